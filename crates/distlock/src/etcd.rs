//! The etcd backend (`etcd://`): the lease-and-revision lock of etcd's own
//! `concurrency.Mutex`, with one etcd lease per client.
//!
//! # The lock
//!
//! Lock `NAME` is the key range `PREFIX NAME/` (`PREFIX` is empty unless the URL's path names
//! one, and `NAME` is the lock name with every byte outside `A-Z a-z 0-9 - _ .` written as
//! `%XX`). A contender puts the key `PREFIX NAME/<lease id in hex>` under its client's etcd
//! lease, in a transaction that only creates it when it is absent; the key with the lowest
//! create revision holds the lock, and every other contender watches only the key just
//! before its own. This is the layout of `concurrency.Mutex` in etcd's Go client, and so of
//! `etcdctl lock NAME`: Go services, shell scripts and distlock exclude each other on the
//! same names. (A second owner of the same client contending for the same name puts
//! `<lease id in hex>-<n>`, a key of the same range.)
//!
//! * **No herd.** A release deletes one key and wakes one waiter: the next in line.
//! * **Fair.** Waiters are served in the order their keys were created.
//! * **No stall on handoff.** etcd's Go mutex watches the key before its own from the
//!   revision it read, which the server serves from its unsynced watchers every 100 ms, so a
//!   handoff waits 50 ms on average. distlock's waiter watches from now, which the server
//!   syncs at once, and then reads the key again so that a deletion between the read and the
//!   watch is not missed. `?watch=etcd` does as the Go mutex does, for comparison.
//! * **Fencing token:** the create revision of the holder's key. Revisions count every write
//!   to the cluster and never go back, across leader elections and restarts.
//! * **Lost replies.** The key names the client's lease, so a put whose reply is lost is
//!   found again by sending the same transaction: it answers the key that is already there.
//!
//! # Leases
//!
//! Every key of a client is under one etcd lease (`?lease_ttl=`, 10 s by default) that one
//! keep-alive stream renews every third of its TTL, whatever the number of locks. The API's
//! leases are kept in the client that holds the lock (as with ZooKeeper): a fixed lease
//! ([`AcquireOptions::lease`](crate::AcquireOptions::lease)) ends with the client deleting
//! its key, and a renewed lock's key is checked at every renewal (one transaction per 100
//! locks), which notices a key deleted by an operator. A holder whose process dies leaves its
//! keys until its etcd lease runs out.
//!
//! When the server answers that the lease is gone, or no keep-alive is answered for half its
//! TTL (the server may expire it a little later), every lock under it is reported lost through
//! [`Guard::lost`](crate::Guard::lost) and [`Locks::session`](crate::Locks::session), and the
//! client takes a new lease.

mod lease;
mod requests;
pub(crate) mod url;
mod waiter;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client as etcd;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backend::{
    Acquired, Backend, Extended, Owner, ReleaseWaiter, Released, SessionState, SessionStatus,
};
use crate::error::{Error, Result};
use crate::name::LockName;

use self::url::EtcdUrl;
use self::waiter::EtcdWaiter;

const SCHEME: &str = "etcd";

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often one request is sent again after a lost connection.
const ATTEMPTS: usize = 3;

/// Locks in etcd. Made by [`connect`](crate::connect) with an `etcd://` URL; see the
/// [module docs](self).
#[derive(Clone)]
pub struct EtcdBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.url.endpoints)
            .field("prefix", &self.shared.url.prefix)
            .finish_non_exhaustive()
    }
}

struct Shared {
    url: EtcdUrl,
    client: etcd::Client,
    status: watch::Sender<SessionStatus>,
    state: StdMutex<State>,
    reaper: Arc<Notify>,
}

