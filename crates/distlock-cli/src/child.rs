//! The command `run` and `elect` start under a lock: started with the lock's variables in its
//! environment, sent the signals distlock is sent, stopped when the lock is lost or
//! `--max-run` ends, and its exit status passed on. It never outlives the lock's holder.
//!
//! # Process group, death signal and the terminal
//! The command runs in a process group of its own, so that distlock can end everything it
//! started: every signal passed on, the stop on a loss, and the end of the command's stray
//! children once it has exited go to the whole group. It also gets `PR_SET_PDEATHSIG`
//! SIGKILL: if distlock dies without a word (SIGKILL, a crash), the kernel kills the command
//! at once, before the lock's lease can end and another holder start. (The death signal
//! follows the thread that started the command: distlock starts it from the main thread,
//! which lives as long as the process.)
//!
//! A group of its own would be stopped by SIGTTIN as soon as it read from the terminal: when
//! distlock runs in the terminal's foreground, the command's group is made the foreground
//! group while it runs (as a shell does for a job), so that it reads the terminal and gets
//! Ctrl-C itself; distlock takes the terminal back once the command has exited.
//!
//! What remains: a process that leaves the group (`setsid`, a daemon) is neither signalled
//! nor ended, and only the command itself, not its children, gets the death signal.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind};

use crate::failure::{CliResult, Failure, exit};

/// The signals passed on to the command.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// How often distlock looks whether the command's group has emptied after the command
/// exited.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// A signal distlock received.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub number: libc::c_int,
}

/// distlock's handlers of the signals it passes on. Once made, those signals no longer end
/// distlock: it decides what each does.
pub struct Signals {
    streams: Vec<(libc::c_int, Signal)>,
    /// A signal ended distlock's own work (a connect, a wait), rather than being passed on.
    ended_work: bool,
}

impl Signals {
    /// Installs the handlers (once per process).
    pub fn install() -> CliResult<Self> {
        let mut streams = Vec::with_capacity(FORWARDED.len());
        for number in FORWARDED {
            let stream =
                tokio::signal::unix::signal(SignalKind::from_raw(number)).map_err(|error| {
                    Failure::failed(format!("cannot handle signal {number}: {error}"))
                })?;
            streams.push((number, stream));
        }
        Ok(Signals {
            streams,
            ended_work: false,
        })
    }

    /// The next signal received. Cancel safe.
    pub async fn recv(&mut self) -> Received {
        std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if let std::task::Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return std::task::Poll::Ready(Received { number: *number });
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Notes that a signal ended distlock's own work: it is to exit at once.
    pub fn note_ended_work(&mut self) {
        self.ended_work = true;
    }

    /// True once a signal has ended distlock's own work (not one passed on to the command).
    pub fn ended_work(&self) -> bool {
        self.ended_work
    }
}

/// True when distlock's standard input is a terminal whose foreground process group is
/// distlock's: the command's group then gets the terminal while it runs.
fn owns_the_terminal() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp only read the state of descriptor 0 and of this
    // process.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `group` the terminal's foreground process group, from a process or thread that
/// may be in a background group: SIGTTOU, which the kernel would send it, is blocked for the
/// call. Async-signal-safe (it runs in the child between fork and exec).
///
/// # Safety
/// Only calls async-signal-safe functions; the caller must own descriptor 0.
unsafe fn give_terminal_to(group: libc::pid_t) {
    // SAFETY: sigset operations on a local set; pthread_sigmask and tcsetpgrp on this
    // thread and descriptor 0.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut previous);
        libc::tcsetpgrp(0, group);
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
    }
}

/// The command, started: its process (also its group's id) and whether it was given the
/// terminal.
pub struct Started {
    child: Child,
    group: Option<libc::pid_t>,
    terminal: bool,
}

/// Starts `command` (program and arguments) with `env` added to distlock's environment,
/// stdin, stdout and stderr inherited, in a process group of its own and with a death
/// signal (see the module docs). A program that cannot be started is exit 127 (not found) or
/// 126 (found, not executable), as in a shell.
///
/// Call it from the main thread (the death signal follows the thread that starts it).
pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> CliResult<Started> {
    let Some((program, args)) = command.split_first() else {
        return Err(Failure::usage("give the command to run after --"));
    };
    let mut child = Command::new(program);
    child.args(args);
    for (key, value) in env {
        child.env(key, value);
    }
    let terminal = owns_the_terminal();
    // SAFETY: getpid only reads this process's id.
    let parent = unsafe { libc::getpid() };
    child.process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, getpid, the signal mask, tcsetpgrp); it
    // allocates only on its error path, after which the child exits without exec.
    unsafe {
        child.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // distlock died between the fork and the prctl: the death signal came too early.
            if libc::getppid() != parent {
                return Err(io::Error::other(
                    "distlock exited while the command started",
                ));
            }
            if terminal {
                give_terminal_to(libc::getpid());
            }
            Ok(())
        });
    }
    let child = child.spawn().map_err(|error| {
        // The child may have taken the terminal before its exec failed.
        if terminal {
            take_the_terminal_back();
        }
        Failure::Spawn {
            code: if error.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            },
            message: format!("cannot run {}: {error}", program.to_string_lossy()),
        }
    })?;
    let group = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok());
    Ok(Started {
        child,
        group,
        terminal,
    })
}

