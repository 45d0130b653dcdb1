//! The client: one connection to a backend, the registry of locks it holds, and the keeper
//! task that renews them in batches and notices when a lease runs out.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
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

/// How many locks one renewal request carries at most.
const RENEW_BATCH: usize = 1000;

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
struct Registry {
    slots: HashMap<(LockName, Owner), Slot>,
    /// `None` while the keeper sleeps with nothing to do (or has not started).
    keeper_wakes_at: Option<Instant>,
}

/// One held lock of this client (all reentrant guards of one grant share it).
struct Slot {
    grant: Arc<Grant>,
    guards: u32,
    renew: bool,
    /// When the lease ends by the client's own clock, counted from the start of the request
    /// that last set it.
    deadline: Instant,
}

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) client_id: String,
    next_holder: AtomicU64,
    pub(crate) options: ConnectOptions,
    registry: StdMutex<Registry>,
    keeper_wake: Arc<Notify>,
    keeper_started: AtomicBool,
    renewal_calls: AtomicU64,
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

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is
        // a single insert or field write), so a poisoned lock is still usable.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a new guard. `fresh` is true when the backend made a new grant (hold count 1):
    /// any slot left from an earlier grant to this owner is then stale and marked lost.
    pub(crate) fn register(
        self: &Arc<Self>,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        fresh: bool,
        renew: bool,
        deadline: Instant,
    ) -> Arc<Grant> {
        let (grant, wake_keeper) = {
            let mut registry = self.registry();
            let key = (name.clone(), owner.clone());
            // The keeper must wake by the first renewal of a renewed lock, or by the deadline
            // of a fixed lease; it need not be disturbed when it already plans to.
            let needed_by = if renew {
                Instant::now() + self.options.lease / 3
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
                    if let Some(slot) = previous {
                        slot.grant
                            .mark_lost(name, "the lease ran out and the lock was granted anew");
                    }
                    let grant = Grant::new(fencing_token);
                    registry.slots.insert(
                        key,
                        Slot {
                            grant: grant.clone(),
                            guards: 1,
                            renew,
                            deadline,
                        },
                    );
                    grant
                }
            };
            (grant, wake_keeper)
        };
        if wake_keeper {
            self.start_keeper();
            self.keeper_wake.notify_one();
        }
        grant
    }

    /// Forgets one guard of `grant`. Returns false when the grant was superseded by a newer
    /// grant to the same owner (the guard's hold no longer exists in the backend).
    pub(crate) fn unregister(&self, name: &LockName, owner: &Owner, grant: &Arc<Grant>) -> bool {
        let mut registry = self.registry();
        let key = (name.clone(), owner.clone());
        match registry.slots.get_mut(&key) {
            Some(slot) if Arc::ptr_eq(&slot.grant, grant) => {
                slot.guards = slot.guards.saturating_sub(1);
                if slot.guards == 0 {
                    registry.slots.remove(&key);
                }
                true
            }
            _ => false,
        }
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
        tokio::spawn(keeper(weak, wake, session));
    }
}

/// The one background task of a client: renews every renewing lock in batches each
/// `lease / 3`, and marks a lock lost once its lease has run out without a successful
/// renewal. Ends when the client and all its guards are gone.
async fn keeper(
    client: Weak<ClientInner>,
    wake: Arc<Notify>,
    mut session: Option<watch::Receiver<crate::SessionStatus>>,
) {
    let mut next_renewal: Option<Instant> = None;
    let mut sessions_lost = session
        .as_mut()
        .map_or(0, |s| s.borrow_and_update().sessions_lost);
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let lease = inner.options.lease;
        let interval = lease / 3;
        let now = Instant::now();

        expire_overdue(&inner, now);
        let lost = session.as_ref().map_or(0, |s| s.borrow().sessions_lost);
        if lost > sessions_lost {
            sessions_lost = lost;
            check_all(&inner).await;
        }
        if next_renewal.is_some_and(|at| at <= now) {
            renew_all(&inner).await;
            next_renewal = None;
        }

        // Sleep until the next renewal or the earliest lease deadline, whichever is first,
        // and publish that time so that `register` wakes the keeper only when a new lock needs
        // it sooner. Computed and published under one lock: a registration either is seen
        // here or sees the published time.
        let wake_at = {
            let mut registry = inner.registry();
            let mut renewing = false;
            let mut earliest_deadline: Option<Instant> = None;
            for slot in registry.slots.values() {
                if slot.grant.lost_reason().is_none() {
                    renewing |= slot.renew;
                    earliest_deadline =
                        Some(earliest_deadline.map_or(slot.deadline, |e| e.min(slot.deadline)));
                }
            }
            next_renewal = match (renewing, next_renewal) {
                (false, _) => None,
                (true, None) => Some(Instant::now() + interval),
                (true, planned) => planned,
            };
            let wake_at = [next_renewal, earliest_deadline]
                .into_iter()
                .flatten()
                .min();
            registry.keeper_wakes_at = wake_at;
            wake_at
        };
        // A registration after the lock above stores a permit that completes this at once.
        let notified = wake.notified();
        drop(inner);
        let session_changed = async {
            // A closed channel (the backend is gone) has nothing more to say.
            let changed = match session.as_mut() {
                Some(status) => status.changed().await.is_ok(),
                None => false,
            };
            if !changed {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = crate::wake::sleep_until_or_never(wake_at) => {}
            _ = notified => {}
            _ = session_changed => {}
        }
    }
}

