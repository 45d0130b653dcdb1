//! The NATS backend against the server `scripts/test` starts (`servers::NATS`): the
//! conformance suite (the mutex, every primitive, the election), the wire faults (lost
//! replies through the fault proxy), and what a client that gets the URL wrong is told.

use std::time::Duration;

use crate::conformance::{Target, servers};

/// The test server's bucket; every case names its locks uniquely.
fn nats() -> Target {
    Target::new(servers::NATS.url())
}

crate::conformance_suite!(nats, nats());
crate::wire_fault_suite!(nats_wire, nats());

#[tokio::test]
async fn a_server_that_does_not_answer_is_a_backend_error() {
    let err = crate::connect("nats://127.0.0.1:9/?connect_timeout=2s")
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
}

/// Promise 3: tokens grow across grants whichever way the lock was freed (released, its
/// lease run out, force-unlocked), since each grant is a later write of the bucket's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise3_tokens_grow_over_releases_expiries_and_force_unlocks() {
    let locks = crate::connect(&servers::NATS.url()).await.unwrap();
    let name = format!("tokens/{}", uuid::Uuid::new_v4().simple());
    let mutex = locks.mutex(&name).unwrap();
    let mut last = 0;
    for round in 0..3 {
        let guard = mutex.acquire().await.unwrap();
        assert!(guard.fencing_token() > last, "round {round}");
        last = guard.fencing_token();
        guard.release().await.unwrap();
        let guard = mutex
            .acquire_with(crate::AcquireOptions::new().lease(Duration::from_millis(200)))
            .await
            .unwrap();
        assert!(guard.fencing_token() > last, "round {round}, after a release");
        last = guard.fencing_token();
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("the fixed lease ends");
        drop(guard);
        let guard = mutex.acquire().await.unwrap();
        assert!(guard.fencing_token() > last, "round {round}, after an expiry");
        last = guard.fencing_token();
        assert!(locks.force_unlock(&name).await.unwrap());
        drop(guard);
    }
}
