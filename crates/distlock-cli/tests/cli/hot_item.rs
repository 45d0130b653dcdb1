//! `distlock demo hot-item`: one lock against segments, on every lock backend it runs.

use crate::{distlock, json_report};

/// The hot-item scenario sells exactly its stock with one lock and with segments, on every
/// lock of the registry (each on its server of the tests) and with the atomic script, and
/// reports orders/s for both (speed is for `distlock bench` and the demo's figures, not
/// asserted here).
#[test]
fn demo_hot_item_is_exact_with_one_lock_and_with_segments() {
    let locks: Vec<&str> = distlock::scheme::demo_locks()
        .map(|lock| lock.strategy)
        .collect();
    let mut args = vec![
        "demo",
        "hot-item",
        "--json",
        "--stock",
        "60",
        "--hold-ms",
        "2",
        "--segments",
        "6",
        "--tasks",
        "4",
        "--workers",
        "2",
        "--strategy",
        "redis-atomic",
    ];
    for lock in &locks {
        args.extend(["--strategy", lock]);
    }
    let flags: Vec<(String, String)> = distlock::scheme::demo_servers()
        .into_iter()
        .map(|server| (format!("--{}", server.flag), server.tests.url()))
        .collect();
    for (flag, url) in &flags {
        args.extend([flag.as_str(), url.as_str()]);
    }
    let output = distlock(&args);
    let report = json_report(&output, "demo hot-item");
    assert!(
        report["unavailable"].as_array().unwrap().is_empty(),
        "{report}"
    );
    assert_eq!(report["stock"], 60, "{report}");
    assert_eq!(report["segments"], 6, "{report}");
    assert_eq!(report["tasks_per_worker"], 4, "{report}");
    let runs = report["results"].as_array().unwrap();
    // Two runs per lock (1 and 6 segments), one for the atomic script.
    assert_eq!(runs.len(), 2 * locks.len() + 1, "{report}");
    for run in runs {
        // The stock lives on the lock's own server where it can (ZooKeeper's in Redis).
        let store = match run["strategy"].as_str().unwrap() {
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

/// A lock whose server does not answer is listed as unavailable with the reason, as in the
/// overselling demo, and nothing runs.
#[test]
fn demo_hot_item_lists_a_lock_whose_server_is_missing_as_unavailable() {
    // Port 1 on loopback: nothing listens there.
    let output = distlock(&[
        "demo",
        "hot-item",
        "--json",
        "--strategy",
        "redis",
        "--redis",
        "redis://127.0.0.1:1/",
    ]);
    let report = json_report(&output, "demo hot-item");
    assert!(report["results"].as_array().unwrap().is_empty(), "{report}");
    let unavailable = report["unavailable"].as_array().unwrap();
    assert_eq!(unavailable.len(), 1, "{report}");
    assert_eq!(unavailable[0]["strategy"], "redis", "{report}");
    assert!(
        unavailable[0]["reason"]
            .as_str()
            .unwrap()
            .contains("refused"),
        "{report}"
    );
}
