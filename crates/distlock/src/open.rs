//! Opening a backend by URL: the one place that maps a scheme's [`BackendKind`] to the
//! backend module that checks and opens it. Everything else asks [`crate::scheme`].

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::scheme::{BackendKind, Scheme, connect_timeout, of_url};

/// Checks `url` as [`connect`](crate::connect) would, without connecting: its scheme, the
/// keys and values of its query, and the backend's own form (hosts, ports, paths). For a
/// command line or a configuration check that should fail before anything starts.
///
/// ```
/// let scheme = distlock::validate_url("redis://127.0.0.1:6379/?fair=false").unwrap();
/// assert_eq!(scheme.name, "redis");
/// let err = distlock::validate_url("redis://127.0.0.1/?fare=false").unwrap_err();
/// assert!(err.is_invalid_input());
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] saying what is wrong and what is accepted;
/// [`Error::FeatureDisabled`] as [`connect`](crate::connect).
pub fn validate_url(url: &str) -> Result<&'static Scheme> {
    let (scheme, _) = of_url(url)?;
    connect_timeout(url)?;
    match scheme.kind {
        BackendKind::Memory => {}
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => {
            crate::sqlite::check_url(url)?;
        }
        #[cfg(feature = "redis")]
        BackendKind::Redis => {
            crate::redis::deployment::check_url(url)?;
        }
        #[cfg(feature = "redis")]
        BackendKind::Redlock => {
            crate::redis::redlock::check_url(url)?;
        }
        #[cfg(feature = "zookeeper")]
        BackendKind::ZooKeeper => {
            crate::zookeeper::check_url(url)?;
        }
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => {
            crate::postgres::check_url(url)?;
        }
        #[cfg(feature = "mysql")]
        BackendKind::MySql => {
            crate::mysql::check_url(url)?;
        }
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => {
            crate::etcd::check_url(url)?;
        }
        #[allow(unreachable_patterns)]
        _ => {
            return Err(Error::FeatureDisabled {
                scheme: scheme.name.into(),
                feature: scheme.feature.unwrap_or_default(),
            });
        }
    }
    Ok(scheme)
}

/// Opens the backend a URL names, without a client around it: for wrappers such as
/// [`FaultyBackend`](crate::fault::FaultyBackend), then handed to
/// [`Locks::with_backend`](crate::Locks::with_backend).
///
/// # Errors
/// As [`connect`](crate::connect).
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    let (scheme, _) = of_url(url)?;
    let limit = connect_timeout(url)?;
    match tokio::time::timeout(limit, open_scheme(scheme, url)).await {
        Ok(opened) => opened,
        // Dropping a connect midway leaves no lock: it has taken none yet.
        Err(_) => Err(Error::backend(
            scheme.name,
            "connect",
            format!(
                "no answer within {limit:?} (connect_timeout); check that the server runs and \
                 answers at that address, or raise ?connect_timeout="
            ),
        )),
    }
}

async fn open_scheme(scheme: &'static Scheme, url: &str) -> Result<Arc<dyn Backend>> {
    match scheme.kind {
        BackendKind::Memory => crate::memory::connect(url).await,
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => crate::sqlite::connect(url).await,
        #[cfg(feature = "redis")]
        BackendKind::Redis => crate::redis::connect(url).await,
        #[cfg(feature = "redis")]
        BackendKind::Redlock => crate::redis::redlock::connect(url).await,
        #[cfg(feature = "zookeeper")]
        BackendKind::ZooKeeper => crate::zookeeper::connect(url).await,
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => crate::etcd::connect(url).await,
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => crate::postgres::connect(url).await,
        #[cfg(feature = "mysql")]
        BackendKind::MySql => crate::mysql::connect(url).await,
        #[allow(unreachable_patterns)]
        _ => Err(Error::FeatureDisabled {
            scheme: scheme.name.into(),
            feature: scheme.feature.unwrap_or_default(),
        }),
    }
}
