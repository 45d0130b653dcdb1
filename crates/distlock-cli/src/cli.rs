//! Command-line arguments and dispatch.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::demo::hot::HotStrategy;
use crate::demo::{Servers, Strategy};
use crate::exporter::MetricsArgs;
use crate::failure::CliResult;
use crate::failure::exit;
use crate::{bench, check, demo, operator, run};

/// Distributed locks: the overselling demo, the lock benchmark, operator commands.
///
/// Exit codes: 0 success, 1 the work failed, 2 bad input (`run` and `elect`: see their
/// --help).
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Several processes buy from one item's stock at once, under each locking strategy;
    /// shows which strategies oversell (`demo hot-item`: one lock against segments).
    Demo(Box<DemoCommand>),
    /// Measures a backend: round-trip time, uncontended acquire+release, and contention
    /// between worker processes, each against its same-run limit.
    Bench(BenchArgs),
    /// Tells what a name is used as now and by whom: a mutex and its holder, a semaphore's
    /// permits and their holders, a reader-writer lock's writer and readers, an election's
    /// leader, or free.
    Status(StatusArgs),
    /// Prints who leads an election (its published value, term and holder), with --watch
    /// each change.
    Leader(LeaderArgs),
    /// Lists the locks held, under a name prefix: each with its holder, fencing token, lease
    /// left and waiters where the backend tells.
    List(ListArgs),
    /// Frees a lock whoever holds it (operators only: the holder keeps working until it
    /// notices, and only fencing tokens stop its writes).
    ForceUnlock(LockArgs),
    /// Runs a command while holding a lock, so that one copy runs at a time everywhere.
    ///
    /// With --permits N, a permit of a semaphore of N instead: N copies at a time. The cron
    /// case: `distlock run --backend URL --skip-if-held nightly -- /usr/local/bin/report`.
    ///
    /// The command gets DISTLOCK_FENCING_TOKEN, DISTLOCK_LOCK_NAME (and DISTLOCK_PERMITS) in
    /// its environment, inherits stdin, stdout and stderr, and runs in a process group of its
    /// own (given the terminal when distlock has it). The HUP, INT, QUIT, TERM, USR1 and USR2
    /// distlock is sent are passed on to that group, and the lock is kept until the command
    /// exits; what it left running in its group is then ended. If the lock is lost while it
    /// runs, the group is sent SIGTERM at once and SIGKILL after --grace, and distlock exits
    /// 76. If distlock itself is killed, the kernel kills the command (PR_SET_PDEATHSIG).
    /// A signal while connecting or waiting ends distlock at once (128+N), leaving no queue
    /// entry behind. docs/run.md says what holds after each kind of death.
    #[command(after_long_help = exit::RUN_HELP)]
    Run(run::RunArgs),
    /// Campaigns for an election's leadership and runs a command while leader.
    ///
    /// The command gets DISTLOCK_FENCING_TOKEN (the term), DISTLOCK_LOCK_NAME (the election's
    /// name) and DISTLOCK_LEADER_VALUE in its environment. Signals are passed on as by `run`.
    /// If the leadership is lost, the command is sent SIGTERM at once and SIGKILL after
    /// --grace, and distlock exits 76; when the command exits, distlock resigns and exits with
    /// its code. It does not stand again afterwards: run it under a supervisor that restarts
    /// it (systemd `Restart=always`) to campaign again.
    #[command(after_long_help = exit::ELECT_HELP)]
    Elect(run::ElectArgs),
    /// Checks whether a deployment keeps distlock's promises: worker processes take one lock
    /// over and over and do fenced writes under it while the checker pauses and kills them
    /// (or, with `--faults none --worker-netns`, while partitions are made outside it); then
    /// the whole history is checked (exclusion, loss, fencing tokens, no lost update).
    /// Exit 0 when every promise held, 1 with the violations otherwise.
    Check(CheckArgs),
    /// Prints a shell's completion script: `distlock completions bash >
    /// /etc/bash_completion.d/distlock`, or zsh, fish, elvish, powershell.
    Completions(CompletionsArgs),
    /// Prints the manual page (roff): `distlock man > /usr/local/share/man/man1/distlock.1`.
    Man,
    /// Holds a lock until killed (for cross-process tests).
    #[command(hide = true)]
    Hold(HoldArgs),
    #[command(hide = true)]
    CheckWorker(CheckWorkerArgs),
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    #[command(hide = true)]
    DemoHotWorker(demo::hot::HotWorkerArgs),
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
}

