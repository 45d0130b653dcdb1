//! `distlock check` end to end: on every backend its workers, paused and killed, keep every
//! promise, and so they do on every networked backend with their connections cut,
//! partitioned and losing replies; on a lock that is not distributed (the in-process memory backend, one per worker
//! process) it reports the overlaps and exits 1, so the check can fail.

use std::process::Command;

use distlock::conformance::servers;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// The process faults, which every backend takes.
const PROCESS_FAULTS: &str = "pause,kill";
/// The faults the checker causes through each worker's proxy.
const NETWORK_FAULTS: &str = "cut,partition,lose-reply";

/// Runs a short check with `faults` and returns its exit status and JSON report.
fn check(url: &str, faults: &str) -> (std::process::ExitStatus, Value, String) {
    let output = Command::new(BIN)
        .args(["check", "--backend", url, "--json"])
        .args(["--duration-s", "6", "--workers", "3", "--lease-ms", "500"])
        .args(["--faults", faults])
        // memory:// is refused unless asked for: the test of the checker's own power.
        .args(url.starts_with("memory://").then_some("--allow-unshared"))
        .output()
        .expect("run the distlock binary");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr: {stderr}"));
    (output.status, report, stderr)
}

fn number(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing: {report}"))
}

/// Promises 1 to 3 and no lost update, checked on a history with `faults`.
fn keeps_its_promises(url: &str, faults: &str) {
    let (status, report, stderr) = check(url, faults);
    let violations = report["violations"].as_array().cloned().unwrap_or_default();
    assert!(
        violations.is_empty(),
        "{url}: violations {violations:?}\nstderr: {stderr}"
    );
    assert!(status.success(), "{url}: exit {status}; stderr: {stderr}");
    assert!(number(&report, "acquisitions") >= 20, "{url}: {report}");
    let injected: u64 = report["faults"]
        .as_object()
        .map(|kinds| kinds.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    assert!(injected >= 1, "{url}: no fault was injected: {report}");
}

#[test]
fn check_finds_the_overlaps_of_a_lock_that_is_not_distributed() {
    let (status, report, _) = check("memory://check", PROCESS_FAULTS);
    assert_eq!(status.code(), Some(1), "{report}");
    let violations = report["violations"].as_array().cloned().unwrap_or_default();
    assert!(!violations.is_empty(), "no violation found: {report}");
}

fn redis_url() -> String {
    servers::REDIS.url()
}

fn postgres_url() -> String {
    servers::POSTGRES.url()
}

fn mysql_url() -> String {
    servers::MYSQL.url()
}

fn zk_url() -> String {
    servers::ZOOKEEPER.url()
}

macro_rules! check_suite {
    ($faults:expr; $($backend:ident => $url:expr;)*) => {$(
        #[test]
        fn $backend() {
            let (url, _keep) = $url;
            keeps_its_promises(&url, $faults);
        }
    )*};
}

mod check_keeps_promises_with_faults {
    use super::*;

    check_suite! {
        PROCESS_FAULTS;
        sqlite => {
            let dir = tempfile::tempdir().unwrap();
            (format!("sqlite://{}", dir.path().join("locks.db").display()), dir)
        };
        redis => (redis_url(), ());
        redis_spin => (redis_url().replacen("redis://", "redis+spin://", 1), ());
        postgres_advisory => (postgres_url(), ());
        postgres_table => (format!("{}?mode=table", postgres_url()), ());
        mysql_named => (mysql_url(), ());
        mysql_table => (format!("{}?mode=table", mysql_url()), ());
        zk => (format!("{}?session_timeout=2s", zk_url()), ());
    }
}

mod check_keeps_promises_with_network_faults {
    use super::*;

    check_suite! {
        NETWORK_FAULTS;
        redis => (redis_url(), ());
        redis_spin => (redis_url().replacen("redis://", "redis+spin://", 1), ());
        postgres_advisory => (postgres_url(), ());
        postgres_table => (format!("{}?mode=table", postgres_url()), ());
        mysql_named => (mysql_url(), ());
        mysql_table => (format!("{}?mode=table", mysql_url()), ());
        zk => (format!("{}?session_timeout=2s", zk_url()), ());
    }
}

/// Network faults on a backend without a network, or one whose client connects to addresses
/// its servers announce, are refused before any worker starts: exit 2 and the reason.
#[test]
fn network_faults_on_an_unroutable_backend_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("locks.db").display());
    for url in [sqlite.as_str(), "redis+cluster://127.0.0.1:7000/"] {
        let output = Command::new(BIN)
            .args(["check", "--backend", url, "--faults", "cut"])
            .output()
            .expect("run the distlock binary");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains("network faults"), "{url}: {stderr}");
    }
}

/// `check --metrics-addr 127.0.0.1:0`: the checker and every worker print where they serve
/// their metrics, and a worker's page, scraped while the check runs, counts its grants.
#[test]
fn check_serves_the_workers_metrics() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let mut child = Command::new(BIN)
        .args(["check", "--backend", &url, "--json", "--faults", "pause"])
        .args(["--duration-s", "8", "--workers", "2", "--lease-ms", "500"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the distlock binary");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut addresses = Vec::new();
    while addresses.len() < 3 {
        let line = lines
            .next()
            .expect("the check ended before 3 metrics addresses were printed")
            .unwrap();
        if let Some(rest) = line.strip_prefix("distlock: metrics at http://") {
            addresses.push(rest.trim_end_matches("/metrics").to_owned());
        }
    }
    // The last address printed is a worker's (the checker's comes first).
    let worker = addresses.last().unwrap().clone();
    let start = std::time::Instant::now();
    loop {
        let mut stream = std::net::TcpStream::connect(&worker).expect("connect to a worker");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        write!(stream, "GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut page = String::new();
        stream.read_to_string(&mut page).unwrap();
        if page.contains("distlock_grants_total{backend=\"sqlite\"") {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(6),
            "no grant counted by the worker:\n{page}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "the check failed");
}

/// Bad input for the options of partitions made outside the checker is refused before any
/// worker starts: exit 2 and the reason (a namespace that cannot be entered, network faults
/// with namespaces, a log directory that holds another run's files).
#[test]
fn worker_namespaces_and_log_dir_are_checked_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("worker-0.jsonl"), "").unwrap();
    let busy = dir.path().display().to_string();
    for (args, reason) in [
        (
            vec!["--faults", "none", "--worker-netns", "distlock-no-such-ns"],
            "--worker-netns",
        ),
        (
            vec!["--faults", "none", "--worker-netns", "a/b"],
            "not a network namespace name",
        ),
        (
            vec!["--faults", "cut", "--worker-netns", "x"],
            "not with --worker-netns",
        ),
        (
            vec!["--faults", "none", "--log-dir", busy.as_str()],
            "not empty",
        ),
    ] {
        let output = Command::new(BIN)
            .args(["check", "--backend", "redis://127.0.0.1:6379/"])
            .args(&args)
            .output()
            .expect("run the distlock binary");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}
