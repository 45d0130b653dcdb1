//! What this client holds, queues and must delete on ZooKeeper: the client-side queue
//! state ([`crate::queue`]) behind the backend's one lock, and the orphans the reaper deletes.

use super::*;

/// The waiters' queue layer ([`crate::queue::Place`]) on ZooKeeper's state.
impl crate::queue::Queue for Shared {
    type Held = ();
    type Extra = PrefixLookups;

    fn with_queue<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
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
        let key = (name.clone(), owner.clone());
        let expires_at = Instant::now() + lease;
        if !self
            .state()
            .grant(key, node, generation, waiter, expires_at, ())
        {
            return false;
        }
        self.reaper.notify_one();
        true
    }

    /// A sequential node's path is only ever its own: delete it whatever its token.
    fn leave_token(_: &Node) -> Option<u64> {
        None
    }
}

impl Shared {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update completes without a panic point: a poisoned lock is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn orphan(&self, path: Arc<str>, token: Option<u64>, generation: u64) {
        self.state()
            .orphans
            .push(Orphan::new(path, token, generation, None, None));
        self.reaper.notify_one();
    }

    /// A create of a node starting with `prefix` may have landed although it failed: the
    /// reaper looks for that node (now and once more a little later) and deletes it, so that
    /// it cannot block the queue for the rest of the session.
    pub(super) fn orphan_prefix(&self, prefix: &str, generation: u64) {
        tracing::debug!(%prefix, "a lock node create has an unknown outcome; the reaper will look for it");
        self.state()
            .orphans
            .push(Orphan::new(prefix.into(), None, generation, None, Some(1)));
        self.reaper.notify_one();
    }

    /// Our held nodes for `locks`, `None` where we hold none.
    pub(super) fn held_nodes(&self, locks: &[(LockName, Owner)]) -> Vec<Option<(Arc<str>, u64)>> {
        let state = self.state();
        locks
            .iter()
            .map(|key| state.held(key).map(|held| (held.key.clone(), held.token)))
            .collect()
    }

    /// One node of `generation` that something rides on, and whether it is held: the held
    /// node with the lowest token (the longest held, the least likely to be released while it
    /// is read), else a queued waiter's node. `None` when this client holds and queues
    /// nothing.
    pub(super) fn at_stake(&self, generation: u64) -> Option<(Node, bool)> {
        let state = self.state();
        let held = state
            .held
            .values()
            .filter(|held| held.generation == generation)
            .min_by_key(|held| held.token)
            .map(|held| {
                let node = Node {
                    key: held.key.clone(),
                    token: held.token,
                };
                (node, true)
            });
        held.or_else(|| {
            state
                .waiters
                .values()
                .filter(|queued| queued.generation == generation)
                .find_map(|queued| queued.node.clone().map(|node| (node, false)))
        })
    }

    /// Forgets the hold of `node` (the same path and token), which the leader no longer has
    /// (an operator's force-unlock): its guard hears of it at its next check. False when no
    /// such hold is recorded (it was released meanwhile).
    pub(super) fn forget_hold(&self, node: &Node) -> bool {
        let mut state = self.state();
        let key = state
            .held
            .iter()
            .find(|(_, held)| held.key == node.key && held.token == node.token)
            .map(|(key, _)| key.clone());
        key.is_some_and(|key| state.held.remove(&key).is_some())
    }
}
