//! The URL schemes of the PostgreSQL backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, SQL_DRIVER_COMMON, concat_keys, Scheme, UrlOption};

const POSTGRES_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "mode",
    values: "advisory|table|transaction",
    meaning: "session advisory locks (advisory, the default), a lock table with leases, or \
              transaction-scoped advisory locks for a pooler in transaction mode (transaction)",
}];

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

const POSTGRES_SERVER: DemoServer = DemoServer {
    flag: "postgres",
    what: "the PostgreSQL database",
    default: "postgres://postgres:postgres@127.0.0.1:5432/test",
    tests: &crate::servers::POSTGRES,
};

/// The demo's advisory lock, with the stock in the same database.
const POSTGRES_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "pg-advisory",
    description: "distlock's PostgreSQL advisory lock around a committed transaction",
    server: Some(&POSTGRES_SERVER),
    query: None,
    stock_on_server: true,
}];

/// The schemes of the PostgreSQL backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "postgres",
        driver: crate::driver::compiled!("postgres", crate::postgres::DRIVER),
        feature: Some("postgres"),
        example: "postgres://user:password@127.0.0.1:5432/db",
        options: POSTGRES_OPTIONS,
        driver_options: POSTGRES_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(5432),
        routable: true,
        herd_variant: None,
        demo: POSTGRES_DEMO,
        overlap_limit: None,
    },
    Scheme {
        name: "postgresql",
        driver: crate::driver::compiled!("postgres", crate::postgres::DRIVER),
        feature: Some("postgres"),
        example: "postgresql://user@127.0.0.1/db?mode=table",
        options: POSTGRES_OPTIONS,
        driver_options: POSTGRES_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(5432),
        routable: true,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
];
