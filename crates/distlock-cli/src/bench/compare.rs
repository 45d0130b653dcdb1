//! `distlock bench --compare`: distlock's uncontended acquire+release next to the backend's
//! bare baselines (its cheapest round trip and a hand-written lock on one connection, see
//! `distlock::hooks::Bare`), in rounds that take turns, so that the machine's noise falls on
//! all of them alike. Each figure is the median of the rounds.

use std::time::{Duration, Instant};

use distlock::Locks;
use distlock::hooks::Bare;
use serde::Serialize;

use crate::failure::{CliResult, Failure};
use crate::progress::Progress;

/// The most operations one measurement of one round makes.
const MAX_OPS_PER_ROUND: u64 = 200_000;

/// The figures of the comparison.
#[derive(Debug, Serialize)]
pub struct Compare {
    pub rounds: u32,
    pub round_ms: u64,
    /// The bare round trip's request, and its pair's.
    pub round_trip: &'static str,
    pub pair: &'static str,
    /// Mean bare round trip, in ms (median over the rounds).
    pub bare_rtt_ms: f64,
    /// Mean round trip of distlock's own `ping`, in ms (median over the rounds).
    pub distlock_rtt_ms: f64,
    pub bare_pairs_per_s: f64,
    pub distlock_pairs_per_s: f64,
    /// 1 / (2 x bare RTT).
    pub limit_per_s: f64,
    /// distlock's pairs per second over the bare pair's.
    pub ratio_to_bare_pair: f64,
    /// distlock's pairs per second over [`Compare::limit_per_s`].
    pub ratio_to_limit: f64,
    /// The bare pair's over the limit, for scale.
    pub bare_ratio_to_limit: f64,
}

/// Operations per second of the body for `round` (and at most [`MAX_OPS_PER_ROUND`]); the body
/// is an expression of `distlock::Result<()>`, awaited once per operation.
macro_rules! rate {
    ($round:expr, $op:expr) => {{
        let start = Instant::now();
        let mut done: u64 = 0;
        while done < MAX_OPS_PER_ROUND && start.elapsed() < $round {
            $op.await?;
            done += 1;
        }
        done as f64 / start.elapsed().as_secs_f64().max(1e-9)
    }};
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the comparison, or `None` for a backend without bare baselines.
pub async fn measure(
    locks: &Locks,
    url: &str,
    run_id: &str,
    rounds: u32,
    round_ms: u64,
    progress: &mut Progress,
) -> CliResult<Option<Compare>> {
    let Some(mut bare) = Bare::open(url, run_id).await? else {
        return Ok(None);
    };
    let round = Duration::from_millis(round_ms);
    let mutex = locks.mutex(format!("bench/{run_id}/compare"))?;
    let (mut bare_rtt, mut distlock_rtt, mut bare_pairs, mut distlock_pairs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The pair's names go on counting across rounds: no name is used twice.
    let mut next_name = 0;
    for i in 0..rounds {
        bare_rtt.push(rate!(round, bare.round_trip()));
        bare_pairs.push(rate!(round, {
            next_name += 1;
            bare.pair(next_name)
        }));
        distlock_pairs.push(rate!(round, async {
            mutex.acquire().await?.release().await?;
            Ok::<(), distlock::Error>(())
        }));
        distlock_rtt.push(rate!(round, locks.ping()));
        progress.show(
            "compare with the bare baselines",
            u64::from(i) + 1,
            u64::from(rounds),
        );
    }
    progress.finish();
    let bare_rtt_per_s = median(bare_rtt);
    if bare_rtt_per_s <= 0.0 {
        return Err(Failure::failed("the bare round trip never completed"));
    }
    let bare_rtt_ms = 1e3 / bare_rtt_per_s;
    let distlock_rtt_ms = 1e3 / median(distlock_rtt).max(1e-9);
    let bare_pairs_per_s = median(bare_pairs);
    let distlock_pairs_per_s = median(distlock_pairs);
    let limit_per_s = bare_rtt_per_s / 2.0;
    Ok(Some(Compare {
        rounds,
        round_ms,
        round_trip: bare.round_trip_name(),
        pair: bare.pair_name(),
        bare_rtt_ms,
        distlock_rtt_ms,
        bare_pairs_per_s,
        distlock_pairs_per_s,
        limit_per_s,
        ratio_to_bare_pair: distlock_pairs_per_s / bare_pairs_per_s.max(1e-9),
        ratio_to_limit: distlock_pairs_per_s / limit_per_s,
        bare_ratio_to_limit: bare_pairs_per_s / limit_per_s,
    }))
}

/// Prints the comparison as table rows.
pub fn print(c: &Compare) {
    println!(
        "compare                      {} rounds of {} ms per measurement, taking turns; medians",
        c.rounds, c.round_ms
    );
    println!(
        "  bare round trip            {:.3} ms ({} on one connection); limit 1/(2*RTT) = {:.0} pairs/s",
        c.bare_rtt_ms, c.round_trip, c.limit_per_s
    );
    println!(
        "  distlock ping              {:.3} ms ({:.2} x the bare round trip)",
        c.distlock_rtt_ms,
        c.distlock_rtt_ms / c.bare_rtt_ms.max(1e-9)
    );
    println!(
        "  bare pair                  {:.0} pairs/s ({}) = {:.0}% of the limit",
        c.bare_pairs_per_s,
        c.pair,
        c.bare_ratio_to_limit * 100.0
    );
    println!(
        "  distlock acquire+release   {:.0} pairs/s = {:.2} x the bare pair = {:.0}% of the limit",
        c.distlock_pairs_per_s,
        c.ratio_to_bare_pair,
        c.ratio_to_limit * 100.0
    );
}
