//! The overselling demo's strategies: the one list of them, and what each one needs. The
//! lock strategies come from the registry ([`distlock::scheme::demo_locks`]); the others
//! are the stock stores' own ways of selling, named here with their stores.

use std::fmt;
use std::path::Path;
use std::sync::LazyLock;

use clap::ValueEnum;
use clap::builder::PossibleValue;
use distlock::scheme::{DemoLock, DemoServer, demo_locks};
use serde::{Serialize, Serializer};

use super::servers::Servers;

/// A way to sell from the stock, as `--strategy` names it. The order is the table's: no lock,
/// a process mutex, every backend's lock in the registry's order, then the databases' ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    None,
    InProcess,
    /// A distlock lock around the purchase: a backend's strategy of the registry.
    Lock(&'static DemoLock),
    PgPessimistic,
    PgOptimistic,
    MySqlPessimistic,
    MySqlOptimistic,
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
    /// Every store.
    pub fn all() -> [Database; 4] {
        [
            Database::Sqlite,
            Database::Postgres,
            Database::MySql,
            Database::Redis,
        ]
    }

    /// The name, as in reports and on the workers' command line.
    pub fn name(self) -> &'static str {
        match self {
            Database::Sqlite => "sqlite",
            Database::Postgres => "postgres",
            Database::MySql => "mysql",
            Database::Redis => "redis",
        }
    }

    /// What it is, in a sentence (`the stock in Redis`).
    pub fn title(self) -> &'static str {
        match self {
            Database::Sqlite => "an SQLite file",
            Database::Postgres => "PostgreSQL",
            Database::MySql => "MySQL/MariaDB",
            Database::Redis => "Redis",
        }
    }

    /// The demo's flag that names this store's server (`None`: the demo's SQLite file).
    pub fn server_flag(self) -> Option<&'static str> {
        match self {
            Database::Sqlite => None,
            database => Some(database.name()),
        }
    }

    /// The store on a lock's server (`None`: the demo's SQLite file), if it is one.
    pub fn on(server: Option<&DemoServer>) -> Option<Database> {
        let flag = server.map(|server| server.flag);
        Database::all()
            .into_iter()
            .find(|database| database.server_flag() == flag)
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

/// Every strategy, in the table's order.
static ALL: LazyLock<Vec<Strategy>> = LazyLock::new(|| {
    [Strategy::None, Strategy::InProcess]
        .into_iter()
        .chain(demo_locks().map(Strategy::Lock))
        .chain([
            Strategy::PgPessimistic,
            Strategy::PgOptimistic,
            Strategy::MySqlPessimistic,
            Strategy::MySqlOptimistic,
            Strategy::RedisAtomic,
        ])
        .collect()
});

impl Strategy {
    /// Every strategy, in the table's order.
    pub fn all() -> Vec<Strategy> {
        ALL.clone()
    }

    /// The name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::InProcess => "in-process",
            Strategy::Lock(lock) => lock.strategy,
            Strategy::PgPessimistic => "pg-pessimistic",
            Strategy::PgOptimistic => "pg-optimistic",
            Strategy::MySqlPessimistic => "mysql-pessimistic",
            Strategy::MySqlOptimistic => "mysql-optimistic",
            Strategy::RedisAtomic => "redis-atomic",
        }
    }

    /// What the strategy does, in a few words.
    pub fn description(self) -> &'static str {
        match self {
            Strategy::None => "no lock: read, think, write",
            Strategy::InProcess => "a Rust mutex in each process",
            Strategy::Lock(lock) => lock.description,
            Strategy::PgPessimistic => "PostgreSQL: SELECT ... FOR UPDATE in a transaction",
            Strategy::PgOptimistic => "PostgreSQL: version column, at most 10 attempts per order",
            Strategy::MySqlPessimistic => "MySQL/MariaDB: SELECT ... FOR UPDATE in a transaction",
            Strategy::MySqlOptimistic => {
                "MySQL/MariaDB: version column, at most 10 attempts per order"
            }
            Strategy::RedisAtomic => "Redis: check and decrement in one Lua script, no lock",
        }
    }

    /// Where the stock is: a lock's own server where it keeps it there, else the SQLite file.
    pub fn database(self) -> Database {
        match self {
            Strategy::PgPessimistic | Strategy::PgOptimistic => Database::Postgres,
            Strategy::MySqlPessimistic | Strategy::MySqlOptimistic => Database::MySql,
            Strategy::RedisAtomic => Database::Redis,
            Strategy::Lock(lock) if lock.stock_on_server => {
                Database::on(lock.server).unwrap_or(Database::Sqlite)
            }
            Strategy::Lock(_) | Strategy::None | Strategy::InProcess => Database::Sqlite,
        }
    }

    pub fn protection(self) -> Protection {
        match self {
            Strategy::None => Protection::Nothing,
            Strategy::InProcess => Protection::ProcessMutex,
            Strategy::PgPessimistic | Strategy::MySqlPessimistic => Protection::RowLock,
            Strategy::PgOptimistic | Strategy::MySqlOptimistic => Protection::Version,
            Strategy::RedisAtomic => Protection::Atomic,
            Strategy::Lock(_) => Protection::Lock,
        }
    }

    /// The flags of the servers the strategy uses: its lock's and its stock's.
    pub fn server_flags(self) -> Vec<&'static str> {
        let lock = match self {
            Strategy::Lock(lock) => lock.server.map(|server| server.flag),
            _ => None,
        };
        let mut flags: Vec<&'static str> = lock.into_iter().collect();
        if let Some(flag) = self.database().server_flag() {
            if !flags.contains(&flag) {
                flags.push(flag);
            }
        }
        flags
    }

    /// The distlock backend the strategy locks with, if it uses one; `db` is the SQLite file.
    pub fn lock_url(self, db: &Path, servers: &Servers) -> Option<String> {
        match self {
            Strategy::Lock(lock) => Some(lock_url(lock, servers, db)),
            _ => None,
        }
    }

    /// The server of a strategy that keeps its stock in PostgreSQL, MySQL or Redis.
    pub fn store_url(self, servers: &Servers) -> Option<String> {
        let flag = self.database().server_flag()?;
        servers.url(flag).map(str::to_owned)
    }
}

