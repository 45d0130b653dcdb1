//! `distlock demo hot-item`: the hot-item scenario. One item, stock 1000, a 20 ms critical
//! section per order, and many buyers in several processes: one lock for the item against
//! the same stock split into 20 segments, each with its own lock, on each chosen lock
//! backend, plus the Redis atomic script (no lock) as the ceiling.

mod strategy;
mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use distlock::stock::RedisStockStore;
use distlock::stock::{SegmentedStock, SqliteStockStore, StockStore};
use serde::Serialize;

use crate::cli::{Durability, HotItemArgs};
use crate::demo::strategy::Database;
use crate::failure::{CliResult, Failure};
use crate::json::{self, Unavailable};
use crate::workers::Fleet;
pub use strategy::HotStrategy;
use strategy::Store;
use worker::HotReport;
pub use worker::{HotWorkerArgs, worker};

/// The scenario's settings, at the top level of its JSON report.
#[derive(Debug, Serialize)]
struct Settings {
    stock: u64,
    hold_ms: u64,
    workers: u32,
    tasks_per_worker: u32,
    segments: u32,
}

/// One run, a row of the report: a lock (or none) with 1 or N segments.
#[derive(Debug, Serialize)]
struct HotRun {
    /// The strategy's name on the command line.
    strategy: String,
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
fn store_label(store: &Store, durability: Durability) -> String {
    match store.database {
        Database::Sqlite => format!("sqlite-{}", durability.as_str()),
        database => database.name().to_owned(),
    }
}

/// Runs each chosen strategy (table-lock, redis and redis-atomic by default) with one lock
/// and with segments, and prints one row for each run.
pub async fn run(args: HotItemArgs) -> CliResult {
    let strategies = if args.strategies.is_empty() {
        HotStrategy::defaults()
    } else {
        args.strategies.clone()
    };
    let dir = tempfile::tempdir()?;
    let sqlite_store = dir.path().join("stock.db");
    if !args.json {
        println!(
            "hot item: stock {}, {} ms critical section, {} processes x {} buyers; one lock vs {} segments\n",
            args.stock, args.hold_ms, args.workers, args.tasks, args.segments
        );
        println!(
            "{:<14} {:<13} {:>8} {:>7} {:>12} {:>10}  verdict",
            "lock", "stock in", "segments", "served", "final stock", "orders/s"
        );
    }
    let mut runs = Vec::new();
    let mut unavailable = Vec::new();
    for strategy in strategies {
        let lock = strategy.lock_url(&args.servers, dir.path());
        let store = strategy.store(&args.servers, &sqlite_store);
        let checked = match &store {
            Some(store) => check(lock.as_deref(), store).await,
            None => Err("no server flag names its stock's server".to_owned()),
        };
        if let Err(reason) = checked {
            if !args.json {
                println!("{strategy:<14} unavailable: {reason}");
            }
            unavailable.push(Unavailable {
                strategy: strategy.name().to_owned(),
                reason,
            });
            continue;
        }
        let Some(store) = store else { continue };
        let segment_counts = if lock.is_none() {
            vec![1]
        } else {
            vec![1, args.segments]
        };
        let mut single = None;
        for segments in segment_counts {
            let run = run_one(&args, strategy, lock.as_deref(), &store, segments).await?;
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
        let settings = Settings {
            stock: args.stock,
            hold_ms: args.hold_ms,
            workers: args.workers,
            tasks_per_worker: args.tasks,
            segments: args.segments,
        };
        json::print_rows("demo hot-item", &settings, &runs, &unavailable)?;
    }
    Ok(())
}

/// Opens the stock `store` names; `connections` to a PostgreSQL or MySQL one.
async fn open_store(
    database: Database,
    store: &str,
    durability: Durability,
    connections: u32,
) -> CliResult<Arc<dyn StockStore>> {
    match database {
        #[cfg(feature = "redis")]
        Database::Redis => Ok(Arc::new(RedisStockStore::connect(store).await?)),
        #[cfg(not(feature = "redis"))]
        Database::Redis => Err(Failure::usage(
            "a Redis stock needs the redis feature of distlock-cli",
        )),
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        Database::Postgres | Database::MySql => Ok(Arc::new(
            distlock::stock::SqlStockStore::connect(store, connections).await?,
        )),
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        Database::Postgres | Database::MySql => {
            let _ = connections;
            Err(Failure::usage(
                "an SQL stock needs the postgres or mysql feature of distlock-cli",
            ))
        }
        Database::Sqlite => Ok(Arc::new(SqliteStockStore::open_with(
            store,
            durability.library(),
        )?)),
    }
}

/// Both servers answer within 3 s.
async fn check(lock: Option<&str>, store: &Store) -> Result<(), String> {
    let checked = tokio::time::timeout(Duration::from_secs(3), async {
        if let Some(url) = lock {
            distlock::connect(url).await?.ping().await?;
        }
        open_store(store.database, &store.spec, Durability::Full, 1)
            .await
            .map_err(|e| distlock::Error::Backend {
                backend: "stock",
                operation: "open the store",
                source: e.to_string().into(),
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

/// One run: creates the item's stock in `segments`, lets the workers buy it all, and
/// reports how fast they sold it.
async fn run_one(
    args: &HotItemArgs,
    strategy: HotStrategy,
    lock: Option<&str>,
    store: &Store,
    segments: u32,
) -> CliResult<HotRun> {
    let item = format!("hot-{}-{:08x}", std::process::id(), fastrand::u32(..));
    let opened = open_store(store.database, &store.spec, args.sqlite_durability, 1).await?;
    let stock = SegmentedStock::atomic(opened.clone(), &item, segments)?;
    stock.create(args.stock).await?;
    // Buyers buy until they are told sold out; twice the stock per worker bounds the loop.
    let budget = args.stock.saturating_mul(2).max(1);
    let argument_lists = (0..args.workers)
        .map(|_| {
            let mut arguments = vec![
                "demo-hot-worker".to_owned(),
                "--database".to_owned(),
                store.database.name().to_owned(),
                "--store".to_owned(),
                store.spec.clone(),
                "--item".to_owned(),
                item.clone(),
                "--segments".to_owned(),
                segments.to_string(),
                "--orders".to_owned(),
                budget.to_string(),
                "--tasks".to_owned(),
                args.tasks.to_string(),
                "--hold-ms".to_owned(),
                args.hold_ms.to_string(),
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
    let limit = Duration::from_millis(args.stock.saturating_mul(args.hold_ms + 50))
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
        strategy: strategy.name().to_owned(),
        store: store_label(store, args.sqlite_durability),
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
        exact: served + final_stock == args.stock,
    })
}

/// Now, in µs since the Unix epoch: comparable between the processes of one machine.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
