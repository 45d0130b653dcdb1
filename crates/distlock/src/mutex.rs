//! The distributed mutual-exclusion lock and its guard.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Acquired, Extended, Owner, ReleaseWaiter, Released, Woken};
use crate::client::{ClientInner, Grant, MAX_DURATION, lease_deadline, validate_lease};
use crate::error::{Error, Result};
use crate::finish::FinishOnDrop;
use crate::name::LockName;
use crate::settle::Ticket;

mod guard;
mod run;

pub use self::guard::Guard;
use self::guard::GuardState;

/// How to acquire: how long to wait, and whether to hold with a fixed lease.
///
/// ```
/// # use std::time::Duration;
/// let opts = distlock::AcquireOptions::new()
///     .wait(Duration::from_secs(2))
///     .lease(Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    wait: Option<Duration>,
    lease: Option<Duration>,
}

impl AcquireOptions {
    /// Wait without a limit; hold with the client's renewed lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give up with [`Error::Timeout`] after waiting this long. Zero tries once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Hold for this fixed lease, without renewal (Redisson's `leaseTime`). The lock frees
    /// itself when the lease runs out, even while the guard lives, and the guard's
    /// [`Guard::lost`] fires then.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    fn validate(&self) -> Result<()> {
        if let Some(lease) = self.lease {
            validate_lease(lease)?;
        }
        if let Some(wait) = self.wait
            && wait > MAX_DURATION
        {
            return Err(Error::invalid(
                "wait",
                format!(
                    "{wait:?} is longer than the limit {MAX_DURATION:?}; use Mutex::acquire to \
                     wait without a limit"
                ),
            ));
        }
        Ok(())
    }
}

/// A handle on one distributed mutual-exclusion lock, made by
/// [`Locks::mutex`](crate::Locks::mutex) or [`Holder::mutex`].
///
/// A handle from `Locks::mutex` gives every acquisition its own owner identity, so tasks that
/// share the handle (or clones of it) exclude each other, as with `tokio::sync::Mutex`.
/// A handle from [`Holder::mutex`] acquires as that holder: acquiring again while holding
/// re-enters the lock and increments its hold count, and the lock is free once every guard
/// has been released.
#[derive(Clone)]
pub struct Mutex {
    client: Arc<ClientInner>,
    name: LockName,
    /// `None`: a fresh owner per acquisition.
    holder: Option<Owner>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .finish()
    }
}

impl Mutex {
    pub(crate) fn new(client: Arc<ClientInner>, name: LockName, holder: Option<Owner>) -> Self {
        Mutex {
            client,
            name,
            holder,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The holder this handle acquires as, when it is bound to one ([`Holder::mutex`]).
    pub fn holder(&self) -> Option<&Owner> {
        self.holder.as_ref()
    }

    /// Waits until the lock is granted, without a limit, and holds it with the client's lease
    /// (30 s by default), renewed every third of the lease while the guard lives.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails; the wait ends then.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropping the future leaves nothing behind: a grant that arrives after the
    /// drop is released in the background.
    pub async fn acquire(&self) -> Result<Guard> {
        self.acquire_with(AcquireOptions::new()).await
    }

    /// Tries once and returns at once: `None` when someone else holds the lock.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.acquire_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Acquires with a wait limit and/or a fixed lease (Redisson's
    /// `tryLock(waitTime, leaseTime)`).
    ///
    /// # Notable errors
    /// - [`Error::Timeout`] when the wait runs out.
    /// - [`Error::InvalidInput`] for a zero or absurd lease, or a wait over one day.
    /// - [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::acquire`].
    pub async fn acquire_with(&self, options: AcquireOptions) -> Result<Guard> {
        let start = Instant::now();
        match self.acquire_inner(options).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Timeout {
                name: self.name.to_string(),
                waited: start.elapsed(),
            }),
        }
    }

    async fn acquire_inner(&self, options: AcquireOptions) -> Result<Option<Guard>> {
        options.validate()?;
        let span = tracing::debug_span!(
            "distlock.acquire",
            lock = %self.name,
            backend = self.client.backend.scheme(),
        );
        let owner = match &self.holder {
            Some(holder) => holder.clone(),
            None => self.client.new_owner(),
        };
        acquire_loop(&self.client, &self.name, &owner, options)
            .instrument(span)
            .await
    }
}

