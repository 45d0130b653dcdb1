//! What a name is used as now, for operators: a mutex and its holder, a semaphore's permits
//! and their holders, a reader-writer lock's writer and readers, or an election's leader.
//! It knows each primitive's layout on the backends (the slots `<name>#permit-<i>`, the
//! count's record `<name>#permits`, the gate and reader slots, the record of an election),
//! so that a tool asks here instead of reading the layout itself.

use crate::backend::LockInfo;
use crate::client::Locks;
use crate::election::Leader;
use crate::error::Result;
use crate::name::LockName;
use crate::semaphore::slot_name;

/// What [`Locks::describe`] found a name used as.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Described {
    /// Nothing holds it, in any primitive's layout.
    Free {
        /// The waiters queued for the name as a mutex, where the backend tells.
        waiters: Option<u64>,
    },
    /// Held as a mutex (or in a backend's own layout of another primitive, which shows as
    /// its lock).
    Mutex(LockInfo),
    /// A semaphore with a registered count: `permits` in all, the held ones' slots in
    /// `holders`.
    Semaphore {
        /// The registered count.
        permits: u32,
        /// One entry per held permit.
        holders: Vec<LockInfo>,
    },
    /// A reader-writer lock with a writer or readers (in the slot layout).
    RwLock {
        /// The writer's gate, when a writer holds or waits for it.
        writer: Option<LockInfo>,
        /// One entry per held reader slot.
        readers: Vec<LockInfo>,
    },
    /// An election with a leader.
    Election(Leader),
}

impl Locks {
    /// What `name` is used as now: a held mutex, a semaphore with its permits' holders, a
    /// reader-writer lock with its writer and readers, an election with its leader, or free.
    /// For operators (`distlock status`); a handful of reads, each a snapshot.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// use distlock::Described;
    /// let locks = distlock::connect("memory://").await?;
    /// let permit = locks.semaphore("pool", 3)?.acquire().await?;
    /// match locks.describe("pool").await? {
    ///     Described::Semaphore { permits, holders } => {
    ///         assert_eq!((permits, holders.len()), (3, 1));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad name; backend errors.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn describe(&self, name: &str) -> Result<Described> {
        let backend = &self.inner.backend;
        let lock = LockName::new(name)?;
        // First: in a backend's own layout, an election's leader holds the name itself. There
        // a mutex and an election may share one layout (etcd's Go recipes do): a holder that
        // published no value is taken for a mutex's, so such a leader shows as its lock.
        if let Ok(election) = self.election(name)
            && let Some(leader) = election.leader().await?
            && (!election.is_native() || !leader.value.is_empty())
        {
            return Ok(Described::Election(leader));
        }
        let info = backend.inspect(&lock).await?;
        if info.locked {
            return Ok(Described::Mutex(info));
        }
        if let Ok(registry) = LockName::new(format!("{name}#permits"))
            && let Some(record) = backend.read_published(&registry).await?
            && let Ok(permits) = record.value.parse::<u32>()
        {
            let holders = held_slots(self, name, "permit", permits).await?;
            if !holders.is_empty() {
                return Ok(Described::Semaphore { permits, holders });
            }
        }
        if let Ok(gate) = LockName::new(format!("{name}#gate")) {
            let gate = backend.inspect(&gate).await?;
            let readers = held_slots(self, name, "reader", crate::rwlock::READER_SLOTS).await?;
            if gate.locked || !readers.is_empty() {
                return Ok(Described::RwLock {
                    writer: gate.locked.then_some(gate),
                    readers,
                });
            }
        }
        Ok(Described::Free {
            waiters: info.waiters,
        })
    }
}

/// What the backend tells of each held slot `<name>#<kind>-<i>`, `i` below `count`.
async fn held_slots(locks: &Locks, name: &str, kind: &str, count: u32) -> Result<Vec<LockInfo>> {
    let mut held = Vec::new();
    for index in 0..count {
        let Ok(slot) = slot_name(name, kind, index) else {
            break;
        };
        let info = locks.inner.backend.inspect(&slot).await?;
        if info.locked {
            held.push(info);
        }
    }
    Ok(held)
}
