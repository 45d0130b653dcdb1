//! Published records (an election's leader): a hash `distlock:{<name>}:published` with the
//! fields `term`, `value` and `holder`, apart from the lock's keys. Publish and withdraw are
//! one script each; a withdrawn record keeps its term with an empty holder.

use super::{RedisBackend, SCHEME, backend_error};
use crate::backend::Published;
use crate::error::{Error, Result};
use crate::name::LockName;

/// The key of the record published under `key`.
fn record_key(key: &LockName) -> String {
    format!("distlock:{{{}}}:published", key.escaped())
}

/// A record from `[term, value, holder]`; `None` when there is none.
fn record(fields: Vec<Option<String>>, operation: &'static str) -> Result<Option<Published>> {
    match fields.as_slice() {
        [None, ..] | [] => Ok(None),
        [Some(term), value, holder] => {
            let term = term.parse().map_err(|_| {
                Error::backend(
                    SCHEME,
                    operation,
                    format!("a published term is not a number: {term:?}"),
                )
            })?;
            Ok(Some(Published::new(
                term,
                value.clone().unwrap_or_default(),
                holder.clone().unwrap_or_default(),
            )))
        }
        other => Err(Error::backend(
            SCHEME,
            operation,
            format!("unexpected published record: {other:?}"),
        )),
    }
}

impl RedisBackend {
    pub(super) async fn publish_record(
        &self,
        key: &LockName,
        published: &Published,
    ) -> Result<Published> {
        let fields: Vec<Option<String>> = self
            .scripts
            .publish_record
            .key(record_key(key))
            .arg(published.term.to_string())
            .arg(&published.value)
            .arg(&published.holder)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("publish"))?;
        record(fields, "publish")?.ok_or_else(|| {
            Error::backend(SCHEME, "publish", "the publish script returned no record")
        })
    }

    /// The stored record of `key`, withdrawn or not.
    pub(super) async fn stored_record(&self, key: &LockName) -> Result<Option<Published>> {
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(record_key(key))
            .arg("term")
            .arg("value")
            .arg("holder")
            .query_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("read the published record"))?;
        record(fields, "read the published record")
    }

    pub(super) async fn withdraw_record(&self, key: &LockName, term: u64) -> Result<bool> {
        let withdrawn: i64 = self
            .scripts
            .withdraw_record
            .key(record_key(key))
            .arg(term.to_string())
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("withdraw"))?;
        Ok(withdrawn == 1)
    }
}
