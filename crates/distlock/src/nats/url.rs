//! `nats://` URLs: the servers, the bucket, how the client logs in and talks TLS.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::scheme::Credentials;

/// The bucket a URL without a path uses.
pub(crate) const DEFAULT_BUCKET: &str = "distlock";

/// How the client logs in. Its `Debug` shows no secret.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Login {
    /// No login.
    None,
    /// `nats://user:password@...`.
    Password(Credentials),
    /// `?token=SECRET`: the server's `authorization { token }`.
    Token(String),
    /// `?creds=PATH`: a credentials file (a user JWT and its NKey seed).
    CredentialsFile(PathBuf),
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Login::None => f.write_str("None"),
            Login::Password(credentials) => write!(f, "Password({credentials:?})"),
            Login::Token(_) => f.write_str("Token(***)"),
            Login::CredentialsFile(path) => write!(f, "CredentialsFile({path:?})"),
        }
    }
}

/// The parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NatsUrl {
    /// `host:port` of every server the URL names.
    pub(crate) servers: Vec<String>,
    /// The key-value bucket the locks live in.
    pub(crate) bucket: String,
    /// The replicas of the bucket's stream when distlock creates it.
    pub(crate) replicas: usize,
    pub(crate) login: Login,
    /// The TLS options, when the client talks TLS.
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
            "{url:?}: {reason}; write it as nats://host:4222,host2:4222/bucket?replicas=1 \
             (user:password@ before the hosts, token= or creds=PATH to log in; tls=true, ca=, cert= \
             and key= for TLS)"
        ),
    )
}

impl NatsUrl {
    pub(crate) fn parse(url: &str) -> Result<NatsUrl> {
        let Some(rest) = url.strip_prefix("nats://") else {
            return Err(invalid(url, "the scheme must be nats"));
        };
        let (_, query) = crate::scheme::Query::parse(url)?;
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        if rest
            .rsplit_once('@')
            .is_some_and(|(user_info, _)| !user_info.contains(':'))
        {
            // Quoting nothing: the user info may be a token.
            return Err(Error::invalid(
                "URL",
                "the user info of a nats:// URL must be user:password; a token goes in \
                 ?token= (percent-encoded), which distlock never shows",
            ));
        }
        let (login, rest) = match Credentials::split("nats", rest)? {
            (Some(credentials), after) => (Login::Password(credentials), after),
            (None, after) => (Login::None, after),
        };
        let (hosts, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let servers = crate::scheme::host_list(url, hosts)
            .map_err(|why| invalid(url, why))?
            .into_iter()
            .map(|(name, port)| format!("{name}:{port}"))
            .collect();
        let bucket = match path.strip_suffix('/').unwrap_or(path) {
            "" => DEFAULT_BUCKET.to_owned(),
            bucket
                if bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')) =>
            {
                bucket.to_owned()
            }
            _ => {
                return Err(invalid(
                    url,
                    "the path names the key-value bucket, of letters, digits, _ and - only",
                ));
            }
        };
        let replicas = match query.get("replicas") {
            None => 1,
            Some(value) => value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=5).contains(n))
                .ok_or_else(|| {
                    invalid(url, format!("replicas={value:?} is not a number from 1 to 5"))
                })?,
        };
        let login = match (query.get("creds"), query.get("token"), login) {
            (None, None, login) => login,
            (Some(""), _, _) => {
                return Err(invalid(url, "creds= needs the path of a credentials file"));
            }
            (_, Some(""), _) => return Err(invalid(url, "token= is empty")),
            (Some(path), None, Login::None) => {
                Login::CredentialsFile(PathBuf::from(crate::percent::decoded(path)))
            }
            (None, Some(token), Login::None) => Login::Token(crate::percent::decoded(token)),
            _ => {
                return Err(invalid(
                    url,
                    "user:password@, token= and creds= are three ways to log in: keep one",
                ));
            }
        };
        Ok(NatsUrl {
            servers,
            bucket,
            replicas,
            login,
            tls: Tls::of(url, &query)?,
        })
    }
}

impl Tls {
    /// The TLS options of `query`: `None` when it asks for none.
    fn of(url: &str, query: &crate::scheme::Query<'_>) -> Result<Option<Tls>> {
        let path = |key: &str| match query.get(key) {
            Some("") => Err(invalid(url, format!("{key}= needs the path of a PEM file"))),
            other => Ok(other.map(|path| PathBuf::from(crate::percent::decoded(path)))),
        };
        let (ca, cert, key) = (path("ca")?, path("cert")?, path("key")?);
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    url,
                    "cert= and key= go together: the client certificate and its private key",
                ));
            }
        };
        let asked = ca.is_some() || identity.is_some();
        match query.flag("tls")? {
            Some(false) if asked => Err(invalid(
                url,
                "tls=false with ca=, cert= or key=: drop tls=false to talk TLS, or the files \
                 to talk plain",
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
        let url = NatsUrl::parse("nats://127.0.0.1:4222,h2/").unwrap();
        assert_eq!(url.servers, ["127.0.0.1:4222", "h2:4222"]);
        assert_eq!(url.bucket, DEFAULT_BUCKET);
        assert_eq!((url.replicas, &url.login, &url.tls), (1, &Login::None, &None));
        let url = NatsUrl::parse("nats://h/app-locks?replicas=3").unwrap();
        assert_eq!((url.bucket.as_str(), url.replicas), ("app-locks", 3));
        let url = NatsUrl::parse("nats://app:s3cr%40t@h/").unwrap();
        let Login::Password(credentials) = &url.login else {
            panic!("{:?}", url.login)
        };
        assert_eq!(
            (credentials.user.as_str(), credentials.password.as_str()),
            ("app", "s3cr@t")
        );
        assert!(!format!("{url:?}").contains("s3cr"));
        let url = NatsUrl::parse("nats://h/?token=t%2Fok").unwrap();
        assert_eq!(url.login, Login::Token("t/ok".into()));
        assert!(!format!("{url:?}").contains("t/ok"));
        let url = NatsUrl::parse("nats://h/?creds=/c/app.creds&ca=/c/ca.pem").unwrap();
        assert_eq!(url.login, Login::CredentialsFile("/c/app.creds".into()));
        assert_eq!(url.tls.unwrap().ca, Some(PathBuf::from("/c/ca.pem")));
        assert_eq!(
            NatsUrl::parse("nats://h/?tls=true").unwrap().tls,
            Some(Tls::default())
        );
        for bad in [
            "nats://",
            "nats:///x",
            "nats://h:0/",
            "nats://h/a.b",
            "nats://h/a/b",
            "nats://h/?replicas=0",
            "nats://h/?replicas=7",
            "nats://h/?creds=",
            "nats://h/?token=t&creds=/c",
            "nats://a:b@h/?token=t",
            "nats://h/?token=",
            "nats://@h/",
            "nats://h/?cert=/c/me.pem",
            "nats://h/?tls=false&ca=/c/ca.pem",
            "nats://h/?fair=false",
            "nats://a:@h/",
        ] {
            let err = NatsUrl::parse(bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
        let err = NatsUrl::parse("nats://app:s3c/ret@h/").expect_err("a raw /");
        assert!(!err.to_string().contains("ret"), "{err}");
        let err = NatsUrl::parse("nats://s3cret@h/").expect_err("a token as user info");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
