//! PostgreSQL session advisory locks (`postgres://...`, the default mode): the SQL side. The
//! client side (lock connections, waiters, leases) is shared with MySQL named locks in
//! `crate::session`.
//!
//! * Try: `pg_try_advisory_lock`, in one statement with the fencing counter's bump.
//! * Wait: `pg_advisory_lock` with `lock_timeout` set to the time the waiter may wait
//!   (SQLSTATE 55P03 when it runs out).
//! * Readers of a reader-writer lock take the same key in shared mode
//!   (`pg_try_advisory_lock_shared`, `pg_advisory_lock_shared`), writers in exclusive mode;
//!   the server's lock queue makes a reader wait behind a writer that waits.
//! * Check: `pg_locks`, filtered to the session's own granted advisory locks (with their
//!   mode).
//! * Cancel and terminate: `pg_cancel_backend` and `pg_terminate_backend` by the session's pid.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};

use crate::backend::Published;
use crate::error::Result;
use crate::name::{LockKind, LockName};
use crate::session::{Dialect, RecordedNames, SessionBackend};

use super::{SCHEME, db_error, token_u64};

/// PostgreSQL session advisory locks, `postgres://` without `?mode=`; see the
/// [`postgres` module docs](crate::postgres).
pub type PgAdvisoryBackend = SessionBackend<PgAdvisory>;

/// Takes the lock if free and, only then, draws the next token of the sequence.
const TRY_LOCK: &str =
    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('distlock_token_seq') END";

const TRY_LOCK_SHARED: &str =
    "SELECT CASE WHEN pg_try_advisory_lock_shared($1) THEN nextval('distlock_token_seq') END";

/// Waits for the lock, then draws the token (the CTE runs before the row it feeds is made).
const BLOCKING_LOCK: &str = "
WITH l AS MATERIALIZED (SELECT pg_advisory_lock($1))
SELECT nextval('distlock_token_seq') FROM l";

const BLOCKING_LOCK_SHARED: &str = "
WITH l AS MATERIALIZED (SELECT pg_advisory_lock_shared($1))
SELECT nextval('distlock_token_seq') FROM l";

/// Records a name, once, for listing: the server's locks know only keys.
const REMEMBER_NAME: &str = "
INSERT INTO distlock_fencing (name, last_token) VALUES ($1, 0) ON CONFLICT (name) DO NOTHING";

/// The advisory keys (bigint form) this session holds, and whether in shared mode.
const MY_KEYS: &str = "
SELECT (classid::bigint << 32) | objid::bigint, mode = 'ShareLock' FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()";

/// The sessions holding `key` in this database (advisory keys are per database; another
/// database's sessions holding the same key hold another lock).
pub(super) const HOLDERS: &str = "
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((classid::bigint << 32) | objid::bigint) = $1";

/// Every advisory key (bigint form) some session holds now in this database, in either mode.
pub(super) const HELD_KEYS: &str = "
SELECT DISTINCT (classid::bigint << 32) | objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// The names ever granted through distlock that start with `$1`, in byte order.
pub(super) const NAMES_UNDER: &str = r#"
SELECT name FROM distlock_fencing WHERE starts_with(name, $1) ORDER BY name COLLATE "C""#;

/// The advisory locks' fencing tokens: one sequence for every name, so that a grant writes
/// nothing that must be flushed (PostgreSQL logs a sequence 32 values ahead and flushes that
/// record before the value is seen). `CACHE 1`: every session draws from the shared counter,
/// so tokens follow the order of the grants. Made once; it starts above every per-name counter
/// that clients before it kept in `distlock_fencing`.
const TOKEN_SEQUENCE: &[&str] = &[
    "CREATE SEQUENCE distlock_token_seq AS bigint MINVALUE 1 CACHE 1 NO CYCLE",
    "SELECT setval('distlock_token_seq',
        (SELECT coalesce(max(last_token), 0) + 1 FROM distlock_fencing), false)",
];

/// Makes the token sequence if it is missing, in the schema transaction `tx`.
pub(super) async fn make_token_sequence(tx: &mut sqlx::PgConnection) -> Result<()> {
    let (exists,): (bool,) = sqlx::query_as("SELECT to_regclass('distlock_token_seq') IS NOT NULL")
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(db_error("create the tables"))?;
    if !exists {
        for statement in TOKEN_SEQUENCE {
            sqlx::query(statement)
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(db_error("create the token sequence"))?;
        }
    }
    Ok(())
}

