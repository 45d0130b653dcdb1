//! The stock module's invariants on real stores: SQLite files and the Redis server that
//! `scripts/test` makes sure of. Orders come from several clients at once (each client is what
//! one process would have).

use std::sync::Arc;
use std::time::Duration;

use distlock::stock::{RedisStockStore, SqlStockStore, SqliteStockStore, Stock, StockStore, Taken};

use crate::common::{item, redis_url};
use distlock::conformance::servers;

/// How each strategy under test makes one client's view of an item.
#[derive(Clone, Copy, Debug)]
enum Strategy {
    SqliteTableLock,
    RedisLock,
    RedisSpinLock,
    ZooKeeperLock,
    PostgresAdvisory,
    MySqlNamed,
    PostgresPessimistic,
    MySqlPessimistic,
    PostgresOptimistic,
    MySqlOptimistic,
    SqliteAtomic,
    RedisAtomic,
    PostgresAtomic,
    MySqlAtomic,
}

fn postgres_url() -> String {
    servers::POSTGRES.url()
}

fn mysql_url() -> String {
    servers::MYSQL.url()
}

/// `clients` views of one item, each with its own lock client and store connection.
async fn views(
    strategy: Strategy,
    dir: &std::path::Path,
    item: &str,
    clients: usize,
) -> Vec<Stock> {
    let locks_db = format!("sqlite://{}", dir.join("locks.db").display());
    let stock_db = dir.join("stock.db");
    let mut out = Vec::new();
    for _ in 0..clients {
        use Strategy::*;
        let store: Arc<dyn StockStore> = match strategy {
            SqliteTableLock | SqliteAtomic | ZooKeeperLock => {
                Arc::new(SqliteStockStore::open(&stock_db).unwrap())
            }
            RedisLock | RedisSpinLock | RedisAtomic => {
                Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap())
            }
            // Four connections per client: with the advisory lock's own connections (up to 17
            // per client) four clients stay well under PostgreSQL's 100.
            PostgresAdvisory | PostgresPessimistic | PostgresOptimistic | PostgresAtomic => {
                Arc::new(SqlStockStore::connect(&postgres_url(), 4).await.unwrap())
            }
            MySqlNamed | MySqlPessimistic | MySqlOptimistic | MySqlAtomic => {
                Arc::new(SqlStockStore::connect(&mysql_url(), 4).await.unwrap())
            }
        };
        let lock_url = match strategy {
            SqliteTableLock => Some(locks_db.clone()),
            RedisLock => Some(redis_url()),
            RedisSpinLock => Some(servers::with_scheme(&redis_url(), "redis+spin")),
            ZooKeeperLock => Some(servers::ZOOKEEPER.url()),
            PostgresAdvisory => Some(postgres_url()),
            MySqlNamed => Some(mysql_url()),
            _ => None,
        };
        let stock = match (strategy, lock_url) {
            (_, Some(url)) => {
                let locks = distlock::connect(&url).await.unwrap();
                Stock::locked(store, &locks, item).unwrap()
            }
            (PostgresPessimistic | MySqlPessimistic, None) => {
                Stock::pessimistic(store, item).unwrap()
            }
            // Many attempts: 100 orders race for one row here.
            (PostgresOptimistic | MySqlOptimistic, None) => {
                Stock::optimistic(store, item, 500).unwrap()
            }
            (_, None) => Stock::atomic(store, item).unwrap(),
        };
        out.push(stock);
    }
    out
}

/// One module per strategy with one test per case, so that a failure names its strategy and
/// hides none of the others. The strategies are listed here once.
macro_rules! per_strategy {
    ($($module:ident: $strategy:ident),* $(,)?) => {$(
        mod $module {
            use super::Strategy;

            /// Promise 5: stock 100, 100 concurrent orders of 1 from 4 clients sell exactly 100.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn promise5_hundred_orders_of_one_empty_a_stock_of_hundred_exactly() {
                super::hundred_orders_of_one(Strategy::$strategy).await;
            }

            /// Promise 5: stock 12, two buyers of 10 at once: one is served, 2 are left.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn promise5_two_buyers_of_ten_on_twelve_leave_two() {
                super::two_buyers_of_ten(Strategy::$strategy).await;
            }
        }
    )*};
}