/// `distlock demo`: the overselling demo, or with a subcommand another scenario.
///
/// The overselling flags and a scenario's subcommand exclude each other, so that a flag is
/// never silently ignored.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DemoCommand {
    #[command(subcommand)]
    pub scenario: Option<DemoScenario>,
    #[command(flatten)]
    pub oversell: DemoArgs,
}

/// The demo's other scenarios.
#[derive(Debug, Subcommand)]
pub enum DemoScenario {
    /// One hot item: one lock for the item against the item split into segments, each with
    /// its own lock, on each chosen lock backend; orders/s and the speed-up.
    HotItem(HotItemArgs),
}

/// `distlock demo` without a scenario: the overselling demo.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Strategy to run (repeatable). Default: all; a strategy whose server does not answer
    /// is listed as unavailable, with the reason.
    #[arg(long = "strategy", value_name = "NAME", value_enum)]
    pub strategies: Vec<Strategy>,
    /// Worker processes buying at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Concurrent buyers (tasks) in each worker process.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tasks: u32,
    /// Units in stock at the start.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub stock: u64,
    /// Orders of one unit, in total over all workers.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub orders: u64,
    /// Milliseconds each purchase spends between reading and writing the stock (the
    /// business logic inside the critical section).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub hold_ms: u64,
    /// SQLite file for the stock and the table lock. Default: a file in a temporary
    /// directory, removed afterwards.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub servers: Servers,
}

/// `distlock demo hot-item`: the hot-item scenario.
#[derive(Debug, Args)]
pub struct HotItemArgs {
    /// Lock to run (repeatable). Default: table-lock, redis, redis-atomic; a lock whose
    /// server does not answer is listed as unavailable, with the reason.
    #[arg(long = "strategy", value_name = "LOCK", value_enum)]
    pub strategies: Vec<HotStrategy>,
    /// Units in stock, all of them ordered one by one.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub stock: u64,
    /// The segments of the segmented run.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub segments: u32,
    /// Milliseconds of business work inside each order's critical section.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub hold_ms: u64,
    /// Worker processes buying at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Concurrent buyers in each worker process.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub tasks: u32,
    /// What a sale in the SQLite stock file survives: full (a power loss; one disk sync per
    /// sale, one sale at a time per file) or normal (a crash of the process).
    #[arg(long, value_enum, default_value_t = Durability::Full)]
    pub sqlite_durability: Durability,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub servers: Servers,
}

/// The name clap gives `value` on the command line (the demos' reports use it too).
pub fn value_name<T: ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map(|possible| possible.get_name().to_owned())
        .unwrap_or_default()
}

/// `--sqlite-durability`: see [`distlock::stock::SqliteDurability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    Full,
    Normal,
}

