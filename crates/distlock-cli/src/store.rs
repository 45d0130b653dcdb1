//! The demo's stock store: one item's stock in an SQLite table, shared by the worker
//! processes. Reads and writes are separate statements on purpose: a purchase reads the
//! stock, spends its critical section, and writes back what it read minus one, which is the
//! read-modify-write that a lock has to protect.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, params};

use crate::failure::{CliResult, Failure};

pub const ITEM: &str = "iphone";

/// How many times an optimistic buyer tries before it gives up.
pub const OPTIMISTIC_ATTEMPTS: u32 = 10;

/// What one purchase came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bought {
    Accepted,
    /// Out of stock.
    Refused,
    /// Optimistic only: every attempt lost its race.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    GaveUp,
}

#[derive(Clone)]
pub struct Store {
    connection: Arc<Mutex<Connection>>,
}

impl Store {
    pub fn open(path: &Path) -> CliResult<Self> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(30))?;
        connection.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        connection.execute_batch(
            "CREATE TABLE IF NOT EXISTS demo_stock (
                 item TEXT PRIMARY KEY,
                 quantity INTEGER NOT NULL
             );",
        )?;
        Ok(Store {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> CliResult<T> {
        let connection = self.connection.clone();
        let result = tokio::task::spawn_blocking(move || {
            let connection = connection.lock().unwrap_or_else(|p| p.into_inner());
            work(&connection)
        })
        .await
        .map_err(|e| Failure::failed(format!("stock store task failed: {e}")))?;
        Ok(result?)
    }

    pub async fn set(&self, quantity: i64) -> CliResult {
        self.with(move |c| {
            c.execute(
                "INSERT INTO demo_stock (item, quantity) VALUES (?1, ?2)
                 ON CONFLICT (item) DO UPDATE SET quantity = excluded.quantity",
                params![ITEM, quantity],
            )
            .map(drop)
        })
        .await
    }

    pub async fn read(&self) -> CliResult<i64> {
        self.with(|c| {
            c.query_row(
                "SELECT quantity FROM demo_stock WHERE item = ?1",
                [ITEM],
                |row| row.get(0),
            )
        })
        .await
    }

    pub async fn write(&self, quantity: i64) -> CliResult {
        self.with(move |c| {
            c.execute(
                "UPDATE demo_stock SET quantity = ?2 WHERE item = ?1",
                params![ITEM, quantity],
            )
            .map(drop)
        })
        .await
    }
}
