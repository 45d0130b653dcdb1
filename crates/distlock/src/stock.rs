//! Stock that never oversells: an item's quantity in a real store, and [`Stock::take`] that
//! checks and decrements it under a distlock lock, or in one atomic step of the store.
//!
//! ```no_run
//! # async fn example() -> distlock::Result<()> {
//! use std::sync::Arc;
//! use distlock::stock::{SqliteStockStore, Stock, Taken};
//!
//! let locks = distlock::connect("sqlite:///tmp/shop-locks.db").await?;
//! let store = Arc::new(SqliteStockStore::open("/tmp/shop-stock.db")?);
//! let iphone = Stock::locked(store, &locks, "iphone-15")?;
//! iphone.create(100).await?;
//! match iphone.take(2).await? {
//!     Taken::Taken { remaining } => println!("sold 2, {remaining} left"),
//!     Taken::SoldOut { available } => println!("only {available} left"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Fenced reads and writes (MISSION §8)
//!
//! A lock's lease can run out while its holder is paused (a long GC, a stopped process). A
//! second holder then takes the lock, and the first one, resuming, must not write. Every read
//! and write that [`Stock`] makes under a lock carries the guard's fencing token, and the store
//! refuses either one when it has already seen a newer token for the item
//! ([`Error::Fenced`]). Fencing the read as well as the write matters: once the newer holder
//! has read the quantity, the stale holder's write, which was based on an older read, would
//! otherwise still be accepted and then overwritten, losing a sale.
//!
//! # Strategies
//!
//! * [`Stock::locked`]: any distlock backend's lock around read, check, write.
//! * [`Stock::atomic`]: no lock; the store checks and decrements in one step (one Lua call on
//!   Redis, one `UPDATE ... WHERE quantity >= n` in SQL). The lock-free ceiling.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::client::Locks;
use crate::error::{Error, Result};
use crate::mutex::{AcquireOptions, Mutex};

#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "sqlite")]
mod sqlite_store;

#[cfg(feature = "redis")]
pub use self::redis_store::RedisStockStore;
#[cfg(feature = "sqlite")]
pub use self::sqlite_store::SqliteStockStore;

/// How long [`Stock::take`] waits for the item's lock by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// The answer to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The units were taken; `remaining` are left.
    Taken {
        /// Units left after this order.
        remaining: u64,
    },
    /// Not enough stock: nothing was taken.
    SoldOut {
        /// Units there were.
        available: u64,
    },
}

impl Taken {
    /// True when the order was served.
    pub fn is_taken(&self) -> bool {
        matches!(self, Taken::Taken { .. })
    }
}

/// Where items' quantities live. Reads and writes made under a lock carry its fencing token;
/// the store refuses a token older than the newest it has seen for the item.
#[async_trait]
pub trait StockStore: Send + Sync + 'static {
    /// Sets an item's quantity, creating it if needed, and forgets its fencing history.
    async fn set(&self, item: &str, quantity: u64) -> Result<()>;
    /// The item's quantity, unfenced.
    async fn quantity(&self, item: &str) -> Result<u64>;
    /// The item's quantity, read under `token`: refused with [`Error::Fenced`] when a newer
    /// token has read or written the item; otherwise `token` becomes the newest seen.
    async fn read_fenced(&self, item: &str, token: u64) -> Result<u64>;
    /// Writes the quantity under `token`, refused as [`StockStore::read_fenced`].
    async fn write_fenced(&self, item: &str, quantity: u64, token: u64) -> Result<()>;
    /// Takes `n` units in one atomic step, or answers sold out.
    async fn take_atomic(&self, item: &str, n: u64) -> Result<Taken>;
    /// Adds `n` units in one atomic step.
    async fn add_atomic(&self, item: &str, n: u64) -> Result<u64>;
}

#[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
pub(crate) fn missing_item(item: &str) -> Error {
    Error::invalid(
        "item",
        format!("{item:?} has no stock in this store; create it first with Stock::create"),
    )
}

pub(crate) fn check_item(item: &str) -> Result<()> {
    if item.is_empty() || item.len() > 200 {
        return Err(Error::invalid(
            "item",
            format!(
                "an item name must be 1 to 200 bytes long, not {} bytes",
                item.len()
            ),
        ));
    }
    Ok(())
}

fn check_units(n: u64) -> Result<()> {
    if n == 0 || n > i64::MAX as u64 {
        return Err(Error::invalid(
            "quantity",
            format!("an order takes 1 to {} units, not {n}", i64::MAX),
        ));
    }
    Ok(())
}

