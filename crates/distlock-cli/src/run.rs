//! `distlock run` and `distlock elect`: a command run while a lock (a semaphore permit, an
//! election's leadership) is held.
//!
//! `run` is `flock(1)` and `etcdctl lock NAME CMD` for every backend: scripts and cron jobs
//! that must not run twice at once, on one machine or many. `elect` runs a command only while
//! it leads an election.
//!
//! * The command gets `DISTLOCK_FENCING_TOKEN` (for `elect`: the term) and
//!   `DISTLOCK_LOCK_NAME`, with `--permits` `DISTLOCK_PERMITS`, with `elect`
//!   `DISTLOCK_LEADER_VALUE`; it inherits stdin, stdout and stderr.
//! * It runs in a process group of its own, dies with distlock (`PR_SET_PDEATHSIG`), and the
//!   signals distlock is sent are passed on to its group (see [`crate::child`]); the lock is
//!   held until it exits, then what it left in its group is ended and the lock given back.
//! * When the lock is lost while it runs, or `--max-run` ends, its group is sent SIGTERM at
//!   once and SIGKILL after `--grace`, and distlock exits 76 (124).
//! * A signal while connecting, waiting or in `--once-per`'s lower-bound wait ends distlock
//!   at once with 128 + N; a wait it drops leaves no queue entry behind, as distlock waits
//!   (briefly) for that clean-up before it exits.
//!
//! Exit codes ([`crate::failure::exit`]): the command's own code; 128 + N when a signal N
//! killed it (or ended distlock before the command ran); 0 when `--skip-if-held` found the
//! lock held; 1 a backend error; 2 bad input; 75 busy (held by another when `--wait` ran
//! out, or `-E N`); 76 lost (while the command ran, or found gone when given back); 124
//! `--max-run` ran out; 126 the command cannot be executed; 127 the command was not found.

use crate::exporter::MetricsArgs;
use distlock::Schedule;
use std::ffi::OsString;
use std::future::Future;
use std::time::Duration;

use clap::Args;
use distlock::{AcquireOptions, ConnectOptions, Locks};

use crate::child::{self, Ended, Signals, Stop};
use crate::failure::{CliResult, Failure, exit};

/// How long giving the lock back may take before distlock leaves it to its lease.
const GIVE_BACK_LIMIT: Duration = Duration::from_secs(10);

/// How long distlock waits, before it exits, for the work it left to the background (a
/// dropped wait's queue entry, a dropped request's undoing): a round trip, normally.
const CLEAN_UP_LIMIT: Duration = Duration::from_secs(5);

/// The same after a signal, which must end distlock at once.
const CLEAN_UP_LIMIT_SIGNALED: Duration = Duration::from_millis(500);

/// The lease when `--lease` is not given.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// `distlock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The backend URL, e.g. sqlite:///var/lib/app/locks.db.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// The lock name.
    pub name: String,
    /// Give up when the lock is still held by another after this long (500ms, 10s, 5m,
    /// 1h; 0s tries once), with exit 75. Default: wait without a limit (with
    /// --skip-if-held: try once).
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// When the lock is held by another (after --wait), exit 0 without running the command
    /// and without a word: for cron jobs that must not pile up.
    #[arg(short = 'n', long)]
    pub skip_if_held: bool,
    /// The exit code when the lock is held by another after --wait (flock's -E), instead of
    /// 75 (with --skip-if-held: instead of 0).
    #[arg(short = 'E', long, value_name = "N")]
    pub conflict_exit_code: Option<u8>,
    /// Take a permit of a semaphore of N permits instead of the lock: N commands at once.
    /// Every user of NAME must give the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(distlock::Semaphore::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// Run the command at most once per this interval across every host that runs this
    /// line (a cron job on a fleet; ShedLock's lock): the lock is tried once and, when held,
    /// distlock exits 0 without running the command. The lock is held at least 0.9 and at
    /// most 0.95 of the interval (`Schedule::at_most_once_per`): a command still running at
    /// the upper bound is stopped as on a loss, and distlock stays until the lower bound has
    /// passed after a shorter command. At least 1s.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, conflicts_with_all = ["wait", "permits", "skip_if_held"])]
    pub once_per: Option<Duration>,
    #[command(flatten)]
    pub held: HeldArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

