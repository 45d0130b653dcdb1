//! Listing the locks held (`distlock list`): a SCAN of the keyspace for lock keys,
//! `distlock:{<escaped name>}:lock`, which exist exactly while their lock is held (Redis
//! deletes a key whose lease ran out). The lock's other keys (`:fence`, `:queue`, ...) and
//! published records (`:published`) end otherwise and are not matched.
//!
//! SCAN visits the whole keyspace in its own (hash) order, so the names are collected while it
//! runs, keeping only the smallest ones asked for, and sorted at the end. On a Cluster every
//! master is scanned, one after another.

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::deployment::Commands;
use super::{RedisBackend, SCHEME, backend_error};
use crate::error::{Error, Result};
use crate::name::{Smallest, escape, unescape};

/// How many keys one SCAN step looks at (its COUNT hint).
const SCAN_COUNT: usize = 1000;

const KEY_START: &str = "distlock:{";
const KEY_END: &str = "}:lock";

/// The SCAN pattern of the lock keys of names that start with `prefix`. An escaped name
/// has no glob character; they are escaped all the same, should the escaping ever change.
fn pattern(prefix: &str) -> String {
    let mut pattern = String::from(KEY_START);
    for c in escape(prefix).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern.push_str(KEY_END);
    pattern
}

/// The lock name whose lock key is `key`; `None` for any other key.
fn name_of(key: &str) -> Option<String> {
    let tag = key.strip_prefix(KEY_START)?.strip_suffix(KEY_END)?;
    unescape(tag)
}

impl RedisBackend {
    /// The names with a lock key under `prefix`, in byte order: the smallest `keep` of them,
    /// and whether more were found.
    pub(super) async fn held_names(
        &self,
        prefix: &str,
        keep: usize,
    ) -> Result<(Vec<String>, bool)> {
        let mut found = Smallest::new(keep);
        if keep == 0 {
            return Ok((Vec::new(), false));
        }
        let pattern = pattern(prefix);
        match &self.connection {
            Commands::Cluster(_) => {
                let Some(owners) = self.slot_owners().await else {
                    return Err(Error::backend(
                        SCHEME,
                        "list the locks",
                        "the Cluster's masters could not be read (CLUSTER SLOTS)",
                    ));
                };
                let mut masters: Vec<(String, u16)> =
                    owners.into_iter().map(|(_, _, node)| node).collect();
                masters.sort();
                masters.dedup();
                for master in masters {
                    self.scan(Some(master), &pattern, prefix, &mut found)
                        .await?;
                }
            }
            _ => self.scan(None, &pattern, prefix, &mut found).await?,
        }
        let left_out = found.left_out;
        Ok((found.into_sorted(), left_out))
    }

    /// Runs one SCAN to its end, on the server of the command connection or on the Cluster
    /// master at `node`, adding the names of the lock keys it finds.
    async fn scan(
        &self,
        node: Option<(String, u16)>,
        pattern: &str,
        prefix: &str,
        found: &mut Smallest,
    ) -> Result<()> {
        let mut cursor: u64 = 0;
        loop {
            let mut step = redis::cmd("SCAN");
            step.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let reply: (u64, Vec<String>) = match (&self.connection, &node) {
                (Commands::Cluster(connection), Some((host, port))) => {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    });
                    let value = connection
                        .clone()
                        .route_command(step, route)
                        .await
                        .map_err(backend_error("list the locks"))?;
                    redis::from_redis_value(value)
                        .map_err(|error| Error::backend(SCHEME, "list the locks", error))?
                }
                _ => step
                    .query_async(&mut self.connection.clone())
                    .await
                    .map_err(backend_error("list the locks"))?,
            };
            for name in reply.1.iter().filter_map(|key| name_of(key)) {
                if name.starts_with(prefix) {
                    found.add(name);
                }
            }
            cursor = reply.0;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::LockName;

    #[test]
    fn lock_keys_map_back_to_names_and_other_keys_do_not() {
        let keys = super::super::Keys::of(&LockName::new("orders/{42}:x").unwrap());
        assert_eq!(name_of(&keys.lock).as_deref(), Some("orders/{42}:x"));
        for other in [&keys.fence, &keys.queue, &keys.seen, &keys.terms] {
            assert_eq!(name_of(other), None, "{other}");
        }
        assert_eq!(name_of("distlock:{a}:published"), None);
        assert_eq!(name_of("distlock:stock:{a}"), None);
        assert_eq!(name_of("distlock:{a%2f}:lock"), None);
    }

    #[test]
    fn the_pattern_matches_escaped_prefixes() {
        assert_eq!(pattern(""), "distlock:{*}:lock");
        assert_eq!(pattern("a/b*"), "distlock:{a%2Fb%2A*}:lock");
    }
}
