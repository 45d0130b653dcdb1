//! Scheduled jobs across a fleet: [`Locks::run_exclusive`] runs a job on whichever instance
//! takes the lock first and makes the others skip it, with ShedLock's two bounds: the lock
//! is held *at least* a while after the run starts (so instances whose schedulers fire a
//! little later skip it), and *at most* a while (so a crashed instance's run does not block
//! the next one).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::mutex::release_after_work;
use crate::options::{AcquireOptions, MAX_DURATION, MIN_LEASE};
use crate::{Guard, Locks};

/// How long a scheduled run holds its lock: [`Locks::run_exclusive`]'s two bounds.
///
/// - **hold at least**: the lock stays held this long from the grant even when the job ends
///   sooner, so that the other instances, whose schedulers fire the same job a little later,
///   find it held and skip. Two runs of the job start at least this far apart.
/// - **hold at most**: the longest a run holds the lock. The job is stopped (its future is
///   dropped) when this runs out and `run_exclusive` answers [`Error::LockLost`]; a crashed
///   instance's run frees the lock by then on the backends that keep leases on the server.
///
/// ```
/// # use std::time::Duration;
/// use distlock::Schedule;
///
/// // A job fired every 5 minutes on every instance: one run per 5 minutes across the fleet.
/// let every_five = Schedule::at_most_once_per(Duration::from_secs(300));
/// assert_eq!(every_five.hold_at_least_for(), Duration::from_secs(270));
/// assert_eq!(every_five.hold_at_most_for(), Duration::from_secs(285));
///
/// // ShedLock's two bounds set by hand: hold 1 minute at least, 10 minutes at most.
/// let nightly = Schedule::hold(Duration::from_secs(60), Duration::from_secs(600));
/// # let _ = nightly;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    at_least: Duration,
    at_most: Duration,
}

impl Schedule {
    /// For a job that every instance's scheduler fires every `interval`: the job runs at
    /// most once per interval across the fleet. The lock is held at least nine tenths of the
    /// interval and at most nineteen twentieths: the hold ends a little before the next
    /// firing, so schedulers that fire a few milliseconds apart cannot find the previous
    /// run's hold still there and skip a whole interval; and the upper bound stays above the
    /// lower one by more than the client's allowance for clock drift (1% of a lease), so the
    /// client does not count the hold lost before the lower bound. That gap (a twentieth
    /// of the interval) must also cover the client's 2 ms allowance and a round trip: below
    /// about 100 ms `run_exclusive` may find the hold lost when it cuts it, and answer
    /// `LockLost` after a good run (`distlock run --once-per` takes 1 s at least).
    pub fn at_most_once_per(interval: Duration) -> Self {
        Schedule {
            at_least: interval - interval / 10,
            at_most: interval - interval / 20,
        }
    }

    /// Both bounds set by hand (ShedLock's `lockAtLeastFor` and `lockAtMostFor`).
    pub fn hold(at_least: Duration, at_most: Duration) -> Self {
        Schedule { at_least, at_most }
    }

    /// This schedule with another lower bound.
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// This schedule with another upper bound.
    pub fn hold_at_most(mut self, at_most: Duration) -> Self {
        self.at_most = at_most;
        self
    }

    /// How long a run holds the lock at least.
    pub fn hold_at_least_for(&self) -> Duration {
        self.at_least
    }

    /// How long a run holds the lock at most.
    pub fn hold_at_most_for(&self) -> Duration {
        self.at_most
    }

    fn validate(&self) -> Result<()> {
        if self.at_most < MIN_LEASE || self.at_most > MAX_DURATION {
            return Err(Error::invalid(
                "schedule",
                format!(
                    "hold at most {:?} is outside the accepted range {MIN_LEASE:?} ..= {MAX_DURATION:?}",
                    self.at_most
                ),
            ));
        }
        if self.at_least > self.at_most {
            return Err(Error::invalid(
                "schedule",
                format!(
                    "hold at least {:?} is longer than hold at most {:?}; raise the upper bound",
                    self.at_least, self.at_most
                ),
            ));
        }
        Ok(())
    }
}

