//! The MySQL/MariaDB backend: named locks (`mysql://user@host:3306/db`, the default; the
//! scheme `mariadb://` means the same) and the table-record lock (`...?mode=table`).
//!
//! # Named locks (the default)
//!
//! A lock is `GET_LOCK(name, seconds)` held by a connection that the lock owns for as long as
//! it is held, separate from any pool the application uses for its business work. The client
//! side is the one PostgreSQL advisory locks use:
//!
//! * `try_acquire` runs `GET_LOCK(name, 0)` on an idle lock connection the client keeps, or
//!   else on its primary lock connection (see `crate::session`).
//! * A waiting acquisition takes a connection of its own and blocks in `GET_LOCK` for what is
//!   left of its wait. The server hands the lock over when the holder releases it, and that
//!   connection then holds it.
//! * **Names.** The server allows 64 characters. Names of up to 64 bytes are used as they
//!   are; longer ones become their first 47 bytes, `#` and 16 hex digits of a 64-bit hash
//!   ([`server_lock_name`]). MariaDB 10.11 compares names byte for byte; a server that
//!   compares them without case makes `Foo` and `foo` one lock (needless waiting, never two
//!   holders).
//! * **Fencing tokens** are drawn by the statement that takes the lock, after it: on MariaDB
//!   from the sequence `distlock_token_seq` (a grant commits nothing), on MySQL from a
//!   counter per name in `distlock_fencing` (one commit per grant). See
//!   `docs/backends/mysql.md` for the limits and for upgrading from per-name counters.
//! * **Loss.** When a lock connection dies or is killed (`KILL`), the server frees its locks
//!   at once, and the next renewal check (one query per lock connection) fires `lost()`.
//!   `force_unlock` kills the holding connection, which frees every lock it held.
//! * **Leases** are kept by the holder's client: a fixed lease ends with the client
//!   releasing. A stopped holder keeps its locks until its connection is closed.
//!
//! # The table-record lock (`?mode=table`)
//!
//! One row per lock name in `distlock_locks` (name, owner, hold count, fencing token, lease
//! end in microseconds of the server's clock). Every operation is one statement:
//!
//! * **Acquire** is an `INSERT ... ON DUPLICATE KEY UPDATE` whose assignments grant the lock
//!   when it is free or its lease has run out, re-enter it for its owner, and leave the row as
//!   it was otherwise (a refused attempt changes nothing). The new token and hold count come
//!   back packed in `LAST_INSERT_ID(expr)`: the token times 2²⁰ plus the hold count, so a
//!   hold count stops at 1,048,575 and tokens at 2⁴³.
//! * **Rows stay** after a release (owner emptied, lease 0), so the token keeps counting up
//!   across holders, expiry and force-unlock without a second table.
//! * **Waking.** MySQL has no notifications. A release by the same client wakes its waiters
//!   at once; waiters in other clients poll, from every 2 ms backing off to every 50 ms, and
//!   at the latest when the holder's lease ends. Waiters are not queued: whoever asks first
//!   after a release wins.
//!
//! The tables are made at connect if missing. Sessions run with `time_zone = '+00:00'`, so
//! the lease arithmetic never meets a daylight-saving shift.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use tokio::sync::watch;

#[cfg(feature = "bench")]
mod bare;
mod named;
mod published;
mod setup;

use self::setup::open_pool;

pub(crate) use self::named::MySqlNamedBackend;
pub use self::named::server_lock_name;

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, Woken,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::wake::ReleaseSignals;

pub(crate) const SCHEME: &str = "mysql";
/// The lock statements' pool.
const POOL_SIZE: u32 = 8;
/// Table-lock waiters in other clients poll from this interval...
const POLL_FIRST: Duration = Duration::from_millis(2);
/// ...doubling up to this one.
const POLL_MAX: Duration = Duration::from_millis(50);

/// The server's clock in microseconds since the epoch (the session's time zone is UTC).
macro_rules! now_us {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}

