//! The command `run` and `elect` start under a lock: started with the lock's variables in its
//! environment, sent the signals distlock is sent, stopped when the lock is lost, and its exit
//! status passed on.
//!
//! # Process group and signals
//! The command stays in distlock's process group, so that it can use the terminal (a child
//! in a group of its own would be stopped by SIGTTIN as soon as it read from it). The signals
//! a terminal sends (Ctrl-C's SIGINT, Ctrl-\'s SIGQUIT, a hang-up's SIGHUP) go to the whole
//! foreground group, so the command receives them from the kernel itself; the same signal
//! sent to distlock alone by a process (`kill PID`, a supervisor stopping its main process)
//! reaches only distlock, which passes it on. To send each signal once, distlock passes on
//! only those a process sent (`si_code` is not `SI_KERNEL`), by the command's process id,
//! and only until it has reaped the command, so the id cannot have been reused.
//!
//! Only the command itself is signalled, not the processes it started: a shell script should
//! `exec` its last command or pass signals on itself.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
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

/// For each signal number below 32: how many deliveries a process sent (rather than the
/// kernel, for a terminal) since [`Signals::recv`] last returned that signal.
static SENT_BY_A_PROCESS: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];

/// A signal distlock received.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub number: libc::c_int,
    /// A process sent it with kill(2) (at least one of the deliveries `recv` folded into
    /// one), rather than the kernel on a terminal's behalf.
    pub by_a_process: bool,
}

/// distlock's handlers of the signals it passes on. Once made, those signals no longer end
/// distlock: it decides what each does.
pub struct Signals {
    streams: Vec<(libc::c_int, Signal)>,
}

impl Signals {
    /// Installs the handlers (once per process).
    pub fn install() -> CliResult<Self> {
        let mut streams = Vec::with_capacity(FORWARDED.len());
        for number in FORWARDED {
            let index = usize::try_from(number).expect("a signal number is positive");
            // Installed before tokio's handler of the same signal, so that the count is
            // made before tokio wakes the task that reads it.
            // SAFETY: the action only reads the siginfo it is given and does an atomic add,
            // both async-signal-safe; it allocates nothing and takes no lock.
            let registered = unsafe {
                signal_hook_registry::register_sigaction(number, move |info: &libc::siginfo_t| {
                    if info.si_code != libc::SI_KERNEL {
                        SENT_BY_A_PROCESS[index].fetch_add(1, Ordering::SeqCst);
                    }
                })
            };
            registered.map_err(|error| {
                Failure::failed(format!("cannot handle signal {number}: {error}"))
            })?;
            let stream =
                tokio::signal::unix::signal(SignalKind::from_raw(number)).map_err(|error| {
                    Failure::failed(format!("cannot handle signal {number}: {error}"))
                })?;
            streams.push((number, stream));
        }
        Ok(Signals { streams })
    }

    /// The next signal received. Cancel safe.
    pub async fn recv(&mut self) -> Received {
        std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    let index = usize::try_from(*number).expect("a signal number is positive");
                    let sent = SENT_BY_A_PROCESS[index].swap(0, Ordering::SeqCst);
                    return Poll::Ready(Received {
                        number: *number,
                        by_a_process: sent > 0,
                    });
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Starts `command` (program and arguments) with `env` added to distlock's environment,
/// stdin, stdout and stderr inherited. A program that cannot be started is exit 127 (not
/// found) or 126 (found, not executable), as in a shell.
pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> CliResult<Child> {
    let Some((program, args)) = command.split_first() else {
        return Err(Failure::usage("give the command to run after --"));
    };
    let mut child = Command::new(program);
    child.args(args);
    for (key, value) in env {
        child.env(key, value);
    }
    child.spawn().map_err(|error| Failure::Spawn {
        code: if error.kind() == io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        },
        message: format!("cannot run {}: {error}", program.to_string_lossy()),
    })
}

/// How the command ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by a signal) while the lock was held.
    Exited(ExitStatus),
    /// The lock was lost while it ran: it was sent SIGTERM, and SIGKILL if it was still
    /// running `grace` later (`killed`).
    Stopped {
        loss: distlock::Error,
        status: ExitStatus,
        killed: bool,
    },
}

/// Waits for the command to exit, passing on the signals a process sends distlock. When
/// `lost` resolves first, sends the command SIGTERM, and SIGKILL once `grace` has passed, and
/// waits for it to exit. Returns only once the command has exited and been reaped.
pub async fn supervise(
    mut child: Child,
    signals: &mut Signals,
    lost: impl Future<Output = distlock::Error>,
    grace: Duration,
) -> CliResult<Ended> {
    let pid = child.id();
    tokio::pin!(lost);
    let loss = loop {
        tokio::select! {
            status = child.wait() => return finish(&mut child, status).map(Ended::Exited),
            loss = &mut lost => break loss,
            received = signals.recv() => pass_on(pid, received),
        }
    };
    tracing::debug!(?pid, %loss, "the lock was lost: stopping the command");
    send(pid, libc::SIGTERM);
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    let mut killed = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = finish(&mut child, status)?;
                return Ok(Ended::Stopped { loss, status, killed });
            }
            () = &mut deadline, if !killed => {
                send(pid, libc::SIGKILL);
                killed = true;
            }
            received = signals.recv() => pass_on(pid, received),
        }
    }
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

/// Passes a signal on to the command, unless the kernel sent it: then it went to the
/// command's process group, and the command has it already.
fn pass_on(pid: Option<u32>, received: Received) {
    if received.by_a_process {
        tracing::debug!(?pid, signal = received.number, "passing a signal on");
        send(pid, received.number);
    } else {
        tracing::debug!(
            ?pid,
            signal = received.number,
            "the terminal sent the signal to the command too"
        );
    }
}

/// Sends `signal` to the command, which has not been reaped yet (so its id is still its own).
fn send(pid: Option<u32>, signal: libc::c_int) {
    let Some(pid) = pid.and_then(|pid| libc::pid_t::try_from(pid).ok()) else {
        return;
    };
    // SAFETY: kill(2) on the process id of our own child, which has not been reaped.
    let result = unsafe { libc::kill(pid, signal) };
    if result != 0 {
        tracing::debug!(pid, signal, error = %io::Error::last_os_error(), "kill failed");
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