/// Why distlock stopped the command.
#[derive(Debug)]
pub enum Stop {
    /// The lock (the leadership) was lost.
    Lost(distlock::Error),
    /// `--max-run` ran out.
    MaxRun(Duration),
}

/// How the command ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by a signal) by itself while the lock was held.
    Exited(ExitStatus),
    /// distlock stopped it: it was sent SIGTERM, and SIGKILL if it was still running `grace`
    /// later (`killed`).
    Stopped {
        why: Stop,
        status: ExitStatus,
        killed: bool,
    },
}

/// Waits for the command to exit, passing on the signals distlock receives to its group.
/// When `lost` resolves first, or `max_run` passes, sends the group SIGTERM, and SIGKILL once
/// `grace` has passed, and waits for the command to exit. Returns only once the command has
/// exited and been reaped, and the rest of its group has ended (see [`end_group`]).
pub async fn supervise(
    started: Started,
    signals: &mut Signals,
    lost: impl Future<Output = distlock::Error>,
    max_run: Option<Duration>,
    grace: Duration,
) -> CliResult<Ended> {
    let Started {
        mut child,
        group,
        terminal,
    } = started;
    let (ended, kill_at) = watch(&mut child, group, terminal, signals, lost, max_run, grace).await;
    // Only from the command's group: if the shell has taken the terminal meanwhile, it stays
    // the shell's.
    // SAFETY: tcgetpgrp only reads descriptor 0's foreground group.
    if terminal && group.is_some_and(|group| unsafe { libc::tcgetpgrp(0) } == group) {
        take_the_terminal_back();
    }
    end_group(group, signals, kill_at).await;
    ended
}

/// Makes distlock's own group the terminal's foreground group again.
fn take_the_terminal_back() {
    // SAFETY: getpgrp reads this process's group; give_terminal_to is async-signal-safe and
    // distlock's descriptor 0 is the terminal it gave away.
    unsafe { give_terminal_to(libc::getpgrp()) };
}

/// How often distlock looks whether a command that has the terminal was stopped (Ctrl-Z).
const STOP_POLL: Duration = Duration::from_millis(100);

/// Waits for the command as [`supervise`] says; also the time by which what is left of its
/// group gets SIGKILL: `grace` after the SIGTERM of a stop, or after the command's exit.
async fn watch(
    child: &mut Child,
    group: Option<libc::pid_t>,
    terminal: bool,
    signals: &mut Signals,
    lost: impl Future<Output = distlock::Error>,
    max_run: Option<Duration>,
    grace: Duration,
) -> (CliResult<Ended>, tokio::time::Instant) {
    tokio::pin!(lost);
    let run_out = async {
        match max_run {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(run_out);
    let mut stop_poll = tokio::time::interval(STOP_POLL);
    let why = loop {
        tokio::select! {
            status = child.wait() => {
                let kill_at = tokio::time::Instant::now() + grace;
                return (finish(child, status).map(Ended::Exited), kill_at);
            }
            loss = &mut lost => break Stop::Lost(loss),
            () = &mut run_out => break Stop::MaxRun(max_run.unwrap_or_default()),
            received = signals.recv() => send(group, received.number),
            _ = stop_poll.tick(), if terminal => continue_a_stop(group),
        }
    };
    tracing::debug!(?group, ?why, "stopping the command");
    send(group, libc::SIGTERM);
    // A stopped command would not see the SIGTERM until continued.
    send(group, libc::SIGCONT);
    let kill_at = tokio::time::Instant::now() + grace;
    let mut killed = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                let ended = finish(child, status).map(|status| Ended::Stopped { why, status, killed });
                return (ended, kill_at);
            }
            () = tokio::time::sleep_until(kill_at), if !killed => {
                send(group, libc::SIGKILL);
                killed = true;
            }
            received = signals.recv() => send(group, received.number),
        }
    }
}

