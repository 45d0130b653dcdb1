//! The library's integration tests, in one test binary with a module per backend or subject
//! (one link of sqlx, redis, tonic and the ZooKeeper client instead of one per file). Each
//! module is compiled when the features it needs are on; the whole suite needs them all:
//!
//! ```sh
//! cargo nextest run -p distlock --all-features        # the suite, with the servers of
//! cargo test -p distlock --all-features --test suite  # `scripts/test --servers-only` running
//! ```
//!
//! Without `--all-features` only the modules whose features are on are built: plain `cargo
//! test` runs the `#[locked]` cases, the SQLite set-up and the structure checks of the
//! default features.
//!
//! Two tests are binaries of their own: the compile-error cases of `#[distlock::locked]`
//! (`tests/locked_ui.rs`, which trybuild builds in a target directory of its own) and the
//! metrics (`tests/metrics.rs`, which installs the process's one global recorder).

#[cfg(feature = "conformance")]
mod common;

#[cfg(feature = "conformance")]
mod conformance;
#[cfg(feature = "macros")]
mod locked;
#[cfg(feature = "sqlite")]
mod sqlite_setup;
mod structure;

#[cfg(all(feature = "etcd", feature = "conformance", feature = "bench"))]
mod etcd;

#[cfg(all(feature = "etcd", feature = "conformance"))]
mod etcd_secured;

#[cfg(all(any(feature = "mysql", feature = "postgres"), feature = "conformance"))]
mod killed_session;
#[cfg(all(feature = "mysql", feature = "conformance"))]
mod mysql;
#[cfg(all(feature = "postgres", feature = "conformance"))]
mod postgres;
#[cfg(all(feature = "postgres", feature = "conformance"))]
mod postgres_pooled;
#[cfg(all(feature = "postgres", feature = "conformance"))]
mod postgres_secured;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "conformance"))]
mod sql_tokens;

#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_acl;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_cluster_faults;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_failover;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_handover;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_rwlock;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis_tls;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redlock;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redlock_faults;

#[cfg(all(
    feature = "sqlite",
    feature = "redis",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql",
    feature = "conformance"
))]
mod stock;
#[cfg(all(feature = "sqlite", feature = "redis", feature = "conformance"))]
mod stock_cancel;

#[cfg(all(feature = "zookeeper", feature = "conformance"))]
mod zookeeper;
#[cfg(all(feature = "zookeeper", feature = "conformance"))]
mod zookeeper_curator;
#[cfg(all(feature = "zookeeper", feature = "conformance"))]
mod zookeeper_digest;
#[cfg(all(feature = "zookeeper", feature = "conformance"))]
mod zookeeper_own_ensemble;

#[cfg(any(
    all(feature = "zookeeper", feature = "conformance"),
    all(feature = "etcd", feature = "conformance", feature = "bench")
))]
mod own_cluster;
#[cfg(all(feature = "zookeeper", feature = "conformance", feature = "bench"))]
mod zookeeper_wakeups;
