//! PostgreSQL session advisory locks (`postgres://...`, the default mode).
//!
//! A lock is `pg_advisory_lock(key)` held by one of the client's own lock connections,
//! separate from any pool the application uses for its business work, for as long as the
//! lock is held. The key is a 64-bit FNV-1a hash of `distlock\0` followed by the lock name.
//!
//! * An acquisition that does not wait runs `pg_try_advisory_lock` on the client's primary
//!   lock connection, which holds every lock taken that way.
//! * A waiting acquisition takes a connection of its own (a new one, or an idle one kept from
//!   earlier) and blocks in `pg_advisory_lock` with `lock_timeout` set to the time it may
//!   wait. The server grants it the moment the holder unlocks, and that connection then
//!   holds the lock until it is released.
//! * Several owners of one client never share a lock through one session (advisory locks
//!   are re-entrant per session): the client reserves the name before it asks.
//! * The fencing token is a per-name counter in `distlock_fencing`, bumped by the same
//!   statement that takes the lock, while it is held.
//! * A lock connection that dies takes its locks with it (the server frees them); the next
//!   renewal check finds them gone and fires `lost()`. Force-unlock terminates the holding
//!   session (`pg_terminate_backend`), which frees every lock that session held.
//! * Leases are kept by the holder's client, as for ZooKeeper: a fixed lease ends with the
//!   client unlocking.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use tokio::sync::{Mutex as AsyncMutex, Notify, oneshot};
use tokio::time::Instant;

use crate::backend::{Acquired, Backend, Extended, Owner, ReleaseWaiter, Released, Woken};
use crate::error::{Error, Result};
use crate::name::LockName;

use super::{SCHEME, db_error, token_u64};

/// Idle lock connections kept for the next waiter.
const IDLE_KEPT: usize = 16;

const TRY_LOCK: &str = "
WITH l AS (SELECT pg_try_advisory_lock($1) AS got)
INSERT INTO distlock_fencing AS f (name, last_token) SELECT $2, 1 FROM l WHERE l.got
ON CONFLICT (name) DO UPDATE SET last_token = f.last_token + 1
RETURNING last_token";

const BLOCKING_LOCK: &str = "
WITH l AS (SELECT pg_advisory_lock($1))
INSERT INTO distlock_fencing AS f (name, last_token) SELECT $2, 1 FROM l
ON CONFLICT (name) DO UPDATE SET last_token = f.last_token + 1
RETURNING last_token";

/// The advisory keys (bigint form) this session holds.
const MY_KEYS: &str = "
SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()";

/// The sessions holding `key`.
const HOLDERS: &str = "
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND ((classid::bigint << 32) | objid::bigint) = $1";

/// The advisory key of a lock name: FNV-1a (64 bit) over `distlock\0` and the name's bytes,
/// as a signed bigint. Stable across releases: every client of one lock must agree on it. Two
/// names collide with a chance of about n²/2⁶⁵ for n names in use at once.
pub fn advisory_key(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"distlock\0".iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// One of the client's lock connections.
struct LockConn {
    conn: AsyncMutex<PgConnection>,
    pid: i32,
}

impl LockConn {
    async fn open(options: &PgConnectOptions) -> Result<Arc<LockConn>> {
        let mut conn = PgConnection::connect_with(options)
            .await
            .map_err(db_error("open a lock connection"))?;
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .map_err(db_error("open a lock connection"))?;
        Ok(Arc::new(LockConn {
            conn: AsyncMutex::new(conn),
            pid,
        }))
    }

    /// The advisory keys this connection holds; an error when it is gone.
    async fn keys(&self) -> Result<HashSet<i64>> {
        let mut conn = self.conn.lock().await;
        let keys: Vec<(i64,)> = sqlx::query_as(MY_KEYS)
            .fetch_all(&mut *conn)
            .await
            .map_err(db_error("check held locks"))?;
        Ok(keys.into_iter().map(|(key,)| key).collect())
    }

    async fn unlock(&self, key: i64) -> Result<bool> {
        let mut conn = self.conn.lock().await;
        let (unlocked,): (bool,) = sqlx::query_as("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await
            .map_err(db_error("unlock"))?;
        Ok(unlocked)
    }
}

struct Held {
    owner: Owner,
    holds: u32,
    token: u64,
    key: i64,
    conn: Arc<LockConn>,
    expires_at: Instant,
}

#[derive(Default)]
struct State {
    held: HashMap<LockName, Held>,
    /// Names being asked for by one owner of this client right now.
    pending: HashSet<LockName>,
    /// Locks to unlock in the background (lease ended, abandoned grant).
    unlock: Vec<(Arc<LockConn>, i64)>,
}

struct Shared {
    options: PgConnectOptions,
    /// For the operator's queries (who holds, terminate).
    pool: PgPool,
    primary: AsyncMutex<Option<Arc<LockConn>>>,
    idle: StdMutex<Vec<Arc<LockConn>>>,
    state: StdMutex<State>,
    reaper: Arc<Notify>,
}

/// PostgreSQL session advisory locks, `postgres://` without `?mode=`; see the
/// [`postgres` module docs](crate::postgres).
#[derive(Clone)]
pub struct PgAdvisoryBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgAdvisoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisoryBackend").finish_non_exhaustive()
    }
}

