//! [`SegmentedStock`]: one item's stock in segments with a lock each, for hot items.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::store::no_work;
use super::*;
use crate::client::Locks;
use crate::options::AcquireOptions;

/// Most segments one item may be split into.
pub const MAX_SEGMENTS: u32 = 1000;

/// The answer to an order on a [`SegmentedStock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentedTaken {
    /// The units were taken, from this many segments (1 unless no single segment had enough).
    Taken {
        /// Segments the order took from.
        segments: u32,
    },
    /// The item's total was short: nothing was taken.
    SoldOut {
        /// Units in all segments together when the order looked.
        available: u64,
    },
}

impl SegmentedTaken {
    /// True when the order was served.
    pub fn is_taken(&self) -> bool {
        matches!(self, SegmentedTaken::Taken { .. })
    }
}

/// One item's stock split into segments, each with its own lock, so that orders
/// for a hot item proceed in parallel: with N segments, up to N orders hold a lock at once.
///
/// * An order starts at a random segment and tries (without waiting) those whose lock may be
///   free right now and that may have enough, up to [`SegmentedStock::tries`]; then it
///   waits in turn for the others (skipping those it found short), until every segment was
///   tried.
/// * A handle remembers, for itself and its clones, which segments its own orders are at and
///   what each segment held when it last looked. An order does not try a segment another
///   order of the same handle holds, waits where the fewest of them wait, and leaves the
///   segments it saw short for the last step below. Share one handle (clone it) among the
///   tasks of a process to get this; the hints never decide an answer.
/// * An order no single segment can serve locks **all** segments, always in index order (so
///   two such orders cannot deadlock), reads the true total, and takes from several segments
///   or answers sold out. Sold out is answered only when the total is really short. A handle
///   runs one such order at a time; an order that waited for it answers sold out from it
///   when that order began after this one and left too little (the moment it held every
///   lock lies within both orders). The atomic variant does the same in one step of the
///   store ([`StockStore::take_spread`]).
///
/// What it costs: the segments drain unevenly (an order for 1 can find its first segments
/// empty and walks on), a multi-segment order waits for every segment's lock, and
/// [`SegmentedStock::available`] reads every segment. Segmenting pays when one item's orders
/// queue on its lock, that is when orders/s × critical section approaches 1.
///
/// Segment `i` of item `x` is the store item `x#i`, locked by `stock/x#i`.
#[derive(Debug, Clone)]
pub struct SegmentedStock {
    item: String,
    segments: Vec<Stock>,
    hints: Arc<Hints>,
    sweeps: Arc<Sweeps>,
    /// See [`SegmentedStock::tries`].
    tries: usize,
}

/// The orders of one handle that lock every segment (see [`SegmentedStock::sweep`]).
#[derive(Debug, Default)]
struct Sweeps {
    /// Sweeps begun so far; a sweep's id is its number.
    begun: AtomicU64,
    /// The last sweep that finished, while a sweep runs `None`.
    last: tokio::sync::Mutex<Option<Sweep>>,
}

/// What a sweep saw.
#[derive(Debug, Clone, Copy)]
struct Sweep {
    id: u64,
    /// Units in all segments while the sweep held every lock, after its own order.
    total: u64,
}

/// What one [`SegmentedStock`] handle (with its clones) knows of its segments without asking
/// the store: how many of its own orders are at each segment now, and how many units each
/// segment had when one of its orders last looked. Hints only order the search; an order
/// answers from what it reads under the locks.
#[derive(Debug)]
pub(super) struct Hints {
    crowd: Vec<AtomicU32>,
    seen: Vec<AtomicU64>,
}

/// How many segments an order tries (`try_acquire`) before it waits for one where the
/// client's attempts share connections (PostgreSQL, MySQL): a try that finds the lock busy
/// still costs a round trip, which there queues on the client's one primary lock connection.
/// docs/stock.md gives the hot-item figures the number was chosen by.
const SESSION_TRIES: usize = 2;

/// A segment no order of this handle has looked at yet.
const UNSEEN: u64 = u64::MAX;

impl Hints {
    pub(super) fn new(count: usize) -> Arc<Self> {
        Arc::new(Hints {
            crowd: (0..count).map(|_| AtomicU32::new(0)).collect(),
            seen: (0..count).map(|_| AtomicU64::new(UNSEEN)).collect(),
        })
    }

