//! `distlock check`: tells an operator whether *their* deployment keeps distlock's promises.
//!
//! Worker processes (this binary, hidden `check-worker` subcommand) take one lock over and
//! over; under it they do a fenced read-modify-write (+1) on a register in an SQLite file and
//! log every grant, write and end, with its time, to a file of their own, line by line, so
//! that a killed worker's history survives it. Meanwhile the checker injects the faults a
//! client side can cause: it stops a worker (SIGSTOP) for longer than its lease and lets it
//! go on, or kills it (SIGKILL) and starts another; through loopback proxies of each worker's
//! own ([`network`]) it cuts the holder's connections, partitions it from the server past its
//! lease, or loses the reply of its next request. Then it judges the whole history
//! ([`history::check`]).

mod history;
mod network;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::stock::{SqliteDurability, SqliteStockStore, StockStore};
use distlock::{AcquireOptions, ConnectOptions};
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::cli::{CheckArgs, CheckFault, CheckWorkerArgs};
use crate::failure::{CliResult, Failure};
use crate::progress::Progress;
use history::{Event, Fault, Verdict};
use network::Proxies;

/// The register item in the SQLite file.
const REGISTER: &str = "distlock-check";
/// How long a worker waits for the lock before it asks again.
const WAIT: Duration = Duration::from_secs(30);
/// How long the checker waits for a long hold to partition before it lets that fault go.
const LONG_HOLD_PATIENCE: Duration = Duration::from_secs(5);
/// How long after the run's end the workers may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(60);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What `check --json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    backend: &'a str,
    workers: u32,
    seconds: f64,
    /// How many faults of each kind were injected.
    faults: std::collections::BTreeMap<&'static str, u64>,
    /// Replies the proxies kept from the workers (a lose-reply fault waits for a request).
    replies_lost: u64,
    /// The backend's documented limit that allows overlaps (then reported, not violations).
    overlap_limit: Option<&'static str>,
    #[serde(flatten)]
    verdict: &'a Verdict,
}

/// Where worker `id` serves its metrics when the checker serves at `checker`: the next
/// ports, or a free port (printed by the worker) when the checker's is 0 or the next one
/// would be past the last port (a replacement worker's id keeps growing).
fn worker_metrics_addr(
    checker: Option<std::net::SocketAddr>,
    id: u32,
) -> Option<std::net::SocketAddr> {
    let mut addr = checker?;
    if addr.port() != 0 {
        let port = u32::from(addr.port()) + 1 + id;
        addr.set_port(u16::try_from(port).unwrap_or(0));
    }
    Some(addr)
}

struct Running {
    id: u32,
    child: Child,
    /// The worker's proxies, when network faults are on.
    proxies: Option<Proxies>,
}

/// What every worker process is started with.
struct Spawner<'a> {
    args: &'a CheckArgs,
    name: String,
    dir: &'a Path,
    store_path: PathBuf,
    stop_path: PathBuf,
    until: u64,
    /// Route each worker through proxies of its own.
    proxied: bool,
}

/// Makes `--log-dir` (or takes it when it exists and is empty): one run's files only.
fn prepare_log_dir(dir: &Path) -> CliResult {
    std::fs::create_dir_all(dir).map_err(|e| {
        Failure::usage(format!(
            "--log-dir {}: cannot create it: {e}",
            dir.display()
        ))
    })?;
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::usage(format!("--log-dir {}: cannot read it: {e}", dir.display())))?;
    if entries.next().is_some() {
        return Err(Failure::usage(format!(
            "--log-dir {}: not empty; give a new or empty directory, so that one run's history is not mixed with another's",
            dir.display()
        )));
    }
    Ok(())
}

