//! The blocking client, [`Locks`]: the handles it makes and the operator requests it sends.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::election::Election;
use super::multi::MultiLock;
use super::mutex::{Holder, Mutex};
use super::runtime::{OnRuntime, Runtime};
use super::rwlock::RwLock;
use super::semaphore::Semaphore;
use crate::backend::{Backend, LockInfo};
use crate::error::Result;
use crate::options::ConnectOptions;

/// A client of one lock backend: [`crate::Locks`] without `async`, made by
/// [`connect`](super::connect). Cheap to clone; clones share the connection, the renewal
/// task and the runtime thread.
#[derive(Clone)]
pub struct Locks {
    inner: OnRuntime<crate::Locks>,
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Locks {
    pub(crate) fn new(locks: crate::Locks, runtime: Arc<Runtime>) -> Self {
        Locks {
            inner: OnRuntime::new(locks, runtime),
        }
    }

    /// A client over a backend that `open` makes, such as a `fault::FaultyBackend` wrapper
    /// or one over an application's own pool:
    /// the counterpart of [`crate::Locks::with_backend`]. It starts the client's runtime
    /// thread and calls `open` there, because a backend's background tasks (its connections,
    /// its listeners) must live on the runtime that runs its requests.
    ///
    /// ```
    /// # fn main() -> distlock::Result<()> {
    /// let locks = distlock::blocking::Locks::with_backend(
    ///     || async { distlock::open_backend("memory://").await },
    ///     distlock::ConnectOptions::new(),
    /// )?;
    /// assert_eq!(locks.backend_scheme(), "memory");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// What `open` returns; [`Error::InvalidInput`](crate::Error::InvalidInput) for options
    /// out of range; [`Error::Backend`](crate::Error::Backend) when the runtime's thread
    /// cannot be started or `open` panics.
    pub fn with_backend<F, Fut>(open: F, options: ConnectOptions) -> Result<Locks>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let runtime = Runtime::start()?;
        let locks = runtime.call("open a backend", async move {
            let backend = open().await?;
            crate::Locks::with_backend(backend, options)
        })?;
        runtime.name_backend(locks.backend_scheme());
        Ok(Locks::new(locks, runtime))
    }

    /// A handle on the mutual-exclusion lock `name`. Cheap: nothing is sent to the backend.
    /// Every acquisition through it is a new owner, so threads sharing it exclude each other.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) when the name is empty or longer than
    /// [`LockName::MAX_BYTES`](crate::LockName::MAX_BYTES).
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        let mutex = self.inner.get().mutex(name)?;
        Ok(Mutex::new(self.inner.with(mutex)))
    }

    /// A handle on the semaphore `name`, which admits `permits` holders at once. Cheap.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, or a count of 0 or
    /// over [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Result<Semaphore> {
        let semaphore = self.inner.get().semaphore(name, permits)?;
        Ok(Semaphore::new(self.inner.with(semaphore)))
    }

    /// A handle on the reader-writer lock `name`. Cheap.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name.
    pub fn rwlock(&self, name: impl Into<String>) -> Result<RwLock> {
        let lock = self.inner.get().rwlock(name)?;
        Ok(RwLock::new(self.inner.with(lock)))
    }

    /// A handle on several locks taken all-or-nothing. Cheap.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, a name given twice,
    /// no names, or more than [`MultiLock::MAX_NAMES`](crate::MultiLock::MAX_NAMES).
    pub fn multi_lock<I, S>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let multi = self.inner.get().multi_lock(names)?;
        Ok(MultiLock::new(self.inner.with(multi)))
    }

    /// A handle on the leader election `name`. Cheap.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, or one too long for
    /// its `#leader` suffix.
    pub fn election(&self, name: impl Into<String>) -> Result<Election> {
        let election = self.inner.get().election(name)?;
        Ok(Election::new(self.inner.with(election)))
    }

    /// A new owner identity for reentrant locking.
    pub fn holder(&self) -> Holder {
        Holder::new(self.inner.with(self.inner.get().holder()))
    }

    /// True when anyone holds `name`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name;
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    /// runtime could not answer.
    pub fn is_locked(&self, name: &str) -> Result<bool> {
        let (locks, name) = (self.inner.get().clone(), name.to_owned());
        self.inner
            .runtime()
            .call("check a lock", async move { locks.is_locked(&name).await })
    }

    /// What the backend can tell about `name` (see [`crate::Locks::inspect`]). Changes
    /// nothing.
    ///
    /// # Errors
    /// As [`Locks::is_locked`].
    pub fn inspect(&self, name: &str) -> Result<LockInfo> {
        let (locks, name) = (self.inner.get().clone(), name.to_owned());
        self.inner
            .runtime()
            .call("inspect a lock", async move { locks.inspect(&name).await })
    }

    /// The names of the locks held now that start with `prefix`, in byte order, at most
    /// `limit` of them (see [`crate::Locks::list_held`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a limit of zero or above
    /// [`Locks::MAX_LIST`](crate::Locks::MAX_LIST); [`Error::Backend`](crate::Error::Backend) as for
    /// [`Locks::is_locked`].
    pub fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let (locks, prefix) = (self.inner.get().clone(), prefix.to_owned());
        self.inner.runtime().call("list held locks", async move {
            locks.list_held(&prefix, limit).await
        })
    }

    /// Frees `name` whoever holds it; true when it was held. For operators: the holder is
    /// told through its guard's `lost()` at its next renewal.
    ///
    /// # Errors
    /// As [`Locks::is_locked`].
    pub fn force_unlock(&self, name: &str) -> Result<bool> {
        let (locks, name) = (self.inner.get().clone(), name.to_owned());
        self.inner.runtime().call(
            "force-unlock",
            async move { locks.force_unlock(&name).await },
        )
    }

    /// Sends the backend's cheapest request and returns how long it took, the runtime's
    /// hand-over included.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    /// runtime could not answer.
    pub fn ping(&self) -> Result<Duration> {
        let locks = self.inner.get().clone();
        let start = std::time::Instant::now();
        self.inner
            .runtime()
            .call("ping", async move { locks.ping().await })?;
        Ok(start.elapsed())
    }

    /// The backend's URL scheme.
    pub fn backend_scheme(&self) -> &'static str {
        self.inner.get().backend_scheme()
    }

    /// This client's id, the first part of every owner string it writes.
    pub fn client_id(&self) -> &str {
        self.inner.get().client_id()
    }

    /// The lease of locks acquired without one of their own.
    pub fn lease(&self) -> Duration {
        self.inner.get().lease()
    }
}
