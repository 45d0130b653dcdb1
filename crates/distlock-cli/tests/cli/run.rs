//! `distlock run` and `distlock elect`: a command run under a lock, across processes on the
//! SQLite backend. Each test names the promise it checks: 1 at most one holder; 2 the loss is
//! known before anyone else can be granted the lock (here: the command is stopped); 3 fencing
//! tokens grow; 4 a cancelled or failed request leaves nothing behind.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{BIN, distlock, spawn_holder, sqlite_url};

/// How long any one step may take before the test gives up.
const LIMIT: Duration = Duration::from_secs(20);

/// A `distlock run` or `elect` process; killed (with the command processes it noted) if the
/// test fails before it exits.
pub(crate) struct Running {
    child: Child,
    /// Process ids of commands it started, killed too if the test fails.
    commands: Vec<u32>,
}

impl Running {
    pub(crate) fn start(args: &[&str]) -> Self {
        let child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start distlock");
        Running {
            child,
            commands: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits at most `limit` for it to exit; its status and stderr.
    /// Its stderr, to read while it runs (`wait` then reads what is left).
    pub(crate) fn stderr(&mut self) -> &mut std::process::ChildStderr {
        self.child.stderr.as_mut().unwrap()
    }

    pub(crate) fn wait(&mut self, limit: Duration) -> (ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < limit,
                "distlock (pid {}) still runs after {limit:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        (status, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            for pid in &self.commands {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// The process id a command wrote to `file`, once it has (at most `LIMIT`).
pub(crate) fn pid_in(file: &Path) -> u32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(start.elapsed() < LIMIT, "no pid in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (a killed process whose parent
/// died is re-parented to PID 1, which on some machines never reaps it).
pub(crate) fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `PID (COMM) STATE ...`: the state follows the last parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Whether `distlock status` calls the lock free.
fn is_free(url: &str, name: &str) -> bool {
    let status = distlock(&["status", "--backend", url, name]);
    assert!(status.status.success(), "{status:?}");
    String::from_utf8_lossy(&status.stdout).starts_with("free")
}

pub(crate) fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_default()
}

/// The one line distlock printed on stderr.
fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    lines[0]
}

/// Promise 1, the cron case: of two `--skip-if-held` runs at once exactly one runs its
/// command, and both exit 0; a run after both runs. A run that waits 200 ms for a lock held by
/// another exits 75 and says so.
#[test]
fn run_skip_if_held_runs_one_of_two_and_a_busy_wait_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("ran.log");
    let script = format!(
        "echo start >> '{0}'; sleep 2; echo end >> '{0}'",
        log.display()
    );
    let args = [
        "run",
        "--backend",
        &url,
        "--skip-if-held",
        "nightly",
        "--",
        "sh",
        "-c",
        &script,
    ];
    // The file is made first: two processes opening a new SQLite file at once can fail
    // ("switch to WAL: database is locked"), a limit of the backend's setup, not of `run`.
    assert!(is_free(&url, "nightly"));
    let mut a = Running::start(&args);
    let mut b = Running::start(&args);
    for run in [&mut a, &mut b] {
        let (status, stderr) = run.wait(LIMIT);
        assert_eq!(status.code(), Some(0), "{stderr}");
        assert_eq!(stderr, "", "--skip-if-held is quiet");
    }
    assert_eq!(read(&log), "start\nend\n");
    assert!(distlock(&args).status.success());
    assert_eq!(read(&log), "start\nend\nstart\nend\n");
    assert!(is_free(&url, "nightly"));

    let (mut holder, _) = spawn_holder(&url, "nightly", 30_000);
    let start = Instant::now();
    let busy = distlock(&[
        "run",
        "--backend",
        &url,
        "--wait",
        "200ms",
        "nightly",
        "--",
        "sh",
        "-c",
        "exit 9",
    ]);
    let waited = start.elapsed();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(75), "{stderr}");
    assert_eq!(
        one_line(&stderr),
        "distlock: busy: lock \"nightly\" is held by another (waited 200ms)"
    );
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
}

/// Promise 3: the command sees the lock's name and its fencing token, and the tokens of
/// consecutive runs grow strictly; with `--permits` it sees the count.
#[test]
fn run_gives_the_command_the_lock_name_and_growing_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let script = "echo \"$DISTLOCK_FENCING_TOKEN $DISTLOCK_LOCK_NAME ${DISTLOCK_PERMITS:-none}\"";
    let mut last = 0;
    for _ in 0..3 {
        let output = distlock(&["run", "--backend", &url, "jobs/a", "--", "sh", "-c", script]);
        assert!(output.status.success(), "{output:?}");
        let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[1..], ["jobs/a", "none"], "{line}");
        let token: u64 = fields[0].parse().expect("a token");
        assert!(token > last, "{token} after {last}");
        last = token;
    }
    let output = distlock(&[
        "run",
        "--backend",
        &url,
        "--permits",
        "3",
        "pool",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout);
    assert!(line.trim().ends_with(" pool 3"), "{line}");
}

