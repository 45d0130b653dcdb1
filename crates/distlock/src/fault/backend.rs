//! A [`Backend`] wrapper that hangs, slows, fails or panics in chosen methods: the faults of a
//! server that is alive but misbehaving, injected in the middle of a request.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use distlock::fault::{Fault, FaultyBackend, Method};
//!
//! let backend = FaultyBackend::new(distlock::open_backend("memory://").await?);
//! let locks = distlock::Locks::with_backend(
//!     backend.clone(),
//!     distlock::ConnectOptions::new().lease(Duration::from_millis(300)),
//! )?;
//! let guard = locks.mutex("job")?.acquire().await?;
//! backend.set(Method::Renew, Fault::Hang); // every renewal from now on hangs
//! let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await;
//! assert!(lost.is_ok(), "lost() fires at the lease's end although the renewal hangs");
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{
    Acquired, Backend, Extended, Owner, Published, ReleaseWaiter, Released, Renewing, SessionStatus,
};
use crate::error::{Error, Result};
use crate::name::LockName;

/// A [`Backend`] method that a [`Fault`] can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// [`Backend::ping`].
    Ping,
    /// [`Backend::try_acquire`] (also re-entry).
    TryAcquire,
    /// [`Backend::subscribe`] (a fair backend's enqueue).
    Subscribe,
    /// [`Backend::release`].
    Release,
    /// [`Backend::extend`].
    Extend,
    /// [`Backend::renew`] (the keeper's renewal).
    Renew,
    /// [`Backend::is_locked`].
    IsLocked,
    /// [`Backend::holds`].
    Holds,
    /// [`Backend::force_unlock`].
    ForceUnlock,
    /// [`Backend::still_held`] (the check after a lost session).
    StillHeld,
    /// [`Backend::publish`] (an election's leader record).
    Publish,
    /// [`Backend::read_published`].
    ReadPublished,
    /// [`Backend::withdraw`].
    Withdraw,
}

impl Method {
    /// Every method, in declaration order.
    pub const ALL: [Method; 13] = [
        Method::Ping,
        Method::TryAcquire,
        Method::Subscribe,
        Method::Release,
        Method::Extend,
        Method::Renew,
        Method::IsLocked,
        Method::Holds,
        Method::ForceUnlock,
        Method::StillHeld,
        Method::Publish,
        Method::ReadPublished,
        Method::Withdraw,
    ];

    fn index(self) -> usize {
        Method::ALL
            .iter()
            .position(|m| *m == self)
            .unwrap_or_default()
    }
}

/// What a faulty method does instead of answering normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Never answers, and never reaches the server.
    Hang,
    /// Waits, then forwards the request: a slow server.
    Delay(Duration),
    /// Waits, then fails without reaching the server.
    Fail(Duration),
    /// Forwards the request (it takes effect), waits, then fails: a reply lost on its way back.
    LoseReply(Duration),
    /// Panics instead of answering: a buggy backend.
    Panic,
}

struct Rule {
    fault: Fault,
    /// `None`: every call; `Some(n)`: the next `n` calls.
    remaining: Option<u32>,
}

/// Wraps a backend and injects [`Fault`]s into the methods the caller chooses. Every other
/// call is forwarded unchanged. Shareable: set faults while clients use it.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    rules: StdMutex<HashMap<Method, Rule>>,
    calls: [AtomicU64; Method::ALL.len()],
    faulted: [AtomicU64; Method::ALL.len()],
}

