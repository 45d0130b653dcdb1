//! Operator commands, and `hold` for cross-process tests.

use std::time::Duration;

use distlock::{AcquireOptions, ConnectOptions};
use serde::Serialize;

use crate::cli::{HoldArgs, LockArgs, StatusArgs};
use crate::failure::{CliResult, Failure};
use crate::json;

/// What `status --json` answers.
#[derive(Debug, Serialize)]
struct Status<'a> {
    lock: &'a str,
    /// The backend's URL scheme, e.g. `redis`.
    backend: &'a str,
    locked: bool,
}

/// Prints whether the lock is held: `locked` or `free`, or one JSON object.
pub async fn status(args: StatusArgs) -> CliResult {
    let StatusArgs { lock, json } = args;
    let locks = distlock::connect(&lock.backend).await?;
    let locked = locks.is_locked(&lock.name).await?;
    if json {
        let status = Status {
            lock: &lock.name,
            backend: locks.backend_scheme(),
            locked,
        };
        json::print_fact("status", &status)
    } else {
        println!("{}", if locked { "locked" } else { "free" });
        Ok(())
    }
}

/// Frees the lock whoever holds it, and says whether it was held.
pub async fn force_unlock(args: LockArgs) -> CliResult {
    let locks = distlock::connect(&args.backend).await?;
    let freed = locks.force_unlock(&args.name).await?;
    println!("{}", if freed { "freed" } else { "was not locked" });
    Ok(())
}

/// Acquires (waiting at most `--max-ms`), prints `{"fencing_token":N}` on one line, and holds
/// until killed, until the lock is lost (exit 1), or until `--max-ms` (exit 0).
pub async fn hold(args: HoldArgs) -> CliResult {
    let options = ConnectOptions::new().lease(Duration::from_millis(args.lease_ms));
    let locks = distlock::connect_with(&args.backend, options).await?;
    let guard = locks
        .mutex(args.name)?
        .acquire_with(AcquireOptions::new().wait(Duration::from_millis(args.max_ms)))
        .await?;
    println!(
        "{}",
        serde_json::json!({ "fencing_token": guard.fencing_token() })
    );
    tokio::select! {
        lost = guard.lost() => Err(Failure::failed(lost)),
        () = tokio::time::sleep(Duration::from_millis(args.max_ms)) => {
            guard.release().await?;
            Ok(())
        }
    }
}
