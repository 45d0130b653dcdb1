//! The Redis reentrant lock (the Redisson design).
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
//! The spin lock (the SETNX design, `redis+spin://`) takes and releases locks with the same scripts
//! (the acquire script is `SET key owner NX PX lease` extended with re-entry and a fencing
//! token; release deletes only the owner's lock) but waits differently: it never subscribes,
//! it asks again after a sleep that grows from 1 ms to 32 ms, with jitter. Every waiter polls
//! the server, and a handoff waits for the next poll: that is the contrast it exists for.
//!
//! Fair mode (the default) queues waiters first come, first served: a waiter joins a sorted
//! set `distlock:{<name>}:queue` and marks itself seen every 250 ms in
//! `distlock:{<name>}:seen`; a free lock goes only to the first waiter seen within the last
//! second. A release hands the lock to that waiter itself (a grant with a 1 s lease, which
//! the new holder extends) and announces the grant, so the waiter holds the lock without
//! asking. `?fair=false` gives the Redisson race: every waiter is woken and the first to ask
//! wins.
//!
//! URLs: `redis://`, `rediss://` (TLS), `redis+spin://`, `redis+sentinel://` (the master a
//! Sentinel group names, followed across failovers) and `redis+cluster://` (sharded pub/sub,
//! renewal per node); see `docs/backends/redis.md`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::watch;

use self::deployment::Commands;
use self::hub::ReleaseHub;

use crate::backend::{
    Acquired, Backend, Extended, LockInfo, Owner, Published, ReleaseWaiter, Released, Renewing,
    Woken,
};
use crate::error::{Error, Result};
use crate::name::LockName;

#[cfg(feature = "bench")]
mod bare;
mod connect;
pub(crate) mod deployment;
mod hub;
mod list;
mod published;
pub mod redlock;
mod scripts;
mod waiter;

use self::waiter::{Queued, RedisWaiter, SpinWaiter, WriterMark};

pub(crate) const SCHEME: &str = "redis";

/// A queued waiter not seen for this long is skipped (fair mode).
const TICKET_STALE: Duration = Duration::from_secs(1);
/// The lease a handover grants (fair mode); the new holder then extends it to the lease it
/// asked for. A waiter that died while first in line holds a lock back this long at most.
const HANDOVER_LEASE: Duration = Duration::from_secs(1);

/// How long a writer of a reader-writer lock that was turned away keeps later readers out
/// (its mark in `:writers`), unless it asks again: a writer that gave up or was cancelled
/// holds readers off this long at most.
const WRITER_MARK: Duration = Duration::from_secs(2);

/// How soon a writer that was turned away asks again at the latest, refreshing its mark.
const WRITER_RECHECK: Duration = Duration::from_millis(500);
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
    terms: String,
    /// The writers of a reader-writer lock waiting, each until its mark's end.
    writers: String,
}

impl Keys {
    /// An invocation of `script` with the six keys of the scripts that may pass a freed lock
    /// on (release, force-unlock, leave): lock, fence, channel, queue, seen, terms.
    fn passing_on<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in [
            &self.lock,
            &self.fence,
            &self.channel,
            &self.queue,
            &self.seen,
            &self.terms,
        ] {
            invocation.key(key);
        }
        invocation
    }

    fn of(name: &LockName) -> Self {
        let tag = name.escaped();
        Keys {
            lock: format!("distlock:{{{tag}}}:lock"),
            fence: format!("distlock:{{{tag}}}:fence"),
            channel: format!("distlock:{{{tag}}}:released"),
            queue: format!("distlock:{{{tag}}}:queue"),
            seen: format!("distlock:{{{tag}}}:seen"),
            ticket: format!("distlock:{{{tag}}}:ticket"),
            terms: format!("distlock:{{{tag}}}:terms"),
            writers: format!("distlock:{{{tag}}}:writers"),
        }
    }
}

