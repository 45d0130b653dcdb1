//! Changing a held lock's lease: `extend` on a fixed lease, `set_lease` from a renewed one.

use std::time::Duration;

use super::{
    SHORT_LEASE, Target, acquire_within, client, hold, hold_for, newer_grant_still_holds,
    short_lease_client, unique,
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

/// Promises 1, 2 and 6: a holder that keeps 12 other locks takes one name again and again
/// (held 15 ms each time; a 600 ms lease renewed every 200 ms, so that renewals are in flight
/// during re-grants) while a rival client keeps trying it. A renewal's answer about an earlier
/// grant never takes the new grant away: the rival is granted only between the holder's
/// grants, or after the holder's guard reported the loss. Bounded by 100 grants and 8 s.
pub async fn promise6_regrants_during_renewals_keep_one_holder(target: &Target) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let name = unique("regrants_during_renewals");
    let holder = target
        .client_with(crate::ConnectOptions::new().lease(Duration::from_millis(600)))
        .await;
    let rival = client(target).await;
    let me = holder.holder();
    let mut others = Vec::new();
    for i in 0..12 {
        let other = me.mutex(format!("{name}-other-{i}")).unwrap();
        let wait = AcquireOptions::new().wait(Duration::from_secs(10));
        others.push(other.acquire_with(wait).await.expect("another lock"));
    }
    // Set while the holder's guard is granted and has not reported a loss.
    let holding = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let rival_task = {
        let mutex = rival.mutex(name.as_str()).unwrap();
        let (holding, stop, overlaps) = (holding.clone(), stop.clone(), overlaps.clone());
        tokio::spawn(async move {
            let mut granted = 0_u64;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(guard)) = mutex.try_acquire().await {
                    granted += 1;
                    if holding.load(Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = guard.release().await;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            granted
        })
    };
    let mutex = me.mutex(name.as_str()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut grants = 0;
    while grants < 100 && tokio::time::Instant::now() < deadline {
        let wait = AcquireOptions::new().wait(Duration::from_secs(2));
        let Ok(guard) = mutex.acquire_with(wait).await else {
            continue;
        };
        grants += 1;
        holding.store(true, Ordering::SeqCst);
        tokio::select! {
            _ = guard.lost() => {}
            () = tokio::time::sleep(Duration::from_millis(15)) => {}
        }
        holding.store(false, Ordering::SeqCst);
        assert!(
            !guard.is_lost(),
            "grant {grants}: the holder's guard was lost ({:?}) with nothing wrong",
            guard.loss_reason()
        );
        guard.release().await.expect("release");
    }
    stop.store(true, Ordering::SeqCst);
    let rival_grants = tokio::time::timeout(Duration::from_secs(10), rival_task)
        .await
        .expect("the rival stops")
        .expect("the rival's task");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "the rival was granted the lock while the holder held it ({grants} grants, the rival's {rival_grants})"
    );
    assert!(grants >= 10, "only {grants} grants in 8 s");
    for other in others {
        assert!(!other.is_lost(), "another lock of the holder was lost");
        other.release().await.expect("release another lock");
    }
}

/// Promises 1, 2 and 6: `extend` on a guard whose fixed lease ran out, after its owner took
/// the name again with a fixed 5 s lease, changes nothing: the extension is about the earlier
/// grant (its fencing token), which is gone. Before, it set the new grant's lease to 200 ms
/// and a rival was granted the lock while the new guard held it, not lost.
pub async fn promise6_extending_a_superseded_guard_leaves_the_new_grant_alone(target: &Target) {
    let name = unique("extend_superseded");
    let locks = client(target).await;
    let me = locks.holder();
    let mutex = me.mutex(name.as_str()).unwrap();
    let fixed = |lease| {
        AcquireOptions::new()
            .lease(lease)
            .wait(Duration::from_secs(5))
    };
    let first = mutex
        .acquire_with(fixed(Duration::from_millis(300)))
        .await
        .expect("the first grant");
    tokio::time::timeout(Duration::from_secs(5), first.lost())
        .await
        .expect("the first grant's 300 ms lease did not end");
    // `lost()` fires a little before the server ends the lease (until then the owner's next
    // acquisition would re-enter the first grant): wait until the server freed it.
    let start = tokio::time::Instant::now();
    while locks.is_locked(name.as_str()).await.expect("is_locked") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the first grant's 300 ms lease did not end on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = mutex
        .acquire_with(fixed(Duration::from_secs(5)))
        .await
        .expect("the second grant");
    assert_ne!(second.fencing_token(), first.fencing_token());
    let extended = first.extend(Duration::from_millis(200)).await;
    assert!(
        extended.is_err(),
        "a guard whose lease ended was extended: {extended:?}"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    newer_grant_still_holds(target, &name, second).await;
}
