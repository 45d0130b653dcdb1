//! The blocking [`RwLock`]: any number of readers or one writer, and their guards.

use std::fmt;
use std::time::Duration;

use super::held::{Held, blocking_guard};
use super::runtime::OnRuntime;
use crate::error::{Error, LossReason, Result};
use crate::options::AcquireOptions;

/// A reader-writer lock, made by [`Locks::rwlock`]: [`crate::RwLock`] without `async` (how
/// it works on each backend is said there). Readers share; a writer excludes readers and
/// writers; a queued writer blocks later readers.
///
/// ```
/// # fn main() -> distlock::Result<()> {
/// let locks = distlock::blocking::connect("memory://")?;
/// let config = locks.rwlock("config")?;
/// let r1 = config.read()?;
/// let r2 = config.read()?;                 // readers share
/// assert!(config.try_write()?.is_none());  // a writer waits for them
/// let newest_read = r1.fencing_token().max(r2.fencing_token());
/// r1.release()?;
/// r2.release()?;
/// let w = config.write()?;
/// assert!(w.fencing_token() > newest_read); // writes are ordered after reads
/// w.release()?;
/// # Ok(())
/// # }
/// ```
///
/// [`Locks::rwlock`]: super::Locks::rwlock
#[derive(Clone)]
pub struct RwLock {
    inner: OnRuntime<crate::RwLock>,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl RwLock {
    pub(crate) fn new(inner: OnRuntime<crate::RwLock>) -> Self {
        RwLock { inner }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.get().name()
    }

    /// True when the backend keeps this lock in its own layout (see
    /// [`crate::RwLock::is_native`]).
    pub fn is_native(&self) -> bool {
        self.inner.get().is_native()
    }

    /// Blocks until a shared read lock is granted, without a limit, held with the client's
    /// renewed lease.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    /// runtime could not answer.
    pub fn read(&self) -> Result<ReadGuard> {
        self.read_with(AcquireOptions::new())
    }

    /// Tries once: `None` when a writer holds or waits, every reader slot is taken, or
    /// another acquisition is passing the lock's gate at this moment (see
    /// [`crate::RwLock::try_read`]).
    ///
    /// # Errors
    /// As [`RwLock::read`].
    pub fn try_read(&self) -> Result<Option<ReadGuard>> {
        let lock = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire a read lock", async move { lock.try_read().await })?;
        Ok(guard.map(|guard| self.read_guard(guard)))
    }

    /// A read lock with a wait limit and/or a fixed lease; the wait is as
    /// [`Mutex::acquire_with`](super::Mutex::acquire_with)'s.
    ///
    /// # Errors
    /// - [`Error::Timeout`](crate::Error::Timeout) when the wait runs out.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad lease or wait.
    /// - [`Error::Backend`](crate::Error::Backend) as for [`RwLock::read`].
    pub fn read_with(&self, options: AcquireOptions) -> Result<ReadGuard> {
        let lock = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire a read lock", async move {
                lock.read_with(options).await
            })?;
        Ok(self.read_guard(guard))
    }

    /// Blocks until the exclusive write lock is granted, without a limit, held with the
    /// client's renewed lease.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    pub fn write(&self) -> Result<WriteGuard> {
        self.write_with(AcquireOptions::new())
    }

    /// Tries once: `None` when anyone holds or waits for the lock.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    pub fn try_write(&self) -> Result<Option<WriteGuard>> {
        let lock = self.inner.get().clone();
        let guard =
            self.inner.runtime().call(
                "acquire a write lock",
                async move { lock.try_write().await },
            )?;
        Ok(guard.map(|guard| self.write_guard(guard)))
    }

    /// The write lock with a wait limit and/or a fixed lease.
    ///
    /// # Errors
    /// As [`RwLock::read_with`].
    pub fn write_with(&self, options: AcquireOptions) -> Result<WriteGuard> {
        let lock = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire a write lock", async move {
                lock.write_with(options).await
            })?;
        Ok(self.write_guard(guard))
    }

    fn read_guard(&self, guard: crate::ReadGuard) -> ReadGuard {
        ReadGuard {
            held: Held::new(guard, self.inner.runtime().clone()),
        }
    }

    fn write_guard(&self, guard: crate::WriteGuard) -> WriteGuard {
        WriteGuard {
            held: Held::new(guard, self.inner.runtime().clone()),
        }
    }
}

blocking_guard!(
    /// A shared read lock of an [`RwLock`]: [`crate::ReadGuard`] without `async`. Dropping it
    /// releases in the background, as a dropped [`Guard`](super::Guard) does.
    #[must_use = "the read lock is released as soon as the guard is dropped"]
    ReadGuard(crate::ReadGuard),
    "the read lock",
    "A writer may hold the lock after that."
);

impl ReadGuard {
    /// This read's fencing token: larger than every write's granted before it, smaller than
    /// every write's granted after it.
    pub fn fencing_token(&self) -> u64 {
        self.held.get().fencing_token()
    }

    /// Releases the read lock.
    ///
    /// # Errors
    /// As [`Guard::release`](super::Guard::release).
    pub fn release(self) -> Result<()> {
        self.held.release("release a read lock")
    }
}

blocking_guard!(
    /// The exclusive write lock of an [`RwLock`]: [`crate::WriteGuard`] without `async`.
    /// Dropping it releases in the background, as a dropped [`Guard`](super::Guard) does.
    #[must_use = "the write lock is released as soon as the guard is dropped"]
    WriteGuard(crate::WriteGuard),
    "a lock the write holds"
);

impl WriteGuard {
    /// This write's fencing token: larger than every read's and write's granted before it.
    pub fn fencing_token(&self) -> u64 {
        self.held.get().fencing_token()
    }

    /// Moves the end of a fixed lease on every lock the write holds.
    ///
    /// # Errors
    /// As [`Guard::extend`](super::Guard::extend), the first part's error.
    pub fn extend(&self, lease: Duration) -> Result<()> {
        self.held.call(
            "extend",
            move |guard| async move { guard.extend(lease).await },
        )
    }

    /// Releases the write lock.
    ///
    /// # Errors
    /// As [`Guard::release`](super::Guard::release): the first part's error, after every part
    /// was tried.
    pub fn release(self) -> Result<()> {
        self.held.release("release a write lock")
    }
}
