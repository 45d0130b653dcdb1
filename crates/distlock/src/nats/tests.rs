//! The NATS backend against the server `scripts/test` starts (`servers::NATS`): the
//! conformance suite (the mutex, every primitive, the election), the wire faults (lost
//! replies through the fault proxy), a killed holder process, and what a client that gets
//! the URL wrong is told. Servers of the tests' own: logins and TLS (`secured`), and a
//! 3-node cluster whose stream leader is killed (`cluster`).

mod cluster;
mod launch;
mod secured;

use std::io::BufRead;
use std::time::{Duration, Instant};

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

/// The environment variable that makes [`killed_holder_process_frees_its_lock_within_its_lease`]
/// the holder: the lock name to hold.
const HOLDER_NAME: &str = "DISTLOCK_NATS_TEST_HOLDER";
const HOLDER_LEASE: Duration = Duration::from_secs(3);

/// A holder in another process (this test binary, run again as the holder), killed with
/// SIGKILL while its lock is renewed: the lock frees when its lease runs out by the server's
/// clock, and the next grant has a larger token (promises 1 and 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_its_lock_within_its_lease() {
    let options = crate::ConnectOptions::new().lease(HOLDER_LEASE);
    if let Ok(name) = std::env::var(HOLDER_NAME) {
        // The holder: take the lock, say so, and keep renewing it until killed.
        let locks = crate::connect_with(&servers::NATS.url(), options).await.unwrap();
        let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
        println!("holding {}", guard.fencing_token());
        tokio::time::sleep(Duration::from_secs(60)).await;
        panic!("the holder was not killed");
    }
    let name = format!("killed/{}", uuid::Uuid::new_v4().simple());
    let mut holder = KillOnDrop(std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "nats::tests::killed_holder_process_frees_its_lock_within_its_lease",
            "--exact",
            "--nocapture",
        ])
        .env(HOLDER_NAME, &name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run the holder"));
    let stdout = holder.0.stdout.take().unwrap();
    let token = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
            .find_map(|line| line.strip_prefix("holding ").and_then(|t| t.parse::<u64>().ok()))
    });
    let token = tokio::time::timeout(Duration::from_secs(60), token)
        .await
        .expect("the holder did not take the lock")
        .unwrap()
        .expect("the holder ended without holding");
    let rival = crate::connect(&servers::NATS.url()).await.unwrap();
    let mutex = rival.mutex(name.as_str()).unwrap();
    // Renewed, the lock stays held past its lease.
    tokio::time::sleep(HOLDER_LEASE * 2).await;
    assert!(mutex.try_acquire().await.unwrap().is_none(), "the live holder's lock was free");
    holder.0.kill().unwrap();
    holder.0.wait().unwrap();
    let killed_at = Instant::now();
    let guard = mutex
        .acquire_with(crate::AcquireOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("the killed holder's lock did not free");
    let freed_after = killed_at.elapsed();
    assert!(guard.fencing_token() > token);
    // The last renewal came at most a third of a lease before the kill, so the lease ends
    // between two thirds of a lease and a lease after it; the waiter tries again at its end.
    assert!(
        freed_after > HOLDER_LEASE / 2,
        "freed {freed_after:?} after the kill: before the holder's lease could have ended"
    );
    assert!(
        freed_after < HOLDER_LEASE + Duration::from_secs(5),
        "freed {freed_after:?} after the kill"
    );
    guard.release().await.unwrap();
}

/// A child process that is killed (SIGKILL, by its PID) when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
