//! Listing the locks held (`distlock list`). Every lock is one child of the base path (its
//! name escaped into one path component, `/` included), so the listing reads the base's
//! children once, keeps those whose names start with the prefix, and looks into them in the
//! names' byte order until `limit` are held:
//!
//! * the sequential lock's node holds a lock while it has a node of one of Curator's recipes
//!   (mutex, reader-writer lock, leader latch): the first node of a line holds, so a lock with
//!   contenders has a holder (the container node itself lingers empty until the server
//!   removes it, and is not listed then);
//! * the naive lock's node is the lock itself, an ephemeral node.
//!
//! Published records (`NAME#published`, a raw `#` no escaped name has) and any other child
//! whose name is not an escaped lock name are left out. At most [`MAX_LOOKED_INTO`] lock
//! nodes are looked into, [`AT_ONCE`] at a time.

use futures_util::future::try_join_all;

use super::*;
use crate::name::unescape;

/// The most lock nodes one listing looks into; a listing stops there, with the names found.
const MAX_LOOKED_INTO: usize = 100_000;
/// How many lock nodes are looked into at once (requests in flight on the session).
const AT_ONCE: usize = 64;

/// The lock name whose node under the base is `child` ([`lock_path`]); `None` for any other
/// node.
fn name_of(child: &str) -> Option<String> {
    match child {
        // The two names that are not node names on their own.
        "%2E" => Some(".".to_owned()),
        "%2E%2E" => Some("..".to_owned()),
        _ => unescape(child),
    }
}

impl Shared {
    pub(super) async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let session = self.session();
        self.catch_up(&session, &self.url.base, "list the locks")
            .await?;
        let children = match session.client.list_children(&self.url.base).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.err("list the locks", e)),
        };
        // Escaping does not keep the names' order (`%` sorts before `-`): sort the names.
        let mut candidates: Vec<(String, String)> = children
            .into_iter()
            .filter_map(|child| {
                let name = name_of(&child)?;
                name.starts_with(prefix).then_some((name, child))
            })
            .collect();
        candidates.sort_unstable();
        candidates.truncate(MAX_LOOKED_INTO);
        let mut held = Vec::new();
        for batch in candidates.chunks(AT_ONCE) {
            let looks = batch
                .iter()
                .map(|(_, child)| self.lock_node_held(&session, child));
            for ((name, _), holds) in batch.iter().zip(try_join_all(looks).await?) {
                if holds {
                    held.push(name.clone());
                    if held.len() == limit {
                        return Ok(held);
                    }
                }
            }
        }
        Ok(held)
    }

    /// True when the child `child` of the base holds a lock now.
    async fn lock_node_held(&self, session: &Session, child: &str) -> Result<bool> {
        let path = format!("{}/{child}", self.url.base);
        if self.url.naive {
            match session.client.check_stat(&path).await {
                Ok(stat) => Ok(stat.is_some_and(|stat| stat.ephemeral_owner != 0)),
                Err(e) => Err(self.err("list the locks", e)),
            }
        } else {
            Ok(!self.queue(session, &path).await?.is_empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_nodes_map_back_to_names_and_other_nodes_do_not() {
        for name in ["a/b", ".", "..", "...", "ä b", "x#published"] {
            let path = lock_path("/base", name);
            let child = path.strip_prefix("/base/").unwrap();
            assert_eq!(name_of(child).as_deref(), Some(name), "{child}");
        }
        assert_eq!(name_of("a%2Fb#published"), None);
        assert_eq!(name_of("a/b"), None);
        assert_eq!(name_of("%2e"), None);
    }
}
