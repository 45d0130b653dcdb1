//! The distributed counting semaphore: `permits` holders at once, each permit a lock of its
//! own on one of the semaphore's permit slots.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::backend::{Owner, Published};
use crate::error::{Error, Result};
use crate::keeper::ClientInner;
use crate::mutex::{Guard, Mutex};
use crate::name::LockName;
use crate::options::{AcquireOptions, MAX_DURATION};

/// [`Semaphore::MAX_PERMITS`].
pub(crate) const MAX_PERMITS: u32 = 256;

/// [`Semaphore::COUNT_CHECK_EVERY`].
pub(crate) const COUNT_CHECK_EVERY: Duration = Duration::from_secs(1);

/// A semaphore of `permits` holders at once, made by
/// [`Locks::semaphore`](crate::Locks::semaphore).
///
/// Every permit is a lock on one of the semaphore's permit slots, the lock names
/// `<name>#permit-0` to `<name>#permit-<permits - 1>`, so a permit is a [`Guard`] with all a
/// mutex guard has: its own lease and renewal, [`Guard::lost`], and a fencing token that grows
/// strictly with every grant of its slot ([`Guard::name`] says which slot). A crashed
/// holder's permit frees itself as that backend's mutex does (its lease ends, or its session
/// or connection does). The slot names are the semaphore's: do not use them for mutexes.
///
/// An acquisition first tries the slots one by one from a random one; when all are held it
/// waits on every slot at once and takes the first it is granted, giving the others up. On a
/// backend that serves its mutex's waiters in arrival order, a waiter is queued on every slot,
/// so the earliest waiter gets the next free permit.
///
/// # Permit count
/// Every client must use the same count for a name. The first acquisition of a name registers
/// its count in the backend (a published record under `<name>#permits`, written under the lock
/// `<name>#permits`: both names are the semaphore's); a handle reads it at its first
/// acquisition, again at least every [`Semaphore::COUNT_CHECK_EVERY`] while it acquires, and whenever it
/// finds all its slots held, and fails with [`Error::InvalidInput`] when it asks with another
/// count, larger or smaller. [`Semaphore::register_permits`] changes the registered count for
/// everyone; clients on the old count see it within that interval of their next acquisition.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let exports = locks.semaphore("exports", 2)?;
/// let a = exports.acquire().await?;
/// let b = exports.acquire().await?;
/// assert!(exports.try_acquire().await?.is_none());  // two at once, no more
/// a.release().await?;
/// let c = exports.acquire().await?;
/// # b.release().await?;
/// # c.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// One lock name per permit.
    slots: Arc<[LockName]>,
    /// Where the name's count is registered (`<name>#permits`), for a user's semaphore; the
    /// reader slots of a reader-writer lock have a fixed count and none.
    registry: Option<LockName>,
    /// When this handle last found its count registered.
    checked: Arc<StdMutex<Option<Instant>>>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.slots.len())
            .finish()
    }
}

/// The lock name of permit slot `index` of the semaphore (or reader set) `name`.
pub(crate) fn slot_name(name: &str, kind: &str, index: u32) -> Result<LockName> {
    LockName::new(format!("{name}#{kind}-{index}")).map_err(|_| {
        Error::invalid(
            "lock name",
            format!(
                "the name is {} bytes long; with its slot suffix (\"#{kind}-{index}\") it must fit \
                 in {} bytes",
                name.len(),
                crate::name::MAX_NAME_BYTES
            ),
        )
    })
}

impl Semaphore {
    /// The most permits a [`Semaphore`] can have: a waiting acquirer waits on every permit slot.
    pub const MAX_PERMITS: u32 = MAX_PERMITS;

    /// How often a handle reads its semaphore's registered count again while it acquires, so that
    /// a count changed with [`Semaphore::register_permits`] is seen this long after at most.
    pub const COUNT_CHECK_EVERY: Duration = COUNT_CHECK_EVERY;

