//! The ZooKeeper backend: the sequential-node lock (`zk://`) and the naive single-node lock
//! (`zk+naive://`).
//!
//! # The sequential-node lock
//!
//! Each lock is a znode `BASE/NAME` (a container node, which the server removes once it is
//! empty; `BASE` is `/distlock/locks` unless the URL names another path, and `NAME` is the
//! lock name with every byte outside `A-Z a-z 0-9 - _ .` written as `%XX`). A contender
//! creates an ephemeral sequential child `_c_<uuid>-lock-<sequence>`; the child with the
//! lowest sequence number holds the lock, and every other contender watches only the child
//! just before its own. This is the layout of Apache Curator's `InterProcessMutex`, so a Java
//! service using Curator on the path `BASE/NAME` and a Rust service using distlock on `NAME`
//! exclude each other.
//!
//! * **No herd.** A release deletes one node and wakes one waiter: the next in line. A
//!   grant after waiting marks the holder's node, which wakes that waiter once more to look
//!   while the lock is held, so that the release alone grants it (one write and one
//!   notification per handoff).
//! * **Fair.** Waiters are served in the order their nodes were created.
//! * **Crash safety.** The nodes are ephemeral: when a holder's process dies, its session
//!   ends after the session timeout (`?session_timeout=`, 10 s by default) and the server
//!   deletes its nodes.
//! * **Fencing token:** the creation zxid of the holder's node. zxids grow with every write
//!   to the ensemble, across leader elections, so every grant's token is larger than the
//!   last.
//! * **Lost replies.** The `_c_<uuid>-` prefix is unique to one create: when a create's reply
//!   is lost with the connection, the client reconnects, finds its node by the prefix and uses
//!   it, so no orphan node blocks the queue.
//!
//! # Identities
//!
//! With user info (`zk://app:PASSWORD@host/app/locks`) every session authenticates as the
//! `digest` identity `app`, and every node the client makes gives all rights to that
//! identity alone, so no other identity can queue for, delete or force-unlock its locks; a
//! base path another identity made answers [`Error::NotAuthorized`] at connect. Without user
//! info the nodes are open to every client, as Curator makes them by default.
//!
//! # Leases and sessions
//!
//! ZooKeeper has no lease: a node lives as long as the session that made it. distlock keeps
//! its API's leases in the client that holds the lock: a fixed lease
//! ([`AcquireOptions::lease`](crate::AcquireOptions::lease)) ends with the holder's client
//! deleting the node, and a renewed lock is checked (one multi-read per 1000 locks) at every
//! renewal, which notices an operator's force-unlock. A holder whose process is stopped
//! keeps its node until its session times out.
//!
//! The session is the real lease. When the connection breaks, [`Locks::session`] turns
//! [`SessionState::Suspended`]: the locks may still be held.
//! When the session expires, or the client stays disconnected for half a session timeout (the
//! server may expire it a little later), every lock of the session is reported lost through
//! [`Guard::lost`](crate::Guard::lost), and the client opens a new session. A connection that
//! looks fine is not trusted alone: while the session holds or queues anything, it asks the
//! leader to confirm it (a `sync` and a read of one of its nodes) every sixth of a session
//! timeout, and half a session timeout without a confirmation loses it the same way.
//!
//! # The naive lock
//!
//! `zk+naive://` is kept as the measured contrast to the herd effect: every contender
//! tries to create the one ephemeral node `BASE/NAME` (`BASE` is `/distlock/naive` by
//! default) and every waiter watches it, so each release wakes every waiter and all but one
//! go back to waiting. It is unfair and kept for measurement; use `zk://`.
//! `distlock bench` counts the watch events its processes receive, which shows the
//! difference.
//!
//! [`Locks::session`]: crate::Locks::session

mod acquire;
mod background;
#[cfg(feature = "bench")]
mod bare;
mod list;
mod nodes;
mod published;
mod recipes;
mod session;
mod state;
pub(crate) mod url;
mod waiter;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, SessionState,
    SessionStatus, Woken,
};
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};
use crate::queue::Node;

use self::background::{Probe, supervise};
use self::recipes::queue;
use self::url::ZkUrl;
pub use self::url::lock_path;
use self::waiter::{NaiveWaiter, SequentialWaiter};
#[cfg(feature = "bench")]
pub(crate) use self::waiter::{watch_grants, watch_notifications};

