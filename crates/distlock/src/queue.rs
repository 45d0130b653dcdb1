//! The client-side queue state of a backend whose locks are entries it makes on the server
//! under a session or lease (ZooKeeper's nodes, etcd's keys): which locks this client holds
//! and with which entry, which waiters queue with which entry, which entries must go in the
//! background, and which ended leases the reaper is still deleting. Every entry belongs to a
//! generation of the session (or lease); entries of an older generation are gone with it and
//! never stand for a lock again. Each backend keeps what is its server's (the session, its
//! watches, its key names) and this for the rest.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Owner, Woken};
use crate::name::LockName;

/// A lock as its owner holds it: the name and the owner.
pub(crate) type LockKey = (LockName, Owner);

/// One of this client's entries on the server: its path or key, and its fencing token (the
/// revision or sequence the server gave it).
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) key: Arc<str>,
    pub(crate) token: u64,
}

/// A held lock. `H` is what the backend keeps beside it (etcd: the key's watch).
pub(crate) struct Held<H> {
    pub(crate) key: Arc<str>,
    pub(crate) token: u64,
    /// Re-entries of the same owner count up.
    pub(crate) holds: u32,
    /// The end of the lease, kept by this client: the reaper deletes the entry then.
    pub(crate) expires_at: Instant,
    pub(crate) generation: u64,
    // ZooKeeper keeps nothing here; etcd its key's watch.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) extra: H,
}

/// A waiter's place in the queue.
pub(crate) struct Queued {
    pub(crate) name: LockName,
    pub(crate) owner: Owner,
    /// Made by the owner's next attempt; `None` until then or after the generation ended.
    pub(crate) node: Option<Node>,
    pub(crate) generation: u64,
}

/// An entry to delete in the background. `O` is what the backend's reaper needs beside it.
pub(crate) struct Orphan<O> {
    pub(crate) key: Arc<str>,
    /// Delete only the entry with this token; `None`: whatever entry has that key (a key only
    /// this client makes).
    pub(crate) token: Option<u64>,
    pub(crate) generation: u64,
    /// The lock whose lease ended, when that is why the entry goes (see [`QueueState::ending`]).
    pub(crate) ended: Option<LockKey>,
    pub(crate) extra: O,
    /// Counted until it is deleted or dropped, so that a process can wait for it to go.
    pub(crate) _counted: crate::cleanup::Counted,
}

impl<O> Orphan<O> {
    pub(crate) fn new(
        key: Arc<str>,
        token: Option<u64>,
        generation: u64,
        ended: Option<LockKey>,
        extra: O,
    ) -> Self {
        Orphan {
            key,
            token,
            generation,
            ended,
            extra,
            _counted: crate::cleanup::Counted::new(),
        }
    }
}

/// The state itself, kept under the backend's mutex.
pub(crate) struct QueueState<H, O> {
    /// The generation now; entries of older generations are gone with their session.
    pub(crate) generation: u64,
    pub(crate) held: HashMap<LockKey, Held<H>>,
    pub(crate) waiters: HashMap<u64, Queued>,
    pub(crate) next_waiter: u64,
    /// Entries to delete in the background: abandoned by a waiter, left by a failed release
    /// or request, or at the end of their lease.
    pub(crate) orphans: Vec<Orphan<O>>,
    /// Locks whose lease ended and whose entries the reaper is deleting right now: the entry
    /// may still exist, but its owner no longer holds the lock.
    pub(crate) ending: HashSet<LockKey>,
}

impl<H, O> Default for QueueState<H, O> {
    fn default() -> Self {
        QueueState {
            generation: 0,
            held: HashMap::new(),
            waiters: HashMap::new(),
            next_waiter: 0,
            orphans: Vec::new(),
            ending: HashSet::new(),
        }
    }
}

impl<H, O> QueueState<H, O> {
    /// True while the reaper deletes the entry of `key`'s ended lease and no other owner of
    /// this client holds the name yet: the server's entry is not anyone's lock then.
    pub(crate) fn lease_ending(&self, key: &LockKey) -> bool {
        self.ending.contains(key)
            && !self
                .held
                .keys()
                .any(|(name, owner)| name == &key.0 && owner != &key.1)
    }

