//! The conformance suite: the behaviour every backend must show, as library code.
//!
//! Each case is an `async fn` taking a [`Target`]: a backend URL, or a factory of
//! `Arc<dyn Backend>` ([`Target::from_factory`]) for a backend built outside this crate. It
//! opens its own clients, uses lock names unique to the run, and panics with a message naming
//! the case when the backend misbehaves. The servers of distlock's own tests are listed in
//! [`servers`]. [`conformance_suite!`](crate::conformance_suite) makes one `#[tokio::test]`
//! per case for a backend, so a failure names backend and case:
//!
//! ```no_run
//! // In tests/conformance.rs of a backend crate:
//! distlock::conformance_suite!(memory, distlock::conformance::Target::new("memory://suite"));
//! # fn main() {}
//! ```
//!
//! Cross-process cases (a holder killed with SIGKILL) need the `distlock` binary and live in
//! the CLI crate's tests.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::name::MAX_NAME_BYTES;
use crate::{AcquireOptions, ConnectOptions, Locks};

mod basics;
mod cancel;
mod elections;
mod leases;
mod nested;
mod primitive_faults;
mod primitives;
mod replies;
mod run;
mod rwlocks;
mod schedule;
/// The servers the tests run against, listed once: each with the environment variable that
/// overrides its URL, the URL `scripts/test` starts it at, and a probe that fails (never
/// skips) naming the server and the command that starts it.
///
/// ```no_run
/// use distlock::conformance::servers;
///
/// // In a test: the Redis URL, after checking that its server answers.
/// let url = servers::REDIS.url();
/// let spin = servers::with_scheme(&url, "redis+spin");
/// let unfair = servers::with_query(&url, "fair=false");
/// # let _ = (spin, unfair);
/// ```
pub mod servers {
    pub use crate::servers::*;

    impl Server {
        /// A conformance [`Target`](crate::conformance::Target) at [`Server::url`].
        pub fn target(&self) -> crate::conformance::Target {
            crate::conformance::Target::new(self.url())
        }
    }
}
mod stalls;
mod wire;
pub use basics::*;
pub use cancel::*;
pub use elections::*;
pub use leases::*;
pub use nested::*;
pub use primitive_faults::*;
pub use primitives::*;
pub use replies::*;
pub use run::*;
pub use rwlocks::*;
pub use schedule::*;
pub use stalls::*;
pub use wire::*;

/// Opens a fresh backend for a [`Target`].
type Open =
    dyn Fn() -> Pin<Box<dyn Future<Output = crate::Result<Arc<dyn Backend>>> + Send>> + Send + Sync;

/// A backend under test: how to open it (a URL, or a factory for a backend built outside this
/// crate), and whatever must live as long as the test (a temporary directory, a server
/// handle). Cheap to clone.
///
/// ```no_run
/// use std::sync::Arc;
/// use distlock::conformance::Target;
///
/// // A backend of your own, run through the same cases as the built-in ones:
/// let target = Target::from_factory("my-backend", || async {
///     let backend: Arc<dyn distlock::backend::Backend> =
///         Arc::new(distlock::memory::MemoryBackend::named("suite"));
///     Ok(backend)
/// });
/// # let _ = target;
/// ```
#[derive(Clone)]
pub struct Target {
    label: String,
    url: Option<String>,
    open: Arc<Open>,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
    /// At most this many locks held at once ([`Target::holding_at_most`]).
    held_at_most: Option<usize>,
}

impl Target {
    /// A backend reachable at `url`, opened with [`open_backend`](crate::open_backend).
    pub fn new(url: impl Into<String>) -> Self {
        let url: String = url.into();
        let opened = url.clone();
        Target {
            label: url.clone(),
            url: Some(url),
            open: Arc::new(move || {
                let url = opened.clone();
                Box::pin(async move { crate::open_backend(&url).await })
            }),
            _keep: None,
            held_at_most: None,
        }
    }

    /// A backend that holds at most `locks` locks at once across its clients (each lock in a
    /// server connection of its own, through a pooler with that many): the cases that hold
    /// thousands hold that many instead.
    pub fn holding_at_most(self, locks: usize) -> Self {
        Target {
            held_at_most: Some(locks.max(1)),
            ..self
        }
    }

    /// A backend at `url` that needs `resource` alive during the test.
    pub fn with_resource(url: impl Into<String>, resource: impl Any + Send + Sync) -> Self {
        Target {
            _keep: Some(Arc::new(resource)),
            ..Target::new(url)
        }
    }

    /// A backend that `open` makes, named `label` in failure messages: for backends built
    /// outside this crate. Every client a case makes calls `open` once. The wire fault cases
    /// ([`wire_fault_suite!`](crate::wire_fault_suite)) need a URL and do not apply.
    pub fn from_factory<F, Fut>(label: impl Into<String>, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = crate::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        Target {
            label: label.into(),
            url: None,
            open: Arc::new(move || Box::pin(open())),
            _keep: None,
            held_at_most: None,
        }
    }

