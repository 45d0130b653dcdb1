//! [`Mutex::run`](crate::Mutex::run): the work runs under the lock and the lock is free after
//! it; a lock lost during the work stops the work and answers the loss (promise 2: no work
//! goes on unprotected once the loss is known).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Target, client, free_within, short_lease_client, unique};

/// The work's answer comes back, it held the lock while it ran, and the lock is free after.
pub async fn run_holds_the_lock_for_the_work(target: &Target) {
    let name = unique("run_holds");
    let locks = client(target).await;
    let other = client(target).await;
    let mutex = locks.mutex(name.as_str()).unwrap();
    let answer = mutex
        .run(|token| {
            let (other, name) = (&other, &name);
            async move {
                let rival = other.mutex(name.as_str()).unwrap().try_acquire().await;
                assert!(
                    matches!(rival, Ok(None)),
                    "another client got the lock during the work: {rival:?}"
                );
                token
            }
        })
        .await
        .expect("run");
    assert!(answer > 0, "the work did not get the fencing token");
    free_within(target, &name, Duration::from_secs(3), "after run").await;
}

/// Promise 2: the lock is force-unlocked while the work runs: the work is stopped (it never
/// finishes) and `run` answers the loss.
pub async fn promise2_run_stops_the_work_when_the_lock_is_lost(target: &Target) {
    let name = unique("run_lost");
    let locks = short_lease_client(target).await;
    let operator = client(target).await;
    let finished = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (finished, started, name) = (finished.clone(), started.clone(), name.clone());
        tokio::spawn(async move {
            locks
                .mutex(name.as_str())
                .unwrap()
                .run(|_| async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    started.notified().await;
    assert!(
        operator.force_unlock(&name).await.expect("force_unlock"),
        "the lock was not held during the work"
    );
    let answer = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("run did not notice the loss")
        .expect("run task");
    let error = answer.expect_err("run answered success for a lost lock");
    assert!(error.is_lock_lost(), "{error}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work went on after the loss"
    );
}
