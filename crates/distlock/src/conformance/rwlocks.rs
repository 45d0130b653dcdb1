//! The reader-writer lock built on a backend's mutex.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::primitives::{PROMPTLY, drop_after_polls};
use super::{SHORT_LEASE, Target, client, finish_tasks, short_lease_client, unique};
use crate::AcquireOptions;

/// Promise 1: readers and writers of two clients; a writer is never in with anyone, and
/// readers are in together at some point.
pub async fn promise1_rwlock_writers_exclude_readers_share(target: &Target) {
    let name = unique("rwlock_exclusion");
    let clients = [client(target).await, client(target).await];
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..6 {
        let lock = clients[task % 2].rwlock(name.as_str()).unwrap();
        let (readers, writers, most_readers) =
            (readers.clone(), writers.clone(), most_readers.clone());
        let wait = AcquireOptions::new().wait(Duration::from_secs(30));
        tasks.push(tokio::spawn(async move {
            for round in 0..6 {
                if task < 2 {
                    let guard = lock
                        .write_with(wait)
                        .await
                        .unwrap_or_else(|e| panic!("writer {task} round {round}: {e}"));
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer with readers");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release the write lock");
                } else {
                    let guard = lock
                        .read_with(wait)
                        .await
                        .unwrap_or_else(|e| panic!("reader {task} round {round}: {e}"));
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader with a writer");
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release the read lock");
                }
            }
        }));
    }
    finish_tasks(tasks, Duration::from_secs(120), "readers and writers").await;
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never held the lock together"
    );
}

