//! The `distlock` binary end to end: the demo and its hot-item scenario, the benchmark,
//! operator commands, bad input, and holders in other processes killed with SIGKILL.

mod bench;
mod cross_process;
mod demo;
mod hot_item;
mod operator;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

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

/// The Redis server `scripts/test` makes sure of (`DISTLOCK_REDIS_URL` overrides).
fn redis_url() -> String {
    std::env::var("DISTLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// The MariaDB database `scripts/test` makes sure of (`DISTLOCK_MYSQL_URL` overrides).
fn mysql_url() -> String {
    std::env::var("DISTLOCK_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The PostgreSQL database `scripts/test` makes sure of (`DISTLOCK_POSTGRES_URL` overrides).
fn postgres_url() -> String {
    std::env::var("DISTLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/test".into())
}

/// The Sentinel group `scripts/test` starts (`DISTLOCK_REDIS_SENTINEL_URL` overrides).
fn redis_sentinel_url() -> String {
    std::env::var("DISTLOCK_REDIS_SENTINEL_URL").unwrap_or_else(|_| {
        "redis+sentinel://127.0.0.1:6382,127.0.0.1:6383,127.0.0.1:6384/distlock".into()
    })
}

/// The Cluster `scripts/test` starts (`DISTLOCK_REDIS_CLUSTER_URL` overrides).
fn redis_cluster_url() -> String {
    std::env::var("DISTLOCK_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002/".into())
}

/// The standalone ZooKeeper server `scripts/test` starts (`DISTLOCK_ZK_URL` overrides).
fn zookeeper_url() -> String {
    std::env::var("DISTLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/".into())
}
