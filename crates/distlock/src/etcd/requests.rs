//! What the etcd backend asks its servers: keys put, found, checked and deleted.

use std::future::Future;
use std::sync::atomic::Ordering;

use tonic::Status;

use crate::queue::Queue as _;

use super::api::etcdserverpb::{RangeRequest, TxnRequest, TxnResponse, range_request::SortOrder};
use super::rpc::{
    by_creation, created, delete, get, get_prefix, op_delete, op_get, op_put, put, read_kv,
    revision_of, txn,
};
use super::*;

use super::api::etcdserverpb::compare::CompareResult;

/// How many keys one renewal transaction checks (the server's default limit on the
/// operations of one transaction is 128).
const CHECK_BATCH: usize = 100;

/// What a waiter sees of the queue: whether its key is still there, and the key just before
/// it with the revision of the read.
pub(super) struct Look {
    pub(super) own: bool,
    /// The key just before ours and its create revision.
    pub(super) predecessor: Option<(Vec<u8>, i64)>,
    pub(super) revision: i64,
}

fn revision_token(revision: i64) -> u64 {
    // Revisions start at 1 and only grow.
    u64::try_from(revision).unwrap_or(0)
}

/// A read of the first contender of a lock's prefix: the key with the lowest create revision.
fn first_created(lock_prefix: &str) -> RangeRequest {
    by_creation(get_prefix(lock_prefix), SortOrder::Ascend)
}

/// A read of `key` alone, its key only.
fn key_only(key: impl Into<Vec<u8>>) -> RangeRequest {
    RangeRequest {
        keys_only: true,
        ..get(key)
    }
}

/// The first contender of `lock_prefix`, its key only.
fn first_of(lock_prefix: &str) -> api::etcdserverpb::RequestOp {
    op_get(RangeRequest {
        keys_only: true,
        ..first_created(lock_prefix)
    })
}

