//! The PostgreSQL backend: session advisory locks (`postgres://user@host:5432/db`, the
//! default), the table-record lock (`...?mode=table`), and transaction-scoped advisory locks
//! for a server behind a pooler in transaction mode (`...?mode=transaction`, see
//! `postgres/xact.rs` and `docs/backends/postgres.md`).
//!
//! # Advisory locks (the default)
//!
//! A lock is `pg_advisory_lock(key)` held by a connection that the lock owns for as long as
//! it is held, separate from any pool the application uses for its business work. The key
//! is [`advisory_key`]: FNV-1a (64 bit) over `distlock\0` and the name.
//!
//! * `try_acquire` runs `pg_try_advisory_lock` on an idle lock connection the client keeps, or
//!   else on its primary lock connection (see `crate::session`).
//! * A waiting acquisition takes a connection of its own and blocks in `pg_advisory_lock`
//!   with `lock_timeout` set to what is left of its wait. The server hands the lock over the
//!   moment the holder unlocks, and that connection then holds it.
//! * Owners of one client never share a lock through one session (advisory locks are
//!   re-entrant per session): the client reserves the name before it asks.
//! * **Fencing tokens** come from the sequence `distlock_token_seq`, drawn by the statement
//!   that takes the lock, after it: a grant commits nothing that must be flushed, and tokens
//!   grow across clients, restarts and force-unlocks (see `docs/backends/postgres.md` for
//!   the limits, and for upgrading from the per-name counters of earlier clients).
//! * **Loss.** When a lock connection dies or is killed (`pg_terminate_backend`), the server
//!   frees its locks at once, and the next renewal check (one `pg_locks` query per lock
//!   connection) fires `lost()`. `force_unlock` terminates the holding session, which frees
//!   every lock that session held.
//! * **Leases** are kept by the holder's client: a fixed lease ends with the client
//!   unlocking. A stopped holder keeps its locks until its connection is closed.
//! * Session locks count against the server's lock table (`max_locks_per_transaction` ×
//!   `max_connections` slots, 6,400 by default), and every waiting acquisition holds a
//!   connection.
//!
//! # The table-record lock (`?mode=table`)
//!
//! One row per lock in `distlock_locks` (name primary key, owner, hold count, fencing token,
//! lease end). Every operation is one SQL statement, so it is atomic against every other
//! client of the database:
//!
//! * **Acquire** is an `INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE` that writes the
//!   row when the lock is free, its lease has run out, or the owner already holds it
//!   (re-entry), and writes nothing otherwise. The lease end is computed by the server's
//!   clock (`clock_timestamp()`), so clients' clocks do not matter.
//! * **Fencing tokens** come from `distlock_fencing`, one counter per name bumped in the same
//!   statement, so they grow across holders, expiry and force-unlock. A refused attempt
//!   writes nothing, except when it races a release; tokens may then have gaps, and they
//!   never repeat or go back.
//! * **Release** decrements or deletes the owner's row and, when it frees the lock, sends
//!   `NOTIFY distlock_release` with the lock name. Each client keeps one connection that
//!   `LISTEN`s and wakes its waiters for that name. A waiter also wakes when the holder's
//!   lease would end, so a crashed holder (no notification) costs at most its lease.
//!
//! Table-lock waiters are not queued: whoever asks first after a release wins (the SQLite
//! backend's fair queue is not built here yet). The tables are made at connect if missing.

use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;

mod advisory;
#[cfg(feature = "bench")]
mod bare;
mod published;
mod readers;
#[cfg(all(test, feature = "conformance"))]
mod session_faults;
mod setup;
mod xact;

use self::setup::{PoolFor, make_tables, open_pool};

#[cfg(all(test, feature = "conformance"))]
use self::advisory::PgAdvisory;
pub(crate) use self::advisory::PgAdvisoryBackend;
pub use self::advisory::advisory_key;
pub(crate) use self::xact::PgXactBackend;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use tokio::sync::{oneshot, watch};

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, Woken,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::wake::ReleaseSignals;

pub(crate) const SCHEME: &str = "postgres";
const CHANNEL: &str = "distlock_release";
/// The lock statements' pool; the listener has its own connection.
const POOL_SIZE: u32 = 8;

