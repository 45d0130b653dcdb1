//! MySQL/MariaDB named locks (`mysql://...`, the default mode): the SQL side. The client side
//! (lock connections, waiters, leases) is shared with PostgreSQL advisory locks in
//! `crate::session`.
//!
//! * Try and wait: `GET_LOCK(name, seconds)` in the `WHERE` of an `INSERT ... SELECT` that
//!   bumps the fencing counter, so that a grant and its token are one statement. The token
//!   comes back through `LAST_INSERT_ID(expr)` in the OK packet, which MySQL and MariaDB
//!   both support (no `RETURNING` needed).
//! * Check: `IS_USED_LOCK(name) = CONNECTION_ID()`, for every lock of a connection in one
//!   query.
//! * Cancel and terminate: `KILL QUERY` and `KILL CONNECTION` by the session's id.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlPool};

use crate::backend::Published;
use crate::error::Result;
use crate::name::LockName;
use crate::session::{Dialect, RecordedNames, SessionBackend};

use super::{SCHEME, db_error};

/// MySQL/MariaDB named locks, `mysql://` without `?mode=`; see the
/// [`mysql` module docs](crate::mysql).
pub type MySqlNamedBackend = SessionBackend<MySqlNamed>;

/// The server's limit on a lock name, in characters; we count bytes, which is stricter.
pub const MAX_SERVER_NAME: usize = 64;
/// How much of a long name is kept, readable, before its hash.
const KEPT_PREFIX: usize = MAX_SERVER_NAME - 17;

/// Takes the lock if `GET_LOCK` grants it within the given seconds, and bumps the counter in
/// the same statement. Nothing is inserted when it is not granted.
const LOCK: &str = "
INSERT INTO distlock_fencing (name, last_token)
SELECT ?, LAST_INSERT_ID(1) FROM DUAL WHERE GET_LOCK(?, ?) = 1
ON DUPLICATE KEY UPDATE last_token = LAST_INSERT_ID(last_token + 1)";

/// MariaDB: takes the lock if `GET_LOCK` grants it within the given seconds and, only then,
/// draws the token from the sequence (`IF` evaluates one branch).
const LOCK_FROM_SEQUENCE: &str = "SELECT IF(GET_LOCK(?, ?) = 1, NEXTVAL(distlock_token_seq), NULL)";

/// Records a name, once, for listing (MariaDB; with MySQL's counters the grant records it).
const REMEMBER_NAME: &str = "INSERT IGNORE INTO distlock_fencing (name, last_token) VALUES (?, 0)";

/// Where fencing tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tokens {
    /// MariaDB: one sequence for every name. Its cached values are shared by every session
    /// and handed out in order; the server writes the sequence once per 1,000 values, so a
    /// grant commits nothing, and after a restart it goes on from the next unwritten block.
    Sequence,
    /// MySQL (no sequences): a counter per name in `distlock_fencing`, bumped by the statement
    /// that takes the lock, which commits (and flushes) once per grant.
    Counters,
}

