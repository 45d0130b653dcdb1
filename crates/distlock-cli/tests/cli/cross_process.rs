//! Holders in other processes, killed with SIGKILL or stopped with SIGSTOP: their locks
//! free within their lease (ZooKeeper: their session timeout; etcd: their etcd lease's TTL).

use std::process::Command;
use std::time::{Duration, Instant};

use distlock::AcquireOptions;

use crate::{
    etcd_url, mysql_url, postgres_url, redis_cluster_url, redis_sentinel_url, redis_url,
    spawn_holder, spawn_holder_of, sqlite_url, zookeeper_url,
};

/// The lease of the holder process the SIGKILL tests start.
const HOLDER_LEASE: Duration = Duration::from_millis(1000);

/// The backends whose locks other processes can hold, listed once.
macro_rules! cross_process_suite {
    ($($backend:ident => $url:expr;)*) => {$(
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_holder_frees_its_lock_within_its_lease() {
                let (url, _keep) = $url;
                killed_holder_frees_its_lock(&url, HOLDER_LEASE + Duration::from_millis(500)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_permit_holder_writer_and_leader_free_within_their_lease() {
                let (url, _keep) = $url;
                killed_primitive_holders_free(&url, HOLDER_LEASE + Duration::from_millis(500)).await;
            }
        }
    )*};
}

cross_process_suite! {
    sqlite => {
        let dir = tempfile::tempdir().unwrap();
        (sqlite_url(dir.path()), dir)
    };
    redis => (redis_url(), ());
    redis_spin => (redis_url().replacen("redis://", "redis+spin://", 1), ());
    redis_sentinel => (redis_sentinel_url(), ());
    redis_cluster => (redis_cluster_url(), ());
    postgres_advisory => (postgres_url(), ());
    postgres_table => (format!("{}?mode=table", postgres_url()), ());
    mysql_named => (mysql_url(), ());
    mysql_table => (format!("{}?mode=table", mysql_url()), ());
}

/// ZooKeeper frees a dead holder's lock when its session expires, not at a lease: with a 2 s
/// session timeout the server notices within the timeout plus one tick (0.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_killed_holder_frees_its_lock_within_the_session_timeout() {
    let url = format!("{}?session_timeout=2s", zookeeper_url());
    killed_holder_frees_its_lock(&url, Duration::from_millis(3000)).await;
}

/// etcd frees a dead holder's lock when the holder's etcd lease runs out: with a 2 s TTL the
/// server notices within the TTL plus its expiry check (every 0.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_holder_frees_its_lock_within_the_lease_ttl() {
    let url = format!("{}?lease_ttl=2s", etcd_url());
    killed_holder_frees_its_lock(&url, Duration::from_millis(3000)).await;
}

/// A killed permit holder's, writer's and leader's locks free when the session expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_killed_permit_holder_writer_and_leader_free_within_the_session_timeout() {
    let url = format!("{}?session_timeout=2s", zookeeper_url());
    killed_primitive_holders_free(&url, Duration::from_millis(3000)).await;
}

/// A killed permit holder's, writer's and leader's locks free when their etcd lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_permit_holder_writer_and_leader_free_within_the_lease_ttl() {
    let url = format!("{}?lease_ttl=2s", etcd_url());
    killed_primitive_holders_free(&url, Duration::from_millis(3000)).await;
}

/// A holder process stopped (SIGSTOP) past its session timeout: the server expires the
/// session and grants the lock to another client, with a larger token; when the holder runs
/// again it learns that its session expired and its guard reports the loss (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_paused_holder_learns_its_session_expired() {
    paused_holder_learns_its_loss(&format!("{}?session_timeout=2s", zookeeper_url())).await;
}

/// As for ZooKeeper, with the holder's etcd lease: the server ends it 2 s into the stop and
/// grants the lock to another client; the resumed holder finds no keep-alive answered for
/// half the TTL and reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_paused_holder_learns_its_lease_ran_out() {
    paused_holder_learns_its_loss(&format!("{}?lease_ttl=2s", etcd_url())).await;
}

async fn paused_holder_learns_its_loss(url: &str) {
    let url = url.to_owned();
    let name = format!("paused/{}/{}", std::process::id(), fastrand::u64(..));
    // A 30 s renewed lease: the loss must come from the session, not from a renewal.
    let (mut holder, token) = spawn_holder(&url, &name, 30_000);
    let pid = holder.id().to_string();
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let locks = distlock::connect(&url).await.unwrap();
    let stopped_at = Instant::now();
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the stopped holder's session or lease did not end");
    let granted_after = stopped_at.elapsed();
    assert!(guard.fencing_token() > token);
    signal("-CONT");
    let resumed_at = Instant::now();
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        if resumed_at.elapsed() > Duration::from_secs(10) {
            let _ = holder.kill();
            panic!("the resumed holder did not learn that its session or lease ended");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "{stderr}");
    eprintln!(
        "granted to another client {granted_after:?} after the stop; the holder knew {:?} after it resumed",
        resumed_at.elapsed()
    );
    guard.release().await.unwrap();
}

