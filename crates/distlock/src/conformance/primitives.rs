//! The primitives built on a backend's mutex: the semaphore and the multi-lock. (The
//! reader-writer lock's cases are in `rwlocks.rs`.)

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::cancel::poll_once;
use super::{
    SHORT_LEASE, Target, UNLOCK_LEASE, client, finish_tasks, hold, short_lease_client, unique,
    unlock_lease_client,
};
use crate::{AcquireOptions, LossReason};

/// How soon after a cancelled acquisition another client must get what it asked for.
pub(super) const PROMPTLY: Duration = Duration::from_secs(5);

/// How long a whole case may take before it counts as hung.
const CASE_LIMIT: Duration = Duration::from_secs(90);

/// Polls `future` `1 + round / 4` times, awaiting `release` before poll `round % 4` (or after
/// the polls, when there are fewer), then drops it. `Some` when it finished first; the bool
/// says whether it was dropped while pending.
pub(super) async fn drop_after_polls<T>(
    round: usize,
    future: impl Future<Output = crate::Result<T>>,
    release: impl Future<Output = ()>,
) -> (Option<T>, bool) {
    let mut future = Box::pin(future);
    let mut release = Some(release);
    let release_at = round % 4;
    let polls = 1 + round / 4;
    let mut finished = None;
    for poll in 0..polls {
        if poll == release_at
            && let Some(release) = release.take()
        {
            release.await;
        }
        if let Some(result) = poll_once(&mut future).await {
            finished = Some(result.unwrap_or_else(|e| panic!("round {round}: acquire: {e}")));
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let pending = finished.is_none();
    drop(future);
    if let Some(release) = release {
        release.await;
    }
    (finished, pending)
}

/// Promise 1: eight tasks of two clients share a semaphore of three permits; never more than
/// three hold one at once, never two the same permit slot, and three do at some point.
pub async fn promise1_semaphore_admits_at_most_its_permits(target: &Target) {
    let name = unique("semaphore_limit");
    let clients = [client(target).await, client(target).await];
    let in_use = Arc::new(StdMutex::new(HashSet::new()));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let semaphore = clients[task % 2].semaphore(name.as_str(), 3).unwrap();
        let (in_use, most) = (in_use.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..6 {
                let permit = semaphore
                    .acquire_with(AcquireOptions::new().wait(Duration::from_secs(30)))
                    .await
                    .unwrap_or_else(|e| panic!("task {task} round {round}: {e}"));
                let slot = permit.name().to_string();
                {
                    let mut in_use = in_use.lock().unwrap();
                    // Three slot names: a fourth holder would share one.
                    assert!(in_use.insert(slot.clone()), "two holders of {slot}");
                    most.fetch_max(in_use.len(), Ordering::SeqCst);
                }
                // Long enough for three holds to meet while a slow backend (an etcd
                // cluster on a loaded machine) hands permits over one round trip at a time.
                tokio::time::sleep(Duration::from_millis(60)).await;
                in_use.lock().unwrap().remove(&slot);
                permit.release().await.expect("release a permit");
            }
        }));
    }
    finish_tasks(tasks, CASE_LIMIT, "semaphore holders").await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        3,
        "never three holders at once: the permits did not admit in parallel"
    );
    let semaphore = clients[0].semaphore(name.as_str(), 3).unwrap();
    // Racers that lost give their grants back in the background.
    tokio::time::timeout(Duration::from_secs(10), async {
        while semaphore.available().await.unwrap() < 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a permit was left held");
}

/// A full semaphore: `try_acquire` says so at once, a waiter gets the next freed permit, a
/// client with a smaller or a larger count is refused with a typed error, bad counts are
/// refused, and `register_permits` changes the count for everyone.
pub async fn semaphore_waits_and_checks_its_count(target: &Target) {
    let name = unique("semaphore_count");
    let locks = client(target).await;
    let other = client(target).await;
    for bad in [0, crate::semaphore::MAX_PERMITS + 1] {
        let err = locks.semaphore(name.as_str(), bad).unwrap_err();
        assert!(err.is_invalid_input(), "{bad} permits: {err}");
    }
    let semaphore = locks.semaphore(name.as_str(), 3).unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            semaphore
                .try_acquire()
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    assert!(
        semaphore.try_acquire().await.unwrap().is_none(),
        "a fourth permit"
    );
    let smaller = other.semaphore(name.as_str(), 2).unwrap();
    let err = smaller.try_acquire().await.unwrap_err();
    assert!(err.is_invalid_input(), "a client with 2 permits: {err}");
    assert!(err.to_string().contains("same count"), "{err}");
    // A larger count is refused too, although its extra slots are free: the count the
    // name's first acquisition registered is read.
    let larger = other.semaphore(name.as_str(), 5).unwrap();
    let err = larger.try_acquire().await.unwrap_err();
    assert!(err.is_invalid_input(), "a client with 5 permits: {err}");
    let waiting = other.semaphore(name.as_str(), 3).unwrap();
    let waiter = tokio::spawn(async move {
        waiting
            .acquire_with(AcquireOptions::new().wait(Duration::from_secs(20)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let freed = held.remove(1);
    let freed_slot = freed.name().to_string();
    freed.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not granted the freed permit")
        .unwrap()
        .expect("the waiter's acquire failed");
    assert_eq!(
        permit.name(),
        freed_slot,
        "granted another slot than the freed one"
    );
    permit.release().await.unwrap();
    for guard in held {
        guard.release().await.unwrap();
    }
    // Changing the count for everyone: the larger count registers itself; then it is the
    // 3-permit clients that are refused.
    larger.register_permits().await.unwrap();
    larger
        .try_acquire()
        .await
        .unwrap()
        .expect("a permit of the registered count")
        .release()
        .await
        .unwrap();
    let old_count = locks.semaphore(name.as_str(), 3).unwrap();
    let err = old_count.try_acquire().await.unwrap_err();
    assert!(
        err.is_invalid_input(),
        "3 permits after 5 were registered: {err}"
    );
    // A handle that checked the old count earlier sees the change within its check interval,
    // although it finds free slots.
    tokio::time::sleep(crate::semaphore::COUNT_CHECK_EVERY).await;
    let err = semaphore.try_acquire().await.unwrap_err();
    assert!(err.is_invalid_input(), "a running 3-permit handle: {err}");
}

/// Promise 2 and expiry: a permit force-unlocked fires its `lost()`; a permit whose holder
/// vanished (its guard forgotten, as a crashed process's) frees at its lease's end.
pub async fn promise2_semaphore_permit_loss_and_expiry(target: &Target) {
    let name = unique("semaphore_loss");
    let locks = short_lease_client(target).await;
    let operator = client(target).await;
    let semaphore = locks.semaphore(name.as_str(), 1).unwrap();
    let permit = semaphore.acquire().await.unwrap();
    assert!(operator.force_unlock(permit.name()).await.unwrap());
    let lost = tokio::time::timeout(SHORT_LEASE * 5, permit.lost())
        .await
        .expect("lost() did not fire after the permit was force-unlocked");
    assert!(lost.is_lock_lost(), "{lost}");
    drop(permit);
    let lease = Duration::from_millis(700);
    let crashed = semaphore
        .acquire_with(
            AcquireOptions::new()
                .lease(lease)
                .wait(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    std::mem::forget(crashed);
    let other = operator.semaphore(name.as_str(), 1).unwrap();
    let permit = other
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the vanished holder's permit did not free at its lease's end");
    assert!(
        started.elapsed() >= lease - Duration::from_millis(100),
        "granted {:?} after a {lease:?} lease began",
        started.elapsed()
    );
    permit.release().await.unwrap();
}

/// Promise 4: a waiting permit acquisition dropped after 1 to 7 polls, with a permit freed
/// before, during or after its wait, leaves no permit and no queue entry behind.
pub async fn promise4_cancelled_semaphore_acquire_leaves_nothing(target: &Target) {
    let name = unique("semaphore_cancel");
    let locks = client(target).await;
    let other = client(target).await;
    let semaphore = locks.semaphore(name.as_str(), 2).unwrap();
    let mut dropped_while_pending = 0;
    for round in 1..=16usize {
        let first = semaphore.acquire().await.unwrap();
        let second = semaphore.acquire().await.unwrap();
        let (granted, pending) = drop_after_polls(
            round,
            semaphore.acquire_with(AcquireOptions::new().wait(Duration::from_secs(10))),
            // Both permits free at once, so that two of the waiter's racers may be granted.
            async {
                let (a, b) = tokio::join!(first.release(), second.release());
                a.and(b).expect("release the permits");
            },
        )
        .await;
        dropped_while_pending += usize::from(pending);
        if let Some(permit) = granted {
            permit.release().await.unwrap();
        }
        let check = other.semaphore(name.as_str(), 2).unwrap();
        let wait = AcquireOptions::new().wait(PROMPTLY);
        let a = check.acquire_with(wait).await.unwrap_or_else(|e| {
            panic!("round {round}: a cancelled acquire left a permit behind: {e}")
        });
        let b = check.acquire_with(wait).await.unwrap_or_else(|e| {
            panic!("round {round}: a cancelled acquire left a permit behind: {e}")
        });
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
    assert!(
        dropped_while_pending >= 4,
        "only {dropped_while_pending} acquires were dropped while pending"
    );
}

/// All or nothing: a multi-lock with one part held by another owner takes none of the
/// others; bad name lists are refused; every part carries its token once granted.
pub async fn multi_lock_is_all_or_nothing(target: &Target) {
    let base = unique("multi_all");
    let names = [
        format!("{base}/c"),
        format!("{base}/a"),
        format!("{base}/b"),
    ];
    let locks = client(target).await;
    let other = client(target).await;
    assert!(
        locks
            .multi_lock(Vec::<String>::new())
            .unwrap_err()
            .is_invalid_input()
    );
    let twice = locks.multi_lock([names[0].as_str(), names[0].as_str()]);
    assert!(twice.unwrap_err().is_invalid_input());
    let multi = locks.multi_lock(names.iter().cloned()).unwrap();
    // The last name in the multi-lock's order (`c`), so that the others are taken first.
    let blocker = hold(&other, names[0].as_str()).await;
    assert!(multi.try_acquire().await.unwrap().is_none());
    let err = multi
        .acquire_with(AcquireOptions::new().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // The parts taken before the held one were given back (in the background).
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let a = locks.is_locked(&names[1]).await.unwrap();
            let b = locks.is_locked(&names[2]).await.unwrap();
            if !a && !b {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a failed multi-lock kept a part");
    blocker.release().await.unwrap();
    let guard = multi.acquire().await.unwrap();
    for name in &names {
        assert!(locks.is_locked(name).await.unwrap(), "{name} not held");
        assert!(guard.fencing_token(name).is_some(), "no token for {name}");
    }
    assert_eq!(guard.fencing_tokens().len(), 3);
    guard.release().await.unwrap();
    for name in &names {
        assert!(!locks.is_locked(name).await.unwrap(), "{name} still held");
    }
}

/// Promise 1 and no deadlock: tasks that list two names in opposite orders take them many
/// times, one at a time, within the case's limit.
pub async fn promise1_multi_lock_orders_do_not_deadlock(target: &Target) {
    let base = unique("multi_order");
    let (x, y) = (format!("{base}/x"), format!("{base}/y"));
    let clients = [client(target).await, client(target).await];
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..4 {
        let names = if task % 2 == 0 {
            [x.clone(), y.clone()]
        } else {
            [y.clone(), x.clone()]
        };
        let multi = clients[task % 2].multi_lock(names).unwrap();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..8 {
                let guard = multi
                    .acquire_with(AcquireOptions::new().wait(Duration::from_secs(30)))
                    .await
                    .unwrap_or_else(|e| panic!("task {task} round {round}: {e}"));
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    finish_tasks(tasks, CASE_LIMIT, "multi-locks in opposite orders").await;
}

/// Promise 1 with a fixed lease: a multi-lock that waited for its last part holds every part
/// for the whole lease from the moment it holds them all (a part's lease did not run out
/// while the others were awaited), and every part frees when that lease ends.
pub async fn promise1_multi_lock_fixed_lease_starts_once_all_are_held(target: &Target) {
    let base = unique("multi_lease");
    let names = [
        format!("{base}/a"),
        format!("{base}/b"),
        format!("{base}/c"),
    ];
    let locks = client(target).await;
    let other = client(target).await;
    let blocker = hold(&other, names[2].as_str()).await;
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        blocker.release().await.expect("release the blocker");
    });
    let lease = Duration::from_secs(1);
    let guard = locks
        .multi_lock(names.iter().cloned())
        .unwrap()
        .acquire_with(
            AcquireOptions::new()
                .wait(Duration::from_secs(10))
                .lease(lease),
        )
        .await
        .expect("the multi-lock was not granted after the blocker left");
    releaser.await.unwrap();
    assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
    for name in &names {
        let held = other
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        assert!(
            held.is_none(),
            "{name} was free while the multi-lock held it"
        );
    }
    let lost = tokio::time::timeout(lease * 4, guard.lost())
        .await
        .expect("the fixed lease never ended");
    assert!(lost.is_lock_lost(), "{lost}");
    for name in &names {
        let part = other
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("{name} did not free at the lease's end: {e}"));
        part.release().await.unwrap();
    }
}

/// Promise 2: a multi-lock whose one part is force-unlocked fires `lost()`.
pub async fn promise2_multi_lock_lost_when_a_part_is_lost(target: &Target) {
    let base = unique("multi_lost");
    let locks = unlock_lease_client(target).await;
    let operator = client(target).await;
    let names = [format!("{base}/p"), format!("{base}/q")];
    let guard = locks
        .multi_lock(names.iter().cloned())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert!(guard.loss_reason().is_none());
    assert!(operator.force_unlock(&names[1]).await.unwrap());
    let lost = tokio::time::timeout(UNLOCK_LEASE * 3, guard.lost())
        .await
        .expect("lost() did not fire after a part was force-unlocked");
    assert!(
        matches!(
            lost,
            crate::Error::LockLost {
                reason: LossReason::NotHeld | LossReason::SessionLost,
                ..
            }
        ),
        "{lost}"
    );
    assert!(guard.loss_reason().is_some());
    drop(guard);
}

/// Promise 4: a waiting multi-lock dropped after 1 to 7 polls leaves no part held.
pub async fn promise4_cancelled_multi_lock_leaves_nothing(target: &Target) {
    let base = unique("multi_cancel");
    let names = [
        format!("{base}/a"),
        format!("{base}/b"),
        format!("{base}/c"),
    ];
    let locks = client(target).await;
    let other = client(target).await;
    let multi = locks.multi_lock(names.iter().cloned()).unwrap();
    let mut dropped_while_pending = 0;
    for round in 1..=16usize {
        let blocker = hold(&other, names[round % 3].as_str()).await;
        let (granted, pending) = drop_after_polls(
            round,
            multi.acquire_with(AcquireOptions::new().wait(Duration::from_secs(10))),
            async {
                blocker.release().await.expect("release the blocker");
            },
        )
        .await;
        dropped_while_pending += usize::from(pending);
        if let Some(guard) = granted {
            guard.release().await.unwrap();
        }
        let check = other.multi_lock(names.iter().cloned()).unwrap();
        let guard = check
            .acquire_with(AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("round {round}: a cancelled multi-lock left a part: {e}"));
        guard.release().await.unwrap();
    }
    assert!(
        dropped_while_pending >= 4,
        "only {dropped_while_pending} multi-locks were dropped while pending"
    );
}
