//! `distlock bench --primitives`: the semaphore, the reader-writer lock and the multi-lock,
//! each against the mutex measured in the same run (tasks of this process, one client).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::failure::{CliResult, Failure};

/// How long each timed loop runs at most.
const LOOP_TIME: Duration = Duration::from_secs(3);
/// How many acquisitions each timed loop makes at most.
const LOOP_COUNT: usize = 2_000;
/// Reader counts of the read-throughput phase.
const READERS: [usize; 4] = [1, 2, 4, 8];
/// How long each reader holds its read lock: long against a round trip, so that readers that
/// hold in parallel show as a rate that grows with their number.
const READ_HOLD: Duration = Duration::from_millis(20);

#[derive(Debug, Serialize)]
pub struct Primitives {
    pub permits: u32,
    pub hold_ms: u64,
    /// Uncontended acquire+release pairs/s of the mutex: the baseline of the ratios.
    pub mutex_pairs_per_s: f64,
    pub semaphore_pairs_per_s: f64,
    pub semaphore_pairs_ratio_to_mutex: f64,
    /// `2 x permits` tasks on one semaphore, each holding `hold_ms`.
    pub semaphore_contended_per_s: f64,
    /// The mean hold measured in that phase.
    pub semaphore_mean_hold_ms: f64,
    /// permits / (mean hold + RTT): every permit busy all the time.
    pub semaphore_contended_limit_per_s: f64,
    pub semaphore_most_holders: usize,
    pub multi_lock_3_pairs_per_s: f64,
    pub multi_lock_3_pairs_ratio_to_mutex: f64,
    pub write_pairs_per_s: f64,
    /// Read locks per second with 1, 2, 4, 8 reader tasks, each holding 20 ms.
    pub reads_per_s: Vec<(usize, f64)>,
    /// Reads/s with 8 readers over reads/s with 1: readers that serialized would give 1.
    pub read_scaling_8_over_1: f64,
}