/// A queued writer blocks readers that come after it (no writer starvation), and fencing
/// tokens order every grant: read, then write, then read.
pub async fn rwlock_queued_writer_blocks_new_readers(target: &Target) {
    let name = unique("rwlock_writer_first");
    let locks = client(target).await;
    let other = client(target).await;
    let lock = locks.rwlock(name.as_str()).unwrap();
    let first_read = lock.read().await.unwrap();
    let read_token = first_read.fencing_token();
    let writing = other.rwlock(name.as_str()).unwrap();
    let writer = tokio::spawn(async move {
        writing
            .write_with(AcquireOptions::new().wait(Duration::from_secs(20)))
            .await
    });
    // The writer is queued once it holds the gate and every reader slot but the reader's
    // (the reader's own gate, released in the background, may still show as held). In the
    // backend's own layout, once a new reader is refused: only a writer in line refuses one.
    tokio::time::timeout(Duration::from_secs(10), async {
        while lock.is_native() {
            match lock.try_read().await.unwrap() {
                Some(read) => read.release().await.unwrap(),
                None => return,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        loop {
            let mut held = 0;
            for slot in 0..crate::rwlock::READER_SLOTS {
                held += u32::from(
                    locks
                        .is_locked(&format!("{name}#reader-{slot}"))
                        .await
                        .unwrap(),
                );
            }
            if held == crate::rwlock::READER_SLOTS
                && locks.is_locked(&format!("{name}#gate")).await.unwrap()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the writer never reached the gate");
    assert!(
        lock.try_read().await.unwrap().is_none(),
        "a reader overtook a queued writer"
    );
    assert!(
        !writer.is_finished(),
        "a writer was granted beside a reader"
    );
    first_read.release().await.unwrap();
    let write = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer was not granted after the reader left")
        .unwrap()
        .expect("the writer's acquire failed");
    assert!(
        write.fencing_token() > read_token,
        "a write's token not above a read's"
    );
    // The writer holds every reader slot itself, not only the gate; in the backend's own
    // layout, another client's writer is refused.
    if lock.is_native() {
        let writer = other.rwlock(name.as_str()).unwrap();
        assert!(
            writer.try_write().await.unwrap().is_none(),
            "a second writer beside a write"
        );
    }
    for slot in (0..crate::rwlock::READER_SLOTS).filter(|_| !lock.is_native()) {
        let slot = format!("{name}#reader-{slot}");
        let mutex = other.mutex(slot.as_str()).unwrap();
        assert!(
            mutex.try_acquire().await.unwrap().is_none(),
            "{slot} free beside a write"
        );
    }
    assert!(
        lock.try_read().await.unwrap().is_none(),
        "a read beside a write"
    );
    let write_token = write.fencing_token();
    write.release().await.unwrap();
    let read = lock
        .read_with(AcquireOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        read.fencing_token() > write_token,
        "a read's token not above the write's"
    );
    read.release().await.unwrap();
}

/// Promise 2: a write lock one of whose slots is force-unlocked fires `lost()` (in the
/// backend's own layout: whose lock is force-unlocked).
pub async fn promise2_rwlock_write_lost_when_a_part_is_lost(target: &Target) {
    let name = unique("rwlock_lost");
    let locks = short_lease_client(target).await;
    let operator = client(target).await;
    let lock = locks.rwlock(name.as_str()).unwrap();
    let write = lock.write().await.unwrap();
    let part = if lock.is_native() {
        name.clone()
    } else {
        format!("{name}#reader-3")
    };
    assert!(operator.force_unlock(&part).await.unwrap());
    let lost = tokio::time::timeout(SHORT_LEASE * 5, write.lost())
        .await
        .expect("lost() did not fire after a slot was force-unlocked");
    assert!(lost.is_lock_lost(), "{lost}");
    assert!(write.loss_reason().is_some());
}

/// Promise 4: a waiting write dropped after 1 to 7 polls leaves neither the gate nor a slot.
pub async fn promise4_cancelled_write_leaves_nothing(target: &Target) {
    let name = unique("rwlock_cancel");
    let locks = client(target).await;
    let other = client(target).await;
    let lock = locks.rwlock(name.as_str()).unwrap();
    let mut dropped_while_pending = 0;
    for round in 1..=12usize {
        let read = other.rwlock(name.as_str()).unwrap().read().await.unwrap();
        let (granted, pending) = drop_after_polls(
            round,
            lock.write_with(AcquireOptions::new().wait(Duration::from_secs(10))),
            async {
                read.release().await.expect("release the reader");
            },
        )
        .await;
        dropped_while_pending += usize::from(pending);
        if let Some(write) = granted {
            write.release().await.unwrap();
        }
        let check = other.rwlock(name.as_str()).unwrap();
        let write = check
            .write_with(AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("round {round}: a cancelled write left a lock: {e}"));
        write.release().await.unwrap();
    }
    assert!(
        dropped_while_pending >= 3,
        "only {dropped_while_pending} writes were dropped while pending"
    );
}

/// How many readers [`promise1_rwlock_readers_hold_together_without_a_limit`] holds at once
/// where the backend keeps the lock in its own layout.
const MANY_READERS: usize = 200;

/// As [`MANY_READERS`] where each reader holds a server connection (PostgreSQL advisory
/// locks): within the test servers' connection limits beside the other tests.
const READERS_ON_CONNECTIONS: usize = 16;

/// Promise 1 with many readers: in the backend's own layout, 200 readers of four clients
/// hold at once (no reader limit; 16 where each takes a server connection), a writer is refused beside them and granted once they are gone, with
/// a token above every read's. Built on the mutex, the readers stop at
/// [`crate::RwLock::READER_SLOTS`].
pub async fn promise1_rwlock_readers_hold_together_without_a_limit(target: &Target) {
    let name = unique("rwlock_many_readers");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(target).await);
    }
    let lock = clients[0].rwlock(name.as_str()).unwrap();
    let readers = if lock.readers_take_a_connection() {
        READERS_ON_CONNECTIONS
    } else if lock.is_native() {
        MANY_READERS
    } else {
        crate::rwlock::READER_SLOTS as usize
    };
    let wait = AcquireOptions::new().wait(Duration::from_secs(60));
    let reads = (0..readers).map(|reader| {
        let lock = clients[reader % clients.len()]
            .rwlock(name.as_str())
            .unwrap();
        async move {
            lock.read_with(wait)
                .await
                .unwrap_or_else(|e| panic!("reader {reader}: {e}"))
        }
    });
    let reads = tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(reads),
    )
    .await
    .expect("the readers were not all granted together");
    let most = reads.iter().map(crate::ReadGuard::fencing_token).max();
    let writer = clients[1].rwlock(name.as_str()).unwrap();
    assert!(
        writer.try_write().await.unwrap().is_none(),
        "a writer beside {readers} readers"
    );
    if !lock.is_native() {
        assert!(
            lock.try_read().await.unwrap().is_none(),
            "a reader beyond the slots"
        );
    }
    for read in reads {
        assert!(
            read.slot().loss_reason().is_none(),
            "a reader lost its lock"
        );
        read.release().await.expect("release a reader");
    }
    let write = writer
        .write_with(AcquireOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("the writer after the readers left");
    assert!(
        Some(write.fencing_token()) > most,
        "a write's token not above every read's"
    );
    write.release().await.unwrap();
}
