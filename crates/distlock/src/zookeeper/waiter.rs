//! Waiters of the ZooKeeper locks: the sequential lock's (a watch on the node before its
//! own) and the naive lock's (a watch on the one lock node).

use super::*;

/// Every watch event delivered to a waiter in this process so far, for measuring the herd
/// effect: with `zk://` one per release and one per grant after waiting (the mark that
/// wakes the waiter behind), with `zk+naive://` one per waiter per release. Read through
/// [`crate::hooks`].
#[cfg(feature = "bench")]
pub(crate) fn watch_notifications() -> u64 {
    WATCH_NOTIFICATIONS.load(Ordering::Relaxed)
}

static WATCH_NOTIFICATIONS: AtomicU64 = AtomicU64::new(0);

/// Grants a waiter in this process took on its watch alone (the node ahead, first in line,
/// was deleted), with no look at the line after it. Read through [`crate::hooks`].
#[cfg(feature = "bench")]
pub(crate) fn watch_grants() -> u64 {
    WATCH_GRANTS.load(Ordering::Relaxed)
}

static WATCH_GRANTS: AtomicU64 = AtomicU64::new(0);

impl Shared {
    /// Tells the waiter behind `node`, just granted, that it is first in line now: a `setData`
    /// of the node (its data unchanged) fires that waiter's watch, set while the node was not
    /// yet first, so the waiter looks at the line while we hold and then takes our release
    /// alone as its grant, with no look after it. One more write per grant that may have a
    /// waiter behind, sent in the background (the grant does not wait for it; a mark sent
    /// after our release finds no node). Only for the mutex: the nodes behind a writer are
    /// often readers, which look at the line after any change anyway.
    pub(super) fn mark_held(
        &self,
        session: Arc<Session>,
        node: &Node,
        kind: &LockKind,
        owner: &Owner,
    ) {
        if !matches!(kind, LockKind::Exclusive) {
            return;
        }
        let (path, data) = (node.path.clone(), recipes::data(kind, owner));
        let limit = self.url.session_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(limit, session.client.set_data(&path, &data, None)).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "marking a granted node failed (released already?)");
                }
                Err(_) => tracing::debug!("marking a granted node timed out"),
            }
        });
    }
}

/// A waiter of the sequential lock: its node in the queue, made by the owner's next attempt.
pub(super) struct SequentialWaiter {
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
    pub(super) name: LockName,
    pub(super) owner: Owner,
    pub(super) lock: String,
    pub(super) lease: Duration,
    pub(super) status: watch::Receiver<SessionStatus>,
}

impl Drop for SequentialWaiter {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        if let Some(queued) = state.waiters.remove(&self.id)
            && let Some(node) = queued.node
        {
            // Not granted: leave the queue (in the background, as Drop cannot wait).
            state.orphans.push(Orphan {
                ended: None,
                path: node.path,
                token: None,
                generation: queued.generation,
                prefix_lookups: None,
                _counted: crate::cleanup::Counted::new(),
            });
            drop(state);
            self.shared.reaper.notify_one();
        }
    }
}

impl SequentialWaiter {
    /// Our node now, if we have one in the current session.
    fn node(&self) -> Option<Node> {
        let state = self.shared.state();
        state
            .waiters
            .get(&self.id)
            .filter(|queued| queued.generation == state.generation)
            .and_then(|queued| queued.node.clone())
    }

    /// Takes the lock with our node, now first in line; `mark` when a waiter behind may not
    /// know it yet (see `Shared::mark_held`).
    fn granted(&self, node: &Node, generation: u64, mark: bool) -> Woken {
        let since = Instant::now();
        let shared = &self.shared;
        if shared.record_grant(
            &self.name,
            &self.owner,
            node,
            self.lease,
            generation,
            Some(self.id),
        ) {
            if mark {
                let session = shared.session();
                if session.generation == generation {
                    shared.mark_held(session, node, self.name.kind(), &self.owner);
                }
            }
            Woken::Granted {
                fencing_token: node.token,
                since,
                lease: self.lease,
            }
        } else {
            Woken::Retry
        }
    }
}

