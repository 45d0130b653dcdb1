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
    let grant = client.register(name, owner, fencing_token, holds <= 1, renew, deadline);
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

/// Proof of holding a lock. Release it with [`Guard::release`] to learn whether the release
/// worked; dropping it releases in the background.
///
/// # Dropping
/// `Drop` cannot wait, so it spawns the release on the Tokio runtime and returns at once: the
/// lock is free a round trip later, not immediately, and an error is only logged. If no
/// runtime is running, or the release fails, the lock frees itself when its lease ends.
/// Prefer `guard.release().await`.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    state: Option<GuardState>,
}

struct GuardState {
    client: Arc<ClientInner>,
    name: LockName,
    owner: Owner,
    fencing_token: u64,
    grant: Arc<Grant>,
    lost: watch::Receiver<Option<Arc<str>>>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            Some(state) => f
                .debug_struct("Guard")
                .field("name", &state.name)
                .field("owner", &state.owner)
                .field("fencing_token", &state.fencing_token)
                .finish(),
            None => f.write_str("Guard(released)"),
        }
    }
}

impl Guard {
    fn state(&self) -> &GuardState {
        // `state` is only taken by `release(self)` and `Drop`, after which no method can be
        // called.
        self.state
            .as_ref()
            .expect("guard state is present until release or drop")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.state().name.as_str()
    }

    /// The owner identity this guard holds the lock as.
    pub fn owner(&self) -> &Owner {
        &self.state().owner
    }

    /// Acquires the same lock again as the same owner, at once: another guard on this grant,
    /// with the same fencing token. The lock is free once every guard has been released.
    ///
    /// # Notable errors
    /// [`Error::LockLost`] or [`Error::NotOwner`] when the lock was lost meanwhile.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::acquire`].
    pub async fn reenter(&self) -> Result<Guard> {
        let state = self.state();
        let reentry = Mutex::new(
            state.client.clone(),
            state.name.clone(),
            Some(state.owner.clone()),
        )
        .try_acquire()
        .await?;
        match reentry {
            Some(guard) if guard.fencing_token() == state.fencing_token => Ok(guard),
            Some(guard) => {
                // A fresh grant: ours was lost before the re-entry. Keep nothing.
                guard.release().await?;
                Err(state.lost_error())
            }
            None => Err(Error::NotOwner {
                name: state.name.to_string(),
            }),
        }
    }

    /// The fencing token of this grant: strictly greater than the token of every earlier grant
    /// of this lock name, across clients and across expiry. Send it with every write to the
    /// protected resource, and let the resource refuse a write whose token is older than the
    /// newest it has seen: that is what makes a holder whose lease ran out harmless.
    pub fn fencing_token(&self) -> u64 {
        self.state().fencing_token
    }