    /// The backend's URL, when the target was made from one.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// What failure messages call the backend: its URL or the factory's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Opens a fresh backend.
    ///
    /// # Errors
    /// Whatever the URL's backend or the factory reports.
    pub async fn open(&self) -> crate::Result<Arc<dyn Backend>> {
        (self.open)().await
    }

    /// A client with `options` over a fresh backend; panics (naming the target) when the
    /// backend cannot be opened, as a failed test should.
    pub async fn client_with(&self, options: ConnectOptions) -> Locks {
        let backend = self
            .open()
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", self.label));
        Locks::with_backend(backend, options).expect("client options")
    }

    /// The URL, for the cases that must rewrite it (the wire fault cases).
    fn url_for(&self, case: &str) -> &str {
        self.url.as_deref().unwrap_or_else(|| {
            panic!(
                "{case} reaches its servers through proxies and needs a Target made from a URL; \
                 {} was made by a factory",
                self.label
            )
        })
    }
}

/// Makes one `#[tokio::test]` per conformance case in a module named after the backend.
///
/// `$target` is evaluated afresh in every test and must give a
/// [`Target`](crate::conformance::Target).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $target:expr) => {
        $crate::conformance_suite!(@cases $backend, $target;
            mutual_exclusion,
            try_acquire_returns_at_once,
            wait_times_out,
            fixed_lease_expires,
            renewal_keeps_holder_alive,
            reentrant_holds_count,
            non_owner_cannot_release_or_extend,
            fencing_tokens_strictly_increase,
            lost_fires_on_expiry,
            lost_fires_on_force_unlock,
            queries_report_state,
            inspect_reports_what_it_knows,
            odd_names,
            bad_durations_are_rejected,
            cancelled_acquire_leaves_nothing,
            renewal_is_batched,
            dropped_guard_releases_in_background,
            extend_moves_the_lease_end,
            set_lease_turns_a_renewed_lock_into_a_fixed_lease,
            promise2_hung_renewal_fires_lost_in_time,
            promise2_slow_failing_renewal_fires_lost_in_time,
            promise2_late_renewal_reply_does_not_revive,
            renewal_panic_does_not_stop_the_keeper,
            promise2_set_lease_during_a_renewal_fires_lost_before_a_rival,
            promise2_set_lease_with_a_lost_reply_fires_lost_before_a_rival,
            promise6_regrants_during_renewals_keep_one_holder,
            promise6_a_late_renewal_leaves_a_newer_grant_alone,
            promise6_extending_a_superseded_guard_leaves_the_new_grant_alone,
            promise4_cancelled_waiting_acquire_leaves_nothing,
            promise4_cancelled_release_completes,
            promise4_lost_acquire_reply_leaves_no_hold,
            promise4_lost_reentry_reply_keeps_holds_exact,
            promise4_lost_release_reply_keeps_holds_exact,
            promise4_failed_release_keeps_holds_exact,
            promise4_failed_last_release_frees_the_lock,
            promise4_lost_extend_reply_keeps_the_lock,
            promise4_lost_enqueue_reply_leaves_no_queue_entry,
            promise4_lost_renewal_reply_keeps_the_lock,
            promise4_regrant_after_a_client_side_loss_keeps_holds_exact,
            promise4_concurrent_releases_keep_holds_exact,
            nested_acquire_is_not_starved_by_waiters,
            two_waiting_tasks_of_one_holder_share_the_grant,
            run_holds_the_lock_for_the_work,
            list_names_the_locks_held,
            promise2_run_stops_the_work_when_the_lock_is_lost,
            promise1_scheduled_job_runs_once_per_hold,
            promise2_scheduled_job_stops_at_its_upper_bound,
            promise4_cancelled_scheduled_job_leaves_nothing,
            promise1_semaphore_admits_at_most_its_permits,
            semaphore_waits_and_checks_its_count,
            promise2_semaphore_permit_loss_and_expiry,
            promise4_cancelled_semaphore_acquire_leaves_nothing,
            promise1_rwlock_writers_exclude_readers_share,
            promise1_rwlock_readers_hold_together_without_a_limit,
            rwlock_queued_writer_blocks_new_readers,
            promise2_rwlock_write_lost_when_a_part_is_lost,
            promise4_cancelled_write_leaves_nothing,
            multi_lock_is_all_or_nothing,
            promise1_multi_lock_orders_do_not_deadlock,
            promise1_multi_lock_fixed_lease_starts_once_all_are_held,
            promise2_multi_lock_lost_when_a_part_is_lost,
            promise4_cancelled_multi_lock_leaves_nothing,
            promise4_semaphore_lost_reply_leaves_no_permit,
            promise4_multi_lock_lost_lease_reply_leaves_no_part,
            promise4_failed_write_leaves_nothing,
            promise4_read_lost_reply_leaves_nothing,
            promise1_election_has_one_leader_at_a_time,
            promise2_leadership_lost_when_its_lock_is_lost,
            crashed_leader_is_replaced,
            promise4_cancelled_campaign_leaves_nothing,
            promise4_lost_publish_reply_leaves_nothing,
            published_records_keep_the_largest_term,
            published_records_race_to_the_largest_term,
            election_refuses_bad_input,
        );
    };
    (@cases $backend:ident, $target:expr; $($case:ident),* $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let target: $crate::conformance::Target = $target;
                    $crate::conformance::$case(&target).await;
                }
            )*
        }
    };
}

