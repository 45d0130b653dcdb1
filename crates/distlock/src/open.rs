//! Opening a backend by URL, through the [`Driver`] its scheme's row names. Nothing here
//! names a scheme; [`crate::scheme`] lists those.

use std::sync::Arc;

use crate::backend::Backend;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::scheme::{Scheme, connect_timeout, of_url};

/// The driver of `scheme`, or the error saying which feature would compile it in.
pub(crate) fn driver(scheme: &'static Scheme) -> Result<&'static Driver> {
    scheme.driver.ok_or_else(|| Error::FeatureDisabled {
        scheme: scheme.name.into(),
        feature: scheme.feature.unwrap_or_default(),
    })
}

/// The scheme of `url` and its driver, the URL checked as [`validate_url`] checks it.
pub(crate) fn checked(url: &str) -> Result<(&'static Scheme, &'static Driver)> {
    let (scheme, _) = of_url(url)?;
    connect_timeout(url)?;
    let driver = driver(scheme)?;
    (driver.check_url)(url)?;
    Ok((scheme, driver))
}

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
    checked(url).map(|(scheme, _)| scheme)
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
    let driver = driver(scheme)?;
    match tokio::time::timeout(limit, (driver.open)(url)).await {
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
