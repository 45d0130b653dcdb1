//! The distributed reader-writer lock, built on the mutex of any backend: a gate that every
//! acquisition passes and a fixed set of reader slots that a writer takes all of.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use tokio::time::Instant;

use crate::error::{Error, LossReason, Result};
use crate::guard_set::GuardSet;
use crate::keeper::ClientInner;
use crate::mutex::{Guard, Mutex};
use crate::name::{LockKind, LockName};
use crate::options::AcquireOptions;
use crate::semaphore::Semaphore;

/// [`RwLock::READER_SLOTS`].
pub(crate) const READER_SLOTS: u32 = 16;

/// A reader-writer lock, made by [`Locks::rwlock`](crate::Locks::rwlock): any number of
/// readers (up to [`RwLock::READER_SLOTS`], except where the backend keeps the lock in its own
/// layout: [`RwLock::is_native`]) or one writer.
///
/// # On ZooKeeper: Curator's layout
/// On `zk://` ([`RwLock::is_native`]) readers and writers are the `__READ__` and `__WRIT__`
/// sequential nodes of Apache Curator's `InterProcessReadWriteLock` under the path of
/// `<name>`, in one line: a writer holds when first, a reader when no writer is ahead of it.
/// A queued writer blocks later readers; each grant's token is its node's creation zxid, so a
/// write's token is larger than every read's granted before it and smaller than every read's
/// granted after it (readers holding together have different tokens). No reader limit; the
/// slots below are not used. Java services using Curator on the same path share the lock.
///
/// # On PostgreSQL advisory locks: the server's shared advisory locks
/// On `postgres://` (advisory mode) a reader holds the name's advisory key in shared mode, a
/// writer in exclusive mode, each on a connection of its own; the server queues a reader
/// behind a waiting writer, and the fencing counter bumped with each grant orders them.
/// Readers holding at once are bounded by the connections the server (or the pooler in front
/// of it) allows.
///
/// # On Redis: readers in the lock's hash
/// On `redis://` (standalone, Sentinel and Cluster; not the Redlock) readers hold the
/// name's lock hash together, each with its own lease and token, and a writer holds it as a
/// mutex does (one script per acquisition and per release). A writer that waits marks
/// itself for 2 s at a time, and readers are turned away while a mark is fresh; the waiter
/// takes its mark away when it goes, and a mark left behind ends within 2 s. A mutex of the
/// same name is the same lock.
///
/// # On SQLite: a row per reader
/// On `sqlite://` a writer holds the name's row as a mutex does, and each reader a row of its
/// own in `distlock_readers`, with its own lease and token; a grant is one transaction that
/// counts the readers (for a writer) or the live writer and the writers queued earlier (for
/// a reader). A mutex of the same name is the same lock.
///
/// # In memory: one entry per name
/// On `memory://` the readers of a name, each with its own lease, hold one entry together,
/// and a writer holds it alone. Waiters are served in arrival order, readers that follow one
/// another together; a waiting writer is served before the readers that came after it. A
/// mutex of the same name is the same lock (it holds it as a writer would).
///
/// # How it works elsewhere
/// Two kinds of lock names: a gate, `<name>#gate`, and [`RwLock::READER_SLOTS`] reader slots,
/// `<name>#reader-<i>`. A reader takes the gate, then one free reader slot, and lets the gate
/// go; it holds only its slot. A writer takes the gate and then every reader slot, and holds
/// them all until it releases. So:
///
/// * a writer excludes every reader and every other writer (it holds all the slots);
/// * a queued writer holds the gate, so readers that come after it wait behind it: a stream
///   of readers cannot starve a writer;
/// * every grant, read or write, passes the gate, and its fencing token is the gate's token:
///   tokens grow strictly across reads and writes, so a write's token is larger than that of
///   every read granted before it, and a read's larger than every write before it;
/// * on a backend whose mutex serves waiters in arrival order, readers and writers are served
///   in arrival order at the gate.
///
/// Readers hold their locks in parallel; their *acquisitions* pass the gate one at a time,
/// each holding it for one slot acquisition and its release. A write costs the gate and then
/// `READER_SLOTS` acquisitions made at once. A reader or writer whose gate is lost while it
/// waits for slots gives up what it took and starts again. The lock names `<name>#gate` and
/// `<name>#reader-<i>` are the lock's: do not use them for mutexes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let config = locks.rwlock("config")?;
/// let r1 = config.read().await?;
/// let r2 = config.read().await?;                  // readers share
/// assert!(config.try_write().await?.is_none());   // a writer waits for them
/// let (t1, t2) = (r1.fencing_token(), r2.fencing_token());
/// r1.release().await?;
/// r2.release().await?;
/// let w = config.write().await?;
/// assert!(w.fencing_token() > t1.max(t2));        // writes are ordered after reads
/// w.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    client: Arc<ClientInner>,
    name: Arc<str>,
    gate: LockName,
    readers: Semaphore,
    /// The name itself, on a backend that keeps reader-writer locks in its own layout.
    native: Option<LockName>,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name).finish()
    }
}