/// `distlock elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The backend URL, e.g. sqlite:///var/lib/app/locks.db.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// The election's name.
    pub name: String,
    /// What this candidate publishes as leader (who to reach, at most 4 KiB). Default:
    /// HOSTNAME:PID.
    #[arg(long)]
    pub value: Option<String>,
    #[command(flatten)]
    pub held: HeldArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

/// What `run` and `elect` share: how the lock is held and how the command is stopped.
#[derive(Debug, Args)]
pub struct HeldArgs {
    /// When the lock is lost (or --max-run ends) while the command runs, its process group
    /// is sent SIGTERM at once, and SIGKILL if still running this long after.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// How long after a crash of distlock (SIGKILL, a lost host) the lock frees, on every
    /// backend: the lease, renewed every third of it while the command runs (on ZooKeeper
    /// and etcd, the session timeout or lease TTL of this client; rounded up to whole
    /// seconds on etcd). Default: 30s, or the URL's session_timeout= / lease_ttl=.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Stop the command after this long, as on a loss (SIGTERM, then SIGKILL after --grace),
    /// and exit 124: a hung job does not keep the lock forever (ShedLock's lock-at-most).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_run: Option<Duration>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// `distlock run`: see the module docs.
pub async fn run(args: RunArgs) -> CliResult {
    let mut signals = Signals::install()?;
    let locks = connect(&args.backend, &args.held, &mut signals).await?;
    let outcome = run_locked(&args, &locks, &mut signals).await;
    clean_up(&locks, &mut signals).await;
    outcome
}

async fn run_locked(args: &RunArgs, locks: &Locks, signals: &mut Signals) -> CliResult {
    let _exporter = crate::exporter::serve(&args.held.metrics).await?;
    let schedule = args.once_per.map(Schedule::at_most_once_per);
    // A scheduled run tries once and, held, is skipped quietly (another host ran it).
    let skip_if_held = args.skip_if_held || schedule.is_some();
    let wait = args.wait.or_else(|| skip_if_held.then_some(Duration::ZERO));
    let mut options =
        wait.map_or_else(AcquireOptions::new, |wait| AcquireOptions::new().wait(wait));
    if let Some(schedule) = schedule {
        options = options.lease(schedule.hold_at_most_for());
    }
    let name = args.name.as_str();
    let acquire = async {
        match args.permits {
            None => locks.mutex(name)?.acquire_with(options).await,
            Some(permits) => locks.semaphore(name, permits)?.acquire_with(options).await,
        }
    };
    // Dropping the acquisition on a signal leaves nothing behind (it is cancel safe, and
    // `run` waits for its clean-up before it exits).
    let acquired = until_signal(signals, acquire).await?;
    let guard = match acquired {
        Ok(guard) => guard,
        Err(error) if error.is_timeout() => {
            let waited = match wait {
                Some(wait) if !wait.is_zero() => format!("waited {}", human(wait)),
                _ => "tried once".to_owned(),
            };
            let held = match args.permits {
                None => format!("lock {name:?} is held by another"),
                Some(permits) => format!("all {permits} permits of {name:?} are held by others"),
            };
            return match (args.conflict_exit_code, skip_if_held) {
                (Some(code), _) => {
                    tracing::info!("{held} ({waited}): exit {code}");
                    if code == exit::SUCCESS {
                        Ok(())
                    } else {
                        Err(Failure::Exit(code))
                    }
                }
                (None, true) => {
                    tracing::info!("skipped: {held} ({waited})");
                    Ok(())
                }
                (None, false) => Err(Failure::Busy(format!("{held} ({waited})"))),
            };
        }
        Err(error) => return Err(error.into()),
    };
    let granted = tokio::time::Instant::now();
    let token = guard.fencing_token();
    tracing::info!(
        lock = guard.name(),
        token,
        "holding the lock; starting the command"
    );
    let mut env = vec![
        ("DISTLOCK_FENCING_TOKEN", token.to_string()),
        ("DISTLOCK_LOCK_NAME", args.name.clone()),
    ];
    if let Some(permits) = args.permits {
        env.push(("DISTLOCK_PERMITS", permits.to_string()));
    }
    let ended = match child::spawn(&args.command, &env) {
        Ok(command) => {
            child::supervise(
                command,
                signals,
                guard.lost(),
                args.held.max_run,
                args.held.grace,
            )
            .await
        }
        Err(failure) => Err(failure),
    };
    if let Some(schedule) = schedule {
        // Held until the lower bound, from the grant: hosts whose cron fires a little later
        // find it held and skip. (This process keeps the hold, as the backends that keep
        // leases in the client need.) A signal ends the wait: the fixed lease still runs
        // out on the server by itself.
        let left = schedule
            .hold_at_least_for()
            .saturating_sub(granted.elapsed());
        let signaled = tokio::select! {
            () = tokio::time::sleep(left) => None,
            _ = guard.lost() => None,
            received = signals.recv() => {
                signals.note_ended_work();
                Some(received)
            }
        };
        // The fixed lease (the upper bound) ran out after the command ended: that is the
        // hold ending as scheduled, not a loss of the command's protection.
        let ran_out = guard.loss_reason() == Some(distlock::LossReason::LeaseRanOut);
        if matches!(ended, Ok(child::Ended::Exited(_))) && (ran_out || signaled.is_some()) {
            // Not released (a release would free the server's lease early): it runs out.
            std::mem::forget(guard);
            if let Some(received) = signaled {
                return Err(Failure::Exit(exit::signaled(received.number)));
            }
            return conclude(
                &format!("lock {name:?}"),
                ended,
                Ok(Ok(())),
                args.held.grace,
            );
        }
    }
    let given_back = tokio::time::timeout(GIVE_BACK_LIMIT, guard.release()).await;
    conclude(
        &format!("lock {name:?}"),
        ended,
        given_back,
        args.held.grace,
    )
}

/// `distlock elect`: see the module docs.
pub async fn elect(args: ElectArgs) -> CliResult {
    let mut signals = Signals::install()?;
    let locks = connect(&args.backend, &args.held, &mut signals).await?;
    let outcome = elect_leading(&args, &locks, &mut signals).await;
    clean_up(&locks, &mut signals).await;
    outcome
}

async fn elect_leading(args: &ElectArgs, locks: &Locks, signals: &mut Signals) -> CliResult {
    let _exporter = crate::exporter::serve(&args.held.metrics).await?;
    let election = locks.election(args.name.as_str())?;
    let value = args.value.clone().unwrap_or_else(default_value);
    tracing::info!(
        election = election.name(),
        lock = election.lock_name(),
        %value,
        "campaigning"
    );
    let leadership = until_signal(signals, election.campaign(value.as_str())).await??;
    tracing::info!(term = leadership.term(), "elected; starting the command");
    let env = [
        ("DISTLOCK_FENCING_TOKEN", leadership.term().to_string()),
        ("DISTLOCK_LOCK_NAME", args.name.clone()),
        ("DISTLOCK_LEADER_VALUE", value),
    ];
    let ended = match child::spawn(&args.command, &env) {
        Ok(command) => {
            child::supervise(
                command,
                signals,
                leadership.lost(),
                args.held.max_run,
                args.held.grace,
            )
            .await
        }
        Err(failure) => Err(failure),
    };
    let given_back = tokio::time::timeout(GIVE_BACK_LIMIT, leadership.resign()).await;
    conclude(
        &format!("the leadership of {:?}", args.name),
        ended,
        given_back,
        args.held.grace,
    )
}

/// `work`'s output, or exit 128+N when signal N comes first (`work` is dropped).
async fn until_signal<T>(signals: &mut Signals, work: impl Future<Output = T>) -> CliResult<T> {
    tokio::select! {
        done = work => Ok(done),
        received = signals.recv() => {
            signals.note_ended_work();
            Err(Failure::Exit(exit::signaled(received.number)))
        }
    }
}

/// Connects for `run` and `elect`, ended by a signal: the URL's checks, `--lease` as the
/// backend takes it, and a refusal of a backend that shares nothing between processes.
async fn connect(url: &str, held: &HeldArgs, signals: &mut Signals) -> CliResult<Locks> {
    let url = lease_url(url, held.lease)?;
    let lease = held.lease.unwrap_or(DEFAULT_LEASE);
    until_signal(
        signals,
        distlock::connect_with(&url, ConnectOptions::new().lease(lease)),
    )
    .await?
    .map_err(Failure::from)
}

/// `url` checked for `run`, `elect` and `check`, and where the backend's session decides
/// when a crashed holder's locks free (the scheme's `session_lease`), with `lease` (or the
/// default) as that option: `--lease` means the same on every backend.
pub fn lease_url(url: &str, lease: Option<Duration>) -> CliResult<String> {
    let scheme = distlock::validate_url(url).map_err(Failure::usage)?;
    if scheme.process_local {
        return Err(Failure::usage(format!(
            "{}:// keeps its locks in one process, and this command coordinates processes: \
             give a shared backend, e.g. {}",
            scheme.name,
            distlock::scheme::SCHEMES
                .iter()
                .find(|other| !other.process_local && other.is_available())
                .map_or("sqlite:///var/lib/app/locks.db", |other| other.example)
        )));
    }
    let Some(key) = scheme.session_lease else {
        return Ok(url.to_owned());
    };
    let in_url = distlock::scheme::sets_option(url, key).map_err(Failure::usage)?;
    match (in_url, lease) {
        (true, Some(_)) => Err(Failure::usage(format!(
            "give the lease once: --lease, or {key}= in the URL (on {}://, they are the same \
             setting)",
            scheme.name
        ))),
        (true, None) => Ok(url.to_owned()),
        (false, lease) => {
            let ms = lease.unwrap_or(DEFAULT_LEASE).as_millis();
            let separator = if url.contains('?') { '&' } else { '?' };
            let with_lease = format!("{url}{separator}{key}={ms}ms");
            // A lease the backend's option does not take is the flag's fault, not the URL's.
            distlock::validate_url(&with_lease).map_err(|error| {
                Failure::usage(format!(
                    "--lease {}: on {}:// it is the {key}, and {error}",
                    human(lease.unwrap_or(DEFAULT_LEASE)),
                    scheme.name
                ))
            })?;
            Ok(with_lease)
        }
    }
}

/// Before distlock exits: waits for what it left to the background (a wait it dropped on a
/// signal leaves its queue entry to a clean-up), briefly after a signal; a second signal
/// ends the wait.
async fn clean_up(locks: &Locks, signals: &mut Signals) {
    let limit = if signals.ended_work() {
        CLEAN_UP_LIMIT_SIGNALED
    } else {
        CLEAN_UP_LIMIT
    };
    tokio::select! {
        _ = locks.wait_for_cleanups(limit) => {}
        _ = signals.recv() => {}
    }
}

/// distlock's outcome once the command has ended (or could not start) and the lock was given
/// back (`given_back`: the release's or resignation's result, or its time running out).
fn conclude(
    what: &str,
    ended: CliResult<Ended>,
    given_back: Result<distlock::Result<()>, tokio::time::error::Elapsed>,
    grace: Duration,
) -> CliResult {
    let status = match ended {
        Ok(Ended::Exited(status)) => status,
        Ok(Ended::Stopped {
            why,
            status,
            killed,
        }) => {
            let how = if killed {
                format!("SIGTERM, then SIGKILL after the {} grace,", human(grace))
            } else {
                "SIGTERM and".to_owned()
            };
            return Err(match why {
                Stop::Lost(loss) => Failure::Lost(format!(
                    "{loss}; the command was sent {how} {}",
                    child::describe(status)
                )),
                Stop::MaxRun(limit) => Failure::MaxRun(format!(
                    "the command ran for --max-run {}; it was sent {how} {}",
                    human(limit),
                    child::describe(status)
                )),
            });
        }
        // It could not start, or waiting for it failed: say so, whatever the release said.
        Err(failure) => {
            if let Ok(Err(error)) = &given_back
                && !error.is_lock_lost()
                && !error.is_not_owner()
            {
                eprintln!("distlock: warning: giving back {what} failed: {error}");
            }
            return Err(failure);
        }
    };
    let code = child::exit_code(status);
    match given_back {
        Ok(Ok(())) => {}
        Ok(Err(error)) if error.is_lock_lost() || error.is_not_owner() => {
            return Err(Failure::Lost(format!(
                "{what} was found gone when given back, after the command {}: its work may not \
                 have been protected to its end ({error})",
                child::describe(status)
            )));
        }
        // Held until the command ended (the loss was not seen); only the release failed, and
        // the lease frees the lock.
        Ok(Err(error)) => eprintln!(
            "distlock: warning: giving back {what} failed: {error}; it frees when its lease ends"
        ),
        Err(_) => eprintln!(
            "distlock: warning: giving back {what} took more than {}; it frees when its lease \
             ends",
            human(GIVE_BACK_LIMIT)
        ),
    }
    if code == exit::SUCCESS {
        Ok(())
    } else {
        Err(Failure::Exit(code))
    }
}

/// `HOSTNAME:PID`.
fn default_value() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `buffer.len()` bytes into the buffer.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let host = if result == 0 {
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    } else {
        "localhost".to_owned()
    };
    format!("{host}:{}", std::process::id())
}

