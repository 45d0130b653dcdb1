//! The ZooKeeper backend on real servers: the conformance suite on a standalone server and on
//! a 3-node ensemble (both started by `scripts/test`), and what is particular to ZooKeeper.

use distlock::conformance::{Target, servers};

fn standalone() -> String {
    servers::ZOOKEEPER.url()
}

fn ensemble() -> String {
    servers::ZOOKEEPER_ENSEMBLE.url()
}

fn naive() -> String {
    servers::with_scheme(&servers::ZOOKEEPER.url(), "zk+naive")
}

distlock::conformance_suite!(zk, Target::new(standalone()));
distlock::conformance_suite!(zk_ensemble, Target::new(ensemble()));
distlock::conformance_suite!(zk_naive, Target::new(naive()));

/// A target whose sessions time out after 2 s, so that a partition ends them quickly.
fn short_sessions(url: String) -> Target {
    Target::new(servers::with_query(&url, "session_timeout=2s"))
}

distlock::wire_fault_suite!(zk_wire, short_sessions(standalone()));
distlock::wire_fault_suite!(zk_ensemble_wire, short_sessions(ensemble()));
distlock::wire_fault_suite!(zk_naive_wire, short_sessions(naive()));

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zk_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(standalone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zk_ensemble_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(ensemble())).await;
}

use std::time::Duration;

use distlock::fault::FaultProxy;
use distlock::{AcquireOptions, SessionState};
use tokio::time::Instant;
use zookeeper_client as zkc;

/// The first server of a `zk://` URL, as `host:port`.
fn first_server(url: &str) -> String {
    servers::first_address(url).to_owned()
}

/// A raw ZooKeeper client, to look at the nodes distlock makes and to play a Curator client.
async fn raw(url: &str) -> zkc::Client {
    zkc::Client::connector()
        .connect(&first_server(url))
        .await
        .expect("raw ZooKeeper client")
}

fn unique(case: &str) -> String {
    format!("zk/{case}/{}", uuid::Uuid::new_v4().simple())
}

/// `BASE/NAME` for the default base and a name made of safe characters and `/`.
fn lock_znode(name: &str) -> String {
    format!("/distlock/locks/{}", name.replace('/', "%2F"))
}

/// Curator's `InterProcessMutex` layout: `_c_<uuid>-lock-<10 digits>` under the lock's path,
/// holding the owner; and a contender that follows Curator's recipe on the same path excludes
/// distlock and is excluded by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_follow_curators_layout_and_exclude_a_curator_client() {
    let url = standalone();
    let locks = distlock::connect(&url).await.unwrap();
    let zk = raw(&url).await;
    let name = unique("curator");
    let path = lock_znode(&name);

    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let children = zk.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let child = &children[0];
    let rest = child.strip_prefix("_c_").expect("protected prefix");
    let (uuid, sequence) = rest.split_once("-lock-").expect("-lock- separator");
    assert!(
        uuid::Uuid::parse_str(uuid).is_ok() && uuid.len() == 36,
        "{child}"
    );
    assert!(
        sequence.len() == 10 && sequence.bytes().all(|b| b.is_ascii_digit()),
        "{child}"
    );
    let (data, stat) = zk.get_data(&format!("{path}/{child}")).await.unwrap();
    assert!(stat.ephemeral_owner != 0, "not ephemeral");
    assert_eq!(
        guard.fencing_token(),
        stat.czxid as u64,
        "token is the node's czxid"
    );
    assert!(String::from_utf8(data).unwrap().starts_with("distlock "));

    // A Curator client arriving now queues behind distlock: not lowest, so not the holder.
    let curator = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    let prefix = format!("{path}/_c_{}-lock-", uuid::Uuid::new_v4());
    let (_, seq) = zk.create(&prefix, b"127.0.0.1", &curator).await.unwrap();
    let curator_node = format!("{prefix}{seq}");
    let mut line = zk.list_children(&path).await.unwrap();
    line.sort_by_key(|c| c.rsplit("lock-").next().unwrap().to_owned());
    assert_eq!(&line[0], child, "distlock's node is first in line");

    // distlock releases: the Curator node is first in line, so by Curator's rule it holds the
    // lock, and distlock clients are refused until it leaves.
    guard.release().await.unwrap();
    let other = distlock::connect(&url).await.unwrap();
    assert!(other.is_locked(&name).await.unwrap());
    assert!(
        other
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "granted while a Curator client holds the lock"
    );
    let waiting = tokio::spawn({
        let other = other.clone();
        let name = name.clone();
        async move { other.mutex(name).unwrap().acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "granted while a Curator client holds the lock"
    );
    zk.delete(&curator_node, None).await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("not granted after the Curator client left")
        .unwrap();
    assert!(granted.fencing_token() > stat.czxid as u64);
    granted.release().await.unwrap();
}

/// A fault proxy in front of the first server of `url`.
async fn proxy(url: &str) -> FaultProxy {
    let server = first_server(url)
        .parse()
        .expect("the ZooKeeper address is host:port with a numeric host");
    FaultProxy::start(server)
        .await
        .expect("start a fault proxy")
}

/// True for a ZooKeeper create request: its length (4 bytes), xid (4) and opcode (4), where
/// create is 1, create2 15, createContainer 19, createTTL 21.
fn is_create(request: &[u8]) -> bool {
    request.len() >= 12
        && matches!(
            i32::from_be_bytes([request[8], request[9], request[10], request[11]]),
            1 | 15 | 19 | 21
        )
}

/// True for a ZooKeeper getChildren request (opcode 8, or 12 for getChildren2).
fn is_list(request: &[u8]) -> bool {
    request.len() >= 12
        && matches!(
            i32::from_be_bytes([request[8], request[9], request[10], request[11]]),
            8 | 12
        )
}

/// Promise 4: a create whose reply is lost, and whose lookup then fails too (its reply lost
/// as well), makes the acquire fail; the node it may have made does not stay in the live
/// session blocking the queue: it is found and deleted, and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_create_whose_reply_and_lookup_fail_leaves_no_orphan() {
    let url = standalone();
    let proxy = proxy(&url).await;
    let locks = distlock::connect(&format!("zk://{}/", proxy.address()))
        .await
        .unwrap();
    let zk = raw(&url).await;
    let name = unique("lost_reply_and_lookup");
    let path = lock_znode(&name);
    zk.create(
        &path,
        &[],
        &zkc::CreateMode::Container.with_acls(zkc::Acls::anyone_all()),
    )
    .await
    .unwrap();
    proxy.lose_reply_of_next(is_create);
    proxy.lose_reply_of_next(is_list);
    let attempt = tokio::time::timeout(
        Duration::from_secs(20),
        locks.mutex(name.as_str()).unwrap().try_acquire(),
    )
    .await
    .expect("try_acquire hung after the lost replies");
    assert_eq!(
        proxy.replies_lost(),
        2,
        "the create's and the lookup's replies were not both lost"
    );
    if let Ok(Some(guard)) = attempt {
        // Found on a later lookup: then it is a proper grant.
        guard.release().await.unwrap();
    }
    let other = distlock::connect(&url).await.unwrap();
    let granted = other
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("a node of the failed create blocks the queue");
    let children = zk.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "an orphan node is left: {children:?}");
    granted.release().await.unwrap();
}

