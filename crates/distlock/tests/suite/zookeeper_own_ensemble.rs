//! ZooKeeper tests that start a 3-node ensemble of their own (by `scripts/zookeeper-deployment`,
//! on free loopback ports) to do to its servers what the shared one must not see: kill its
//! leader, stop a follower.

use std::time::Duration;

use tokio::time::Instant;

use crate::own_cluster::{Layout, OwnCluster};

fn unique(case: &str) -> String {
    format!("zk/{case}/{}", uuid::Uuid::new_v4().simple())
}

/// `scripts/zookeeper-deployment ensemble`: client ports base..base+2, then the quorum and
/// election ports.
static ZOOKEEPER: Layout = Layout {
    script: "zookeeper-deployment",
    mode: "ensemble",
    offsets: &[0, 1, 2, 10, 11, 12, 20, 21, 22],
    member_dir: |node| format!("node{node}"),
};

/// The node (1..=3) that leads now, asked with the `srvr` command.
fn leading_member(ensemble: &OwnCluster) -> Option<u16> {
    (1..=3).find(|&node| {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", ensemble.port(node)))
        else {
            return false;
        };
        let mut reply = String::new();
        use std::io::{Read, Write};
        // A stopped server still accepts connections: a read must not wait forever.
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        stream.write_all(b"srvr").is_ok()
            && stream.read_to_string(&mut reply).is_ok()
            && reply.contains("Mode: leader")
    })
}

/// `zk://` on node `node`'s server alone.
fn url_of(ensemble: &OwnCluster, node: u16) -> String {
    format!("zk://127.0.0.1:{}/", ensemble.port(node))
}

/// Killing the ensemble's leader while a lock is held: the ensemble elects another leader,
/// the session survives, the holder keeps the lock, nobody else is granted it meanwhile, and
/// the waiter gets it once the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_survives_the_loss_of_the_ensemble_leader() {
    let ensemble = OwnCluster::start(&ZOOKEEPER);
    let url = ensemble.url("zk");
    let holder = distlock::connect(&url).await.unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let name = unique("leader_loss");
    let guard = crate::common::hold(&holder, name.as_str()).await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move { rival.mutex(name).unwrap().acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let leader = leading_member(&ensemble).expect("the ensemble has a leader");
    ensemble.kill(leader);
    // Wait for a new leader, then a little longer for the clients to reconnect.
    let start = Instant::now();
    while leading_member(&ensemble).is_none_or(|l| l == leader) {
        assert!(start.elapsed() < Duration::from_secs(30), "no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elected_after = start.elapsed();
    let mut held = None;
    while start.elapsed() < Duration::from_secs(20) {
        match guard.is_held().await {
            Ok(answer) => {
                held = Some(answer);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(held, Some(true), "the holder lost the lock with the leader");
    assert!(!guard.is_lost(), "lost() fired though the session survived");
    assert!(!waiting.is_finished(), "granted to a second holder");

    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not granted after the release")
        .unwrap();
    assert!(granted.fencing_token() > token);
    granted.release().await.unwrap();
    eprintln!("new leader after {elected_after:?}");
}

/// Promise 1 as others read it: a read on a follower that is behind the leader still sees a
/// grant made before the read was sent. `is_locked`, `list_held`, an election's `leader()` and
/// `force_unlock` each catch their server up first (`sync`). The follower is stopped
/// (`SIGSTOP`) while the leader grants through the other follower's vote, the read is sent to
/// it, and it resumes with the grant's commit and the read waiting side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_read_on_a_lagging_follower_sees_a_grant_made_before_it() {
    let ensemble = OwnCluster::start(&ZOOKEEPER);
    let leader = within(Duration::from_secs(60), async {
        loop {
            if let Some(node) = leading_member(&ensemble) {
                return node;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let follower = (1..=3).find(|&node| node != leader).unwrap();
    // A short lease, so that the holder's check finds a force-unlock soon.
    let options = || distlock::ConnectOptions::new().lease(Duration::from_secs(1));
    let (leader_url, follower_url) = (url_of(&ensemble, leader), url_of(&ensemble, follower));
    let granting = within(LIMIT, distlock::connect_with(&leader_url, options())).await;
    let granting = granting.unwrap();
    let reading = within(LIMIT, distlock::connect_with(&follower_url, options())).await;
    let reading = std::sync::Arc::new(reading.unwrap());
    // Sends `read` to the stopped follower, lets it resume, and returns the answer.
    async fn behind<T: Send + 'static>(
        ensemble: &OwnCluster,
        follower: u16,
        read: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let read = tokio::spawn(read);
        tokio::time::sleep(Duration::from_millis(50)).await;
        ensemble.signal(follower, "-CONT");
        within(LIMIT, read).await.unwrap()
    }
    for round in 0..6 {
        let name = unique("read_behind");
        ensemble.signal(follower, "-STOP");
        let mutex = granting.mutex(name.as_str()).unwrap();
        let guard = within(LIMIT, mutex.acquire()).await.unwrap();
        let (r, n) = (reading.clone(), name.clone());
        let read = match round % 3 {
            0 => behind(&ensemble, follower, async move { r.is_locked(&n).await }).await,
            1 => {
                let list = async move { r.list_held(&n, 10).await.map(|l| l.len() == 1) };
                behind(&ensemble, follower, list).await
            }
            _ => behind(&ensemble, follower, async move { r.force_unlock(&n).await }).await,
        };
        assert!(
            read.unwrap(),
            "round {round}: the follower's read missed the grant"
        );
        if round % 3 == 2 {
            within(Duration::from_secs(3), guard.lost()).await;
        } else {
            within(LIMIT, guard.release()).await.unwrap();
        }
        ensemble.signal(follower, "-STOP");
        let election = granting.election(name.as_str()).unwrap();
        let leadership = within(LIMIT, election.campaign("x")).await;
        let leadership = leadership.unwrap();
        let (r, n) = (reading.clone(), name.clone());
        let leader_read = async move { r.election(n.as_str()).unwrap().leader().await };
        let read = behind(&ensemble, follower, leader_read).await.unwrap();
        let term = read.map(|l| l.term);
        assert_eq!(term, Some(leadership.term()), "round {round}: leader()");
        within(LIMIT, leadership.resign()).await.unwrap();
    }
}

/// The bound of each step of a test.
const LIMIT: Duration = Duration::from_secs(10);

/// `future`'s output, or a panic naming the limit it ran past.
async fn within<T>(limit: Duration, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("not done within {limit:?}"))
}
