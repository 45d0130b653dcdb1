//! The watch on the keys this client holds: one watch stream per client that tells of a held
//! key's deletion (an operator's force-unlock, `etcdctl del`), so that a renewal needs no
//! request while the stream is up.

use std::collections::HashSet;

use tokio::sync::mpsc;
use tonic::Streaming;

use super::api::etcdserverpb::watch_create_request::FilterType;
use super::api::etcdserverpb::{
    WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchResponse, watch_request,
};
use super::api::mvccpb::event::EventType;
use super::rpc::watch_create;
use super::*;

/// How long the stream waits before it opens again after a failure.
const REOPEN_AFTER: Duration = Duration::from_millis(200);

/// A change to the set of watched keys.
pub(crate) enum Change {
    /// Watch `key`, held since revision `from`, under the watch id `id`.
    Watch { id: i64, key: Arc<str>, from: i64 },
    /// Stop watching under `id`.
    Unwatch { id: i64 },
}

/// Keeps the held keys' watch up while the backend lives: opens the stream, watches every
/// held key on it, checks once with the server the keys held while no stream was up, then
/// follows the changes and the deletions until the stream breaks, and starts again.
pub(super) async fn watch(
    shared: Weak<Shared>,
    rpc: Rpc,
    mut changes: mpsc::UnboundedReceiver<Change>,
) {
    loop {
        let anchor = {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            strong.state().watch_up = false;
            // The stream opens with a first watch: one on a key nobody writes, with every
            // event filtered out.
            format!("{}distlock-held-keys", strong.url.prefix)
        };
        let first = watch_create(WatchCreateRequest {
            key: anchor.into_bytes(),
            filters: vec![FilterType::Noput.into(), FilterType::Nodelete.into()],
            ..WatchCreateRequest::default()
        });
        let opened = tokio::time::timeout(REQUEST_TIMEOUT, rpc.watch(first)).await;
        let (watcher, stream) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(error)) => {
                tracing::debug!(%error, "opening the held keys' watch failed");
                tokio::time::sleep(REOPEN_AFTER).await;
                continue;
            }
            Err(_) => continue,
        };
        // What was asked while no stream was up is in the state now.
        while changes.try_recv().is_ok() {}
        let ids = Arc::new(StdMutex::new(Ids::default()));
        // The answers are read by a task of their own, always: a server whose answers are
        // not read stops reading requests, and a writer waiting on it would never read them.
        let mut reader = tokio::spawn(read(shared.clone(), stream, ids.clone()));
        let Some(strong) = shared.upgrade() else {
            reader.abort();
            return;
        };
        let held: Vec<(i64, Node)> = {
            let state = strong.state();
            state
                .held
                .values()
                .filter(|held| held.generation == state.generation)
                .map(|held| {
                    (
                        held.extra.watch,
                        Node {
                            key: held.key.clone(),
                            token: held.token,
                        },
                    )
                })
                .collect()
        };
        let mut watched = HashSet::new();
        let mut failed = false;
        for (id, node) in &held {
            ids.lock()
                .unwrap_or_else(|p| p.into_inner())
                .requested
                .insert(*id);
            watched.insert(*id);
            let watch = watch_create(WatchCreateRequest {
                key: node.key.as_bytes().to_vec(),
                watch_id: *id,
                filters: vec![FilterType::Noput.into()],
                ..WatchCreateRequest::default()
            });
            if watcher.send(watch).await.is_err() {
                failed = true;
                break;
            }
        }
        // A key deleted while no stream was up is not in the new watches: ask once, after
        // the server created every watch (it only queued them so far), so that a deletion is
        // in the read or in a watch.
        let created_by = Instant::now() + REQUEST_TIMEOUT;
        while !failed {
            let pending = ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .requested
                .iter()
                .any(|id| watched.contains(id));
            if !pending {
                break;
            }
            if Instant::now() >= created_by || reader.is_finished() {
                failed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let nodes: Vec<Option<Node>> = held.iter().map(|(_, node)| Some(node.clone())).collect();
        match strong.check_keys(&nodes).await {
            Ok(alive) if !failed && !reader.is_finished() => {
                let mut state = strong.state();
                for ((_, node), alive) in held.iter().zip(alive) {
                    if !alive {
                        mark_gone(&mut state, node.key.as_bytes(), i64::MAX);
                    }
                }
                state.watch_up = true;
            }
            _ => {
                drop(strong);
                if reader.is_finished() && matches!((&mut reader).await, Ok(Ended::Refused)) {
                    tracing::warn!(
                        "the etcd server does not take client watch ids; renewals read the held keys"
                    );
                    return;
                }
                reader.abort();
                tokio::time::sleep(REOPEN_AFTER).await;
                continue;
            }
        }
        drop(strong);
        let ended = loop {
            tokio::select! {
                ended = &mut reader => break ended.unwrap_or(Ended::Broken),
                change = changes.recv() => match change {
                    None => {
                        reader.abort();
                        return;
                    }
                    Some(Change::Watch { id, key, from }) => {
                        if watched.insert(id) {
                            ids.lock().unwrap_or_else(|p| p.into_inner()).requested.insert(id);
                            // From the grant's revision: a deletion since then is replayed.
                            let watch = watch_create(WatchCreateRequest {
                                key: key.as_bytes().to_vec(),
                                watch_id: id,
                                start_revision: from,
                                filters: vec![FilterType::Noput.into()],
                                ..WatchCreateRequest::default()
                            });
                            if watcher.send(watch).await.is_err() {
                                break Ended::Broken;
                            }
                        }
                    }
                    Some(Change::Unwatch { id }) => {
                        if watched.remove(&id) {
                            ids.lock().unwrap_or_else(|p| p.into_inner()).unwatched.insert(id);
                            let cancel = WatchRequest {
                                request_union: Some(watch_request::RequestUnion::CancelRequest(
                                    WatchCancelRequest { watch_id: id },
                                )),
                            };
                            if watcher.send(cancel).await.is_err() {
                                break Ended::Broken;
                            }
                        }
                    }
                },
            }
        };
        reader.abort();
        if let Some(strong) = shared.upgrade() {
            strong.state().watch_up = false;
        }
        if ended == Ended::Refused {
            tracing::warn!(
                "the etcd server does not take client watch ids; renewals read the held keys"
            );
            return;
        }
        tokio::time::sleep(REOPEN_AFTER).await;
    }
}

