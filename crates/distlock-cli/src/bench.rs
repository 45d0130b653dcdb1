//! `distlock bench`: what a backend costs, each figure next to its limit measured in the same
//! run.
//!
//! 1. Baseline: the backend's cheapest request (`ping`) through the same client.
//! 2. Uncontended: acquire+release pairs on one name, against 1 / (2 x RTT).
//! 3. Contention: worker processes on one name, each holding `--hold-ms` per acquisition,
//!    against 1 / (mean hold + RTT); handoff gaps (release start to the next grant), waits,
//!    fairness, and a mutual-exclusion check over every acquisition's interval.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::cli::BenchArgs;
use crate::failure::{CliResult, Failure};
use crate::progress::Progress;
use crate::workers::{self, Fleet};

/// The most any timed phase of the parent may take.
const PHASE_TIME_LIMIT: Duration = Duration::from_secs(30);

/// The hidden `bench-worker` subcommand's arguments.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
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
struct Interval {
    wait_start: u64,
    acquired: u64,
    release_start: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    intervals: Vec<Interval>,
}

/// Milliseconds statistics of a sample.
#[derive(Debug, Clone, Copy, Serialize)]
struct Stats {
    count: usize,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Stats {
    fn of(mut samples_ms: Vec<f64>) -> Self {
        samples_ms.sort_by(f64::total_cmp);
        let count = samples_ms.len();
        let at = |q: f64| -> f64 {
            if count == 0 {
                return 0.0;
            }
            let index = ((count as f64 - 1.0) * q).round() as usize;
            samples_ms[index.min(count - 1)]
        };
        Stats {
            count,
            mean_ms: if count == 0 {
                0.0
            } else {
                samples_ms.iter().sum::<f64>() / count as f64
            },
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: samples_ms.last().copied().unwrap_or(0.0),
        }
    }
}

#[derive(Debug, Serialize)]
struct Uncontended {
    pairs: usize,
    pairs_per_s: f64,
    latency: Stats,
    /// 1 / (2 x mean RTT): two round trips per pair.
    limit_per_s: f64,
    ratio_to_limit: f64,
}

#[derive(Debug, Serialize)]
struct Contention {
    workers: u32,
    hold_ms_requested: u64,
    acquisitions: usize,
    throughput_per_s: f64,
    hold: Stats,
    /// 1 / (mean hold + mean RTT).
    limit_per_s: f64,
    ratio_to_limit: f64,
    /// Release start to the next grant, whoever got it.
    handoff_gap: Stats,
    handoff_gap_p50_in_rtt: f64,
    /// Release start to the next grant when another worker got it: the wake-up latency.
    handoff_gap_to_other: Stats,
    handoff_gap_to_other_p50_in_rtt: f64,
    /// The same, in round trips measured after idling (see `rtt_after_idle`).
    handoff_gap_to_other_p50_in_idle_rtt: f64,
    /// Share of grants that went straight back to the worker that had just released.
    same_worker_share: f64,
    wait: Stats,
    acquisitions_per_worker: Vec<usize>,
    overlaps: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: String,
    rtt: Stats,
    /// The round trip right after sleeping for the hold time (at least 1 ms).
    rtt_after_idle: Stats,
    uncontended: Uncontended,
    contention: Contention,
    #[serde(skip_serializing_if = "Option::is_none")]
    renewal: Option<Renewal>,
    /// ZooKeeper only: the round trip of the cheapest write (set data), the floor of every
    /// grant and release.
    #[cfg(feature = "zookeeper")]
    #[serde(skip_serializing_if = "Option::is_none")]
    write_rtt: Option<Stats>,
    /// ZooKeeper only: watch notifications per release, sequential vs naive lock.
    #[cfg(feature = "zookeeper")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    herd: Vec<crate::herd::Herd>,
}

/// The watchdog's cost: one client holding many renewed locks.
#[derive(Debug, Serialize)]
struct Renewal {
    locks: u64,
    lease_ms: u64,
    seconds: u64,
    renewal_requests: u64,
    requests_per_10_s: f64,
    requests_per_100_locks_per_10_s: f64,
    /// Locks the client knows lost at the end (should be 0).
    lost: usize,
    /// Time to acquire all the locks, one after another.
    acquire_s: f64,
}

/// Acquires `locks` renewed locks with one client, waits, and counts renewal requests.
async fn renewal_phase(
    locks_client: &distlock::Locks,
    run_id: &str,
    count: u64,
    seconds: u64,
    progress: &mut Progress,
) -> CliResult<Renewal> {
    let start = Instant::now();
    let mut guards = Vec::new();
    for i in 0..count {
        let mutex = locks_client.mutex(format!("bench/{run_id}/renewal/{i}"))?;
        guards.push(mutex.acquire().await?);
        progress.show("acquiring the renewed locks", i + 1, count);
    }
    progress.finish();
    let acquire_s = start.elapsed().as_secs_f64();
    let before = locks_client.renewal_requests();
    let total = seconds * 1000;
    let phase = Instant::now();
    while phase.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let done = u64::try_from(phase.elapsed().as_millis()).unwrap_or(total);
        progress.show("holding under renewal", done.min(total), total);
    }
    progress.finish();
    let renewal_requests = locks_client.renewal_requests() - before;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    for guard in guards {
        // Release errors (a lock lost meanwhile) are counted above, not fatal here.
        let _ = guard.release().await;
    }
    let requests_per_10_s = renewal_requests as f64 * 10.0 / seconds as f64;
    Ok(Renewal {
        locks: count,
        lease_ms: u64::try_from(locks_client.lease().as_millis()).unwrap_or(u64::MAX),
        seconds,
        renewal_requests,
        requests_per_10_s,
        requests_per_100_locks_per_10_s: requests_per_10_s * 100.0 / count as f64,
        lost,
        acquire_s,
    })
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

pub async fn run(args: BenchArgs) -> CliResult {
    let locks = distlock::connect(&args.backend).await?;
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

    // 1c. ZooKeeper: every grant and release is a write that the leader logs before it
    // answers; the write round trip is their floor.
    #[cfg(feature = "zookeeper")]
    let write_rtt = if crate::herd::both_urls(&args.backend).is_some() {
        let samples = crate::herd::write_round_trips(&args.backend, (args.rtt_samples / 4).max(1))
            .await?
            .into_iter()
            .map(ms)
            .collect();
        Some(Stats::of(samples))
    } else {
        None
    };

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

    // 3. Contention: worker processes, or tasks for a backend that lives in this process
    // (separate processes would each have their own memory backend and never contend).
    let name = format!("bench/{run_id}/contended");
    let duration = Duration::from_secs(args.duration_s);
    let label = format!("{} workers contending", args.workers);
    let contention_start = Instant::now();
    let collect = async {
        if locks.backend_scheme() == "memory" {
            contend_in_process(&locks, &args, &name, duration).await
        } else {
            contend_in_processes(&args, &name, duration).await
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
    let contention = analyse(&args, &rtt, &rtt_after_idle, &reports)?;

    // 4. Optionally, the watchdog's cost.
    let renewal = if args.renewal_locks > 0 {
        Some(
            renewal_phase(
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

    // 5. ZooKeeper: the herd effect, sequential vs naive lock.
    #[cfg(feature = "zookeeper")]
    let herd = if args.herd.is_empty() {
        Vec::new()
    } else {
        crate::herd::measure(&args.backend, &run_id, &args.herd).await?
    };

    let report = Report {
        backend: args.backend.clone(),
        rtt,
        rtt_after_idle,
        uncontended,
        contention,
        renewal,
        #[cfg(feature = "zookeeper")]
        write_rtt,
        #[cfg(feature = "zookeeper")]
        herd,
    };
    if let Some(path) = &args.plot {
        write_plot(path, &report, &reports)?;
    }
    if args.json {
        let line = serde_json::to_string(&report)
            .map_err(|e| Failure::failed(format!("cannot encode the report: {e}")))?;
        println!("{line}");
    } else {
        print_report(&report);
    }
    if report.contention.overlaps > 0 {
        return Err(Failure::failed(format!(
            "mutual exclusion violated: {} acquisitions overlapped another holder",
            report.contention.overlaps
        )));
    }
    Ok(())
}

/// Every worker's intervals with the worker's index, in the order of their grants.
fn merged(reports: &[WorkerReport]) -> Vec<(usize, Interval)> {
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
fn handoff_gaps(all: &[(usize, Interval)], to_other: bool) -> Vec<f64> {
    all.windows(2)
        .filter(|w| w[1].1.acquired >= w[0].1.release_start && (!to_other || w[0].0 != w[1].0))
        .map(|w| ns_to_ms(w[1].1.acquired - w[0].1.release_start))
        .collect()
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn analyse(
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

fn print_report(r: &Report) {
    print_main(r);
    #[cfg(feature = "zookeeper")]
    if let Some(w) = &r.write_rtt {
        println!(
            "write round trip (set data)  mean {:.3} ms   p50 {:.3} ms   p99 {:.3} ms   ({} samples): uncontended pairs = {:.0}% of 1/(2*write RTT), handoff p50 = {:.1} x write RTT",
            w.mean_ms,
            w.p50_ms,
            w.p99_ms,
            w.count,
            r.uncontended.pairs_per_s * 2.0 * w.mean_ms / 1e3 * 100.0,
            r.contention.handoff_gap_to_other.p50_ms / w.p50_ms.max(1e-9)
        );
    }
    #[cfg(feature = "zookeeper")]
    for h in &r.herd {
        println!(
            "herd                         {:<9} {:>2} waiters: {} watch notifications for {} releases = {:.2} per release (drained in {:.1} ms)",
            h.lock, h.waiters, h.notifications, h.releases, h.per_release, h.drain_ms
        );
    }
}

fn print_main(r: &Report) {
    let u = &r.uncontended;
    let c = &r.contention;
    println!("distlock bench: {}", r.backend);
    println!();
    println!(
        "round trip (ping)            mean {:.3} ms   p50 {:.3} ms   p99 {:.3} ms   ({} samples)",
        r.rtt.mean_ms, r.rtt.p50_ms, r.rtt.p99_ms, r.rtt.count
    );
    println!(
        "round trip after idling      mean {:.3} ms   p50 {:.3} ms   p99 {:.3} ms   ({} samples, each after a {} ms sleep)",
        r.rtt_after_idle.mean_ms,
        r.rtt_after_idle.p50_ms,
        r.rtt_after_idle.p99_ms,
        r.rtt_after_idle.count,
        r.contention.hold_ms_requested.max(1)
    );
    println!(
        "uncontended acquire+release  {:.0} pairs/s   p50 {:.3} ms   p99 {:.3} ms   ({} pairs)",
        u.pairs_per_s, u.latency.p50_ms, u.latency.p99_ms, u.pairs
    );
    println!(
        "                             {:.0}% of the limit 1/(2*RTT) = {:.0}/s",
        u.ratio_to_limit * 100.0,
        u.limit_per_s
    );
    println!(
        "contention                   {} workers, hold {} ms (measured mean {:.3} ms), {} acquisitions",
        c.workers, c.hold_ms_requested, c.hold.mean_ms, c.acquisitions
    );
    println!(
        "  throughput                 {:.1}/s = {:.0}% of the limit 1/(hold+RTT) = {:.1}/s",
        c.throughput_per_s,
        c.ratio_to_limit * 100.0,
        c.limit_per_s
    );
    println!(
        "  handoff gap                p50 {:.3} ms ({:.1} x RTT)   p99 {:.3} ms   max {:.3} ms",
        c.handoff_gap.p50_ms, c.handoff_gap_p50_in_rtt, c.handoff_gap.p99_ms, c.handoff_gap.max_ms
    );
    println!(
        "  handoff to another worker  p50 {:.3} ms ({:.1} x RTT, {:.1} x idle RTT)   p99 {:.3} ms   ({} handoffs; {:.0}% of grants went back to the releaser)",
        c.handoff_gap_to_other.p50_ms,
        c.handoff_gap_to_other_p50_in_rtt,
        c.handoff_gap_to_other_p50_in_idle_rtt,
        c.handoff_gap_to_other.p99_ms,
        c.handoff_gap_to_other.count,
        c.same_worker_share * 100.0
    );
    println!(
        "  wait                       p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms",
        c.wait.p50_ms, c.wait.p99_ms, c.wait.max_ms
    );
    let per_worker: Vec<String> = c
        .acquisitions_per_worker
        .iter()
        .map(usize::to_string)
        .collect();
    println!("  acquisitions per worker    {}", per_worker.join(" "));
    println!(
        "  mutual exclusion           {}",
        if c.overlaps == 0 {
            "held (0 overlapping acquisitions)".to_owned()
        } else {
            format!("VIOLATED ({} overlapping acquisitions)", c.overlaps)
        }
    );
    if let Some(r) = &r.renewal {
        println!(
            "renewal                      {} locks held {} s (lease {} ms): {} renewal requests = {:.1} per 10 s = {:.3} per 100 locks per 10 s; {} lost",
            r.locks,
            r.seconds,
            r.lease_ms,
            r.renewal_requests,
            r.requests_per_10_s,
            r.requests_per_100_locks_per_10_s,
            r.lost
        );
    }
}

/// Draws the handoff-gap histogram as an SVG file.
fn write_plot(path: &Path, report: &Report, reports: &[WorkerReport]) -> CliResult {
    let gaps = handoff_gaps(&merged(reports), false);
    let title = format!(
        "handoff gap, {} workers, hold {} ms: {}",
        report.contention.workers, report.contention.hold_ms_requested, report.backend
    );
    let svg = histogram_svg(
        &gaps,
        &title,
        report.rtt.mean_ms,
        &report.contention.handoff_gap,
    );
    std::fs::write(path, svg)
        .map_err(|e| Failure::failed(format!("cannot write {}: {e}", path.display())))
}

fn escape_xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn histogram_svg(gaps_ms: &[f64], title: &str, rtt_ms: f64, stats: &Stats) -> String {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 360.0;
    const LEFT: f64 = 60.0;
    const BOTTOM: f64 = 40.0;
    const TOP: f64 = 40.0;
    const BINS: usize = 50;
    let upper = (stats.p99_ms * 1.25).max(stats.p50_ms * 2.0).max(1e-3);
    let mut counts = [0usize; BINS];
    for &gap in gaps_ms {
        let bin = ((gap / upper) * BINS as f64) as usize;
        counts[bin.min(BINS - 1)] += 1;
    }
    let tallest = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let plot_w = WIDTH - LEFT - 20.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let bar_w = plot_w / BINS as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape_xml(title)
    );
    for (bin, &count) in counts.iter().enumerate() {
        let h = count as f64 / tallest * plot_h;
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4a7fb5\"/>\n",
            LEFT + bin as f64 * bar_w,
            TOP + plot_h - h,
            (bar_w - 1.0).max(0.5),
            h
        ));
    }
    let axis_y = TOP + plot_h;
    svg.push_str(&format!(
        "<line x1=\"{LEFT}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"black\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{axis_y}\" stroke=\"black\"/>\n",
        LEFT + plot_w
    ));
    for tick in 0..=5 {
        let value = upper * f64::from(tick) / 5.0;
        let x = LEFT + plot_w * f64::from(tick) / 5.0;
        svg.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{value:.2}</text>\n",
            axis_y + 16.0
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">gap from release start to next grant (ms); the last bar holds all longer gaps</text>\n\
         <text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">handoffs (max {})</text>\n",
        LEFT + plot_w / 2.0,
        HEIGHT - 6.0,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        tallest as usize
    ));
    let markers = [
        ("RTT", rtt_ms, "#5cb85c"),
        ("p50", stats.p50_ms, "#d9534f"),
        ("p99", stats.p99_ms, "#f0ad4e"),
    ];
    for (row, (label, value, colour)) in markers.into_iter().enumerate() {
        if value <= upper {
            let x = LEFT + plot_w * value / upper;
            svg.push_str(&format!(
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{axis_y}\" stroke=\"{colour}\" stroke-dasharray=\"4 3\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{label} {value:.3} ms</text>\n",
                x + 3.0,
                TOP + 12.0 + 14.0 * row as f64
            ));
        }
    }
    svg.push_str("</svg>\n");
    svg
}

async fn contend_in_processes(
    args: &BenchArgs,
    name: &str,
    duration: Duration,
) -> CliResult<Vec<WorkerReport>> {
    let argument_lists = (0..args.workers)
        .map(|_| {
            vec![
                "bench-worker".to_owned(),
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
    let mut fleet = Fleet::start(argument_lists).await?;
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
        if !hold.is_zero() {
            // Tokio's timer rounds up to whole milliseconds (a 1 ms sleep lasts about 2 ms);
            // the thread sleep is precise to tens of microseconds.
            tokio::task::block_in_place(|| std::thread::sleep(hold));
        }
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
