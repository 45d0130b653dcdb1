//! MySQL's bare baseline for `distlock bench --compare`: `SELECT 1`, and `GET_LOCK(name, 0)`
//! + `RELEASE_LOCK(name)` on one connection.

use async_trait::async_trait;
use sqlx::Connection as _;

use super::db_error;
use crate::driver::BareConnection;
use crate::error::Result;

struct BareMySql(sqlx::MySqlConnection);

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    let options = super::connect_options(url)?;
    let connection = sqlx::MySqlConnection::connect_with(&options)
        .await
        .map_err(db_error("connect"))?;
    Ok(Some(Box::new(BareMySql(connection))))
}

#[async_trait]
impl BareConnection for BareMySql {
    fn requests(&self) -> (&'static str, &'static str) {
        ("SELECT 1", "GET_LOCK(name, 0) + RELEASE_LOCK")
    }

    async fn round_trip(&mut self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&mut self.0)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let (got,): (Option<i64>,) = sqlx::query_as("SELECT GET_LOCK(?, 0)")
            .bind(name)
            .fetch_one(&mut self.0)
            .await
            .map_err(db_error("lock"))?;
        sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(name)
            .execute(&mut self.0)
            .await
            .map_err(db_error("unlock"))?;
        Ok(got == Some(1))
    }
}