/// Curator's protected-node prefix.
const PROTECTED: &str = "_c_";
/// How often one request retries after a lost connection or a vanished parent.
const ATTEMPTS: usize = 5;

fn child_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn token_of(stat: &zk::Stat) -> u64 {
    // zxids are positive (epoch << 32 | counter).
    u64::try_from(stat.czxid).unwrap_or(0)
}

/// Locks in ZooKeeper. Made by [`connect`](crate::connect) with a `zk://` or `zk+naive://`
/// URL; see the [module docs](self).
#[derive(Clone)]
pub struct ZooKeeperBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("cluster", &self.shared.url.cluster)
            .field("base", &self.shared.url.base)
            .field("naive", &self.shared.url.naive)
            .finish_non_exhaustive()
    }
}

struct Shared {
    scheme: &'static str,
    url: ZkUrl,
    current: StdMutex<Arc<Session>>,
    status: watch::Sender<SessionStatus>,
    state: StdMutex<State>,
    reaper: Arc<Notify>,
}

/// One ZooKeeper session. Dropping the last handle closes it, and the server deletes its
/// nodes.
struct Session {
    client: zk::Client,
    generation: u64,
}

/// The client-side queue state ([`crate::queue`]). ZooKeeper keeps nothing of its own beside
/// a hold; an orphan carries its [`PrefixLookups`].
type State = crate::queue::QueueState<(), PrefixLookups>;
type Orphan = crate::queue::Orphan<PrefixLookups>;

/// `Some(n)`: the orphan's key is the protected prefix of a create whose outcome is unknown
/// (its reply was lost and the lookup failed): the node to delete is the one starting with
/// it, if any, and `n` is how many more lookups a node not found yet gets. `None`: the key
/// is the node's path.
type PrefixLookups = Option<u8>;

impl ZooKeeperBackend {
    /// Connects to the ensemble a `zk://` or `zk+naive://` URL names, as the URL's digest
    /// identity when it has user info, and makes the base path.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::NotAuthorized`] when the base
    /// path belongs to another identity (or the password is not the identity's);
    /// [`Error::Backend`] when no server answers or the base path cannot be made.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = ZkUrl::parse(url)?;
        let scheme = if url.naive { "zk+naive" } else { "zk" };
        let client = url
            .connector()
            .with_fail_eagerly()
            .connect(&url.cluster)
            .await
            .map_err(|e| zk_error(scheme, "connect", e))?;
        client
            .mkdir(&url.base, &url.node(zk::CreateMode::Persistent))
            .await
            .map_err(|e| zk_error(scheme, "create the base path", e))?;
        url.check_base(scheme, &client).await?;
        let watcher = client.state_watcher();
        let shared = Arc::new(Shared {
            scheme,
            url,
            current: StdMutex::new(Arc::new(Session {
                client,
                generation: 0,
            })),
            status: watch::channel(SessionStatus {
                state: SessionState::Connected,
                sessions_lost: 0,
            })
            .0,
            state: StdMutex::new(State::default()),
            reaper: Arc::new(Notify::new()),
        });
        tokio::spawn(supervise(Arc::downgrade(&shared), watcher));
        crate::reaper::spawn(&shared, &shared.reaper);
        Ok(ZooKeeperBackend { shared })
    }

    /// Times the cheapest write: setting the (empty) data of the base node. Every grant and
    /// release is a write, which the leader logs to disk before it answers, so this is the
    /// floor under their cost, as [`Backend::ping`] (a read) is under a query's.
    /// Measured through the driver's `write_round_trips` ([`crate::hooks::write_round_trips`]).
    ///
    /// # Errors
    /// [`Error::Backend`] when the write fails.
    #[cfg(feature = "bench")]
    pub(crate) async fn write_round_trip(&self) -> Result<Duration> {
        let shared = &self.shared;
        let session = shared.session();
        let start = std::time::Instant::now();
        session
            .client
            .set_data(&shared.url.base, &[], None)
            .await
            .map_err(|e| shared.err("write", e))?;
        Ok(start.elapsed())
    }

    /// The znode path of lock `name`.
    pub fn lock_path(&self, name: &str) -> String {
        lock_path(&self.shared.url.base, name)
    }
}