/// Parses a duration written as a number and a unit: `500ms`, `10s`, `1.5s`, `5m`, `1h`. Zero
/// is accepted (`--wait 0s` tries once); more than a day is not.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const FORMAT: &str = "write a number and a unit: 500ms, 10s, 1.5s, 5m or 1h";
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_ms: u32 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" if !number.is_empty() => return Err(format!("{text:?} has no unit; {FORMAT}")),
        _ if number.is_empty() => return Err(format!("{text:?} is not a duration; {FORMAT}")),
        _ => return Err(format!("unknown unit {unit:?} in {text:?}; {FORMAT}")),
    };
    let valid = number.split('.').all(|part| !part.is_empty()) && number.matches('.').count() <= 1;
    let value: f64 = match number.parse() {
        Ok(value) if valid => value,
        _ => return Err(format!("{text:?} is not a duration; {FORMAT}")),
    };
    let ms = (value * f64::from(unit_ms)).round();
    let max = distlock::AcquireOptions::MAX_DURATION.as_millis() as f64;
    if ms > max {
        return Err(format!("{text:?} is longer than a day (24h)"));
    }
    if ms == 0.0 && value != 0.0 {
        return Err(format!("{text:?} is shorter than a millisecond"));
    }
    // In 0..=a day's milliseconds, whole: the cast is exact.
    Ok(Duration::from_millis(ms as u64))
}

