//! The contention phase: worker processes (the hidden `bench-worker` subcommand), or tasks
//! for a backend that lives in one process, take one lock over and over; then their
//! intervals are analysed.

use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::report::{Contention, Stats};
use super::wall_ns;
use crate::cli::BenchArgs;
use crate::failure::{CliResult, Failure};
use crate::progress::Progress;
use crate::workers::{self, Fleet};

/// The hidden `bench-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true)]
    backend: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    hold_ms: u64,
    #[arg(long)]
    duration_ms: u64,
}

/// One acquisition in a worker: wall-clock nanoseconds (shared by the processes of one
/// machine) when it started waiting, was granted, and started releasing.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Interval {
    pub wait_start: u64,
    pub acquired: u64,
    pub release_start: u64,
}

/// What a worker sends back: every acquisition it made, in order.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerReport {
    pub intervals: Vec<Interval>,
}

/// Runs the contention phase: worker processes, or tasks for a backend that lives in this
/// process (separate processes would each have their own memory backend and never contend),
/// for `--duration-s`; returns each worker's intervals.
pub async fn phase(
    locks: &distlock::Locks,
    args: &BenchArgs,
    run_id: &str,
    progress: &mut Progress,
) -> CliResult<Vec<WorkerReport>> {
    let name = format!("bench/{run_id}/contended");
    let duration = Duration::from_secs(args.duration_s);
    let label = format!("{} workers contending", args.workers);
    let contention_start = Instant::now();
    // A backend that lives in this process is shared by tasks, not by processes.
    let in_process = distlock::validate_url(&args.backend).is_ok_and(|s| s.process_local);
    let collect = async {
        if in_process {
            contend_in_process(locks, args, &name, duration).await
        } else {
            contend_in_processes(args, &name, duration).await
        }
    };
    let reports = {
        tokio::pin!(collect);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let total = u64::try_from(duration.as_millis()).unwrap_or(1);
        loop {
            tokio::select! {
                reports = &mut collect => break reports?,
                _ = tick.tick() => {
                    let done = u64::try_from(contention_start.elapsed().as_millis()).unwrap_or(total);
                    progress.show(&label, done.min(total), total);
                }
            }
        }
    };
    progress.finish();
    Ok(reports)
}

/// Every worker's intervals with the worker's index, in the order of their grants.
pub fn merged(reports: &[WorkerReport]) -> Vec<(usize, Interval)> {
    let mut all: Vec<(usize, Interval)> = reports
        .iter()
        .enumerate()
        .flat_map(|(worker, r)| r.intervals.iter().map(move |i| (worker, *i)))
        .collect();
    all.sort_by_key(|(_, i)| i.acquired);
    all
}

/// Handoff gaps in ms: release start to the next grant, for consecutive grants that do not
/// overlap. `to_other` keeps only handoffs to a different worker.
pub fn handoff_gaps(all: &[(usize, Interval)], to_other: bool) -> Vec<f64> {
    all.windows(2)
        .filter(|w| w[1].1.acquired >= w[0].1.release_start && (!to_other || w[0].0 != w[1].0))
        .map(|w| ns_to_ms(w[1].1.acquired - w[0].1.release_start))
        .collect()
}

/// Nanoseconds in milliseconds.
fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The contention figures of the workers' intervals, each against its limit from the
/// round trips measured in the same run; counts the grants that overlapped a holder.
pub fn analyse(
    args: &BenchArgs,
    rtt: &Stats,
    rtt_after_idle: &Stats,
    reports: &[WorkerReport],
) -> CliResult<Contention> {
    let all = merged(reports);
    if all.len() < 2 {
        return Err(Failure::failed(
            "the contention phase made fewer than 2 acquisitions; lengthen --duration-s",
        ));
    }
    // Sorted by grant time, a grant before the latest release start so far overlaps a holder.
    let mut overlaps = 0;
    let mut latest_release = 0;
    for (_, interval) in &all {
        if interval.acquired < latest_release {
            overlaps += 1;
        }
        latest_release = latest_release.max(interval.release_start);
    }
    let same_worker = all.windows(2).filter(|w| w[0].0 == w[1].0).count();
    let holds: Vec<f64> = all
        .iter()
        .map(|(_, i)| ns_to_ms(i.release_start.saturating_sub(i.acquired)))
        .collect();
    let waits: Vec<f64> = all
        .iter()
        .map(|(_, i)| ns_to_ms(i.acquired.saturating_sub(i.wait_start)))
        .collect();
    let window_ms = ns_to_ms(latest_release.saturating_sub(all[0].1.acquired));
    let throughput_per_s = all.len() as f64 / (window_ms / 1e3).max(1e-9);
    let hold = Stats::of(holds);
    let limit_per_s = 1e3 / (hold.mean_ms + rtt.mean_ms).max(1e-9);
    let handoff_gap = Stats::of(handoff_gaps(&all, false));
    let handoff_gap_to_other = Stats::of(handoff_gaps(&all, true));
    let in_rtt = |gap_ms: f64| gap_ms / rtt.mean_ms.max(1e-9);
    Ok(Contention {
        worker_command: args.worker_command.clone(),
        workers: args.workers,
        hold_ms_requested: args.hold_ms,
        acquisitions: all.len(),
        throughput_per_s,
        hold,
        limit_per_s,
        ratio_to_limit: throughput_per_s / limit_per_s,
        handoff_gap_p50_in_rtt: in_rtt(handoff_gap.p50_ms),
        handoff_gap,
        handoff_gap_to_other_p50_in_rtt: in_rtt(handoff_gap_to_other.p50_ms),
        handoff_gap_to_other_p50_in_idle_rtt: handoff_gap_to_other.p50_ms
            / rtt_after_idle.mean_ms.max(1e-9),
        handoff_gap_to_other,
        same_worker_share: same_worker as f64 / (all.len() - 1) as f64,
        wait: Stats::of(waits),
        acquisitions_per_worker: reports.iter().map(|r| r.intervals.len()).collect(),
        overlaps,
    })
}

