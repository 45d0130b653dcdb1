//! The demo's stock: where a strategy sells from, and one purchase under each protection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock::stock::{SqliteStockStore, Stock, StockStore, Taken, Work};

use super::strategy::{Database, Protection, Strategy};
use crate::failure::{CliResult, Failure};

/// The item every run on the SQLite file sells (runs on a server get an item of their own).
pub const ITEM: &str = "iphone";

/// How many times an optimistic buyer tries before it gives up.
pub const OPTIMISTIC_ATTEMPTS: u32 = distlock::stock::DEFAULT_ATTEMPTS;

/// What one purchase came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bought {
    Accepted,
    /// Out of stock.
    Refused,
    /// Optimistic only: every attempt lost its race.
    GaveUp,
}

impl From<Taken> for Bought {
    fn from(taken: Taken) -> Self {
        match taken {
            Taken::Taken { .. } => Bought::Accepted,
            Taken::SoldOut { .. } => Bought::Refused,
            Taken::GaveUp { .. } => Bought::GaveUp,
        }
    }
}

/// The stock a strategy sells from, in a `distlock::stock` store: the SQLite file, a
/// PostgreSQL or MySQL table, or Redis.
#[derive(Clone)]
pub struct DemoStock {
    store: Arc<dyn StockStore>,
    item: String,
}

impl DemoStock {
    /// The stock of a strategy: the SQLite file at `db`, or `item` on the server `store_url`
    /// of the strategy's `database`.
    pub async fn open(
        db: &Path,
        database: Database,
        store_url: Option<&str>,
        item: &str,
        connections: u32,
    ) -> CliResult<Self> {
        let store: Arc<dyn StockStore> = match (database, store_url) {
            (Database::Sqlite, _) | (_, None) => Arc::new(SqliteStockStore::open(db)?),
            #[cfg(feature = "redis")]
            (Database::Redis, Some(url)) => {
                Arc::new(distlock::stock::RedisStockStore::connect(url).await?)
            }
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            (Database::Postgres | Database::MySql, Some(url)) => {
                Arc::new(distlock::stock::SqlStockStore::connect(url, connections).await?)
            }
            #[allow(unreachable_patterns)]
            (_, Some(url)) => {
                let _ = connections;
                return Err(Failure::usage(format!(
                    "{}: this distlock was built without the feature for this server",
                    distlock::redact_url(url)
                )));
            }
        };
        Ok(DemoStock {
            store,
            item: item.to_owned(),
        })
    }

    pub async fn set(&self, quantity: u64) -> CliResult {
        Ok(self.store.set(&self.item, quantity).await?)
    }

    pub async fn read(&self) -> CliResult<u64> {
        Ok(self.store.quantity(&self.item).await?)
    }

    /// Removes a run's own item from a server; the SQLite file is the run's to keep or drop.
    pub async fn remove(&self) -> CliResult {
        self.store.remove(&self.item).await?;
        Ok(())
    }

    /// How a buyer of `strategy` orders: the library's protected `Stock`, or `None` for the
    /// unprotected read, think, write.
    pub fn buyer(
        &self,
        strategy: Strategy,
        locks: Option<&distlock::Locks>,
    ) -> CliResult<Option<Stock>> {
        let (store, item) = (self.store.clone(), self.item.as_str());
        Ok(match strategy.protection() {
            Protection::Nothing | Protection::ProcessMutex => None,
            Protection::Lock => {
                let locks = locks.ok_or_else(|| {
                    Failure::usage(format!("strategy {} needs --lock-url", strategy.name()))
                })?;
                Some(Stock::locked(store, locks, item)?)
            }
            Protection::RowLock => Some(Stock::pessimistic(store, item)?),
            Protection::Version => Some(Stock::optimistic(store, item, OPTIMISTIC_ATTEMPTS)?),
            Protection::Atomic => Some(Stock::atomic(store, item)?),
        })
    }

    /// The unprotected purchase of one unit: read, spend the critical section, write back
    /// what was read minus one. What a lock has to protect.
    pub async fn buy_unprotected(&self, hold: Duration) -> CliResult<Bought> {
        let quantity = self.read().await?;
        crate::workers::spend(hold).await;
        if quantity < 1 {
            return Ok(Bought::Refused);
        }
        self.set(quantity - 1).await?;
        Ok(Bought::Accepted)
    }
}

/// One protected purchase of one unit, the critical section inside the protection (for the
/// atomic step, after it: nothing can be inside one store step).
pub async fn buy(stock: &Stock, protection: Protection, hold: Duration) -> CliResult<Bought> {
    if protection == Protection::Atomic {
        let taken = stock.take(1).await?;
        crate::workers::spend(hold).await;
        return Ok(taken.into());
    }
    let work: Work<'_> = Box::pin(crate::workers::spend(hold));
    Ok(stock.take_with(1, work).await?.into())
}
