//! Redlock masters of a test's own, and what the Redlock tests need to know of the lock's
//! layout.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Three masters started by `scripts/redis-deployment redlock` on free loopback ports, killed
/// by the PIDs in their pid files when dropped.
pub struct OwnMasters {
    base: u16,
    dir: tempfile::TempDir,
}

impl OwnMasters {
    pub fn start() -> Self {
        let free = |base: u16| {
            (base..base + 3).all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        };
        let base = (0..100)
            .map(|_| fastrand::u16(20_000..40_000))
            .find(|&base| free(base))
            .expect("three free loopback ports");
        let masters = OwnMasters {
            base,
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        masters.start_missing();
        masters
    }

    /// Starts every master that does not answer (empty: they keep nothing on disk).
    pub fn start_missing(&self) {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-deployment");
        let status = Command::new(script)
            .args(["redlock", &self.base.to_string()])
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("scripts/redis-deployment runs (redis-server is installed by scripts/test)");
        assert!(status.success(), "scripts/redis-deployment failed");
    }

    pub fn url(&self, query: &str) -> String {
        let b = self.base;
        format!(
            "redlock://127.0.0.1:{b},127.0.0.1:{},127.0.0.1:{}/{query}",
            b + 1,
            b + 2
        )
    }

    /// Master `i` in the order the lock sorts them (by address; the ports have one width).
    pub fn port(&self, i: usize) -> u16 {
        self.base + u16::try_from(i).unwrap()
    }

    pub fn kill(&self, i: usize) {
        let port = self.port(i);
        let file = self.dir.path().join(format!("redis-{port}.pid"));
        let pid = std::fs::read_to_string(&file).expect("the master's pid file");
        let status = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -KILL {pid}");
        let _ = std::fs::remove_file(file);
        // Wait until it no longer answers.
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "master {port} still answers"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pttl(&self, i: usize, key: &str) -> i64 {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port(i).to_string(), "pttl", key])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("PTTL answers a number")
    }
}

impl Drop for OwnMasters {
    fn drop(&mut self) {
        for i in 0..3 {
            let file = self.dir.path().join(format!("redis-{}.pid", self.port(i)));
            if let Ok(pid) = std::fs::read_to_string(file) {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }
}

/// The master a name asks first (its gate): the lock's FNV-1a hash of the name, modulo 3.
pub fn gate_of(name: &str) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    usize::try_from(hash % 3).unwrap()
}

/// A fresh name whose gate is master `gate`.
pub fn name_with_gate(prefix: &str, gate: usize) -> String {
    loop {
        let name = format!("{prefix}-{}", fastrand::u64(..));
        if gate_of(&name) == gate {
            return name;
        }
    }
}

pub fn lock_key(name: &str) -> String {
    format!("distlock:{{{name}}}:lock")
}

pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(output.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A fault proxy in front of each of `masters`, sorted as the lock sorts its masters (by
/// address): `proxies[i]` is the lock's master `i`, and `ports[i]` the real master behind it.
pub struct ProxiedMasters {
    pub proxies: Vec<distlock::fault::FaultProxy>,
    pub ports: Vec<u16>,
}

impl ProxiedMasters {
    pub async fn start(masters: &OwnMasters) -> Self {
        let mut proxied = Vec::new();
        for i in 0..3 {
            let port = masters.port(i);
            let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let proxy = distlock::fault::FaultProxy::start(target)
                .await
                .expect("start a fault proxy");
            proxied.push((proxy.address().to_string(), proxy, port));
        }
        proxied.sort_by(|a, b| a.0.cmp(&b.0));
        let (proxies, ports) = proxied.into_iter().map(|(_, p, port)| (p, port)).unzip();
        ProxiedMasters { proxies, ports }
    }

    pub fn url(&self, query: &str) -> String {
        let addresses: Vec<String> = self
            .proxies
            .iter()
            .map(|p| p.address().to_string())
            .collect();
        format!("redlock://{}/{query}", addresses.join(","))
    }

    /// `redis-cli` on the real master behind the lock's master `i`.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        redis_cli(self.ports[i], args)
    }
}
