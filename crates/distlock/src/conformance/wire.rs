//! Faults on the wire: the client reaches its servers through
//! [`FaultProxy`](crate::fault::FaultProxy)s that lose a reply or partition the client in the
//! middle of a request. For backends whose URL names the servers the client talks to (not a
//! Sentinel group or a Cluster, which name servers of their own); see
//! [`wire_fault_suite!`](crate::wire_fault_suite).

use std::time::Duration;

use tokio::time::Instant;

use super::{Target, acquire_within, client, free_within, lost_at, unique};
use crate::fault::FaultProxy;
use crate::{AcquireOptions, ConnectOptions, Guard, Locks};

/// The lease of the proxied client in the partition case.
const LEASE: Duration = Duration::from_secs(2);

/// How soon another client must get a lock after a fault: far below the 30 s lease a
/// left-over hold would keep.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Makes one `#[tokio::test]` per wire fault case in a module named after the backend.
///
/// `$target` gives a [`Target`](crate::conformance::Target) whose URL lists its servers as
/// `host:port` (several separated by commas); each gets a proxy of its own.
#[macro_export]
macro_rules! wire_fault_suite {
    ($backend:ident, $target:expr) => {
        $crate::conformance_suite!(@cases $backend, $target;
            promise4_wire_lost_acquire_reply_leaves_no_hold,
            promise4_wire_lost_release_reply_keeps_holds_exact,
            promise2_wire_partition_fires_lost_before_a_rival,
        );
    };
}

/// A backend URL rewritten to reach its servers through fault proxies.
struct Proxied {
    url: String,
    proxies: Vec<FaultProxy>,
}

impl Proxied {
    /// Starts a proxy for every server `target`'s URL names.
    async fn new(target: &Target, case: &str) -> Proxied {
        let url = target.url_for(case);
        let (scheme, rest) = url
            .split_once("://")
            .unwrap_or_else(|| panic!("{url}: not a URL"));
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
            None => (String::new(), authority),
        };
        let mut proxies = Vec::new();
        let mut addresses = Vec::new();
        for host in hosts.split(',') {
            let server = tokio::net::lookup_host(host)
                .await
                .ok()
                .and_then(|mut found| found.next())
                .unwrap_or_else(|| panic!("{url}: cannot resolve {host} (host:port expected)"));
            let proxy = FaultProxy::start(server)
                .await
                .expect("start a fault proxy");
            addresses.push(proxy.address().to_string());
            proxies.push(proxy);
        }
        Proxied {
            url: format!("{scheme}://{userinfo}{}{tail}", addresses.join(",")),
            proxies,
        }
    }

    fn lose_next_reply(&self) {
        for proxy in &self.proxies {
            proxy.lose_next_reply();
        }
    }

    fn replies_lost(&self) -> u64 {
        self.proxies.iter().map(FaultProxy::replies_lost).sum()
    }

    fn blackhole(&self) {
        self.proxies.iter().for_each(FaultProxy::blackhole);
    }

    fn heal(&self) {
        self.proxies.iter().for_each(FaultProxy::heal);
    }
}