/// Promise 4: whatever way the command ends or fails to start, distlock exits with the
/// shell's code for it and the lock is free afterwards; bad input exits 2 before anything.
#[test]
fn run_exit_codes_follow_the_shell_and_leave_the_lock_free() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let not_executable = not_executable.display().to_string();
    let cases: &[(&[&str], i32)] = &[
        (&["sh", "-c", "exit 0"], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["sh", "-c", "kill -9 $$"], 137),
        (&["sh", "-c", "kill -TERM $$"], 143),
        (&["distlock-test-no-such-command"], 127),
        (&[&not_executable], 126),
    ];
    for (command, code) in cases {
        let mut args = vec!["run", "--backend", &url, "codes", "--"];
        args.extend_from_slice(command);
        let output = distlock(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(*code), "{command:?}: {stderr}");
        if *code >= 126 && *code < 128 {
            assert!(
                one_line(&stderr).starts_with("distlock: error: cannot run "),
                "{stderr}"
            );
        } else {
            assert_eq!(stderr, "", "{command:?}");
        }
        assert!(is_free(&url, "codes"), "{command:?} left the lock held");
    }
    let bad: &[&[&str]] = &[
        &["run", "--backend", &url, "codes"],
        &["run", "--backend", &url, "codes", "--"],
        &[
            "run",
            "--backend",
            &url,
            "--wait",
            "10",
            "codes",
            "--",
            "true",
        ],
        &[
            "run",
            "--backend",
            &url,
            "--wait",
            "soon",
            "codes",
            "--",
            "true",
        ],
        &[
            "run",
            "--backend",
            &url,
            "--wait=-1s",
            "codes",
            "--",
            "true",
        ],
        &[
            "run",
            "--backend",
            &url,
            "--grace",
            "25h",
            "codes",
            "--",
            "true",
        ],
        &[
            "run",
            "--backend",
            &url,
            "--lease",
            "0s",
            "codes",
            "--",
            "true",
        ],
        &[
            "run",
            "--backend",
            &url,
            "--permits",
            "0",
            "codes",
            "--",
            "true",
        ],
        &["run", "--backend", &url, "", "--", "true"],
        &["run", "--backend", "nope://x", "codes", "--", "true"],
        &["elect", "--backend", &url, "leader"],
    ];
    for args in bad {
        let output = distlock(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        let errors = stderr.lines().filter(|l| l.contains("error")).count();
        assert_eq!(errors, 1, "{args:?}: {stderr}");
    }
    assert!(is_free(&url, "codes"));
}

