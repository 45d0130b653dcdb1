//! The failover problem, shown on a Sentinel group of this test's own: Redis
//! replicates asynchronously, so a master that dies right after a grant can take the grant
//! with it, and the promoted replica grants the lock again. Two clients then hold it. The
//! lock cannot prevent that; a resource that checks fencing tokens refuses the stale holder.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use distlock::ConnectOptions;

use crate::common::FencedStock;

/// A Sentinel group started by `scripts/redis-deployment` on free loopback ports; every
/// process it started is killed, by the PID in its pid file, when this is dropped.
struct OwnSentinelGroup {
    base: u16,
    dir: tempfile::TempDir,
}

fn ports_free(base: u16) -> bool {
    (base..base + 5).all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
}

impl OwnSentinelGroup {
    fn start() -> Self {
        let base = (0..100)
            .map(|_| fastrand::u16(20_000..40_000))
            .find(|&base| ports_free(base))
            .expect("five free loopback ports");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-deployment");
        let group = OwnSentinelGroup { base, dir };
        let status = Command::new(script)
            .args(["sentinel", &base.to_string()])
            .arg(group.dir.path())
            // Fail over after half a second of silence.
            .env("DOWN_AFTER_MS", "500")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("scripts/redis-deployment runs (redis-server is installed by scripts/test)");
        assert!(status.success(), "scripts/redis-deployment failed");
        group
    }

    fn master_port(&self) -> u16 {
        self.base
    }

    fn replica_port(&self) -> u16 {
        self.base + 1
    }

    fn url(&self) -> String {
        let b = self.base;
        format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/distlock",
            b + 2,
            b + 3,
            b + 4
        )
    }

    fn pid(&self, port: u16) -> Option<String> {
        let redis = self.dir.path().join(format!("redis-{port}.pid"));
        let sentinel = self.dir.path().join(format!("sentinel-{port}.pid"));
        std::fs::read_to_string(redis)
            .or_else(|_| std::fs::read_to_string(sentinel))
            .ok()
            .map(|pid| pid.trim().to_owned())
    }

    fn signal(&self, port: u16, signal: &str) {
        let pid = self.pid(port).expect("the server's pid file");
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// What the sentinels call the master's port.
    fn announced_master(&self) -> Option<u16> {
        let output = Command::new("redis-cli")
            .args(["-p", &(self.base + 2).to_string()])
            .args(["sentinel", "get-master-addr-by-name", "distlock"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }

    fn exists(&self, port: u16, key: &str) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "exists", key])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for OwnSentinelGroup {
    fn drop(&mut self) {
        for port in self.base..self.base + 5 {
            if let Some(pid) = self.pid(port) {
                // SIGCONT first, in case the test stopped it and failed before resuming it.
                for signal in ["-CONT", "-KILL"] {
                    let _ = Command::new("kill")
                        .args([signal, &pid])
                        .stderr(std::process::Stdio::null())
                        .status();
                }
            }
        }
    }
}

/// A holds the lock; the master dies before its replica has the grant; the sentinels promote
/// the replica; B is granted the same lock by the new master (two holders: the failover
/// problem); B's write is accepted and A's stale write is refused by its fencing token; and A
/// learns that it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_grants_twice_and_fencing_refuses_the_stale_holder() {
    let group = OwnSentinelGroup::start();
    let url = group.url();
    let lease = Duration::from_secs(3);
    let options = || ConnectOptions::new().lease(lease);
    let a = distlock::connect_with(&url, options()).await.unwrap();
    let name = format!("failover-{}", fastrand::u64(..));
    let key = format!("distlock:{{{name}}}:lock");
    let mut store = FencedStock::default();
    store.write(&name, 0, 10).unwrap();

    // The replica must not get the grant: stop it, grant, kill the master, resume it.
    group.signal(group.replica_port(), "-STOP");
    let held_by_a = a.mutex(&name).unwrap().acquire().await.unwrap();
    let token_a = held_by_a.fencing_token();
    assert_eq!(group.exists(group.master_port(), &key), "1");
    group.signal(group.master_port(), "-KILL");
    group.signal(group.replica_port(), "-CONT");
    assert_eq!(
        group.exists(group.replica_port(), &key),
        "0",
        "the replica received the grant; the failover would not lose it"
    );

    let start = Instant::now();
    while group.announced_master() != Some(group.replica_port()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the sentinels did not promote the replica within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failover = start.elapsed();

    // B asks the sentinels, reaches the new master, and is granted the lock A believes it holds.
    let b = distlock::connect_with(&url, options()).await.unwrap();
    let held_by_b = b
        .mutex(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the promoted replica never saw A's grant, so it grants the lock again");
    let token_b = held_by_b.fencing_token();
    assert!(
        token_b > token_a,
        "fencing token went back across the failover: {token_a} then {token_b}"
    );

    // Both write; the store keeps the stock exact by refusing the stale token.
    store.write(&name, token_b, 9).unwrap();
    let refused = store.write(&name, token_a, 9);
    assert!(refused.is_err(), "the stale holder's write was accepted");
    assert_eq!(store.items[&name], (token_b, 9));

    // A's client, connected before the failover, found the new master by itself.
    let other = format!("{name}-after");
    let after = a
        .mutex(&other)
        .unwrap()
        .try_acquire()
        .await
        .expect("A's client did not follow the failover")
        .expect("a fresh lock is free");
    assert!(b.is_locked(&other).await.unwrap());
    after.release().await.unwrap();

    // A's renewals now reach the new master, which says the lock is B's: A is told.
    let lost = tokio::time::timeout(lease * 3, held_by_a.lost()).await;
    assert!(lost.is_ok(), "A was never told that it lost the lock");
    assert!(held_by_b.is_held().await.unwrap(), "B lost the lock A lost");
    held_by_b.release().await.unwrap();
    eprintln!(
        "failover took {failover:?}; A's token {token_a}, B's token {token_b}; A's write refused: {}",
        refused.unwrap_err()
    );
}
