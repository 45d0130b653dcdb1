//! `etcd://` URLs, and how lock names become key prefixes.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::scheme::Credentials;

/// The lease TTL asked of the server when the URL names none. The server rounds a shorter
/// one up to its minimum (about 1.5 times its election timeout, 2 s by default).
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// How a waiter watches the key before its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// From now (no start revision): the server syncs the watch at once; a read after the
    /// watch is set up closes the gap between the look and the watch.
    Now,
    /// From the revision of the look, as etcd's own `concurrency.Mutex` does: the server
    /// serves such a watch from its unsynced group, every 100 ms (kept for measurement).
    Revision,
}

/// The parsed URL. Its `Debug` shows no password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdUrl {
    /// `http://host:port` (`https://` over TLS) of every server the URL names.
    pub(crate) endpoints: Vec<String>,
    /// Prepended to every lock's key prefix: empty, or ending in `/`.
    pub(crate) prefix: String,
    /// The TTL of the client's etcd lease, in whole seconds.
    pub(crate) lease_ttl: Duration,
    pub(crate) watch: WatchStart,
    /// The user the client authenticates as (`etcd://user:password@...`), for a cluster with
    /// authentication on.
    pub(crate) credentials: Option<Credentials>,
    /// How the client checks the servers and shows itself over TLS, when it talks TLS.
    pub(crate) tls: Option<Tls>,
}

/// The TLS options of a URL: files read when the client connects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Tls {
    /// The certificate authority the servers' certificates are checked against; the
    /// system's roots without one.
    pub(crate) ca: Option<PathBuf>,
    /// The client certificate and its private key.
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

fn invalid(url: &str, reason: impl std::fmt::Display) -> Error {
    let url = crate::redact::shown(url);
    Error::invalid(
        "URL",
        format!(
            "{url:?}: {reason}; write it as etcd://host:2379,host2:2379/optional/prefix\
             ?lease_ttl=10s&watch=now (user:password@ before the hosts, tls=true, ca=, cert= \
             and key= for a secured cluster)"
        ),
    )
}

