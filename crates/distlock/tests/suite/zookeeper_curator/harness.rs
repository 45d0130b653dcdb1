//! What the Curator interop tests share: the Java program's driver and a test's setting.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use distlock::conformance::servers;
use distlock::zookeeper::ZooKeeperBackend;
use distlock::{ConnectOptions, Locks};
use tokio::sync::mpsc;
use tokio::time::timeout;
use zookeeper_client as zkc;

/// Where Debian installs Java libraries.
pub const JAVA_DIR: &str = "/usr/share/java";

/// The jars the Curator program needs, each with the Debian package that ships it.
pub const JARS: &[(&str, &str)] = &[
    ("curator-recipes.jar", "libcurator-recipes-java"),
    ("curator-framework.jar", "libcurator-framework-java"),
    ("curator-client.jar", "libcurator-client-java"),
    ("zookeeper.jar", "libzookeeper-java"),
    ("zookeeper-jute.jar", "libzookeeper-java"),
    ("guava.jar", "libguava-java"),
    ("slf4j-api.jar", "libslf4j-java"),
    ("slf4j-simple.jar", "libslf4j-java"),
];

/// The Java source of the Curator side.
pub const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/suite/zookeeper_curator/CuratorLock.java"
);

/// A generous bound for one step: a JVM start, a ZooKeeper round trip, a handoff.
pub const STEP: Duration = Duration::from_secs(20);

