//! How a command fails, and the exit code each failure gets: every code distlock exits with
//! is named in [`exit`].

use std::fmt;

/// The exit codes of every command, in one place.
pub mod exit {
    /// The work was done (for `run` and `elect`: the command exited 0, or `--skip-if-held`
    /// found the lock held).
    pub const SUCCESS: u8 = 0;
    /// The work failed: a backend error, a failed check.
    pub const FAILED: u8 = 1;
    /// Bad input: an unknown flag, a malformed URL or duration, an empty lock name, no
    /// command.
    pub const USAGE: u8 = 2;
    /// `run`: the lock was still held by another when `--wait` ran out (sysexits'
    /// `EX_TEMPFAIL`: try again later).
    pub const BUSY: u8 = 75;
    /// `run`, `elect`: the lock or the leadership was lost while the command ran (the command
    /// was stopped), or found gone when it was given back: the command's work may not have
    /// been protected to its end.
    pub const LOST: u8 = 76;
    /// `run`, `elect`: `--max-run` ran out and the command was stopped (the code of
    /// `timeout(1)`).
    pub const MAX_RUN: u8 = 124;
    /// `run`, `elect`: the command was found but could not be executed (the shell's code).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`, `elect`: the command was not found (the shell's code).
    pub const NOT_FOUND: u8 = 127;
    /// `run`, `elect`: the command was killed by signal N: the exit code is this plus N (the
    /// shell's convention; 137 for SIGKILL, 143 for SIGTERM).
    pub const SIGNALED: u8 = 128;

    /// The exit code of a process killed by `signal`.
    pub fn signaled(signal: i32) -> u8 {
        u8::try_from(signal)
            .ok()
            .and_then(|signal| SIGNALED.checked_add(signal))
            .unwrap_or(u8::MAX)
    }

    /// The exit codes of `run`, for its `--help`.
    pub const RUN_HELP: &str = "\
Exit codes:
  N      the command exited by itself with code N
  128+N  the command was killed by signal N (137: SIGKILL, 143: SIGTERM), or distlock was
         sent signal N before the command started: nothing was run
  0      --skip-if-held: the lock was held, nothing was run
  1      a backend error before the command started: nothing was run
  2      bad input: URL, lock name, duration, no command after --
  75     the lock was still held by another when --wait ran out (-E N: N instead)
  76     lost: the lock was lost while the command ran, and the command was stopped
         (SIGTERM, then SIGKILL after --grace); or found gone when given back
  124    --max-run ran out and the command was stopped
  126    the command was found but cannot be executed
  127    the command was not found";

    /// The exit codes of `elect`, for its `--help`.
    pub const ELECT_HELP: &str = "\
Exit codes:
  N      the command exited by itself with code N
  128+N  the command was killed by signal N (137: SIGKILL, 143: SIGTERM), or distlock was
         sent signal N while it campaigned: nothing was run
  1      a backend error before the command started: nothing was run
  2      bad input: URL, election name, duration, value, no command after --
  76     lost: the leadership was lost while the command ran, and the command was stopped
         (SIGTERM, then SIGKILL after --grace); or found gone when resigning
  124    --max-run ran out and the command was stopped
  126    the command was found but cannot be executed
  127    the command was not found";
}

/// A command's failure: bad input (exit 2), failed work (exit 1), or for `run` and `elect`
/// one of their own outcomes.
#[derive(Debug)]
pub enum Failure {
    /// The user's input was wrong; the message says what to change.
    Usage(String),
    /// The work could not be done.
    Failed(String),
    /// The lock was held by another past the wait ([`exit::BUSY`]).
    Busy(String),
    /// The lock was lost while it protected work ([`exit::LOST`]).
    Lost(String),
    /// `--max-run` ran out and the command was stopped ([`exit::MAX_RUN`]).
    MaxRun(String),
    /// The command to run could not be started ([`exit::NOT_FOUND`] or
    /// [`exit::CANNOT_EXECUTE`]).
    Spawn { code: u8, message: String },
    /// Exit with this code and say nothing: the command's own exit status passed on (it
    /// said what it had to), or distlock stopped by a signal.
    Exit(u8),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => exit::USAGE,
            Failure::Failed(_) => exit::FAILED,
            Failure::Busy(_) => exit::BUSY,
            Failure::Lost(_) => exit::LOST,
            Failure::MaxRun(_) => exit::MAX_RUN,
            Failure::Spawn { code, .. } | Failure::Exit(code) => *code,
        }
    }

    /// The line to print on stderr after `distlock: `, if any.
    pub fn report(&self) -> Option<String> {
        match self {
            Failure::Usage(message) | Failure::Failed(message) => Some(format!("error: {message}")),
            Failure::Spawn { message, .. } => Some(format!("error: {message}")),
            Failure::Busy(message) => Some(format!("busy: {message}")),
            Failure::Lost(message) => Some(format!("lost: {message}")),
            Failure::MaxRun(message) => Some(format!("stopped: {message}")),
            Failure::Exit(_) => None,
        }
    }

    pub fn failed(message: impl fmt::Display) -> Self {
        Failure::Failed(message.to_string())
    }

    pub fn usage(message: impl fmt::Display) -> Self {
        Failure::Usage(message.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(message)
            | Failure::Failed(message)
            | Failure::Busy(message)
            | Failure::Lost(message)
            | Failure::MaxRun(message)
            | Failure::Spawn { message, .. } => f.write_str(message),
            Failure::Exit(code) => write!(f, "exit code {code}"),
        }
    }
}

impl From<distlock::Error> for Failure {
    fn from(error: distlock::Error) -> Self {
        if error.is_invalid_input() || error.is_unsupported() {
            Failure::Usage(error.to_string())
        } else {
            Failure::Failed(error.to_string())
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Failure::Failed(error.to_string())
    }
}

pub type CliResult<T = ()> = Result<T, Failure>;

#[cfg(test)]
mod tests {
    use super::exit;

    /// Every code `run` and `elect` can exit with is in their help, and only those.
    #[test]
    fn the_help_names_every_code() {
        for code in [
            exit::FAILED,
            exit::USAGE,
            exit::BUSY,
            exit::LOST,
            exit::MAX_RUN,
            exit::CANNOT_EXECUTE,
            exit::NOT_FOUND,
            exit::SIGNALED,
        ] {
            assert!(
                exit::RUN_HELP.contains(&format!("\n  {code}")),
                "{code} missing"
            );
            assert_eq!(
                exit::ELECT_HELP.contains(&format!("\n  {code}")),
                code != exit::BUSY,
                "{code}"
            );
        }
        assert_eq!(exit::signaled(9), 137);
        assert_eq!(exit::signaled(15), 143);
    }
}