/// Parameters: name, owner, lease (µs), owner, owner, lease, owner, lease.
///
/// The assignments are ordered so that each reads the columns it tests before they change,
/// whether the server assigns left to right (MySQL, MariaDB by default) or all at once
/// (MariaDB's `SIMULTANEOUS_ASSIGNMENT`).
const ACQUIRE: &str = concat!(
    "INSERT INTO distlock_locks (name, owner, holds, fencing_token, expires_us)
VALUES (?, ?, 1, LAST_INSERT_ID(1048577) >> 20, ",
    now_us!(),
    " + ?)
ON DUPLICATE KEY UPDATE
    fencing_token = CASE
        WHEN expires_us <= ",
    now_us!(),
    " THEN LAST_INSERT_ID(((fencing_token + 1) << 20) | 1) >> 20
        WHEN owner = ? THEN fencing_token + 0 * LAST_INSERT_ID((fencing_token << 20) | LEAST(holds + 1, 1048575))
        ELSE fencing_token + 0 * LAST_INSERT_ID(0) END,
    holds = CASE
        WHEN expires_us <= ",
    now_us!(),
    " THEN 1
        WHEN owner = ? THEN LEAST(holds + 1, 1048575)
        ELSE holds END,
    owner = IF(expires_us <= ",
    now_us!(),
    ", ?, owner),
    expires_us = CASE
        WHEN expires_us <= ",
    now_us!(),
    " THEN ",
    now_us!(),
    " + ?
        WHEN owner = ? THEN GREATEST(expires_us, ",
    now_us!(),
    " + ?)
        ELSE expires_us END"
);

/// Microseconds left of a live lease, or no row.
const TTL: &str = concat!(
    "SELECT expires_us - ",
    now_us!(),
    " FROM distlock_locks WHERE name = ? AND expires_us > ",
    now_us!()
);

/// Parameters: name, owner. The remaining holds come back in `LAST_INSERT_ID`.
const RELEASE: &str = concat!(
    "UPDATE distlock_locks SET
    owner = IF(holds <= 1, '', owner),
    expires_us = IF(holds <= 1, 0, expires_us),
    holds = LAST_INSERT_ID(holds - 1)
WHERE name = ? AND owner = ? AND expires_us > ",
    now_us!()
);

/// Who holds a live lease on the name: the owner, or no row.
const LIVE_OWNER: &str = concat!(
    "SELECT owner, holds FROM distlock_locks WHERE name = ? AND expires_us > ",
    now_us!()
);

/// Parameters: lease, name, owner.
const EXTEND: &str = concat!(
    "UPDATE distlock_locks SET expires_us = ",
    now_us!(),
    " + ? WHERE name = ? AND owner = ? AND fencing_token = ? AND expires_us > ",
    now_us!()
);

const FORCE_UNLOCK: &str = concat!(
    "UPDATE distlock_locks SET owner = '', holds = 0, expires_us = 0
WHERE name = ? AND expires_us > ",
    now_us!()
);

/// The live leases in a range of names, in byte order (names are `VARBINARY`, so the primary
/// key serves the range). Parameters: first name, end of the range, limit.
const LIST_HELD: &str = concat!(
    "SELECT name FROM distlock_locks WHERE name >= ? AND name < ? AND expires_us > ",
    now_us!(),
    " ORDER BY name LIMIT ?"
);

/// As [`LIST_HELD`], for a range without an end. Parameters: first name, limit.
const LIST_HELD_FROM: &str = concat!(
    "SELECT name FROM distlock_locks WHERE name >= ? AND expires_us > ",
    now_us!(),
    " ORDER BY name LIMIT ?"
);

/// How many locks one renewal statement covers.
const RENEW_CHUNK: usize = 256;

/// A `limit` for SQL.
pub(crate) fn limit_u64(limit: usize) -> u64 {
    u64::try_from(limit).unwrap_or(u64::MAX)
}

pub(crate) fn db_error(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| {
        // Access denied for the user (1045), to the database (1044), or a connection without
        // TLS where the server requires it (3159).
        let refused = match &e {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .filter(|db| matches!(db.number(), 1044 | 1045 | 3159))
                .map(|db| format!("{} ({})", db.message(), db.number())),
            _ => None,
        };
        match refused {
            Some(message) => Error::not_authorized(
                SCHEME,
                operation,
                format!("{message}: check the URL's user, password and ssl-mode"),
            ),
            None => Error::backend(SCHEME, operation, e),
        }
    }
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX / 2)
}

/// The two ways to lock in MySQL and MariaDB (`?mode=` in a URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Named locks (`GET_LOCK`), each on a connection the lock owns (the default).
    Named,
    /// The table-record lock (`?mode=table`).
    Table,
}

/// Checks a URL as connecting would, without connecting ([`crate::validate_url`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    parse_url(url).map(|_| ())
}

/// The driver's options for the server a `mysql://` or `mariadb://` URL names, whatever its
/// mode.
#[cfg(feature = "bench")]
pub(crate) fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
    parse_url(url).map(|(options, _)| options)
}

/// Splits `?mode=` off a `mysql://` or `mariadb://` URL.
fn parse_url(url: &str) -> Result<(MySqlConnectOptions, Mode)> {
    let (base, query) = crate::scheme::Query::parse(url)?;
    let mode = match query.choice("mode", &["named", "table"])? {
        "table" => Mode::Table,
        _ => Mode::Named,
    };
    let url = query.driver_url(&base.replacen("mariadb://", "mysql://", 1));
    let options = MySqlConnectOptions::from_str(&url).map_err(|e| {
        Error::invalid(
            "URL",
            format!(
                "{:?} is not a MySQL URL ({e}); write mysql://user:password@host:3306/db",
                crate::redact::shown(&url)
            ),
        )
    })?;
    // Lease arithmetic reads the server's clock as UTC (no daylight-saving shifts).
    Ok((options.timezone(Some("+00:00".to_owned())), mode))
}

