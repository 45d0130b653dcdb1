//! The bare baselines of `distlock bench --compare`: each backend's cheapest round trip and
//! the simplest lock a user could write by hand against it, on one connection of the same
//! driver distlock uses, with no fencing token, no lease keeping and no waiter. distlock's own
//! acquire+release is measured against them in the same sitting.
//!
//! | backend | round trip | bare pair |
//! |---|---|---|
//! | Redis | `PING` | `SET key 1 NX PX 30000` + `DEL key` |
//! | PostgreSQL | `SELECT 1` | `pg_try_advisory_lock` + `pg_advisory_unlock` |
//! | MySQL/MariaDB | `SELECT 1` | `GET_LOCK(name, 0)` + `RELEASE_LOCK(name)` |
//! | ZooKeeper | `exists` of the base node | `create` of an ephemeral node + `delete` |
//! | etcd | a count-only `range` | a `txn` put if absent + `delete` |
//! | SQLite | `SELECT 1` | `INSERT` of a row + `DELETE`, each a transaction |

use crate::error::{Error, Result};
use crate::scheme::BackendKind;

/// One connection for the bare baselines of `distlock bench --compare`: the round trip and
/// the bare pair of each backend, listed in `bare.rs`.
pub struct Bare {
    connection: Connection,
    /// Distinguishes this run's keys from another run's.
    tag: String,
}

enum Connection {
    #[cfg(feature = "redis")]
    Redis(redis::aio::MultiplexedConnection),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(zookeeper_client::Client, String),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::rpc::Rpc, String),
    #[cfg(feature = "sqlite")]
    Sqlite(std::sync::Arc<std::sync::Mutex<rusqlite::Connection>>),
}

fn failed(scheme: &'static str, operation: &'static str) -> impl Fn(String) -> Error {
    move |e| Error::backend(scheme, operation, e)
}

