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
use crate::workers::{self, Fleet};
use distlock::stock::{SqliteStockStore, Stock, StockStore, Taken, Work};

/// The strategies, in the order the table shows them.
const STRATEGIES: &[(&str, &str)] = &[
    ("none", "no lock: read, think, write"),
    ("in-process", "a Rust mutex in each process"),
    ("table-lock", "distlock's SQLite table-record lock"),
    ("redis", "distlock's Redis reentrant lock"),
    ("redis-spin", "distlock's Redis spin lock"),
    ("zookeeper", "distlock's ZooKeeper sequential-node lock"),
    (
        "pg-pessimistic",
        "PostgreSQL: SELECT ... FOR UPDATE in a transaction",
    ),
    (
        "pg-optimistic",
        "PostgreSQL: version column, at most 10 attempts per order",
    ),
    (
        "pg-advisory",
        "distlock's PostgreSQL advisory lock around a committed transaction",
    ),
    (
        "mysql-pessimistic",
        "MySQL/MariaDB: SELECT ... FOR UPDATE in a transaction",
    ),
    (
        "mysql-optimistic",
        "MySQL/MariaDB: version column, at most 10 attempts per order",
    ),
    (
        "mysql-named",
        "distlock's MySQL named lock around a committed transaction",
    ),
    (
        "redis-atomic",
        "Redis: check and decrement in one Lua script, no lock",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    None,
    InProcess,
    TableLock,
    Redis,
    RedisSpin,
    ZooKeeper,
    PgPessimistic,
    PgOptimistic,
    PgAdvisory,
    MySqlPessimistic,
    MySqlOptimistic,
    MySqlNamed,
    RedisAtomic,
}

/// Where a strategy keeps the stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Database {
    Sqlite,
    Postgres,
    MySql,
    Redis,
}

/// How a strategy protects the read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protection {
    Nothing,
    ProcessMutex,
    /// A distlock lock around the purchase.
    Lock,
    RowLock,
    Version,
    /// One atomic step of the store; the work runs after it.
    Atomic,
}

impl Strategy {
    const ALL: [Strategy; 13] = [
        Strategy::None,
        Strategy::InProcess,
        Strategy::TableLock,
        Strategy::Redis,
        Strategy::RedisSpin,
        Strategy::ZooKeeper,
        Strategy::PgPessimistic,
        Strategy::PgOptimistic,
        Strategy::PgAdvisory,
        Strategy::MySqlPessimistic,
        Strategy::MySqlOptimistic,
        Strategy::MySqlNamed,
        Strategy::RedisAtomic,
    ];

