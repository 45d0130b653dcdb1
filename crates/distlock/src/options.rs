//! The settings of a client and of one acquisition, and the lease arithmetic both share.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// [`AcquireOptions::DEFAULT_LEASE`].
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// [`AcquireOptions::MIN_LEASE`].
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(10);

/// [`AcquireOptions::MAX_DURATION`].
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of a client, given to [`connect_with`](crate::connect_with).
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    lease: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            lease: DEFAULT_LEASE,
        }
    }
}

impl ConnectOptions {
    /// Options with the defaults: a 30 s renewed lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease of locks acquired without a lease of their own. The client renews them every
    /// `lease / 3`; a holder that cannot renew for a whole lease loses the lock. Shorter
    /// leases free a crashed holder's locks sooner and cost more renewals.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The renewed lease.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_lease(self.lease)
    }
}

/// When the client stops believing it holds a lock whose lease of `lease` was set by a
/// request that started at `start`: the lease less an allowance for the server's clock running
/// faster than ours and for timer granularity (1% of the lease plus 2 ms, Redlock's drift
/// allowance), so that `lost()` fires before the server can grant the lock to anyone else.
pub(crate) fn lease_deadline(start: Instant, lease: Duration) -> Instant {
    start + lease - (lease / 100 + Duration::from_millis(2))
}

pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_DURATION {
        return Err(Error::invalid(
            "lease",
            format!(
                "{lease:?} is outside the accepted range {MIN_LEASE:?} ..= {MAX_DURATION:?}; \
                 leave the lease unset to hold the lock with automatic renewal"
            ),
        ));
    }
    Ok(())
}

/// How to acquire: how long to wait, and whether to hold with a fixed lease.
///
/// ```
/// # use std::time::Duration;
/// let opts = distlock::AcquireOptions::new()
///     .wait(Duration::from_secs(2))
///     .lease(Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    wait: Option<Duration>,
    lease: Option<Duration>,
}

impl AcquireOptions {
    /// The default lease of a lock acquired without a lease of its own: 30 s, renewed every
    /// 10 s while its guard lives.
    pub const DEFAULT_LEASE: Duration = DEFAULT_LEASE;

    /// The shortest lease accepted.
    pub const MIN_LEASE: Duration = MIN_LEASE;

    /// The longest lease or wait accepted: one day. Wait without a limit with
    /// [`Mutex::acquire`](crate::Mutex::acquire).
    pub const MAX_DURATION: Duration = MAX_DURATION;

    /// Wait without a limit; hold with the client's renewed lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give up with [`Error::Timeout`] after waiting this long. Zero tries once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Hold for this fixed lease, without renewal (Redisson's `leaseTime`). The lock frees
    /// itself when the lease runs out, even while the guard lives, and the guard's
    /// [`Guard::lost`](crate::Guard::lost) fires then.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The wait limit; `None` waits without one.
    pub(crate) fn wait_limit(&self) -> Option<Duration> {
        self.wait
    }

    /// The fixed lease; `None` holds with the client's renewed lease.
    pub(crate) fn fixed_lease(&self) -> Option<Duration> {
        self.lease
    }

    /// These options with what is left, `start` ago, of their wait (no limit stays none).
    pub(crate) fn wait_left(self, start: Instant) -> Self {
        AcquireOptions {
            wait: self.wait.map(|wait| wait.saturating_sub(start.elapsed())),
            lease: self.lease,
        }
    }

    /// These options with the client's renewed lease instead of a fixed one: for the parts
    /// of a primitive that waits for several locks, whose fixed lease starts once it holds
    /// them all.
    pub(crate) fn renewed(self) -> Self {
        AcquireOptions {
            wait: self.wait,
            lease: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(lease) = self.lease {
            validate_lease(lease)?;
        }
        if let Some(wait) = self.wait
            && wait > MAX_DURATION
        {
            return Err(Error::invalid(
                "wait",
                format!(
                    "{wait:?} is longer than the limit {MAX_DURATION:?}; use Mutex::acquire to \
                     wait without a limit"
                ),
            ));
        }
        Ok(())
    }
}