/// MariaDB gets the sequence, made once above every per-name counter kept before it (by
/// clients that predate it); MySQL the counters.
pub(super) async fn token_source(conn: &mut MySqlConnection) -> Result<Tokens> {
    let (version,): (String,) = sqlx::query_as("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error("read the server's version"))?;
    if !version.contains("MariaDB") {
        return Ok(Tokens::Counters);
    }
    let (exists,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = 'distlock_token_seq'",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db_error("look for the token sequence"))?;
    if exists == 0 {
        let (start,): (i64,) = sqlx::query_as(
            "SELECT CAST(COALESCE(MAX(last_token), 0) + 1 AS SIGNED) FROM distlock_fencing",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error("create the token sequence"))?;
        // A number read from the server, not user input.
        let create = format!(
            "CREATE SEQUENCE IF NOT EXISTS distlock_token_seq START WITH {start} \
             MINVALUE 1 CACHE 1000 NOCYCLE"
        );
        sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(&create))
            .await
            .map_err(db_error("create the token sequence"))?;
    }
    Ok(Tokens::Sequence)
}

/// How many names one check asks about.
const CHECK_CHUNK: usize = 256;

/// How many names ever granted one page of [`MySqlNamed::list_held`] reads, and then asks the
/// server about in one `IS_USED_LOCK` query.
const LIST_PAGE: usize = 256;

/// The name a lock has on the server. Names of up to 64 bytes (the server's limit) are used
/// as they are, so that other programs can take the same lock by name. Longer names keep their
/// first bytes (cut at a character boundary), then `#` and the 64-bit FNV-1a hash of the whole
/// name (with distlock's domain tag) in 16 hex digits: 64 bytes at most, deterministic.
pub fn server_lock_name(name: &str) -> String {
    if name.len() <= MAX_SERVER_NAME {
        return name.to_owned();
    }
    let mut cut = KEPT_PREFIX;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}#{:016x}", &name[..cut], crate::session::fnv1a64(name))
}

/// The MySQL side of session locks: connection options for lock connections and a pool for
/// the operator's queries.
#[doc(hidden)]
pub struct MySqlNamed {
    options: MySqlConnectOptions,
    pool: MySqlPool,
    tokens: Tokens,
    /// Names this client has recorded in `distlock_fencing` (with the sequence).
    named: RecordedNames,
}

impl MySqlNamedBackend {
    pub(super) fn with_pool(options: MySqlConnectOptions, pool: MySqlPool, tokens: Tokens) -> Self {
        // A waiting statement blocks by design; sqlx would log each one as slow.
        let options = sqlx::ConnectOptions::disable_statement_logging(options);
        SessionBackend::new(MySqlNamed {
            options,
            pool,
            tokens,
            named: RecordedNames::default(),
        })
    }
}

impl MySqlNamed {
    /// Records `name` in `distlock_fencing` unless this client did already: before its first
    /// grant, on the lock connection about to ask (a statement of its own, committed at once,
    /// so that a failure takes no lock), not on the operator's pool, which would keep a
    /// connection of its own open for it.
    async fn remember(&self, conn: &mut MySqlConnection, name: &LockName) -> Result<()> {
        if self.named.contains(name) {
            return Ok(());
        }
        sqlx::query(REMEMBER_NAME)
            .bind(name.as_str().as_bytes())
            .execute(conn)
            .await
            .map_err(db_error("record the lock's name"))?;
        self.named.insert(name);
        Ok(())
    }

    async fn lock(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        name: &LockName,
        seconds: f64,
        operation: &'static str,
    ) -> Result<Option<u64>> {
        if self.tokens == Tokens::Sequence {
            self.remember(&mut *conn, name).await?;
            let (token,): (Option<i64>,) = sqlx::query_as(LOCK_FROM_SEQUENCE)
                .bind(key)
                .bind(seconds)
                .fetch_one(conn)
                .await
                .map_err(db_error(operation))?;
            return Ok(token.and_then(|t| u64::try_from(t).ok()));
        }
        let done = sqlx::query(LOCK)
            .bind(name.as_str().as_bytes())
            .bind(key)
            .bind(seconds)
            .execute(conn)
            .await
            .map_err(db_error(operation))?;
        Ok((done.rows_affected() > 0).then(|| done.last_insert_id()))
    }

    /// Up to [`LIST_PAGE`] names ever granted through distlock (they have a fencing counter)
    /// in `[from, end)` in byte order, `from` itself included or not.
    async fn granted_names(
        &self,
        from: &[u8],
        inclusive: bool,
        end: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>> {
        let sql = format!(
            "SELECT name FROM distlock_fencing WHERE name {} ?{} ORDER BY name LIMIT {LIST_PAGE}",
            if inclusive { ">=" } else { ">" },
            if end.is_some() { " AND name < ?" } else { "" },
        );
        let mut query = sqlx::query_as::<_, (Vec<u8>,)>(&sql).bind(from);
        if let Some(end) = end {
            query = query.bind(end);
        }
        let names = query
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("list the locks held"))?;
        Ok(names.into_iter().map(|(name,)| name).collect())
    }