/// The error of a ZooKeeper request: [`Error::NotAuthorized`] when the server refused the
/// session's identity, else [`Error::Backend`].
pub(crate) fn zk_error(scheme: &'static str, operation: &'static str, error: zk::Error) -> Error {
    let reason = match error {
        zk::Error::NoAuth => {
            "the node belongs to another ZooKeeper identity (NoAuth); connect as the user that \
             made the URL's base path (zk://user:password@host/base) or use a base path of your \
             own"
        }
        zk::Error::AuthFailed => {
            "ZooKeeper refused the session's credentials (AuthFailed); check the URL's user and \
             password"
        }
        error => return Error::backend(scheme, operation, error),
    };
    Error::not_authorized(scheme, operation, reason)
}

fn state_error(state: zk::SessionState) -> zk::Error {
    match state {
        zk::SessionState::Expired => zk::Error::SessionExpired,
        zk::SessionState::AuthFailed => zk::Error::AuthFailed,
        zk::SessionState::Closed => zk::Error::ClientClosed,
        _ => zk::Error::ConnectionLoss,
    }
}

/// Checks a `zk://` or `zk+naive://` URL without connecting.
///
/// # Errors
/// [`Error::InvalidInput`] saying what is wrong.
pub(crate) fn check_url(url: &str) -> Result<()> {
    url::ZkUrl::parse(url).map(drop)
}

/// Connects to the ensemble a `zk://` or `zk+naive://` URL names; see
/// [`ZooKeeperBackend::connect`].
///
/// # Errors
/// As [`ZooKeeperBackend::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(ZooKeeperBackend::connect(url).await?))
}

/// Write round trips for the driver: a `setData` on the base node, the unit of a ZooKeeper
/// handoff.
#[cfg(feature = "bench")]
async fn write_round_trips(url: &str, samples: u64) -> Result<Vec<Duration>> {
    let backend = ZooKeeperBackend::connect(url).await?;
    crate::driver::sampled(samples, || backend.write_round_trip()).await
}