#[derive(Default)]
struct State {
    /// Counts the client's etcd leases; entries of older ones are gone with their lease.
    generation: u64,
    /// The etcd lease now, `None` while a new one is being granted.
    lease: Option<i64>,
    /// Its TTL, as the server granted it.
    ttl: Duration,
    held: HashMap<(LockName, Owner), Held>,
    waiters: HashMap<u64, Queued>,
    next_waiter: u64,
    /// The suffix of the next extra key (`<lease>-<n>`).
    next_key: u64,
    /// Keys of this lease that exist or may exist: held, queued, being made or to delete.
    keys: HashSet<Arc<str>>,
    /// Keys to delete in the background: abandoned by a waiter, left by a failed release or
    /// request, or at the end of their lease.
    orphans: Vec<Orphan>,
    /// Locks whose lease ended and whose keys the reaper is deleting right now.
    ending: HashSet<(LockName, Owner)>,
}

struct Held {
    key: Arc<str>,
    token: u64,
    holds: u32,
    /// The end of the lease, kept by this client: the reaper deletes the key then.
    expires_at: Instant,
    generation: u64,
}

/// A waiter's place in the queue.
struct Queued {
    name: LockName,
    owner: Owner,
    /// Put by the owner's next attempt; `None` until then or after the lease was lost.
    node: Option<Node>,
    generation: u64,
}

/// One of our keys and its create revision.
#[derive(Clone)]
struct Node {
    key: Arc<str>,
    token: u64,
}

struct Orphan {
    key: Arc<str>,
    /// Delete only the key with this create revision; `None`: whatever key of that name
    /// exists (the name holds our lease id, so only this client makes it).
    token: Option<u64>,
    generation: u64,
    /// The lock whose lease ended, when that is why the key goes (see `State::ending`).
    ended: Option<(LockName, Owner)>,
}

impl State {
    /// True while the reaper deletes the key of `key`'s ended lease and no other owner of
    /// this client holds the name yet.
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

    /// The waiter of `owner` on `name` under this lease, if any.
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

    /// Names a new key of ours under `lock_prefix` and reserves it, with the lease and its
    /// generation; `None` while there is no lease.
    fn new_key(&mut self, lock_prefix: &str) -> Option<(Arc<str>, i64, u64)> {
        let lease = self.lease?;
        let plain = format!("{lock_prefix}{lease:x}");
        let key: Arc<str> = if self.keys.contains(plain.as_str()) {
            self.next_key += 1;
            format!("{plain}-{}", self.next_key).into()
        } else {
            plain.into()
        };
        self.keys.insert(key.clone());
        Some((key, lease, self.generation))
    }
}

fn no_lease() -> Error {
    Error::backend(
        SCHEME,
        "put a lock key",
        "the client's etcd lease was lost and a new one is not granted yet",
    )
}

impl EtcdBackend {
    /// Connects to the servers an `etcd://` URL names and takes the client's etcd lease.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Backend`] when no server answers
    /// or the lease cannot be granted.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = EtcdUrl::parse(url)?;
        let options = etcd::ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_require_leader(true);
        let client = etcd::Client::connect(&url.endpoints, Some(options))
            .await
            .map_err(|e| Error::backend(SCHEME, "connect", e))?;
        let (lease, ttl) = lease::grant(&client, url.lease_ttl).await?;
        let shared = Arc::new(Shared {
            url,
            client,
            status: watch::channel(SessionStatus {
                state: SessionState::Connected,
                sessions_lost: 0,
            })
            .0,
            state: StdMutex::new(State {
                lease: Some(lease),
                ttl,
                ..State::default()
            }),
            reaper: Arc::new(Notify::new()),
        });
        tokio::spawn(lease::keep_alive(
            Arc::downgrade(&shared),
            shared.client.clone(),
        ));
        tokio::spawn(crate::reaper::run(
            Arc::downgrade(&shared),
            shared.reaper.clone(),
        ));
        Ok(EtcdBackend { shared })
    }

    /// Times the cheapest write: a put of one key under the client's lease. Every grant and
    /// release is a write that the cluster commits before it answers, so this is the floor
    /// under their cost. Read through [`crate::hooks`].
    ///
    /// # Errors
    /// [`Error::Backend`] when the write fails.
    pub(crate) async fn write_round_trip(&self) -> Result<Duration> {
        let shared = &self.shared;
        let lease = shared.state().lease.ok_or_else(no_lease)?;
        let key = format!("{}distlock-write-probe/{lease:x}", shared.url.prefix);
        let start = std::time::Instant::now();
        shared
            .call(
                "write",
                shared
                    .kv()
                    .put(key, "", Some(etcd::PutOptions::new().with_lease(lease))),
            )
            .await?;
        Ok(start.elapsed())
    }

    /// The key prefix under which lock `name`'s contenders put their keys.
    pub fn lock_prefix(&self, name: &str) -> Result<String> {
        Ok(self.shared.lock_prefix(&LockName::new(name)?))
    }
}

