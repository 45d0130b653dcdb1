//! The backends distlock connects to, by URL scheme: [`SCHEMES`], the list that
//! [`connect`](crate::connect), its error messages and the command line's help are derived
//! from, and the one parser of the options in a URL's query. Each backend writes its rows in
//! its own folder (`<backend>/schemes.rs`); the registry in the crate root gathers them.

use crate::driver::Driver;
use crate::error::{Error, Result};

/// One option a URL's query may carry (`?key=value`).
#[derive(Debug)]
#[non_exhaustive]
pub struct UrlOption {
    /// The key.
    pub key: &'static str,
    /// The values it takes, as written in help (`true|false`, `10s`).
    pub values: &'static str,
    /// What it does, and its default.
    pub meaning: &'static str,
}

/// One URL scheme distlock knows.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Scheme {
    /// The scheme, as written before `://`.
    pub name: &'static str,
    /// The backend it opens, when this build has it ([`crate::driver`]).
    pub(crate) driver: Option<&'static Driver>,
    /// The cargo feature that compiles the backend in (`None`: always there).
    pub feature: Option<&'static str>,
    /// An example URL.
    pub example: &'static str,
    /// distlock's own options.
    pub options: &'static [UrlOption],
    /// Keys passed on, unchanged, to the driver underneath (sqlx, redis-rs); a key ending in
    /// `[` is a prefix (`options[search_path]`).
    pub driver_options: &'static [&'static str],
    /// The documented limit under which two clients may hold a lock at once (a failover of
    /// asynchronous replication), and where it is documented; `None`: never. `distlock
    /// check` reports such overlaps instead of failing on them, as long as fencing refused
    /// the stale writes.
    pub overlap_limit: Option<&'static str>,
    /// The option of [`options`](Self::options) that decides when a crashed holder's locks
    /// free, where that is a property of the client's session rather than of each lock's
    /// lease (ZooKeeper's session timeout, etcd's lease TTL): a tool with one lease setting
    /// for every backend sets this option to it.
    pub session_lease: Option<&'static str>,
    /// True when the locks live in this process only (`memory://`): nothing is shared with
    /// another process, so a tool that coordinates processes refuses it.
    pub process_local: bool,
    /// The port a host of the URL without one means (`None`: no network).
    pub default_port: Option<u16>,
    /// True when every connection of a client goes to a host its URL names, so that proxies
    /// in front of those hosts carry all of its traffic (`distlock check`'s network faults).
    /// Not so where clients follow the addresses their servers announce (Redis Sentinel and
    /// Cluster) or check a certificate against the host name (`rediss://`).
    pub routable: bool,
    /// The scheme of the same backend whose waiters all watch the lock itself instead of the
    /// waiter before them: the herd effect (`distlock bench --herd`) measured against this
    /// scheme's lock (`zk` against `zk+naive`).
    pub herd_variant: Option<&'static str>,
    /// The lock strategies of `distlock demo` that this scheme's backend runs (most schemes
    /// none: one row of a backend names them).
    pub demo: &'static [DemoLock],
}

impl Scheme {
    /// True when this build can open it (its feature is on).
    pub fn is_available(&self) -> bool {
        self.driver.is_some()
    }

    /// Every key the query may carry: distlock's (this scheme's, then those of every
    /// scheme), then the driver's.
    pub fn known_keys(&self) -> Vec<&'static str> {
        self.own_options()
            .map(|option| option.key)
            .chain(self.driver_options.iter().copied())
            .collect()
    }

    /// distlock's options of this scheme: its own, then [`COMMON_OPTIONS`].
    pub fn own_options(&self) -> impl Iterator<Item = &'static UrlOption> + use<> {
        self.options.iter().chain(COMMON_OPTIONS)
    }

    fn is_driver_key(&self, key: &str) -> bool {
        self.driver_options
            .iter()
            .any(|known| match known.strip_suffix('[') {
                Some(prefix) => key.starts_with(prefix) && key.ends_with(']'),
                None => *known == key,
            })
    }
}

/// The options every scheme takes.
pub const COMMON_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "connect_timeout",
    values: "10s|2500ms",
    meaning: "how long connecting may take (every server's connection and distlock's set-up) \
              before it fails, 100 ms to 10 min (10 s)",
}];

/// How long connecting may take unless the URL's `connect_timeout` says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The range `connect_timeout` accepts.
const CONNECT_TIMEOUT_RANGE: std::ops::RangeInclusive<std::time::Duration> =
    std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(600);

/// The `connect_timeout` of `url` (checked), or the default. A bare number is seconds, as
/// libpq writes it (URLs shared with libpq-based tools carry `connect_timeout=10`); libpq's
/// `0`, no limit, is the longest distlock takes.
pub(crate) fn connect_timeout(url: &str) -> Result<std::time::Duration> {
    let (_, query) = Query::parse(url)?;
    if let Some(seconds) = query
        .get("connect_timeout")
        .and_then(|value| value.parse::<u64>().ok())
    {
        if seconds == 0 {
            return Ok(*CONNECT_TIMEOUT_RANGE.end());
        }
        let timeout = std::time::Duration::from_secs(seconds);
        if CONNECT_TIMEOUT_RANGE.contains(&timeout) {
            return Ok(timeout);
        }
    }
    Ok(query
        .duration("connect_timeout", CONNECT_TIMEOUT_RANGE)?
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT))
}