per_strategy!(
    sqlite_table_lock: SqliteTableLock,
    redis_lock: RedisLock,
    redis_spin_lock: RedisSpinLock,
    zookeeper_lock: ZooKeeperLock,
    postgres_advisory: PostgresAdvisory,
    mysql_named: MySqlNamed,
    postgres_pessimistic: PostgresPessimistic,
    mysql_pessimistic: MySqlPessimistic,
    postgres_optimistic: PostgresOptimistic,
    mysql_optimistic: MySqlOptimistic,
    sqlite_atomic: SqliteAtomic,
    redis_atomic: RedisAtomic,
    postgres_atomic: PostgresAtomic,
    mysql_atomic: MySqlAtomic,
);

/// Stock 100, 100 concurrent orders of 1 from 4 clients: exactly 0 left, 100 sold.
async fn hundred_orders_of_one(strategy: Strategy) {
    {
        let dir = tempfile::tempdir().unwrap();
        let item = item("hundred");
        let views = views(strategy, dir.path(), &item, 4).await;
        views[0].create(100).await.unwrap();
        let mut orders = Vec::new();
        for i in 0..100 {
            let stock = views[i % views.len()].clone();
            orders.push(tokio::spawn(async move { stock.take(1).await }));
        }
        let mut sold = 0;
        for order in orders {
            match order.await.unwrap().unwrap() {
                Taken::Taken { .. } => sold += 1,
                other => panic!("{strategy:?}: {other:?} with stock left"),
            }
        }
        assert_eq!(sold, 100, "{strategy:?}");
        assert_eq!(views[0].available().await.unwrap(), 0, "{strategy:?}");
        // One more order finds nothing, and takes nothing.
        assert_eq!(
            views[1].take(1).await.unwrap(),
            Taken::SoldOut { available: 0 },
            "{strategy:?}"
        );
    }
}

/// Stock 12, two buyers of 10 at the same moment: one is served, 2 are left, never -8.
async fn two_buyers_of_ten(strategy: Strategy) {
    {
        let dir = tempfile::tempdir().unwrap();
        let item = item("twelve");
        let views = views(strategy, dir.path(), &item, 2).await;
        views[0].create(12).await.unwrap();
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let buyers: Vec<_> = views
            .iter()
            .cloned()
            .map(|stock| {
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    stock.take(10).await.unwrap()
                })
            })
            .collect();
        let mut answers = Vec::new();
        for buyer in buyers {
            answers.push(buyer.await.unwrap());
        }
        answers.sort_by_key(|a| !a.is_taken());
        assert_eq!(
            answers,
            vec![
                Taken::Taken { remaining: 2 },
                Taken::SoldOut { available: 2 }
            ],
            "{strategy:?}"
        );
        assert_eq!(views[0].available().await.unwrap(), 2, "{strategy:?}");
    }
}

/// One test per lock backend of the fencing case. The lock backends are listed here once:
/// `sqlite` is a file per test; the others are the servers `scripts/test` makes sure of.
macro_rules! per_lock_backend {
    ($($module:ident: $backend:literal),* $(,)?) => {$(
        mod $module {
            /// Promise 3 and 5: a stale holder's write is refused by its fencing token.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn promise5_a_stale_holders_write_is_refused_by_its_fencing_token() {
                super::stale_holders_write_is_refused($backend).await;
            }
        }
    )*};
}

per_lock_backend!(
    fenced_sqlite: "sqlite",
    fenced_redis: "redis",
    fenced_redis_spin: "redis+spin",
    fenced_zookeeper: "zk",
    fenced_postgres_advisory: "postgres",
    fenced_postgres_table: "postgres?mode=table",
    fenced_mysql_named: "mysql",
    fenced_mysql_table: "mysql?mode=table",
);

/// The URL of a lock backend of [`per_lock_backend!`]; `dir` holds the SQLite file.
fn lock_url(backend: &str, dir: &std::path::Path) -> String {
    match backend {
        "sqlite" => format!("sqlite://{}", dir.join("locks.db").display()),
        "redis" => redis_url(),
        "redis+spin" => servers::with_scheme(&redis_url(), "redis+spin"),
        "zk" => servers::ZOOKEEPER.url(),
        "postgres" => postgres_url(),
        "postgres?mode=table" => servers::with_query(&postgres_url(), "mode=table"),
        "mysql" => mysql_url(),
        "mysql?mode=table" => servers::with_query(&mysql_url(), "mode=table"),
        other => panic!("no lock backend {other:?} in per_lock_backend!"),
    }
}

