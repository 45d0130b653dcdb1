//! SQLite's bare baseline for `distlock bench --compare`: `SELECT 1`, and the `INSERT` of a
//! row + its `DELETE`, each its own transaction, on one connection.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::driver::BareConnection;
use crate::error::{Error, Result};

struct BareSqlite(Arc<Mutex<rusqlite::Connection>>);

fn failed<E: std::fmt::Display>(operation: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::backend("sqlite", operation, e.to_string())
}

/// `work` on the blocking pool: rusqlite's calls block.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(failed("bare request"))?
        .map_err(failed("bare request"))
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    Ok(Some(Box::new(BareSqlite::open(url).await?)))
}

impl BareSqlite {
    async fn open(url: &str) -> Result<Self> {
        let path = super::url::parse_url(url.strip_prefix("sqlite://").unwrap_or(url))?.path;
        let connection = blocking(move || {
            let conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.execute_batch("CREATE TABLE IF NOT EXISTS distlock_bare (name TEXT PRIMARY KEY)")?;
            Ok(conn)
        })
        .await?;
        Ok(BareSqlite(Arc::new(Mutex::new(connection))))
    }

    async fn on_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = self.0.clone();
        blocking(move || work(&connection.lock().unwrap_or_else(|p| p.into_inner()))).await
    }
}

#[async_trait]
impl BareConnection for BareSqlite {
    fn requests(&self) -> (&'static str, &'static str) {
        ("SELECT 1", "INSERT + DELETE")
    }

    async fn round_trip(&mut self) -> Result<()> {
        self.on_connection(|conn| conn.query_row("SELECT 1", [], |_| Ok(())))
            .await
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        self.on_connection(move |conn| {
            let inserted = conn.execute(
                "INSERT OR IGNORE INTO distlock_bare (name) VALUES (?1)",
                [&name],
            )?;
            conn.execute("DELETE FROM distlock_bare WHERE name = ?1", [&name])?;
            Ok(inserted == 1)
        })
        .await
    }
}