/// One item's stock, and the way orders are protected.
#[derive(Clone)]
pub struct Stock {
    store: Arc<dyn StockStore>,
    item: String,
    lock: Option<Mutex>,
    wait: Duration,
}

impl std::fmt::Debug for Stock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stock")
            .field("item", &self.item)
            .field("locked", &self.lock.is_some())
            .finish_non_exhaustive()
    }
}

impl Stock {
    /// Orders take the lock `stock/<item>` from `locks`, then read, check and write the
    /// quantity with the guard's fencing token.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty or over-long item name.
    pub fn locked(store: Arc<dyn StockStore>, locks: &Locks, item: &str) -> Result<Self> {
        check_item(item)?;
        Ok(Stock {
            store,
            item: item.to_owned(),
            lock: Some(locks.mutex(format!("stock/{item}"))?),
            wait: DEFAULT_WAIT,
        })
    }

    /// Orders check and decrement in one atomic step of the store, without a lock.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty or over-long item name.
    pub fn atomic(store: Arc<dyn StockStore>, item: &str) -> Result<Self> {
        check_item(item)?;
        Ok(Stock {
            store,
            item: item.to_owned(),
            lock: None,
            wait: DEFAULT_WAIT,
        })
    }

    /// How long an order waits for the lock ([`DEFAULT_WAIT`] unless changed).
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The item's name.
    pub fn item(&self) -> &str {
        &self.item
    }

    /// Sets the quantity (creating the item), whatever it was.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store fails.
    pub async fn create(&self, quantity: u64) -> Result<()> {
        check_units(quantity.max(1))?;
        self.store.set(&self.item, quantity).await
    }

    /// Units in stock now.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the item was never created; [`Error::Backend`].
    pub async fn available(&self) -> Result<u64> {
        self.store.quantity(&self.item).await
    }

    /// Takes `n` units, or answers [`Taken::SoldOut`] without taking any. Never oversells.
    ///
    /// # Errors
    /// - [`Error::InvalidInput`] for `n == 0` or an item never created.
    /// - [`Error::Timeout`] when the lock was not granted within the wait.
    /// - [`Error::Fenced`] when this order's lock was lost before it wrote (nothing taken).
    /// - [`Error::Backend`] when the lock's backend or the store fails.
    pub async fn take(&self, n: u64) -> Result<Taken> {
        check_units(n)?;
        let Some(lock) = &self.lock else {
            return self.store.take_atomic(&self.item, n).await;
        };
        self.under_lock(lock, |available| {
            if available >= n {
                (
                    Some(available - n),
                    Taken::Taken {
                        remaining: available - n,
                    },
                )
            } else {
                (None, Taken::SoldOut { available })
            }
        })
        .await
    }

    /// Adds `n` units; returns the new quantity.
    ///
    /// # Errors
    /// As [`Stock::take`].
    pub async fn restock(&self, n: u64) -> Result<u64> {
        check_units(n)?;
        let Some(lock) = &self.lock else {
            return self.store.add_atomic(&self.item, n).await;
        };
        self.under_lock(lock, |available| {
            let total = available.saturating_add(n);
            (Some(total), total)
        })
        .await
    }

    /// Runs one read-decide-write under the item's lock, fenced by the guard's token.
    async fn under_lock<T>(
        &self,
        lock: &Mutex,
        decide: impl FnOnce(u64) -> (Option<u64>, T),
    ) -> Result<T> {
        let guard = lock
            .acquire_with(AcquireOptions::new().wait(self.wait))
            .await?;
        let token = guard.fencing_token();
        let outcome = async {
            let available = self.store.read_fenced(&self.item, token).await?;
            let (write, answer) = decide(available);
            if let Some(quantity) = write {
                self.store.write_fenced(&self.item, quantity, token).await?;
            }
            Ok(answer)
        }
        .await;
        // A write the store accepted stands even if the lease ran out after it: no newer
        // holder had used the item then.
        if let Err(error) = guard.release().await {
            tracing::debug!(item = %self.item, %error, "releasing the stock lock failed");
        }
        outcome
    }
}

/// A fencing refusal, for stores.
#[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
pub(crate) fn fenced(item: &str, token: u64, accepted: u64) -> Error {
    Error::Fenced {
        item: item.to_owned(),
        token,
        accepted,
    }
}