    pub(crate) fn new(client: Arc<ClientInner>, name: String, permits: u32) -> Result<Self> {
        let mut semaphore = Self::with_slots(client, name, permits, "permit")?;
        // Shorter than the slots' suffixes, which fit.
        semaphore.registry = Some(LockName::new(format!("{}#permits", semaphore.name))?);
        Ok(semaphore)
    }

    /// A semaphore over the slots `<name>#<kind>-<i>`.
    pub(crate) fn with_slots(
        client: Arc<ClientInner>,
        name: String,
        permits: u32,
        kind: &str,
    ) -> Result<Self> {
        LockName::new(name.as_str())?;
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::invalid(
                "permit count",
                format!("{permits} permits asked; give 1 to {MAX_PERMITS}"),
            ));
        }
        let slots = (0..permits)
            .map(|index| slot_name(&name, kind, index))
            .collect::<Result<Arc<[LockName]>>>()?;
        // Room for the slot just past the count, so that a name fits every count up to it.
        slot_name(&name, kind, permits)?;
        Ok(Semaphore {
            client,
            name: name.into(),
            slots,
            registry: None,
            checked: Arc::default(),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        // At most MAX_PERMITS, checked when made.
        u32::try_from(self.slots.len()).unwrap_or(MAX_PERMITS)
    }

    /// Waits for a permit without a limit, held with the client's renewed lease.
    ///
    /// # Notable errors
    /// - [`Error::InvalidInput`] when the name's registered count is another.
    /// - [`Error::Backend`] when the backend fails; the wait ends then.
    ///
    /// # Cancel safety
    /// Cancel safe: every slot's acquisition is, so a dropped acquire leaves no permit, no
    /// queue entry, and a grant that arrives after the drop is given back in the background.
    pub async fn acquire(&self) -> Result<Guard> {
        self.acquire_with(AcquireOptions::new()).await
    }

    /// Tries every slot once and returns at once: `None` when all permits are held.
    ///
    /// # Notable errors
    /// As [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.acquire_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Acquires a permit with a wait limit and/or a fixed lease.
    ///
    /// # Notable errors
    /// - [`Error::Timeout`] when the wait runs out.
    /// - [`Error::InvalidInput`] for a bad lease or wait, or when the name's registered count
    ///   is another.
    /// - [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn acquire_with(&self, options: AcquireOptions) -> Result<Guard> {
        let start = Instant::now();
        self.acquire_inner(options)
            .await?
            .ok_or_else(|| Error::timed_out(&self.name, start))
    }

    /// How many permit slots nobody holds now, by asking every slot (an operator's and a
    /// test's tool; it may be stale by the time it returns). On ZooKeeper a free slot with a
    /// queued waiter counts as held; on a fair Redis lock a free slot reserved for a queued
    /// waiter counts as free.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn available(&self) -> Result<u32> {
        let mut free = 0;
        for slot in self.slots.iter() {
            if !self.client.backend.is_locked(slot).await? {
                free += 1;
            }
        }
        Ok(free)
    }

    /// The mutex of slot `index`, acquiring as `owner` (`None`: a new owner per acquisition).
    pub(crate) fn slot(&self, index: usize, owner: Option<Owner>) -> Mutex {
        Mutex::new(self.client.clone(), self.slots[index].clone(), owner)
    }

    /// Makes this handle's count the one every client of the name must use: a client that
    /// asks with another count is refused from its next check (its first acquisition, one at
    /// least [`Semaphore::COUNT_CHECK_EVERY`] after its last check, or one that finds every permit held).
    /// For changing a semaphore's count; the first acquisition of a name registers its count
    /// by itself. Waits without a limit for the registration's lock.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe: the registration is one lock acquisition and one publish; dropped between
    /// them, the count is either registered or not.
    pub async fn register_permits(&self) -> Result<()> {
        if let Some(registry) = &self.registry {
            self.check_count(registry, true, AcquireOptions::new())
                .await?;
        }
        Ok(())
    }

    /// True when this handle's last check of the count is older than [`Semaphore::COUNT_CHECK_EVERY`].
    fn check_due(&self) -> bool {
        let checked = self
            .checked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        checked.is_none_or(|at| at.elapsed() >= COUNT_CHECK_EVERY)
    }

    /// Reads the name's registered count and refuses a different one; registers this
    /// handle's count when none is registered (or when `replace`), under the registry's lock,
    /// so that two first clients with different counts cannot both register.
    /// False when the registration's lock was not free within `options`' wait.
    async fn check_count(
        &self,
        registry: &LockName,
        replace: bool,
        options: AcquireOptions,
    ) -> Result<bool> {
        let backend = &self.client.backend;
        let mine = self.slots.len();
        if !replace && let Some(record) = backend.read_published(registry).await? {
            return self.same_count(&record).map(|()| true);
        }
        let lock = Mutex::new(self.client.clone(), registry.clone(), None);
        let Some(guard) = lock
            .acquire_inner(AcquireOptions::new().wait(options.wait_limit().unwrap_or(MAX_DURATION)))
            .await?
        else {
            return Ok(false);
        };
        let result = async {
            if !replace && let Some(record) = backend.read_published(registry).await? {
                return self.same_count(&record);
            }
            let record = Published::new(
                guard.fencing_token(),
                mine.to_string(),
                guard.owner().as_str(),
            );
            let stored = backend.publish(registry, &record).await?;
            self.same_count(&stored)
        }
        .await;
        if let Err(error) = guard.release().await {
            tracing::debug!(semaphore = %self.name, %error, "releasing the count's registration lock failed");
        }
        result.map(|()| true)
    }

    /// Refuses a registered count other than this handle's; notes the check's time.
    fn same_count(&self, record: &Published) -> Result<()> {
        let mine = self.slots.len();
        if record.value == mine.to_string() {
            *self
                .checked
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
            return Ok(());
        }
        Err(Error::invalid(
            "permit count",
            format!(
                "semaphore {:?} is registered with {} permits and this client asks for {mine}; \
                 give every client the same count (Semaphore::register_permits changes it for \
                 all)",
                self.name, record.value
            ),
        ))
    }

    pub(crate) async fn acquire_inner(&self, options: AcquireOptions) -> Result<Option<Guard>> {
        options.validate()?;
        let start = Instant::now();
        let checked_now = self.registry.is_some() && self.check_due();
        if let Some(registry) = &self.registry
            && checked_now
            && !self.check_count(registry, false, options).await?
        {
            // The count's registration is busy past the wait.
            return Ok(None);
        }
        let count = self.slots.len();
        let first = fastrand::usize(..count);
        for step in 0..count {
            let slot = self.slot((first + step) % count, None);
            if let Some(guard) = slot.acquire_inner(options.wait(Duration::ZERO)).await? {
                return Ok(Some(guard));
            }
        }
        if let Some(registry) = &self.registry
            && !checked_now
        {
            // About to wait: the count may have been changed for everyone since the last
            // check (one made by this acquisition a moment ago is as fresh).
            if !self
                .check_count(registry, false, options.wait_left(start))
                .await?
            {
                return Ok(None);
            }
        }
        if options
            .wait_limit()
            .is_some_and(|wait| wait <= start.elapsed())
        {
            return Ok(None);
        }
        let options = options.wait_left(start);
        // Wait on every slot; the first grant wins and the other acquisitions are dropped,
        // which gives back anything they were granted meanwhile.
        let mut racers: FuturesUnordered<_> = (0..count)
            .map(|index| {
                let slot = self.slot(index, None);
                async move { slot.acquire_with(options).await }
            })
            .collect();
        while let Some(result) = racers.next().await {
            match result {
                Ok(guard) => return Ok(Some(guard)),
                Err(error) if error.is_timeout() => {}
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }
}