async fn connect(url: &str, options: ConnectOptions) -> Locks {
    crate::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Another client gets `name` promptly: nothing is left behind.
async fn free_promptly(target: &Target, name: &str, what: &str) {
    free_within(target, name, PROMPTLY, what).await;
}

/// While `guard` is not lost, another client cannot take its lock.
async fn excluded_unless_lost(target: &Target, name: &str, guard: &Guard, what: &str) {
    let other = client(target).await;
    let rival = other
        .mutex(name)
        .unwrap()
        .try_acquire()
        .await
        .expect("try_acquire");
    if let Some(rival) = rival {
        assert!(
            guard.is_lost(),
            "{what}: another client got a lock whose guard is not lost"
        );
        rival.release().await.expect("release the rival");
    }
}

/// Promise 4: the reply of an acquire is lost on the wire (the connection is cut as it
/// arrives). Whatever the acquire answers, hold counts are exact: a guard it returns excludes
/// others, and once everything is released the lock is free.
pub async fn promise4_wire_lost_acquire_reply_leaves_no_hold(target: &Target) {
    let proxied = Proxied::new(target, "promise4_wire_lost_acquire_reply_leaves_no_hold").await;
    let locks = connect(&proxied.url, ConnectOptions::new()).await;
    let name = unique("wire_lost_acquire_reply");
    // The client's connections are open and idle: the next request is the acquire's.
    locks.is_locked(&name).await.expect("a first request");
    proxied.lose_next_reply();
    let acquired = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await;
    assert!(
        proxied.replies_lost() >= 1,
        "no reply was lost, so nothing was tested"
    );
    if let Ok(guard) = acquired {
        excluded_unless_lost(target, &name, &guard, "lost acquire reply").await;
        let _ = guard.release().await;
    }
    free_promptly(target, &name, "lost acquire reply").await;
}

/// Promise 4: the reply of the release of one of two holds is lost on the wire (or, where
/// that release sends nothing, the reply of the last one). The other hold still excludes
/// everyone (or its guard reports the loss, for backends whose locks die with their
/// connection), and once both are released the lock is free.
pub async fn promise4_wire_lost_release_reply_keeps_holds_exact(target: &Target) {
    let proxied = Proxied::new(target, "promise4_wire_lost_release_reply_keeps_holds_exact").await;
    let locks = connect(&proxied.url, ConnectOptions::new()).await;
    let name = unique("wire_lost_release_reply");
    let outer = locks
        .holder()
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    let inner = outer.reenter().await.expect("re-enter");
    proxied.lose_next_reply();
    let _ = inner.release().await;
    excluded_unless_lost(target, &name, &outer, "lost release reply").await;
    // Where releasing one of several holds sends nothing (session locks count them in the
    // client), the reply lost is the last release's.
    let _ = outer.release().await;
    assert!(
        proxied.replies_lost() >= 1,
        "no reply was lost, so nothing was tested"
    );
    free_promptly(target, &name, "lost release reply").await;
}

/// Promise 2: the client is cut off from its servers (nothing passes either way) while it
/// holds a renewed and a fixed-lease lock, with renewals in flight. Both guards fire `lost()`,
/// and before another client is granted either lock.
pub async fn promise2_wire_partition_fires_lost_before_a_rival(target: &Target) {
    let proxied = Proxied::new(target, "promise2_wire_partition_fires_lost_before_a_rival").await;
    let locks = connect(&proxied.url, ConnectOptions::new().lease(LEASE)).await;
    let (renewed_name, fixed_name) = (
        unique("wire_partition/renewed"),
        unique("wire_partition/fixed"),
    );
    let renewed = locks
        .mutex(renewed_name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire the renewed lock");
    let fixed = locks
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().lease(LEASE))
        .await
        .expect("acquire the fixed-lease lock");
    // Into the first renewal interval, so that a renewal is in flight when the cut comes.
    tokio::time::sleep(LEASE / 3 + Duration::from_millis(50)).await;
    proxied.blackhole();
    let rivals = [&renewed_name, &fixed_name].map(|name| {
        let (target, name) = (target.clone(), name.clone());
        tokio::spawn(async move {
            let rival = client(&target).await;
            let granted = acquire_within(&rival, &name, LEASE * 5).await.ok();
            (Instant::now(), granted)
        })
    });
    let watch = Duration::from_secs(30);
    let (renewed_lost, fixed_lost) = tokio::join!(lost_at(&renewed, watch), lost_at(&fixed, watch));
    let renewed_lost = renewed_lost.expect("the renewed lock never fired lost() in the partition");
    let fixed_lost = fixed_lost.expect("the fixed-lease lock never fired lost() in the partition");
    for ((what, lost), rival) in [("renewed", renewed_lost), ("fixed-lease", fixed_lost)]
        .into_iter()
        .zip(rivals)
    {
        let (granted_at, granted) = tokio::time::timeout(watch, rival)
            .await
            .expect("a rival hung")
            .expect("rival task");
        if let Some(guard) = granted {
            assert!(
                lost < granted_at,
                "a rival was granted the {what} lock {:?} before its holder fired lost()",
                lost - granted_at
            );
            let _ = guard.release().await;
        }
    }
    proxied.heal();
    let _ = renewed.release().await;
    let _ = fixed.release().await;
}

/// For the session locks (PostgreSQL advisory, MySQL/MariaDB named; not part of
/// [`wire_fault_suite!`](crate::wire_fault_suite)): a client whose acquisitions take turns (a
/// try that fails while another client holds, a wait the server grants, a release; four
/// times) keeps one server connection once it idles: its operator's pool closes idle
/// connections, and its primary connection, unused, becomes the idle lock connection that the
/// next try and wait take. Counted at a proxy in front of the server.
pub async fn session_client_keeps_one_connection(target: &Target) {
    let proxied = Proxied::new(target, "session_client_keeps_one_connection").await;
    let locks = connect(&proxied.url, ConnectOptions::new()).await;
    let other = client(target).await;
    let name = unique("one_connection");
    let mutex = locks.mutex(name.as_str()).unwrap();
    let round = || async {
        let held = other.mutex(name.as_str()).unwrap().acquire().await.unwrap();
        let waiting = tokio::spawn({
            let mutex = mutex.clone();
            async move {
                mutex
                    .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
                    .await
            }
        });
        // Long enough for the try to fail and the wait to reach the server.
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.release().await.unwrap();
        let guard = tokio::time::timeout(PROMPTLY, waiting)
            .await
            .expect("the waiter was not granted the lock")
            .unwrap()
            .expect("acquire");
        guard.release().await.unwrap();
    };
    for _ in 0..4 {
        round().await;
    }
    let kept = |limit: u64| {
        let proxied = &proxied;
        async move {
            let start = Instant::now();
            loop {
                let open: u64 = proxied.proxies.iter().map(FaultProxy::connections).sum();
                if open <= limit {
                    return open;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{open} server connections still open after the client idled for 10 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(kept(1).await, 1, "the client kept no lock connection");
    // And the next rounds run on that connection: none is opened for them.
    let accepted: u64 = proxied
        .proxies
        .iter()
        .map(FaultProxy::connections_accepted)
        .sum();
    for _ in 0..2 {
        round().await;
    }
    let opened = proxied
        .proxies
        .iter()
        .map(FaultProxy::connections_accepted)
        .sum::<u64>()
        - accepted;
    assert_eq!(
        opened, 0,
        "{opened} connections were opened for two more rounds"
    );
}

/// Promise 4 for the session locks: a waiter dropped after its wait began but before its
/// statement was sent (its task had not run yet, so there was no session to cancel) sends no
/// statement afterwards. Before, the statement started anyway and waited in the server's
/// queue, unseen and uncancelled, for all of the wait's time, taking the lock on its way.
/// Counted at a proxy; run it on a current-thread runtime, where the drop always comes
/// before the waiter's task first runs.
pub async fn session_waiter_dropped_before_its_statement_sends_none(target: &Target) {
    use crate::backend::{Acquired, Owner};
    use crate::name::LockName;
    let proxied = Proxied::new(target, "session_waiter_dropped_before_its_statement").await;
    let backend = crate::open_backend(&proxied.url)
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", proxied.url));
    let other = client(target).await;
    let name = unique("dropped_waiter");
    let held = other.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let lock = LockName::new(name.as_str()).unwrap();
    let owner = Owner::new("dropped-waiter", 1);
    let lease = Duration::from_secs(30);
    // As an acquire does: a try, refused, then the wait.
    let tried = backend.try_acquire(&lock, &owner, lease).await.unwrap();
    assert!(
        matches!(tried, Acquired::Held { .. }),
        "a held lock was not refused: {tried:?}"
    );
    let mut waiter = backend.subscribe(&lock, &owner, lease).await.unwrap();
    {
        let mut wait = waiter.wait(Duration::from_secs(20));
        assert!(
            super::cancel::poll_once(&mut wait).await.is_none(),
            "the wait ended at once"
        );
    }
    let sent = |proxied: &Proxied| -> (u64, u64) {
        let requests = proxied.proxies.iter().map(FaultProxy::requests).sum();
        let accepted = proxied
            .proxies
            .iter()
            .map(FaultProxy::connections_accepted)
            .sum();
        (requests, accepted)
    };
    let before = sent(&proxied);
    drop(waiter);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sent(&proxied),
        before,
        "(requests, connections) went on after the waiter was dropped: its statement started"
    );
    held.release().await.unwrap();
    let next = acquire_within(&other, &name, PROMPTLY)
        .await
        .expect("the lock was not free after its holder released it");
    next.release().await.unwrap();
}