/// Bumps the fencing counter only when the statement's snapshot does not show another
/// owner's live lease, so that a refused attempt writes nothing (no commit to flush). When
/// the snapshot is stale, `ON CONFLICT ... WHERE` still decides on the latest row.
const ACQUIRE: &str = "
WITH token AS (
    INSERT INTO distlock_fencing AS f (name, last_token)
    SELECT $1, 1
    WHERE NOT EXISTS (
        SELECT 1 FROM distlock_locks
        WHERE name = $1 AND owner <> $2 AND expires_at > clock_timestamp()
    )
    ON CONFLICT (name) DO UPDATE SET last_token = f.last_token + 1
    RETURNING last_token
)
INSERT INTO distlock_locks AS l (name, owner, holds, fencing_token, expires_at)
SELECT $1, $2, 1, token.last_token, clock_timestamp() + $3 * interval '1 millisecond'
FROM token
ON CONFLICT (name) DO UPDATE SET
    holds = CASE WHEN l.owner = excluded.owner AND l.expires_at > clock_timestamp()
                 THEN l.holds + 1 ELSE 1 END,
    fencing_token = CASE WHEN l.owner = excluded.owner AND l.expires_at > clock_timestamp()
                 THEN l.fencing_token ELSE excluded.fencing_token END,
    expires_at = CASE WHEN l.owner = excluded.owner AND l.expires_at > clock_timestamp()
                 THEN greatest(l.expires_at, excluded.expires_at) ELSE excluded.expires_at END,
    owner = excluded.owner
WHERE l.owner = excluded.owner OR l.expires_at <= clock_timestamp()
RETURNING holds, fencing_token";

/// Milliseconds left of a live lease, or no row.
const TTL: &str = "
SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp()";

const RELEASE: &str = "
WITH dec AS (
    UPDATE distlock_locks SET holds = holds - 1
    WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() AND holds > 1
    RETURNING holds
), del AS (
    DELETE FROM distlock_locks
    WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() AND holds <= 1
    RETURNING 0 AS holds
)
SELECT holds FROM dec
UNION ALL
SELECT del.holds FROM del CROSS JOIN LATERAL (SELECT pg_notify('distlock_release', $1)) n";

/// How often a release that met a concurrent release of the same owner is run again.
const RELEASE_ATTEMPTS: usize = 8;

/// Who holds a live lease on the name: the owner, or no row.
const LIVE_OWNER: &str =
    "SELECT owner, holds FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp()";

const EXTEND: &str = "
UPDATE distlock_locks SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
WHERE name = $1 AND owner = $2 AND fencing_token = $4 AND expires_at > clock_timestamp()
RETURNING 1";

const RENEW: &str = "
UPDATE distlock_locks AS l SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $4::bigint[]) AS k(name, owner, token)
WHERE l.name = k.name AND l.owner = k.owner AND l.fencing_token = k.token
  AND l.expires_at > clock_timestamp()
RETURNING l.name, l.owner";

const FORCE_UNLOCK: &str = "
WITH del AS (
    DELETE FROM distlock_locks WHERE name = $1 RETURNING expires_at > clock_timestamp() AS live
)
SELECT del.live FROM del CROSS JOIN LATERAL (SELECT pg_notify('distlock_release', $1)) n";

/// The live leases whose names start with `$1`, in byte order (collation "C", whatever the
/// database's), at most `$2`. PostgreSQL deletes a row when its lock is released, so this
/// reads the held locks and the expired ones not yet taken over.
const LIST_HELD: &str = r#"
SELECT name FROM distlock_locks
WHERE starts_with(name, $1) AND expires_at > clock_timestamp()
ORDER BY name COLLATE "C" LIMIT $2"#;

/// A `limit` for SQL.
pub(crate) fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub(crate) fn db_error(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| {
        let reason = match &e {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("28P01") => Some(
                    "the server refused the URL's user and password (28P01): check them".to_owned(),
                ),
                // pg_hba.conf has no entry that lets this connection in: often one without
                // TLS where the server requires it.
                Some("28000") => Some(format!(
                    "{} (28000): check the URL's user, database and sslmode",
                    db.message()
                )),
                _ => None,
            },
            _ => None,
        };
        match reason {
            Some(reason) => Error::not_authorized(SCHEME, operation, reason),
            None => Error::backend(SCHEME, operation, e),
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn holds_u32(holds: i32) -> u32 {
    u32::try_from(holds).unwrap_or(0)
}

pub(crate) fn token_u64(token: i64) -> u64 {
    u64::try_from(token).unwrap_or(0)
}

/// Locks in a PostgreSQL table. Made by [`connect`](crate::connect) with a
/// `postgres://...?mode=table` URL; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pool: PgPool,
    /// Fed by the client's listening connection.
    hub: Arc<ReleaseSignals>,
    /// Dropped with the last clone of the backend: ends the listening task.
    _stop: Arc<oneshot::Sender<()>>,
}

/// The two ways to lock in PostgreSQL (`?mode=` in a URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Session advisory locks, each on a connection the lock owns (the default).
    Advisory,
    /// The table-record lock, with LISTEN/NOTIFY wake-up (`?mode=table`).
    Table,
    /// Transaction-scoped advisory locks, each in a transaction its connection keeps open
    /// while it is held (`?mode=transaction`): for a server reached through a pooler in
    /// transaction mode, such as PgBouncer's `pool_mode = transaction`.
    Transaction,
}

