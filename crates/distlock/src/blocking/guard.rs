//! The blocking [`Guard`]: proof of holding a mutex (or a semaphore's permit), its loss as a
//! blocking wait and a non-blocking check, and its release.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::held::Held;
use super::runtime::Runtime;
use crate::backend::Owner;
use crate::error::{Error, LossReason, Result};

/// Proof of holding a lock: [`crate::Guard`] without `async`. Release it with
/// [`Guard::release`] to learn whether the release worked; dropping it releases in the
/// background.
///
/// The lock is renewed on the client's runtime while the guard lives, whatever the calling
/// thread does; [`Guard::is_lost`] says at once, without a request, whether the client knows
/// it lost the lock, and [`Guard::lost`] blocks until it does.
///
/// # Dropping
/// `Drop` does not block: it hands the release to the client's runtime and returns. The lock
/// is free a round trip later, and an error is only logged. The guard keeps the runtime
/// running, and when the last handle and guard of a client are gone, the runtime waits up to
/// [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) for such releases before it stops, so dropping
/// a guard last, even right before the program exits, still releases it. Prefer
/// `guard.release()`, which reports errors.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    held: Held<crate::Guard>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.held.fmt(f)
    }
}

impl Guard {
    pub(crate) fn new(guard: crate::Guard, runtime: Arc<Runtime>) -> Self {
        Guard {
            held: Held::new(guard, runtime),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held.get().name()
    }

    /// The owner identity this guard holds the lock as.
    pub fn owner(&self) -> &Owner {
        self.held.get().owner()
    }

    /// The fencing token of this grant: strictly greater than the token of every earlier
    /// grant of this lock name. Send it with every write to the protected resource (see
    /// [`crate::Guard::fencing_token`]).
    pub fn fencing_token(&self) -> u64 {
        self.held.get().fencing_token()
    }

    /// Blocks until the lock is known to be lost (a renewal refused, the lease run out, an
    /// operator's force-unlock noticed at the next renewal, a session ended), and returns the
    /// [`Error::LockLost`] to report. It never returns while the lock is held: a thread that
    /// watches a guard while others work uses [`Guard::lost_timeout`] or [`Guard::is_lost`]
    /// instead, since the guard cannot be released while it is borrowed.
    ///
    /// If the client's runtime cannot answer, the answer is that
    /// [`Error::Backend`](crate::Error::Backend): the lock is not renewed any more.
    pub fn lost(&self) -> Error {
        self.held.lost()
    }

    /// Blocks at most `limit` until the lock is known to be lost: `Some` with the
    /// [`Error::LockLost`] to report, `None` when the limit passed with the lock held.
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// # use std::time::Duration;
    /// let locks = distlock::blocking::connect("memory://")?;
    /// let guard = locks.mutex("report")?.acquire()?;
    /// for step in 0..3 {
    ///     // ... one step of the work ...
    ///     # let _ = step;
    ///     if let Some(lost) = guard.lost_timeout(Duration::from_millis(1)) {
    ///         return Err(lost);
    ///     }
    /// }
    /// guard.release()
    /// # }
    /// ```
    pub fn lost_timeout(&self, limit: Duration) -> Option<Error> {
        self.held.lost_timeout(limit)
    }

    /// True once the client knows the lock is lost. Does not block: asks no server.
    pub fn is_lost(&self) -> bool {
        self.held.get().is_lost()
    }

    /// Why the lock was lost, once the client knows it is. Does not block.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.held.loss_reason()
    }

    /// Asks the backend whether this guard's owner still holds the lock.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    /// runtime could not answer.
    pub fn is_held(&self) -> Result<bool> {
        self.held
            .call("check a hold", |guard| async move { guard.is_held().await })
    }

    /// Moves the end of a fixed lease ([`AcquireOptions::lease`](crate::AcquireOptions::lease))
    /// to `lease` from now; a renewed lock is refused (see [`crate::Guard::extend`]).
    ///
    /// # Errors
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a lease out of range, or when
    ///   the lock is renewed.
    /// - [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds the lock now.
    /// - [`Error::LockLost`] when nobody holds it any more.
    /// - [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    ///   runtime could not answer.
    pub fn extend(&self, lease: Duration) -> Result<()> {
        self.held.call(
            "extend",
            move |guard| async move { guard.extend(lease).await },
        )
    }

    /// Holds the lock with a fixed lease ending `lease` from now, renewed or not before: from
    /// then on it is not renewed, and it frees itself when that lease ends (see
    /// [`crate::Guard::set_lease`]).
    ///
    /// # Errors
    /// As [`Guard::extend`], except that a renewed lock is accepted.
    pub fn set_lease(&self, lease: Duration) -> Result<()> {
        self.held.call("set a lease", move |guard| async move {
            guard.set_lease(lease).await
        })
    }

    /// Acquires the same lock again as the same owner, at once: another guard on this grant,
    /// with the same fencing token. The lock is free once every guard has been released.
    ///
    /// # Errors
    /// [`Error::LockLost`] or [`Error::NotOwner`](crate::Error::NotOwner) when the lock was
    /// lost meanwhile; [`Error::Backend`](crate::Error::Backend) as for
    /// [`Guard::is_held`].
    pub fn reenter(&self) -> Result<Guard> {
        let guard = self
            .held
            .call("re-enter", |guard| async move { guard.reenter().await })?;
        Ok(Guard::new(guard, self.held.runtime().clone()))
    }

    /// Releases this guard's hold and reports how it went. The lock is free once every guard
    /// of its owner has been released.
    ///
    /// # Errors
    /// - [`Error::LockLost`] when the lock had already been lost (nothing changed), or was
    ///   force-unlocked or ran out on the server meanwhile.
    /// - [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds it now.
    /// - [`Error::Backend`](crate::Error::Backend) when the request failed, or the client's
    ///   runtime could not answer; the lock then frees when its lease ends.
    pub fn release(self) -> Result<()> {
        self.held.release("release")
    }

    /// Releases after work done under the lock, as [`crate::Mutex::run`] does: a lock found
    /// gone is the answer; any other failure is logged.
    pub(crate) fn release_after_work(self) -> Result<()> {
        self.held.finish("release", |guard| async move {
            let name = guard.name().to_owned();
            crate::mutex::release_after_work(guard, &name).await
        })
    }
}
