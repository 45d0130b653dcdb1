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
