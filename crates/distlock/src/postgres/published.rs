//! Published records (an election's leader) in `distlock_published`, one row per key, apart
//! from the lock tables; for the table-record lock and advisory locks alike. A publish is one
//! upsert that keeps the larger term; a withdrawn record keeps its row and term with an empty
//! holder.

use sqlx::postgres::PgExecutor;

use super::{db_error, token_u64};
use crate::backend::Published;
use crate::error::Result;
use crate::name::LockName;

/// Made at connect with the lock tables.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_published (
    name   text   PRIMARY KEY,
    term   bigint NOT NULL,
    value  text   NOT NULL,
    holder text   NOT NULL
)";

/// Parameters: name, term, value, holder. Returns the row stored afterwards.
const PUBLISH: &str = "
INSERT INTO distlock_published AS p (name, term, value, holder) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET
    value  = CASE WHEN p.term > excluded.term THEN p.value  ELSE excluded.value  END,
    holder = CASE WHEN p.term > excluded.term THEN p.holder ELSE excluded.holder END,
    term   = greatest(p.term, excluded.term)
RETURNING term, value, holder";

fn term_i64(term: u64) -> i64 {
    i64::try_from(term).unwrap_or(i64::MAX)
}

fn record((term, value, holder): (i64, String, String)) -> Published {
    Published::new(token_u64(term), value, holder)
}

/// The statements below run on `on` as prepared statements kept by the connection when
/// `persistent`, else as unnamed ones (through a pooler in transaction mode, in a transaction).
pub(crate) async fn publish<'c>(
    on: impl PgExecutor<'c>,
    persistent: bool,
    key: &LockName,
    published: &Published,
) -> Result<Published> {
    sqlx::query_as(PUBLISH)
        .persistent(persistent)
        .bind(key.as_str())
        .bind(term_i64(published.term))
        .bind(&published.value)
        .bind(&published.holder)
        .fetch_one(on)
        .await
        .map(record)
        .map_err(db_error("publish"))
}

pub(crate) async fn read<'c>(
    on: impl PgExecutor<'c>,
    persistent: bool,
    key: &LockName,
) -> Result<Option<Published>> {
    let row: Option<(i64, String, String)> =
        sqlx::query_as("SELECT term, value, holder FROM distlock_published WHERE name = $1")
            .persistent(persistent)
            .bind(key.as_str())
            .fetch_optional(on)
            .await
            .map_err(db_error("read the published record"))?;
    Ok(row.map(record).and_then(Published::live))
}

pub(crate) async fn withdraw<'c>(
    on: impl PgExecutor<'c>,
    persistent: bool,
    key: &LockName,
    term: u64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE distlock_published SET value = '', holder = ''
         WHERE name = $1 AND term = $2 AND holder <> ''",
    )
    .persistent(persistent)
    .bind(key.as_str())
    .bind(term_i64(term))
    .execute(on)
    .await
    .map_err(db_error("withdraw"))?;
    Ok(done.rows_affected() > 0)
}
