//! The herd-effect figure of `distlock bench` on ZooKeeper: watch notifications delivered
//! per release, for the sequential-node lock and the naive lock, with the same waiters.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::failure::{CliResult, Failure};

/// One measurement: `waiters` clients (one session each) queued behind a holder, then served
/// one after another.
#[derive(Debug, Clone, Serialize)]
pub struct Herd {
    pub lock: &'static str,
    pub waiters: usize,
    /// Releases that had at least one waiter behind them.
    pub releases: u64,
    pub notifications: u64,
    pub per_release: f64,
    /// From the first release to the last grant.
    pub drain_ms: f64,
}

/// The scheme and URL of a lock and of its herd variant (`Scheme::herd_variant`), on the same
/// servers and path, from a URL of either.
fn both_urls(url: &str) -> Option<[(&'static str, String); 2]> {
    let (name, rest) = url.split_once("://")?;
    let lock = distlock::SCHEMES
        .iter()
        .find(|s| (s.name == name && s.herd_variant.is_some()) || s.herd_variant == Some(name))?;
    let variant = lock.herd_variant?;
    Some([
        (lock.name, format!("{}://{rest}", lock.name)),
        (variant, format!("{variant}://{rest}")),
    ])
}

/// Measures both locks with each waiter count.
pub async fn measure(url: &str, run_id: &str, counts: &[usize]) -> CliResult<Vec<Herd>> {
    let Some(locks) = both_urls(url) else {
        let with: Vec<String> = distlock::SCHEMES
            .iter()
            .filter(|s| s.herd_variant.is_some())
            .map(|s| format!("{}://", s.name))
            .collect();
        return Err(Failure::usage(format!(
            "--herd measures watch notifications per release against a lock whose waiters \
             all watch it; use it with a {} backend",
            with.join(" or ")
        )));
    };
    if let Some(bad) = counts.iter().find(|&&n| !(1..=256).contains(&n)) {
        return Err(Failure::usage(format!(
            "--herd {bad}: the waiter counts must be between 1 and 256"
        )));
    }
    let mut figures = Vec::new();
    for &waiters in counts {
        for (lock, url) in locks.iter().map(|(lock, url)| (*lock, url.as_str())) {
            let name = format!("bench/{run_id}/herd/{lock}/{waiters}");
            figures.push(once(lock, url, &name, waiters).await?);
        }
    }
    Ok(figures)
}

async fn once(lock: &'static str, url: &str, name: &str, waiters: usize) -> CliResult<Herd> {
    let holder = distlock::connect(url).await?;
    let held = holder.mutex(name)?.acquire().await?;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let locks = distlock::connect(url).await?;
        let mutex = locks.mutex(name)?;
        tasks.push(tokio::spawn(async move {
            let guard = mutex
                .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(60)))
                .await?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            guard.release().await?;
            drop(locks);
            Ok::<_, distlock::Error>(())
        }));
    }
    // Let every waiter queue and set its watch.
    tokio::time::sleep(Duration::from_millis(200 + 10 * waiters as u64)).await;
    let before = distlock::hooks::zookeeper_watch_notifications();
    let start = Instant::now();
    held.release().await?;
    for task in tasks {
        task.await
            .map_err(|e| Failure::failed(format!("a herd waiter panicked: {e}")))??;
    }
    let drain_ms = start.elapsed().as_secs_f64() * 1e3;
    let notifications = distlock::hooks::zookeeper_watch_notifications() - before;
    // The holder's release and every waiter's but the last one's had someone waiting.
    let releases = waiters as u64;
    Ok(Herd {
        lock,
        waiters,
        releases,
        notifications,
        per_release: notifications as f64 / releases.max(1) as f64,
        drain_ms,
    })
}
