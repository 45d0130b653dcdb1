//! Stock in PostgreSQL or MySQL/MariaDB: table `distlock_stock` (item, quantity, fence,
//! version). The lock strategies use the fenced read and write, the atomic strategy one
//! conditional `UPDATE`, the pessimistic strategy a transaction with `SELECT ... FOR UPDATE`,
//! the optimistic strategy the version column.

use std::time::Duration;

use async_trait::async_trait;
#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::error::{Error, Result};
use crate::stock::{Spread, StockStore, Taken, Work, fenced, missing_item, plan_spread};

const CREATE: &str = "CREATE TABLE IF NOT EXISTS distlock_stock (
    item     VARCHAR(255) NOT NULL PRIMARY KEY,
    quantity BIGINT       NOT NULL,
    fence    BIGINT       NOT NULL,
    version  BIGINT       NOT NULL
)";

#[derive(Clone, Debug)]
enum Pool {
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
}

/// Runs `$body` (which may use `?` on `sqlx::Error`) with `$pool` bound to the concrete pool.
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

/// Stock in a PostgreSQL or MySQL/MariaDB database.
#[derive(Clone, Debug)]
pub struct SqlStockStore {
    pool: Pool,
    kind: &'static str,
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl SqlStockStore {
    /// Connects to the database a `postgres://` or `mysql://` (`mariadb://`) URL names, with
    /// a pool of `connections`, and makes the table if missing. A `?mode=` for the lock is
    /// ignored. Pessimistic orders each keep a connection for their whole transaction, so
    /// give the pool as many connections as orders run at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for another URL; [`Error::FeatureDisabled`] when the driver is
    /// not compiled in; [`Error::Backend`] when the database cannot be reached.
    pub async fn connect(url: &str, connections: u32) -> Result<Self> {
        let base = url.split_once('?').map_or(url, |(base, _)| base);
        let scheme = base.split("://").next().unwrap_or_default();
        let store = match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                connects_once::<sqlx::PgConnection>("postgres", base).await?;
                SqlStockStore {
                    pool: Pool::Postgres(
                        PgPoolOptions::new()
                            .max_connections(connections.max(1))
                            .acquire_timeout(Duration::from_secs(30))
                            .connect(base)
                            .await
                            .map_err(|e| Error::backend("postgres", "connect", e))?,
                    ),
                    kind: "postgres",
                }
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let base = base.replacen("mariadb://", "mysql://", 1);
                connects_once::<sqlx::MySqlConnection>("mysql", &base).await?;
                SqlStockStore {
                    pool: Pool::MySql(
                        MySqlPoolOptions::new()
                            .max_connections(connections.max(1))
                            .acquire_timeout(Duration::from_secs(30))
                            .connect(&base)
                            .await
                            .map_err(|e| Error::backend("mysql", "connect", e))?,
                    ),
                    kind: "mysql",
                }
            }
            #[cfg(not(feature = "postgres"))]
            "postgres" | "postgresql" => {
                return Err(Error::FeatureDisabled {
                    scheme: scheme.to_owned(),
                    feature: "postgres",
                });
            }
            #[cfg(not(feature = "mysql"))]
            "mysql" | "mariadb" => {
                return Err(Error::FeatureDisabled {
                    scheme: scheme.to_owned(),
                    feature: "mysql",
                });
            }
            _ => {
                return Err(Error::invalid(
                    "URL",
                    format!(
                        "{:?}: a SQL stock store needs postgres://... or mysql://...",
                        crate::redact::shown(url)
                    ),
                ));
            }
        };
        on_pool!(store, pool => sqlx::query(CREATE).execute(pool).await?.rows_affected())
            .map_err(store.error("create the stock table"))?;
        Ok(store)
    }

    fn error(&self, operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
        let kind = self.kind;
        move |e| Error::backend(kind, operation, e)
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
                        out.push('$');
                        out.push_str(&n.to_string());
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }

    /// The quantity and fence of an item, or the missing-item error.
    async fn row(&self, item: &str) -> Result<(u64, u64)> {
        let select = self.sql("SELECT quantity, fence FROM distlock_stock WHERE item = ?");
        let row: Option<(i64, i64)> =
            on_pool!(self, pool => sqlx::query_as(&select).bind(item).fetch_optional(pool).await?)
                .map_err(self.error("read the stock"))?;
        row.map(|(q, f)| (to_u64(q), to_u64(f)))
            .ok_or_else(|| missing_item(item))
    }

    /// Runs an `UPDATE ... RETURNING x` on PostgreSQL, or on MySQL (no `RETURNING`) the same
    /// update with the value assigned through `LAST_INSERT_ID(x)`, which the OK packet
    /// carries: the value when a row matched.
    async fn update_returning(
        &self,
        postgres: &str,
        mysql: &str,
        binds: &[Bind<'_>],
        operation: &'static str,
    ) -> Result<Option<i64>> {
        match &self.pool {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => {
                let _ = mysql;
                let sql = self.sql(postgres);
                let mut query = sqlx::query_as::<_, (i64,)>(&sql);
                for bind in binds {
                    query = match bind {
                        Bind::Int(v) => query.bind(*v),
                        Bind::Text(v) => query.bind(*v),
                    };
                }
                let row = query
                    .fetch_optional(pool)
                    .await
                    .map_err(self.error(operation))?;
                Ok(row.map(|(v,)| v))
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let _ = postgres;
                let mut query = sqlx::query(mysql);
                for bind in binds {
                    query = match bind {
                        Bind::Int(v) => query.bind(*v),
                        Bind::Text(v) => query.bind(*v),
                    };
                }
                let done = query.execute(pool).await.map_err(self.error(operation))?;
                Ok((done.rows_affected() > 0)
                    .then(|| i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX)))
            }
        }
    }
}

