//! The etcd cluster losing its leader: a cluster of the test's own, started by
//! `scripts/etcd-deployment`.

use super::*;

/// A 3-member cluster started by `scripts/etcd-deployment` on free loopback ports; every
/// member it started is killed, by the PID in its pid file, when this is dropped.
struct OwnCluster {
    base: u16,
    dir: tempfile::TempDir,
}

impl OwnCluster {
    fn start() -> Self {
        let free = |base: u16| {
            [0, 1, 2, 100, 101, 102]
                .iter()
                .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        };
        let base = (0..100)
            .map(|_| fastrand::u16(20_000..40_000))
            .find(|&base| free(base))
            .expect("free loopback ports");
        let cluster = OwnCluster {
            base,
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        cluster.deploy();
        cluster
    }

    /// Runs the deployment script: starts the members that do not run.
    fn deploy(&self) {
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/etcd-deployment");
        let status = Command::new(script)
            .args(["cluster", &self.base.to_string()])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .status()
            .expect("scripts/etcd-deployment runs (scripts/test installs etcd)");
        assert!(status.success(), "scripts/etcd-deployment failed");
    }

    fn url(&self) -> String {
        let b = self.base;
        format!(
            "etcd://127.0.0.1:{b},127.0.0.1:{},127.0.0.1:{}/",
            b + 1,
            b + 2
        )
    }

    /// The member (1..=3) that leads now, as the members still running say.
    async fn leader(&self) -> Option<u16> {
        for member in 1..=3 {
            let mut command = Command::new("etcdctl");
            command
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=127.0.0.1:{}", self.base + member - 1))
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

    fn kill(&self, member: u16) {
        let pid_file = self.dir.path().join(format!("m{member}/pid"));
        if let Ok(pid) = std::fs::read_to_string(pid_file) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for member in 1..=3 {
            self.kill(member);
        }
    }
}

/// Promises 1 and 3 when the cluster loses its leader while a lock is held and contended:
/// another member is elected, the holder keeps the lock (no double grant), the waiter is
/// granted once the holder releases, with a larger token; the killed member rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_the_lock_survives_the_loss_of_the_cluster_leader() {
    let cluster = OwnCluster::start();
    let url = cluster.url();
    let holder = distlock::connect(&url).await.unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let name = unique("leader_loss");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .unwrap();
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

    let leader = cluster.leader().await.expect("the cluster has a leader");
    cluster.kill(leader);
    let start = Instant::now();
    while cluster.leader().await.is_none_or(|l| l == leader) {
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
