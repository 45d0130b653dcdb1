//! `distlock bench`: what a backend costs, each figure next to its limit measured in the same
//! run.
//!
//! 1. Baseline: the backend's cheapest request (`ping`) through the same client.
//! 2. Uncontended: acquire+release pairs on one name, against 1 / (2 x RTT).
//! 3. Contention: worker processes on one name, each holding `--hold-ms` per acquisition,
//!    against 1 / (mean hold + RTT); handoff gaps (release start to the next grant), waits,
//!    fairness, and a mutual-exclusion check over every acquisition's interval.
//! 4. Optionally (`--primitives`), the semaphore, reader-writer lock and multi-lock against
//!    the mutex of the same run; `--failovers N`: leader election's failover after the
//!    leader's process is SIGKILLed.

mod compare;
mod contend;
mod failover;
mod plot;
mod primitives;
mod renewal;
mod report;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cli::BenchArgs;
use crate::failure::{CliResult, Failure};
use crate::json;
use crate::progress::Progress;
pub use contend::{WorkerArgs, worker};
use report::{Report, Stats, Uncontended};

/// The most any timed phase of the parent may take.
const PHASE_TIME_LIMIT: Duration = Duration::from_secs(30);

/// The benchmark's settings, at the top level of its JSON report.
#[derive(Debug, Serialize)]
struct Settings<'a> {
    backend: &'a str,
}

/// A duration in milliseconds.
fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Now, in nanoseconds since the Unix epoch: comparable between the processes of one
/// machine.
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Measures the backend phase by phase and prints every figure; fails if two holders
/// overlapped.
pub async fn run(args: BenchArgs) -> CliResult {
    let _exporter = crate::exporter::serve(&args.metrics).await?;
    let locks = distlock::connect(&args.backend).await?;
    if let Some(command) = &args.worker_command {
        if command.trim().is_empty() {
            return Err(Failure::usage(
                "--worker-command is empty: give the program to run",
            ));
        }
        let scheme = distlock::validate_url(&args.backend).map_err(Failure::usage)?;
        if scheme.process_local {
            return Err(Failure::usage(format!(
                "--worker-command needs a server backend: {}:// lives in one process",
                scheme.name
            )));
        }
    }
    let mut progress = Progress::new(!args.json);
    let run_id = format!("{}-{}", std::process::id(), wall_ns());

    // 1. Baseline.
    let mut rtt_samples = Vec::new();
    let phase_start = Instant::now();
    for i in 0..args.rtt_samples {
        rtt_samples.push(ms(locks.ping().await?));
        progress.show("round trip (ping)", i + 1, args.rtt_samples);
        if phase_start.elapsed() > PHASE_TIME_LIMIT {
            break;
        }
    }
    progress.finish();
    let rtt = Stats::of(rtt_samples);

    // 1b. The same request from a process that has just slept for the hold time, as a lock
    // holder or a waiter has: on a virtual machine waking up costs more than the request.
    let idle = Duration::from_millis(args.hold_ms.max(1));
    let idle_samples = (args.rtt_samples / 4).max(1);
    let mut idle_rtt_samples = Vec::new();
    let phase_start = Instant::now();
    for i in 0..idle_samples {
        std::thread::sleep(idle);
        idle_rtt_samples.push(ms(locks.ping().await?));
        progress.show("round trip after idling", i + 1, idle_samples);
        if phase_start.elapsed() > PHASE_TIME_LIMIT {
            break;
        }
    }
    progress.finish();
    let rtt_after_idle = Stats::of(idle_rtt_samples);

    // 1c. Where every grant and release is a write that the cluster commits before it
    // answers (ZooKeeper, etcd), the write round trip is the floor; the driver says.
    let write_rtt =
        distlock::hooks::write_round_trips(&args.backend, (args.rtt_samples / 4).max(1))
            .await?
            .map(|samples| Stats::of(samples.into_iter().map(ms).collect()));

    // 2. Uncontended pairs on one name.
    let mutex = locks.mutex(format!("bench/{run_id}/uncontended"))?;
    let mut latencies = Vec::new();
    let phase_start = Instant::now();
    for i in 0..args.pairs {
        let start = Instant::now();
        let guard = mutex.acquire().await?;
        guard.release().await?;
        latencies.push(ms(start.elapsed()));
        progress.show("uncontended acquire+release", i + 1, args.pairs);
        if phase_start.elapsed() > PHASE_TIME_LIMIT {
            break;
        }
    }
    let phase_s = phase_start.elapsed().as_secs_f64();
    progress.finish();
    let pairs = latencies.len();
    let pairs_per_s = pairs as f64 / phase_s.max(1e-9);
    let limit_per_s = 1e3 / (2.0 * rtt.mean_ms).max(1e-9);
    let uncontended = Uncontended {
        pairs,
        pairs_per_s,
        latency: Stats::of(latencies),
        limit_per_s,
        ratio_to_limit: pairs_per_s / limit_per_s,
    };

    // 2b. Optionally, the same pairs next to the backend's bare baselines.
    let compare = if args.compare {
        let compare = compare::measure(
            &locks,
            &args.backend,
            &run_id,
            args.compare_rounds,
            args.compare_round_ms,
            &mut progress,
        )
        .await?;
        if compare.is_none() {
            return Err(Failure::usage(format!(
                "--compare: no bare baseline for {}; there are some for {} \
                 (docs/performance.md)",
                distlock::redact_url(&args.backend),
                distlock::hooks::Bare::schemes().join(", ")
            )));
        }
        compare
    } else {
        None
    };

    // 3. Contention between worker processes.
    let reports = contend::phase(&locks, &args, &run_id, &mut progress).await?;
    let contention = contend::analyse(&args, &rtt, &rtt_after_idle, &reports)?;

    // 4. Optionally, the watchdog's cost.
    let renewal = if args.renewal_locks > 0 {
        Some(
            renewal::phase(
                &locks,
                &run_id,
                args.renewal_locks,
                args.renewal_s,
                &mut progress,
            )
            .await?,
        )
    } else {
        None
    };

    // 4b. Optionally, the primitives built on the mutex.
    let primitives = if args.primitives {
        Some(primitives::measure(&locks, &run_id, args.permits, args.hold_ms, rtt.mean_ms).await?)
    } else {
        None
    };

    // 4c. Optionally, leader election's failover after a SIGKILL.
    let failover = if args.failovers > 0 {
        failover::measure(
            &args.backend,
            &run_id,
            args.failovers,
            args.failover_lease_ms,
        )
        .await?
    } else {
        None
    };

    // 5. ZooKeeper: the herd effect, sequential vs naive lock.
    #[cfg(feature = "zookeeper")]
    let herd = if args.herd.is_empty() {
        Vec::new()
    } else {
        crate::herd::measure(&args.backend, &run_id, &args.herd).await?
    };

    let report = Report {
        backend: distlock::redact_url(&args.backend),
        rtt,
        rtt_after_idle,
        uncontended,
        compare,
        contention,
        renewal,
        primitives,
        failover,
        write_rtt,
        #[cfg(feature = "zookeeper")]
        herd,
    };
    if let Some(path) = &args.plot {
        plot::write(path, &report, &reports)?;
    }
    if args.json {
        let settings = Settings {
            backend: &report.backend,
        };
        json::print_rows("bench", &settings, std::slice::from_ref(&report), &[])?;
    } else {
        report::print(&report);
    }
    if report.contention.overlaps > 0 {
        return Err(Failure::failed(format!(
            "mutual exclusion violated: {} acquisitions overlapped another holder",
            report.contention.overlaps
        )));
    }
    Ok(())
}
