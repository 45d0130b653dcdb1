//! The keeper: what a client knows about the locks it holds (the registry of grants, their
//! lease deadlines and loss signals) and the one background task that renews them and
//! notices when one is lost ([`task`]).
//!
//! Every acquisition registers its grant here with a [`GrantKind`] (a fresh grant, or a
//! re-entry into holds that are still there) and a [`LeaseMode`] (renewed by the keeper, or a
//! fixed lease that ends by itself); guards unregister on release.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backend::{Backend, Owner};
use crate::error::LossReason;
use crate::name::LockName;
use crate::options::{ConnectOptions, lease_deadline};

pub(crate) mod settle;
mod task;

/// How a held lock's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// The keeper renews it every `lease / 3` while a guard lives.
    Renewed,
    /// It ends at its deadline unless extended.
    Fixed,
}

/// What a grant is to the owner it went to, from the hold count the backend answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantKind {
    /// A new grant: any slot left from an earlier grant to this owner is stale.
    Fresh,
    /// Another hold on a lock the owner still holds; `holds` counts them all.
    Reentered { holds: u32 },
}

impl GrantKind {
    /// The kind of a grant whose owner now has `holds` holds.
    pub(crate) fn from_holds(holds: u32) -> Self {
        if holds <= 1 {
            GrantKind::Fresh
        } else {
            GrantKind::Reentered { holds }
        }
    }
}

/// Why a lock was lost, shared by every guard of one grant.
pub(crate) struct Grant {
    fencing_token: u64,
    lost: watch::Sender<Option<LossReason>>,
    /// The backend's scheme and the grant's time, for the metrics.
    backend: &'static str,
    granted_at: Instant,
}

impl Grant {
    fn new(fencing_token: u64, backend: &'static str) -> Arc<Self> {
        crate::meter::hold_started(backend);
        Arc::new(Grant {
            fencing_token,
            lost: watch::channel(None).0,
            backend,
            granted_at: Instant::now(),
        })
    }