/// Connects to the backend a `mysql://` (or `mariadb://`) URL names: named locks, or with
/// `?mode=table` the table-record lock.
///
/// # Errors
/// [`Error::InvalidInput`] for a malformed URL, [`Error::Backend`] when the server cannot be
/// reached or the tables cannot be made.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let (options, mode) = parse_url(url)?;
    connect_with(options, mode).await
}

/// The backend of `mode` for the database of a pool the application already has. It opens
/// connections of its own with the pool's connect options, set to UTC (the lease arithmetic
/// reads the server's clock in the session's time zone, which the pool's connections may not
/// use; and each named lock lives in a connection it owns). Makes the tables if missing.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> distlock::Result<()> {
/// let backend = distlock::mysql::from_pool(&pool, distlock::mysql::Mode::Named).await?;
/// let locks = distlock::Locks::with_backend(backend, distlock::ConnectOptions::new())?;
/// # let _ = locks;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::Backend`] when the server cannot be reached or the tables cannot be made.
pub async fn from_pool(pool: &MySqlPool, mode: Mode) -> Result<Arc<dyn Backend>> {
    let options = (*pool.connect_options()).clone();
    connect_with(options.timezone(Some("+00:00".to_owned())), mode).await
}

async fn connect_with(options: MySqlConnectOptions, mode: Mode) -> Result<Arc<dyn Backend>> {
    match mode {
        Mode::Table => Ok(Arc::new(MySqlTableBackend {
            pool: open_pool(options, POOL_SIZE, false).await?.0,
            hub: Arc::default(),
        })),
        Mode::Named => {
            let (pool, tokens) =
                open_pool(options.clone(), crate::session::OPERATOR_POOL_SIZE, true).await?;
            Ok(Arc::new(MySqlNamedBackend::with_pool(
                options, pool, tokens,
            )))
        }
    }
}

/// Locks in a MySQL/MariaDB table. Made by [`connect`](crate::connect) with a
/// `mysql://...?mode=table` URL; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct MySqlTableBackend {
    pool: MySqlPool,
    /// Releases this client made; waiters in other clients poll.
    hub: Arc<ReleaseSignals>,
}

impl MySqlTableBackend {
    async fn live_owner(&self, name: &LockName) -> Result<Option<(Vec<u8>, i32)>> {
        sqlx::query_as(LIVE_OWNER)
            .bind(name.as_str().as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("read the lock"))
    }
}

crate::driver::driver!(check_url: check_url, open: connect, bare: bare::open);

