//! Network faults for `distlock check`: each worker reaches the backend through loopback
//! proxies of its own that the checker runs, so that the checker can cut, partition or lose
//! a reply of one worker's connections while the others go on.

use distlock::fault::FaultProxy;

use crate::failure::{CliResult, Failure};

/// The schemes whose every connection goes to a host its URL names (the registry's
/// `routable`), so that proxies in front of those hosts carry all of a worker's traffic.
fn routable() -> impl Iterator<Item = &'static distlock::Scheme> {
    distlock::SCHEMES.iter().filter(|scheme| scheme.routable)
}

/// The parts of a backend URL around its host list.
#[derive(Debug, PartialEq, Eq)]
struct Hosts<'a> {
    /// `scheme://` and the user part with its `@`, if any.
    head: String,
    /// `host:port` of each server (the default port added where the URL had none).
    hosts: Vec<(&'a str, u16)>,
    /// The path and query, from the first `/` or `?` on.
    tail: &'a str,
}

fn split(url: &str) -> CliResult<Hosts<'_>> {
    let refuse = |why: &str| {
        let schemes: Vec<&str> = routable().map(|scheme| scheme.name).collect();
        Failure::usage(format!(
            "network faults (cut, partition, lose-reply) need a backend whose connections go to \
             the hosts its URL names ({}): {why}; run the other faults (pause, kill) on {:?}",
            schemes.join(", "),
            distlock::redact_url(url)
        ))
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(refuse("the URL has no scheme"));
    };
    let Some(default_port) = routable()
        .find(|known| known.name == scheme)
        .and_then(|known| known.default_port)
    else {
        return Err(refuse(&format!("{scheme}:// is not one of them")));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, servers) = match authority.rsplit_once('@') {
        Some((user, servers)) => (Some(user), servers),
        None => (None, authority),
    };
    let mut hosts = Vec::new();
    for server in servers.split(',') {
        let (host, port) = match server.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                let port = port
                    .parse()
                    .map_err(|_| refuse(&format!("{server:?} has a bad port")))?;
                (host, port)
            }
            _ => (server, default_port),
        };
        if host.is_empty() {
            return Err(refuse("a host is empty"));
        }
        hosts.push((host, port));
    }
    Ok(Hosts {
        head: match user {
            Some(user) => format!("{scheme}://{user}@"),
            None => format!("{scheme}://"),
        },
        hosts,
        tail,
    })
}

/// One worker's proxies, one per server of the backend URL.
pub struct Proxies(Vec<FaultProxy>);

impl Proxies {
    /// Checks that `url` can be routed through proxies, before any worker starts.
    pub fn check_url(url: &str) -> CliResult {
        split(url).map(|_| ())
    }

    /// Starts a proxy in front of every server `url` names and answers the URL that reaches
    /// them through the proxies.
    pub async fn start(url: &str) -> CliResult<(Proxies, String)> {
        let parts = split(url)?;
        let mut proxies = Vec::new();
        let mut through = Vec::new();
        for (i, &(host, port)) in parts.hosts.iter().enumerate() {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let target = tokio::net::lookup_host((bare, port))
                .await
                .ok()
                .and_then(|mut found| found.next())
                .ok_or_else(|| {
                    let server = if url.contains('@') {
                        format!("server {}", i + 1)
                    } else {
                        format!("{host}:{port}")
                    };
                    Failure::failed(format!(
                        "cannot resolve {server} of {:?}",
                        distlock::redact_url(url)
                    ))
                })?;
            let proxy = FaultProxy::start(target).await?;
            through.push(proxy.address().to_string());
            proxies.push(proxy);
        }
        let url = format!("{}{}{}", parts.head, through.join(","), parts.tail);
        Ok((Proxies(proxies), url))
    }

    /// Resets every connection the worker has open.
    pub fn cut(&self) {
        self.0.iter().for_each(FaultProxy::reset);
    }

    /// Nothing passes either way until [`Proxies::heal`].
    pub fn partition(&self) {
        self.0.iter().for_each(FaultProxy::blackhole);
    }

    pub fn heal(&self) {
        self.0.iter().for_each(FaultProxy::heal);
    }

    /// The worker's next request to a server it is connected to loses its reply.
    pub fn lose_next_reply(&self) {
        let open = self.0.iter().find(|proxy| proxy.connections() > 0);
        if let Some(proxy) = open.or(self.0.first()) {
            proxy.lose_next_reply();
        }
    }

    /// How many replies the proxies kept from the worker so far.
    pub fn replies_lost(&self) -> u64 {
        self.0.iter().map(FaultProxy::replies_lost).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_around_their_hosts() {
        let parts = split("postgres://u:p@db.example:6543/test?mode=table").unwrap();
        assert_eq!(parts.head, "postgres://u:p@");
        assert_eq!(parts.hosts, [("db.example", 6543)]);
        assert_eq!(parts.tail, "/test?mode=table");
        let parts = split("zk://a:2181,b,[::1]:2183/base").unwrap();
        assert_eq!(parts.hosts, [("a", 2181), ("b", 2181), ("[::1]", 2183)]);
        assert_eq!(parts.tail, "/base");
        let parts = split("etcd://127.0.0.1:2381,127.0.0.1/?lease_ttl=2s").unwrap();
        assert_eq!(parts.hosts, [("127.0.0.1", 2381), ("127.0.0.1", 2379)]);
        assert_eq!(parts.tail, "/?lease_ttl=2s");
        let parts = split("redis://127.0.0.1").unwrap();
        assert_eq!((parts.hosts[0], parts.tail), (("127.0.0.1", 6379), ""));
    }

    #[test]
    fn unroutable_backends_are_refused_with_the_reason() {
        for url in [
            "sqlite:///tmp/x.db",
            "memory://",
            "redis+cluster://127.0.0.1:7000/",
            "rediss://h:6390/",
            "no-scheme",
        ] {
            let error = split(url).unwrap_err().to_string();
            assert!(error.contains("network faults"), "{url}: {error}");
        }
        assert!(split("redis://127.0.0.1:99999/").is_err());
        assert!(split("redis://:6379/").is_err());
    }
}