impl fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl FaultyBackend {
    /// Wraps `inner`, with no fault set.
    pub fn new(inner: Arc<dyn Backend>) -> Arc<Self> {
        Arc::new(FaultyBackend {
            inner,
            rules: StdMutex::new(HashMap::new()),
            calls: Default::default(),
            faulted: Default::default(),
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// Every call of `method` from now on meets `fault`, until [`FaultyBackend::clear`].
    pub fn set(&self, method: Method, fault: Fault) {
        self.rules().insert(
            method,
            Rule {
                fault,
                remaining: None,
            },
        );
    }

    /// The next `times` calls of `method` meet `fault`; later calls are forwarded.
    pub fn set_times(&self, method: Method, fault: Fault, times: u32) {
        self.rules().insert(
            method,
            Rule {
                fault,
                remaining: Some(times),
            },
        );
    }

    /// Calls of `method` are forwarded again.
    pub fn clear(&self, method: Method) {
        self.rules().remove(&method);
    }

    /// How many times `method` was called.
    pub fn calls(&self, method: Method) -> u64 {
        self.calls[method.index()].load(Ordering::SeqCst)
    }

    /// How many calls of `method` met a fault: lets a test assert that its fault path ran.
    pub fn faulted(&self, method: Method) -> u64 {
        self.faulted[method.index()].load(Ordering::SeqCst)
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, HashMap<Method, Rule>> {
        self.rules
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts the call and takes the fault it meets, if any.
    fn take_fault(&self, method: Method) -> Option<Fault> {
        self.calls[method.index()].fetch_add(1, Ordering::SeqCst);
        let mut rules = self.rules();
        let rule = rules.get_mut(&method)?;
        let fault = rule.fault;
        match &mut rule.remaining {
            None => {}
            Some(0) => {
                rules.remove(&method);
                return None;
            }
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    rules.remove(&method);
                }
            }
        }
        self.faulted[method.index()].fetch_add(1, Ordering::SeqCst);
        Some(fault)
    }

    async fn call<T, F>(&self, method: Method, request: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send,
    {
        let Some(fault) = self.take_fault(method) else {
            return request.await;
        };
        match fault {
            Fault::Hang => std::future::pending().await,
            Fault::Delay(delay) => {
                tokio::time::sleep(delay).await;
                request.await
            }
            Fault::Fail(delay) => {
                tokio::time::sleep(delay).await;
                Err(injected(method, "failed"))
            }
            Fault::LoseReply(delay) => {
                // The answer is dropped, whatever it was.
                let _ = request.await;
                tokio::time::sleep(delay).await;
                Err(injected(method, "lost its reply"))
            }
            Fault::Panic => panic!("fault injected: {method:?} panics"),
        }
    }
}

fn injected(method: Method, what: &str) -> Error {
    Error::backend(
        "fault",
        "answer a request with a fault injected",
        format!("{method:?} {what} (fault injected)"),
    )
}

#[async_trait]
impl Backend for FaultyBackend {
    fn scheme(&self) -> &'static str {
        self.inner.scheme()
    }

    async fn ping(&self) -> Result<()> {
        self.call(Method::Ping, self.inner.ping()).await
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let request = self.inner.try_acquire(name, owner, lease);
        self.call(Method::TryAcquire, request).await
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let request = self.inner.subscribe(name, owner, lease);
        self.call(Method::Subscribe, request).await
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        self.call(Method::Release, self.inner.release(name, owner))
            .await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        self.call(
            Method::Extend,
            self.inner.extend(name, owner, fencing_token, lease),
        )
        .await
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        self.call(Method::Renew, self.inner.renew(locks, lease))
            .await
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        self.call(Method::IsLocked, self.inner.is_locked(name))
            .await
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        self.call(Method::Holds, self.inner.holds(name, owner))
            .await
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        self.call(Method::ForceUnlock, self.inner.force_unlock(name))
            .await
    }

    async fn inspect(&self, name: &LockName) -> Result<crate::backend::LockInfo> {
        self.inner.inspect(name).await
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.inner.list_held(prefix, limit).await
    }

    fn queues_on_subscribe(&self) -> bool {
        self.inner.queues_on_subscribe()
    }

    fn attempts_share_a_connection(&self) -> bool {
        self.inner.attempts_share_a_connection()
    }

    fn readers_take_a_connection(&self) -> bool {
        self.inner.readers_take_a_connection()
    }

    /// False whatever the inner backend does: a reply this wrapper loses after the inner
    /// attempt took effect is no failure of the inner backend's, which would not undo it.
    fn undoes_failed_attempts(&self) -> bool {
        false
    }

    fn supports(&self, kind: &crate::name::LockKind) -> bool {
        self.inner.supports(kind)
    }

    async fn still_held(&self, locks: &[(LockName, Owner)]) -> Result<Vec<bool>> {
        self.call(Method::StillHeld, self.inner.still_held(locks))
            .await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        self.inner.session()
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.call(Method::Publish, self.inner.publish(key, record))
            .await
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        self.call(Method::ReadPublished, self.inner.read_published(key))
            .await
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.call(Method::Withdraw, self.inner.withdraw(key, term))
            .await
    }
}
