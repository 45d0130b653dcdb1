//! The etcd backend on real servers: the conformance suite on a standalone server and on a
//! 3-member cluster (both started by `scripts/test`), and what is particular to etcd: the key
//! layout shared with `etcdctl lock`, the lost lease, and the loss of the cluster's leader.

use std::process::{Command, Stdio};
use std::time::Duration;

use distlock::conformance::{Target, servers};
use distlock::{AcquireOptions, ConnectOptions};
use tokio::time::Instant;

mod etcdctl;

fn standalone() -> String {
    servers::ETCD.url()
}

fn cluster() -> String {
    servers::ETCD_CLUSTER.url()
}

distlock::conformance_suite!(etcd_standalone, Target::new(standalone()));
distlock::conformance_suite!(etcd_cluster, Target::new(cluster()));
distlock::conformance_suite!(
    etcd_watch_from_revision,
    Target::new(servers::with_query(&standalone(), "watch=etcd"))
);

/// A target whose etcd leases run out 2 s after the last keep-alive, so that a partition ends
/// them quickly.
fn short_leases(url: String) -> Target {
    Target::new(servers::with_query(&url, "lease_ttl=2s"))
}

distlock::wire_fault_suite!(etcd_wire, short_leases(standalone()));
distlock::wire_fault_suite!(etcd_cluster_wire, short_leases(cluster()));

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(standalone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_cluster_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(cluster())).await;
}