/// Promise 2: when the lock is lost (an operator force-unlocks it) while the command runs,
/// the command is sent SIGTERM at once and distlock exits 76 saying why, long before the
/// command would have ended; a command that ignores SIGTERM is killed after `--grace`.
#[test]
fn run_stops_the_command_when_the_lock_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    // A 1.5 s lease is renewed every 0.5 s: a renewal finds the lock gone within 0.5 s.
    for (script, grace, signal) in [
        (
            "echo $$ > '{pidfile}'; exec sleep 30",
            "10s",
            "sent SIGTERM and was killed by signal 15",
        ),
        (
            "trap '' TERM; echo $$ > '{pidfile}'; while true; do sleep 0.1; done",
            "500ms",
            "sent SIGTERM, then SIGKILL after the 500ms grace, was killed by signal 9",
        ),
    ] {
        let pidfile = dir.path().join(format!("{grace}.pid"));
        let script = script.replace("{pidfile}", &pidfile.display().to_string());
        let mut run = Running::start(&[
            "run",
            "--backend",
            &url,
            "--lease",
            "1500ms",
            "--grace",
            grace,
            "report",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let pid = pid_in(&pidfile);
        run.commands.push(pid);
        let freed = distlock(&["force-unlock", "--backend", &url, "report"]);
        assert_eq!(String::from_utf8_lossy(&freed.stdout).trim(), "freed");
        let start = Instant::now();
        let (status, stderr) = run.wait(LIMIT);
        let took = start.elapsed();
        assert_eq!(status.code(), Some(76), "{stderr}");
        let line = one_line(&stderr);
        assert!(
            line.starts_with("distlock: lost: lock \"report\" was lost: "),
            "{line}"
        );
        assert!(line.contains(signal), "{line}");
        // Noticed within a renewal (0.5 s), stopped at once or after the grace: seconds, not
        // the command's 30 s or the 10 s grace.
        assert!(took < Duration::from_secs(6), "{took:?}");
        assert!(!alive(pid), "the command (pid {pid}) still runs");
    }
}

/// Signals a process sends distlock reach the command; distlock keeps the lock until the
/// command exits, then exits with its code and leaves the lock free (promise 4).
#[test]
fn run_passes_sigterm_on_and_exits_with_the_commands_code() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let pidfile = dir.path().join("child.pid");
    let got = dir.path().join("got");
    let script = format!(
        "trap 'echo got-term > \"{}\"; exit 0' TERM; echo $$ > '{}'; \
         while true; do sleep 0.1; done",
        got.display(),
        pidfile.display()
    );
    let mut run = Running::start(&["run", "--backend", &url, "job", "--", "sh", "-c", &script]);
    run.commands.push(pid_in(&pidfile));
    assert!(!is_free(&url, "job"));
    let status = Command::new("kill")
        .args(["-TERM", &run.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (status, stderr) = run.wait(LIMIT);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(read(&got).trim(), "got-term");
    assert!(is_free(&url, "job"));
}

/// Promise 1 with `--permits 2`: of three `--skip-if-held` runs at once, exactly two run.
#[test]
fn run_with_two_permits_runs_two_of_three() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("ran.log");
    // The first use registers the count; a try-once racing that registration would skip.
    assert!(
        distlock(&[
            "run",
            "--backend",
            &url,
            "--permits",
            "2",
            "pool",
            "--",
            "true"
        ])
        .status
        .success()
    );
    let script = format!("echo start >> '{}'; sleep 2", log.display());
    let args = [
        "run",
        "--backend",
        &url,
        "--permits",
        "2",
        "--skip-if-held",
        "pool",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let mut runs: Vec<Running> = (0..3).map(|_| Running::start(&args)).collect();
    for run in &mut runs {
        let (status, stderr) = run.wait(LIMIT);
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
    assert_eq!(read(&log), "start\nstart\n");
}

/// Promises 1 and 3 for `elect`: of two candidates only the leader runs its command; when it
/// exits, its distlock exits with its code and resigns, and the other is elected with a
/// larger term and runs.
#[test]
fn elect_runs_one_leader_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("lead.log");
    let script = |code: i32| {
        format!(
            "echo \"start $DISTLOCK_LEADER_VALUE $DISTLOCK_FENCING_TOKEN $DISTLOCK_LOCK_NAME\" \
             >> '{0}'; sleep 1; echo \"end $DISTLOCK_LEADER_VALUE\" >> '{0}'; exit {code}",
            log.display()
        )
    };
    let (script_a, script_b) = (script(4), script(5));
    let mut a = Running::start(&[
        "elect",
        "--backend",
        &url,
        "--value",
        "A",
        "sched",
        "--",
        "sh",
        "-c",
        &script_a,
    ]);
    let start = Instant::now();
    while !read(&log).starts_with("start A") {
        assert!(start.elapsed() < LIMIT, "A never led");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut b = Running::start(&[
        "elect",
        "--backend",
        &url,
        "--value",
        "B",
        "sched",
        "--",
        "sh",
        "-c",
        &script_b,
    ]);
    let (status, stderr) = a.wait(LIMIT);
    assert_eq!(status.code(), Some(4), "{stderr}");
    let (status, stderr) = b.wait(LIMIT);
    assert_eq!(status.code(), Some(5), "{stderr}");
    let text = read(&log);
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(
        [&lines[0][..2], &lines[1][..], &lines[2][..2], &lines[3][..]],
        [
            &["start", "A"][..],
            &["end", "A"],
            &["start", "B"],
            &["end", "B"]
        ],
        "{text}"
    );
    assert_eq!(lines[0][3], "sched", "{text}");
    let term = |line: &[&str]| line[2].parse::<u64>().expect("a term");
    assert!(term(&lines[2]) > term(&lines[0]), "{text}");
}

/// Promise 2 for `elect`: when the leadership is lost (an operator force-unlocks the
/// election's lock) the command is stopped and distlock exits 76.
#[test]
fn elect_stops_the_command_when_the_leadership_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let lock_name = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let locks = distlock::connect(&url).await.unwrap();
            locks.election("sched").unwrap().lock_name().to_owned()
        });
    let pidfile = dir.path().join("leader.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut run = Running::start(&[
        "elect",
        "--backend",
        &url,
        "--lease",
        "1500ms",
        "sched",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let pid = pid_in(&pidfile);
    run.commands.push(pid);
    let freed = distlock(&["force-unlock", "--backend", &url, &lock_name]);
    assert_eq!(String::from_utf8_lossy(&freed.stdout).trim(), "freed");
    let start = Instant::now();
    let (status, stderr) = run.wait(LIMIT);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(
        one_line(&stderr).starts_with("distlock: lost: "),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(!alive(pid), "the command (pid {pid}) still runs");
}

/// The conventions users bring from flock(1), ShedLock and etcdctl: DISTLOCK_BACKEND,
/// `-w`, `-n`, `-E N`, `--max-run` (exit 124, the command stopped), memory:// refused,
/// `--lease` given twice refused; shell completions and a manual page.
#[test]
fn run_takes_the_conventions_users_bring() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let with_env = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("DISTLOCK_BACKEND", &url)
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    assert!(with_env(&["run", "conv", "--", "true"]).status.success());
    let (mut holder, _) = spawn_holder(&url, "conv", 30_000);
    let busy = with_env(&["run", "-w", "100ms", "-E", "9", "conv", "--", "true"]);
    assert_eq!(busy.status.code(), Some(9), "{busy:?}");
    let skipped = with_env(&["run", "-n", "conv", "--", "false"]);
    assert_eq!(skipped.status.code(), Some(0), "{skipped:?}");
    holder.kill().unwrap();
    holder.wait().unwrap();

    let start = Instant::now();
    let stopped = with_env(&["run", "--max-run", "300ms", "other", "--", "sleep", "30"]);
    assert_eq!(stopped.status.code(), Some(124), "{stopped:?}");
    assert!(start.elapsed() < LIMIT, "{:?}", start.elapsed());
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(stderr.contains("--max-run 300ms"), "{stderr}");

    for args in [
        &["run", "--backend", "memory://", "x", "--", "true"][..],
        &["elect", "--backend", "memory://", "x", "--", "true"],
        &["check", "--backend", "memory://"],
        &[
            "run",
            "--backend",
            "zk://127.0.0.1:1/?session_timeout=2s",
            "--lease",
            "3s",
            "x",
            "--",
            "true",
        ],
    ] {
        let output = distlock(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("memory://") || stderr.contains("give the lease once"),
            "{args:?}: {stderr}"
        );
    }

    for shell in ["bash", "zsh", "fish"] {
        let output = distlock(&["completions", shell]);
        assert!(output.status.success(), "{shell}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("force-unlock"),
            "{shell}"
        );
    }
    let page = distlock(&["man"]);
    assert!(page.status.success());
    assert!(String::from_utf8_lossy(&page.stdout).starts_with(".ie"));
}
