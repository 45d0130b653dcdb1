//! Promise 5 under cancellation and lost replies: a segmented order stopped at a chosen point
//! of its write phase sells all or nothing, and leaves no segment lock behind. The stores are
//! the real ones (Redis, a SQLite file); a gate in front of them stops the order at an exact
//! request, so that every case runs every time instead of depending on timing.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::stock::{
    RedisStockStore, SegmentedStock, SegmentedTaken, Spread, SqliteStockStore, StockStore, Taken,
    Work,
};
use distlock::{Error, Result};
use tokio::sync::oneshot;

use crate::common::{item, redis_url};

/// The stock an item starts with, its segments, and the order that needs all of them
/// (2 + 2 + 2 + 1 units: four segment writes).
const TOTAL: u64 = 8;
const SEGMENTS: u32 = 4;
const ORDER: u64 = 7;

/// How long the gate holds the order at its cut: long enough for the test to drop it there.
const PAUSE: Duration = Duration::from_millis(40);

/// Where the gated request stops the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Before the request reaches the store.
    Before,
    /// After it landed, before its answer reaches the order.
    After,
    /// It landed, and its answer is lost: the order sees a failure.
    LostReply,
}

/// A real store whose `at`-th write (a fenced segment write, or the atomic spread) is stopped
/// at `cut`: the gate tells the test, then pauses.
struct GatedStore {
    inner: Arc<dyn StockStore>,
    writes: AtomicUsize,
    at: usize,
    cut: Cut,
    reached: Mutex<Option<oneshot::Sender<()>>>,
}

impl GatedStore {
    async fn gate<T>(&self, request: impl Future<Output = Result<T>>) -> Result<T> {
        if self.writes.fetch_add(1, Ordering::SeqCst) != self.at {
            return request.await;
        }
        let signal = || {
            if let Some(reached) = self.reached.lock().unwrap().take() {
                let _ = reached.send(());
            }
        };
        if self.cut == Cut::Before {
            signal();
            tokio::time::sleep(PAUSE).await;
            return request.await;
        }
        let answer = request.await;
        signal();
        tokio::time::sleep(PAUSE).await;
        match self.cut {
            Cut::LostReply => Err(Error::backend(
                "test gate",
                "write",
                "the reply was lost (the write landed)",
            )),
            _ => answer,
        }
    }
}