    /// Whether segment `i` may still have `n` units, as far as this handle knows.
    pub(super) fn may_serve(&self, i: usize, n: u64) -> bool {
        self.seen[i].load(Ordering::Relaxed) >= n
    }

    pub(super) fn saw(&self, i: usize, units: u64) {
        self.seen[i].store(units, Ordering::Relaxed);
    }

    pub(super) fn learn(&self, i: usize, taken: &Taken) {
        match *taken {
            Taken::Taken { remaining } => self.saw(i, remaining),
            Taken::SoldOut { available } => self.saw(i, available),
            Taken::GaveUp { .. } => {}
        }
    }

    /// This handle's orders holding or waiting for segment `i`'s lock now.
    pub(super) fn crowd(&self, i: usize) -> u32 {
        self.crowd[i].load(Ordering::Relaxed)
    }

    /// Counts an order at segment `i` until the returned value is dropped.
    pub(super) fn visit(&self, i: usize) -> Visit<'_> {
        self.crowd[i].fetch_add(1, Ordering::Relaxed);
        Visit { hints: self, i }
    }
}

/// An order at a segment, for [`Hints::crowd`]; dropping it (also by cancellation) leaves.
pub(super) struct Visit<'a> {
    hints: &'a Hints,
    i: usize,
}

impl Drop for Visit<'_> {
    fn drop(&mut self) {
        self.hints.crowd[self.i].fetch_sub(1, Ordering::Relaxed);
    }
}

fn check_segments(segments: u32) -> Result<()> {
    if segments == 0 || segments > MAX_SEGMENTS {
        return Err(Error::invalid(
            "segments",
            format!("an item has 1 to {MAX_SEGMENTS} segments, not {segments}"),
        ));
    }
    Ok(())
}

impl SegmentedStock {
    /// Segments locked with `locks` (any backend).
    ///
    /// Orders try up to [`tries`](Self::tries) segments without waiting before they wait:
    /// two on PostgreSQL and MySQL, whose tries queue on one connection per client, every
    /// segment on the other backends.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad item name or segment count.
    pub fn locked(
        store: Arc<dyn StockStore>,
        locks: &Locks,
        item: &str,
        segments: u32,
    ) -> Result<Self> {
        check_item(item)?;
        check_segments(segments)?;
        Ok(SegmentedStock {
            item: item.to_owned(),
            segments: (0..segments)
                .map(|i| Stock::locked(store.clone(), locks, &format!("{item}#{i}")))
                .collect::<Result<_>>()?,
            hints: Hints::new(segments as usize),
            sweeps: Arc::default(),
            tries: if locks.attempts_share_a_connection() {
                SESSION_TRIES
            } else {
                segments as usize
            },
        })
    }

    /// Segments taken from in one atomic store step each, without locks. An order no one
    /// segment can serve is one step across all segments ([`StockStore::take_spread`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad item name or segment count.
    pub fn atomic(store: Arc<dyn StockStore>, item: &str, segments: u32) -> Result<Self> {
        check_item(item)?;
        check_segments(segments)?;
        Ok(SegmentedStock {
            item: item.to_owned(),
            segments: (0..segments)
                .map(|i| Stock::atomic(store.clone(), &format!("{item}#{i}")))
                .collect::<Result<_>>()?,
            hints: Hints::new(segments as usize),
            sweeps: Arc::default(),
            tries: 0,
        })
    }

    /// How many segments a locked order tries (`try_acquire`) before it waits for one; 0
    /// makes orders wait on their first segment at once.
    #[must_use]
    pub fn tries(mut self, tries: usize) -> Self {
        self.tries = tries;
        self
    }

