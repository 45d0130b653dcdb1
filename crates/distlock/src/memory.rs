//! The in-process backend: locks in this process's memory.
//!
//! Correct between tasks and threads of one process, and useless between processes (each
//! has its own memory). Fair: waiters are served first come, first served, as with
//! `tokio::sync::Mutex`. Use it in tests and in single-process programs. `memory://` makes a
//! new, private store; `memory://NAME` shares the store called NAME with every client in the
//! process that uses the same URL.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{
    Acquired, Backend, Extended, LockInfo, Owner, Published, ReleaseWaiter, Released, Renewing,
    Woken,
};
use crate::error::Result;
use crate::name::LockName;
use crate::wake::ReleaseSignals;

/// Locks kept in this process's memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

#[derive(Debug, Default)]
struct Store {
    state: StdMutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<LockName, Holding>,
    /// The last fencing token granted per name. Kept after release so tokens keep growing.
    fencing: HashMap<LockName, u64>,
    /// Release signals per name, present while someone waits.
    releases: ReleaseSignals,
    /// Waiters per name in arrival order (waiter id, owner); a free lock goes to the first.
    queues: HashMap<LockName, VecDeque<(u64, Owner)>>,
    next_waiter: u64,
    /// Published records per key, withdrawn ones kept for their term.
    published: HashMap<LockName, Published>,
}

/// How soon a waiter turned away from a free lock reserved for an earlier waiter tries again,
/// so that it notices when that waiter's grant expires without a release.
const RESERVED_RECHECK: Duration = Duration::from_millis(10);

#[derive(Debug)]
struct Holding {
    owner: Owner,
    holds: u32,
    fencing_token: u64,
    expires_at: Instant,
}

impl MemoryBackend {
    /// A new private store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide store called `name`, made on first use. It lives while a client
    /// uses it.
    pub fn named(name: &str) -> Self {
        static NAMED: OnceLock<StdMutex<HashMap<String, Weak<Store>>>> = OnceLock::new();
        let mut named = NAMED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        named.retain(|_, store| store.strong_count() > 0);
        if let Some(store) = named.get(name).and_then(Weak::upgrade) {
            return MemoryBackend { store };
        }
        let store = Arc::new(Store::default());
        named.insert(name.to_owned(), Arc::downgrade(&store));
        MemoryBackend { store }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update below completes without a panic point, so a poisoned lock is whole.
        self.store
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// The live holding of `name`, dropping it first if its lease has run out.
    fn live(&mut self, name: &LockName, now: Instant) -> Option<&mut Holding> {
        if self.held.get(name).is_some_and(|h| h.expires_at <= now) {
            self.held.remove(name);
        }
        self.held.get_mut(name)
    }

    /// True when a free `name` is reserved for a waiter other than `owner`.
    fn reserved_for_other(&self, name: &LockName, owner: &Owner) -> bool {
        self.queues
            .get(name)
            .and_then(VecDeque::front)
            .is_some_and(|(_, first)| first != owner)
    }

    fn leave_queue(&mut self, name: &LockName, keep: impl Fn(&(u64, Owner)) -> bool) {
        if let Some(queue) = self.queues.get_mut(name) {
            queue.retain(keep);
            if queue.is_empty() {
                self.queues.remove(name);
            }
        }
    }

    fn signal_release(&mut self, name: &LockName) {
        self.releases.signal(name.as_str());
    }
}

/// The store a `memory://` URL names: a new private one, or with `memory://NAME` the store
/// called NAME shared by every client of this process that uses the same URL.
///
/// # Errors
/// [`Error::InvalidInput`](crate::Error::InvalidInput) for a query option (there are none).
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let (base, _) = crate::scheme::Query::parse(url)?;
    let name = base.strip_prefix("memory://").unwrap_or_default();
    Ok(Arc::new(if name.is_empty() {
        MemoryBackend::new()
    } else {
        MemoryBackend::named(name)
    }))
}

crate::driver::driver!(check_url: |_| Ok(()), open: connect);

