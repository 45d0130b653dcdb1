//! The stores: SQLite files, Redis, PostgreSQL and MySQL.

#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "redis")]
pub use self::redis::RedisStockStore;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::sql::SqlStockStore;
#[cfg(feature = "sqlite")]
pub use self::sqlite::{SqliteDurability, SqliteStockStore};
