//! The watchdog's cost: one client holding many renewed locks, and the renewal requests it
//! sends.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::failure::CliResult;
use crate::progress::Progress;

/// The watchdog's cost: one client holding many renewed locks.
#[derive(Debug, Serialize)]
pub struct Renewal {
    pub locks: u64,
    pub lease_ms: u64,
    pub seconds: u64,
    pub renewal_requests: u64,
    pub requests_per_10_s: f64,
    pub requests_per_100_locks_per_10_s: f64,
    /// Locks the client knows lost at the end (should be 0).
    pub lost: usize,
    /// Time to acquire all the locks, one after another.
    pub acquire_s: f64,
}

/// Acquires `locks` renewed locks with one client, waits, and counts renewal requests.
pub async fn phase(
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
    let before = distlock::hooks::renewal_requests(locks_client);
    let total = seconds * 1000;
    let phase = Instant::now();
    while phase.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let done = u64::try_from(phase.elapsed().as_millis()).unwrap_or(total);
        progress.show("holding under renewal", done.min(total), total);
    }
    progress.finish();
    let renewal_requests = distlock::hooks::renewal_requests(locks_client) - before;
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
