//! etcd's own Go client, as `etcdctl`, on the names distlock uses: `etcdctl lock` against
//! distlock's mutex and `etcdctl elect` against distlock's election (both sides keep the
//! layouts of the Go client's `concurrency` package), each excluding the other both ways.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use distlock::AcquireOptions;
use tokio::time::Instant;

use super::{keys, raw, servers_of, standalone, unique};

/// An `etcdctl` child process, killed by its PID when dropped.
struct Etcdctl {
    child: Child,
    /// Its stdout, line by line.
    lines: mpsc::Receiver<String>,
}

impl Etcdctl {
    fn spawn(url: &str, args: &[&str]) -> Self {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", servers_of(url).join(",")))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl runs (scripts/test installs the etcd-client package)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Etcdctl { child, lines }
    }

    /// `etcdctl lock NAME COMMAND...`: runs the command while holding the lock.
    fn lock(url: &str, name: &str, command: &[&str]) -> Self {
        Self::spawn(url, &[&["lock", name], command].concat())
    }

    /// `etcdctl elect NAME PROPOSAL`: campaigns; once elected prints its key and value and
    /// leads until interrupted.
    fn elect(url: &str, name: &str, proposal: &str) -> Self {
        Self::spawn(url, &["elect", name, proposal])
    }

    /// `etcdctl elect -l NAME`: prints the key and value of each leader it observes.
    fn observe(url: &str, name: &str) -> Self {
        Self::spawn(url, &["elect", "-l", name])
    }

