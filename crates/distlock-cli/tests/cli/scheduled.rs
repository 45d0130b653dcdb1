//! `distlock run --once-per` (a cron line on a fleet runs once per interval) and
//! `--metrics-addr` (the library's metrics scraped over HTTP while a command runs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::run::{Running, read};
use crate::sqlite_url;

const LIMIT: Duration = Duration::from_secs(20);

/// Promise 1 for scheduled runs: two hosts fire the same line at once, one runs it; fired
/// again while the first still holds its lower bound (2.7 s of a 3 s interval), it is
/// skipped, exit 0; the first stays until the bound; after it, the line runs again.
#[test]
fn run_once_per_runs_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    // Made first: two processes creating a new SQLite file at once can collide on its setup.
    assert!(
        crate::distlock(&["status", "--backend", &url, "report"])
            .status
            .success()
    );
    let file = dir.path().join("ran");
    let line = format!("echo ran >> {}", file.display());
    let args = [
        "run",
        "--backend",
        &url,
        "--once-per",
        "3s",
        "report",
        "--",
        "sh",
        "-c",
        &line,
    ];
    let start = Instant::now();
    let (mut a, mut b) = (Running::start(&args), Running::start(&args));
    while read(&file).lines().count() == 0 {
        assert!(start.elapsed() < LIMIT, "neither run ran the command");
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the first run's hold lasts, a third host's firing is skipped.
    let mut c = Running::start(&args);
    let (status, stderr) = c.wait(LIMIT);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "a skipped run spoke: {stderr}");
    for run in [&mut a, &mut b] {
        let (status, stderr) = run.wait(LIMIT);
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
    assert_eq!(
        read(&file).lines().count(),
        1,
        "ran more than once in one interval"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(2700),
        "the run that ran left before its lower bound ({:?})",
        start.elapsed()
    );
    let (status, stderr) = Running::start(&args).wait(LIMIT);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(
        read(&file).lines().count(),
        2,
        "the next interval's firing did not run"
    );
}

/// `--metrics-addr 127.0.0.1:0`: the address is printed on stderr, and a scrape while the
/// command runs shows the grant and the held lock under the backend's label.
#[test]
fn run_serves_metrics_while_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let mut running = Running::start(&[
        "run",
        "--backend",
        &url,
        "--metrics-addr",
        "127.0.0.1:0",
        "scraped",
        "--",
        "sleep",
        "3",
    ]);
    let mut stderr = BufReader::new(running.stderr());
    let mut first = String::new();
    stderr
        .read_line(&mut first)
        .expect("read distlock's stderr");
    let addr = first
        .trim()
        .strip_prefix("distlock: metrics at http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address on stderr: {first:?}"))
        .to_owned();
    // The keeper counts the lock as held before the acquisition records its grant, and a
    // scrape can fall between the two: scrape until both are on one page.
    let start = Instant::now();
    let page = loop {
        let page = scrape(&addr, "/metrics");
        if page.contains("distlock_held{backend=\"sqlite\"} 1")
            && page.contains("distlock_grants_total{backend=\"sqlite\",waited=\"false\"} 1")
        {
            break page;
        }
        assert!(
            start.elapsed() < LIMIT,
            "the lock never showed as held and granted:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("distlock_acquire_seconds_bucket{"), "{page}");
    assert!(scrape(&addr, "/other").starts_with("HTTP/1.1 404"));
    let (status, rest) = running.wait(LIMIT);
    assert_eq!(status.code(), Some(0), "{rest}");
}

fn scrape(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut page = String::new();
    stream
        .read_to_string(&mut page)
        .expect("read the metrics page");
    page
}