/// The watches of one stream the reader must tell apart.
#[derive(Default)]
struct Ids {
    /// Asked for and not yet answered as created.
    requested: HashSet<i64>,
    /// Asked to end and not yet answered as cancelled.
    unwatched: HashSet<i64>,
}

/// Why a stream's reader ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The stream broke or a watch ended that nobody ended: open it again, and check.
    Broken,
    /// The server assigns watch ids of its own: the watch cannot be followed by key.
    Refused,
}

/// Reads the answers of one stream: marks the held keys deleted, until the stream ends.
async fn read(
    shared: Weak<Shared>,
    mut stream: Streaming<WatchResponse>,
    ids: Arc<StdMutex<Ids>>,
) -> Ended {
    loop {
        let Ok(Some(answer)) = stream.message().await else {
            return Ended::Broken;
        };
        let Some(strong) = shared.upgrade() else {
            return Ended::Broken;
        };
        let id = answer.watch_id;
        {
            let mut ids = ids.lock().unwrap_or_else(|p| p.into_inner());
            if answer.created && id != 0 && !ids.requested.remove(&id) {
                return Ended::Refused;
            }
            if answer.canceled && !ids.unwatched.remove(&id) {
                // A compacted revision, a duplicate id: start again.
                tracing::debug!(
                    reason = answer.cancel_reason,
                    "a held key's watch was cancelled"
                );
                return Ended::Broken;
            }
        }
        let mut state = strong.state();
        for event in &answer.events {
            if event.r#type() == EventType::Delete
                && let Some(kv) = &event.kv
            {
                mark_gone(&mut state, &kv.key, kv.mod_revision);
            }
        }
    }
}

/// Marks the held entry of `key` as deleted, when the deletion (at revision `deleted`) came
/// after the entry's grant: a key released and put again under the same name is a new grant,
/// which a late event of the old key's deletion must not end.
fn mark_gone(state: &mut State, key: &[u8], deleted: i64) {
    let generation = state.generation;
    if let Some(held) = state.held.values_mut().find(|held| {
        held.generation == generation
            && held.key.as_bytes() == key
            && u64::try_from(deleted).unwrap_or(0) > held.token
    }) {
        held.extra.gone = true;
    }
}