impl Durability {
    pub fn library(self) -> distlock::stock::SqliteDurability {
        match self {
            Durability::Full => distlock::stock::SqliteDurability::Full,
            Durability::Normal => distlock::stock::SqliteDurability::Normal,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Normal => "normal",
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The backend URL, e.g. sqlite:///tmp/bench.db.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// Worker processes contending for one lock.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Milliseconds each worker holds the lock per acquisition.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub hold_ms: u64,
    /// Seconds of contention.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub duration_s: u64,
    /// Uncontended acquire+release pairs to time.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub pairs: u64,
    /// Round trips to time for the baseline.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub rtt_samples: u64,
    /// Also hold this many locks with one client for --renewal-s seconds and count the
    /// renewal requests it sends (the watchdog's cost). 0 skips the phase.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub renewal_locks: u64,
    /// Seconds of the renewal phase.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub renewal_s: u64,
    /// ZooKeeper only: queue this many waiters (one session each) behind a holder, on the
    /// sequential lock and on the naive lock, and count the watch notifications per release
    /// (comma-separated counts, e.g. 8,32; empty skips the phase).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(usize))]
    pub herd: Vec<usize>,
    /// Also measure the semaphore (--permits permits), the reader-writer lock (reads as
    /// readers grow) and a 3-name multi-lock, each against the mutex of the same run.
    #[arg(long)]
    pub primitives: bool,
    /// The semaphore's permits in the --primitives phase (twice as many tasks contend).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub permits: u32,
    /// Also measure leader election's failover this many times: a leader process is
    /// SIGKILLed while this process campaigns, and the time until it leads is taken. 0 skips.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub failovers: u32,
    /// The renewed lease of both campaigners in the failover phase, in milliseconds (a
    /// lease-based backend frees a dead leader's lock at its end; ZooKeeper and etcd at the
    /// end of the session or etcd lease the URL sets).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(300..=60_000))]
    pub failover_lease_ms: u64,
    /// Also compare distlock's uncontended acquire+release with the backend's bare baselines
    /// on one connection of the same driver (its cheapest round trip, and a hand-written lock:
    /// SET NX + DEL, pg_try_advisory_lock + unlock, GET_LOCK + RELEASE_LOCK, ZooKeeper create +
    /// delete, ...), in --compare-rounds rounds that take turns.
    #[arg(long)]
    pub compare: bool,
    /// Rounds of the --compare phase; each measures every figure for --compare-round-ms.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub compare_rounds: u32,
    /// Milliseconds each figure is measured for in one round of --compare.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub compare_round_ms: u64,
    /// Run the contention phase's workers with this command instead of distlock's own, to
    /// measure another library's lock in the same scenario (e.g. `python3
    /// scripts/peers/redis_py_lock.py`). Split at whitespace (no quoting), it is given
    /// `--backend URL --name NAME --hold-ms H --duration-ms D` and must speak the worker
    /// protocol (see docs/performance.md). Every other phase still measures distlock.
    #[arg(long, value_name = "COMMAND")]
    pub worker_command: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw the handoff-gap distribution into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The backend URL, e.g. redis://127.0.0.1:6379/.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// Seconds to run at most.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration_s: u64,
    /// Acquisitions to make in total, at most (the run ends at whichever limit comes first).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub acquisitions: u64,
    /// Worker processes contending for the lock.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub workers: u32,
    /// Faults to inject, comma-separated: pause (SIGSTOP a worker past its lease, then
    /// SIGCONT), kill (SIGKILL a worker and start another), and through a loopback proxy per
    /// worker: cut (reset its connections), partition (nothing passes for its lease plus
    /// 300 ms), lose-reply (its next request reaches the server, its reply is lost). The
    /// network faults need a backend whose URL names every server it connects to (not
    /// SQLite, TLS, Sentinel or Cluster). `none`: no fault.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pause,kill")]
    pub faults: Vec<CheckFault>,
    /// The workers' renewed lease, in milliseconds (a pause lasts this long plus 300 ms).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub lease_ms: u64,
    /// Microseconds each holder spends between its read and its write.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub hold_us: u64,
    /// Run the workers in these network namespaces (`ip netns exec NS`), worker N in the
    /// (N mod count)-th one given; repeat the option for several. For partitions made
    /// outside the checker, between namespaces that hold the servers and the workers
    /// (docs/check.md#partitions-between-the-servers). Needs root and `ip`; the register and
    /// the logs stay in a temporary directory every namespace sees. Not with network faults.
    #[arg(long = "worker-netns", value_name = "NS")]
    pub worker_netns: Vec<String>,
    /// Keep the run's files in DIR (created; it must be new or empty) instead of a
    /// temporary directory removed at the end: the register (register.db) and each worker's
    /// history, worker-N.jsonl, one JSON event a line (ask, grant with its token, write and
    /// the register's answer, end with the moment lost() fired), for a look afterwards.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// The workers write the register without their fencing tokens, as a resource that does
    /// not check them would: shows what fencing prevents (a lost update where grants
    /// overlap).
    #[arg(long)]
    pub unfenced: bool,
    /// Run on a backend whose locks are not shared between the workers (memory://), which
    /// is otherwise refused: to see the checker find the overlaps it must find.
    #[arg(long, hide = true)]
    pub allow_unshared: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Serve the checker's metrics at http://ADDR/metrics, and each worker's at the next
    /// ports (worker N at port+1+N; with port 0, or past the last port, a free one); every
    /// address is printed on stderr.
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// A fault `distlock check` injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckFault {
    // No fault: the check only records and judges (faults made outside it). `--faults ''`
    // says the same.
    #[value(alias = "")]
    None,
    Pause,
    Kill,
    Cut,
    Partition,
    LoseReply,
}

impl CheckFault {
    /// Faults the checker causes through the workers' proxies.
    pub fn is_network(self) -> bool {
        matches!(
            self,
            CheckFault::Cut | CheckFault::Partition | CheckFault::LoseReply
        )
    }
}

#[derive(Debug, Args)]
pub struct CheckWorkerArgs {
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    #[arg(long)]
    pub name: String,
    #[arg(long, env = "DISTLOCK_STORE")]
    pub store: PathBuf,
    #[arg(long)]
    pub log: PathBuf,
    #[arg(long)]
    pub id: u32,
    #[arg(long)]
    pub until_us: u64,
    #[arg(long)]
    pub max: u64,
    /// The worker stops once this file exists.
    #[arg(long)]
    pub stop: PathBuf,
    #[arg(long)]
    pub lease_ms: u64,
    #[arg(long)]
    pub hold_us: u64,
    /// When this file exists at a grant, the worker removes it and holds for one and a half
    /// leases instead (the checker asks for such a hold before a partition).
    #[arg(long)]
    pub long_flag: PathBuf,
    /// Read and write the register without the fencing token.
    #[arg(long)]
    pub unfenced: bool,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// `distlock status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub lock: LockArgs,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
}

/// `distlock completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `distlock leader`.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    #[command(flatten)]
    pub lock: LockArgs,
    /// Print the leader now and then each change (a new term, or nobody), until SIGINT or
    /// SIGTERM.
    #[arg(long)]
    pub watch: bool,
    /// Print one JSON object per line instead of a line of words.
    #[arg(long)]
    pub json: bool,
}

/// `distlock list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The backend URL, e.g. redis://127.0.0.1:6379/.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// List only names that start with this (default: every name).
    #[arg(default_value = "")]
    pub prefix: String,
    /// List at most this many names.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=distlock::Locks::MAX_LIST as u64))]
    pub limit: u64,
    /// Print one JSON object instead of a line per lock.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The backend URL, e.g. sqlite:///var/lib/app/locks.db.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// The lock name.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The backend URL.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    pub backend: String,
    /// The lock name.
    #[arg(long)]
    pub name: String,
    /// The renewed lease, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Give up holding and exit after this many milliseconds.
    #[arg(long, default_value_t = 600_000)]
    pub max_ms: u64,
    /// What to hold: the mutex NAME, a permit of the semaphore NAME (--permits), the read or
    /// write lock of the reader-writer lock NAME, or the leadership of the election NAME.
    #[arg(long, value_enum, default_value = "mutex")]
    pub kind: HoldKind,
    /// The semaphore's permits (--kind permit).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub permits: u32,
}

