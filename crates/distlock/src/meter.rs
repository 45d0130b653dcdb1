//! What the client measures, reported through the [`metrics`](https://docs.rs/metrics)
//! facade (cargo feature `metrics`, on by default): the application installs the recorder
//! it wants (Prometheus, StatsD, OpenTelemetry); without one a call here still builds its
//! label list. The names and labels are listed once, here, and in `docs/metrics.md`.
//!
//! Every metric carries the label `backend` (the URL scheme: `redis`, `zk`, `postgres`...).
//! Lock names are never labels: a service with a lock per order would make a series per
//! order.

use std::time::Duration;

use crate::error::LossReason;

/// Acquisitions of one lock: time from the call to its end (histogram, seconds); label
/// `outcome`: `granted`, `busy` (a try found it held), `timeout` (a wait ran out), `error`,
/// `cancelled` (the caller dropped the future). Primitives made of several locks (a
/// semaphore's slots, the fallback read-write lock) record one per lock they try.
pub const ACQUIRE_SECONDS: &str = "distlock_acquire_seconds";
/// Grants (counter); label `waited`: `false` when the first try got the lock, `true` when
/// the caller had to wait for it.
pub const GRANTS: &str = "distlock_grants_total";
/// Grants handed over by the releaser to a waiter of this client (counter), on the backends
/// that hand a lock over (Redis's fair queue).
pub const HANDOVERS: &str = "distlock_handovers_total";
/// Acquisitions whose wait ran out (counter).
pub const TIMEOUTS: &str = "distlock_timeouts_total";
/// How long locks were held, from the grant to the release or loss (histogram, seconds).
pub const HOLD_SECONDS: &str = "distlock_hold_seconds";
/// Renewal requests (counter; one request renews up to a batch of locks); label `outcome`:
/// `renewed`, `failed`, `late` (no answer within the locks' deadline).
pub const RENEWALS: &str = "distlock_renewals_total";
/// Renewal request latency (histogram, seconds).
pub const RENEWAL_SECONDS: &str = "distlock_renewal_seconds";
/// Locks lost while held (counter); label `reason`, one of [`loss_label`]'s values.
pub const LOSSES: &str = "distlock_losses_total";
/// Acquisitions of this client waiting now (gauge): its share of the lock queues.
pub const WAITING: &str = "distlock_waiting";
/// Grants this client holds now (gauge).
pub const HELD: &str = "distlock_held";

/// The `reason` label of a loss.
pub fn loss_label(reason: LossReason) -> &'static str {
    match reason {
        LossReason::LeaseRanOut => "lease_ran_out",
        LossReason::RenewalTooLate => "renewal_too_late",
        LossReason::NotHeld => "not_held",
        LossReason::HeldByOther => "held_by_other",
        LossReason::SessionLost => "session_lost",
        LossReason::GrantedAnew => "granted_anew",
        LossReason::HandoverRanOut => "handover_ran_out",
    }
}

/// How an acquisition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted { waited: bool },
    Busy,
    Timeout,
    Error,
}

/// One acquisition, from its call to its end: counts it as waiting while it waits, and
/// records its outcome once (`cancelled` when dropped before it ended).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Acquisition {
    backend: &'static str,
    start: tokio::time::Instant,
    waiting: bool,
    ended: bool,
}

impl Acquisition {
    pub(crate) fn start(backend: &'static str) -> Self {
        Acquisition {
            backend,
            start: tokio::time::Instant::now(),
            waiting: false,
            ended: false,
        }
    }

    /// True once the acquisition has waited.
    pub(crate) fn waited(&self) -> bool {
        self.waiting
    }

    /// The first try found the lock held: the acquisition waits from now on.
    pub(crate) fn waits(&mut self) {
        if !self.waiting {
            self.waiting = true;
            #[cfg(feature = "metrics")]
            metrics::gauge!(WAITING, "backend" => self.backend).increment(1.0);
        }
    }

