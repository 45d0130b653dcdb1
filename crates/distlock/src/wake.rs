//! Small waiting helpers shared by the client's keeper and the backends.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::Woken;

/// Sleeps until `at`, or forever when there is nothing to wake for.
pub(crate) async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a release signalled on `receiver` (counted releases per lock name), at most
/// `max`. `changed` returns at once for a release signalled since the previous wait. A
/// closed channel (its sender dropped with its store) cannot signal again: sleep instead.
pub(crate) async fn release_signalled(receiver: &mut watch::Receiver<u64>, max: Duration) -> Woken {
    match tokio::time::timeout(max, receiver.changed()).await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(_)) => tokio::time::sleep(max).await,
    }
    Woken::Retry
}

/// Release signals per lock name, for the waiters of one client: a waiter subscribes to a
/// name, a release (seen by this client, or announced by the server) signals it. The one hub
/// of every backend that wakes its waiters in-process (memory, the PostgreSQL and MySQL table
/// locks); Redis has its own, fed by pub/sub with a reconnecting subscriber.
#[derive(Debug, Default)]
pub(crate) struct ReleaseSignals {
    names: StdMutex<HashMap<String, watch::Sender<u64>>>,
}

impl ReleaseSignals {
    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // Every update is one insert, removal or counter bump: a poisoned lock is consistent.
        self.names
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver that changes with every release of `name` signalled from now on.
    pub(crate) fn subscribe(&self, name: &str) -> watch::Receiver<u64> {
        self.names()
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Wakes the waiters of `name`; forgets the name once nobody waits for it.
    pub(crate) fn signal(&self, name: &str) {
        let mut names = self.names();
        if let Some(sender) = names.get(name) {
            if sender.receiver_count() == 0 {
                names.remove(name);
            } else {
                sender.send_modify(|n| *n += 1);
            }
        }
    }

    /// Wakes every waiter: after the feed of releases was interrupted, some may be missed.
    #[cfg(feature = "postgres")]
    pub(crate) fn signal_all(&self) {
        let mut names = self.names();
        names.retain(|_, sender| sender.receiver_count() > 0);
        for sender in names.values() {
            sender.send_modify(|n| *n += 1);
        }
    }
}
