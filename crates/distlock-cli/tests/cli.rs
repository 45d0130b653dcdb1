//! The `distlock` binary end to end: the demo, the benchmark, operator commands, bad input,
//! and holders in other processes killed with SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock::AcquireOptions;
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

#[test]
fn demo_oversells_without_a_lock_and_is_exact_with_the_table_lock() {
    let redis = redis_url();
    let output = distlock(&[
        "demo", "--json", "--stock", "30", "--orders", "120", "--redis", &redis,
    ]);
    let report = stdout_json(&output);
    let results = report["results"].as_array().expect("results");
    let row = |name: &str| {
        results
            .iter()
            .find(|r| r["strategy"] == name)
            .unwrap_or_else(|| panic!("no {name} row in {report}"))
    };
    for broken in ["none", "in-process"] {
        let r = row(broken);
        assert_eq!(r["exact"], false, "{broken} was exact: {r}");
        let damage = r["oversold"].as_u64().unwrap() as i64 + r["lost_updates"].as_i64().unwrap();
        assert!(damage > 0, "{broken}: {r}");
    }
    for exact in ["table-lock", "redis", "redis-spin", "redis-atomic"] {
        let r = row(exact);
        assert_eq!(r["exact"], true, "{r}");
        assert_eq!(r["accepted"], 30, "{r}");
        assert_eq!(r["final_stock"], 0, "{r}");
        assert_eq!(r["refused"], 90, "{r}");
    }
}

#[test]
fn demo_lists_a_strategy_whose_server_is_missing_as_unavailable() {
    // Port 1 on loopback: nothing listens there.
    let output = distlock(&[
        "demo",
        "--json",
        "--strategy",
        "redis",
        "--strategy",
        "none",
        "--redis",
        "redis://127.0.0.1:1/",
        "--orders",
        "10",
    ]);
    let report = stdout_json(&output);
    assert_eq!(report["results"].as_array().unwrap().len(), 1, "{report}");
    let unavailable = &report["unavailable"][0];
    assert_eq!(unavailable["strategy"], "redis", "{report}");
    assert!(
        unavailable["reason"].as_str().unwrap().contains("refused"),
        "{report}"
    );
}

/// The database-native strategies keep their stock in PostgreSQL and MariaDB: row locks,
/// version checks and session locks around a committed transaction all sell exactly the
/// stock; an optimistic buyer may give up, and that order is neither sold nor lost.
#[test]
fn demo_database_strategies_are_exact() {
    let mut args = vec![
        "demo",
        "--json",
        "--stock",
        "20",
        "--orders",
        "60",
        "--workers",
        "2",
    ];
    let strategies = [
        "pg-pessimistic",
        "pg-optimistic",
        "pg-advisory",
        "mysql-pessimistic",
        "mysql-optimistic",
        "mysql-named",
    ];
    for strategy in strategies {
        args.extend(["--strategy", strategy]);
    }
    let postgres = postgres_url();
    let mysql = mysql_url();
    args.extend(["--postgres", &postgres, "--mysql", &mysql]);
    let report = stdout_json(&distlock(&args));
    assert!(
        report["unavailable"].as_array().unwrap().is_empty(),
        "{report}"
    );
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), strategies.len(), "{report}");
    for r in results {
        assert_eq!(r["exact"], true, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        let accepted = r["accepted"].as_u64().unwrap();
        let refused = r["refused"].as_u64().unwrap();
        let gave_up = r["gave_up"].as_u64().unwrap();
        let remaining = r["final_stock"].as_i64().unwrap();
        assert_eq!(accepted as i64 + remaining, 20, "{r}");
        assert_eq!(accepted + refused + gave_up, 60, "{r}");
        if r["strategy"].as_str().unwrap().ends_with("optimistic") {
            assert!(accepted > 0, "{r}");
        } else {
            assert_eq!((accepted, gave_up), (20, 0), "{r}");
        }
    }
}