/// A create whose reply is lost with the connection leaves no orphan: the client reconnects
/// (same session), finds its node by the protected prefix and takes the lock with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_was_lost_is_found_by_its_prefix() {
    let url = standalone();
    let proxy = proxy(&url).await;
    let locks = distlock::connect(&format!("zk://{}/", proxy.address()))
        .await
        .unwrap();
    let zk = raw(&url).await;
    let name = unique("lost_reply");
    let path = lock_znode(&name);
    // Make the lock's node first, so that the armed request is the create of our node.
    zk.create(
        &path,
        &[],
        &zkc::CreateMode::Container.with_acls(zkc::Acls::anyone_all()),
    )
    .await
    .unwrap();
    let mutex = locks.mutex(name.as_str()).unwrap();

    proxy.lose_reply_of_next(is_create);
    let guard = tokio::time::timeout(Duration::from_secs(10), mutex.try_acquire())
        .await
        .expect("try_acquire hung after the lost reply")
        .expect("try_acquire failed after the lost reply")
        .expect("the lock was refused: an orphan node blocks it");
    assert_eq!(proxy.replies_lost(), 1, "no reply was lost");
    assert_eq!(proxy.connections_accepted(), 2, "no reconnection");
    let children = zk.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "an orphan node was left: {children:?}");
    let (_, stat) = zk
        .get_data(&format!("{path}/{}", children[0]))
        .await
        .unwrap();
    assert_eq!(guard.fencing_token(), stat.czxid as u64);
    guard.release().await.unwrap();
    assert!(zk.list_children(&path).await.unwrap_or_default().is_empty());
}