async fn acquire_loop(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    options: AcquireOptions,
) -> Result<Option<Guard>> {
    let start = Instant::now();
    // Held until the guard is registered (or the acquisition ends, and any attempt it left
    // finishing in the background has settled): a settle of the same owner meanwhile cannot
    // tell a grant on its way from a left-over hold, so it waits.
    let acquisition = Arc::new(client.begin_request(name, owner));
    let deadline = options.wait.map(|wait| start + wait);
    let lease = options.lease.unwrap_or(client.options.lease_duration());
    let mut waiter: Option<Box<dyn ReleaseWaiter>> = None;
    let mut waiter_spent = false;
    if client.backend.queues_on_subscribe() && options.wait != Some(Duration::ZERO) {
        // Join the queue first; the attempts below take up the place and check it.
        waiter = Some(subscribe(client, name, owner, lease).await?);
    }
    loop {
        if waiter_spent {
            // A waiter whose handover ran out is done: the next failed attempt subscribes anew.
            waiter = None;
            waiter_spent = false;
        }
        let attempt_start = Instant::now();
        match attempt(client, name, owner, lease, &acquisition).await? {
            Acquired::Granted {
                fencing_token,
                holds,
            } => {
                let deadline = lease_deadline(attempt_start, lease);
                return Ok(Some(granted(
                    client,
                    name,
                    owner,
                    &options,
                    (fencing_token, holds, deadline),
                    start,
                )));
            }
            Acquired::Held { ttl } => {
                let remaining = match deadline {
                    Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                    None => MAX_DURATION,
                };
                if remaining.is_zero() {
                    tracing::debug!("held by another owner; giving up");
                    return Ok(None);
                }
                match waiter.as_mut() {
                    None => {
                        // Subscribe, then try again at once: a release between the failed
                        // attempt and the subscription is not missed.
                        waiter = Some(subscribe(client, name, owner, lease).await?);
                    }
                    Some(waiter) => {
                        let ttl = ttl.unwrap_or(remaining).max(Duration::from_millis(1));
                        tracing::trace!(?ttl, "waiting for a release");
                        if let Woken::Granted {
                            fencing_token,
                            since,
                            lease: handover,
                        } = waiter.wait(ttl.min(remaining)).await
                        {
                            // Handed over by the releaser: held now, for a short lease that
                            // a background request extends to ours.
                            let mut deadline = lease_deadline(since, handover);
                            let mut confirm = handover < lease;
                            let mut handover_gone = false;
                            if deadline <= Instant::now() {
                                // The short lease may have run out while this waiter was
                                // slow: confirm before handing out a guard.
                                match confirm_late_handover(client, name, owner, lease).await? {
                                    Some(confirmed) => (deadline, confirm) = (confirmed, false),
                                    None => {
                                        tracing::debug!("the handover ran out; trying again");
                                        handover_gone = true;
                                    }
                                }
                            }
                            if handover_gone {
                                waiter_spent = true;
                                continue;
                            }
                            let guard = granted(
                                client,
                                name,
                                owner,
                                &options,
                                (fencing_token, 1, deadline),
                                start,
                            );
                            if confirm {
                                confirm_handover(&guard, lease, options.lease.is_none());
                            }
                            return Ok(Some(guard));
                        }
                    }
                }
            }
        }
    }
}

/// Extends a handed-over grant whose short lease may have run out to the lease the caller
/// asked for, before the caller gets a guard: the new deadline, or `None` when the grant is
/// gone. If the acquire future is dropped meanwhile, a hold the extension kept is released.
async fn confirm_late_handover(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    lease: Duration,
) -> Result<Option<Instant>> {
    let backend = client.backend.clone();
    let (name, owner) = (name.clone(), owner.clone());
    let start = Instant::now();
    let request = {
        let (backend, name, owner) = (backend.clone(), name.clone(), owner.clone());
        async move { backend.extend(&name, &owner, lease).await }
    };
    let undo = {
        let (client, name, owner) = (client.clone(), name.clone(), owner.clone());
        move |result: Result<Extended>| async move {
            if !matches!(result, Ok(Extended::NotHeld | Extended::HeldByOther)) {
                tracing::debug!(lock = %name, "acquire cancelled after a handover; releasing it");
                let ticket = client.begin_request(&name, &owner);
                let _ = release_one(&client, &name, &owner, ticket).await;
            }
        }
    };
    match FinishOnDrop::new(request, undo).await {
        Ok(Extended::Extended) => Ok(Some(lease_deadline(start, lease))),
        Ok(Extended::NotHeld | Extended::HeldByOther) => Ok(None),
        Err(error) => {
            // Unknown whether the handover still holds: give it back, then report.
            let client = client.clone();
            let ticket = client.begin_request(&name, &owner);
            tokio::spawn(async move {
                let _ = release_one(&client, &name, &owner, ticket).await;
            });
            Err(error)
        }
    }
}

/// Extends a handed-over grant to the lease the caller asked for, in the background; a
/// refusal marks it lost, an error leaves it to run out (and be reported lost) unless a
/// renewal succeeds first.
fn confirm_handover(guard: &Guard, lease: Duration, renewing: bool) {
    let Some(state) = guard.state.as_ref() else {
        return;
    };
    let (client, name, owner, grant) = (
        state.client.clone(),
        state.name.clone(),
        state.owner.clone(),
        state.grant.clone(),
    );
    tokio::spawn(async move {
        let start = Instant::now();
        match client.backend.extend(&name, &owner, lease).await {
            Ok(Extended::Extended) => {
                client.extended(
                    &name,
                    &owner,
                    &grant,
                    lease_deadline(start, lease),
                    renewing,
                );
            }
            Ok(Extended::NotHeld | Extended::HeldByOther) => {
                client.lost_if_current(
                    &name,
                    &owner,
                    &grant,
                    "the lock handed over ran out before it was extended",
                );
            }
            Err(error) => {
                tracing::warn!(lock = %name, %error, "extending a handed-over lock failed");
            }
        }
    });
}

