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
//!     Taken::GaveUp { attempts } => println!("gave up after {attempts} attempts"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Fenced reads and writes
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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::client::Locks;
use crate::error::{Error, Result};
use crate::mutex::Mutex;
use crate::options::AcquireOptions;

mod commit;
#[cfg(feature = "redis")]
mod redis_store;
mod segmented;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql_store;
#[cfg(feature = "sqlite")]
mod sqlite_store;

#[cfg(feature = "redis")]
pub use self::redis_store::RedisStockStore;
use self::segmented::Hints;
pub use self::segmented::{MAX_SEGMENTS, SegmentedStock, SegmentedTaken};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::sql_store::SqlStockStore;
#[cfg(feature = "sqlite")]
pub use self::sqlite_store::{SqliteDurability, SqliteStockStore};

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
    /// Optimistic strategy only: every attempt found the item changed by another order
    /// between its read and its write, so the order gave up. Nothing was taken; stock may be
    /// left. Try again later, or use a lock for this item.
    GaveUp {
        /// Attempts made.
        attempts: u32,
    },
}

impl Taken {
    /// True when the order was served.
    pub fn is_taken(&self) -> bool {
        matches!(self, Taken::Taken { .. })
    }
}

/// The answer of [`StockStore::take_spread`]: what one step across several items saw and
/// took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spread {
    /// Each item's quantity when the step ran, in the order the items were given.
    pub quantities: Vec<u64>,
    /// Units taken from each item, in the same order: all zero when the total was short.
    pub parts: Vec<u64>,
}

impl Spread {
    /// True when the units were taken.
    pub fn is_taken(&self) -> bool {
        self.parts.iter().any(|&part| part > 0)
    }

    /// Units in all the items together when the step ran.
    pub fn total(&self) -> u64 {
        self.quantities
            .iter()
            .fold(0, |sum, &q| sum.saturating_add(q))
    }
}

/// How `n` units are taken from items holding `quantities`: from the fullest first (the lower
/// index on a tie), all zero when the total is short.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn plan_spread(quantities: &[u64], n: u64) -> Vec<u64> {
    let mut parts = vec![0; quantities.len()];
    if quantities
        .iter()
        .fold(0u64, |sum, &q| sum.saturating_add(q))
        < n
    {
        return parts;
    }
    let mut order: Vec<usize> = (0..quantities.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(quantities[i]), i));
    let mut left = n;
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] = left.min(quantities[i]);
        left -= parts[i];
    }
    parts
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

    /// Deletes the item and its fencing history; `false` when there was none. The stores of
    /// this crate implement it; the default answers [`Error::Unsupported`].
    async fn remove(&self, item: &str) -> Result<bool> {
        let _ = item;
        Err(Error::Unsupported {
            backend: self.kind(),
            operation: "removing an item",
        })
    }

    /// Takes `n` units from `items` together, from the fullest first, all or nothing: the
    /// atomic [`SegmentedStock`]'s order that no one segment can serve.
    ///
    /// The stores of this crate do it in one atomic step (one script, one transaction), so
    /// an order is refused only when the items' total really was short. This default, for
    /// other stores, takes item by item with [`take_atomic`](Self::take_atomic) and puts
    /// back what it took when the total is short: not atomic, so while it runs another order
    /// can see less stock than there is, and be refused although the total sufficed.
    async fn take_spread(&self, items: &[String], n: u64) -> Result<Spread> {
        let mut spread = Spread {
            quantities: Vec::with_capacity(items.len()),
            parts: vec![0; items.len()],
        };
        let mut left = n;
        for (i, item) in items.iter().enumerate() {
            let quantity = self.quantity(item).await?;
            spread.quantities.push(quantity);
            let part = left.min(quantity);
            if part > 0 && self.take_atomic(item, part).await?.is_taken() {
                spread.parts[i] = part;
                left -= part;
            }
        }
        if left > 0 {
            for (item, part) in items.iter().zip(&mut spread.parts) {
                if *part > 0 {
                    self.add_atomic(item, *part).await?;
                    *part = 0;
                }
            }
        }
        Ok(spread)
    }

    /// The pessimistic strategy: in one transaction, read the quantity with a row lock
    /// (`SELECT ... FOR UPDATE`), run `work` while the row is locked, then write. Stores
    /// without row locks answer [`Error::Unsupported`].
    async fn take_row_locked(&self, item: &str, n: u64, work: Work<'_>) -> Result<Taken> {
        let _ = (item, n, work);
        Err(Error::Unsupported {
            backend: self.kind(),
            operation: "row locks (the pessimistic strategy)",
        })
    }

    /// The optimistic strategy's read: quantity and version.
    async fn read_versioned(&self, item: &str) -> Result<(u64, u64)> {
        let _ = item;
        Err(Error::Unsupported {
            backend: self.kind(),
            operation: "version checks (the optimistic strategy)",
        })
    }

    /// The optimistic strategy's write: succeeds (true) only if the version is still the one
    /// read, and bumps it.
    async fn write_versioned(&self, item: &str, quantity: u64, version: u64) -> Result<bool> {
        let _ = (item, quantity, version);
        Err(Error::Unsupported {
            backend: self.kind(),
            operation: "version checks (the optimistic strategy)",
        })
    }

    /// The store's kind, for errors ("sqlite", "redis", "postgres", "mysql").
    fn kind(&self) -> &'static str;
}

