//! Promise 4 on a Redis Cluster: a command whose reply is lost is never sent again (it may
//! have run, and the lock's scripts are not idempotent). The Cluster here is one node of this
//! test's own that announces a fault proxy's port, so that every connection the client opens
//! to it passes through the proxy.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use distlock::fault::FaultProxy;

/// A one-node Redis Cluster (all 16384 slots) on a free loopback port, announcing
/// `announced` as its port. Its process is killed, by PID, when this is dropped.
struct OwnCluster {
    server: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (scripts/test installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl OwnCluster {
    fn start(announced: u16) -> OwnCluster {
        let port = (0..100)
            .map(|_| fastrand::u16(20_000..25_000))
            .find(|&p| free(p) && free(p + 10_000))
            .expect("a free port and its cluster bus port");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let server = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
            ])
            .args(["--cluster-announce-ip", "127.0.0.1"])
            .args(["--cluster-announce-port", &announced.to_string()])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/test installs it)");
        let cluster = OwnCluster {
            server,
            port,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cli(port, &["PING"]).trim() != "PONG" {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cli(port, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        while !cli(port, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Promise 4 (and 1): the release of one of two holds loses its reply on a Cluster. The
/// client reports the error and does not send the release again: the other hold stays and
/// excludes everyone; releasing it frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_cluster_does_not_resend_a_release_whose_reply_was_lost() {
    // The proxy's port must be known before the node starts (it announces it).
    let placeholder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = placeholder.local_addr().unwrap().port();
    drop(placeholder);
    let cluster = OwnCluster::start(proxy_port);
    let proxy = FaultProxy::start_on(
        ([127, 0, 0, 1], proxy_port).into(),
        ([127, 0, 0, 1], cluster.port).into(),
    )
    .await
    .expect("the fault proxy binds its port");
    let url = format!("redis+cluster://127.0.0.1:{proxy_port}/");
    let direct = format!("redis+cluster://127.0.0.1:{}/", cluster.port);

    let locks = distlock::connect(&url).await.unwrap();
    let name = format!("cluster/lost-release/{}", uuid::Uuid::new_v4().simple());
    let outer = locks
        .holder()
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let inner = outer.reenter().await.unwrap();
    // The next script call on this lock's key is the release.
    let key = format!("{{{}}}", name.replace('/', "%2F")).into_bytes();
    proxy.lose_reply_of_next(move |request| {
        contains(request, b"EVALSHA") && contains(request, &key)
    });
    let released = tokio::time::timeout(Duration::from_secs(15), inner.release())
        .await
        .expect("the release hung");
    assert_eq!(
        proxy.replies_lost(),
        1,
        "no reply was lost, so nothing was tested"
    );
    assert!(
        released.is_err(),
        "a release whose reply was lost reported success"
    );

    let rival = distlock::connect(&direct).await.unwrap();
    let stolen = rival
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    assert!(
        stolen.is_none(),
        "the release ran twice: the lock was free while its other hold's guard lived"
    );
    assert!(!outer.is_lost());
    outer.release().await.expect("release the other hold");
    let granted = rival
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the lock was not free after both releases");
    granted.release().await.unwrap();
}
