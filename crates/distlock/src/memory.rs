//! The in-process backend: locks in this process's memory.
//!
//! Correct between tasks and threads of one process, and useless between processes (each
//! has its own memory). Fair: waiters are served first come, first served, as with
//! `tokio::sync::Mutex`. Use it in tests and in single-process programs. `memory://` makes a
//! new, private store; `memory://NAME` shares the store called NAME with every client in the
//! process that uses the same URL.
//!
//! Reader-writer locks are kept natively: any number of readers of a name, each with its own
//! lease, hold one entry together; a writer holds it alone, and a writer waiting in line is
//! served before readers that came after it.

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
use crate::name::{LockKind, LockName};
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
    /// The grants per key ([`key_of`]).
    held: HashMap<LockName, Grants>,
    /// The last fencing token granted per name. Kept after release so tokens keep growing.
    fencing: HashMap<LockName, u64>,
    /// Release signals per name, present while someone waits.
    releases: ReleaseSignals,
    /// Waiters per key in arrival order; a free lock goes to the first, and readers go
    /// together while no writer waits before them.
    queues: HashMap<LockName, VecDeque<Queued>>,
    next_waiter: u64,
    /// Published records per key, withdrawn ones kept for their term.
    published: HashMap<LockName, Published>,
}

/// How soon a waiter turned away from a free lock reserved for an earlier waiter tries again,
/// so that it notices when that waiter's grant expires without a release.
const RESERVED_RECHECK: Duration = Duration::from_millis(10);

/// A waiter in line.
#[derive(Debug)]
struct Queued {
    id: u64,
    owner: Owner,
    /// A reader of a reader-writer lock, which may hold beside other readers.
    shares: bool,
}

/// What holds one key: one owner (a mutex, a writer), or readers together.
#[derive(Debug)]
enum Grants {
    One(Holding),
    Readers(HashMap<Owner, Holding>),
}

impl Grants {
    fn iter(&self) -> impl Iterator<Item = &Holding> {
        let (one, readers) = match self {
            Grants::One(holding) => (Some(holding), None),
            Grants::Readers(readers) => (None, Some(readers.values())),
        };
        one.into_iter().chain(readers.into_iter().flatten())
    }

    /// How long until the first lease ends.
    fn first_end(&self, now: Instant) -> Duration {
        self.iter()
            .map(|holding| holding.expires_at.saturating_duration_since(now))
            .min()
            .unwrap_or_default()
    }
}

/// The key a name's grants are kept under, whatever it is locked as: the reads and writes of
/// a reader-writer lock and the mutex of the same name are one lock (a mutex holds it as a
/// writer would), which `force_unlock` and `is_locked` of the name see.
fn key_of(name: &LockName) -> LockName {
    name.clone().with_kind(LockKind::Exclusive)
}

