//! `sqlite://` URLs: the file's path and the options after `?`.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// How long a statement waits for another process's write lock by default.
pub(super) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Parsed `sqlite://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SqliteUrl {
    pub(super) path: PathBuf,
    pub(super) busy_timeout: Duration,
    pub(super) fair: bool,
}

/// Checks a URL as connecting would, without connecting ([`crate::validate_url`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    parse_url(url.trim_start_matches("sqlite://")).map(|_| ())
}

pub(super) fn parse_url(rest: &str) -> Result<SqliteUrl> {
    let url = format!("sqlite://{rest}");
    let (base, query) = crate::scheme::Query::parse(&url)?;
    let path = base.strip_prefix("sqlite://").unwrap_or_default();
    if path.is_empty() {
        return Err(Error::invalid(
            "URL",
            "sqlite:// needs a file path, as in sqlite:///var/lib/app/locks.db",
        ));
    }
    let mut busy_timeout = DEFAULT_BUSY_TIMEOUT;
    if let Some(value) = query.get("busy_timeout_ms") {
        let ms: u64 = value.parse().map_err(|_| {
            Error::invalid(
                "URL",
                format!("busy_timeout_ms={value:?} is not a whole number of milliseconds"),
            )
        })?;
        if ms == 0 || ms > 600_000 {
            return Err(Error::invalid(
                "URL",
                format!("busy_timeout_ms={ms} is outside 1 ..= 600000"),
            ));
        }
        busy_timeout = Duration::from_millis(ms);
    }
    Ok(SqliteUrl {
        path: PathBuf::from(path),
        busy_timeout,
        fair: query.flag("fair")?.unwrap_or(true),
    })
}
