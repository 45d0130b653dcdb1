//! The blocking [`MultiLock`]: several locks taken all or nothing, and its [`MultiGuard`].

use std::fmt;
use std::time::Duration;

use super::held::{Held, blocking_guard};
use super::runtime::OnRuntime;
use crate::error::{Error, LossReason, Result};
use crate::options::AcquireOptions;

/// Several locks taken together, in one global order, made by [`Locks::multi_lock`]:
/// [`crate::MultiLock`] without `async`. Nothing is held unless everything is.
///
/// ```
/// # fn main() -> distlock::Result<()> {
/// let locks = distlock::blocking::connect("memory://")?;
/// let transfer = locks.multi_lock(["account/7", "account/3"])?;
/// let guard = transfer.acquire()?;
/// assert!(locks.is_locked("account/3")? && locks.is_locked("account/7")?);
/// assert!(guard.fencing_token("account/7").is_some());
/// guard.release()?;
/// # Ok(())
/// # }
/// ```
///
/// [`Locks::multi_lock`]: super::Locks::multi_lock
#[derive(Clone)]
pub struct MultiLock {
    inner: OnRuntime<crate::MultiLock>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl MultiLock {
    pub(crate) fn new(inner: OnRuntime<crate::MultiLock>) -> Self {
        MultiLock { inner }
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.get().names()
    }

    /// Blocks until every lock is held, without a limit, each with the client's renewed
    /// lease.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails (the parts already
    /// taken are given back), or the client's runtime could not answer.
    pub fn acquire(&self) -> Result<MultiGuard> {
        self.acquire_with(AcquireOptions::new())
    }

    /// Tries each lock once: `None` (and nothing held) when any is held by someone else.
    ///
    /// # Errors
    /// As [`MultiLock::acquire`].
    pub fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        let multi = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call(
                "acquire several locks",
                async move { multi.try_acquire().await },
            )?;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Every lock within one wait limit (for all parts together) and/or with a fixed lease
    /// (for every part, from the moment all are held).
    ///
    /// # Errors
    /// - [`Error::Timeout`](crate::Error::Timeout) when the wait runs out; nothing is held.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad lease or wait.
    /// - [`Error::Backend`](crate::Error::Backend) as for [`MultiLock::acquire`].
    pub fn acquire_with(&self, options: AcquireOptions) -> Result<MultiGuard> {
        let multi = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire several locks", async move {
                multi.acquire_with(options).await
            })?;
        Ok(self.guard(guard))
    }

    fn guard(&self, guard: crate::MultiGuard) -> MultiGuard {
        MultiGuard {
            held: Held::new(guard, self.inner.runtime().clone()),
        }
    }
}

blocking_guard!(
    /// Every lock of a [`MultiLock`]: [`crate::MultiGuard`] without `async`. Lost when any part
    /// is lost; dropping it releases every part in the background, as a dropped
    /// [`Guard`](super::Guard) does.
    #[must_use = "the locks are released as soon as the guard is dropped"]
    MultiGuard(crate::MultiGuard),
    "a part"
);

impl MultiGuard {
    /// The fencing token of the part `name`, or `None` when the multi-lock has no such part.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.held.get().fencing_token(name)
    }

    /// Every part's name and fencing token, in the order they were taken.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.held.get().fencing_tokens()
    }

    /// Moves the end of every part's fixed lease to `lease` from now.
    ///
    /// # Errors
    /// As [`Guard::extend`](super::Guard::extend), the first part's error.
    pub fn extend(&self, lease: Duration) -> Result<()> {
        self.held.call(
            "extend",
            move |guard| async move { guard.extend(lease).await },
        )
    }

    /// Releases every part.
    ///
    /// # Errors
    /// As [`Guard::release`](super::Guard::release): the first part's error, after every part
    /// was tried.
    pub fn release(self) -> Result<()> {
        self.held.release("release")
    }
}