/// The hot-item scenario sells exactly its stock with one lock and with segments, on each
/// lock backend it runs, and reports orders/s for both (speed is for `distlock bench` and
/// the demo's figures, not asserted here).
#[test]
fn demo_hot_item_is_exact_with_one_lock_and_with_segments() {
    let redis = redis_url();
    let postgres = postgres_url();
    let mysql = mysql_url();
    let zookeeper = zookeeper_url();
    let output = distlock(&[
        "demo",
        "--json",
        "--hot-item",
        "--hot-stock",
        "60",
        "--hot-hold-ms",
        "2",
        "--hot-segments",
        "6",
        "--hot-tasks",
        "4",
        "--workers",
        "2",
        "--strategy",
        "table-lock",
        "--strategy",
        "redis",
        "--strategy",
        "pg-advisory",
        "--strategy",
        "mysql-named",
        "--strategy",
        "redis-atomic",
        "--strategy",
        "redis-spin",
        "--strategy",
        "zookeeper",
        "--redis",
        &redis,
        "--postgres",
        &postgres,
        "--mysql",
        &mysql,
        "--zookeeper",
        &zookeeper,
    ]);
    let report = stdout_json(&output);
    assert!(
        report["unavailable"].as_array().unwrap().is_empty(),
        "{report}"
    );
    let runs = report["runs"].as_array().unwrap();
    // Two runs per lock (1 and 6 segments), one for the atomic script.
    assert_eq!(runs.len(), 13, "{report}");
    for run in runs {
        // The stock lives on the lock's own server where it can (ZooKeeper's in Redis).
        let store = match run["lock"].as_str().unwrap() {
            "table-lock" => "sqlite-full",
            "pg-advisory" => "postgres",
            "mysql-named" => "mysql",
            _ => "redis",
        };
        assert_eq!(run["store"], store, "{run}");
        assert_eq!(run["exact"], true, "{run}");
        assert_eq!(run["served"], 60, "{run}");
        assert_eq!(run["final_stock"], 0, "{run}");
        assert!(run["orders_per_s"].as_f64().unwrap() > 0.0, "{run}");
    }
}

/// A database strategy whose server does not answer is listed with the reason.
#[test]
fn demo_lists_a_missing_database_as_unavailable() {
    let output = distlock(&[
        "demo",
        "--json",
        "--strategy",
        "mysql-pessimistic",
        "--strategy",
        "pg-optimistic",
        "--mysql",
        "mysql://root@127.0.0.1:1/test",
        "--postgres",
        "postgres://postgres@127.0.0.1:1/test",
        "--orders",
        "10",
    ]);
    let report = stdout_json(&output);
    assert!(report["results"].as_array().unwrap().is_empty(), "{report}");
    let unavailable = report["unavailable"].as_array().unwrap();
    assert_eq!(unavailable.len(), 2, "{report}");
    for entry in unavailable {
        assert!(
            entry["reason"].as_str().unwrap().contains("refused"),
            "{report}"
        );
    }
}

#[test]
fn demo_runs_one_strategy_on_a_given_db() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db");
    let output = distlock(&[
        "demo",
        "--json",
        "--strategy",
        "table-lock",
        "--db",
        db.to_str().unwrap(),
        "--stock",
        "12",
        "--orders",
        "20",
        "--workers",
        "2",
        "--tasks",
        "2",
    ]);
    let report = stdout_json(&output);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["final_stock"], 0);
    assert_eq!(results[0]["accepted"], 12);
    assert!(db.exists());
}

