//! The write round trip of the backends whose every grant and release is a replicated write
//! that the cluster commits before it answers (ZooKeeper, etcd): the floor under their cost.

use std::time::Duration;

use crate::failure::CliResult;

/// `samples` write round trips of the backend `url` names, or `None` for a backend without
/// such a write.
pub async fn round_trips(url: &str, samples: u64) -> CliResult<Option<Vec<Duration>>> {
    #[cfg(feature = "zookeeper")]
    if crate::herd::both_urls(url).is_some() {
        return Ok(Some(crate::herd::write_round_trips(url, samples).await?));
    }
    #[cfg(feature = "etcd")]
    if url.starts_with("etcd://") {
        return Ok(Some(etcd_round_trips(url, samples).await?));
    }
    Ok(None)
}

/// Puts of one key under the client's lease (see `distlock::hooks::etcd_write_round_trip`).
#[cfg(feature = "etcd")]
async fn etcd_round_trips(url: &str, samples: u64) -> CliResult<Vec<Duration>> {
    let backend = distlock::etcd::EtcdBackend::connect(url).await?;
    let mut times = Vec::new();
    let start = std::time::Instant::now();
    for _ in 0..samples {
        times.push(distlock::hooks::etcd_write_round_trip(&backend).await?);
        if start.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    Ok(times)
}
