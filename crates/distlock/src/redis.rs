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
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use redis::cluster::ClusterClientBuilder;
use tokio::sync::watch;

use self::deployment::{Commands, Deployment, Following};
use self::hub::{ReleaseHub, Source};

use crate::backend::{Acquired, Backend, Extended, Owner, ReleaseWaiter, Released};
use crate::error::{Error, Result};
use crate::name::LockName;

mod deployment;
mod hub;

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
///
/// The token is the larger of the counter plus one and the server's clock in microseconds.
/// The counter alone would go back after a failover that lost the last grants, or after a
/// restart of a server that keeps nothing on disk; with the clock, tokens keep growing across
/// both, as long as the new master's clock is not behind the old one's by more than the time
/// the failover took. (Lua numbers are doubles: exact up to 2^53, about 285 years of
/// microseconds.)
const GRANTING: &str = r"
local function grant(lock, fence, owner, lease)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = redis.call('incr', fence)
  if token < now then
    token = now
    redis.call('set', fence, string.format('%.0f', now))
  end
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
    connection: Commands,
    scripts: Arc<Scripts>,
    releases: Arc<ReleaseHub>,
    /// Wait by polling instead of pub/sub.
    spin: bool,
    /// Serve waiters first come, first served, waking only the first (the default).
    fair: bool,
    /// The URL scheme, for errors and reports.
    scheme: &'static str,
    /// A Cluster: keys of different locks live in different slots.
    cluster: bool,
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
    /// Connects to the deployment a `redis://`, `redis+spin://`, `redis+sentinel://` or
    /// `redis+cluster://` URL names.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a URL that cannot be parsed; [`Error::Backend`] when the
    /// servers cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let target = deployment::parse(url)?;
        // Fair by default; the spin lock cannot be fair (nobody is told whose turn it is).
        let fair = target.options.fair.unwrap_or(!target.options.spin);
        let mut cluster = false;
        let (connection, source) = match target.deployment {
            Deployment::Standalone(url) => {
                let client = redis::Client::open(url.as_str()).map_err(|e| {
                    Error::invalid(
                        "URL",
                        format!("{e}; write redis://[user:password@]host[:port][/db]"),
                    )
                })?;
                let connection = deployment::standalone(&client)
                    .await
                    .map_err(backend_error("connect"))?;
                (connection, Source::Server(client))
            }
            Deployment::Sentinel {
                sentinels,
                service,
                db,
                username,
                password,
            } => {
                let following = Following::new(sentinels, &service, db, username, password)?;
                // Find the master now, so that a wrong address fails here.
                let mut connection = Commands::Sentinel(following.clone());
                let _: String = redis::cmd("PING")
                    .query_async(&mut connection)
                    .await
                    .map_err(backend_error("connect"))?;
                (connection, Source::Sentinel(following))
            }
            Deployment::Cluster {
                nodes,
                username,
                password,
            } => {
                cluster = true;
                let (pushes, receiver) = tokio::sync::mpsc::unbounded_channel();
                let mut builder = ClusterClientBuilder::new(nodes)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(pushes)
                    .connection_timeout(deployment::CONNECT_TIMEOUT)
                    .response_timeout(deployment::RESPONSE_TIMEOUT);
                if let Some(username) = username {
                    builder = builder.username(username);
                }
                if let Some(password) = password {
                    builder = builder.password(password);
                }
                let connection = builder
                    .build()
                    .map_err(|e| Error::invalid("URL", e.to_string()))?
                    .get_async_connection()
                    .await
                    .map_err(backend_error("connect"))?;
                let source = Source::Cluster {
                    connection: connection.clone(),
                    pushes: StdMutex::new(Some(receiver)),
                };
                (Commands::Cluster(connection), source)
            }
        };
        // A Cluster announces releases on the lock's shard only.
        let publish = if cluster { "spublish" } else { "publish" };
        let script =
            |text: String| Script::new(&text.replace("'publish'", &format!("'{publish}'")));
        Ok(RedisBackend {
            connection,
            scripts: Arc::new(Scripts {
                acquire: script(format!("{GRANTING}{ACQUIRE}")),
                acquire_fair: script(format!("{GRANTING}{LIVE_HEAD}{ACQUIRE_FAIR}")),
                release: script(format!("{LIVE_HEAD}{RELEASE}")),
                extend: script(EXTEND.to_owned()),
                renew: script(RENEW.to_owned()),
                force_unlock: script(format!("{LIVE_HEAD}{FORCE_UNLOCK}")),
                enqueue: script(ENQUEUE.to_owned()),
                leave: script(format!("{LIVE_HEAD}{LEAVE}")),
            }),
            releases: Arc::new(ReleaseHub::new(source)),
            scheme: if target.options.spin && target.scheme == "redis" {
                "redis+spin"
            } else {
                target.scheme
            },
            spin: target.options.spin,
            fair,
            cluster,
        })
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn scheme(&self) -> &'static str {
        self.scheme
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
        if self.cluster {
            return self.renew_by_slot(locks, lease).await;
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

impl RedisBackend {
    /// Renewal on a Cluster: a script may only touch keys of one slot, so the locks are
    /// grouped by slot, one script call per slot, all in flight at once (the cluster
    /// connection multiplexes them over one connection per node).
    async fn renew_by_slot(
        &self,
        locks: &[(LockName, Owner)],
        lease: Duration,
    ) -> Result<Vec<bool>> {
        let keys: Vec<String> = locks.iter().map(|(name, _)| Keys::of(name).lock).collect();
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            by_slot.entry(deployment::slot(key)).or_default().push(i);
        }
        let calls = by_slot.into_values().map(|group| {
            let mut invocation = self.scripts.renew.prepare_invoke();
            invocation.arg(millis(lease));
            for &i in &group {
                invocation.key(&keys[i]);
                invocation.arg(locks[i].1.as_str());
            }
            let mut connection = self.connection.clone();
            async move {
                let reply: Vec<i64> = invocation.invoke_async(&mut connection).await?;
                Ok::<_, redis::RedisError>((group, reply))
            }
        });
        let replies = futures_util::future::try_join_all(calls)
            .await
            .map_err(backend_error("renew"))?;
        let mut renewed = vec![false; locks.len()];
        for (group, reply) in replies {
            for (i, r) in group.into_iter().zip(reply) {
                renewed[i] = r == 1;
            }
        }
        Ok(renewed)
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
