//! Release announcements: one pub/sub connection per client, shared by all its waiters.
//!
//! A channel is subscribed while at least one waiter listens on it, and each message bumps
//! that channel's watch. On a standalone server or a Sentinel group's master the hub uses
//! SUBSCRIBE on a dedicated connection (opened again, on the current master, after it breaks);
//! on a Cluster it uses SSUBSCRIBE through the cluster connection, which sends each
//! subscription to the shard that owns the channel's slot and renews it after a reconnect or
//! a slot move, so a release wakes only its own shard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};

use super::backend_error;
use super::deployment::Following;
use crate::error::Result;

/// The first and the longest pause before opening a closed pub/sub connection again.
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Where the hub's connection comes from.
pub(super) enum Source {
    /// A standalone server.
    Server(Box<redis::Client>),
    /// The current master of a Sentinel group.
    Sentinel(Following),
    /// A Cluster connection made with RESP3 and a push sender; the receiver until first use.
    Cluster {
        connection: ClusterConnection,
        pushes: StdMutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
    },
}

pub(super) struct ReleaseHub {
    source: Source,
    /// The subscriber; `None` until first use. Held across (un)subscribe requests, so that they
    /// reach the server in the order they were decided.
    subscriber: tokio::sync::Mutex<Option<Subscriber>>,
    /// Channel → (signal, listeners).
    channels: Channels,
}

enum Sink {
    PubSub(PubSubSink),
    Cluster(ClusterConnection),
}

struct Subscriber {
    sink: Sink,
    /// False once the reader has seen this connection close.
    alive: Arc<AtomicBool>,
}

/// The last announcement on a channel: who may go (an owner, or `*` for anyone).
type Announcement = watch::Sender<Arc<str>>;
type ChannelMap = HashMap<String, (Announcement, usize)>;
type Channels = Arc<StdMutex<ChannelMap>>;

fn lock_channels(channels: &StdMutex<ChannelMap>) -> std::sync::MutexGuard<'_, ChannelMap> {
    // Updates are single inserts and field writes: a poisoned map is still whole.
    channels.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells the listeners of `channel` who may go.
fn announce(channels: &StdMutex<ChannelMap>, channel: &str, who: Arc<str>) {
    if let Some((signal, _)) = lock_channels(channels).get(channel) {
        signal.send_replace(who);
    }
}

/// The channel and payload of a sharded message pushed by a Cluster node.
fn sharded_message(push: &PushInfo) -> Option<(String, Arc<str>)> {
    if push.kind != PushKind::SMessage {
        return None;
    }
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match push.data.as_slice() {
        [channel, payload, ..] => {
            Some((text(channel)?, text(payload).unwrap_or("*".into()).into()))
        }
        _ => None,
    }
}

impl ReleaseHub {
    pub(super) fn new(source: Source) -> Self {
        ReleaseHub {
            source,
            subscriber: tokio::sync::Mutex::new(None),
            channels: Arc::new(StdMutex::new(HashMap::new())),
        }
    }

    /// The channels somebody listens on (forgetting the others).
    fn listened(&self) -> Vec<String> {
        let mut channels = lock_channels(&self.channels);
        channels.retain(|_, (_, listeners)| *listeners > 0);
        channels.keys().cloned().collect()
    }

