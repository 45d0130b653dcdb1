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
//! its key. A second stream watches the keys the client holds, so that a key deleted by an
//! operator fires its lock's `lost()` at the next renewal, and renewals send no request
//! while that watch is up. A holder whose process dies leaves its keys until its etcd lease
//! runs out.
//!
//! When the server answers that the lease is gone, or no keep-alive is answered for half its
//! TTL (the server may expire it a little later), every lock under it is reported lost through
//! [`Guard::lost`](crate::Guard::lost) and [`Locks::session`](crate::Locks::session), and the
//! client takes a new lease.

pub(crate) mod api;
mod auth;
#[cfg(feature = "bench")]
mod bare;
mod held;
mod lease;
mod list;
mod published;
mod requests;
pub(crate) mod rpc;
mod state;
pub(crate) mod url;
mod waiter;

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, SessionState,
    SessionStatus,
};
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};

use self::rpc::Rpc;
use self::state::{Node, Orphan, State, no_lease};
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
    rpc: Rpc,
    /// Transactions reading held keys sent so far.
    key_checks: std::sync::atomic::AtomicU64,
    /// Changes to the held keys' watch ([`held`]).
    held_watch: tokio::sync::mpsc::UnboundedSender<held::Change>,
    status: watch::Sender<SessionStatus>,
    state: StdMutex<State>,
    reaper: Arc<Notify>,
}

impl EtcdBackend {
    /// Connects to the servers an `etcd://` URL names and takes the client's etcd lease.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Backend`] when no server answers
    /// or the lease cannot be granted.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = EtcdUrl::parse(url)?;
        let rpc = Rpc::new(&url)?;
        let (lease, ttl) = lease::grant(&rpc, url.lease_ttl).await?;
        let (held_watch, changes) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            url,
            rpc,
            key_checks: std::sync::atomic::AtomicU64::new(0),
            held_watch,
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
            shared.rpc.clone(),
        ));
        tokio::spawn(held::watch(
            Arc::downgrade(&shared),
            shared.rpc.clone(),
            changes,
        ));
        crate::reaper::spawn(&shared, &shared.reaper);
        Ok(EtcdBackend { shared })
    }

    /// Times the cheapest write: a put of one key under the client's lease. Every grant and
    /// release is a write that the cluster commits before it answers, so this is the floor
    /// under their cost. Measured through the driver's `write_round_trips`
    /// ([`crate::hooks::write_round_trips`]).
    ///
    /// # Errors
    /// [`Error::Backend`] when the write fails.
    #[cfg(feature = "bench")]
    pub(crate) async fn write_round_trip(&self) -> Result<Duration> {
        let shared = &self.shared;
        let lease = shared.state().lease.ok_or_else(no_lease)?;
        // No `/` after the prefix: outside every lock's range (`<prefix><name>/`).
        let key = format!("{}distlock-write-probe-{lease:x}", shared.url.prefix);
        let start = std::time::Instant::now();
        shared
            .call("write", shared.rpc.put(rpc::put(key, "", lease)))
            .await?;
        Ok(start.elapsed())
    }

    /// How many transactions reading held keys this backend has sent. Read through
    /// [`crate::hooks`].
    #[cfg(feature = "bench")]
    pub(crate) fn key_check_requests(&self) -> u64 {
        self.shared
            .key_checks
            .load(std::sync::atomic::Ordering::Relaxed)
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
pub(crate) fn check_url(url: &str) -> Result<()> {
    EtcdUrl::parse(url).map(drop)
}

/// Write round trips for the driver: a put of one key under the client's lease, the unit of
/// an etcd handoff.
#[cfg(feature = "bench")]
async fn write_round_trips(url: &str, samples: u64) -> Result<Vec<Duration>> {
    let backend = EtcdBackend::connect(url).await?;
    crate::driver::sampled(samples, || backend.write_round_trip()).await
}

crate::driver::driver!(
    check_url: check_url,
    open: connect,
    bare: bare::open,
    write_round_trips: write_round_trips,
);

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
                shared.rpc.range(api::etcdserverpb::RangeRequest {
                    count_only: true,
                    ..rpc::get(key)
                }),
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
        Ok(Box::new(EtcdWaiter {
            place: crate::queue::Place::join(shared, name, owner, lease),
            lock_prefix,
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
                    let watch = held.extra.watch;
                    state.held.remove(&key);
                    drop(state);
                    shared.unwatch(watch);
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
            let taken = shared
                .state()
                .held
                .get(&key)
                .is_none_or(|held| held.key != node.key);
            if taken {
                // A release of the owner's last hold, running at the same time, took the
                // entry and deleted the key: this hold was counted before it.
                return Ok(Released::Released { remaining_holds });
            }
            shared.forget(&key, &node.key);
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

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let shared = &self.shared;
        let key = (name.clone(), owner.clone());
        let Some((node, _)) = shared
            .held_node(&key)
            .filter(|(node, _)| node.token == fencing_token)
        else {
            if shared.state().lease_ending(&key) {
                return Ok(Extended::NotHeld);
            }
            return Ok(shared.not_ours(name).await?.1);
        };
        let start = Instant::now();
        let alive = shared.check_keys(&[Some(node.clone())]).await? == [true];
        let extended = match shared.state().held.get_mut(&key) {
            Some(held) if held.key == node.key && alive => {
                held.expires_at = start + lease;
                Extended::Extended
            }
            _ => Extended::NotHeld,
        };
        if !alive {
            shared.forget(&key, &node.key);
        }
        shared.reaper.notify_one();
        Ok(extended)
    }

    /// Renews the grants asked about (their keys carry their token; a later grant of the name
    /// is another key, neither renewed nor forgotten).
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let shared = &self.shared;
        let start = Instant::now();
        // While the held keys' watch is up, it has told of every deletion: no request.
        let alive = match shared.renew_watched(locks, start + lease) {
            Some(alive) => alive,
            None => {
                let keys: Vec<(LockName, Owner)> = locks.iter().map(|r| r.lock.clone()).collect();
                let nodes: Vec<Option<state::Node>> = shared
                    .held_nodes(&keys)
                    .into_iter()
                    .zip(locks)
                    .map(|(node, r)| node.filter(|node| node.token == r.fencing_token))
                    .collect();
                let alive = shared.check_keys(&nodes).await?;
                for ((key, node), alive) in keys.iter().zip(&nodes).zip(&alive) {
                    let Some(node) = node else { continue };
                    let mut state = shared.state();
                    match state.held.get_mut(key) {
                        Some(held) if held.key == node.key && *alive => {
                            held.expires_at = start + lease;
                        }
                        _ => {
                            drop(state);
                            shared.forget(key, &node.key);
                        }
                    }
                }
                alive
            }
        };
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

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.shared.publish_record(key, record).await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        match key.kind() {
            LockKind::Leader(_) => self.shared.read_leader(key).await,
            _ => self.shared.read_record(key).await,
        }
    }

    fn supports(&self, kind: &LockKind) -> bool {
        // etcd's Go client has the mutex and the election; its reader-writer lock is a
        // contrib recipe, built here on the mutex instead.
        matches!(kind, LockKind::Exclusive | LockKind::Leader(_))
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.shared.withdraw_record(key, term).await
    }

    /// One keys-only range read of the contender keys under the prefix (in pages of 1000
    /// keys at one revision); see `etcd/list.rs`. An election's candidates are listed under
    /// its lock name (`NAME#leader`).
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.shared.list_held(prefix, limit).await
    }

    fn queues_on_subscribe(&self) -> bool {
        true
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.shared.status.subscribe())
    }
}