/// A holder pauses past its lease; another takes the lock and sells; the stale holder's
/// write is refused and the stock stays exact. On each lock backend under test.
async fn stale_holders_write_is_refused(backend: &str) {
    {
        let dir = tempfile::tempdir().unwrap();
        let lock_url = lock_url(backend, dir.path());
        let store: Arc<dyn StockStore> = if lock_url.starts_with("sqlite") {
            Arc::new(SqliteStockStore::open(dir.path().join("stock.db")).unwrap())
        } else {
            Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap())
        };
        let item = item("fenced");
        let stale_locks = distlock::connect(&lock_url).await.unwrap();
        let fresh_locks = distlock::connect(&lock_url).await.unwrap();
        let fresh = Stock::locked(store.clone(), &fresh_locks, &item).unwrap();
        fresh.create(10).await.unwrap();

        // The stale holder: a 300 ms fixed lease, a read, then a pause past the lease.
        let guard = stale_locks
            .mutex(format!("stock/{item}"))
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().lease(Duration::from_millis(300)))
            .await
            .unwrap();
        let stale_token = guard.fencing_token();
        let read = store.read_fenced(&item, stale_token).await.unwrap();
        assert_eq!(read, 10);
        let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{lock_url}: lost() did not fire after the 300 ms lease"));
        assert!(lost.is_lock_lost(), "{lock_url}: {lost}");

        // Meanwhile the lock was free again: another order is served.
        assert_eq!(
            fresh.take(3).await.unwrap(),
            Taken::Taken { remaining: 7 },
            "{lock_url}"
        );
        // The stale holder resumes and writes what it read minus one: refused.
        let err = store
            .write_fenced(&item, read - 1, stale_token)
            .await
            .expect_err("the stale write was accepted");
        assert!(err.is_fenced(), "{lock_url}: {err}");
        assert_eq!(fresh.available().await.unwrap(), 7, "{lock_url}");
        // And a stale read is refused too.
        assert!(
            store
                .read_fenced(&item, stale_token)
                .await
                .unwrap_err()
                .is_fenced()
        );
    }
}

/// Bad input gets typed errors, not panics.
#[tokio::test]
async fn bad_orders_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn StockStore> =
        Arc::new(SqliteStockStore::open(dir.path().join("stock.db")).unwrap());
    let stock = Stock::atomic(store.clone(), "pen").unwrap();
    assert!(
        stock.take(1).await.unwrap_err().is_invalid_input(),
        "item never created"
    );
    stock.create(5).await.unwrap();
    assert!(stock.take(0).await.unwrap_err().is_invalid_input());
    assert!(
        Stock::atomic(store.clone(), "")
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        SqliteStockStore::open("/no/such/dir/stock.db")
            .unwrap_err()
            .is_invalid_input()
    );
    assert_eq!(stock.restock(3).await.unwrap(), 8);
    assert_eq!(stock.take(8).await.unwrap(), Taken::Taken { remaining: 0 });
}

use distlock::stock::{SegmentedStock, SegmentedTaken};

/// Segmented views of one item for `clients` clients, locked (Redis lock, SQLite table lock)
/// or atomic (Redis script).
async fn segmented(
    kind: &str,
    dir: &std::path::Path,
    item: &str,
    segments: u32,
    clients: usize,
) -> Vec<SegmentedStock> {
    let mut out = Vec::new();
    for _ in 0..clients {
        let redis: Arc<dyn StockStore> =
            Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap());
        let stock = match kind {
            "redis-lock" => {
                let locks = distlock::connect(&redis_url()).await.unwrap();
                SegmentedStock::locked(redis, &locks, item, segments).unwrap()
            }
            "sqlite-lock" => {
                let locks =
                    distlock::connect(&format!("sqlite://{}", dir.join("locks.db").display()))
                        .await
                        .unwrap();
                let store: Arc<dyn StockStore> =
                    Arc::new(SqliteStockStore::open(dir.join("stock.db")).unwrap());
                SegmentedStock::locked(store, &locks, item, segments).unwrap()
            }
            _ => SegmentedStock::atomic(redis, item, segments).unwrap(),
        };
        out.push(stock);
    }
    out
}

