//! The Redis reentrant lock (MISSION §1, the Redisson design).
//!
//! Each lock is a hash `distlock:{<name>}:lock` mapping the owner to its hold count, plus a
//! field `:token` with the grant's fencing token, and a PEXPIRE equal to the lease. The
//! counter `distlock:{<name>}:fence` (never deleted) gives the tokens; releases are announced
//! on the channel `distlock:{<name>}:released`. `<name>` is the escaped lock name
//! ([`LockName::escaped`]), which has no `{` or `}`, so the braces are a Cluster hash tag and
//! all keys of one lock share a slot.
//!
//! Acquire, release, extend, renew and force-unlock are each one Lua script, sent with
//! EVALSHA and loaded again when the server answers NOSCRIPT (the `redis` crate's `Script`).
//! Commands share one multiplexed, reconnecting connection; waiters share one pub/sub
//! connection per client, opened on first use.
//!
//! The spin lock (MISSION §2, `redis+spin://`) takes and releases locks with the same scripts
//! (the acquire script is `SET key owner NX PX lease` extended with re-entry and a fencing
//! token; release deletes only the owner's lock) but waits differently: it never subscribes,
//! it asks again after a sleep that grows from 1 ms to 32 ms, with jitter. Every waiter polls
//! the server, and a handoff waits for the next poll: that is the contrast it exists for.
//!
//! Fair mode (the default for `redis://`) queues waiters first come, first served: a waiter
//! joins a sorted set `distlock:{<name>}:queue` and marks itself seen every 250 ms in
//! `distlock:{<name>}:seen`; a free lock goes only to the first waiter seen within the last
//! second, and a release names that waiter in its announcement, so only it asks. `?fair=false`
//! gives the Redisson race: every waiter is woken and the first to ask wins.
//!
//! URL: `redis://[user:password@]host[:port][/db][?fair=false]` or `redis+spin://...`.
//! Standalone servers only in this release; Sentinel and Cluster are planned.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use tokio::sync::watch;

use crate::backend::{Acquired, Backend, Extended, Owner, ReleaseWaiter, Released};
use crate::error::{Error, Result};
use crate::name::LockName;

const SCHEME: &str = "redis";

/// KEYS: lock, fence. ARGV: owner, lease ms.
/// Returns {1, token, holds} when granted, {0, pttl} when held by another owner.
const ACQUIRE: &str = r"
local lock, fence = KEYS[1], KEYS[2]
local owner, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('exists', lock) == 0 then return grant(lock, fence, owner, lease) end
if redis.call('hexists', lock, owner) == 1 then return reenter(lock, owner, lease) end
return {0, redis.call('pttl', lock)}
";

/// Lua: the two ways an acquire succeeds, shared by the acquire scripts. `grant` makes a new
/// grant with the next fencing token; `reenter` adds a hold to the owner's grant and never
/// shortens its lease.
const GRANTING: &str = r"
local function grant(lock, fence, owner, lease)
  local token = redis.call('incr', fence)
  redis.call('hset', lock, owner, 1, ':token', token)
  redis.call('pexpire', lock, lease)
  return {1, token, 1}
end
local function reenter(lock, owner, lease)
  local holds = redis.call('hincrby', lock, owner, 1)
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  return {1, tonumber(redis.call('hget', lock, ':token')), holds}
end
";

/// Lua: the first waiter of a fair queue whose ticket is fresh, removing stale ones; nil when
/// none. Prefixed to the scripts that need it.
const LIVE_HEAD: &str = r"
local function live_head(queue, seen, stale)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local head = redis.call('zrange', queue, 0, 0)[1]
    if not head then return nil end
    local last = tonumber(redis.call('hget', seen, head) or '0')
    if last + stale > now then return head end
    redis.call('zrem', queue, head)
    redis.call('hdel', seen, head)
  end
end
";

