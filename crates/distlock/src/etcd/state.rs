//! The etcd backend's client-side state: what this client holds, queues and must delete,
//! under which lease.

use super::*;
pub(super) use crate::queue::Node;
use crate::queue::QueueState;

/// What etcd keeps beside the client-side queue state ([`crate::queue`]): the lease, the
/// names of its keys, and the held keys' watch.
#[derive(Default)]
pub(super) struct State {
    pub(super) queue: QueueState<Watched, LateUntil>,
    /// The etcd lease now, `None` while a new one is being granted.
    pub(super) lease: Option<i64>,
    /// Its TTL, as the server granted it.
    pub(super) ttl: Duration,
    /// The suffix of the next extra key (`<lease>-<n>`).
    pub(super) next_key: u64,
    /// Keys of this lease that exist or may exist: held, queued, being made or to delete.
    pub(super) keys: HashSet<Arc<str>>,
    /// The watch on the held keys is open and was checked against the server: renewals can
    /// answer from [`Watched::gone`].
    pub(super) watch_up: bool,
    /// The id of the next held key's watch.
    pub(super) next_watch: i64,
}

/// The queue state's generation is the lease's: it counts the client's etcd leases, and
/// entries of older ones are gone with their lease.
impl std::ops::Deref for State {
    type Target = QueueState<Watched, LateUntil>;

    fn deref(&self) -> &Self::Target {
        &self.queue
    }
}

impl std::ops::DerefMut for State {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.queue
    }
}

pub(super) type Orphan = crate::queue::Orphan<LateUntil>;

/// The waiters' queue layer ([`crate::queue::Place`]) on etcd's state.
impl crate::queue::Queue for Shared {
    type Held = Watched;
    type Extra = LateUntil;

    fn with_queue<R>(&self, f: impl FnOnce(&mut QueueState<Watched, LateUntil>) -> R) -> R {
        f(&mut self.state())
    }

    fn wake_reaper(&self) {
        self.reaper.notify_one();
    }

    fn record_grant(
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
        let watch = state.next_watch + 1;
        let watched = Watched { watch, gone: false };
        let expires_at = Instant::now() + lease;
        if !state.grant(key, node, generation, waiter, expires_at, watched) {
            return false;
        }
        state.next_watch = watch;
        drop(state);
        let _ = self.held_watch.send(held::Change::Watch {
            id: watch,
            key: node.key.clone(),
            from: i64::try_from(node.token).unwrap_or(i64::MAX),
        });
        self.reaper.notify_one();
        true
    }

    /// Keys are made again under the same lease: delete only the waiter's revision.
    fn leave_token(node: &Node) -> Option<u64> {
        Some(node.token)
    }
}

/// A held key's watch on the held-keys stream.
pub(super) struct Watched {
    /// The id of the key's watch.
    pub(super) watch: i64,
    /// The watch saw the key deleted.
    pub(super) gone: bool,
}

/// For a key whose put never answered (its orphan's token is `None`): the put may still be
/// applied after the first delete, so the key is deleted again until then.
pub(super) type LateUntil = Option<Instant>;

impl State {
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
        self.state()
            .orphans
            .push(Orphan::new(key, token, generation, ended, None));
        self.reaper.notify_one();
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
            Some(held) if &held.key == node_key => Some(held.extra.watch),
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
                Some(held) if held.generation == generation && !held.extra.gone => {
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