/// `fair=`, for a backend that serves waiters in arrival order or not.
pub(crate) const FAIR: UrlOption = UrlOption {
    key: "fair",
    values: "true|false",
    meaning: "serve waiters in arrival order (true, the default) or first to ask",
};

/// `spin=`, for a backend whose waiters can poll instead.
pub(crate) const SPIN: UrlOption = UrlOption {
    key: "spin",
    values: "true|false",
    meaning: "waiters poll with backoff instead of waiting for pub/sub (false)",
};

/// The driver keys sqlx takes for PostgreSQL and MySQL alike.
pub(crate) const SQL_DRIVER_COMMON: [&str; 10] = [
    "sslmode",
    "ssl-mode",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "ssl-ca",
    "statement-cache-capacity",
    "options",
    "options[",
];

/// `a` then `b`, in a constant.
pub(crate) const fn concat_keys<const A: usize, const B: usize, const C: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; C] {
    let mut out = [""; C];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < C {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

/// Every scheme distlock knows, in the order help lists them: each backend's rows
/// (`<backend>/schemes.rs`), in the order of the registry in the crate root.
pub const SCHEMES: &[Scheme] = &flatten::<SCHEME_COUNT>(crate::BACKEND_SCHEMES);

const SCHEME_COUNT: usize = {
    let mut count = 0;
    let mut i = 0;
    while i < crate::BACKEND_SCHEMES.len() {
        count += crate::BACKEND_SCHEMES[i].len();
        i += 1;
    }
    count
};

/// The backends' rows, one after another.
const fn flatten<const N: usize>(groups: &[&[Scheme]]) -> [Scheme; N] {
    let mut out = [groups[0][0]; N];
    let (mut at, mut group) = (0, 0);
    while group < groups.len() {
        let mut row = 0;
        while row < groups[group].len() {
            out[at] = groups[group][row];
            at += 1;
            row += 1;
        }
        group += 1;
    }
    out
}

/// The scheme named `name`, if distlock knows it.
pub fn find(name: &str) -> Option<&'static Scheme> {
    SCHEMES.iter().find(|scheme| scheme.name == name)
}

/// True when `url`'s query gives distlock's option `key` (its keys read as `connect` reads
/// them, percent-escapes decoded).
///
/// ```
/// assert!(distlock::scheme::sets_option("zk://h/?session%5Ftimeout=5s", "session_timeout").unwrap());
/// assert!(!distlock::scheme::sets_option("zk://h/", "session_timeout").unwrap());
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] as [`validate_url`](crate::validate_url) for a malformed scheme or
/// query.
pub fn sets_option(url: &str, key: &str) -> Result<bool> {
    let (_, query) = Query::parse(url)?;
    Ok(query.get(key).is_some())
}

/// The scheme of `url`, or a typed error naming the known schemes.
pub(crate) fn of_url(url: &str) -> Result<(&'static Scheme, &str)> {
    let Some((name, rest)) = url.split_once("://") else {
        return Err(Error::invalid(
            "URL",
            format!(
                "{:?} has no scheme; write it as {}",
                crate::redact::shown(url),
                SCHEMES
                    .iter()
                    .filter(|s| s.is_available())
                    .map(|s| s.example)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    };
    let scheme = find(name).ok_or_else(|| {
        Error::invalid(
            "URL",
            format!(
                "unknown scheme {name:?}; the known schemes are {}",
                SCHEMES
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    Ok((scheme, rest))
}

// The user info and the host list of a URL that names several servers, for the backends that
// parse them here: compiled in every build, so that a backend that uses them names no feature
// here; a build without such a backend leaves them unused.
#[cfg_attr(not(feature = "all-backends"), allow(dead_code, unused_imports))]
mod credentials;
mod demo;
#[cfg_attr(not(feature = "all-backends"), allow(dead_code, unused_imports))]
mod hosts;
mod query;
#[cfg_attr(not(feature = "all-backends"), allow(unused_imports))]
pub(crate) use credentials::Credentials;
pub use demo::{DemoLock, DemoServer, demo_locks, demo_servers};
#[cfg_attr(not(feature = "all-backends"), allow(unused_imports))]
pub(crate) use hosts::host_list;
pub(crate) use query::Query;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_names_are_unique_and_their_examples_parse() {
        for (i, scheme) in SCHEMES.iter().enumerate() {
            assert!(
                SCHEMES[..i].iter().all(|other| other.name != scheme.name),
                "{} twice",
                scheme.name
            );
            let (found, _) = of_url(scheme.example).unwrap();
            assert_eq!(found.name, scheme.name);
            Query::parse(scheme.example).unwrap();
        }
    }

    /// The crate docs and the README name every scheme: adding one to [`SCHEMES`] without
    /// documenting it fails here.
    #[test]
    fn every_scheme_is_documented() {
        let readme = include_str!("../../../README.md");
        let lib = include_str!("lib.rs");
        for scheme in SCHEMES {
            let written = format!("{}://", scheme.name);
            assert!(
                lib.contains(&written),
                "the crate docs do not name {written}"
            );
            assert!(
                readme.contains(&written),
                "README.md does not name {written}"
            );
        }
    }
}
