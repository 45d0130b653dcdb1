//! How a command fails, and the exit code each failure gets.

use std::fmt;

/// A command's failure: bad input (exit 2) or failed work (exit 1).
#[derive(Debug)]
pub enum Failure {
    /// The user's input was wrong; the message says what to change.
    Usage(String),
    /// The work could not be done.
    Failed(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Failed(_) => 1,
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
            Failure::Usage(message) | Failure::Failed(message) => f.write_str(message),
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
