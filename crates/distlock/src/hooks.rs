//! Measurement hooks of `distlock bench` and of the tests. Not part of the API: hidden from
//! the docs, with no stability promise; applications have no use for them.

use crate::client::Locks;

/// The bare baselines of `distlock bench --compare` (with at least one server backend).
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper",
    feature = "etcd",
    feature = "sqlite"
))]
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

/// One ZooKeeper write round trip of `backend` (a `setData` on its base node): the unit of a
/// ZooKeeper handoff.
///
/// # Errors
/// [`Error::Backend`](crate::Error::Backend) when the write fails.
#[cfg(feature = "zookeeper")]
pub async fn zookeeper_write_round_trip(
    backend: &crate::zookeeper::ZooKeeperBackend,
) -> crate::Result<std::time::Duration> {
    backend.write_round_trip().await
}

/// One etcd write round trip of `backend` (a put of one key under its lease): the unit of an
/// etcd handoff.
///
/// # Errors
/// [`Error::Backend`](crate::Error::Backend) when the write fails.
#[cfg(feature = "etcd")]
pub async fn etcd_write_round_trip(
    backend: &crate::etcd::EtcdBackend,
) -> crate::Result<std::time::Duration> {
    backend.write_round_trip().await
}

/// How many etcd transactions that read held keys (renewals while the held keys' watch is
/// down, re-entries, extensions, releases of one hold of several) `backend` has sent.
#[cfg(feature = "etcd")]
pub fn etcd_key_check_requests(backend: &crate::etcd::EtcdBackend) -> u64 {
    backend.key_check_requests()
}