/// `host:port` of every server of an `etcd://` URL.
fn servers_of(url: &str) -> Vec<String> {
    url.split_once("://")
        .map_or("", |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// etcd's own command-line client, to look at the keys distlock puts and to play an
/// operator: a second implementation of the wire protocol, so that what distlock wrote is
/// read back by other code than its own.
struct Raw {
    endpoints: String,
}

/// A raw etcd client for the servers of `url`.
async fn raw(url: &str) -> Raw {
    Raw {
        endpoints: servers_of(url).join(","),
    }
}

impl Raw {
    /// Runs `etcdctl ARGS` and answers its standard output; fails the test when it fails.
    async fn etcdctl(&self, args: &[&str]) -> String {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints))
            .arg("--command-timeout=5s")
            .args(args)
            .stdin(Stdio::null());
        let what = format!("etcdctl {}", args.join(" "));
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("the etcdctl thread")
            .unwrap_or_else(|e| panic!("{what}: {e} (scripts/test installs etcd-client)"));
        assert!(
            output.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Revokes etcd lease `lease`.
    async fn lease_revoke(&self, lease: i64) {
        self.etcdctl(&["lease", "revoke", &format!("{lease:x}")])
            .await;
    }

    /// Deletes every key under `prefix`.
    async fn delete_prefix(&self, prefix: &str) {
        self.etcdctl(&["del", prefix, "--prefix"]).await;
    }
}

/// The value of the line `"FIELD" : VALUE` of `etcdctl -w fields` output.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.strip_prefix(&format!("\"{name}\" : "))
}

/// A lock name of safe characters only: its key prefix is the name itself.
fn unique(case: &str) -> String {
    format!("etcd-{case}-{}", uuid::Uuid::new_v4().simple())
}

/// The keys under `NAME/`, first created first, with their create revisions and leases.
async fn keys(raw: &Raw, name: &str) -> Vec<(String, i64, i64)> {
    let prefix = format!("{name}/");
    let output = raw
        .etcdctl(&[
            "get",
            &prefix,
            "--prefix",
            "--keys-only",
            "--sort-by=CREATE",
            "--order=ASCEND",
            "-w",
            "fields",
        ])
        .await;
    let mut found: Vec<(String, i64, i64)> = Vec::new();
    for line in output.lines() {
        let number = |value: &str| value.trim().parse::<i64>().expect("a number field");
        if let Some(key) = field(line, "Key") {
            found.push((key.trim_matches('"').to_owned(), 0, 0));
        } else if let Some(value) = field(line, "CreateRevision") {
            found.last_mut().expect("a key before its fields").1 = number(value);
        } else if let Some(value) = field(line, "Lease") {
            found.last_mut().expect("a key before its fields").2 = number(value);
        }
    }
    found
}

/// Promises 1, 3 and 4: the key is `NAME/<lease id in hex>` under the client's lease, its
/// create revision is the fencing token, a second owner of the same client queues with a key
/// of its own in the same range, and nothing is left once both released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_keys_follow_the_layout_of_etcds_mutex() {
    let url = standalone();
    let raw = raw(&url).await;
    let locks = distlock::connect(&url).await.unwrap();
    let name = unique("layout");
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let found = keys(&raw, &name).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let (key, revision, lease) = &found[0];
    assert_eq!(key, &format!("{name}/{lease:x}"));
    assert_eq!(u64::try_from(*revision).unwrap(), guard.fencing_token());

    let waiting = tokio::spawn({
        let (locks, name) = (locks.clone(), name.clone());
        async move { locks.mutex(name).unwrap().acquire().await.unwrap() }
    });
    let start = Instant::now();
    let queued = loop {
        let found = keys(&raw, &name).await;
        if found.len() == 2 {
            break found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the second owner never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(queued[1].0.starts_with(&format!("{key}-")), "{queued:?}");
    assert_eq!(queued[1].2, *lease, "one lease per client");
    assert!(
        !waiting.is_finished(),
        "two owners of one client hold the lock"
    );

    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the queued owner was not granted")
        .unwrap();
    assert!(next.fencing_token() > u64::try_from(*revision).unwrap());
    next.release().await.unwrap();
    assert!(keys(&raw, &name).await.is_empty(), "a key was left behind");
}

/// One etcd lease carries every renewed lock: while the held keys' watch is up (also after
/// grants whose watches ended at once), renewing 200 locks every 200 ms sends no request that
/// reads them, and none of them is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_send_no_request_per_lock() {
    let backend = std::sync::Arc::new(
        distlock::etcd::EtcdBackend::connect(&standalone())
            .await
            .unwrap(),
    );
    let options = ConnectOptions::new().lease(Duration::from_millis(600));
    let locks = distlock::Locks::with_backend(backend.clone(), options).unwrap();
    let base = unique("renewals");
    // Grants released at once: their watches end before the server answers their creation.
    let brief = locks.mutex(format!("{base}-brief")).unwrap();
    for _ in 0..50 {
        brief.acquire().await.unwrap().release().await.unwrap();
    }
    let mut guards = Vec::new();
    for i in 0..200 {
        let name = format!("{base}-{i}");
        guards.push(locks.mutex(name.as_str()).unwrap().acquire().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (checks, renewals) = (
        distlock::hooks::etcd_key_check_requests(&backend),
        distlock::hooks::renewal_requests(&locks),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        distlock::hooks::renewal_requests(&locks) >= renewals + 5,
        "the locks were not renewed"
    );
    assert_eq!(
        distlock::hooks::etcd_key_check_requests(&backend),
        checks,
        "renewals read the held keys"
    );
    assert!(guards.iter().all(|guard| !guard.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Four clients take one lock in turn as fast as they can, each queueing again under the same
/// key name right after its release: all 400 acquisitions are granted within their 5 s wait.
/// (It stresses, without hitting it reliably, the race of a waiter whose predecessor's key is
/// deleted and put again before its watch starts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_to_holders_that_queue_again_do_not_stall() {
    let url = standalone();
    let name = unique("requeue");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (url, name) = (url.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let locks = distlock::connect(&url).await.unwrap();
            let mutex = locks.mutex(name).unwrap();
            for round in 0..100 {
                let guard = mutex
                    .acquire_with(AcquireOptions::new().wait(Duration::from_secs(5)))
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: a handoff stalled: {e}"));
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Promise 2: an operator revokes the client's etcd lease. Every lock under it fires `lost()`
/// (renewed and fixed-lease alike), the loss is counted, and the client takes a new lease and
/// can lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_revoked_lease_fires_lost_on_every_lock() {
    let url = standalone();
    let raw = raw(&url).await;
    let locks = distlock::connect(&url).await.unwrap();
    let (renewed_name, fixed_name) = (unique("revoked_renewed"), unique("revoked_fixed"));
    let renewed = crate::common::hold(&locks, renewed_name.as_str()).await;
    let fixed = locks
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().lease(Duration::from_secs(60)))
        .await
        .unwrap();
    let lease = keys(&raw, &renewed_name).await[0].2;
    raw.lease_revoke(lease).await;
    for (what, guard) in [("renewed", &renewed), ("fixed-lease", &fixed)] {
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("the {what} lock did not fire lost()"));
    }
    let session = locks
        .session()
        .expect("etcd reports its lease as a session");
    assert_eq!(session.borrow().sessions_lost, 1);
    let again = locks
        .mutex(renewed_name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("lock again under a new lease");
    assert_ne!(keys(&raw, &renewed_name).await[0].2, lease);
    again.release().await.unwrap();
}

/// Promise 2: an operator deletes a held key (`etcdctl del`). That lock fires `lost()` at the
/// next renewal, and another client gets it; also after the client's held keys' watch has
/// followed 1500 brief grants (its answers must be read while it is asked for more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_deleted_key_fires_lost() {
    let url = standalone();
    let raw = raw(&url).await;
    let locks = distlock::connect_with(
        &url,
        ConnectOptions::new().lease(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    let name = unique("deleted_key");
    let brief = locks.mutex(format!("{name}-brief")).unwrap();
    for _ in 0..1500 {
        brief.acquire().await.unwrap().release().await.unwrap();
    }
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    raw.delete_prefix(&format!("{name}/")).await;
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not fire after the key was deleted");
    let other = distlock::connect(&url).await.unwrap();
    let rival = other
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free once its key is gone");
    rival.release().await.unwrap();
}

/// Promise 2 across a partition longer than the etcd lease: a holder with the 30 s API lease,
/// cut off from the server (nothing passes either way), gives its 2 s etcd lease up after
/// half of it and fires `lost()`; the server ends the lease after all of it and a rival is
/// granted, after the `lost()`, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_partitioned_holder_fires_lost_before_the_rival_is_granted() {
    let url = standalone();
    let server = tokio::net::lookup_host(servers_of(&url)[0].as_str())
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = distlock::fault::FaultProxy::start(server).await.unwrap();
    let proxied = format!("etcd://{}/?lease_ttl=2s", proxy.address());
    let holder = distlock::connect(&proxied).await.unwrap();
    let name = unique("partition");
    let guard = crate::common::hold(&holder, name.as_str()).await;
    let rival = distlock::connect(&url).await.unwrap();
    proxy.blackhole();
    let (lost_at, (granted_at, granted)) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(20), guard.lost())
                .await
                .ok()
                .map(|_| Instant::now())
        },
        async {
            let granted = rival
                .mutex(name.as_str())
                .unwrap()
                .acquire_with(AcquireOptions::new().wait(Duration::from_secs(20)))
                .await;
            (Instant::now(), granted)
        }
    );
    let lost_at = lost_at.expect("the partitioned holder never fired lost()");
    let granted = granted.expect("the rival was never granted: the holder's lease did not end");
    assert!(
        lost_at < granted_at,
        "the rival was granted {:?} before the holder fired lost()",
        lost_at - granted_at
    );
    assert!(granted.fencing_token() > guard.fencing_token());
    granted.release().await.unwrap();
    proxy.heal();
}

mod cluster;
mod waiters;
