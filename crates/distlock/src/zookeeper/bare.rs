//! ZooKeeper's bare baseline for `distlock bench --compare`: an `exists` of the base node, and
//! the `create` of an ephemeral node + its `delete` on one session.

use async_trait::async_trait;

use crate::driver::BareConnection;
use crate::error::{Error, Result};

struct BareZooKeeper {
    client: zookeeper_client::Client,
    url: super::url::ZkUrl,
}

fn failed<E: std::fmt::Display>(operation: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::backend("zk", operation, e.to_string())
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    Ok(Some(Box::new(BareZooKeeper::open(url).await?)))
}

impl BareZooKeeper {
    async fn open(url: &str) -> Result<Self> {
        let url = super::url::ZkUrl::parse(url)?;
        let client = url
            .connector()
            .connect(&url.cluster)
            .await
            .map_err(failed("connect"))?;
        client
            .mkdir(
                &url.base,
                &url.node(zookeeper_client::CreateMode::Persistent),
            )
            .await
            .map_err(failed("create the base path"))?;
        Ok(BareZooKeeper { client, url })
    }
}

#[async_trait]
impl BareConnection for BareZooKeeper {
    fn requests(&self) -> (&'static str, &'static str) {
        ("exists", "create ephemeral + delete")
    }

    async fn round_trip(&mut self) -> Result<()> {
        self.client
            .check_stat(&self.url.base)
            .await
            .map(drop)
            .map_err(failed("ping"))
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        // One node under the base: the name's parts joined by `-`.
        let path = format!("{}/{}", self.url.base, name.replace('/', "-"));
        self.client
            .create(
                &path,
                b"",
                &self.url.node(zookeeper_client::CreateMode::Ephemeral),
            )
            .await
            .map_err(failed("create"))?;
        self.client
            .delete(&path, None)
            .await
            .map_err(failed("delete"))?;
        Ok(true)
    }
}
