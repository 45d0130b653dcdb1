//! A 3-member deployment of the test's own (an etcd cluster, a ZooKeeper ensemble), started by
//! the repository's deployment script on free loopback ports, for tests that do to its
//! servers what the shared ones must not see: kill the leader, stop a follower. Each backend's
//! tests ask their own way which member leads.

use std::process::{Command, Stdio};

/// How a deployment script lays a cluster out.
pub struct Layout {
    /// The script under `scripts/`.
    pub script: &'static str,
    /// Its first argument (`cluster`, `ensemble`).
    pub mode: &'static str,
    /// The ports the members use, as offsets from the base port: the first three are the
    /// members' client ports.
    pub offsets: &'static [u16],
    /// The folder of member `n` (1..=3) in the script's directory, where its `pid` file is.
    pub member_dir: fn(u16) -> String,
}

/// A running deployment; every member it started is killed, by the PID in its pid file, when
/// this is dropped. A PID killed before is not signalled again (it may belong to another
/// process by then); a member the script starts anew has a new one.
pub struct OwnCluster {
    pub base: u16,
    layout: &'static Layout,
    dir: tempfile::TempDir,
    killed: std::sync::Mutex<Vec<String>>,
}

impl OwnCluster {
    /// Starts the three members on free ports.
    pub fn start(layout: &'static Layout) -> Self {
        let free = |base: u16| {
            layout
                .offsets
                .iter()
                .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        };
        let base = (0..100)
            .map(|_| fastrand::u16(20_000..40_000))
            .find(|&base| free(base))
            .expect("free loopback ports");
        let cluster = OwnCluster {
            base,
            layout,
            dir: tempfile::tempdir().expect("a temporary directory"),
            killed: std::sync::Mutex::new(Vec::new()),
        };
        cluster.deploy();
        cluster
    }

    /// Runs the deployment script: starts the members that do not run (again). A member
    /// stopped with `-STOP` must be continued first, or the script starts a second one.
    pub fn deploy(&self) {
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts")
            .join(self.layout.script);
        let status = Command::new(&script)
            .args([self.layout.mode, &self.base.to_string()])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("{script:?} runs (scripts/test installs its server): {e}"));
        assert!(status.success(), "{script:?} failed");
    }

    /// `scheme://` on the three members' client ports.
    pub fn url(&self, scheme: &str) -> String {
        let b = self.base;
        format!(
            "{scheme}://127.0.0.1:{b},127.0.0.1:{},127.0.0.1:{}/",
            b + 1,
            b + 2
        )
    }

    /// The client port of member `member` (1..=3).
    pub fn port(&self, member: u16) -> u16 {
        self.base + member - 1
    }

    pub fn kill(&self, member: u16) {
        if let Some(pid) = self.signal(member, "-KILL") {
            let mut killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
            killed.push(pid);
        }
    }

    /// The PID of member `member`, from its pid file.
    pub fn pid(&self, member: u16) -> Option<String> {
        let pid_file = self
            .dir
            .path()
            .join((self.layout.member_dir)(member))
            .join("pid");
        Some(std::fs::read_to_string(pid_file).ok()?.trim().to_owned())
    }

    /// Sends `signal` to member `member`, by the PID in its pid file, unless that PID was
    /// killed; the PID signalled.
    pub fn signal(&self, member: u16, signal: &str) -> Option<String> {
        let pid = self.pid(member)?;
        let killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
        if killed.contains(&pid) {
            return None;
        }
        drop(killed);
        let _ = Command::new("kill").args([signal, &pid]).status();
        Some(pid)
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for member in 1..=3 {
            self.kill(member);
        }
    }
}
