//! Making a [`RedisBackend`]: from a URL (one function per deployment: a standalone server, a
//! Sentinel group, a Cluster), or from a `redis::Client` the application already has.

use std::sync::{Arc, Mutex as StdMutex};

use redis::cluster::ClusterClientBuilder;

use super::deployment::{self, Commands, Deployment, Following, Login, Options};
use super::hub::{ReleaseHub, Source};
use super::scripts::Scripts;
use super::{RedisBackend, backend_error};
use crate::error::{Error, Result};

impl RedisBackend {
    /// Connects to the deployment a `redis://`, `rediss://`, `redis+spin://`,
    /// `redis+sentinel://` or `redis+cluster://` URL names.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a URL that cannot be parsed; [`Error::NotAuthorized`] when a
    /// server (or a sentinel) refused the URL's login, or the user may not run what the lock
    /// needs; [`Error::Backend`] when the servers cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let target = deployment::parse(url)?;
        if target.scheme == "rediss" {
            // The TLS library needs a crypto provider; an application that chose one keeps it.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let (connection, source) = match target.deployment {
            Deployment::Standalone(url) => standalone(&url, &target.options).await?,
            Deployment::Sentinel {
                sentinels,
                service,
                db,
                login,
                sentinel_login,
            } => {
                sentinel(Following::new(
                    sentinels,
                    &service,
                    db,
                    &login,
                    &sentinel_login,
                )?)
                .await?
            }
            Deployment::Cluster { nodes, login } => cluster(nodes, &login).await?,
        };
        let scheme = if target.options.spin && target.scheme == "redis" {
            "redis+spin"
        } else {
            target.scheme
        };
        Ok(Self::assemble(connection, source, scheme, &target.options))
    }

    /// The lock on the standalone server of a `redis::Client` the application already has:
    /// fair, woken by pub/sub, as a `redis://` URL without options gives. The backend opens
    /// its own connections from the client (one for commands, one for pub/sub).
    ///
    /// ```no_run
    /// # async fn f() -> distlock::Result<()> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/").expect("a valid URL");
    /// let backend = distlock::redis::RedisBackend::from_client(client).await?;
    /// let locks = distlock::Locks::with_backend(
    ///     std::sync::Arc::new(backend),
    ///     distlock::ConnectOptions::new(),
    /// )?;
    /// # let _ = locks;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`] when the server cannot be reached.
    pub async fn from_client(client: redis::Client) -> Result<Self> {
        let connection = deployment::standalone(&client)
            .await
            .map_err(backend_error("connect"))?;
        let source = Source::Server(Box::new(client));
        Ok(Self::assemble(
            connection,
            source,
            super::SCHEME,
            &Options::default(),
        ))
    }

    fn assemble(
        connection: Commands,
        source: Source,
        scheme: &'static str,
        options: &Options,
    ) -> Self {
        let cluster = matches!(connection, Commands::Cluster(_));
        RedisBackend {
            connection,
            scripts: Arc::new(Scripts::new(cluster)),
            releases: Arc::new(ReleaseHub::new(source)),
            scheme,
            spin: options.spin,
            // Fair by default; the spin lock cannot be fair (nobody is told whose turn it is).
            fair: options.fair.unwrap_or(!options.spin),
            cluster,
        }
    }
}

/// The driver's reading of a standalone server's URL, or an error that says which part is
/// wrong (the driver's own says only `InvalidClientConfig`).
pub(super) fn standalone_info(url: &str) -> Result<redis::ConnectionInfo> {
    redis::IntoConnectionInfo::into_connection_info(url).map_err(|_| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let port = host_port
            .rsplit_once(':')
            .filter(|(host, _)| !host.ends_with(']') || host.starts_with('['))
            .map(|(_, port)| port);
        let path = rest.split('?').next().unwrap_or_default();
        let db = path.split_once('/').map(|(_, db)| db).unwrap_or_default();
        let reason = match port {
            Some(port) if port.parse::<u16>().map_or(true, |port| port == 0) => {
                let port = crate::redact::piece(url, port, || "of the URL".to_owned());
                format!("port {port} is not a number from 1 to 65535")
            }
            _ if host_port.is_empty() || host_port.starts_with(':') => {
                "it names no host".to_owned()
            }
            _ if !db.is_empty() && db.parse::<u32>().is_err() => {
                let db = crate::redact::piece(url, db, || "(the path)".to_owned());
                format!("database {db} is not a number")
            }
            _ => "the Redis driver cannot read it".to_owned(),
        };
        Error::invalid(
            "URL",
            format!("{reason}; write redis://[user:password@]host[:port][/db]"),
        )
    })
}

