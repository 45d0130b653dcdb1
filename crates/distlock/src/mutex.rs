//! The distributed mutual-exclusion lock: its handle, its guard, and the holder identity of
//! reentrant locking.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Owner;
use crate::error::{Error, Result};
use crate::keeper::ClientInner;
use crate::name::LockName;
use crate::options::AcquireOptions;

mod acquire;
mod guard;
mod run;

pub use self::guard::Guard;
pub(crate) use self::run::release_after_work;

/// A handle on one distributed mutual-exclusion lock, made by
/// [`Locks::mutex`](crate::Locks::mutex) or [`Holder::mutex`].
///
/// A handle from `Locks::mutex` gives every acquisition its own owner identity, so tasks that
/// share the handle (or clones of it) exclude each other, as with `tokio::sync::Mutex`.
/// A handle from [`Holder::mutex`] acquires as that holder: acquiring again while holding
/// re-enters the lock and increments its hold count, and the lock is free once every guard
/// has been released.
#[derive(Clone)]
pub struct Mutex {
    client: Arc<ClientInner>,
    name: LockName,
    /// `None`: a fresh owner per acquisition.
    holder: Option<Owner>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .finish()
    }
}

impl Mutex {
    pub(crate) fn new(client: Arc<ClientInner>, name: LockName, holder: Option<Owner>) -> Self {
        Mutex {
            client,
            name,
            holder,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The holder this handle acquires as, when it is bound to one ([`Holder::mutex`]).
    pub fn holder(&self) -> Option<&Owner> {
        self.holder.as_ref()
    }

    /// Waits until the lock is granted, without a limit, and holds it with the client's lease
    /// (30 s by default), renewed every third of the lease while the guard lives.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails; the wait ends then.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropping the future leaves nothing behind: a grant that arrives after the
    /// drop is released in the background.
    pub async fn acquire(&self) -> Result<Guard> {
        self.acquire_with(AcquireOptions::new()).await
    }

    /// Tries once and returns at once: `None` when someone else holds the lock.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.acquire_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Acquires with a wait limit and/or a fixed lease (Redisson's
    /// `tryLock(waitTime, leaseTime)`).
    ///
    /// # Notable errors
    /// - [`Error::Timeout`] when the wait runs out.
    /// - [`Error::InvalidInput`] for a zero or absurd lease, or a wait over one day.
    /// - [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::acquire`].
    pub async fn acquire_with(&self, options: AcquireOptions) -> Result<Guard> {
        let start = Instant::now();
        self.acquire_inner(options)
            .await?
            .ok_or_else(|| Error::timed_out(&self.name, start))
    }

    pub(crate) async fn acquire_inner(&self, options: AcquireOptions) -> Result<Option<Guard>> {
        options.validate()?;
        let span = tracing::debug_span!(
            "distlock.acquire",
            lock = %self.name,
            backend = self.client.backend.scheme(),
        );
        let owner = match &self.holder {
            Some(holder) => holder.clone(),
            None => self.client.new_owner(),
        };
        acquire::acquire_loop(&self.client, &self.name, &owner, options)
            .instrument(span)
            .await
    }
}

/// An explicit owner identity for reentrant locking, made by
/// [`Locks::holder`](crate::Locks::holder). Clones are the same holder.
///
/// Ownership never depends on the OS thread (tasks move between threads): code that holds a
/// lock and calls code that locks it again passes the holder (or the guard, see
/// [`Guard::reenter`]) along.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let me = locks.holder();
/// let outer = me.mutex("account/7")?.acquire().await?;
/// let inner = me.mutex("account/7")?.acquire().await?; // re-enters: hold count 2
/// outer.release().await?;
/// assert!(locks.is_locked("account/7").await?);       // one hold left
/// inner.release().await?;
/// assert!(!locks.is_locked("account/7").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Holder {
    client: Arc<ClientInner>,
    owner: Owner,
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Holder").field(&self.owner).finish()
    }
}

impl Holder {
    pub(crate) fn new(client: Arc<ClientInner>, owner: Owner) -> Self {
        Holder { client, owner }
    }

    /// A handle on the lock `name` that acquires as this holder (reentrant).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty or too long name.
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        Ok(Mutex::new(
            self.client.clone(),
            LockName::new(name)?,
            Some(self.owner.clone()),
        ))
    }

    /// The identity as backends store it.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }
}