#[async_trait]
impl StockStore for GatedStore {
    async fn set(&self, item: &str, quantity: u64) -> Result<()> {
        self.inner.set(item, quantity).await
    }
    async fn quantity(&self, item: &str) -> Result<u64> {
        self.inner.quantity(item).await
    }
    async fn read_fenced(&self, item: &str, token: u64) -> Result<u64> {
        self.inner.read_fenced(item, token).await
    }
    async fn write_fenced(&self, item: &str, quantity: u64, token: u64) -> Result<()> {
        self.gate(self.inner.write_fenced(item, quantity, token))
            .await
    }
    async fn take_atomic(&self, item: &str, n: u64) -> Result<Taken> {
        self.inner.take_atomic(item, n).await
    }
    async fn add_atomic(&self, item: &str, n: u64) -> Result<u64> {
        self.inner.add_atomic(item, n).await
    }
    async fn remove(&self, item: &str) -> Result<bool> {
        self.inner.remove(item).await
    }
    async fn take_spread(&self, items: &[String], n: u64) -> Result<Spread> {
        self.gate(self.inner.take_spread(items, n)).await
    }
    async fn take_row_locked(&self, item: &str, n: u64, work: Work<'_>) -> Result<Taken> {
        self.inner.take_row_locked(item, n, work).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

/// One stock item on real servers: its store, and the lock backend of the locked kinds.
struct Setup {
    kind: &'static str,
    store: Arc<dyn StockStore>,
    locks: Option<distlock::Locks>,
    item: String,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn new(kind: &'static str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (store, locks): (Arc<dyn StockStore>, _) = match kind {
            "redis-lock" => (
                Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap()),
                Some(distlock::connect(&redis_url()).await.unwrap()),
            ),
            "sqlite-lock" => (
                Arc::new(SqliteStockStore::open(dir.path().join("stock.db")).unwrap()),
                Some(
                    distlock::connect(&format!(
                        "sqlite://{}",
                        dir.path().join("locks.db").display()
                    ))
                    .await
                    .unwrap(),
                ),
            ),
            _ => (
                Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap()),
                None,
            ),
        };
        Setup {
            kind,
            store,
            locks,
            item: item("cut_order"),
            _dir: dir,
        }
    }

    /// A fresh handle on the item over `store`.
    fn handle(&self, store: Arc<dyn StockStore>) -> SegmentedStock {
        match &self.locks {
            Some(locks) => SegmentedStock::locked(store, locks, &self.item, SEGMENTS).unwrap(),
            None => SegmentedStock::atomic(store, &self.item, SEGMENTS).unwrap(),
        }
    }

    /// Orders `ORDER` units with the `at`-th write stopped at `cut`; when `drop_it`, the
    /// caller stops waiting right there. Then checks that the stock settles at what the order
    /// did (all or nothing) and that every segment lock is free again.
    async fn cut_order(&self, cut: Cut, at: usize, drop_it: bool) {
        let case = format!("{}: write {at} cut {cut:?}, dropped {drop_it}", self.kind);
        let (reached, stopped) = oneshot::channel();
        let gated = Arc::new(GatedStore {
            inner: self.store.clone(),
            writes: AtomicUsize::new(0),
            at,
            cut,
            reached: Mutex::new(Some(reached)),
        });
        let stock = self.handle(gated);
        stock.create(TOTAL).await.unwrap();
        let take = stock.take(ORDER);
        let answer = tokio::time::timeout(Duration::from_secs(20), async {
            if drop_it {
                tokio::select! {
                    answer = take => panic!("{case}: the order ended before its cut: {answer:?}"),
                    _ = stopped => None,
                }
            } else {
                Some(take.await)
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{case}: the order hung"));
        // A landed write stands (the order finishes in the background when dropped); a lost
        // reply makes the order put back every unit it took.
        let expected = match cut {
            Cut::Before | Cut::After => TOTAL - ORDER,
            Cut::LostReply => TOTAL,
        };
        match answer {
            Some(Ok(SegmentedTaken::Taken { .. })) => {
                assert_eq!(expected, TOTAL - ORDER, "{case}: served though it failed")
            }
            Some(other) => assert!(
                expected == TOTAL && other.is_err(),
                "{case}: answered {other:?}"
            ),
            None => {}
        }
        let plain = self.handle(self.store.clone());
        let settled = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let left = plain.available().await.unwrap();
                if left == expected {
                    tokio::time::sleep(Duration::from_millis(2 * PAUSE.as_millis() as u64)).await;
                    if plain.available().await.unwrap() == left {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let left = plain.available().await.unwrap();
        assert!(
            settled.is_ok(),
            "{case}: the stock stayed at {left}, not {expected}"
        );
        // Every segment lock is free: an order for the whole stock (it needs all four) is
        // served well within a lock's lease.
        plain.create(TOTAL).await.unwrap();
        let all = tokio::time::timeout(Duration::from_secs(5), plain.take(TOTAL))
            .await
            .unwrap_or_else(|_| panic!("{case}: a segment lock was left held"));
        assert!(
            matches!(all, Ok(SegmentedTaken::Taken { .. })),
            "{case}: {all:?}"
        );
    }
}

/// Promise 5: on the locked kinds, an order dropped before, during or after each of its four
/// segment writes, or whose write reply is lost (dropped or not), sells all or nothing and
/// leaves no lock behind.
async fn every_cut_of_the_write_phase(kind: &'static str) {
    let setup = Setup::new(kind).await;
    for at in 0..4 {
        for cut in [Cut::Before, Cut::After, Cut::LostReply] {
            for drop_it in [true, false] {
                setup.cut_order(cut, at, drop_it).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise5_every_cut_of_a_multi_segment_order_conserves_units_redis_lock() {
    every_cut_of_the_write_phase("redis-lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise5_every_cut_of_a_multi_segment_order_conserves_units_sqlite_lock() {
    every_cut_of_the_write_phase("sqlite-lock").await;
}

/// Promise 5 on the atomic kind: its order is one request, which either ran or did not, so a
/// drop before it was sent sells nothing and a drop after it landed sells the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise5_a_dropped_atomic_multi_segment_order_is_all_or_nothing() {
    let setup = Setup::new("atomic").await;
    for drop_it in [true, false] {
        setup.cut_order(Cut::After, 0, drop_it).await;
    }
    // Dropped before its one request was sent: nothing happened.
    let (reached, stopped) = oneshot::channel();
    let gated = Arc::new(GatedStore {
        inner: setup.store.clone(),
        writes: AtomicUsize::new(0),
        at: 0,
        cut: Cut::Before,
        reached: Mutex::new(Some(reached)),
    });
    let stock = setup.handle(gated);
    stock.create(TOTAL).await.unwrap();
    tokio::select! {
        answer = stock.take(ORDER) => panic!("the order ended before its cut: {answer:?}"),
        _ = stopped => {}
    }
    tokio::time::sleep(PAUSE * 3).await;
    assert_eq!(stock.available().await.unwrap(), TOTAL);
}

/// Promise 5, a poll at a time: an order dropped after 1, 2, 3... polls (wherever that falls:
/// waiting for a lock, reading, writing) sells all or nothing once it settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise5_an_order_dropped_after_any_number_of_polls_is_all_or_nothing() {
    for kind in ["redis-lock", "sqlite-lock", "atomic"] {
        let setup = Setup::new(kind).await;
        for polls in 1..=60usize {
            let stock = setup.handle(setup.store.clone());
            stock.create(TOTAL).await.unwrap();
            let mut take = Box::pin(stock.take(ORDER));
            let mut finished = false;
            for _ in 0..polls {
                let step =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(take.as_mut().poll(cx))).await;
                if step.is_ready() {
                    finished = true;
                    break;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            drop(take);
            let settled = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let left = stock.available().await.unwrap();
                    if left == TOTAL || left == TOTAL - ORDER {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if stock.available().await.unwrap() == left {
                            return;
                        }
                    }
                }
            })
            .await;
            assert!(
                settled.is_ok(),
                "{kind}: dropped after {polls} polls, the stock stayed at {}",
                stock.available().await.unwrap()
            );
            if finished {
                break;
            }
        }
    }
}
