//! The ZooKeeper backend on real servers: the conformance suite on a standalone server and on
//! a 3-node ensemble (both started by `scripts/test`), and what is particular to ZooKeeper.

use distlock::conformance::Target;

/// A ZooKeeper deployment `scripts/test` starts: the URL in `variable`, or the default. Fails,
/// never skips, when its first server does not answer.
fn deployment(variable: &str, default: &str) -> Target {
    let url = std::env::var(variable).unwrap_or_else(|_| default.into());
    let first = url
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .split([',', '/', '?'])
        .next()
        .unwrap_or_default()
        .to_owned();
    if std::net::TcpStream::connect(&first).is_err() {
        panic!("ZooKeeper is not reachable at {first} ({url}); start it with scripts/test");
    }
    Target::new(url)
}

/// The standalone server of `scripts/test`.
fn standalone() -> Target {
    deployment("DISTLOCK_ZK_URL", "zk://127.0.0.1:2181/")
}

/// The 3-node ensemble of `scripts/test`.
fn ensemble() -> Target {
    deployment(
        "DISTLOCK_ZK_ENSEMBLE_URL",
        "zk://127.0.0.1:2190,127.0.0.1:2191,127.0.0.1:2192/",
    )
}

fn naive() -> Target {
    Target::new(standalone().url().replacen("zk://", "zk+naive://", 1))
}

distlock::conformance_suite!(zk, standalone());
distlock::conformance_suite!(zk_ensemble, ensemble());
distlock::conformance_suite!(zk_naive, naive());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zk_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(standalone().url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zk_ensemble_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(ensemble().url()).await;
}
