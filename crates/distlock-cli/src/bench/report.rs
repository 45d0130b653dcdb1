//! What `distlock bench` reports: the figures of each phase, as a table or as JSON.

use serde::Serialize;

use super::failover::{self, Failover};
use super::primitives::{self, Primitives};
use super::renewal::Renewal;

/// Milliseconds statistics of a sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stats {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Stats {
    /// The statistics of `samples_ms` (all zero for no samples).
    pub fn of(mut samples_ms: Vec<f64>) -> Self {
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
pub struct Uncontended {
    pub pairs: usize,
    pub pairs_per_s: f64,
    pub latency: Stats,
    /// 1 / (2 x mean RTT): two round trips per pair.
    pub limit_per_s: f64,
    pub ratio_to_limit: f64,
}

#[derive(Debug, Serialize)]
pub struct Contention {
    /// The workers' command when not distlock's own (`--worker-command`).
    pub worker_command: Option<String>,
    pub workers: u32,
    pub hold_ms_requested: u64,
    pub acquisitions: usize,
    pub throughput_per_s: f64,
    pub hold: Stats,
    /// 1 / (mean hold + mean RTT).
    pub limit_per_s: f64,
    pub ratio_to_limit: f64,
    /// Release start to the next grant, whoever got it.
    pub handoff_gap: Stats,
    pub handoff_gap_p50_in_rtt: f64,
    /// Release start to the next grant when another worker got it: the wake-up latency.
    pub handoff_gap_to_other: Stats,
    pub handoff_gap_to_other_p50_in_rtt: f64,
    /// The same, in round trips measured after idling (see `rtt_after_idle`).
    pub handoff_gap_to_other_p50_in_idle_rtt: f64,
    /// Share of grants that went straight back to the worker that had just released.
    pub same_worker_share: f64,
    pub wait: Stats,
    pub acquisitions_per_worker: Vec<usize>,
    pub overlaps: usize,
}

/// Every figure of one run: the row of the JSON report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub backend: String,
    pub rtt: Stats,
    /// The round trip right after sleeping for the hold time (at least 1 ms).
    pub rtt_after_idle: Stats,
    pub uncontended: Uncontended,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<super::compare::Compare>,
    pub contention: Contention,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewal: Option<Renewal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primitives: Option<Primitives>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
    /// Backends whose every grant is a replicated write (ZooKeeper: set data; etcd: a put
    /// under the client's lease): that write's round trip, the floor of every grant and release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_rtt: Option<Stats>,
    /// ZooKeeper only: watch notifications per release, sequential vs naive lock.
    #[cfg(feature = "zookeeper")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub herd: Vec<crate::herd::Herd>,
}

/// Prints the report as a table.
pub fn print(r: &Report) {
    print_main(r);
    if let Some(c) = &r.compare {
        super::compare::print(c);
    }
    if let Some(p) = &r.primitives {
        primitives::print(p);
    }
    if let Some(f) = &r.failover {
        failover::print(f);
    }
    if let Some(w) = &r.write_rtt {
        println!(
            "write round trip             mean {:.3} ms   p50 {:.3} ms   p99 {:.3} ms   ({} samples): uncontended pairs = {:.0}% of 1/(2*write RTT), handoff p50 = {:.1} x write RTT",
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
    if let Some(command) = &c.worker_command {
        println!("  workers' command           {command} (not distlock)");
    }
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