#[async_trait]
impl ReleaseWaiter for SequentialWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        // A watch lost in some way nobody foresaw costs one session timeout, not a hang.
        let deadline = Instant::now() + max.min(self.shared.url.session_timeout);
        self.status.borrow_and_update();
        loop {
            let Some(node) = self.node() else {
                // The next attempt makes the node.
                return Woken::Retry;
            };
            let shared = self.shared.clone();
            let session = shared.session();
            let line = match shared.line(&session, &self.lock, self.name.kind()).await {
                Ok(line) => line,
                Err(error) => {
                    tracing::debug!(%error, "listing the queue failed");
                    tokio::time::sleep_until(
                        deadline.min(Instant::now() + Duration::from_millis(100)),
                    )
                    .await;
                    return Woken::Retry;
                }
            };
            let position = line.iter().position(|c| c == child_name(&node.path));
            let Some(at) = position else {
                return Woken::Retry;
            };
            let Some(before) = recipes::blocker(self.name.kind(), &line, at) else {
                return self.granted(&node, session.generation, line.len() > at + 1);
            };
            let predecessor = format!("{}/{}", self.lock, line[before]);
            let watcher = match session.client.check_and_watch_stat(&predecessor).await {
                Ok((Some(_), watcher)) => watcher,
                // Gone already: look again.
                Ok((None, _)) => continue,
                Err(error) => {
                    tracing::debug!(%error, "watching the predecessor failed");
                    tokio::time::sleep_until(
                        deadline.min(Instant::now() + Duration::from_millis(100)),
                    )
                    .await;
                    return Woken::Retry;
                }
            };
            drop(session);
            tokio::select! {
                event = watcher.changed() => {
                    WATCH_NOTIFICATIONS.fetch_add(1, Ordering::Relaxed);
                    if event.event_type == zk::EventType::NodeDeleted
                        && recipes::last_blocker(self.name.kind(), before)
                    {
                        // The node ahead was first in line: nobody can come before us now.
                        // A node may have queued behind us since our look: mark anyway.
                        let generation = self.shared.state().generation;
                        let woken = self.granted(&node, generation, true);
                        if matches!(woken, Woken::Granted { .. }) {
                            WATCH_GRANTS.fetch_add(1, Ordering::Relaxed);
                        }
                        return woken;
                    }
                    // Any other change (the node ahead deleted while others were ahead of
                    // it, or marked as granted): look at the line again.
                    if event.event_type == zk::EventType::Session {
                        return Woken::Retry;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Woken::Retry,
                _ = self.status.changed() => return Woken::Retry,
            }
        }
    }
}

/// A waiter of the naive lock: watches the one node, like every other waiter.
pub(super) struct NaiveWaiter {
    pub(super) shared: Arc<Shared>,
    pub(super) path: String,
    pub(super) status: watch::Receiver<SessionStatus>,
}

#[async_trait]
impl ReleaseWaiter for NaiveWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        let deadline = Instant::now() + max.min(self.shared.url.session_timeout);
        self.status.borrow_and_update();
        let session = self.shared.session();
        let watcher = match session.client.check_and_watch_stat(&self.path).await {
            Ok((Some(_), watcher)) => watcher,
            Ok((None, _)) => return Woken::Retry,
            Err(error) => {
                tracing::debug!(%error, "watching the lock node failed");
                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100)))
                    .await;
                return Woken::Retry;
            }
        };
        drop(session);
        tokio::select! {
            _ = watcher.changed() => {
                WATCH_NOTIFICATIONS.fetch_add(1, Ordering::Relaxed);
            }
            _ = tokio::time::sleep_until(deadline) => {}
            _ = self.status.changed() => {}
        }
        Woken::Retry
    }
}
