//! Redis fair mode: a lock handed to a waiter is never left held when the waiter goes away in
//! the middle of taking it (promise 4).

use std::task::Poll;
use std::time::{Duration, Instant};

use distlock::LockName;
use distlock::backend::{Acquired, Backend, ReleaseWaiter};
use distlock::conformance::servers;
use distlock::redis::RedisBackend;

/// The handover's own lease is 1 s: a lock left behind is still held well after this.
const GIVEN_BACK_WITHIN: Duration = Duration::from_millis(400);

async fn backend() -> RedisBackend {
    RedisBackend::connect(&servers::REDIS.url())
        .await
        .expect("connect to the test Redis")
}

/// Polls `wait` once: far enough for a refresh to be sent, usually not for its reply to be
/// read. True when the refresh was left in flight; false when the reply came within the poll
/// (a test thread descheduled on a loaded machine), so that the round tested nothing.
async fn poll_once(waiter: &mut Box<dyn ReleaseWaiter>) -> bool {
    let mut wait = waiter.wait(Duration::from_secs(5));
    let polled = std::future::poll_fn(|cx| Poll::Ready(wait.as_mut().poll(cx))).await;
    polled.is_pending()
}

async fn freed_within(backend: &RedisBackend, name: &LockName, limit: Duration, what: &str) {
    let start = Instant::now();
    while backend.is_locked(name).await.expect("is_locked") {
        assert!(start.elapsed() < limit, "{what}: the lock was still held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Promise 4: a waiter dropped while the refresh that takes the lock handed to it is in
/// flight (sent, its reply unread) gives the lock back at once: taking a handover leaves it
/// marked for that waiter, so the leave that follows the refresh still finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_waiter_dropped_while_it_takes_a_handover_gives_it_back() {
    let backend = backend().await;
    let locks = distlock::connect("memory://").await.unwrap();
    let name = LockName::new(format!("claim-dropped/{}", fastrand::u64(..))).unwrap();
    let lease = Duration::from_secs(30);
    let (holder, waiter) = (locks.holder(), locks.holder());
    let (mut in_flight, mut rounds) = (0, 0);
    while in_flight < 5 {
        rounds += 1;
        assert!(
            rounds <= 40,
            "only {in_flight} of {rounds} rounds left the refresh in flight"
        );
        let granted = backend.try_acquire(&name, holder.owner(), lease).await;
        assert!(
            matches!(granted, Ok(Acquired::Granted { .. })),
            "{granted:?}"
        );
        let mut queued = backend
            .subscribe(&name, waiter.owner(), lease)
            .await
            .unwrap();
        backend.release(&name, holder.owner()).await.unwrap();
        assert_eq!(backend.holds(&name, waiter.owner()).await.unwrap(), 1);
        // Past the refresh interval: the next wait refreshes first, which takes the lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !poll_once(&mut queued).await {
            // The handover was taken within the poll: give it back and try again.
            drop(queued);
            backend.release(&name, waiter.owner()).await.unwrap();
            freed_within(&backend, &name, GIVEN_BACK_WITHIN, "a round taken at once").await;
            continue;
        }
        in_flight += 1;
        drop(queued);
        let what = format!("round {rounds}, a waiter dropped while taking its handover");
        freed_within(&backend, &name, GIVEN_BACK_WITHIN, &what).await;
    }
}
