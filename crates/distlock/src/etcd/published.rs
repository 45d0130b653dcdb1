//! Published records (an election's leader): one key `PREFIX NAME#published` per key, with no
//! lease, outside every lock's range `PREFIX NAME/` (escaped names have no `#` and no `/`).
//! Its value is the record ([`Published::encode`]); a publish is a transaction that writes
//! only if the key's modification revision is still the one read, so it is atomic per key.
//! A withdrawn record keeps its key and term.

use etcd::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};

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
    let record = Published::decode(kv.value()).ok_or_else(|| {
        Error::backend(
            SCHEME,
            operation,
            "a published key does not hold a published record",
        )
    })?;
    Ok((Some(record), kv.mod_revision()))
}

/// The key-value the `else` branch's read found, after a failed compare.
fn else_read(answer: &etcd::TxnResponse) -> Option<KeyValue> {
    match answer.op_responses().first() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
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
        let answer = self.call(operation, self.kv().get(key, None)).await?;
        decoded(answer.kvs().first(), operation)
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
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(key, data, None)])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.call(operation, self.kv().txn(txn)).await?;
        if answer.succeeded() {
            return Ok(None);
        }
        decoded(else_read(&answer).as_ref(), operation).map(Some)
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
