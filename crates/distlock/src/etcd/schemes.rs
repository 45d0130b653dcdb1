//! The URL schemes of the etcd backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, Scheme, UrlOption};

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

const ETCD_SERVER: DemoServer = DemoServer {
    flag: "etcd",
    what: "the etcd cluster",
    default: "etcd://127.0.0.1:2379/",
    tests: &crate::servers::ETCD,
};

/// The demo's etcd lock.
const ETCD_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "etcd",
    description: "distlock's etcd lock (etcdctl lock's layout)",
    server: Some(&ETCD_SERVER),
    query: None,
    stock_on_server: false,
}];

/// The schemes of the etcd backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "etcd",
        driver: crate::driver::compiled!("etcd", crate::etcd::DRIVER),
        feature: Some("etcd"),
        example: "etcd://127.0.0.1:2379/",
        options: ETCD_OPTIONS,
        driver_options: &[],
        process_local: false,
        session_lease: Some("lease_ttl"),
        default_port: Some(2379),
        routable: true,
        herd_variant: None,
        demo: ETCD_DEMO,
        overlap_limit: None,
    },
];
