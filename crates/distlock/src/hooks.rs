//! Measurement hooks of `distlock bench` and of the tests. Not part of the API: hidden from
//! the docs, with no stability promise; applications have no use for them.

use crate::client::Locks;

/// The bare baselines of `distlock bench --compare`.
pub use crate::bare::Bare;

/// How many renewal requests `locks` has sent (each renews up to 1000 locks).
pub fn renewal_requests(locks: &Locks) -> u64 {
    locks.renewal_requests()
}

/// Every watch event delivered to a ZooKeeper waiter in this process so far, for measuring the
/// herd effect: with `zk://` one per release, with `zk+naive://` one per waiter per release.
#[cfg(feature = "zookeeper")]
pub fn zookeeper_watch_notifications() -> u64 {
    crate::zookeeper::watch_notifications()
}

/// ZooKeeper waiters' grants in this process so far that came from a watch alone, with no
/// look at the line after the release: the handoff of one write and one notification.
#[cfg(feature = "zookeeper")]
pub fn zookeeper_watch_grants() -> u64 {
    crate::zookeeper::watch_grants()
}

/// Up to `samples` round trips (at most 30 s of them) of the replicated write that each grant
/// and release costs on the backend `url` names, for a backend whose every grant is one: a
/// `setData` on ZooKeeper's base node, a put under etcd's lease. `None` for the others.
///
/// # Errors
/// [`Error::InvalidInput`](crate::Error::InvalidInput) for a malformed URL,
/// [`Error::Backend`](crate::Error::Backend) when connecting or a write fails.
pub async fn write_round_trips(
    url: &str,
    samples: u64,
) -> crate::Result<Option<Vec<std::time::Duration>>> {
    let (_, driver) = crate::open::checked(url)?;
    match driver.write_round_trips {
        Some(measure) => measure(url, samples).await.map(Some),
        None => Ok(None),
    }
}

/// How many etcd transactions that read held keys (renewals while the held keys' watch is
/// down, re-entries, extensions, releases of one hold of several) `backend` has sent.
#[cfg(feature = "etcd")]
pub fn etcd_key_check_requests(backend: &crate::etcd::EtcdBackend) -> u64 {
    backend.key_check_requests()
}