    fn parse(name: &str) -> CliResult<Self> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.name() == name)
            .ok_or_else(|| {
                Failure::usage(format!(
                    "unknown strategy {name:?}; choose from {}",
                    STRATEGIES
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::InProcess => "in-process",
            Strategy::TableLock => "table-lock",
            Strategy::Redis => "redis",
            Strategy::RedisSpin => "redis-spin",
            Strategy::ZooKeeper => "zookeeper",
            Strategy::PgPessimistic => "pg-pessimistic",
            Strategy::PgOptimistic => "pg-optimistic",
            Strategy::PgAdvisory => "pg-advisory",
            Strategy::MySqlPessimistic => "mysql-pessimistic",
            Strategy::MySqlOptimistic => "mysql-optimistic",
            Strategy::MySqlNamed => "mysql-named",
            Strategy::RedisAtomic => "redis-atomic",
        }
    }

    fn database(self) -> Database {
        match self {
            Strategy::PgPessimistic | Strategy::PgOptimistic | Strategy::PgAdvisory => {
                Database::Postgres
            }
            Strategy::MySqlPessimistic | Strategy::MySqlOptimistic | Strategy::MySqlNamed => {
                Database::MySql
            }
            Strategy::RedisAtomic => Database::Redis,
            _ => Database::Sqlite,
        }
    }

    fn protection(self) -> Protection {
        match self {
            Strategy::None => Protection::Nothing,
            Strategy::InProcess => Protection::ProcessMutex,
            Strategy::PgPessimistic | Strategy::MySqlPessimistic => Protection::RowLock,
            Strategy::PgOptimistic | Strategy::MySqlOptimistic => Protection::Version,
            Strategy::RedisAtomic => Protection::Atomic,
            _ => Protection::Lock,
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
    /// The PostgreSQL or MySQL database of a database strategy's stock.
    #[arg(long)]
    store_url: Option<String>,
    /// The item whose stock this run sells.
    #[arg(long, default_value = ITEM)]
    item: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerReport {
    accepted: u64,
    refused: u64,
    /// Orders given up after every optimistic attempt lost its race.
    #[serde(default)]
    gave_up: u64,
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
    /// Refused for lack of stock.
    refused: u64,
    /// Refused after every optimistic attempt lost its race (stock was left).
    gave_up: u64,
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
        Strategy::PgAdvisory => Some(args.postgres.clone()),
        Strategy::MySqlNamed => Some(args.mysql.clone()),
        Strategy::None
        | Strategy::InProcess
        | Strategy::PgPessimistic
        | Strategy::PgOptimistic
        | Strategy::MySqlPessimistic
        | Strategy::MySqlOptimistic
        | Strategy::RedisAtomic => None,
    }
}

/// The server of a strategy that keeps its stock in PostgreSQL, MySQL or Redis.
fn store_url(strategy: Strategy, args: &DemoArgs) -> Option<String> {
    match strategy.database() {
        Database::Sqlite => None,
        Database::Postgres => Some(args.postgres.clone()),
        Database::MySql => Some(args.mysql.clone()),
        Database::Redis => Some(args.redis.clone()),
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

/// The item every run on the SQLite file sells (runs on a server get an item of their own).
const ITEM: &str = "iphone";

/// How many times an optimistic buyer tries before it gives up.
const OPTIMISTIC_ATTEMPTS: u32 = distlock::stock::DEFAULT_ATTEMPTS;

/// What one purchase came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bought {
    Accepted,
    /// Out of stock.
    Refused,
    /// Optimistic only: every attempt lost its race.
    GaveUp,
}

impl From<Taken> for Bought {
    fn from(taken: Taken) -> Self {
        match taken {
            Taken::Taken { .. } => Bought::Accepted,
            Taken::SoldOut { .. } => Bought::Refused,
            Taken::GaveUp { .. } => Bought::GaveUp,
        }
    }
}

/// The stock a strategy sells from, in a `distlock::stock` store: the SQLite file, a
/// PostgreSQL or MySQL table, or Redis.
#[derive(Clone)]
struct DemoStock {
    store: Arc<dyn StockStore>,
    item: String,
}

impl DemoStock {
    /// The stock of a strategy: the SQLite file at `db`, or `item` on the server `store_url`.
    async fn open(
        db: &Path,
        store_url: Option<&str>,
        item: &str,
        connections: u32,
    ) -> CliResult<Self> {
        let store: Arc<dyn StockStore> = match store_url {
            None => Arc::new(SqliteStockStore::open(db)?),
            #[cfg(feature = "redis")]
            Some(url) if url.starts_with("redis") => {
                Arc::new(distlock::stock::RedisStockStore::connect(url).await?)
            }
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Some(url) => Arc::new(distlock::stock::SqlStockStore::connect(url, connections).await?),
            #[cfg(not(any(feature = "postgres", feature = "mysql")))]
            Some(url) => {
                let _ = connections;
                return Err(Failure::usage(format!(
                    "{url}: this distlock was built without the feature for this server"
                )));
            }
        };
        Ok(DemoStock {
            store,
            item: item.to_owned(),
        })
    }

    async fn set(&self, quantity: u64) -> CliResult {
        Ok(self.store.set(&self.item, quantity).await?)
    }

    async fn read(&self) -> CliResult<u64> {
        Ok(self.store.quantity(&self.item).await?)
    }

    /// Removes a run's own item from a server; the SQLite file is the run's to keep or drop.
    async fn remove(&self) -> CliResult {
        self.store.remove(&self.item).await?;
        Ok(())
    }

    /// How a buyer of `strategy` orders: the library's protected `Stock`, or `None` for the
    /// unprotected read, think, write.
    fn buyer(
        &self,
        strategy: Strategy,
        locks: Option<&distlock::Locks>,
    ) -> CliResult<Option<Stock>> {
        let (store, item) = (self.store.clone(), self.item.as_str());
        Ok(match strategy.protection() {
            Protection::Nothing | Protection::ProcessMutex => None,
            Protection::Lock => {
                let locks = locks.ok_or_else(|| {
                    Failure::usage(format!("strategy {} needs --lock-url", strategy.name()))
                })?;
                Some(Stock::locked(store, locks, item)?)
            }
            Protection::RowLock => Some(Stock::pessimistic(store, item)?),
            Protection::Version => Some(Stock::optimistic(store, item, OPTIMISTIC_ATTEMPTS)?),
            Protection::Atomic => Some(Stock::atomic(store, item)?),
        })
    }

    /// The unprotected purchase of one unit: read, spend the critical section, write back
    /// what was read minus one. What a lock has to protect.
    async fn buy_unprotected(&self, hold: Duration) -> CliResult<Bought> {
        let quantity = self.read().await?;
        tokio::time::sleep(hold).await;
        if quantity < 1 {
            return Ok(Bought::Refused);
        }
        self.set(quantity - 1).await?;
        Ok(Bought::Accepted)
    }
}

/// One protected purchase of one unit, the critical section inside the protection (for the
/// atomic step, after it: nothing can be inside one store step).
async fn buy(stock: &Stock, protection: Protection, hold: Duration) -> CliResult<Bought> {
    if protection == Protection::Atomic {
        let taken = stock.take(1).await?;
        tokio::time::sleep(hold).await;
        return Ok(taken.into());
    }
    let work: Work<'_> = Box::pin(async move { tokio::time::sleep(hold).await });
    Ok(stock.take_with(1, work).await?.into())
}

/// Checks that a strategy's servers answer, so that a missing one is reported as a reason
/// instead of failing every worker.
async fn check_strategy(
    strategy: Strategy,
    lock_url: Option<&str>,
    store_url: Option<&str>,
) -> Result<(), String> {
    if let Some(url) = lock_url {
        check_backend(url).await?;
    }
    if let Some(url) = store_url.filter(|url| url.starts_with("redis")) {
        // The atomic strategy's Redis answers as a lock backend does.
        return check_backend(url).await;
    }
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    if let Some(url) = store_url {
        let opened = tokio::time::timeout(
            Duration::from_secs(3),
            distlock::stock::SqlStockStore::connect(url, 1),
        )
        .await;
        return match opened {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("{url} did not answer within 3 s")),
        };
    }
    #[cfg(not(any(feature = "postgres", feature = "mysql")))]
    if store_url.is_some() {
        return Err(format!(
            "strategy {} needs the postgres or mysql feature",
            strategy.name()
        ));
    }
    let _ = strategy;
    Ok(())
}

pub async fn run(args: DemoArgs) -> CliResult {
    if args.hot_item {
        return crate::hot::run(&args).await;
    }
    let strategies = if args.strategies.is_empty() {
        Strategy::ALL.to_vec()
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
        let store_url = store_url(strategy, &args);
        if let Err(reason) = check_strategy(strategy, url.as_deref(), store_url.as_deref()).await {
            if !args.json {
                println!("{:<18} unavailable: {reason}", strategy.name());
            }
            unavailable.push(Unavailable {
                strategy: strategy.name(),
                available: false,
                reason,
            });
            continue;
        }
        // One item per run, so that runs at the same time on one database do not mix.
        let item = match store_url {
            Some(_) => format!("{ITEM}-{}-{:08x}", std::process::id(), fastrand::u32(..)),
            None => ITEM.to_owned(),
        };
        let stock = DemoStock::open(&db, store_url.as_deref(), &item, 2).await?;
        let outcome = run_strategy(&args, &db, &stock, strategy, url, store_url, &item).await;
        stock.remove().await?;
        let outcome = outcome?;
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
            "\noversold: units sold beyond the stock. lost updates: sales the stock does not show.\n\
             gave up: orders refused after {OPTIMISTIC_ATTEMPTS} lost races (optimistic only), with stock left."
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
    stock: &DemoStock,
    strategy: Strategy,
    lock_url: Option<String>,
    store_url: Option<String>,
    item: &str,
) -> CliResult<Outcome> {
    let initial = i64::try_from(args.stock).map_err(Failure::usage)?;
    stock.set(args.stock).await?;
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
                "--item".to_owned(),
                item.to_owned(),
            ];
            if let Some(url) = &lock_url {
                arguments.extend(["--lock-url".to_owned(), url.clone()]);
            }
            if let Some(url) = &store_url {
                arguments.extend(["--store-url".to_owned(), url.clone()]);
            }
            arguments
        })
        .collect();
    let mut fleet = Fleet::start(argument_lists).await?;
    let start = Instant::now();
    fleet.go().await?;
    // Generous: every order serialized, with 50 ms of overhead each (optimistic orders may
    // back off up to 64 ms per attempt).
    let per_order = args.hold_ms + 50;
    let per_order = if strategy.protection() == Protection::Version {
        (args.hold_ms + 70) * u64::from(OPTIMISTIC_ATTEMPTS)
    } else {
        per_order
    };
    let limit =
        Duration::from_millis(args.orders.saturating_mul(per_order)) + Duration::from_secs(60);
    let reports: Vec<WorkerReport> = fleet.reports(limit).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let final_stock = i64::try_from(stock.read().await?).unwrap_or(i64::MAX);

    let accepted: u64 = reports.iter().map(|r| r.accepted).sum();
    let refused: u64 = reports.iter().map(|r| r.refused).sum();
    let gave_up: u64 = reports.iter().map(|r| r.gave_up).sum();
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
        gave_up,
        errors,
        initial_stock: args.stock,
        final_stock,
        oversold,
        lost_updates,
        orders_per_s: (accepted + refused + gave_up) as f64 / elapsed.max(1e-9),
        elapsed_s: elapsed,
        exact: oversold == 0 && lost_updates == 0 && final_stock >= 0,
    })
}