/// The interval of `--once-per`: a duration of at least a second (below that, the client's
/// allowance for clock drift and a round trip eat the gap between the two bounds).
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_secs(1) {
        return Err(format!(
            "{text:?} is shorter than the shortest interval, 1s"
        ));
    }
    Ok(interval)
}

/// A duration as `parse_duration` reads it: `200ms`, `2s`, `1.5s`, `5m`, `1h`.
pub fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{}s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("500ms", ms(500)),
            ("10s", ms(10_000)),
            ("1.5s", ms(1_500)),
            ("5m", ms(300_000)),
            ("1h", ms(3_600_000)),
            ("24h", ms(86_400_000)),
            ("0s", ms(0)),
            ("0ms", ms(0)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
            assert_eq!(parse_duration(&human(expected)), Ok(expected), "{text}");
        }
        for bad in [
            "", "10", "-1s", "s", "1.s", ".5s", "1..5s", "1.2.3s", "5 s", "5sec", "1d", "25h",
            "0.1ms", "1e3s", "NaNs", "infs", "abc",
        ] {
            let error = parse_duration(bad).expect_err(bad);
            assert!(!error.contains('\n'), "{bad}: {error}");
        }
    }

    #[test]
    fn durations_print_as_they_are_written() {
        assert_eq!(human(Duration::from_millis(200)), "200ms");
        assert_eq!(human(Duration::from_secs(2)), "2s");
        assert_eq!(human(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(7_200)), "2h");
    }
}
