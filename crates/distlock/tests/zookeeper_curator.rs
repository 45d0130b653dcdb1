//! The ZooKeeper backend against the real Apache Curator: Debian's Curator 5.4 jars, driven by
//! `tests/curator/CuratorLock.java` (compiled here with `javac`), take an `InterProcessMutex`
//! on the path distlock uses for a lock name, and the two exclude each other both ways.
//!
//! Needs the ZooKeeper server of `scripts/test --servers-only` (`DISTLOCK_ZK_URL` overrides),
//! `javac` (Debian's `default-jdk-headless`) and the jars of `libcurator-recipes-java` in
//! /usr/share/java; `scripts/test` installs both when missing. A missing one fails the test,
//! naming the package.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::conformance::servers;
use distlock::zookeeper::ZooKeeperBackend;
use distlock::{AcquireOptions, ConnectOptions, LockName, Locks};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use zookeeper_client as zkc;

/// Where Debian installs Java libraries.
const JAVA_DIR: &str = "/usr/share/java";

/// The jars the Curator program needs, each with the Debian package that ships it.
const JARS: &[(&str, &str)] = &[
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
const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/curator/CuratorLock.java"
);

/// A generous bound for one step: a JVM start, a ZooKeeper round trip, a handoff.
const STEP: Duration = Duration::from_secs(20);