/// A standalone server, over TLS when the URL gave a CA.
async fn standalone(url: &str, options: &Options) -> Result<(Commands, Source)> {
    let info = standalone_info(url)?.set_tcp_settings(deployment::tcp_settings());
    let client = match &options.ca {
        None => redis::Client::open(info),
        Some(path) => {
            let root_cert = std::fs::read(path).map_err(|e| {
                Error::invalid(
                    "URL",
                    format!("ca={path}: cannot read the CA certificate: {e}"),
                )
            })?;
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            };
            redis::Client::build_with_tls(info, certificates)
        }
    }
    .map_err(|e| Error::invalid("URL", e.to_string()))?;
    let tls = url.starts_with("rediss://");
    let connection = deployment::standalone(&client)
        .await
        .map_err(|error| connect_failure(error, tls))?;
    Ok((connection, Source::Server(Box::new(client))))
}

/// The error of a failed connect to a standalone server: a refused login as
/// [`Error::NotAuthorized`]; otherwise [`Error::Backend`], with what to check when the failure
/// looks like TLS on one side only or a certificate the client does not trust.
fn connect_failure(error: redis::RedisError, tls: bool) -> Error {
    if let Some(refused) = super::refused("connect", &error) {
        return refused;
    }
    let text = error.to_string();
    let lower = text.to_lowercase();
    let hint = if tls
        && [
            "certificate",
            "tls",
            "handshake",
            "timed out",
            "eof",
            "end of file",
        ]
        .iter()
        .any(|cause| lower.contains(cause))
    {
        " (over TLS: the server's certificate must be signed by the CA of ca=, or by one of \
         the system's roots without ca=, and name the URL's host; a server without TLS on \
         that port never answers the handshake)"
    } else if !tls
        && [
            "connection reset",
            "broken pipe",
            "connection closed",
            "end of file",
        ]
        .iter()
        .any(|cause| lower.contains(cause))
    {
        " (a server that takes only TLS drops a client that does not: write rediss://, with \
         ca= for a CA of your own)"
    } else {
        ""
    };
    Error::backend(super::SCHEME, "connect", format!("{text}{hint}"))
}

/// The master a Sentinel group names, found now so that a wrong address or login fails here;
/// a refused login says whether the sentinels or the master refused it.
async fn sentinel(following: Following) -> Result<(Commands, Source)> {
    let mut connection = Commands::Sentinel(following.clone());
    let answer: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut connection).await;
    if let Err(error) = answer {
        if super::refused("connect", &error).is_some()
            && let Some(refusal) = following.sentinel_refusal().await
        {
            return Err(super::sentinel_refused(&refusal));
        }
        return Err(backend_error("connect")(error));
    }
    Ok((connection, Source::Sentinel(following)))
}

/// A Cluster, over RESP3 so that sharded pub/sub messages arrive as pushes.
async fn cluster(nodes: Vec<String>, login: &Login) -> Result<(Commands, Source)> {
    let (pushes, receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut builder = ClusterClientBuilder::new(nodes.clone())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .tcp_settings(deployment::tcp_settings())
        .connection_timeout(deployment::CONNECT_TIMEOUT)
        .response_timeout(deployment::RESPONSE_TIMEOUT)
        // At most once: a request whose reply was lost is not sent again (it may have run);
        // `deployment::cluster_command` resends only refused ones.
        .retries(0);
    if let Some(user) = &login.user {
        builder = builder.username(user.clone());
    }
    if let Some(password) = &login.password {
        builder = builder.password(password.clone());
    }
    let connection = match builder
        .build()
        .map_err(|e| Error::invalid("URL", e.to_string()))?
        .get_async_connection()
        .await
    {
        Ok(connection) => connection,
        // The cluster client reports a node's refusal as text in an I/O error: ask the
        // nodes directly for the refusal's code (only then, so that nodes out of reach are
        // not waited for twice).
        Err(error) => {
            let text = error.to_string();
            let refusal = if ["WRONGPASS", "NOAUTH", "NOPERM", "authentication"]
                .iter()
                .any(|code| text.contains(code))
            {
                node_refusal(&nodes, login).await
            } else {
                None
            };
            return Err(backend_error("connect")(refusal.unwrap_or(error)));
        }
    };
    let source = Source::Cluster {
        connection: connection.clone(),
        pushes: StdMutex::new(Some(receiver)),
    };
    Ok((Commands::Cluster(connection), source))
}

/// The nodes' refusal of `login`, when every node that answers refuses what the cluster
/// client asks (`PING`, `CLUSTER SLOTS`).
async fn node_refusal(nodes: &[String], login: &Login) -> Option<redis::RedisError> {
    let infos = nodes
        .iter()
        .filter_map(|node| {
            let info = redis::IntoConnectionInfo::into_connection_info(node.as_str()).ok()?;
            Some(info.set_redis_settings(login.apply(redis::RedisConnectionInfo::default())))
        })
        .collect();
    deployment::refusal_of_all(infos, &[&["PING"], &["CLUSTER", "SLOTS"]]).await
}
