//! The client: one connection to a backend, the registry of locks it holds, and the keeper
//! task that renews them in batches and notices when a lease runs out.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backend::{Backend, Owner};
use crate::error::{Error, Result};
use crate::mutex::{Holder, Mutex};
use crate::name::LockName;

/// The default lease of a lock acquired without a lease of its own: 30 s, renewed every
/// 10 s while its guard lives.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// The longest lease or wait accepted: one day. Wait without a limit with
/// [`Mutex::acquire`].
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of a client, given to [`connect_with`](crate::connect_with).
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    lease: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            lease: DEFAULT_LEASE,
        }
    }
}

impl ConnectOptions {
    /// Options with the defaults: a 30 s renewed lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease of locks acquired without a lease of their own. The client renews them every
    /// `lease / 3`; a holder that cannot renew for a whole lease loses the lock. Shorter
    /// leases free a crashed holder's locks sooner and cost more renewals.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The renewed lease.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_lease(self.lease)
    }
}

/// When the client stops believing it holds a lock whose lease of `lease` was set by a
/// request that started at `start`: the lease less an allowance for the server's clock running
/// faster than ours and for timer granularity (1% of the lease plus 2 ms, Redlock's drift
/// allowance), so that `lost()` fires before the server can grant the lock to anyone else.
pub(crate) fn lease_deadline(start: Instant, lease: Duration) -> Instant {
    start + lease - (lease / 100 + Duration::from_millis(2))
}

pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_DURATION {
        return Err(Error::invalid(
            "lease",
            format!(
                "{lease:?} is outside the accepted range {MIN_LEASE:?} ..= {MAX_DURATION:?}; \
                 leave the lease unset to hold the lock with automatic renewal"
            ),
        ));
    }
    Ok(())
}

/// A client of one lock backend. Cheap to clone; clones share the connection, the client id
/// and the renewal task.
///
/// Made by [`connect`](crate::connect). Hand out lock handles with [`Locks::mutex`].
#[derive(Clone)]
pub struct Locks {
    pub(crate) inner: Arc<ClientInner>,
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("backend", &self.inner.backend)
            .field("client_id", &self.inner.client_id)
            .finish_non_exhaustive()
    }
}

impl Locks {
    /// A client over a backend built outside this crate.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the options are out of range.
    pub fn with_backend(backend: Arc<dyn Backend>, options: ConnectOptions) -> Result<Self> {
        options.validate()?;
        let keeper_wake = Arc::new(Notify::new());
        Ok(Locks {
            inner: Arc::new(ClientInner {
                backend,
                client_id: uuid::Uuid::new_v4().simple().to_string(),
                next_holder: AtomicU64::new(1),
                options,
                registry: StdMutex::new(Registry::default()),
                keeper_wake,
                keeper_started: AtomicBool::new(false),
                renewal_calls: AtomicU64::new(0),
                requests: StdMutex::default(),
            }),
        })
    }

    /// A handle on the mutual-exclusion lock `name`. Cheap: nothing is sent to the backend.
    ///
    /// Every acquisition through the handle is a new owner, so tasks sharing the handle
    /// exclude each other. For reentrant locking use [`Locks::holder`] or
    /// [`Guard::reenter`](crate::Guard::reenter).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the name is empty or longer than
    /// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES).
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        Ok(Mutex::new(self.inner.clone(), LockName::new(name)?, None))
    }

    /// A new owner identity for reentrant locking: the handles it makes acquire as this
    /// holder, so acquiring a lock the holder already holds re-enters it.
    pub fn holder(&self) -> Holder {
        Holder::new(self.inner.clone(), self.inner.new_owner())
    }

    /// True when anyone holds `name`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        self.inner.backend.is_locked(&name).await
    }

    /// Frees `name` whoever holds it; true when it was held. For operators: the holder is
    /// told through [`Guard::lost`](crate::Guard::lost) at its next renewal, and its writes
    /// are refused only where the resource checks fencing tokens.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have freed the lock.
    pub async fn force_unlock(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        let freed = self.inner.backend.force_unlock(&name).await?;
        tracing::warn!(lock = %name, freed, "force unlock");
        Ok(freed)
    }

    /// Sends the backend's cheapest request and returns how long it took.
    pub async fn ping(&self) -> Result<Duration> {
        let start = std::time::Instant::now();
        self.inner.backend.ping().await?;
        Ok(start.elapsed())
    }

    /// The backend's URL scheme.
    pub fn backend_scheme(&self) -> &'static str {
        self.inner.backend.scheme()
    }

    /// This client's id, the first part of every owner string it writes.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// The lease of locks acquired without one of their own.
    pub fn lease(&self) -> Duration {
        self.inner.options.lease
    }

    /// The state of the backend's session, for backends whose locks live in a session
    /// (ZooKeeper): [`SessionState::Connected`](crate::SessionState::Connected) or
    /// [`SessionState::Suspended`](crate::SessionState::Suspended), and how many sessions were
    /// lost. `None` for backends whose locks live by their leases alone.
    ///
    /// ```no_run
    /// # async fn run(locks: distlock::Locks) {
    /// if let Some(mut session) = locks.session() {
    ///     while session.changed().await.is_ok() {
    ///         let status = *session.borrow();
    ///         if status.state == distlock::SessionState::Suspended {
    ///             // Pause unfenced writes until Connected again, or until `lost()` fires.
    ///         }
    ///     }
    /// }
    /// # }
    /// ```
    pub fn session(&self) -> Option<watch::Receiver<crate::SessionStatus>> {
        self.inner.backend.session()
    }

    /// How many renewal requests this client has sent (each renews up to 1000 locks).
    pub fn renewal_requests(&self) -> u64 {
        self.inner.renewal_calls.load(Ordering::Relaxed)
    }
}

