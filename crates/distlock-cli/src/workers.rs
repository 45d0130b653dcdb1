//! Worker processes for the demo and the benchmark: this same binary, started with a hidden
//! subcommand, or (`distlock bench --worker-command`) another program that drives another
//! library's lock. The protocol on the worker's stdio is three lines: the worker prints `ready`
//! once set up, waits for `go` on stdin (so that all workers start together), and prints one
//! JSON report when done.

use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::failure::{CliResult, Failure};

/// How long a worker may take to start and connect.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The flags of this binary's worker subcommands that carry a URL, and the environment
/// variable each is passed in instead: a process's command line is readable by every user of
/// the machine (`ps`, `/proc/PID/cmdline`), its environment only by its own user and root.
/// The worker subcommands read each flag from its variable.
pub const URL_FLAGS: &[(&str, &str)] = &[
    ("--backend", "DISTLOCK_BACKEND"),
    ("--lock-url", "DISTLOCK_LOCK_URL"),
    ("--store-url", "DISTLOCK_STORE_URL"),
    ("--store", "DISTLOCK_STORE"),
];

/// Gives `args` to a worker of this binary: the value of each flag of [`URL_FLAGS`] in its
/// environment variable, the rest as arguments. A variable whose flag is not given is
/// removed, so that the worker does not take one from this process's environment.
pub fn own_worker_args(command: &mut std::process::Command, args: &[String]) {
    let mut given = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
            _ => (arg.as_str(), None),
        };
        match URL_FLAGS.iter().find(|(url_flag, _)| *url_flag == flag) {
            Some((_, variable)) => {
                let value = match inline {
                    Some(value) => value,
                    None => args.next().map_or("", String::as_str),
                };
                command.env(variable, value);
                given.push(*variable);
            }
            None => {
                command.arg(arg);
            }
        }
    }
    for (_, variable) in URL_FLAGS {
        if !given.contains(variable) {
            command.env_remove(variable);
        }
    }
}

pub struct Fleet {
    workers: Vec<Worker>,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Fleet {
    /// Starts one worker (this binary) per argument list and waits until every one is ready.
    /// Their URLs go in their environment ([`own_worker_args`]).
    pub async fn start(argument_lists: Vec<Vec<String>>) -> CliResult<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::failed(format!("cannot find the distlock binary: {e}")))?;
        Self::spawn(&exe.to_string_lossy(), &[], argument_lists, true).await
    }

    /// As [`Fleet::start`], running `program` with `leading` arguments before each list, every
    /// argument on its command line (another program reads its URL there).
    pub async fn start_program(
        program: &str,
        leading: &[String],
        argument_lists: Vec<Vec<String>>,
    ) -> CliResult<Self> {
        Self::spawn(program, leading, argument_lists, false).await
    }

    async fn spawn(
        program: &str,
        leading: &[String],
        argument_lists: Vec<Vec<String>>,
        own: bool,
    ) -> CliResult<Self> {
        let mut workers = Vec::with_capacity(argument_lists.len());
        for args in argument_lists {
            let mut command = Command::new(program);
            command.args(leading);
            if own {
                own_worker_args(command.as_std_mut(), &args);
            } else {
                command.args(&args);
            }
            let mut child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                // Only the processes this fleet started are ended, by their own handles.
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    Failure::failed(format!("cannot start a worker process ({program}): {e}"))
                })?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(Failure::failed("a worker process has no stdio pipes"));
            };
            workers.push(Worker {
                child,
                stdin,
                stdout: BufReader::new(stdout).lines(),
            });
        }
        for (index, worker) in workers.iter_mut().enumerate() {
            let line = tokio::time::timeout(READY_TIMEOUT, worker.stdout.next_line())
                .await
                .map_err(|_| Failure::failed(format!("worker {index} did not get ready")))??;
            if line.as_deref() != Some("ready") {
                return Err(Failure::failed(format!(
                    "worker {index} failed to start (it said {line:?}; see its error above)"
                )));
            }
        }
        Ok(Fleet { workers })
    }

    /// Tells every worker to start.
    pub async fn go(&mut self) -> CliResult {
        for worker in &mut self.workers {
            worker.stdin.write_all(b"go\n").await?;
            worker.stdin.flush().await?;
        }
        Ok(())
    }

    /// Reads every worker's report and waits for it to exit.
    pub async fn reports<T: DeserializeOwned>(mut self, timeout: Duration) -> CliResult<Vec<T>> {
        let mut reports = Vec::with_capacity(self.workers.len());
        for (index, worker) in self.workers.iter_mut().enumerate() {
            let line = tokio::time::timeout(timeout, worker.stdout.next_line())
                .await
                .map_err(|_| {
                    Failure::failed(format!("worker {index} did not finish in {timeout:?}"))
                })??
                .ok_or_else(|| {
                    Failure::failed(format!("worker {index} exited without a report"))
                })?;
            let report = serde_json::from_str(&line).map_err(|e| {
                Failure::failed(format!("worker {index} sent a bad report ({e}): {line}"))
            })?;
            reports.push(report);
            let status = worker.child.wait().await?;
            if !status.success() {
                return Err(Failure::failed(format!(
                    "worker {index} exited with {status}"
                )));
            }
        }
        Ok(reports)
    }
}

