//! Operator commands, and `hold` for cross-process tests.

use std::time::Duration;

use distlock::{AcquireOptions, ConnectOptions};
use serde::Serialize;

use crate::cli::{HoldArgs, HoldKind, ListArgs, LockArgs, StatusArgs};
use crate::failure::{CliResult, Failure};
use crate::json;

/// What `status --json` answers; a field the backend cannot tell is null.
#[derive(Debug, Serialize)]
struct Status<'a> {
    lock: &'a str,
    /// The backend's URL scheme, e.g. `redis`.
    backend: &'a str,
    locked: bool,
    holder: Option<String>,
    holds: Option<u32>,
    fencing_token: Option<u64>,
    remaining_lease_ms: Option<u64>,
    waiters: Option<u64>,
}

/// Prints whether the lock is held (`locked` or `free`) and what the backend can tell about
/// it (holder, holds, fencing token, lease left, waiters), or one JSON object.
pub async fn status(args: StatusArgs) -> CliResult {
    let StatusArgs { lock, json } = args;
    let locks = distlock::connect(&lock.backend).await?;
    let info = locks.inspect(&lock.name).await?;
    let status = Status {
        lock: &lock.name,
        backend: locks.backend_scheme(),
        locked: info.locked,
        holder: info.holder,
        holds: info.holds,
        fencing_token: info.fencing_token,
        remaining_lease_ms: info
            .remaining_lease
            .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
        waiters: info.waiters,
    };
    if json {
        return json::print_fact("status", &status);
    }
    let mut line = String::from(if status.locked { "locked" } else { "free" });
    let known = |value: Option<String>| value.unwrap_or_else(|| "unknown".to_owned());
    if status.locked {
        line += &format!(
            " holder={} holds={} fencing_token={} lease_left_ms={}",
            known(status.holder),
            known(status.holds.map(|h| h.to_string())),
            known(status.fencing_token.map(|t| t.to_string())),
            known(status.remaining_lease_ms.map(|ms| ms.to_string())),
        );
    }
    line += &format!(" waiters={}", known(status.waiters.map(|w| w.to_string())));
    println!("{line}");
    Ok(())
}

/// One lock of `list --json`: its name and what `status` would say of it.
#[derive(Debug, Serialize)]
struct Listed {
    lock: String,
    holder: Option<String>,
    holds: Option<u32>,
    fencing_token: Option<u64>,
    remaining_lease_ms: Option<u64>,
    waiters: Option<u64>,
}

/// What `list --json` answers.
#[derive(Debug, Serialize)]
struct Listing<'a> {
    backend: &'a str,
    prefix: &'a str,
    limit: usize,
    /// True when `limit` names were found: there may be more.
    truncated: bool,
    locks: Vec<Listed>,
}

/// Prints the locks held under a prefix, one line each (name, holder, token, lease left,
/// waiters where the backend tells), or one JSON object.
pub async fn list(args: ListArgs) -> CliResult {
    let locks = distlock::connect(&args.backend).await?;
    let limit = usize::try_from(args.limit).unwrap_or(distlock::MAX_LIST);
    let names = locks.list_held(&args.prefix, limit).await?;
    let mut listed = Vec::with_capacity(names.len());
    for name in &names {
        let info = match locks.inspect(name).await {
            Ok(info) => info,
            // A key the backend holds under a name distlock would refuse (left by another
            // program): listed, with nothing known about it.
            Err(error) if error.is_invalid_input() => distlock::backend::LockInfo::new(true),
            Err(error) => return Err(error.into()),
        };
        if !info.locked {
            // Released between the listing and this look.
            continue;
        }
        listed.push(Listed {
            lock: name.clone(),
            holder: info.holder,
            holds: info.holds,
            fencing_token: info.fencing_token,
            remaining_lease_ms: info
                .remaining_lease
                .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            waiters: info.waiters,
        });
    }
    let truncated = names.len() == limit;
    if args.json {
        let listing = Listing {
            backend: locks.backend_scheme(),
            prefix: &args.prefix,
            limit,
            truncated,
            locks: listed,
        };
        return json::print_fact("list", &listing);
    }
    let known = |value: Option<String>| value.unwrap_or_else(|| "unknown".to_owned());
    for lock in listed {
        println!(
            "{} holder={} fencing_token={} lease_left_ms={} waiters={}",
            lock.lock,
            known(lock.holder),
            known(lock.fencing_token.map(|t| t.to_string())),
            known(lock.remaining_lease_ms.map(|ms| ms.to_string())),
            known(lock.waiters.map(|w| w.to_string())),
        );
    }
    if truncated {
        eprintln!(
            "distlock: the first {limit} names; there may be more (--limit, or a longer prefix)"
        );
    }
    Ok(())
}