/// KEYS: lock, channel, queue, seen. ARGV: owner, stale ms.
/// Returns the holds left (0: freed and announced), -1 when free, -2 when held by another.
/// The announcement names the first queued waiter (fair mode) or is `*` (anyone).
const RELEASE: &str = r"
local lock, channel, owner = KEYS[1], KEYS[2], ARGV[1]
if redis.call('hexists', lock, owner) == 0 then
  if redis.call('exists', lock) == 1 then return -2 end
  return -1
end
local holds = redis.call('hincrby', lock, owner, -1)
if holds > 0 then return holds end
redis.call('del', lock)
redis.call('publish', channel, live_head(KEYS[3], KEYS[4], tonumber(ARGV[2])) or '*')
return 0
";

/// KEYS: lock, fence, queue, seen. ARGV: owner, lease ms, stale ms.
/// As ACQUIRE, but a free lock goes only to the first live waiter of the queue (or anyone
/// when nobody waits): returns {0, -3} when it is reserved for another.
const ACQUIRE_FAIR: &str = r"
local lock, fence, queue, seen = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('exists', lock) == 1 then
  if redis.call('hexists', lock, owner) == 1 then return reenter(lock, owner, lease) end
  return {0, redis.call('pttl', lock)}
end
local head = live_head(queue, seen, tonumber(ARGV[3]))
if head and head ~= owner then return {0, -3} end
redis.call('zrem', queue, owner)
redis.call('hdel', seen, owner)
return grant(lock, fence, owner, lease)
";

/// KEYS: queue, seen, ticket. ARGV: owner. Queues the owner at the back unless it is queued,
/// and marks it seen now. Also the refresh.
const ENQUEUE: &str = r"
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not redis.call('zscore', KEYS[1], ARGV[1]) then
  redis.call('zadd', KEYS[1], redis.call('incr', KEYS[3]), ARGV[1])
end
redis.call('hset', KEYS[2], ARGV[1], now)
return 1
";

/// KEYS: lock, channel, queue, seen. ARGV: owner, stale ms. Leaves the queue; if the lock is
/// free, names the next waiter.
const LEAVE: &str = r"
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[4], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
  local head = live_head(KEYS[3], KEYS[4], tonumber(ARGV[2]))
  if head then redis.call('publish', KEYS[2], head) end
end
return 1
";

/// KEYS: lock. ARGV: owner, lease ms. Returns 1 when extended, -1 when free, -2 when held by
/// another.
const EXTEND: &str = r"
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
if redis.call('exists', KEYS[1]) == 1 then return -2 end
return -1
";

/// KEYS: the locks. ARGV: lease ms, then one owner per key. Returns 1 or 0 per key.
const RENEW: &str = r"
local renewed = {}
for i, lock in ipairs(KEYS) do
  if redis.call('hexists', lock, ARGV[i + 1]) == 1 then
    redis.call('pexpire', lock, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
";

/// KEYS: lock, channel, queue, seen. ARGV: stale ms. Returns 1 when the lock was held.
const FORCE_UNLOCK: &str = r"
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], live_head(KEYS[3], KEYS[4], tonumber(ARGV[1])) or '*')
  return 1
end
return 0
";

/// A queued waiter not seen for this long is skipped (fair mode).
const TICKET_STALE: Duration = Duration::from_secs(1);
/// How often a queued waiter marks itself seen, and asks again (fair mode).
const TICKET_REFRESH: Duration = Duration::from_millis(250);

/// The keys of one lock.
struct Keys {
    lock: String,
    fence: String,
    channel: String,
    queue: String,
    seen: String,
    ticket: String,
}

impl Keys {
    fn of(name: &LockName) -> Self {
        let tag = name.escaped();
        Keys {
            lock: format!("distlock:{{{tag}}}:lock"),
            fence: format!("distlock:{{{tag}}}:fence"),
            channel: format!("distlock:{{{tag}}}:released"),
            queue: format!("distlock:{{{tag}}}:queue"),
            seen: format!("distlock:{{{tag}}}:seen"),
            ticket: format!("distlock:{{{tag}}}:ticket"),
        }
    }
}

