//! Redis's bare baseline for `distlock bench --compare`: `PING`, and `SET key 1 NX PX 30000`
//! + `DEL key` on one multiplexed connection.

use async_trait::async_trait;

use crate::driver::BareConnection;
use crate::error::{Error, Result};

struct BareRedis(redis::aio::MultiplexedConnection);

fn failed(operation: &'static str) -> impl Fn(redis::RedisError) -> Error {
    move |e| Error::backend("redis", operation, e.to_string())
}

/// Standalone Redis without TLS only: the bare pair on Sentinel, Cluster or TLS would
/// measure the deployment, not the lock.
pub(super) fn applies(url: &str) -> bool {
    url.starts_with("redis://")
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    if !applies(url) {
        return Ok(None);
    }
    Ok(Some(Box::new(BareRedis::open(url).await?)))
}

impl BareRedis {
    async fn open(url: &str) -> Result<Self> {
        let (base, query) = crate::scheme::Query::parse(url)?;
        let client = redis::Client::open(query.driver_url(base))
            .map_err(|e| Error::invalid("URL", e.to_string()))?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(failed("connect"))?;
        Ok(BareRedis(connection))
    }
}

#[async_trait]
impl BareConnection for BareRedis {
    fn requests(&self) -> (&'static str, &'static str) {
        ("PING", "SET NX PX + DEL")
    }

    async fn round_trip(&mut self) -> Result<()> {
        redis::cmd("PING")
            .query_async::<String>(&mut self.0)
            .await
            .map(drop)
            .map_err(failed("ping"))
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let ok: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.0)
            .await
            .map_err(failed("SET NX"))?;
        let _: i64 = redis::cmd("DEL")
            .arg(name)
            .query_async(&mut self.0)
            .await
            .map_err(failed("DEL"))?;
        Ok(ok.is_some())
    }
}
