//! The etcd cluster losing its leader: a cluster of the test's own, started by
//! `scripts/etcd-deployment`.

use super::*;

use crate::own_cluster::{Layout, OwnCluster};

/// `scripts/etcd-deployment cluster`: client ports base..base+2, peer ports base+100...
static ETCD: Layout = Layout {
    script: "etcd-deployment",
    mode: "cluster",
    offsets: &[0, 1, 2, 100, 101, 102],
    member_dir: |member| format!("m{member}"),
};

/// The member (1..=3) that leads now, as the members still running say.
async fn leading_member(cluster: &OwnCluster) -> Option<u16> {
    for member in 1..=3 {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=127.0.0.1:{}", cluster.port(member)))
            .args(["--dial-timeout=500ms", "--command-timeout=1s"])
            .args(["endpoint", "status", "-w", "fields"])
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        let Ok(Ok(output)) = tokio::task::spawn_blocking(move || command.output()).await else {
            continue;
        };
        let status = String::from_utf8_lossy(&output.stdout);
        let value = |name: &str| status.lines().find_map(|line| field(line, name));
        if output.status.success()
            && value("MemberID").is_some()
            && value("MemberID") == value("Leader")
        {
            return Some(member);
        }
    }
    None
}

/// Promises 1 and 3 when the cluster loses its leader while a lock is held and contended:
/// another member is elected, the holder keeps the lock (no double grant), the waiter is
/// granted once the holder releases, with a larger token; the killed member rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_the_lock_survives_the_loss_of_the_cluster_leader() {
    let cluster = OwnCluster::start(&ETCD);
    let url = cluster.url("etcd");
    let holder = distlock::connect(&url).await.unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let name = unique("leader_loss");
    let guard = crate::common::hold(&holder, name.as_str()).await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            rival
                .mutex(name)
                .unwrap()
                .acquire_with(AcquireOptions::new().wait(Duration::from_secs(90)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let leader = leading_member(&cluster)
        .await
        .expect("the cluster has a leader");
    cluster.kill(leader);
    let start = Instant::now();
    while leading_member(&cluster).await.is_none_or(|l| l == leader) {
        assert!(start.elapsed() < Duration::from_secs(30), "no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut held = None;
    while start.elapsed() < Duration::from_secs(30) {
        match guard.is_held().await {
            Ok(answer) => {
                held = Some(answer);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(held, Some(true), "the holder lost the lock with the leader");
    assert!(!guard.is_lost(), "lost() fired though the lease survived");
    assert!(!waiting.is_finished(), "granted to a second holder");

    cluster.deploy();
    assert!(!waiting.is_finished(), "granted to a second holder");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter was not granted after the release")
        .unwrap()
        .expect("the waiter's acquire failed");
    assert!(granted.fencing_token() > token);
    granted.release().await.unwrap();
}
