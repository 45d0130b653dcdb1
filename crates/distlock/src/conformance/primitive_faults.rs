//! The primitives with a request that fails or whose reply is lost in the middle of an
//! acquisition (promise 4: the parts already taken are given back, nothing is left behind),
//! injected by [`FaultyBackend`](crate::fault::FaultyBackend) around the real backend.

use std::time::Duration;

use super::{Target, client, faulty_client, unique};
use crate::fault::{Fault, Method};
use crate::{AcquireOptions, ConnectOptions};

/// How soon another client must get what the faulty acquisition asked for: far below the 30 s
/// lease a left-over hold would keep.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Promise 4: a permit acquisition whose grant reply is lost fails, and leaves no permit: with
/// a rival holding one of two permits, a third client still gets the other promptly, and no
/// more.
pub async fn promise4_semaphore_lost_reply_leaves_no_permit(target: &Target) {
    let name = unique("semaphore_lost_reply");
    let rival = client(target).await;
    let held = rival
        .semaphore(name.as_str(), 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let (locks, faulty) = faulty_client(target, ConnectOptions::new()).await;
    faulty.set_times(Method::TryAcquire, Fault::LoseReply(Duration::ZERO), 1);
    let result = locks
        .semaphore(name.as_str(), 2)
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(5)))
        .await;
    assert_eq!(
        faulty.faulted(Method::TryAcquire),
        1,
        "the fault was never injected"
    );
    assert!(
        result.is_err(),
        "a permit was granted although its reply was lost"
    );
    let third = client(target).await;
    let semaphore = third.semaphore(name.as_str(), 2).unwrap();
    let permit = semaphore
        .acquire_with(AcquireOptions::new().wait(PROMPTLY))
        .await
        .expect("the lost reply's grant was left behind");
    assert!(
        semaphore.try_acquire().await.unwrap().is_none(),
        "a third permit of two"
    );
    permit.release().await.unwrap();
    held.release().await.unwrap();
}

/// Promise 4: a multi-lock with a fixed lease whose lease change on a part loses its reply
/// fails, and leaves no part held.
pub async fn promise4_multi_lock_lost_lease_reply_leaves_no_part(target: &Target) {
    let base = unique("multi_lost_reply");
    let names = [format!("{base}/a"), format!("{base}/b")];
    let (locks, faulty) = faulty_client(target, ConnectOptions::new()).await;
    faulty.set_times(Method::Extend, Fault::LoseReply(Duration::ZERO), 1);
    let result = locks
        .multi_lock(names.iter().cloned())
        .unwrap()
        .acquire_with(
            AcquireOptions::new()
                .wait(Duration::from_secs(5))
                .lease(Duration::from_secs(20)),
        )
        .await;
    assert_eq!(
        faulty.faulted(Method::Extend),
        1,
        "the fault was never injected"
    );
    assert!(
        result.is_err(),
        "granted although a part's lease reply was lost"
    );
    let other = client(target).await;
    let guard = other
        .multi_lock(names.iter().cloned())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(PROMPTLY))
        .await
        .expect("a part of the failed multi-lock was left held");
    guard.release().await.unwrap();
}

/// Promise 4: a write whose wait for a reader's slot fails (its subscription fails) gives
/// back the gate and every slot it took: once the reader leaves, another client writes
/// promptly. Where the backend keeps the lock itself (ZooKeeper, PostgreSQL advisory locks),
/// the write's lock is taken by its attempt, whose reply is lost instead: it must not stay.
pub async fn promise4_failed_write_leaves_nothing(target: &Target) {
    let name = unique("rwlock_failed_write");
    let reader = client(target).await;
    let read = reader.rwlock(name.as_str()).unwrap().read().await.unwrap();
    let (locks, faulty) = faulty_client(target, ConnectOptions::new()).await;
    let lock = locks.rwlock(name.as_str()).unwrap();
    let (method, fault) = if lock.is_native() {
        (Method::TryAcquire, Fault::LoseReply(Duration::ZERO))
    } else {
        (Method::Subscribe, Fault::Fail(Duration::ZERO))
    };
    faulty.set_times(method, fault, 1);
    let result = lock
        .write_with(AcquireOptions::new().wait(Duration::from_secs(5)))
        .await;
    assert_eq!(faulty.faulted(method), 1, "the fault was never injected");
    assert!(
        result.is_err(),
        "a write was granted although a request failed"
    );
    read.release().await.unwrap();
    writes_promptly(
        target,
        &name,
        "the failed write left the gate, a slot or its node held",
    )
    .await;
}

/// Asserts that a new client gets the write lock of `name` promptly (`what` says which
/// left-over would stop it).
async fn writes_promptly(target: &Target, name: &str, what: &str) {
    let other = client(target).await;
    let write = other
        .rwlock(name)
        .unwrap()
        .write_with(AcquireOptions::new().wait(PROMPTLY))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    write.release().await.unwrap();
}

/// Promise 4: a read whose first attempt's reply is lost (the gate's, or on ZooKeeper the
/// reader's node: it took effect) fails or reads, and leaves nothing: another client writes
/// promptly after it, while the faulty client stays connected.
pub async fn promise4_read_lost_reply_leaves_nothing(target: &Target) {
    let name = unique("rwlock_lost_read");
    let (locks, faulty) = faulty_client(target, ConnectOptions::new()).await;
    faulty.set_times(Method::TryAcquire, Fault::LoseReply(Duration::ZERO), 1);
    let result = locks
        .rwlock(name.as_str())
        .unwrap()
        .read_with(AcquireOptions::new().wait(PROMPTLY))
        .await;
    assert_eq!(
        faulty.faulted(Method::TryAcquire),
        1,
        "the fault was never injected"
    );
    if let Ok(read) = result {
        read.release().await.unwrap();
    }
    writes_promptly(
        target,
        &name,
        "the read whose reply was lost left a lock held",
    )
    .await;
    drop(locks);
}