/// Opens and closes one connection, without a pool's retries, so that a server that is not
/// there (a refused connection, a wrong password) is reported at once, with the reason.
async fn connects_once<C: sqlx::Connection>(kind: &'static str, url: &str) -> Result<()> {
    let connection = C::connect(url)
        .await
        .map_err(|e| Error::backend(kind, "connect", e))?;
    connection
        .close()
        .await
        .map_err(|e| Error::backend(kind, "connect", e))
}

/// A statement parameter.
enum Bind<'a> {
    Int(i64),
    Text(&'a str),
}

#[async_trait]
impl StockStore for SqlStockStore {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn set(&self, item: &str, quantity: u64) -> Result<()> {
        crate::stock::check_item(item)?;
        let delete = self.sql("DELETE FROM distlock_stock WHERE item = ?");
        let insert = self
            .sql("INSERT INTO distlock_stock (item, quantity, fence, version) VALUES (?, ?, 0, 0)");
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(&delete).bind(item).execute(&mut *tx).await?;
            sqlx::query(&insert)
                .bind(item)
                .bind(to_i64(quantity))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?
        })
        .map_err(self.error("set the stock"))
    }

    async fn remove(&self, item: &str) -> Result<bool> {
        let delete = self.sql("DELETE FROM distlock_stock WHERE item = ?");
        let done = on_pool!(self, pool => {
            sqlx::query(&delete).bind(item).execute(pool).await?.rows_affected()
        })
        .map_err(self.error("remove an item"))?;
        Ok(done > 0)
    }

    async fn quantity(&self, item: &str) -> Result<u64> {
        Ok(self.row(item).await?.0)
    }

    async fn read_fenced(&self, item: &str, token: u64) -> Result<u64> {
        let token_i = to_i64(token);
        let quantity = self
            .update_returning(
                "UPDATE distlock_stock SET fence = ? WHERE item = ? AND fence <= ? RETURNING quantity",
                "UPDATE distlock_stock SET fence = ?, quantity = LAST_INSERT_ID(quantity)
                 WHERE item = ? AND fence <= ?",
                &[Bind::Int(token_i), Bind::Text(item), Bind::Int(token_i)],
                "read the stock",
            )
            .await?;
        match quantity {
            Some(quantity) => Ok(to_u64(quantity)),
            None => Err(fenced(item, token, self.row(item).await?.1)),
        }
    }

    async fn write_fenced(&self, item: &str, quantity: u64, token: u64) -> Result<()> {
        let update = self.sql(
            "UPDATE distlock_stock SET quantity = ?, fence = ?, version = version + 1
             WHERE item = ? AND fence <= ?",
        );
        let token_i = to_i64(token);
        let matched = on_pool!(self, pool => {
            sqlx::query(&update)
                .bind(to_i64(quantity))
                .bind(token_i)
                .bind(item)
                .bind(token_i)
                .execute(pool)
                .await?
                .rows_affected()
        })
        .map_err(self.error("write the stock"))?;
        if matched == 1 {
            Ok(())
        } else {
            Err(fenced(item, token, self.row(item).await?.1))
        }
    }

    async fn take_atomic(&self, item: &str, n: u64) -> Result<Taken> {
        let n_i = to_i64(n);
        let remaining = self
            .update_returning(
                "UPDATE distlock_stock SET quantity = quantity - ?, version = version + 1
                 WHERE item = ? AND quantity >= ? RETURNING quantity",
                "UPDATE distlock_stock SET quantity = LAST_INSERT_ID(quantity - ?),
                 version = version + 1 WHERE item = ? AND quantity >= ?",
                &[Bind::Int(n_i), Bind::Text(item), Bind::Int(n_i)],
                "take stock",
            )
            .await?;
        match remaining {
            Some(remaining) => Ok(Taken::Taken {
                remaining: to_u64(remaining),
            }),
            None => Ok(Taken::SoldOut {
                available: self.row(item).await?.0,
            }),
        }
    }

    async fn add_atomic(&self, item: &str, n: u64) -> Result<u64> {
        let total = self
            .update_returning(
                "UPDATE distlock_stock SET quantity = quantity + ?, version = version + 1
                 WHERE item = ? RETURNING quantity",
                "UPDATE distlock_stock SET quantity = LAST_INSERT_ID(quantity + ?),
                 version = version + 1 WHERE item = ?",
                &[Bind::Int(to_i64(n)), Bind::Text(item)],
                "restock",
            )
            .await?;
        total.map(to_u64).ok_or_else(|| missing_item(item))
    }

    async fn take_spread(&self, items: &[String], n: u64) -> Result<Spread> {
        // One transaction locks the items' rows in item order (so two such orders queue
        // instead of deadlocking), reads them, and writes the parts taken.
        let select = self.sql(&format!(
            "SELECT item, quantity FROM distlock_stock WHERE item IN ({}) ORDER BY item \
             FOR UPDATE",
            vec!["?"; items.len()].join(", ")
        ));
        let update = self
            .sql("UPDATE distlock_stock SET quantity = ?, version = version + 1 WHERE item = ?");
        let outcome = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let mut query = sqlx::query_as::<_, (String, i64)>(&select);
            for item in items {
                query = query.bind(item.as_str());
            }
            let rows = query.fetch_all(&mut *tx).await?;
            let found: std::collections::HashMap<String, i64> = rows.into_iter().collect();
            match items.iter().find(|item| !found.contains_key(*item)) {
                Some(missing) => Err(missing.clone()),
                None => {
                    let quantities: Vec<u64> =
                        items.iter().map(|item| to_u64(found[item])).collect();
                    let parts = plan_spread(&quantities, n);
                    for ((item, &quantity), &part) in items.iter().zip(&quantities).zip(&parts) {
                        if part > 0 {
                            sqlx::query(&update)
                                .bind(to_i64(quantity - part))
                                .bind(item.as_str())
                                .execute(&mut *tx)
                                .await?;
                        }
                    }
                    tx.commit().await?;
                    Ok(Spread { quantities, parts })
                }
            }
        })
        .map_err(self.error("take stock from several items"))?;
        outcome.map_err(|missing| missing_item(&missing))
    }

    async fn take_row_locked(&self, item: &str, n: u64, work: Work<'_>) -> Result<Taken> {
        let select = self.sql("SELECT quantity FROM distlock_stock WHERE item = ? FOR UPDATE");
        let update = self
            .sql("UPDATE distlock_stock SET quantity = ?, version = version + 1 WHERE item = ?");
        let mut work = Some(work);
        let outcome = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let row: Option<(i64,)> = sqlx::query_as(&select)
                .bind(item)
                .fetch_optional(&mut *tx)
                .await?;
            match row {
                None => None,
                Some((quantity,)) => {
                    let available = to_u64(quantity);
                    if available < n {
                        tx.rollback().await?;
                        Some(Taken::SoldOut { available })
                    } else {
                        if let Some(work) = work.take() {
                            work.await;
                        }
                        sqlx::query(&update)
                            .bind(to_i64(available - n))
                            .bind(item)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Some(Taken::Taken {
                            remaining: available - n,
                        })
                    }
                }
            }
        })
        .map_err(self.error("take stock under a row lock"))?;
        outcome.ok_or_else(|| missing_item(item))
    }

    async fn read_versioned(&self, item: &str) -> Result<(u64, u64)> {
        let select = self.sql("SELECT quantity, version FROM distlock_stock WHERE item = ?");
        let row: Option<(i64, i64)> =
            on_pool!(self, pool => sqlx::query_as(&select).bind(item).fetch_optional(pool).await?)
                .map_err(self.error("read the stock"))?;
        row.map(|(q, v)| (to_u64(q), to_u64(v)))
            .ok_or_else(|| missing_item(item))
    }

    async fn write_versioned(&self, item: &str, quantity: u64, version: u64) -> Result<bool> {
        let update = self.sql(
            "UPDATE distlock_stock SET quantity = ?, version = version + 1
             WHERE item = ? AND version = ?",
        );
        let matched = on_pool!(self, pool => {
            sqlx::query(&update)
                .bind(to_i64(quantity))
                .bind(item)
                .bind(to_i64(version))
                .execute(pool)
                .await?
                .rows_affected()
        })
        .map_err(self.error("write the stock"))?;
        Ok(matched == 1)
    }
}
