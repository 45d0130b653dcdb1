//! [`Stock`]: one item's stock and the strategy that protects its orders.

use std::sync::Arc;
use std::time::Duration;

use super::store::no_work;
use super::{DEFAULT_WAIT, StockStore, Taken, Work, check_item, check_units};
use crate::client::Locks;
use crate::error::{Error, Result};
use crate::mutex::Mutex;
use crate::options::AcquireOptions;

/// One item's stock, and the way orders are protected.
#[derive(Clone)]
pub struct Stock {
    pub(super) store: Arc<dyn StockStore>,
    pub(super) item: String,
    pub(super) lock: Option<Mutex>,
    pub(super) wait: Duration,
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
    pub(super) async fn try_take_with(&self, n: u64, work: Work<'_>) -> Result<Option<Taken>> {
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
