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

use std::time::Duration;

use crate::error::{Error, Result};

mod commit;
mod item;
mod segmented;
mod store;
mod stores;

pub use self::item::{DEFAULT_ATTEMPTS, Stock};
use self::segmented::Hints;
pub use self::segmented::{MAX_SEGMENTS, SegmentedStock, SegmentedTaken};
pub use self::store::{StockStore, Work};
#[cfg(feature = "redis")]
pub use self::stores::RedisStockStore;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::stores::SqlStockStore;
#[cfg(feature = "sqlite")]
pub use self::stores::{SqliteDurability, SqliteStockStore};

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

pub(crate) fn check_units(n: u64) -> Result<()> {
    if n == 0 || n > i64::MAX as u64 {
        return Err(Error::invalid(
            "quantity",
            format!("an order takes 1 to {} units, not {n}", i64::MAX),
        ));
    }
    Ok(())
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