    /// The next line of its stdout, waiting at most `within`.
    async fn line_within(&mut self, within: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            match self.lines.try_recv() {
                Ok(line) => return Some(line),
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) if start.elapsed() >= within => return None,
                Err(mpsc::TryRecvError::Empty) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Waits for the child to exit, at most `within`; its stdout, or `None` if it still runs.
    async fn output_within(&mut self, within: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("etcdctl's status") {
                assert!(status.success(), "etcdctl failed: {status}");
                // The reader thread ends with the pipe; give it a moment to hand over the rest.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Some(self.lines.try_iter().collect::<Vec<_>>().join("\n"));
            }
            if start.elapsed() >= within {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGINT to this child (by its PID): `etcdctl elect` then resigns and exits.
    fn interrupt(&self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -INT failed: {status}");
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Promise 1 with a Go client: while `etcdctl lock NAME` holds, distlock cannot get NAME; it
/// is granted once etcdctl releases (its key is deleted), not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_an_etcdctl_lock_excludes_distlock() {
    let url = standalone();
    let raw = raw(&url).await;
    let name = unique("etcdctl_holds");
    let mut etcdctl = Etcdctl::lock(&url, &name, &["sleep", "2"]);
    let start = Instant::now();
    while keys(&raw, &name).await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "etcdctl never locked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let locks = distlock::connect(&url).await.unwrap();
    let mutex = locks.mutex(name.as_str()).unwrap();
    assert!(
        mutex.try_acquire().await.unwrap().is_none(),
        "distlock got a lock etcdctl holds"
    );
    let guard = mutex
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("distlock was not granted after etcdctl released");
    let found = keys(&raw, &name).await;
    assert_eq!(
        found.len(),
        1,
        "granted while etcdctl's key is there: {found:?}"
    );
    assert_eq!(u64::try_from(found[0].1).unwrap(), guard.fencing_token());
    guard.release().await.unwrap();
    assert!(
        etcdctl
            .output_within(Duration::from_secs(5))
            .await
            .is_some()
    );
}

/// Promise 1 the other way: while distlock holds NAME, `etcdctl lock NAME` waits; it gets the
/// lock once distlock releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_distlock_excludes_an_etcdctl_lock() {
    let url = standalone();
    let name = unique("distlock_holds");
    let locks = distlock::connect(&url).await.unwrap();
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let mut etcdctl = Etcdctl::lock(&url, &name, &["echo", "etcdctl-holds"]);
    assert_eq!(
        etcdctl.output_within(Duration::from_millis(1500)).await,
        None,
        "etcdctl got a lock distlock holds"
    );
    guard.release().await.unwrap();
    let out = etcdctl
        .output_within(Duration::from_secs(10))
        .await
        .expect("etcdctl was not granted after distlock released");
    assert!(out.contains("etcdctl-holds"), "{out}");
}

/// Promise 1 for elections with a Go client: while `etcdctl elect NAME` leads, distlock's
/// `leader()` names it (its key and proposal) and a distlock campaign waits; distlock is
/// elected once etcdctl resigns, not before, with a term above etcdctl's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_an_etcdctl_leader_excludes_a_distlock_campaign() {
    let url = standalone();
    let name = unique("etcdctl_leads");
    let mut etcdctl = Etcdctl::elect(&url, &name, "go-1");
    let key = etcdctl
        .line_within(Duration::from_secs(10))
        .await
        .expect("etcdctl was not elected");
    assert_eq!(
        etcdctl.line_within(Duration::from_secs(5)).await.as_deref(),
        Some("go-1")
    );
    let locks = distlock::connect(&url).await.unwrap();
    let election = locks.election(name.as_str()).unwrap();
    assert!(election.is_native(), "etcd keeps the election itself");
    let leader = election.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(
        (leader.value.as_str(), leader.holder.as_str()),
        ("go-1", key.as_str())
    );
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let leadership = election
                .campaign_with(
                    "distlock",
                    AcquireOptions::new().wait(Duration::from_secs(20)),
                )
                .await;
            (leadership, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !campaign.is_finished(),
        "distlock was elected while etcdctl leads"
    );
    let interrupted = Instant::now();
    etcdctl.interrupt();
    let (leadership, elected) = tokio::time::timeout(Duration::from_secs(20), campaign)
        .await
        .expect("the campaign did not end")
        .unwrap();
    let leadership = leadership.expect("distlock was not elected after etcdctl resigned");
    assert!(elected >= interrupted, "elected before etcdctl resigned");
    assert!(
        leadership.term() > leader.term,
        "term {} after {}",
        leadership.term(),
        leader.term
    );
    let now = election.leader().await.unwrap().expect("distlock leads");
    assert_eq!(
        (now.term, now.value.as_str()),
        (leadership.term(), "distlock")
    );
    assert!(
        etcdctl
            .output_within(Duration::from_secs(10))
            .await
            .is_some()
    );
    leadership.resign().await.unwrap();
}

/// Promise 1 the other way: while distlock leads, `etcdctl elect -l` observes distlock's key
/// and value as the leader, and `etcdctl elect NAME` waits; it leads once distlock resigns,
/// and distlock's `leader()` then names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_distlock_leader_excludes_etcdctl_elect() {
    let url = standalone();
    let name = unique("distlock_leads");
    let raw = raw(&url).await;
    let locks = distlock::connect(&url).await.unwrap();
    let election = locks.election(name.as_str()).unwrap();
    let leadership = election.campaign("distlock").await.unwrap();
    let found = keys(&raw, &name).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(u64::try_from(found[0].1).unwrap(), leadership.term());
    let mut observer = Etcdctl::observe(&url, &name);
    assert_eq!(
        observer
            .line_within(Duration::from_secs(10))
            .await
            .as_deref(),
        Some(found[0].0.as_str()),
        "etcdctl does not observe distlock's key as the leader's"
    );
    assert_eq!(
        observer
            .line_within(Duration::from_secs(5))
            .await
            .as_deref(),
        Some("distlock"),
        "etcdctl does not observe distlock's value"
    );
    let mut candidate = Etcdctl::elect(&url, &name, "go-2");
    assert_eq!(
        candidate.line_within(Duration::from_millis(1500)).await,
        None,
        "etcdctl was elected while distlock leads"
    );
    leadership.resign().await.unwrap();
    let key = candidate
        .line_within(Duration::from_secs(10))
        .await
        .expect("etcdctl was not elected after distlock resigned");
    assert_eq!(
        candidate
            .line_within(Duration::from_secs(5))
            .await
            .as_deref(),
        Some("go-2")
    );
    let leader = election.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(
        (leader.value.as_str(), leader.holder.as_str()),
        ("go-2", key.as_str())
    );
    candidate.interrupt();
    assert!(
        candidate
            .output_within(Duration::from_secs(10))
            .await
            .is_some()
    );
    assert!(
        election.leader().await.unwrap().is_none(),
        "a leader after etcdctl resigned"
    );
}
