//! What a backend gives the registry: the one interface through which code outside a
//! backend's folder checks a URL, opens the backend, and (with the `bench` feature) reaches
//! its measurement baselines. Each backend writes its [`Driver`] in its own folder, and each
//! of its scheme rows (`<backend>/schemes.rs`) names it where the build has the backend.

use std::sync::Arc;
#[cfg(feature = "bench")]
use std::time::Duration;

#[cfg(feature = "bench")]
use async_trait::async_trait;
use futures_util::future::BoxFuture;

use crate::backend::Backend;
use crate::error::Result;

/// Opens a backend from a URL.
pub(crate) type Open = for<'a> fn(&'a str) -> BoxFuture<'a, Result<Arc<dyn Backend>>>;

/// Opens a bare baseline's connection from a URL.
#[cfg(feature = "bench")]
pub(crate) type OpenBare = for<'a> fn(&'a str) -> BoxFuture<'a, Result<Option<BoxedBare>>>;

/// Measures up to `samples` write round trips of the server a URL names.
#[cfg(feature = "bench")]
pub(crate) type MeasureWrites = for<'a> fn(&'a str, u64) -> BoxFuture<'a, Result<Vec<Duration>>>;

/// A backend as the registry sees it.
#[derive(Debug)]
pub(crate) struct Driver {
    /// Checks a URL of one of its schemes without connecting.
    pub(crate) check_url: fn(&str) -> Result<()>,
    /// Opens the backend a URL of one of its schemes names.
    pub(crate) open: Open,
    /// One connection for the bare baselines of `distlock bench --compare` (`None`: the
    /// backend has none; the function answers `None` for a deployment without one).
    #[cfg(feature = "bench")]
    pub(crate) bare: Option<OpenBare>,
    /// Whether a URL of one of its schemes has that baseline, without connecting (not every
    /// deployment has one: Redis Sentinel, Cluster and TLS, a pooler in transaction mode).
    #[cfg(feature = "bench")]
    pub(crate) bare_applies: fn(&str) -> bool,
    /// Up to `samples` round trips (at most 30 s of them) of the replicated write each grant
    /// and release costs, for a backend whose every grant is one (ZooKeeper, etcd).
    #[cfg(feature = "bench")]
    pub(crate) write_round_trips: Option<MeasureWrites>,
}

/// Declares a backend's `DRIVER`: its URL check, the function that
/// opens it, and (optional, used with the `bench` feature) the functions that open its bare
/// baseline and measure its write round trips.
macro_rules! driver {
    (
        check_url: $check:expr,
        open: $open:path
        $(, bare: $bare:path)?
        $(, bare_applies: $applies:path)?
        $(, write_round_trips: $writes:path)?
        $(,)?
    ) => {
        /// The registry's entry for this backend ([`crate::driver`]).
        pub(crate) const DRIVER: $crate::driver::Driver = $crate::driver::Driver {
            check_url: $check,
            open: |url| Box::pin($open(url)),
            #[cfg(feature = "bench")]
            bare: $crate::driver::driver!(@bare $($bare)?),
            #[cfg(feature = "bench")]
            bare_applies: $crate::driver::driver!(@applies $($applies)?),
            #[cfg(feature = "bench")]
            write_round_trips: $crate::driver::driver!(@writes $($writes)?),
        };
    };
    (@bare) => { None };
    (@bare $bare:path) => { Some(|url| Box::pin($bare(url))) };
    (@applies) => { |_| true };
    (@applies $applies:path) => { $applies };
    (@writes) => { None };
    (@writes $writes:path) => { Some(|url, samples| Box::pin($writes(url, samples))) };
}
pub(crate) use driver;

/// A scheme row's driver: `Some(&DRIVER)` where the build has the backend's feature, `None`
/// (the URL then names the feature) where it does not.
macro_rules! compiled {
    ($feature:literal, $driver:path) => {{
        #[cfg(feature = $feature)]
        let driver: Option<&'static $crate::driver::Driver> = Some(&$driver);
        #[cfg(not(feature = $feature))]
        let driver: Option<&'static $crate::driver::Driver> = None;
        driver
    }};
}
pub(crate) use compiled;

/// A bare baseline's connection, boxed.
#[cfg(feature = "bench")]
pub(crate) type BoxedBare = Box<dyn BareConnection>;

/// One connection of a backend's bare baseline: its cheapest round trip and the simplest lock
/// a user could write by hand against it, with the driver distlock uses.
#[cfg(feature = "bench")]
#[async_trait]
pub(crate) trait BareConnection: Send {
    /// What [`round_trip`](Self::round_trip) and [`pair`](Self::pair) send, for reports.
    fn requests(&self) -> (&'static str, &'static str);

    /// One round trip.
    async fn round_trip(&mut self) -> Result<()>;

    /// One lock and unlock of `name`: true when the lock was free.
    async fn pair(&mut self, name: &str) -> Result<bool>;
}

/// Calls `step` until `samples` times are taken or 30 s have passed.
#[cfg(all(feature = "bench", any(feature = "zookeeper", feature = "etcd")))]
pub(crate) async fn sampled<F>(samples: u64, mut step: impl FnMut() -> F) -> Result<Vec<Duration>>
where
    F: Future<Output = Result<Duration>>,
{
    let mut times = Vec::new();
    let start = std::time::Instant::now();
    for _ in 0..samples {
        times.push(step().await?);
        if start.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    Ok(times)
}