struct Scripts {
    acquire: Script,
    acquire_fair: Script,
    release: Script,
    extend: Script,
    renew: Script,
    force_unlock: Script,
    enqueue: Script,
    leave: Script,
}

/// The reentrant lock on a standalone Redis server.
#[derive(Clone)]
pub struct RedisBackend {
    connection: ConnectionManager,
    scripts: Arc<Scripts>,
    releases: Arc<ReleaseHub>,
    /// Wait by polling instead of pub/sub.
    spin: bool,
    /// Serve waiters first come, first served, waking only the first (the default).
    fair: bool,
}

const SPIN_FIRST: Duration = Duration::from_millis(1);
const SPIN_MAX: Duration = Duration::from_millis(32);

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

fn backend_error(operation: &'static str) -> impl FnOnce(redis::RedisError) -> Error {
    move |error| Error::backend(SCHEME, operation, error)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl RedisBackend {
    /// Connects to the server a `redis://` or `redis+spin://` URL names.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a URL the `redis` crate cannot parse; [`Error::Backend`]
    /// when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let (url, spin) = match url.strip_prefix("redis+spin://") {
            Some(rest) => (format!("redis://{rest}"), true),
            None => (url.to_owned(), false),
        };
        let (url, fair) = take_fair_option(&url)?;
        if fair == Some(true) && spin {
            return Err(Error::invalid(
                "URL",
                "fair=true needs pub/sub wake-ups; use it with redis://, not redis+spin://",
            ));
        }
        // Fair by default; the spin lock cannot be fair (nobody is told whose turn it is).
        let fair = fair.unwrap_or(!spin);
        let client = redis::Client::open(url.as_str()).map_err(|e| {
            Error::invalid(
                "URL",
                format!("{e}; write redis://[user:password@]host[:port][/db]"),
            )
        })?;
        // Fail fast on a server that is not there; reconnects later retry with backoff.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2);
        let connection = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(backend_error("connect"))?;
        Ok(RedisBackend {
            connection,
            scripts: Arc::new(Scripts {
                acquire: Script::new(&format!("{GRANTING}{ACQUIRE}")),
                acquire_fair: Script::new(&format!("{GRANTING}{LIVE_HEAD}{ACQUIRE_FAIR}")),
                release: Script::new(&format!("{LIVE_HEAD}{RELEASE}")),
                extend: Script::new(EXTEND),
                renew: Script::new(RENEW),
                force_unlock: Script::new(&format!("{LIVE_HEAD}{FORCE_UNLOCK}")),
                enqueue: Script::new(ENQUEUE),
                leave: Script::new(&format!("{LIVE_HEAD}{LEAVE}")),
            }),
            releases: Arc::new(ReleaseHub {
                client,
                subscriber: tokio::sync::Mutex::new(None),
                channels: Arc::new(StdMutex::new(HashMap::new())),
            }),
            spin,
            fair,
        })
    }
}

/// Removes distlock's own `fair=true|false` from a Redis URL's query.
fn take_fair_option(url: &str) -> Result<(String, Option<bool>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut fair = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("fair", "true" | "1")) => fair = Some(true),
            Some(("fair", "false" | "0")) => fair = Some(false),
            Some(("fair", other)) => {
                return Err(Error::invalid(
                    "URL",
                    format!("fair={other:?} must be true or false"),
                ));
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, fair))
}