#[test]
fn bench_reports_every_figure_and_draws_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let plot = dir.path().join("gap.svg");
    let output = distlock(&[
        "bench",
        "--backend",
        &url,
        "--json",
        "--workers",
        "3",
        "--duration-s",
        "1",
        "--pairs",
        "50",
        "--rtt-samples",
        "50",
        "--plot",
        plot.to_str().unwrap(),
        "--renewal-locks",
        "20",
        "--renewal-s",
        "1",
    ]);
    let report = stdout_json(&output);
    assert!(report["rtt"]["mean_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(report["uncontended"]["pairs"], 50);
    assert!(report["uncontended"]["ratio_to_limit"].as_f64().unwrap() > 0.0);
    let contention = &report["contention"];
    assert_eq!(contention["overlaps"], 0, "{contention}");
    assert!(contention["acquisitions"].as_u64().unwrap() >= 2);
    assert_eq!(
        contention["acquisitions_per_worker"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert!(contention["handoff_gap"]["p50_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(report["renewal"]["locks"], 20, "{report}");
    assert_eq!(report["renewal"]["lost"], 0, "{report}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{svg}");
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let cases: &[&[&str]] = &[
        &["status", "--backend", "nope://x", "a"],
        &["status", "--backend", "no-scheme", "a"],
        &["status", "--backend", "sqlite:///no/such/dir/x.db", "a"],
        &["status", "--backend", &url, ""],
        &[
            "bench",
            "--backend",
            "etcd://127.0.0.1",
            "--duration-s",
            "1",
        ],
        &["demo", "--workers", "0"],
        &["demo", "--strategy", "bogus"],
        &["demo", "--db", "/no/such/dir/x.db"],
        &["hold", "--backend", &url, "--name", "x", "--lease-ms", "0"],
        &["bench", "--backend", &url, "--hold-ms", "-1"],
    ];
    for args in cases {
        let output = distlock(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn operator_commands_see_and_free_a_lock_held_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (mut holder, _token) = spawn_holder(&url, "orders/42", 300);
    let status = distlock(&["status", "--backend", &url, "orders/42"]);
    assert_eq!(String::from_utf8_lossy(&status.stdout).trim(), "locked");
    let freed = distlock(&["force-unlock", "--backend", &url, "orders/42"]);
    assert_eq!(String::from_utf8_lossy(&freed.stdout).trim(), "freed");
    // The holder notices at its next renewal and exits 1 with a lock-lost message.
    let start = Instant::now();
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "holder did not notice the loss"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "{stderr}");
}

/// The backends whose locks other processes can hold, listed once.
macro_rules! cross_process_suite {
    ($($backend:ident => $url:expr;)*) => {$(
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_holder_frees_its_lock_within_its_lease() {
                let (url, _keep) = $url;
                killed_holder_frees_its_lock(&url, HOLDER_LEASE + Duration::from_millis(500)).await;
            }
        }
    )*};
}

cross_process_suite! {
    sqlite => {
        let dir = tempfile::tempdir().unwrap();
        (sqlite_url(dir.path()), dir)
    };
    redis => (redis_url(), ());
    redis_spin => (redis_url().replacen("redis://", "redis+spin://", 1), ());
    redis_sentinel => (redis_sentinel_url(), ());
    redis_cluster => (redis_cluster_url(), ());
    postgres_advisory => (postgres_url(), ());
    postgres_table => (format!("{}?mode=table", postgres_url()), ());
    mysql_named => (mysql_url(), ());
    mysql_table => (format!("{}?mode=table", mysql_url()), ());
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

#[test]
fn demo_is_exact_on_sentinel_and_cluster() {
    for url in [redis_sentinel_url(), redis_cluster_url()] {
        let output = distlock(&[
            "demo",
            "--json",
            "--strategy",
            "redis",
            "--strategy",
            "redis-spin",
            "--stock",
            "20",
            "--orders",
            "60",
            "--workers",
            "2",
            "--redis",
            &url,
        ]);
        let report = stdout_json(&output);
        let results = report["results"].as_array().expect("results");
        assert_eq!(results.len(), 2, "{url}: {report}");
        for r in results {
            assert_eq!(r["exact"], true, "{url}: {r}");
            assert_eq!(r["accepted"], 20, "{url}: {r}");
            assert_eq!(r["final_stock"], 0, "{url}: {r}");
        }
    }
}

/// The Redis server `scripts/test` makes sure of (`DISTLOCK_REDIS_URL` overrides).
fn redis_url() -> String {
    std::env::var("DISTLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// The lease of the holder process the SIGKILL tests start.
const HOLDER_LEASE: Duration = Duration::from_millis(1000);

/// The standalone ZooKeeper server `scripts/test` starts (`DISTLOCK_ZK_URL` overrides).
fn zookeeper_url() -> String {
    std::env::var("DISTLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/".into())
}

/// ZooKeeper frees a dead holder's lock when its session expires, not at a lease: with a 2 s
/// session timeout the server notices within the timeout plus one tick (0.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_killed_holder_frees_its_lock_within_the_session_timeout() {
    let url = format!("{}?session_timeout=2s", zookeeper_url());
    killed_holder_frees_its_lock(&url, Duration::from_millis(3000)).await;
}

/// A holder process stopped (SIGSTOP) past its session timeout: the server expires the
/// session and grants the lock to another client, with a larger token; when the holder runs
/// again it learns that its session expired and its guard reports the loss (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_paused_holder_learns_its_session_expired() {
    let url = format!("{}?session_timeout=2s", zookeeper_url());
    let name = format!("paused/{}/{}", std::process::id(), fastrand::u64(..));
    // A 30 s renewed lease: the loss must come from the session, not from a renewal.
    let (mut holder, token) = spawn_holder(&url, &name, 30_000);
    let pid = holder.id().to_string();
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let locks = distlock::connect(&url).await.unwrap();
    let stopped_at = Instant::now();
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the stopped holder's session did not expire");
    let granted_after = stopped_at.elapsed();
    assert!(guard.fencing_token() > token);
    signal("-CONT");
    let resumed_at = Instant::now();
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        if resumed_at.elapsed() > Duration::from_secs(10) {
            let _ = holder.kill();
            panic!("the resumed holder did not learn that its session expired");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "{stderr}");
    eprintln!(
        "granted to another client {granted_after:?} after the stop; the holder knew {:?} after it resumed",
        resumed_at.elapsed()
    );
    guard.release().await.unwrap();
}

#[test]
fn demo_is_exact_on_zookeeper() {
    let output = distlock(&[
        "demo",
        "--json",
        "--strategy",
        "zookeeper",
        "--stock",
        "20",
        "--orders",
        "60",
        "--workers",
        "2",
        "--zookeeper",
        &zookeeper_url(),
    ]);
    let report = stdout_json(&output);
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "{report}");
    let r = &results[0];
    assert_eq!(r["strategy"], "zookeeper", "{r}");
    assert_eq!(r["exact"], true, "{r}");
    assert_eq!(r["accepted"], 20, "{r}");
    assert_eq!(r["final_stock"], 0, "{r}");
}

async fn killed_holder_frees_its_lock(url: &str, bound: Duration) {
    let lease = HOLDER_LEASE;
    let name = format!("killed/{}/{}", std::process::id(), fastrand::u64(..));
    let (mut holder, token) = spawn_holder(url, &name, lease.as_millis() as u64);
    let locks = distlock::connect(url).await.unwrap();
    assert!(locks.is_locked(&name).await.unwrap());
    let mutex = locks.mutex(name.as_str()).unwrap();
    assert!(
        mutex.try_acquire().await.unwrap().is_none(),
        "granted while another process holds it"
    );
    holder.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    holder.wait().unwrap();
    let guard = mutex
        .acquire_with(AcquireOptions::new().wait(bound * 3))
        .await
        .expect("the killed holder's lock never freed");
    let freed_after = killed_at.elapsed();
    assert!(freed_after <= bound, "freed after {freed_after:?}");
    assert!(guard.fencing_token() > token);
    guard.release().await.unwrap();
}