    /// Which of `keys` (server lock names) some session holds now: their indexes, ascending.
    async fn used(&self, keys: &[String]) -> Result<Vec<usize>> {
        let rows = vec!["SELECT ? AS i, ? AS k"; keys.len()].join(" UNION ALL ");
        let sql = format!("SELECT i FROM ({rows}) t WHERE IS_USED_LOCK(k) IS NOT NULL ORDER BY i");
        let mut query = sqlx::query_as::<_, (i64,)>(&sql);
        for (i, key) in keys.iter().enumerate() {
            query = query.bind(i64::try_from(i).unwrap_or(i64::MAX)).bind(key);
        }
        let used = query
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("list the locks held"))?;
        Ok(used
            .into_iter()
            .filter_map(|(i,)| usize::try_from(i).ok())
            .collect())
    }

    /// `KILL <what> <session>`, on `via` when given, else on the operator's pool: false when
    /// the session had ended.
    async fn kill(
        &self,
        via: Option<&mut MySqlConnection>,
        what: &str,
        session: u64,
    ) -> Result<bool> {
        // The id is a number we read from the server, never user input.
        let kill = format!("KILL {what} {session}");
        let done = match via {
            Some(conn) => sqlx::Executor::execute(conn, sqlx::raw_sql(&kill)).await,
            None => sqlx::raw_sql(&kill).execute(&self.pool).await,
        };
        match done {
            Ok(_) => Ok(true),
            // 1094: unknown thread id (it has ended already).
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
                    .is_some_and(|e| e.number() == 1094) =>
            {
                Ok(false)
            }
            Err(error) => Err(db_error("end the holder's session")(error)),
        }
    }
}

#[async_trait]
impl Dialect for MySqlNamed {
    type Conn = MySqlConnection;
    type Key = String;
    const SCHEME: &'static str = SCHEME;

    fn keeps(kind: &crate::LockKind) -> bool {
        // MySQL's named locks have one mode: a reader-writer lock is built on them.
        kind.is_exclusive()
    }

    fn key(name: &LockName) -> String {
        server_lock_name(name.as_str())
    }

    async fn open(&self) -> Result<(MySqlConnection, u64)> {
        let mut conn = MySqlConnection::connect_with(&self.options)
            .await
            .map_err(db_error("open a lock connection"))?;
        let (id,): (u64,) = sqlx::query_as("SELECT CONNECTION_ID()")
            .fetch_one(&mut conn)
            .await
            .map_err(db_error("open a lock connection"))?;
        Ok((conn, id))
    }

    async fn try_lock(
        &self,
        conn: &mut MySqlConnection,
        key: &String,
        name: &LockName,
    ) -> Result<Option<u64>> {
        self.lock(conn, key, name, 0.0, "acquire").await
    }

    async fn lock_waiting(
        &self,
        conn: &mut MySqlConnection,
        key: &String,
        name: &LockName,
        max: Duration,
    ) -> Result<Option<u64>> {
        let seconds = max.as_secs_f64().max(0.001);
        self.lock(conn, key, name, seconds, "wait for the lock")
            .await
    }

    async fn unlock(&self, conn: &mut MySqlConnection, key: &String) -> Result<bool> {
        let (released,): (Option<i64>,) = sqlx::query_as("SELECT RELEASE_LOCK(?)")
            .bind(key)
            .fetch_one(conn)
            .await
            .map_err(db_error("unlock"))?;
        Ok(released == Some(1))
    }

    async fn unlock_all(&self, conn: &mut MySqlConnection) -> Result<()> {
        sqlx::query("SELECT RELEASE_ALL_LOCKS()")
            .execute(conn)
            .await
            .map(drop)
            .map_err(db_error("unlock"))
    }