const SHORT_LEASE: Duration = Duration::from_millis(300);

/// The lease of a lock that an operator force-unlocks in a test that wants the server's answer
/// (`NotHeld`) as the loss's reason: the renewal that finds the lock gone comes within a third
/// of it, and a renewal slowed by a loaded machine still comes before the lease's end (a
/// 300 ms lease ended first once, `RenewalTooLate`).
const UNLOCK_LEASE: Duration = Duration::from_millis(1_200);

/// A lock name unique to this run of `case`.
fn unique(case: &str) -> String {
    format!("conformance/{case}/{}", uuid::Uuid::new_v4().simple())
}

async fn client(target: &Target) -> Locks {
    target.client_with(ConnectOptions::new()).await
}

/// Acquires `name` with the client's renewed lease, waiting as long as it takes.
async fn hold(locks: &Locks, name: &str) -> crate::Guard {
    locks
        .mutex(name)
        .unwrap()
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?}: {e}"))
}

/// Acquires `name` with a fixed `lease`, waiting as long as it takes.
async fn hold_for(locks: &Locks, name: &str, lease: Duration) -> crate::Guard {
    locks
        .mutex(name)
        .unwrap()
        .acquire_with(AcquireOptions::new().lease(lease))
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?}: {e}"))
}

/// Acquires `name` with the client's renewed lease, waiting at most `wait`.
async fn acquire_within(locks: &Locks, name: &str, wait: Duration) -> crate::Result<crate::Guard> {
    locks
        .mutex(name)
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(wait))
        .await
}

/// Another client gets `name` within `within`: nothing was left behind.
async fn free_within(target: &Target, name: &str, within: Duration, what: &str) {
    let other = client(target).await;
    let guard = acquire_within(&other, name, within)
        .await
        .unwrap_or_else(|e| panic!("{what}: a hold or a queue entry was left behind: {e}"));
    guard.release().await.expect("release the check's grant");
}

/// A client with `options` whose requests go through a
/// [`FaultyBackend`](crate::fault::FaultyBackend) around a fresh backend of `target`.
async fn faulty_client(
    target: &Target,
    options: ConnectOptions,
) -> (Locks, Arc<crate::fault::FaultyBackend>) {
    let backend = target
        .open()
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", target.label()));
    let faulty = crate::fault::FaultyBackend::new(backend);
    let locks = Locks::with_backend(faulty.clone(), options).expect("client options");
    (locks, faulty)
}

/// The owner's newer grant `second` of `name` (on a fixed 5 s lease) still holds after an
/// answer about an earlier grant: a rival is refused, and the guard is neither lost nor gone.
/// Then it is released.
async fn newer_grant_still_holds(target: &Target, name: &str, second: crate::Guard) {
    let rival = client(target).await;
    let taken = rival.mutex(name).unwrap().try_acquire().await;
    assert!(
        matches!(taken, Ok(None)),
        "a rival was granted the lock during the owner's fixed 5 s lease: {taken:?}"
    );
    assert!(
        !second.is_lost(),
        "the new grant was lost: {:?}",
        second.loss_reason()
    );
    assert!(second.is_held().await.unwrap(), "the new grant is gone");
    second.release().await.expect("release the second grant");
}

/// When `guard`'s `lost()` fires, at most `within` from now.
async fn lost_at(guard: &crate::Guard, within: Duration) -> Option<Instant> {
    tokio::time::timeout(within, guard.lost())
        .await
        .ok()
        .map(|_| Instant::now())
}

/// Waits for every task, at most `limit` for all; panics naming `what` when one panicked or
/// they did not finish (a hold never freed, a deadlock).
async fn finish_tasks(tasks: Vec<tokio::task::JoinHandle<()>>, limit: Duration, what: &str) {
    tokio::time::timeout(limit, async {
        for task in tasks {
            task.await
                .unwrap_or_else(|e| panic!("{what}: a task failed: {e}"));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the tasks did not finish within {limit:?}"));
}

async fn unlock_lease_client(target: &Target) -> Locks {
    target
        .client_with(ConnectOptions::new().lease(UNLOCK_LEASE))
        .await
}

async fn short_lease_client(target: &Target) -> Locks {
    target
        .client_with(ConnectOptions::new().lease(SHORT_LEASE))
        .await
}
