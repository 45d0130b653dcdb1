//! The table-record lock in an SQLite file: the embedded default.
//!
//! One row per held lock in `distlock_locks` (name UNIQUE, owner, hold count, fencing token,
//! lease, created and expiry times). Acquire inserts the row; a live row means someone holds
//! the lock; an expired row is deleted and replaced in the same transaction. Release deletes
//! only the owner's row. Fencing tokens come from `distlock_fencing`, one counter per name
//! that survives release, so tokens grow across holders and across expiry.
//!
//! Every operation is one `BEGIN IMMEDIATE` transaction, so it is atomic against every other
//! process using the file. The file uses WAL and a busy timeout so that processes wait for
//! each other's short transactions instead of failing. Waiters poll (SQLite has no
//! notifications between processes) with a read-only query.
//!
//! Reader-writer locks keep each reader in a row of its own in `distlock_readers` beside the
//! writer's row (see `readers.rs` and docs/primitives/rwlock.md); their waiters take tickets
//! in either mode, a reader's marked `kind = 'r'`.
//!
//! Fair mode (the default) queues waiters first come, first served: a waiter takes a ticket
//! in `distlock_waiters` and refreshes it every 250 ms; a free lock goes only to the owner of
//! the oldest live ticket. A ticket not refreshed for 1 s (its process died or stalled) is
//! skipped. Without fair mode, whoever asks first after a release wins, which is faster but
//! lets a process that releases and re-acquires in a loop starve the others.
//!
//! URL: `sqlite:///absolute/path.db` or `sqlite://relative/path.db`, with the optional query
//! options `busy_timeout_ms=N` (default 5000) and `fair=true|false` (default true). The file
//! is made if missing; its directory must exist.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use crate::backend::{
    Acquired, Backend, Extended, LockInfo, Owner, Published, ReleaseWaiter, Released, Renewing,
    Woken,
};
use crate::error::{Error, Result};
use crate::name::LockName;

#[cfg(feature = "bench")]
mod bare;
mod bell;
mod published;
mod readers;
mod rows;
mod setup;
mod url;
mod waiter;

use self::url::{DEFAULT_BUSY_TIMEOUT, parse_url};

use self::readers::{READER_TICKET, live_reader, next_token, readers_hold};
use self::rows::{Found, execute, find, head_bell, live_row, query_row};
use self::setup::set_up;
use self::waiter::SqliteWaiter;
use bell::{Bell, Listener};

const SCHEME: &str = "sqlite";
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(8);
/// How often a queued waiter refreshes its ticket.
const TICKET_REFRESH: Duration = Duration::from_millis(250);
/// A ticket not refreshed for this long is skipped and removed.
const TICKET_STALE_MS: i64 = 1000;
/// How often the first two waiters in the queue look, on a blocking thread (Tokio's timer
/// cannot sleep less than a millisecond). A look is one indexed read of about 15 µs.
const CLOSE_POLL: Duration = Duration::from_micros(200);
/// How often a waiter with a doorbell and nobody ahead of it looks anyway: for a lease that
/// expired, a ring that was lost, a waiter ahead that left.
const BELL_POLL: Duration = Duration::from_millis(25);
/// How much later a waiter with a doorbell looks for each live ticket ahead of its own, up to
/// [`TICKET_REFRESH`]: its turn is at least that many handoffs away, and a release rings it
/// when it comes.
const BELL_POLL_PER_AHEAD: Duration = Duration::from_millis(5);
/// How long one close watch lasts before the async loop takes over again (to refresh the
/// ticket and to notice a dropped waiter).
const CLOSE_WATCH: Duration = Duration::from_millis(20);

/// The table-record lock in an SQLite file shared by the processes of one machine.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    connection: Arc<StdMutex<Connection>>,
    path: PathBuf,
    fair: bool,
    busy_timeout: Duration,
    /// Where releases ring this handle's waiters (fair mode on Linux).
    bell: Option<Arc<Bell>>,
}

thread_local! {
    /// The busy budget of the statement running on this thread, for [`busy_wait`].
    static BUSY_BUDGET: std::cell::Cell<Duration> = const { std::cell::Cell::new(DEFAULT_BUSY_TIMEOUT) };
}

