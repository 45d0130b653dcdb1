//! `distlock demo --hot-item`: the hot-item scenario. One item, stock 1000,
//! a 20 ms critical section per order, and many buyers in several processes: one lock for
//! the item against the same stock split into 20 segments, each with its own lock, on each
//! chosen lock backend, plus the Redis atomic script (no lock) as the ceiling.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
#[cfg(feature = "redis")]
use distlock::stock::RedisStockStore;
use distlock::stock::{SegmentedStock, SqliteStockStore, Stock, StockStore};
use serde::{Deserialize, Serialize};

use crate::cli::{DemoArgs, Durability};
use crate::failure::{CliResult, Failure};
use crate::workers::{self, Fleet};

/// The hidden `demo-hot-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct HotWorkerArgs {
    /// The lock backend; none means the store's atomic step.
    #[arg(long)]
    lock_url: Option<String>,
    /// `redis://...` or the path of an SQLite stock file.
    #[arg(long)]
    store: String,
    #[arg(long)]
    item: String,
    #[arg(long)]
    segments: u32,
    /// Most orders this worker places (a bound; buyers stop at the first sold-out answer).
    #[arg(long)]
    orders: u64,
    #[arg(long)]
    tasks: u32,
    #[arg(long)]
    hold_ms: u64,
    #[arg(long, value_enum, default_value_t = Durability::Full)]
    sqlite_durability: Durability,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct HotReport {
    served: u64,
    sold_out: u64,
    errors: u64,
    first_error: Option<String>,
    /// When each of this worker's sales ended, in µs since the Unix epoch.
    sales_us: Vec<u64>,
}

/// One run: a lock (or none) with 1 or N segments.
#[derive(Debug, Serialize)]
struct HotRun {
    lock: String,
    /// Where the stock was kept: redis, postgres, mysql, sqlite-full or sqlite-normal.
    store: String,
    segments: u32,
    served: u64,
    sold_out: u64,
    final_stock: u64,
    /// Units sold per second, from `go` to the end of the last sale.
    orders_per_s: f64,
    /// Seconds from `go` to the end of the last sale.
    selling_s: f64,
    /// Seconds from `go` to the end of the first sale, and of a tenth, half and nine tenths
    /// of the sales: where the run lost time (start, middle, drain).
    first_sale_s: f64,
    tenth_s: f64,
    half_s: f64,
    nine_tenths_s: f64,
    /// Seconds from `go` until every buyer had its sold-out answer.
    elapsed_s: f64,
    exact: bool,
}

/// Where a run keeps its stock, for the report.
fn store_label(store: &str, durability: Durability) -> String {
    match store.split_once("://") {
        Some(("mariadb", _)) => "mysql".to_owned(),
        Some((scheme, _)) => scheme.to_owned(),
        None => format!("sqlite-{}", durability.as_str()),
    }
}

/// The lock backends of the scenario, by demo strategy name.
fn lock_of(strategy: &str, args: &DemoArgs, dir: &Path) -> CliResult<Option<String>> {
    Ok(match strategy {
        "table-lock" => Some(format!("sqlite://{}", dir.join("locks.db").display())),
        "redis" => Some(args.redis.clone()),
        "redis-spin" => Some(args.redis.replacen("redis://", "redis+spin://", 1)),
        "zookeeper" => Some(args.zookeeper.clone()),
        "pg-advisory" => Some(args.postgres.clone()),
        "mysql-named" => Some(args.mysql.clone()),
        "redis-atomic" => None,
        other => {
            return Err(Failure::usage(format!(
                "--hot-item runs table-lock, redis, redis-spin, zookeeper, pg-advisory, \
                 mysql-named or redis-atomic, not {other:?}"
            )));
        }
    })
}