    /// Opens the pub/sub connection, starts its reader, and subscribes again to every channel
    /// that still has listeners (after a lost connection).
    ///
    /// A boxed future, not an `async fn`: its reader calls [`Self::reconnect`], which calls
    /// this, a cycle the compiler cannot prove `Send` through opaque types.
    fn connect(self: &Arc<Self>) -> BoxFuture<'_, Result<Subscriber>> {
        Box::pin(async move {
            let client = match &self.source {
                Source::Server(client) => client.as_ref().clone(),
                Source::Sentinel(following) => following
                    .master_client()
                    .await
                    .map_err(backend_error("find the master for pub/sub"))?,
                Source::Cluster { connection, pushes } => {
                    return self.connect_cluster(connection, pushes);
                }
            };
            let pubsub = match client.get_async_pubsub().await {
                Ok(pubsub) => pubsub,
                Err(error) => {
                    if let Source::Sentinel(following) = &self.source {
                        // Most likely the master is gone: ask the sentinels next time.
                        following.forget_current();
                    }
                    return Err(backend_error("open the pub/sub connection")(error));
                }
            };
            let (mut sink, mut stream) = pubsub.split();
            let alive = Arc::new(AtomicBool::new(true));
            let (channels, reader_alive) = (self.channels.clone(), alive.clone());
            let hub = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(message) = stream.next().await {
                    let who: Arc<str> = message
                        .get_payload::<String>()
                        .map_or_else(|_| "*".into(), Into::into);
                    announce(&channels, message.get_channel_name(), who);
                }
                reader_alive.store(false, Ordering::Release);
                tracing::warn!("redis pub/sub connection closed");
                // Until a new connection listens, waiters fall back to their timeouts (the
                // holder's remaining lease): open one now rather than at the next subscription.
                Self::reconnect(hub).await;
            });
            let listened = self.listened();
            if !listened.is_empty() {
                sink.subscribe(&listened)
                    .await
                    .map_err(backend_error("subscribe"))?;
                // Channels listened to already: releases announced while no connection
                // listened were missed, so every waiter looks again now instead of at its
                // holder's lease end (a fair lock still serves them in queue order).
                for channel in &listened {
                    announce(&self.channels, channel, Arc::from("*"));
                }
            }
            Ok(Subscriber {
                sink: Sink::PubSub(sink),
                alive,
            })
        })
    }

    /// After the pub/sub connection closed: opens a new one (on the current master, for a
    /// Sentinel group) as long as somebody listens, retrying with a growing pause.
    async fn reconnect(hub: Weak<Self>) {
        let mut pause = RECONNECT_FIRST;
        loop {
            tokio::time::sleep(pause).await;
            let Some(hub) = hub.upgrade() else { return };
            let mut slot = hub.subscriber.lock().await;
            if slot
                .as_ref()
                .is_some_and(|s| s.alive.load(Ordering::Acquire))
                || hub.listened().is_empty()
            {
                // Somebody reconnected already, or nobody needs the connection.
                return;
            }
            match hub.connect().await {
                Ok(subscriber) => {
                    *slot = Some(subscriber);
                    tracing::info!("redis pub/sub connection opened again");
                    return;
                }
                Err(error) => {
                    *slot = None;
                    tracing::warn!(%error, "redis pub/sub connection cannot be opened yet");
                    pause = (pause * 2).min(RECONNECT_MAX);
                }
            }
        }
    }

    /// Starts the reader of a Cluster connection's pushes. The connection itself reconnects
    /// and subscribes again, so this subscriber stays alive as long as the client.
    fn connect_cluster(
        &self,
        connection: &ClusterConnection,
        pushes: &StdMutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
    ) -> Result<Subscriber> {
        let receiver = pushes.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut receiver) = receiver {
            let channels = self.channels.clone();
            tokio::spawn(async move {
                while let Some(push) = receiver.recv().await {
                    if let Some((channel, who)) = sharded_message(&push) {
                        announce(&channels, &channel, who);
                    }
                }
            });
        }
        Ok(Subscriber {
            sink: Sink::Cluster(connection.clone()),
            alive: Arc::new(AtomicBool::new(true)),
        })
    }

    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> Result<watch::Receiver<Arc<str>>> {
        let mut slot = self.subscriber.lock().await;
        let (receiver, first) = {
            let mut channels = lock_channels(&self.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| (watch::channel(Arc::from("*")).0, 0));
            entry.1 += 1;
            (entry.0.subscribe(), entry.1 == 1)
        };
        let needs_connection = slot
            .as_ref()
            .is_none_or(|s| !s.alive.load(Ordering::Acquire));
        let result = if needs_connection {
            // A new pub/sub connection subscribes to every listened channel, this one
            // included; a Cluster subscriber subscribes below.
            match self.connect().await {
                Ok(subscriber) => {
                    let cluster = matches!(subscriber.sink, Sink::Cluster(_));
                    let subscriber = slot.insert(subscriber);
                    if cluster && first {
                        subscriber.subscribe(channel).await
                    } else {
                        Ok(())
                    }
                }
                Err(error) => Err(error),
            }
        } else if let (true, Some(subscriber)) = (first, slot.as_mut()) {
            subscriber.subscribe(channel).await
        } else {
            Ok(())
        };
        if let Err(error) = result {
            *slot = None;
            self.leave(channel);
            return Err(error);
        }
        Ok(receiver)
    }

    /// One listener fewer; returns true when nobody listens on `channel` any more.
    pub(super) fn leave(&self, channel: &str) -> bool {
        let mut channels = lock_channels(&self.channels);
        match channels.get_mut(channel) {
            Some((_, listeners)) => {
                *listeners = listeners.saturating_sub(1);
                *listeners == 0
            }
            None => false,
        }
    }

    /// Unsubscribes from `channel` if still nobody listens (checked under the subscriber's
    /// lock, so a subscription made meanwhile wins).
    pub(super) async fn unsubscribe_if_idle(&self, channel: String) {
        let mut slot = self.subscriber.lock().await;
        let idle = {
            let mut channels = lock_channels(&self.channels);
            let idle = channels.get(&channel).is_some_and(|(_, n)| *n == 0);
            if idle {
                channels.remove(&channel);
            }
            idle
        };
        if idle
            && let Some(subscriber) = slot.as_mut()
            && subscriber.unsubscribe(&channel).await.is_err()
        {
            *slot = None;
        }
    }
}

impl Subscriber {
    async fn subscribe(&mut self, channel: &str) -> Result<()> {
        match &mut self.sink {
            Sink::PubSub(sink) => sink.subscribe(channel).await,
            Sink::Cluster(connection) => connection.ssubscribe(channel).await,
        }
        .map_err(backend_error("subscribe"))
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<()> {
        match &mut self.sink {
            Sink::PubSub(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(connection) => connection.sunsubscribe(channel).await,
        }
        .map_err(backend_error("unsubscribe"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_messages_are_read() {
        let push = PushInfo {
            kind: PushKind::SMessage,
            data: vec![
                Value::BulkString(b"distlock:{a}:released".to_vec()),
                Value::BulkString(b"owner-1".to_vec()),
            ],
        };
        assert_eq!(
            sharded_message(&push),
            Some(("distlock:{a}:released".to_owned(), Arc::from("owner-1")))
        );
        let other = PushInfo {
            kind: PushKind::SSubscribe,
            data: vec![Value::BulkString(b"x".to_vec()), Value::Int(1)],
        };
        assert_eq!(sharded_message(&other), None);
    }
}