/// Registers a grant (fencing token, holds, local lease deadline) and makes its guard.
fn granted(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    options: &AcquireOptions,
    (fencing_token, holds, deadline): (u64, u32, Instant),
    start: Instant,
) -> Guard {
    let renew = options.lease.is_none();
    let grant = client.register(name, owner, fencing_token, holds, renew, deadline);
    tracing::debug!(
        fencing_token,
        holds,
        waited_ms = start.elapsed().as_millis() as u64,
        "granted"
    );
    Guard {
        state: Some(GuardState {
            client: client.clone(),
            name: name.clone(),
            owner: owner.clone(),
            fencing_token,
            lost: grant.subscribe(),
            grant,
        }),
    }
}

/// Subscribes to releases (and joins a fair backend's queue). If the caller drops the acquire
/// future while the request is in flight, the request finishes in the background and the
/// waiter it made is dropped, which leaves the queue (and gives back a lock handed to it).
async fn subscribe(
    client: &ClientInner,
    name: &LockName,
    owner: &Owner,
    lease: Duration,
) -> Result<Box<dyn ReleaseWaiter>> {
    let request = {
        let (backend, name, owner) = (client.backend.clone(), name.clone(), owner.clone());
        async move { backend.subscribe(&name, &owner, lease).await }
    };
    FinishOnDrop::new(request, |waiter| async move {
        if waiter.is_ok() {
            tracing::debug!("acquire cancelled while subscribing; leaving the queue");
        }
        drop(waiter);
    })
    .await
}

/// One attempt. If the caller drops the acquire future while the request is in flight, the
/// request finishes in the background and a grant it made is released. A failed request may
/// still have been granted (its reply lost): it is settled before the error is returned.
async fn attempt(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    lease: Duration,
    acquisition: &Arc<Ticket>,
) -> Result<Acquired> {
    let (name, owner) = (name.clone(), owner.clone());
    let request = {
        let (client, name, owner) = (client.clone(), name.clone(), owner.clone());
        // Lives as long as this request, even if the acquire is dropped meanwhile.
        let acquisition = acquisition.clone();
        async move {
            let ticket = client.begin_request(&name, &owner);
            let result = client.backend.try_acquire(&name, &owner, lease).await;
            drop(ticket);
            if result.is_err() {
                // The acquisition's own ticket is the one still held.
                client.settle(&name, &owner, 1).await;
            }
            drop(acquisition);
            result
        }
    };
    let client = client.clone();
    FinishOnDrop::new(request, move |result| async move {
        if let Ok(Acquired::Granted { .. }) = result {
            tracing::debug!(lock = %name, "acquire cancelled after the grant; releasing it");
            let ticket = client.begin_request(&name, &owner);
            if let Err(error) = release_one(&client, &name, &owner, ticket).await {
                tracing::warn!(lock = %name, %error, "could not undo a cancelled grant; it frees when its lease ends");
            }
        }
    })
    .await
}

/// Releases one hold of `owner` under `ticket` (taken before the guard was unregistered, so
/// that no settle counts this hold as left over meanwhile); if the request fails, settles
/// what it may have left.
pub(crate) async fn release_one(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    ticket: Ticket,
) -> Result<Released> {
    let result = client.backend.release(name, owner).await;
    drop(ticket);
    if result.is_err() {
        client.settle(name, owner, 0).await;
    }
    result
}

/// An explicit owner identity for reentrant locking, made by
/// [`Locks::holder`](crate::Locks::holder). Clones are the same holder.
///
/// Ownership never depends on the OS thread (tasks move between threads): code that holds a
/// lock and calls code that locks it again passes the holder (or the guard, see
/// [`Guard::reenter`]) along.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let me = locks.holder();
/// let outer = me.mutex("account/7")?.acquire().await?;
/// let inner = me.mutex("account/7")?.acquire().await?; // re-enters: hold count 2
/// outer.release().await?;
/// assert!(locks.is_locked("account/7").await?);       // one hold left
/// inner.release().await?;
/// assert!(!locks.is_locked("account/7").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Holder {
    client: Arc<ClientInner>,
    owner: Owner,
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Holder").field(&self.owner).finish()
    }
}

impl Holder {
    pub(crate) fn new(client: Arc<ClientInner>, owner: Owner) -> Self {
        Holder { client, owner }
    }

    /// A handle on the lock `name` that acquires as this holder (reentrant).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty or too long name.
    pub fn mutex(&self, name: impl Into<String>) -> Result<Mutex> {
        Ok(Mutex::new(
            self.client.clone(),
            LockName::new(name)?,
            Some(self.owner.clone()),
        ))
    }

    /// The identity as backends store it.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }
}
