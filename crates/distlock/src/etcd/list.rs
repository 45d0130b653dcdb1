//! Listing the locks held (`distlock list`): a keys-only range read of the keys under
//! `<url prefix><escaped name prefix>`, in pages of [`PAGE`] keys read at the revision of
//! the first page, so that the pages show one moment.
//!
//! A contender's key is `<url prefix><escaped name>/<lease id in hex>[-<n>]`, under an etcd
//! lease; the first contender holds, so a name with a contender key is held. An election's
//! candidates are contenders of its lock name (`NAME#leader`) and are listed under it.
//! Published records (`NAME#published`), the backend's probe keys and any key without a `/`
//! after an escaped name, or not under a lease, are left out. Keys come in the order of the
//! escaped names, which is not the names' order (`%` sorts before `-`): the whole range is
//! read, keeping the smallest names asked for.

use super::api::etcdserverpb::RangeRequest;
use super::rpc::prefix_end;
use super::*;
use crate::name::{Smallest, escape, unescape};

/// How many keys one read of the range returns at most.
const PAGE: i64 = 1000;

/// The lock name of the contender key `key` (its part after the URL's prefix); `None` for
/// any other key.
fn name_of(key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    let (escaped, contender) = key.split_once('/')?;
    let lease_key = contender
        .split_once('-')
        .map_or((contender, None), |(lease, n)| (lease, Some(n)));
    let well_formed = !lease_key.0.is_empty()
        && lease_key.0.bytes().all(|b| b.is_ascii_hexdigit())
        && lease_key
            .1
            .is_none_or(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return None;
    }
    unescape(escaped)
}

impl Shared {
    pub(super) async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let mut found = Smallest::new(limit);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let start = format!("{}{}", self.url.prefix, escape(prefix)).into_bytes();
        let end = prefix_end(&start);
        // etcd refuses an empty key; `\0` is the first key there is.
        let mut from = if start.is_empty() { vec![0] } else { start };
        let mut revision = 0;
        loop {
            // Revision 0 reads the newest; the next pages read the first page's.
            let read = RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                keys_only: true,
                limit: PAGE,
                revision,
                ..RangeRequest::default()
            };
            let page = self.call("list the locks", self.rpc.range(read)).await?;
            if revision == 0 {
                revision = rpc::revision_of(page.header.as_ref());
            }
            for kv in &page.kvs {
                let Some(key) = kv.key.strip_prefix(self.url.prefix.as_bytes()) else {
                    continue;
                };
                if kv.lease == 0 {
                    continue;
                }
                if let Some(name) = name_of(key).filter(|name| name.starts_with(prefix)) {
                    found.add(name);
                }
            }
            match page.kvs.last() {
                Some(last) if page.more => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(found.into_sorted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_keys_map_back_to_names_and_other_keys_do_not() {
        assert_eq!(name_of(b"a%2Fb/694d7c1f0a2b").as_deref(), Some("a/b"));
        assert_eq!(
            name_of(b"a%23leader/694d7c1f0a2b-3").as_deref(),
            Some("a#leader")
        );
        for other in [
            &b"a%2Fb#published"[..],
            b"distlock-ping",
            b"distlock-held-keys",
            b"a/b/c",
            b"a/",
            b"a/xyz",
            b"a/12-",
            b"a b/12",
        ] {
            assert_eq!(name_of(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
