//! The hot-item scenario's worker process: the hidden `demo-hot-worker` subcommand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use distlock::stock::{SegmentedStock, Stock};
use serde::{Deserialize, Serialize};

use super::{open_store, unix_us};
use crate::cli::Durability;
use crate::demo::strategy::Database;
use crate::failure::{CliResult, Failure};
use crate::workers;

/// The hidden `demo-hot-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct HotWorkerArgs {
    /// The lock backend; none means the store's atomic step.
    #[arg(long, env = "DISTLOCK_LOCK_URL", hide_env_values = true)]
    lock_url: Option<String>,
    /// The kind of store `--store` names.
    #[arg(long, value_enum)]
    database: Database,
    /// The store's URL, or the path of an SQLite stock file.
    #[arg(long, env = "DISTLOCK_STORE", hide_env_values = true)]
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

/// What a worker sold, sent to the scenario as one JSON line.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HotReport {
    pub served: u64,
    pub sold_out: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// When each of this worker's sales ended, in µs since the Unix epoch.
    pub sales_us: Vec<u64>,
}

/// Connections to a PostgreSQL or MySQL stock in each buyer process. Each lock granted after
/// waiting keeps its own connection while held, so 4 processes, each with a primary, up to
/// 16 waiting and the held connections, nearly fill PostgreSQL's default 100: with 6 store
/// connections there, waiters met "too many clients" (and retried); 3 leave room. MySQL allows 151: with 6 instead of
/// 3 its segmented runs sold 826 to 833/s instead of 680 to 780/s.
fn store_connections(database: Database) -> u32 {
    if database == Database::Postgres { 3 } else { 6 }
}

/// A hot-item worker: buys its share, one unit per order, spending the critical section
/// inside each order.
pub async fn worker(args: HotWorkerArgs) -> CliResult {
    let connections = store_connections(args.database);
    let store = open_store(
        args.database,
        &args.store,
        args.sqlite_durability,
        connections,
    )
    .await?;
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
                .take_with(1, Box::pin(crate::workers::spend(hold)))
                .await?
                .is_taken()),
            Either::Many(stock) => Ok(stock
                .take_with(1, || Box::pin(crate::workers::spend(hold)))
                .await?
                .is_taken()),
        }
    }
}