    /// `key`'s hold in the current generation.
    pub(crate) fn held(&self, key: &LockKey) -> Option<&Held<H>> {
        self.held
            .get(key)
            .filter(|held| held.generation == self.generation)
    }

    /// The waiter of `owner` on `name` in the current generation, if any.
    pub(crate) fn waiter_of(&self, name: &LockName, owner: &Owner) -> Option<u64> {
        self.waiters
            .iter()
            .find(|(_, queued)| {
                &queued.name == name
                    && &queued.owner == owner
                    && queued.generation == self.generation
            })
            .map(|(id, _)| *id)
    }

    /// Records a grant of `node` to `owner` until `expires_at`, taking the place of its
    /// waiter `waiter` if it queued. False, changing nothing, when the grant cannot stand:
    /// the generation it was made in is over, the owner holds the lock already (through
    /// another entry), or the waiter's place is no longer this entry's.
    pub(crate) fn grant(
        &mut self,
        key: LockKey,
        node: &Node,
        generation: u64,
        waiter: Option<u64>,
        expires_at: Instant,
        extra: H,
    ) -> bool {
        if generation != self.generation || self.held(&key).is_some() {
            return false;
        }
        if let Some(id) = waiter {
            match self.waiters.get(&id) {
                Some(queued) if queued.node.as_ref().is_some_and(|n| n.key == node.key) => {
                    self.waiters.remove(&id);
                }
                _ => return false,
            }
        }
        self.held.insert(
            key,
            Held {
                key: node.key.clone(),
                token: node.token,
                holds: 1,
                expires_at,
                generation,
                extra,
            },
        );
        true
    }

    /// A new waiter of `owner` on `name` joins the queue, with no entry yet: its id.
    pub(crate) fn join(&mut self, name: &LockName, owner: &Owner) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.insert(
            id,
            Queued {
                name: name.clone(),
                owner: owner.clone(),
                node: None,
                generation: self.generation,
            },
        );
        id
    }

    /// The waiter `id`'s entry, if it has one in the current generation, and the generation.
    pub(crate) fn entry_of(&self, id: u64) -> Option<(Node, u64)> {
        self.waiters
            .get(&id)
            .filter(|queued| queued.generation == self.generation)
            .and_then(|queued| queued.node.clone())
            .map(|node| (node, self.generation))
    }

    /// The waiter `id` leaves the queue (it was dropped before a grant): its entry, if it
    /// made one, becomes an orphan, with the token `token_of` says to delete it by. True when
    /// there is one, for the reaper to be woken.
    pub(crate) fn leave(
        &mut self,
        id: u64,
        token_of: impl FnOnce(&Node) -> Option<u64>,
        extra: O,
    ) -> bool {
        let Some(queued) = self.waiters.remove(&id) else {
            return false;
        };
        let Some(node) = queued.node else {
            return false;
        };
        let token = token_of(&node);
        self.orphans
            .push(Orphan::new(node.key, token, queued.generation, None, extra));
        true
    }

    /// The reaper's work now: the locks whose lease ended by `now` leave [`held`](Self::held)
    /// for [`ending`](Self::ending), their entries orphans (`on_end` says the token to delete
    /// each by and what else its orphan carries), and every orphan of the current generation
    /// is handed out (those of older ones are gone with their session). With the time of the
    /// next lease end.
    pub(crate) fn due(
        &mut self,
        now: Instant,
        mut on_end: impl FnMut(&LockKey, &Held<H>) -> (Option<u64>, O),
    ) -> (Vec<Orphan<O>>, Option<Instant>) {
        let expired: Vec<LockKey> = self
            .held
            .iter()
            .filter(|(_, held)| held.expires_at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in expired {
            if let Some(held) = self.held.remove(&key) {
                tracing::debug!(lock = %key.0, "the lease ended; deleting its entry");
                let (token, extra) = on_end(&key, &held);
                self.ending.insert(key.clone());
                self.orphans.push(Orphan::new(
                    held.key,
                    token,
                    held.generation,
                    Some(key),
                    extra,
                ));
            }
        }
        let generation = self.generation;
        let mut work = std::mem::take(&mut self.orphans);
        work.retain(|orphan| {
            let keep = orphan.generation == generation;
            if !keep && let Some(key) = &orphan.ended {
                self.ending.remove(key);
            }
            keep
        });
        let next_end = self.held.values().map(|held| held.expires_at).min();
        (work, next_end)
    }

    /// The session (or lease) is lost: a new generation begins. Every hold is lost (returned,
    /// for the backend to stop what it kept beside each), the orphans and ending leases are
    /// gone with the old generation's entries, and each waiter keeps its place in this
    /// client's queue but must make a new entry.
    pub(crate) fn end_generation(&mut self) -> Vec<Held<H>> {
        self.generation += 1;
        let generation = self.generation;
        let lost = self.held.drain().map(|(_, held)| held).collect();
        self.orphans.clear();
        self.ending.clear();
        for queued in self.waiters.values_mut() {
            queued.node = None;
            queued.generation = generation;
        }
        lost
    }

    /// `orphan` is gone (deleted, or with its generation): its ended lock, if any, is no
    /// longer ending.
    pub(crate) fn reaped(&mut self, orphan: &Orphan<O>) {
        if let Some(key) = &orphan.ended {
            self.ending.remove(key);
        }
    }
}