/// Why a lock was lost, shared by every guard of one grant.
pub(crate) struct Grant {
    fencing_token: u64,
    lost: watch::Sender<Option<Arc<str>>>,
}

impl Grant {
    fn new(fencing_token: u64) -> Arc<Self> {
        Arc::new(Grant {
            fencing_token,
            lost: watch::channel(None).0,
        })
    }

    pub(crate) fn mark_lost(&self, name: &LockName, reason: &str) {
        let first = self.lost.send_if_modified(|state| {
            if state.is_none() {
                *state = Some(reason.into());
                true
            } else {
                false
            }
        });
        if first {
            tracing::warn!(lock = %name, fencing_token = self.fencing_token, reason, "lock lost");
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<Arc<str>> {
        self.lost.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.lost.subscribe()
    }
}

/// The locks this client holds, and when the keeper plans to wake next.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) slots: HashMap<(LockName, Owner), Slot>,
    /// `None` while the keeper sleeps with nothing to do (or has not started).
    pub(crate) keeper_wakes_at: Option<Instant>,
}

/// One held lock of this client (all reentrant guards of one grant share it).
pub(crate) struct Slot {
    pub(crate) grant: Arc<Grant>,
    guards: u32,
    pub(crate) renew: bool,
    /// When the lease ends by the client's own clock, counted from the start of the request
    /// that last set it.
    pub(crate) deadline: Instant,
    /// Guards of earlier grants to this owner that the client had given up as lost while the
    /// server still held them (a re-entry found their holds): their releases must still reach
    /// the server.
    carried: Vec<(Arc<Grant>, u32)>,
}

impl Slot {
    /// The holds the server should have: this grant's guards and the carried ones.
    fn holds(&self) -> u32 {
        self.carried
            .iter()
            .fold(self.guards, |sum, (_, guards)| sum.saturating_add(*guards))
    }
}

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) client_id: String,
    next_holder: AtomicU64,
    pub(crate) options: ConnectOptions,
    registry: StdMutex<Registry>,
    keeper_wake: Arc<Notify>,
    keeper_started: AtomicBool,
    pub(crate) renewal_calls: AtomicU64,
    requests: StdMutex<crate::settle::Requests>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Lets the keeper task see that the client is gone and end.
        self.keeper_wake.notify_one();
    }
}

impl ClientInner {
    pub(crate) fn new_owner(&self) -> Owner {
        let holder = self.next_holder.fetch_add(1, Ordering::Relaxed);
        Owner::new(&self.client_id, holder)
    }

    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is
        // a single insert or field write), so a poisoned lock is still usable.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn requests(&self) -> std::sync::MutexGuard<'_, crate::settle::Requests> {
        // Every update is a single field write: a poisoned lock is still consistent.
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many guards of `owner` on `name` this client has registered: the holds the server
    /// should have for that owner.
    pub(crate) fn registered_guards(&self, name: &LockName, owner: &Owner) -> u32 {
        self.registry()
            .slots
            .get(&(name.clone(), owner.clone()))
            .map_or(0, Slot::holds)
    }