    async fn after_wait(&self, _conn: &mut MySqlConnection) -> Result<()> {
        // GET_LOCK takes its timeout as an argument: nothing stays set on the session.
        Ok(())
    }

    async fn held(&self, conn: &mut MySqlConnection, keys: &[String]) -> Result<HashSet<String>> {
        let mut held = HashSet::new();
        for chunk in keys.chunks(CHECK_CHUNK) {
            let names = vec!["SELECT ? AS k"; chunk.len()].join(" UNION ALL ");
            let sql = format!(
                "SELECT CAST(k AS BINARY) FROM ({names}) t WHERE IS_USED_LOCK(k) = CONNECTION_ID()"
            );
            let mut query = sqlx::query_as::<_, (Vec<u8>,)>(&sql);
            for key in chunk {
                query = query.bind(key);
            }
            let rows = query
                .fetch_all(&mut *conn)
                .await
                .map_err(db_error("check held locks"))?;
            held.extend(
                rows.into_iter()
                    .filter_map(|(key,)| String::from_utf8(key).ok()),
            );
        }
        Ok(held)
    }

    async fn holders(&self, key: &String) -> Result<Vec<u64>> {
        let (holder,): (Option<i64>,) = sqlx::query_as("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error("read the lock"))?;
        Ok(holder
            .and_then(|id| u64::try_from(id).ok())
            .into_iter()
            .collect())
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        // The server can say whether a lock name is in use; listing them would need
        // performance_schema, which MariaDB leaves off by default. So the names come from
        // the fencing counters (one row per name ever granted through distlock), a page at a
        // time, each page asked about in one query.
        let end = crate::name::prefix_end(prefix);
        let mut listed = Vec::new();
        let mut from = prefix.as_bytes().to_vec();
        let mut inclusive = true;
        while listed.len() < limit {
            let page = self
                .granted_names(&from, inclusive, end.as_deref().map(str::as_bytes))
                .await?;
            let names: Vec<String> = page
                .iter()
                .filter_map(|name| String::from_utf8(name.clone()).ok())
                .collect();
            if !names.is_empty() {
                let keys: Vec<String> = names.iter().map(|name| server_lock_name(name)).collect();
                for i in self.used(&keys).await? {
                    if let Some(name) = names.get(i) {
                        listed.push(name.clone());
                    }
                    if listed.len() == limit {
                        break;
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() == LIST_PAGE => {
                    from.clone_from(last);
                    inclusive = false;
                }
                _ => break,
            }
        }
        Ok(listed)
    }

    async fn terminate(&self, session: u64) -> Result<bool> {
        self.kill(None, "CONNECTION", session).await
    }

    async fn cancel(&self, via: Option<&mut MySqlConnection>, session: u64) -> Result<()> {
        self.kill(via, "QUERY", session).await.map(drop)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        super::published::publish(&self.pool, key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        super::published::read(&self.pool, key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        super::published::withdraw(&self.pool, key, term).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_hashed_to_the_server_limit() {
        assert_eq!(server_lock_name("stock/iphone-15"), "stock/iphone-15");
        let exact = "x".repeat(MAX_SERVER_NAME);
        assert_eq!(server_lock_name(&exact), exact);
        let long = format!("{}a", "x".repeat(MAX_SERVER_NAME));
        let mapped = server_lock_name(&long);
        assert_eq!(mapped.len(), MAX_SERVER_NAME);
        assert!(mapped.starts_with(&"x".repeat(KEPT_PREFIX)));
        assert_ne!(mapped, server_lock_name(&format!("{}b", "x".repeat(64))));
        // Fixed: changing the mapping would let old and new clients hold one lock twice.
        assert_eq!(server_lock_name(&long), server_lock_name(&long));
        let wide = "é".repeat(40);
        let mapped = server_lock_name(&wide);
        assert!(mapped.len() <= MAX_SERVER_NAME, "{mapped}");
        assert!(mapped.starts_with(&"é".repeat(23)));
    }
}
