//! A one-line progress bar on stderr, drawn only when stderr is a terminal.

use std::io::{IsTerminal, Write};

pub struct Progress {
    enabled: bool,
    last_percent: Option<u64>,
}

impl Progress {
    pub fn new(wanted: bool) -> Self {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            last_percent: None,
        }
    }

    /// Shows `phase` at `done` of `total`; redraws only when the percentage changes.
    pub fn show(&mut self, phase: &str, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        let percent = (done.saturating_mul(100) / total.max(1)).min(100);
        if self.last_percent == Some(percent) {
            return;
        }
        self.last_percent = Some(percent);
        let filled = usize::try_from(percent / 5).unwrap_or(20);
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(20 - filled));
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r{phase:<28} [{bar}] {percent:>3}%");
        let _ = stderr.flush();
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.enabled {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r{:<60}\r", "");
            let _ = stderr.flush();
        }
        self.last_percent = None;
    }
}