impl PgAdvisoryBackend {
    pub(super) fn new(options: PgConnectOptions, pool: PgPool) -> Self {
        let shared = Arc::new(Shared {
            options,
            pool,
            primary: AsyncMutex::new(None),
            idle: StdMutex::default(),
            state: StdMutex::default(),
            reaper: Arc::new(Notify::new()),
        });
        tokio::spawn(reap(Arc::downgrade(&shared), shared.reaper.clone()));
        PgAdvisoryBackend { shared }
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn primary(&self) -> Result<Arc<LockConn>> {
        let mut primary = self.primary.lock().await;
        if let Some(conn) = primary.as_ref() {
            return Ok(conn.clone());
        }
        let conn = LockConn::open(&self.options).await?;
        *primary = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets a primary connection that failed, so that the next request opens another.
    async fn drop_primary(&self, failed: &Arc<LockConn>) {
        let mut primary = self.primary.lock().await;
        if primary.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
            *primary = None;
        }
    }

    async fn idle_or_new(&self) -> Result<Arc<LockConn>> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        match idle {
            Some(conn) => Ok(conn),
            None => LockConn::open(&self.options).await,
        }
    }

    /// A waiter's connection that holds nothing now: keep it for the next waiter.
    fn to_idle(&self, conn: Arc<LockConn>) {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if idle.len() < IDLE_KEPT {
            idle.push(conn);
        }
    }

    /// After an unlock on `conn`: a waiter's connection holding nothing more goes idle. A
    /// connection whose unlock failed is never reused: it may still hold the lock, and
    /// closing it (dropping the last handle) frees everything it holds.
    async fn after_unlock(&self, conn: Arc<LockConn>, unlocked: bool) {
        if !unlocked {
            self.drop_primary(&conn).await;
            return;
        }
        if self
            .primary
            .lock()
            .await
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &conn))
        {
            return;
        }
        let in_use = self
            .state()
            .held
            .values()
            .any(|held| Arc::ptr_eq(&held.conn, &conn));
        if !in_use {
            self.to_idle(conn);
        }
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let holders: Vec<(i32,)> = sqlx::query_as(HOLDERS)
            .bind(advisory_key(name.as_str()))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error("read the lock"))?;
        Ok(!holders.is_empty())
    }

    /// Whether `owner` still holds `name` on the server.
    async fn alive(&self, name: &LockName, owner: &Owner) -> Result<Option<(Arc<LockConn>, i64)>> {
        let Some((conn, key)) = self
            .state()
            .held
            .get(name)
            .filter(|held| &held.owner == owner)
            .map(|held| (held.conn.clone(), held.key))
        else {
            return Ok(None);
        };
        match conn.keys().await {
            Ok(keys) if keys.contains(&key) => Ok(Some((conn, key))),
            Ok(_) | Err(_) => {
                self.forget(name, &conn);
                Ok(None)
            }
        }
    }

    fn forget(&self, name: &LockName, conn: &Arc<LockConn>) {
        let mut state = self.state();
        if state
            .held
            .get(name)
            .is_some_and(|held| Arc::ptr_eq(&held.conn, conn))
        {
            state.held.remove(name);
        }
    }
}

