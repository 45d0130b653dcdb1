//! What a scheme offers `distlock demo`: the lock strategies its backend runs in the
//! overselling demo and the hot-item scenario, and the server each of them locks on. Each
//! backend names them in its scheme rows, so that the demo's strategies, its server flags and
//! its tests come from the registry and a new backend needs no change to the command line.

use crate::servers::Server;

/// A lock strategy of `distlock demo`: this backend's lock around each purchase.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DemoLock {
    /// The strategy's name on `--strategy` and in the reports (`nats`).
    pub strategy: &'static str,
    /// What it is, in a few words: the strategy's help and its line in the reports.
    pub description: &'static str,
    /// The server it locks on; `None`: the demo's own SQLite file (`--db`).
    pub server: Option<&'static DemoServer>,
    /// Options added to the server's URL for this strategy (`spin=true`).
    pub query: Option<&'static str>,
    /// True when the strategy keeps the stock on the lock's own server (its database, or the
    /// SQLite file) rather than where the demo keeps it for every other lock.
    pub stock_on_server: bool,
}

/// A server of `distlock demo`, named by a flag of its own (`--nats URL`).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DemoServer {
    /// The flag, without its dashes (`nats`).
    pub flag: &'static str,
    /// What it is, for the flag's help (`the NATS JetStream servers`).
    pub what: &'static str,
    /// Its URL when the flag is not given.
    pub default: &'static str,
    /// The server of distlock's own tests that the command line's tests point the flag at.
    pub tests: &'static Server,
}

impl DemoLock {
    /// The strategy's lock URL, given the URL of its server (`None`: the SQLite file's).
    pub fn url(&self, server: &str) -> String {
        match self.query {
            Some(query) => {
                let separator = if server.contains('?') { '&' } else { '?' };
                format!("{server}{separator}{query}")
            }
            None => server.to_owned(),
        }
    }
}

/// Every lock strategy of the demo, in the registry's order.
pub fn demo_locks() -> impl Iterator<Item = &'static DemoLock> {
    super::SCHEMES.iter().flat_map(|scheme| scheme.demo)
}

/// Every server the demo's lock strategies use, once each, in the registry's order.
pub fn demo_servers() -> Vec<&'static DemoServer> {
    let mut servers: Vec<&'static DemoServer> = Vec::new();
    for server in demo_locks().filter_map(|lock| lock.server) {
        if !servers.iter().any(|known| known.flag == server.flag) {
            servers.push(server);
        }
    }
    servers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_and_flags_are_each_named_once() {
        let mut names: Vec<&str> = demo_locks().map(|lock| lock.strategy).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a strategy named twice: {names:?}");
        for server in demo_servers() {
            let same: Vec<_> = demo_locks()
                .filter_map(|lock| lock.server)
                .filter(|other| other.flag == server.flag)
                .collect();
            assert!(
                same.iter().all(|other| *other == server),
                "the flag --{} is described two ways",
                server.flag
            );
        }
    }

    #[test]
    fn a_query_is_added_to_the_server_url() {
        let lock = DemoLock {
            strategy: "spin",
            description: "",
            server: None,
            query: Some("spin=true"),
            stock_on_server: false,
        };
        assert_eq!(lock.url("redis://h/"), "redis://h/?spin=true");
        assert_eq!(
            lock.url("redis://h/?fair=false"),
            "redis://h/?fair=false&spin=true"
        );
    }
}
