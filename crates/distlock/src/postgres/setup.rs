//! Setting up PostgreSQL: the tables both modes use, and the pools that make them.

use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::db_error;
use crate::error::Result;

/// The tables of both modes (advisory locks keep names and the published records in them).
const SCHEMA: &[&str] = &[
    // Serialises concurrent first connections: CREATE TABLE IF NOT EXISTS alone can fail
    // when two sessions create the same table at once.
    "SELECT pg_advisory_xact_lock(7135591823651209011)",
    "CREATE TABLE IF NOT EXISTS distlock_locks (
        name          text        PRIMARY KEY,
        owner         text        NOT NULL,
        holds         integer     NOT NULL,
        fencing_token bigint      NOT NULL,
        expires_at    timestamptz NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS distlock_fencing (
        name       text   PRIMARY KEY,
        last_token bigint NOT NULL
    )",
    super::published::TABLE,
];

/// Whether a function of that name exists (in the search path).
const FUNCTION_EXISTS: &str = "SELECT to_regproc($1) IS NOT NULL";

/// What a pool made by [`open_pool`] serves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PoolFor {
    /// The table-record lock's statements: a pool kept open.
    Statements,
    /// The operator's statements beside session-level advisory locks.
    SessionLocks,
    /// The operator's statements beside transaction-scoped locks (`?mode=transaction`): as
    /// [`PoolFor::SessionLocks`], on a server checked to be new enough.
    TransactionLocks,
}

/// A pool for the backend's own statements, with the tables made. Beside advisory locks, it
/// is the operator's pool, which opens connections only when asked and closes them when idle;
/// the tables are made (and the server checked) on a connection closed right after, so that a
/// client starting up holds no connection beside its lock connection for long.
pub(super) async fn open_pool(
    options: PgConnectOptions,
    size: u32,
    used: PoolFor,
) -> Result<PgPool> {
    let for_session_locks = used != PoolFor::Statements;
    let pool_options = PgPoolOptions::new()
        .max_connections(size)
        .idle_timeout(for_session_locks.then_some(crate::session::OPERATOR_POOL_IDLE))
        .acquire_timeout(Duration::from_secs(10));
    if for_session_locks {
        let mut setup = sqlx::PgConnection::connect_with(&options)
            .await
            .map_err(db_error("connect"))?;
        if used == PoolFor::TransactionLocks {
            super::xact::check_server(&mut setup).await?;
        }
        make_tables(&mut setup).await?;
        // Closing only says goodbye to the server; a failure leaves nothing to undo.
        let _ = sqlx::Connection::close(setup).await;
        return Ok(pool_options.connect_lazy_with(options));
    }
    let pool = pool_options
        .connect_with(options)
        .await
        .map_err(db_error("connect"))?;
    let mut conn = pool.acquire().await.map_err(db_error("connect"))?;
    make_tables(&mut conn).await?;
    drop(conn);
    Ok(pool)
}

pub(super) async fn make_tables(conn: &mut sqlx::PgConnection) -> Result<()> {
    let mut tx = sqlx::Connection::begin(conn)
        .await
        .map_err(db_error("create the tables"))?;
    for statement in SCHEMA.iter().chain(super::readers::SCHEMA) {
        // Unnamed statements: a pooler in transaction mode may give the next transaction
        // another server connection, where a named one would be missing or taken.
        sqlx::query(statement)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(db_error("create the tables"))?;
    }
    for (function, statement) in super::readers::FUNCTIONS {
        let (exists,): (bool,) = sqlx::query_as(FUNCTION_EXISTS)
            .persistent(false)
            .bind(function)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error("create the functions"))?;
        if !exists {
            sqlx::query(statement)
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(db_error("create the functions"))?;
        }
    }
    // Under the schema's lock, so that one first connection makes the sequence.
    super::advisory::make_token_sequence(&mut tx).await?;
    tx.commit().await.map_err(db_error("create the tables"))
}