    /// How long an order waits for each lock.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.segments = self
            .segments
            .into_iter()
            .map(|segment| segment.wait(wait))
            .collect();
        self
    }

    /// The item's name.
    pub fn item(&self) -> &str {
        &self.item
    }

    /// How many segments.
    pub fn segments(&self) -> u32 {
        u32::try_from(self.segments.len()).unwrap_or(MAX_SEGMENTS)
    }

    /// Sets the total, split as evenly as it goes (the first `total % segments` segments get
    /// one more unit).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a total above `i64::MAX`; [`Error::Backend`] when the store
    /// fails.
    pub async fn create(&self, total: u64) -> Result<()> {
        check_units(total.max(1))?;
        let n = self.segments.len() as u64;
        for (i, segment) in self.segments.iter().enumerate() {
            let share = total / n + u64::from((i as u64) < total % n);
            self.segment_store(segment)
                .set(&segment.item, share)
                .await?;
            self.hints.saw(i, share);
        }
        Ok(())
    }

    /// Units in all segments together.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the item was never created; [`Error::Backend`].
    pub async fn available(&self) -> Result<u64> {
        let mut total = 0u64;
        for (i, segment) in self.segments.iter().enumerate() {
            let units = segment.available().await?;
            self.hints.saw(i, units);
            total = total.saturating_add(units);
        }
        Ok(total)
    }

    /// Deletes every segment from the store; `false` when none was there.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store fails.
    pub async fn remove(&self) -> Result<bool> {
        let mut any = false;
        for segment in &self.segments {
            any |= segment.remove().await?;
        }
        Ok(any)
    }

    /// Adds `n` units, spread over the segments from a random one on.
    ///
    /// # Errors
    /// As [`Stock::restock`].
    pub async fn restock(&self, n: u64) -> Result<()> {
        check_units(n)?;
        let count = self.segments.len() as u64;
        let start = fastrand::usize(..self.segments.len());
        for k in 0..self.segments.len() {
            let share = n / count + u64::from((k as u64) < n % count);
            if share > 0 {
                let i = (start + k) % self.segments.len();
                let units = self.segments[i].restock(share).await?;
                self.hints.saw(i, units);
            }
        }
        Ok(())
    }

    pub(super) fn segment_store<'a>(&self, segment: &'a Stock) -> &'a Arc<dyn StockStore> {
        &segment.store
    }

    /// Takes `n` units from one segment if any has enough, else from several (all or
    /// nothing), else answers sold out. Never oversells.
    ///
    /// # Errors
    /// As [`Stock::take`].
    pub async fn take(&self, n: u64) -> Result<SegmentedTaken> {
        self.take_with(n, no_work).await
    }

    /// As [`SegmentedStock::take`], running business work inside the critical section of
    /// the order that is served. `work` makes that work; it is called once per segment
    /// tried, and only the serving attempt's work runs.
    ///
    /// # Errors
    /// As [`Stock::take`].
    pub async fn take_with<'a>(
        &self,
        n: u64,
        work: impl Fn() -> Work<'a>,
    ) -> Result<SegmentedTaken> {
        check_units(n)?;
        let count = self.segments.len();
        if count == 1 {
            return Ok(match self.segments[0].take_with(n, work()).await? {
                Taken::Taken { .. } => SegmentedTaken::Taken { segments: 1 },
                Taken::SoldOut { available } => SegmentedTaken::SoldOut { available },
                Taken::GaveUp { .. } => SegmentedTaken::SoldOut {
                    available: self.segments[0].available().await?,
                },
            });
        }
        let start = fastrand::usize(..count);
        // Segments not tried yet, from a random one on, less those this handle last saw short.
        let mut left: Vec<usize> = (0..count)
            .map(|k| (start + k) % count)
            .filter(|&i| self.hints.may_serve(i, n))
            .collect();
        if self.segments[0].lock.is_some() {
            // First a segment whose lock is free now, passing those this handle's own orders
            // hold or wait for: they are busy for sure. At most `self.tries` of them.
            let mut k = 0;
            let mut tries = 0;
            while k < left.len() && tries < self.tries {
                let i = left[k];
                if self.hints.crowd(i) > 0 {
                    k += 1;
                    continue;
                }
                tries += 1;
                let tried = {
                    let _visit = self.hints.visit(i);
                    self.segments[i].try_take_with(n, work()).await?
                };
                match tried {
                    Some(taken) => {
                        self.hints.learn(i, &taken);
                        if taken.is_taken() {
                            return Ok(SegmentedTaken::Taken { segments: 1 });
                        }
                        left.remove(k);
                    }
                    None => k += 1,
                }
            }
        }
        // Then wait, each time for the segment the fewest of this handle's orders are at, so
        // that its orders spread over the segments instead of queueing on a few.
        while let Some(k) = (0..left.len()).min_by_key(|&k| self.hints.crowd(left[k])) {
            let i = left.remove(k);
            let taken = {
                let _visit = self.hints.visit(i);
                self.segments[i].take_with(n, work()).await?
            };
            self.hints.learn(i, &taken);
            if taken.is_taken() {
                return Ok(SegmentedTaken::Taken { segments: 1 });
            }
        }
        // No single segment had enough (or this handle believed so): the true total decides.
        match self.segments[0].lock {
            Some(_) => self.sweep(n, work()).await,
            None => self.take_from_all_atomic(n).await,
        }
    }

    /// One order of this handle at a time locks every segment. An order that waited here
    /// while another one's sweep began and found fewer than it needs answers sold out from
    /// that sweep: the moment all its locks were held lies within both orders.
    pub(super) async fn sweep(&self, n: u64, work: Work<'_>) -> Result<SegmentedTaken> {
        let arrived = self.sweeps.begun.load(Ordering::SeqCst);
        let mut last = self.sweeps.last.lock().await;
        if let Some(sweep) = *last
            && sweep.id > arrived
            && sweep.total < n
        {
            return Ok(SegmentedTaken::SoldOut {
                available: sweep.total,
            });
        }
        let id = self.sweeps.begun.fetch_add(1, Ordering::SeqCst) + 1;
        *last = None;
        let (taken, total) = self.take_from_all_locked(n, work).await?;
        *last = Some(Sweep { id, total });
        Ok(taken)
    }

    /// Locks every segment in index order, then takes from the fullest first. Also answers
    /// the total left while all the locks were held.
    pub(super) async fn take_from_all_locked(
        &self,
        n: u64,
        work: Work<'_>,
    ) -> Result<(SegmentedTaken, u64)> {
        let mut guards = Vec::with_capacity(self.segments.len());
        for segment in &self.segments {
            let Some(lock) = &segment.lock else {
                return Err(Error::invalid(
                    "segments",
                    "mixed locked and atomic segments",
                ));
            };
            guards.push(
                lock.acquire_with(AcquireOptions::new().wait(segment.wait))
                    .await?,
            );
        }
        // Until the first write, a dropped order changes nothing: its guards release on drop.
        let mut quantities = Vec::with_capacity(self.segments.len());
        for (segment, guard) in self.segments.iter().zip(&guards) {
            quantities.push(
                segment
                    .store
                    .read_fenced(&segment.item, guard.fencing_token())
                    .await?,
            );
        }
        for (i, &units) in quantities.iter().enumerate() {
            self.hints.saw(i, units);
        }
        let available: u64 = quantities.iter().sum();
        if available < n {
            for guard in guards {
                if let Err(error) = guard.release().await {
                    tracing::debug!(item = %self.item, %error, "releasing a segment lock failed");
                }
            }
            return Ok((SegmentedTaken::SoldOut { available }, available));
        }
        work.await;
        let mut order: Vec<usize> = (0..quantities.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(quantities[i]));
        let mut left = n;
        let mut parts = Vec::new();
        for index in order {
            let units = left.min(quantities[index]);
            if units > 0 {
                parts.push(commit::Part {
                    index,
                    before: quantities[index],
                    units,
                });
                left -= units;
            }
        }
        // From the first write on, the order finishes even if its caller is gone.
        let segments =
            commit::write_parts(self.segments.clone(), guards, parts, self.hints.clone()).await?;
        Ok((SegmentedTaken::Taken { segments }, available - n))
    }

    /// Takes segment by segment in atomic steps; puts everything back when the total is short.
    pub(super) async fn take_from_all_atomic(&self, n: u64) -> Result<SegmentedTaken> {
        let items: Vec<String> = self.segments.iter().map(|s| s.item.clone()).collect();
        let spread = self.segments[0].store.take_spread(&items, n).await?;
        for (i, (quantity, part)) in spread.quantities.iter().zip(&spread.parts).enumerate() {
            self.hints.saw(i, quantity.saturating_sub(*part));
        }
        Ok(if spread.is_taken() {
            SegmentedTaken::Taken {
                segments: u32::try_from(spread.parts.iter().filter(|&&p| p > 0).count())
                    .unwrap_or(u32::MAX),
            }
        } else {
            SegmentedTaken::SoldOut {
                available: spread.total(),
            }
        })
    }
}
