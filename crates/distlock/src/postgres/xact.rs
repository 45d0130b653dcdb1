//! PostgreSQL transaction-scoped advisory locks (`postgres://...?mode=transaction`): the SQL
//! side. A lock is `pg_advisory_xact_lock(key)` taken inside a transaction that stays open
//! while the lock is held; `COMMIT` releases it. Such a lock needs a server connection only
//! while a transaction is open, so it works through a connection pooler in transaction mode
//! (PgBouncer's `pool_mode = transaction`), where a waiter queued in the pooler holds none.
//! The client side (lock connections, waiters, leases) is `crate::session`, as for session
//! advisory locks, with one lock per connection (a transaction's locks end together).
//!
//! Every statement here goes as one simple-protocol message with its values written into the
//! text (keys and numbers as digits, names hex-encoded), or, on the operator's pool, inside an
//! explicit transaction as unnamed statements: a pooler in transaction mode may hand each
//! transaction to another server connection, where named prepared statements do not exist.
//!
//! * Try: `BEGIN; SELECT CASE WHEN pg_try_advisory_xact_lock(k) THEN nextval(...) END`, and
//!   `ROLLBACK` when refused.
//! * Wait: `BEGIN`, `lock_timeout` and `client_connection_check_interval` set for the
//!   transaction, then `pg_advisory_xact_lock` and the token, in one message. A dropped waiter
//!   closes its connection; the pooler then closes its server connection, and the server
//!   leaves the lock's queue within [`CHECK_INTERVAL_MS`] (PostgreSQL 14 or later).
//! * Release: `COMMIT`, in one message with the check that the transaction still held it.
//! * Check: `pg_locks` of the transaction's backend, only while a transaction is open, under a
//!   savepoint (a failed check must not abort the transaction, which would free the lock).
//! * Force-unlock: `pg_terminate_backend` of the backend holding it, as for session locks.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgRow};
use sqlx::{Connection, Executor};

use crate::backend::Published;
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};
use crate::session::{Dialect, RecordedNames, SessionBackend};

use super::advisory::{AdvisoryLock, advisory_key};
use super::setup::{PoolFor, open_pool};
use super::{SCHEME, db_error, token_u64};

/// PostgreSQL transaction-scoped advisory locks, `postgres://...?mode=transaction`; see the
/// [`postgres` module docs](crate::postgres).
pub type PgXactBackend = SessionBackend<PgXact>;

/// How often a waiting statement's server checks that its client is still connected, so that a
/// dropped waiter (whose connection closes) leaves the lock's queue.
pub(crate) const CHECK_INTERVAL_MS: u32 = 50;

/// Ids for lock connections, which have no server session of their own through a pooler.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// The advisory keys (bigint form, and whether shared) that this connection's open
/// transaction holds. Outside an explicit transaction (where `now()` is exactly the statement's
/// own start) none; unequal rather than earlier, so that a clock stepped back changes nothing.
const MY_KEYS: &str = "
SELECT (classid::bigint << 32) | objid::bigint AS key, mode = 'ShareLock' AS shared
FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()
  AND now() <> statement_timestamp()";

/// Settings of a lock's transaction, sent in its first message: a held lock is a transaction
/// idle between statements, which no idle or transaction timeout of the server may end
/// (`transaction_timeout` exists from PostgreSQL 17 on).
const HOLD_SETTINGS: &str = "
SET LOCAL idle_in_transaction_session_timeout = 0;
SELECT set_config('transaction_timeout', '0', true)
WHERE current_setting('server_version_num')::int >= 170000;";

/// `text` as an SQL expression that no setting of the server can misread: its UTF-8 bytes in
/// hexadecimal.
fn text_literal(text: &str) -> String {
    let mut hex = String::with_capacity(text.len() * 2);
    for byte in text.as_bytes() {
        let _ = write!(hex, "{byte:02x}");
    }
    format!("convert_from(decode('{hex}', 'hex'), 'UTF8')")
}

/// Runs `sql` (one or more statements) as one simple-protocol message: its rows.
async fn simple(conn: &mut PgConnection, sql: &str, what: &'static str) -> Result<Vec<PgRow>> {
    simple_raw(conn, sql).await.map_err(db_error(what))
}

