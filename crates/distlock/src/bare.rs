//! The bare baselines of `distlock bench --compare`: each backend's cheapest round trip and
//! the simplest lock a user could write by hand against it, on one connection of the same
//! driver distlock uses, with no fencing token, no lease keeping and no waiter. distlock's own
//! acquire+release is measured against them in the same sitting. Each backend writes its own
//! in its folder (`bare.rs`), reached through its [`Driver`](crate::driver::Driver):
//!
//! | backend | round trip | bare pair |
//! |---|---|---|
//! | Redis | `PING` | `SET key 1 NX PX 30000` + `DEL key` |
//! | PostgreSQL | `SELECT 1` | `pg_try_advisory_lock` + `pg_advisory_unlock` |
//! | MySQL/MariaDB | `SELECT 1` | `GET_LOCK(name, 0)` + `RELEASE_LOCK(name)` |
//! | ZooKeeper | `exists` of the base node | `create` of an ephemeral node + `delete` |
//! | etcd | a count-only `range` | a `txn` put if absent + `delete` |
//! | SQLite | `SELECT 1` | `INSERT` of a row + `DELETE`, each a transaction |
//! | NATS JetStream | a direct get of a missing key | key-value `create` + `delete` |

use crate::driver::BareConnection;
use crate::error::{Error, Result};

/// One connection for the bare baselines of `distlock bench --compare`: the round trip and
/// the bare pair of a backend, as the table of this module lists them.
pub struct Bare {
    connection: Box<dyn BareConnection>,
    /// Distinguishes this run's keys from another run's.
    tag: String,
}

impl Bare {
    /// Opens one connection to the server `url` names, or `None` for a backend without a
    /// bare baseline here (memory; Redis Sentinel, Cluster, TLS, the spin lock and Redlock;
    /// PostgreSQL behind a pooler, `?mode=transaction`).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL, [`Error::Backend`] when the server cannot
    /// be reached.
    pub async fn open(url: &str, tag: &str) -> Result<Option<Bare>> {
        let (_, driver) = crate::open::checked(url)?;
        let Some(open) = driver.bare else {
            return Ok(None);
        };
        Ok(open(url).await?.map(|connection| Bare {
            connection,
            tag: tag.to_owned(),
        }))
    }

    /// The schemes of this build whose backend has a bare baseline (some deployments of them
    /// may still have none, as [`Bare::open`] says).
    pub fn schemes() -> Vec<&'static str> {
        crate::scheme::SCHEMES
            .iter()
            .filter(|scheme| {
                crate::open::driver(scheme).is_ok_and(|driver| {
                    driver.bare.is_some() && (driver.bare_applies)(scheme.example)
                })
            })
            .map(|scheme| scheme.name)
            .collect()
    }

    /// The request [`Bare::round_trip`] sends, for reports.
    pub fn round_trip_name(&self) -> &'static str {
        self.connection.requests().0
    }

    /// The requests [`Bare::pair`] sends, for reports.
    pub fn pair_name(&self) -> &'static str {
        self.connection.requests().1
    }

    /// One round trip.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails it.
    pub async fn round_trip(&mut self) -> Result<()> {
        self.connection.round_trip().await
    }

    /// One lock and unlock of the name `i` makes, checking that the lock was free.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server fails a request or the name was taken.
    pub async fn pair(&mut self, i: u64) -> Result<()> {
        let name = format!("distlock-bare/{}/{i}", self.tag);
        if self.connection.pair(&name).await? {
            Ok(())
        } else {
            Err(Error::backend(
                "bench",
                "bare pair",
                format!("{name} was taken"),
            ))
        }
    }
}
