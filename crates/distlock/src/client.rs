//! The client handle, [`Locks`]: the lock handles it makes and the operator requests it
//! sends. What it knows about held locks lives in the keeper.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::Backend;
use crate::error::Result;
use crate::keeper::ClientInner;
use crate::mutex::{Holder, Mutex};
use crate::name::LockName;
use crate::options::ConnectOptions;

/// A client of one lock backend. Cheap to clone; clones share the connection, the client id
/// and the renewal task.
///
/// Made by [`connect`](crate::connect). Hand out lock handles with [`Locks::mutex`].
#[derive(Clone)]
pub struct Locks {
    pub(crate) inner: Arc<ClientInner>,
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("backend", &self.inner.backend)
            .field("client_id", &self.inner.client_id)
            .finish_non_exhaustive()
    }
}

/// [`Locks::MAX_LIST`].
pub(crate) const MAX_LIST: usize = 100_000;

impl Locks {
    /// The most names one [`Locks::list_held`] answers.
    pub const MAX_LIST: usize = MAX_LIST;

    /// A client over a backend built outside this crate.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) when the options are out of range.
    pub fn with_backend(backend: Arc<dyn Backend>, options: ConnectOptions) -> Result<Self> {
        crate::meter::describe();
        options.validate()?;
        Ok(Locks {
            inner: Arc::new(ClientInner::new(backend, options)),
        })
    }