/// SQLite's busy handler: called when another process holds the write lock, with the number
/// of earlier calls for this statement. SQLite's own handler sleeps 1, 2, 5, 10 ms ...; lock
/// transactions last tens of microseconds, so this one sleeps 50 µs at first, then 200 µs,
/// then 1 ms, until the budget (`busy_timeout_ms`) is spent.
pub(crate) fn busy_wait(calls: i32) -> bool {
    let calls = u32::try_from(calls).unwrap_or(0);
    let (nap, spent) = match calls {
        0..20 => (Duration::from_micros(50), Duration::from_micros(50) * calls),
        20..70 => (
            Duration::from_micros(200),
            Duration::from_millis(1) + Duration::from_micros(200) * (calls - 20),
        ),
        _ => (
            Duration::from_millis(1),
            Duration::from_millis(11) + Duration::from_millis(1) * (calls - 70),
        ),
    };
    if spent >= BUSY_BUDGET.with(std::cell::Cell::get) {
        return false;
    }
    std::thread::sleep(nap);
    true
}

/// Takes the connection on a blocking thread, with that thread's busy budget set.
pub(crate) fn lock_connection(
    connection: &StdMutex<Connection>,
    busy_timeout: Duration,
) -> std::sync::MutexGuard<'_, Connection> {
    BUSY_BUDGET.with(|budget| budget.set(busy_timeout));
    // rusqlite leaves the connection usable after a panic elsewhere; an open transaction is
    // rolled back when its `Transaction` value is dropped.
    connection
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn backend_error(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |error| Error::backend(SCHEME, operation, error)
}

/// Milliseconds since the Unix epoch by this machine's clock. All processes sharing the file
/// run on this machine, so they share the clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// True for a reader of a reader-writer lock, which holds together with other readers.
fn shares(name: &LockName) -> bool {
    matches!(name.kind(), crate::LockKind::Read)
}

fn to_u32(holds: i64) -> u32 {
    u32::try_from(holds).unwrap_or(u32::MAX)
}

