//! The contract between the lock primitives and a backend.
//!
//! Users do not call this trait; they use [`Locks`](crate::Locks) and
//! [`Mutex`](crate::Mutex). It is public so that a backend can live outside this crate:
//! implement [`Backend`] and hand it to [`Locks::with_backend`](crate::Locks::with_backend).
//!
//! Every method is one request (or one atomic transaction) against the backend's server. The
//! primitives build waiting, renewal, loss detection, cancel safety and tracing on top, so a
//! backend only answers questions about the lock's state.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::Result;
use crate::name::{LockKind, LockName};

/// One grant a renewal is about ([`Backend::renew`]): the lock, its owner, and the fencing
/// token of the grant, so that a backend renews that grant and no later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewing {
    /// The lock's name and the owner holding it.
    pub lock: (LockName, Owner),
    /// The fencing token of the grant being renewed.
    pub fencing_token: u64,
}

/// Who holds a lock: the id of a client ([`Locks`](crate::Locks)) and a holder id that the
/// client hands out to each [`Mutex`](crate::Mutex) handle.
///
/// Ownership never depends on the OS thread: a task that moves between threads keeps its
/// ownership. Backends store it as the string [`Owner::as_str`], `<client>:<holder>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    pub(crate) fn new(client_id: &str, holder: u64) -> Self {
        Owner(format!("{client_id}:{holder}").into())
    }

    /// The owner as stored by backends: `<client id>:<holder id>`, the client id being
    /// `HOST/PID/UUID` ([`Locks::client_id`](crate::Locks::client_id)).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The answer to an acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The owner now holds the lock.
    Granted {
        /// Strictly greater than every token granted before for this name. A reentrant
        /// acquisition returns the token of the grant it re-enters.
        fencing_token: u64,
        /// The owner's hold count after this acquisition (1 for a fresh grant).
        holds: u32,
    },
    /// Someone else holds the lock, or (in a fair backend) it is free but reserved for a
    /// waiter queued earlier.
    Held {
        /// How long the current holder's lease still runs, when the backend knows it. A waiter
        /// retries at the latest when it runs out; `None` leaves the timing to the waiter.
        ttl: Option<Duration>,
    },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// One hold was released; the lock is free when `remaining_holds` is 0.
    Released {
        /// The owner's holds left after this release.
        remaining_holds: u32,
    },
    /// Nobody holds the lock (the lease ran out or it was force-unlocked). Nothing changed.
    NotHeld,
    /// Another owner holds the lock. Nothing changed.
    HeldByOther,
}

/// The answer to an extension of one lock's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The lease now ends the requested time after the request.
    Extended,
    /// Nobody holds the lock. Nothing changed.
    NotHeld,
    /// Another owner holds the lock. Nothing changed.
    HeldByOther,
}