/// What `distlock hold` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HoldKind {
    Mutex,
    Permit,
    Read,
    Write,
    Leader,
}

pub async fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Demo(command) => match *command {
            DemoCommand {
                scenario: Some(DemoScenario::HotItem(args)),
                ..
            } => demo::hot::run(args).await,
            DemoCommand {
                scenario: None,
                oversell,
            } => demo::run(oversell).await,
        },
        Command::Bench(args) => bench::run(args).await,
        Command::Status(args) => operator::status(args).await,
        Command::Leader(args) => operator::leader(args).await,
        Command::Completions(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut command, "distlock", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            page.render(&mut std::io::stdout()).map_err(|error| {
                crate::failure::Failure::failed(format!("cannot print the page: {error}"))
            })
        }
        Command::List(args) => operator::list(args).await,
        Command::ForceUnlock(args) => operator::force_unlock(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Elect(args) => run::elect(args).await,
        Command::Check(args) => check::run(args).await,
        Command::Hold(args) => operator::hold(args).await,
        Command::CheckWorker(args) => check::worker(args).await,
        Command::DemoWorker(args) => demo::worker(args).await,
        Command::DemoHotWorker(args) => demo::hot::worker(args).await,
        Command::BenchWorker(args) => bench::worker(args).await,
    }
}
