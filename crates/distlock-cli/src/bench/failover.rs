//! `distlock bench --failovers N`: how long an election takes to elect a new leader after the
//! leader's process is SIGKILLed while another process campaigns.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, ConnectOptions};
use serde::Serialize;

use super::ms;
use super::report::Stats;
use crate::failure::{CliResult, Failure};

/// How long one round may take before it counts as failed.
const ROUND_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Serialize)]
pub struct Failover {
    pub rounds: usize,
    /// The renewed lease of both campaigners.
    pub lease_ms: u64,
    /// SIGKILL of the leader's process to the campaigner's election.
    pub failover: Stats,
    /// The mean failover over the lease: a lease-based backend's failover is bounded by one
    /// lease (the dead leader's last renewal may have just happened).
    pub failover_over_lease: f64,
}

/// Kills the child by its PID when dropped, so that no leader process outlives the bench.
struct Leader(Child);

impl Drop for Leader {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `distlock hold --kind leader` on `name` and waits for the term it prints.
async fn spawn_leader(url: &str, name: &str, lease_ms: u64) -> CliResult<(Leader, u64)> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::failed(format!("cannot find this program to start a leader: {e}")))?;
    let mut command = Command::new(exe);
    // The URL in the leader's environment, off its command line.
    crate::workers::own_worker_args(&mut command, &["--backend".to_owned(), url.to_owned()]);
    let mut child = command
        .args(["hold", "--kind", "leader", "--name", name])
        .args(["--lease-ms", &lease_ms.to_string(), "--max-ms", "120000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failure::failed(format!("cannot start a leader process: {e}")))?;
    let stdout = child.stdout.take();
    let leader = Leader(child);
    let line = tokio::time::timeout(
        ROUND_LIMIT,
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            if let Some(stdout) = stdout {
                let _ = BufReader::new(stdout).read_line(&mut line);
            }
            line
        }),
    )
    .await
    .map_err(|_| Failure::failed("the leader process was not elected in time"))?
    .map_err(|e| Failure::failed(format!("reading the leader's term failed: {e}")))?;
    let term = serde_json::from_str::<serde_json::Value>(&line)
        .ok()
        .and_then(|value| value["fencing_token"].as_u64())
        .ok_or_else(|| Failure::failed(format!("the leader process printed {line:?}")))?;
    Ok((leader, term))
}

pub async fn measure(
    url: &str,
    run_id: &str,
    rounds: u32,
    lease_ms: u64,
) -> CliResult<Option<Failover>> {
    if distlock::validate_url(url)?.process_local {
        // Each process has its own memory backend: there is no leader in another process.
        return Ok(None);
    }
    let options = ConnectOptions::new().lease(Duration::from_millis(lease_ms));
    let locks = distlock::connect_with(url, options).await?;
    let mut samples = Vec::new();
    for round in 0..rounds {
        let name = format!("bench/{run_id}/election/{round}");
        let (mut leader, term) = spawn_leader(url, &name, lease_ms).await?;
        let election = locks.election(name)?;
        let campaign = tokio::spawn(async move {
            election
                .campaign_with("bench", AcquireOptions::new().wait(ROUND_LIMIT))
                .await
        });
        // The campaign is waiting behind the leader by now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = leader.0.kill();
        let killed_at = Instant::now();
        let _ = leader.0.wait();
        let leadership = campaign
            .await
            .map_err(|e| Failure::failed(format!("the campaign task failed: {e}")))??;
        samples.push(ms(killed_at.elapsed()));
        if leadership.term() <= term {
            return Err(Failure::failed(format!(
                "the new leader's term {} is not above the killed leader's {term}",
                leadership.term()
            )));
        }
        leadership.resign().await?;
    }
    let failover = Stats::of(samples);
    Ok(Some(Failover {
        rounds: failover.count,
        lease_ms,
        failover_over_lease: failover.mean_ms / lease_ms as f64,
        failover,
    }))
}

pub fn print(f: &Failover) {
    println!(
        "election failover            {} leaders SIGKILLed: new leader after mean {:.0} ms, max {:.0} ms = {:.2} x the {} ms lease (ZooKeeper, etcd: their session or etcd lease)",
        f.rounds, f.failover.mean_ms, f.failover.max_ms, f.failover_over_lease, f.lease_ms
    );
}