async fn killed_holder_frees_its_lock(url: &str, bound: Duration) {
    let lease = HOLDER_LEASE;
    let name = format!("killed/{}/{}", std::process::id(), fastrand::u64(..));
    let (mut holder, token) = spawn_holder(url, &name, lease.as_millis() as u64);
    let locks = distlock::connect(url).await.unwrap();
    assert!(locks.is_locked(&name).await.unwrap());
    let mutex = locks.mutex(name.as_str()).unwrap();
    assert!(
        mutex.try_acquire().await.unwrap().is_none(),
        "granted while another process holds it"
    );
    holder.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    holder.wait().unwrap();
    let guard = mutex
        .acquire_with(AcquireOptions::new().wait(bound * 3))
        .await
        .expect("the killed holder's lock never freed");
    let freed_after = killed_at.elapsed();
    assert!(freed_after <= bound, "freed after {freed_after:?}");
    assert!(guard.fencing_token() > token);
    guard.release().await.unwrap();
}

/// Promise 4 across processes: a process holding the only permit of a semaphore, one holding
/// the write lock of a reader-writer lock (its gate and 16 slots), and an election's leader are
/// SIGKILLed; each lock frees within `bound` (a successor leads), and the next grant's token
/// (term) is larger.
async fn killed_primitive_holders_free(url: &str, bound: Duration) {
    let lease_ms = HOLDER_LEASE.as_millis() as u64;
    let locks = distlock::connect(url).await.unwrap();

    let name = format!("killed-permit/{}/{}", std::process::id(), fastrand::u64(..));
    let (mut holder, token) = spawn_holder_of(
        url,
        &name,
        lease_ms,
        &["--kind", "permit", "--permits", "1"],
    );
    let semaphore = locks.semaphore(name.as_str(), 1).unwrap();
    assert!(
        semaphore.try_acquire().await.unwrap().is_none(),
        "a second permit while another process holds the only one"
    );
    holder.kill().expect("SIGKILL the permit holder");
    let killed_at = Instant::now();
    holder.wait().unwrap();
    let permit = semaphore
        .acquire_with(AcquireOptions::new().wait(bound * 3))
        .await
        .expect("the killed holder's permit never freed");
    let freed_after = killed_at.elapsed();
    assert!(
        freed_after <= bound,
        "the permit freed after {freed_after:?}"
    );
    assert!(permit.fencing_token() > token);
    permit.release().await.unwrap();

    let name = format!("killed-writer/{}/{}", std::process::id(), fastrand::u64(..));
    let (mut writer, token) = spawn_holder_of(url, &name, lease_ms, &["--kind", "write"]);
    let rwlock = locks.rwlock(name.as_str()).unwrap();
    assert!(
        rwlock.try_read().await.unwrap().is_none(),
        "a read while another process writes"
    );
    writer.kill().expect("SIGKILL the writer");
    let killed_at = Instant::now();
    writer.wait().unwrap();
    let read = rwlock
        .read_with(AcquireOptions::new().wait(bound * 3))
        .await
        .expect("the killed writer's locks never freed");
    let freed_after = killed_at.elapsed();
    assert!(
        freed_after <= bound,
        "the write lock freed after {freed_after:?}"
    );
    assert!(
        read.fencing_token() > token,
        "a read's token not above the killed write's"
    );
    read.release().await.unwrap();
    let name = format!("killed-leader/{}/{}", std::process::id(), fastrand::u64(..));
    let (mut leader, term) = spawn_holder_of(url, &name, lease_ms, &["--kind", "leader"]);
    let election = locks.election(name.as_str()).unwrap();
    let before = election
        .leader()
        .await
        .unwrap()
        .expect("the leader process leads");
    assert_eq!(before.term, term);
    leader.kill().expect("SIGKILL the leader");
    let killed_at = Instant::now();
    leader.wait().unwrap();
    let leadership = election
        .campaign_with("successor", AcquireOptions::new().wait(bound * 3))
        .await
        .expect("the killed leader was never replaced");
    let replaced_after = killed_at.elapsed();
    assert!(replaced_after <= bound, "replaced after {replaced_after:?}");
    assert!(
        leadership.term() > term,
        "the new term is not above the killed leader's"
    );
    let now = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (now.term, now.value.as_str()),
        (leadership.term(), "successor")
    );
    leadership.resign().await.unwrap();
}
