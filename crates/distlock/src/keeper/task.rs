//! The keeper task: the one background task of a client. It renews the client's renewed locks in
//! batches every `lease / 3`, and fires `lost()` on a lock whose lease ran out without a
//! successful renewal or whose session ended.
//!
//! The keeper never waits on a request. Renewals and session checks run as tasks of their
//! own, so a hung or slow server (or a backend that panics) cannot delay a loss past the
//! lock's deadline: the keeper keeps watching deadlines while a request is in flight.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::{ClientInner, Grant, LeaseMode};
use crate::backend::{Owner, Renewing, SessionStatus};
use crate::error::LossReason;
use crate::meter;
use crate::name::LockName;

/// How many locks one renewal request carries at most.
const RENEW_BATCH: usize = 1000;

/// How long the check after a lost session waits for the backend's answer before it calls
/// the locks it asked about lost.
const CHECK_PATIENCE: Duration = Duration::from_secs(2);

/// Runs until the client and all its guards are gone.
pub(crate) async fn keeper(
    client: Weak<ClientInner>,
    wake: Arc<Notify>,
    mut session: Option<watch::Receiver<SessionStatus>>,
) {
    let mut next_renewal: Option<Instant> = None;
    let mut renewal: Option<JoinHandle<bool>> = None;
    let mut renewal_started = Instant::now();
    let mut check: Option<JoinHandle<()>> = None;
    let mut check_wanted = false;
    let mut sessions_lost = session
        .as_mut()
        .map_or(0, |s| s.borrow_and_update().sessions_lost);
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let interval = inner.options.lease_duration() / 3;
        let now = Instant::now();

        expire_overdue(&inner, now);
        let lost = session.as_ref().map_or(0, |s| s.borrow().sessions_lost);
        if lost > sessions_lost {
            sessions_lost = lost;
            check_wanted = true;
        }
        if check_wanted && check.is_none() {
            // A session lost while a check runs is checked again once it ends.
            check_wanted = false;
            check = Some(tokio::spawn(check_all(inner.clone())));
        }
        if renewal.is_none() && next_renewal.is_some_and(|at| at <= now) {
            next_renewal = None;
            renewal_started = now;
            renewal = Some(tokio::spawn(renew_all(inner.clone())));
        }

        // Sleep until the next renewal or the earliest lease deadline, whichever is first,
        // and publish that time so that `register` wakes the keeper only when a new lock needs
        // it sooner. Computed and published under one lock: a registration either is seen
        // here or sees the published time. While a renewal is in flight the next one is
        // planned when it ends.
        let wake_at = {
            let mut registry = inner.registry();
            let mut renewing = false;
            let mut earliest_deadline: Option<Instant> = None;
            for slot in registry.slots.values() {
                if slot.grant.lost_reason().is_none() {
                    renewing |= slot.mode == LeaseMode::Renewed;
                    earliest_deadline =
                        Some(earliest_deadline.map_or(slot.deadline, |e| e.min(slot.deadline)));
                }
            }
            next_renewal = match (renewing && renewal.is_none(), next_renewal) {
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
            ended = join_or_never(&mut renewal) => {
                renewal = None;
                // Keep the cadence from the start of the renewal that ended: a slow one is
                // followed by the next at once rather than an interval later. One that failed
                // (an error, no answer, a panic) is tried again a quarter interval later, so
                // that a lock gets several tries before its deadline.
                let answered = matches!(ended, Ok(true));
                next_renewal = Some(if answered {
                    renewal_started + interval
                } else {
                    (renewal_started + interval).min(Instant::now() + interval / 4)
                });
                report_task_end(ended.map(drop), "renewal");
            }
            ended = join_or_never(&mut check) => {
                check = None;
                report_task_end(ended, "the check after a lost session");
            }
        }
    }
}

/// Waits for the task in `task`, or forever when there is none.
async fn join_or_never<T>(task: &mut Option<JoinHandle<T>>) -> Result<T, JoinError> {
    match task {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}

/// A panic in a backend's request ends that request, never the keeper: its locks run out at
/// their deadlines and are reported lost then, unless a later renewal succeeds.
fn report_task_end(ended: Result<(), JoinError>, what: &str) {
    if let Err(error) = ended {
        tracing::error!(%error, "{what} ended abnormally; the keeper carries on");
    }
}

/// After the backend lost a session: asks which registered locks are still held and marks
/// the others lost, renewed or not. A check that fails or does not answer in time marks
/// every lock it asked about lost: after a lost session that is the likely truth, and the
/// safe answer.
async fn check_all(inner: Arc<ClientInner>) {
    let batch: Vec<((LockName, Owner), Arc<Grant>)> = {
        let registry = inner.registry();
        registry
            .slots
            .iter()
            .filter(|(_, slot)| slot.grant.lost_reason().is_none())
            .map(|(key, slot)| (key.clone(), slot.grant.clone()))
            .collect()
    };
    let patience = CHECK_PATIENCE.min(inner.options.lease_duration() / 3);
    for chunk in batch.chunks(RENEW_BATCH) {
        let locks: Vec<(LockName, Owner)> = chunk.iter().map(|(key, _)| key.clone()).collect();
        let answer = tokio::time::timeout(patience, inner.backend.still_held(&locks)).await;
        let held = match answer {
            Ok(Ok(held)) if held.len() == locks.len() => held,
            Ok(Ok(held)) => {
                tracing::error!(
                    asked = locks.len(),
                    answered = held.len(),
                    "the backend answered a check for a different number of locks"
                );
                vec![false; locks.len()]
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "checking locks after a lost session failed");
                vec![false; locks.len()]
            }
            Err(_elapsed) => {
                tracing::warn!("checking locks after a lost session timed out");
                vec![false; locks.len()]
            }
        };
        for ((key, grant), still_held) in chunk.iter().zip(held) {
            if !still_held {
                inner.lost_if_current(&key.0, &key.1, grant, LossReason::SessionLost);
            }
        }
    }
}

