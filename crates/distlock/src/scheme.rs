//! The backends distlock connects to, by URL scheme: the one list that [`connect`](crate::connect),
//! its error messages and the command line's help are derived from, and the one parser of
//! the options in a URL's query.

use crate::error::{Error, Result};

/// The backend a scheme opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// This process only ([`crate::memory`]).
    Memory,
    /// An SQLite file.
    Sqlite,
    /// Redis: standalone, TLS, Sentinel or Cluster.
    Redis,
    /// Redlock over independent Redis masters.
    Redlock,
    /// ZooKeeper.
    ZooKeeper,
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    MySql,
    /// etcd.
    Etcd,
}

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
#[derive(Debug)]
#[non_exhaustive]
pub struct Scheme {
    /// The scheme, as written before `://`.
    pub name: &'static str,
    /// The backend it opens.
    pub kind: BackendKind,
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
}

impl Scheme {
    /// True when this build can open it (its feature is on).
    pub fn is_available(&self) -> bool {
        self.feature.is_none_or(feature_enabled)
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

// With every feature on, each arm is `true`, which clippy would fold into `matches!`.
#[allow(clippy::match_like_matches_macro)]
fn feature_enabled(feature: &str) -> bool {
    match feature {
        "sqlite" => cfg!(feature = "sqlite"),
        "redis" => cfg!(feature = "redis"),
        "zookeeper" => cfg!(feature = "zookeeper"),
        "etcd" => cfg!(feature = "etcd"),
        "postgres" => cfg!(feature = "postgres"),
        "mysql" => cfg!(feature = "mysql"),
        _ => false,
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

const FAIR: UrlOption = UrlOption {
    key: "fair",
    values: "true|false",
    meaning: "serve waiters in arrival order (true, the default) or first to ask",
};

const SPIN: UrlOption = UrlOption {
    key: "spin",
    values: "true|false",
    meaning: "waiters poll with backoff instead of waiting for pub/sub (false)",
};

const REDIS_OPTIONS: &[UrlOption] = &[
    FAIR,
    SPIN,
    UrlOption {
        key: "ca",
        values: "PATH",
        meaning: "the PEM file of the certificate authority a TLS server is checked against",
    },
];

const REDIS_SENTINEL_OPTIONS: &[UrlOption] = &[
    FAIR,
    SPIN,
    UrlOption {
        key: "sentinel_user",
        values: "NAME",
        meaning: "the user distlock logs in to the sentinels as (default; the URL's user info \
                  is the master's)",
    },
    UrlOption {
        key: "sentinel_password",
        values: "SECRET",
        meaning: "the sentinels' own password (none), percent-encoded; never shown",
    },
];

const REDIS_DRIVER: &[&str] = &["protocol"];

const REDLOCK_OPTIONS: &[UrlOption] = &[
    UrlOption {
        key: "request_timeout",
        values: "250ms|1s",
        meaning: "how long one master may take to answer one request, 1 ms to 10 s (250ms); \
                  far below the lease",
    },
    UrlOption {
        key: "clock_drift",
        values: "0..0.5",
        meaning: "the share of a lease a master's clock may run fast by: each master keeps a \
                  lock lease x (1 + clock_drift) + 2 ms (0.01)",
    },
    UrlOption {
        key: "tls",
        values: "true|false",
        meaning: "talk TLS to every master (rediss://), their certificates checked against \
                  the system's roots or ca= (false; ca= turns it on)",
    },
    UrlOption {
        key: "ca",
        values: "PATH",
        meaning: "the PEM file of the certificate authority the masters' certificates are \
                  checked against",
    },
];

const ZK_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "session_timeout",
    values: "10s|2500ms",
    meaning: "the session timeout asked of the server, 1 s to 1 h (10 s)",
}];

const ETCD_OPTIONS: &[UrlOption] = &[
    UrlOption {
        key: "lease_ttl",
        values: "10s",
        meaning: "the TTL of the client's etcd lease, which frees a crashed holder's locks, \
                  2 s to 1 h, rounded up to whole seconds (10 s)",
    },
    UrlOption {
        key: "watch",
        values: "now|etcd",
        meaning: "how a waiter watches the key before its own: from now, synced at once \
                  (now, the default), or from a revision as etcd's concurrency.Mutex does, \
                  which the server serves every 100 ms (etcd, for comparison)",
    },
    UrlOption {
        key: "tls",
        values: "true|false",
        meaning: "talk to the servers over TLS, their certificates checked against the \
                  system's roots or ca= (false; ca=, cert= and key= turn it on)",
    },
    UrlOption {
        key: "ca",
        values: "PATH",
        meaning: "the PEM file of the certificate authority the servers' certificates are \
                  checked against",
    },
    UrlOption {
        key: "cert",
        values: "PATH",
        meaning: "the PEM file of the client certificate to present (with key=), for a \
                  cluster started with --client-cert-auth",
    },
    UrlOption {
        key: "key",
        values: "PATH",
        meaning: "the PEM file of the client certificate's private key (with cert=)",
    },
];

const SQL_DRIVER_COMMON: [&str; 10] = [
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

/// sqlx's PostgreSQL keys, and libpq's that sqlx accepts without acting on them (it logs a
/// warning): URLs shared with libpq-based tools (`DATABASE_URL`) carry them.
const POSTGRES_DRIVER: &[&str] = &concat_keys::<10, 26, 36>(
    SQL_DRIVER_COMMON,
    [
        "sslrootcert",
        "ssl-root-cert",
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "application_name",
        "channel_binding",
        "target_session_attrs",
        "gssencmode",
        "sslcrl",
        "sslpassword",
        "sslsni",
        "requiressl",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "fallback_application_name",
        "krbsrvname",
        "load_balance_hosts",
        "client_encoding",
        "service",
    ],
);

const MYSQL_DRIVER: &[&str] = &concat_keys::<10, 6, 16>(
    SQL_DRIVER_COMMON,
    [
        "sslca",
        "charset",
        "collation",
        "socket",
        "timezone",
        "time-zone",
    ],
);

const fn concat_keys<const A: usize, const B: usize, const C: usize>(
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

const POSTGRES_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "mode",
    values: "advisory|table|transaction",
    meaning: "session advisory locks (advisory, the default), a lock table with leases, or \
              transaction-scoped advisory locks for a pooler in transaction mode (transaction)",
}];

const MYSQL_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "mode",
    values: "named|table",
    meaning: "named locks, GET_LOCK (named, the default) or a lock table with leases",
}];

