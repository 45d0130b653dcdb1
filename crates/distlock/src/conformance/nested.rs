//! A task that holds one lock and asks for another while many tasks of its client wait for
//! the first: the second lock must not wait for the first (no starvation by the client's own
//! bound on waiting requests).

use std::time::Duration;

use super::{Target, acquire_within, client, unique};

/// How many tasks of the holder's client wait for the held lock: at least every waiting
/// statement a session-lock client runs at once.
const WAITERS: usize = 20;

/// Promise 1 without starvation: while 20 tasks of one client wait for lock A, the task that
/// holds A gets a free lock B of the same client within two seconds.
pub async fn nested_acquire_is_not_starved_by_waiters(target: &Target) {
    let (a, b) = (unique("nested/a"), unique("nested/b"));
    let locks = client(target).await;
    let held = acquire_within(&locks, &a, Duration::from_secs(5))
        .await
        .expect("acquire A");
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let mutex = locks.mutex(a.as_str()).unwrap();
        waiters.push(tokio::spawn(async move {
            let guard = mutex
                .acquire_with(crate::AcquireOptions::new().wait(Duration::from_secs(60)))
                .await
                .expect("a waiter of A");
            guard.release().await.expect("release A");
        }));
    }
    // Let every waiter start waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = tokio::time::Instant::now();
    let nested = acquire_within(&locks, &b, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| {
            panic!("B was not granted while {WAITERS} tasks of the client waited for A: {e}")
        });
    assert!(start.elapsed() < Duration::from_secs(2));
    nested.release().await.expect("release B");
    held.release().await.expect("release A");
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the waiters of A never all got it")
            .expect("a waiter of A panicked");
    }
}

/// Promises 1 and 4 for one owner in several tasks: two tasks of one
/// [`Holder`](crate::Holder) wait at once for a lock another client holds, ten rounds. Each
/// round both are granted (one grant re-entered, or one after the other), neither guard is
/// reported lost while held, both releases succeed (a guard of a grant marked lost would fail
/// its release), and the lock is free for a rival at once: the owner's two requests in flight
/// leave neither an extra hold nor a key of their own behind.
pub async fn two_waiting_tasks_of_one_holder_share_the_grant(target: &Target) {
    let name = unique("nested/two-tasks");
    let (locks, rival) = (client(target).await, client(target).await);
    let me = locks.holder();
    for round in 0..10 {
        let held = acquire_within(&rival, &name, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the rival was not granted: {e}"));
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let mutex = me.mutex(name.as_str()).unwrap();
                tokio::spawn(async move {
                    let wait = crate::AcquireOptions::new().wait(Duration::from_secs(10));
                    let guard = mutex.acquire_with(wait).await?;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(
                        !guard.is_lost(),
                        "a guard of the shared grant was reported lost"
                    );
                    guard.release().await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20 + round % 7)).await;
        held.release().await.expect("the rival's release");
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a task of the holder hung"))
                .expect("a task of the holder panicked")
                .unwrap_or_else(|e| panic!("round {round}: a task of the holder: {e}"));
        }
    }
    let last = acquire_within(&rival, &name, Duration::from_secs(2))
        .await
        .expect("the lock was not free after both tasks released");
    last.release().await.expect("release");
}
