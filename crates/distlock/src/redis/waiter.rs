//! Waiters of the Redis locks: the spin lock's backoff, and the pub/sub waiter with its
//! queue ticket (fair mode) and handovers.

use super::*;

/// The spin lock's waiting: sleep, then let the caller ask again.
pub(super) struct SpinWaiter {
    pub(super) sleep: Duration,
    /// A waiting writer of a reader-writer lock: its mark, taken away when it goes.
    pub(super) writer_mark: Option<WriterMark>,
}

#[async_trait]
impl ReleaseWaiter for SpinWaiter {
    async fn leave(&mut self) {
        if let Some(mark) = self.writer_mark.as_mut() {
            mark.remove().await;
        }
    }

    async fn wait(&mut self, max: Duration) -> Woken {
        // Jitter keeps waiters that started together from asking together.
        let nap = self.sleep.mul_f64(0.5 + fastrand::f64());
        self.sleep = (self.sleep * 2).min(SPIN_MAX);
        tokio::time::sleep(nap.min(max)).await;
        Woken::Retry
    }
}

pub(super) struct RedisWaiter {
    pub(super) hub: Arc<ReleaseHub>,
    pub(super) channel: String,
    pub(super) receiver: watch::Receiver<Arc<str>>,
    /// In fair mode: the waiter's own channel (`<lock channel>><waiter id>`) and what arrives
    /// on it. A release names or hands the lock to the first waiter there, so that it wakes
    /// one process, not every process with a waiter.
    pub(super) own: Option<(String, watch::Receiver<Arc<str>>)>,
    /// In fair mode: our place in the lock's queue; `None` once we took a lock handed to us.
    pub(super) queued: Option<Queued>,
    /// A handover learnt of while queueing, returned by the next wait.
    pub(super) handed: Option<Woken>,
    /// A waiting writer of a reader-writer lock: its mark, taken away when it goes.
    pub(super) writer_mark: Option<WriterMark>,
}

/// A waiting writer's mark in `distlock:{E}:writers`, which turns later readers away; taken
/// away when the waiter leaves or is dropped.
pub(super) struct WriterMark {
    pub(super) backend: RedisBackend,
    pub(super) writers: String,
    pub(super) owner: String,
    /// Taken away (or never made): nothing to do on drop.
    pub(super) removed: bool,
}

impl WriterMark {
    /// Takes the mark away. Best effort: a mark left behind ends by itself.
    pub(super) async fn remove(&mut self) {
        self.removed = remove_mark(&self.backend, &self.writers, &self.owner).await;
    }
}

/// Takes `owner`'s mark out of `writers`: true when the server answered.
async fn remove_mark(backend: &RedisBackend, writers: &str, owner: &str) -> bool {
    let removed: redis::RedisResult<i64> = redis::cmd("ZREM")
        .arg(writers)
        .arg(owner)
        .query_async(&mut backend.connection.clone())
        .await;
    removed.is_ok()
}

impl Drop for WriterMark {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            let (writers, owner) = (
                std::mem::take(&mut self.writers),
                std::mem::take(&mut self.owner),
            );
            crate::cleanup::spawn_on(&runtime, async move {
                remove_mark(&backend, &writers, &owner).await;
            });
        }
    }
}

/// A waiter's place in a fair lock's queue.
pub(super) struct Queued {
    pub(super) backend: RedisBackend,
    pub(super) keys: Keys,
    /// `<owner>#<random>`: this waiter, distinct from the owner's other waiters.
    pub(super) id: String,
    /// The lease a handover grants; 0 for "name me, I will ask".
    pub(super) lease_ms: u64,
    /// When each recent refresh was sent, by number.
    pub(super) refreshes: VecDeque<(u64, tokio::time::Instant)>,
    pub(super) next_refresh: u64,
    pub(super) refreshed: tokio::time::Instant,
}

/// How many refresh send times a waiter remembers. The server hands over only to a waiter
/// seen within `TICKET_STALE`, four refresh intervals, so the refresh it names is recent.
pub(super) const REFRESHES_KEPT: usize = 16;

impl Queued {
    /// Leaves the queue; gives back a lock handed to us that we did not take, and passes a
    /// free lock on. Running it again changes nothing.
    pub(super) async fn leave(&self) -> redis::RedisResult<i64> {
        self.keys
            .passing_on(&self.backend.scripts.leave)
            .arg(&self.id)
            .arg(millis(TICKET_STALE))
            .invoke_async(&mut self.backend.connection.clone())
            .await
    }

    /// Joins the queue, or marks us seen if we are in it; takes the lock if it was handed to
    /// us and the announcement was missed.
    pub(super) async fn enqueue(&mut self) -> Result<Option<Woken>> {
        let number = self.next_refresh;
        self.next_refresh += 1;
        if self.refreshes.len() == REFRESHES_KEPT {
            self.refreshes.pop_front();
        }
        self.refreshes
            .push_back((number, tokio::time::Instant::now()));
        let reply: Vec<i64> = self
            .backend
            .scripts
            .enqueue
            .key(&self.keys.queue)
            .key(&self.keys.seen)
            .key(&self.keys.ticket)
            .key(&self.keys.terms)
            .key(&self.keys.lock)
            .arg(&self.id)
            .arg(self.lease_ms)
            .arg(number)
            .invoke_async(&mut self.backend.connection.clone())
            .await
            .map_err(backend_error("queue a waiter"))?;
        self.refreshed = tokio::time::Instant::now();
        Ok(match reply.as_slice() {
            [1, token, number] => Some(self.handed(*token, *number)),
            _ => None,
        })
    }