/// What a backend's shared state gives the waiters of [`Place`].
pub(crate) trait Queue: Send + Sync + 'static {
    /// What the backend keeps beside a held lock.
    type Held;
    /// What its reaper needs beside an orphan; a left waiter's orphan carries the default.
    type Extra: Default;

    /// Runs `f` on the queue state, under the backend's mutex.
    fn with_queue<R>(&self, f: impl FnOnce(&mut QueueState<Self::Held, Self::Extra>) -> R) -> R;

    /// Wakes the reaper: there are orphans to delete.
    fn wake_reaper(&self);

    /// Records a grant of `node` to `owner` for `lease`, made in `generation`, taking the
    /// place of `waiter`: false when it cannot stand (see [`QueueState::grant`]).
    fn record_grant(
        &self,
        name: &LockName,
        owner: &Owner,
        node: &Node,
        lease: Duration,
        generation: u64,
        waiter: Option<u64>,
    ) -> bool;

    /// The token a left waiter's entry is deleted by: `None` when its key is only ever its
    /// own (ZooKeeper's sequential nodes), the entry's token where a key may be made again.
    fn leave_token(node: &Node) -> Option<u64>;
}

/// A waiter's place in the queue of a [`Queue`] backend: dropping it before a grant leaves
/// the queue (its entry, if any, goes to the reaper).
pub(crate) struct Place<S: Queue> {
    pub(crate) shared: Arc<S>,
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) owner: Owner,
    pub(crate) lease: Duration,
}

impl<S: Queue> Place<S> {
    /// Joins the queue of `name` as `owner`, asking for `lease`.
    pub(crate) fn join(shared: Arc<S>, name: &LockName, owner: &Owner, lease: Duration) -> Self {
        let id = shared.with_queue(|queue| queue.join(name, owner));
        Place {
            shared,
            id,
            name: name.clone(),
            owner: owner.clone(),
            lease,
        }
    }

    /// Our entry now and its generation, if we have one in the current generation (the
    /// owner's next attempt makes it).
    pub(crate) fn entry(&self) -> Option<(Node, u64)> {
        self.shared.with_queue(|queue| queue.entry_of(self.id))
    }

    /// Takes the lock with our entry, now first in line: `Woken::Granted`, or `None` when
    /// the grant cannot stand (the caller lets its owner try again).
    pub(crate) fn granted(&self, node: &Node, generation: u64) -> Option<Woken> {
        let since = Instant::now();
        self.shared
            .record_grant(
                &self.name,
                &self.owner,
                node,
                self.lease,
                generation,
                Some(self.id),
            )
            .then_some(Woken::Granted {
                fencing_token: node.token,
                since,
                lease: self.lease,
            })
    }
}