impl EtcdUrl {
    pub(crate) fn parse(url: &str) -> Result<EtcdUrl> {
        let Some(rest) = url.strip_prefix("etcd://") else {
            return Err(invalid(url, "the scheme must be etcd"));
        };
        let (credentials, rest) = Credentials::split("etcd", rest)?;
        let (_, query) = crate::scheme::Query::parse(url)?;
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        let (hosts, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let tls = Tls::of(&query)?;
        let transport = if tls.is_some() { "https" } else { "http" };
        let endpoints = crate::scheme::host_list(url, hosts)
            .map_err(|why| invalid(url, why))?
            .into_iter()
            .map(|(name, port)| format!("{transport}://{name}:{port}"))
            .collect();
        if path.contains('#') {
            return Err(invalid(url, "the prefix may not contain #"));
        }
        let prefix = if path.is_empty() || path.ends_with('/') {
            path.to_owned()
        } else {
            format!("{path}/")
        };
        // etcd counts a lease's TTL in whole seconds: a fraction is rounded up.
        let lease_ttl = query
            .duration(
                "lease_ttl",
                Duration::from_secs(2)..=Duration::from_secs(3600),
            )?
            .map_or(DEFAULT_LEASE_TTL, |ttl| {
                Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            });
        let watch = match query.get("watch") {
            None | Some("now") => WatchStart::Now,
            Some("etcd") => WatchStart::Revision,
            Some(other) => {
                return Err(invalid(
                    url,
                    format!("watch={other:?} is neither now (the default) nor etcd"),
                ));
            }
        };
        Ok(EtcdUrl {
            endpoints,
            prefix,
            lease_ttl,
            watch,
            credentials,
            tls,
        })
    }

    /// The key prefix of lock `name`: `<prefix><escaped name>/`, under which each contender
    /// puts its key (the layout of `concurrency.Mutex`, and so of `etcdctl lock`).
    pub(crate) fn lock_prefix(&self, escaped_name: &str) -> String {
        format!("{}{escaped_name}/", self.prefix)
    }
}

impl Tls {
    /// The TLS options of `query`: `None` when it asks for none (no `tls=true`, `ca=`,
    /// `cert=` or `key=`).
    fn of(query: &crate::scheme::Query<'_>) -> Result<Option<Tls>> {
        let path = |key: &str| match query.get(key) {
            Some("") => Err(Error::invalid(
                "URL",
                format!("etcd://: {key}= needs the path of a PEM file"),
            )),
            other => Ok(other.map(|path| PathBuf::from(crate::percent::decoded(path)))),
        };
        let (ca, cert, key) = (path("ca")?, path("cert")?, path("key")?);
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid(
                    "URL",
                    "etcd://: cert= and key= go together: the client certificate and its \
                     private key",
                ));
            }
        };
        let asked = ca.is_some() || identity.is_some();
        match query.flag("tls")? {
            Some(false) if asked => Err(Error::invalid(
                "URL",
                "etcd://: tls=false with ca=, cert= or key=: drop tls=false to talk TLS, or \
                 the files to talk plain",
            )),
            Some(true) => Ok(Some(Tls { ca, identity })),
            _ if asked => Ok(Some(Tls { ca, identity })),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let url = EtcdUrl::parse("etcd://127.0.0.1:2379,h2:2380/").unwrap();
        assert_eq!(url.endpoints, ["http://127.0.0.1:2379", "http://h2:2380"]);
        assert_eq!(url.prefix, "");
        assert_eq!(url.lease_ttl, DEFAULT_LEASE_TTL);
        assert_eq!(url.watch, WatchStart::Now);
        assert_eq!(url.lock_prefix("job"), "job/");
        let url = EtcdUrl::parse("etcd://h?lease_ttl=3s&watch=etcd").unwrap();
        assert_eq!(url.endpoints, ["http://h:2379"]);
        assert_eq!(url.lease_ttl, Duration::from_secs(3));
        assert_eq!(url.watch, WatchStart::Revision);
        let url = EtcdUrl::parse("etcd://h?lease_ttl=2500ms").unwrap();
        assert_eq!(url.lease_ttl, Duration::from_secs(3), "rounded up");
        let url = EtcdUrl::parse("etcd://h:1/app/locks?watch=now").unwrap();
        assert_eq!(url.prefix, "app/locks/");
        assert_eq!(url.lock_prefix("a%2Fb"), "app/locks/a%2Fb/");
        let url = EtcdUrl::parse("etcd://h:1//svc/").unwrap();
        assert_eq!(url.prefix, "/svc/");
        for bad in [
            "etcd://",
            "etcd:///x",
            "etcd://h:0/",
            "etcd://h:x/",
            "etcd://:2379/",
            "etcd://u@h:2379/",
            "etcd://:pw@h:2379/",
            "etcd://h/?lease_ttl=1s",
            "etcd://h/?lease_ttl=10",
            "etcd://h/?lease_ttl=1999ms",
            "etcd://h/?watch=later",
            "etcd://h/?fair=false",
            "zk://h/",
        ] {
            let err = EtcdUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
    }

    #[test]
    fn user_info_and_tls_options_parse() {
        let url = EtcdUrl::parse("etcd://app:s3cr%40t@h1,h2:2/locks").unwrap();
        let credentials = url.credentials.as_ref().expect("credentials");
        assert_eq!(
            (credentials.user.as_str(), credentials.password.as_str()),
            ("app", "s3cr@t")
        );
        assert_eq!(url.endpoints, ["http://h1:2379", "http://h2:2"]);
        assert_eq!(url.prefix, "locks/");
        assert_eq!(url.tls, None);
        assert!(!format!("{url:?}").contains("s3cr"));
        let url = EtcdUrl::parse("etcd://h/?tls=true").unwrap();
        assert_eq!(url.endpoints, ["https://h:2379"]);
        assert_eq!(url.tls, Some(Tls::default()));
        let url =
            EtcdUrl::parse("etcd://h/?ca=/c/ca.pem&cert=/c/me.pem&key=/c/me%20key.pem").unwrap();
        assert_eq!(url.endpoints, ["https://h:2379"]);
        let tls = url.tls.expect("TLS");
        assert_eq!(tls.ca, Some(PathBuf::from("/c/ca.pem")));
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("/c/me.pem"), PathBuf::from("/c/me key.pem")))
        );
        assert_eq!(EtcdUrl::parse("etcd://h/?tls=false").unwrap().tls, None);
        for bad in [
            "etcd://h/?cert=/c/me.pem",
            "etcd://h/?key=/c/me.pem",
            "etcd://h/?ca=",
            "etcd://h/?tls=false&ca=/c/ca.pem",
            "etcd://h/?tls=maybe",
            "etcd://app:@h/",
            "etcd://app:pw@/x",
        ] {
            let err = EtcdUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
        let err = EtcdUrl::parse("etcd://app:s3c/ret@h/").expect_err("a raw /");
        assert!(!err.to_string().contains("ret"), "{err}");
    }
}
