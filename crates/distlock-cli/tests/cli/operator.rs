//! Operator commands (`status`, `leader`, `list`, `force-unlock`) on locks other processes
//! hold, and bad input on every command.

use std::time::{Duration, Instant};

use crate::{distlock, spawn_holder, sqlite_url, stdout_json};

/// Bad input on any command: exit 2 and an error on stderr, never a panic.
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
            "etcd://127.0.0.1/?lease_ttl=1s",
            "--duration-s",
            "1",
        ],
        &["demo", "--workers", "0"],
        &["demo", "--strategy", "bogus"],
        &["demo", "--db", "/no/such/dir/x.db"],
        // The old mode flag; the hot-item scenario is a subcommand now.
        &["demo", "--hot-item"],
        // A flag of the overselling demo with the hot-item scenario, either side of it.
        &["demo", "--stock", "5", "hot-item"],
        &["demo", "hot-item", "--orders", "5"],
        &["demo", "hot-item", "--strategy", "none"],
        &["demo", "hot-item", "--segments", "1"],
        &["hold", "--backend", &url, "--name", "x", "--lease-ms", "0"],
        &["bench", "--backend", &url, "--hold-ms", "-1"],
    ];
    for args in cases {
        let output = distlock(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // distlock's own errors are one line; clap's add usage and a hint, around one error
        // line.
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        if stderr.starts_with("distlock: error: ") {
            assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
        } else {
            assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
            let errors = lines.iter().filter(|line| line.contains("error")).count();
            assert_eq!(errors, 1, "{args:?}: not one error line: {stderr}");
        }
    }
}

/// `status` (as text and as JSON) and `force-unlock` on a lock another process holds; the
/// holder learns of the loss.
#[test]
fn operator_commands_see_and_free_a_lock_held_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (mut holder, token) = spawn_holder(&url, "orders/42", 300);
    let status = distlock(&["status", "--backend", &url, "orders/42"]);
    let line = String::from_utf8_lossy(&status.stdout);
    assert!(line.starts_with("locked holder="), "{line}");
    assert!(
        line.contains(&format!(" holds=1 fencing_token={token} ")),
        "{line}"
    );
    let status = stdout_json(&distlock(&[
        "status",
        "--backend",
        &url,
        "orders/42",
        "--json",
    ]));
    assert_eq!(status["command"], "status", "{status}");
    assert_eq!(status["lock"], "orders/42", "{status}");
    assert_eq!(status["backend"], "sqlite", "{status}");
    assert_eq!(status["locked"], true, "{status}");
    assert_eq!(status["holds"], 1, "{status}");
    assert_eq!(status["fencing_token"], token, "{status}");
    assert_eq!(status["waiters"], 0, "{status}");
    assert!(status["holder"].is_string(), "{status}");
    let left = status["remaining_lease_ms"].as_u64().expect("lease left");
    assert!(left > 0 && left <= 300, "{status}");
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
    let status = stdout_json(&distlock(&[
        "status",
        "--json",
        "--backend",
        &url,
        "orders/42",
    ]));
    assert_eq!(status["locked"], false, "{status}");
    assert!(status["holder"].is_null(), "{status}");
}

/// `list` shows the locks other processes hold under a prefix, with their tokens, as lines
/// and as JSON; a name outside the prefix is left out; a limit of zero is bad input.
#[test]
fn list_shows_the_locks_held_under_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (mut first, first_token) = spawn_holder(&url, "orders/1", 30_000);
    let (mut second, second_token) = spawn_holder(&url, "orders/2", 30_000);
    let (mut other, _) = spawn_holder(&url, "invoices/1", 30_000);
    let lines = distlock(&["list", "--backend", &url, "orders/"]);
    let text = String::from_utf8_lossy(&lines.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(names, ["orders/1", "orders/2"], "{text}");
    assert!(
        text.contains(&format!("fencing_token={first_token} ")),
        "{text}"
    );
    let listing = stdout_json(&distlock(&["list", "--backend", &url, "--json"]));
    assert_eq!(listing["command"], "list", "{listing}");
    assert_eq!(listing["truncated"], false, "{listing}");
    let locks = listing["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks.iter().map(|l| l["lock"].as_str().unwrap()).collect();
    assert_eq!(names, ["invoices/1", "orders/1", "orders/2"], "{listing}");
    assert_eq!(locks[2]["fencing_token"], second_token, "{listing}");
    let limited = stdout_json(&distlock(&[
        "list",
        "--backend",
        &url,
        "--limit",
        "1",
        "--json",
    ]));
    assert_eq!(limited["truncated"], true, "{limited}");
    assert_eq!(limited["locks"].as_array().unwrap().len(), 1, "{limited}");
    let zero = distlock(&["list", "--backend", &url, "--limit", "0"]);
    assert_eq!(zero.status.code(), Some(2));
    for child in [&mut first, &mut second, &mut other] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// `status` understands every primitive and `leader` names the leader, on every backend:
/// a mutex, a semaphore with two of three permits held, a read lock (in the slot layout, or the
/// backend's own, which shows as its lock), an election's leader; and `list` escapes a name
/// that would forge a line.
#[test]
fn status_and_leader_understand_every_primitive_on_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        sqlite_url(dir.path()),
        crate::redis_url(),
        crate::zookeeper_url(),
        crate::etcd_url(),
        crate::postgres_url(),
        crate::mysql_url(),
        crate::redlock_url(),
    ] {
        let id = fastrand::u32(..);
        let (semaphore, election, rwlock) = (
            format!("st-sem-{id}"),
            format!("st-lead-{id}"),
            format!("st-rw-{id}"),
        );
        let forged = format!("st-{id}\nfake holder=evil");
        let permit = ["--kind", "permit", "--permits", "3"];
        let mut holders = vec![
            crate::spawn_holder_of(&url, &semaphore, 30_000, &permit).0,
            crate::spawn_holder_of(&url, &semaphore, 30_000, &permit).0,
            crate::spawn_holder_of(&url, &election, 30_000, &["--kind", "leader"]).0,
            crate::spawn_holder_of(&url, &rwlock, 30_000, &["--kind", "read"]).0,
            crate::spawn_holder_of(&url, &forged, 30_000, &[]).0,
        ];
        let status = |name: &str| {
            let output = distlock(&["status", "--backend", &url, name]);
            assert!(output.status.success(), "{url}: {output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let text = status(&semaphore);
        assert!(
            text.starts_with("semaphore permits_held=2/3 holders="),
            "{url}: {text}"
        );
        let text = status(&election);
        assert!(
            text.starts_with("election leader=\"distlock hold (pid "),
            "{url}: {text}"
        );
        let text = status(&rwlock);
        assert!(
            text.starts_with("rwlock writer=none readers=1 ") || text.starts_with("locked "),
            "{url}: {text}"
        );
        let text = status(&forged);
        assert!(text.starts_with("locked "), "{url}: a mutex: {text}");
        // The holder is readable where the backend tells it: HOST/PID/UUID:N.
        let pid = holders[4].id();
        assert!(
            text.contains("holder=unknown") || text.contains(&format!("/{pid}/")),
            "{url}: the holder does not name process {pid}: {text}"
        );
        let output = distlock(&["leader", "--backend", &url, &election]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.starts_with("leader value=\"distlock hold"),
            "{url}: {text}"
        );
        let output = distlock(&["list", "--backend", &url, &format!("st-{id}")]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{url}: {output:?}");
        assert!(
            text.lines().all(|line| !line.starts_with("fake")),
            "{url}: a name forged a line: {text}"
        );
        for holder in &mut holders {
            holder.kill().unwrap();
            holder.wait().unwrap();
        }
    }
}
