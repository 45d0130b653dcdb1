//! Waiters of one owner: two tasks of one `Holder` waiting for the same lock at once.

use std::time::Duration;

use distlock::AcquireOptions;
use tokio::time::{Instant, timeout};

use super::{keys, raw, standalone, unique};

/// Promise 4: two tasks of one `Holder` wait for a lock another client holds, both at once,
/// over and over. Each round both are granted (the second re-enters), both release, and no
/// key of theirs is left: a key put by one task's attempt over the other's, and tracked by
/// nobody, would stay under the client's lease and block the lock for every contender.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promise4_two_waiting_tasks_of_one_holder_leave_no_key() {
    let url = standalone();
    let raw = raw(&url).await;
    let name = unique("two-tasks");
    let locks = distlock::connect(&url).await.unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    let me = locks.holder();
    for round in 0..20 {
        let held = rival.mutex(&name).unwrap().acquire().await.unwrap();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let mutex = me.mutex(name.as_str()).unwrap();
                tokio::spawn(async move {
                    let wait = AcquireOptions::new().wait(Duration::from_secs(10));
                    let guard = mutex.acquire_with(wait).await.expect("granted");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    guard.release().await.expect("released");
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20 + round % 7)).await;
        held.release().await.unwrap();
        for task in tasks {
            timeout(Duration::from_secs(15), task)
                .await
                .expect("both tasks are granted and release")
                .expect("a task failed");
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = keys(&raw, &name).await;
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: keys left after both released: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