    /// Resolves when the lock is known to be lost: a renewal was refused, the lease ran out
    /// without a successful renewal, or (for backends with sessions) the session ended. A
    /// force-unlock is noticed at the next renewal. Returns the [`Error::LockLost`] to report.
    ///
    /// ```no_run
    /// # async fn f(guard: distlock::Guard) -> distlock::Result<()> {
    /// tokio::select! {
    ///     lost = guard.lost() => return Err(lost),
    ///     _ = do_the_work() => {}
    /// }
    /// guard.release().await
    /// # }
    /// # async fn do_the_work() {}
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> Error {
        let state = self.state();
        let mut lost = state.lost.clone();
        let reason = match lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The sender lives in the grant, which this guard keeps alive.
            Err(_) => None,
        };
        Error::LockLost {
            name: state.name.to_string(),
            reason: reason.map_or_else(|| "unknown".to_owned(), |r| r.to_string()),
        }
    }

    /// True once the client knows the lock is lost. Cheap: asks no server.
    pub fn is_lost(&self) -> bool {
        self.state().lost.borrow().is_some()
    }

    /// Asks the backend whether this guard's owner still holds the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn is_held(&self) -> Result<bool> {
        let state = self.state();
        if state.grant.lost_reason().is_some() {
            return Ok(false);
        }
        Ok(state
            .client
            .backend
            .holds(&state.name, &state.owner)
            .await?
            > 0)
    }

    /// Sets the lock's lease to end `lease` from now. From then on the lock is held with that
    /// fixed lease and no longer renewed automatically.
    ///
    /// # Notable errors
    /// - [`Error::NotOwner`] when another owner holds the lock now; nothing changed.
    /// - [`Error::LockLost`] when nobody holds it any more.
    /// - [`Error::InvalidInput`] for a lease out of range.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lease.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        validate_lease(lease)?;
        let state = self.state();
        let start = Instant::now();
        let outcome = state
            .client
            .backend
            .extend(&state.name, &state.owner, lease)
            .await?;
        match outcome {
            Extended::Extended => {
                state.client.extended(
                    &state.name,
                    &state.owner,
                    &state.grant,
                    lease_deadline(start, lease),
                    false,
                );
                tracing::debug!(lock = %state.name, ?lease, "extended");
                Ok(())
            }
            Extended::NotHeld => {
                state
                    .grant
                    .mark_lost(&state.name, "an extension found the lock free");
                Err(state.lost_error())
            }
            Extended::HeldByOther => {
                state
                    .grant
                    .mark_lost(&state.name, "an extension found another owner holding it");
                Err(Error::NotOwner {
                    name: state.name.to_string(),
                })
            }
        }
    }

    /// Releases this guard's hold and reports how it went. The lock is free once every guard
    /// of its owner has been released.
    ///
    /// # Notable errors
    /// - [`Error::LockLost`] when the lock had already been lost (nothing changed), or when
    ///   this guard had already reported the loss through [`Guard::lost`] (a hold the server
    ///   still kept is released).
    /// - [`Error::NotOwner`] when another owner holds it now; nothing changed.
    /// - [`Error::Backend`] when the request failed; the lock then frees when its lease ends.
    ///
    /// # Cancel safety
    /// Cancel safe: if this future is dropped, the release completes in the background.
    pub async fn release(mut self) -> Result<()> {
        let Some(state) = self.state.take() else {
            return Ok(());
        };
        let Some(release) = state.begin_release() else {
            return Err(state.lost_error());
        };
        // If this future is dropped, the release still finishes in the background.
        let name = state.name.clone();
        let outcome = FinishOnDrop::new(release, move |result| async move {
            if let Err(error) = result {
                tracing::warn!(lock = %name, %error, "release failed; the lock frees when its lease ends");
            }
        })
        .await?;
        match outcome {
            // The client counts a lease from the start of the request that set it, so it may
            // call a lock lost a little before the server expires it. The release then still
            // frees the lock, and reports the loss the guard already announced.
            Released::Released { .. } if state.grant.lost_reason().is_some() => {
                Err(state.lost_error())
            }
            Released::Released { remaining_holds } => {
                tracing::debug!(lock = %state.name, fencing_token = state.fencing_token, remaining_holds, "released");
                Ok(())
            }
            Released::NotHeld => {
                state
                    .grant
                    .mark_lost(&state.name, "the lock was free at release");
                Err(state.lost_error())
            }
            Released::HeldByOther => {
                state
                    .grant
                    .mark_lost(&state.name, "another owner held the lock at release");
                Err(Error::NotOwner {
                    name: state.name.to_string(),
                })
            }
        }
    }
}

impl GuardState {
    fn lost_error(&self) -> Error {
        Error::LockLost {
            name: self.name.to_string(),
            reason: self.grant.lost_reason().map_or_else(
                || "the lock was no longer held".to_owned(),
                |r| r.to_string(),
            ),
        }
    }

    /// Stops renewal of this guard's hold and returns the backend release to run. `None` when
    /// a newer grant to the same owner superseded this guard's (nothing to release).
    fn begin_release(&self) -> Option<impl Future<Output = Result<Released>> + Send + 'static> {
        // Taken before the guard goes from the registry: a settle meanwhile sees the release
        // in flight and leaves this hold alone.
        let ticket = self.client.begin_request(&self.name, &self.owner);
        if !self.client.unregister(&self.name, &self.owner, &self.grant) {
            return None;
        }
        let client = self.client.clone();
        let name = self.name.clone();
        let owner = self.owner.clone();
        Some(async move { release_one(&client, &name, &owner, ticket).await })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        let Some(release) = state.begin_release() else {
            return;
        };
        let name = state.name.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Detached: a failure is only logged.
                drop(runtime.spawn(async move {
                    match release.await {
                        Ok(_) => tracing::debug!(lock = %name, "released on drop"),
                        Err(error) => tracing::warn!(
                            lock = %name, %error,
                            "release on drop failed; the lock frees when its lease ends"
                        ),
                    }
                }));
            }
            Err(_) => tracing::warn!(
                lock = %name,
                "guard dropped outside a Tokio runtime; the lock frees when its lease ends"
            ),
        }
    }
}