const SQLITE_OPTIONS: &[UrlOption] = &[
    UrlOption {
        key: "busy_timeout_ms",
        values: "1..600000",
        meaning: "how long a statement waits for the file's write lock (5000)",
    },
    FAIR,
];

/// Every scheme distlock knows, in the order help lists them.
pub const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "memory",
        kind: BackendKind::Memory,
        feature: None,
        example: "memory://",
        options: &[],
        driver_options: &[],
        process_local: true,
        session_lease: None,
        default_port: None,
        routable: false,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "sqlite",
        kind: BackendKind::Sqlite,
        feature: Some("sqlite"),
        example: "sqlite:///var/lib/app/locks.db",
        options: SQLITE_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: None,
        default_port: None,
        routable: false,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "redis",
        kind: BackendKind::Redis,
        feature: Some("redis"),
        example: "redis://127.0.0.1:6379/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "rediss",
        kind: BackendKind::Redis,
        feature: Some("redis"),
        example: "rediss://cache.internal:6379/?ca=/etc/ssl/ca.pem",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: false,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "redis+spin",
        kind: BackendKind::Redis,
        feature: Some("redis"),
        example: "redis+spin://127.0.0.1:6379/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "redis+sentinel",
        kind: BackendKind::Redis,
        feature: Some("redis"),
        example: "redis+sentinel://s1:26379,s2:26379/mymaster",
        options: REDIS_SENTINEL_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(26379),
        routable: false,
        herd_variant: None,
        overlap_limit: Some(
            "asynchronous replication: a failover may grant the lock again (docs/backends/redis.md#safety-limits)",
        ),
    },
    Scheme {
        name: "redis+cluster",
        kind: BackendKind::Redis,
        feature: Some("redis"),
        example: "redis+cluster://n1:7000,n2:7001/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: false,
        herd_variant: None,
        overlap_limit: Some(
            "asynchronous replication: a shard's failover may grant the lock again (docs/backends/redis.md#safety-limits)",
        ),
    },
    Scheme {
        name: "redlock",
        kind: BackendKind::Redlock,
        feature: Some("redis"),
        example: "redlock://r1:6379,r2:6379,r3:6379/",
        options: REDLOCK_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "zk",
        kind: BackendKind::ZooKeeper,
        feature: Some("zookeeper"),
        example: "zk://127.0.0.1:2181/distlock/locks",
        options: ZK_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("session_timeout"),
        default_port: Some(2181),
        routable: true,
        herd_variant: Some("zk+naive"),
        overlap_limit: None,
    },
    Scheme {
        name: "zk+naive",
        kind: BackendKind::ZooKeeper,
        feature: Some("zookeeper"),
        example: "zk+naive://127.0.0.1:2181/",
        options: ZK_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("session_timeout"),
        default_port: Some(2181),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "postgres",
        kind: BackendKind::Postgres,
        feature: Some("postgres"),
        example: "postgres://user:password@127.0.0.1:5432/db",
        options: POSTGRES_OPTIONS,
        driver_options: POSTGRES_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(5432),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "postgresql",
        kind: BackendKind::Postgres,
        feature: Some("postgres"),
        example: "postgresql://user@127.0.0.1/db?mode=table",
        options: POSTGRES_OPTIONS,
        driver_options: POSTGRES_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(5432),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "mysql",
        kind: BackendKind::MySql,
        feature: Some("mysql"),
        example: "mysql://root@127.0.0.1:3306/db",
        options: MYSQL_OPTIONS,
        driver_options: MYSQL_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(3306),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "mariadb",
        kind: BackendKind::MySql,
        feature: Some("mysql"),
        example: "mariadb://root@127.0.0.1:3306/db?mode=table",
        options: MYSQL_OPTIONS,
        driver_options: MYSQL_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(3306),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
    Scheme {
        name: "etcd",
        kind: BackendKind::Etcd,
        feature: Some("etcd"),
        example: "etcd://127.0.0.1:2379/",
        options: ETCD_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("lease_ttl"),
        default_port: Some(2379),
        routable: true,
        herd_variant: None,
        overlap_limit: None,
    },
];

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

#[cfg(any(feature = "zookeeper", feature = "etcd"))]
mod credentials;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
mod hosts;
mod query;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
pub(crate) use credentials::Credentials;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
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
