//! A lab of test hosts made by the test itself: one network namespace per host, each with a
//! veth pair into a bridge that lives in a "switch" namespace of its own, on 10.77.0.0/24.
//! Nothing of it touches the machine's own network namespace. Partitions, heals and packet
//! drops between hosts are iptables rules inside the hosts' namespaces. The lab ends every
//! process it started (by its handle, so by its process id) and deletes its namespaces when
//! it is dropped, also when a test fails.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What every namespace name of a lab begins with, followed by the test process's id: a
/// leftover of a process that is gone can be recognised and removed.
const PREFIX: &str = "dlab";

/// The lab network's first three octets; host `i` (from 0) is `.{FIRST_HOST + i}`.
const NET: &str = "10.77.0";
const FIRST_HOST: usize = 11;

/// One host of the lab.
struct Host {
    name: String,
    ns: String,
    ip: String,
}

/// A lab; see the module's doc.
pub struct Lab {
    switch: String,
    hosts: Vec<Host>,
    /// Server processes started in the hosts, with what they are, for the logs.
    processes: Vec<(String, Child)>,
    /// Where the servers keep their files and logs.
    dir: tempfile::TempDir,
}

/// Fails the test, naming what is missing: a lab cannot be made without root, `ip` and
/// `iptables`, and a test that needs one must not pass without it.
fn require(what: &str, ok: bool) {
    assert!(
        ok,
        "the partition lab needs {what}; run the tests as root on Linux with iproute2 and \
         iptables installed (scripts/test installs iptables)"
    );
}

