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
//! * **No herd.** A release deletes one node and wakes one waiter: the next in line.
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
//! [`Guard::lost`](crate::Guard::lost), and the client opens a new session.
//!
//! # The naive lock
//!
//! `zk+naive://` is kept as the measured contrast to the herd effect: every contender
//! tries to create the one ephemeral node `BASE/NAME` (`BASE` is `/distlock/naive` by
//! default) and every waiter watches it, so each release wakes every waiter and all but one
//! go back to waiting. It is unfair and kept for measurement; use `zk://`.
//! [`watch_notifications`] counts the watch events this process received, which shows the
//! difference.
//!
//! [`Locks::session`]: crate::Locks::session

pub(crate) mod url;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::backend::{
    Acquired, Backend, Extended, Owner, ReleaseWaiter, Released, SessionState, SessionStatus, Woken,
};
use crate::error::{Error, Result};
use crate::name::LockName;

use self::url::ZkUrl;
pub use self::url::lock_path;

/// Every watch event delivered to a waiter in this process so far, for measuring the herd
/// effect: with `zk://` one per release, with `zk+naive://` one per waiter per release.
pub fn watch_notifications() -> u64 {
    WATCH_NOTIFICATIONS.load(Ordering::Relaxed)
}

static WATCH_NOTIFICATIONS: AtomicU64 = AtomicU64::new(0);

/// Curator's protected-node prefix.
const PROTECTED: &str = "_c_";
/// Curator's lock node name; the sequence number follows it.
const NODE_NAME: &str = "lock-";
/// How often one request retries after a lost connection or a vanished parent.
const ATTEMPTS: usize = 5;

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

fn ephemeral() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
}

fn container() -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all())
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// The sequence number of a lock node (`..lock-0000000042`), `None` for other children.
fn sequence_of(child: &str) -> Option<u64> {
    let at = child.rfind(NODE_NAME)?;
    child[at + NODE_NAME.len()..].parse().ok()
}

/// The lock nodes among `children`, first in line first.
fn queue(children: Vec<String>) -> Vec<String> {
    let mut nodes: Vec<(u64, String)> = children
        .into_iter()
        .filter_map(|child| sequence_of(&child).map(|seq| (seq, child)))
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, child)| child).collect()
}

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

#[derive(Default)]
struct State {
    /// The session generation now; entries of older generations are gone with their session.
    generation: u64,
    held: HashMap<(LockName, Owner), Held>,
    waiters: HashMap<u64, Queued>,
    next_waiter: u64,
    /// Nodes to delete in the background: abandoned by a waiter, left by a failed release, or
    /// at the end of their lease.
    orphans: Vec<Orphan>,
    /// Locks whose lease ended and whose nodes the reaper is deleting right now: their node
    /// may still exist, but their owner no longer holds them.
    ending: HashSet<(LockName, Owner)>,
}

struct Held {
    path: Arc<str>,
    token: u64,
    holds: u32,
    /// The end of the lease, kept by this client: the reaper deletes the node then.
    expires_at: Instant,
    generation: u64,
}

/// A waiter's place in the queue (sequential lock only).
struct Queued {
    name: LockName,
    owner: Owner,
    /// Made by the owner's next attempt; `None` until then or after the session was lost.
    node: Option<Node>,
    generation: u64,
}

#[derive(Clone)]
struct Node {
    path: Arc<str>,
    token: u64,
}

struct Orphan {
    path: Arc<str>,
    /// For the naive lock's shared path: delete only the node with this token.
    token: Option<u64>,
    generation: u64,
    /// The lock whose lease ended, when that is why the node goes (see `State::ending`).
    ended: Option<(LockName, Owner)>,
    /// `path` is the protected prefix of a create whose outcome is unknown (its reply was
    /// lost and the lookup failed): the node to delete is the one starting with it, if any.
    /// The count is how many more lookups a node not found yet gets.
    prefix_lookups: Option<u8>,
}

impl State {
    /// True while the reaper deletes the node of `key`'s ended lease and no other owner of
    /// this client holds the name yet: the server's node is not anyone's lock then.
    fn lease_ending(&self, key: &(LockName, Owner)) -> bool {
        self.ending.contains(key)
            && !self
                .held
                .keys()
                .any(|(name, owner)| name == &key.0 && owner != &key.1)
    }

    fn held(&self, key: &(LockName, Owner)) -> Option<&Held> {
        self.held
            .get(key)
            .filter(|held| held.generation == self.generation)
    }