/// As [`simple`], with the driver's error. A string without parameters goes as a simple query.
async fn simple_raw(conn: &mut PgConnection, sql: &str) -> sqlx::Result<Vec<PgRow>> {
    conn.fetch_all(sql).await
}

/// The first column of the last row (the last statement's answer), if any.
fn last_i64(rows: &[PgRow]) -> Result<Option<i64>> {
    match rows.last() {
        Some(row) => row
            .try_get::<Option<i64>, _>(0)
            .map_err(db_error("read a reply")),
        None => Ok(None),
    }
}

/// The first PostgreSQL version (as `server_version_num`) with
/// `client_connection_check_interval`, which takes a dropped waiter out of the server's queue.
const FIRST_VERSION: i64 = 140_000;

/// Refuses a server older than [`FIRST_VERSION`], where every wait would fail on the unknown
/// setting.
pub(super) async fn check_server(conn: &mut PgConnection) -> Result<()> {
    let sql = "SELECT current_setting('server_version_num')::bigint";
    let version = last_i64(&simple(conn, sql, "read the server's version").await?)?;
    supported(version)
}

fn supported(version: Option<i64>) -> Result<()> {
    match version {
        Some(version) if version < FIRST_VERSION => Err(Error::Unsupported {
            backend: SCHEME,
            operation: "`?mode=transaction` on a server before PostgreSQL 14 (it needs \
                        `client_connection_check_interval`); use `?mode=advisory`",
        }),
        _ => Ok(()),
    }
}

/// The PostgreSQL side of transaction-scoped locks: connection options for lock connections
/// and a pool for the operator's statements.
#[doc(hidden)]
pub struct PgXact {
    options: PgConnectOptions,
    pool: PgPool,
    named: RecordedNames,
}

impl PgXactBackend {
    /// Transaction-scoped advisory locks over the server `options` name (or a pooler in front
    /// of it), with an operator's pool whose statements a pooler in transaction mode passes.
    pub(super) async fn connect(options: PgConnectOptions) -> Result<Self> {
        let options = pooler_options(options);
        let size = crate::session::OPERATOR_POOL_SIZE;
        let pool = open_pool(options.clone(), size, PoolFor::TransactionLocks).await?;
        Ok(SessionBackend::new(PgXact {
            options,
            pool,
            named: RecordedNames::default(),
        }))
    }
}

/// Connect options a pooler accepts: no startup parameter it may not know, no statement logs
/// for waits that block by design.
fn pooler_options(options: PgConnectOptions) -> PgConnectOptions {
    sqlx::ConnectOptions::disable_statement_logging(options.extra_float_digits(None))
}

impl PgXact {
    /// Records `name` for listing, once per client, in a statement of its own.
    async fn remember(&self, conn: &mut PgConnection, name: &LockName) -> Result<()> {
        if self.named.contains(name) {
            return Ok(());
        }
        let sql = format!(
            "INSERT INTO distlock_fencing (name, last_token) VALUES ({}, 0)
             ON CONFLICT (name) DO NOTHING",
            text_literal(name.as_str())
        );
        simple(conn, &sql, "record the lock's name").await?;
        self.named.insert(name);
        Ok(())
    }

    /// Ends a failed or refused transaction; an error leaves the connection to be given up.
    async fn rollback(conn: &mut PgConnection) -> Result<()> {
        simple(conn, "ROLLBACK", "roll back").await.map(drop)
    }

    /// A statement on the operator's pool, as one message.
    async fn on_pool(&self, sql: &str, what: &'static str) -> Result<Vec<PgRow>> {
        let mut conn = self.pool.acquire().await.map_err(db_error(what))?;
        simple(&mut conn, sql, what).await
    }
}

#[async_trait]
impl Dialect for PgXact {
    type Conn = PgConnection;
    type Key = AdvisoryLock;
    const SCHEME: &'static str = SCHEME;
    const ONE_LOCK_PER_SESSION: bool = true;
    const CANCEL_BY_CLOSING: bool = true;

    fn keeps(kind: &LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
    }

    fn key(name: &LockName) -> AdvisoryLock {
        AdvisoryLock::of(name)
    }

