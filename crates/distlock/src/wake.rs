//! Small waiting helpers shared by the client's keeper and the backends.

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