/// A storage or coordination service that keeps locks.
///
/// Implementations must make each method atomic with respect to every other client of the
/// same server, and must never let an owner's request change a lock another owner holds.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// The URL scheme that names this backend (`"sqlite"`, `"memory"`, ...).
    fn scheme(&self) -> &'static str;

    /// The backend's cheapest request through the same client. Benchmarks use its
    /// round-trip time as the baseline.
    async fn ping(&self) -> Result<()>;

    /// Tries once to grant `name` to `owner` for `lease`. A lock the owner already holds is
    /// re-entered: its hold count grows and its lease is not shortened.
    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired>;

    /// Starts listening for releases of `name` on behalf of `owner`, before the attempt that
    /// may fail, so that no release between that attempt and the wait is missed. A fair
    /// backend also queues `owner` here; dropping the waiter leaves the queue. `lease` is the
    /// lease the caller asks for, for a backend that hands the lock to its next waiter.
    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>>;

    /// Releases one of `owner`'s holds on `name`.
    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released>;

    /// Sets the lease of the grant of `name` to `owner` with `fencing_token` to end `lease`
    /// from now. [`Extended::NotHeld`] when the owner holds no grant of `name` with that token
    /// (a later grant of the name to the same owner is another grant, left alone).
    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended>;

    /// Renews many grants at once (the watchdog). `true` at index `i` when the grant
    /// `locks[i]` is about (its name, owner and fencing token) was still held and its lease
    /// now ends `lease` from now. A later grant of the name to the same owner (the earlier
    /// one released and the name taken again while the renewal was on its way) is another
    /// grant: it is neither renewed nor shortened nor forgotten, and its index answers as the
    /// backend likes (the keeper ignores answers about grants it no longer holds).
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>>;

    /// True when anyone holds `name`.
    async fn is_locked(&self, name: &LockName) -> Result<bool>;

    /// How many holds `owner` has on `name` (0 when it does not hold it).
    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32>;

    /// Frees `name` whoever holds it (an operator's tool). True when it was held.
    async fn force_unlock(&self, name: &LockName) -> Result<bool>;

    /// Stores `record` as the published record of `key` (an election's leader) unless the
    /// record stored there has a larger term; returns the record stored afterwards, so that the
    /// caller learns whether a newer term won. Atomic per key. A withdrawn record
    /// ([`Published::is_withdrawn`]) keeps its term, so a record of an older term stays refused
    /// after the newer one resigned. Published records live in a namespace of their own, apart
    /// from every lock's keys.
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published>;

    /// The record published under `key`; `None` when none was, or when it was withdrawn.
    ///
    /// For a `key` of kind [`LockKind::Leader`] (on a backend that keeps that kind) the record
    /// is the first candidate in line of that lock, whoever made it: its token as the term,
    /// its stored value, and its node or key as the holder; `None` when nobody is in line.
    async fn read_published(&self, key: &LockName) -> Result<Option<Published>>;

    /// Withdraws the record of `key` if its term is `term`: it reads as `None` from then on,
    /// and its term still refuses older ones. True when that record was there.
    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool>;

    /// The names of the locks held now that start with `prefix`, in byte order, at most
    /// `limit` of them (an operator's tool: `distlock list`; changes nothing). A name is
    /// listed once whatever kinds of it are held (a reader and a writer of one name are one
    /// name), with the primitives' own names (`NAME#permits`, `NAME#leader`...) as they are.
    /// Names held at the moment of the answer: a lock whose lease ran out on the server is not
    /// listed, one granted meanwhile may be missing.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>>;

    /// What the backend can tell about `name`, changing nothing (an operator's tool: `distlock
    /// status`). The default knows only whether it is held ([`Backend::is_locked`]).
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        Ok(LockInfo::new(self.is_locked(name).await?))
    }

    /// True when the backend keeps locks of `kind` in its own layout (names of that
    /// [`LockName::kind`] then reach every method). Every backend keeps
    /// [`LockKind::Exclusive`]; the primitives build the other kinds on it where a backend
    /// does not keep them. No default: a backend that wraps another must forward it, or its
    /// clients would use another layout than the wrapped backend's on the same names.
    fn supports(&self, kind: &LockKind) -> bool;

    /// True when [`Backend::subscribe`] is the first step of an acquisition that may wait:
    /// the waiter is a place in a queue that the following [`Backend::try_acquire`] of the
    /// same owner takes up and checks (the ZooKeeper recipe). The acquire loop then
    /// subscribes before its first attempt, so that a waiting acquisition joins the queue
    /// once instead of trying, leaving and joining again. Default: false.
    fn queues_on_subscribe(&self) -> bool {
        false
    }

    /// True when a [`Backend::try_acquire`] that fails gives back whatever it may have taken
    /// by itself, exactly (the Redlock marks each master's hold with the attempt's id and
    /// takes back that hold, in the background on masters that do not answer yet). The client
    /// then does not settle the failed attempt (ask how many holds the owner has and release
    /// the extra ones): a settle's release takes *a* hold of the owner, so that the give-back
    /// would take a second one. Default: false.
    fn undoes_failed_attempts(&self) -> bool {
        false
    }

    /// True when a try that finds a lock busy holds up the client's other requests, because
    /// its attempts queue on server connections it shares (every PostgreSQL and MySQL mode:
    /// the session locks' primary connection, the table modes' pool): a caller that could try
    /// several locks then tries few ([`SegmentedStock`](crate::stock::SegmentedStock)). A
    /// backend that wraps another forwards it. Default: false.
    fn attempts_share_a_connection(&self) -> bool {
        false
    }

    /// True when each reader of a reader-writer lock kept in the backend's own layout holds
    /// a server connection of its own (PostgreSQL's shared advisory locks): the readers
    /// holding at once are then bounded by the connections the server (or the pooler in
    /// front of it) allows. A backend that wraps another forwards it. Default: false.
    fn readers_take_a_connection(&self) -> bool {
        false
    }

    /// Which of `locks` their owners still hold, changing nothing. The client asks after the
    /// backend reported a lost session ([`Backend::session`]). The default asks
    /// [`Backend::holds`] once per lock.
    async fn still_held(&self, locks: &[(LockName, Owner)]) -> Result<Vec<bool>> {
        let mut held = Vec::with_capacity(locks.len());
        for (name, owner) in locks {
            held.push(self.holds(name, owner).await? > 0);
        }
        Ok(held)
    }

    /// The state of the session the backend's locks live in, for a backend whose locks end
    /// with a session (ZooKeeper). `None` (the default): locks live by their leases alone.
    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        None
    }
}

/// What a backend can tell about one lock, for operators ([`Locks::inspect`](crate::Locks::inspect),
/// `distlock status`). A field the backend cannot tell is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// Held by anyone now.
    pub locked: bool,
    /// The owner holding it, as backends store it (`<client id>:<holder id>`).
    pub holder: Option<String>,
    /// How many holds that owner has (reentrancy).
    pub holds: Option<u32>,
    /// The fencing token of the grant.
    pub fencing_token: Option<u64>,
    /// How long its lease still runs, by the server's (or the store's) clock.
    pub remaining_lease: Option<Duration>,
    /// How many waiters are queued for it (backends that keep a queue).
    pub waiters: Option<u64>,
}

