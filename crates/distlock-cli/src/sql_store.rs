//! The demo's stock in PostgreSQL or MySQL/MariaDB, for the database-native strategies:
//!
//! * **pessimistic**: `SELECT ... FOR UPDATE` in a transaction; the row lock serialises
//!   buyers until the transaction ends.
//! * **optimistic**: read the quantity and a version, spend the critical section, then
//!   `UPDATE ... WHERE version = ?`; a buyer that lost the race backs off and reads again, a
//!   bounded number of times, then gives up (an order refused for contention, not for stock).
//! * **locked**: a distlock lock (PostgreSQL advisory or MySQL named, on its own connection)
//!   around a plain business transaction that commits before the lock is released.
//!
//! One item per demo run (`item`), so runs at the same time do not share a row.

use std::time::Duration;

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::failure::{CliResult, Failure};
use crate::store::{Bought, OPTIMISTIC_ATTEMPTS};
/// The longest back-off between two optimistic attempts.
const MAX_BACKOFF_MS: u64 = 64;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS distlock_demo_stock (
    item     VARCHAR(100) NOT NULL PRIMARY KEY,
    quantity BIGINT       NOT NULL,
    version  BIGINT       NOT NULL
)";

/// The database. The statements are the same text for both (placeholders aside); the
/// [`on_pool!`] macro runs one body against whichever pool this is.
#[derive(Clone)]
enum Pool {
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
}

/// Runs `$body` (an async body answering `Result<_, sqlx::Error>`) with `$pool` bound to
/// the concrete pool.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            #[cfg(feature = "postgres")]
            Pool::Postgres($pool) => async { Ok::<_, sqlx::Error>($body) }.await,
            #[cfg(feature = "mysql")]
            Pool::MySql($pool) => async { Ok::<_, sqlx::Error>($body) }.await,
        }
    };
}

#[derive(Clone)]
pub struct SqlStore {
    pool: Pool,
    item: String,
}

fn store_error(what: &str) -> impl FnOnce(sqlx::Error) -> Failure + '_ {
    move |e| Failure::failed(format!("stock store ({what}): {e}"))
}