/// The reentrant lock on a standalone Redis server.
#[derive(Clone)]
pub struct RedisBackend {
    connection: Commands,
    scripts: Arc<scripts::Scripts>,
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
    move |error| {
        refused(operation, &error).unwrap_or_else(|| Error::backend(SCHEME, operation, error))
    }
}

/// [`Error::NotAuthorized`] when the server refused the URL's credentials (`WRONGPASS`), asked
/// for credentials the URL did not give (`NOAUTH`), or its ACL denied a command or key that
/// distlock needs (`NOPERM`, or inside a script the `ERR` that says the user executing it
/// can't); `None` for any other error. Decided by the reply's code, never by words a reply
/// may echo (a key, a lock name).
pub(crate) fn refused(operation: &'static str, error: &redis::RedisError) -> Option<Error> {
    let code = error.code().unwrap_or_default();
    let detail = error.detail().unwrap_or_default();
    let in_script = code == "ERR" && detail.starts_with("The user executing the script can't");
    let reason = if error.kind() == redis::ErrorKind::AuthenticationFailed || code == "WRONGPASS" {
        "Redis refused the URL's user and password (WRONGPASS): check them, and that the user \
         is enabled"
            .to_owned()
    } else if code == "NOAUTH" {
        "the server requires a password (NOAUTH): give it in the URL, \
         redis://user:password@host:6379/"
            .to_owned()
    } else if code == "NOPERM" || in_script {
        format!(
            "the server's ACL does not let the URL's user run a command or touch a key the lock \
             needs (NOPERM: {}): grant the commands and the key and channel pattern distlock:* \
             that docs/security.md lists",
            if detail.is_empty() {
                "no detail"
            } else {
                detail
            }
        )
    } else {
        return None;
    };
    Some(Error::not_authorized(SCHEME, operation, reason))
}