/// Checks that every namespace of `--worker-netns` can be entered, before any worker starts.
fn check_namespaces(namespaces: &[String]) -> CliResult {
    for ns in namespaces {
        if ns.is_empty() || ns.contains('/') || ns == "." || ns == ".." {
            return Err(Failure::usage(format!(
                "--worker-netns {ns:?}: not a network namespace name"
            )));
        }
        let entered = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output();
        match entered {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                return Err(Failure::usage(format!(
                    "--worker-netns {ns:?}: cannot enter it (`ip netns exec {ns} true`: {}); it must exist (`ip netns add {ns}`) and this must run as root",
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
            Err(error) => {
                return Err(Failure::usage(format!(
                    "--worker-netns needs the `ip` command (iproute2): {error}"
                )));
            }
        }
    }
    Ok(())
}

impl Spawner<'_> {
    async fn spawn(&self, id: u32) -> CliResult<Running> {
        let args = self.args;
        let (proxies, backend) = if self.proxied {
            let (proxies, url) = Proxies::start(&args.backend).await?;
            (Some(proxies), url)
        } else {
            (None, args.backend.clone())
        };
        let exe = std::env::current_exe()
            .map_err(|e| Failure::failed(format!("cannot find the distlock binary: {e}")))?;
        let mut command = if self.args.worker_netns.is_empty() {
            Command::new(exe)
        } else {
            let namespaces = &self.args.worker_netns;
            let ns = &namespaces[id as usize % namespaces.len()];
            // `ip netns exec` enters the namespace and execs the worker: the child's process
            // id is the worker's, for the pauses and kills.
            let mut command = Command::new("ip");
            command.args(["netns", "exec", ns]).arg(exe);
            command
        };
        command.arg("check-worker");
        if args.unfenced {
            command.arg("--unfenced");
        }
        if let Some(addr) = worker_metrics_addr(args.metrics.metrics_addr, id) {
            command.arg("--metrics-addr").arg(addr.to_string());
        }
        // The URL in the worker's environment, off its command line.
        crate::workers::own_worker_args(
            command.as_std_mut(),
            &["--backend".to_owned(), backend.clone()],
        );
        let child = command
            .args(["--name", &self.name])
            .arg("--store")
            .arg(&self.store_path)
            .arg("--log")
            .arg(log_path(self.dir, id))
            .args(["--id", &id.to_string()])
            .args(["--until-us", &self.until.to_string()])
            .args(["--max", &args.acquisitions.to_string()])
            .arg("--stop")
            .arg(&self.stop_path)
            .args(["--lease-ms", &args.lease_ms.to_string()])
            .args(["--hold-us", &args.hold_us.to_string()])
            .arg("--long-flag")
            .arg(long_flag(self.dir, id))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Losses are expected here (the checker causes them): only errors are worth a line.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            // Only the processes this check started are ended, by their own handles.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::failed(format!("cannot start a worker process: {e}")))?;
        Ok(Running { id, child, proxies })
    }
}

pub async fn run(mut args: CheckArgs) -> CliResult {
    args.faults.retain(|fault| *fault != CheckFault::None);
    if args.lease_ms < 100 {
        return Err(Failure::usage("--lease-ms must be at least 100"));
    }
    // A malformed URL is bad input (exit 2), found before anything starts.
    let scheme = distlock::validate_url(&args.backend).map_err(Failure::usage)?;
    if scheme.process_local && !args.allow_unshared {
        return Err(Failure::usage(format!(
            "{}:// keeps its locks in each worker process: the check needs a backend its \
             worker processes share",
            scheme.name
        )));
    }
    let proxied = args.faults.iter().any(|fault| fault.is_network());
    if proxied {
        Proxies::check_url(&args.backend)?;
        if !args.worker_netns.is_empty() {
            return Err(Failure::usage(
                "the network faults (cut, partition, lose-reply) run through loopback proxies in the checker's namespace: not with --worker-netns",
            ));
        }
    }
    check_namespaces(&args.worker_netns)?;
    let limit = scheme.overlap_limit;
    let temporary;
    let dir: &Path = match &args.log_dir {
        Some(dir) => {
            prepare_log_dir(dir)?;
            dir
        }
        None => {
            temporary = tempfile::tempdir()?;
            temporary.path()
        }
    };
    let _exporter = crate::exporter::serve(&args.metrics).await?;
    // The backend must answer before any worker starts.
    let locks = distlock::connect(&args.backend).await?;
    locks.ping().await?;
    let store_path = dir.join("register.db");
    let store = SqliteStockStore::open_with(&store_path, SqliteDurability::Normal)?;
    store.set(REGISTER, 0).await?;
    let name = format!("distlock-check/{}", uuid_like());
    let run_for = Duration::from_secs(args.duration_s);
    let until = now_us() + u64::try_from(run_for.as_micros()).unwrap_or(u64::MAX);
    // Created when the run has made its acquisitions: the workers stop at their next one.
    let stop_path = dir.join("stop");

    // Locks that end with their connection: a cut may let a rival in before lost() fires.
    // A session with a lease of its own (ZooKeeper's, etcd's) outlives a connection.
    let frees = locks.session().is_some() && scheme.session_lease.is_none();
    let spawner = Spawner {
        args: &args,
        name,
        dir,
        store_path,
        stop_path: stop_path.clone(),
        until,
        proxied,
    };
    let mut running = Vec::new();
    for id in 0..args.workers {
        running.push(spawner.spawn(id).await?);
    }
    let mut next_id = args.workers;
    let mut faults: Vec<Fault> = Vec::new();
    let mut gone_replies_lost = 0;
    let mut progress = Progress::new(!args.json);
    let started = std::time::Instant::now();
    let lease = Duration::from_millis(args.lease_ms);

    // Faults until the run's end, one at a time, a lease or two apart.
    while started.elapsed() < run_for {
        // Every acquisition writes the register once (or is refused, rarely): its value is
        // the count so far, close enough to stop by.
        let made = store.quantity(REGISTER).await.unwrap_or(0);
        if made >= args.acquisitions {
            break;
        }
        let by_time =
            started.elapsed().as_millis() as u64 * 1000 / run_for.as_millis().max(1) as u64;
        let by_count = made * 1000 / args.acquisitions.max(1);
        progress.show("checking", by_time.max(by_count), 1000);
        let gap = lease + Duration::from_millis(fastrand::u64(0..=args.lease_ms));
        tokio::time::sleep(gap.min(run_for.saturating_sub(started.elapsed()))).await;
        if args.faults.is_empty() || started.elapsed() >= run_for || running.is_empty() {
            continue;
        }
        let fault = args.faults[fastrand::usize(..args.faults.len())];
        let victim = if fault == CheckFault::Partition {
            // A hold that outlasts its lease: the partition must catch the holder inside it.
            let Some(victim) = long_holder(dir, &running).await? else {
                continue;
            };
            victim
        } else {
            holding(dir, &running).unwrap_or_else(|| fastrand::usize(..running.len()))
        };
        let Some(pid) = running[victim].child.id() else {
            continue;
        };
        match fault {
            CheckFault::Pause => {
                let from = now_us();
                signal(pid, libc::SIGSTOP)?;
                // Past its lease, so that another worker may be granted the lock meanwhile.
                tokio::time::sleep(lease + Duration::from_millis(300)).await;
                signal(pid, libc::SIGCONT)?;
                faults.push(Fault::Pause {
                    w: running[victim].id,
                    from,
                    to: now_us(),
                });
            }
            CheckFault::Kill => {
                let at = now_us();
                let mut gone = running.swap_remove(victim);
                gone_replies_lost += gone.proxies.as_ref().map_or(0, Proxies::replies_lost);
                gone.child.kill().await?;
                faults.push(Fault::Kill { w: gone.id, at });
                if started.elapsed() + lease < run_for {
                    running.push(spawner.spawn(next_id).await?);
                    next_id += 1;
                }
            }
            network => {
                let worker = &running[victim];
                let Some(proxies) = &worker.proxies else {
                    continue;
                };
                let (w, at) = (worker.id, now_us());
                faults.push(match network {
                    CheckFault::Cut => {
                        proxies.cut();
                        Fault::Cut { w, at, frees }
                    }
                    CheckFault::LoseReply => {
                        proxies.lose_next_reply();
                        Fault::LostReply { w, at, frees }
                    }
                    _ => {
                        proxies.partition();
                        // Past its lease: the server may end it and grant another meanwhile.
                        tokio::time::sleep(lease + Duration::from_millis(300)).await;
                        proxies.heal();
                        Fault::Partition {
                            w,
                            from: at,
                            to: now_us(),
                        }
                    }
                });
            }
        }
    }
    progress.finish();
    std::fs::write(&stop_path, b"")?;
    let replies_lost = running
        .iter()
        .filter_map(|w| w.proxies.as_ref())
        .map(Proxies::replies_lost)
        .sum::<u64>()
        + gone_replies_lost;
    for mut worker in running {
        match tokio::time::timeout(STOP_GRACE, worker.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                return Err(Failure::failed(format!(
                    "worker {} exited with {status}",
                    worker.id
                )));
            }
            Ok(Err(error)) => return Err(error.into()),
            Err(_) => {
                return Err(Failure::failed(format!(
                    "worker {} did not stop within {STOP_GRACE:?} of the run's end",
                    worker.id
                )));
            }
        }
    }

    let mut events = Vec::new();
    for id in 0..next_id {
        read_log(&log_path(dir, id), &mut events)?;
    }
    let register = store.quantity(REGISTER).await?;
    let verdict = history::check(&events, &faults, register, limit.is_some());
    // A fault asked for and never made is reported as 0, not left out.
    let mut counts: std::collections::BTreeMap<&'static str, u64> = args
        .faults
        .iter()
        .filter_map(|fault| {
            let name = crate::cli::value_name(fault);
            Fault::KINDS.iter().copied().find(|kind| *kind == name)
        })
        .map(|kind| (kind, 0))
        .collect();
    for fault in &faults {
        *counts.entry(fault.kind()).or_insert(0) += 1;
    }
    let shown = distlock::redact_url(&args.backend);
    let report = Report {
        backend: &shown,
        workers: args.workers,
        seconds: started.elapsed().as_secs_f64(),
        faults: counts,
        replies_lost,
        overlap_limit: limit,
        verdict: &verdict,
    };
    if args.json {
        let line = serde_json::to_string(&report)
            .map_err(|e| Failure::failed(format!("cannot encode the report: {e}")))?;
        println!("{line}");
    } else {
        print_table(&report);
    }
    if verdict.violations.is_empty() {
        Ok(())
    } else {
        Err(Failure::failed(format!(
            "{} violation(s) of distlock's promises",
            verdict.violations.len()
        )))
    }
}

fn print_table(report: &Report<'_>) {
    let v = report.verdict;
    println!("distlock check on {}", report.backend);
    println!("  {:<34} {}", "worker processes", report.workers);
    println!("  {:<34} {:.1}", "seconds", report.seconds);
    println!("  {:<34} {}", "acquisitions", v.acquisitions);
    for (kind, label) in [
        ("pause", "holders paused past their lease"),
        ("kill", "holders killed"),
        ("cut", "holders' connections cut"),
        ("partition", "holders partitioned past lease"),
        ("lose-reply", "holders' replies lost"),
    ] {
        if let Some(count) = report.faults.get(kind) {
            println!("  {:<34} {count}", label);
        }
    }
    if report.faults.contains_key("lose-reply") {
        println!(
            "  {:<34} {}",
            "replies lost (in flight)", report.replies_lost
        );
    }
    println!("  {:<34} {}", "losses reported (lost())", v.losses_reported);
    println!("  {:<34} {}", "writes accepted", v.writes_accepted);
    println!(
        "  {:<34} {}",
        "stale writes refused by fencing", v.stale_writes_refused
    );
    println!(
        "  {:<34} {}",
        "writes of killed holders, unknown", v.writes_unknown
    );
    println!(
        "  {:<34} {}",
        "overlaps after a fault (fenced)", v.overlaps_excused
    );
    println!(
        "  {:<34} {}",
        "overlaps no fault explains", v.overlaps_unexcused
    );
    println!(
        "  {:<34} {}",
        "  of them, earlier write fenced", v.overlaps_unexcused_fenced
    );
    if let Some(limit) = report.overlap_limit {
        println!("  {:<34} {limit}", "overlaps allowed by");
        for overlap in v.overlaps.iter().take(5) {
            println!("    - {overlap}");
        }
    }
    println!("  {:<34} {}", "register", v.register);
    println!("  {:<34} {}", "unfenced violations", v.unfenced_violations);
    println!("  {:<34} {}", "violations", v.violations.len());
    for violation in v.violations.iter().take(20) {
        println!("    - {violation}");
    }
    if v.violations.len() > 20 {
        println!("    ... and {} more", v.violations.len() - 20);
    }
}

fn signal(pid: u32, signal: libc::c_int) -> CliResult {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| Failure::failed(format!("process id {pid} out of range")))?;
    // SAFETY: kill(2) with a process id this checker started and has not reaped yet.
    let result = unsafe { libc::kill(pid, signal) };
    if result == 0 {
        Ok(())
    } else {
        Err(Failure::failed(format!(
            "cannot signal worker process {pid}: {}",
            std::io::Error::last_os_error()
        )))
    }
}