#[async_trait]
impl Backend for RedisBackend {
    fn scheme(&self) -> &'static str {
        if self.spin { "redis+spin" } else { SCHEME }
    }

    async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("ping"))?;
        Ok(())
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let keys = Keys::of(name);
        let reply: Vec<i64> = if self.fair {
            self.scripts
                .acquire_fair
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.queue)
                .key(&keys.seen)
                .arg(owner.as_str())
                .arg(millis(lease))
                .arg(millis(TICKET_STALE))
                .invoke_async(&mut self.connection.clone())
                .await
        } else {
            self.scripts
                .acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(millis(lease))
                .invoke_async(&mut self.connection.clone())
                .await
        }
        .map_err(backend_error("acquire"))?;
        match reply.as_slice() {
            // Free, but reserved for the first queued waiter.
            [0, -3] => Ok(Acquired::Held { ttl: None }),
            [1, token, holds] => Ok(Acquired::Granted {
                fencing_token: u64::try_from(*token).unwrap_or(0),
                holds: u32::try_from(*holds).unwrap_or(u32::MAX),
            }),
            [0, pttl] => Ok(Acquired::Held {
                // -1 (no expiry) cannot happen for our keys; -2 means it just expired.
                ttl: Some(Duration::from_millis(u64::try_from(*pttl).unwrap_or(0))),
            }),
            other => Err(Error::backend(
                SCHEME,
                "acquire",
                format!("unexpected reply from the acquire script: {other:?}"),
            )),
        }
    }

    async fn subscribe(&self, name: &LockName, owner: &Owner) -> Result<Box<dyn ReleaseWaiter>> {
        if self.spin {
            return Ok(Box::new(SpinWaiter { sleep: SPIN_FIRST }));
        }
        let keys = Keys::of(name);
        // Listen first, then queue: an announcement naming us cannot come before we listen.
        let receiver = self.releases.subscribe(&keys.channel).await?;
        let mut waiter = RedisWaiter {
            hub: self.releases.clone(),
            channel: keys.channel.clone(),
            receiver,
            queued: None,
        };
        if self.fair {
            let queued = Queued {
                backend: self.clone(),
                keys,
                owner: owner.as_str().to_owned(),
                refreshed: tokio::time::Instant::now(),
            };
            queued.enqueue().await?;
            waiter.queued = Some(queued);
        }
        Ok(Box::new(waiter))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let keys = Keys::of(name);
        let reply: i64 = self
            .scripts
            .release
            .key(&keys.lock)
            .key(&keys.channel)
            .key(&keys.queue)
            .key(&keys.seen)
            .arg(owner.as_str())
            .arg(millis(TICKET_STALE))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("release"))?;
        Ok(match reply {
            -1 => Released::NotHeld,
            -2 => Released::HeldByOther,
            holds => Released::Released {
                remaining_holds: u32::try_from(holds).unwrap_or(0),
            },
        })
    }

    async fn extend(&self, name: &LockName, owner: &Owner, lease: Duration) -> Result<Extended> {
        let keys = Keys::of(name);
        let reply: i64 = self
            .scripts
            .extend
            .key(&keys.lock)
            .arg(owner.as_str())
            .arg(millis(lease))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("extend"))?;
        Ok(match reply {
            1 => Extended::Extended,
            -2 => Extended::HeldByOther,
            _ => Extended::NotHeld,
        })
    }

    async fn renew(&self, locks: &[(LockName, Owner)], lease: Duration) -> Result<Vec<bool>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation.arg(millis(lease));
        for (name, owner) in locks {
            invocation.key(Keys::of(name).lock);
            invocation.arg(owner.as_str());
        }
        let renewed: Vec<i64> = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("renew"))?;
        Ok(renewed.into_iter().map(|r| r == 1).collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let exists: bool = redis::cmd("EXISTS")
            .arg(Keys::of(name).lock)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("query the lock"))?;
        Ok(exists)
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let holds: Option<i64> = redis::cmd("HGET")
            .arg(Keys::of(name).lock)
            .arg(owner.as_str())
            .query_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("query the lock"))?;
        Ok(holds.map_or(0, |h| u32::try_from(h).unwrap_or(0)))
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let keys = Keys::of(name);
        let freed: i64 = self
            .scripts
            .force_unlock
            .key(&keys.lock)
            .key(&keys.channel)
            .key(&keys.queue)
            .key(&keys.seen)
            .arg(millis(TICKET_STALE))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("force unlock"))?;
        Ok(freed == 1)
    }
}