/// [`Error::NotAuthorized`] for a sentinel's refusal of the login distlock gives the sentinels
/// (`sentinel_user=`, `sentinel_password=`), which is not the master's (the URL's user info).
pub(crate) fn sentinel_refused(error: &redis::RedisError) -> Error {
    let reason = match error.code().unwrap_or_default() {
        "NOAUTH" => "the sentinels require a password of their own (NOAUTH): give it as \
                     ?sentinel_password=... (and ?sentinel_user=... for a user other than \
                     default); the URL's user info is the master's login"
            .to_owned(),
        "NOPERM" => format!(
            "the sentinels' ACL does not let sentinel_user= run a command distlock asks of them \
             (NOPERM: {}): grant it SENTINEL, ROLE and PING",
            error.detail().unwrap_or("no detail")
        ),
        _ => "a sentinel refused sentinel_user= and sentinel_password= (WRONGPASS): check them; \
              the URL's user info is the master's login, not the sentinels'"
            .to_owned(),
    };
    Error::not_authorized(SCHEME, "connect", reason)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Reads the reply of an acquire script: `{1, token, holds}` granted, `{0, pttl}` held,
/// `{0, -3}` free but reserved for the first queued waiter.
fn acquired(reply: &[i64]) -> Result<Acquired> {
    match reply {
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

/// Connects to the deployment a Redis URL names; see [`RedisBackend::connect`].
///
/// # Errors
/// As [`RedisBackend::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(RedisBackend::connect(url).await?))
}

crate::driver::driver!(
    check_url: deployment::check_url,
    open: connect,
    bare: bare::open,
    bare_applies: bare::applies,
);

#[async_trait]
impl Backend for RedisBackend {
    fn scheme(&self) -> &'static str {
        self.scheme
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        matches!(
            kind,
            crate::LockKind::Exclusive | crate::LockKind::Read | crate::LockKind::Write
        )
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
        let reader = matches!(name.kind(), crate::LockKind::Read);
        let reply: Vec<i64> = if !name.kind().is_exclusive() {
            self.scripts
                .rw_acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.writers)
                .arg(owner.as_str())
                .arg(millis(lease))
                .arg(u8::from(reader))
                .arg(millis(WRITER_MARK))
                .arg(millis(WRITER_RECHECK))
                .invoke_async(&mut self.connection.clone())
                .await
        } else if self.fair {
            self.scripts
                .acquire_fair
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.queue)
                .key(&keys.seen)
                .key(&keys.terms)
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
        acquired(&reply)
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let keys = Keys::of(name);
        let writer_mark = self.mark_writer(name, owner, &keys).await?;
        if self.spin {
            return Ok(Box::new(SpinWaiter {
                sleep: SPIN_FIRST,
                writer_mark,
            }));
        }
        // Listen first, then queue: an announcement naming us cannot come before we listen.
        let mut waiter = self.listen(&keys).await?;
        waiter.writer_mark = writer_mark;
        // A reader-writer lock's waiters are not queued: they listen, and a waiting writer's
        // mark keeps later readers out.
        if self.fair && name.kind().is_exclusive() {
            let id = format!("{}#{:x}", owner.as_str(), fastrand::u64(..));
            // The waiter's own channel, listened to before it queues, as the lock's is.
            let own = format!("{}>{id}", keys.channel);
            let own_receiver = match self.releases.subscribe(&own).await {
                Ok(receiver) => receiver,
                Err(error) => {
                    drop(waiter);
                    return Err(error);
                }
            };
            waiter.own = Some((own, own_receiver));
            let queued = Queued {
                backend: self.clone(),
                keys,
                id,
                // A waiter asking for a lease shorter than a handover's is named, not handed
                // the lock: it learns of a handover up to a refresh interval late.
                lease_ms: if lease >= HANDOVER_LEASE {
                    millis(HANDOVER_LEASE)
                } else {
                    0
                },
                refreshes: VecDeque::new(),
                next_refresh: 0,
                refreshed: tokio::time::Instant::now(),
            };
            // Queued before the request: a waiter whose first enqueue failed (it may have
            // queued us all the same) leaves the queue when it is dropped.
            let queued = waiter.queued.insert(queued);
            waiter.handed = queued.enqueue().await?;
        }
        Ok(Box::new(waiter))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let keys = Keys::of(name);
        let script = if matches!(name.kind(), crate::LockKind::Read) {
            &self.scripts.rw_release
        } else {
            &self.scripts.release
        };
        let reply: i64 = keys
            .passing_on(script)
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

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let keys = Keys::of(name);
        let reply: i64 = self
            .scripts
            .extend
            .key(&keys.lock)
            .arg(owner.as_str())
            .arg(millis(lease))
            .arg(fencing_token.to_string())
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("extend"))?;
        // A reader's hold is its own: other readers holding do not make it another's.
        let reader = matches!(name.kind(), crate::LockKind::Read);
        Ok(match reply {
            1 => Extended::Extended,
            -2 if !reader => Extended::HeldByOther,
            _ => Extended::NotHeld,
        })
    }

    /// Renews the grants whose hash still carries their owner and their token (`renew.lua`).
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        if self.cluster {
            return self.renew_by_slot(locks, lease).await;
        }
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation.arg(millis(lease));
        for Renewing {
            lock: (name, owner),
            fencing_token,
        } in locks
        {
            invocation.key(Keys::of(name).lock);
            invocation
                .arg(owner.as_str())
                .arg(fencing_token.to_string());
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

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let keys = Keys::of(name);
        let mut connection = self.connection.clone();
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&keys.lock)
            .query_async(&mut connection)
            .await
            .map_err(backend_error("inspect the lock"))?;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&keys.lock)
            .query_async(&mut connection)
            .await
            .map_err(backend_error("inspect the lock"))?;
        let waiters: u64 = redis::cmd("ZCARD")
            .arg(&keys.queue)
            .query_async(&mut connection)
            .await
            .map_err(backend_error("inspect the lock"))?;
        // Owner fields hold counts; the grant's own fields start with ':'.
        let holder = fields.iter().find(|(field, _)| !field.starts_with(':'));
        Ok(LockInfo {
            locked: holder.is_some(),
            holder: holder.map(|(owner, _)| owner.clone()),
            holds: holder.and_then(|(_, holds)| holds.parse().ok()),
            fencing_token: fields.get(":token").and_then(|token| token.parse().ok()),
            remaining_lease: u64::try_from(pttl).ok().map(Duration::from_millis),
            waiters: Some(waiters),
        })
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        if matches!(name.kind(), crate::LockKind::Read) {
            // A reader's own lease may have ended while other readers keep the key.
            let holds: i64 = self
                .scripts
                .rw_holds
                .key(Keys::of(name).lock)
                .arg(owner.as_str())
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(backend_error("query the lock"))?;
            return Ok(u32::try_from(holds).unwrap_or(0));
        }
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
        let freed: i64 = keys
            .passing_on(&self.scripts.force_unlock)
            .arg(millis(TICKET_STALE))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("force unlock"))?;
        Ok(freed == 1)
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.publish_record(key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        Ok(self.stored_record(key).await?.and_then(Published::live))
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.withdraw_record(key, term).await
    }

    /// The names whose lock key exists, found by a SCAN of the whole keyspace (on a Cluster,
    /// of every master), `COUNT` 1000 per step; see `redis/list.rs`.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        Ok(self.held_names(prefix, limit).await?.0)
    }
}