/// Pairs per second of `pair` run back to back.
async fn pairs_per_s<F, Fut>(mut pair: F) -> CliResult<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = distlock::Result<()>>,
{
    let start = Instant::now();
    let mut done = 0usize;
    while done < LOOP_COUNT && start.elapsed() < LOOP_TIME {
        pair().await?;
        done += 1;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// Grants per second of `tasks` tasks, each running `grant` (acquire, hold, release) until
/// the loop's time or count runs out.
async fn grants_per_s<F, Fut>(tasks: usize, grant: F) -> CliResult<f64>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = distlock::Result<()>> + Send,
{
    let start = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut handles: Vec<tokio::task::JoinHandle<distlock::Result<()>>> = Vec::new();
    for _ in 0..tasks {
        let (grant, done) = (grant.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < LOOP_COUNT && start.elapsed() < LOOP_TIME {
                grant().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    for handle in handles {
        handle
            .await
            .map_err(|e| Failure::failed(format!("a benchmark task failed: {e}")))??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

pub async fn measure(
    locks: &distlock::Locks,
    run_id: &str,
    permits: u32,
    hold_ms: u64,
    rtt_ms: f64,
) -> CliResult<Primitives> {
    let hold = Duration::from_millis(hold_ms);
    let mutex = locks.mutex(format!("bench/{run_id}/primitives/mutex"))?;
    let mutex_pairs_per_s =
        pairs_per_s(|| async { mutex.acquire().await?.release().await }).await?;

    let semaphore = locks.semaphore(format!("bench/{run_id}/primitives/semaphore"), permits)?;
    let semaphore_pairs_per_s =
        pairs_per_s(|| async { semaphore.acquire().await?.release().await }).await?;

    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let held_us = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let semaphore_contended_per_s = {
        let state = (
            semaphore.clone(),
            holders,
            most.clone(),
            held_us.clone(),
            grants.clone(),
        );
        grants_per_s(2 * permits as usize, move || {
            let (semaphore, holders, most, held_us, grants) = state.clone();
            async move {
                let permit = semaphore.acquire().await?;
                let start = Instant::now();
                most.fetch_max(holders.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                let held = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                held_us.fetch_add(held, Ordering::Relaxed);
                grants.fetch_add(1, Ordering::Relaxed);
                permit.release().await
            }
        })
        .await?
    };
    // The hold the tasks really had (a timer sleeps at least the time asked, often more).
    let mean_hold_ms =
        held_us.load(Ordering::Relaxed) as f64 / 1e3 / grants.load(Ordering::Relaxed).max(1) as f64;
    let semaphore_most_holders = most.load(Ordering::SeqCst);
    if semaphore_most_holders > permits as usize {
        return Err(Failure::failed(format!(
            "the semaphore admitted {semaphore_most_holders} holders with {permits} permits"
        )));
    }

    let multi = locks.multi_lock(
        ["a", "b", "c"].map(|part| format!("bench/{run_id}/primitives/multi/{part}")),
    )?;
    let multi_lock_3_pairs_per_s =
        pairs_per_s(|| async { multi.acquire().await?.release().await }).await?;

    let rwlock = locks.rwlock(format!("bench/{run_id}/primitives/rwlock"))?;
    let write_pairs_per_s = pairs_per_s(|| async { rwlock.write().await?.release().await }).await?;
    let mut reads_per_s = Vec::new();
    for readers in READERS {
        let rwlock = rwlock.clone();
        let rate = grants_per_s(readers, move || {
            let rwlock = rwlock.clone();
            async move {
                let read = rwlock.read().await?;
                tokio::time::sleep(READ_HOLD).await;
                read.release().await
            }
        })
        .await?;
        reads_per_s.push((readers, rate));
    }
    let read_scaling_8_over_1 = reads_per_s[READERS.len() - 1].1 / reads_per_s[0].1.max(1e-9);

    Ok(Primitives {
        permits,
        hold_ms,
        mutex_pairs_per_s,
        semaphore_pairs_per_s,
        semaphore_pairs_ratio_to_mutex: semaphore_pairs_per_s / mutex_pairs_per_s.max(1e-9),
        semaphore_contended_per_s,
        semaphore_mean_hold_ms: mean_hold_ms,
        semaphore_contended_limit_per_s: f64::from(permits) * 1e3
            / (mean_hold_ms + rtt_ms).max(1e-9),
        semaphore_most_holders,
        multi_lock_3_pairs_per_s,
        multi_lock_3_pairs_ratio_to_mutex: multi_lock_3_pairs_per_s / mutex_pairs_per_s.max(1e-9),
        write_pairs_per_s,
        reads_per_s,
        read_scaling_8_over_1,
    })
}

pub fn print(p: &Primitives) {
    println!(
        "mutex (baseline)             {:.0} uncontended pairs/s",
        p.mutex_pairs_per_s
    );
    println!(
        "semaphore ({} permits)        {:.0} uncontended pairs/s = {:.2} x mutex; {} tasks holding {} ms (measured {:.2} ms): {:.0} grants/s = {:.0}% of permits/(hold+RTT), at most {} holders",
        p.permits,
        p.semaphore_pairs_per_s,
        p.semaphore_pairs_ratio_to_mutex,
        2 * p.permits,
        p.hold_ms,
        p.semaphore_mean_hold_ms,
        p.semaphore_contended_per_s,
        p.semaphore_contended_per_s / p.semaphore_contended_limit_per_s.max(1e-9) * 100.0,
        p.semaphore_most_holders
    );
    println!(
        "multi-lock (3 names)         {:.0} uncontended pairs/s = {:.2} x mutex",
        p.multi_lock_3_pairs_per_s, p.multi_lock_3_pairs_ratio_to_mutex
    );
    let reads = p
        .reads_per_s
        .iter()
        .map(|(readers, rate)| format!("{readers}: {rate:.0}/s"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "rwlock                       {:.0} uncontended write pairs/s; reads holding {} ms with readers {reads}; 8 readers = {:.1} x 1 reader",
        p.write_pairs_per_s,
        READ_HOLD.as_millis(),
        p.read_scaling_8_over_1
    );
}
