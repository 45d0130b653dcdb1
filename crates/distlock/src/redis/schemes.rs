//! The URL schemes of the Redis backend (standalone, TLS, Sentinel, Cluster) and Redlock: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, FAIR, SPIN, Scheme, UrlOption};

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

const REDIS_SERVER: DemoServer = DemoServer {
    flag: "redis",
    what: "the Redis server",
    default: "redis://127.0.0.1:6379/",
    tests: &crate::servers::REDIS,
};

/// The demo's Redis locks: the reentrant lock, and the spin lock on the same server.
const REDIS_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "redis",
    description: "distlock's Redis reentrant lock",
    server: Some(&REDIS_SERVER),
    query: None,
    stock_on_server: false,
}, DemoLock {
    strategy: "redis-spin",
    description: "distlock's Redis spin lock",
    server: Some(&REDIS_SERVER),
    query: Some("spin=true"),
    stock_on_server: false,
}];

const REDLOCK_SERVER: DemoServer = DemoServer {
    flag: "redlock",
    what: "the independent Redis masters",
    default: "redlock://127.0.0.1:6400,127.0.0.1:6401,127.0.0.1:6402/",
    tests: &crate::servers::REDLOCK,
};

/// The demo's Redlock, over its own masters.
const REDLOCK_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "redlock",
    description: "distlock's Redlock over independent Redis masters",
    server: Some(&REDLOCK_SERVER),
    query: None,
    stock_on_server: false,
}];

/// The schemes of the Redis backend (standalone, TLS, Sentinel, Cluster) and Redlock, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "redis",
        driver: crate::driver::compiled!("redis", crate::redis::DRIVER),
        feature: Some("redis"),
        example: "redis://127.0.0.1:6379/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        demo: REDIS_DEMO,
        overlap_limit: None,
    },
    Scheme {
        name: "rediss",
        driver: crate::driver::compiled!("redis", crate::redis::DRIVER),
        feature: Some("redis"),
        example: "rediss://cache.internal:6379/?ca=/etc/ssl/ca.pem",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: false,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
    Scheme {
        name: "redis+spin",
        driver: crate::driver::compiled!("redis", crate::redis::DRIVER),
        feature: Some("redis"),
        example: "redis+spin://127.0.0.1:6379/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
    Scheme {
        name: "redis+sentinel",
        driver: crate::driver::compiled!("redis", crate::redis::DRIVER),
        feature: Some("redis"),
        example: "redis+sentinel://s1:26379,s2:26379/mymaster",
        options: REDIS_SENTINEL_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(26379),
        routable: false,
        herd_variant: None,
        demo: &[],
        overlap_limit: Some(
            "asynchronous replication: a failover may grant the lock again (docs/backends/redis.md#safety-limits)",
        ),
    },
    Scheme {
        name: "redis+cluster",
        driver: crate::driver::compiled!("redis", crate::redis::DRIVER),
        feature: Some("redis"),
        example: "redis+cluster://n1:7000,n2:7001/",
        options: REDIS_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: false,
        herd_variant: None,
        demo: &[],
        overlap_limit: Some(
            "asynchronous replication: a shard's failover may grant the lock again (docs/backends/redis.md#safety-limits)",
        ),
    },
    Scheme {
        name: "redlock",
        driver: crate::driver::compiled!("redis", crate::redis::redlock::DRIVER),
        feature: Some("redis"),
        example: "redlock://r1:6379,r2:6379,r3:6379/",
        options: REDLOCK_OPTIONS,
        driver_options: REDIS_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(6379),
        routable: true,
        herd_variant: None,
        demo: REDLOCK_DEMO,
        overlap_limit: None,
    },
];
