//! PostgreSQL's bare baseline for `distlock bench --compare`: `SELECT 1`, and
//! `pg_try_advisory_lock` + `pg_advisory_unlock` on one connection.

use async_trait::async_trait;
use sqlx::Connection as _;

use super::db_error;
use crate::driver::BareConnection;
use crate::error::Result;

struct BarePostgres(sqlx::PgConnection);

/// None through a pooler in transaction mode, where the bare pair's session lock means
/// nothing.
pub(super) fn applies(url: &str) -> bool {
    super::url_mode(url).is_ok_and(|mode| mode != super::Mode::Transaction)
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    super::url_mode(url)?;
    if !applies(url) {
        return Ok(None);
    }
    let options = super::connect_options(url)?;
    let connection = sqlx::PgConnection::connect_with(&options)
        .await
        .map_err(db_error("connect"))?;
    Ok(Some(Box::new(BarePostgres(connection))))
}

#[async_trait]
impl BareConnection for BarePostgres {
    fn requests(&self) -> (&'static str, &'static str) {
        ("SELECT 1", "pg_try_advisory_lock + pg_advisory_unlock")
    }

    async fn round_trip(&mut self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&mut self.0)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let key = super::advisory_key(name);
        let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut self.0)
            .await
            .map_err(db_error("lock"))?;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut self.0)
            .await
            .map_err(db_error("unlock"))?;
        Ok(got)
    }
}
