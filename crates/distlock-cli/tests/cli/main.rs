//! The `distlock` binary end to end: the demo and its hot-item scenario, the benchmark,
//! `check` on every backend, operator commands, bad input, holders in other processes killed with SIGKILL, commands
//! run under a lock (`run`, `elect`), and those commands under signals, hung servers and
//! deaths.

mod bench;
mod check;
mod cross_process;
mod deaths;
mod demo;
mod hot_item;
mod operator;
mod partitions;
mod run;
mod scheduled;
mod secrets;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use distlock::conformance::servers;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn distlock(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run the distlock binary")
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "distlock failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// Starts `distlock hold` and returns it with the fencing token it printed.
fn spawn_holder(url: &str, name: &str, lease_ms: u64) -> (Child, u64) {
    spawn_holder_of(url, name, lease_ms, &[])
}

/// A `distlock hold` child with `extra` arguments (`--kind permit`, ...), and the fencing token
/// it printed once it held.
fn spawn_holder_of(url: &str, name: &str, lease_ms: u64, extra: &[&str]) -> (Child, u64) {
    let mut child = Command::new(BIN)
        .args([
            "hold",
            "--backend",
            url,
            "--name",
            name,
            "--lease-ms",
            &lease_ms.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start distlock hold");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's line");
    let token: Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("holder printed {line:?}: {e}"));
    (
        child,
        token["fencing_token"].as_u64().expect("fencing_token"),
    )
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// The report of a successful `--json` run of `command` (its words, e.g. `demo hot-item`):
/// the envelope every row-reporting command prints, `command`, `results` and `unavailable`.
fn json_report(output: &Output, command: &str) -> Value {
    let report = stdout_json(output);
    assert_eq!(report["command"], command, "{report}");
    assert!(report["results"].is_array(), "{report}");
    assert!(report["unavailable"].is_array(), "{report}");
    report
}

// The servers `scripts/test` makes sure of, as `distlock::conformance::servers` lists them
// (their variables override the URLs; a missing server fails the test with the command
// that starts it).

fn redis_url() -> String {
    servers::REDIS.url()
}

fn mysql_url() -> String {
    servers::MYSQL.url()
}

fn postgres_url() -> String {
    servers::POSTGRES.url()
}

fn redlock_url() -> String {
    servers::REDLOCK.url()
}

fn redis_sentinel_url() -> String {
    servers::REDIS_SENTINEL.url()
}

fn redis_cluster_url() -> String {
    servers::REDIS_CLUSTER.url()
}

fn zookeeper_url() -> String {
    servers::ZOOKEEPER.url()
}

fn etcd_url() -> String {
    servers::ETCD.url()
}