/// One pub/sub connection per client, shared by all its waiters: a channel is subscribed while
/// at least one waiter listens on it, and each message bumps that channel's watch.
struct ReleaseHub {
    client: redis::Client,
    /// The subscriber; `None` until first use. Held across (un)subscribe requests, so that they
    /// reach the server in the order they were decided.
    subscriber: tokio::sync::Mutex<Option<Subscriber>>,
    /// Channel → (signal, listeners).
    channels: Channels,
}

struct Subscriber {
    sink: PubSubSink,
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

impl ReleaseHub {
    /// Opens the pub/sub connection, starts its reader, and subscribes again to every channel
    /// that still has listeners (after a lost connection).
    async fn connect(&self) -> Result<Subscriber> {
        let (mut sink, mut stream) = self
            .client
            .get_async_pubsub()
            .await
            .map_err(backend_error("open the pub/sub connection"))?
            .split();
        let alive = Arc::new(AtomicBool::new(true));
        let (channels, reader_alive) = (self.channels.clone(), alive.clone());
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let who: Arc<str> = message
                    .get_payload::<String>()
                    .map_or_else(|_| "*".into(), Into::into);
                if let Some((signal, _)) = lock_channels(&channels).get(message.get_channel_name())
                {
                    signal.send_replace(who);
                }
            }
            // Waiters fall back to their timeouts (the holder's remaining lease) until the
            // next subscription reconnects.
            reader_alive.store(false, Ordering::Release);
            tracing::warn!("redis pub/sub connection closed");
        });
        let listened: Vec<String> = {
            let mut channels = lock_channels(&self.channels);
            channels.retain(|_, (_, listeners)| *listeners > 0);
            channels.keys().cloned().collect()
        };
        if !listened.is_empty() {
            sink.subscribe(&listened)
                .await
                .map_err(backend_error("subscribe"))?;
        }
        Ok(Subscriber { sink, alive })
    }

    async fn subscribe(&self, channel: &str) -> Result<watch::Receiver<Arc<str>>> {
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
            // A new connection subscribes to every listened channel, this one included.
            self.connect()
                .await
                .map(|subscriber| *slot = Some(subscriber))
        } else if let (true, Some(subscriber)) = (first, slot.as_mut()) {
            subscriber
                .sink
                .subscribe(channel)
                .await
                .map_err(backend_error("subscribe"))
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
    fn leave(&self, channel: &str) -> bool {
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
    async fn unsubscribe_if_idle(&self, channel: String) {
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
            && subscriber.sink.unsubscribe(&channel).await.is_err()
        {
            *slot = None;
        }
    }
}

/// The spin lock's waiting: sleep, then let the caller ask again.
struct SpinWaiter {
    sleep: Duration,
}

#[async_trait]
impl ReleaseWaiter for SpinWaiter {
    async fn wait(&mut self, max: Duration) {
        // Jitter keeps waiters that started together from asking together.
        let nap = self.sleep.mul_f64(0.5 + fastrand::f64());
        self.sleep = (self.sleep * 2).min(SPIN_MAX);
        tokio::time::sleep(nap.min(max)).await;
    }
}

struct RedisWaiter {
    hub: Arc<ReleaseHub>,
    channel: String,
    receiver: watch::Receiver<Arc<str>>,
    /// In fair mode: our place in the lock's queue.
    queued: Option<Queued>,
}

/// A waiter's place in a fair lock's queue.
struct Queued {
    backend: RedisBackend,
    keys: Keys,
    owner: String,
    refreshed: tokio::time::Instant,
}

impl Queued {
    /// Joins the queue, or marks us seen if we are in it.
    async fn enqueue(&self) -> Result<()> {
        let _: i64 = self
            .backend
            .scripts
            .enqueue
            .key(&self.keys.queue)
            .key(&self.keys.seen)
            .key(&self.keys.ticket)
            .arg(&self.owner)
            .invoke_async(&mut self.backend.connection.clone())
            .await
            .map_err(backend_error("queue a waiter"))?;
        Ok(())
    }
}

#[async_trait]
impl ReleaseWaiter for RedisWaiter {
    async fn wait(&mut self, max: Duration) {
        let now = tokio::time::Instant::now();
        let mut until = now + max;
        if let Some(queued) = self.queued.as_mut() {
            if now.duration_since(queued.refreshed) >= TICKET_REFRESH {
                // An error leaves the ticket to go stale; the next refresh queues us again.
                let _ = queued.enqueue().await;
                queued.refreshed = tokio::time::Instant::now();
            }
            // Return at the next refresh so that the caller asks again: a first waiter that
            // died is only skipped by an acquire after its ticket went stale.
            until = until.min(queued.refreshed + TICKET_REFRESH);
        }
        loop {
            match tokio::time::timeout_at(until, self.receiver.changed()).await {
                Ok(Ok(())) => {
                    let who = self.receiver.borrow_and_update().clone();
                    match &self.queued {
                        // Fair: only the named waiter goes; the others keep waiting.
                        Some(queued) if &*who != "*" && *who != *queued.owner => {}
                        _ => return,
                    }
                }
                // The hub dropped the channel; wait out the time instead.
                Ok(Err(_)) => {
                    tokio::time::sleep_until(until).await;
                    return;
                }
                Err(_) => return,
            }
        }
    }
}

impl Drop for RedisWaiter {
    fn drop(&mut self) {
        if let Some(queued) = self.queued.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Leave the queue (and name the next waiter if the lock is free). Best effort: a
            // ticket left behind goes stale in a second.
            drop(runtime.spawn(async move {
                let _: redis::RedisResult<i64> = queued
                    .backend
                    .scripts
                    .leave
                    .key(&queued.keys.lock)
                    .key(&queued.keys.channel)
                    .key(&queued.keys.queue)
                    .key(&queued.keys.seen)
                    .arg(&queued.owner)
                    .arg(millis(TICKET_STALE))
                    .invoke_async(&mut queued.backend.connection.clone())
                    .await;
            }));
        }
        if self.hub.leave(&self.channel)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (hub, channel) = (self.hub.clone(), std::mem::take(&mut self.channel));
            drop(runtime.spawn(async move { hub.unsubscribe_if_idle(channel).await }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_option_is_taken_out_of_the_url() {
        let cases = [
            ("redis://h:1/", "redis://h:1/", None),
            ("redis://h:1/?fair=true", "redis://h:1/", Some(true)),
            ("redis://h:1/?fair=0", "redis://h:1/", Some(false)),
            (
                "redis://h:1/2?protocol=resp3&fair=false",
                "redis://h:1/2?protocol=resp3",
                Some(false),
            ),
            (
                "redis://h:1/?a=b&fair=1&c=d",
                "redis://h:1/?a=b&c=d",
                Some(true),
            ),
        ];
        for (url, rest, fair) in cases {
            assert_eq!(
                take_fair_option(url).unwrap(),
                (rest.to_owned(), fair),
                "{url}"
            );
        }
        assert!(
            take_fair_option("redis://h/?fair=maybe")
                .unwrap_err()
                .is_invalid_input()
        );
    }

    #[test]
    fn keys_of_one_lock_share_a_hash_tag() {
        let keys = Keys::of(&LockName::new("orders/{42}:x").unwrap());
        let tag = "{orders%2F%7B42%7D%3Ax}";
        for key in [
            &keys.lock,
            &keys.fence,
            &keys.channel,
            &keys.queue,
            &keys.seen,
            &keys.ticket,
        ] {
            assert!(key.starts_with(&format!("distlock:{tag}:")), "{key}");
        }
    }

    #[tokio::test]
    async fn fair_spin_and_bad_urls_are_refused() {
        let err = RedisBackend::connect("redis+spin://127.0.0.1:1/?fair=true")
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let err = RedisBackend::connect("redis://[::1").await.unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }
}
