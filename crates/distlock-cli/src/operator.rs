//! Operator commands, and `hold` for cross-process tests.

use std::time::Duration;

use distlock::{AcquireOptions, ConnectOptions};
use serde::Serialize;

use distlock::Described;
use futures_util::StreamExt;

use crate::cli::{HoldArgs, HoldKind, LeaderArgs, ListArgs, LockArgs, StatusArgs};
use crate::failure::{CliResult, Failure};
use crate::json;

/// What `status --json` answers; a field the backend cannot tell is null.
#[derive(Debug, Default, Serialize)]
struct Status<'a> {
    lock: &'a str,
    /// The backend's URL scheme, e.g. `redis`.
    backend: &'a str,
    /// What the name is used as now: `free`, `mutex`, `semaphore`, `rwlock` or `election`.
    kind: &'static str,
    locked: bool,
    holder: Option<String>,
    holds: Option<u32>,
    fencing_token: Option<u64>,
    remaining_lease_ms: Option<u64>,
    waiters: Option<u64>,
    /// A semaphore's registered count.
    permits: Option<u32>,
    /// A semaphore's permit holders, or a reader-writer lock's readers.
    holders: Option<Vec<Holder>>,
    /// A reader-writer lock's writer.
    writer: Option<Holder>,
    /// An election's leader.
    leader: Option<LeaderStatus>,
}

/// One holder of a permit, a read or a write.
#[derive(Debug, Serialize)]
struct Holder {
    holder: Option<String>,
    fencing_token: Option<u64>,
    remaining_lease_ms: Option<u64>,
}

impl From<distlock::backend::LockInfo> for Holder {
    fn from(info: distlock::backend::LockInfo) -> Self {
        Holder {
            holder: info.holder,
            fencing_token: info.fencing_token,
            remaining_lease_ms: info.remaining_lease.map(millis),
        }
    }
}

/// An election's leader.
#[derive(Debug, Serialize)]
struct LeaderStatus {
    value: String,
    term: u64,
    holder: String,
}

impl From<distlock::Leader> for LeaderStatus {
    fn from(leader: distlock::Leader) -> Self {
        LeaderStatus {
            value: leader.value,
            term: leader.term,
            holder: leader.holder,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `text` as it is when it is one plain word; quoted, with control characters, quotes and
/// backslashes escaped, otherwise: a name or value cannot forge a field or a line.
pub fn shown(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && !matches!(c, '"' | '\\' | '='));
    if plain {
        text.to_owned()
    } else {
        format!("{text:?}")
    }
}

/// What the backend did not tell.
fn known(value: Option<String>) -> String {
    value.unwrap_or_else(|| "unknown".to_owned())
}

/// Prints what the name is used as and what the backend can tell about it (`status` of a
/// mutex, a semaphore, a reader-writer lock or an election), or one JSON object.
pub async fn status(args: StatusArgs) -> CliResult {
    let StatusArgs { lock, json } = args;
    let locks = distlock::connect(&lock.backend).await?;
    let described = locks.describe(&lock.name).await?;
    let mut status = Status {
        lock: &lock.name,
        backend: locks.backend_scheme(),
        ..Status::default()
    };
    let line = match described {
        Described::Free { waiters } => {
            status.kind = "free";
            status.waiters = waiters;
            format!("free waiters={}", known(waiters.map(|w| w.to_string())))
        }
        Described::Mutex(info) => {
            status.kind = "mutex";
            status.locked = true;
            status.holder = info.holder;
            status.holds = info.holds;
            status.fencing_token = info.fencing_token;
            status.remaining_lease_ms = info.remaining_lease.map(millis);
            status.waiters = info.waiters;
            format!(
                "locked holder={} holds={} fencing_token={} lease_left_ms={} waiters={}",
                known(status.holder.as_deref().map(shown)),
                known(status.holds.map(|h| h.to_string())),
                known(status.fencing_token.map(|t| t.to_string())),
                known(status.remaining_lease_ms.map(|ms| ms.to_string())),
                known(status.waiters.map(|w| w.to_string())),
            )
        }
        Described::Semaphore { permits, holders } => {
            status.kind = "semaphore";
            status.locked = holders.len() >= usize::try_from(permits).unwrap_or(usize::MAX);
            status.permits = Some(permits);
            let holders: Vec<Holder> = holders.into_iter().map(Holder::from).collect();
            let line = format!(
                "semaphore permits_held={}/{permits} holders={}",
                holders.len(),
                holder_list(&holders)
            );
            status.holders = Some(holders);
            line
        }
        Described::RwLock { writer, readers } => {
            status.kind = "rwlock";
            status.locked = true;
            let readers: Vec<Holder> = readers.into_iter().map(Holder::from).collect();
            let writer = writer.map(Holder::from);
            let line = format!(
                "rwlock writer={} readers={} reader_holders={}",
                writer.as_ref().map_or_else(
                    || "none".to_owned(),
                    |writer| known(writer.holder.as_deref().map(shown))
                ),
                readers.len(),
                holder_list(&readers)
            );
            status.writer = writer;
            status.holders = Some(readers);
            line
        }
        Described::Election(leader) => {
            status.kind = "election";
            status.locked = true;
            let line = format!(
                "election leader={} term={} holder={}",
                shown(&leader.value),
                leader.term,
                shown(&leader.holder)
            );
            status.fencing_token = Some(leader.term);
            status.leader = Some(leader.into());
            line
        }
        _ => {
            status.kind = "unknown";
            "unknown".to_owned()
        }
    };
    if json {
        return json::print_fact("status", &status);
    }
    println!("{line}");
    Ok(())
}

/// `h1,h2,...` (escaped), or `none`.
fn holder_list(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return "none".to_owned();
    }
    holders
        .iter()
        .map(|h| known(h.holder.as_deref().map(shown)))
        .collect::<Vec<_>>()
        .join(",")
}

/// `distlock leader NAME`: prints who leads the election (`leader value=V term=T holder=H`,
/// or `none`), with `--watch` each change until a signal, or one JSON object per line.
pub async fn leader(args: LeaderArgs) -> CliResult {
    let locks = distlock::connect(&args.lock.backend).await?;
    let election = locks.election(args.lock.name.as_str())?;
    let print = |leader: Option<distlock::Leader>| -> CliResult {
        if args.json {
            let leader = leader.map(LeaderStatus::from);
            return json::print_fact("leader", &serde_json::json!({ "leader": leader }));
        }
        match leader {
            None => println!("none"),
            Some(leader) => println!(
                "leader value={} term={} holder={}",
                shown(&leader.value),
                leader.term,
                shown(&leader.holder)
            ),
        }
        Ok(())
    };
    if !args.watch {
        return print(election.leader().await?);
    }
    let mut changes = Box::pin(election.observe());
    let mut stop = Box::pin(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok::<(), std::io::Error>(())
    });
    loop {
        tokio::select! {
            stopped = &mut stop => return stopped.map_err(Failure::from),
            next = changes.next() => match next {
                Some(Ok(leader)) => print(leader)?,
                Some(Err(error)) => eprintln!("distlock: warning: {error}"),
                None => return Ok(()),
            },
        }
    }
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
    let limit = usize::try_from(args.limit).unwrap_or(distlock::Locks::MAX_LIST);
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
    for lock in listed {
        println!(
            "{} holder={} fencing_token={} lease_left_ms={} waiters={}",
            shown(&lock.lock),
            known(lock.holder.as_deref().map(shown)),
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
