//! [`Locks::run_exclusive`](crate::Locks::run_exclusive): a scheduled job fired on several
//! instances at once runs on one of them, the hold outlives a short job until its lower
//! bound, and a job past its upper bound is stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{Target, client, free_within, unique};
use crate::Schedule;

/// Promise 1: four instances fire the job together: one runs it, the others skip it; fired
/// again before the lower bound has passed, every instance skips it; after the bound the
/// lock frees itself (nothing left behind) and the job runs again, with a larger token.
pub async fn promise1_scheduled_job_runs_once_per_hold(target: &Target) {
    let name = unique("schedule_once");
    let schedule = Schedule::hold(Duration::from_secs(2), Duration::from_secs(10));
    let instances = [
        client(target).await,
        client(target).await,
        client(target).await,
        client(target).await,
    ];
    let ran = Arc::new(AtomicU32::new(0));
    let fire = |round: &'static str| {
        let ran = ran.clone();
        let name = name.clone();
        let instances = &instances;
        async move {
            let runs = instances.iter().map(|locks| {
                let (ran, name) = (ran.clone(), name.clone());
                async move {
                    locks
                        .run_exclusive(name, schedule, |token| async move {
                            ran.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            token
                        })
                        .await
                        .unwrap_or_else(|e| panic!("{round}: run_exclusive: {e}"))
                }
            });
            tokio::time::timeout(
                Duration::from_secs(10),
                futures_util::future::join_all(runs),
            )
            .await
            .unwrap_or_else(|_| panic!("{round}: run_exclusive hung"))
        }
    };
    let start = Instant::now();
    let first = fire("first firing").await;
    let tokens: Vec<u64> = first.iter().flatten().copied().collect();
    assert_eq!(
        tokens.len(),
        1,
        "first firing: not exactly one run: {first:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "first firing: the job ran twice"
    );
    let again = fire("fired within the hold").await;
    assert!(
        start.elapsed() >= Duration::from_secs(2) || again.iter().all(Option::is_none),
        "fired within the lower bound, the job ran again: {again:?}"
    );
    free_within(target, &name, Duration::from_secs(6), "after the hold").await;
    let third = fire("after the hold").await;
    let later: Vec<u64> = third.iter().flatten().copied().collect();
    assert_eq!(
        later.len(),
        1,
        "after the hold: not exactly one run: {third:?}"
    );
    assert!(
        later[0] > tokens[0],
        "promise 3: token {} after {}",
        later[0],
        tokens[0]
    );
}

/// Promise 2: a job still running when the upper bound ends is stopped (it never finishes)
/// and the answer is the loss; another instance can run the job after.
pub async fn promise2_scheduled_job_stops_at_its_upper_bound(target: &Target) {
    let name = unique("schedule_most");
    let locks = client(target).await;
    let finished = Arc::new(AtomicBool::new(false));
    let schedule = Schedule::hold(Duration::from_millis(100), Duration::from_millis(500));
    let run = locks.run_exclusive(name.as_str(), schedule, |_| {
        let finished = finished.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            finished.store(true, Ordering::SeqCst);
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the job was not stopped at its upper bound");
    let error = answer.expect_err("a job past its upper bound answered success");
    assert!(error.is_lock_lost(), "{error}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the job went on after the loss"
    );
    free_within(
        target,
        &name,
        Duration::from_secs(5),
        "after the upper bound",
    )
    .await;
}

/// Promise 4: a run cancelled while its job runs leaves nothing behind (the lock frees at
/// once, not at a bound), and a bad schedule is refused before anything is asked.
pub async fn promise4_cancelled_scheduled_job_leaves_nothing(target: &Target) {
    let name = unique("schedule_cancel");
    let locks = client(target).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let schedule = Schedule::hold(Duration::from_secs(30), Duration::from_secs(60));
    let run = {
        let started = started.clone();
        locks.run_exclusive(name.as_str(), schedule, |_| async move {
            started.notify_one();
            std::future::pending::<()>().await;
        })
    };
    tokio::select! {
        _ = run => panic!("a pending job finished"),
        _ = started.notified() => {}
    }
    free_within(
        target,
        &name,
        Duration::from_secs(5),
        "after a cancelled run",
    )
    .await;
    let bad = Schedule::hold(Duration::from_secs(2), Duration::from_secs(1));
    let refused = locks.run_exclusive(name.as_str(), bad, |_| async {}).await;
    assert!(
        refused.as_ref().is_err_and(crate::Error::is_invalid_input),
        "lower bound above the upper one: {refused:?}"
    );
}
