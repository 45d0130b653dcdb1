//! Waiters of the ZooKeeper locks: the sequential lock's (a watch on the node before its
//! own) and the naive lock's (a watch on the one lock node).

use super::*;
use crate::queue::Place;

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

/// A waiter of the sequential lock: its place in the queue, whose node the owner's next
/// attempt makes.
pub(super) struct SequentialWaiter {
    pub(super) place: Place<Shared>,
    pub(super) lock: String,
    pub(super) status: watch::Receiver<SessionStatus>,
}

impl SequentialWaiter {
    /// Takes the lock with our node, now first in line; `mark` when a waiter behind may not
    /// know it yet (see `Shared::mark_held`).
    fn granted(&self, node: &Node, generation: u64, mark: bool) -> Woken {
        let Some(woken) = self.place.granted(node, generation) else {
            return Woken::Retry;
        };
        if mark {
            let shared = &self.place.shared;
            let session = shared.session();
            if session.generation == generation {
                shared.mark_held(session, node, self.place.name.kind(), &self.place.owner);
            }
        }
        woken
    }
}

#[async_trait]
impl ReleaseWaiter for SequentialWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        // A watch lost in some way nobody foresaw costs one session timeout, not a hang.
        let deadline = Instant::now() + max.min(self.place.shared.url.session_timeout);
        self.status.borrow_and_update();
        loop {
            let Some((node, _)) = self.place.entry() else {
                // The next attempt makes the node.
                return Woken::Retry;
            };
            let shared = self.place.shared.clone();
            let session = shared.session();
            let line = match shared
                .line(&session, &self.lock, self.place.name.kind())
                .await
            {
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
            let position = line.iter().position(|c| c == child_name(&node.key));
            let Some(at) = position else {
                return Woken::Retry;
            };
            let Some(before) = recipes::blocker(self.place.name.kind(), &line, at) else {
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
                        && recipes::last_blocker(self.place.name.kind(), before)
                    {
                        // The node ahead was first in line: nobody can come before us now.
                        // A node may have queued behind us since our look: mark anyway.
                        let generation = self.place.shared.state().generation;
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