pub async fn run(args: &DemoArgs) -> CliResult {
    let strategies: Vec<String> = if args.strategies.is_empty() {
        ["table-lock", "redis", "redis-atomic"]
            .map(str::to_owned)
            .to_vec()
    } else {
        args.strategies.clone()
    };
    let dir = tempfile::tempdir()?;
    let sqlite_store = dir.path().join("stock.db");
    // A strategy the scenario does not run is refused before anything is printed.
    for strategy in &strategies {
        lock_of(strategy, args, dir.path())?;
    }
    if !args.json {
        println!(
            "hot item: stock {}, {} ms critical section, {} processes x {} buyers; one lock vs {} segments\n",
            args.hot_stock, args.hot_hold_ms, args.workers, args.hot_tasks, args.hot_segments
        );
        println!(
            "{:<14} {:<13} {:>8} {:>7} {:>12} {:>10}  verdict",
            "lock", "stock in", "segments", "served", "final stock", "orders/s"
        );
    }
    let mut runs = Vec::new();
    let mut unavailable = Vec::new();
    for strategy in &strategies {
        let lock = lock_of(strategy, args, dir.path())?;
        // The stock lives on the lock's own server where that server can keep it (SQLite,
        // PostgreSQL, MySQL), else (ZooKeeper) in Redis, like the Redis strategies.
        let store = if strategy == "pg-advisory" {
            args.postgres.clone()
        } else if strategy == "mysql-named" {
            args.mysql.clone()
        } else if strategy != "table-lock" {
            args.redis.clone()
        } else {
            sqlite_store.display().to_string()
        };
        if let Err(reason) = check(lock.as_deref(), &store).await {
            if !args.json {
                println!("{strategy:<14} unavailable: {reason}");
            }
            unavailable.push(serde_json::json!({"lock": strategy, "reason": reason}));
            continue;
        }
        let segment_counts = if lock.is_none() {
            vec![1]
        } else {
            vec![1, args.hot_segments]
        };
        let mut single = None;
        for segments in segment_counts {
            let run = run_one(args, strategy, lock.as_deref(), &store, segments).await?;
            if !args.json {
                let speed_up = match single {
                    Some(base) if segments > 1 => format!("  {:.1}x", run.orders_per_s / base),
                    _ => String::new(),
                };
                println!(
                    "{:<14} {:<13} {:>8} {:>7} {:>12} {:>10.0}  {}{speed_up}",
                    strategy,
                    run.store,
                    segments,
                    run.served,
                    run.final_stock,
                    run.orders_per_s,
                    if run.exact { "exact" } else { "NOT EXACT" }
                );
            }
            if segments == 1 {
                single = Some(run.orders_per_s);
            }
            runs.push(run);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "scenario": "hot-item",
                "stock": args.hot_stock,
                "hold_ms": args.hot_hold_ms,
                "workers": args.workers,
                "tasks_per_worker": args.hot_tasks,
                "segments": args.hot_segments,
                "runs": runs,
                "unavailable": unavailable,
            })
        );
    }
    Ok(())
}

/// Connections to a PostgreSQL or MySQL stock in each buyer process. Each lock granted after
/// waiting keeps its own connection while held, so 4 processes, each with a primary, up to
/// 16 waiting and the held connections, nearly fill PostgreSQL's default 100: with 6 store
/// connections there, waiters met "too many clients" (and retried); 3 leave room. MySQL allows 151: with 6 instead of
/// 3 its segmented runs sold 826 to 833/s instead of 680 to 780/s.
fn store_connections(store: &str) -> u32 {
    if store.starts_with("postgres") { 3 } else { 6 }
}

/// Opens the stock named by `store`; `connections` to a PostgreSQL or MySQL one.
async fn open_store(
    store: &str,
    durability: Durability,
    connections: u32,
) -> CliResult<Arc<dyn StockStore>> {
    if store.starts_with("redis://") {
        #[cfg(feature = "redis")]
        return Ok(Arc::new(RedisStockStore::connect(store).await?));
        #[cfg(not(feature = "redis"))]
        return Err(Failure::usage(
            "a Redis stock needs the redis feature of distlock-cli",
        ));
    }
    if store.starts_with("postgres") || store.starts_with("mysql") || store.starts_with("mariadb") {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        return Ok(Arc::new(
            distlock::stock::SqlStockStore::connect(store, connections).await?,
        ));
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        return Err(Failure::usage(
            "an SQL stock needs the postgres or mysql feature of distlock-cli",
        ));
    }
    Ok(Arc::new(SqliteStockStore::open_with(
        store,
        durability.library(),
    )?))
}