/// The advisory key of a lock name: FNV-1a (64 bit) over `distlock\0` and the name's bytes,
/// as a signed bigint. Stable across releases: every client of one lock must agree on it. Two
/// names collide with a chance of about n²/2⁶⁵ for n names in use at once.
pub fn advisory_key(name: &str) -> i64 {
    i64::from_ne_bytes(crate::session::fnv1a64(name).to_ne_bytes())
}

/// An advisory lock as the server names it: its key, and its mode (shared for a reader of a
/// reader-writer lock, exclusive otherwise).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdvisoryLock {
    pub(super) key: i64,
    pub(super) shared: bool,
}

impl AdvisoryLock {
    /// The lock of `name`: its key, shared for a reader of a reader-writer lock.
    pub(super) fn of(name: &LockName) -> Self {
        AdvisoryLock {
            key: advisory_key(name.as_str()),
            shared: matches!(name.kind(), LockKind::Read),
        }
    }
}

/// The PostgreSQL side of session locks: connection options for lock connections and a pool
/// for the operator's queries.
#[doc(hidden)]
pub struct PgAdvisory {
    options: PgConnectOptions,
    pool: PgPool,
    /// Names this client has recorded in `distlock_fencing`.
    named: RecordedNames,
}

impl PgAdvisory {
    /// Records `name` in `distlock_fencing` unless this client did already: before its first
    /// grant, on the lock connection about to ask (a statement of its own, committed at once,
    /// so that a failure takes no lock), not on the operator's pool, which would keep a
    /// connection of its own open for it.
    async fn remember(&self, conn: &mut PgConnection, name: &LockName) -> Result<()> {
        if self.named.contains(name) {
            return Ok(());
        }
        sqlx::query(REMEMBER_NAME)
            .bind(name.as_str())
            .execute(conn)
            .await
            .map_err(db_error("record the lock's name"))?;
        self.named.insert(name);
        Ok(())
    }
}

impl PgAdvisoryBackend {
    pub(super) fn with_pool(options: PgConnectOptions, pool: PgPool) -> Self {
        // A waiting statement blocks by design; sqlx would log each one as slow.
        let options = sqlx::ConnectOptions::disable_statement_logging(options);
        SessionBackend::new(PgAdvisory {
            options,
            pool,
            named: RecordedNames::default(),
        })
    }
}

#[async_trait]
impl Dialect for PgAdvisory {
    type Conn = PgConnection;
    type Key = AdvisoryLock;
    const SCHEME: &'static str = SCHEME;

    fn keeps(kind: &LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
    }

    fn key(name: &LockName) -> AdvisoryLock {
        AdvisoryLock::of(name)
    }

    async fn open(&self) -> Result<(PgConnection, u64)> {
        let mut conn = PgConnection::connect_with(&self.options)
            .await
            .map_err(db_error("open a lock connection"))?;
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .map_err(db_error("open a lock connection"))?;
        Ok((conn, u64::try_from(pid).unwrap_or(0)))
    }

    async fn try_lock(
        &self,
        conn: &mut PgConnection,
        key: &AdvisoryLock,
        name: &LockName,
    ) -> Result<Option<u64>> {
        self.remember(conn, name).await?;
        let sql = if key.shared {
            TRY_LOCK_SHARED
        } else {
            TRY_LOCK
        };
        let (token,): (Option<i64>,) = sqlx::query_as(sql)
            .bind(key.key)
            .fetch_one(conn)
            .await
            .map_err(db_error("acquire"))?;
        Ok(token.map(token_u64))
    }