#[async_trait]
impl Backend for MySqlTableBackend {
    fn attempts_share_a_connection(&self) -> bool {
        true
    }

    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        kind.is_exclusive()
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let query = match crate::name::prefix_end(prefix) {
            Some(end) => sqlx::query_as::<_, (Vec<u8>,)>(LIST_HELD)
                .bind(prefix.as_bytes().to_vec())
                .bind(end.into_bytes()),
            None => sqlx::query_as(LIST_HELD_FROM).bind(prefix.as_bytes().to_vec()),
        };
        let names = query
            .bind(limit_u64(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("list the locks held"))?;
        // Every name was written from a `LockName`, which is UTF-8.
        Ok(names
            .into_iter()
            .filter_map(|(name,)| String::from_utf8(name).ok())
            .collect())
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let owner = owner.as_str().as_bytes();
        let lease = micros(lease);
        let done = sqlx::query(ACQUIRE)
            .bind(name.as_str().as_bytes())
            .bind(owner)
            .bind(lease)
            .bind(owner)
            .bind(owner)
            .bind(owner)
            .bind(lease)
            .bind(owner)
            .bind(lease)
            .execute(&self.pool)
            .await
            .map_err(db_error("acquire"))?;
        let packed = done.last_insert_id();
        if packed != 0 {
            return Ok(Acquired::Granted {
                fencing_token: packed >> 20,
                holds: u32::try_from(packed & 0xF_FFFF).unwrap_or(0),
            });
        }
        let ttl: Option<(i64,)> = sqlx::query_as(TTL)
            .bind(name.as_str().as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error("read the lease"))?;
        Ok(Acquired::Held {
            // Freed between the two statements: try again at once.
            ttl: Some(ttl.map_or(Duration::ZERO, |(us,)| {
                Duration::from_micros(u64::try_from(us).unwrap_or(0))
            })),
        })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        _owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let receiver = self.hub.subscribe(name.as_str());
        Ok(Box::new(PollingWaiter {
            receiver,
            interval: POLL_FIRST,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let done = sqlx::query(RELEASE)
            .bind(name.as_str().as_bytes())
            .bind(owner.as_str().as_bytes())
            .execute(&self.pool)
            .await
            .map_err(db_error("release"))?;
        if done.rows_affected() > 0 {
            let remaining = u32::try_from(done.last_insert_id()).unwrap_or(0);
            if remaining == 0 {
                self.hub.signal(name.as_str());
            }
            return Ok(Released::Released {
                remaining_holds: remaining,
            });
        }
        Ok(match self.live_owner(name).await? {
            Some(_) => Released::HeldByOther,
            None => Released::NotHeld,
        })
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let done = sqlx::query(EXTEND)
            .bind(micros(lease))
            .bind(name.as_str().as_bytes())
            .bind(owner.as_str().as_bytes())
            .bind(i64::try_from(fencing_token).unwrap_or(-1))
            .execute(&self.pool)
            .await
            .map_err(db_error("extend"))?;
        if done.rows_affected() > 0 {
            return Ok(Extended::Extended);
        }
        Ok(match self.live_owner(name).await? {
            // The owner's later grant (another token): this one is gone.
            Some((holder, _)) if holder == owner.as_str().as_bytes() => Extended::NotHeld,
            Some(_) => Extended::HeldByOther,
            None => Extended::NotHeld,
        })
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let mut renewed = std::collections::HashSet::new();
        for chunk in locks.chunks(RENEW_CHUNK) {
            let triples = vec!["(?, ?, ?)"; chunk.len()].join(", ");
            let update = format!(
                "UPDATE distlock_locks SET expires_us = {} + ? \
                 WHERE (name, owner, fencing_token) IN ({triples}) AND expires_us > {}",
                now_us!(),
                now_us!()
            );
            let mut query = sqlx::query(&update).bind(micros(lease));
            for Renewing {
                lock: (name, owner),
                fencing_token,
            } in chunk
            {
                query = query
                    .bind(name.as_str().as_bytes())
                    .bind(owner.as_str().as_bytes())
                    .bind(i64::try_from(*fencing_token).unwrap_or(-1));
            }
            query.execute(&self.pool).await.map_err(db_error("renew"))?;
            // Which of them this owner holds now: exactly those the update just renewed.
            let select = format!(
                "SELECT name, owner FROM distlock_locks \
                 WHERE (name, owner, fencing_token) IN ({triples}) AND expires_us > {}",
                now_us!()
            );
            let mut query = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(&select);
            for Renewing {
                lock: (name, owner),
                fencing_token,
            } in chunk
            {
                query = query
                    .bind(name.as_str().as_bytes())
                    .bind(owner.as_str().as_bytes())
                    .bind(i64::try_from(*fencing_token).unwrap_or(-1));
            }
            renewed.extend(
                query
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error("renew"))?,
            );
        }
        Ok(locks
            .iter()
            .map(
                |Renewing {
                     lock: (name, owner),
                     ..
                 }| {
                    renewed.contains(&(
                        name.as_str().as_bytes().to_vec(),
                        owner.as_str().as_bytes().to_vec(),
                    ))
                },
            )
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(self.live_owner(name).await?.is_some())
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        Ok(match self.live_owner(name).await? {
            Some((holder, holds)) if holder == owner.as_str().as_bytes() => {
                u32::try_from(holds).unwrap_or(0)
            }
            _ => 0,
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let done = sqlx::query(FORCE_UNLOCK)
            .bind(name.as_str().as_bytes())
            .execute(&self.pool)
            .await
            .map_err(db_error("force-unlock"))?;
        self.hub.signal(name.as_str());
        Ok(done.rows_affected() > 0)
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        published::publish(&self.pool, key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        published::read(&self.pool, key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        published::withdraw(&self.pool, key, term).await
    }
}

/// Waits for a release by this client, or polls with a growing interval.
struct PollingWaiter {
    receiver: watch::Receiver<u64>,
    interval: Duration,
}

#[async_trait]
impl ReleaseWaiter for PollingWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        let jitter = Duration::from_micros(fastrand::u64(0..=500));
        let step = self.interval + jitter;
        self.interval = (self.interval * 2).min(POLL_MAX);
        crate::wake::release_signalled(&mut self.receiver, max.min(step)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_the_mode() {
        assert_eq!(
            parse_url("mysql://u@h/db?mode=table").unwrap().1,
            Mode::Table
        );
        assert_eq!(parse_url("mariadb://u@h/db").unwrap().1, Mode::Named);
        assert_eq!(
            parse_url("mysql://u@h/db?ssl-mode=disabled&mode=named")
                .unwrap()
                .1,
            Mode::Named
        );
        let err = parse_url("mysql://u@h/db?mode=rows").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let err = parse_url("mysql://u@h:notaport/db").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
}
