//! The URL schemes of the MySQL/MariaDB backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{SQL_DRIVER_COMMON, concat_keys, Scheme, UrlOption};

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
        overlap_limit: None,
    },
];