/// A command that has the terminal and was stopped (Ctrl-Z) is continued: it holds a lock,
/// and a stopped holder would keep it from everyone while the shell, waiting for distlock,
/// could not take the terminal back. (Stopping distlock too, as a shell's job, would stop
/// the renewals, and a `kill -CONT` of the command alone would then run it unprotected;
/// distlock cannot tell a terminal's stop from another's.) Stop a command under a lock with
/// Ctrl-C, or bound it with `--max-run`.
fn continue_a_stop(group: Option<libc::pid_t>) {
    let Some(group) = group else { return };
    // SAFETY: tcgetpgrp only reads descriptor 0's foreground group.
    let has_the_terminal = unsafe { libc::tcgetpgrp(0) } == group;
    if !has_the_terminal || process_state(group).is_none_or(|state| state != "T") {
        return;
    }
    eprintln!(
        "distlock: warning: the command was stopped (Ctrl-Z?) while it holds the lock: \
         continuing it; end it with Ctrl-C"
    );
    send(Some(group), libc::SIGCONT);
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z` zombie ...), from `/proc`.
fn process_state(pid: libc::pid_t) -> Option<String> {
    stat_of(Path::new(&format!("/proc/{pid}"))).map(|(state, _)| state)
}

/// The state letter and process group of the process whose `/proc` directory is `dir`: the
/// fields of `stat` after the command name's last parenthesis are `STATE PPID PGRP ...`.
fn stat_of(dir: &Path) -> Option<(String, Option<libc::pid_t>)> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.to_owned();
    let group = fields.nth(1).and_then(|pgrp| pgrp.parse().ok());
    Some((state, group))
}

/// Ends what is left of the command's group once the command has exited (the processes it
/// left running in the background): SIGTERM, then SIGKILL at `kill_at` (the grace after a
/// stop's SIGTERM, or after the command's exit). Nothing the command started runs on after
/// distlock gives the lock back.
async fn end_group(
    group: Option<libc::pid_t>,
    signals: &mut Signals,
    kill_at: tokio::time::Instant,
) {
    let Some(group) = group else { return };
    let alive = || group_runs(group);
    if !alive() {
        return;
    }
    tracing::debug!(
        group,
        "the command left processes in its group: ending them"
    );
    send(Some(group), libc::SIGTERM);
    send(Some(group), libc::SIGCONT);
    while alive() && tokio::time::Instant::now() < kill_at {
        tokio::select! {
            () = tokio::time::sleep(GROUP_POLL) => {}
            received = signals.recv() => send(Some(group), received.number),
        }
    }
    if alive() {
        send(Some(group), libc::SIGKILL);
    }
}

/// True while a process of `group` runs. A zombie does not count: a member whose parent
/// died is re-parented to PID 1, which on some machines never reaps it. Read from `/proc`;
/// without it, whether the group has any member at all.
fn group_runs(group: libc::pid_t) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // SAFETY: signal 0 to our command's group only checks that it has members.
        return unsafe { libc::kill(-group, 0) == 0 };
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && stat_of(&entry.path()).is_some_and(|(state, pgrp)| {
                pgrp == Some(group) && !matches!(state.as_str(), "Z" | "X")
            })
    })
}

/// The command's exit status; when waiting for it failed, it is killed and waited for again
/// (distlock must not exit while it runs).
fn finish(child: &mut Child, status: io::Result<ExitStatus>) -> CliResult<ExitStatus> {
    match status {
        Ok(status) => Ok(status),
        Err(error) => {
            let _ = child.start_kill();
            Err(Failure::failed(format!(
                "cannot wait for the command: {error}; it was killed"
            )))
        }
    }
}

/// Sends `signal` to the command's process group. The group's id is the command's process
/// id, which cannot be reused while the group has a member; once it has none, the call fails
/// harmlessly.
fn send(group: Option<libc::pid_t>, signal: libc::c_int) {
    let Some(group) = group else { return };
    // SAFETY: kill(2) on the process group distlock made for its command.
    let result = unsafe { libc::kill(-group, signal) };
    if result != 0 {
        tracing::debug!(group, signal, error = %io::Error::last_os_error(), "kill failed");
    }
}

/// distlock's exit code for the command's exit status: its code, or 128 + the signal that
/// killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::FAILED),
        (None, Some(signal)) => exit::signaled(signal),
        (None, None) => exit::FAILED,
    }
}

/// The exit status in words: `exited with code 3`, `was killed by signal 9`.
pub fn describe(status: ExitStatus) -> String {
    match status.signal() {
        Some(signal) => format!("was killed by signal {signal}"),
        None => format!("exited with code {}", exit_code(status)),
    }
}