/// The worker's side of the handshake: say `ready`, then wait for `go`.
pub async fn await_go() -> CliResult {
    println!("ready");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match stdin.next_line().await? {
        Some(line) if line == "go" => Ok(()),
        other => Err(Failure::failed(format!(
            "expected go on stdin, got {other:?}"
        ))),
    }
}

/// Prints the worker's report as one JSON line.
pub fn report<T: serde::Serialize>(report: &T) -> CliResult {
    let line = serde_json::to_string(report)
        .map_err(|e| Failure::failed(format!("cannot encode the report: {e}")))?;
    println!("{line}");
    Ok(())
}

/// Spends `hold` in a critical section, to within tens of microseconds: Tokio's timer rounds a
/// sleep up to the next whole millisecond (a 1 ms sleep lasts about 2 ms, a 20 ms one about
/// 21 ms), so the last 2 ms are a thread sleep, off the runtime's other tasks.
pub async fn spend(hold: Duration) {
    if hold.is_zero() {
        return;
    }
    let end = tokio::time::Instant::now() + hold;
    let coarse = Duration::from_millis(2);
    if hold > coarse {
        tokio::time::sleep_until(end - coarse).await;
    }
    let rest = end.saturating_duration_since(tokio::time::Instant::now());
    if !rest.is_zero() {
        tokio::task::block_in_place(|| std::thread::sleep(rest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Security: a worker of this binary gets its URLs in its environment, never on its
    /// command line, which every user of the machine can read.
    #[test]
    fn own_workers_get_their_urls_in_the_environment() {
        let secret = "redis://app:s3cret@127.0.0.1:1/";
        let args: Vec<String> = [
            "bench-worker",
            "--backend",
            secret,
            "--name",
            "x",
            "--store-url=postgres://u:pw2@h/db",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut command = std::process::Command::new("distlock");
        own_worker_args(&mut command, &args);
        let argv: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(argv, ["bench-worker", "--name", "x"]);
        let envs: Vec<(String, Option<String>)> = command
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(envs.contains(&("DISTLOCK_BACKEND".into(), Some(secret.into()))));
        assert!(envs.contains(&(
            "DISTLOCK_STORE_URL".into(),
            Some("postgres://u:pw2@h/db".into())
        )));
        // A flag not given: its variable is removed, not inherited.
        assert!(envs.contains(&("DISTLOCK_LOCK_URL".into(), None)));
        assert!(envs.contains(&("DISTLOCK_STORE".into(), None)));
    }
}