async fn contend_in_processes(
    args: &BenchArgs,
    name: &str,
    duration: Duration,
) -> CliResult<Vec<WorkerReport>> {
    let argument_lists = (0..args.workers)
        .map(|_| {
            vec![
                "--backend".to_owned(),
                args.backend.clone(),
                "--name".to_owned(),
                name.to_owned(),
                "--hold-ms".to_owned(),
                args.hold_ms.to_string(),
                "--duration-ms".to_owned(),
                duration.as_millis().to_string(),
            ]
        })
        .collect();
    let mut fleet = match &args.worker_command {
        Some(command) => {
            let mut words = command.split_whitespace().map(str::to_owned);
            let program = words
                .next()
                .ok_or_else(|| Failure::usage("--worker-command is empty"))?;
            let leading: Vec<String> = words.collect();
            Fleet::start_program(&program, &leading, argument_lists).await?
        }
        None => {
            let own = argument_lists.into_iter().map(|list| {
                std::iter::once("bench-worker".to_owned())
                    .chain(list)
                    .collect()
            });
            Fleet::start(own.collect()).await?
        }
    };
    fleet.go().await?;
    fleet.reports(duration + Duration::from_secs(120)).await
}

async fn contend_in_process(
    locks: &distlock::Locks,
    args: &BenchArgs,
    name: &str,
    duration: Duration,
) -> CliResult<Vec<WorkerReport>> {
    let hold = Duration::from_millis(args.hold_ms);
    let tasks: Vec<_> = (0..args.workers)
        .map(|_| {
            let mutex = locks.mutex(name);
            tokio::spawn(async move { contend(&mutex?, hold, duration).await })
        })
        .collect();
    let mut reports = Vec::with_capacity(tasks.len());
    for task in tasks {
        let intervals = task
            .await
            .map_err(|e| Failure::failed(format!("a bench task failed: {e}")))??;
        reports.push(WorkerReport { intervals });
    }
    Ok(reports)
}

/// Acquires, holds for `hold`, releases, on one lock, until `duration` has passed.
async fn contend(
    mutex: &distlock::Mutex,
    hold: Duration,
    duration: Duration,
) -> CliResult<Vec<Interval>> {
    let deadline = Instant::now() + duration;
    let mut intervals = Vec::new();
    while Instant::now() < deadline {
        let wait_start = wall_ns();
        // Waits at most past the end of the run by a grace period, so the loop always ends.
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(10);
        let guard = match mutex
            .acquire_with(distlock::AcquireOptions::new().wait(wait))
            .await
        {
            Ok(guard) => guard,
            Err(error) if error.is_timeout() => break,
            Err(error) => return Err(error.into()),
        };
        let acquired = wall_ns();
        workers::spend(hold).await;
        let release_start = wall_ns();
        guard.release().await?;
        intervals.push(Interval {
            wait_start,
            acquired,
            release_start,
        });
    }
    Ok(intervals)
}

/// A worker process: contends for one lock until the duration ends, then reports.
pub async fn worker(args: WorkerArgs) -> CliResult {
    let locks = distlock::connect(&args.backend).await?;
    let mutex = locks.mutex(args.name)?;
    let hold = Duration::from_millis(args.hold_ms);
    let duration = Duration::from_millis(args.duration_ms);
    workers::await_go().await?;
    let intervals = contend(&mutex, hold, duration).await?;
    workers::report(&WorkerReport { intervals })
}