/// Stock 1000 in 20 segments, 1100 concurrent orders of 1 from 4 clients: exactly 1000 served,
/// 100 sold out, nothing left, never negative — also while segments run dry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn segmented_stock_sells_exactly_its_total() {
    for kind in ["redis-lock", "sqlite-lock", "atomic"] {
        let dir = tempfile::tempdir().unwrap();
        let item = item("segmented");
        let views = segmented(kind, dir.path(), &item, 20, 4).await;
        views[0].create(1000).await.unwrap();
        assert_eq!(views[0].available().await.unwrap(), 1000);
        let mut orders = Vec::new();
        for i in 0..1100 {
            let stock = views[i % views.len()].clone();
            orders.push(tokio::spawn(async move { stock.take(1).await.unwrap() }));
        }
        let (mut served, mut sold_out) = (0, 0);
        for order in orders {
            match order.await.unwrap() {
                SegmentedTaken::Taken { segments } => {
                    assert_eq!(segments, 1, "{kind}");
                    served += 1;
                }
                SegmentedTaken::SoldOut { .. } => sold_out += 1,
            }
        }
        assert_eq!((served, sold_out), (1000, 100), "{kind}");
        assert_eq!(views[0].available().await.unwrap(), 0, "{kind}");
    }
}

/// An order larger than any one segment is served from several when the total allows, all or
/// nothing; sold out is answered only when the total is short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_orders_take_from_several_segments_all_or_nothing() {
    for kind in ["redis-lock", "sqlite-lock", "atomic"] {
        let dir = tempfile::tempdir().unwrap();
        let item = item("large");
        let stock = segmented(kind, dir.path(), &item, 4, 1).await.remove(0);
        stock.create(40).await.unwrap();
        assert_eq!(
            stock.take(25).await.unwrap(),
            SegmentedTaken::Taken { segments: 3 },
            "{kind}"
        );
        assert_eq!(stock.available().await.unwrap(), 15, "{kind}");
        assert_eq!(
            stock.take(16).await.unwrap(),
            SegmentedTaken::SoldOut { available: 15 },
            "{kind}"
        );
        assert_eq!(
            stock.available().await.unwrap(),
            15,
            "{kind}: a refused order took stock"
        );
        assert!(stock.take(15).await.unwrap().is_taken(), "{kind}");
        assert_eq!(stock.available().await.unwrap(), 0, "{kind}");
        stock.restock(7).await.unwrap();
        assert_eq!(stock.available().await.unwrap(), 7, "{kind}");
        assert!(stock.take(7).await.unwrap().is_taken(), "{kind}");
    }
}

/// Two multi-segment orders at once lock the segments in one order, so they cannot deadlock;
/// both are served when the total allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_large_orders_do_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let item = item("deadlock");
    let views = segmented("redis-lock", dir.path(), &item, 4, 2).await;
    for round in 0..10 {
        views[0].create(40).await.unwrap();
        let orders: Vec<_> = views
            .iter()
            .cloned()
            .map(|stock| tokio::spawn(async move { stock.take(15).await.unwrap() }))
            .collect();
        for order in orders {
            let taken = tokio::time::timeout(Duration::from_secs(10), order)
                .await
                .unwrap_or_else(|_| panic!("round {round}: deadlock"))
                .unwrap();
            assert!(taken.is_taken(), "round {round}: {taken:?}");
        }
        assert_eq!(views[0].available().await.unwrap(), 10, "round {round}");
    }
}

/// Ten orders of 12 at once on 30 units in 4 segments (no segment can serve one): exactly two
/// are served, and every refusal reports the 6 units truly left. A handle's orders that need
/// every segment take turns, and those that waited answer from a look that began after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_orders_larger_than_any_segment_sell_exactly() {
    for kind in ["redis-lock", "sqlite-lock", "atomic"] {
        let dir = tempfile::tempdir().unwrap();
        let item = item("sweeps");
        let stock = segmented(kind, dir.path(), &item, 4, 1).await.remove(0);
        stock.create(30).await.unwrap();
        let orders: Vec<_> = (0..10)
            .map(|_| {
                let stock = stock.clone();
                tokio::spawn(async move { stock.take(12).await.unwrap() })
            })
            .collect();
        let mut served = 0;
        for order in orders {
            match order.await.unwrap() {
                SegmentedTaken::Taken { .. } => served += 1,
                SegmentedTaken::SoldOut { available } => {
                    assert_eq!(available, 6, "{kind}: a refusal saw a total that never was");
                }
            }
        }
        assert_eq!(served, 2, "{kind}");
        assert_eq!(stock.available().await.unwrap(), 6, "{kind}");
    }
}

