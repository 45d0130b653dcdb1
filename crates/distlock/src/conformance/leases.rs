//! Changing a held lock's lease: `extend` on a fixed lease, `set_lease` from a renewed one.

use std::time::Duration;

use super::{
    SHORT_LEASE, Target, acquire_within, client, hold, hold_for, short_lease_client, unique,
};
use crate::{AcquireOptions, LossReason};

/// `extend` makes a fixed lease end later; the guard is neither lost nor freed at the old end.
pub async fn extend_moves_the_lease_end(target: &Target) {
    let name = unique("extend");
    let locks = client(target).await;
    let guard = hold_for(&locks, name.as_str(), Duration::from_millis(300)).await;
    guard.extend(Duration::from_secs(3)).await.expect("extend");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!guard.is_lost(), "lost at the old lease end");
    assert!(guard.is_held().await.unwrap(), "freed at the old lease end");
    let rival = locks.mutex(name.as_str()).unwrap();
    assert!(rival.try_acquire().await.unwrap().is_none());
    // A shorter extension shortens the lease too: the guard is lost once it ends.
    guard.extend(Duration::from_millis(100)).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() did not fire at the new lease end");
    assert!(lost.is_lock_lost());
    // The client calls the lock lost a little before the server frees it (its deadline counts
    // from the start of the request), so the rival may wait a moment.
    let freed = rival
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(2)))
        .await;
    assert!(
        freed.is_ok(),
        "not freed after the shortened lease: {freed:?}"
    );
}

/// `extend` refuses a renewed lock (it has no lease end to move) and leaves it renewed;
/// `set_lease` turns it into a fixed lease that frees the lock at its end, and `lost()` names
/// that end as the reason.
pub async fn set_lease_turns_a_renewed_lock_into_a_fixed_lease(target: &Target) {
    let name = unique("set_lease");
    let locks = short_lease_client(target).await;
    let guard = hold(&locks, &name).await;
    let err = guard
        .extend(Duration::from_secs(5))
        .await
        .expect_err("extended a renewed lock");
    assert!(err.is_invalid_input(), "expected invalid input, got {err}");
    // Still renewed: held well past its first lease.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert!(
        !guard.is_lost(),
        "the refused extension stopped the renewal"
    );
    assert!(
        guard.is_held().await.unwrap(),
        "the refused extension freed the lock"
    );
    guard
        .set_lease(Duration::from_millis(400))
        .await
        .expect("set_lease");
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() did not fire at the end of the fixed lease");
    assert_lost_by_the_lease_end(&lost);
    let other = client(target).await;
    acquire_within(&other, &name, Duration::from_secs(3))
        .await
        .expect("not freed after the fixed lease set on a renewed lock")
        .release()
        .await
        .unwrap();
}

/// `lost` reports the end of a fixed lease.
pub(super) fn assert_lost_by_the_lease_end(lost: &crate::Error) {
    assert!(
        matches!(
            lost,
            crate::Error::LockLost {
                reason: LossReason::LeaseRanOut,
                ..
            }
        ),
        "expected the fixed lease's end as the reason, got {lost}"
    );
}