/// The jars' class path; panics naming the package of the first missing jar.
pub fn jar_classpath() -> String {
    JARS.iter()
        .map(|(jar, package)| {
            let path = Path::new(JAVA_DIR).join(jar);
            assert!(
                path.is_file(),
                "{} is missing: install Debian's {package} (`apt-get install {package}`; \
                 scripts/test installs libcurator-recipes-java when it is missing)",
                path.display()
            );
            path.display().to_string()
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// Compiles `CuratorLock.java` into `classes`; panics naming the package when javac or a jar
/// is missing, and with javac's output when it fails.
pub fn compile(classes: &Path) -> String {
    let jars = jar_classpath();
    let output = Command::new("javac")
        .args(["-encoding", "UTF-8", "-d"])
        .arg(classes)
        .args(["-cp", &jars, SOURCE])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "javac does not run ({e}): install Debian's default-jdk-headless \
                 (`apt-get install default-jdk-headless`; scripts/test installs it when missing)"
            )
        });
    assert!(
        output.status.success(),
        "javac failed on {SOURCE}:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    format!("{}:{jars}", classes.display())
}

/// The `host:port,...` part of a `zk://` URL: ZooKeeper's connect string.
pub fn connect_string(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or_default()
}

/// A running `CuratorLock` program: one Curator client with its own ZooKeeper session, killed
/// by its PID when dropped.
pub struct Curator {
    pub child: Child,
    pub stdin: ChildStdin,
    pub replies: mpsc::UnboundedReceiver<String>,
    /// The compiled classes and the program's stderr (Curator's and ZooKeeper's log).
    pub dir: tempfile::TempDir,
}

impl Curator {
    /// Compiles the program, starts it on `connect` and waits for its `ready`.
    pub async fn start(connect: &str) -> Curator {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let classpath = compile(dir.path());
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("a log file");
        let mut child = Command::new("java")
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .args(["-cp", &classpath, "CuratorLock", connect])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("java runs (it comes with javac: default-jdk-headless)");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, replies) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut curator = Curator {
            child,
            stdin,
            replies,
            dir,
        };
        let ready = curator.reply(STEP).await;
        assert_eq!(ready, "ready", "Curator did not connect{}", curator.log());
        curator
    }

    /// The program's stderr, for failure messages.
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        let tail: String = log
            .chars()
            .rev()
            .take(4000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("\n--- Curator's stderr (end) ---\n{tail}")
    }

    /// Sends one command line, without waiting for its reply.
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("writing {line:?} to Curator: {e}"));
    }

    /// The next reply line, waiting at most `within`.
    pub async fn reply(&mut self, within: Duration) -> String {
        match timeout(within, self.replies.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("Curator exited ({:?}){}", self.child.try_wait(), self.log()),
            Err(_) => panic!("no reply from Curator within {within:?}{}", self.log()),
        }
    }

    /// True when a reply has arrived that was not read yet.
    pub fn has_reply(&self) -> bool {
        !self.replies.is_empty()
    }

    /// Sends a command and returns its reply.
    pub async fn command(&mut self, line: &str, within: Duration) -> String {
        self.send(line);
        self.reply(within).await
    }

    /// Curator's view of the lock's queue: the nodes in its order, the holder first.
    pub async fn participants(&mut self, path: &str) -> Vec<String> {
        let reply = self.command(&format!("participants {path}"), STEP).await;
        let nodes = reply
            .strip_prefix("participants")
            .unwrap_or_else(|| panic!("participants: {reply}{}", self.log()));
        nodes.split_whitespace().map(str::to_owned).collect()
    }

    /// Closes the client (its nodes go with its session) and waits for the program to end.
    pub async fn exit(mut self) {
        assert_eq!(self.command("exit", STEP).await, "bye", "{}", self.log());
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One test's setting: a distlock client on a base path of its own, a raw client to look at
/// the nodes, and the lock's name and path.
pub struct Setup {
    pub connect: String,
    pub base: String,
    pub locks: Locks,
    pub zk: zkc::Client,
    pub name: &'static str,
    pub path: String,
}

impl Setup {
    pub async fn new() -> Setup {
        let url = servers::ZOOKEEPER.url();
        let connect = connect_string(&url).to_owned();
        let base = format!("/distlock-curator/{}", uuid::Uuid::new_v4().simple());
        let query = url
            .split_once('?')
            .map_or(String::new(), |(_, q)| format!("?{q}"));
        let backend = timeout(
            STEP,
            ZooKeeperBackend::connect(&format!("zk://{connect}{base}{query}")),
        )
        .await
        .expect("distlock did not connect in time")
        .expect("distlock connects");
        // A name with a `/`, so that the test also pins how a name becomes a path.
        let name = "orders/7";
        let path = backend.lock_path(name);
        assert_eq!(path, format!("{base}/orders%2F7"));
        let locks = Locks::with_backend(Arc::new(backend), ConnectOptions::new()).unwrap();
        let zk = timeout(STEP, zkc::Client::connector().connect(&connect))
            .await
            .expect("raw client did not connect in time")
            .expect("raw ZooKeeper client");
        Setup {
            connect,
            base,
            locks,
            zk,
            name,
            path,
        }
    }

    /// Another distlock client (its own session) on the same base path.
    pub async fn other_client(&self) -> Locks {
        timeout(
            STEP,
            distlock::connect(&format!("zk://{}{}", self.connect, self.base)),
        )
        .await
        .expect("distlock did not connect in time")
        .expect("distlock connects")
    }

    /// The lock's child nodes in queue order (by the sequence number after `lock-`).
    pub async fn queue(&self) -> Vec<String> {
        let mut children = match timeout(STEP, self.zk.list_children(&self.path)).await {
            Ok(Ok(children)) => children,
            Ok(Err(zkc::Error::NoNode)) => Vec::new(),
            Ok(Err(e)) => panic!("listing {}: {e}", self.path),
            Err(_) => panic!("listing {} timed out", self.path),
        };
        children.sort_by_key(|child| child.rsplit("lock-").next().unwrap_or_default().to_owned());
        children
    }

    /// The data of the node first in line: `distlock ...` for a distlock holder, Curator's
    /// default (the client's IP address) for a Curator holder.
    pub async fn holder_data(&self) -> String {
        let queue = self.queue().await;
        let first = queue.first().expect("a holder's node");
        let (data, _) = timeout(STEP, self.zk.get_data(&format!("{}/{first}", self.path)))
            .await
            .expect("get_data timed out")
            .expect("the holder's node");
        String::from_utf8_lossy(&data).into_owned()
    }

    /// Removes the lock's node and the base path, when they are empty.
    pub async fn clean_up(self) {
        for path in [self.path.as_str(), self.base.as_str()] {
            let _ = timeout(STEP, self.zk.delete(path, None)).await;
        }
    }
}

/// True for a node named as Curator's `InterProcessMutex` names it: `_c_<uuid>-lock-<10 digits>`.
pub fn curator_layout(node: &str) -> bool {
    let Some(rest) = node.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, sequence)) = rest.split_once("-lock-") else {
        return false;
    };
    uuid::Uuid::parse_str(uuid).is_ok()
        && sequence.len() == 10
        && sequence.bytes().all(|b| b.is_ascii_digit())
}

/// The last part of a znode path.
pub fn leaf(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