fn run_ok(command: &mut Command) -> Output {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn ip(args: &[&str]) -> Output {
    run_ok(Command::new("ip").args(args))
}

/// Deletes the namespaces of labs whose test process is gone (killed before its lab's drop).
fn remove_leftovers() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

impl Lab {
    /// Makes a lab named `scenario` with one host per name in `hosts`, all on one bridge.
    /// Fails the test, with what is missing, when it cannot (not root, no `ip`, no
    /// `iptables`).
    pub fn new(scenario: &str, hosts: &[&str]) -> Lab {
        // SAFETY: geteuid only reads this process's credentials.
        require("root (network namespaces)", unsafe { libc::geteuid() } == 0);
        require(
            "the ip command (iproute2)",
            Command::new("ip").arg("-V").output().is_ok(),
        );
        require(
            "iptables",
            Command::new("iptables-restore")
                .arg("--version")
                .output()
                .is_ok(),
        );
        remove_leftovers();
        let tag = format!("{PREFIX}{}{scenario}", std::process::id());
        let switch = format!("{tag}-sw");
        let mut lab = Lab {
            switch: switch.clone(),
            hosts: Vec::new(),
            processes: Vec::new(),
            dir: tempfile::Builder::new()
                .prefix("distlock-lab-")
                .tempdir()
                .expect("a directory for the lab's servers"),
        };
        let _ = Command::new("ip").args(["netns", "del", &switch]).output();
        ip(&["netns", "add", &switch]);
        ip(&["-n", &switch, "link", "set", "lo", "up"]);
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        for (i, name) in hosts.iter().enumerate() {
            let ns = format!("{tag}-{name}");
            let host_ip = format!("{NET}.{}", FIRST_HOST + i);
            let port = format!("p{i}");
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            ip(&["netns", "add", &ns]);
            // Registered at once: a failure below still deletes it.
            lab.hosts.push(Host {
                name: (*name).to_owned(),
                ns: ns.clone(),
                ip: host_ip.clone(),
            });
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "link", "add", "name", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &switch,
            ]);
            ip(&["-n", &switch, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &switch, "link", "set", &port, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{host_ip}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        lab
    }

    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in the lab"))
    }

    /// The host's address on the lab network.
    pub fn ip(&self, host: &str) -> String {
        self.host(host).ip.clone()
    }

    /// The host's namespace, for `ip netns exec` and `check --worker-netns`.
    pub fn ns(&self, host: &str) -> String {
        self.host(host).ns.clone()
    }

    /// A directory for the files of `what`.
    pub fn dir(&self, what: &str) -> PathBuf {
        let dir = self.dir.path().join(what);
        std::fs::create_dir_all(&dir).expect("a server directory");
        dir
    }

    /// A command that runs `program` in `host`'s namespace. It is killed with the test's
    /// thread if the test process dies before the lab's drop (`ip netns exec` execs the
    /// program, which keeps the flag).
    pub fn command(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.host(host).ns])
            .arg(program);
        // SAFETY: prctl only sets a flag of the child, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
    }

    /// Starts a server process made by [`Lab::command`] (ended by the lab), its output in
    /// `log`.
    pub fn spawn(&mut self, host: &str, what: &str, mut command: Command, log: &Path) {
        let out = std::fs::File::create(log).expect("a server log");
        let err = out.try_clone().expect("a server log");
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} in {host}: {e}"));
        self.processes.push((format!("{what} in {host}"), child));
    }

    /// Fails the test when a server the lab started has exited.
    pub fn assert_servers_run(&mut self) {
        for (what, child) in &mut self.processes {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{what} exited ({status}); logs in {}",
                    self.dir.path().display()
                );
            }
        }
    }

    /// Waits up to `limit` until `ready` answers true, else fails the test naming `what`.
    pub fn wait_for(&mut self, what: &str, limit: Duration, mut ready: impl FnMut(&Lab) -> bool) {
        let start = Instant::now();
        while !ready(self) {
            self.assert_servers_run();
            assert!(
                start.elapsed() < limit,
                "{what} not ready within {limit:?}; server logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sets every host's filter rules: each host drops what it exchanges with the hosts
    /// `cut(host)` names, and drops a share `loss` of what it exchanges with `lossy(host)`.
    fn apply(&self, rules: impl Fn(&str) -> (Vec<String>, Vec<(String, f64)>)) {
        for host in &self.hosts {
            let (cut, lossy) = rules(&host.name);
            let mut table = String::from(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
            );
            for other in &cut {
                let peer = &self.host(other).ip;
                let _ = writeln!(
                    table,
                    "-A INPUT -s {peer} -j DROP\n-A OUTPUT -d {peer} -j DROP"
                );
            }
            for (other, share) in &lossy {
                let peer = &self.host(other).ip;
                let _ = writeln!(
                    table,
                    "-A INPUT -s {peer} -m statistic --mode random --probability {share} -j DROP"
                );
            }
            table.push_str("COMMIT\n");
            let mut child = Command::new("ip")
                .args(["netns", "exec", &host.ns, "iptables-restore", "-w", "5"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run iptables-restore");
            child
                .stdin
                .take()
                .expect("iptables-restore's input")
                .write_all(table.as_bytes())
                .expect("write the rules");
            let output = child.wait_with_output().expect("iptables-restore");
            assert!(
                output.status.success(),
                "iptables-restore in {}: {}\n{table}",
                host.name,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    /// Nothing passes between a host of `side` and a host not in it (either way); within
    /// each side everything does.
    pub fn partition(&self, side: &[&str]) {
        let names: Vec<String> = self.hosts.iter().map(|h| h.name.clone()).collect();
        self.apply(|host| {
            let inside = side.contains(&host);
            let cut = names
                .iter()
                .filter(|other| side.contains(&other.as_str()) != inside)
                .cloned()
                .collect();
            (cut, Vec::new())
        });
    }

    /// Drops a share `loss` (0 to 1) of the packets between a host of `side` and a host not
    /// in it, as each host receives them.
    pub fn lossy(&self, side: &[&str], loss: f64) {
        let names: Vec<String> = self.hosts.iter().map(|h| h.name.clone()).collect();
        self.apply(|host| {
            let inside = side.contains(&host);
            let lossy = names
                .iter()
                .filter(|other| side.contains(&other.as_str()) != inside)
                .map(|other| (other.clone(), loss))
                .collect();
            (Vec::new(), lossy)
        });
    }

    /// How many packets the filter rules of every host have dropped since they were set.
    pub fn dropped(&self) -> u64 {
        self.hosts
            .iter()
            .map(|host| {
                let listed = Command::new("ip")
                    .args([
                        "netns", "exec", &host.ns, "iptables", "-w", "5", "-nvx", "-L",
                    ])
                    .stdin(Stdio::null())
                    .output();
                let text = listed
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                text.lines()
                    .filter(|line| line.contains("DROP") && !line.starts_with("Chain"))
                    .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }

    /// Everything passes again.
    pub fn heal(&self) {
        self.apply(|_| (Vec::new(), Vec::new()));
    }

    /// True when `from` reaches `port` on `to` (a TCP connection within a second).
    pub fn reaches(&self, from: &str, to: &str, port: u16) -> bool {
        let probe = format!("exec 3<>/dev/tcp/{}/{port}", self.host(to).ip);
        self.command(from, "timeout")
            .args(["1", "bash", "-c", &probe])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, child) in &mut self.processes {
            // Only the processes this lab started, by their handles.
            let _ = child.kill();
            let _ = child.wait();
        }
        for host in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", &host.ns]).output();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch])
            .output();
    }
}