fn print_header() {
    println!(
        "{:<18} {:>7} {:>9} {:>8} {:>12} {:>9} {:>13} {:>9}  verdict",
        "strategy",
        "orders",
        "accepted",
        "gave up",
        "final stock",
        "oversold",
        "lost updates",
        "orders/s"
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
        "{:<18} {:>7} {:>9} {:>8} {:>12} {:>9} {:>13} {:>9.0}  {verdict}",
        o.strategy,
        o.orders,
        o.accepted,
        o.gave_up,
        o.final_stock,
        o.oversold,
        o.lost_updates,
        o.orders_per_s
    );
}

/// A worker process: buys its share of the orders with `tasks` concurrent buyers.
pub async fn worker(args: WorkerArgs) -> CliResult {
    let strategy = Strategy::parse(&args.strategy)?;
    let protection = strategy.protection();
    // Pessimistic buyers each keep a connection for their whole transaction.
    let stock = DemoStock::open(
        &args.db,
        args.store_url.as_deref(),
        &args.item,
        args.tasks + 1,
    )
    .await?;
    let locks = match (protection, &args.lock_url) {
        (Protection::Lock, Some(url)) => Some(distlock::connect(url).await?),
        (Protection::Lock, None) => {
            return Err(Failure::usage(format!(
                "strategy {} needs --lock-url",
                strategy.name()
            )));
        }
        _ => None,
    };
    let process_mutex = Arc::new(tokio::sync::Mutex::new(()));
    let remaining = Arc::new(AtomicU64::new(args.orders));
    let hold = Duration::from_millis(args.hold_ms);
    workers::await_go().await?;

    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let stock = stock.clone();
        let buyer = stock.buyer(strategy, locks.as_ref())?;
        let process_mutex = process_mutex.clone();
        let remaining = remaining.clone();
        tasks.push(tokio::spawn(async move {
            let mut report = WorkerReport::default();
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let result = match &buyer {
                    // Under a lock the write is made before the lock is released.
                    Some(buyer) => buy(buyer, protection, hold).await,
                    None if protection == Protection::ProcessMutex => {
                        let _guard = process_mutex.lock().await;
                        stock.buy_unprotected(hold).await
                    }
                    None => stock.buy_unprotected(hold).await,
                };
                match result {
                    Ok(Bought::Accepted) => report.accepted += 1,
                    Ok(Bought::Refused) => report.refused += 1,
                    Ok(Bought::GaveUp) => report.gave_up += 1,
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
        total.gave_up += report.gave_up;
        total.errors += report.errors;
        if total.first_error.is_none() {
            total.first_error = report.first_error;
        }
    }
    workers::report(&total)
}