/// The URL of a registry lock on the demo's servers; `sqlite` is the file a lock without a
/// server of its own (the table lock) keeps its table in.
pub fn lock_url(lock: &DemoLock, servers: &Servers, sqlite: &Path) -> String {
    match lock.server {
        Some(server) => lock.url(&servers.of(server)),
        None => lock.url(&format!("sqlite://{}", sqlite.display())),
    }
}

impl ValueEnum for Strategy {
    fn value_variants<'a>() -> &'a [Self] {
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(self.description()))
    }
}

impl fmt::Display for Strategy {
    /// The name; a width pads it, as in the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for Strategy {
    /// The name, as on the command line.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_fixed_around_the_registry_locks() {
        let names: Vec<&str> = Strategy::all().into_iter().map(Strategy::name).collect();
        let locks: Vec<&str> = demo_locks().map(|lock| lock.strategy).collect();
        let mut expected = vec!["none", "in-process"];
        expected.extend(&locks);
        expected.extend([
            "pg-pessimistic",
            "pg-optimistic",
            "mysql-pessimistic",
            "mysql-optimistic",
            "redis-atomic",
        ]);
        assert_eq!(names, expected);
        for known in [
            "table-lock",
            "redis",
            "redis-spin",
            "redlock",
            "pg-advisory",
        ] {
            assert!(locks.contains(&known), "{known} is missing: {locks:?}");
        }
        assert_eq!(
            Strategy::PgPessimistic.description(),
            "PostgreSQL: SELECT ... FOR UPDATE in a transaction"
        );
        assert_eq!(format!("{:<12}|", Strategy::None), "none        |");
        assert_eq!(
            serde_json::to_string(&Strategy::MySqlOptimistic).unwrap(),
            r#""mysql-optimistic""#
        );
    }

    #[test]
    fn every_strategy_has_a_description_and_parses_by_name() {
        for strategy in Strategy::all() {
            assert!(!strategy.description().is_empty(), "{strategy}");
            assert_eq!(Strategy::from_str(strategy.name(), false), Ok(strategy));
        }
    }

    #[test]
    fn a_lock_keeps_its_stock_on_its_own_database_only_where_it_says() {
        for strategy in Strategy::all() {
            let Strategy::Lock(lock) = strategy else {
                continue;
            };
            let database = strategy.database();
            if lock.stock_on_server {
                assert_eq!(Some(database), Database::on(lock.server), "{strategy}");
            } else {
                assert_eq!(database, Database::Sqlite, "{strategy}");
            }
        }
    }
}
