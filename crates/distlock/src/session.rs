//! Locks that live in a database session: PostgreSQL advisory locks and MySQL/MariaDB named
//! locks. The two servers differ in their SQL; the client side is this one module, generic
//! over a [`Dialect`].
//!
//! * An acquisition that does not wait asks on an idle lock connection when the client keeps
//!   one, else on the client's primary lock connection, which holds the locks taken that way.
//! * A waiting acquisition takes a connection of its own (an idle one kept from earlier, else
//!   the primary when nothing holds or uses it, else a new one) and blocks in the server's
//!   own wait, bounded by the time it may wait. The server grants it the moment the holder
//!   unlocks, and that connection then holds the lock until it is released; then it is kept
//!   idle for the next try or wait.
//! * A primary connection that holds nothing and that nothing uses is made idle (by the
//!   watcher, or for a waiter), a dropped waiter's statement is cancelled from an idle lock
//!   connection when there is one, and the operator's pool closes connections idle for
//!   [`OPERATOR_POOL_IDLE`]: a process whose acquisitions take turns keeps one server
//!   connection.
//! * Several owners of one client never share a lock through one session (session locks are
//!   re-entrant per session on both servers): the client reserves the name before it asks.
//! * The fencing token is drawn by the same statement that takes the lock, after it: from a
//!   sequence on PostgreSQL and MariaDB, from a per-name counter in `distlock_fencing` on
//!   MySQL.
//! * A lock connection that dies takes its locks with it (the server frees them). A watcher
//!   asks every lock connection that holds locks whether it still holds them every
//!   [`WATCH_INTERVAL`]; when one is gone it forgets those locks and reports a lost session,
//!   and the client fires `lost()` for each of them, renewed or on a fixed lease. Force-unlock ends the holding
//!   session, which frees every lock that session held.
//! * Leases are kept by the holder's client, as for ZooKeeper: a fixed lease ends with the
//!   client unlocking.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex as AsyncMutex, Notify, Semaphore, oneshot, watch};
use tokio::time::Instant;

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, SessionState,
    SessionStatus, Woken,
};
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};

mod background;
mod conns;
mod dialect;
mod names;
mod waiter;

use self::background::watch_sessions;
use self::conns::Unlocking;
pub use self::dialect::Dialect;
pub(crate) use self::names::RecordedNames;
use self::waiter::SessionWaiter;