/// Unlocks in the background: leases that ended and grants nobody took.
async fn reap(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let notified = wake.notified();
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (work, next) = {
            let mut state = strong.state();
            let expired: Vec<LockName> = state
                .held
                .iter()
                .filter(|(_, held)| held.expires_at <= now)
                .map(|(name, _)| name.clone())
                .collect();
            for name in expired {
                if let Some(held) = state.held.remove(&name) {
                    tracing::debug!(lock = %name, "the lease ended; unlocking");
                    state.unlock.push((held.conn, held.key));
                }
            }
            let next = state.held.values().map(|held| held.expires_at).min();
            (std::mem::take(&mut state.unlock), next)
        };
        for (conn, key) in work {
            let unlocked = conn.unlock(key).await;
            if let Err(error) = &unlocked {
                tracing::warn!(%error, "unlocking in the background failed; closing the connection");
            }
            strong.after_unlock(conn, unlocked.is_ok()).await;
        }
        drop(strong);
        tokio::select! {
            _ = notified => {}
            _ = crate::wake::sleep_until_or_never(next) => {}
        }
    }
}

#[async_trait]
impl Backend for PgAdvisoryBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.shared.pool)
            .await
            .map(drop)
            .map_err(db_error("ping"))
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let shared = &self.shared;
        {
            let mut state = shared.state();
            if let Some(held) = state.held.get_mut(name) {
                if &held.owner != owner {
                    return Ok(Acquired::Held { ttl: None });
                }
                held.holds += 1;
                held.expires_at = held.expires_at.max(Instant::now() + lease);
                return Ok(Acquired::Granted {
                    fencing_token: held.token,
                    holds: held.holds,
                });
            }
            if !state.pending.insert(name.clone()) {
                // Another owner of this client is asking right now.
                return Ok(Acquired::Held {
                    ttl: Some(Duration::from_millis(1)),
                });
            }
        }
        let key = advisory_key(name.as_str());
        let outcome = async {
            let conn = shared.primary().await?;
            let token: Result<Option<(i64,)>> = {
                let mut c = conn.conn.lock().await;
                sqlx::query_as(TRY_LOCK)
                    .bind(key)
                    .bind(name.as_str())
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(db_error("acquire"))
            };
            match token {
                Ok(token) => Ok((conn, token)),
                Err(error) => {
                    // The lock may have been taken before the statement failed.
                    let _ = conn.unlock(key).await;
                    shared.drop_primary(&conn).await;
                    Err(error)
                }
            }
        }
        .await;
        let mut state = shared.state();
        state.pending.remove(name);
        let (conn, token) = outcome?;
        let Some((token,)) = token else {
            return Ok(Acquired::Held { ttl: None });
        };
        let token = token_u64(token);
        state.held.insert(
            name.clone(),
            Held {
                owner: owner.clone(),
                holds: 1,
                token,
                key,
                conn,
                expires_at: Instant::now() + lease,
            },
        );
        drop(state);
        shared.reaper.notify_one();
        Ok(Acquired::Granted {
            fencing_token: token,
            holds: 1,
        })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        Ok(Box::new(AdvisoryWaiter {
            shared: self.shared.clone(),
            name: name.clone(),
            owner: owner.clone(),
            lease,
            pending: None,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let shared = &self.shared;
        let taken = {
            let mut state = shared.state();
            match state.held.get_mut(name) {
                Some(held) if &held.owner == owner => {
                    if held.holds > 1 {
                        held.holds -= 1;
                        return Ok(Released::Released {
                            remaining_holds: held.holds,
                        });
                    }
                    state.held.remove(name)
                }
                Some(_) => return Ok(Released::HeldByOther),
                None => None,
            }
        };
        let Some(held) = taken else {
            return Ok(if shared.is_locked(name).await? {
                Released::HeldByOther
            } else {
                Released::NotHeld
            });
        };
        let unlocked = held.conn.unlock(held.key).await;
        shared.after_unlock(held.conn, unlocked.is_ok()).await;
        Ok(match unlocked {
            Ok(true) => Released::Released { remaining_holds: 0 },
            // The session lost it (terminated, or its connection broke).
            Ok(false) | Err(_) => Released::NotHeld,
        })
    }

    async fn extend(&self, name: &LockName, owner: &Owner, lease: Duration) -> Result<Extended> {
        let shared = &self.shared;
        let start = Instant::now();
        if shared.alive(name, owner).await?.is_some() {
            if let Some(held) = shared.state().held.get_mut(name) {
                held.expires_at = start + lease;
            }
            shared.reaper.notify_one();
            return Ok(Extended::Extended);
        }
        let other = shared.state().held.contains_key(name) || shared.is_locked(name).await?;
        Ok(if other {
            Extended::HeldByOther
        } else {
            Extended::NotHeld
        })
    }

    async fn renew(&self, locks: &[(LockName, Owner)], lease: Duration) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let start = Instant::now();
        // One query per lock connection involved.
        let conns: Vec<Arc<LockConn>> = {
            let state = shared.state();
            let mut conns: Vec<Arc<LockConn>> = Vec::new();
            for (name, owner) in locks {
                if let Some(held) = state.held.get(name).filter(|h| &h.owner == owner)
                    && !conns.iter().any(|c| Arc::ptr_eq(c, &held.conn))
                {
                    conns.push(held.conn.clone());
                }
            }
            conns
        };
        let mut alive: Vec<(Arc<LockConn>, HashSet<i64>)> = Vec::new();
        for conn in conns {
            match conn.keys().await {
                Ok(keys) => alive.push((conn, keys)),
                Err(error) => {
                    tracing::warn!(%error, "a lock connection failed; its locks are lost");
                    shared.drop_primary(&conn).await;
                }
            }
        }
        let mut state = shared.state();
        Ok(locks
            .iter()
            .map(|(name, owner)| {
                let Some(held) = state.held.get_mut(name).filter(|h| &h.owner == owner) else {
                    return false;
                };
                let ok = alive
                    .iter()
                    .any(|(conn, keys)| Arc::ptr_eq(conn, &held.conn) && keys.contains(&held.key));
                if ok {
                    held.expires_at = start + lease;
                } else {
                    state.held.remove(name);
                }
                ok
            })
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        self.shared.is_locked(name).await
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let shared = &self.shared;
        if shared.alive(name, owner).await?.is_none() {
            return Ok(0);
        }
        Ok(shared
            .state()
            .held
            .get(name)
            .filter(|held| &held.owner == owner)
            .map_or(0, |held| held.holds))
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let shared = &self.shared;
        let holders: Vec<(i32,)> = sqlx::query_as(HOLDERS)
            .bind(advisory_key(name.as_str()))
            .fetch_all(&shared.pool)
            .await
            .map_err(db_error("find the holder"))?;
        let mut freed = false;
        for (pid,) in holders {
            let (terminated,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&shared.pool)
                .await
                .map_err(db_error("terminate the holder's session"))?;
            freed |= terminated;
        }
        // The server frees the locks when the terminated session has ended.
        if freed {
            let deadline = Instant::now() + Duration::from_secs(5);
            while shared.is_locked(name).await? && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(freed)
    }
}

/// The outcome of one blocking attempt, from its background task.
enum Outcome {
    Granted {
        conn: Arc<LockConn>,
        token: u64,
        key: i64,
    },
    TimedOut,
    Failed(Error),
}

/// A blocking attempt in flight: its task's answer and its session (to cancel it).
struct Pending {
    answer: oneshot::Receiver<Outcome>,
    pid: Arc<AtomicI32>,
}

struct AdvisoryWaiter {
    shared: Arc<Shared>,
    name: LockName,
    owner: Owner,
    lease: Duration,
    pending: Option<Pending>,
}

impl AdvisoryWaiter {
    fn start(&mut self, max: Duration) -> &mut Pending {
        let (send, answer) = oneshot::channel();
        let pid = Arc::new(AtomicI32::new(0));
        let shared = self.shared.clone();
        let name = self.name.clone();
        let task_pid = pid.clone();
        tokio::spawn(async move {
            let outcome = blocking_attempt(&shared, &name, max, &task_pid).await;
            if let Err(Outcome::Granted { conn, key, .. }) = send.send(outcome) {
                // Nobody took the grant: give it back.
                shared.state().unlock.push((conn, key));
                shared.reaper.notify_one();
            }
        });
        self.pending.insert(Pending { answer, pid })
    }
}

async fn blocking_attempt(
    shared: &Shared,
    name: &LockName,
    max: Duration,
    pid: &AtomicI32,
) -> Outcome {
    let conn = match shared.idle_or_new().await {
        Ok(conn) => conn,
        Err(error) => return Outcome::Failed(error),
    };
    pid.store(conn.pid, Ordering::SeqCst);
    let key = advisory_key(name.as_str());
    let result: Result<(i64,), sqlx::Error> = {
        let mut c = conn.conn.lock().await;
        let timeout_ms = max.as_millis().clamp(1, i32::MAX as u128).to_string();
        match sqlx::query("SELECT set_config('lock_timeout', $1, false)")
            .bind(&timeout_ms)
            .execute(&mut *c)
            .await
        {
            Ok(_) => {
                sqlx::query_as(BLOCKING_LOCK)
                    .bind(key)
                    .bind(name.as_str())
                    .fetch_one(&mut *c)
                    .await
            }
            Err(error) => Err(error),
        }
    };
    // Done with the statement: a waiter that gives up from now on has nothing to cancel.
    pid.store(0, Ordering::SeqCst);
    match result {
        Ok((token,)) => Outcome::Granted {
            conn,
            token: token_u64(token),
            key,
        },
        Err(error) => {
            // A statement that failed after its CTE took the lock (a cancel landing during
            // the insert) leaves the session holding it: session locks outlive a failed
            // statement. This connection holds nothing else, so unlock everything before it
            // serves another waiter; if that fails, closing it frees whatever it holds.
            let clean = {
                let mut c = conn.conn.lock().await;
                sqlx::query("SELECT pg_advisory_unlock_all()")
                    .execute(&mut *c)
                    .await
                    .is_ok()
            };
            if clean {
                shared.to_idle(conn);
            }
            let code = error
                .as_database_error()
                .and_then(|e| e.code())
                .map(|c| c.into_owned());
            // 55P03: lock_timeout ran out.
            if code.as_deref() == Some("55P03") {
                return Outcome::TimedOut;
            }
            Outcome::Failed(Error::backend(SCHEME, "wait for the lock", error))
        }
    }
}

impl Drop for AdvisoryWaiter {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        // Stop the blocked statement; a grant that lands anyway is given back by the task.
        let pid = pending.pid.load(Ordering::SeqCst);
        if pid != 0
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let pool = self.shared.pool.clone();
            runtime.spawn(async move {
                let _ = sqlx::query("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .execute(&pool)
                    .await;
            });
        }
    }
}

#[async_trait]
impl ReleaseWaiter for AdvisoryWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        let deadline = Instant::now() + max;
        if self.pending.is_none() {
            self.start(max);
        }
        let Some(pending) = self.pending.as_mut() else {
            return Woken::Retry;
        };
        let outcome = tokio::select! {
            outcome = &mut pending.answer => outcome,
            // The statement's own lock_timeout ends it; this is the backstop.
            _ = tokio::time::sleep_until(deadline + Duration::from_secs(1)) => return Woken::Retry,
        };
        self.pending = None;
        match outcome {
            Ok(Outcome::Granted { conn, token, key }) => {
                let since = Instant::now();
                let mut state = self.shared.state();
                if state.held.contains_key(&self.name) {
                    // Cannot happen (the server excludes this client's other sessions), but
                    // never record two holders.
                    state.unlock.push((conn, key));
                    drop(state);
                    self.shared.reaper.notify_one();
                    return Woken::Retry;
                }
                state.held.insert(
                    self.name.clone(),
                    Held {
                        owner: self.owner.clone(),
                        holds: 1,
                        token,
                        key,
                        conn,
                        expires_at: since + self.lease,
                    },
                );
                drop(state);
                self.shared.reaper.notify_one();
                Woken::Granted {
                    fencing_token: token,
                    since,
                    lease: self.lease,
                }
            }
            Ok(Outcome::TimedOut) => Woken::Retry,
            Ok(Outcome::Failed(error)) => {
                tracing::warn!(%error, "waiting for a PostgreSQL advisory lock failed");
                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100)))
                    .await;
                Woken::Retry
            }
            Err(_) => Woken::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        // Fixed: changing the mapping would let old and new clients hold one lock twice.
        assert_eq!(advisory_key(""), advisory_key(""));
        assert_ne!(advisory_key("a"), advisory_key("b"));
        assert_ne!(advisory_key("ab"), advisory_key("ba"));
        // Computed independently (a Python FNV-1a over b"distlock\0stock/iphone-15").
        assert_eq!(advisory_key("stock/iphone-15"), -4_084_211_295_201_441_055);
    }
}
