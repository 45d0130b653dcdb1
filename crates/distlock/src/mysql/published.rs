//! Published records (an election's leader) in `distlock_published`, one row per key, apart
//! from the lock tables; for the table-record lock and named locks alike. A publish is an
//! upsert that keeps the larger term, read back in the same transaction under the row's lock;
//! a withdrawn record keeps its row and term with an empty holder.

use sqlx::mysql::MySqlPool;

use super::db_error;
use crate::backend::Published;
use crate::error::{Error, Result};
use crate::name::LockName;

/// Made at connect with the lock tables.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_published (
        name   VARBINARY(1024) NOT NULL PRIMARY KEY,
        term   BIGINT          NOT NULL,
        value  VARBINARY(4096) NOT NULL,
        holder VARBINARY(1024) NOT NULL
    ) ENGINE = InnoDB";

/// Parameters: name, term, value, holder, term, value, term, holder, term. The assignments
/// read `term` before it changes, whether the server assigns left to right or all at once.
const PUBLISH: &str = "
INSERT INTO distlock_published (name, term, value, holder) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
    value  = IF(term > ?, value, ?),
    holder = IF(term > ?, holder, ?),
    term   = GREATEST(term, ?)";

const READ: &str = "SELECT term, value, holder FROM distlock_published WHERE name = ?";

fn term_i64(term: u64) -> i64 {
    i64::try_from(term).unwrap_or(i64::MAX)
}

fn record(
    (term, value, holder): (i64, Vec<u8>, Vec<u8>),
    operation: &'static str,
) -> Result<Published> {
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes).map_err(|e| Error::backend(super::SCHEME, operation, e))
    };
    Ok(Published::new(
        u64::try_from(term).unwrap_or(0),
        text(value)?,
        text(holder)?,
    ))
}

pub(crate) async fn publish(
    pool: &MySqlPool,
    key: &LockName,
    published: &Published,
) -> Result<Published> {
    let term = term_i64(published.term);
    let mut tx = pool.begin().await.map_err(db_error("publish"))?;
    sqlx::query(PUBLISH)
        .bind(key.as_str())
        .bind(term)
        .bind(&published.value)
        .bind(&published.holder)
        .bind(term)
        .bind(&published.value)
        .bind(term)
        .bind(&published.holder)
        .bind(term)
        .execute(&mut *tx)
        .await
        .map_err(db_error("publish"))?;
    let row: (i64, Vec<u8>, Vec<u8>) = sqlx::query_as(&format!("{READ} FOR UPDATE"))
        .bind(key.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(db_error("publish"))?;
    tx.commit().await.map_err(db_error("publish"))?;
    record(row, "publish")
}

pub(crate) async fn read(pool: &MySqlPool, key: &LockName) -> Result<Option<Published>> {
    let row: Option<(i64, Vec<u8>, Vec<u8>)> = sqlx::query_as(READ)
        .bind(key.as_str())
        .fetch_optional(pool)
        .await
        .map_err(db_error("read the published record"))?;
    Ok(row
        .map(|row| record(row, "read the published record"))
        .transpose()?
        .and_then(Published::live))
}

pub(crate) async fn withdraw(pool: &MySqlPool, key: &LockName, term: u64) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE distlock_published SET value = '', holder = ''
         WHERE name = ? AND term = ? AND holder <> ''",
    )
    .bind(key.as_str())
    .bind(term_i64(term))
    .execute(pool)
    .await
    .map_err(db_error("withdraw"))?;
    Ok(done.rows_affected() > 0)
}
