//! The Redis reader-writer lock kept in the lock's hash: a waiting writer's mark and each
//! reader's own lease.

use std::time::{Duration, Instant};

use distlock::AcquireOptions;
use distlock::conformance::servers;

async fn client() -> distlock::Locks {
    distlock::connect(&servers::REDIS.url())
        .await
        .expect("connect to the test Redis")
}

fn unique(case: &str) -> String {
    format!("redis-rwlock/{case}/{:x}", fastrand::u64(..))
}

/// Promise 4: a writer cancelled while it waits behind a reader leaves nothing that outlives
/// its mark: new readers are turned away while it waits (writer preference), and granted again
/// within the mark's 2 s once it is gone, with the first reader still holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_cancelled_writer_holds_readers_off_for_its_mark_at_most() {
    let (locks, other) = (client().await, client().await);
    let name = unique("cancelled-writer");
    let lock = locks.rwlock(name.as_str()).unwrap();
    assert!(lock.is_native(), "the Redis rwlock is not native");
    let first = lock.read().await.unwrap();
    let writing = other.rwlock(name.as_str()).unwrap();
    let writer = tokio::spawn(async move {
        writing
            .write_with(AcquireOptions::new().wait(Duration::from_secs(60)))
            .await
    });
    // Waits until the writer's mark turns a new reader away.
    let start = Instant::now();
    loop {
        match lock.try_read().await.unwrap() {
            Some(read) => read.release().await.unwrap(),
            None => break,
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the waiting writer never turned a reader away"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    let cancelled = Instant::now();
    let read = lock
        .read_with(AcquireOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("a reader after the writer was cancelled");
    assert!(
        cancelled.elapsed() < Duration::from_secs(10),
        "a cancelled writer held readers off for {:?}",
        cancelled.elapsed()
    );
    assert!(
        first.loss_reason().is_none(),
        "the first reader lost its lock"
    );
    read.release().await.unwrap();
    first.release().await.unwrap();
    // Nothing is left: the writer's mark no longer holds a reader off.
    let again = lock
        .try_read()
        .await
        .unwrap()
        .expect("a reader of a free lock");
    again.release().await.unwrap();
}

/// Promise 1 and 2 with readers' own leases: a reader on a short fixed lease ends on its own
/// (its `lost()` fires) while a reader on the renewed lease keeps holding, and a writer is
/// refused until that reader leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_each_reader_keeps_its_own_lease() {
    let (locks, other) = (client().await, client().await);
    let name = unique("own-leases");
    let lock = locks.rwlock(name.as_str()).unwrap();
    let short = lock
        .read_with(AcquireOptions::new().lease(Duration::from_millis(300)))
        .await
        .unwrap();
    let long = lock.read().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), short.lost())
        .await
        .expect("the short reader's lease did not end");
    let writer = other.rwlock(name.as_str()).unwrap();
    for _ in 0..5 {
        assert!(
            writer.try_write().await.unwrap().is_none(),
            "a writer beside the renewed reader"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        long.loss_reason().is_none(),
        "the renewed reader lost its lock"
    );
    let long_token = long.fencing_token();
    long.release().await.unwrap();
    let write = writer
        .write_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(write.fencing_token() > long_token);
    write.release().await.unwrap();
}

/// Promise 4: a writer's try that finds readers leaves no mark: readers that come after it
/// are granted at once, however often it tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_writers_try_leaves_no_mark() {
    let (locks, other) = (client().await, client().await);
    let name = unique("try-write");
    let lock = locks.rwlock(name.as_str()).unwrap();
    let first = lock.read().await.unwrap();
    let writer = other.rwlock(name.as_str()).unwrap();
    for round in 0..20 {
        assert!(
            writer.try_write().await.unwrap().is_none(),
            "round {round}: a writer beside a reader"
        );
        let read = lock
            .try_read()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: a writer's try turned a reader away"));
        read.release().await.unwrap();
    }
    first.release().await.unwrap();
}