impl RwLock {
    /// How many readers an [`RwLock`] admits at once. Part of the lock's layout: every client
    /// must agree on it, so it is not an option.
    pub const READER_SLOTS: u32 = READER_SLOTS;

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Result<Self> {
        let readers = Semaphore::with_slots(client.clone(), name.clone(), READER_SLOTS, "reader")?;
        // The reader slots' names checked the length; the gate's suffix is shorter.
        let gate = LockName::new(format!("{name}#gate"))?;
        let backend = &client.backend;
        let native = (backend.supports(&LockKind::Read) && backend.supports(&LockKind::Write))
            .then(|| LockName::new(name.as_str()))
            .transpose()?;
        Ok(RwLock {
            client,
            name: name.into(),
            gate,
            readers,
            native,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for a shared read lock, without a limit, held with the client's renewed lease.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe: the gate and the slot acquisitions are, and a dropped read leaves neither
    /// (in the backend's own layout: a dropped read leaves nothing).
    pub async fn read(&self) -> Result<ReadGuard> {
        self.read_with(AcquireOptions::new()).await
    }

    /// Tries once: `None` when a writer holds or waits for the lock, every reader slot is
    /// taken, or another reader or writer is passing the gate at this moment (in the backend's own layout:
    /// when a writer holds or waits).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::read`].
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.read_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// A read lock with a wait limit and/or a fixed lease (the lease of the reader's slot).
    ///
    /// # Notable errors
    /// - [`Error::Timeout`] when the wait runs out.
    /// - [`Error::InvalidInput`] for a bad lease or wait.
    /// - [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::read`].
    pub async fn read_with(&self, options: AcquireOptions) -> Result<ReadGuard> {
        let start = Instant::now();
        self.read_inner(options)
            .await?
            .ok_or_else(|| Error::timed_out(&self.name, start))
    }

    /// Waits for the exclusive write lock, without a limit, held with the client's renewed
    /// lease.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped write gives back the gate and every slot it had taken (in
    /// the backend's own layout: its lock).
    pub async fn write(&self) -> Result<WriteGuard> {
        self.write_with(AcquireOptions::new()).await
    }

    /// Tries once: `None` when anyone holds or waits at the gate or holds a read lock (in
    /// the backend's own layout: when anyone holds or waits).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::write`].
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// The write lock with a wait limit and/or a fixed lease (for the gate and every slot,
    /// from the moment all are held; in the backend's own layout for its lock).
    ///
    /// # Notable errors
    /// As [`RwLock::read_with`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RwLock::write`].
    pub async fn write_with(&self, options: AcquireOptions) -> Result<WriteGuard> {
        let start = Instant::now();
        self.write_inner(options)
            .await?
            .ok_or_else(|| Error::timed_out(&self.name, start))
    }

    /// The gate, acquired as a new owner with `options`.
    async fn gate(&self, options: AcquireOptions) -> Result<Option<Guard>> {
        Mutex::new(self.client.clone(), self.gate.clone(), None)
            .acquire_inner(options)
            .await
    }

    /// True when the backend keeps this lock in its own layout (ZooKeeper: Curator's;
    /// PostgreSQL advisory locks: shared advisory locks; Redis: the lock's hash; SQLite: a row
    /// per reader; memory: one entry per name).
    pub fn is_native(&self) -> bool {
        self.native.is_some()
    }

    /// True when each reader holds a server connection of its own (PostgreSQL advisory
    /// locks), so that the server's connection limit bounds the readers.
    #[cfg(feature = "conformance")]
    pub(crate) fn readers_take_a_connection(&self) -> bool {
        self.native.is_some() && self.client.backend.readers_take_a_connection()
    }

    /// The backend's own lock of `kind` on the name, acquired as a new owner.
    async fn native(
        &self,
        name: &LockName,
        kind: LockKind,
        options: AcquireOptions,
    ) -> Result<Option<Guard>> {
        Mutex::new(self.client.clone(), name.clone().with_kind(kind), None)
            .acquire_inner(options)
            .await
    }

    async fn read_inner(&self, options: AcquireOptions) -> Result<Option<ReadGuard>> {
        options.validate()?;
        if let Some(name) = &self.native {
            let slot = self.native(name, LockKind::Read, options).await?;
            return Ok(slot.map(|slot| ReadGuard {
                fencing_token: slot.fencing_token(),
                slot,
            }));
        }
        let start = Instant::now();
        loop {
            // The gate only orders the reader: it is held for the slot acquisition, with the
            // client's renewed lease, whatever lease the read asks for.
            let Some(gate) = self.gate(options.renewed().wait_left(start)).await? else {
                return Ok(None);
            };
            let slot = tokio::select! {
                slot = self.readers.acquire_inner(options.wait_left(start)) => slot?,
                // Dropping the slot acquisition leaves nothing; start again.
                _ = gate.lost() => continue,
            };
            let Some(slot) = slot else {
                return Ok(None);
            };
            // Not lost now means nobody else was granted the gate yet (a loss is known
            // before anyone else can be granted): the gate's token orders this read.
            if gate.is_lost() {
                continue;
            }
            let fencing_token = gate.fencing_token();
            if let Err(error) = gate.release().await {
                tracing::debug!(lock = %self.gate, %error, "the reader's gate release failed");
            }
            return Ok(Some(ReadGuard {
                slot,
                fencing_token,
            }));
        }
    }

    async fn write_inner(&self, options: AcquireOptions) -> Result<Option<WriteGuard>> {
        options.validate()?;
        if let Some(name) = &self.native {
            let lock = self.native(name, LockKind::Write, options).await?;
            return Ok(lock.map(|lock| WriteGuard {
                fencing_token: lock.fencing_token(),
                parts: GuardSet::one(lock),
            }));
        }
        let start = Instant::now();
        loop {
            // Every part is acquired with the renewed lease; a fixed lease starts once the
            // writer holds them all.
            let Some(gate) = self.gate(options.renewed().wait_left(start)).await? else {
                return Ok(None);
            };
            // One owner for every slot, so the writer's guards name one holder.
            let holder = self.client.new_owner();
            let slots = (0..READER_SLOTS).map(|index| {
                let slot = self.readers.slot(index as usize, Some(holder.clone()));
                let options = options.renewed().wait_left(start);
                async move { slot.acquire_inner(options).await }
            });
            let slots = tokio::select! {
                slots = try_join_all(slots) => slots?,
                // Another writer may take the gate now: give the slots up, start again.
                _ = gate.lost() => continue,
            };
            let Some(slots) = slots.into_iter().collect::<Option<Vec<Guard>>>() else {
                return Ok(None);
            };
            let fencing_token = gate.fencing_token();
            let mut parts = Vec::with_capacity(slots.len() + 1);
            parts.push(gate);
            parts.extend(slots);
            if let Some(parts) = GuardSet::held(parts, options).await? {
                return Ok(Some(WriteGuard {
                    parts,
                    fencing_token,
                }));
            }
        }
    }
}

/// A shared read lock of an [`RwLock`]. Dropping it releases in the background.
#[must_use = "the read lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct ReadGuard {
    slot: Guard,
    fencing_token: u64,
}

impl ReadGuard {
    /// The gate's token of this read (in the backend's own layout: its own): larger than every write's
    /// granted before it, smaller than every write's granted after it.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The reader slot held (in the backend's own layout: the reader's own lock), a lock of its own (its lease,
    /// renewal, and loss).
    pub fn slot(&self) -> &Guard {
        &self.slot
    }

    /// Resolves when the read lock is known lost (its slot's lease ran out, was refused, or
    /// force-unlocked); a writer may hold the lock after that.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> Error {
        self.slot.lost().await
    }

    /// Why it was lost, once known.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.slot.loss_reason()
    }

    /// Releases the read lock.
    ///
    /// # Notable errors
    /// As [`Guard::release`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release completes in the background.
    pub async fn release(self) -> Result<()> {
        self.slot.release().await
    }
}

/// The exclusive write lock of an [`RwLock`]: the gate and every reader slot. Dropping it
/// releases them in the background.
#[must_use = "the write lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct WriteGuard {
    parts: GuardSet,
    fencing_token: u64,
}

impl WriteGuard {
    /// The gate's token of this write: larger than every read's and write's granted before it.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Resolves when any of the locks the write holds is known lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> Error {
        self.parts.lost().await
    }

    /// Why it was lost, once known.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.parts.loss_reason()
    }

    /// Moves the end of a fixed lease on the gate and every slot.
    ///
    /// # Notable errors
    /// As [`Guard::extend`], the first part's error.
    ///
    /// # Cancel safety
    /// Dropping the future may have moved some parts' lease ends.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.parts.extend(lease).await
    }

    /// Releases the gate and every slot.
    ///
    /// # Notable errors
    /// The first part's error, after every part was tried.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release completes in the background.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }
}
