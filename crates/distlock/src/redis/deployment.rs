//! How distlock reaches Redis: a standalone server, the master a Sentinel group names, or a
//! Cluster. Parses the URL, and gives the lock one command connection whatever the deployment.

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use crate::error::{Error, Result};

mod sentinel;

pub(crate) use self::sentinel::Following;

/// How long connecting to a server may take before distlock gives up on it.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a Sentinel or Cluster command (and the Redis stock store's) may wait for its
/// reply; a hung master is then abandoned and the next command finds the master again.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// TCP settings of every connection to Redis: no Nagle delay. A client's requests share one
/// connection, so a request written while an earlier one awaits its reply must go out at once.
pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Where the servers are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Deployment {
    /// One server: the URL the `redis` crate reads (`redis://...`).
    Standalone(String),
    /// A Sentinel group: the sentinels' URLs, the monitored service's name, the master's
    /// database and login, and the sentinels' own login.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        db: i64,
        login: Login,
        sentinel_login: Login,
    },
    /// A Cluster: some of its nodes' URLs (the rest are discovered), and the nodes' login.
    Cluster { nodes: Vec<String>, login: Login },
}

/// What a client logs in with: a user (the server's `default` when none) and a password
/// (none: no login), percent-decoded. Its `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Login {
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Login {
    /// `info` logging in as this says.
    pub(crate) fn apply(&self, mut info: redis::RedisConnectionInfo) -> redis::RedisConnectionInfo {
        if let Some(user) = &self.user {
            info = info.set_username(user);
        }
        if let Some(password) = &self.password {
            info = info.set_password(password);
        }
        info
    }
}

/// distlock's own URL options, taken out of the query before the rest reaches the `redis` crate.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Options {
    pub fair: Option<bool>,
    pub spin: bool,
    /// A PEM file of the CA that signed the server's certificate (`rediss://` only).
    pub ca: Option<String>,
    /// The sentinels' own login (`sentinel_user=`, `sentinel_password=`; Sentinel only).
    pub sentinel_login: Login,
}

/// What one URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub scheme: &'static str,
    pub deployment: Deployment,
    pub options: Options,
}

const URL_FORMS: &str = "write redis://[user:password@]host[:port][/db], \
     rediss://[user:password@]host[:port][/db][?ca=/path/ca.pem], \
     redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]\
     [?sentinel_password=...] or \
     redis+cluster://[user:password@]host:port[,host:port...]/";

fn bad_url(reason: impl std::fmt::Display) -> Error {
    Error::invalid("URL", format!("{reason}; {URL_FORMS}"))
}

/// Removes distlock's options (`fair`, `spin`, `ca`) from a URL's query, refusing keys
/// neither distlock nor the Redis client knows; returns the URL without them.
pub(super) fn take_options(url: &str) -> Result<(String, Options)> {
    let (base, query) = crate::scheme::Query::parse(url)?;
    let ca = match query.get("ca") {
        Some("") => return Err(Error::invalid("URL", "ca= needs the path of a PEM file")),
        other => other.map(str::to_owned),
    };
    let sentinel_login = Login {
        user: query.get("sentinel_user").map(crate::percent::decoded),
        password: query.get("sentinel_password").map(crate::percent::decoded),
    };
    if sentinel_login.user.is_some() && sentinel_login.password.is_none() {
        return Err(Error::invalid(
            "URL",
            "sentinel_user= needs sentinel_password=: a sentinel logs a user in with its password",
        ));
    }
    if [&sentinel_login.user, &sentinel_login.password]
        .iter()
        .any(|given| given.as_deref() == Some(""))
    {
        return Err(Error::invalid(
            "URL",
            "sentinel_user= and sentinel_password= need a value",
        ));
    }
    let options = Options {
        fair: query.flag("fair")?,
        spin: query.flag("spin")?.unwrap_or(false),
        ca,
        sentinel_login,
    };
    Ok((query.driver_url(base), options))
}