impl SqliteBackend {
    /// Opens (or makes) the lock file named by the part of a `sqlite://` URL after `://`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or a directory that does not exist;
    /// [`Error::Backend`] when SQLite cannot open or set up the file.
    pub async fn open(url_rest: &str) -> Result<Self> {
        let url = parse_url(url_rest)?;
        let parent = url.path.parent().unwrap_or(Path::new(""));
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(Error::invalid(
                "URL",
                format!(
                    "the directory {} does not exist; create it first or choose another path",
                    parent.display()
                ),
            ));
        }
        let (path, fair, busy_timeout) = (url.path.clone(), url.fair, url.busy_timeout);
        let connection = tokio::task::spawn_blocking(move || -> Result<Connection> {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let mut conn = Connection::open_with_flags(&url.path, flags)
                .map_err(backend_error("open the file"))?;
            BUSY_BUDGET.with(|budget| budget.set(url.busy_timeout));
            conn.busy_handler(Some(busy_wait))
                .map_err(backend_error("set the busy handler"))?;
            set_up(&mut conn, url.busy_timeout)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::backend(SCHEME, "open the file", e))??;
        Ok(SqliteBackend {
            connection: Arc::new(StdMutex::new(connection)),
            path,
            fair,
            busy_timeout,
            bell: if fair { Bell::open() } else { None },
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the connection in a blocking thread.
    async fn run<T: Send + 'static>(
        &self,
        operation: &'static str,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = self.connection.clone();
        let busy_timeout = self.busy_timeout;
        tokio::task::spawn_blocking(move || {
            let mut conn = lock_connection(&connection, busy_timeout);
            work(&mut conn)
        })
        .await
        .map_err(|e| Error::backend(SCHEME, operation, e))?
        .map_err(backend_error(operation))
    }
}

/// Opens (or makes) the lock file a `sqlite://` URL names; see [`SqliteBackend::open`].
///
/// # Errors
/// As [`SqliteBackend::open`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let rest = url.strip_prefix("sqlite://").unwrap_or(url);
    Ok(Arc::new(SqliteBackend::open(rest).await?))
}

crate::driver::driver!(check_url: url::check_url, open: connect, bare: bare::open);

#[async_trait]
impl Backend for SqliteBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        use crate::LockKind;
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
    }

    async fn ping(&self) -> Result<()> {
        self.run("ping", |conn| query_row(conn, "SELECT 1", [], |_| Ok(())))
            .await
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let start = prefix.to_owned();
        let end = crate::name::prefix_end(prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("list the locks held", move |conn| {
            // A range of the name's index, in byte order (SQLite compares text bytewise).
            let now = now_ms();
            let name = |row: &rusqlite::Row<'_>| row.get::<_, String>(0);
            // A name held by readers has rows in `distlock_readers` instead.
            match end {
                Some(end) => conn
                    .prepare_cached(
                        "SELECT name FROM distlock_locks
                         WHERE name >= ?1 AND name < ?2 AND expires_at_ms > ?3
                         UNION
                         SELECT name FROM distlock_readers
                         WHERE name >= ?1 AND name < ?2 AND expires_at_ms > ?3
                         ORDER BY name LIMIT ?4",
                    )?
                    .query_map(params![start, end, now, limit], name)?
                    .collect(),
                None => conn
                    .prepare_cached(
                        "SELECT name FROM distlock_locks
                         WHERE name >= ?1 AND expires_at_ms > ?2
                         UNION
                         SELECT name FROM distlock_readers
                         WHERE name >= ?1 AND expires_at_ms > ?2
                         ORDER BY name LIMIT ?3",
                    )?
                    .query_map(params![start, now, limit], name)?
                    .collect(),
            }
        })
        .await
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let reader = shares(name);
        // A reader-writer lock's waiters queue in either mode (see `subscribe`).
        let queued = self.fair || !name.kind().is_exclusive();
        let name = name.as_str().to_owned();
        let owner = owner.as_str().to_owned();
        let lease_ms = millis(lease);
        let fair = self.fair;
        self.run("acquire", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            if reader {
                let acquired = readers::acquire_read(&tx, &name, &owner, lease_ms, now)?;
                tx.commit()?;
                return Ok(acquired);
            }
            let acquired = match find(&tx, &name, &owner, fair, now)? {
                Found::Busy(held) => held,
                Found::Ours(holds, token) => {
                    execute(
                        &tx,
                        "UPDATE distlock_locks
                         SET holds = holds + 1, expires_at_ms = MAX(expires_at_ms, ?2)
                         WHERE name = ?1",
                        params![name, now.saturating_add(lease_ms)],
                    )?;
                    Acquired::Granted {
                        fencing_token: u64::try_from(token).unwrap_or(0),
                        holds: to_u32(holds + 1),
                    }
                }
                Found::Free => {
                    // Free, or an expired row that is taken over in this transaction.
                    execute(&tx, "DELETE FROM distlock_locks WHERE name = ?1", [&name])?;
                    if queued {
                        // Leave the queue, and clear tickets whose waiters are gone.
                        execute(
                            &tx,
                            "DELETE FROM distlock_waiters
                             WHERE name = ?1 AND (owner = ?2 OR seen_at_ms <= ?3)",
                            params![name, owner, now - TICKET_STALE_MS],
                        )?;
                    }
                    let token = next_token(&tx, &name)?;
                    execute(
                        &tx,
                        "INSERT INTO distlock_locks
                         (name, owner, holds, fencing_token, lease_ms, created_at_ms, expires_at_ms)
                         VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)",
                        params![
                            name,
                            owner,
                            token,
                            lease_ms,
                            now,
                            now.saturating_add(lease_ms)
                        ],
                    )?;
                    Acquired::Granted {
                        fencing_token: u64::try_from(token).unwrap_or(0),
                        holds: 1,
                    }
                }
            };
            tx.commit()?;
            Ok(acquired)
        })
        .await
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        // A reader-writer lock's waiters queue in either mode: a writer's ticket holds later
        // readers back.
        let reader = shares(name);
        let ticket = if self.fair || !name.kind().is_exclusive() {
            Some(self.take_ticket(name.as_str(), owner.as_str(), reader).await?)
        } else {
            None
        };
        let listener = match (&self.bell, ticket) {
            (Some(bell), Some(_)) => Some(bell.listen(name.as_str())),
            _ => None,
        };
        Ok(Box::new(SqliteWaiter {
            backend: self.clone(),
            name: name.as_str().to_owned(),
            owner: owner.as_str().to_owned(),
            reader,
            ticket,
            listener,
            refreshed: tokio::time::Instant::now(),
            poll: POLL_FIRST,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let reader = shares(name);
        let name = name.as_str().to_owned();
        let owner = owner.as_str().to_owned();
        let bell = self.bell.clone();
        self.run("release", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let mut next = None;
            if reader {
                let (released, freed) = readers::release_read(&tx, &name, &owner, now)?;
                if freed {
                    next = head_bell(&tx, &name, now)?;
                }
                tx.commit()?;
                ring(bell.as_deref(), next.as_deref(), &name);
                return Ok(released);
            }
            let released = match live_row(&tx, &name, now)? {
                None => Released::NotHeld,
                Some((holder, _, _, _)) if holder != owner => Released::HeldByOther,
                Some((_, holds, _, _)) if holds > 1 => {
                    execute(
                        &tx,
                        "UPDATE distlock_locks SET holds = holds - 1 WHERE name = ?1",
                        [&name],
                    )?;
                    Released::Released {
                        remaining_holds: to_u32(holds - 1),
                    }
                }
                Some(_) => {
                    execute(
                        &tx,
                        "DELETE FROM distlock_locks WHERE name = ?1 AND owner = ?2",
                        [&name, &owner],
                    )?;
                    next = head_bell(&tx, &name, now)?;
                    Released::Released { remaining_holds: 0 }
                }
            };
            tx.commit()?;
            ring(bell.as_deref(), next.as_deref(), &name);
            Ok(released)
        })
        .await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let token = i64::try_from(fencing_token).unwrap_or(-1);
        let reader = shares(name);
        let name = name.as_str().to_owned();
        let owner = owner.as_str().to_owned();
        let lease_ms = millis(lease);
        self.run("extend", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            if reader {
                let extended = readers::extend_read(&tx, &name, &owner, token, lease_ms, now)?;
                tx.commit()?;
                return Ok(extended);
            }
            let extended = match live_row(&tx, &name, now)? {
                None => Extended::NotHeld,
                Some((holder, _, _, _)) if holder != owner => Extended::HeldByOther,
                Some((_, _, held_token, _)) if held_token != token => Extended::NotHeld,
                Some(_) => {
                    execute(
                        &tx,
                        "UPDATE distlock_locks SET expires_at_ms = ?2, lease_ms = ?3
                         WHERE name = ?1",
                        params![name, now.saturating_add(lease_ms), lease_ms],
                    )?;
                    Extended::Extended
                }
            };
            tx.commit()?;
            Ok(extended)
        })
        .await
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let locks: Vec<(String, String, i64, bool)> = locks
            .iter()
            .map(
                |Renewing {
                     lock: (name, owner),
                     fencing_token,
                 }| {
                    (
                        name.as_str().to_owned(),
                        owner.as_str().to_owned(),
                        i64::try_from(*fencing_token).unwrap_or(-1),
                        shares(name),
                    )
                },
            )
            .collect();
        let lease_ms = millis(lease);
        self.run("renew", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let mut renewed = Vec::with_capacity(locks.len());
            {
                let mut update = tx.prepare_cached(
                    "UPDATE distlock_locks SET expires_at_ms = ?3
                     WHERE name = ?1 AND owner = ?2 AND fencing_token = ?5 AND expires_at_ms > ?4",
                )?;
                let mut update_reader = tx.prepare_cached(
                    "UPDATE distlock_readers SET expires_at_ms = ?3
                     WHERE name = ?1 AND owner = ?2 AND fencing_token = ?5 AND expires_at_ms > ?4",
                )?;
                for (name, owner, token, reader) in &locks {
                    let update = if *reader {
                        &mut update_reader
                    } else {
                        &mut update
                    };
                    let changed = update.execute(params![
                        name,
                        owner,
                        now.saturating_add(lease_ms),
                        now,
                        token
                    ])?;
                    renewed.push(changed == 1);
                }
            }
            tx.commit()?;
            Ok(renewed)
        })
        .await
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let name = name.as_str().to_owned();
        self.run("query the lock", move |conn| {
            let now = now_ms();
            Ok(live_row(conn, &name, now)?.is_some() || readers_hold(conn, &name, now)?)
        })
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let name = name.as_str().to_owned();
        self.run("inspect the lock", move |conn| {
            let now = now_ms();
            let waiters: i64 = conn.query_row(
                "SELECT COUNT(*) FROM distlock_waiters WHERE name = ?1 AND seen_at_ms > ?2",
                rusqlite::params![name, now - TICKET_STALE_MS],
                |row| row.get(0),
            )?;
            let waiters = Some(u64::try_from(waiters).unwrap_or(0));
            let readers = readers::inspect_readers(conn, &name, now)?;
            Ok(match (live_row(conn, &name, now)?, readers) {
                (None, Some((holds, token, expires_at_ms))) => LockInfo {
                    locked: true,
                    holder: None,
                    holds: Some(to_u32(holds)),
                    fencing_token: u64::try_from(token).ok(),
                    remaining_lease: u64::try_from(expires_at_ms - now)
                        .ok()
                        .map(Duration::from_millis),
                    waiters,
                },
                (Some((holder, holds, token, expires_at_ms)), _) => LockInfo {
                    locked: true,
                    holder: Some(holder),
                    holds: Some(to_u32(holds)),
                    fencing_token: u64::try_from(token).ok(),
                    remaining_lease: u64::try_from(expires_at_ms - now)
                        .ok()
                        .map(Duration::from_millis),
                    waiters,
                },
                (None, None) => LockInfo {
                    waiters,
                    ..LockInfo::new(false)
                },
            })
        })
        .await
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let reader = shares(name);
        let name = name.as_str().to_owned();
        let owner = owner.as_str().to_owned();
        self.run("query the lock", move |conn| {
            if reader {
                let held = live_reader(conn, &name, &owner, now_ms())?;
                return Ok(held.map_or(0, |(holds, _, _)| to_u32(holds)));
            }
            Ok(match live_row(conn, &name, now_ms())? {
                Some((holder, holds, _, _)) if holder == owner => to_u32(holds),
                _ => 0,
            })
        })
        .await
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let name = name.as_str().to_owned();
        let bell = self.bell.clone();
        self.run("force unlock", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let was_held = live_row(&tx, &name, now)?.is_some() || readers_hold(&tx, &name, now)?;
            execute(&tx, "DELETE FROM distlock_locks WHERE name = ?1", [&name])?;
            execute(&tx, "DELETE FROM distlock_readers WHERE name = ?1", [&name])?;
            let next = head_bell(&tx, &name, now)?;
            tx.commit()?;
            ring(bell.as_deref(), next.as_deref(), &name);
            Ok(was_held)
        })
        .await
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.publish_record(key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        self.read_record(key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.withdraw_record(key, term).await
    }
}

/// Rings the doorbell `next` (the oldest waiter's) from this handle's `bell`, after a commit
/// that freed `name`.
fn ring(bell: Option<&Bell>, next: Option<&str>, name: &str) {
    if let (Some(bell), Some(next)) = (bell, next) {
        bell.ring(next, name);
    }
}

impl SqliteBackend {
    /// Queues `owner` for `name`, as a reader when `reader`; returns the ticket.
    async fn take_ticket(&self, name: &str, owner: &str, reader: bool) -> Result<i64> {
        let (name, owner) = (name.to_owned(), owner.to_owned());
        let bell = self.bell.as_ref().map(|bell| bell.name().to_owned());
        let kind = reader.then_some(READER_TICKET);
        self.run("queue a waiter", move |conn| {
            execute(
                conn,
                "INSERT INTO distlock_waiters (name, owner, seen_at_ms, bell, kind)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![name, owner, now_ms(), bell, kind],
            )?;
            Ok(conn.last_insert_rowid())
        })
        .await
    }
}

#[cfg(test)]
mod tests;