/// A partition longer than the session timeout: the client shows Suspended at once, the
/// server expires the session and frees the lock for another client, the holder's guards
/// (renewed and fixed-lease) report the loss, and after the partition the client has a new
/// session and works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_frees_the_lock_and_fires_lost() {
    let url = standalone();
    let proxy = proxy(&url).await;
    let holder = distlock::connect(&format!("zk://{}/?session_timeout=2s", proxy.address()))
        .await
        .unwrap();
    let mut session = holder.session().expect("ZooKeeper has a session");
    assert_eq!(session.borrow_and_update().state, SessionState::Connected);
    let (renewed_name, fixed_name) = (unique("expiry_renewed"), unique("expiry_fixed"));
    let renewed = crate::common::hold(&holder, renewed_name.as_str()).await;
    let fixed = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().lease(Duration::from_secs(60)))
        .await
        .unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let waiting = tokio::spawn({
        let rival = rival.clone();
        let name = renewed_name.clone();
        async move {
            let guard = rival.mutex(name).unwrap().acquire().await.unwrap();
            (guard, Instant::now())
        }
    });

    let cut_at = Instant::now();
    proxy.partition();
    tokio::time::timeout(
        Duration::from_secs(2),
        session.wait_for(|s| s.state == SessionState::Suspended),
    )
    .await
    .expect("Suspended not reported within 2 s of the cut")
    .unwrap();
    assert!(
        !renewed.is_lost(),
        "lost at the cut, before the session timeout"
    );

    let lost = tokio::time::timeout(Duration::from_secs(10), renewed.lost())
        .await
        .expect("lost() did not fire after the session timeout");
    assert!(lost.is_lock_lost());
    let lost_after = cut_at.elapsed();
    // Given up half a session timeout after the last probe the leader confirmed, and probes go
    // every sixth of one: a third of a session timeout after the cut at the earliest, and
    // before the server can expire the session.
    assert!(
        lost_after >= Duration::from_millis(600),
        "lost too early: {lost_after:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), fixed.lost())
        .await
        .expect("the fixed-lease guard was not told");

    let (rival_guard, granted_at) = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the server did not free the lock of the expired session")
        .unwrap();
    assert!(rival_guard.fencing_token() > renewed.fencing_token());
    let freed_after = granted_at - cut_at;
    assert!(
        freed_after > lost_after,
        "another client was granted the lock ({freed_after:?}) before the holder was told ({lost_after:?})"
    );

    proxy.heal();
    tokio::time::timeout(
        Duration::from_secs(15),
        session.wait_for(|s| s.state == SessionState::Connected && s.sessions_lost == 1),
    )
    .await
    .expect("no new session after the partition healed")
    .unwrap();
    assert!(
        !renewed.is_held().await.unwrap(),
        "the old grant is held again"
    );
    let err = renewed.release().await.expect_err("released a lost lock");
    assert!(err.is_lock_lost() || err.is_not_owner(), "{err}");
    // The new session takes locks again.
    let again = crate::common::hold(&holder, fixed_name.as_str()).await;
    assert!(again.fencing_token() > fixed.fencing_token());
    again.release().await.unwrap();
    rival_guard.release().await.unwrap();
    eprintln!("lost() after {lost_after:?}, lock free for others after {freed_after:?}");
}

/// A waiter that gives up (its wait runs out, or its future is dropped) takes its node out of
/// the queue: only the holder's node is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let url = standalone();
    let locks = distlock::connect(&url).await.unwrap();
    let zk = raw(&url).await;
    let name = unique("give_up");
    let path = lock_znode(&name);
    let held = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();

    let mutex = locks.mutex(name.as_str()).unwrap();
    let err = mutex
        .acquire_with(AcquireOptions::new().wait(Duration::from_millis(200)))
        .await
        .expect_err("granted a held lock");
    assert!(err.is_timeout(), "{err}");
    let dropped = tokio::time::timeout(Duration::from_millis(200), mutex.acquire()).await;
    assert!(dropped.is_err(), "granted a held lock");

    let start = Instant::now();
    loop {
        let children = zk.list_children(&path).await.unwrap();
        if children.len() == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "nodes of waiters that gave up are still queued: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    assert!(zk.list_children(&path).await.unwrap_or_default().is_empty());
}

/// Promise 2 without a false alarm: an operator's force-unlock of the oldest of a client's
/// locks (the node its session probes) loses that lock alone: the session stays, and the
/// other lock stays held past several session timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlocked_node_loses_its_lock_and_not_the_session() {
    let url = format!("{}?session_timeout=2s", standalone());
    let holder = distlock::connect(&url).await.unwrap();
    let operator = distlock::connect(&standalone()).await.unwrap();
    let mut session = holder.session().expect("ZooKeeper has a session");
    session.borrow_and_update();
    let (oldest, other) = (unique("forced_oldest"), unique("forced_other"));
    // Fixed leases: no renewal checks either lock, only the session's probes see the node.
    let options = || AcquireOptions::new().lease(Duration::from_secs(60));
    let acquire = |name: String| {
        let holder = holder.clone();
        async move {
            let mutex = holder.mutex(name).unwrap();
            mutex.acquire_with(options()).await.unwrap()
        }
    };
    let forced = acquire(oldest.clone()).await;
    let kept = acquire(other.clone()).await;
    assert!(forced.fencing_token() < kept.fencing_token());
    assert!(operator.force_unlock(&oldest).await.unwrap());
    // Three session timeouts: a session taken for lost would have shown by then.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        session.borrow().sessions_lost,
        0,
        "the session was given up for one forced node"
    );
    assert!(
        !kept.is_lost(),
        "the other lock was lost with the forced one"
    );
    assert!(
        kept.is_held().await.unwrap(),
        "the other lock is no longer held"
    );
    let rival = operator.mutex(other.as_str()).unwrap();
    assert!(
        rival.try_acquire().await.unwrap().is_none(),
        "promise 1: the other lock was granted to a rival"
    );
    kept.release().await.unwrap();
    drop(forced);
}
