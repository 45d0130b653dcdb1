//! The hot-item scenario's strategies: the one list of them, and the servers each one uses.

use std::fmt;
use std::path::Path;

use clap::ValueEnum;

use crate::cli::{Servers, value_name};
use crate::demo::strategy::{Database, spin_url};

/// A lock the hot-item scenario runs, as `--strategy` names it (the overselling demo's name
/// for the same lock), or the Redis atomic script as the ceiling. The doc comment of a
/// variant is its description in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HotStrategy {
    /// distlock's SQLite table-record lock; the stock in an SQLite file
    TableLock,
    /// distlock's Redis reentrant lock; the stock in Redis
    Redis,
    /// distlock's Redis spin lock; the stock in Redis
    RedisSpin,
    /// distlock's ZooKeeper sequential-node lock; the stock in Redis
    #[value(name = "zookeeper")]
    ZooKeeper,
    /// distlock's etcd lock; the stock in Redis
    Etcd,
    /// distlock's NATS JetStream key-value lock; the stock in Redis
    Nats,
    /// distlock's PostgreSQL advisory lock; the stock in PostgreSQL
    PgAdvisory,
    /// distlock's MySQL named lock; the stock in MySQL/MariaDB
    #[value(name = "mysql-named")]
    MySqlNamed,
    /// Redis: check and decrement in one Lua script, no lock (the ceiling)
    RedisAtomic,
}

impl HotStrategy {
    /// What runs without `--strategy`.
    pub fn defaults() -> Vec<HotStrategy> {
        vec![
            HotStrategy::TableLock,
            HotStrategy::Redis,
            HotStrategy::RedisAtomic,
        ]
    }

    /// The name on the command line and in the reports.
    pub fn name(self) -> String {
        value_name(&self)
    }

    /// The lock backend, or `None` for the store's atomic step; `dir` holds the SQLite
    /// lock file.
    pub fn lock_url(self, servers: &Servers, dir: &Path) -> Option<String> {
        match self {
            HotStrategy::TableLock => Some(format!("sqlite://{}", dir.join("locks.db").display())),
            HotStrategy::Redis => Some(servers.redis.clone()),
            HotStrategy::RedisSpin => Some(spin_url(&servers.redis)),
            HotStrategy::ZooKeeper => Some(servers.zookeeper.clone()),
            HotStrategy::Etcd => Some(servers.etcd.clone()),
            HotStrategy::Nats => Some(servers.nats.clone()),
            HotStrategy::PgAdvisory => Some(servers.postgres.clone()),
            HotStrategy::MySqlNamed => Some(servers.mysql.clone()),
            HotStrategy::RedisAtomic => None,
        }
    }

    /// Where the stock lives: on the lock's own server where that server can keep it
    /// (SQLite, PostgreSQL, MySQL), else (ZooKeeper, etcd, NATS) in Redis, like the Redis strategies.
    /// `sqlite_store` is the SQLite stock file.
    pub fn store(self, servers: &Servers, sqlite_store: &Path) -> Store {
        let (database, spec) = match self {
            HotStrategy::TableLock => (Database::Sqlite, sqlite_store.display().to_string()),
            HotStrategy::PgAdvisory => (Database::Postgres, servers.postgres.clone()),
            HotStrategy::MySqlNamed => (Database::MySql, servers.mysql.clone()),
            HotStrategy::Redis
            | HotStrategy::RedisSpin
            | HotStrategy::ZooKeeper
            | HotStrategy::Etcd
            | HotStrategy::Nats
            | HotStrategy::RedisAtomic => (Database::Redis, servers.redis.clone()),
        };
        Store { database, spec }
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
        f.pad(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_item_strategies_keep_the_demo_names() {
        let names: Vec<String> = HotStrategy::value_variants()
            .iter()
            .map(|strategy| strategy.name())
            .collect();
        assert_eq!(
            names,
            [
                "table-lock",
                "redis",
                "redis-spin",
                "zookeeper",
                "etcd",
                "nats",
                "pg-advisory",
                "mysql-named",
                "redis-atomic",
            ]
        );
    }
}
