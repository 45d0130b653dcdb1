//! The etcd lock's waiter: a watch on the key just before its own.

use tonic::Streaming;

use super::api::etcdserverpb::{WatchCreateRequest, WatchResponse};
use super::api::mvccpb::event::EventType;

use super::url::WatchStart;
use super::*;
use crate::backend::Woken;
use crate::queue::Place;

/// How long a waiter whose request failed waits before it lets the caller try again.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// A waiter: its place in the queue, whose key the owner's next attempt puts.
pub(super) struct EtcdWaiter {
    pub(super) place: Place<Shared>,
    pub(super) lock_prefix: String,
    pub(super) status: watch::Receiver<SessionStatus>,
}

impl EtcdWaiter {
    /// Opens a watch on `key`, from now or (`?watch=etcd`) from `revision`.
    async fn watch(&self, key: &[u8], revision: i64) -> Result<Streaming<WatchResponse>> {
        let create = WatchCreateRequest {
            key: key.to_vec(),
            start_revision: match self.place.shared.url.watch {
                WatchStart::Now => 0,
                WatchStart::Revision => revision,
            },
            ..WatchCreateRequest::default()
        };
        let shared = &self.place.shared;
        let (_requests, stream) = shared
            .call(
                "watch a lock key",
                shared.rpc.watch(rpc::watch_create(create)),
            )
            .await?;
        // Dropping the requests' half leaves the stream open; dropping the stream ends it.
        Ok(stream)
    }
}

/// Waits until `stream` reports `key` deleted, or ends.
async fn deleted(stream: &mut Streaming<WatchResponse>) {
    loop {
        match stream.message().await {
            Ok(Some(answer)) => {
                if answer.canceled
                    || answer
                        .events
                        .iter()
                        .any(|event| event.r#type() == EventType::Delete)
                {
                    return;
                }
            }
            Ok(None) | Err(_) => return,
        }
    }
}

#[async_trait]
impl ReleaseWaiter for EtcdWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        // A watch lost in some way nobody foresaw costs one lease TTL, not a hang.
        let deadline = Instant::now() + max.min(self.place.shared.url.lease_ttl);
        self.status.borrow_and_update();
        let pause = || tokio::time::sleep_until(deadline.min(Instant::now() + PAUSE_AFTER_FAILURE));
        loop {
            if Instant::now() >= deadline {
                return Woken::Retry;
            }
            let Some((node, generation)) = self.place.entry() else {
                // The next attempt puts the key.
                return Woken::Retry;
            };
            let look = match self.place.shared.look(&self.lock_prefix, &node).await {
                Ok(look) => look,
                Err(error) => {
                    tracing::debug!(%error, "looking at the queue failed");
                    pause().await;
                    return Woken::Retry;
                }
            };
            if !look.own {
                // Our key is gone (an operator deleted it): the next attempt puts it again.
                return Woken::Retry;
            }
            let Some((predecessor, created)) = look.predecessor else {
                return self
                    .place
                    .granted(&node, generation)
                    .unwrap_or(Woken::Retry);
            };
            let mut stream = match self.watch(&predecessor, look.revision).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%error, "watching the key before ours failed");
                    pause().await;
                    return Woken::Retry;
                }
            };
            if self.place.shared.url.watch == WatchStart::Now {
                // A deletion between the look and the watch is not in the watch: look again.
                match self.place.shared.exists(&predecessor, created).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(error) => {
                        tracing::debug!(%error, "checking the key before ours failed");
                        pause().await;
                        return Woken::Retry;
                    }
                }
            }
            tokio::select! {
                () = deleted(&mut stream) => {}
                () = tokio::time::sleep_until(deadline) => return Woken::Retry,
                _ = self.status.changed() => return Woken::Retry,
            }
        }
    }
}
