//! The overselling demo's strategies: the one list of them, and what each one needs.

use std::fmt;
use std::path::Path;

use clap::ValueEnum;
use serde::{Serialize, Serializer};

use crate::cli::{Servers, value_help, value_name};

/// A way to sell from the stock, as `--strategy` names it. The order is the table's; the doc
/// comment of a variant is its description in `--help` and in the reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Strategy {
    /// no lock: read, think, write
    None,
    /// a Rust mutex in each process
    InProcess,
    /// distlock's SQLite table-record lock
    TableLock,
    /// distlock's Redis reentrant lock
    Redis,
    /// distlock's Redis spin lock
    RedisSpin,
    /// distlock's Redlock over independent Redis masters
    Redlock,
    /// distlock's ZooKeeper sequential-node lock
    #[value(name = "zookeeper")]
    ZooKeeper,
    /// distlock's etcd lock (etcdctl lock's layout)
    Etcd,
    /// distlock's NATS JetStream key-value lock
    Nats,
    /// PostgreSQL: SELECT ... FOR UPDATE in a transaction
    PgPessimistic,
    /// PostgreSQL: version column, at most 10 attempts per order
    PgOptimistic,
    /// distlock's PostgreSQL advisory lock around a committed transaction
    PgAdvisory,
    /// MySQL/MariaDB: SELECT ... FOR UPDATE in a transaction
    #[value(name = "mysql-pessimistic")]
    MySqlPessimistic,
    /// MySQL/MariaDB: version column, at most 10 attempts per order
    #[value(name = "mysql-optimistic")]
    MySqlOptimistic,
    /// distlock's MySQL named lock around a committed transaction
    #[value(name = "mysql-named")]
    MySqlNamed,
    /// Redis: check and decrement in one Lua script, no lock
    RedisAtomic,
}

/// Where a strategy keeps the stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Database {
    Sqlite,
    Postgres,
    #[value(name = "mysql")]
    MySql,
    Redis,
}

impl Database {
    /// The name, as in reports and on the workers' command line.
    pub fn name(self) -> &'static str {
        match self {
            Database::Sqlite => "sqlite",
            Database::Postgres => "postgres",
            Database::MySql => "mysql",
            Database::Redis => "redis",
        }
    }
}

/// How a strategy protects the read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    Nothing,
    ProcessMutex,
    /// A distlock lock around the purchase.
    Lock,
    RowLock,
    Version,
    /// One atomic step of the store; the work runs after it.
    Atomic,
}

impl Strategy {
    /// Every strategy, in the table's order.
    pub fn all() -> Vec<Strategy> {
        Strategy::value_variants().to_vec()
    }

    /// The name on the command line and in the reports.
    pub fn name(self) -> String {
        value_name(&self)
    }

    /// What the strategy does, in a few words.
    pub fn description(self) -> String {
        value_help(&self)
    }

    pub fn database(self) -> Database {
        match self {
            Strategy::PgPessimistic | Strategy::PgOptimistic | Strategy::PgAdvisory => {
                Database::Postgres
            }
            Strategy::MySqlPessimistic | Strategy::MySqlOptimistic | Strategy::MySqlNamed => {
                Database::MySql
            }
            Strategy::RedisAtomic => Database::Redis,
            Strategy::None
            | Strategy::InProcess
            | Strategy::TableLock
            | Strategy::Redis
            | Strategy::RedisSpin
            | Strategy::Redlock
            | Strategy::ZooKeeper
            | Strategy::Etcd
            | Strategy::Nats => Database::Sqlite,
        }
    }

    pub fn protection(self) -> Protection {
        match self {
            Strategy::None => Protection::Nothing,
            Strategy::InProcess => Protection::ProcessMutex,
            Strategy::PgPessimistic | Strategy::MySqlPessimistic => Protection::RowLock,
            Strategy::PgOptimistic | Strategy::MySqlOptimistic => Protection::Version,
            Strategy::RedisAtomic => Protection::Atomic,
            Strategy::TableLock
            | Strategy::Redis
            | Strategy::RedisSpin
            | Strategy::Redlock
            | Strategy::ZooKeeper
            | Strategy::Etcd
            | Strategy::Nats
            | Strategy::PgAdvisory
            | Strategy::MySqlNamed => Protection::Lock,
        }
    }

    /// The distlock backend the strategy locks with, if it uses one; `db` is the SQLite file.
    pub fn lock_url(self, db: &Path, servers: &Servers) -> Option<String> {
        match self {
            Strategy::TableLock => Some(format!("sqlite://{}", db.display())),
            Strategy::Redis => Some(servers.redis.clone()),
            Strategy::RedisSpin => Some(spin_url(&servers.redis)),
            Strategy::Redlock => Some(servers.redlock.clone()),
            Strategy::ZooKeeper => Some(servers.zookeeper.clone()),
            Strategy::Etcd => Some(servers.etcd.clone()),
            Strategy::Nats => Some(servers.nats.clone()),
            Strategy::PgAdvisory => Some(servers.postgres.clone()),
            Strategy::MySqlNamed => Some(servers.mysql.clone()),
            Strategy::None
            | Strategy::InProcess
            | Strategy::PgPessimistic
            | Strategy::PgOptimistic
            | Strategy::MySqlPessimistic
            | Strategy::MySqlOptimistic
            | Strategy::RedisAtomic => None,
        }
    }

    /// The server of a strategy that keeps its stock in PostgreSQL, MySQL or Redis.
    pub fn store_url(self, servers: &Servers) -> Option<String> {
        match self.database() {
            Database::Sqlite => None,
            Database::Postgres => Some(servers.postgres.clone()),
            Database::MySql => Some(servers.mysql.clone()),
            Database::Redis => Some(servers.redis.clone()),
        }
    }
}

impl fmt::Display for Strategy {
    /// The name; a width pads it, as in the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.name())
    }
}

impl Serialize for Strategy {
    /// The name, as on the command line.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name())
    }
}

/// The spin lock on the deployment a Redis URL names (standalone, Sentinel or Cluster).
pub fn spin_url(redis: &str) -> String {
    let separator = if redis.contains('?') { '&' } else { '?' };
    format!("{redis}{separator}spin=true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions_come_from_the_enum() {
        let names: Vec<String> = Strategy::all().into_iter().map(Strategy::name).collect();
        assert_eq!(
            names,
            [
                "none",
                "in-process",
                "table-lock",
                "redis",
                "redis-spin",
                "redlock",
                "zookeeper",
                "etcd",
                "nats",
                "pg-pessimistic",
                "pg-optimistic",
                "pg-advisory",
                "mysql-pessimistic",
                "mysql-optimistic",
                "mysql-named",
                "redis-atomic",
            ]
        );
        assert_eq!(
            Strategy::PgPessimistic.description(),
            "PostgreSQL: SELECT ... FOR UPDATE in a transaction"
        );
        assert_eq!(format!("{:<12}|", Strategy::Redis), "redis       |");
        assert_eq!(
            serde_json::to_string(&Strategy::MySqlNamed).unwrap(),
            r#""mysql-named""#
        );
    }

    #[test]
    fn every_strategy_has_a_description() {
        for strategy in Strategy::all() {
            assert!(!strategy.description().is_empty(), "{strategy}");
        }
    }
}