/// Checks a URL as connecting would, without connecting ([`crate::validate_url`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    parse_url(url).map(|_| ())
}

/// The driver's options for the server a `postgres://` URL names, whatever its mode.
#[cfg(any(feature = "bench", all(test, feature = "conformance")))]
pub(crate) fn connect_options(url: &str) -> Result<PgConnectOptions> {
    parse_url(url).map(|(options, _)| options)
}

/// The mode a `postgres://` URL names.
#[cfg(feature = "bench")]
pub(crate) fn url_mode(url: &str) -> Result<Mode> {
    parse_url(url).map(|(_, mode)| mode)
}

/// Splits `?mode=` off a `postgres://` URL.
fn parse_url(url: &str) -> Result<(PgConnectOptions, Mode)> {
    let (base, query) = crate::scheme::Query::parse(url)?;
    let mode = match query.choice("mode", &["advisory", "table", "transaction"])? {
        "table" => Mode::Table,
        "transaction" => Mode::Transaction,
        _ => Mode::Advisory,
    };
    let url = query.driver_url(&base.replacen("postgresql://", "postgres://", 1));
    let options = PgConnectOptions::from_str(&url).map_err(|e| {
        Error::invalid(
            "URL",
            format!(
                "{:?} is not a PostgreSQL URL ({e}); write postgres://user:password@host:5432/db",
                crate::redact::shown(&url)
            ),
        )
    })?;
    Ok((options, mode))
}

/// Connects to the backend a `postgres://` URL names: advisory locks, with `?mode=table` the
/// table-record lock, with `?mode=transaction` transaction-scoped advisory locks.
///
/// # Errors
/// [`Error::InvalidInput`] for a malformed URL, [`Error::Backend`] when the server cannot be
/// reached or the tables cannot be made, [`Error::Unsupported`] for `?mode=transaction` on a
/// server before PostgreSQL 14.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let (options, mode) = parse_url(url)?;
    match mode {
        Mode::Table => Ok(Arc::new(PostgresBackend::connect_with(options).await?)),
        Mode::Advisory => {
            let pool = open_pool(
                options.clone(),
                crate::session::OPERATOR_POOL_SIZE,
                PoolFor::SessionLocks,
            )
            .await?;
            Ok(Arc::new(PgAdvisoryBackend::with_pool(options, pool)))
        }
        Mode::Transaction => Ok(Arc::new(PgXactBackend::connect(options).await?)),
    }
}

/// The backend of `mode` for the database of a pool the application already has. The
/// table-record lock runs its statements on the pool and keeps one of its connections for
/// LISTEN. Advisory locks open connections of their own with the pool's connect options
/// (each lock lives in a connection it owns, so it cannot be borrowed from a pool); hooks the
/// application runs on its pool's new connections (`after_connect`, such as a
/// `search_path`) do not apply to those. Makes the tables if missing.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> distlock::Result<()> {
/// let backend = distlock::postgres::from_pool(pool, distlock::postgres::Mode::Advisory).await?;
/// let locks = distlock::Locks::with_backend(backend, distlock::ConnectOptions::new())?;
/// # let _ = locks;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::Backend`] when the tables cannot be made or the listening connection cannot be
/// opened; [`Error::Unsupported`] for [`Mode::Transaction`] on a server before PostgreSQL 14.
pub async fn from_pool(pool: PgPool, mode: Mode) -> Result<Arc<dyn Backend>> {
    match mode {
        Mode::Table => {
            let mut conn = pool.acquire().await.map_err(db_error("connect"))?;
            make_tables(&mut conn).await?;
            drop(conn);
            Ok(Arc::new(PostgresBackend::with_pool(pool).await?))
        }
        Mode::Advisory => {
            // The lock connections write the fencing counter: the tables are made, and the
            // operator's statements run, on connections opened as they are.
            let options = (*pool.connect_options()).clone();
            let own = open_pool(
                options.clone(),
                crate::session::OPERATOR_POOL_SIZE,
                PoolFor::SessionLocks,
            )
            .await?;
            Ok(Arc::new(PgAdvisoryBackend::with_pool(options, own)))
        }
        Mode::Transaction => {
            let options = (*pool.connect_options()).clone();
            Ok(Arc::new(PgXactBackend::connect(options).await?))
        }
    }
}

