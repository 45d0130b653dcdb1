//! Requests whose reply is lost, or that fail before they reach the server, on every mutating
//! method (promise 4: nothing is left behind, hold counts stay exact), injected by
//! [`FaultyBackend`](crate::fault::FaultyBackend) around the real backend.

use std::sync::Arc;
use std::time::Duration;

use super::{Target, client, faulty_client, free_within, hold, unique};
use crate::fault::{Fault, FaultyBackend, Method};
use crate::{AcquireOptions, ConnectOptions, Guard, Locks};

/// How soon another client must get a lock after the faulty request: far below the 30 s
/// lease a left-over hold would keep.
const PROMPTLY: Duration = Duration::from_secs(3);

/// A client with the default (30 s) lease whose requests go through a [`FaultyBackend`].
async fn faulty(target: &Target) -> (Locks, Arc<FaultyBackend>) {
    faulty_client(target, ConnectOptions::new()).await
}

/// Another client gets `name` promptly: no hold is left.
async fn free_promptly(target: &Target, name: &str, what: &str) {
    free_within(target, name, PROMPTLY, what).await;
}

/// Another client cannot take `name` now: it is still held.
async fn still_excluded(target: &Target, name: &str, what: &str) {
    let other = client(target).await;
    let rival = other
        .mutex(name)
        .unwrap()
        .try_acquire()
        .await
        .expect("try_acquire");
    assert!(rival.is_none(), "{what}: another client got a held lock");
}

/// Holds `name` twice as one holder: the outer guard and a re-entered inner one.
async fn hold_twice(locks: &Locks, name: &str) -> (Guard, Guard) {
    let outer = locks
        .holder()
        .mutex(name)
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    let inner = outer.reenter().await.expect("re-enter");
    (outer, inner)
}

fn assert_faulted(faulty: &FaultyBackend, method: Method, what: &str) {
    assert_eq!(
        faulty.faulted(method),
        1,
        "{what}: the fault was never injected, so nothing was tested"
    );
}

/// Promise 4: an acquire whose grant's reply is lost reports the error and leaves no hold.
pub async fn promise4_lost_acquire_reply_leaves_no_hold(target: &Target) {
    let name = unique("lost_acquire_reply");
    let (locks, faulty) = faulty(target).await;
    faulty.set_times(Method::TryAcquire, Fault::LoseReply(Duration::ZERO), 1);
    let result = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(5)))
        .await;
    assert_faulted(&faulty, Method::TryAcquire, "lost acquire reply");
    assert!(
        result.is_err(),
        "the acquire succeeded although its reply was lost"
    );
    free_promptly(target, &name, "lost acquire reply").await;
}

/// Promise 4: a re-entry whose reply is lost leaves the hold count as it was: releasing the
/// outer guard frees the lock.
pub async fn promise4_lost_reentry_reply_keeps_holds_exact(target: &Target) {
    let name = unique("lost_reentry_reply");
    let (locks, faulty) = faulty(target).await;
    let outer = locks
        .holder()
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    faulty.set_times(Method::TryAcquire, Fault::LoseReply(Duration::ZERO), 1);
    let reentry = outer.reenter().await;
    assert_faulted(&faulty, Method::TryAcquire, "lost re-entry reply");
    assert!(
        reentry.is_err(),
        "the re-entry succeeded although its reply was lost"
    );
    assert!(!outer.is_lost(), "the outer guard was called lost");
    still_excluded(target, &name, "lost re-entry reply").await;
    outer.release().await.expect("release the outer guard");
    free_promptly(target, &name, "lost re-entry reply").await;
}

/// Releases one of two holds with `fault` on the release: the other hold stays (exclusion
/// holds, not lost), and releasing it frees the lock.
async fn release_one_of_two_with(target: &Target, case: &str, fault: Fault) {
    let name = unique(case);
    let (locks, faulty) = faulty(target).await;
    let (outer, inner) = hold_twice(&locks, &name).await;
    faulty.set_times(Method::Release, fault, 1);
    let released = inner.release().await;
    assert_faulted(&faulty, Method::Release, case);
    assert!(released.is_err(), "{case}: the release reported success");
    assert!(
        !outer.is_lost(),
        "{case}: the remaining guard was called lost"
    );
    assert!(
        outer.is_held().await.expect("is_held"),
        "{case}: one failed release of two holds freed the lock"
    );
    still_excluded(target, &name, case).await;
    outer.release().await.expect("release the outer guard");
    free_promptly(target, &name, case).await;
}

/// Promise 4: the release of one of two holds whose reply is lost (it ran) leaves one hold.
pub async fn promise4_lost_release_reply_keeps_holds_exact(target: &Target) {
    release_one_of_two_with(
        target,
        "lost_release_reply",
        Fault::LoseReply(Duration::ZERO),
    )
    .await;
}

/// Promise 4: the release of one of two holds that fails before it reaches the server leaves
/// one hold, not two.
pub async fn promise4_failed_release_keeps_holds_exact(target: &Target) {
    release_one_of_two_with(target, "failed_release", Fault::Fail(Duration::ZERO)).await;
}

/// Promise 4: the release of a lock's only hold that fails before it reaches the server still
/// frees the lock promptly.
pub async fn promise4_failed_last_release_frees_the_lock(target: &Target) {
    let name = unique("failed_last_release");
    let (locks, faulty) = faulty(target).await;
    let guard = hold(&locks, &name).await;
    faulty.set_times(Method::Release, Fault::Fail(Duration::ZERO), 1);
    let released = guard.release().await;
    assert_faulted(&faulty, Method::Release, "failed last release");
    assert!(released.is_err(), "the failed release reported success");
    free_promptly(target, &name, "failed last release").await;
}

