//! The failover problem, shown on a Sentinel group of this test's own: Redis
//! replicates asynchronously, so a master that dies right after a grant can take the grant
//! with it, and the promoted replica grants the lock again. Two clients then hold it. The
//! lock cannot prevent that; a resource that checks fencing tokens refuses the stale holder.
//! And on a group that requires passwords, a client follows the failover with its logins.

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
    /// How redis-cli logs in to the sentinels (nothing, or `-a PASSWORD`).
    sentinel_login: Vec<&'static str>,
    /// How redis-cli logs in to the master and the replica.
    server_login: Vec<&'static str>,
}

fn ports_free(base: u16) -> bool {
    (base..base + 5).all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
}

impl OwnSentinelGroup {
    /// The open group (`scripts/redis-deployment sentinel`).
    fn start() -> Self {
        Self::start_kind("sentinel")
    }

    /// The group whose servers require the users of `scripts/redis-acl.conf` and whose
    /// sentinels the password `sentinel-pw` (`scripts/redis-deployment sentinel-acl`).
    fn start_secured() -> Self {
        Self::start_kind("sentinel-acl")
    }

    fn start_kind(kind: &str) -> Self {
        let base = (0..100)
            .map(|_| fastrand::u16(20_000..40_000))
            .find(|&base| ports_free(base))
            .expect("five free loopback ports");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-deployment");
        let secured = kind == "sentinel-acl";
        let group = OwnSentinelGroup {
            base,
            dir,
            sentinel_login: if secured {
                vec!["-a", "sentinel-pw", "--no-auth-warning"]
            } else {
                Vec::new()
            },
            server_login: if secured {
                vec![
                    "--user",
                    "distlock",
                    "--pass",
                    "distlock-pw",
                    "--no-auth-warning",
                ]
            } else {
                Vec::new()
            },
        };
        let status = Command::new(script)
            .args([kind, &base.to_string()])
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
            .args(&self.sentinel_login)
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

    /// `WAIT 1 10000` on the master: "1" when the replica acknowledged every write so far.
    fn wait_for_the_replica(&self) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.master_port().to_string()])
            .args(&self.server_login)
            .args(["wait", "1", "10000"])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn exists(&self, port: u16, key: &str) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(&self.server_login)
            .args(["exists", key])
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

/// Security across a failover: on a group whose master and replica require a user's password
/// and whose sentinels require their own, a client connected before the master dies asks the
/// (password-protected) sentinels again, logs in to the promoted replica as its user, and
/// keeps granting locks there; a client that connects afterwards does too. Promise 3 across
/// it: the token of the grant after the failover is above every token granted before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_a_failover_with_its_logins() {
    let group = OwnSentinelGroup::start_secured();
    let b = group.base;
    let url = format!(
        "redis+sentinel://app:app-pw@127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/distlock\
         ?sentinel_password=sentinel-pw",
        b + 2,
        b + 3,
        b + 4
    );
    let step = Duration::from_secs(30);
    let client = tokio::time::timeout(step, distlock::connect(&url))
        .await
        .expect("connecting took too long")
        .expect("the app's logins were refused");
    let name = format!("follow-{}", fastrand::u64(..));
    let before = tokio::time::timeout(step, client.mutex(&name).unwrap().acquire())
        .await
        .expect("the grant before the failover took too long")
        .unwrap();
    let token_before = before.fencing_token();
    tokio::time::timeout(step, before.release())
        .await
        .unwrap()
        .unwrap();
    // The replica must have the grant, the release and the token counter before its master
    // dies: WAIT returns when it acknowledged every write so far.
    assert_eq!(
        group.wait_for_the_replica(),
        "1",
        "the replica did not acknowledge the master's writes"
    );

    group.signal(group.master_port(), "-KILL");
    let start = Instant::now();
    while group.announced_master() != Some(group.replica_port()) {
        assert!(
            start.elapsed() < step,
            "the password-protected sentinels did not promote the replica within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The client broke with the old master; its next requests find the new one. Until the
    // sentinels and the client agree, a request may fail: retry within the bound.
    let start = Instant::now();
    let after = loop {
        match tokio::time::timeout(step, client.mutex(&name).unwrap().try_acquire()).await {
            Ok(Ok(Some(guard))) => break guard,
            Ok(Ok(None)) => panic!("the lock released before the failover is held after it"),
            Ok(Err(e)) if !e.is_not_authorized() && start.elapsed() < step => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("the client did not follow the failover: {other:?}"),
        }
    };
    assert!(
        after.fencing_token() > token_before,
        "fencing token went back across the failover: {token_before} then {}",
        after.fencing_token()
    );
    let late = tokio::time::timeout(step, distlock::connect(&url))
        .await
        .expect("connecting after the failover took too long")
        .expect("a client connecting after the failover was refused");
    assert!(
        tokio::time::timeout(step, late.is_locked(&name))
            .await
            .unwrap()
            .unwrap(),
        "the new master does not show the lock granted on it"
    );
    tokio::time::timeout(step, after.release())
        .await
        .unwrap()
        .unwrap();
}
