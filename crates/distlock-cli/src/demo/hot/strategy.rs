//! The hot-item scenario's strategies: every lock of the registry (the overselling demo's
//! names for them), and the Redis atomic script as the ceiling.

use std::fmt;
use std::path::Path;
use std::sync::LazyLock;

use clap::ValueEnum;
use clap::builder::PossibleValue;
use distlock::scheme::{DemoLock, demo_locks};

use crate::demo::servers::Servers;
use crate::demo::strategy::{Database, lock_url};

/// A lock the hot-item scenario runs, as `--strategy` names it, or the Redis atomic script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotStrategy {
    /// A backend's lock of the registry.
    Lock(&'static DemoLock),
    /// Redis: check and decrement in one Lua script, no lock (the ceiling).
    RedisAtomic,
}

/// Every strategy, in `--help`'s order.
static ALL: LazyLock<Vec<HotStrategy>> = LazyLock::new(|| {
    demo_locks()
        .map(HotStrategy::Lock)
        .chain([HotStrategy::RedisAtomic])
        .collect()
});

/// Their descriptions, made once: `--help` borrows them.
static DESCRIPTIONS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ALL.iter()
        .map(|strategy| match strategy {
            HotStrategy::Lock(lock) => format!(
                "{}; the stock in {}",
                lock.description,
                strategy.database().title()
            ),
            HotStrategy::RedisAtomic => {
                "Redis: check and decrement in one Lua script, no lock (the ceiling)".to_owned()
            }
        })
        .collect()
});

/// What runs without `--strategy`: the embedded table lock, the Redis lock, and the ceiling.
const DEFAULTS: [&str; 3] = ["table-lock", "redis", "redis-atomic"];

impl HotStrategy {
    /// What runs without `--strategy`.
    pub fn defaults() -> Vec<HotStrategy> {
        ALL.iter()
            .copied()
            .filter(|strategy| DEFAULTS.contains(&strategy.name()))
            .collect()
    }

    /// The name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            HotStrategy::Lock(lock) => lock.strategy,
            HotStrategy::RedisAtomic => "redis-atomic",
        }
    }

    /// The lock backend, or `None` for the store's atomic step; `dir` holds the SQLite
    /// lock file.
    pub fn lock_url(self, servers: &Servers, dir: &Path) -> Option<String> {
        match self {
            HotStrategy::Lock(lock) => Some(lock_url(lock, servers, &dir.join("locks.db"))),
            HotStrategy::RedisAtomic => None,
        }
    }

    /// Which store keeps the stock: the lock's own server where the lock says so (SQLite,
    /// PostgreSQL, MySQL), else Redis, like the Redis strategies.
    fn database(self) -> Database {
        match self {
            HotStrategy::Lock(lock) if lock.stock_on_server => {
                Database::on(lock.server).unwrap_or(Database::Redis)
            }
            HotStrategy::Lock(_) | HotStrategy::RedisAtomic => Database::Redis,
        }
    }

    /// Where the stock lives; `sqlite_store` is the SQLite stock file. `None` when no flag
    /// names the store's server.
    pub fn store(self, servers: &Servers, sqlite_store: &Path) -> Option<Store> {
        let database = self.database();
        let spec = match database.server_flag() {
            None => sqlite_store.display().to_string(),
            Some(flag) => servers.url(flag)?.to_owned(),
        };
        Some(Store { database, spec })
    }
}

impl ValueEnum for HotStrategy {
    fn value_variants<'a>() -> &'a [Self] {
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let at = ALL.iter().position(|known| known == self)?;
        Some(PossibleValue::new(self.name()).help(DESCRIPTIONS[at].as_str()))
    }
}

/// Where a hot-item run keeps its stock: the kind of store, and its URL (the file's path for
/// SQLite).
#[derive(Debug, Clone)]
pub struct Store {
    pub database: Database,
    pub spec: String,
}

impl fmt::Display for HotStrategy {
    /// The name; a width pads it, as in the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_item_strategies_are_the_registry_locks_and_the_ceiling() {
        let names: Vec<&str> = HotStrategy::value_variants()
            .iter()
            .map(|strategy| strategy.name())
            .collect();
        let mut expected: Vec<&str> = demo_locks().map(|lock| lock.strategy).collect();
        expected.push("redis-atomic");
        assert_eq!(names, expected);
        let defaults: Vec<&str> = HotStrategy::defaults()
            .into_iter()
            .map(HotStrategy::name)
            .collect();
        assert_eq!(defaults, DEFAULTS);
    }

    #[test]
    fn every_hot_strategy_has_a_description_naming_its_store() {
        for strategy in HotStrategy::value_variants() {
            let help = strategy
                .to_possible_value()
                .and_then(|value| value.get_help().map(ToString::to_string));
            let help = help.unwrap_or_default();
            assert!(
                help.contains("stock") || help.contains("ceiling"),
                "{strategy}: {help}"
            );
        }
    }
}