    /// The waiter of `owner` on `name` in this session, if any.
    fn waiter_of(&self, name: &LockName, owner: &Owner) -> Option<u64> {
        self.waiters
            .iter()
            .find(|(_, queued)| {
                &queued.name == name
                    && &queued.owner == owner
                    && queued.generation == self.generation
            })
            .map(|(id, _)| *id)
    }
}

impl ZooKeeperBackend {
    /// Connects to the ensemble a `zk://` or `zk+naive://` URL names and makes the base path.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Backend`] when no server answers
    /// or the base path cannot be made.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = ZkUrl::parse(url)?;
        let scheme = if url.naive { "zk+naive" } else { "zk" };
        let client = zk::Client::connector()
            .with_session_timeout(url.session_timeout)
            .with_fail_eagerly()
            .connect(&url.cluster)
            .await
            .map_err(|e| Error::backend(scheme, "connect", e))?;
        client
            .mkdir(&url.base, &persistent())
            .await
            .map_err(|e| Error::backend(scheme, "create the base path", e))?;
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
        tokio::spawn(reap(Arc::downgrade(&shared), shared.reaper.clone()));
        Ok(ZooKeeperBackend { shared })
    }

    /// Times the cheapest write: setting the (empty) data of the base node. Every grant and
    /// release is a write, which the leader logs to disk before it answers, so this is the
    /// floor under their cost, as [`Backend::ping`] (a read) is under a query's.
    ///
    /// # Errors
    /// [`Error::Backend`] when the write fails.
    pub async fn write_round_trip(&self) -> Result<Duration> {
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

impl Shared {
    fn session(&self) -> Arc<Session> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update completes without a panic point: a poisoned lock is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn err(&self, operation: &'static str, error: zk::Error) -> Error {
        Error::backend(self.scheme, operation, error)
    }

    fn node_data(owner: &Owner) -> Vec<u8> {
        format!("distlock {owner}").into_bytes()
    }

    fn orphan(&self, path: Arc<str>, token: Option<u64>, generation: u64) {
        self.state().orphans.push(Orphan {
            ended: None,
            path,
            token,
            generation,
            prefix_lookups: None,
        });
        self.reaper.notify_one();
    }

    /// A create of a node starting with `prefix` may have landed although it failed: the
    /// reaper looks for that node (now and once more a little later) and deletes it, so that
    /// it cannot block the queue for the rest of the session.
    fn orphan_prefix(&self, prefix: &str, generation: u64) {
        tracing::debug!(%prefix, "a lock node create has an unknown outcome; the reaper will look for it");
        self.state().orphans.push(Orphan {
            ended: None,
            path: prefix.into(),
            token: None,
            generation,
            prefix_lookups: Some(1),
        });
        self.reaper.notify_one();
    }

    /// Waits until `session` is connected, at most a session timeout.
    async fn connected(&self, session: &Session) -> Result<()> {
        let mut watcher = session.client.state_watcher();
        let deadline = Instant::now() + session.client.session_timeout();
        loop {
            match watcher.state() {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    return Ok(());
                }
                zk::SessionState::Disconnected => {
                    if tokio::time::timeout_at(deadline, watcher.changed())
                        .await
                        .is_err()
                    {
                        return Err(self.err("reconnect", zk::Error::ConnectionLoss));
                    }
                }
                state => return Err(self.err("reconnect", state_error(state))),
            }
        }
    }

    /// Makes the lock's container node (and the base path if it vanished).
    async fn make_lock_node(&self, session: &Session, path: &str) -> Result<()> {
        for _ in 0..ATTEMPTS {
            match session.client.create(path, &[], &container()).await {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => session
                    .client
                    .mkdir(&self.url.base, &persistent())
                    .await
                    .map_err(|e| self.err("create the base path", e))?,
                Err(zk::Error::ConnectionLoss) => self.connected(session).await?,
                Err(e) => return Err(self.err("create the lock's node", e)),
            }
        }
        Err(self.err(
            "create the lock's node",
            zk::Error::UnexpectedError("it vanished after every attempt".into()),
        ))
    }

    /// Creates a protected ephemeral sequential node under `lock`. A create whose reply was
    /// lost with the connection is found again by its unique prefix.
    async fn create_node(&self, session: &Session, lock: &str, owner: &Owner) -> Result<Node> {
        let prefix = format!(
            "{lock}/{PROTECTED}{}-{NODE_NAME}",
            uuid::Uuid::new_v4().hyphenated()
        );
        let data = Self::node_data(owner);
        for _ in 0..ATTEMPTS {
            match session
                .client
                .create(&prefix, &data, &ephemeral_sequential())
                .await
            {
                Ok((stat, sequence)) => {
                    return Ok(Node {
                        path: format!("{prefix}{sequence}").into(),
                        token: token_of(&stat),
                    });
                }
                Err(zk::Error::NoNode) => self.make_lock_node(session, lock).await?,
                Err(zk::Error::ConnectionLoss) => {
                    let found = async {
                        self.connected(session).await?;
                        self.find_protected(session, lock, &prefix).await
                    }
                    .await;
                    match found {
                        Ok(Some(node)) => {
                            tracing::debug!(node = %node.path, "found the node of a create whose reply was lost");
                            return Ok(node);
                        }
                        // Not created: the next round creates it with the same prefix.
                        Ok(None) => {}
                        Err(error) => {
                            self.orphan_prefix(&prefix, session.generation);
                            return Err(error);
                        }
                    }
                }
                Err(e) => return Err(self.err("create a lock node", e)),
            }
        }
        self.orphan_prefix(&prefix, session.generation);
        Err(self.err("create a lock node", zk::Error::ConnectionLoss))
    }

    /// Deletes the node starting with the protected `prefix` (a full path prefix), if there
    /// is one; true when one was found.
    async fn delete_protected(&self, session: &Session, prefix: &str) -> Result<bool> {
        let Some((lock, _)) = prefix.rsplit_once('/') else {
            return Ok(false);
        };
        match self.find_protected(session, lock, prefix).await? {
            Some(node) => {
                tracing::debug!(node = %node.path, "deleting the node of a failed create");
                self.delete_node(session, &node.path, None).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The node whose path starts with `prefix`, if the server has it.
    async fn find_protected(
        &self,
        session: &Session,
        lock: &str,
        prefix: &str,
    ) -> Result<Option<Node>> {
        let wanted = child_name(prefix);
        // The server this session talks to now may be a follower that has not applied the
        // lost create yet: a sync first makes it catch up with the leader, so that a node
        // that exists is found (not created a second time, or left behind).
        match session.client.sync(lock).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.err("look for a lock node", e)),
        }
        let children = match session.client.list_children(lock).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err("look for a lock node", e)),
        };
        let Some(child) = children.into_iter().find(|c| c.starts_with(wanted)) else {
            return Ok(None);
        };
        let path = format!("{lock}/{child}");
        match session.client.check_stat(&path).await {
            Ok(Some(stat)) => Ok(Some(Node {
                path: path.into(),
                token: token_of(&stat),
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(self.err("look for a lock node", e)),
        }
    }

    /// The lock nodes of `lock`, first in line first; empty when the lock node is gone.
    async fn queue(&self, session: &Session, lock: &str) -> Result<Vec<String>> {
        match session.client.list_children(lock).await {
            Ok(children) => Ok(queue(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.err("list the lock's queue", e)),
        }
    }

    /// Deletes one of our nodes; `Ok(false)` when it was already gone. For the naive lock's
    /// shared path, `token` makes sure it is still the node we made.
    async fn delete_node(&self, session: &Session, path: &str, token: Option<u64>) -> Result<bool> {
        for _ in 0..ATTEMPTS {
            let version = match token {
                None => None,
                Some(token) => match session.client.check_stat(path).await {
                    Ok(Some(stat)) if token_of(&stat) == token => Some(stat.version),
                    Ok(_) => return Ok(false),
                    Err(zk::Error::ConnectionLoss) => {
                        self.connected(session).await?;
                        continue;
                    }
                    Err(e) => return Err(self.err("delete a lock node", e)),
                },
            };
            match session.client.delete(path, version).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode | zk::Error::BadVersion) => return Ok(false),
                Err(zk::Error::ConnectionLoss) => {
                    self.connected(session).await?;
                    // The delete may have been applied: the next round finds out.
                    match session.client.check_stat(path).await {
                        Ok(None) => return Ok(true),
                        Ok(Some(_)) => continue,
                        Err(e) => return Err(self.err("delete a lock node", e)),
                    }
                }
                Err(e) => return Err(self.err("delete a lock node", e)),
            }
        }
        Err(self.err("delete a lock node", zk::Error::ConnectionLoss))
    }

    /// Whether our node still exists (and, for the naive lock, is still ours).
    async fn exists(&self, session: &Session, path: &str, token: u64) -> Result<bool> {
        match session.client.check_stat(path).await {
            Ok(stat) => Ok(stat.is_some_and(|stat| token_of(&stat) == token)),
            Err(e) => Err(self.err("check a lock node", e)),
        }
    }

    /// Re-enters a lock `owner` holds. `None` when it does not hold it (any more).
    async fn reenter(
        &self,
        session: &Session,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Option<Acquired>> {
        let key = (name.clone(), owner.clone());
        let Some((path, token)) = self
            .state()
            .held(&key)
            .map(|held| (held.path.clone(), held.token))
        else {
            return Ok(None);
        };
        let alive = self.exists(session, &path, token).await?;
        let mut state = self.state();
        let generation = state.generation;
        match state.held.get_mut(&key) {
            Some(held) if held.path == path && held.generation == generation => {
                if alive {
                    held.holds += 1;
                    held.expires_at = held.expires_at.max(Instant::now() + lease);
                    Ok(Some(Acquired::Granted {
                        fencing_token: token,
                        holds: held.holds,
                    }))
                } else {
                    state.held.remove(&key);
                    Ok(None)
                }
            }
            _ => Ok(None),
        }
    }

    /// Records a grant of `node` to `owner`. False when it cannot stand: the session it was
    /// made in is gone, or the owner got the lock through another node meanwhile.
    fn record_grant(
        &self,
        name: &LockName,
        owner: &Owner,
        node: &Node,
        lease: Duration,
        generation: u64,
        waiter: Option<u64>,
    ) -> bool {
        let mut state = self.state();
        let key = (name.clone(), owner.clone());
        if generation != state.generation || state.held(&key).is_some() {
            return false;
        }
        if let Some(id) = waiter {
            match state.waiters.get(&id) {
                Some(queued) if queued.node.as_ref().is_some_and(|n| n.path == node.path) => {
                    state.waiters.remove(&id);
                }
                _ => return false,
            }
        }
        let expires_at = Instant::now() + lease;
        state.held.insert(
            key,
            Held {
                path: node.path.clone(),
                token: node.token,
                holds: 1,
                expires_at,
                generation,
            },
        );
        drop(state);
        self.reaper.notify_one();
        true
    }

    async fn try_acquire_sequential(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let session = self.session();
        if let Some(granted) = self.reenter(&session, name, owner, lease).await? {
            return Ok(granted);
        }
        let lock = lock_path(&self.url.base, name.as_str());
        let (waiter, queued_node) = {
            let state = self.state();
            match state.waiter_of(name, owner) {
                Some(id) => (Some(id), state.waiters[&id].node.clone()),
                None => (None, None),
            }
        };
        // A one-off attempt first looks: when anyone holds or waits, it would only queue
        // and leave again, two writes the ensemble must log and sync, for the same answer.
        // A failed look (a lost connection) is no answer: the attempt goes on to queue, which
        // handles a lost connection.
        if waiter.is_none()
            && matches!(self.queue(&session, &lock).await, Ok(line) if !line.is_empty())
        {
            return Ok(Acquired::Held { ttl: None });
        }
        let node = match queued_node {
            Some(node) => node,
            None => {
                let node = self.create_node(&session, &lock, owner).await?;
                if let Some(id) = waiter {
                    let mut state = self.state();
                    match state.waiters.get_mut(&id) {
                        Some(queued) if queued.generation == session.generation => {
                            queued.node = Some(node.clone());
                        }
                        _ => {
                            // The waiter left while the node was being made.
                            drop(state);
                            self.orphan(node.path, None, session.generation);
                            return Ok(Acquired::Held {
                                ttl: Some(Duration::ZERO),
                            });
                        }
                    }
                }
                node
            }
        };
        let line = match self.queue(&session, &lock).await {
            Ok(line) => line,
            Err(error) => {
                // A waiter's node stays queued for its next attempt; a one-off attempt's
                // node must not stay behind.
                if waiter.is_none() {
                    self.orphan(node.path, None, session.generation);
                }
                return Err(error);
            }
        };
        let position = line.iter().position(|c| c == child_name(&node.path));
        match position {
            Some(0) => {
                if self.record_grant(name, owner, &node, lease, session.generation, waiter) {
                    return Ok(Acquired::Granted {
                        fencing_token: node.token,
                        holds: 1,
                    });
                }
                if waiter.is_none() {
                    self.orphan(node.path, None, session.generation);
                }
                Ok(Acquired::Held {
                    ttl: Some(Duration::ZERO),
                })
            }
            Some(_) => {
                if waiter.is_none() {
                    // A one-off attempt leaves the queue at once.
                    if let Err(error) = self.delete_node(&session, &node.path, None).await {
                        tracing::warn!(%error, "leaving the queue failed; deleting in the background");
                        self.orphan(node.path, None, session.generation);
                    }
                }
                Ok(Acquired::Held { ttl: None })
            }
            None => {
                // Our node is gone (an operator removed it): queue again at the next attempt.
                if let Some(id) = waiter
                    && let Some(queued) = self.state().waiters.get_mut(&id)
                {
                    queued.node = None;
                }
                Ok(Acquired::Held {
                    ttl: Some(Duration::ZERO),
                })
            }
        }
    }

    async fn try_acquire_naive(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let session = self.session();
        if let Some(granted) = self.reenter(&session, name, owner, lease).await? {
            return Ok(granted);
        }
        let path: Arc<str> = lock_path(&self.url.base, name.as_str()).into();
        let data = Self::node_data(owner);
        for _ in 0..ATTEMPTS {
            let node = match session.client.create(&path, &data, &ephemeral()).await {
                Ok((stat, _)) => Node {
                    path: path.clone(),
                    token: token_of(&stat),
                },
                Err(zk::Error::NodeExists) => return Ok(Acquired::Held { ttl: None }),
                Err(zk::Error::NoNode) => {
                    session
                        .client
                        .mkdir(&self.url.base, &persistent())
                        .await
                        .map_err(|e| self.err("create the base path", e))?;
                    continue;
                }
                Err(zk::Error::ConnectionLoss) => {
                    self.connected(&session).await?;
                    let stat = session
                        .client
                        .check_stat(&path)
                        .await
                        .map_err(|e| self.err("check the lock node", e))?;
                    match stat {
                        None => continue,
                        // Ours if our session made it and no other owner of this client holds it.
                        Some(stat)
                            if stat.ephemeral_owner == session.client.session_id().0
                                && !self.state().held.values().any(|held| held.path == path) =>
                        {
                            Node {
                                path: path.clone(),
                                token: token_of(&stat),
                            }
                        }
                        Some(_) => return Ok(Acquired::Held { ttl: None }),
                    }
                }
                Err(e) => return Err(self.err("create the lock node", e)),
            };
            if self.record_grant(name, owner, &node, lease, session.generation, None) {
                return Ok(Acquired::Granted {
                    fencing_token: node.token,
                    holds: 1,
                });
            }
            self.orphan(node.path, Some(node.token), session.generation);
            return Ok(Acquired::Held {
                ttl: Some(Duration::ZERO),
            });
        }
        Err(self.err("create the lock node", zk::Error::ConnectionLoss))
    }

    /// Who holds a lock we do not: used to answer a release or extension by a non-holder.
    async fn not_ours(&self, name: &LockName) -> Result<(Released, Extended)> {
        if self.is_locked(name).await? {
            Ok((Released::HeldByOther, Extended::HeldByOther))
        } else {
            Ok((Released::NotHeld, Extended::NotHeld))
        }
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let session = self.session();
        let path = lock_path(&self.url.base, name.as_str());
        if self.url.naive {
            match session.client.check_stat(&path).await {
                Ok(stat) => Ok(stat.is_some()),
                Err(e) => Err(self.err("check the lock node", e)),
            }
        } else {
            Ok(!self.queue(&session, &path).await?.is_empty())
        }
    }

    /// Reads many of our nodes in one request: `true` where the node is still ours.
    async fn read_many(
        &self,
        session: &Session,
        nodes: &[Option<(Arc<str>, u64)>],
    ) -> Result<Vec<bool>> {
        if nodes.iter().all(Option::is_none) {
            return Ok(vec![false; nodes.len()]);
        }
        let mut reader = session.client.new_multi_reader();
        for (path, _) in nodes.iter().flatten() {
            reader
                .add_get_data(path)
                .map_err(|e| self.err("check lock nodes", e))?;
        }
        let mut results = reader
            .commit()
            .await
            .map_err(|e| self.err("check lock nodes", e))?
            .into_iter();
        Ok(nodes
            .iter()
            .map(|node| match node {
                None => false,
                Some((_, token)) => matches!(
                    results.next(),
                    Some(zk::MultiReadResult::Data { stat, .. }) if token_of(&stat) == *token
                ),
            })
            .collect())
    }

    /// Our held nodes for `locks`, `None` where we hold none.
    fn held_nodes(&self, locks: &[(LockName, Owner)]) -> Vec<Option<(Arc<str>, u64)>> {
        let state = self.state();
        locks
            .iter()
            .map(|key| state.held(key).map(|held| (held.path.clone(), held.token)))
            .collect()
    }
}

fn state_error(state: zk::SessionState) -> zk::Error {
    match state {
        zk::SessionState::Expired => zk::Error::SessionExpired,
        zk::SessionState::AuthFailed => zk::Error::AuthFailed,
        zk::SessionState::Closed => zk::Error::ClientClosed,
        _ => zk::Error::ConnectionLoss,
    }
}

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
        let id = {
            let mut state = shared.state();
            state.next_waiter += 1;
            let id = state.next_waiter;
            let generation = state.generation;
            state.waiters.insert(
                id,
                Queued {
                    name: name.clone(),
                    owner: owner.clone(),
                    node: None,
                    generation,
                },
            );
            id
        };
        Ok(Box::new(SequentialWaiter {
            shared,
            id,
            name: name.clone(),
            owner: owner.clone(),
            lock: path,
            lease,
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
            .map(|held| (held.path.clone(), held.token))
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
                Some(held) if held.path == path && held.holds > 1 => {
                    held.holds -= 1;
                    Some(held.holds)
                }
                Some(held) if held.path == path => {
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
            if state.held.get(&key).is_some_and(|held| held.path == path) {
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

    async fn extend(&self, name: &LockName, owner: &Owner, lease: Duration) -> Result<Extended> {
        let shared = &self.shared;
        let session = shared.session();
        let key = (name.clone(), owner.clone());
        let Some((path, token)) = shared
            .state()
            .held(&key)
            .map(|held| (held.path.clone(), held.token))
        else {
            if shared.state().lease_ending(&key) {
                return Ok(Extended::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.1);
        };
        let start = Instant::now();
        let alive = shared.exists(&session, &path, token).await?;
        let mut state = shared.state();
        let extended = match state.held.get_mut(&key) {
            Some(held) if held.path == path && alive => {
                held.expires_at = start + lease;
                Extended::Extended
            }
            Some(held) if held.path == path => {
                state.held.remove(&key);
                Extended::NotHeld
            }
            _ => Extended::NotHeld,
        };
        drop(state);
        shared.reaper.notify_one();
        Ok(extended)
    }

    async fn renew(&self, locks: &[(LockName, Owner)], lease: Duration) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let session = shared.session();
        let nodes = shared.held_nodes(locks);
        let start = Instant::now();
        let alive = shared.read_many(&session, &nodes).await?;
        let mut state = shared.state();
        for ((key, node), alive) in locks.iter().zip(&nodes).zip(&alive) {
            let Some((path, _)) = node else { continue };
            match state.held.get_mut(key) {
                Some(held) if &held.path == path && *alive => held.expires_at = start + lease,
                Some(held) if &held.path == path => {
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
            .map(|held| (held.path.clone(), held.token, held.holds))
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
        let shared = &self.shared;
        let session = shared.session();
        let lock = lock_path(&shared.url.base, name.as_str());
        if shared.url.naive {
            return match session.client.delete(&lock, None).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) => Err(shared.err("force-unlock", e)),
            };
        }
        for _ in 0..ATTEMPTS {
            let line = shared.queue(&session, &lock).await?;
            let Some(first) = line.first() else {
                return Ok(false);
            };
            match session
                .client
                .delete(&format!("{lock}/{first}"), None)
                .await
            {
                Ok(()) => return Ok(true),
                // Released meanwhile: the next in line holds it now.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(shared.err("force-unlock", e)),
            }
        }
        Ok(false)
    }

    fn queues_on_subscribe(&self) -> bool {
        !self.shared.url.naive
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.shared.status.subscribe())
    }
}

/// A waiter of the sequential lock: its node in the queue, made by the owner's next attempt.
struct SequentialWaiter {
    shared: Arc<Shared>,
    id: u64,
    name: LockName,
    owner: Owner,
    lock: String,
    lease: Duration,
    status: watch::Receiver<SessionStatus>,
}

impl Drop for SequentialWaiter {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        if let Some(queued) = state.waiters.remove(&self.id)
            && let Some(node) = queued.node
        {
            // Not granted: leave the queue (in the background, as Drop cannot wait).
            state.orphans.push(Orphan {
                ended: None,
                path: node.path,
                token: None,
                generation: queued.generation,
                prefix_lookups: None,
            });
            drop(state);
            self.shared.reaper.notify_one();
        }
    }
}

impl SequentialWaiter {
    /// Our node now, if we have one in the current session.
    fn node(&self) -> Option<Node> {
        let state = self.shared.state();
        state
            .waiters
            .get(&self.id)
            .filter(|queued| queued.generation == state.generation)
            .and_then(|queued| queued.node.clone())
    }

    /// Takes the lock with our node, now first in line.
    fn granted(&self, node: &Node, generation: u64) -> Woken {
        let since = Instant::now();
        let shared = &self.shared;
        if shared.record_grant(
            &self.name,
            &self.owner,
            node,
            self.lease,
            generation,
            Some(self.id),
        ) {
            Woken::Granted {
                fencing_token: node.token,
                since,
                lease: self.lease,
            }
        } else {
            Woken::Retry
        }
    }
}

#[async_trait]
impl ReleaseWaiter for SequentialWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        // A watch lost in some way nobody foresaw costs one session timeout, not a hang.
        let deadline = Instant::now() + max.min(self.shared.url.session_timeout);
        self.status.borrow_and_update();
        loop {
            let Some(node) = self.node() else {
                // The next attempt makes the node.
                return Woken::Retry;
            };
            let shared = self.shared.clone();
            let session = shared.session();
            let line = match shared.queue(&session, &self.lock).await {
                Ok(line) => line,
                Err(error) => {
                    tracing::debug!(%error, "listing the queue failed");
                    tokio::time::sleep_until(
                        deadline.min(Instant::now() + Duration::from_millis(100)),
                    )
                    .await;
                    return Woken::Retry;
                }
            };
            let position = line.iter().position(|c| c == child_name(&node.path));
            let before = match position {
                None => return Woken::Retry,
                Some(0) => return self.granted(&node, session.generation),
                Some(at) => at - 1,
            };
            let predecessor = format!("{}/{}", self.lock, line[before]);
            let watcher = match session.client.check_and_watch_stat(&predecessor).await {
                Ok((Some(_), watcher)) => watcher,
                // Gone already: look again.
                Ok((None, _)) => continue,
                Err(error) => {
                    tracing::debug!(%error, "watching the predecessor failed");
                    tokio::time::sleep_until(
                        deadline.min(Instant::now() + Duration::from_millis(100)),
                    )
                    .await;
                    return Woken::Retry;
                }
            };
            drop(session);
            tokio::select! {
                event = watcher.changed() => {
                    WATCH_NOTIFICATIONS.fetch_add(1, Ordering::Relaxed);
                    if event.event_type == zk::EventType::NodeDeleted && before == 0 {
                        // The node ahead was first in line: nobody can come before us now.
                        let generation = self.shared.state().generation;
                        return self.granted(&node, generation);
                    }
                    if event.event_type == zk::EventType::Session {
                        return Woken::Retry;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Woken::Retry,
                _ = self.status.changed() => return Woken::Retry,
            }
        }
    }
}

/// A waiter of the naive lock: watches the one node, like every other waiter.
struct NaiveWaiter {
    shared: Arc<Shared>,
    path: String,
    status: watch::Receiver<SessionStatus>,
}

#[async_trait]
impl ReleaseWaiter for NaiveWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        let deadline = Instant::now() + max.min(self.shared.url.session_timeout);
        self.status.borrow_and_update();
        let session = self.shared.session();
        let watcher = match session.client.check_and_watch_stat(&self.path).await {
            Ok((Some(_), watcher)) => watcher,
            Ok((None, _)) => return Woken::Retry,
            Err(error) => {
                tracing::debug!(%error, "watching the lock node failed");
                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100)))
                    .await;
                return Woken::Retry;
            }
        };
        drop(session);
        tokio::select! {
            _ = watcher.changed() => {
                WATCH_NOTIFICATIONS.fetch_add(1, Ordering::Relaxed);
            }
            _ = tokio::time::sleep_until(deadline) => {}
            _ = self.status.changed() => {}
        }
        Woken::Retry
    }
}

