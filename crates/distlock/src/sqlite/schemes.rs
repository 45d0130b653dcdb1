//! The URL schemes of the SQLite backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, FAIR, Scheme, UrlOption};

const SQLITE_OPTIONS: &[UrlOption] = &[
    UrlOption {
        key: "busy_timeout_ms",
        values: "1..600000",
        meaning: "how long a statement waits for the file's write lock (5000)",
    },
    FAIR,
];

/// The demo's table lock: in the demo's SQLite file, beside the stock.
const SQLITE_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "table-lock",
    description: "distlock's SQLite table-record lock",
    server: None,
    query: None,
    stock_on_server: true,
}];

/// The schemes of the SQLite backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "sqlite",
        driver: crate::driver::compiled!("sqlite", crate::sqlite::DRIVER),
        feature: Some("sqlite"),
        example: "sqlite:///var/lib/app/locks.db",
        options: SQLITE_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: None,
        default_port: None,
        routable: false,
        herd_variant: None,
        demo: SQLITE_DEMO,
        overlap_limit: None,
    },
];