/// The index of a running worker that holds the lock now, by the last line of its log (a
/// grant not yet ended; a worker still asking does not count): faults on a holder are the
/// ones that test the promises.
fn holding(dir: &Path, running: &[Running]) -> Option<usize> {
    running.iter().position(|worker| {
        matches!(
            last_event(dir, worker.id),
            Some(
                Event::Grant { .. }
                    | Event::Long { .. }
                    | Event::WriteBegin { .. }
                    | Event::Write { .. }
            )
        )
    })
}

/// Asks a random worker for a long hold at its next grant and waits (up to
/// [`LONG_HOLD_PATIENCE`]) until it has begun; `None` when it did not in time.
async fn long_holder(dir: &Path, running: &[Running]) -> CliResult<Option<usize>> {
    let chosen = fastrand::usize(..running.len());
    let flag = long_flag(dir, running[chosen].id);
    std::fs::write(&flag, b"")?;
    let deadline = std::time::Instant::now() + LONG_HOLD_PATIENCE;
    while std::time::Instant::now() < deadline {
        if matches!(
            last_event(dir, running[chosen].id),
            Some(Event::Long { .. })
        ) {
            return Ok(Some(chosen));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Not taken up in time: withdrawn, so that no long hold comes without its partition.
    let _ = std::fs::remove_file(&flag);
    Ok(None)
}

fn long_flag(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("long-{id}"))
}

/// The last whole event of a worker's log.
fn last_event(dir: &Path, id: u32) -> Option<Event> {
    let text = std::fs::read(log_path(dir, id)).ok()?;
    let tail = &text[text.len().saturating_sub(256)..];
    let last = tail.split(|&b| b == b'\n').rfind(|line| !line.is_empty())?;
    serde_json::from_slice::<Event>(last).ok()
}

fn log_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("worker-{id}.jsonl"))
}