/// After the backend lost a session: asks which registered locks are still held and marks
/// the others lost, renewed or not.
async fn check_all(inner: &ClientInner) {
    let batch: Vec<((LockName, Owner), Arc<Grant>)> = {
        let registry = inner.registry();
        registry
            .slots
            .iter()
            .filter(|(_, slot)| slot.grant.lost_reason().is_none())
            .map(|(key, slot)| (key.clone(), slot.grant.clone()))
            .collect()
    };
    for chunk in batch.chunks(RENEW_BATCH) {
        let locks: Vec<(LockName, Owner)> = chunk.iter().map(|(key, _)| key.clone()).collect();
        match inner.backend.still_held(&locks).await {
            Ok(held) => {
                for ((key, grant), still_held) in chunk.iter().zip(held) {
                    if !still_held {
                        inner.lost_if_current(
                            &key.0,
                            &key.1,
                            grant,
                            "the session the lock lived in was lost",
                        );
                    }
                }
            }
            // The locks stay ours until their deadline, as after a failed renewal.
            Err(error) => tracing::warn!(%error, "checking locks after a lost session failed"),
        }
    }
}

fn expire_overdue(inner: &ClientInner, now: Instant) {
    let registry = inner.registry();
    for ((name, _), slot) in registry.slots.iter() {
        if slot.deadline <= now && slot.grant.lost_reason().is_none() {
            let reason = if slot.renew {
                "the lease ran out before a renewal succeeded"
            } else {
                "the lease ran out"
            };
            slot.grant.mark_lost(name, reason);
        }
    }
}

async fn renew_all(inner: &ClientInner) {
    let lease = inner.options.lease;
    let batch: Vec<((LockName, Owner), Arc<Grant>)> = {
        let registry = inner.registry();
        registry
            .slots
            .iter()
            .filter(|(_, slot)| slot.renew && slot.grant.lost_reason().is_none())
            .map(|(key, slot)| (key.clone(), slot.grant.clone()))
            .collect()
    };
    let earliest_deadline = {
        let registry = inner.registry();
        batch
            .iter()
            .filter_map(|(key, _)| registry.slots.get(key).map(|slot| slot.deadline))
            .min()
    };
    // Locks whose renewal fails stay ours until their deadline; expire_overdue marks them
    // lost if no renewal succeeds before then.
    for chunk in batch.chunks(RENEW_BATCH) {
        let locks: Vec<(LockName, Owner)> = chunk.iter().map(|(key, _)| key.clone()).collect();
        let start = Instant::now();
        inner.renewal_calls.fetch_add(1, Ordering::Relaxed);
        // A hung request must not keep the keeper from noticing deadlines, but a slow one
        // that lands before them still counts: wait for it until the earliest deadline of
        // the batch (at least one renewal interval), then try again.
        let patience = earliest_deadline
            .map_or(lease / 3, |deadline| {
                deadline.saturating_duration_since(start)
            })
            .max(lease / 3);
        let reply = tokio::time::timeout(patience, inner.backend.renew(&locks, lease)).await;
        match reply {
            Ok(Ok(renewed)) => {
                let mut registry = inner.registry();
                for ((key, grant), still_held) in chunk.iter().zip(renewed) {
                    // A lock released while this request was in flight is no longer
                    // registered: its "not held" is the release, not a loss.
                    let Some(slot) = registry
                        .slots
                        .get_mut(key)
                        .filter(|slot| Arc::ptr_eq(&slot.grant, grant))
                    else {
                        continue;
                    };
                    if !still_held {
                        grant.mark_lost(&key.0, "a renewal found the lock no longer held");
                    } else if slot.renew {
                        slot.deadline = start + lease;
                    }
                }
                tracing::debug!(locks = locks.len(), "renewed");
            }
            Ok(Err(error)) => {
                tracing::warn!(locks = locks.len(), %error, "renewal failed");
            }
            Err(_elapsed) => {
                tracing::warn!(locks = locks.len(), "renewal timed out");
            }
        }
    }
}
