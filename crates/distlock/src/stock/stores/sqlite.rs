//! Stock in an SQLite file: one row per item with its quantity and the newest fencing token
//! seen. Each operation is one statement, so several processes can share the file.

use std::path::Path;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::stock::{Spread, StockStore, Taken, fenced, missing_item, plan_spread};

const SCHEME: &str = "sqlite";
/// How long a statement waits for other processes' writes before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Stock in an SQLite file (table `distlock_stock`).
#[derive(Clone)]
pub struct SqliteStockStore {
    connection: Arc<StdMutex<Connection>>,
}

impl std::fmt::Debug for SqliteStockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStockStore").finish_non_exhaustive()
    }
}

fn db_error(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |e| Error::backend(SCHEME, operation, e)
}

fn to_u64(quantity: i64) -> u64 {
    u64::try_from(quantity).unwrap_or(0)
}

fn to_i64(quantity: u64) -> i64 {
    i64::try_from(quantity).unwrap_or(i64::MAX)
}

/// What a sale committed to an [`SqliteStockStore`] survives, and what that costs.
///
/// SQLite has no group commit: with [`Full`](Self::Full), every sale waits for the disk while
/// it holds the file's write lock, so the file as a whole sells at most one sale per disk
/// sync, however many locks or segments serve the item. On the development machine (a disk
/// sync of about 0.15 ms, shared by the processes) the hot-item scenario's 20 segments sold
/// about 500 units/s with `Full` and about 840/s with [`Normal`](Self::Normal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteDurability {
    /// `synchronous = FULL`: a sale survives the machine losing power. The default.
    #[default]
    Full,
    /// `synchronous = NORMAL` (the file is in WAL mode): a sale survives its process crashing,
    /// but the last sales before a power loss or an operating-system crash may roll back and
    /// their units be sold again. Choose it only where that is acceptable.
    Normal,
}

impl SqliteStockStore {
    /// Opens (or creates) the file and the table, with [`SqliteDurability::Full`].
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the file's directory does not exist; [`Error::Backend`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteDurability::Full)
    }

    /// Opens (or creates) the file and the table, committing with `durability`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(path: impl AsRef<Path>, durability: SqliteDurability) -> Result<Self> {
        let path = path.as_ref();
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
            && !parent.is_dir()
        {
            return Err(Error::invalid(
                "stock file",
                format!("the directory {} does not exist", parent.display()),
            ));
        }
        let connection = Connection::open(path).map_err(db_error("open the stock file"))?;
        // Short naps while another process writes (a stock statement lasts tens of µs), not
        // SQLite's own 1, 2, 5, 10 ms ... ones.
        connection
            .busy_handler(Some(crate::sqlite::busy_wait))
            .map_err(db_error("open the stock file"))?;
        connection
            .query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(db_error("open the stock file"))?;
        let synchronous = match durability {
            SqliteDurability::Full => "FULL",
            SqliteDurability::Normal => "NORMAL",
        };
        connection
            .execute_batch(&format!("PRAGMA synchronous = {synchronous}"))
            .map_err(db_error("open the stock file"))?;
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS distlock_stock (
                     item     TEXT    PRIMARY KEY,
                     quantity INTEGER NOT NULL,
                     fence    INTEGER NOT NULL
                 )",
            )
            .map_err(db_error("create the stock table"))?;
        Ok(SqliteStockStore {
            connection: Arc::new(StdMutex::new(connection)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            let connection = crate::sqlite::lock_connection(&connection, BUSY_TIMEOUT);
            work(&connection)
        })
        .await
        .map_err(|e| Error::backend(SCHEME, "run a stock statement", e))?
    }
}

/// The item's quantity, or the missing-item error.
fn quantity_of(c: &Connection, item: &str) -> Result<u64> {
    let quantity: Option<i64> = c
        .query_row(
            "SELECT quantity FROM distlock_stock WHERE item = ?1",
            [item],
            |row| row.get(0),
        )
        .optional()
        .map_err(db_error("read the stock"))?;
    quantity.map(to_u64).ok_or_else(|| missing_item(item))
}

/// The newest token seen for `item`, or the missing-item error.
fn fence_of(c: &Connection, item: &str) -> Result<u64> {
    let fence: Option<i64> = c
        .query_row(
            "SELECT fence FROM distlock_stock WHERE item = ?1",
            [item],
            |row| row.get(0),
        )
        .optional()
        .map_err(db_error("read the stock"))?;
    fence.map(to_u64).ok_or_else(|| missing_item(item))
}