    async fn open(&self) -> Result<(PgConnection, u64)> {
        let conn = PgConnection::connect_with(&self.options)
            .await
            .map_err(db_error("open a lock connection"))?;
        Ok((conn, NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed)))
    }

    async fn try_lock(
        &self,
        conn: &mut PgConnection,
        key: &AdvisoryLock,
        name: &LockName,
    ) -> Result<Option<u64>> {
        self.remember(conn, name).await?;
        let function = if key.shared {
            "pg_try_advisory_xact_lock_shared"
        } else {
            "pg_try_advisory_xact_lock"
        };
        let sql = format!(
            "BEGIN; {HOLD_SETTINGS}
             SELECT CASE WHEN {function}({}) THEN nextval('distlock_token_seq') END",
            key.key
        );
        let token = match simple(conn, &sql, "acquire").await {
            Ok(rows) => last_i64(&rows)?,
            Err(error) => {
                Self::rollback(conn).await?;
                return Err(error);
            }
        };
        match token {
            Some(token) => Ok(Some(token_u64(token))),
            None => {
                Self::rollback(conn).await?;
                Ok(None)
            }
        }
    }

    async fn lock_waiting(
        &self,
        conn: &mut PgConnection,
        key: &AdvisoryLock,
        name: &LockName,
        max: Duration,
    ) -> Result<Option<u64>> {
        self.remember(conn, name).await?;
        let function = if key.shared {
            "pg_advisory_xact_lock_shared"
        } else {
            "pg_advisory_xact_lock"
        };
        let timeout_ms = max.as_millis().clamp(1, i32::MAX as u128);
        let sql = format!(
            "BEGIN; {HOLD_SETTINGS}
             SET LOCAL lock_timeout = {timeout_ms};
             SET LOCAL client_connection_check_interval = {CHECK_INTERVAL_MS};
             WITH l AS MATERIALIZED (SELECT {function}({}))
             SELECT nextval('distlock_token_seq') FROM l",
            key.key
        );
        let result = simple_raw(conn, &sql).await;
        match result {
            Ok(rows) => match last_i64(&rows)? {
                Some(token) => Ok(Some(token_u64(token))),
                None => {
                    Self::rollback(conn).await?;
                    Ok(None)
                }
            },
            Err(error) => {
                Self::rollback(conn).await?;
                // 55P03: lock_timeout ran out.
                let timed_out = error
                    .as_database_error()
                    .and_then(|e| e.code())
                    .is_some_and(|code| code == "55P03");
                if timed_out {
                    Ok(None)
                } else {
                    Err(db_error("wait for the lock")(error))
                }
            }
        }
    }

    async fn unlock(&self, conn: &mut PgConnection, key: &AdvisoryLock) -> Result<bool> {
        let sql = format!(
            "SELECT count(*) FROM ({MY_KEYS}) mine WHERE key = {} AND shared = {};
             COMMIT",
            key.key, key.shared
        );
        let rows = simple(conn, &sql, "unlock").await?;
        Ok(last_i64(&rows)?.is_some_and(|held| held > 0))
    }

    async fn unlock_all(&self, conn: &mut PgConnection) -> Result<()> {
        Self::rollback(conn).await
    }

    async fn after_wait(&self, _conn: &mut PgConnection) -> Result<()> {
        // The wait's settings were the transaction's own.
        Ok(())
    }

    async fn held(
        &self,
        conn: &mut PgConnection,
        _keys: &[AdvisoryLock],
    ) -> Result<HashSet<AdvisoryLock>> {
        // Under a savepoint: an error inside the holding transaction would abort it, and the
        // server frees a transaction's locks the moment it aborts, before `lost()` could fire.
        // Outside a transaction (a release committed since the watcher looked) the savepoint
        // itself fails, with 25P01: nothing is held.
        let sql = format!("SAVEPOINT distlock_check; {MY_KEYS}; RELEASE SAVEPOINT distlock_check");
        let rows = match simple_raw(conn, &sql).await {
            Ok(rows) => rows,
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|e| e.code())
                    .is_some_and(|code| code == "25P01") =>
            {
                return Ok(HashSet::new());
            }
            Err(error) => {
                let error = db_error("check held locks")(error);
                let undo = "ROLLBACK TO SAVEPOINT distlock_check; RELEASE SAVEPOINT distlock_check";
                if let Err(undone) = simple(conn, undo, "check held locks").await {
                    tracing::debug!(%undone, "no savepoint to roll back to");
                }
                return Err(error);
            }
        };
        rows.iter()
            .map(|row| {
                Ok(AdvisoryLock {
                    key: row.try_get(0).map_err(db_error("check held locks"))?,
                    shared: row.try_get(1).map_err(db_error("check held locks"))?,
                })
            })
            .collect()
    }

    async fn holders(&self, key: &AdvisoryLock) -> Result<Vec<u64>> {
        let sql = super::advisory::HOLDERS.replace("$1", &key.key.to_string());
        let rows = self.on_pool(&sql, "read the lock").await?;
        Ok(rows
            .iter()
            .filter_map(|row| row.try_get::<i32, _>(0).ok())
            .filter_map(|pid| u64::try_from(pid).ok())
            .collect())
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let held = self
            .on_pool(super::advisory::HELD_KEYS, "list the locks held")
            .await?;
        let held: HashSet<i64> = held
            .iter()
            .filter_map(|row| row.try_get::<i64, _>(0).ok())
            .collect();
        if held.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let sql = super::advisory::NAMES_UNDER.replace("$1", &text_literal(prefix));
        let names = self.on_pool(&sql, "list the locks held").await?;
        Ok(names
            .iter()
            .filter_map(|row| row.try_get::<String, _>(0).ok())
            .filter(|name| held.contains(&advisory_key(name)))
            .take(limit)
            .collect())
    }

    async fn terminate(&self, session: u64) -> Result<bool> {
        let Ok(pid) = i32::try_from(session) else {
            return Ok(false);
        };
        let rows = self
            .on_pool(
                &format!("SELECT pg_terminate_backend({pid})::int"),
                "terminate the holder's session",
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.try_get::<i32, _>(0).ok())
            .is_some_and(|done| done == 1))
    }

    async fn cancel(&self, _via: Option<&mut PgConnection>, _session: u64) -> Result<()> {
        // Never asked: a dropped waiter closes its connection (`CANCEL_BY_CLOSING`).
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        self.on_pool("SELECT 1", "ping").await.map(drop)
    }

    // On the operator's pool, each in a transaction of its own (rolled back if dropped), as
    // unnamed statements, which stay on the transaction's server connection.
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        let mut tx = self.pool.begin().await.map_err(db_error("publish"))?;
        let done = super::published::publish(&mut *tx, false, key, record).await?;
        tx.commit().await.map_err(db_error("publish"))?;
        Ok(done)
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        let what = "read the published record";
        let mut tx = self.pool.begin().await.map_err(db_error(what))?;
        let done = super::published::read(&mut *tx, false, key).await?;
        tx.commit().await.map_err(db_error(what))?;
        Ok(done)
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        let mut tx = self.pool.begin().await.map_err(db_error("withdraw"))?;
        let done = super::published::withdraw(&mut *tx, false, key, term).await?;
        tx.commit().await.map_err(db_error("withdraw"))?;
        Ok(done)
    }

    async fn terminate_holders(&self, key: &AdvisoryLock) -> Result<bool> {
        // Looked up and ended in one statement: through a pooler, a backend that held the lock
        // a moment ago may serve another client now.
        let sql = format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ({}) holders",
            super::advisory::HOLDERS.replace("$1", &key.key.to_string())
        );
        let rows = self.on_pool(&sql, "terminate the holder's session").await?;
        Ok(last_i64(&rows)?.is_some_and(|ended| ended > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_literals_carry_only_hex_digits() {
        assert_eq!(
            text_literal("a'b"),
            "convert_from(decode('612762', 'hex'), 'UTF8')"
        );
        assert_eq!(text_literal(""), "convert_from(decode('', 'hex'), 'UTF8')");
    }
    #[test]
    fn servers_before_14_are_refused_with_what_to_use() {
        let refused = supported(Some(130_011)).unwrap_err();
        assert!(refused.is_unsupported(), "{refused}");
        assert!(refused.to_string().contains("mode=advisory"), "{refused}");
        assert!(supported(Some(140_000)).is_ok());
        assert!(supported(Some(170_002)).is_ok());
    }
}