fn read_log(path: &Path, events: &mut Vec<Event>) -> CliResult {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        // A worker killed before it wrote anything.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    for line in text.lines() {
        // The last line of a killed worker may be cut short.
        if let Ok(event) = serde_json::from_str(line) {
            events.push(event);
        }
    }
    Ok(())
}

fn uuid_like() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// One worker process: takes the lock until the run ends or it made `--max` acquisitions.
pub async fn worker(args: CheckWorkerArgs) -> CliResult {
    // A worker whose metrics cannot be served still checks: the metrics are an extra.
    let _exporter = crate::exporter::serve(&args.metrics)
        .await
        .unwrap_or_else(|failure| {
            eprintln!("distlock: warning: worker {}: {failure}", args.id);
            None
        });
    // If the checker dies (Ctrl-C, killed), this worker must not live on, least of all
    // stopped by a pause that will never end: the kernel kills it with its parent.
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let locks = distlock::connect_with(
        &args.backend,
        ConnectOptions::new().lease(Duration::from_millis(args.lease_ms)),
    )
    .await?;
    let store: Arc<dyn StockStore> = Arc::new(SqliteStockStore::open_with(
        &args.store,
        SqliteDurability::Normal,
    )?);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)?;
    let mut record = |event: Event| -> CliResult {
        let line = serde_json::to_string(&event)
            .map_err(|e| Failure::failed(format!("cannot encode an event: {e}")))?;
        // One write per line: a killed worker leaves whole lines (but perhaps the last).
        log.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    };
    let mutex = locks.mutex(args.name.as_str())?;
    let w = args.id;
    let mut done = 0;
    while done < args.max && now_us() < args.until_us && !args.stop.exists() {
        record(Event::Ask { w, at: now_us() })?;
        // No wait past the run's end: a worker stuck behind a partition stops with the run.
        let left = Duration::from_micros(args.until_us.saturating_sub(now_us()));
        let wait = WAIT.min(left.max(Duration::from_millis(100)));
        let guard = match mutex.acquire_with(AcquireOptions::new().wait(wait)).await {
            Ok(guard) => guard,
            Err(error) if error.is_timeout() => continue,
            Err(error) => {
                tracing::warn!(%error, "acquire failed; trying again");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let token = guard.fencing_token();
        record(Event::Grant {
            w,
            token,
            at: now_us(),
        })?;
        record(Event::WriteBegin {
            w,
            token,
            at: now_us(),
        })?;
        let mut hold = Duration::from_micros(args.hold_us);
        if std::fs::remove_file(&args.long_flag).is_ok() {
            hold = hold.max(Duration::from_millis(args.lease_ms * 3 / 2));
            record(Event::Long {
                w,
                token,
                at: now_us(),
            })?;
        }
        // The read-modify-write, watching the guard: the moment lost() fires is part of the
        // history.
        let work = async {
            let read = if args.unfenced {
                store.quantity(REGISTER).await
            } else {
                store.read_fenced(REGISTER, token).await
            };
            match read {
                Ok(value) => {
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    if args.unfenced {
                        store.set(REGISTER, value + 1).await.is_ok()
                    } else {
                        store.write_fenced(REGISTER, value + 1, token).await.is_ok()
                    }
                }
                Err(_) => false,
            }
        };
        tokio::pin!(work);
        let mut lost_at = None;
        let ok = loop {
            tokio::select! {
                ok = &mut work => break ok,
                _ = guard.lost(), if lost_at.is_none() => lost_at = Some(now_us()),
            }
        };
        record(Event::Write {
            w,
            token,
            at: now_us(),
            ok,
        })?;
        if lost_at.is_none() && guard.is_lost() {
            lost_at = Some(now_us());
        }
        record(Event::End {
            w,
            token,
            at: now_us(),
            lost_at,
        })?;
        let _ = guard.release().await;
        done += 1;
    }
    Ok(())
}
