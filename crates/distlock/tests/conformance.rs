//! The conformance suite on every backend compiled into this crate, and behaviour specific
//! to one backend.

use distlock::conformance::Target;

fn memory() -> Target {
    // A named store, so that the two clients a case connects share it.
    Target::new(format!(
        "memory://conformance-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ))
}

#[cfg(feature = "sqlite")]
fn sqlite(query: &str) -> Target {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}{query}", dir.path().join("locks.db").display());
    Target::with_resource(url, dir)
}

distlock::conformance_suite!(memory, memory());
#[cfg(feature = "sqlite")]
distlock::conformance_suite!(sqlite, sqlite(""));
#[cfg(feature = "sqlite")]
distlock::conformance_suite!(sqlite_unfair, sqlite("?fair=false"));

#[cfg(feature = "sqlite")]
mod sqlite_fair_mode {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::sqlite;

    /// Waiters are served in arrival order, and a releaser cannot jump the queue. (Without
    /// fair mode this test fails: the releaser takes the lock straight back.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn waiters_are_served_first_come_first_served() {
        let target = sqlite("");
        let holder_client = distlock::connect(target.url()).await.unwrap();
        let holder = holder_client.mutex("fifo").unwrap();
        let held = holder.acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for id in 0..4 {
            // A client per waiter, as if each were another process.
            let locks = distlock::connect(target.url()).await.unwrap();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let guard = locks.mutex("fifo").unwrap().acquire().await.unwrap();
                order.lock().unwrap().push(id);
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await.unwrap();
            }));
            // Let this waiter take its ticket before the next one arrives.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        held.release().await.unwrap();
        assert!(
            holder.try_acquire().await.unwrap().is_none(),
            "the releaser jumped the queue"
        );
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    }

    /// A queued waiter that vanishes without leaving the queue delays a free lock by at most
    /// the ticket's staleness limit (1 s), never for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_abandoned_ticket_goes_stale() {
        let target = sqlite("");
        let locks = distlock::connect(target.url()).await.unwrap();
        let held = locks.mutex("stale").unwrap().acquire().await.unwrap();
        // A waiter queues, then its runtime is leaked with it: no chance to leave the queue.
        let url = target.url().to_owned();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let locks = distlock::connect(&url).await.unwrap();
                let mutex = locks.mutex("stale").unwrap();
                let waiting = Box::pin(mutex.acquire());
                let _ = tokio::time::timeout(Duration::from_millis(200), waiting).await;
            });
            std::mem::forget(runtime);
        })
        .join()
        .unwrap();
        held.release().await.unwrap();
        let start = std::time::Instant::now();
        let guard = locks
            .mutex("stale")
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
            .await
            .expect("an abandoned ticket blocked the lock");
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        guard.release().await.unwrap();
    }
}
