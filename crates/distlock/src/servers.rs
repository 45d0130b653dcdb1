//! The servers the tests run against (published as `distlock::conformance::servers`): each
//! with the environment variable that overrides its URL, the URL `scripts/test` starts it at,
//! and a probe. A module of its own, below every backend, so that a backend's unit tests can
//! name their server without reaching up to the conformance suite.

/// The command that starts every server the tests use.
pub const START_COMMAND: &str = "scripts/test --servers-only";

/// A server (or a group of servers) the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// What it is, for messages.
    pub what: &'static str,
    /// The environment variable that overrides its URL.
    pub variable: &'static str,
    /// Its URL when the variable is unset: where `scripts/test` starts it.
    pub default: &'static str,
}

/// The standalone Redis server.
pub const REDIS: Server = Server {
    what: "Redis",
    variable: "DISTLOCK_REDIS_URL",
    default: "redis://127.0.0.1:6379/",
};

/// The Redis Sentinel group (master, replica, three sentinels).
pub const REDIS_SENTINEL: Server = Server {
    what: "the Redis Sentinel group",
    variable: "DISTLOCK_REDIS_SENTINEL_URL",
    default: "redis+sentinel://127.0.0.1:6382,127.0.0.1:6383,127.0.0.1:6384/distlock",
};

/// The 3-master Redis Cluster.
pub const REDIS_CLUSTER: Server = Server {
    what: "the Redis Cluster",
    variable: "DISTLOCK_REDIS_CLUSTER_URL",
    default: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002/",
};

/// The TLS-only Redis server, trusted through its own CA.
pub const REDIS_TLS: Server = Server {
    what: "the TLS Redis server",
    variable: "DISTLOCK_REDIS_TLS_URL",
    default: "rediss://127.0.0.1:6390/?ca=/tmp/distlock-redis/tls/ca.pem",
};

/// The Redis server that requires a password, with the users of `scripts/redis-acl.conf`:
/// its URL is the administrator's (`distlock`, every right); `app` and `tenant` have only what
/// distlock's locks need, on their keys.
pub const REDIS_ACL: Server = Server {
    what: "the Redis server that requires a password",
    variable: "DISTLOCK_REDIS_ACL_URL",
    default: "redis://distlock:distlock-pw@127.0.0.1:6391/",
};

/// A Sentinel group whose master and replica require the users of
/// `scripts/redis-acl.conf` and whose sentinels require a password of their own
/// (`scripts/redis-deployment sentinel-acl`): its URL logs in to the master as the
/// administrator (`distlock`) and to the sentinels with `sentinel_password=`.
pub const REDIS_SENTINEL_ACL: Server = Server {
    what: "the Redis Sentinel group that requires passwords",
    variable: "DISTLOCK_REDIS_SENTINEL_ACL_URL",
    default: "redis+sentinel://distlock:distlock-pw@127.0.0.1:6422,127.0.0.1:6423,127.0.0.1:6424/distlock?sentinel_password=sentinel-pw",
};

/// A 3-master Cluster whose nodes require the users of `scripts/redis-acl.conf`
/// (`scripts/redis-deployment cluster-acl`): its URL is the administrator's (`distlock`).
pub const REDIS_CLUSTER_ACL: Server = Server {
    what: "the Redis Cluster that requires a password",
    variable: "DISTLOCK_REDIS_CLUSTER_ACL_URL",
    default: "redis+cluster://distlock:distlock-pw@127.0.0.1:7010,127.0.0.1:7011,127.0.0.1:7012/",
};

/// Three independent Redis masters, for Redlock.
pub const REDLOCK: Server = Server {
    what: "the Redlock masters",
    variable: "DISTLOCK_REDLOCK_URL",
    default: "redlock://127.0.0.1:6400,127.0.0.1:6401,127.0.0.1:6402/",
};

/// Three independent masters that speak only TLS and take a password
/// (`scripts/redis-deployment redlock-tls`), for a Redlock of `rediss://` masters.
pub const REDLOCK_TLS: Server = Server {
    what: "the Redlock masters that require TLS and a password",
    variable: "DISTLOCK_REDLOCK_TLS_URL",
    default: "redlock://:redlock-pw@127.0.0.1:6410,127.0.0.1:6411,127.0.0.1:6412/?ca=/tmp/distlock-redis/redlock-tls/ca.pem",
};

/// The standalone ZooKeeper server.
pub const ZOOKEEPER: Server = Server {
    what: "ZooKeeper",
    variable: "DISTLOCK_ZK_URL",
    default: "zk://127.0.0.1:2181/",
};

/// The 3-node ZooKeeper ensemble.
pub const ZOOKEEPER_ENSEMBLE: Server = Server {
    what: "the ZooKeeper ensemble",
    variable: "DISTLOCK_ZK_ENSEMBLE_URL",
    default: "zk://127.0.0.1:2190,127.0.0.1:2191,127.0.0.1:2192/",
};

/// The standalone etcd server.
pub const ETCD: Server = Server {
    what: "etcd",
    variable: "DISTLOCK_ETCD_URL",
    default: "etcd://127.0.0.1:2379/",
};

/// The 3-member etcd cluster.
pub const ETCD_CLUSTER: Server = Server {
    what: "the etcd cluster",
    variable: "DISTLOCK_ETCD_CLUSTER_URL",
    default: "etcd://127.0.0.1:2381,127.0.0.1:2382,127.0.0.1:2383/",
};

