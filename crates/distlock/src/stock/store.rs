//! [`StockStore`]: where items' quantities live, and what a store must do for [`Stock`](super::Stock).

use async_trait::async_trait;

use super::{Spread, Taken};
use crate::error::{Error, Result};

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
    /// atomic [`SegmentedStock`](super::SegmentedStock)'s order that no one segment can serve.
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

pub(super) fn no_work() -> Work<'static> {
    Box::pin(async {})
}
