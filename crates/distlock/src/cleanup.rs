//! The work a dropped request, waiter or guard leaves to a background task (a release, a
//! queue entry to remove, a request to finish and undo), counted, so that a process can wait
//! for it before it exits: a task still queued when the runtime stops never runs, and what it
//! was to remove stays on the server until a lease or a staleness limit ends it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;

/// Clean-ups started and not yet ended, in this process.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Woken each time `PENDING` falls to zero.
static SETTLED: Notify = Notify::const_new();

/// Counts one clean-up while it lives: from its spawn until its task ends (or is dropped unrun
/// when the runtime shuts down), or while a backend's reaper keeps it in its list.
pub(crate) struct Counted;

impl Counted {
    pub(crate) fn new() -> Self {
        PENDING.fetch_add(1, Ordering::SeqCst);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if PENDING.fetch_sub(1, Ordering::SeqCst) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// Runs `work` in a task on `runtime`, counted until it ends.
pub(crate) fn spawn_on(runtime: &Handle, work: impl Future<Output = ()> + Send + 'static) {
    let counted = Counted::new();
    drop(runtime.spawn(async move {
        work.await;
        drop(counted);
    }));
}

/// Runs `work` in a task on the current runtime, counted until it ends; without a runtime
/// (a drop outside one), `false` and nothing runs.
pub(crate) fn spawn(work: impl Future<Output = ()> + Send + 'static) -> bool {
    match Handle::try_current() {
        Ok(runtime) => {
            spawn_on(&runtime, work);
            true
        }
        Err(_) => false,
    }
}

/// How many clean-ups are under way.
pub(crate) fn pending() -> usize {
    PENDING.load(Ordering::SeqCst)
}

/// Waits until no clean-up is under way (those started meanwhile included), at most
/// `within`; true when none is left.
pub(crate) async fn settled(within: Duration) -> bool {
    let wait = async {
        loop {
            let notified = SETTLED.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if pending() == 0 {
                return;
            }
            notified.await;
        }
    };
    tokio::time::timeout(within, wait).await.is_ok()
}
