//! The URL scheme of the NATS JetStream backend: its row of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::{DemoLock, DemoServer, Scheme, UrlOption};

const NATS_OPTIONS: &[UrlOption] = &[
    UrlOption {
        key: "replicas",
        values: "1..5",
        meaning: "the replicas of the bucket's stream when distlock creates the bucket (1); \
                  3 on a JetStream cluster survives the loss of a server",
    },
    UrlOption {
        key: "token",
        values: "SECRET",
        meaning: "log in with the server's authorization token, percent-encoded; never shown",
    },
    UrlOption {
        key: "creds",
        values: "PATH",
        meaning: "log in with a credentials file (a user JWT and its NKey seed)",
    },
    UrlOption {
        key: "tls",
        values: "true|false",
        meaning: "talk TLS to the servers, their certificates checked against the system's \
                  roots or ca= (false; ca=, cert= and key= turn it on)",
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
        meaning: "the PEM file of the client certificate to present (with key=)",
    },
    UrlOption {
        key: "key",
        values: "PATH",
        meaning: "the PEM file of the client certificate's private key (with cert=)",
    },
];

const NATS_SERVER: DemoServer = DemoServer {
    flag: "nats",
    what: "the NATS JetStream servers",
    default: "nats://127.0.0.1:4222/",
    tests: &crate::servers::NATS,
};

/// The demo's NATS lock.
const NATS_DEMO: &[DemoLock] = &[DemoLock {
    strategy: "nats",
    description: "distlock's NATS JetStream key-value lock",
    server: Some(&NATS_SERVER),
    query: None,
    stock_on_server: false,
}];

/// The schemes of the NATS backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[Scheme {
    name: "nats",
    driver: crate::driver::compiled!("nats", crate::nats::DRIVER),
    feature: Some("nats"),
    example: "nats://127.0.0.1:4222/distlock",
    options: NATS_OPTIONS,
    driver_options: &[],
    process_local: false,
    session_lease: None,
    default_port: Some(4222),
    routable: true,
    herd_variant: None,
    demo: NATS_DEMO,
    overlap_limit: None,
}];
