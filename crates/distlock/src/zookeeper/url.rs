//! `zk://` and `zk+naive://` URLs, and how lock names become znode paths.

use std::fmt::Write as _;
use std::time::Duration;

use zookeeper_client as zk;

use crate::error::{Error, Result};
use crate::scheme::Credentials;

/// The session timeout asked for when the URL names none. The server clamps it to between 2
/// and 20 of its ticks (4 s to 40 s with the default 2 s tick).
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The parsed URL. Its `Debug` shows no password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZkUrl {
    /// The connect string: `host:port,host:port`.
    pub(crate) cluster: String,
    /// The znode under which each lock has its node, without a trailing slash.
    pub(crate) base: String,
    pub(crate) naive: bool,
    pub(crate) session_timeout: Duration,
    /// The digest identity of the URL's user info (`zk://user:password@...`), which every
    /// session authenticates as and which alone may change the nodes it creates.
    pub(crate) digest: Option<Credentials>,
}

fn invalid(url: &str, reason: impl std::fmt::Display) -> Error {
    let url = crate::redact::shown(url);
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
        let (digest, rest) = Credentials::split("zk", rest)?;
        let (_, query) = crate::scheme::Query::parse(url)?;
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, ""),
        };
        let cluster: Vec<String> = crate::scheme::host_list(url, authority)
            .map_err(|why| invalid(url, why))?
            .into_iter()
            .map(|(name, port)| format!("{name}:{port}"))
            .collect();
        let base = match path.trim_end_matches('/') {
            "" if digest.is_some() => {
                return Err(invalid(
                    url,
                    "a URL with a ZooKeeper identity names a base path of its own \
                     (zk://user:password@host/app/locks): the nodes it makes are that \
                     identity's alone, and the default base is shared by every client",
                ));
            }
            "" if naive => "/distlock/naive".to_owned(),
            "" => "/distlock/locks".to_owned(),
            base => {
                for part in base[1..].split('/') {
                    if part.is_empty() || part == "." || part == ".." {
                        let base = crate::redact::piece(url, base, || "of the URL".to_owned());
                        return Err(invalid(
                            url,
                            format!("the base path {base} has an empty, . or .. part"),
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
            digest,
        })
    }

    /// Checks, on a session of this URL, that its base path (made already) is the URL's
    /// identity's: its ACL, which ZooKeeper shows only to an identity with READ or ADMIN on it
    /// (another identity gets `NoAuth`), and which must not give `world:anyone` more than
    /// reading. Without an identity, nothing to check.
    ///
    /// # Errors
    /// [`Error::NotAuthorized`] when the base path belongs to another identity;
    /// [`Error::InvalidInput`] when it is open to every client.
    pub(crate) async fn check_base(&self, scheme: &'static str, client: &zk::Client) -> Result<()> {
        if self.digest.is_none() {
            return Ok(());
        }
        let failed = |e| super::zk_error(scheme, "read the base path", e);
        let (acl, _) = client.get_acl(&self.base).await.map_err(failed)?;
        let open = acl.iter().any(|entry| {
            entry.scheme() == "world"
                && entry.id() == "anyone"
                && [
                    zk::Permission::WRITE,
                    zk::Permission::CREATE,
                    zk::Permission::DELETE,
                    zk::Permission::ADMIN,
                ]
                .into_iter()
                .any(|right| entry.permission().has(right))
        });
        if open {
            return Err(Error::invalid(
                "base path",
                format!(
                    "{} is open to every client (world:anyone), so its locks could not be this \
                     identity's alone: name a new base path, or make it the identity's (in \
                     zkCli.sh: addauth digest USER:PASSWORD, then setAcl -R {} auth::cdrwa)",
                    self.base, self.base
                ),
            ));
        }
        Ok(())
    }

    /// The options of a node of `mode`: open to every client (`world:anyone`), or with a
    /// digest identity, all rights to that identity alone (`auth`, Curator's
    /// `creatorAllAcl`): another identity can neither create under it, change it nor delete
    /// what it holds.
    pub(crate) fn node(&self, mode: zk::CreateMode) -> zk::CreateOptions<'static> {
        mode.with_acls(if self.digest.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        })
    }

    /// A connector for a session of this URL: its session timeout, and its digest identity
    /// where it has one (sent again on every reconnect of the session).
    pub(crate) fn connector(&self) -> zk::Connector {
        let connector = zk::Client::connector().with_session_timeout(self.session_timeout);
        match &self.digest {
            Some(digest) => connector.with_auth(
                "digest",
                format!("{}:{}", digest.user, digest.password).as_bytes(),
            ),
            None => connector,
        }
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
    fn user_info_is_a_digest_identity_whose_password_is_never_shown() {
        let url = ZkUrl::parse("zk://app:s3cr%40t@h1:1,h2/app/locks/").unwrap();
        assert_eq!(url.cluster, "h1:1,h2:2181");
        assert_eq!(url.base, "/app/locks");
        let digest = url.digest.as_ref().expect("a digest identity");
        assert_eq!(
            (digest.user.as_str(), digest.password.as_str()),
            ("app", "s3cr@t")
        );
        let shown = format!("{url:?}");
        assert!(
            shown.contains("\"app\"") && !shown.contains("s3cr"),
            "{shown}"
        );
        assert!(ZkUrl::parse("zk://h/").unwrap().digest.is_none());
        assert!(ZkUrl::parse("zk+naive://a:b@h/n").unwrap().digest.is_some());
        for bad in [
            "zk://app@h/",
            "zk://app:@h/",
            "zk://:pw@h/",
            "zk://a%3Ab:pw@h/",
            "zk://app:pw@/x",
            "zk://app:pw@h",
            "zk://app:pw@h/",
        ] {
            let err = ZkUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
        let err = ZkUrl::parse("zk://app:s3cret@h/a//b")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        // Raw characters that would cut the URL inside the password: refused, and the
        // password quoted nowhere (a raw `/` would otherwise leave no identity at all).
        for raw in [
            "zk://app:12/34@zk1/app/locks",
            "zk://app:s3,cret@zk1/app/locks",
            "zk://app:s3?cret@zk1/app/locks",
            "zk://app:s3#cret@zk1/app/locks",
        ] {
            let err = ZkUrl::parse(raw).expect_err(raw);
            assert!(err.is_invalid_input(), "{raw}: {err}");
            let text = err.to_string();
            for piece in ["34", "cret"] {
                assert!(!text.contains(piece), "{raw}: {text}");
            }
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