    /// The grant handed to us with `token`, made after the server saw refresh `number`.
    pub(super) fn handed(&self, token: i64, number: i64) -> Woken {
        // The grant's lease started after the server saw that refresh, hence after we sent
        // it: a safe start for our local deadline. Unknown numbers fall back to the oldest.
        let since = self
            .refreshes
            .iter()
            .find(|(n, _)| i64::try_from(*n).is_ok_and(|n| n == number))
            .or(self.refreshes.front())
            .map_or(self.refreshed, |(_, sent)| *sent);
        Woken::Granted {
            fencing_token: u64::try_from(token).unwrap_or(0),
            since,
            lease: Duration::from_millis(self.lease_ms),
        }
    }
}

/// An announcement, read: `!<id> <token> <refresh>` (the lock was handed to waiter `id`),
/// `*` (anyone may try), or a waiter id (that waiter may try).
pub(super) enum Announced<'a> {
    Handed {
        id: &'a str,
        token: i64,
        number: i64,
    },
    Anyone,
    Named(&'a str),
}

pub(super) fn read_announcement(message: &str) -> Announced<'_> {
    if message == "*" {
        return Announced::Anyone;
    }
    if let Some(rest) = message.strip_prefix('!') {
        let mut parts = rest.split(' ');
        if let (Some(id), Some(token), Some(number), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
            && let (Ok(token), Ok(number)) = (token.parse(), number.parse())
        {
            return Announced::Handed { id, token, number };
        }
        // Not ours to read: anyone may look.
        return Announced::Anyone;
    }
    Announced::Named(message)
}

impl RedisWaiter {
    /// Before the caller asks as the owner (which would re-enter a lock handed to this
    /// waiter, leaving a second hold): refresh, which takes a lock handed to this waiter by
    /// its id, and answer that grant; otherwise `Retry`. Unqueued, just `Retry`.
    async fn claim_or_retry(&mut self) -> Woken {
        if let Some(queued) = self.queued.as_mut()
            && let Ok(Some(handed)) = queued.enqueue().await
        {
            self.queued = None;
            return handed;
        }
        Woken::Retry
    }
}

#[async_trait]
impl ReleaseWaiter for RedisWaiter {
    async fn leave(&mut self) {
        if let Some(mark) = self.writer_mark.as_mut() {
            mark.remove().await;
        }
        // Forgotten only once left: cancelled before, the drop leaves again.
        if let Some(queued) = self.queued.as_ref()
            && queued.leave().await.is_ok()
        {
            self.queued = None;
            self.handed = None;
        }
    }

    async fn wait(&mut self, max: Duration) -> Woken {
        if let Some(handed) = self.handed.take() {
            self.queued = None;
            return handed;
        }
        let now = tokio::time::Instant::now();
        let mut until = now + max;
        if let Some(queued) = self.queued.as_mut() {
            if now.duration_since(queued.refreshed) >= TICKET_REFRESH {
                // An error leaves the ticket to go stale; the next refresh queues us again.
                if let Ok(Some(handed)) = queued.enqueue().await {
                    self.queued = None;
                    return handed;
                }
            }
            // Return at the next refresh so that the caller asks again: a first waiter that
            // died is only skipped by an acquire after its ticket went stale.
            if let Some(queued) = &self.queued {
                until = until.min(queued.refreshed + TICKET_REFRESH);
            }
        }
        loop {
            let (own, receiver) = (&mut self.own, &mut self.receiver);
            let changed = async move {
                match own.as_mut() {
                    // The own channel first: a handover there beats a `*` read on the lock's.
                    Some((_, own)) => tokio::select! {
                        biased;
                        changed = own.changed() => changed.map(|()| own.borrow_and_update().clone()),
                        changed = receiver.changed() => {
                            changed.map(|()| receiver.borrow_and_update().clone())
                        }
                    },
                    None => receiver
                        .changed()
                        .await
                        .map(|()| receiver.borrow_and_update().clone()),
                }
            };
            match tokio::time::timeout_at(until, changed).await {
                Ok(Ok(message)) => {
                    let Some(queued) = &self.queued else {
                        // Not queued (the race): any announcement is a chance.
                        return Woken::Retry;
                    };
                    match read_announcement(&message) {
                        Announced::Handed { id, token, number } if id == queued.id => {
                            let handed = queued.handed(token, number);
                            self.queued = None;
                            return handed;
                        }
                        Announced::Anyone => return self.claim_or_retry().await,
                        Announced::Named(id) if id == queued.id => {
                            return self.claim_or_retry().await;
                        }
                        // Another waiter's turn.
                        Announced::Handed { .. } | Announced::Named(_) => {}
                    }
                }
                // The hub dropped the channel; wait out the time instead.
                Ok(Err(_)) => {
                    tokio::time::sleep_until(until).await;
                    return self.claim_or_retry().await;
                }
                Err(_) => return self.claim_or_retry().await,
            }
        }
    }
}

impl Drop for RedisWaiter {
    fn drop(&mut self) {
        if let Some(queued) = self.queued.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Leave the queue; give back a lock handed to us that we did not take (and pass a
            // free lock on). Best effort: a ticket left behind goes stale in a second, and a
            // lock handed to us frees when its lease ends.
            crate::cleanup::spawn_on(&runtime, async move {
                let _ = queued.leave().await;
            });
        }
        let own = self.own.take().map(|(channel, _)| channel);
        for channel in [Some(std::mem::take(&mut self.channel)), own]
            .into_iter()
            .flatten()
        {
            if self.hub.leave(&channel)
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                let hub = self.hub.clone();
                drop(runtime.spawn(async move { hub.unsubscribe_if_idle(channel).await }));
            }
        }
    }
}