/// A handle whose orders saw every segment empty still serves orders once another client
/// restocks: what a handle remembers only orders its search, it never answers sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handle_that_saw_sold_out_sells_what_another_client_restocks() {
    for kind in ["redis-lock", "sqlite-lock", "atomic"] {
        let dir = tempfile::tempdir().unwrap();
        let item = item("restocked");
        let views = segmented(kind, dir.path(), &item, 10, 2).await;
        views[0].create(20).await.unwrap();
        let take_all = |count: usize| {
            let orders: Vec<_> = (0..count)
                .map(|_| {
                    let stock = views[0].clone();
                    tokio::spawn(async move { stock.take(1).await.unwrap() })
                })
                .collect();
            async move {
                let mut served = 0;
                for order in orders {
                    served += usize::from(order.await.unwrap().is_taken());
                }
                served
            }
        };
        assert_eq!(take_all(28).await, 20, "{kind}");
        assert_eq!(take_all(8).await, 0, "{kind}");
        views[1].restock(3).await.unwrap();
        assert_eq!(take_all(5).await, 3, "{kind}: restocked units not sold");
        assert_eq!(views[1].available().await.unwrap(), 0, "{kind}");
    }
}

/// One step across several items, on every store: taken from the fullest first, all or
/// nothing, and a missing item is an input error that takes nothing. Then an item removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spreads_and_removal_work_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<Arc<dyn StockStore>> = vec![
        Arc::new(SqliteStockStore::open(dir.path().join("stock.db")).unwrap()),
        Arc::new(RedisStockStore::connect(&redis_url()).await.unwrap()),
        Arc::new(SqlStockStore::connect(&postgres_url(), 2).await.unwrap()),
        Arc::new(SqlStockStore::connect(&mysql_url(), 2).await.unwrap()),
    ];
    for store in stores {
        let kind = store.kind();
        let items: Vec<String> = ["a", "b", "c"].map(item).to_vec();
        for (item, quantity) in items.iter().zip([5, 9, 2]) {
            store.set(item, quantity).await.unwrap();
        }
        let spread = store.take_spread(&items, 12).await.unwrap();
        assert_eq!(spread.quantities, [5, 9, 2], "{kind}");
        assert_eq!(spread.parts, [3, 9, 0], "{kind}");
        assert!(spread.is_taken(), "{kind}");
        let short = store.take_spread(&items, 5).await.unwrap();
        assert_eq!(
            (short.quantities.clone(), short.total()),
            (vec![2, 0, 2], 4),
            "{kind}"
        );
        assert!(!short.is_taken(), "{kind}: {short:?}");
        let mut with_missing = items.clone();
        with_missing.push(item("missing"));
        let err = store.take_spread(&with_missing, 1).await.unwrap_err();
        assert!(err.is_invalid_input(), "{kind}: {err}");
        for (item, quantity) in items.iter().zip([2, 0, 2]) {
            assert_eq!(store.quantity(item).await.unwrap(), quantity, "{kind}");
        }
        // Removing forgets the item; removing it again finds nothing.
        assert!(store.remove(&items[0]).await.unwrap(), "{kind}");
        assert!(!store.remove(&items[0]).await.unwrap(), "{kind}");
        let err = store.quantity(&items[0]).await.unwrap_err();
        assert!(err.is_invalid_input(), "{kind}: {err}");
    }
}

#[test]
fn segment_counts_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn StockStore> =
        Arc::new(SqliteStockStore::open(dir.path().join("stock.db")).unwrap());
    for bad in [0, distlock::stock::MAX_SEGMENTS + 1] {
        let err = SegmentedStock::atomic(store.clone(), "pen", bad).unwrap_err();
        assert!(err.is_invalid_input(), "{bad}: {err}");
    }
}
