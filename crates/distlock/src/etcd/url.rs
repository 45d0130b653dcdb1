//! `etcd://` URLs, and how lock names become key prefixes.

use std::time::Duration;

use crate::error::{Error, Result};

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

/// The parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdUrl {
    /// `http://host:port` of every server the URL names.
    pub(crate) endpoints: Vec<String>,
    /// Prepended to every lock's key prefix: empty, or ending in `/`.
    pub(crate) prefix: String,
    /// The TTL of the client's etcd lease, in whole seconds.
    pub(crate) lease_ttl: Duration,
    pub(crate) watch: WatchStart,
}

fn invalid(url: &str, reason: impl std::fmt::Display) -> Error {
    let url = crate::redact::shown(url);
    Error::invalid(
        "URL",
        format!(
            "{url:?}: {reason}; write it as etcd://host:2379,host2:2379/optional/prefix\
             ?lease_ttl=10s&watch=now"
        ),
    )
}

impl EtcdUrl {
    pub(crate) fn parse(url: &str) -> Result<EtcdUrl> {
        let Some(rest) = url.strip_prefix("etcd://") else {
            return Err(invalid(url, "the scheme must be etcd"));
        };
        let (_, query) = crate::scheme::Query::parse(url)?;
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        let (hosts, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let endpoints = crate::scheme::host_list(url, hosts)
            .map_err(|why| invalid(url, why))?
            .into_iter()
            .map(|(name, port)| format!("http://{name}:{port}"))
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
        })
    }

    /// The key prefix of lock `name`: `<prefix><escaped name>/`, under which each contender
    /// puts its key (the layout of `concurrency.Mutex`, and so of `etcdctl lock`).
    pub(crate) fn lock_prefix(&self, escaped_name: &str) -> String {
        format!("{}{escaped_name}/", self.prefix)
    }
}

/// `10s`, between 2 s and 1 h.
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
}
