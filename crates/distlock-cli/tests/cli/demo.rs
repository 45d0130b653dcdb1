//! `distlock demo`: which strategies oversell, on every server the strategies use.

use crate::{
    distlock, json_report, mysql_url, postgres_url, redis_cluster_url, redis_sentinel_url,
    redis_url, redlock_url,
};

#[test]
fn demo_oversells_without_a_lock_and_is_exact_with_the_table_lock() {
    let (redis, redlock) = (redis_url(), redlock_url());
    let output = distlock(&[
        "demo",
        "--json",
        "--stock",
        "30",
        "--orders",
        "120",
        "--redis",
        &redis,
        "--redlock",
        &redlock,
    ]);
    let report = json_report(&output, "demo");
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
    for exact in [
        "table-lock",
        "redis",
        "redis-spin",
        "redlock",
        "redis-atomic",
    ] {
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
    let report = json_report(&output, "demo");
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
    let report = json_report(&distlock(&args), "demo");
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
    let report = json_report(&output, "demo");
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
    let report = json_report(&output, "demo");
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["final_stock"], 0);
    assert_eq!(results[0]["accepted"], 12);
    assert!(db.exists());
}

/// The demo with `strategies` against the server at `url` (given by `flag`): each result
/// sells exactly the stock of 20, of 60 orders.
fn assert_exact_on(strategies: &[&str], flag: &str, url: &str) {
    let mut args = vec!["demo", "--json"];
    for strategy in strategies {
        args.extend(["--strategy", strategy]);
    }
    args.extend([
        "--stock",
        "20",
        "--orders",
        "60",
        "--workers",
        "2",
        flag,
        url,
    ]);
    let report = json_report(&distlock(&args), "demo");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), strategies.len(), "{url}: {report}");
    let mut ran: Vec<&str> = results
        .iter()
        .filter_map(|r| r["strategy"].as_str())
        .collect();
    ran.sort_unstable();
    let mut asked = strategies.to_vec();
    asked.sort_unstable();
    assert_eq!(ran, asked, "{url}: {report}");
    for r in results {
        assert_eq!(r["exact"], true, "{url}: {r}");
        assert_eq!(r["accepted"], 20, "{url}: {r}");
        assert_eq!(r["final_stock"], 0, "{url}: {r}");
    }
}

#[test]
fn demo_is_exact_on_sentinel_and_cluster() {
    for url in [redis_sentinel_url(), redis_cluster_url()] {
        assert_exact_on(&["redis", "redis-spin"], "--redis", &url);
    }
}

/// Every lock strategy of the registry, each on its server of the tests: a backend's
/// strategy is tested here by being in the registry.
#[test]
fn demo_is_exact_with_every_lock_of_the_registry() {
    let locks: Vec<_> = distlock::scheme::demo_locks()
        .filter(|lock| lock.server.is_some())
        .collect();
    let strategies: Vec<&str> = locks.iter().map(|lock| lock.strategy).collect();
    let mut flags: Vec<(String, String)> = Vec::new();
    for server in distlock::scheme::demo_servers() {
        flags.push((format!("--{}", server.flag), server.tests.url()));
    }
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
    for strategy in &strategies {
        args.extend(["--strategy", strategy]);
    }
    for (flag, url) in &flags {
        args.extend([flag.as_str(), url.as_str()]);
    }
    let report = json_report(&distlock(&args), "demo");
    assert!(
        report["unavailable"].as_array().unwrap().is_empty(),
        "{report}"
    );
    let results = report["results"].as_array().expect("results");
    let ran: Vec<&str> = results
        .iter()
        .filter_map(|r| r["strategy"].as_str())
        .collect();
    assert_eq!(ran, strategies, "{report}");
    for r in results {
        assert_eq!(r["exact"], true, "{r}");
        assert_eq!(r["accepted"], 20, "{r}");
        assert_eq!(r["final_stock"], 0, "{r}");
    }
}