    /// Records a new guard; `holds` is the owner's hold count the backend answered. A count
    /// of 1 is a new grant: any slot left from an earlier grant to this owner is then stale
    /// and marked lost. A larger count re-entered holds that are still there.
    pub(crate) fn register(
        self: &Arc<Self>,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        holds: u32,
        renew: bool,
        deadline: Instant,
    ) -> Arc<Grant> {
        let fresh = holds <= 1;
        let (grant, wake_keeper) = {
            let mut registry = self.registry();
            let key = (name.clone(), owner.clone());
            // The keeper must wake by the lock's deadline, and by the first renewal of a
            // renewed lock (a handed-over grant's deadline comes first: its lease is short);
            // it need not be disturbed when it already plans to.
            let needed_by = if renew {
                deadline.min(Instant::now() + self.options.lease / 3)
            } else {
                deadline
            };
            let wake_keeper = registry.keeper_wakes_at.is_none_or(|at| at > needed_by);
            let grant = match registry.slots.get_mut(&key) {
                Some(slot) if !fresh && slot.grant.lost_reason().is_none() => {
                    slot.guards += 1;
                    slot.renew |= renew;
                    slot.deadline = slot.deadline.max(deadline);
                    slot.grant.clone()
                }
                previous => {
                    let mut carried = Vec::new();
                    if let Some(slot) = previous {
                        slot.grant
                            .mark_lost(name, "the lease ran out and the lock was granted anew");
                        // A re-entry (not a fresh grant) found old holds still there: their
                        // guards' releases must still reach the server, but no more of them
                        // than the server counts besides this grant (some old holds may
                        // have ended, and their releases must not take newer ones).
                        if !fresh {
                            carried = std::mem::take(&mut slot.carried);
                            carried.push((slot.grant.clone(), slot.guards));
                            let mut room = holds - 1;
                            for (_, guards) in &mut carried {
                                *guards = (*guards).min(room);
                                room -= *guards;
                            }
                            carried.retain(|(_, guards)| *guards > 0);
                        }
                    }
                    let grant = Grant::new(fencing_token);
                    registry.slots.insert(
                        key,
                        Slot {
                            grant: grant.clone(),
                            guards: 1,
                            renew,
                            deadline,
                            carried,
                        },
                    );
                    grant
                }
            };
            (grant, wake_keeper)
        };
        self.guards_changed(name, owner);
        if wake_keeper {
            self.start_keeper();
            self.keeper_wake.notify_one();
        }
        grant
    }

    /// Forgets one guard of `grant`. Returns false when the grant was superseded by a fresh
    /// grant to the same owner (the guard's hold no longer exists in the backend); true, and
    /// the release is to be sent, for a carried grant whose hold a re-entry found.
    pub(crate) fn unregister(&self, name: &LockName, owner: &Owner, grant: &Arc<Grant>) -> bool {
        let mut registry = self.registry();
        let key = (name.clone(), owner.clone());
        let unregistered = match registry.slots.get_mut(&key) {
            Some(slot) if Arc::ptr_eq(&slot.grant, grant) => {
                slot.guards = slot.guards.saturating_sub(1);
                true
            }
            Some(slot) => match slot.carried.iter().position(|(g, _)| Arc::ptr_eq(g, grant)) {
                Some(at) => {
                    slot.carried[at].1 = slot.carried[at].1.saturating_sub(1);
                    if slot.carried[at].1 == 0 {
                        slot.carried.swap_remove(at);
                    }
                    true
                }
                None => false,
            },
            None => false,
        };
        if registry
            .slots
            .get(&key)
            .is_some_and(|slot| slot.holds() == 0)
        {
            registry.slots.remove(&key);
        }
        drop(registry);
        if unregistered {
            self.guards_changed(name, owner);
        }
        unregistered
    }

    /// Marks `grant` lost if it is still registered: a reply to a request sent before the
    /// guard's release began, not an answer about a lock that is released meanwhile.
    pub(crate) fn lost_if_current(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        reason: &str,
    ) {
        let registry = self.registry();
        if registry
            .slots
            .get(&(name.clone(), owner.clone()))
            .is_some_and(|slot| Arc::ptr_eq(&slot.grant, grant))
        {
            grant.mark_lost(name, reason);
        }
    }

    /// After a successful extension: a fixed lease from now on, unless `renewing` (a renewed
    /// lock whose first lease was set by an extension).
    pub(crate) fn extended(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        deadline: Instant,
        renewing: bool,
    ) {
        let mut registry = self.registry();
        if let Some(slot) = registry.slots.get_mut(&(name.clone(), owner.clone()))
            && Arc::ptr_eq(&slot.grant, grant)
        {
            slot.renew &= renewing;
            slot.deadline = deadline;
        }
        drop(registry);
        self.keeper_wake.notify_one();
    }

    fn start_keeper(self: &Arc<Self>) {
        if self.keeper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.keeper_wake.clone();
        let session = self.backend.session();
        tokio::spawn(crate::keeper::keeper(weak, wake, session));
    }
}