#[async_trait]
impl Backend for MemoryBackend {
    fn scheme(&self) -> &'static str {
        "memory"
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        kind.is_exclusive()
    }

    async fn ping(&self) -> Result<()> {
        drop(self.state());
        Ok(())
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let now = Instant::now();
        let state = self.state();
        let mut names: Vec<String> = state
            .held
            .iter()
            .filter(|(name, holding)| holding.expires_at > now && name.as_str().starts_with(prefix))
            .map(|(name, _)| name.as_str().to_owned())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.truncate(limit);
        Ok(names)
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(holding) = state.live(name, now) {
            if &holding.owner != owner {
                return Ok(Acquired::Held {
                    ttl: Some(holding.expires_at - now),
                });
            }
            holding.holds += 1;
            holding.expires_at = holding.expires_at.max(now + lease);
            return Ok(Acquired::Granted {
                fencing_token: holding.fencing_token,
                holds: holding.holds,
            });
        }
        if state.reserved_for_other(name, owner) {
            return Ok(Acquired::Held {
                ttl: Some(RESERVED_RECHECK),
            });
        }
        state.leave_queue(name, |(_, waiting)| waiting != owner);
        let token = state.fencing.entry(name.clone()).or_insert(0);
        *token += 1;
        let fencing_token = *token;
        state.held.insert(
            name.clone(),
            Holding {
                owner: owner.clone(),
                holds: 1,
                fencing_token,
                expires_at: now + lease,
            },
        );
        Ok(Acquired::Granted {
            fencing_token,
            holds: 1,
        })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let mut state = self.state();
        let receiver = state.releases.subscribe(name.as_str());
        state.next_waiter += 1;
        let id = state.next_waiter;
        state
            .queues
            .entry(name.clone())
            .or_default()
            .push_back((id, owner.clone()));
        Ok(Box::new(MemoryWaiter {
            store: self.store.clone(),
            name: name.clone(),
            id,
            receiver,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let now = Instant::now();
        let mut state = self.state();
        let Some(holding) = state.live(name, now) else {
            return Ok(Released::NotHeld);
        };
        if &holding.owner != owner {
            return Ok(Released::HeldByOther);
        }
        holding.holds -= 1;
        let remaining_holds = holding.holds;
        if remaining_holds == 0 {
            state.held.remove(name);
            state.signal_release(name);
        }
        Ok(Released::Released { remaining_holds })
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(match state.live(name, now) {
            None => Extended::NotHeld,
            Some(holding) if &holding.owner != owner => Extended::HeldByOther,
            Some(holding) if holding.fencing_token != fencing_token => Extended::NotHeld,
            Some(holding) => {
                holding.expires_at = now + lease;
                Extended::Extended
            }
        })
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(locks
            .iter()
            .map(|renewing| match state.live(&renewing.lock.0, now) {
                Some(holding)
                    if holding.owner == renewing.lock.1
                        && holding.fencing_token == renewing.fencing_token =>
                {
                    holding.expires_at = now + lease;
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(self.state().live(name, Instant::now()).is_some())
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        Ok(match self.state().live(name, Instant::now()) {
            Some(holding) if &holding.owner == owner => holding.holds,
            _ => 0,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let now = Instant::now();
        let mut state = self.state();
        let waiters = state.queues.get(name).map_or(0, |queue| queue.len() as u64);
        Ok(match state.live(name, now) {
            Some(holding) => LockInfo {
                locked: true,
                holder: Some(holding.owner.as_str().to_owned()),
                holds: Some(holding.holds),
                fencing_token: Some(holding.fencing_token),
                remaining_lease: Some(holding.expires_at.saturating_duration_since(now)),
                waiters: Some(waiters),
            },
            None => LockInfo {
                waiters: Some(waiters),
                ..LockInfo::new(false)
            },
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let mut state = self.state();
        let was_held = state.live(name, Instant::now()).is_some();
        if was_held {
            state.held.remove(name);
            state.signal_release(name);
        }
        Ok(was_held)
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        let mut state = self.state();
        let stored = state.published.get(key).cloned();
        let after = record.clone().winner(stored);
        state.published.insert(key.clone(), after.clone());
        Ok(after)
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        Ok(self
            .state()
            .published
            .get(key)
            .cloned()
            .and_then(Published::live))
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        let mut state = self.state();
        match state.published.get_mut(key) {
            Some(stored) if stored.term == term && !stored.is_withdrawn() => {
                *stored = Published::withdrawn(term);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

struct MemoryWaiter {
    store: Arc<Store>,
    name: LockName,
    id: u64,
    receiver: watch::Receiver<u64>,
}

impl Drop for MemoryWaiter {
    fn drop(&mut self) {
        let mut state = self
            .store
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let was_first = state
            .queues
            .get(&self.name)
            .and_then(VecDeque::front)
            .is_some_and(|(id, _)| *id == self.id);
        let id = self.id;
        state.leave_queue(&self.name, |(waiting, _)| *waiting != id);
        if was_first {
            // The next waiter may now take a free lock.
            state.signal_release(&self.name);
        }
    }
}

#[async_trait]
impl ReleaseWaiter for MemoryWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        crate::wake::release_signalled(&mut self.receiver, max).await
    }
}