/// Frees the lock whoever holds it, and says whether it was held.
pub async fn force_unlock(args: LockArgs) -> CliResult {
    let locks = distlock::connect(&args.backend).await?;
    let freed = locks.force_unlock(&args.name).await?;
    println!("{}", if freed { "freed" } else { "was not locked" });
    Ok(())
}

/// Acquires (waiting at most `--max-ms`) the mutex, a semaphore permit, a read or write lock,
/// or an election's leadership, prints `{"fencing_token":N}` on one line, and holds until killed, until the lock is
/// lost (exit 1), or until `--max-ms` (exit 0).
pub async fn hold(args: HoldArgs) -> CliResult {
    let options = ConnectOptions::new().lease(Duration::from_millis(args.lease_ms));
    let locks = distlock::connect_with(&args.backend, options).await?;
    let wait = AcquireOptions::new().wait(Duration::from_millis(args.max_ms));
    let held = match args.kind {
        HoldKind::Mutex => Held::Guard(locks.mutex(args.name)?.acquire_with(wait).await?),
        HoldKind::Permit => Held::Guard(
            locks
                .semaphore(args.name, args.permits)?
                .acquire_with(wait)
                .await?,
        ),
        HoldKind::Read => Held::Read(locks.rwlock(args.name)?.read_with(wait).await?),
        HoldKind::Write => Held::Write(locks.rwlock(args.name)?.write_with(wait).await?),
        HoldKind::Leader => Held::Leader(
            locks
                .election(args.name)?
                .campaign_with(format!("distlock hold (pid {})", std::process::id()), wait)
                .await?,
        ),
    };
    println!(
        "{}",
        serde_json::json!({ "fencing_token": held.fencing_token() })
    );
    tokio::select! {
        lost = held.lost() => Err(Failure::failed(lost)),
        () = tokio::time::sleep(Duration::from_millis(args.max_ms)) => {
            held.release().await?;
            Ok(())
        }
    }
}

/// What `hold` holds.
enum Held {
    Guard(distlock::Guard),
    Read(distlock::ReadGuard),
    Write(distlock::WriteGuard),
    Leader(distlock::Leadership),
}

impl Held {
    fn fencing_token(&self) -> u64 {
        match self {
            Held::Guard(guard) => guard.fencing_token(),
            Held::Read(guard) => guard.fencing_token(),
            Held::Write(guard) => guard.fencing_token(),
            Held::Leader(leadership) => leadership.term(),
        }
    }

    async fn lost(&self) -> distlock::Error {
        match self {
            Held::Guard(guard) => guard.lost().await,
            Held::Read(guard) => guard.lost().await,
            Held::Write(guard) => guard.lost().await,
            Held::Leader(leadership) => leadership.lost().await,
        }
    }

    async fn release(self) -> distlock::Result<()> {
        match self {
            Held::Guard(guard) => guard.release().await,
            Held::Read(guard) => guard.release().await,
            Held::Write(guard) => guard.release().await,
            Held::Leader(leadership) => leadership.resign().await,
        }
    }
}
