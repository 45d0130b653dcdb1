//! `distlock demo`: the overselling demonstration.
//!
//! For each strategy: set the stock, start the worker processes, let them buy at once, and
//! compare what was sold with what the stock says.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::DemoArgs;
use crate::failure::{CliResult, Failure};
use crate::store::{ITEM, Store};
use crate::workers::{self, Fleet};

/// The strategies, in the order the table shows them.
const STRATEGIES: &[(&str, &str)] = &[
    ("none", "no lock: read, think, write"),
    ("in-process", "a Rust mutex in each process"),
    ("table-lock", "distlock's SQLite table-record lock"),
    ("redis", "distlock's Redis reentrant lock"),
    ("redis-spin", "distlock's Redis spin lock"),
    ("zookeeper", "distlock's ZooKeeper sequential-node lock"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    None,
    InProcess,
    TableLock,
    Redis,
    RedisSpin,
    ZooKeeper,
}

impl Strategy {
    fn parse(name: &str) -> CliResult<Self> {
        match name {
            "none" => Ok(Strategy::None),
            "in-process" => Ok(Strategy::InProcess),
            "table-lock" => Ok(Strategy::TableLock),
            "redis" => Ok(Strategy::Redis),
            "redis-spin" => Ok(Strategy::RedisSpin),
            "zookeeper" => Ok(Strategy::ZooKeeper),
            _ => {
                let known: Vec<&str> = STRATEGIES.iter().map(|(name, _)| *name).collect();
                Err(Failure::usage(format!(
                    "unknown strategy {name:?}; choose from {}",
                    known.join(", ")
                )))
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::InProcess => "in-process",
            Strategy::TableLock => "table-lock",
            Strategy::Redis => "redis",
            Strategy::RedisSpin => "redis-spin",
            Strategy::ZooKeeper => "zookeeper",
        }
    }
}

/// The hidden `demo-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    db: PathBuf,
    #[arg(long)]
    strategy: String,
    /// The distlock backend of a locking strategy.
    #[arg(long)]
    lock_url: Option<String>,
    #[arg(long)]
    orders: u64,
    #[arg(long)]
    tasks: u32,
    #[arg(long)]
    hold_ms: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerReport {
    accepted: u64,
    refused: u64,
    errors: u64,
    first_error: Option<String>,
}

/// One row of the table.
#[derive(Debug, Serialize)]
struct Outcome {
    strategy: &'static str,
    description: &'static str,
    orders: u64,
    accepted: u64,
    refused: u64,
    errors: u64,
    initial_stock: u64,
    final_stock: i64,
    /// Units sold beyond the initial stock.
    oversold: u64,
    /// Sales the stock does not show: accepted - (initial - final).
    lost_updates: i64,
    orders_per_s: f64,
    elapsed_s: f64,
    /// Sold + remaining = initial, and nothing oversold.
    exact: bool,
}

/// A strategy that could not run, and why.
#[derive(Debug, Serialize)]
struct Unavailable {
    strategy: &'static str,
    available: bool,
    reason: String,
}

/// The distlock backend a strategy locks with, if it uses one.
fn lock_url(strategy: Strategy, db: &Path, args: &DemoArgs) -> Option<String> {
    match strategy {
        Strategy::TableLock => Some(format!("sqlite://{}", db.display())),
        Strategy::Redis => Some(args.redis.clone()),
        Strategy::RedisSpin => Some(spin_url(&args.redis)),
        Strategy::ZooKeeper => Some(args.zookeeper.clone()),
        Strategy::None | Strategy::InProcess => None,
    }
}

/// The spin lock on the deployment a Redis URL names (standalone, Sentinel or Cluster).
fn spin_url(redis: &str) -> String {
    if redis.starts_with("redis://") {
        redis.replacen("redis://", "redis+spin://", 1)
    } else {
        let separator = if redis.contains('?') { '&' } else { '?' };
        format!("{redis}{separator}spin=true")
    }
}

/// Connects to a strategy's backend and asks it once, so that a missing server is reported
/// as a reason instead of failing every worker.
async fn check_backend(url: &str) -> Result<(), String> {
    let connected = tokio::time::timeout(Duration::from_secs(3), async {
        let locks = distlock::connect(url).await?;
        locks.ping().await
    })
    .await;
    match connected {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("{url} did not answer within 3 s")),
    }
}

pub async fn run(args: DemoArgs) -> CliResult {
    let strategies = if args.strategies.is_empty() {
        vec![
            Strategy::None,
            Strategy::InProcess,
            Strategy::TableLock,
            Strategy::Redis,
            Strategy::RedisSpin,
            Strategy::ZooKeeper,
        ]
    } else {
        args.strategies
            .iter()
            .map(|name| Strategy::parse(name))
            .collect::<CliResult<Vec<_>>>()?
    };
    let (db, _temporary) = match &args.db {
        Some(path) => {
            check_db_directory(path)?;
            (path.clone(), None)
        }
        None => {
            let dir = tempfile::tempdir()?;
            (dir.path().join("demo.db"), Some(dir))
        }
    };
    let store = Store::open(&db)?;
    if !args.json {
        println!(
            "{} worker processes x {} buyers, {} orders of 1 unit, stock {}, {} ms critical section\n",
            args.workers, args.tasks, args.orders, args.stock, args.hold_ms
        );
    }
    let mut outcomes = Vec::new();
    let mut unavailable = Vec::new();
    if !args.json {
        print_header();
    }
    for strategy in strategies {
        let url = lock_url(strategy, &db, &args);
        if let Some(url) = &url
            && let Err(reason) = check_backend(url).await
        {
            if !args.json {
                println!("{:<12} unavailable: {reason}", strategy.name());
            }
            unavailable.push(Unavailable {
                strategy: strategy.name(),
                available: false,
                reason,
            });
            continue;
        }
        let outcome = run_strategy(&args, &db, &store, strategy, url).await?;
        if !args.json {
            print_row(&outcome);
        }
        outcomes.push(outcome);
    }
    if args.json {
        let report = serde_json::json!({
            "workers": args.workers,
            "tasks_per_worker": args.tasks,
            "orders": args.orders,
            "stock": args.stock,
            "hold_ms": args.hold_ms,
            "results": outcomes,
            "unavailable": unavailable,
        });
        println!("{report}");
    } else {
        println!(
            "\noversold: units sold beyond the stock. lost updates: sales the stock does not show."
        );
    }
    Ok(())
}

fn check_db_directory(path: &Path) -> CliResult {
    let parent = path.parent().unwrap_or(Path::new(""));
    if !parent.as_os_str().is_empty() && !parent.is_dir() {
        return Err(Failure::usage(format!(
            "--db: the directory {} does not exist; create it first",
            parent.display()
        )));
    }
    Ok(())
}

async fn run_strategy(
    args: &DemoArgs,
    db: &Path,
    store: &Store,
    strategy: Strategy,
    lock_url: Option<String>,
) -> CliResult<Outcome> {
    let initial = i64::try_from(args.stock).map_err(Failure::usage)?;
    store.set(initial).await?;
    let workers = u64::from(args.workers);
    let argument_lists = (0..workers)
        .map(|index| {
            let share = args.orders / workers + u64::from(index < args.orders % workers);
            let mut arguments = vec![
                "demo-worker".to_owned(),
                "--db".to_owned(),
                db.display().to_string(),
                "--strategy".to_owned(),
                strategy.name().to_owned(),
                "--orders".to_owned(),
                share.to_string(),
                "--tasks".to_owned(),
                args.tasks.to_string(),
                "--hold-ms".to_owned(),
                args.hold_ms.to_string(),
            ];
            if let Some(url) = &lock_url {
                arguments.extend(["--lock-url".to_owned(), url.clone()]);
            }
            arguments
        })
        .collect();
    let mut fleet = Fleet::start(argument_lists).await?;
    let start = Instant::now();
    fleet.go().await?;
    // Generous: every order serialized, with 50 ms of overhead each.
    let limit = Duration::from_millis(args.orders.saturating_mul(args.hold_ms + 50))
        + Duration::from_secs(60);
    let reports: Vec<WorkerReport> = fleet.reports(limit).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let final_stock = store.read().await?;

    let accepted: u64 = reports.iter().map(|r| r.accepted).sum();
    let refused: u64 = reports.iter().map(|r| r.refused).sum();
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    if let Some(error) = reports.iter().find_map(|r| r.first_error.as_ref()) {
        return Err(Failure::failed(format!(
            "strategy {}: {errors} orders failed; the first: {error}",
            strategy.name()
        )));
    }
    let accepted_signed = i64::try_from(accepted).unwrap_or(i64::MAX);
    let lost_updates = accepted_signed - (initial - final_stock);
    let oversold = accepted.saturating_sub(args.stock);
    Ok(Outcome {
        strategy: strategy.name(),
        description: STRATEGIES
            .iter()
            .find(|(name, _)| *name == strategy.name())
            .map_or("", |(_, description)| description),
        orders: args.orders,
        accepted,
        refused,
        errors,
        initial_stock: args.stock,
        final_stock,
        oversold,
        lost_updates,
        orders_per_s: (accepted + refused) as f64 / elapsed.max(1e-9),
        elapsed_s: elapsed,
        exact: oversold == 0 && lost_updates == 0 && final_stock >= 0,
    })
}

fn print_header() {
    println!(
        "{:<12} {:>7} {:>9} {:>12} {:>9} {:>13} {:>9}  verdict",
        "strategy", "orders", "accepted", "final stock", "oversold", "lost updates", "orders/s"
    );
}

fn print_row(o: &Outcome) {
    let verdict = if o.exact {
        "exact"
    } else if o.oversold > 0 {
        "OVERSOLD"
    } else {
        "LOST UPDATES"
    };
    println!(
        "{:<12} {:>7} {:>9} {:>12} {:>9} {:>13} {:>9.0}  {verdict}",
        o.strategy, o.orders, o.accepted, o.final_stock, o.oversold, o.lost_updates, o.orders_per_s
    );
}

/// A worker process: buys its share of the orders with `tasks` concurrent buyers.
pub async fn worker(args: WorkerArgs) -> CliResult {
    let strategy = Strategy::parse(&args.strategy)?;
    let store = Store::open(&args.db)?;
    let locks = match (strategy, &args.lock_url) {
        (Strategy::None | Strategy::InProcess, _) => None,
        (_, Some(url)) => Some(distlock::connect(url).await?),
        (_, None) => {
            return Err(Failure::usage(format!(
                "strategy {} needs --lock-url",
                strategy.name()
            )));
        }
    };
    let process_mutex = Arc::new(tokio::sync::Mutex::new(()));
    let remaining = Arc::new(AtomicU64::new(args.orders));
    let hold = Duration::from_millis(args.hold_ms);
    workers::await_go().await?;

    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let store = store.clone();
        let locks = locks.clone();
        let process_mutex = process_mutex.clone();
        let remaining = remaining.clone();
        tasks.push(tokio::spawn(async move {
            let mut report = WorkerReport::default();
            let lock = match &locks {
                Some(locks) => Some(locks.mutex(format!("stock/{ITEM}"))?),
                None => None,
            };
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let result = match (&lock, strategy) {
                    (Some(lock), _) => {
                        let guard = lock.acquire().await?;
                        let bought = buy(&store, hold).await;
                        guard.release().await?;
                        bought
                    }
                    (None, Strategy::InProcess) => {
                        let _guard = process_mutex.lock().await;
                        buy(&store, hold).await
                    }
                    (None, _) => buy(&store, hold).await,
                };
                match result {
                    Ok(true) => report.accepted += 1,
                    Ok(false) => report.refused += 1,
                    Err(error) => {
                        report.errors += 1;
                        report.first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            Ok::<_, Failure>(report)
        }));
    }
    let mut total = WorkerReport::default();
    for task in tasks {
        let report = match task.await {
            Ok(Ok(report)) => report,
            Ok(Err(error)) => WorkerReport {
                errors: 1,
                first_error: Some(error.to_string()),
                ..WorkerReport::default()
            },
            Err(error) => WorkerReport {
                errors: 1,
                first_error: Some(format!("buyer task failed: {error}")),
                ..WorkerReport::default()
            },
        };
        total.accepted += report.accepted;
        total.refused += report.refused;
        total.errors += report.errors;
        if total.first_error.is_none() {
            total.first_error = report.first_error;
        }
    }
    workers::report(&total)
}

/// One purchase of one unit: read, spend the critical section, write back what was read
/// minus one. True when the order was accepted.
async fn buy(store: &Store, hold: Duration) -> CliResult<bool> {
    let quantity = store.read().await?;
    tokio::time::sleep(hold).await;
    if quantity < 1 {
        return Ok(false);
    }
    store.write(quantity - 1).await?;
    Ok(true)
}
