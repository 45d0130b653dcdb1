//! The etcd backend's client-side state: what this client holds, queues and must delete,
//! under which lease.

use super::*;

#[derive(Default)]
pub(super) struct State {
    /// Counts the client's etcd leases; entries of older ones are gone with their lease.
    pub(super) generation: u64,
    /// The etcd lease now, `None` while a new one is being granted.
    pub(super) lease: Option<i64>,
    /// Its TTL, as the server granted it.
    pub(super) ttl: Duration,
    pub(super) held: HashMap<(LockName, Owner), Held>,
    pub(super) waiters: HashMap<u64, Queued>,
    pub(super) next_waiter: u64,
    /// The suffix of the next extra key (`<lease>-<n>`).
    pub(super) next_key: u64,
    /// Keys of this lease that exist or may exist: held, queued, being made or to delete.
    pub(super) keys: HashSet<Arc<str>>,
    /// Keys to delete in the background: abandoned by a waiter, left by a failed release or
    /// request, or at the end of their lease.
    pub(super) orphans: Vec<Orphan>,
    /// Locks whose lease ended and whose keys the reaper is deleting right now.
    pub(super) ending: HashSet<(LockName, Owner)>,
    /// The watch on the held keys is open and was checked against the server: renewals can
    /// answer from [`Held::gone`].
    pub(super) watch_up: bool,
    /// The id of the next held key's watch.
    pub(super) next_watch: i64,
}

pub(super) struct Held {
    pub(super) key: Arc<str>,
    pub(super) token: u64,
    pub(super) holds: u32,
    /// The end of the lease, kept by this client: the reaper deletes the key then.
    pub(super) expires_at: Instant,
    pub(super) generation: u64,
    /// The id of the key's watch on the held-keys stream.
    pub(super) watch: i64,
    /// The watch saw the key deleted.
    pub(super) gone: bool,
}

/// A waiter's place in the queue.
pub(super) struct Queued {
    pub(super) name: LockName,
    pub(super) owner: Owner,
    /// Put by the owner's next attempt; `None` until then or after the lease was lost.
    pub(super) node: Option<Node>,
    pub(super) generation: u64,
}

/// One of our keys and its create revision.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) key: Arc<str>,
    pub(super) token: u64,
}

pub(super) struct Orphan {
    pub(super) key: Arc<str>,
    /// Delete only the key with this create revision; `None`: whatever key of that name
    /// exists (the name holds our lease id, so only this client makes it).
    pub(super) token: Option<u64>,
    pub(super) generation: u64,
    /// The lock whose lease ended, when that is why the key goes (see `State::ending`).
    pub(super) ended: Option<(LockName, Owner)>,
    /// For a key whose put never answered (`token` is `None`): the put may still be applied
    /// after the first delete, so the key is deleted again until then.
    pub(super) late_until: Option<Instant>,
    /// Counted until it is deleted or dropped, so that a process can wait for it to go.
    pub(super) _counted: crate::cleanup::Counted,
}

impl State {
    /// True while the reaper deletes the key of `key`'s ended lease and no other owner of
    /// this client holds the name yet.
    pub(super) fn lease_ending(&self, key: &(LockName, Owner)) -> bool {
        self.ending.contains(key)
            && !self
                .held
                .keys()
                .any(|(name, owner)| name == &key.0 && owner != &key.1)
    }

    pub(super) fn held(&self, key: &(LockName, Owner)) -> Option<&Held> {
        self.held
            .get(key)
            .filter(|held| held.generation == self.generation)
    }

    /// The waiter of `owner` on `name` under this lease, if any.
    pub(super) fn waiter_of(&self, name: &LockName, owner: &Owner) -> Option<u64> {
        self.waiters
            .iter()
            .find(|(_, queued)| {
                &queued.name == name
                    && &queued.owner == owner
                    && queued.generation == self.generation
            })
            .map(|(id, _)| *id)
    }

    /// Names a new key of ours under `lock_prefix` and reserves it, with the lease and its
    /// generation; `None` while there is no lease. A name is never used twice under one
    /// lease: a request naming an earlier key may still be applied late (a put whose answer
    /// never came, a retried re-put), and must not find a newer key of the same name. The
    /// first key of a lease is `<lease id>`, as etcd's own mutex names it; the next ones
    /// `<lease id>-<n>`.
    pub(super) fn new_key(&mut self, lock_prefix: &str) -> Option<(Arc<str>, i64, u64)> {
        let lease = self.lease?;
        let plain = format!("{lock_prefix}{lease:x}");
        let key: Arc<str> = if self.next_key == 0 && !self.keys.contains(plain.as_str()) {
            plain.into()
        } else {
            format!("{plain}-{}", self.next_key).into()
        };
        self.next_key += 1;
        self.keys.insert(key.clone());
        Some((key, lease, self.generation))
    }
}