impl PostgresBackend {
    /// Connects with `?mode=table`, makes the tables if missing, and starts listening for
    /// releases.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or another mode, [`Error::Backend`] when
    /// the server cannot be reached or the tables cannot be made.
    pub async fn connect(url: &str) -> Result<Self> {
        match parse_url(url)? {
            (options, Mode::Table) => Self::connect_with(options).await,
            (_, Mode::Advisory | Mode::Transaction) => Err(Error::invalid(
                "URL",
                format!(
                    "{:?}: the table-record lock needs ?mode=table",
                    crate::redact::shown(url)
                ),
            )),
        }
    }

    async fn connect_with(options: PgConnectOptions) -> Result<Self> {
        Self::with_pool(open_pool(options, POOL_SIZE, PoolFor::Statements).await?).await
    }

    /// Over `pool`, whose tables are made: starts listening for releases.
    async fn with_pool(pool: PgPool) -> Result<Self> {
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(db_error("listen for releases"))?;
        listener
            .listen(CHANNEL)
            .await
            .map_err(db_error("listen for releases"))?;
        let (stop, stopped) = oneshot::channel();
        let hub = Arc::new(ReleaseSignals::default());
        tokio::spawn(listen(listener, Arc::downgrade(&hub), stopped));
        Ok(PostgresBackend {
            pool,
            hub,
            _stop: Arc::new(stop),
        })
    }

    /// Renews grants of writers and mutexes (rows of their own in `distlock_locks`).
    async fn renew_held(&self, locks: &[&Renewing], lease: Duration) -> Result<Vec<bool>> {
        let names: Vec<&str> = locks.iter().map(|r| r.lock.0.as_str()).collect();
        let owners: Vec<&str> = locks.iter().map(|r| r.lock.1.as_str()).collect();
        let tokens: Vec<i64> = locks
            .iter()
            .map(|r| i64::try_from(r.fencing_token).unwrap_or(-1))
            .collect();
        let renewed: Vec<(String, String)> = sqlx::query_as(RENEW)
            .bind(&names)
            .bind(&owners)
            .bind(millis(lease))
            .bind(&tokens)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("renew"))?;
        let renewed: std::collections::HashSet<(String, String)> = renewed.into_iter().collect();
        Ok(locks
            .iter()
            .map(
                |r| renewed.contains(&(r.lock.0.as_str().to_owned(), r.lock.1.as_str().to_owned())),
            )
            .collect())
    }

    async fn live_owner(&self, name: &LockName) -> Result<Option<(String, i32)>> {
        sqlx::query_as(LIVE_OWNER)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("read the lock"))
    }
}

