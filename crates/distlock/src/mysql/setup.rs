//! Setting up MySQL/MariaDB: the tables both modes use, and the pools that make them.

use std::time::Duration;

use sqlx::Connection as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

use super::db_error;
use crate::error::Result;

/// The tables of both modes (named locks keep names and the published records in them).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS distlock_locks (
        name          VARBINARY(1024) NOT NULL PRIMARY KEY,
        owner         VARBINARY(1024) NOT NULL,
        holds         INT             NOT NULL,
        fencing_token BIGINT          NOT NULL,
        expires_us    BIGINT          NOT NULL
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS distlock_fencing (
        name       VARBINARY(1024) NOT NULL PRIMARY KEY,
        last_token BIGINT          NOT NULL
    ) ENGINE = InnoDB",
    super::published::TABLE,
];

/// A pool for the backend's own statements, with the tables made, and where the tokens of
/// named locks come from. `for_session_locks`: the operator's pool of named locks, which opens
/// connections only when asked and closes them when idle; the tables are made on a connection
/// closed right after, so that a client starting up holds no connection beside its lock
/// connection for long.
pub(super) async fn open_pool(
    options: MySqlConnectOptions,
    size: u32,
    for_session_locks: bool,
) -> Result<(MySqlPool, super::named::Tokens)> {
    let pool_options = MySqlPoolOptions::new()
        .max_connections(size)
        .idle_timeout(for_session_locks.then_some(crate::session::OPERATOR_POOL_IDLE))
        .acquire_timeout(Duration::from_secs(10));
    if for_session_locks {
        let mut setup = sqlx::MySqlConnection::connect_with(&options)
            .await
            .map_err(db_error("connect"))?;
        make_tables(&mut setup).await?;
        let tokens = super::named::token_source(&mut setup).await?;
        // Closing only says goodbye to the server; a failure leaves nothing to undo.
        let _ = sqlx::Connection::close(setup).await;
        return Ok((pool_options.connect_lazy_with(options), tokens));
    }
    let pool = pool_options
        .connect_with(options)
        .await
        .map_err(db_error("connect"))?;
    let mut conn = pool.acquire().await.map_err(db_error("connect"))?;
    make_tables(&mut conn).await?;
    drop(conn);
    Ok((pool, super::named::Tokens::Counters))
}

async fn make_tables(conn: &mut sqlx::MySqlConnection) -> Result<()> {
    for statement in SCHEMA {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .map_err(db_error("create the tables"))?;
    }
    Ok(())
}