/// Both servers answer within 3 s.
async fn check(lock: Option<&str>, store: &str) -> Result<(), String> {
    let checked = tokio::time::timeout(Duration::from_secs(3), async {
        if let Some(url) = lock {
            distlock::connect(url).await?.ping().await?;
        }
        open_store(store, Durability::Full, 1)
            .await
            .map_err(|e| match e {
                Failure::Usage(m) | Failure::Failed(m) => distlock::Error::Backend {
                    backend: "stock",
                    operation: "open the store",
                    source: m.into(),
                },
            })?;
        Ok::<_, distlock::Error>(())
    })
    .await;
    match checked {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("did not answer within 3 s".to_owned()),
    }
}

async fn run_one(
    args: &DemoArgs,
    strategy: &str,
    lock: Option<&str>,
    store_spec: &str,
    segments: u32,
) -> CliResult<HotRun> {
    let item = format!("hot-{}-{:08x}", std::process::id(), fastrand::u32(..));
    let store = open_store(store_spec, args.sqlite_durability, 1).await?;
    let stock = SegmentedStock::atomic(store.clone(), &item, segments)?;
    stock.create(args.hot_stock).await?;
    // Buyers buy until they are told sold out; twice the stock per worker bounds the loop.
    let budget = args.hot_stock.saturating_mul(2).max(1);
    let argument_lists = (0..args.workers)
        .map(|_| {
            let mut arguments = vec![
                "demo-hot-worker".to_owned(),
                "--store".to_owned(),
                store_spec.to_owned(),
                "--item".to_owned(),
                item.clone(),
                "--segments".to_owned(),
                segments.to_string(),
                "--orders".to_owned(),
                budget.to_string(),
                "--tasks".to_owned(),
                args.hot_tasks.to_string(),
                "--hold-ms".to_owned(),
                args.hot_hold_ms.to_string(),
                "--sqlite-durability".to_owned(),
                args.sqlite_durability.as_str().to_owned(),
            ];
            if let Some(url) = lock {
                arguments.extend(["--lock-url".to_owned(), url.to_owned()]);
            }
            arguments
        })
        .collect();
    let mut fleet = Fleet::start(argument_lists).await?;
    let start = Instant::now();
    let go_us = unix_us();
    fleet.go().await?;
    // Generous: every unit sold behind one lock, with 50 ms of overhead each.
    let limit = Duration::from_millis(args.hot_stock.saturating_mul(args.hot_hold_ms + 50))
        + Duration::from_secs(60);
    let reports: Vec<HotReport> = fleet.reports(limit).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut sales: Vec<f64> = reports
        .iter()
        .flat_map(|r| &r.sales_us)
        .map(|&us| us.saturating_sub(go_us) as f64 / 1e6)
        .collect();
    sales.sort_by(f64::total_cmp);
    let selling = sales.last().copied().unwrap_or(0.0);
    // When the first sale, and a tenth, half and nine tenths of the sales, had ended.
    let marks = [0.0, 0.1, 0.5, 0.9].map(|q| {
        sales
            .get(((sales.len() as f64 * q) as usize).min(sales.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    });
    if let Some(error) = reports.iter().find_map(|r| r.first_error.as_ref()) {
        return Err(Failure::failed(format!("hot item on {strategy}: {error}")));
    }
    let served: u64 = reports.iter().map(|r| r.served).sum();
    let sold_out: u64 = reports.iter().map(|r| r.sold_out).sum();
    let final_stock = stock.available().await?;
    // The run's item is its own: leave nothing behind on the server.
    stock.remove().await?;
    Ok(HotRun {
        lock: strategy.to_owned(),
        store: store_label(store_spec, args.sqlite_durability),
        segments,
        served,
        sold_out,
        final_stock,
        orders_per_s: served as f64 / selling.max(1e-6),
        selling_s: selling,
        first_sale_s: marks[0],
        tenth_s: marks[1],
        half_s: marks[2],
        nine_tenths_s: marks[3],
        elapsed_s: elapsed,
        exact: served + final_stock == args.hot_stock,
    })
}

/// A hot-item worker: buys its share, one unit per order, spending the critical section
/// inside each order.
pub async fn worker(args: HotWorkerArgs) -> CliResult {
    let connections = store_connections(&args.store);
    let store = open_store(&args.store, args.sqlite_durability, connections).await?;
    let stock = match &args.lock_url {
        Some(url) => {
            let locks = distlock::connect(url).await?;
            warm_up(&locks, &args.item, args.tasks).await?;
            if args.segments == 1 {
                Either::One(Stock::locked(store, &locks, &format!("{}#0", args.item))?)
            } else {
                Either::Many(SegmentedStock::locked(
                    store,
                    &locks,
                    &args.item,
                    args.segments,
                )?)
            }
        }
        None => Either::Many(SegmentedStock::atomic(store, &args.item, args.segments)?),
    };
    let stock = Arc::new(stock);
    let remaining = Arc::new(AtomicU64::new(args.orders));
    let sold_out = Arc::new(AtomicBool::new(false));
    let hold = Duration::from_millis(args.hold_ms);
    workers::await_go().await?;
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let stock = stock.clone();
        let remaining = remaining.clone();
        let sold_out = sold_out.clone();
        tasks.push(tokio::spawn(async move {
            let mut report = HotReport::default();
            while !sold_out.load(Ordering::SeqCst)
                && remaining
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                match stock.take_one(hold).await {
                    Ok(true) => {
                        report.served += 1;
                        report.sales_us.push(unix_us());
                    }
                    Ok(false) => {
                        report.sold_out += 1;
                        sold_out.store(true, Ordering::SeqCst);
                    }
                    Err(error) => {
                        report.errors += 1;
                        report.first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            report
        }));
    }
    let mut total = HotReport::default();
    for task in tasks {
        let report = task.await.unwrap_or_else(|error| HotReport {
            errors: 1,
            first_error: Some(format!("buyer task failed: {error}")),
            ..HotReport::default()
        });
        total.served += report.served;
        total.sold_out += report.sold_out;
        total.errors += report.errors;
        total.sales_us.extend(report.sales_us);
        if total.first_error.is_none() {
            total.first_error = report.first_error;
        }
    }
    workers::report(&total)
}

/// Opens what the buyers will use before `go`, as a running shop has it open: every buyer
/// waits once for a lock of this process's own, so a backend that waits on a connection of
/// its own (PostgreSQL, MySQL) opens those connections now, not during the run.
async fn warm_up(locks: &distlock::Locks, item: &str, tasks: u32) -> CliResult {
    let lock = locks.mutex(format!("warm-up/{item}/{}", std::process::id()))?;
    let first = lock.acquire().await?;
    let waiters: Vec<_> = (0..tasks)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire().await?.release().await })
        })
        .collect();
    // Let every waiter reach the server before the first release.
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await?;
    for waiter in waiters {
        waiter
            .await
            .map_err(|e| Failure::failed(format!("a warm-up task failed: {e}")))??;
    }
    Ok(())
}

/// Now, in µs since the Unix epoch: comparable between the processes of one machine.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One lock for the item (segment `#0` of the same layout), or segments.
enum Either {
    One(Stock),
    Many(SegmentedStock),
}

impl Either {
    /// One order of one unit with `hold` of business work inside the critical section. The
    /// work is an `async` block, so its clock starts when the critical section runs it, not
    /// when the order is made (`tokio::time::sleep` alone would count the wait for the lock).
    async fn take_one(&self, hold: Duration) -> distlock::Result<bool> {
        match self {
            Either::One(stock) => Ok(stock
                .take_with(1, Box::pin(async move { tokio::time::sleep(hold).await }))
                .await?
                .is_taken()),
            Either::Many(stock) => Ok(stock
                .take_with(1, || {
                    Box::pin(async move { tokio::time::sleep(hold).await })
                })
                .await?
                .is_taken()),
        }
    }
}
