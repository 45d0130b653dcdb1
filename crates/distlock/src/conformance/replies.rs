//! Requests whose reply is lost, or that fail before they reach the server, on every mutating
//! method (promise 4: nothing is left behind, hold counts stay exact), injected by
//! [`FaultyBackend`](crate::fault::FaultyBackend) around the real backend.

use std::sync::Arc;
use std::time::Duration;

use super::{client, faulty_client, free_within, unique};
use crate::fault::{Fault, FaultyBackend, Method};
use crate::{AcquireOptions, ConnectOptions, Guard, Locks};

/// How soon another client must get a lock after the faulty request: far below the 30 s
/// lease a left-over hold would keep.
const PROMPTLY: Duration = Duration::from_secs(3);

/// A client with the default (30 s) lease whose requests go through a [`FaultyBackend`].
async fn faulty(url: &str) -> (Locks, Arc<FaultyBackend>) {
    faulty_client(url, ConnectOptions::new()).await
}

/// Another client gets `name` promptly: no hold is left.
async fn free_promptly(url: &str, name: &str, what: &str) {
    free_within(url, name, PROMPTLY, what).await;
}

/// Another client cannot take `name` now: it is still held.
async fn still_excluded(url: &str, name: &str, what: &str) {
    let other = client(url).await;
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
pub async fn promise4_lost_acquire_reply_leaves_no_hold(url: &str) {
    let name = unique("lost_acquire_reply");
    let (locks, faulty) = faulty(url).await;
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
    free_promptly(url, &name, "lost acquire reply").await;
}

/// Promise 4: a re-entry whose reply is lost leaves the hold count as it was: releasing the
/// outer guard frees the lock.
pub async fn promise4_lost_reentry_reply_keeps_holds_exact(url: &str) {
    let name = unique("lost_reentry_reply");
    let (locks, faulty) = faulty(url).await;
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
    still_excluded(url, &name, "lost re-entry reply").await;
    outer.release().await.expect("release the outer guard");
    free_promptly(url, &name, "lost re-entry reply").await;
}

/// Releases one of two holds with `fault` on the release: the other hold stays (exclusion
/// holds, not lost), and releasing it frees the lock.
async fn release_one_of_two_with(url: &str, case: &str, fault: Fault) {
    let name = unique(case);
    let (locks, faulty) = faulty(url).await;
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
    still_excluded(url, &name, case).await;
    outer.release().await.expect("release the outer guard");
    free_promptly(url, &name, case).await;
}

/// Promise 4: the release of one of two holds whose reply is lost (it ran) leaves one hold.
pub async fn promise4_lost_release_reply_keeps_holds_exact(url: &str) {
    release_one_of_two_with(url, "lost_release_reply", Fault::LoseReply(Duration::ZERO)).await;
}

/// Promise 4: the release of one of two holds that fails before it reaches the server leaves
/// one hold, not two.
pub async fn promise4_failed_release_keeps_holds_exact(url: &str) {
    release_one_of_two_with(url, "failed_release", Fault::Fail(Duration::ZERO)).await;
}

/// Promise 4: the release of a lock's only hold that fails before it reaches the server still
/// frees the lock promptly.
pub async fn promise4_failed_last_release_frees_the_lock(url: &str) {
    let name = unique("failed_last_release");
    let (locks, faulty) = faulty(url).await;
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    faulty.set_times(Method::Release, Fault::Fail(Duration::ZERO), 1);
    let released = guard.release().await;
    assert_faulted(&faulty, Method::Release, "failed last release");
    assert!(released.is_err(), "the failed release reported success");
    free_promptly(url, &name, "failed last release").await;
}

/// Promise 4: an extension whose reply is lost leaves the lock held, exclusively, by its
/// guard, which releases it normally.
pub async fn promise4_lost_extend_reply_keeps_the_lock(url: &str) {
    let name = unique("lost_extend_reply");
    let (locks, faulty) = faulty(url).await;
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    faulty.set_times(Method::Extend, Fault::LoseReply(Duration::ZERO), 1);
    let extended = guard.extend(Duration::from_secs(20)).await;
    assert_faulted(&faulty, Method::Extend, "lost extend reply");
    assert!(extended.is_err(), "the extension reported success");
    assert!(!guard.is_lost(), "the guard was called lost");
    still_excluded(url, &name, "lost extend reply").await;
    guard.release().await.expect("release");
    free_promptly(url, &name, "lost extend reply").await;
}

/// Holds exact under concurrency: two guards of one holder released at the same moment both
/// succeed and free the lock, 20 rounds in a row.
pub async fn promise4_concurrent_releases_keep_holds_exact(url: &str) {
    let name = unique("concurrent_releases");
    let locks = client(url).await;
    for round in 0..20 {
        let (outer, inner) = hold_twice(&locks, &name).await;
        let (a, b) = tokio::join!(outer.release(), inner.release());
        a.unwrap_or_else(|e| panic!("round {round}: the first release failed: {e}"));
        b.unwrap_or_else(|e| panic!("round {round}: the second release failed: {e}"));
        free_promptly(url, &name, &format!("concurrent releases, round {round}")).await;
    }
}
