//! The acquire loop and the requests it makes, each safe to cancel at every await point:
//! attempts, the subscription to releases, the confirmation of a handover, and the release of
//! one hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquired, Extended, Owner, ReleaseWaiter, Released, Woken};
use crate::error::{LossReason, Result};
use crate::finish::FinishOnDrop;
use crate::keeper::settle::Ticket;
use crate::keeper::{ClientInner, GrantKind, LeaseMode};
use crate::meter::{self, Outcome};
use crate::mutex::Guard;
use crate::name::LockName;
use crate::options::{AcquireOptions, MAX_DURATION, lease_deadline};

/// How long a wait that ran out gives its waiter to leave the queue before it answers.
const LEAVE_LIMIT: Duration = Duration::from_secs(1);

/// Waits for the lock as `owner` within `options`: `None` when the wait ran out. Measured
/// (see [`meter`](crate::meter)).
pub(crate) async fn acquire_loop(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    options: AcquireOptions,
) -> Result<Option<Guard>> {
    let backend = client.backend.scheme();
    let mut measured = meter::Acquisition::start(backend);
    let answer = wait_for_grant(client, name, owner, options, &mut measured).await;
    let outcome = match &answer {
        Ok(Some(_)) => Outcome::Granted {
            waited: measured.waited(),
        },
        Ok(None) if options.wait_limit() == Some(Duration::ZERO) => Outcome::Busy,
        Ok(None) => Outcome::Timeout,
        Err(_) => Outcome::Error,
    };
    measured.end(outcome);
    answer
}

async fn wait_for_grant(
    client: &Arc<ClientInner>,
    name: &LockName,
    owner: &Owner,
    options: AcquireOptions,
    measured: &mut meter::Acquisition,
) -> Result<Option<Guard>> {
    let start = Instant::now();
    // Held until the guard is registered (or the acquisition ends, and any attempt it left
    // finishing in the background has settled): a settle of the same owner meanwhile cannot
    // tell a grant on its way from a left-over hold, so it waits.
    let acquisition = Arc::new(client.begin_request(name, owner));
    let deadline = options.wait_limit().map(|wait| start + wait);
    let lease = options
        .fixed_lease()
        .unwrap_or(client.options.lease_duration());
    let mut waiter: Option<Box<dyn ReleaseWaiter>> = None;
    let mut waiter_spent = false;
    if client.backend.queues_on_subscribe() && options.wait_limit() != Some(Duration::ZERO) {
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
                    if let Some(waiter) = waiter.as_mut() {
                        // Bounded, so that a slow server does not stretch the caller's wait
                        // by more than this: what is not done by then the drop does.
                        let _ = tokio::time::timeout(LEAVE_LIMIT, waiter.leave()).await;
                    }
                    return Ok(None);
                }
                measured.waits();
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
                            meter::handover(client.backend.scheme());
                            let mut deadline = lease_deadline(since, handover);
                            let mut confirm = handover < lease;
                            let mut handover_gone = false;
                            if deadline <= Instant::now() {
                                // The short lease may have run out while this waiter was
                                // slow: confirm before handing out a guard.
                                match confirm_late_handover(
                                    client,
                                    name,
                                    owner,
                                    fencing_token,
                                    lease,
                                )
                                .await?
                                {
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
                                confirm_handover(&guard, lease);
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
    fencing_token: u64,
    lease: Duration,
) -> Result<Option<Instant>> {
    let backend = client.backend.clone();
    let (name, owner) = (name.clone(), owner.clone());
    let start = Instant::now();
    let request = {
        let (backend, name, owner) = (backend.clone(), name.clone(), owner.clone());
        async move { backend.extend(&name, &owner, fencing_token, lease).await }
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
            crate::cleanup::spawn(async move {
                let _ = release_one(&client, &name, &owner, ticket).await;
            });
            Err(error)
        }
    }
}

/// Extends a handed-over grant to the lease the caller asked for, in the background; a
/// refusal marks it lost, an error leaves it to run out (and be reported lost) unless a
/// renewal succeeds first.
fn confirm_handover(guard: &Guard, lease: Duration) {
    let (client, name, owner, grant) = guard.parts();
    let (client, name, owner, grant) = (client.clone(), name.clone(), owner.clone(), grant.clone());
    let start = Instant::now();
    client.confirmation_starts(&name, &owner, &grant, start, lease);
    tokio::spawn(async move {
        match client
            .backend
            .extend(&name, &owner, grant.fencing_token(), lease)
            .await
        {
            Ok(Extended::Extended) => {
                client.confirmed(&name, &owner, &grant, start, lease);
            }
            Ok(Extended::NotHeld | Extended::HeldByOther) => {
                client.lost_if_current(&name, &owner, &grant, LossReason::HandoverRanOut);
            }
            Err(error) => {
                tracing::warn!(lock = %name, %error, "extending a handed-over lock failed");
            }
        }
    });
}

/// How a grant made with `options` is kept: renewed unless it has a fixed lease.
fn lease_mode(options: &AcquireOptions) -> LeaseMode {
    match options.fixed_lease() {
        Some(_) => LeaseMode::Fixed,
        None => LeaseMode::Renewed,
    }
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
    let grant = client.register(
        name,
        owner,
        fencing_token,
        GrantKind::from_holds(holds),
        lease_mode(options),
        deadline,
    );
    tracing::debug!(
        fencing_token,
        holds,
        waited_ms = start.elapsed().as_millis() as u64,
        "granted"
    );
    Guard::new(client.clone(), name.clone(), owner.clone(), grant)
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
/// still have been granted (its reply lost): it is settled before the error is returned,
/// unless the backend undoes its failed attempts itself.
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
            if result.is_err() && !client.backend.undoes_failed_attempts() {
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