fn expire_overdue(inner: &ClientInner, now: Instant) {
    let registry = inner.registry();
    for ((name, _), slot) in registry.slots.iter() {
        if slot.deadline <= now && slot.grant.lost_reason().is_none() {
            let reason = match slot.mode {
                LeaseMode::Renewed => LossReason::RenewalTooLate,
                LeaseMode::Fixed => LossReason::LeaseRanOut,
            };
            slot.grant.mark_lost(name, reason);
        }
    }
}

/// Renews every renewed lock of the client, in batches. True when every batch was answered.
async fn renew_all(inner: Arc<ClientInner>) -> bool {
    let mut answered = true;
    let lease = inner.options.lease_duration();
    // One start for the whole batch: every lock in it is marked renewing from then, before
    // any request is sent (a lease change by the caller meanwhile sees it).
    let start = Instant::now();
    let batch: Vec<((LockName, Owner), Arc<Grant>, Instant)> = {
        let mut registry = inner.registry();
        registry
            .slots
            .iter_mut()
            .filter(|(_, slot)| {
                slot.mode == LeaseMode::Renewed && slot.grant.lost_reason().is_none()
            })
            .map(|(key, slot)| {
                slot.renewing = Some((start, lease));
                (key.clone(), slot.grant.clone(), slot.deadline)
            })
            .collect()
    };
    // Locks whose renewal fails stay ours until their deadline; the keeper marks them lost
    // then unless a later renewal succeeds first.
    for chunk in batch.chunks(RENEW_BATCH) {
        let locks: Vec<Renewing> = chunk
            .iter()
            .map(|(key, grant, _)| Renewing {
                lock: key.clone(),
                fencing_token: grant.fencing_token(),
            })
            .collect();
        inner
            .renewal_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The keeper watches deadlines meanwhile; a slow reply that lands before the batch's
        // earliest deadline still counts, so wait for it that long (at least one renewal
        // interval), then leave the locks to the next renewal.
        let earliest = chunk.iter().map(|(_, _, deadline)| *deadline).min();
        let patience = earliest
            .map_or(lease / 3, |deadline| {
                deadline.saturating_duration_since(start)
            })
            .max(lease / 3);
        let sent = Instant::now();
        let reply = tokio::time::timeout(patience, inner.backend.renew(&locks, lease)).await;
        let outcome = match &reply {
            Ok(Ok(renewed)) if renewed.len() == locks.len() => meter::Renewal::Renewed,
            Ok(_) => meter::Renewal::Failed,
            Err(_) => meter::Renewal::Late,
        };
        meter::renewal(inner.backend.scheme(), outcome, sent.elapsed());
        match reply {
            Ok(Ok(renewed)) if renewed.len() == locks.len() => {
                let now = Instant::now();
                let mut registry = inner.registry();
                for ((key, grant, _), still_held) in chunk.iter().zip(renewed) {
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
                        grant.mark_lost(&key.0, LossReason::NotHeld);
                    } else if slot.deadline <= now {
                        // The client's deadline passed while the reply was on its way: the
                        // loss stands, whatever the reply says.
                        grant.mark_lost(&key.0, LossReason::RenewalTooLate);
                    } else {
                        slot.renewed(start, lease);
                    }
                }
                tracing::debug!(locks = locks.len(), "renewed");
            }
            Ok(Ok(renewed)) => {
                tracing::error!(
                    asked = locks.len(),
                    answered = renewed.len(),
                    "the backend answered a renewal for a different number of locks"
                );
                answered = false;
            }
            Ok(Err(error)) => {
                tracing::warn!(locks = locks.len(), %error, "renewal failed");
                answered = false;
            }
            Err(_elapsed) => {
                tracing::warn!(locks = locks.len(), "renewal timed out");
                answered = false;
            }
        }
    }
    answered
}
