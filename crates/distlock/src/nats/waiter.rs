//! Waiting for a lock of the NATS backend: a plain subscription to the lock's key subject,
//! on which the server delivers every write of the key (a release's delete among them).

use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;

use crate::backend::{ReleaseWaiter, Woken};

/// Listens to one lock's key; dropping it unsubscribes.
pub(crate) struct NatsWaiter {
    subscriber: async_nats::Subscriber,
    /// The subscription ended (the client closed): waits only time out.
    ended: bool,
}

impl NatsWaiter {
    pub(crate) fn new(subscriber: async_nats::Subscriber) -> Self {
        NatsWaiter {
            subscriber,
            ended: false,
        }
    }
}

#[async_trait]
impl ReleaseWaiter for NatsWaiter {
    /// Returns at the next write of the key (spuriously for a renewal or a reentry), or when
    /// `max` has passed: a lease that runs out writes nothing, so the caller bounds `max` by
    /// the holder's lease.
    async fn wait(&mut self, max: Duration) -> Woken {
        if self.ended {
            tokio::time::sleep(max).await;
            return Woken::Retry;
        }
        if let Ok(None) = tokio::time::timeout(max, self.subscriber.next()).await {
            self.ended = true;
        }
        Woken::Retry
    }
}