/// The etcd member that takes only TLS with a client certificate and has authentication on
/// (`scripts/etcd-deployment secured`): the user `app`, its prefix `distlock/`, the CA that
/// signed the member's certificate, and the client certificate.
pub const ETCD_SECURED: Server = Server {
    what: "the etcd member that requires TLS, a client certificate and a password",
    variable: "DISTLOCK_ETCD_SECURED_URL",
    default: "etcd://app:app-pw@127.0.0.1:2389/distlock/?ca=/tmp/distlock-etcd/secured/ca.pem&cert=/tmp/distlock-etcd/secured/client.pem&key=/tmp/distlock-etcd/secured/client-key.pem",
};

/// The PostgreSQL database.
pub const POSTGRES: Server = Server {
    what: "PostgreSQL",
    variable: "DISTLOCK_POSTGRES_URL",
    default: "postgres://postgres:postgres@127.0.0.1:5432/test",
};

/// A PostgreSQL server of its own that takes only TLS connections with a SCRAM password
/// (`scripts/postgres-deployment secured`): the role `app`, the database `test`, and the CA
/// that signed its certificate.
pub const POSTGRES_SECURED: Server = Server {
    what: "the PostgreSQL server that requires TLS and a password",
    variable: "DISTLOCK_POSTGRES_SECURED_URL",
    default: "postgres://app:app-pw@127.0.0.1:5433/test?sslmode=verify-full&sslrootcert=/tmp/distlock-pg-secured/ca.pem",
};

/// PgBouncer in transaction mode in front of [`POSTGRES`], for `?mode=transaction`.
pub const PGBOUNCER: Server = Server {
    what: "PgBouncer (transaction mode)",
    variable: "DISTLOCK_PGBOUNCER_URL",
    default: "postgres://postgres:postgres@127.0.0.1:6432/test",
};

/// The MySQL/MariaDB database.
pub const MYSQL: Server = Server {
    what: "MySQL/MariaDB",
    variable: "DISTLOCK_MYSQL_URL",
    default: "mysql://root@127.0.0.1:3306/test",
};

/// A MariaDB server of its own that takes only TLS connections with a password
/// (`scripts/mariadb-deployment secured`): the user `app`, the database `test`, and the CA that
/// signed its certificate.
pub const MYSQL_SECURED: Server = Server {
    what: "the MariaDB server that requires TLS and a password",
    variable: "DISTLOCK_MYSQL_SECURED_URL",
    default: "mysql://app:app-pw@127.0.0.1:3307/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=/tmp/distlock-mariadb-secured/ca.pem",
};

/// The NATS server with JetStream.
pub const NATS: Server = Server {
    what: "NATS with JetStream",
    variable: "DISTLOCK_NATS_URL",
    default: "nats://127.0.0.1:4222/distlock-tests",
};

/// Every server above.
pub const ALL: &[Server] = &[
    REDIS,
    REDIS_SENTINEL,
    REDIS_CLUSTER,
    REDIS_TLS,
    REDIS_ACL,
    REDIS_SENTINEL_ACL,
    REDIS_CLUSTER_ACL,
    REDLOCK,
    REDLOCK_TLS,
    ZOOKEEPER,
    ZOOKEEPER_ENSEMBLE,
    ETCD,
    ETCD_CLUSTER,
    ETCD_SECURED,
    POSTGRES,
    POSTGRES_SECURED,
    PGBOUNCER,
    MYSQL,
    MYSQL_SECURED,
    NATS,
];

impl Server {
    /// The URL without the probe: the variable's value, or the default.
    pub fn configured_url(&self) -> String {
        std::env::var(self.variable).unwrap_or_else(|_| self.default.to_owned())
    }

    /// The URL, after checking that its first server accepts a TCP connection.
    ///
    /// # Panics
    /// When it does not, naming the address and the command that starts it: a test whose
    /// server is missing fails, never skips.
    pub fn url(&self) -> String {
        let url = self.configured_url();
        let address = first_address(&url);
        if std::net::TcpStream::connect(address).is_err() {
            panic!(
                "{} is not reachable at {address} ({}); start it with `{START_COMMAND}` \
                 or point {} at a running one",
                self.what,
                crate::redact::shown(&url),
                self.variable
            );
        }
        url
    }
}

/// The `host:port` of the first server a URL names (after any user info, before the path).
pub fn first_address(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts = authority.rsplit('@').next().unwrap_or_default();
    hosts.split(',').next().unwrap_or_default()
}

/// `url` with its scheme replaced by `scheme`.
pub fn with_scheme(url: &str, scheme: &str) -> String {
    match url.split_once("://") {
        Some((_, rest)) => format!("{scheme}://{rest}"),
        None => url.to_owned(),
    }
}

/// `url` with `pair` (`key=value`) added to its query.
pub fn with_query(url: &str, pair: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{pair}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_taken_apart_and_extended() {
        assert_eq!(first_address(REDIS.default), "127.0.0.1:6379");
        assert_eq!(first_address(REDIS_SENTINEL.default), "127.0.0.1:6382");
        assert_eq!(first_address(POSTGRES.default), "127.0.0.1:5432");
        assert_eq!(first_address(MYSQL.default), "127.0.0.1:3306");
        assert_eq!(first_address(REDIS_TLS.default), "127.0.0.1:6390");
        assert_eq!(first_address(REDIS_ACL.default), "127.0.0.1:6391");
        assert_eq!(first_address(ETCD_CLUSTER.default), "127.0.0.1:2381");
        assert_eq!(
            with_scheme(REDIS.default, "redis+spin"),
            "redis+spin://127.0.0.1:6379/"
        );
        assert_eq!(
            with_query(REDIS_TLS.default, "fair=false"),
            "rediss://127.0.0.1:6390/?ca=/tmp/distlock-redis/tls/ca.pem&fair=false"
        );
        assert_eq!(
            with_query(MYSQL.default, "mode=table"),
            "mysql://root@127.0.0.1:3306/test?mode=table"
        );
    }
}