    pub(crate) fn mark_lost(&self, name: &LockName, reason: LossReason) {
        let first = self.lost.send_if_modified(|state| {
            if state.is_none() {
                *state = Some(reason);
                true
            } else {
                false
            }
        });
        if first {
            crate::meter::lost(self.backend, reason);
            tracing::warn!(lock = %name, fencing_token = self.fencing_token, %reason, "lock lost");
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<LossReason> {
        *self.lost.borrow()
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<LossReason>> {
        self.lost.subscribe()
    }
}

impl Drop for Grant {
    /// The last guard and the registry let go of the grant: its hold has ended (released,
    /// lost, or left to run out).
    fn drop(&mut self) {
        crate::meter::hold_ended(self.backend, self.granted_at.elapsed());
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
    pub(crate) mode: LeaseMode,
    /// When the lease ends by the client's own clock, counted from the start of the request
    /// that last set it.
    pub(crate) deadline: Instant,
    /// Guards of earlier grants to this owner that the client had given up as lost while the
    /// server still held them (a re-entry found their holds): their releases must still reach
    /// the server.
    carried: Vec<(Arc<Grant>, u32)>,
    /// The last request that renews the lock (a renewal, a handover's confirmation), by its
    /// start and lease, until it is answered: it may still run on the server after a change
    /// of the lease by the caller.
    pub(crate) renewing: Option<(Instant, Duration)>,
    /// The caller's last change of the lease (`extend`, `set_lease`): when it started, and
    /// when its answer came (or its outcome became unknown). A renewing request that started
    /// before that answer may have run before or after the change on the server, so its own
    /// answer can only shorten the client's deadline.
    lease_change: Option<(Instant, Option<Instant>)>,
    /// The grant's fresh reply was registered (its first hold): another fresh reply with its
    /// token is not this grant.
    fresh_seen: bool,
}

impl Slot {
    /// A renewing request that started at `start` was answered: the lock is held for `lease`
    /// from then. It lengthens the deadline unless it started before the answer to a change
    /// of the lease by the caller (which of the two ran last on the server is unknown): then
    /// it can only shorten it.
    pub(crate) fn renewed(&mut self, start: Instant, lease: Duration) {
        if self.renewing.is_some_and(|(sent, _)| sent == start) {
            self.renewing = None;
        }
        let end = lease_deadline(start, lease);
        let raced = self
            .lease_change
            .is_some_and(|(_, answered)| answered.is_none_or(|answered| start < answered));
        if raced {
            self.deadline = self.deadline.min(end);
        } else if self.grant.lost_reason().is_none() {
            self.deadline = self.deadline.max(end);
        }
    }

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
    requests: StdMutex<settle::Requests>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Lets the keeper task see that the client is gone and end.
        self.keeper_wake.notify_one();
    }
}

/// A client's id: `HOST/PID/UUID`. The UUID makes it unique; the host and the process id make
/// the holders that `distlock status` and `list` show readable (who holds the lock). The host
/// keeps only letters, digits, `.` and `-` (at most 63 of them), so that the id holds no
/// separator a backend uses.
fn new_client_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
        .take(63)
        .collect();
    let host = if host.is_empty() { "localhost" } else { &host };
    format!(
        "{host}/{}/{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

impl ClientInner {
    pub(crate) fn new(backend: Arc<dyn Backend>, options: ConnectOptions) -> Self {
        ClientInner {
            backend,
            client_id: new_client_id(),
            next_holder: AtomicU64::new(1),
            options,
            registry: StdMutex::new(Registry::default()),
            keeper_wake: Arc::new(Notify::new()),
            keeper_started: AtomicBool::new(false),
            renewal_calls: AtomicU64::new(0),
            requests: StdMutex::default(),
        }
    }

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

    pub(crate) fn requests(&self) -> std::sync::MutexGuard<'_, settle::Requests> {
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

    /// Records a new guard of a grant with `fencing_token` whose lease ends at `deadline`.
    /// A fresh grant makes any slot left from an earlier grant to this owner stale (it is
    /// marked lost); a re-entry adds a guard to holds that are still there.
    pub(crate) fn register(
        self: &Arc<Self>,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        kind: GrantKind,
        mode: LeaseMode,
        deadline: Instant,
    ) -> Arc<Grant> {
        let (grant, wake_keeper) = {
            let mut registry = self.registry();
            let key = (name.clone(), owner.clone());
            // The keeper must wake by the lock's deadline, and by the first renewal of a
            // renewed lock (a handed-over grant's deadline comes first: its lease is short);
            // it need not be disturbed when it already plans to.
            let needed_by = if mode == LeaseMode::Renewed {
                deadline.min(Instant::now() + self.options.lease_duration() / 3)
            } else {
                deadline
            };
            let wake_keeper = registry.keeper_wakes_at.is_none_or(|at| at > needed_by);
            let grant = match registry.slots.get_mut(&key) {
                // Another hold on the grant this client knows: the same fencing token (a grant's
                // token is its own). A re-entry that answers with another token found a newer
                // grant of the server. A fresh grant with the same token is that grant's first
                // hold, registered after a re-entry of another task of the owner that was
                // answered later but registered first.
                Some(slot)
                    if slot.grant.lost_reason().is_none()
                        && slot.grant.fencing_token() == fencing_token
                        && (kind != GrantKind::Fresh || !slot.fresh_seen) =>
                {
                    // A grant has one fresh reply: a second one with the same token would
                    // be a new grant from a backend whose counter went back.
                    slot.fresh_seen |= kind == GrantKind::Fresh;
                    slot.guards += 1;
                    if mode == LeaseMode::Renewed {
                        slot.mode = LeaseMode::Renewed;
                    }
                    slot.deadline = slot.deadline.max(deadline);
                    slot.grant.clone()
                }
                previous => {
                    let mut carried = Vec::new();
                    if let Some(slot) = previous {
                        slot.grant.mark_lost(name, LossReason::GrantedAnew);
                        // A re-entry (not a fresh grant) found old holds still there: their
                        // guards' releases must still reach the server, but no more of them
                        // than the server counts besides this grant (some old holds may
                        // have ended, and their releases must not take newer ones).
                        // Only holds of the same grant (the same token) can still be there; a
                        // newer grant's extra hold is another request of this owner in flight.
                        if let GrantKind::Reentered { holds } = kind
                            && slot.grant.fencing_token() == fencing_token
                        {
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
                    let grant = Grant::new(fencing_token, self.backend.scheme());
                    registry.slots.insert(
                        key,
                        Slot {
                            grant: grant.clone(),
                            guards: 1,
                            mode,
                            deadline,
                            carried,
                            renewing: None,
                            lease_change: None,
                            fresh_seen: kind == GrantKind::Fresh,
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
        reason: LossReason,
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

    /// Runs `update` on `grant`'s slot while it is registered, then wakes the keeper (a
    /// deadline may have moved).
    fn with_slot(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        update: impl FnOnce(&mut Slot, Duration),
    ) {
        let lease = self.options.lease_duration();
        let mut registry = self.registry();
        if let Some(slot) = registry.slots.get_mut(&(name.clone(), owner.clone()))
            && Arc::ptr_eq(&slot.grant, grant)
        {
            update(slot, lease);
        }
        drop(registry);
        self.keeper_wake.notify_one();
    }

    /// True while a renewing request of `grant` (a batch renewal, a handover's
    /// confirmation) is unanswered.
    pub(crate) fn renewal_in_flight(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
    ) -> bool {
        let registry = self.registry();
        registry
            .slots
            .get(&(name.clone(), owner.clone()))
            .is_some_and(|slot| Arc::ptr_eq(&slot.grant, grant) && slot.renewing.is_some())
    }

    /// A handover's confirmation, which extends `grant`'s lock to `lease`, starts at `start`.
    pub(crate) fn confirmation_starts(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        start: Instant,
        lease: Duration,
    ) {
        self.with_slot(name, owner, grant, |slot, _| {
            slot.renewing = Some((start, lease));
        });
    }

    /// A handover's confirmation that started at `start` was answered: held for `lease` from
    /// then.
    pub(crate) fn confirmed(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        start: Instant,
        lease: Duration,
    ) {
        self.with_slot(name, owner, grant, |slot, _| slot.renewed(start, lease));
    }

    /// The caller starts changing `grant`'s lease (`extend`, `set_lease`): returns the
    /// renewing request that may still run on the server after the change.
    pub(crate) fn lease_change_starts(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        start: Instant,
    ) -> Option<(Instant, Duration)> {
        let mut pending = None;
        self.with_slot(name, owner, grant, |slot, _| {
            slot.lease_change = Some((start, None));
            pending = slot.renewing;
        });
        pending
    }

    /// The caller's change of `grant`'s lease, started at `start` while `pending` could still
    /// run, was answered: a fixed lease ending at `deadline`, or sooner when a renewing
    /// request may have run after the change (its lease then counts on the server).
    pub(crate) fn lease_changed(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        (start, deadline): (Instant, Instant),
        pending: Option<(Instant, Duration)>,
    ) {
        self.with_slot(name, owner, grant, |slot, _| {
            let since = slot.renewing.filter(|(sent, _)| *sent >= start);
            slot.deadline = [pending, since]
                .into_iter()
                .flatten()
                .fold(deadline, |end, (sent, lease)| {
                    end.min(lease_deadline(sent, lease))
                });
            slot.mode = LeaseMode::Fixed;
            slot.lease_change = Some((start, Some(Instant::now())));
        });
    }

    /// The caller's change of `grant`'s lease failed or was dropped, and may have run on the
    /// server: the client's deadline is at most `bound`, the end of the lease it asked for.
    pub(crate) fn lease_change_unknown(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
        bound: Instant,
    ) {
        self.with_slot(name, owner, grant, |slot, _| {
            slot.deadline = slot.deadline.min(bound);
            if let Some((_, answered)) = &mut slot.lease_change {
                *answered = Some(Instant::now());
            }
        });
    }

    /// The lease mode of `grant`'s slot, while it is registered.
    pub(crate) fn lease_mode(
        &self,
        name: &LockName,
        owner: &Owner,
        grant: &Arc<Grant>,
    ) -> Option<LeaseMode> {
        self.registry()
            .slots
            .get(&(name.clone(), owner.clone()))
            .filter(|slot| Arc::ptr_eq(&slot.grant, grant))
            .map(|slot| slot.mode)
    }

    fn start_keeper(self: &Arc<Self>) {
        if self.keeper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.keeper_wake.clone();
        let session = self.backend.session();
        tokio::spawn(task::keeper(weak, wake, session));
    }
}