/// FNV-1a (64 bit) over `distlock\0` and the name's bytes: the domain-tagged hash both
/// databases' lock keys are made from. Fixed forever: clients of one lock must agree on it.
pub(crate) fn fnv1a64(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"distlock\0".iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// How often a lock connection is asked what it holds before a failure means it is dead.
const HELD_ATTEMPTS: u32 = 3;

/// How often the watcher asks each lock connection holding locks whether it still does.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// How long a waiter waits for a free waiting statement before it tries the lock again.
const PERMIT_PATIENCE: Duration = Duration::from_millis(100);

/// Idle lock connections kept for the next try or waiter.
const IDLE_KEPT: usize = 16;

/// Connections of the pool for the operator's statements (listing, holders, terminate,
/// published records, and a dropped waiter's cancel when the client keeps no idle lock
/// connection); the locks never use it.
pub(crate) const OPERATOR_POOL_SIZE: u32 = 2;
/// How long a connection of the operator's pool is kept idle: a client that only locks holds
/// no pool connection for long, so that a fleet of processes needs about one server
/// connection per process (its lock connection).
pub(crate) const OPERATOR_POOL_IDLE: Duration = Duration::from_secs(1);
/// Waiting statements one client runs at once, each on a connection of its own, so that a
/// burst of waiters does not open more connections than the server allows. Further waiters
/// queue in the client for a free one, in arrival order, for [`PERMIT_PATIENCE`] at a time,
/// trying the lock in between (on an idle connection, else the primary: a task holding a
/// lock that all waiting statements wait for can still take another).
pub(crate) const MAX_WAITING_CONNECTIONS: usize = 16;

/// One of the client's lock connections.
struct LockConn<D: Dialect> {
    conn: AsyncMutex<D::Conn>,
    session: u64,
    /// Given up ([`Shared::lose_connection`]): never reused, so that it closes with its last
    /// handle and the server frees what it may still hold.
    given_up: std::sync::atomic::AtomicBool,
}

impl<D: Dialect> LockConn<D> {
    async fn open(dialect: &D) -> Result<Arc<Self>> {
        let (conn, session) = dialect.open().await?;
        Ok(Arc::new(LockConn {
            conn: AsyncMutex::new(conn),
            session,
            given_up: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

struct Held<D: Dialect> {
    owner: Owner,
    holds: u32,
    token: u64,
    key: D::Key,
    conn: Arc<LockConn<D>>,
    expires_at: Instant,
}

/// How the client's state names a grant: the lock name, and for a reader also its owner
/// (readers of one client hold one name together, each on a session of its own).
#[derive(Clone, PartialEq, Eq, Hash)]
struct HeldKey {
    name: LockName,
    reader: Option<Owner>,
}

impl HeldKey {
    fn of(name: &LockName, owner: &Owner) -> Self {
        HeldKey {
            name: name.clone(),
            reader: matches!(name.kind(), LockKind::Read).then(|| owner.clone()),
        }
    }
}

impl fmt::Display for HeldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.name, f)
    }
}

/// Names with unlocks on their way on one of the client's sessions, each counted once per
/// unlock (a release's, the reaper's): a name is marked until the last of them is done.
#[derive(Default)]
struct Ending(std::collections::HashMap<HeldKey, u32>);

impl Ending {
    /// One more unlock of `slot` on its way.
    fn mark(&mut self, slot: &HeldKey) {
        *self.0.entry(slot.clone()).or_insert(0) += 1;
    }

    /// One unlock of `slot` done.
    fn unmark(&mut self, slot: &HeldKey) {
        if let Some(count) = self.0.get_mut(slot) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(slot);
            }
        }
    }

    fn contains(&self, slot: &HeldKey) -> bool {
        self.0.contains_key(slot)
    }
}

/// A lock to unlock in the background: its connection, its key, and its name when the name is
/// marked as ending for it (see `State::ending`).
type Unlock<D> = (Arc<LockConn<D>>, <D as Dialect>::Key, Option<HeldKey>);

struct State<D: Dialect> {
    held: HashMap<HeldKey, Held<D>>,
    /// Names being asked for by one owner of this client right now.
    pending: HashSet<HeldKey>,
    /// Locks to unlock in the background (lease ended, release dropped or failed: with its
    /// name; abandoned grant, failed try: without).
    unlock: Vec<Unlock<D>>,
    /// Names with an unlock on its way (a release's, or the reaper's after a lease ended or
    /// an unlock failed), one count each: maybe still held by our session on the server, but
    /// no longer by their owner. Other owners of this client are refused them meanwhile.
    ending: Ending,
}

impl<D: Dialect> Default for State<D> {
    fn default() -> Self {
        State {
            held: HashMap::new(),
            pending: HashSet::new(),
            unlock: Vec::new(),
            ending: Ending::default(),
        }
    }
}

struct Shared<D: Dialect> {
    dialect: D,
    primary: AsyncMutex<Option<Arc<LockConn<D>>>>,
    idle: StdMutex<Vec<Arc<LockConn<D>>>>,
    state: StdMutex<State<D>>,
    reaper: Arc<Notify>,
    /// Permits for waiting statements ([`MAX_WAITING_CONNECTIONS`]).
    waiting: Arc<Semaphore>,
    /// Bumped (`sessions_lost`) each time the watcher finds locks gone from their session.
    status: watch::Sender<SessionStatus>,
}

/// Session locks of one database; see the [module docs](self).
pub struct SessionBackend<D: Dialect> {
    shared: Arc<Shared<D>>,
}

impl<D: Dialect> Clone for SessionBackend<D> {
    fn clone(&self) -> Self {
        SessionBackend {
            shared: self.shared.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SessionBackend<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBackend")
            .field("scheme", &D::SCHEME)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SessionBackend<D> {
    pub(crate) fn new(dialect: D) -> Self {
        let shared = Arc::new(Shared {
            dialect,
            primary: AsyncMutex::new(None),
            idle: StdMutex::default(),
            state: StdMutex::default(),
            reaper: Arc::new(Notify::new()),
            waiting: Arc::new(Semaphore::new(MAX_WAITING_CONNECTIONS)),
            status: watch::Sender::new(SessionStatus {
                state: SessionState::Connected,
                sessions_lost: 0,
            }),
        });
        crate::reaper::spawn(&shared, &shared.reaper);
        tokio::spawn(watch_sessions(Arc::downgrade(&shared)));
        SessionBackend { shared }
    }

    /// The dialect (for the tests of other modules).
    #[cfg(all(test, feature = "conformance"))]
    pub(crate) fn dialect(&self) -> &D {
        &self.shared.dialect
    }

    /// True while the client's state records `owner`'s grant of `name` (for the tests of
    /// other modules, which cannot see the state).
    #[cfg(all(test, feature = "conformance"))]
    pub(crate) fn records_grant(&self, name: &LockName, owner: &Owner) -> bool {
        self.shared
            .state()
            .held
            .contains_key(&HeldKey::of(name, owner))
    }
}

/// One lock connection and the keys to ask it about.
type ConnKeys<D> = (Arc<LockConn<D>>, Vec<<D as Dialect>::Key>);
/// One lock connection and the keys it answered it holds.
type ConnHolds<D> = (Arc<LockConn<D>>, HashSet<<D as Dialect>::Key>);

/// One grant a background check asks about, as the state recorded it when the check began:
/// its answer may forget or extend that grant only, never a later grant of the name.
struct Asked<D: Dialect> {
    slot: HeldKey,
    conn: Arc<LockConn<D>>,
    key: D::Key,
    token: u64,
}

impl<D: Dialect> Asked<D> {
    fn of(slot: &HeldKey, held: &Held<D>) -> Self {
        Asked {
            slot: slot.clone(),
            conn: held.conn.clone(),
            key: held.key.clone(),
            token: held.token,
        }
    }

    /// Whether `held` is this grant (not a later one of the same name).
    fn is(&self, held: &Held<D>) -> bool {
        held.token == self.token && Arc::ptr_eq(&held.conn, &self.conn)
    }
}

#[async_trait]
impl<D: Dialect> Backend for SessionBackend<D> {
    fn attempts_share_a_connection(&self) -> bool {
        true
    }

    /// A reader takes a session of its own (see `try_acquire`).
    fn readers_take_a_connection(&self) -> bool {
        D::keeps(&LockKind::Read)
    }

    fn scheme(&self) -> &'static str {
        D::SCHEME
    }

    fn supports(&self, kind: &LockKind) -> bool {
        D::keeps(kind)
    }

    async fn ping(&self) -> Result<()> {
        self.shared.dialect.ping().await
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let shared = &self.shared;
        let slot = HeldKey::of(name, owner);
        {
            let mut state = shared.state();
            if let Some(held) = state.held.get_mut(&slot) {
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
            if state.ending.contains(&slot) {
                // Its unlock on our own session is still on its way (a lease that ended, or
                // an unlock being tried again): a grant on that session now could be undone
                // by it.
                return Ok(Acquired::Held {
                    ttl: Some(Duration::from_millis(1)),
                });
            }
            if !state.pending.insert(slot.clone()) {
                // Another owner of this client is asking right now.
                return Ok(Acquired::Held {
                    ttl: Some(Duration::from_millis(1)),
                });
            }
        }
        let key = D::key(name);
        // A reader's or writer's lock takes a session of its own: a session never conflicts
        // with itself, so a reader and a writer (or a mutex) of one name on one session would
        // both be granted; so does every lock where a session holds one at most
        // (`Dialect::ONE_LOCK_PER_SESSION`). An exclusive lock takes an idle connection when one is kept (a
        // failed try leaves it for the waiter that follows), else the primary: a client whose
        // tries and waits take turns keeps one lock connection.
        let own_session = D::ONE_LOCK_PER_SESSION || !name.kind().is_exclusive();
        let idle = if own_session {
            None
        } else {
            shared.take_idle()
        };
        let outcome = match idle {
            Some(idle) => shared.try_on_idle(name, &key, idle).await,
            None => shared.try_on_connection(name, &key, own_session).await,
        };
        // The reservation ends and a grant is recorded under one lock of the state, so that no
        // other owner of this client sees the name neither reserved nor held.
        let (token, refused_on) = {
            let mut state = shared.state();
            state.pending.remove(&slot);
            let (conn, token) = outcome?;
            match token {
                Some(token) => {
                    state.held.insert(
                        slot,
                        Held {
                            owner: owner.clone(),
                            holds: 1,
                            token,
                            key,
                            conn,
                            expires_at: Instant::now() + lease,
                        },
                    );
                    (token, None)
                }
                None => (0, Some(conn)),
            }
        };
        if let Some(conn) = refused_on {
            // A connection other than the primary holds nothing now: it goes idle, for the
            // waiter that usually follows.
            shared.after_unlock(conn).await;
            return Ok(Acquired::Held { ttl: None });
        }
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
        Ok(Box::new(SessionWaiter {
            shared: self.shared.clone(),
            name: name.clone(),
            owner: owner.clone(),
            lease,
            pending: None,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let shared = &self.shared;
        let slot = HeldKey::of(name, owner);
        let taken = {
            let mut state = shared.state();
            match state.held.get_mut(&slot) {
                Some(held) if &held.owner == owner => {
                    if held.holds > 1 {
                        held.holds -= 1;
                        return Ok(Released::Released {
                            remaining_holds: held.holds,
                        });
                    }
                    // Marked as ending until the unlock is done: no other owner of this
                    // client asks for it on the same session meanwhile.
                    state.ending.mark(&slot);
                    state.held.remove(&slot)
                }
                Some(_) => return Ok(Released::HeldByOther),
                None => None,
            }
        };
        let Some(held) = taken else {
            if shared.lease_ending(&slot) {
                // Its lease ended, or its release is on its way: being unlocked.
                return Ok(Released::NotHeld);
            }
            // A reader's hold is its own: other readers holding do not make it another's.
            let other = !matches!(name.kind(), LockKind::Read) && shared.is_locked(name).await?;
            return Ok(if other {
                Released::HeldByOther
            } else {
                Released::NotHeld
            });
        };
        // Until the unlock has answered, or the failed one was settled, the guard holds it:
        // a release dropped meanwhile hands it to the reaper.
        let mut unlocking = Unlocking {
            shared,
            slot: slot.clone(),
            in_flight: Some((held.conn.clone(), held.key.clone())),
            settled: false,
        };
        let unlocked = shared.unlock(&held.conn, &held.key).await;
        if let Err(error) = &unlocked {
            // It may still hold it: unlocked again in the background, or closed.
            tracing::warn!(%error, "unlocking failed; unlocking again in the background");
            // The guard's handle is one of the queued unlock's own.
            let kept = shared
                .unlock_failed(held.conn, held.key, Some(slot), 1)
                .await;
            unlocking.settled = true;
            if kept {
                shared.reaper.notify_one();
            }
            return Ok(Released::NotHeld);
        }
        unlocking.in_flight = None;
        drop(unlocking);
        shared.after_unlock(held.conn).await;
        Ok(match unlocked {
            Ok(true) => Released::Released { remaining_holds: 0 },
            // The session lost it (terminated, or its connection broke).
            Ok(false) | Err(_) => Released::NotHeld,
        })
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let shared = &self.shared;
        let start = Instant::now();
        let slot = HeldKey::of(name, owner);
        let superseded = shared
            .state()
            .held
            .get(&slot)
            .is_some_and(|held| &held.owner == owner && held.token != fencing_token);
        if superseded {
            // The owner holds a later grant of the name: this extension's grant is gone.
            return Ok(Extended::NotHeld);
        }
        if let Some(token) = shared.alive(name, owner).await?
            && token == fencing_token
        {
            // Only the grant the server was asked about: if its lease ended meanwhile (it is
            // being unlocked) or it was released, the extension is refused.
            let extended = match shared.state().held.get_mut(&slot) {
                Some(held) if &held.owner == owner && held.token == token => {
                    held.expires_at = start + lease;
                    true
                }
                _ => false,
            };
            if extended {
                shared.reaper.notify_one();
                return Ok(Extended::Extended);
            }
        }
        if shared.lease_ending(&slot) {
            return Ok(Extended::NotHeld);
        }
        let other = !matches!(name.kind(), LockKind::Read)
            && (shared.state().held.contains_key(&slot) || shared.is_locked(name).await?);
        Ok(if other {
            Extended::HeldByOther
        } else {
            Extended::NotHeld
        })
    }

    /// Renews the grants `locks` are about (by their tokens). A lock released and granted
    /// again before or while the renewal is in flight keeps its new grant (with the lease it
    /// was granted): the answer, false, is about the earlier grant only.
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let start = Instant::now();
        let keys: Vec<(LockName, Owner)> = locks.iter().map(|r| r.lock.clone()).collect();
        let grants: Vec<Option<Asked<D>>> = shared
            .grants_of(&keys)
            .into_iter()
            .zip(locks)
            .map(|(grant, r)| grant.filter(|grant| grant.token == r.fencing_token))
            .collect();
        let answers = shared.ask_connections(&grants).await;
        let mut state = shared.state();
        Ok(keys
            .iter()
            .zip(grants.iter().zip(answers))
            .map(|((name, owner), (asked, answer))| {
                let slot = HeldKey::of(name, owner);
                let Some(held) = state.held.get_mut(&slot).filter(|h| &h.owner == owner) else {
                    return false;
                };
                let Some(asked) = asked.as_ref().filter(|asked| asked.is(held)) else {
                    // Not the grant the renewal is about (that one is gone): the later
                    // grant is left alone, and the answer about the earlier one is no.
                    return false;
                };
                if answer == Some(true) {
                    held.expires_at = start + lease;
                    return true;
                }
                state.held.remove(&asked.slot);
                false
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
            .get(&HeldKey::of(name, owner))
            .filter(|held| &held.owner == owner)
            .map_or(0, |held| held.holds))
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.shared.dialect.list_held(prefix, limit).await
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.shared.dialect.publish(key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        self.shared.dialect.read_published(key).await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.shared.dialect.withdraw(key, term).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.shared.status.subscribe())
    }

    /// Which grants of `locks` the server still holds: the grants as they were when the check
    /// began; one replaced meanwhile is gone.
    async fn still_held(&self, locks: &[(LockName, Owner)]) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let grants = shared.grants_of(locks);
        let answers = shared.ask_connections(&grants).await;
        let state = shared.state();
        Ok(locks
            .iter()
            .zip(grants.iter().zip(answers))
            .map(|((name, owner), (asked, answer))| {
                let Some(held) = state
                    .held
                    .get(&HeldKey::of(name, owner))
                    .filter(|h| &h.owner == owner)
                else {
                    return false;
                };
                // A grant other than the one asked about: the one asked about is gone.
                asked
                    .as_ref()
                    .is_some_and(|asked| asked.is(held) && answer == Some(true))
            })
            .collect())
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let shared = &self.shared;
        let freed = shared.dialect.terminate_holders(&D::key(name)).await?;
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