pub(super) fn no_lease() -> Error {
    Error::backend(
        SCHEME,
        "put a lock key",
        "the client's etcd lease was lost and a new one is not granted yet",
    )
}

impl Shared {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update completes without a panic point: a poisoned lock is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn lock_prefix(&self, name: &LockName) -> String {
        self.url.lock_prefix(&name.escaped())
    }

    /// The key `owner` holds `name` with, and its generation.
    pub(super) fn held_node(&self, key: &(LockName, Owner)) -> Option<(Node, u64)> {
        self.state().held(key).map(|held| {
            (
                Node {
                    key: held.key.clone(),
                    token: held.token,
                },
                held.generation,
            )
        })
    }

    /// Our held keys for `locks`, `None` where we hold none.
    pub(super) fn held_nodes(&self, locks: &[(LockName, Owner)]) -> Vec<Option<Node>> {
        let state = self.state();
        locks
            .iter()
            .map(|key| {
                state.held(key).map(|held| Node {
                    key: held.key.clone(),
                    token: held.token,
                })
            })
            .collect()
    }

    pub(super) fn orphan(
        &self,
        key: Arc<str>,
        token: Option<u64>,
        generation: u64,
        ended: Option<(LockName, Owner)>,
    ) {
        self.state().orphans.push(Orphan {
            key,
            token,
            generation,
            ended,
            late_until: None,
            _counted: crate::cleanup::Counted::new(),
        });
        self.reaper.notify_one();
    }

    /// Records a grant of `node` to `owner`. False when it cannot stand: the lease it was
    /// made under is gone, or the owner got the lock through another key meanwhile.
    pub(super) fn record_grant(
        &self,
        name: &LockName,
        owner: &Owner,
        node: &Node,
        lease: Duration,
        generation: u64,
        waiter: Option<u64>,
    ) -> bool {
        let mut state = self.state();
        let key = (name.clone(), owner.clone());
        if generation != state.generation || state.held(&key).is_some() {
            return false;
        }
        if let Some(id) = waiter {
            match state.waiters.get(&id) {
                Some(queued) if queued.node.as_ref().is_some_and(|n| n.key == node.key) => {
                    state.waiters.remove(&id);
                }
                _ => return false,
            }
        }
        state.next_watch += 1;
        let watch = state.next_watch;
        state.held.insert(
            key,
            Held {
                key: node.key.clone(),
                token: node.token,
                holds: 1,
                expires_at: Instant::now() + lease,
                generation,
                watch,
                gone: false,
            },
        );
        drop(state);
        let _ = self.held_watch.send(held::Change::Watch {
            id: watch,
            key: node.key.clone(),
            from: i64::try_from(node.token).unwrap_or(i64::MAX),
        });
        self.reaper.notify_one();
        true
    }

    /// Stops watching a key no longer held.
    pub(super) fn unwatch(&self, id: i64) {
        let _ = self.held_watch.send(held::Change::Unwatch { id });
    }

    /// Removes `owner`'s hold entry on `name` if it is still the one with `node_key`, and
    /// stops watching that key.
    pub(super) fn forget(&self, key: &(LockName, Owner), node_key: &Arc<str>) {
        let mut state = self.state();
        let watch = match state.held.get(key) {
            Some(held) if &held.key == node_key => Some(held.watch),
            _ => None,
        };
        if let Some(watch) = watch {
            state.held.remove(key);
            drop(state);
            self.unwatch(watch);
            self.state().keys.remove(node_key);
        } else {
            state.keys.remove(node_key);
        }
    }

    /// Renews `locks` to `expires_at` from what the held keys' watch saw, when it is up:
    /// `true` where the lock is held and its key was not deleted. `None` when the watch is
    /// down (the caller asks the server).
    pub(super) fn renew_watched(
        &self,
        locks: &[Renewing],
        expires_at: Instant,
    ) -> Option<Vec<bool>> {
        let mut state = self.state();
        if !state.watch_up {
            return None;
        }
        let generation = state.generation;
        let mut gone = Vec::new();
        let alive = locks
            .iter()
            .map(|renewing| match state.held.get_mut(&renewing.lock) {
                // A later grant of the name (another token) is not this renewal's.
                Some(held) if held.token != renewing.fencing_token => false,
                Some(held) if held.generation == generation && !held.gone => {
                    held.expires_at = expires_at;
                    true
                }
                Some(held) if held.generation == generation => {
                    gone.push((renewing.lock.clone(), held.key.clone()));
                    false
                }
                _ => false,
            })
            .collect();
        drop(state);
        for (key, node_key) in gone {
            self.forget(&key, &node_key);
        }
        Some(alive)
    }
}
