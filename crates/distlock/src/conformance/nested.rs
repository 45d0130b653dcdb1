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
