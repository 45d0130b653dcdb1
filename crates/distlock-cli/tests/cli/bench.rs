//! `distlock bench`: every figure, and the plot.

use crate::{distlock, json_report, sqlite_url};

/// One row, the backend's: every phase's figures, and the plot drawn.
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
    let envelope = json_report(&output, "bench");
    assert_eq!(envelope["backend"], url.as_str(), "{envelope}");
    assert_eq!(envelope["unavailable"].as_array().unwrap().len(), 0);
    let results = envelope["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{envelope}");
    let report = &results[0];
    assert_eq!(report["backend"], url.as_str(), "{report}");
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

/// `--compare` on `url`: the bare baselines and distlock's pairs all ran, and the ratios are
/// theirs.
fn compare_on(url: &str) {
    let output = distlock(&[
        "bench",
        "--backend",
        url,
        "--json",
        "--workers",
        "2",
        "--duration-s",
        "1",
        "--pairs",
        "20",
        "--rtt-samples",
        "20",
        "--compare",
        "--compare-rounds",
        "3",
        "--compare-round-ms",
        "100",
    ]);
    let envelope = json_report(&output, "bench");
    let compare = &envelope["results"][0]["compare"];
    assert_eq!(compare["rounds"], 3, "{compare}");
    let figure = |key: &str| {
        let value = compare[key].as_f64().unwrap_or(0.0);
        assert!(value > 0.0, "{key} of {url}: {compare}");
        value
    };
    let (bare, ours, limit) = (
        figure("bare_pairs_per_s"),
        figure("distlock_pairs_per_s"),
        figure("limit_per_s"),
    );
    figure("bare_rtt_ms");
    figure("distlock_rtt_ms");
    assert!(
        (figure("ratio_to_bare_pair") - ours / bare).abs() < 1e-6,
        "{compare}"
    );
    assert!(
        (figure("ratio_to_limit") - ours / limit).abs() < 1e-6,
        "{compare}"
    );
    assert!(
        compare["pair"].as_str().is_some_and(|p| !p.is_empty()),
        "{compare}"
    );
}

/// Every backend with a bare baseline runs its comparison against the real server.
#[test]
fn bench_compares_with_the_bare_baselines_on_every_server() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        sqlite_url(dir.path()),
        crate::redis_url(),
        crate::postgres_url(),
        crate::mysql_url(),
        crate::zookeeper_url(),
        crate::etcd_url(),
    ] {
        compare_on(&url);
    }
}

/// `--herd` on a URL of either ZooKeeper scheme measures both locks, named by the registry's
/// herd variant, with the same waiters; on a backend without one it is refused.
#[test]
fn bench_herd_measures_the_lock_and_its_herd_variant() {
    let naive = crate::zookeeper_url().replacen("zk://", "zk+naive://", 1);
    let output = distlock(&[
        "bench",
        "--backend",
        &naive,
        "--json",
        "--workers",
        "2",
        "--duration-s",
        "1",
        "--pairs",
        "10",
        "--rtt-samples",
        "8",
        "--renewal-s",
        "1",
        "--herd",
        "3",
    ]);
    let envelope = json_report(&output, "bench");
    let report = &envelope["results"][0];
    let herd = report["herd"].as_array().expect("herd figures");
    let locks: Vec<&str> = herd.iter().map(|h| h["lock"].as_str().unwrap()).collect();
    assert_eq!(locks, ["zk", "zk+naive"], "{report}");
    for figure in herd {
        assert_eq!(figure["waiters"], 3, "{figure}");
        assert!(figure["notifications"].as_u64().unwrap() >= 3, "{figure}");
    }
    assert!(
        report["write_rtt"]["count"].as_u64().unwrap() >= 1,
        "{report}"
    );
    let refused = distlock(&[
        "bench",
        "--backend",
        "memory://",
        "--duration-s",
        "1",
        "--workers",
        "1",
        "--pairs",
        "5",
        "--rtt-samples",
        "5",
        "--herd",
        "3",
    ]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--herd") && stderr.contains("zk://"),
        "{stderr}"
    );
}

/// A backend without bare baselines is refused with the list of those that have them.
#[test]
fn bench_compare_names_the_backends_it_serves() {
    let output = distlock(&[
        "bench",
        "--backend",
        "memory://",
        "--compare",
        "--duration-s",
        "1",
        "--workers",
        "1",
        "--pairs",
        "5",
        "--rtt-samples",
        "5",
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no bare baseline") && stderr.contains("postgres, "),
        "{stderr}"
    );
}

/// The arguments of a short contention run on `url` with `--worker-command command`.
fn bench_with_workers<'a>(url: &'a str, command: &'a str) -> Vec<&'a str> {
    vec![
        "bench",
        "--backend",
        url,
        "--json",
        "--workers",
        "2",
        "--duration-s",
        "1",
        "--pairs",
        "5",
        "--rtt-samples",
        "5",
        "--worker-command",
        command,
    ]
}

/// `--worker-command` runs the contention phase with another program that speaks the worker
/// protocol (here distlock's own worker, started as a foreign command), and the report names
/// it.
#[test]
fn bench_runs_the_contention_with_a_foreign_worker_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let command = format!("{} bench-worker", crate::BIN);
    let output = distlock(&bench_with_workers(&url, &command));
    assert!(output.status.success(), "{output:?}");
    let envelope = json_report(&output, "bench");
    let contention = &envelope["results"][0]["contention"];
    assert_eq!(
        contention["worker_command"],
        command.as_str(),
        "{contention}"
    );
    assert_eq!(contention["overlaps"], 0, "{contention}");
    assert_eq!(
        contention["acquisitions_per_worker"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(contention["acquisitions"].as_u64().unwrap() >= 2);
}

/// A foreign worker whose lock does not exclude (two processes report the same 1 s hold) is
/// caught: the run fails naming the overlap. A command that is not a worker, an empty one, and
/// one for the in-process backend are refused.
#[test]
fn bench_catches_a_foreign_lock_that_does_not_exclude() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let worker = dir.path().join("no-lock-worker");
    std::fs::write(
        &worker,
        "#!/bin/sh\necho ready\nread line\n[ \"$line\" = go ] || exit 2\nnow=$(date +%s%N)\n\
         echo \"{\\\"intervals\\\":[{\\\"wait_start\\\":$now,\\\"acquired\\\":$now,\\\"release_start\\\":$((now + 1000000000))}]}\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = distlock(&bench_with_workers(&url, worker.to_str().unwrap()));
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mutual exclusion violated"), "{stderr}");

    let output = distlock(&bench_with_workers(&url, "true"));
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("worker 0"), "{stderr}");

    let output = distlock(&bench_with_workers(&url, "  "));
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let output = distlock(&bench_with_workers("memory://", "true"));
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--worker-command needs a server"),
        "{stderr}"
    );
}