impl Shared {
    /// Runs one request under [`REQUEST_TIMEOUT`], with a typed error.
    pub(super) async fn call<T>(
        &self,
        operation: &'static str,
        request: impl Future<Output = std::result::Result<T, Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(status)) => Err(self.rpc.failed(operation, status)),
            Err(_) => Err(Error::backend(
                SCHEME,
                operation,
                format!("no answer within {REQUEST_TIMEOUT:?}"),
            )),
        }
    }

    /// Runs a transaction, sending it again after a failure (at most [`ATTEMPTS`] times):
    /// for transactions whose second run answers what the first did.
    async fn txn_again(&self, operation: &'static str, txn: TxnRequest) -> Result<TxnResponse> {
        let mut attempt = 1;
        loop {
            match self.call(operation, self.rpc.txn(txn.clone())).await {
                Ok(answer) => return Ok(answer),
                Err(error) if attempt >= ATTEMPTS => return Err(error),
                Err(error) => {
                    tracing::debug!(%error, "an etcd request failed; sending it again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Puts `key` under `lease` unless it exists, and tells whether it is first in line.
    /// With `only_if_free`, puts it only when no contender has a key: `None` then means the
    /// lock is taken (and nothing was put). A second run of the transaction after a lost
    /// reply finds the key the first one put.
    async fn enqueue(
        &self,
        lock_prefix: &str,
        key: &str,
        kind: &LockKind,
        lease: i64,
        only_if_free: bool,
    ) -> Result<Option<(Node, bool)>> {
        // A candidate's key holds its value, as `concurrency.Election`'s; a lock's is empty,
        // as `concurrency.Mutex`'s.
        let value = match kind {
            LockKind::Leader(value) => value.as_bytes(),
            _ => &[],
        };
        let put = op_put(put(key, value, lease));
        let when = if only_if_free {
            // Every key of the prefix is absent.
            api::etcdserverpb::Compare {
                range_end: rpc::prefix_end(lock_prefix.as_bytes()),
                ..created(lock_prefix, CompareResult::Equal, 0)
            }
        } else {
            created(key, CompareResult::Equal, 0)
        };
        let request = txn(
            [when],
            [put, first_of(lock_prefix)],
            [op_get(get(key)), first_of(lock_prefix)],
        );
        let answer = self.txn_again("put a lock key", request).await?;
        let responses = &answer.responses;
        let token = if answer.succeeded {
            revision_token(revision_of(answer.header.as_ref()))
        } else {
            match read_kv(responses, 0) {
                Some(kv) => revision_token(kv.create_revision),
                None if only_if_free => return Ok(None),
                None => {
                    return Err(Error::backend(
                        SCHEME,
                        "put a lock key",
                        "the key was there for the check and gone for the read; try again",
                    ));
                }
            }
        };
        let first = read_kv(responses, 1).is_some_and(|kv| kv.key == key.as_bytes());
        Ok(Some((
            Node {
                key: key.into(),
                token,
            },
            first,
        )))
    }

    pub(super) async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        if let Some(granted) = self.reenter(name, owner, lease).await? {
            return Ok(granted);
        }
        let lock_prefix = self.lock_prefix(name);
        self.lease_granted().await?;
        // `queued`: the waiter's key, put by an earlier attempt, with its create revision.
        let (waiter, queued, key, lease_id, generation) = {
            let mut state = self.state();
            let waiter = state.waiter_of(name, owner);
            let queued = waiter.and_then(|id| state.waiters[&id].node.clone());
            match (queued, state.lease) {
                (Some(node), Some(lease_id)) => (
                    waiter,
                    Some(node.token),
                    node.key,
                    lease_id,
                    state.generation,
                ),
                _ => {
                    let (key, lease_id, generation) =
                        state.new_key(&lock_prefix).ok_or_else(no_lease)?;
                    (waiter, None, key, lease_id, generation)
                }
            }
        };
        let answer = self
            .enqueue(&lock_prefix, &key, name.kind(), lease_id, waiter.is_none())
            .await;
        let (node, first) = match answer {
            Err(error) => {
                // The put may have landed: the reaper deletes the key if it is there. A
                // waiter's key already queued stays for its next attempt (and goes when the
                // waiter is dropped).
                if queued.is_none() {
                    self.orphan(key, None, generation, None);
                }
                if std::error::Error::source(&error)
                    .is_some_and(|source| source.to_string().contains("lease not found"))
                {
                    // The lease this put was under is gone: give it up now rather than at
                    // the next keep-alive (a newer lease is left alone).
                    self.lose_lease(generation, "a put found the lease gone");
                }
                return Err(error);
            }
            Ok(None) => {
                self.state().keys.remove(&key);
                return Ok(Acquired::Held { ttl: None });
            }
            Ok(Some(found)) => found,
        };
        if let Some(id) = waiter {
            let mut state = self.state();
            match state.waiters.get_mut(&id) {
                Some(entry)
                    if entry.generation == generation
                        && entry.node.as_ref().is_none_or(|put| put.key == node.key) =>
                {
                    entry.node = Some(node.clone());
                }
                _ => {
                    // The waiter left (or the lease was lost, or another attempt of the same
                    // owner took its key as a grant) while the key was being put, or another
                    // attempt of the owner put the waiter's key first. A key this attempt
                    // made is nobody's now; the waiter's own key is not this attempt's to
                    // delete while it is the same key (it is held, or its waiter's drop deletes
                    // it).
                    // A re-put that made the key again (its first one deleted meanwhile: the
                    // waiter dropped, or granted and released) made a key nobody tracks.
                    drop(state);
                    if queued != Some(node.token) {
                        self.orphan(node.key, Some(node.token), generation, None);
                    }
                    return Ok(Acquired::Held {
                        ttl: Some(Duration::ZERO),
                    });
                }
            }
        }
        if first && self.record_grant(name, owner, &node, lease, generation, waiter) {
            return Ok(Acquired::Granted {
                fencing_token: node.token,
                holds: 1,
            });
        }
        if waiter.is_none() {
            // A one-off attempt leaves no key behind.
            self.orphan(node.key, Some(node.token), generation, None);
        }
        Ok(Acquired::Held {
            ttl: first.then_some(Duration::ZERO),
        })
    }

    /// The first candidate in line of an election (`concurrency.Election`'s leader): its
    /// create revision as the term, its value, its key as the holder.
    pub(super) async fn read_leader(&self, name: &LockName) -> Result<Option<Published>> {
        let read = first_created(&self.lock_prefix(name));
        let answer = self.call("read the leader", self.rpc.range(read)).await?;
        Ok(answer.kvs.first().map(|kv| {
            Published::new(
                revision_token(kv.create_revision),
                String::from_utf8_lossy(&kv.value),
                String::from_utf8_lossy(&kv.key),
            )
        }))
    }

    /// Waits (at most a request's timeout) while a lost lease is being replaced.
    async fn lease_granted(&self) -> Result<()> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        while self.state().lease.is_none() {
            if Instant::now() >= deadline {
                return Err(no_lease());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Re-enters a lock `owner` holds. `None` when it does not hold it (any more).
    async fn reenter(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Option<Acquired>> {
        let key = (name.clone(), owner.clone());
        let Some((node, generation)) = self.held_node(&key) else {
            return Ok(None);
        };
        let alive = self.check_keys(&[Some(node.clone())]).await? == [true];
        let mut state = self.state();
        match state.held.get_mut(&key) {
            Some(held) if held.key == node.key && held.generation == generation => {
                if alive {
                    held.holds += 1;
                    held.expires_at = held.expires_at.max(Instant::now() + lease);
                    Ok(Some(Acquired::Granted {
                        fencing_token: node.token,
                        holds: held.holds,
                    }))
                } else {
                    drop(state);
                    self.forget(&key, &node.key);
                    Ok(None)
                }
            }
            _ => Ok(None),
        }
    }

    /// Deletes one of our keys: only the one with create revision `token` when given.
    /// `Ok(false)` when it was not there. A second run after a failure that finds the key
    /// gone counts as deleted: the first run may have deleted it.
    pub(super) async fn delete_key(&self, key: &str, token: Option<u64>) -> Result<bool> {
        let when = match token {
            Some(token) => created(
                key,
                CompareResult::Equal,
                i64::try_from(token).unwrap_or(i64::MAX),
            ),
            None => created(key, CompareResult::Greater, 0),
        };
        let request = txn([when], [op_delete(delete(key))], []);
        let mut attempt = 1;
        loop {
            match self
                .call("delete a lock key", self.rpc.txn(request.clone()))
                .await
            {
                Ok(answer) => return Ok(answer.succeeded || attempt > 1),
                Err(error) if attempt >= ATTEMPTS => return Err(error),
                Err(error) => {
                    tracing::debug!(%error, "deleting a lock key failed; sending it again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Which of `nodes` are still there with their create revision; `false` for `None`.
    pub(super) async fn check_keys(&self, nodes: &[Option<Node>]) -> Result<Vec<bool>> {
        let mut alive = vec![false; nodes.len()];
        let wanted: Vec<(usize, &Node)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| node.as_ref().map(|node| (i, node)))
            .collect();
        for batch in wanted.chunks(CHECK_BATCH) {
            let reads = batch
                .iter()
                .map(|(_, node)| op_get(key_only(node.key.as_bytes())));
            self.key_checks.fetch_add(1, Ordering::Relaxed);
            let answer = self
                .call("check lock keys", self.rpc.txn(txn([], reads, [])))
                .await?;
            for (at, (i, node)) in batch.iter().enumerate() {
                alive[*i] = read_kv(&answer.responses, at)
                    .is_some_and(|kv| revision_token(kv.create_revision) == node.token);
            }
        }
        Ok(alive)
    }

    /// Whether `node` is still there, and the key just before it in line.
    pub(super) async fn look(&self, lock_prefix: &str, node: &Node) -> Result<Look> {
        let before = RangeRequest {
            max_create_revision: i64::try_from(node.token).unwrap_or(i64::MAX) - 1,
            keys_only: true,
            ..by_creation(get_prefix(lock_prefix), SortOrder::Descend)
        };
        let reads = [op_get(key_only(node.key.as_bytes())), op_get(before)];
        let answer = self
            .call("look at the lock's queue", self.rpc.txn(txn([], reads, [])))
            .await?;
        let responses = &answer.responses;
        Ok(Look {
            own: read_kv(responses, 0)
                .is_some_and(|kv| revision_token(kv.create_revision) == node.token),
            predecessor: read_kv(responses, 1).map(|kv| (kv.key.clone(), kv.create_revision)),
            revision: revision_of(answer.header.as_ref()),
        })
    }

    /// Whether `key` exists with the create revision `created` (a key deleted and put again
    /// under the same name is another key).
    pub(super) async fn exists(&self, key: &[u8], created: i64) -> Result<bool> {
        let answer = self
            .call("check a lock key", self.rpc.range(key_only(key)))
            .await?;
        Ok(answer
            .kvs
            .first()
            .is_some_and(|kv| kv.create_revision == created))
    }

    pub(super) async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let answer = self
            .call(
                "check the lock",
                self.rpc.range(RangeRequest {
                    count_only: true,
                    ..get_prefix(self.lock_prefix(name))
                }),
            )
            .await?;
        Ok(answer.count > 0)
    }

    /// Who holds a lock we do not: used to answer a release or extension by a non-holder.
    pub(super) async fn not_ours(&self, name: &LockName) -> Result<(Released, Extended)> {
        if self.is_locked(name).await? {
            Ok((Released::HeldByOther, Extended::HeldByOther))
        } else {
            Ok((Released::NotHeld, Extended::NotHeld))
        }
    }

    /// Deletes the holder's key of `name`, whoever holds it.
    pub(super) async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let lock_prefix = self.lock_prefix(name);
        for _ in 0..ATTEMPTS {
            let answer = self
                .call(
                    "force-unlock",
                    self.rpc.txn(txn([], [first_of(&lock_prefix)], [])),
                )
                .await?;
            let Some(first) = read_kv(&answer.responses, 0) else {
                return Ok(false);
            };
            let request = txn(
                [created(
                    first.key.clone(),
                    CompareResult::Equal,
                    first.create_revision,
                )],
                [op_delete(delete(first.key.clone()))],
                [],
            );
            if self
                .call("force-unlock", self.rpc.txn(request))
                .await?
                .succeeded
            {
                return Ok(true);
            }
            // Released meanwhile: the next in line holds it now.
        }
        Ok(false)
    }
}
