//! Published records (an election's leader): one persistent node `BASE/NAME#published` per
//! key, beside (never inside) the lock nodes `BASE/NAME`, whose names have no raw `#`. The
//! node's data is the record ([`Published::encode`]); every change is checked against the
//! version read, so a publish is atomic per key. A withdrawn record keeps its node and term.

use super::*;
use crate::backend::Published;

/// How often a publish or withdraw reads again after another client changed the node
/// between its read and its write.
const RACES: usize = 16;

/// The node of the record published under `key`.
fn record_path(base: &str, key: &LockName) -> String {
    format!("{}#published", lock_path(base, key.as_str()))
}

impl Shared {
    /// The stored record and the node's version; `None` when there is no node.
    async fn stored_record(
        &self,
        session: &Session,
        path: &str,
        operation: &'static str,
    ) -> Result<Option<(Published, i32)>> {
        match session.client.get_data(path).await {
            Ok((data, stat)) => {
                let record = Published::decode(&data).ok_or_else(|| {
                    Error::backend(
                        self.scheme,
                        operation,
                        format!("the node {path} does not hold a published record"),
                    )
                })?;
                Ok(Some((record, stat.version)))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err(operation, e)),
        }
    }

    pub(super) async fn publish_record(
        &self,
        key: &LockName,
        record: &Published,
    ) -> Result<Published> {
        let session = self.session();
        let path = record_path(&self.url.base, key);
        for _ in 0..RACES {
            let written = match self.stored_record(&session, &path, "publish").await? {
                Some((stored, _)) if stored.term > record.term => return Ok(stored),
                Some((_, version)) => session
                    .client
                    .set_data(&path, &record.encode(), Some(version))
                    .await
                    .map(drop),
                None => match session
                    .client
                    .create(
                        &path,
                        &record.encode(),
                        &self.url.node(zk::CreateMode::Persistent),
                    )
                    .await
                {
                    Err(zk::Error::NoNode) => session
                        .client
                        .mkdir(&self.url.base, &self.url.node(zk::CreateMode::Persistent))
                        .await
                        .and(Err(zk::Error::NoNode)),
                    other => other.map(drop),
                },
            };
            match written {
                Ok(()) => return Ok(record.clone()),
                // Changed, made or removed since the read: read again.
                Err(zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode) => {}
                Err(e) => return Err(self.err("publish", e)),
            }
        }
        Err(Error::backend(
            self.scheme,
            "publish",
            format!("the record {path} changed under every one of {RACES} attempts"),
        ))
    }

    pub(super) async fn read_record(&self, key: &LockName) -> Result<Option<Published>> {
        let session = self.session();
        let path = record_path(&self.url.base, key);
        // A record another session published before this read began is seen.
        self.catch_up(&session, &path, "read the published record")
            .await?;
        Ok(self
            .stored_record(&session, &path, "read the published record")
            .await?
            .and_then(|(record, _)| record.live()))
    }

    pub(super) async fn withdraw_record(&self, key: &LockName, term: u64) -> Result<bool> {
        let session = self.session();
        let path = record_path(&self.url.base, key);
        for _ in 0..RACES {
            let version = match self.stored_record(&session, &path, "withdraw").await? {
                Some((stored, version)) if stored.term == term && !stored.is_withdrawn() => version,
                _ => return Ok(false),
            };
            let withdrawn = Published::withdrawn(term).encode();
            match session
                .client
                .set_data(&path, &withdrawn, Some(version))
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                Err(e) => return Err(self.err("withdraw", e)),
            }
        }
        Ok(false)
    }
}
