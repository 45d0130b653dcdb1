//! Helpers shared by the test modules (not every feature set uses every helper). The servers come from `distlock::conformance::servers`.
#![allow(dead_code)]

use std::collections::HashMap;

use distlock::conformance::servers;

pub mod redlock;

/// The Redis server's URL; fails at once, naming the address, when nothing answers there.
pub fn redis_url() -> String {
    servers::REDIS.url()
}

/// Acquires the mutex `name` on `locks`, waiting as long as it takes.
pub async fn hold(locks: &distlock::Locks, name: &str) -> distlock::Guard {
    locks
        .mutex(name)
        .unwrap()
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?}: {e}"))
}

/// `url` with its `key=value` option replaced by `pair` (or removed when `pair` is empty).
pub fn with_option(url: &str, key: &str, pair: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with(&format!("{key}=")))
        .collect();
    if !pair.is_empty() {
        pairs.push(pair);
    }
    format!("{base}?{}", pairs.join("&"))
}

/// A name no other test run uses.
pub fn item(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A resource guarded by fencing tokens: it remembers the highest token it accepted per item
/// and refuses any write that carries a lower one.
#[derive(Default)]
pub struct FencedStock {
    pub items: HashMap<String, (u64, i64)>,
}

impl FencedStock {
    pub fn write(&mut self, item: &str, token: u64, stock: i64) -> Result<(), String> {
        let entry = self.items.entry(item.to_owned()).or_insert((0, 0));
        if token < entry.0 {
            return Err(format!(
                "stale fencing token {token}: {} was already accepted",
                entry.0
            ));
        }
        *entry = (token, stock);
        Ok(())
    }
}