#[async_trait]
impl StockStore for SqliteStockStore {
    fn kind(&self) -> &'static str {
        SCHEME
    }

    async fn set(&self, item: &str, quantity: u64) -> Result<()> {
        let item = item.to_owned();
        self.with(move |c| {
            c.execute(
                "INSERT INTO distlock_stock (item, quantity, fence) VALUES (?1, ?2, 0)
                 ON CONFLICT (item) DO UPDATE SET quantity = excluded.quantity, fence = 0",
                params![item, to_i64(quantity)],
            )
            .map(drop)
            .map_err(db_error("set the stock"))
        })
        .await
    }

    async fn remove(&self, item: &str) -> Result<bool> {
        let item = item.to_owned();
        self.with(move |c| {
            c.execute("DELETE FROM distlock_stock WHERE item = ?1", [&item])
                .map(|deleted| deleted > 0)
                .map_err(db_error("remove an item"))
        })
        .await
    }

    async fn quantity(&self, item: &str) -> Result<u64> {
        let item = item.to_owned();
        self.with(move |c| quantity_of(c, &item)).await
    }

    async fn read_fenced(&self, item: &str, token: u64) -> Result<u64> {
        let item = item.to_owned();
        self.with(move |c| {
            let quantity: Option<i64> = c
                .query_row(
                    "UPDATE distlock_stock SET fence = ?2 WHERE item = ?1 AND fence <= ?2
                     RETURNING quantity",
                    params![item, to_i64(token)],
                    |row| row.get(0),
                )
                .optional()
                .map_err(db_error("read the stock"))?;
            match quantity {
                Some(quantity) => Ok(to_u64(quantity)),
                None => Err(fenced(&item, token, fence_of(c, &item)?)),
            }
        })
        .await
    }

    async fn write_fenced(&self, item: &str, quantity: u64, token: u64) -> Result<()> {
        let item = item.to_owned();
        self.with(move |c| {
            let written = c
                .execute(
                    "UPDATE distlock_stock SET quantity = ?3, fence = ?2
                     WHERE item = ?1 AND fence <= ?2",
                    params![item, to_i64(token), to_i64(quantity)],
                )
                .map_err(db_error("write the stock"))?;
            if written == 1 {
                Ok(())
            } else {
                Err(fenced(&item, token, fence_of(c, &item)?))
            }
        })
        .await
    }

    async fn take_atomic(&self, item: &str, n: u64) -> Result<Taken> {
        let item = item.to_owned();
        self.with(move |c| {
            let remaining: Option<i64> = c
                .query_row(
                    "UPDATE distlock_stock SET quantity = quantity - ?2
                     WHERE item = ?1 AND quantity >= ?2 RETURNING quantity",
                    params![item, to_i64(n)],
                    |row| row.get(0),
                )
                .optional()
                .map_err(db_error("take stock"))?;
            if let Some(remaining) = remaining {
                return Ok(Taken::Taken {
                    remaining: to_u64(remaining),
                });
            }
            Ok(Taken::SoldOut {
                available: quantity_of(c, &item)?,
            })
        })
        .await
    }

    async fn add_atomic(&self, item: &str, n: u64) -> Result<u64> {
        let item = item.to_owned();
        self.with(move |c| {
            let total: Option<i64> = c
                .query_row(
                    "UPDATE distlock_stock SET quantity = quantity + ?2 WHERE item = ?1
                     RETURNING quantity",
                    params![item, to_i64(n)],
                    |row| row.get(0),
                )
                .optional()
                .map_err(db_error("restock"))?;
            total.map(to_u64).ok_or_else(|| missing_item(&item))
        })
        .await
    }

    async fn take_spread(&self, items: &[String], n: u64) -> Result<Spread> {
        let items = items.to_vec();
        self.with(move |c| {
            let tx =
                rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)
                    .map_err(db_error("take stock from several items"))?;
            let mut quantities = Vec::with_capacity(items.len());
            for item in &items {
                quantities.push(quantity_of(&tx, item)?);
            }
            let parts = plan_spread(&quantities, n);
            for ((item, &quantity), &part) in items.iter().zip(&quantities).zip(&parts) {
                if part > 0 {
                    tx.execute(
                        "UPDATE distlock_stock SET quantity = ?2 WHERE item = ?1",
                        params![item, to_i64(quantity - part)],
                    )
                    .map_err(db_error("take stock from several items"))?;
                }
            }
            tx.commit()
                .map_err(db_error("take stock from several items"))?;
            Ok(Spread { quantities, parts })
        })
        .await
    }
}