impl Locks {
    /// Runs `job` if no other instance runs it or ran it within the schedule's lower bound,
    /// and answers `Ok(None)` without running it otherwise (ShedLock's scheduled-task lock).
    ///
    /// The lock `name` is tried once (never waited for) with a fixed lease of the schedule's
    /// upper bound. The job gets the grant's fencing token. When the job ends before the
    /// lower bound, the lock is left held until the lower bound, from the grant, has passed;
    /// it then frees itself. If the lock is lost while the job runs (the upper bound ran out,
    /// an operator freed it), the job is dropped at once and the answer is
    /// [`Error::LockLost`]: no work goes on unprotected.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// use std::time::Duration;
    /// use distlock::Schedule;
    ///
    /// let locks = distlock::connect("memory://").await?;
    /// let every_minute = Schedule::at_most_once_per(Duration::from_secs(60));
    /// let ran = locks
    ///     .run_exclusive("report/daily", every_minute, |_token| async { "sent" })
    ///     .await?;
    /// assert_eq!(ran, Some("sent"));
    /// // Fired again within the interval (here, or on another instance): skipped.
    /// let again = locks
    ///     .run_exclusive("report/daily", every_minute, |_token| async { "sent" })
    ///     .await?;
    /// assert_eq!(again, None);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The hold left after the job is kept by whatever keeps the lock's lease: the server on
    /// Redis, Redlock, SQLite and the table locks (it outlives this process); this client on
    /// ZooKeeper, etcd and the PostgreSQL/MySQL session locks, so there the hold ends early
    /// if this process exits first.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad name or schedule (upper bound below
    /// [`AcquireOptions::MIN_LEASE`](crate::AcquireOptions::MIN_LEASE), lower bound above the upper one);
    /// [`Error::LockLost`] when the lock was lost during the job (the job was stopped), or
    /// found lost when its hold was cut to the lower bound (the job ran, but may not have
    /// been protected to its end); backend errors of the try. A failure to cut the hold is
    /// only logged: the lock then runs to the upper bound.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future while the job runs drops the job and releases the
    /// lock in the background (a cancelled job is not a run: another instance may run it
    /// next). Dropped after the job ended, the lock is left to run out as if the call had
    /// finished (at the latest at the upper bound).
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        name: impl Into<String>,
        schedule: Schedule,
        job: F,
    ) -> Result<Option<T>>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        schedule.validate()?;
        // An owner of its own: a hold this client left to run out is never re-entered.
        let mutex = self.holder().mutex(name)?;
        let options = AcquireOptions::new()
            .wait(Duration::ZERO)
            .lease(schedule.at_most);
        let guard = match mutex.acquire_with(options).await {
            Ok(guard) => guard,
            Err(error) if error.is_timeout() => return Ok(None),
            Err(error) => return Err(error),
        };
        // Counted from after the grant's answer, so the hold lasts at least as long on the
        // server, whose lease started before.
        let granted = Instant::now();
        let work = job(guard.fencing_token());
        let value = tokio::select! {
            biased;
            lost = guard.lost() => return Err(lost),
            value = work => value,
        };
        // The job ran: from here on, whatever happens (a failed request, the caller dropping
        // this future), the lock is never released before the lower bound, only left to run
        // out, so that no instance runs the job again within it.
        let left = schedule.at_least.saturating_sub(granted.elapsed());
        if left.is_zero() {
            release_after_work(guard, mutex.name()).await?;
        } else {
            let hold = LeftToRunOut(Some(guard));
            let cut = hold.guard().set_lease(left.max(MIN_LEASE)).await;
            match cut {
                Ok(()) => {}
                // The job may not have been protected to its end.
                Err(error) if error.is_lock_lost() || error.is_not_owner() => return Err(error),
                // The lease stays at the upper bound, which is not shorter.
                Err(error) => tracing::warn!(
                    lock = %mutex.name(), %error,
                    "shortening the hold after the job failed; it runs to the upper bound"
                ),
            }
        }
        Ok(Some(value))
    }
}

/// A finished run's guard: dropped (even with the future that owns it), it leaves the lock to
/// run out at its lease end instead of releasing it.
struct LeftToRunOut(Option<Guard>);

impl LeftToRunOut {
    fn guard(&self) -> &Guard {
        // Taken only by `Drop`.
        self.0.as_ref().expect("the guard is present until drop")
    }
}

impl Drop for LeftToRunOut {
    fn drop(&mut self) {
        if let Some(guard) = self.0.take() {
            guard.keep_until_lease_end();
        }
    }
}