/// Deletes nodes whose lease ended and nodes left behind, in the background. Ends with the
/// backend.
async fn reap(shared: Weak<Shared>, wake: Arc<Notify>) {
    let mut retry_at: Option<Instant> = None;
    loop {
        let notified = wake.notified();
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (work, next_expiry) = {
            let mut state = strong.state();
            let generation = state.generation;
            let expired: Vec<(LockName, Owner)> = state
                .held
                .iter()
                .filter(|(_, held)| held.expires_at <= now)
                .map(|(key, _)| key.clone())
                .collect();
            for key in expired {
                if let Some(held) = state.held.remove(&key) {
                    tracing::debug!(lock = %key.0, "the lease ended; deleting the node");
                    state.ending.insert(key.clone());
                    let token = strong.url.naive.then_some(held.token);
                    state.orphans.push(Orphan {
                        ended: Some(key.clone()),
                        path: held.path,
                        token,
                        generation: held.generation,
                        prefix_lookups: None,
                    });
                }
            }
            let mut work = std::mem::take(&mut state.orphans);
            // Nodes of an ended session are gone with it.
            work.retain(|orphan| {
                let keep = orphan.generation == generation;
                if !keep && let Some(key) = &orphan.ended {
                    state.ending.remove(key);
                }
                keep
            });
            let next_expiry = state.held.values().map(|held| held.expires_at).min();
            (work, next_expiry)
        };
        if !work.is_empty() || retry_at.is_some_and(|at| at <= now) {
            retry_at = None;
            let session = strong.session();
            let mut failed = Vec::new();
            for orphan in work {
                if orphan.generation != session.generation {
                    if let Some(key) = &orphan.ended {
                        strong.state().ending.remove(key);
                    }
                    continue;
                }
                if let Some(lookups) = orphan.prefix_lookups {
                    match strong.delete_protected(&session, &orphan.path).await {
                        Ok(true) => {}
                        Ok(false) if lookups > 0 => failed.push(Orphan {
                            prefix_lookups: Some(lookups - 1),
                            ..orphan
                        }),
                        Ok(false) => {}
                        Err(error) => {
                            tracing::warn!(prefix = %orphan.path, %error, "looking for a lock node failed; retrying");
                            failed.push(orphan);
                        }
                    }
                    continue;
                }
                match strong
                    .delete_node(&session, &orphan.path, orphan.token)
                    .await
                {
                    Ok(_) => {
                        if let Some(key) = &orphan.ended {
                            strong.state().ending.remove(key);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(node = %orphan.path, %error, "deleting a lock node failed; retrying");
                        failed.push(orphan);
                    }
                }
            }
            if !failed.is_empty() {
                strong.state().orphans.extend(failed);
                retry_at = Some(Instant::now() + Duration::from_millis(200));
            }
        }
        drop(strong);
        let wake_at = [next_expiry, retry_at].into_iter().flatten().min();
        tokio::select! {
            _ = notified => {}
            _ = crate::wake::sleep_until_or_never(wake_at) => {}
        }
    }
}

/// Follows the session: publishes Connected/Suspended, and when the session is lost (expired,
/// or disconnected for half a session timeout), forgets its locks and opens a new one.
async fn supervise(shared: Weak<Shared>, mut watcher: zk::StateWatcher) {
    loop {
        let state = watcher.state();
        let suspended = match state {
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => false,
            zk::SessionState::Disconnected => true,
            _ => {
                match renew_session(&shared).await {
                    Some(next) => watcher = next,
                    None => return,
                }
                continue;
            }
        };
        let timeout = {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            strong.status.send_if_modified(|status| {
                let state = if suspended {
                    SessionState::Suspended
                } else {
                    SessionState::Connected
                };
                let changed = status.state != state;
                status.state = state;
                changed
            });
            if suspended {
                tracing::warn!(cluster = %strong.url.cluster, "ZooKeeper connection lost; locks are suspended");
            }
            // The server expires a session a session timeout after it last heard from the
            // client, and the client is heard from at least every third of it: after half a
            // timeout without a connection, give the locks up before the server can.
            strong.session().client.session_timeout() / 2
        };
        if !suspended {
            watcher.changed().await;
            continue;
        }
        if tokio::time::timeout(timeout, watcher.changed())
            .await
            .is_err()
        {
            tracing::warn!(
                "disconnected for a whole session timeout; treating the session as lost"
            );
            match renew_session(&shared).await {
                Some(next) => watcher = next,
                None => return,
            }
        }
    }
}

/// Forgets the lost session's locks, reports the loss, and connects a new session. `None`
/// when the backend is gone.
async fn renew_session(shared: &Weak<Shared>) -> Option<zk::StateWatcher> {
    {
        let strong = shared.upgrade()?;
        let mut state = strong.state();
        state.generation += 1;
        let generation = state.generation;
        let lost = state.held.len();
        state.held.clear();
        state.orphans.clear();
        for queued in state.waiters.values_mut() {
            queued.node = None;
            queued.generation = generation;
        }
        drop(state);
        tracing::warn!(locks = lost, "ZooKeeper session lost; its locks are lost");
        strong.status.send_modify(|status| {
            status.state = SessionState::Suspended;
            status.sessions_lost += 1;
        });
    }
    let mut backoff = Duration::from_millis(50);
    loop {
        let (url, generation) = {
            let strong = shared.upgrade()?;
            let generation = strong.state().generation;
            (strong.url.clone(), generation)
        };
        match zk::Client::connector()
            .with_session_timeout(url.session_timeout)
            .connect(&url.cluster)
            .await
        {
            Ok(client) => {
                let strong = shared.upgrade()?;
                let watcher = client.state_watcher();
                *strong
                    .current
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Arc::new(Session { client, generation });
                tracing::info!("new ZooKeeper session");
                return Some(watcher);
            }
            Err(error) => {
                tracing::warn!(%error, "opening a new ZooKeeper session failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
