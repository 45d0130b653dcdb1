//! ZooKeeper tests that start a 3-node ensemble of their own (by `scripts/zookeeper-deployment`,
//! on free loopback ports) to do to its servers what the shared one must not see: kill its
//! leader, stop a follower, cut a follower off from the leader.

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

/// Promise 2 when the connection looks fine: the holder's follower stops hearing the leader
/// (its quorum connection dropped by `iptables`), but keeps answering the holder's pings until
/// its `syncLimit` (5 s here) runs out. The leader hears nothing of the holder's session,
/// expires it after its 2 s, and grants the lock to the rival, on the leader. The holder must
/// have been told `lost()` before that grant: its session's probes (a `sync` through the
/// leader) stop being answered, so it gives the session up after half a session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_follower_the_leader_no_longer_hears_cannot_keep_its_holder() {
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
    let url = |node| format!("{}?session_timeout=2s", url_of(&ensemble, node));
    let holder = within(LIMIT, distlock::connect(&url(follower))).await;
    let holder = holder.unwrap();
    let rival = within(LIMIT, distlock::connect(&url(leader))).await;
    let rival = rival.unwrap();
    let name = unique("follower_cut_off");
    let mutex = holder.mutex(name.as_str()).unwrap();
    let guard = within(LIMIT, mutex.acquire()).await.unwrap();
    let held_token = guard.fencing_token();
    let granted = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = rival.mutex(name).unwrap().acquire().await;
            (Instant::now(), guard)
        }
    });
    // Held for a while past a probe's period first: the probes must not lose a healthy hold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!granted.is_finished(), "the rival was granted a held lock");
    assert!(
        within(LIMIT, guard.is_held()).await.unwrap(),
        "a healthy session lost its lock"
    );

    let cut = QuorumCut::between(&ensemble, follower, leader);
    let cut_at = Instant::now();
    let told = tokio::spawn(async move {
        let why = guard.lost().await;
        (Instant::now(), why)
    });
    let (granted_at, rival_guard) = within(Duration::from_secs(30), granted).await.unwrap();
    let rival_guard = rival_guard.expect("the rival is granted the lock once the session ends");
    let (told_at, why) = within(Duration::from_secs(10), told).await.unwrap();
    drop(cut);
    assert!(
        told_at <= granted_at,
        "promise 2: the holder was told {:?} after the cut, the rival granted {:?} after it \
         ({why})",
        told_at - cut_at,
        granted_at - cut_at
    );
    assert!(
        rival_guard.fencing_token() > held_token,
        "promise 3: the rival's token is not past the holder's"
    );
}

/// The quorum connection of a follower to the leader, dropped both ways by `iptables` rules on
/// its two loopback ports until this is dropped.
struct QuorumCut {
    rules: Vec<Vec<String>>,
}

impl QuorumCut {
    fn between(ensemble: &OwnCluster, follower: u16, leader: u16) -> Self {
        // The leader's quorum port: `scripts/zookeeper-deployment` puts them 10 past the
        // client ports.
        let quorum = ensemble.port(leader) + 10;
        let pid = ensemble.pid(follower).expect("the follower's pid");
        let output = std::process::Command::new("ss")
            .args(["-tnpH", "state", "established"])
            .arg(format!("dst 127.0.0.1:{quorum}"))
            .output()
            .expect("ss runs (iproute2)");
        let listing = String::from_utf8_lossy(&output.stdout);
        let port = listing
            .lines()
            .filter(|line| line.contains(&format!("pid={pid},")))
            .find_map(|line| {
                // `127.0.0.1:P`, or `[::ffff:127.0.0.1]:P` from Java's dual-stack socket
                // (IPv4 on the wire all the same).
                let local = line.split_whitespace().find(|t| t.contains("127.0.0.1"))?;
                local.rsplit(':').next()?.parse::<u16>().ok()
            })
            .unwrap_or_else(|| {
                panic!("no quorum connection of pid {pid} to port {quorum}:\n{listing}")
            });
        let (port, quorum) = (port.to_string(), quorum.to_string());
        let rules: Vec<Vec<String>> = [(&port, &quorum), (&quorum, &port)]
            .into_iter()
            .map(|(from, to)| {
                [
                    "INPUT",
                    "-p",
                    "tcp",
                    "-s",
                    "127.0.0.1",
                    "--sport",
                    from,
                    "-d",
                    "127.0.0.1",
                ]
                .into_iter()
                .map(str::to_owned)
                .chain([
                    "--dport".to_owned(),
                    to.clone(),
                    "-j".to_owned(),
                    "DROP".to_owned(),
                ])
                .collect()
            })
            .collect();
        let mut cut = QuorumCut { rules: Vec::new() };
        for rule in rules {
            let status = std::process::Command::new("iptables")
                .args(["-w", "-I"])
                .args(&rule)
                .status()
                .expect("iptables runs (root)");
            assert!(status.success(), "iptables -I {rule:?} failed");
            cut.rules.push(rule);
        }
        cut
    }
}

impl Drop for QuorumCut {
    fn drop(&mut self) {
        for rule in &self.rules {
            let _ = std::process::Command::new("iptables")
                .args(["-w", "-D"])
                .args(rule)
                .status();
        }
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
