//! The `redlock://` URL: the masters, their credentials and database, and the two options.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::scheme::Query;

/// How long one master may take to answer one request, by default.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(250);
/// The share of a lease allowed for a master's clock running fast, by default.
const DEFAULT_CLOCK_DRIFT: f64 = 0.01;

/// What a `redlock://` URL says.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RedlockUrl {
    /// One `redis://` URL per master, sorted by address, so that every client orders the
    /// masters alike whatever order its URL lists them in.
    pub(super) masters: Vec<String>,
    pub(super) request_timeout: Duration,
    pub(super) clock_drift: f64,
}

fn invalid(reason: impl std::fmt::Display) -> Error {
    Error::invalid(
        "URL",
        format!(
            "{reason}; write redlock://[user:password@]host:port,host:port,host:port[/db]\
             [?request_timeout=250ms&clock_drift=0.01&tls=true&ca=PATH] with an odd number (3 \
             or more) of independent masters"
        ),
    )
}

impl RedlockUrl {
    pub(super) fn parse(url: &str) -> Result<Self> {
        let (base, query) = Query::parse(url)?;
        let request_timeout = query
            .duration(
                "request_timeout",
                Duration::from_millis(1)..=Duration::from_secs(10),
            )?
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        let clock_drift = query
            .fraction("clock_drift", 0.0..=0.5)?
            .unwrap_or(DEFAULT_CLOCK_DRIFT);
        let tls = match (query.flag("tls")?, query.get("ca")) {
            (_, Some("")) => return Err(invalid("ca= needs the path of a PEM file")),
            (Some(false), Some(_)) => {
                return Err(invalid(
                    "tls=false with ca=: drop tls=false to talk TLS, or ca= to talk plain",
                ));
            }
            (Some(true), None) => Some(None),
            (_, Some(ca)) => Some(Some(ca)),
            (_, None) => None,
        };
        // Each master's URL: `rediss://` with the CA (a distlock option of that scheme)
        // over TLS, then the driver's options.
        let (scheme, mut options) = match tls {
            Some(Some(ca)) => ("rediss", vec![format!("ca={ca}")]),
            Some(None) => ("rediss", Vec::new()),
            None => ("redis", Vec::new()),
        };
        if let Some(driver) = query.driver_url("").strip_prefix('?') {
            options.push(driver.to_owned());
        }
        let driver = if options.is_empty() {
            String::new()
        } else {
            format!("?{}", options.join("&"))
        };
        let Some(rest) = base.strip_prefix("redlock://") else {
            return Err(invalid(format!(
                "{:?} is not a redlock:// URL",
                crate::redact::shown(url)
            )));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
            None => (String::new(), authority),
        };
        let db = path.trim_end_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            let db = crate::redact::piece(url, db, || "(the path)".to_owned());
            return Err(invalid(format!("database {db} is not a number")));
        }
        let mut addresses: Vec<&str> = Vec::new();
        for (i, host) in hosts.split(',').enumerate() {
            let master = crate::redact::piece(url, host, || format!("{}", i + 1));
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(invalid(format!("master {master} has no port")));
            };
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(invalid(format!("master {master} is not host:port")));
            }
            if addresses.contains(&host) {
                return Err(invalid(format!(
                    "master {master} is named twice: a majority needs independent masters"
                )));
            }
            addresses.push(host);
        }
        if addresses.len() < 3 || addresses.len() % 2 == 0 {
            return Err(invalid(format!(
                "{} masters given: a majority of an even number, or of fewer than 3, \
                 survives no more failures than a smaller odd group",
                addresses.len()
            )));
        }
        addresses.sort_unstable();
        let masters = addresses
            .into_iter()
            .map(|address| format!("{scheme}://{credentials}{address}/{db}{driver}"))
            .collect();
        Ok(RedlockUrl {
            masters,
            request_timeout,
            clock_drift,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_sorted_and_carry_credentials_and_database() {
        let url = RedlockUrl::parse("redlock://u:p@h3:1,h1:2,h2:3/4?request_timeout=50ms").unwrap();
        assert_eq!(
            url.masters,
            [
                "redis://u:p@h1:2/4",
                "redis://u:p@h2:3/4",
                "redis://u:p@h3:1/4"
            ]
        );
        assert_eq!(url.request_timeout, Duration::from_millis(50));
        assert_eq!(url.clock_drift, DEFAULT_CLOCK_DRIFT);
        let url = RedlockUrl::parse("redlock://a:1,b:1,c:1/?clock_drift=0.05").unwrap();
        assert_eq!(url.masters[0], "redis://a:1/");
        assert_eq!(url.clock_drift, 0.05);
    }

    #[test]
    fn tls_makes_every_master_rediss_with_the_ca() {
        let url =
            RedlockUrl::parse("redlock://:pw@a:1,b:1,c:1/2?ca=/c/ca.pem&protocol=resp3").unwrap();
        assert_eq!(
            url.masters[0],
            "rediss://:pw@a:1/2?ca=/c/ca.pem&protocol=resp3"
        );
        let url = RedlockUrl::parse("redlock://a:1,b:1,c:1/?tls=true").unwrap();
        assert_eq!(url.masters[2], "rediss://c:1/");
        let url = RedlockUrl::parse("redlock://a:1,b:1,c:1/?tls=false").unwrap();
        assert_eq!(url.masters[1], "redis://b:1/");
        for bad in [
            "redlock://a:1,b:1,c:1/?ca=",
            "redlock://a:1,b:1,c:1/?tls=false&ca=/c/ca.pem",
        ] {
            let err = RedlockUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redlock://a:1,b:1/", "2 masters"),
            ("redlock://a:1/", "1 masters"),
            ("redlock://a:1,b:1,c:1,d:1/", "4 masters"),
            ("redlock://a:1,a:1,b:1/", "named twice"),
            ("redlock://a,b:1,c:1/", "has no port"),
            ("redlock://a:x,b:1,c:1/", "not host:port"),
            ("redlock://a:1,b:1,c:1/x", "not a number"),
            (
                "redlock://a:1,b:1,c:1/?request_timeout=0ms",
                "request_timeout",
            ),
            ("redlock://a:1,b:1,c:1/?clock_drift=2", "clock_drift"),
            ("redlock://a:1,b:1,c:1/?fair=true", "fair"),
        ] {
            let err = RedlockUrl::parse(url).unwrap_err();
            assert!(err.is_invalid_input(), "{url}: {err}");
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }
}
