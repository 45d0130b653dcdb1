//! The client-side lease reaper, one loop for every backend that keeps the API's leases in
//! the client (ZooKeeper, whose locks live as long as a session, and the PostgreSQL and MySQL
//! session locks, which live as long as a connection): when a lease ends, the reaper lets go
//! of the lock on the server, in the background.
//!
//! A backend says what is due and how to let go ([`Reap`]); the loop wakes at the next lease
//! end, when the backend notifies it, and shortly after a failure, and ends with the backend.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How soon work that failed is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// A backend's side of the reaper.
pub(crate) trait Reap: Send + Sync + 'static {
    /// One thing to let go of (a lock whose lease ended, a node left behind).
    type Work: Send + 'static;

    /// Takes what is due at `now` (leases that ended, and whatever else waits to be let go
    /// of, such as work that failed before), marking ended leases as ending; returns it with
    /// the end of the next lease still running.
    fn due(&self, now: Instant) -> (Vec<Self::Work>, Option<Instant>);

    /// Lets go of `work` on the server. True when some of it failed and was kept (by the
    /// backend, to come back from [`Reap::due`]) to be tried again shortly.
    fn reap(&self, work: Vec<Self::Work>) -> impl Future<Output = bool> + Send;
}

/// Starts the reaper of `shared` in a task of its own, which ends when `shared` is dropped;
/// a notification of `wake` says that new work is due.
pub(crate) fn spawn<S: Reap>(shared: &Arc<S>, wake: &Arc<Notify>) {
    tokio::spawn(run(Arc::downgrade(shared), wake.clone()));
}

/// Runs the reaper of `shared` until it is dropped; `wake` says that new work is due.
async fn run<S: Reap>(shared: Weak<S>, wake: Arc<Notify>) {
    let mut retry_at: Option<Instant> = None;
    loop {
        let notified = wake.notified();
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        if retry_at.is_some_and(|at| at <= now) {
            retry_at = None;
        }
        let (work, next_end) = strong.due(now);
        if !work.is_empty() && strong.reap(work).await {
            retry_at = Some(Instant::now() + RETRY_AFTER);
        }
        drop(strong);
        let wake_at = [next_end, retry_at].into_iter().flatten().min();
        tokio::select! {
            _ = notified => {}
            _ = crate::wake::sleep_until_or_never(wake_at) => {}
        }
    }
}