impl RedisBackend {
    /// A waiter that listens for releases of the lock whose keys are `keys`, unqueued.
    async fn listen(&self, keys: &Keys) -> Result<RedisWaiter> {
        let receiver = self.releases.subscribe(&keys.channel).await?;
        Ok(RedisWaiter {
            hub: self.releases.clone(),
            channel: keys.channel.clone(),
            receiver,
            own: None,
            queued: None,
            handed: None,
            writer_mark: None,
        })
    }

    /// Renewal on a Cluster: one script call per node. The locks are grouped by the node
    /// that serves their slot (from CLUSTER SLOTS) and each node renews its share in one call
    /// of a script allowed to touch keys of several slots of that node. The locks of a node
    /// that refused (a slot that moved meanwhile, a node not connected) are renewed again
    /// one slot per call, routed by key, which follows redirections.
    async fn renew_by_slot(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let keys: Vec<String> = locks.iter().map(|r| Keys::of(&r.lock.0).lock).collect();
        let slots: Vec<u16> = keys.iter().map(|key| deployment::slot(key)).collect();
        let mut renewed = vec![false; locks.len()];
        let mut left: Vec<usize> = Vec::new();
        match self.slot_owners().await {
            Some(owners) => {
                let mut by_node: HashMap<(String, u16), Vec<usize>> = HashMap::new();
                for (i, slot) in slots.iter().enumerate() {
                    match owners
                        .iter()
                        .find(|(start, end, _)| (*start..=*end).contains(slot))
                    {
                        Some((_, _, node)) => by_node.entry(node.clone()).or_default().push(i),
                        None => left.push(i),
                    }
                }
                let calls = by_node
                    .into_iter()
                    .map(|(node, share)| self.renew_on_node(node, share, &keys, locks, lease));
                for (share, flags) in futures_util::future::join_all(calls).await {
                    match flags {
                        Some(flags) => {
                            for (i, flag) in share.into_iter().zip(flags) {
                                renewed[i] = flag;
                            }
                        }
                        None => left.extend(share),
                    }
                }
            }
            None => left.extend(0..locks.len()),
        }
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for i in left {
            by_slot.entry(slots[i]).or_default().push(i);
        }
        let calls = by_slot.into_values().map(|group| {
            let mut invocation = self.scripts.renew.prepare_invoke();
            invocation.arg(millis(lease));
            for &i in &group {
                invocation.key(&keys[i]);
                invocation
                    .arg(locks[i].lock.1.as_str())
                    .arg(locks[i].fencing_token.to_string());
            }
            let mut connection = self.connection.clone();
            async move {
                let reply: Vec<i64> = invocation.invoke_async(&mut connection).await?;
                Ok::<_, redis::RedisError>((group, reply))
            }
        });
        for (group, reply) in futures_util::future::try_join_all(calls)
            .await
            .map_err(backend_error("renew"))?
        {
            for (i, r) in group.into_iter().zip(reply) {
                renewed[i] = r == 1;
            }
        }
        Ok(renewed)
    }

