//! The URL schemes of the ZooKeeper backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, Scheme, UrlOption};

const ZK_OPTIONS: &[UrlOption] = &[UrlOption {
    key: "session_timeout",
    values: "10s|2500ms",
    meaning: "the session timeout asked of the server, 1 s to 1 h (10 s)",
}];

const ZOOKEEPER_SERVER: DemoServer = DemoServer {
    flag: "zookeeper",
    what: "the ZooKeeper ensemble",
    default: "zk://127.0.0.1:2181/",
    tests: &crate::servers::ZOOKEEPER,
};

/// The demo's ZooKeeper lock.
const ZOOKEEPER_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "zookeeper",
    description: "distlock's ZooKeeper sequential-node lock",
    server: Some(&ZOOKEEPER_SERVER),
    query: None,
    stock_on_server: false,
}];

/// The schemes of the ZooKeeper backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "zk",
        driver: crate::driver::compiled!("zookeeper", crate::zookeeper::DRIVER),
        feature: Some("zookeeper"),
        example: "zk://127.0.0.1:2181/distlock/locks",
        options: ZK_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("session_timeout"),
        default_port: Some(2181),
        routable: true,
        herd_variant: Some("zk+naive"),
        demo: ZOOKEEPER_DEMO,
        overlap_limit: None,
    },
    Scheme {
        name: "zk+naive",
        driver: crate::driver::compiled!("zookeeper", crate::zookeeper::DRIVER),
        feature: Some("zookeeper"),
        example: "zk+naive://127.0.0.1:2181/",
        options: ZK_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("session_timeout"),
        default_port: Some(2181),
        routable: true,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
];