    pub(crate) fn end(mut self, outcome: Outcome) {
        self.record(outcome_label(outcome));
        #[cfg(feature = "metrics")]
        match outcome {
            Outcome::Granted { waited } => {
                let waited = if waited { "true" } else { "false" };
                metrics::counter!(GRANTS, "backend" => self.backend, "waited" => waited)
                    .increment(1);
            }
            Outcome::Timeout => {
                metrics::counter!(TIMEOUTS, "backend" => self.backend).increment(1);
            }
            Outcome::Busy | Outcome::Error => {}
        }
    }

    fn record(&mut self, outcome: &'static str) {
        self.ended = true;
        if self.waiting {
            self.waiting = false;
            #[cfg(feature = "metrics")]
            metrics::gauge!(WAITING, "backend" => self.backend).decrement(1.0);
        }
        let _ = (outcome, self.start);
        #[cfg(feature = "metrics")]
        metrics::histogram!(ACQUIRE_SECONDS, "backend" => self.backend, "outcome" => outcome)
            .record(self.start.elapsed().as_secs_f64());
    }
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        if !self.ended {
            self.record("cancelled");
        }
    }
}

fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Granted { .. } => "granted",
        Outcome::Busy => "busy",
        Outcome::Timeout => "timeout",
        Outcome::Error => "error",
    }
}

/// A grant handed over by its releaser.
pub(crate) fn handover(backend: &'static str) {
    let _ = backend;
    #[cfg(feature = "metrics")]
    metrics::counter!(HANDOVERS, "backend" => backend).increment(1);
}

/// A grant begins to be held.
pub(crate) fn hold_started(backend: &'static str) {
    let _ = backend;
    #[cfg(feature = "metrics")]
    metrics::gauge!(HELD, "backend" => backend).increment(1.0);
}

/// A grant is no longer held, `held` after it was granted.
pub(crate) fn hold_ended(backend: &'static str, held: Duration) {
    let _ = (backend, held);
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(HELD, "backend" => backend).decrement(1.0);
        metrics::histogram!(HOLD_SECONDS, "backend" => backend).record(held.as_secs_f64());
    }
}

/// A held lock was lost.
pub(crate) fn lost(backend: &'static str, reason: LossReason) {
    let _ = (backend, reason);
    #[cfg(feature = "metrics")]
    metrics::counter!(LOSSES, "backend" => backend, "reason" => loss_label(reason)).increment(1);
}

/// How a renewal request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    Failed,
    Late,
}

/// One renewal request, `took` long.
pub(crate) fn renewal(backend: &'static str, outcome: Renewal, took: Duration) {
    let _ = (backend, outcome, took);
    #[cfg(feature = "metrics")]
    {
        let outcome = match outcome {
            Renewal::Renewed => "renewed",
            Renewal::Failed => "failed",
            Renewal::Late => "late",
        };
        metrics::counter!(RENEWALS, "backend" => backend, "outcome" => outcome).increment(1);
        metrics::histogram!(RENEWAL_SECONDS, "backend" => backend).record(took.as_secs_f64());
    }
}

/// Registers the descriptions of every metric with the installed recorder (once per
/// client: a recorder installed later still gets them from the next client).
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_histogram!(
            ACQUIRE_SECONDS,
            Unit::Seconds,
            "Time from an acquire call to its end, by outcome"
        );
        describe_counter!(GRANTS, "Locks granted, by whether the caller waited");
        describe_counter!(HANDOVERS, "Locks handed over by their releaser to a waiter");
        describe_counter!(TIMEOUTS, "Acquisitions whose wait ran out");
        describe_histogram!(
            HOLD_SECONDS,
            Unit::Seconds,
            "How long locks were held, grant to release or loss"
        );
        describe_counter!(RENEWALS, "Renewal requests, by outcome");
        describe_histogram!(RENEWAL_SECONDS, Unit::Seconds, "Renewal request latency");
        describe_counter!(LOSSES, "Locks lost while held, by reason");
        describe_gauge!(WAITING, "Acquisitions of this process waiting now");
        describe_gauge!(HELD, "Grants this process holds now");
    }
}