/// Promise 4: an extension whose reply is lost leaves the lock held, exclusively, by its
/// guard, which releases it normally.
pub async fn promise4_lost_extend_reply_keeps_the_lock(target: &Target) {
    let name = unique("lost_extend_reply");
    let (locks, faulty) = faulty(target).await;
    let guard = hold(&locks, &name).await;
    faulty.set_times(Method::Extend, Fault::LoseReply(Duration::ZERO), 1);
    let extended = guard.set_lease(Duration::from_secs(20)).await;
    assert_faulted(&faulty, Method::Extend, "lost extend reply");
    assert!(extended.is_err(), "the extension reported success");
    assert!(!guard.is_lost(), "the guard was called lost");
    still_excluded(target, &name, "lost extend reply").await;
    guard.release().await.expect("release");
    free_promptly(target, &name, "lost extend reply").await;
}

/// Holds exact under concurrency: two guards of one holder released at the same moment both
/// succeed and free the lock, 20 rounds in a row.
pub async fn promise4_concurrent_releases_keep_holds_exact(target: &Target) {
    let name = unique("concurrent_releases");
    let locks = client(target).await;
    for round in 0..20 {
        let (outer, inner) = hold_twice(&locks, &name).await;
        let (a, b) = tokio::join!(outer.release(), inner.release());
        a.unwrap_or_else(|e| panic!("round {round}: the first release failed: {e}"));
        b.unwrap_or_else(|e| panic!("round {round}: the second release failed: {e}"));
        free_promptly(
            target,
            &name,
            &format!("concurrent releases, round {round}"),
        )
        .await;
    }
}

/// Waits up to 5 s for the fault set on `method` to strike once.
async fn until_faulted(faulty: &FaultyBackend, method: Method, what: &str) {
    let struck = tokio::time::timeout(Duration::from_secs(5), async {
        while faulty.faulted(method) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(struck.is_ok(), "{what}: the fault was never injected");
}

/// Promise 4: a waiter's enqueue (its subscription; a fair backend's queue entry) whose
/// reply is lost leaves no entry behind: whatever the waiter's acquire answers, once the
/// holder and the waiter are done another client gets the lock promptly.
pub async fn promise4_lost_enqueue_reply_leaves_no_queue_entry(target: &Target) {
    let name = unique("lost_enqueue_reply");
    let holder = client(target).await;
    let held = hold(&holder, &name).await;
    let (locks, faulty) = faulty(target).await;
    faulty.set_times(Method::Subscribe, Fault::LoseReply(Duration::ZERO), 1);
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            let options = AcquireOptions::new().wait(Duration::from_secs(10));
            let acquired = locks
                .mutex(name.as_str())
                .unwrap()
                .acquire_with(options)
                .await;
            if let Ok(guard) = acquired {
                guard.release().await.expect("release the waiter's grant");
            }
            locks
        })
    };
    until_faulted(&faulty, Method::Subscribe, "lost enqueue reply").await;
    held.release().await.expect("release the holder's grant");
    let _locks = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter hung")
        .expect("waiter task");
    // Well under the 1 s handover lease a fair backend gives an entry at the head of its
    // queue: an entry left behind would hold the next client up for that long.
    free_within(
        target,
        &name,
        Duration::from_millis(600),
        "lost enqueue reply",
    )
    .await;
}

/// Promise 4: a renewal whose reply is lost (it ran on the server) does not cost the lock:
/// the next renewal keeps it, the guard is not lost, others stay excluded, and releasing it
/// frees it.
pub async fn promise4_lost_renewal_reply_keeps_the_lock(target: &Target) {
    let lease = Duration::from_secs(1);
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(lease)).await;
    let name = unique("lost_renewal_reply");
    let guard = hold(&locks, &name).await;
    faulty.set_times(Method::Renew, Fault::LoseReply(Duration::ZERO), 1);
    until_faulted(&faulty, Method::Renew, "lost renewal reply").await;
    // Two more leases: the lock lives on by the renewals after the lost reply.
    let lost = tokio::time::timeout(lease * 2, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the lock was lost after one renewal reply was lost"
    );
    still_excluded(target, &name, "lost renewal reply").await;
    guard.release().await.expect("release");
    free_promptly(target, &name, "lost renewal reply").await;
}

/// Promise 4: the client gave a lock up as lost while the server still held it (every
/// renewal ran but its reply was lost), and the same holder then takes it again: whether the
/// server re-entered the old hold or granted anew, releasing both guards, the lost one and
/// the new one, frees the lock at once, not at the end of a lease.
pub async fn promise4_regrant_after_a_client_side_loss_keeps_holds_exact(target: &Target) {
    let lease = Duration::from_secs(5);
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(lease)).await;
    let name = unique("regrant_after_client_side_loss");
    let holder = locks.holder();
    let first = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    faulty.set(Method::Renew, Fault::LoseReply(Duration::ZERO));
    tokio::time::timeout(lease * 2, first.lost())
        .await
        .expect("the client never gave the lock up");
    faulty.clear(Method::Renew);
    let second = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the holder could not take its lock again");
    assert!(!second.is_lost(), "the new guard is lost");
    second.release().await.expect("release the new guard");
    let _ = first.release().await;
    // Well within the 5 s lease the server would keep a forgotten hold for.
    free_within(
        target,
        &name,
        Duration::from_millis(1500),
        "regrant after a client-side loss",
    )
    .await;
}