    /// A handle on the mutual-exclusion lock `name`. Cheap: nothing is sent to the backend.
    ///
    /// Every acquisition through the handle is a new owner, so tasks sharing the handle
    /// exclude each other. For reentrant locking use [`Locks::holder`] or
    /// [`Guard::reenter`](crate::Guard::reenter).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) when the name is empty or longer than
    /// [`LockName::MAX_BYTES`](crate::LockName::MAX_BYTES).
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        Ok(Mutex::new(self.inner.clone(), LockName::new(name)?, None))
    }

    /// A handle on the semaphore `name`, which admits `permits` holders at once. Cheap:
    /// nothing is sent to the backend. Every client must give the same count for a name.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, or a count of 0 or
    /// over [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Result<crate::Semaphore> {
        crate::Semaphore::new(self.inner.clone(), name.into(), permits)
    }

    /// A handle on the reader-writer lock `name`. Cheap: nothing is sent to the backend.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name.
    pub fn rwlock(&self, name: impl Into<String>) -> Result<crate::RwLock> {
        crate::RwLock::new(self.inner.clone(), name.into())
    }

    /// A handle on several locks taken all-or-nothing. Cheap: nothing is sent to the backend.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, a name given twice,
    /// no names, or more than [`MultiLock::MAX_NAMES`](crate::MultiLock::MAX_NAMES).
    pub fn multi_lock<I, S>(&self, names: I) -> Result<crate::MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        crate::MultiLock::new(self.inner.clone(), names)
    }

    /// A handle on the leader election `name`; its leader holds the mutex `<name>#leader`, or
    /// on ZooKeeper and etcd leads the servers' own election recipe on `<name>` (see
    /// [`Election`](crate::Election)). Cheap: nothing is sent to the backend.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name, or one too long for
    /// its `#leader` suffix.
    pub fn election(&self, name: impl Into<String>) -> Result<crate::Election> {
        crate::Election::new(self.inner.clone(), name.into())
    }

    /// A new owner identity for reentrant locking: the handles it makes acquire as this
    /// holder, so acquiring a lock the holder already holds re-enters it.
    pub fn holder(&self) -> Holder {
        Holder::new(self.inner.clone(), self.inner.new_owner())
    }

    /// True when anyone holds `name`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        self.inner.backend.is_locked(&name).await
    }

    /// What the backend can tell about `name`: held or not, and where it knows them, the
    /// holder, its hold count, the fencing token, the lease left and the queued waiters.
    /// Changes nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// let locks = distlock::connect("memory://").await?;
    /// let guard = locks.mutex("report/daily")?.acquire().await?;
    /// let info = locks.inspect("report/daily").await?;
    /// assert!(info.locked);
    /// assert_eq!(info.fencing_token, Some(guard.fencing_token()));
    /// # guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<crate::backend::LockInfo> {
        let name = LockName::new(name)?;
        self.inner.backend.inspect(&name).await
    }

    /// The names of the locks held now that start with `prefix`, in byte order, at most
    /// `limit` of them (an operator's tool: `distlock list`). What each backend can list,
    /// and what it costs, is on its page in `docs/backends/`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// let locks = distlock::connect("memory://").await?;
    /// let guard = locks.mutex("orders/42")?.acquire().await?;
    /// assert_eq!(locks.list_held("orders/", 100).await?, ["orders/42"]);
    /// # guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a limit of zero or above
    /// [`Locks::MAX_LIST`]; backend errors.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 || limit > MAX_LIST {
            return Err(crate::Error::invalid(
                "limit",
                format!("{limit} is outside 1..={MAX_LIST}; list by a longer prefix instead"),
            ));
        }
        self.inner.backend.list_held(prefix, limit).await
    }

    /// Frees `name` whoever holds it; true when it was held. For operators: the holder is
    /// told through [`Guard::lost`](crate::Guard::lost) at its next renewal, and its writes
    /// are refused only where the resource checks fencing tokens.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have freed the lock.
    pub async fn force_unlock(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        let freed = self.inner.backend.force_unlock(&name).await?;
        tracing::info!(lock = %name, freed, "force unlock");
        Ok(freed)
    }

    /// Sends the backend's cheapest request and returns how long it took.
    pub async fn ping(&self) -> Result<Duration> {
        let start = std::time::Instant::now();
        self.inner.backend.ping().await?;
        Ok(start.elapsed())
    }

    /// Waits until the work this process left to the background has ended, at most
    /// `within`: the releases of dropped guards and leaderships, the queue entries of
    /// dropped or timed-out waits, the undoing of cancelled requests. True when nothing is
    /// left. Call it before a process exits (the end of `main`, a signal handler): a task
    /// still queued when the runtime stops never runs, and what it was to remove stays on
    /// the server until a lease or a staleness limit ends it.
    ///
    /// It counts this whole process's work, every client's, and what is started meanwhile.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = distlock::connect("memory://").await?;
    /// drop(locks.mutex("job")?.acquire().await?); // released in the background
    /// assert!(locks.wait_for_cleanups(Duration::from_secs(5)).await);
    /// assert!(!locks.is_locked("job").await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_for_cleanups(&self, within: Duration) -> bool {
        crate::cleanup::settled(within).await
    }

    /// See [`Backend::attempts_share_a_connection`].
    pub(crate) fn attempts_share_a_connection(&self) -> bool {
        self.inner.backend.attempts_share_a_connection()
    }

    /// The backend's URL scheme.
    pub fn backend_scheme(&self) -> &'static str {
        self.inner.backend.scheme()
    }

    /// This client's id, the first part of every owner string it writes: `HOST/PID/UUID`,
    /// unique by its UUID and readable by its host and process id (`distlock status` shows
    /// who holds a lock).
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// The lease of locks acquired without one of their own.
    pub fn lease(&self) -> Duration {
        self.inner.options.lease_duration()
    }

    /// The state of the backend's session, for backends whose locks live in a session
    /// (ZooKeeper): [`SessionState::Connected`](crate::SessionState::Connected) or
    /// [`SessionState::Suspended`](crate::SessionState::Suspended), and how many sessions were
    /// lost. `None` for backends whose locks live by their leases alone.
    ///
    /// ```no_run
    /// # async fn run(locks: distlock::Locks) {
    /// if let Some(mut session) = locks.session() {
    ///     while session.changed().await.is_ok() {
    ///         let status = *session.borrow();
    ///         if status.state == distlock::SessionState::Suspended {
    ///             // Pause unfenced writes until Connected again, or until `lost()` fires.
    ///         }
    ///     }
    /// }
    /// # }
    /// ```
    pub fn session(&self) -> Option<watch::Receiver<crate::SessionStatus>> {
        self.inner.backend.session()
    }

    /// How many renewal requests this client has sent ([`crate::hooks`]).
    #[cfg(any(feature = "bench", feature = "conformance"))]
    pub(crate) fn renewal_requests(&self) -> u64 {
        self.inner
            .renewal_calls
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