    async fn lock_waiting(
        &self,
        conn: &mut PgConnection,
        key: &AdvisoryLock,
        name: &LockName,
        max: Duration,
    ) -> Result<Option<u64>> {
        let sql = if key.shared {
            BLOCKING_LOCK_SHARED
        } else {
            BLOCKING_LOCK
        };
        self.remember(conn, name).await?;
        let timeout_ms = max.as_millis().clamp(1, i32::MAX as u128).to_string();
        sqlx::query("SELECT set_config('lock_timeout', $1, false)")
            .bind(&timeout_ms)
            .execute(&mut *conn)
            .await
            .map_err(db_error("wait for the lock"))?;
        let result: std::result::Result<(i64,), sqlx::Error> = sqlx::query_as(sql)
            .bind(key.key)
            .fetch_one(&mut *conn)
            .await;
        match result {
            Ok((token,)) => Ok(Some(token_u64(token))),
            // 55P03: lock_timeout ran out.
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|e| e.code())
                    .is_some_and(|code| code == "55P03") =>
            {
                Ok(None)
            }
            Err(error) => Err(db_error("wait for the lock")(error)),
        }
    }

    async fn unlock(&self, conn: &mut PgConnection, key: &AdvisoryLock) -> Result<bool> {
        let sql = if key.shared {
            "SELECT pg_advisory_unlock_shared($1)"
        } else {
            "SELECT pg_advisory_unlock($1)"
        };
        let (unlocked,): (bool,) = sqlx::query_as(sql)
            .bind(key.key)
            .fetch_one(conn)
            .await
            .map_err(db_error("unlock"))?;
        Ok(unlocked)
    }

    async fn after_wait(&self, conn: &mut PgConnection) -> Result<()> {
        // Back to the session's default (the role's or database's, if an operator set one).
        sqlx::query("RESET lock_timeout")
            .execute(conn)
            .await
            .map(drop)
            .map_err(db_error("reset the lock timeout"))
    }

    async fn unlock_all(&self, conn: &mut PgConnection) -> Result<()> {
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(conn)
            .await
            .map(drop)
            .map_err(db_error("unlock"))
    }

    async fn held(
        &self,
        conn: &mut PgConnection,
        _keys: &[AdvisoryLock],
    ) -> Result<HashSet<AdvisoryLock>> {
        let keys: Vec<(i64, bool)> = sqlx::query_as(MY_KEYS)
            .fetch_all(conn)
            .await
            .map_err(db_error("check held locks"))?;
        Ok(keys
            .into_iter()
            .map(|(key, shared)| AdvisoryLock { key, shared })
            .collect())
    }

    async fn holders(&self, key: &AdvisoryLock) -> Result<Vec<u64>> {
        let holders: Vec<(i32,)> = sqlx::query_as(HOLDERS)
            .bind(key.key)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("read the lock"))?;
        Ok(holders
            .into_iter()
            .filter_map(|(pid,)| u64::try_from(pid).ok())
            .collect())
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        // The server knows keys, not names: the names come from the fencing counters (one row
        // per name ever granted through distlock), kept when their key is held now.
        let held: Vec<(i64,)> = sqlx::query_as(HELD_KEYS)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("list the locks held"))?;
        let held: HashSet<i64> = held.into_iter().map(|(key,)| key).collect();
        let mut listed = Vec::new();
        if held.is_empty() || limit == 0 {
            return Ok(listed);
        }
        let mut names = sqlx::query_as::<_, (String,)>(NAMES_UNDER)
            .bind(prefix)
            .fetch(&self.pool);
        while let Some((name,)) = names
            .try_next()
            .await
            .map_err(db_error("list the locks held"))?
        {
            if held.contains(&advisory_key(&name)) {
                listed.push(name);
                if listed.len() == limit {
                    break;
                }
            }
        }
        Ok(listed)
    }

    async fn terminate(&self, session: u64) -> Result<bool> {
        let Ok(pid) = i32::try_from(session) else {
            return Ok(false);
        };
        let (terminated,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error("terminate the holder's session"))?;
        Ok(terminated)
    }

    async fn cancel(&self, via: Option<&mut PgConnection>, session: u64) -> Result<()> {
        let Ok(pid) = i32::try_from(session) else {
            return Ok(());
        };
        let cancel = sqlx::query("SELECT pg_cancel_backend($1)").bind(pid);
        match via {
            Some(conn) => cancel.execute(conn).await,
            None => cancel.execute(&self.pool).await,
        }
        .map(drop)
        .map_err(db_error("cancel a waiting statement"))
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        super::published::publish(&self.pool, true, key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        super::published::read(&self.pool, true, key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        super::published::withdraw(&self.pool, true, key, term).await
    }
}

impl PgAdvisory {
    /// The dialect of a client of `url`, with the tables made: for the tests of faults inside
    /// one statement (`session_faults.rs`).
    #[cfg(all(test, feature = "conformance"))]
    pub(crate) async fn for_tests(url: &str) -> Self {
        let options = super::connect_options(url).expect("a PostgreSQL URL");
        let pool = super::setup::open_pool(options.clone(), 1, super::setup::PoolFor::SessionLocks)
            .await
            .expect("the operator's pool");
        PgAdvisory {
            options,
            pool,
            named: RecordedNames::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        // Fixed: changing the mapping would let old and new clients hold one lock twice.
        assert_eq!(advisory_key(""), advisory_key(""));
        assert_ne!(advisory_key("a"), advisory_key("b"));
        assert_ne!(advisory_key("ab"), advisory_key("ba"));
        // Computed independently (a Python FNV-1a over b"distlock\0stock/iphone-15").
        assert_eq!(advisory_key("stock/iphone-15"), -4_084_211_295_201_441_055);
    }
}