/// Splits `[user:password@]hosts[/path]` (a Sentinel or Cluster URL after its `scheme://`)
/// into its login (percent-decoded), host list and path.
///
/// # Errors
/// [`Error::InvalidInput`], quoting nothing of the URL, for a raw `/`, `?`, `#` or `,` in the
/// user info (the host list or the path would start inside the password), and for a query
/// left for the driver (`protocol=`: the Sentinel and Cluster clients take none).
fn split_authority(rest: &str) -> Result<(Login, &str, &str)> {
    let (credentials, after) = match crate::redact::user_info_end(rest) {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if credentials.is_some_and(|c| c.contains(['/', '?', '#', ','])) {
        return Err(bad_url(
            "the user info holds a raw `/`, `?`, `#` or `,`: percent-encode them in the user \
             and the password (`/` is %2F, `?` %3F, `#` %23, `,` %2C, `@` %40)",
        ));
    }
    if after.contains('?') {
        return Err(bad_url(
            "a Sentinel or Cluster URL takes none of the Redis client's own options \
             (protocol=): they apply to redis:// and rediss://",
        ));
    }
    let (hosts, path) = after.split_once('/').unwrap_or((after, ""));
    let decoded = |text: &str| Some(crate::percent::decoded(text)).filter(|t| !t.is_empty());
    let login = match credentials {
        None => Login::default(),
        Some(c) => match c.split_once(':') {
            Some((user, password)) => Login {
                user: decoded(user),
                password: Some(crate::percent::decoded(password)),
            },
            None => Login {
                user: decoded(c),
                password: None,
            },
        },
    };
    Ok((login, hosts, path))
}

/// `host:port,host:port` → `redis://host:port` each.
fn host_list(hosts: &str, what: &str) -> Result<Vec<String>> {
    let mut urls = Vec::new();
    for host in hosts.split(',') {
        let Some((name, port)) = host.rsplit_once(':') else {
            return Err(bad_url(format!("{what} {host:?} has no port")));
        };
        if name.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad_url(format!("{what} {host:?} is not host:port")));
        }
        urls.push(format!("redis://{host}"));
    }
    Ok(urls)
}

/// Parses a distlock Redis URL.
/// Checks a URL as connecting would, without connecting ([`crate::validate_url`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    let target = parse(url)?;
    if let Deployment::Standalone(url) = &target.deployment {
        super::connect::standalone_info(url)?;
    }
    Ok(())
}

pub(super) fn parse(url: &str) -> Result<Target> {
    let (url, mut options) = take_options(url)?;
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad_url(format!(
            "{:?} has no scheme",
            crate::redact::shown(&url)
        )));
    };
    let (scheme, deployment): (&'static str, _) = match scheme {
        "redis" => ("redis", Deployment::Standalone(url.clone())),
        "rediss" => ("rediss", Deployment::Standalone(url.clone())),
        "redis+spin" => {
            options.spin = true;
            (
                "redis+spin",
                Deployment::Standalone(format!("redis://{rest}")),
            )
        }
        "redis+sentinel" => {
            let (login, hosts, path) = split_authority(rest)?;
            let mut parts = path.split('/').filter(|p| !p.is_empty());
            let service = parts
                .next()
                .ok_or_else(|| bad_url("the Sentinel URL names no service"))?
                .to_owned();
            let db = match parts.next() {
                None => 0,
                Some(db) => db
                    .parse()
                    .map_err(|_| bad_url(format!("database {db:?} is not a number")))?,
            };
            let sentinels = host_list(hosts, "sentinel")?;
            (
                "redis+sentinel",
                Deployment::Sentinel {
                    sentinels,
                    service,
                    db,
                    login,
                    sentinel_login: std::mem::take(&mut options.sentinel_login),
                },
            )
        }
        "redis+cluster" => {
            let (login, hosts, path) = split_authority(rest)?;
            if !path.is_empty() && path != "0" {
                return Err(bad_url(format!(
                    "a Cluster has only database 0, not {path:?}"
                )));
            }
            let nodes = host_list(hosts, "cluster node")?;
            ("redis+cluster", Deployment::Cluster { nodes, login })
        }
        other => return Err(bad_url(format!("{other:?} is not a Redis scheme"))),
    };
    if options.ca.is_some() && scheme != "rediss" {
        return Err(Error::invalid(
            "URL",
            "ca= applies to TLS connections: use it with rediss://",
        ));
    }
    if options.spin && options.fair == Some(true) {
        return Err(Error::invalid(
            "URL",
            "fair=true needs pub/sub wake-ups; the spin lock cannot be fair",
        ));
    }
    Ok(Target {
        scheme,
        deployment,
        options,
    })
}

