//! `zk://` and `zk+naive://` URLs, and how lock names become znode paths.

use std::fmt::Write as _;
use std::time::Duration;

use crate::error::{Error, Result};

/// The session timeout asked for when the URL names none. The server clamps it to between 2
/// and 20 of its ticks (4 s to 40 s with the default 2 s tick).
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZkUrl {
    /// The connect string: `host:port,host:port`.
    pub(crate) cluster: String,
    /// The znode under which each lock has its node, without a trailing slash.
    pub(crate) base: String,
    pub(crate) naive: bool,
    pub(crate) session_timeout: Duration,
}

fn invalid(url: &str, reason: impl std::fmt::Display) -> Error {
    Error::invalid(
        "URL",
        format!(
            "{url:?}: {reason}; write it as zk://host:2181,host2:2181/base/path?session_timeout=10s \
             (or zk+naive://...)"
        ),
    )
}

impl ZkUrl {
    pub(crate) fn parse(url: &str) -> Result<ZkUrl> {
        let (naive, rest) = if let Some(rest) = url.strip_prefix("zk://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("zk+naive://") {
            (true, rest)
        } else {
            return Err(invalid(url, "the scheme must be zk or zk+naive"));
        };
        let (_, query) = crate::scheme::Query::parse(url)?;
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        let (hosts, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, ""),
        };
        if hosts.is_empty() {
            return Err(invalid(url, "no server is named"));
        }
        let mut cluster = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) => (name, port),
                None => (host, "2181"),
            };
            if name.is_empty() {
                return Err(invalid(url, format!("server {host:?} has no host name")));
            }
            let port: u16 = port
                .parse()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| invalid(url, format!("server {host:?} has a bad port")))?;
            cluster.push(format!("{name}:{port}"));
        }
        let base = match path.trim_end_matches('/') {
            "" if naive => "/distlock/naive".to_owned(),
            "" => "/distlock/locks".to_owned(),
            base => {
                for part in base[1..].split('/') {
                    if part.is_empty() || part == "." || part == ".." {
                        return Err(invalid(
                            url,
                            format!("the base path {base:?} has an empty, . or .. part"),
                        ));
                    }
                }
                if base == "/zookeeper" || base.starts_with("/zookeeper/") {
                    return Err(invalid(url, "/zookeeper is ZooKeeper's own tree"));
                }
                base.to_owned()
            }
        };
        let session_timeout = query
            .duration(
                "session_timeout",
                Duration::from_secs(1)..=Duration::from_secs(3600),
            )?
            .unwrap_or(DEFAULT_SESSION_TIMEOUT);
        Ok(ZkUrl {
            cluster: cluster.join(","),
            base,
            naive,
            session_timeout,
        })
    }
}

/// The znode that stands for lock `name` under `base`: one path component, the name with
/// every byte outside `A-Z a-z 0-9 - _ .` written as `%XX` (and `.`/`..` written in full as
/// `%2E`), so that any name is a valid, distinct znode name and plain names read as
/// themselves.
pub fn lock_path(base: &str, name: &str) -> String {
    let mut path = String::with_capacity(base.len() + 1 + name.len());
    path.push_str(base);
    path.push('/');
    if name == "." || name == ".." {
        for _ in 0..name.len() {
            path.push_str("%2E");
        }
        return path;
    }
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
            path.push(byte as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(path, "%{byte:02X}");
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let url = ZkUrl::parse("zk://127.0.0.1:2181,h2:2182/").unwrap();
        assert_eq!(url.cluster, "127.0.0.1:2181,h2:2182");
        assert_eq!(url.base, "/distlock/locks");
        assert!(!url.naive);
        assert_eq!(url.session_timeout, DEFAULT_SESSION_TIMEOUT);
        let url = ZkUrl::parse("zk+naive://h?session_timeout=2500ms").unwrap();
        assert_eq!(url.cluster, "h:2181");
        assert_eq!(url.base, "/distlock/naive");
        assert!(url.naive);
        assert_eq!(url.session_timeout, Duration::from_millis(2500));
        let url = ZkUrl::parse("zk://h:1/app/locks/?session_timeout=3s").unwrap();
        assert_eq!(url.base, "/app/locks");
        for bad in [
            "zk://",
            "zk:///x",
            "zk://h:0/",
            "zk://h:x/",
            "zk://:2181/",
            "zk://h/a//b",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h/?session_timeout=0s",
            "zk://h/?session_timeout=10",
            "zk://h/?session_timeout=2d",
            "zk://h/?fair=false",
            "redis://h/",
        ] {
            let err = ZkUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
    }

    #[test]
    fn names_become_one_component() {
        assert_eq!(lock_path("/b", "stock-1_a.b"), "/b/stock-1_a.b");
        assert_eq!(lock_path("/b", "a/b"), "/b/a%2Fb");
        assert_eq!(lock_path("/b", "a%2Fb"), "/b/a%252Fb");
        assert_eq!(lock_path("/b", "锁"), "/b/%E9%94%81");
        assert_eq!(lock_path("/b", "."), "/b/%2E");
        assert_eq!(lock_path("/b", ".."), "/b/%2E%2E");
        assert_eq!(lock_path("/b", "..."), "/b/...");
        assert_eq!(lock_path("/b", "a b"), "/b/a%20b");
    }
}
