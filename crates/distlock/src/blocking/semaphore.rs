//! The blocking [`Semaphore`]: `permits` holders at once, each permit a [`Guard`].

use std::fmt;

use super::guard::Guard;
use super::runtime::OnRuntime;
use crate::error::Result;
use crate::options::AcquireOptions;

/// A semaphore of `permits` holders at once, made by [`Locks::semaphore`]:
/// [`crate::Semaphore`] without `async` (how it works, and the permit count every client
/// must share, are said there). A permit is a [`Guard`] with all a mutex guard has.
///
/// ```
/// # fn main() -> distlock::Result<()> {
/// let locks = distlock::blocking::connect("memory://")?;
/// let exports = locks.semaphore("exports", 2)?;
/// let a = exports.acquire()?;
/// let b = exports.acquire()?;
/// assert!(exports.try_acquire()?.is_none()); // two at once, no more
/// a.release()?;
/// let c = exports.acquire()?;
/// # b.release()?;
/// # c.release()?;
/// # Ok(())
/// # }
/// ```
///
/// [`Locks::semaphore`]: super::Locks::semaphore
#[derive(Clone)]
pub struct Semaphore {
    inner: OnRuntime<crate::Semaphore>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Semaphore {
    pub(crate) fn new(inner: OnRuntime<crate::Semaphore>) -> Self {
        Semaphore { inner }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.get().name()
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.inner.get().permits()
    }

    /// Blocks until a permit is granted, without a limit, held with the client's renewed
    /// lease.
    ///
    /// # Errors
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) when the name's registered count
    ///   is another.
    /// - [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    ///   runtime could not answer.
    pub fn acquire(&self) -> Result<Guard> {
        self.acquire_with(AcquireOptions::new())
    }

    /// Tries every permit once and returns: `None` when all are held.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let semaphore = self.inner.get().clone();
        let permit = self.inner.runtime().call("acquire a permit", async move {
            semaphore.try_acquire().await
        })?;
        Ok(permit.map(|permit| Guard::new(permit, self.inner.runtime().clone())))
    }

    /// A permit with a wait limit and/or a fixed lease; the wait is as
    /// [`Mutex::acquire_with`](super::Mutex::acquire_with)'s.
    ///
    /// # Errors
    /// - [`Error::Timeout`](crate::Error::Timeout) when the wait runs out.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad lease or wait, or
    ///   when the name's registered count is another.
    /// - [`Error::Backend`](crate::Error::Backend) as for [`Semaphore::acquire`].
    pub fn acquire_with(&self, options: AcquireOptions) -> Result<Guard> {
        let semaphore = self.inner.get().clone();
        let permit = self.inner.runtime().call("acquire a permit", async move {
            semaphore.acquire_with(options).await
        })?;
        Ok(Guard::new(permit, self.inner.runtime().clone()))
    }

    /// How many permits nobody holds now, by asking every permit's lock (it may be stale by
    /// the time it returns).
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) as for [`Semaphore::acquire`].
    pub fn available(&self) -> Result<u32> {
        let semaphore = self.inner.get().clone();
        self.inner.runtime().call(
            "count free permits",
            async move { semaphore.available().await },
        )
    }

    /// Makes this handle's count the one every client of the name must use (see
    /// [`crate::Semaphore::register_permits`]). Blocks without a limit for the registration's
    /// lock.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) as for [`Semaphore::acquire`].
    pub fn register_permits(&self) -> Result<()> {
        let semaphore = self.inner.get().clone();
        self.inner
            .runtime()
            .call("register a permit count", async move {
                semaphore.register_permits().await
            })
    }
}