/// Business work an order runs inside its critical section (after the stock check, before
/// the write): for example inserting the order row. A boxed future, so that the trait stays
/// object safe. Make it an `async` block (`Box::pin(async move { ... })`), which does nothing
/// until the critical section polls it; a future that starts its clock when made, such as
/// `tokio::time::sleep(d)`, would count the wait for the lock as work.
pub type Work<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

fn no_work() -> Work<'static> {
    Box::pin(async {})
}

#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "redis",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code)
)]
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
    mode: Mode,
}

/// How a [`Stock`] without a distlock lock protects an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A distlock lock (the `lock` field), or one atomic store step when there is none.
    Plain,
    RowLock,
    Optimistic {
        attempts: u32,
    },
}

/// The optimistic strategy's default number of attempts per order.
pub const DEFAULT_ATTEMPTS: u32 = 10;
/// The longest back-off between two optimistic attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(64);

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
            mode: Mode::Plain,
        })
    }

    /// Orders lock the item's row in a database transaction (`SELECT ... FOR UPDATE`): the
    /// pessimistic strategy. The store must be an SQL store with row locks.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad item name.
    pub fn pessimistic(store: Arc<dyn StockStore>, item: &str) -> Result<Self> {
        let mut stock = Stock::atomic(store, item)?;
        stock.mode = Mode::RowLock;
        Ok(stock)
    }

    /// Orders read quantity and version, and write only if the version is unchanged; a lost
    /// race backs off (jittered, 1 ms doubling to 64 ms) and tries again, `attempts` times at
    /// most, then answers [`Taken::GaveUp`]: the optimistic strategy.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad item name or `attempts == 0`.
    pub fn optimistic(store: Arc<dyn StockStore>, item: &str, attempts: u32) -> Result<Self> {
        if attempts == 0 {
            return Err(Error::invalid(
                "attempts",
                "the optimistic strategy needs at least 1 attempt per order",
            ));
        }
        let mut stock = Stock::atomic(store, item)?;
        stock.mode = Mode::Optimistic { attempts };
        Ok(stock)
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
            mode: Mode::Plain,
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

    /// Deletes the item from the store (its quantity and fencing history); `false` when it
    /// was not there. Orders afterwards fail with [`Error::InvalidInput`] until
    /// [`create`](Self::create).
    ///
    /// # Errors
    /// [`Error::Backend`] when the store fails.
    pub async fn remove(&self) -> Result<bool> {
        self.store.remove(&self.item).await
    }

    /// Takes `n` units, or answers [`Taken::SoldOut`] without taking any. Never oversells.
    ///
    /// # Errors
    /// - [`Error::InvalidInput`] for `n == 0` or an item never created.
    /// - [`Error::Timeout`] when the lock was not granted within the wait.
    /// - [`Error::Fenced`] when this order's lock was lost before it wrote (nothing taken).
    /// - [`Error::Unsupported`] for a strategy the store cannot do.
    /// - [`Error::Backend`] when the lock's backend or the store fails.
    pub async fn take(&self, n: u64) -> Result<Taken> {
        self.take_with(n, no_work()).await
    }

    /// As [`Stock::take`], running `work` inside the critical section when there is stock:
    /// after the check and before the write (with the atomic strategy, right after the
    /// atomic step). `work` is the order's business logic; it runs at most once per attempt.
    ///
    /// # Errors
    /// As [`Stock::take`].
    pub async fn take_with(&self, n: u64, work: Work<'_>) -> Result<Taken> {
        check_units(n)?;
        match (self.mode, &self.lock) {
            (Mode::RowLock, _) => self.store.take_row_locked(&self.item, n, work).await,
            (Mode::Optimistic { attempts }, _) => self.take_optimistic(n, attempts, work).await,
            (Mode::Plain, None) => {
                let taken = self.store.take_atomic(&self.item, n).await?;
                if taken.is_taken() {
                    work.await;
                }
                Ok(taken)
            }
            (Mode::Plain, Some(lock)) => {
                let guard = lock
                    .acquire_with(AcquireOptions::new().wait(self.wait))
                    .await?;
                self.sell_under(guard, n, work).await
            }
        }
    }

    async fn take_optimistic(&self, n: u64, attempts: u32, work: Work<'_>) -> Result<Taken> {
        let mut work = Some(work);
        for attempt in 0..attempts {
            let (available, version) = self.store.read_versioned(&self.item).await?;
            if available < n {
                return Ok(Taken::SoldOut { available });
            }
            if let Some(work) = work.take() {
                work.await;
            }
            if self
                .store
                .write_versioned(&self.item, available - n, version)
                .await?
            {
                return Ok(Taken::Taken {
                    remaining: available - n,
                });
            }
            let ceiling = Duration::from_millis(1 << attempt.min(6)).min(MAX_BACKOFF);
            let pause = ceiling
                .mul_f64(fastrand::f64())
                .max(Duration::from_micros(100));
            tokio::time::sleep(pause).await;
        }
        Ok(Taken::GaveUp { attempts })
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
        let total = self
            .under_lock(lock, async |available| {
                match available.checked_add(n).filter(|&t| t <= i64::MAX as u64) {
                    Some(total) => (Some(total), Some(total)),
                    None => (None, None),
                }
            })
            .await?;
        total.ok_or_else(|| {
            Error::invalid(
                "quantity",
                format!(
                    "restocking {n} units would take {} past {} units; nothing was added",
                    self.item,
                    i64::MAX
                ),
            )
        })
    }

    /// Runs one read-decide-write under the item's lock, fenced by the guard's token.
    async fn under_lock<T>(
        &self,
        lock: &Mutex,
        decide: impl AsyncFnOnce(u64) -> (Option<u64>, T),
    ) -> Result<T> {
        let guard = lock
            .acquire_with(AcquireOptions::new().wait(self.wait))
            .await?;
        self.with_guard(guard, decide).await
    }

    /// As [`Stock::take_with`] for a locked stock, but only if the lock is free right now:
    /// `None` when another order holds it. For [`SegmentedStock`], which looks for a free
    /// segment before it waits for a busy one.
    async fn try_take_with(&self, n: u64, work: Work<'_>) -> Result<Option<Taken>> {
        let Some(lock) = &self.lock else {
            return self.take_with(n, work).await.map(Some);
        };
        let Some(guard) = lock.try_acquire().await? else {
            return Ok(None);
        };
        self.sell_under(guard, n, work).await.map(Some)
    }

    /// One order under a held lock: the check, the work when there is stock, the write.
    async fn sell_under(
        &self,
        guard: crate::mutex::Guard,
        n: u64,
        work: Work<'_>,
    ) -> Result<Taken> {
        self.with_guard(guard, async |available| {
            if available >= n {
                work.await;
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

    async fn with_guard<T>(
        &self,
        guard: crate::mutex::Guard,
        decide: impl AsyncFnOnce(u64) -> (Option<u64>, T),
    ) -> Result<T> {
        let token = guard.fencing_token();
        let outcome = async {
            let available = self.store.read_fenced(&self.item, token).await?;
            let (write, answer) = decide(available).await;
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
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "redis",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code)
)]
pub(crate) fn fenced(item: &str, token: u64, accepted: u64) -> Error {
    Error::Fenced {
        item: item.to_owned(),
        token,
        accepted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_takes_from_the_fullest_first_or_nothing() {
        assert_eq!(plan_spread(&[5, 9, 2], 12), [3, 9, 0]);
        assert_eq!(plan_spread(&[4, 4, 4], 5), [4, 1, 0]);
        assert_eq!(plan_spread(&[4, 4, 4], 12), [4, 4, 4]);
        assert_eq!(plan_spread(&[4, 4, 4], 13), [0, 0, 0]);
        assert_eq!(plan_spread(&[], 1), Vec::<u64>::new());
        assert_eq!(plan_spread(&[u64::MAX, u64::MAX], u64::MAX), [u64::MAX, 0]);
    }
}