/// The jars' class path; panics naming the package of the first missing jar.
fn jar_classpath() -> String {
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
fn compile(classes: &Path) -> String {
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
fn connect_string(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or_default()
}

/// A running `CuratorLock` program: one Curator client with its own ZooKeeper session, killed
/// by its PID when dropped.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::UnboundedReceiver<String>,
    /// The compiled classes and the program's stderr (Curator's and ZooKeeper's log).
    dir: tempfile::TempDir,
}

impl Curator {
    /// Compiles the program, starts it on `connect` and waits for its `ready`.
    async fn start(connect: &str) -> Curator {
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
    fn log(&self) -> String {
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
    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("writing {line:?} to Curator: {e}"));
    }

    /// The next reply line, waiting at most `within`.
    async fn reply(&mut self, within: Duration) -> String {
        match timeout(within, self.replies.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("Curator exited ({:?}){}", self.child.try_wait(), self.log()),
            Err(_) => panic!("no reply from Curator within {within:?}{}", self.log()),
        }
    }

    /// True when a reply has arrived that was not read yet.
    fn has_reply(&self) -> bool {
        !self.replies.is_empty()
    }

    /// Sends a command and returns its reply.
    async fn command(&mut self, line: &str, within: Duration) -> String {
        self.send(line);
        self.reply(within).await
    }

    /// Curator's view of the lock's queue: the nodes in its order, the holder first.
    async fn participants(&mut self, path: &str) -> Vec<String> {
        let reply = self.command(&format!("participants {path}"), STEP).await;
        let nodes = reply
            .strip_prefix("participants")
            .unwrap_or_else(|| panic!("participants: {reply}{}", self.log()));
        nodes.split_whitespace().map(str::to_owned).collect()
    }

    /// Closes the client (its nodes go with its session) and waits for the program to end.
    async fn exit(mut self) {
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
struct Setup {
    connect: String,
    base: String,
    locks: Locks,
    zk: zkc::Client,
    name: &'static str,
    path: String,
}

impl Setup {
    async fn new() -> Setup {
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
    async fn other_client(&self) -> Locks {
        timeout(
            STEP,
            distlock::connect(&format!("zk://{}{}", self.connect, self.base)),
        )
        .await
        .expect("distlock did not connect in time")
        .expect("distlock connects")
    }

    /// The lock's child nodes in queue order (by the sequence number after `lock-`).
    async fn queue(&self) -> Vec<String> {
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
    async fn holder_data(&self) -> String {
        let queue = self.queue().await;
        let first = queue.first().expect("a holder's node");
        let (data, _) = timeout(STEP, self.zk.get_data(&format!("{}/{first}", self.path)))
            .await
            .expect("get_data timed out")
            .expect("the holder's node");
        String::from_utf8_lossy(&data).into_owned()
    }

    /// Removes the lock's node and the base path, when they are empty.
    async fn clean_up(self) {
        for path in [self.path.as_str(), self.base.as_str()] {
            let _ = timeout(STEP, self.zk.delete(path, None)).await;
        }
    }
}

/// True for a node named as Curator's `InterProcessMutex` names it: `_c_<uuid>-lock-<10 digits>`.
fn curator_layout(node: &str) -> bool {
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
fn leaf(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Promise 1: at most one holder per name, with a real Curator client holding. While
/// Curator's `InterProcessMutex` holds the path distlock uses for the name, distlock's
/// `try_acquire` answers `None` and a waiting `acquire_with` queues behind Curator's node (as
/// Curator's own view of the queue shows); it is granted only after Curator was told to
/// release, and Curator's node is gone when the grant returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_curator_holder_excludes_distlock_until_it_releases() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;

    assert_eq!(
        curator.command(&format!("acquire {path} 5000"), STEP).await,
        "acquired"
    );
    let held = curator.participants(&path).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(curator_layout(leaf(&held[0])), "{held:?}");
    let curator_node = leaf(&held[0]).to_owned();

    let mutex = setup.locks.mutex(setup.name).unwrap();
    let tried = timeout(STEP, mutex.try_acquire())
        .await
        .expect("try_acquire hung");
    assert!(
        tried.unwrap().is_none(),
        "distlock's try_acquire was granted while Curator holds"
    );
    assert!(
        timeout(STEP, setup.locks.is_locked(setup.name))
            .await
            .unwrap()
            .unwrap()
    );

    let setup = Arc::new(setup);
    let waiter = tokio::spawn({
        let setup = setup.clone();
        async move {
            let guard = setup
                .locks
                .mutex(setup.name)
                .unwrap()
                .acquire_with(AcquireOptions::new().wait(Duration::from_secs(30)))
                .await
                .expect("distlock was not granted after Curator released");
            let granted = Instant::now();
            (guard, granted, setup.queue().await)
        }
    });
    // The waiter's node joins the queue behind Curator's, in both recipes' order.
    let start = Instant::now();
    let queue = loop {
        let queue = setup.queue().await;
        if queue.len() == 2 || start.elapsed() > STEP {
            break queue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(queue.len(), 2, "distlock's waiter never queued: {queue:?}");
    assert_eq!(queue[0], curator_node);
    assert!(curator_layout(&queue[1]), "{queue:?}");
    let seen_by_curator: Vec<String> = curator
        .participants(&path)
        .await
        .iter()
        .map(|node| leaf(node).to_owned())
        .collect();
    assert_eq!(
        seen_by_curator, queue,
        "Curator orders distlock's waiter behind its own node"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "distlock was granted while Curator holds"
    );

    // The grant may reach distlock before Curator's `released` line reaches us (the deletion's
    // watch and Curator's reply race), so the order asserted is: not granted before the
    // release was asked for, and Curator's node gone when the grant returns.
    let release_sent = Instant::now();
    assert_eq!(curator.command("release", STEP).await, "released");
    let (guard, granted, queue_at_grant) = timeout(STEP, waiter)
        .await
        .expect("distlock was not granted within 20 s of Curator's release")
        .unwrap();
    assert!(granted >= release_sent);
    assert!(
        !queue_at_grant.contains(&curator_node),
        "granted while Curator's node is there: {queue_at_grant:?}"
    );
    assert_eq!(queue_at_grant.len(), 1, "{queue_at_grant:?}");
    assert!(setup.holder_data().await.starts_with("distlock "));
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    curator.exit().await;
    Arc::into_inner(setup).unwrap().clean_up().await;
}

/// Promise 1: at most one holder per name, with distlock holding. While distlock holds, a real
/// Curator client's `acquire(500 ms)` times out (and leaves the queue); Curator sees distlock's
/// node as the holder; a Curator client waiting when distlock releases is granted then, and
/// then distlock is refused until Curator releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_distlock_holder_excludes_curator_until_it_releases() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;
    let mutex = setup.locks.mutex(setup.name).unwrap();

    let guard = timeout(STEP, mutex.acquire()).await.unwrap().unwrap();
    let queue = setup.queue().await;
    assert_eq!(queue.len(), 1, "{queue:?}");
    let distlock_node = queue[0].clone();
    let seen_by_curator = curator.participants(&path).await;
    assert_eq!(
        seen_by_curator.iter().map(|n| leaf(n)).collect::<Vec<_>>(),
        [distlock_node.as_str()],
        "Curator sees distlock's node as the holder"
    );

    let asked = Instant::now();
    assert_eq!(
        curator.command(&format!("acquire {path} 500"), STEP).await,
        "timeout",
        "Curator was granted while distlock holds"
    );
    assert!(asked.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        setup.queue().await,
        std::slice::from_ref(&distlock_node),
        "Curator's timed-out node left the queue"
    );

    // A Curator client that waits is granted when distlock releases, not before.
    curator.send(&format!("acquire {path} 20000"));
    let start = Instant::now();
    while setup.queue().await.len() < 2 {
        assert!(start.elapsed() < STEP, "Curator never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if curator.has_reply() {
        let reply = curator.reply(STEP).await;
        panic!("Curator answered {reply:?} while distlock holds");
    }
    let release_started = Instant::now();
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    assert_eq!(curator.reply(STEP).await, "acquired");
    let curator_granted = Instant::now();
    assert!(curator_granted >= release_started);
    assert!(
        !setup.queue().await.contains(&distlock_node),
        "distlock's node outlived its release"
    );
    assert!(!setup.holder_data().await.starts_with("distlock "));

    let other = setup.other_client().await;
    for locks in [&setup.locks, &other] {
        let tried = timeout(STEP, locks.mutex(setup.name).unwrap().try_acquire())
            .await
            .expect("try_acquire hung")
            .unwrap();
        assert!(tried.is_none(), "distlock was granted while Curator holds");
    }
    assert_eq!(curator.command("release", STEP).await, "released");
    let guard = timeout(STEP, mutex.try_acquire())
        .await
        .unwrap()
        .unwrap()
        .expect("distlock was refused after Curator released");
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    curator.exit().await;
    setup.clean_up().await;
}

/// Who holds the lock, as the test's drivers know it for certain: from the grant until the
/// release is asked for.
#[derive(Default)]
struct Holding {
    holder: Option<&'static str>,
    /// Every grant in order.
    history: Vec<&'static str>,
}

impl Holding {
    fn enter(this: &StdMutex<Holding>, who: &'static str) {
        let mut holding = this.lock().unwrap();
        if let Some(other) = holding.holder {
            panic!(
                "{who} was granted while {other} holds (grants so far: {:?})",
                holding.history
            );
        }
        holding.holder = Some(who);
        holding.history.push(who);
    }

    fn leave(this: &StdMutex<Holding>, who: &'static str) {
        let mut holding = this.lock().unwrap();
        assert_eq!(holding.holder, Some(who));
        holding.holder = None;
    }
}

/// Rounds per contender in the queueing test, and how long each grant is held.
const ROUNDS: usize = 6;
const HOLD: Duration = Duration::from_millis(100);

/// Promise 1: at most one holder per name while Curator and distlock queue on one lock. A
/// Curator client and two distlock clients (three sessions) each take the lock `ROUNDS` times,
/// holding it 100 ms and queueing again at once. Whenever a driver knows its side holds (from
/// the grant until it asks for the release), no other side does, and the node first in line
/// is the holder's. Each side gets every round, and the grants pass between Curator and
/// distlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_curator_and_distlock_queue_on_one_lock_without_overlap() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;
    let other = setup.other_client().await;
    let holding = StdMutex::new(Holding::default());

    let curator_side = async {
        for round in 0..ROUNDS {
            let reply = curator
                .command(&format!("acquire {path} 30000"), STEP * 2)
                .await;
            assert_eq!(reply, "acquired", "Curator's round {round}");
            Holding::enter(&holding, "curator");
            let data = setup.holder_data().await;
            assert!(
                !data.starts_with("distlock "),
                "Curator holds but a distlock node is first in line"
            );
            tokio::time::sleep(HOLD).await;
            Holding::leave(&holding, "curator");
            assert_eq!(curator.command("release", STEP).await, "released");
        }
    };
    let distlock_side = |locks: Locks, who: &'static str| {
        let setup = &setup;
        let holding = &holding;
        async move {
            let mutex = locks.mutex(setup.name).unwrap();
            for round in 0..ROUNDS {
                let guard = timeout(
                    STEP * 2,
                    mutex.acquire_with(AcquireOptions::new().wait(Duration::from_secs(30))),
                )
                .await
                .unwrap_or_else(|_| panic!("{who}'s round {round} hung"))
                .unwrap_or_else(|e| panic!("{who}'s round {round}: {e}"));
                Holding::enter(holding, who);
                let data = setup.holder_data().await;
                assert!(
                    data.starts_with("distlock "),
                    "{who} holds but the node first in line is not distlock's: {data:?}"
                );
                tokio::time::sleep(HOLD).await;
                Holding::leave(holding, who);
                timeout(STEP, guard.release()).await.unwrap().unwrap();
            }
        }
    };
    let started = Instant::now();
    tokio::join!(
        curator_side,
        distlock_side(setup.locks.clone(), "distlock A"),
        distlock_side(other, "distlock B"),
    );
    let history = holding.into_inner().unwrap().history;
    for who in ["curator", "distlock A", "distlock B"] {
        assert_eq!(
            history.iter().filter(|h| **h == who).count(),
            ROUNDS,
            "{history:?}"
        );
    }
    let handoffs = history
        .windows(2)
        .filter(|pair| (pair[0] == "curator") != (pair[1] == "curator"))
        .count();
    assert!(
        handoffs >= ROUNDS,
        "the lock rarely passed between Curator and distlock: {history:?}"
    );
    eprintln!(
        "{} grants in {:?}, {handoffs} between Curator and distlock: {history:?}",
        history.len(),
        started.elapsed()
    );
    assert!(setup.queue().await.is_empty(), "nodes left behind");
    curator.exit().await;
    setup.clean_up().await;
}

/// No promise: the test's own helpers (the connect string of a URL, Curator's node names).
/// Promise 1 for leadership: Curator's `LeaderSelector` (its leader holds an
/// `InterProcessMutex` on the selector's path) on the path of a distlock election's mutex, and
/// distlock's `Election`, exclude each other in both directions: distlock is elected only after
/// Curator's leader resigned, Curator's selector times out while distlock leads, and a waiting
/// Curator selector takes leadership when distlock resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_curator_leader_selector_and_distlock_election_exclude_each_other() {
    let setup = Setup::new().await;
    let election = setup.locks.election("jobs/scheduler").unwrap();
    let path = format!(
        "{}/{}",
        setup.base,
        LockName::new(election.lock_name()).unwrap().escaped()
    );
    let mut curator = Curator::start(&setup.connect).await;
    assert_eq!(
        curator.command(&format!("lead {path} 20000"), STEP).await,
        "leading"
    );
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let leadership = election
                .campaign_with("distlock", AcquireOptions::new().wait(STEP))
                .await;
            (leadership, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !campaign.is_finished(),
        "distlock was elected while Curator's selector leads"
    );
    let resign_sent = Instant::now();
    assert_eq!(curator.command("resign", STEP).await, "resigned");
    let (leadership, elected) = timeout(STEP, campaign).await.unwrap().unwrap();
    let leadership = leadership.expect("distlock was not elected after Curator resigned");
    assert!(elected >= resign_sent, "elected before Curator resigned");
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.term, leader.value.as_str()),
        (leadership.term(), "distlock")
    );

    assert_eq!(
        curator.command(&format!("lead {path} 500"), STEP).await,
        "timeout",
        "Curator's selector led while distlock leads"
    );
    curator.send(&format!("lead {path} 20000"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    if curator.has_reply() {
        let reply = curator.reply(STEP).await;
        panic!("Curator answered {reply:?} while distlock leads");
    }
    timeout(STEP, leadership.resign()).await.unwrap().unwrap();
    assert_eq!(curator.reply(STEP).await, "leading");
    assert_eq!(curator.command("resign", STEP).await, "resigned");
    curator.exit().await;
    // The election's lock node and its published record, then the rest.
    if let Ok(Ok(children)) = timeout(STEP, setup.zk.list_children(&setup.base)).await {
        for child in children {
            let _ = timeout(
                STEP,
                setup.zk.delete(&format!("{}/{child}", setup.base), None),
            )
            .await;
        }
    }
    setup.clean_up().await;
}

#[test]
fn connect_strings_are_taken_from_urls() {
    assert_eq!(connect_string("zk://127.0.0.1:2181/"), "127.0.0.1:2181");
    assert_eq!(connect_string("zk://a:1,b:2/base?x=1"), "a:1,b:2");
    assert_eq!(connect_string("zk://a:1?session_timeout=2s"), "a:1");
    assert!(curator_layout(
        "_c_3f0c1e3c-7d2a-4b8e-9c1f-0a1b2c3d4e5f-lock-0000000007"
    ));
    assert!(!curator_layout("lock-0000000007"));
}