impl<S: Queue> Drop for Place<S> {
    fn drop(&mut self) {
        // Not granted: leave the queue, in the background as Drop cannot wait.
        let left = self
            .shared
            .with_queue(|queue| queue.leave(self.id, S::leave_token, S::Extra::default()));
        if left {
            self.shared.wake_reaper();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, owner: &str) -> LockKey {
        (LockName::new(name).unwrap(), Owner::new(owner, 1))
    }

    fn node(key: &str, token: u64) -> Node {
        Node {
            key: key.into(),
            token,
        }
    }

    /// Promise 6: a grant made in an ended generation, or for a waiter whose place is now
    /// another entry's, is not recorded; a waiter that leaves orphans its entry.
    #[tokio::test]
    async fn promise6_grants_of_another_generation_or_entry_do_not_stand() {
        let mut state: QueueState<(), ()> = QueueState::default();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        state.generation = 2;
        assert!(!state.grant(key("a", "o"), &node("n1", 1), 1, None, later, ()));
        state.waiters.insert(
            7,
            Queued {
                name: LockName::new("a").unwrap(),
                owner: Owner::new("o", 1),
                node: Some(node("n2", 2)),
                generation: 2,
            },
        );
        assert_eq!(
            state.waiter_of(&LockName::new("a").unwrap(), &Owner::new("o", 1)),
            Some(7)
        );
        assert!(!state.grant(key("a", "o"), &node("n3", 3), 2, Some(7), later, ()));
        assert!(state.grant(key("a", "o"), &node("n2", 2), 2, Some(7), later, ()));
        assert!(state.waiters.is_empty());
        assert!(!state.grant(key("a", "o"), &node("n4", 4), 2, None, later, ()));
        assert_eq!(state.held(&key("a", "o")).map(|h| h.token), Some(2));

        state.waiters.insert(
            8,
            Queued {
                name: LockName::new("b").unwrap(),
                owner: Owner::new("o", 1),
                node: Some(node("n5", 5)),
                generation: 2,
            },
        );
        assert!(state.leave(8, |n| Some(n.token), ()));
        assert!(!state.leave(8, |n| Some(n.token), ()));
        assert_eq!(state.orphans.len(), 1);
        assert_eq!(state.orphans[0].token, Some(5));
    }

    /// An ended lease's entry goes with its lock marked ending; orphans of an older generation
    /// are dropped and end their lock's ending.
    #[tokio::test]
    async fn due_ends_expired_leases_and_drops_old_generations() {
        let mut state: QueueState<(), ()> = QueueState::default();
        let now = Instant::now();
        state.generation = 1;
        assert!(state.grant(key("a", "o"), &node("n1", 1), 1, None, now, ()));
        let later = now + std::time::Duration::from_secs(60);
        assert!(state.grant(key("b", "o"), &node("n2", 2), 1, None, later, ()));
        let (work, next) = state.due(now, |_, held| (Some(held.token), ()));
        assert_eq!(work.len(), 1);
        assert_eq!(work[0].token, Some(1));
        assert_eq!(next, Some(later));
        assert!(state.lease_ending(&key("a", "o")));
        state.orphans.extend(work);
        state.generation = 2;
        let (work, _) = state.due(now, |_, held| (Some(held.token), ()));
        assert!(work.is_empty());
        assert!(!state.lease_ending(&key("a", "o")));
    }

    /// Promise 6: a lost session ends every hold and every ending lease with it, so that a
    /// grant of the same name and owner in the next session is not taken for an ending one
    /// (ZooKeeper kept `ending` across sessions before).
    #[tokio::test]
    async fn promise6_a_new_generation_keeps_nothing_of_the_old() {
        let mut state: QueueState<(), ()> = QueueState::default();
        let now = Instant::now();
        assert!(state.grant(key("a", "o"), &node("n1", 1), 0, None, now, ()));
        let (work, _) = state.due(now, |_, held| (Some(held.token), ()));
        state.orphans.extend(work);
        assert!(state.lease_ending(&key("a", "o")));
        state.waiters.insert(
            3,
            Queued {
                name: LockName::new("b").unwrap(),
                owner: Owner::new("o", 1),
                node: Some(node("n2", 2)),
                generation: 0,
            },
        );
        let later = now + std::time::Duration::from_secs(60);
        assert!(state.grant(key("c", "o"), &node("n3", 3), 0, None, later, ()));
        let lost = state.end_generation();
        assert_eq!(lost.len(), 1);
        assert_eq!(state.generation, 1);
        assert!(state.held.is_empty() && state.orphans.is_empty());
        assert!(!state.lease_ending(&key("a", "o")));
        let waiter = &state.waiters[&3];
        assert!(waiter.node.is_none() && waiter.generation == 1);
        assert!(state.grant(key("a", "o"), &node("n4", 4), 1, None, later, ()));
        assert!(!state.lease_ending(&key("a", "o")));
    }
}