async fn listen(
    mut listener: PgListener,
    hub: Weak<ReleaseSignals>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let received = tokio::select! {
            received = listener.try_recv() => received,
            _ = &mut stopped => return,
        };
        let Some(hub) = hub.upgrade() else {
            return;
        };
        match received {
            Ok(Some(notification)) => hub.signal(notification.payload()),
            Ok(None) => {
                tracing::warn!("the PostgreSQL listening connection was lost; reconnecting");
                hub.signal_all();
            }
            Err(error) => {
                tracing::warn!(%error, "listening for releases failed; retrying");
                hub.signal_all();
                drop(hub);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

crate::driver::driver!(
    check_url: check_url,
    open: connect,
    bare: bare::open,
    bare_applies: bare::applies,
);

#[async_trait]
impl Backend for PostgresBackend {
    fn attempts_share_a_connection(&self) -> bool {
        true
    }

    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        use crate::LockKind;
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let names: Vec<(String,)> = sqlx::query_as(LIST_HELD)
            .bind(prefix)
            .bind(limit_i64(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("list the locks held"))?;
        Ok(names.into_iter().map(|(name,)| name).collect())
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        if readers::is_reader(name) {
            return readers::acquire_read(&self.pool, name, owner, lease).await;
        }
        let granted: Option<(i32, i64)> = sqlx::query_as(ACQUIRE)
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(millis(lease))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("acquire"))?;
        if let Some((holds, token)) = granted {
            return Ok(Acquired::Granted {
                fencing_token: token_u64(token),
                holds: holds_u32(holds),
            });
        }
        if !name.kind().is_exclusive() {
            let ttl = readers::writer_refused(&self.pool, name, owner).await?;
            return Ok(Acquired::Held { ttl: Some(ttl) });
        }
        let ttl: Option<(i64,)> = sqlx::query_as(TTL)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("read the lease"))?;
        Ok(Acquired::Held {
            // Freed between the two statements: try again at once.
            ttl: Some(ttl.map_or(Duration::ZERO, |(ms,)| {
                Duration::from_millis(u64::try_from(ms).unwrap_or(0))
            })),
        })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        // Listen first, then mark: the release a waiting writer waits for cannot come before.
        let receiver = self.hub.subscribe(name.as_str());
        let writer_mark = readers::mark_writer(&self.pool, name, owner).await?;
        Ok(Box::new(PostgresWaiter {
            receiver,
            writer_mark,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        if readers::is_reader(name) {
            return readers::release_read(&self.pool, name, owner).await;
        }
        // Two releases of one owner's holds at once: the second statement's decrement waits
        // for the first's row lock, then finds `holds > 1` false, while its delete looked at
        // the row as it was before (holds 2) and skipped it. It changed nothing, so it is run
        // again while the row is still this owner's.
        for _ in 0..RELEASE_ATTEMPTS {
            let released: Option<(i32,)> = sqlx::query_as(RELEASE)
                .bind(name.as_str())
                .bind(owner.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db_error("release"))?;
            if let Some((holds,)) = released {
                return Ok(Released::Released {
                    remaining_holds: holds_u32(holds),
                });
            }
            match self.live_owner(name).await? {
                Some((holder, _)) if holder == owner.as_str() => continue,
                Some(_) => return Ok(Released::HeldByOther),
                None => return Ok(Released::NotHeld),
            }
        }
        Err(Error::backend(
            "postgres",
            "release a table lock",
            format!("the release of {name} kept meeting concurrent releases of the same owner"),
        ))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        if readers::is_reader(name) {
            return readers::extend_read(&self.pool, name, owner, fencing_token, lease).await;
        }
        let extended = sqlx::query(EXTEND)
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(millis(lease))
            .bind(i64::try_from(fencing_token).unwrap_or(-1))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("extend"))?;
        if extended.is_some() {
            return Ok(Extended::Extended);
        }
        Ok(match self.live_owner(name).await? {
            // The owner's later grant (another token): this one is gone.
            Some((holder, _)) if holder == owner.as_str() => Extended::NotHeld,
            Some(_) => Extended::HeldByOther,
            None => Extended::NotHeld,
        })
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let (reads, held): (Vec<&Renewing>, Vec<&Renewing>) =
            locks.iter().partition(|r| readers::is_reader(&r.lock.0));
        let mut reads_renewed = if reads.is_empty() {
            Vec::new()
        } else {
            readers::renew_reads(&self.pool, &reads, lease).await?
        }
        .into_iter();
        let mut held_renewed = if held.is_empty() {
            Vec::new()
        } else {
            self.renew_held(&held, lease).await?
        }
        .into_iter();
        Ok(locks
            .iter()
            .map(|r| {
                let renewed = if readers::is_reader(&r.lock.0) {
                    reads_renewed.next()
                } else {
                    held_renewed.next()
                };
                renewed.unwrap_or(false)
            })
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(self.live_owner(name).await?.is_some())
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        if readers::is_reader(name) {
            return readers::read_holds(&self.pool, name, owner).await;
        }
        Ok(match self.live_owner(name).await? {
            Some((holder, holds)) if holder == owner.as_str() => holds_u32(holds),
            _ => 0,
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let deleted: Option<(bool,)> = sqlx::query_as(FORCE_UNLOCK)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("force-unlock"))?;
        Ok(deleted.is_some_and(|(live,)| live))
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        published::publish(&self.pool, true, key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        published::read(&self.pool, true, key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        published::withdraw(&self.pool, true, key, term).await
    }
}

struct PostgresWaiter {
    receiver: watch::Receiver<u64>,
    /// A waiting writer's mark, which turns later readers away.
    writer_mark: Option<readers::WriterMark>,
}

#[async_trait]
impl ReleaseWaiter for PostgresWaiter {
    async fn leave(&mut self) {
        if let Some(mark) = self.writer_mark.as_mut() {
            mark.remove().await;
        }
    }

    async fn wait(&mut self, max: Duration) -> Woken {
        crate::wake::release_signalled(&mut self.receiver, max).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_the_mode() {
        assert_eq!(
            parse_url("postgres://u@h/db?mode=table").unwrap().1,
            Mode::Table
        );
        assert_eq!(
            parse_url("postgresql://u@h/db?sslmode=disable&mode=table")
                .unwrap()
                .1,
            Mode::Table
        );
        assert_eq!(parse_url("postgres://u@h/db").unwrap().1, Mode::Advisory);
        let err = parse_url("postgres://u@h/db?mode=rows").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let err = parse_url("postgres://u@h:notaport/db?mode=table").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
}