impl Bare {
    /// Opens one connection to the server `url` names, or `None` for a backend without a
    /// bare baseline here (memory; Redis Sentinel, Cluster, TLS and Redlock).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL, [`Error::Backend`] when the server cannot
    /// be reached.
    pub async fn open(url: &str, tag: &str) -> Result<Option<Bare>> {
        let kind = crate::validate_url(url)?.kind;
        let connection = match kind {
            #[cfg(feature = "redis")]
            BackendKind::Redis if url.starts_with("redis://") => {
                let (base, query) = crate::scheme::Query::parse(url)?;
                let client = redis::Client::open(query.driver_url(base))
                    .map_err(|e| Error::invalid("URL", e.to_string()))?;
                let connection = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| failed("redis", "connect")(e.to_string()))?;
                Connection::Redis(connection)
            }
            // Through a pooler in transaction mode the bare pair's session lock means nothing.
            #[cfg(feature = "postgres")]
            BackendKind::Postgres
                if crate::postgres::url_mode(url)? != crate::postgres::Mode::Transaction =>
            {
                use sqlx::Connection as _;
                let options = crate::postgres::connect_options(url)?;
                let connection = sqlx::PgConnection::connect_with(&options)
                    .await
                    .map_err(|e| failed("postgres", "connect")(e.to_string()))?;
                Connection::Postgres(connection)
            }
            #[cfg(feature = "mysql")]
            BackendKind::MySql => {
                use sqlx::Connection as _;
                let options = crate::mysql::connect_options(url)?;
                let connection = sqlx::MySqlConnection::connect_with(&options)
                    .await
                    .map_err(|e| failed("mysql", "connect")(e.to_string()))?;
                Connection::MySql(connection)
            }
            #[cfg(feature = "zookeeper")]
            BackendKind::ZooKeeper => {
                let url = crate::zookeeper::url::ZkUrl::parse(url)?;
                let client = zookeeper_client::Client::connector()
                    .with_session_timeout(url.session_timeout)
                    .connect(&url.cluster)
                    .await
                    .map_err(|e| failed("zk", "connect")(e.to_string()))?;
                let base = url.base.clone();
                client
                    .mkdir(&base, &crate::zookeeper::persistent())
                    .await
                    .map_err(|e| failed("zk", "create the base path")(e.to_string()))?;
                Connection::ZooKeeper(client, base)
            }
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => {
                let url = crate::etcd::url::EtcdUrl::parse(url)?;
                let rpc = crate::etcd::rpc::Rpc::new(&url.endpoints)
                    .map_err(failed("etcd", "connect"))?;
                Connection::Etcd(rpc, url.prefix.clone())
            }
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => {
                let path = crate::sqlite::path_of(url)?;
                let connection = tokio::task::spawn_blocking(move || {
                    let conn = rusqlite::Connection::open(path)?;
                    conn.busy_timeout(std::time::Duration::from_secs(5))?;
                    conn.execute_batch(
                        "CREATE TABLE IF NOT EXISTS distlock_bare (name TEXT PRIMARY KEY)",
                    )?;
                    Ok::<_, rusqlite::Error>(conn)
                })
                .await
                .map_err(|e| failed("sqlite", "open")(e.to_string()))?
                .map_err(|e| failed("sqlite", "open")(e.to_string()))?;
                Connection::Sqlite(std::sync::Arc::new(std::sync::Mutex::new(connection)))
            }
            _ => return Ok(None),
        };
        Ok(Some(Bare {
            connection,
            tag: tag.to_owned(),
        }))
    }

    /// The request [`Bare::round_trip`] sends, for reports.
    pub fn round_trip_name(&self) -> &'static str {
        match &self.connection {
            #[cfg(feature = "redis")]
            Connection::Redis(_) => "PING",
            #[cfg(feature = "postgres")]
            Connection::Postgres(_) => "SELECT 1",
            #[cfg(feature = "mysql")]
            Connection::MySql(_) => "SELECT 1",
            #[cfg(feature = "zookeeper")]
            Connection::ZooKeeper(..) => "exists",
            #[cfg(feature = "etcd")]
            Connection::Etcd(..) => "range (count only)",
            #[cfg(feature = "sqlite")]
            Connection::Sqlite(_) => "SELECT 1",
        }
    }

    /// The requests [`Bare::pair`] sends, for reports.
    pub fn pair_name(&self) -> &'static str {
        match &self.connection {
            #[cfg(feature = "redis")]
            Connection::Redis(_) => "SET NX PX + DEL",
            #[cfg(feature = "postgres")]
            Connection::Postgres(_) => "pg_try_advisory_lock + pg_advisory_unlock",
            #[cfg(feature = "mysql")]
            Connection::MySql(_) => "GET_LOCK(name, 0) + RELEASE_LOCK",
            #[cfg(feature = "zookeeper")]
            Connection::ZooKeeper(..) => "create ephemeral + delete",
            #[cfg(feature = "etcd")]
            Connection::Etcd(..) => "txn put-if-absent + delete",
            #[cfg(feature = "sqlite")]
            Connection::Sqlite(_) => "INSERT + DELETE",
        }
    }

    /// One round trip.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails it.
    pub async fn round_trip(&mut self) -> Result<()> {
        match &mut self.connection {
            #[cfg(feature = "redis")]
            Connection::Redis(c) => redis::cmd("PING")
                .query_async::<String>(c)
                .await
                .map(drop)
                .map_err(|e| failed("redis", "ping")(e.to_string())),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => sqlx::query("SELECT 1")
                .execute(c)
                .await
                .map(drop)
                .map_err(|e| failed("postgres", "ping")(e.to_string())),
            #[cfg(feature = "mysql")]
            Connection::MySql(c) => sqlx::query("SELECT 1")
                .execute(c)
                .await
                .map(drop)
                .map_err(|e| failed("mysql", "ping")(e.to_string())),
            #[cfg(feature = "zookeeper")]
            Connection::ZooKeeper(c, base) => c
                .check_stat(base)
                .await
                .map(drop)
                .map_err(|e| failed("zk", "ping")(e.to_string())),
            #[cfg(feature = "etcd")]
            Connection::Etcd(c, prefix) => c
                .range(crate::etcd::api::etcdserverpb::RangeRequest {
                    count_only: true,
                    ..crate::etcd::rpc::get(format!("{prefix}distlock-bare-ping"))
                })
                .await
                .map(drop)
                .map_err(|e| failed("etcd", "ping")(e.to_string())),
            #[cfg(feature = "sqlite")]
            Connection::Sqlite(c) => {
                let c = c.clone();
                blocking(move || {
                    let conn = c.lock().unwrap_or_else(|p| p.into_inner());
                    conn.query_row("SELECT 1", [], |_| Ok(()))
                })
                .await
            }
        }
    }

    /// One lock and unlock of the name `i` makes, checking that the lock was free.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails a request or the name was taken.
    pub async fn pair(&mut self, i: u64) -> Result<()> {
        let name = format!("distlock-bare/{}/{i}", self.tag);
        let taken = || Error::backend("bench", "bare pair", format!("{name} was taken"));
        let got = match &mut self.connection {
            #[cfg(feature = "redis")]
            Connection::Redis(c) => {
                let ok: Option<String> = redis::cmd("SET")
                    .arg(&name)
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(c)
                    .await
                    .map_err(|e| failed("redis", "SET NX")(e.to_string()))?;
                let _: i64 = redis::cmd("DEL")
                    .arg(&name)
                    .query_async(c)
                    .await
                    .map_err(|e| failed("redis", "DEL")(e.to_string()))?;
                ok.is_some()
            }
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => {
                let key = crate::postgres::advisory_key(&name);
                let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
                    .bind(key)
                    .fetch_one(&mut *c)
                    .await
                    .map_err(|e| failed("postgres", "lock")(e.to_string()))?;
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut *c)
                    .await
                    .map_err(|e| failed("postgres", "unlock")(e.to_string()))?;
                got
            }
            #[cfg(feature = "mysql")]
            Connection::MySql(c) => {
                let (got,): (Option<i64>,) = sqlx::query_as("SELECT GET_LOCK(?, 0)")
                    .bind(&name)
                    .fetch_one(&mut *c)
                    .await
                    .map_err(|e| failed("mysql", "lock")(e.to_string()))?;
                sqlx::query("SELECT RELEASE_LOCK(?)")
                    .bind(&name)
                    .execute(&mut *c)
                    .await
                    .map_err(|e| failed("mysql", "unlock")(e.to_string()))?;
                got == Some(1)
            }
            #[cfg(feature = "zookeeper")]
            Connection::ZooKeeper(c, base) => {
                let path = format!("{base}/distlock-bare-{}-{i}", self.tag);
                c.create(&path, b"", &crate::zookeeper::ephemeral())
                    .await
                    .map_err(|e| failed("zk", "create")(e.to_string()))?;
                c.delete(&path, None)
                    .await
                    .map_err(|e| failed("zk", "delete")(e.to_string()))?;
                true
            }
            #[cfg(feature = "etcd")]
            Connection::Etcd(c, prefix) => {
                use crate::etcd::api::etcdserverpb::compare::CompareResult;
                use crate::etcd::rpc::{created, delete, op_put, put, txn};
                let key = format!("{prefix}{name}");
                let request = txn(
                    [created(key.clone(), CompareResult::Equal, 0)],
                    [op_put(put(key.clone(), "1", 0))],
                    [],
                );
                let put = c
                    .txn(request)
                    .await
                    .map_err(|e| failed("etcd", "txn")(e.to_string()))?;
                c.delete_range(delete(key))
                    .await
                    .map_err(|e| failed("etcd", "delete")(e.to_string()))?;
                put.succeeded
            }
            #[cfg(feature = "sqlite")]
            Connection::Sqlite(c) => {
                let c = c.clone();
                let name = name.clone();
                blocking(move || {
                    let conn = c.lock().unwrap_or_else(|p| p.into_inner());
                    let inserted = conn.execute(
                        "INSERT OR IGNORE INTO distlock_bare (name) VALUES (?1)",
                        [&name],
                    )?;
                    conn.execute("DELETE FROM distlock_bare WHERE name = ?1", [&name])?;
                    Ok(inserted == 1)
                })
                .await?
            }
        };
        if got { Ok(()) } else { Err(taken()) }
    }
}

#[cfg(feature = "sqlite")]
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| failed("sqlite", "bare request")(e.to_string()))?
        .map_err(|e| failed("sqlite", "bare request")(e.to_string()))
}