impl SqlStore {
    /// Connects to the database a `postgres://` or `mysql://` URL names (a `?mode=` for the
    /// lock is ignored) and makes the table.
    pub async fn open(url: &str, item: &str, connections: u32) -> CliResult<Self> {
        let base = url.split_once('?').map_or(url, |(base, _)| base);
        let pool = if base.starts_with("postgres://") || base.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            {
                Pool::Postgres(
                    PgPoolOptions::new()
                        .max_connections(connections)
                        .acquire_timeout(Duration::from_secs(30))
                        .connect(base)
                        .await
                        .map_err(store_error("connect"))?,
                )
            }
            #[cfg(not(feature = "postgres"))]
            return Err(Failure::usage(
                "this distlock was built without the postgres feature",
            ));
        } else if base.starts_with("mysql://") || base.starts_with("mariadb://") {
            #[cfg(feature = "mysql")]
            {
                Pool::MySql(
                    MySqlPoolOptions::new()
                        .max_connections(connections)
                        .acquire_timeout(Duration::from_secs(30))
                        .connect(&base.replacen("mariadb://", "mysql://", 1))
                        .await
                        .map_err(store_error("connect"))?,
                )
            }
            #[cfg(not(feature = "mysql"))]
            return Err(Failure::usage(
                "this distlock was built without the mysql feature",
            ));
        } else {
            return Err(Failure::usage(format!(
                "{url:?} is not a PostgreSQL or MySQL URL; write postgres://... or mysql://..."
            )));
        };
        let store = SqlStore {
            pool,
            item: item.to_owned(),
        };
        on_pool!(store, pool => sqlx::query(CREATE).execute(pool).await?.rows_affected())
            .map_err(store_error("create the table"))?;
        Ok(store)
    }

    /// Connects once, without the pool's retries, so that a missing server is reported at
    /// once with the reason.
    pub async fn check(url: &str) -> CliResult {
        use sqlx::Connection;
        let base = url.split_once('?').map_or(url, |(base, _)| base);
        #[cfg(feature = "postgres")]
        if base.starts_with("postgres://") || base.starts_with("postgresql://") {
            let conn = sqlx::PgConnection::connect(base)
                .await
                .map_err(store_error("connect"))?;
            return conn.close().await.map_err(store_error("connect"));
        }
        #[cfg(feature = "mysql")]
        if base.starts_with("mysql://") || base.starts_with("mariadb://") {
            let conn = sqlx::MySqlConnection::connect(&base.replacen("mariadb://", "mysql://", 1))
                .await
                .map_err(store_error("connect"))?;
            return conn.close().await.map_err(store_error("connect"));
        }
        Self::open(url, crate::store::ITEM, 1).await.map(drop)
    }

    /// `?` placeholders as the database wants them.
    fn sql(&self, text: &str) -> String {
        match &self.pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => text.to_owned(),
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => {
                let mut out = String::with_capacity(text.len() + 8);
                let mut n = 0;
                for c in text.chars() {
                    if c == '?' {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }

    pub async fn set(&self, quantity: i64) -> CliResult {
        let delete = self.sql("DELETE FROM distlock_demo_stock WHERE item = ?");
        let insert =
            self.sql("INSERT INTO distlock_demo_stock (item, quantity, version) VALUES (?, ?, 0)");
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(&delete).bind(&self.item).execute(&mut *tx).await?;
            sqlx::query(&insert)
                .bind(&self.item)
                .bind(quantity)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?
        })
        .map_err(store_error("set"))
    }

    pub async fn read(&self) -> CliResult<i64> {
        let select = self.sql("SELECT quantity FROM distlock_demo_stock WHERE item = ?");
        let (quantity,): (i64,) = on_pool!(self, pool => {
            sqlx::query_as(&select).bind(&self.item).fetch_one(pool).await?
        })
        .map_err(store_error("read"))?;
        Ok(quantity)
    }

    /// Removes this run's row.
    pub async fn remove(&self) -> CliResult {
        let delete = self.sql("DELETE FROM distlock_demo_stock WHERE item = ?");
        on_pool!(self, pool => sqlx::query(&delete).bind(&self.item).execute(pool).await?.rows_affected())
            .map(drop)
            .map_err(store_error("clean up"))
    }

    /// A business transaction with no protection of its own (a lock around it provides
    /// that): read, think, write what was read minus one, commit.
    pub async fn buy_plain(&self, hold: Duration) -> CliResult<Bought> {
        self.buy_in_transaction(hold, "").await
    }

    /// The pessimistic strategy: the read takes the row lock (`FOR UPDATE`), which other
    /// buyers wait for until this transaction commits.
    pub async fn buy_pessimistic(&self, hold: Duration) -> CliResult<Bought> {
        self.buy_in_transaction(hold, " FOR UPDATE").await
    }

    async fn buy_in_transaction(&self, hold: Duration, lock_clause: &str) -> CliResult<Bought> {
        let select = self.sql(&format!(
            "SELECT quantity FROM distlock_demo_stock WHERE item = ?{lock_clause}"
        ));
        let update = self.sql(
            "UPDATE distlock_demo_stock SET quantity = ?, version = version + 1 WHERE item = ?",
        );
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let (quantity,): (i64,) = sqlx::query_as(&select)
                .bind(&self.item)
                .fetch_one(&mut *tx)
                .await?;
            tokio::time::sleep(hold).await;
            if quantity < 1 {
                tx.rollback().await?;
                Bought::Refused
            } else {
                sqlx::query(&update)
                    .bind(quantity - 1)
                    .bind(&self.item)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Bought::Accepted
            }
        })
        .map_err(store_error("purchase"))
    }

    /// The optimistic strategy: no lock; the write succeeds only if the version it read is
    /// still current. Bounded retries with jittered exponential back-off.
    pub async fn buy_optimistic(&self, hold: Duration) -> CliResult<Bought> {
        let select = self.sql("SELECT quantity, version FROM distlock_demo_stock WHERE item = ?");
        let update = self.sql(
            "UPDATE distlock_demo_stock SET quantity = ?, version = version + 1
             WHERE item = ? AND version = ?",
        );
        for attempt in 0..OPTIMISTIC_ATTEMPTS {
            let outcome = on_pool!(self, pool => {
                let (quantity, version): (i64, i64) =
                    sqlx::query_as(&select).bind(&self.item).fetch_one(pool).await?;
                tokio::time::sleep(hold).await;
                if quantity < 1 {
                    Some(Bought::Refused)
                } else {
                    let done = sqlx::query(&update)
                        .bind(quantity - 1)
                        .bind(&self.item)
                        .bind(version)
                        .execute(pool)
                        .await?;
                    (done.rows_affected() == 1).then_some(Bought::Accepted)
                }
            })
            .map_err(store_error("purchase"))?;
            if let Some(outcome) = outcome {
                return Ok(outcome);
            }
            let ceiling = (1u64 << attempt.min(6)).min(MAX_BACKOFF_MS);
            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=ceiling))).await;
        }
        Ok(Bought::GaveUp)
    }
}