fn shares(name: &LockName) -> bool {
    matches!(name.kind(), LockKind::Read)
}

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
    /// The live grants of `key`, dropping those whose lease has run out first.
    fn live(&mut self, key: &LockName, now: Instant) -> Option<&mut Grants> {
        let ended = match self.held.get_mut(key) {
            Some(Grants::One(holding)) => holding.expires_at <= now,
            Some(Grants::Readers(readers)) => {
                readers.retain(|_, holding| holding.expires_at > now);
                readers.is_empty()
            }
            None => false,
        };
        if ended {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }

    /// `owner`'s live holding of `key`.
    fn holding_of(&mut self, key: &LockName, owner: &Owner, now: Instant) -> Option<&mut Holding> {
        match self.live(key, now)? {
            Grants::One(holding) => (&holding.owner == owner).then_some(holding),
            Grants::Readers(readers) => readers.get_mut(owner),
        }
    }

    /// Drops `owner`'s holding of `key` (every hold).
    fn remove_holding(&mut self, key: &LockName, owner: &Owner) {
        let emptied = match self.held.get_mut(key) {
            Some(Grants::One(holding)) => &holding.owner == owner,
            Some(Grants::Readers(readers)) => {
                readers.remove(owner);
                readers.is_empty()
            }
            None => false,
        };
        if emptied {
            self.held.remove(key);
        }
    }

    /// True when a free `key` is reserved for a waiter other than `owner`; for a reader,
    /// when a writer waits in line before it (or at all, when it is not in line).
    fn reserved_for_other(&self, key: &LockName, owner: &Owner, reader: bool) -> bool {
        let Some(queue) = self.queues.get(key) else {
            return false;
        };
        if reader {
            return queue
                .iter()
                .take_while(|queued| &queued.owner != owner)
                .any(|queued| !queued.shares);
        }
        queue.front().is_some_and(|first| &first.owner != owner)
    }

    fn leave_queue(&mut self, name: &LockName, keep: impl Fn(&Queued) -> bool) {
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
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
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
            .filter(|(name, grants)| {
                grants.iter().any(|holding| holding.expires_at > now)
                    && name.as_str().starts_with(prefix)
            })
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
        let key = key_of(name);
        let reader = shares(name);
        let mut state = self.state();
        let same_kind = match state.live(&key, now) {
            Some(Grants::Readers(_)) => reader,
            Some(Grants::One(_)) => !reader,
            None => false,
        };
        if same_kind && let Some(holding) = state.holding_of(&key, owner, now) {
            holding.holds += 1;
            holding.expires_at = holding.expires_at.max(now + lease);
            return Ok(Acquired::Granted {
                fencing_token: holding.fencing_token,
                holds: holding.holds,
            });
        }
        match state.live(&key, now) {
            Some(Grants::Readers(_)) if reader => {}
            Some(grants) => {
                return Ok(Acquired::Held {
                    ttl: Some(grants.first_end(now)),
                });
            }
            None => {}
        }
        if state.reserved_for_other(&key, owner, reader) {
            return Ok(Acquired::Held {
                ttl: Some(RESERVED_RECHECK),
            });
        }
        state.leave_queue(&key, |queued| &queued.owner != owner);
        let token = state.fencing.entry(key.clone()).or_insert(0);
        *token += 1;
        let fencing_token = *token;
        let holding = Holding {
            owner: owner.clone(),
            holds: 1,
            fencing_token,
            expires_at: now + lease,
        };
        match state.held.get_mut(&key) {
            Some(Grants::Readers(readers)) => {
                readers.insert(owner.clone(), holding);
            }
            _ if reader => {
                let readers = HashMap::from([(owner.clone(), holding)]);
                state.held.insert(key, Grants::Readers(readers));
            }
            _ => {
                state.held.insert(key, Grants::One(holding));
            }
        }
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
        let key = key_of(name);
        let mut state = self.state();
        let receiver = state.releases.subscribe(key.as_str());
        state.next_waiter += 1;
        let id = state.next_waiter;
        state.queues.entry(key.clone()).or_default().push_back(Queued {
            id,
            owner: owner.clone(),
            shares: shares(name),
        });
        Ok(Box::new(MemoryWaiter {
            store: self.store.clone(),
            name: key,
            id,
            receiver,
        }))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let now = Instant::now();
        let key = key_of(name);
        let mut state = self.state();
        let Some(holding) = state.holding_of(&key, owner, now) else {
            // A reader's hold is its own: other readers holding do not make it another's.
            let other = !shares(name) && state.live(&key, now).is_some();
            return Ok(if other {
                Released::HeldByOther
            } else {
                Released::NotHeld
            });
        };
        holding.holds -= 1;
        let remaining_holds = holding.holds;
        if remaining_holds == 0 {
            state.remove_holding(&key, owner);
            state.signal_release(&key);
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
        let key = key_of(name);
        let mut state = self.state();
        if let Some(holding) = state.holding_of(&key, owner, now) {
            if holding.fencing_token != fencing_token {
                return Ok(Extended::NotHeld);
            }
            holding.expires_at = now + lease;
            return Ok(Extended::Extended);
        }
        Ok(if !shares(name) && state.live(&key, now).is_some() {
            Extended::HeldByOther
        } else {
            Extended::NotHeld
        })
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(locks
            .iter()
            .map(|renewing| {
                let (name, owner) = &renewing.lock;
                match state.holding_of(&key_of(name), owner, now) {
                    Some(holding) if holding.fencing_token == renewing.fencing_token => {
                        holding.expires_at = now + lease;
                        true
                    }
                    _ => false,
                }
            })
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(self.state().live(&key_of(name), Instant::now()).is_some())
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        Ok(self
            .state()
            .holding_of(&key_of(name), owner, Instant::now())
            .map_or(0, |holding| holding.holds))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let now = Instant::now();
        let key = key_of(name);
        let mut state = self.state();
        let waiters = state.queues.get(&key).map_or(0, |queue| queue.len() as u64);
        Ok(match state.live(&key, now) {
            Some(Grants::Readers(readers)) => LockInfo {
                locked: true,
                holder: None,
                holds: Some(readers.values().map(|holding| holding.holds).sum()),
                fencing_token: readers.values().map(|holding| holding.fencing_token).max(),
                remaining_lease: readers
                    .values()
                    .map(|holding| holding.expires_at.saturating_duration_since(now))
                    .max(),
                waiters: Some(waiters),
            },
            Some(Grants::One(holding)) => LockInfo {
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
        let key = key_of(name);
        let mut state = self.state();
        let was_held = state.live(&key, Instant::now()).is_some();
        if was_held {
            state.held.remove(&key);
            state.signal_release(&key);
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
        let id = self.id;
        let Some(at) = state
            .queues
            .get(&self.name)
            .and_then(|queue| queue.iter().position(|queued| queued.id == id))
        else {
            return;
        };
        let writer = state.queues[&self.name]
            .get(at)
            .is_some_and(|queued| !queued.shares);
        state.leave_queue(&self.name, |queued| queued.id != id);
        if at == 0 || writer {
            // The next waiter may now take a free lock, or readers that waited behind
            // this writer may join the readers holding.
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
