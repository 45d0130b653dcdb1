//! The overselling demo's worker process: the hidden `demo-worker` subcommand.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::stock::{Bought, DemoStock, ITEM, buy};
use super::strategy::{Protection, Strategy};
use crate::failure::{CliResult, Failure};
use crate::workers;

/// The hidden `demo-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    db: PathBuf,
    #[arg(long, value_enum)]
    strategy: Strategy,
    /// The distlock backend of a locking strategy.
    #[arg(long, env = "DISTLOCK_LOCK_URL", hide_env_values = true)]
    lock_url: Option<String>,
    #[arg(long)]
    orders: u64,
    #[arg(long)]
    tasks: u32,
    #[arg(long)]
    hold_ms: u64,
    /// The PostgreSQL or MySQL database of a database strategy's stock.
    #[arg(long, env = "DISTLOCK_STORE_URL", hide_env_values = true)]
    store_url: Option<String>,
    /// The item whose stock this run sells.
    #[arg(long, default_value = ITEM)]
    item: String,
}

/// What a worker sold, sent to the demo as one JSON line.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub accepted: u64,
    pub refused: u64,
    /// Orders given up after every optimistic attempt lost its race.
    #[serde(default)]
    pub gave_up: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// A worker process: buys its share of the orders with `tasks` concurrent buyers.
pub async fn worker(args: WorkerArgs) -> CliResult {
    let strategy = args.strategy;
    let protection = strategy.protection();
    // Pessimistic buyers each keep a connection for their whole transaction.
    let stock = DemoStock::open(
        &args.db,
        strategy.database(),
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