impl LockInfo {
    /// Held or free, and nothing else known.
    pub fn new(locked: bool) -> Self {
        LockInfo {
            locked,
            ..LockInfo::default()
        }
    }
}

/// [`Published::MAX_VALUE`].
pub(crate) const MAX_PUBLISHED_VALUE: usize = 4096;

/// A record published under a key ([`Backend::publish`]): who leads an election, with which
/// term, and the value the leader published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The leadership's term: the fencing token of the grant of the election's lock.
    pub term: u64,
    /// What the leader published (at most [`Published::MAX_VALUE`] bytes).
    pub value: String,
    /// The owner holding the election's lock, as backends store it; empty when withdrawn.
    pub holder: String,
}

impl Published {
    /// The most bytes a published value may have.
    pub const MAX_VALUE: usize = MAX_PUBLISHED_VALUE;

    /// A record of `term`, published by `holder`.
    pub fn new(term: u64, value: impl Into<String>, holder: impl Into<String>) -> Self {
        Published {
            term,
            value: value.into(),
            holder: holder.into(),
        }
    }

    /// What a withdrawn record of `term` is stored as: its term, no value, no holder.
    pub fn withdrawn(term: u64) -> Self {
        Published::new(term, "", "")
    }

    /// True for a withdrawn record (it has no holder).
    pub fn is_withdrawn(&self) -> bool {
        self.holder.is_empty()
    }

    /// The record as bytes, for stores that keep one blob per key (ZooKeeper, etcd):
    /// `<term>\n<holder>\n<value>`. Holders have no newline; the value is the rest.
    #[cfg(any(feature = "zookeeper", feature = "etcd"))]
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!("{}\n{}\n{}", self.term, self.holder, self.value).into_bytes()
    }

    /// The record [`Published::encode`] wrote; `None` for anything else.
    #[cfg(any(feature = "zookeeper", feature = "etcd"))]
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.splitn(3, '\n');
        let term = parts.next()?.parse().ok()?;
        let holder = parts.next()?;
        let value = parts.next()?;
        Some(Published::new(term, value, holder))
    }

    /// The record that stands after `self` met the stored one: the stored one when its term is
    /// larger, else `self`.
    pub(crate) fn winner(self, stored: Option<Published>) -> Published {
        match stored {
            Some(stored) if stored.term > self.term => stored,
            _ => self,
        }
    }

    /// `Some` unless withdrawn.
    pub(crate) fn live(self) -> Option<Published> {
        (!self.is_withdrawn()).then_some(self)
    }
}

/// The state of a backend's session, from [`Locks::session`](crate::Locks::session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStatus {
    /// Connected or not, now.
    pub state: SessionState,
    /// How many sessions this client has lost so far. Each lost session lost every lock it
    /// held; their guards' [`Guard::lost`](crate::Guard::lost) fire.
    pub sessions_lost: u64,
}

/// Whether a session-based backend is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// Connected: the session is alive and every lock not reported lost is held.
    Connected,
    /// The connection is broken and the client is trying to reconnect. The session may be
    /// alive (the locks are still held) or may be expiring on the server. A holder should stop
    /// changing what the lock protects unless its writes carry the fencing token, and wait for
    /// [`SessionState::Connected`] or for the guard's [`Guard::lost`](crate::Guard::lost).
    Suspended,
}

/// Waits for a release of one lock name. Made by [`Backend::subscribe`]; dropping it
/// unsubscribes.
#[async_trait]
pub trait ReleaseWaiter: Send {
    /// Returns when the lock may have been released since the subscription or the previous
    /// wait, or when `max` has passed: [`Woken::Retry`], and the caller tries again (spurious
    /// returns are allowed). A backend that hands a released lock straight to its next waiter
    /// returns [`Woken::Granted`] instead: the waiter holds the lock (one hold) and must not
    /// ask again. Dropping a waiter that was handed the lock but did not return it gives the
    /// lock back.
    async fn wait(&mut self, max: Duration) -> Woken;

    /// Leaves the queue now, when the caller gives up waiting: what dropping the waiter does
    /// in the background, done before the caller answers, so that its next attempt (or
    /// another owner's) is not refused by a queue entry still on its way out. Best effort:
    /// what fails here (or takes longer than the second the acquire loop gives it) is still
    /// left to the drop. The default does nothing, for waiters that keep no entry on the
    /// server.
    async fn leave(&mut self) {}
}

/// What ended a [`ReleaseWaiter::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Woken {
    /// The lock may be free: try to acquire it again.
    Retry,
    /// The lock was handed to this waiter.
    Granted {
        /// The grant's fencing token.
        fencing_token: u64,
        /// A moment no later than the grant.
        since: tokio::time::Instant,
        /// The lease the handover granted, from `since` at the latest; usually shorter than
        /// the lease the waiter asked for, which the caller then sets with
        /// [`Backend::extend`] (so that a waiter that died while queued blocks the lock only
        /// briefly).
        lease: Duration,
    },
}
