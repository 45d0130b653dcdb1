//! etcd's bare baseline for `distlock bench --compare`: a count-only `range`, and a `txn` that
//! puts a key if absent + its `delete`, on one channel.

use async_trait::async_trait;

use super::api::etcdserverpb::RangeRequest;
use super::api::etcdserverpb::compare::CompareResult;
use super::rpc::{Rpc, created, delete, get, op_put, put, txn};
use crate::driver::BareConnection;
use crate::error::Result;

struct BareEtcd {
    rpc: Rpc,
    prefix: String,
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    Ok(Some(Box::new(BareEtcd::open(url)?)))
}

impl BareEtcd {
    fn open(url: &str) -> Result<Self> {
        let url = super::url::EtcdUrl::parse(url)?;
        let rpc = Rpc::new(&url)?;
        Ok(BareEtcd {
            rpc,
            prefix: url.prefix.clone(),
        })
    }
}

#[async_trait]
impl BareConnection for BareEtcd {
    fn requests(&self) -> (&'static str, &'static str) {
        ("range (count only)", "txn put-if-absent + delete")
    }

    async fn round_trip(&mut self) -> Result<()> {
        self.rpc
            .range(RangeRequest {
                count_only: true,
                ..get(format!("{}distlock-bare-ping", self.prefix))
            })
            .await
            .map(drop)
            .map_err(|status| self.rpc.failed("ping", status))
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let key = format!("{}{name}", self.prefix);
        let request = txn(
            [created(key.clone(), CompareResult::Equal, 0)],
            [op_put(put(key.clone(), "1", 0))],
            [],
        );
        let put = self
            .rpc
            .txn(request)
            .await
            .map_err(|status| self.rpc.failed("txn", status))?;
        self.rpc
            .delete_range(delete(key))
            .await
            .map_err(|status| self.rpc.failed("delete", status))?;
        Ok(put.succeeded)
    }
}
