//! Published records (an election's leader): one key `PREFIX NAME#published` per key, with no
//! lease, outside every lock's range `PREFIX NAME/` (escaped names have no `#` and no `/`).
//! Its value is the record ([`Published::encode`]); a publish is a transaction that writes
//! only if the key's modification revision is still the one read, so it is atomic per key.
//! A withdrawn record keeps its key and term.

use super::api::etcdserverpb::compare::CompareResult;
use super::api::mvccpb::KeyValue;
use super::rpc::{get, modified, op_get, op_put, put, read_kv, txn};
use super::*;
use crate::backend::Published;

/// How often a publish or withdraw reads again after another client changed the key between
/// its read and its write.
const RACES: usize = 16;

/// The stored record of a key-value (its modification revision with it), `None` for none.
fn decoded(kv: Option<&KeyValue>, operation: &'static str) -> Result<(Option<Published>, i64)> {
    let Some(kv) = kv else {
        return Ok((None, 0));
    };
    let record = Published::decode(&kv.value).ok_or_else(|| {
        Error::backend(
            SCHEME,
            operation,
            "a published key does not hold a published record",
        )
    })?;
    Ok((Some(record), kv.mod_revision))
}

impl Shared {
    fn record_key(&self, key: &LockName) -> String {
        format!("{}{}#published", self.url.prefix, key.escaped())
    }

    async fn stored_record(
        &self,
        key: &str,
        operation: &'static str,
    ) -> Result<(Option<Published>, i64)> {
        let answer = self.call(operation, self.rpc.range(get(key))).await?;
        decoded(answer.kvs.first(), operation)
    }

    /// Writes `data` to `key` if its modification revision is `revision` (0: absent). `Ok(None)`
    /// when written, else what the key holds now.
    async fn write_if(
        &self,
        key: &str,
        revision: i64,
        data: Vec<u8>,
        operation: &'static str,
    ) -> Result<Option<(Option<Published>, i64)>> {
        let request = txn(
            [modified(key, CompareResult::Equal, revision)],
            [op_put(put(key, data, 0))],
            [op_get(get(key))],
        );
        let answer = self.call(operation, self.rpc.txn(request)).await?;
        if answer.succeeded {
            return Ok(None);
        }
        // The `else` branch's read: what the key holds now.
        decoded(read_kv(&answer.responses, 0), operation).map(Some)
    }

    pub(super) async fn publish_record(
        &self,
        key: &LockName,
        record: &Published,
    ) -> Result<Published> {
        let key = self.record_key(key);
        let mut stored = self.stored_record(&key, "publish").await?;
        for _ in 0..RACES {
            let (found, revision) = stored;
            if let Some(found) = found.filter(|found| found.term > record.term) {
                return Ok(found);
            }
            match self
                .write_if(&key, revision, record.encode(), "publish")
                .await?
            {
                None => return Ok(record.clone()),
                Some(now) => stored = now,
            }
        }
        Err(Error::backend(
            SCHEME,
            "publish",
            format!("the key {key} changed under every one of {RACES} attempts"),
        ))
    }

    pub(super) async fn read_record(&self, key: &LockName) -> Result<Option<Published>> {
        let key = self.record_key(key);
        let (stored, _) = self
            .stored_record(&key, "read the published record")
            .await?;
        Ok(stored.and_then(Published::live))
    }

    pub(super) async fn withdraw_record(&self, key: &LockName, term: u64) -> Result<bool> {
        let key = self.record_key(key);
        let mut stored = self.stored_record(&key, "withdraw").await?;
        for _ in 0..RACES {
            let revision = match stored {
                (Some(found), revision) if found.term == term && !found.is_withdrawn() => revision,
                _ => return Ok(false),
            };
            let withdrawn = Published::withdrawn(term).encode();
            match self.write_if(&key, revision, withdrawn, "withdraw").await? {
                None => return Ok(true),
                Some(now) => stored = now,
            }
        }
        Ok(false)
    }
}
