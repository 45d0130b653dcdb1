//! The watch on the keys this client holds: one watch stream per client that tells of a held
//! key's deletion (an operator's force-unlock, `etcdctl del`), so that a renewal needs no
//! request while the stream is up.

use std::collections::HashSet;

use etcd::{EventType, WatchFilterType, WatchOptions};
use tokio::sync::mpsc;

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
    client: etcd::Client,
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
        let options =
            WatchOptions::new().with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete]);
        let opened = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client.watch_client().watch(anchor, Some(options)),
        )
        .await;
        let (mut watcher, mut stream) = match opened {
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
        let Some(strong) = shared.upgrade() else {
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
                        held.watch,
                        Node {
                            key: held.key.clone(),
                            token: held.token,
                        },
                    )
                })
                .collect()
        };
        // Watches asked for and not yet answered as created, and watches in place.
        let mut requested = HashSet::new();
        let mut watched = HashSet::new();
        let mut failed = false;
        for (id, node) in &held {
            let options = WatchOptions::new()
                .with_watch_id(*id)
                .with_filters([WatchFilterType::NoPut]);
            if watcher
                .watch(node.key.as_bytes(), Some(options))
                .await
                .is_err()
            {
                failed = true;
                break;
            }
            requested.insert(*id);
            watched.insert(*id);
        }
        // A key deleted while no stream was up is not in the new watches: ask once.
        let nodes: Vec<Option<Node>> = held.iter().map(|(_, node)| Some(node.clone())).collect();
        match strong.check_keys(&nodes).await {
            Ok(alive) if !failed => {
                let mut state = strong.state();
                for ((_, node), alive) in held.iter().zip(alive) {
                    if !alive {
                        mark_gone(&mut state, node.key.as_bytes());
                    }
                }
                state.watch_up = true;
            }
            _ => {
                drop(strong);
                tokio::time::sleep(REOPEN_AFTER).await;
                continue;
            }
        }
        drop(strong);
        let mut unwatched = HashSet::new();
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    None => return,
                    Some(Change::Watch { id, key, from }) => {
                        if watched.insert(id) {
                            requested.insert(id);
                            // From the grant's revision: a deletion since then is replayed.
                            let options = WatchOptions::new()
                                .with_watch_id(id)
                                .with_start_revision(from)
                                .with_filters([WatchFilterType::NoPut]);
                            if watcher.watch(key.as_bytes(), Some(options)).await.is_err() {
                                break;
                            }
                        }
                    }
                    Some(Change::Unwatch { id }) => {
                        if watched.remove(&id) {
                            unwatched.insert(id);
                            if watcher.cancel_by_id(id).await.is_err() {
                                break;
                            }
                        }
                    }
                },
                message = stream.message() => {
                    let Ok(Some(answer)) = message else { break };
                    let Some(strong) = shared.upgrade() else { return };
                    let mut state = strong.state();
                    if answer.created()
                        && answer.watch_id() != 0
                        && !requested.remove(&answer.watch_id())
                    {
                        // A server that does not take the client's watch ids: renewals ask
                        // the server instead.
                        tracing::warn!("the etcd server does not take watch ids; renewals read the held keys");
                        state.watch_up = false;
                        return;
                    }
                    for event in answer.events() {
                        if event.event_type() == EventType::Delete
                            && let Some(kv) = event.kv()
                        {
                            mark_gone(&mut state, kv.key());
                        }
                    }
                    if answer.canceled() && !unwatched.remove(&answer.watch_id()) {
                        // The server ended a watch nobody asked to end (a compacted
                        // revision, an id it refused): start again, and check.
                        tracing::debug!(reason = answer.cancel_reason(), "a held key's watch was cancelled");
                        break;
                    }
                }
            }
        }
        if let Some(strong) = shared.upgrade() {
            strong.state().watch_up = false;
        }
        tokio::time::sleep(REOPEN_AFTER).await;
    }
}

/// Marks the held entry of `key` (if any, under the current lease) as deleted.
fn mark_gone(state: &mut State, key: &[u8]) {
    let generation = state.generation;
    if let Some(held) = state
        .held
        .values_mut()
        .find(|held| held.generation == generation && held.key.as_bytes() == key)
    {
        held.gone = true;
    }
}
