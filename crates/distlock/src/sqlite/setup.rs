//! Setting up a lock file just opened: WAL, then the tables, safe when several processes
//! open a new file at the same moment.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::rows::add_bell_column;
use super::{SCHEME, backend_error, published};
use crate::error::{Error, Result};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS distlock_locks (
    id            INTEGER PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    owner         TEXT    NOT NULL,
    holds         INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    lease_ms      INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS distlock_fencing (
    name       TEXT    PRIMARY KEY,
    last_token INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS distlock_waiters (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT    NOT NULL,
    owner      TEXT    NOT NULL,
    seen_at_ms INTEGER NOT NULL,
    bell       TEXT
);
CREATE INDEX IF NOT EXISTS distlock_waiters_by_name ON distlock_waiters (name, ticket);
";

/// Sets up a file just opened: WAL, then the tables (made if missing, in one transaction).
///
/// Processes that open a new file at the same moment meet here. Switching a file to WAL needs
/// it to themselves, and SQLite answers "database is locked" at once instead of calling the
/// busy handler when another connection is reading or switching it too; creating the tables
/// can meet the same while the other one's switch is under way. So each step is tried again,
/// with short naps, while it is refused as busy and `budget` (the busy timeout) lasts.
pub(super) fn set_up(conn: &mut Connection, budget: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + budget;
    let mut nap = Duration::from_micros(500);
    let mut retry = |error: rusqlite::Error, operation: &'static str| {
        if !is_busy(&error) || std::time::Instant::now() >= deadline {
            return Err(Error::backend(SCHEME, operation, error));
        }
        std::thread::sleep(nap + Duration::from_micros(fastrand::u64(0..=500)));
        nap = (nap * 2).min(Duration::from_millis(20));
        Ok(())
    };
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        }) {
            Ok(_mode) => break,
            Err(error) => retry(error, "switch to WAL")?,
        }
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL;")
        .map_err(backend_error("set synchronous"))?;
    loop {
        match create_tables(conn) {
            Ok(()) => return Ok(()),
            Err(error) => retry(error, "create the lock tables")?,
        }
    }
}

/// Makes the tables that are missing, and the waiters' bell and kind columns in a file made
/// before doorbells or reader-writer locks, in one write transaction (rolled back when it fails).
fn create_tables(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    tx.execute_batch(published::SCHEMA)?;
    tx.execute_batch(super::readers::SCHEMA)?;
    add_bell_column(&tx)?;
    super::readers::add_kind_column(&tx)?;
    tx.commit()
}

/// True for SQLite's "the file is busy or locked by another connection".
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
