//! [`Guard`]: proof of holding a lock, its loss signal, and its release.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Mutex;
use super::acquire::release_one;
use crate::backend::{Extended, Owner, Released};
use crate::error::{Error, LossReason, Result};
use crate::finish::FinishOnDrop;
use crate::keeper::{ClientInner, Grant, LeaseMode};
use crate::name::LockName;
use crate::options::{lease_deadline, validate_lease};

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
    grant: Arc<Grant>,
    lost: watch::Receiver<Option<LossReason>>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            Some(state) => f
                .debug_struct("Guard")
                .field("name", &state.name)
                .field("owner", &state.owner)
                .field("fencing_token", &state.grant.fencing_token())
                .finish(),
            None => f.write_str("Guard(released)"),
        }
    }
}

impl Guard {
    /// The guard of a registered grant.
    pub(crate) fn new(
        client: Arc<ClientInner>,
        name: LockName,
        owner: Owner,
        grant: Arc<Grant>,
    ) -> Self {
        Guard {
            state: Some(GuardState {
                client,
                name,
                owner,
                lost: grant.subscribe(),
                grant,
            }),
        }
    }

    /// What the guard holds, for the requests that finish a grant in the background.
    pub(crate) fn parts(&self) -> (&Arc<ClientInner>, &LockName, &Owner, &Arc<Grant>) {
        let state = self.state();
        (&state.client, &state.name, &state.owner, &state.grant)
    }

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
            Some(guard) if guard.fencing_token() == state.grant.fencing_token() => Ok(guard),
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
        self.state().grant.fencing_token()
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
        // The sender lives in the grant, which this guard keeps alive: the wait ends only
        // with a reason.
        if let Err(closed) = lost.wait_for(Option::is_some).await {
            tracing::error!(lock = %state.name, %closed, "the loss signal closed");
        }
        state.lost_error()
    }

    /// Why the lock was lost, once the client knows it is. Cheap: asks no server.
    pub fn loss_reason(&self) -> Option<LossReason> {
        *self.state().lost.borrow()
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

    /// Moves the end of a fixed lease ([`AcquireOptions::lease`](crate::AcquireOptions::lease))
    /// to `lease` from now: later or sooner. The lock stays on a fixed lease.
    ///
    /// A renewed lock has no end to move (the keeper renews it while the guard lives), so
    /// `extend` refuses it; [`Guard::set_lease`] turns it into a fixed lease.
    ///
    /// # Notable errors
    /// - [`Error::InvalidInput`] for a lease out of range, or when the lock is renewed.
    /// - [`Error::NotOwner`] when another owner holds the lock now; nothing changed.
    /// - [`Error::LockLost`] when nobody holds it any more.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have moved the lease end.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        validate_lease(lease)?;
        let state = self.state();
        if state
            .client
            .lease_mode(&state.name, &state.owner, &state.grant)
            == Some(LeaseMode::Renewed)
        {
            return Err(Error::invalid(
                "extension",
                format!(
                    "lock {:?} is renewed automatically while its guard lives, so it has no lease \
                     end to move; use Guard::set_lease to hold it with a fixed lease instead",
                    state.name.as_str()
                ),
            ));
        }
        self.change_lease(lease).await
    }

    /// Holds the lock with a fixed lease ending `lease` from now, renewed or not before: from
    /// then on it is no longer renewed, and it frees itself when that lease ends (the guard's
    /// [`Guard::lost`] fires then) unless [`Guard::extend`] moves the end.
    ///
    /// # Notable errors
    /// As [`Guard::extend`], except that a renewed lock is accepted.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have set the lease. The lock is then still renewed,
    /// and the client counts it lost by the end of the lease asked for unless a renewal that
    /// started later succeeds first.
    pub async fn set_lease(&self, lease: Duration) -> Result<()> {
        validate_lease(lease)?;
        self.change_lease(lease).await
    }

    /// Waits, at most `limit`, until no renewing request of this grant is unanswered, so that
    /// a lease change sent next is not overtaken on the server by that request's longer lease
    /// (a handover's confirmation is sent right after the grant).
    pub(crate) async fn renewal_settled(&self, limit: Duration) {
        let state = self.state();
        let until = Instant::now() + limit;
        while Instant::now() < until
            && state
                .client
                .renewal_in_flight(&state.name, &state.owner, &state.grant)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn change_lease(&self, lease: Duration) -> Result<()> {
        let state = self.state();
        let start = Instant::now();
        let pending =
            state
                .client
                .lease_change_starts(&state.name, &state.owner, &state.grant, start);
        // Until the answer is in, the change may have run: if the request fails or this future
        // is dropped, the client's deadline is at most the end of the lease asked for.
        let mut unknown = UnknownChange {
            state,
            bound: Some(lease_deadline(start, lease)),
        };
        let outcome = state
            .client
            .backend
            .extend(
                &state.name,
                &state.owner,
                state.grant.fencing_token(),
                lease,
            )
            .await?;
        unknown.bound = None;
        match outcome {
            Extended::Extended => {
                state.client.lease_changed(
                    &state.name,
                    &state.owner,
                    &state.grant,
                    (start, lease_deadline(start, lease)),
                    pending,
                );
                tracing::debug!(lock = %state.name, ?lease, "fixed lease set");
                Ok(())
            }
            Extended::NotHeld => {
                state.grant.mark_lost(&state.name, LossReason::NotHeld);
                Err(state.lost_error())
            }
            Extended::HeldByOther => {
                state.grant.mark_lost(&state.name, LossReason::HeldByOther);
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
                tracing::debug!(lock = %state.name, fencing_token = state.grant.fencing_token(), remaining_holds, "released");
                Ok(())
            }
            Released::NotHeld => {
                state.grant.mark_lost(&state.name, LossReason::NotHeld);
                Err(state.lost_error())
            }
            Released::HeldByOther => {
                state.grant.mark_lost(&state.name, LossReason::HeldByOther);
                Err(Error::NotOwner {
                    name: state.name.to_string(),
                })
            }
        }
    }
}

/// A change of the lease whose answer is not in: on drop (an error, or the caller's future
/// dropped) the client's deadline is bounded by the end of the lease it asked for.
struct UnknownChange<'a> {
    state: &'a GuardState,
    bound: Option<Instant>,
}

impl Drop for UnknownChange<'_> {
    fn drop(&mut self) {
        if let Some(bound) = self.bound {
            let state = self.state;
            state
                .client
                .lease_change_unknown(&state.name, &state.owner, &state.grant, bound);
        }
    }
}

impl GuardState {
    fn lost_error(&self) -> Error {
        Error::LockLost {
            name: self.name.to_string(),
            reason: self.grant.lost_reason().unwrap_or(LossReason::NotHeld),
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

impl Guard {
    /// Lets the lock run to the end of its fixed lease instead of releasing it: the client
    /// forgets the hold (no release, no loss signal) and the lease's keeper — the server, or
    /// this client's reaper for the backends that keep leases in the client — frees it.
    pub(crate) fn keep_until_lease_end(mut self) {
        if let Some(state) = self.state.take() {
            state
                .client
                .unregister(&state.name, &state.owner, &state.grant);
        }
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
                crate::cleanup::spawn_on(&runtime, async move {
                    match release.await {
                        Ok(_) => tracing::debug!(lock = %name, "released on drop"),
                        Err(error) => tracing::warn!(
                            lock = %name, %error,
                            "release on drop failed; the lock frees when its lease ends"
                        ),
                    }
                });
            }
            Err(_) => tracing::warn!(
                lock = %name,
                "guard dropped outside a Tokio runtime; the lock frees when its lease ends"
            ),
        }
    }
}