crate::driver::driver!(
    check_url: check_url,
    open: connect,
    bare: bare::open,
    write_round_trips: write_round_trips,
);

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn scheme(&self) -> &'static str {
        self.shared.scheme
    }

    async fn ping(&self) -> Result<()> {
        let shared = &self.shared;
        let session = shared.session();
        session
            .client
            .check_stat(&shared.url.base)
            .await
            .map(drop)
            .map_err(|e| shared.err("ping", e))
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        if self.shared.url.naive {
            self.shared.try_acquire_naive(name, owner, lease).await
        } else {
            self.shared.try_acquire_sequential(name, owner, lease).await
        }
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let shared = self.shared.clone();
        let status = shared.status.subscribe();
        let path = lock_path(&shared.url.base, name.as_str());
        if shared.url.naive {
            return Ok(Box::new(NaiveWaiter {
                shared,
                path,
                status,
            }));
        }
        Ok(Box::new(SequentialWaiter {
            place: crate::queue::Place::join(shared, name, owner, lease),
            lock: path,
            status,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let shared = &self.shared;
        let session = shared.session();
        let key = (name.clone(), owner.clone());
        let Some((path, token)) = shared
            .state()
            .held(&key)
            .map(|held| (held.key.clone(), held.token))
        else {
            if shared.state().lease_ending(&key) {
                // Its lease ended; the reaper is deleting its node.
                return Ok(Released::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.0);
        };
        let naive_token = shared.url.naive.then_some(token);
        // Decided and counted under one lock: two releases of one owner's holds at once must
        // take one hold each, and exactly one of them deletes the node.
        let remaining = {
            let mut state = shared.state();
            match state.held.get_mut(&key) {
                Some(held) if held.key == path && held.holds > 1 => {
                    held.holds -= 1;
                    Some(held.holds)
                }
                Some(held) if held.key == path => {
                    state.held.remove(&key);
                    None
                }
                _ => return Ok(Released::NotHeld),
            }
        };
        if let Some(remaining_holds) = remaining {
            // One hold of several: the node stays; tell whether it is still there.
            if shared.exists(&session, &path, token).await? {
                return Ok(Released::Released { remaining_holds });
            }
            let mut state = shared.state();
            if state.held.get(&key).is_some_and(|held| held.key == path) {
                state.held.remove(&key);
            }
            return Ok(Released::NotHeld);
        }
        match shared.delete_node(&session, &path, naive_token).await {
            Ok(true) => Ok(Released::Released { remaining_holds: 0 }),
            Ok(false) => Ok(Released::NotHeld),
            Err(error) => {
                // Keep trying in the background, or the lock stays taken until the session
                // ends.
                shared.orphan(path, naive_token, session.generation);
                Err(error)
            }
        }
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let shared = &self.shared;
        let session = shared.session();
        let key = (name.clone(), owner.clone());
        let Some((path, token)) = shared
            .state()
            .held(&key)
            .filter(|held| held.token == fencing_token)
            .map(|held| (held.key.clone(), held.token))
        else {
            if shared.state().lease_ending(&key) {
                return Ok(Extended::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.1);
        };
        let start = Instant::now();
        let alive = shared.exists(&session, &path, token).await?;
        let mut state = shared.state();
        // The path and the token: in naive mode every grant of a name has the same path.
        let extended = match state.held.get_mut(&key) {
            Some(held) if held.key == path && held.token == token && alive => {
                held.expires_at = start + lease;
                Extended::Extended
            }
            Some(held) if held.key == path && held.token == token => {
                state.held.remove(&key);
                Extended::NotHeld
            }
            _ => Extended::NotHeld,
        };
        drop(state);
        shared.reaper.notify_one();
        Ok(extended)
    }

    /// Reads the nodes of the grants asked about (a grant with another token is not asked
    /// about: a later grant of the name), and renews or forgets those grants only.
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let session = shared.session();
        let keys: Vec<(LockName, Owner)> = locks.iter().map(|r| r.lock.clone()).collect();
        let nodes: Vec<Option<(Arc<str>, u64)>> = shared
            .held_nodes(&keys)
            .into_iter()
            .zip(locks)
            .map(|(node, r)| node.filter(|(_, token)| *token == r.fencing_token))
            .collect();
        let start = Instant::now();
        let alive = shared.read_many(&session, &nodes).await?;
        let mut state = shared.state();
        for ((key, node), alive) in keys.iter().zip(&nodes).zip(&alive) {
            let Some((path, token)) = node else { continue };
            // The path and the token: in naive mode every grant of a name has the same path.
            match state.held.get_mut(key) {
                Some(held) if &held.key == path && held.token == *token && *alive => {
                    held.expires_at = start + lease;
                }
                Some(held) if &held.key == path && held.token == *token => {
                    state.held.remove(key);
                }
                _ => {}
            }
        }
        Ok(alive)
    }

    async fn still_held(&self, locks: &[(LockName, Owner)]) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let session = shared.session();
        let nodes = shared.held_nodes(locks);
        shared.read_many(&session, &nodes).await
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        self.shared.is_locked(name).await
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let shared = &self.shared;
        let session = shared.session();
        let Some((path, token, holds)) = shared
            .state()
            .held(&(name.clone(), owner.clone()))
            .map(|held| (held.key.clone(), held.token, held.holds))
        else {
            return Ok(0);
        };
        Ok(if shared.exists(&session, &path, token).await? {
            holds
        } else {
            0
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        self.shared.force_unlock(name).await
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.shared.publish_record(key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        match key.kind() {
            LockKind::Leader(_) if self.supports(key.kind()) => self.shared.read_leader(key).await,
            _ => self.shared.read_record(key).await,
        }
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.shared.withdraw_record(key, term).await
    }

    /// The base path's children read once, then the nodes of the names under the prefix
    /// looked into in byte order, 64 at once, until `limit` hold a lock (at most 100,000 of
    /// them); see `zookeeper/list.rs`. A lock whose node has contenders has a holder: the first
    /// of them.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.shared.list_held(prefix, limit).await
    }

    fn queues_on_subscribe(&self) -> bool {
        !self.shared.url.naive
    }

    fn supports(&self, kind: &LockKind) -> bool {
        match kind {
            LockKind::Exclusive => true,
            kind => !self.shared.url.naive && recipes::keeps(kind),
        }
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.shared.status.subscribe())
    }
}
