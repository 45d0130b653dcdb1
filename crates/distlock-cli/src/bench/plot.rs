//! The handoff-gap histogram of `distlock bench --plot`, drawn as an SVG file.

use std::path::Path;

use super::contend::{WorkerReport, handoff_gaps, merged};
use super::report::{Report, Stats};
use crate::failure::{CliResult, Failure};

/// Draws the handoff-gap histogram as an SVG file.
pub fn write(path: &Path, report: &Report, reports: &[WorkerReport]) -> CliResult {
    let gaps = handoff_gaps(&merged(reports), false);
    let title = format!(
        "handoff gap, {} workers, hold {} ms: {}",
        report.contention.workers, report.contention.hold_ms_requested, report.backend
    );
    let svg = histogram_svg(
        &gaps,
        &title,
        report.rtt.mean_ms,
        &report.contention.handoff_gap,
    );
    std::fs::write(path, svg)
        .map_err(|e| Failure::failed(format!("cannot write {}: {e}", path.display())))
}

fn escape_xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn histogram_svg(gaps_ms: &[f64], title: &str, rtt_ms: f64, stats: &Stats) -> String {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 360.0;
    const LEFT: f64 = 60.0;
    const BOTTOM: f64 = 40.0;
    const TOP: f64 = 40.0;
    const BINS: usize = 50;
    let upper = (stats.p99_ms * 1.25).max(stats.p50_ms * 2.0).max(1e-3);
    let mut counts = [0usize; BINS];
    for &gap in gaps_ms {
        let bin = ((gap / upper) * BINS as f64) as usize;
        counts[bin.min(BINS - 1)] += 1;
    }
    let tallest = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let plot_w = WIDTH - LEFT - 20.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let bar_w = plot_w / BINS as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape_xml(title)
    );
    for (bin, &count) in counts.iter().enumerate() {
        let h = count as f64 / tallest * plot_h;
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4a7fb5\"/>\n",
            LEFT + bin as f64 * bar_w,
            TOP + plot_h - h,
            (bar_w - 1.0).max(0.5),
            h
        ));
    }
    let axis_y = TOP + plot_h;
    svg.push_str(&format!(
        "<line x1=\"{LEFT}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"black\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{axis_y}\" stroke=\"black\"/>\n",
        LEFT + plot_w
    ));
    for tick in 0..=5 {
        let value = upper * f64::from(tick) / 5.0;
        let x = LEFT + plot_w * f64::from(tick) / 5.0;
        svg.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{value:.2}</text>\n",
            axis_y + 16.0
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">gap from release start to next grant (ms); the last bar holds all longer gaps</text>\n\
         <text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">handoffs (max {})</text>\n",
        LEFT + plot_w / 2.0,
        HEIGHT - 6.0,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        tallest as usize
    ));
    let markers = [
        ("RTT", rtt_ms, "#5cb85c"),
        ("p50", stats.p50_ms, "#d9534f"),
        ("p99", stats.p99_ms, "#f0ad4e"),
    ];
    for (row, (label, value, colour)) in markers.into_iter().enumerate() {
        if value <= upper {
            let x = LEFT + plot_w * value / upper;
            svg.push_str(&format!(
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{axis_y}\" stroke=\"{colour}\" stroke-dasharray=\"4 3\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{label} {value:.3} ms</text>\n",
                x + 3.0,
                TOP + 12.0 + 14.0 * row as f64
            ));
        }
    }
    svg.push_str("</svg>\n");
    svg
}
