//! The blocking mutex handle, [`Mutex`], and the holder identity of reentrant locking,
//! [`Holder`].

use std::fmt;

use super::guard::Guard;
use super::runtime::OnRuntime;
use crate::backend::Owner;
use crate::error::Result;
use crate::options::AcquireOptions;

/// A handle on one distributed mutual-exclusion lock, made by [`Locks::mutex`] or
/// [`Holder::mutex`]: [`crate::Mutex`] without `async`. Cheap to clone.
///
/// A handle from `Locks::mutex` gives every acquisition its own owner, so threads that share
/// the handle exclude each other. A handle from [`Holder::mutex`] acquires as that holder
/// and re-enters a lock it holds.
///
/// [`Locks::mutex`]: super::Locks::mutex
#[derive(Clone)]
pub struct Mutex {
    inner: OnRuntime<crate::Mutex>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Mutex {
    pub(crate) fn new(inner: OnRuntime<crate::Mutex>) -> Self {
        Mutex { inner }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.get().name()
    }

    /// The holder this handle acquires as, when it is bound to one ([`Holder::mutex`]).
    pub fn holder(&self) -> Option<&Owner> {
        self.inner.get().holder()
    }

    /// Blocks until the lock is granted, without a limit, and holds it with the client's
    /// lease (30 s by default), renewed in the background while the guard lives. Bound the
    /// wait with [`Mutex::acquire_with`] and [`AcquireOptions::wait`]: a blocking call
    /// cannot be cancelled.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails (the wait ends then),
    /// or when the client's runtime could not answer.
    pub fn acquire(&self) -> Result<Guard> {
        self.acquire_with(AcquireOptions::new())
    }

    /// Tries once and returns at once (after a round trip): `None` when someone else holds
    /// the lock.
    ///
    /// # Errors
    /// As [`Mutex::acquire`].
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let mutex = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire", async move { mutex.try_acquire().await })?;
        Ok(guard.map(|guard| Guard::new(guard, self.inner.runtime().clone())))
    }

    /// Acquires with a wait limit and/or a fixed lease. With [`AcquireOptions::wait`] the
    /// calling thread blocks about that long at most (plus a round trip) and gets
    /// [`Error::Timeout`](crate::Error::Timeout) after it; nothing is left behind (no hold,
    /// no place in a queue), as when an async acquisition is dropped at its limit.
    ///
    /// # Errors
    /// - [`Error::Timeout`](crate::Error::Timeout) when the wait runs out.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a zero or absurd lease, or a
    ///   wait over one day.
    /// - [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    ///   runtime could not answer.
    pub fn acquire_with(&self, options: AcquireOptions) -> Result<Guard> {
        let mutex = self.inner.get().clone();
        let guard = self
            .inner
            .runtime()
            .call("acquire", async move { mutex.acquire_with(options).await })?;
        Ok(Guard::new(guard, self.inner.runtime().clone()))
    }

    /// Acquires the lock (blocking as [`Mutex::acquire`] does), runs `work` on the calling
    /// thread with the grant's fencing token, and releases the lock.
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// let locks = distlock::blocking::connect("memory://")?;
    /// let sold = locks.mutex("concert/42")?.run(|token| {
    ///     // Read, check and write the stock, passing `token` to a fenced store.
    ///     let _ = token;
    ///     1
    /// })?;
    /// assert_eq!(sold, 1);
    /// assert!(!locks.is_locked("concert/42")?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Unlike the async [`crate::Mutex::run`], which drops its work at the loss, a closure
    /// cannot be stopped from outside: `work` runs to its end, and if the lock was lost
    /// meanwhile the answer is the loss, not the work's value. Work that must stop when the
    /// lock is lost acquires a [`Guard`] and checks [`Guard::is_lost`] between its steps. If
    /// `work` panics, the guard is dropped and releases in the background.
    ///
    /// # Errors
    /// As [`Mutex::acquire`]; [`Error::LockLost`](crate::Error::LockLost) when the lock was
    /// lost during the work, and `LockLost` or [`Error::NotOwner`](crate::Error::NotOwner)
    /// when the release found it gone. Any other failed release is logged, not returned (the
    /// lock frees at its lease end), as [`crate::Mutex::run`] does.
    pub fn run<T>(&self, work: impl FnOnce(u64) -> T) -> Result<T> {
        self.run_with(AcquireOptions::new(), work)
    }

    /// As [`Mutex::run`], acquiring with `options` (a wait limit, a fixed lease).
    ///
    /// # Errors
    /// As [`Mutex::acquire_with`] and [`Mutex::run`].
    pub fn run_with<T>(&self, options: AcquireOptions, work: impl FnOnce(u64) -> T) -> Result<T> {
        let guard = self.acquire_with(options)?;
        let value = work(guard.fencing_token());
        guard.release_after_work()?;
        Ok(value)
    }
}

/// An owner identity for reentrant locking, made by [`Locks::holder`]:
/// [`crate::Holder`] without `async`. Clones are the same holder.
///
/// Ownership never depends on the thread: code that holds a lock and calls code that locks
/// it again passes the holder (or the guard, see [`Guard::reenter`]) along.
///
/// ```
/// # fn main() -> distlock::Result<()> {
/// let locks = distlock::blocking::connect("memory://")?;
/// let me = locks.holder();
/// let outer = me.mutex("account/7")?.acquire()?;
/// let inner = me.mutex("account/7")?.acquire()?; // re-enters: hold count 2
/// outer.release()?;
/// assert!(locks.is_locked("account/7")?);        // one hold left
/// inner.release()?;
/// assert!(!locks.is_locked("account/7")?);
/// # Ok(())
/// # }
/// ```
///
/// [`Locks::holder`]: super::Locks::holder
#[derive(Clone)]
pub struct Holder {
    inner: OnRuntime<crate::Holder>,
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Holder {
    pub(crate) fn new(inner: OnRuntime<crate::Holder>) -> Self {
        Holder { inner }
    }

    /// A handle on the lock `name` that acquires as this holder (reentrant).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for an empty or too long name.
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        let mutex = self.inner.get().mutex(name)?;
        Ok(Mutex::new(self.inner.with(mutex)))
    }

    /// The identity as backends store it.
    pub fn owner(&self) -> &Owner {
        self.inner.get().owner()
    }
}
