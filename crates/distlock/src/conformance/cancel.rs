//! Cancellation at every await point of a contended acquire and of a release (promise 4: a
//! cancelled request leaves nothing behind).

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use super::{Target, acquire_within, client, unique};
use crate::AcquireOptions;

/// How soon after a cancelled acquire another client must get the lock: shorter than a
/// Redis handover lease and than the age at which a fair backend skips a stale ticket, so a
/// left-over grant or queue entry shows.
const PROMPTLY: Duration = Duration::from_millis(900);

/// Polls `future` once; `Some` when it finished.
pub(super) async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    match std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx))).await {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// A waiting acquire dropped after 1 to 7 polls, with the holder's release landing before,
/// during or after its wait: afterwards no hold and no queue entry remain, so another client
/// gets the lock promptly, and the holder's release was exact.
pub async fn promise4_cancelled_waiting_acquire_leaves_nothing(target: &Target) {
    let name = unique("cancel_waiting");
    let locks = client(target).await;
    let other = client(target).await;
    let mut dropped_while_pending = 0;
    for round in 1..=24usize {
        let holder = acquire_within(&locks, &name, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the holder could not acquire: {e}"));
        let mutex = locks.mutex(name.as_str()).unwrap();
        let mut acquire =
            Box::pin(mutex.acquire_with(AcquireOptions::new().wait(Duration::from_secs(10))));
        // The holder's release lands before poll 0, 1, 2 or 3 (or never, when the acquire is
        // dropped first), and the acquire is dropped after 1 to 7 polls.
        let release_at = round % 4;
        let polls = 1 + round / 4;
        let mut holder = Some(holder);
        let mut granted = None;
        for poll in 0..polls {
            if poll == release_at
                && let Some(holder) = holder.take()
            {
                holder
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: release: {e}"));
            }
            if let Some(result) = poll_once(&mut acquire).await {
                granted = Some(result.unwrap_or_else(|e| panic!("round {round}: acquire: {e}")));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if granted.is_none() {
            dropped_while_pending += 1;
        }
        drop(acquire);
        if let Some(guard) = granted {
            guard.release().await.expect("release the waiter's grant");
        }
        if let Some(holder) = holder {
            holder.release().await.expect("release the holder");
        }
        let start = tokio::time::Instant::now();
        let guard = acquire_within(&other, &name, PROMPTLY)
            .await
            .unwrap_or_else(|e| {
                panic!("round {round}: a cancelled acquire left a hold or a queue entry: {e}")
            });
        assert!(start.elapsed() <= PROMPTLY + Duration::from_millis(100));
        guard.release().await.expect("release the check's grant");
    }
    assert!(
        dropped_while_pending >= 5,
        "only {dropped_while_pending} acquires were dropped while pending: the case tested little"
    );
}

/// Releases dropped after 0, 1 or 2 polls still complete: the lock is free promptly and a
/// re-entered lock keeps exactly its other hold.
pub async fn promise4_cancelled_release_completes(target: &Target) {
    let name = unique("cancel_release");
    let locks = client(target).await;
    let other = client(target).await;
    for polls in 0..3usize {
        let me = locks.holder();
        let outer = me
            .mutex(name.as_str())
            .unwrap()
            .acquire()
            .await
            .expect("acquire");
        let inner = outer.reenter().await.expect("re-enter");
        let mut release = Box::pin(inner.release());
        for _ in 0..polls {
            if poll_once(&mut release).await.is_some() {
                break;
            }
        }
        drop(release);
        // One hold is left: the lock stays held until the outer guard goes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            outer.is_held().await.expect("is_held"),
            "polls {polls}: a dropped release of one hold freed the lock"
        );
        outer.release().await.expect("release the outer hold");
        let guard = acquire_within(&other, &name, PROMPTLY)
            .await
            .unwrap_or_else(|e| panic!("polls {polls}: a dropped release left a hold: {e}"));
        guard.release().await.expect("release the check's grant");
    }
}

/// Acquire futures dropped while waiting, or in the middle of a request (after 1, 2 or 3
/// polls; at least 10 of them, in up to 600 attempts), leave no lock held: a grant that lands after the drop is released.
pub async fn cancelled_acquire_leaves_nothing(target: &Target) {
    let name = unique("cancel");
    let locks = client(target).await;
    let holder = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let waiter = locks.mutex(name.as_str()).unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(100), waiter.acquire()).await;
    assert!(cancelled.is_err(), "the waiter got a held lock");
    holder.release().await.unwrap();
    // Until enough acquires were cut in flight: how many complete within a few polls depends
    // on how fast the server answers, so the count of attempts adapts (bounded) instead.
    let (mut cut_mid_request, mut attempts) = (0, 0);
    for polls in [1, 2, 3].into_iter().cycle().take(600) {
        if attempts >= 30 && (cut_mid_request >= 10 || process_local(&locks)) {
            break;
        }
        attempts += 1;
        let mutex = locks.mutex(name.as_str()).unwrap();
        let mut acquire = Box::pin(mutex.acquire());
        let mut granted = None;
        for _ in 0..polls {
            let step = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
            if let Poll::Ready(result) = step {
                granted = Some(result.expect("acquire"));
                break;
            }
        }
        match granted {
            Some(guard) => guard.release().await.unwrap(),
            None => {
                cut_mid_request += 1;
                drop(acquire);
            }
        }
    }
    // The in-process backend answers within the first poll: nothing is ever mid-request
    // there. Everywhere else at least 10 acquires must have been cut while in flight, or the
    // case tested little.
    if !process_local(&locks) {
        assert!(
            cut_mid_request >= 10,
            "only {cut_mid_request} of {attempts} acquires were dropped mid-request: the case tested little"
        );
    }
    let other = client(target).await;
    let guard = acquire_within(&other, name.as_str(), Duration::from_secs(5))
        .await
        .expect("a cancelled acquire left the lock held");
    guard.release().await.unwrap();
}

/// True when `locks` keeps its locks in this process ([`crate::Scheme::process_local`]).
fn process_local(locks: &crate::Locks) -> bool {
    crate::scheme::find(locks.backend_scheme()).is_some_and(|scheme| scheme.process_local)
}