/// The command connection of one client.
#[derive(Clone)]
pub(super) enum Commands {
    /// A reconnecting connection to one server.
    Standalone(ConnectionManager),
    /// A connection to the master the sentinels name, found again after a failover.
    Sentinel(Following),
    /// A connection to every master of a Cluster, routing each command by its keys' slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Commands::Standalone(c) => c.req_packed_command(cmd),
            Commands::Sentinel(c) => Box::pin(c.command(cmd)),
            Commands::Cluster(c) => Box::pin(cluster_command(c, cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Commands::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Commands::Sentinel(c) => Box::pin(c.commands(pipeline, offset, count)),
            Commands::Cluster(c) => Box::pin(cluster_commands(c, pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Commands::Standalone(c) => c.get_db(),
            Commands::Sentinel(c) => c.db,
            Commands::Cluster(c) => c.get_db(),
        }
    }
}

/// How often a Cluster command refused before it ran (MOVED, TRYAGAIN, ...) is sent again.
const CLUSTER_ATTEMPTS: u32 = 8;

/// True when the server refused the command without running it, so sending it again cannot
/// run it twice: a redirection, or a shard that cannot serve writes at the moment.
fn refused_before_running(error: &redis::RedisError) -> bool {
    matches!(
        error.code(),
        Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" | "LOADING")
    )
}

/// Sends one command to a Cluster at most once. The cluster connection is built without
/// transport retries (a command whose reply was lost may have run, and our scripts are not
/// idempotent); only a command the server refused before running it is sent again, after the
/// connection refreshed its slot map.
async fn cluster_command(
    connection: &mut ClusterConnection,
    cmd: &Cmd,
) -> redis::RedisResult<Value> {
    let mut attempt = 1;
    loop {
        match connection.req_packed_command(cmd).await {
            Err(error) if attempt < CLUSTER_ATTEMPTS && refused_before_running(&error) => {
                tokio::time::sleep(cluster_pause(attempt)).await;
                attempt += 1;
            }
            reply => return reply,
        }
    }
}

/// [`cluster_command`] for a pipeline.
async fn cluster_commands(
    connection: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> redis::RedisResult<Vec<Value>> {
    let mut attempt = 1;
    loop {
        match connection
            .req_packed_commands(pipeline, offset, count)
            .await
        {
            Err(error) if attempt < CLUSTER_ATTEMPTS && refused_before_running(&error) => {
                tokio::time::sleep(cluster_pause(attempt)).await;
                attempt += 1;
            }
            reply => return reply,
        }
    }
}

/// The pause before the `attempt`th resend: 10 ms, doubling up to 320 ms.
fn cluster_pause(attempt: u32) -> Duration {
    Duration::from_millis(10 << attempt.min(5))
}

/// The refusal (`NOAUTH`, `WRONGPASS`, `NOPERM`) that `servers` answer a client logged in as
/// their connection info says, sending it the `probe` commands one after another: the first
/// server's refusal when every server that answers refuses, `None` when one of them takes
/// every command (or none answers). The Sentinel and Cluster clients report a refused login
/// without its code (as text, or as the failure of the whole deployment): this asks the
/// servers directly whose login was refused.
pub(crate) async fn refusal_of_all(
    servers: Vec<redis::ConnectionInfo>,
    probe: &[&[&str]],
) -> Option<redis::RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    let mut refusal = None;
    for info in servers {
        let answer: redis::RedisResult<()> = async {
            let client = redis::Client::open(info)?;
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            for words in probe {
                let mut command = redis::cmd(words[0]);
                for word in &words[1..] {
                    command.arg(*word);
                }
                let _: Value = command.query_async(&mut connection).await?;
            }
            Ok(())
        }
        .await;
        match answer {
            Ok(()) => return None,
            Err(error) if super::refused("connect", &error).is_some() => {
                refusal = refusal.or(Some(error));
            }
            // Not reached, or another failure: this server tells nothing.
            Err(_) => {}
        }
    }
    refusal
}

/// Opens the command connection of a standalone server.
pub(super) async fn standalone(client: &redis::Client) -> redis::RedisResult<Commands> {
    // Fail fast on a server that is not there; reconnects later retry with backoff.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_number_of_retries(2);
    let mut connection = client.get_connection_manager_with_config(config).await?;
    // A server that wants credentials the URL did not give answers NOAUTH to any command:
    // ask once, so that connecting says so rather than the first lock.
    let _: String = redis::cmd("PING").query_async(&mut connection).await?;
    Ok(Commands::Standalone(connection))
}

/// The Cluster hash slot of a key (CRC16/XMODEM of its hash tag, modulo 16384).
pub(super) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| {
            let after = &bytes[open + 1..];
            let close = after.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &after[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from CLUSTER KEYSLOT on Redis 7.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), 3443);
        assert_eq!(slot("foo{}{bar}"), 8363);
        assert_eq!(slot("foo{{bar}}zap"), 4015);
    }

