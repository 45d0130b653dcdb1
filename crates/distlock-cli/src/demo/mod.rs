//! `distlock demo`: the overselling demonstration.
//!
//! For each strategy: set the stock, start the worker processes, let them buy at once, and
//! compare what was sold with what the stock says. `distlock demo hot-item` ([`hot`]) is
//! the hot-item scenario.

pub mod hot;
mod report;
mod servers;
mod stock;
mod strategy;
mod worker;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::DemoArgs;
use crate::failure::{CliResult, Failure};
use crate::json::{self, Unavailable};
use crate::workers::Fleet;
use report::{Outcome, Settings};
pub use servers::Servers;
use stock::{DemoStock, ITEM, OPTIMISTIC_ATTEMPTS};
pub use strategy::Strategy;
use strategy::{Database, Protection};
use worker::WorkerReport;
pub use worker::{WorkerArgs, worker};

/// Runs each chosen strategy in turn (all by default) and prints one row for each.
pub async fn run(args: DemoArgs) -> CliResult {
    let strategies = if args.strategies.is_empty() {
        Strategy::all()
    } else {
        args.strategies.clone()
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
        report::print_header(&args);
    }
    let mut outcomes = Vec::new();
    let mut unavailable = Vec::new();
    for strategy in strategies {
        let lock_url = strategy.lock_url(&db, &args.servers);
        let store_url = strategy.store_url(&args.servers);
        if let Err(reason) =
            check_strategy(strategy, lock_url.as_deref(), store_url.as_deref()).await
        {
            if !args.json {
                report::print_unavailable(strategy, &reason);
            }
            unavailable.push(Unavailable {
                strategy: strategy.name().to_owned(),
                reason,
            });
            continue;
        }
        // One item per run, so that runs at the same time on one database do not mix.
        let item = match store_url {
            Some(_) => format!("{ITEM}-{}-{:08x}", std::process::id(), fastrand::u32(..)),
            None => ITEM.to_owned(),
        };
        let stock =
            DemoStock::open(&db, strategy.database(), store_url.as_deref(), &item, 2).await?;
        let run = Run {
            args: &args,
            db: &db,
            strategy,
            lock_url,
            store_url,
            item,
        };
        let outcome = run.sell(&stock).await;
        stock.remove().await?;
        let outcome = outcome?;
        if !args.json {
            report::print_row(&outcome);
        }
        outcomes.push(outcome);
    }
    if args.json {
        json::print_rows("demo", &Settings::of(&args), &outcomes, &unavailable)
    } else {
        report::print_legend();
        Ok(())
    }
}

/// Refuses a `--db` whose directory does not exist (bad input, not a failed run).
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

/// One strategy's run: what its workers are told.
struct Run<'a> {
    args: &'a DemoArgs,
    db: &'a Path,
    strategy: Strategy,
    lock_url: Option<String>,
    store_url: Option<String>,
    item: String,
}

impl Run<'_> {
    /// The arguments of each worker process: its share of the orders and where to sell.
    fn worker_arguments(&self) -> Vec<Vec<String>> {
        let args = self.args;
        let workers = u64::from(args.workers);
        (0..workers)
            .map(|index| {
                let share = args.orders / workers + u64::from(index < args.orders % workers);
                let mut arguments = vec![
                    "demo-worker".to_owned(),
                    "--db".to_owned(),
                    self.db.display().to_string(),
                    "--strategy".to_owned(),
                    self.strategy.name().to_owned(),
                    "--orders".to_owned(),
                    share.to_string(),
                    "--tasks".to_owned(),
                    args.tasks.to_string(),
                    "--hold-ms".to_owned(),
                    args.hold_ms.to_string(),
                    "--item".to_owned(),
                    self.item.clone(),
                ];
                if let Some(url) = &self.lock_url {
                    arguments.extend(["--lock-url".to_owned(), url.clone()]);
                }
                if let Some(url) = &self.store_url {
                    arguments.extend(["--store-url".to_owned(), url.clone()]);
                }
                arguments
            })
            .collect()
    }

    /// Sets the stock, lets the workers buy at once, and compares what they sold with what
    /// the stock says.
    async fn sell(&self, stock: &DemoStock) -> CliResult<Outcome> {
        let args = self.args;
        stock.set(args.stock).await?;
        let mut fleet = Fleet::start(self.worker_arguments()).await?;
        let start = Instant::now();
        fleet.go().await?;
        // Generous: every order serialized, with 50 ms of overhead each (optimistic orders
        // may back off up to 64 ms per attempt).
        let per_order = if self.strategy.protection() == Protection::Version {
            (args.hold_ms + 70) * u64::from(OPTIMISTIC_ATTEMPTS)
        } else {
            args.hold_ms + 50
        };
        let limit =
            Duration::from_millis(args.orders.saturating_mul(per_order)) + Duration::from_secs(60);
        let reports: Vec<WorkerReport> = fleet.reports(limit).await?;
        let elapsed = start.elapsed().as_secs_f64();
        let final_stock = i64::try_from(stock.read().await?).unwrap_or(i64::MAX);
        Outcome::tally(self.strategy, args, &reports, final_stock, elapsed)
    }
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
    if let Some(url) = store_url.filter(|_| strategy.database() == Database::Redis) {
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
            Err(_) => Err(format!(
                "{} did not answer within 3 s",
                distlock::redact_url(url)
            )),
        };
    }
    #[cfg(not(any(feature = "postgres", feature = "mysql")))]
    if store_url.is_some() {
        return Err(format!(
            "strategy {} needs the postgres or mysql feature",
            strategy.name()
        ));
    }
    Ok(())
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
        Err(_) => Err(format!(
            "{} did not answer within 3 s",
            distlock::redact_url(url)
        )),
    }
}
