//! [`Mutex::run`]: the code every user writes around a guard — acquire, work, stop the work
//! when the lock is lost, release — written once.

use std::future::Future;

use super::{AcquireOptions, Guard, Mutex};
use crate::error::Result;

impl Mutex {
    /// Acquires the lock (waiting as [`Mutex::acquire`] does), runs `work` with the grant's
    /// fencing token, and releases the lock. If the lock is lost while `work` runs, `work`
    /// is dropped at once (it stops at its next await point) and the answer is the loss,
    /// [`Error::LockLost`](crate::Error::LockLost): no work goes on unprotected.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// let locks = distlock::connect("memory://").await?;
    /// let sold = locks
    ///     .mutex("concert/42")?
    ///     .run(|token| async move {
    ///         // Read, check and write the stock, passing `token` to a fenced store.
    ///         let _ = token;
    ///         1
    ///     })
    ///     .await?;
    /// assert_eq!(sold, 1);
    /// assert!(!locks.is_locked("concert/42").await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// If the release finds the lock gone (lost, or held by another), the answer is that
    /// error, not the work's value: the work finished, but it may not have been protected to
    /// its end. Any other failed release is logged, not returned: the lock was not known lost
    /// when the work ended, and it frees itself at its lease end.
    ///
    /// # Errors
    /// As [`Mutex::acquire`]; [`Error::LockLost`](crate::Error::LockLost) when the lock was lost during the work,
    /// and `LockLost` or [`Error::NotOwner`](crate::Error::NotOwner) when the release found it gone.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the work and releases the lock in the
    /// background, as dropping a [`Guard`](crate::Guard) does.
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_with(AcquireOptions::new(), work).await
    }

    /// As [`Mutex::run`], acquiring with `options` (a wait limit, a fixed lease).
    ///
    /// # Errors
    /// As [`Mutex::acquire_with`], and [`Error::LockLost`](crate::Error::LockLost) when the
    /// lock was lost during the work.
    pub async fn run_with<F, Fut, T>(&self, options: AcquireOptions, work: F) -> Result<T>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire_with(options).await?;
        let work = work(guard.fencing_token());
        let done = tokio::select! {
            // A loss and a finished work seen together count as the loss.
            biased;
            lost = guard.lost() => Err(lost),
            value = work => Ok(value),
        };
        let value = done?;
        release_after_work(guard, self.name()).await?;
        Ok(value)
    }
}

/// Releases the lock after work done under it. A lock found gone is the answer: the work
/// finished, but may not have been protected to its end (a session lock's loss is known up
/// to a second late). Any other failure is only logged: the lock was not known lost when the
/// work ended, and it frees at its lease end.
pub(crate) async fn release_after_work(guard: Guard, name: &str) -> Result<()> {
    match guard.release().await {
        Ok(()) => Ok(()),
        Err(error) if error.is_lock_lost() || error.is_not_owner() => Err(error),
        Err(error) => {
            tracing::warn!(lock = %name, %error, "releasing after the work failed; the lock frees at its lease end");
            Ok(())
        }
    }
}