/// Connects to the servers an `etcd://` URL names; see [`EtcdBackend::connect`].
///
/// # Errors
/// As [`EtcdBackend::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(EtcdBackend::connect(url).await?))
}

/// Checks an `etcd://` URL without connecting.
///
/// # Errors
/// [`Error::InvalidInput`] saying what is wrong.
pub fn check_url(url: &str) -> Result<()> {
    EtcdUrl::parse(url).map(drop)
}

#[async_trait]
impl Backend for EtcdBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    async fn ping(&self) -> Result<()> {
        let shared = &self.shared;
        let key = format!("{}distlock-ping", shared.url.prefix);
        shared
            .call(
                "ping",
                shared
                    .kv()
                    .get(key, Some(etcd::GetOptions::new().with_count_only())),
            )
            .await
            .map(drop)
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        self.shared.try_acquire(name, owner, lease).await
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let shared = self.shared.clone();
        let status = shared.status.subscribe();
        let lock_prefix = shared.lock_prefix(name);
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
        Ok(Box::new(EtcdWaiter {
            shared,
            id,
            name: name.clone(),
            owner: owner.clone(),
            lock_prefix,
            lease,
            status,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let shared = &self.shared;
        let key = (name.clone(), owner.clone());
        let Some((node, generation)) = shared.held_node(&key) else {
            if shared.state().lease_ending(&key) {
                // Its lease ended; the reaper is deleting its key.
                return Ok(Released::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.0);
        };
        // Decided and counted under one lock: two releases of one owner's holds at once must
        // take one hold each, and exactly one of them deletes the key.
        let remaining = {
            let mut state = shared.state();
            match state.held.get_mut(&key) {
                Some(held) if held.key == node.key && held.holds > 1 => {
                    held.holds -= 1;
                    Some(held.holds)
                }
                Some(held) if held.key == node.key => {
                    state.held.remove(&key);
                    None
                }
                _ => return Ok(Released::NotHeld),
            }
        };
        if let Some(remaining_holds) = remaining {
            // One hold of several: the key stays; tell whether it is still there.
            if shared.check_keys(&[Some(node.clone())]).await? == [true] {
                return Ok(Released::Released { remaining_holds });
            }
            let mut state = shared.state();
            if !state
                .held
                .get(&key)
                .is_some_and(|held| held.key == node.key)
            {
                // A release of the owner's last hold, running at the same time, took the
                // entry and deleted the key: this hold was counted before it.
                return Ok(Released::Released { remaining_holds });
            }
            state.held.remove(&key);
            state.keys.remove(&node.key);
            return Ok(Released::NotHeld);
        }
        match shared.delete_key(&node.key, Some(node.token)).await {
            Ok(deleted) => {
                shared.state().keys.remove(&node.key);
                Ok(if deleted {
                    Released::Released { remaining_holds: 0 }
                } else {
                    Released::NotHeld
                })
            }
            Err(error) => {
                // Keep trying in the background, or the lock stays taken until the lease ends.
                shared.orphan(node.key, Some(node.token), generation, None);
                Err(error)
            }
        }
    }

    async fn extend(&self, name: &LockName, owner: &Owner, lease: Duration) -> Result<Extended> {
        let shared = &self.shared;
        let key = (name.clone(), owner.clone());
        let Some((node, _)) = shared.held_node(&key) else {
            if shared.state().lease_ending(&key) {
                return Ok(Extended::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.1);
        };
        let start = Instant::now();
        let alive = shared.check_keys(&[Some(node.clone())]).await? == [true];
        let mut state = shared.state();
        let extended = match state.held.get_mut(&key) {
            Some(held) if held.key == node.key && alive => {
                held.expires_at = start + lease;
                Extended::Extended
            }
            Some(held) if held.key == node.key => {
                state.held.remove(&key);
                state.keys.remove(&node.key);
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
        let nodes = shared.held_nodes(locks);
        let start = Instant::now();
        let alive = shared.check_keys(&nodes).await?;
        let mut state = shared.state();
        for ((key, node), alive) in locks.iter().zip(&nodes).zip(&alive) {
            let Some(node) = node else { continue };
            match state.held.get_mut(key) {
                Some(held) if held.key == node.key && *alive => held.expires_at = start + lease,
                Some(held) if held.key == node.key => {
                    state.held.remove(key);
                    state.keys.remove(&node.key);
                }
                _ => {}
            }
        }
        Ok(alive)
    }

    async fn still_held(&self, locks: &[(LockName, Owner)]) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let nodes = shared.held_nodes(locks);
        shared.check_keys(&nodes).await
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        self.shared.is_locked(name).await
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let shared = &self.shared;
        let key = (name.clone(), owner.clone());
        let Some((node, holds)) = shared.state().held(&key).map(|held| {
            (
                Node {
                    key: held.key.clone(),
                    token: held.token,
                },
                held.holds,
            )
        }) else {
            return Ok(0);
        };
        Ok(if shared.check_keys(&[Some(node)]).await? == [true] {
            holds
        } else {
            0
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        self.shared.force_unlock(name).await
    }

    fn queues_on_subscribe(&self) -> bool {
        true
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.shared.status.subscribe())
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update completes without a panic point: a poisoned lock is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn kv(&self) -> etcd::KvClient {
        self.client.kv_client()
    }

    fn lock_prefix(&self, name: &LockName) -> String {
        self.url.lock_prefix(&name.escaped())
    }

    /// The key `owner` holds `name` with, and its generation.
    fn held_node(&self, key: &(LockName, Owner)) -> Option<(Node, u64)> {
        self.state().held(key).map(|held| {
            (
                Node {
                    key: held.key.clone(),
                    token: held.token,
                },
                held.generation,
            )
        })
    }

    /// Our held keys for `locks`, `None` where we hold none.
    fn held_nodes(&self, locks: &[(LockName, Owner)]) -> Vec<Option<Node>> {
        let state = self.state();
        locks
            .iter()
            .map(|key| {
                state.held(key).map(|held| Node {
                    key: held.key.clone(),
                    token: held.token,
                })
            })
            .collect()
    }

    fn orphan(
        &self,
        key: Arc<str>,
        token: Option<u64>,
        generation: u64,
        ended: Option<(LockName, Owner)>,
    ) {
        self.state().orphans.push(Orphan {
            key,
            token,
            generation,
            ended,
        });
        self.reaper.notify_one();
    }

    /// Records a grant of `node` to `owner`. False when it cannot stand: the lease it was
    /// made under is gone, or the owner got the lock through another key meanwhile.
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
                Some(queued) if queued.node.as_ref().is_some_and(|n| n.key == node.key) => {
                    state.waiters.remove(&id);
                }
                _ => return false,
            }
        }
        state.held.insert(
            key,
            Held {
                key: node.key.clone(),
                token: node.token,
                holds: 1,
                expires_at: Instant::now() + lease,
                generation,
            },
        );
        drop(state);
        self.reaper.notify_one();
        true
    }
}