    /// The Cluster's slot ranges and the address of each range's master, or `None` when
    /// they cannot be read (renewal then routes each slot's call by key).
    async fn slot_owners(&self) -> Option<Vec<(u16, u16, (String, u16))>> {
        let Commands::Cluster(connection) = &self.connection else {
            return None;
        };
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let reply = connection
            .clone()
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), routing)
            .await
            .ok()?;
        let ranges: Vec<Vec<redis::Value>> = redis::from_redis_value(reply).ok()?;
        let mut owners = Vec::new();
        for range in ranges {
            let [start, end, master, ..] = range.as_slice() else {
                continue;
            };
            let (start, end): (u16, u16) = (
                redis::from_redis_value_ref(start).ok()?,
                redis::from_redis_value_ref(end).ok()?,
            );
            let (host, port): (String, u16) =
                match redis::from_redis_value_ref::<Vec<redis::Value>>(master)
                    .ok()?
                    .as_slice()
                {
                    [host, port, ..] => (
                        redis::from_redis_value_ref(host).ok()?,
                        redis::from_redis_value_ref(port).ok()?,
                    ),
                    _ => continue,
                };
            owners.push((start, end, (host, port)));
        }
        Some(owners)
    }

    /// For a writer of a reader-writer lock that begins to wait: its mark, which turns later
    /// readers away while it waits (writer preference). `None` for anyone else.
    async fn mark_writer(
        &self,
        name: &LockName,
        owner: &Owner,
        keys: &Keys,
    ) -> Result<Option<WriterMark>> {
        if !matches!(name.kind(), crate::LockKind::Write) {
            return Ok(None);
        }
        // Made before the request: a mark whose reply was lost is taken away all the same
        // when it is dropped, and ends by itself.
        let mark = WriterMark {
            backend: self.clone(),
            writers: keys.writers.clone(),
            owner: owner.as_str().to_owned(),
            removed: false,
        };
        let _: i64 = self
            .scripts
            .rw_mark
            .key(&mark.writers)
            .arg(&mark.owner)
            .arg(millis(WRITER_MARK))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(backend_error("mark a waiting writer"))?;
        Ok(Some(mark))
    }

    /// Renews one node's share of the locks in one script call sent to that node. Returns
    /// the share and its flags, or `None` when the node did not run the call.
    async fn renew_on_node(
        &self,
        (host, port): (String, u16),
        share: Vec<usize>,
        keys: &[String],
        locks: &[Renewing],
        lease: Duration,
    ) -> (Vec<usize>, Option<Vec<bool>>) {
        let Commands::Cluster(connection) = &self.connection else {
            return (share, None);
        };
        // EVAL, not EVALSHA: sent once per node and renewal round, and never NOSCRIPT.
        let mut call = redis::cmd("EVAL");
        call.arg(&self.scripts.renew_on_node)
            .arg(0)
            .arg(millis(lease));
        for &i in &share {
            call.arg(&keys[i])
                .arg(locks[i].lock.1.as_str())
                .arg(locks[i].fencing_token.to_string());
        }
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        let flags = connection
            .clone()
            .route_command(call, route)
            .await
            .ok()
            .and_then(|reply| redis::from_redis_value::<Vec<i64>>(reply).ok())
            .filter(|flags| flags.len() == share.len())
            .map(|flags| flags.into_iter().map(|f| f == 1).collect());
        (share, flags)
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
            &keys.terms,
            &keys.writers,
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
