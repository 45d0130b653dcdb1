//! The URL schemes of the in-process backend: its rows of the registry, compiled with or
//! without the backend, so that a URL of a build without it says which feature would
//! compile it in.

use crate::scheme::Scheme;

/// The schemes of the in-process backend, in the order help lists them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "memory",
        driver: Some(&crate::memory::DRIVER),
        feature: None,
        example: "memory://",
        options: &[],
        driver_options: &[],
        process_local: true,
        session_lease: None,
        default_port: None,
        routable: false,
        herd_variant: None,
        demo: &[],
        overlap_limit: None,
    },
];
