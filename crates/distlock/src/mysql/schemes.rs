//! The URL schemes of the MySQL/MariaDB backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, SQL_DRIVER_COMMON, concat_keys, Scheme, UrlOption};

const MYSQL_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "mode",
    values: "named|table",
    meaning: "named locks, GET_LOCK (named, the default) or a lock table with leases",
}];

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

const MYSQL_SERVER: DemoServer = DemoServer {
    flag: "mysql",
    what: "the MySQL/MariaDB database",
    default: "mysql://root@127.0.0.1:3306/test",
    tests: &crate::servers::MYSQL,
};

/// The demo's named lock, with the stock in the same database.
const MYSQL_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "mysql-named",
    description: "distlock's MySQL named lock around a committed transaction",
    server: Some(&MYSQL_SERVER),
    query: None,
    stock_on_server: true,
}];

/// The schemes of the MySQL/MariaDB backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "mysql",
        driver: crate::driver::compiled!("mysql", crate::mysql::DRIVER),
        feature: Some("mysql"),
        example: "mysql://root@127.0.0.1:3306/db",
        options: MYSQL_OPTIONS,
        driver_options: MYSQL_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(3306),
        routable: true,
        herd_variant: None,
        demo: MYSQL_DEMO,
        overlap_limit: None,
    },
    Scheme {
        name: "mariadb",
        driver: crate::driver::compiled!("mysql", crate::mysql::DRIVER),
        feature: Some("mysql"),
        example: "mariadb://root@127.0.0.1:3306/db?mode=table",
        options: MYSQL_OPTIONS,
        driver_options: MYSQL_DRIVER,
        process_local: false,
        session_lease: None,
        default_port: Some(3306),
        routable: true,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
];