    #[test]
    fn options_are_taken_out_of_the_url() {
        let cases = [
            ("redis://h:1/", "redis://h:1/", None, false),
            ("redis://h:1/?fair=true", "redis://h:1/", Some(true), false),
            (
                "redis://h:1/?fair=0&spin=1",
                "redis://h:1/",
                Some(false),
                true,
            ),
            (
                "redis://h:1/2?protocol=resp3&fair=false",
                "redis://h:1/2?protocol=resp3",
                Some(false),
                false,
            ),
        ];
        for (url, rest, fair, spin) in cases {
            assert_eq!(
                take_options(url).unwrap(),
                (
                    rest.to_owned(),
                    Options {
                        fair,
                        spin,
                        ..Options::default()
                    }
                ),
                "{url}"
            );
        }
        for bad in [
            "redis://h/?fair=maybe",
            "redis://h/?spin=yes",
            "redis://h/?a=b&fair=1",
            "redis+cluster://h:1/?fare=true",
        ] {
            assert!(take_options(bad).unwrap_err().is_invalid_input(), "{bad}");
        }
    }

    #[test]
    fn deployments_are_parsed() {
        let target = parse("redis+sentinel://:pw@a:1,b:2/svc/3?fair=false").unwrap();
        assert_eq!(target.scheme, "redis+sentinel");
        assert_eq!(target.options.fair, Some(false));
        assert_eq!(
            target.deployment,
            Deployment::Sentinel {
                sentinels: vec!["redis://a:1".into(), "redis://b:2".into()],
                service: "svc".into(),
                db: 3,
                login: Login {
                    user: None,
                    password: Some("pw".into()),
                },
                sentinel_login: Login::default(),
            }
        );
        let target = parse(
            "redis+sentinel://app:p%40ss@a:1/svc?sentinel_user=watch&sentinel_password=s%26pw",
        )
        .unwrap();
        let Deployment::Sentinel {
            login,
            sentinel_login,
            ..
        } = &target.deployment
        else {
            panic!("not a Sentinel deployment: {target:?}");
        };
        assert_eq!(
            (login.user.as_deref(), login.password.as_deref()),
            (Some("app"), Some("p@ss"))
        );
        assert_eq!(
            (
                sentinel_login.user.as_deref(),
                sentinel_login.password.as_deref()
            ),
            (Some("watch"), Some("s&pw"))
        );
        let shown = format!("{target:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("s&pw"),
            "{shown}"
        );
        // A raw `/` (or `,`, `?`, `#`) in a password is refused, quoting none of it.
        for raw in [
            "redis+sentinel://app:pa/ss9@h:1/svc",
            "redis+cluster://app:pa/ss9@h:1/",
            "redis+cluster://app:pa,ss9@h:1,h:2/",
        ] {
            let err = parse(raw).expect_err(raw);
            let text = err.to_string();
            assert!(err.is_invalid_input(), "{raw}: {text}");
            assert!(!text.contains("ss9"), "{raw}: {text}");
        }
        let target = parse("redis+cluster://a:1,b:2/?spin=true").unwrap();
        assert!(target.options.spin);
        assert_eq!(
            target.deployment,
            Deployment::Cluster {
                nodes: vec!["redis://a:1".into(), "redis://b:2".into()],
                login: Login::default(),
            }
        );
        let target = parse("rediss://h:1/?ca=/etc/ca.pem&fair=false").unwrap();
        assert_eq!(target.scheme, "rediss");
        assert_eq!(target.options.ca.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            target.deployment,
            Deployment::Standalone("rediss://h:1/".into())
        );
        let target = parse("redis+spin://h:1/2").unwrap();
        assert!(target.options.spin);
        assert_eq!(
            target.deployment,
            Deployment::Standalone("redis://h:1/2".into())
        );
        for bad in [
            "redis+sentinel://a:1,b:2/",
            "redis+sentinel://a:1/svc/x",
            "redis+sentinel://a/svc",
            "redis+cluster://a:1/5",
            "redis+cluster://a:port/",
            "redis+spin://h/?fair=true",
            "redis://h/?ca=/tmp/ca.pem",
            "rediss://h/?ca=",
            "redis://h/?sentinel_password=x",
            "redis+cluster://h:1/?sentinel_password=x",
            "redis+sentinel://a:1/svc?sentinel_user=watch",
            "redis+sentinel://a:1/svc?sentinel_password=",
            "redis+sentinel://a:1/svc?protocol=resp3",
            "redis+cluster://a:1/?protocol=resp3",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
    }
}
