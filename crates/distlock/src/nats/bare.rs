//! NATS's bare baseline for `distlock bench --compare`: a direct get of a key that is not
//! there, and the lock a user would write with `async-nats`'s key-value API, `create` of the
//! name's key + `delete`, on one connection to the bucket the URL names. After the first
//! pair the key's last entry is a delete marker, so each `create` is a write on revision 0
//! that fails, a read of the marker and a write on its revision: three round trips.

use async_nats::jetstream::kv::CreateErrorKind;
use async_trait::async_trait;

use super::{NatsBackend, failed, record};
use crate::driver::BareConnection;
use crate::error::Result;

struct BareNats {
    backend: NatsBackend,
}

pub(super) async fn open(url: &str) -> Result<Option<crate::driver::BoxedBare>> {
    Ok(Some(Box::new(BareNats {
        backend: NatsBackend::connect(url).await?,
    })))
}

#[async_trait]
impl BareConnection for BareNats {
    fn requests(&self) -> (&'static str, &'static str) {
        ("direct get of a missing key", "create on revision 0 + delete")
    }

    async fn round_trip(&mut self) -> Result<()> {
        self.backend
            .entry("ping", "distlock-bare-ping")
            .await
            .map(drop)
    }

    async fn pair(&mut self, name: &str) -> Result<bool> {
        let store = &self.backend.shared.store;
        let key = format!("bare.{}", record::encode(name));
        match store.create(&key, "1".into()).await {
            Ok(_) => {}
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(failed("create", e)),
        }
        store.delete(&key).await.map_err(|e| failed("delete", e))?;
        Ok(true)
    }
}
