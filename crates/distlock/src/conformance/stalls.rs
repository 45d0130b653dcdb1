//! Cases where the backend stalls in the middle of a request: a renewal that hangs, fails
//! slowly or panics, wrapped around the real backend by
//! [`FaultyBackend`](crate::fault::FaultyBackend). They apply to every backend.

use std::time::Duration;

use tokio::time::Instant;

use super::{Target, client, faulty_client, lost_at, newer_grant_still_holds, unique};
use crate::fault::{Fault, Method};
use crate::{AcquireOptions, ConnectOptions, Guard};

/// The renewed lease of the stalled client: renewals every 667 ms, and a drift allowance
/// (22 ms) that absorbs the scheduling delays of a loaded test machine.
const LEASE: Duration = Duration::from_secs(2);

/// How late after its client deadline `lost()` may fire: timer and scheduling slack.
const SLACK: Duration = Duration::from_millis(150);

/// A rival client of the real backend asks for `name` and reports when it was granted.
fn rival_grant(target: &Target, name: &str) -> tokio::task::JoinHandle<(Instant, Guard)> {
    let (target, name) = (target.clone(), name.to_owned());
    tokio::spawn(async move {
        let rival = client(&target).await;
        let guard = rival
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(AcquireOptions::new().wait(Duration::from_secs(20)))
            .await
            .unwrap_or_else(|e| panic!("the rival never got {name:?}: {e}"));
        (Instant::now(), guard)
    })
}

/// Holds a renewed and a fixed-lease lock, makes every renewal meet `fault`, and checks
/// that both guards fire `lost()` by their client deadlines and before a rival is granted.
async fn stalled_renewal_fires_lost_in_time(target: &Target, case: &str, fault: Fault) {
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(LEASE)).await;
    let renewed_name = unique(&format!("{case}/renewed"));
    let fixed_name = unique(&format!("{case}/fixed"));
    // Ends before the renewed lock's deadline: a keeper that waits on the renewal until the
    // renewed lock's deadline misses it.
    let fixed_lease = LEASE / 2;

    // The first renewal goes through, so the renewed lock's deadline is set by a renewal.
    let renewed = locks
        .mutex(renewed_name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire the renewed lock");
    let first_renewal = tokio::time::timeout(Duration::from_secs(5), async {
        while faulty.calls(Method::Renew) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(first_renewal.is_ok(), "{case}: the keeper never renewed");
    let fixed_start = Instant::now();
    let fixed = locks
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().lease(fixed_lease))
        .await
        .expect("acquire the fixed-lease lock");
    // Every renewal from here on stalls. The last request that may have set the renewed
    // lease started no earlier than now minus one interval.
    faulty.set(Method::Renew, fault);
    let stalled_at = Instant::now();
    let renewed_rival = rival_grant(target, &renewed_name);
    let fixed_rival = rival_grant(target, &fixed_name);

    // Watched together: each time is taken when that guard's lost() resolves.
    let (renewed_lost, fixed_lost) = tokio::join!(
        lost_at(&renewed, Duration::from_secs(10)),
        lost_at(&fixed, Duration::from_secs(10)),
    );
    let renewed_lost = renewed_lost
        .unwrap_or_else(|| panic!("{case}: the renewed lock never fired lost() ({fault:?})"));
    let fixed_lost = fixed_lost
        .unwrap_or_else(|| panic!("{case}: the fixed-lease lock never fired lost() ({fault:?})"));
    assert!(
        faulty.faulted(Method::Renew) >= 1,
        "{case}: no renewal met the fault, so nothing was tested"
    );
    // A renewed lease set by a renewal that started before the stall ends at most one lease
    // after the stall began.
    assert!(
        renewed_lost <= stalled_at + LEASE + SLACK,
        "{case}: the renewed lock's lost() fired {:?} after the stall, past its {LEASE:?} lease",
        renewed_lost - stalled_at
    );
    assert!(
        fixed_lost <= fixed_start + fixed_lease + SLACK,
        "{case}: the fixed-lease lock's lost() fired {:?} after its grant, past its {fixed_lease:?} lease",
        fixed_lost - fixed_start
    );
    for (what, lost, rival) in [
        ("renewed", renewed_lost, renewed_rival),
        ("fixed-lease", fixed_lost, fixed_rival),
    ] {
        let (granted, guard) = tokio::time::timeout(Duration::from_secs(30), rival)
            .await
            .unwrap_or_else(|_| panic!("{case}: the rival of the {what} lock hung"))
            .expect("rival task");
        assert!(
            lost < granted,
            "{case}: the {what} lock's lost() fired {:?} after a rival was granted",
            lost - granted
        );
        let _ = guard.release().await;
    }
    faulty.clear(Method::Renew);
}

/// Promise 2: every renewal hangs; the renewed and the fixed-lease guard fire `lost()` by
/// their client deadlines, before a rival is granted.
pub async fn promise2_hung_renewal_fires_lost_in_time(target: &Target) {
    stalled_renewal_fires_lost_in_time(target, "hung_renewal", Fault::Hang).await;
}

/// Promise 2: every renewal fails, slowly (after two leases); `lost()` is not held up by the
/// failing request.
pub async fn promise2_slow_failing_renewal_fires_lost_in_time(target: &Target) {
    stalled_renewal_fires_lost_in_time(target, "slow_failing_renewal", Fault::Fail(LEASE * 2))
        .await;
}

/// Promise 2: a renewal that answers after the client's deadline passed does not revive the
/// lock: `lost()` fired at the deadline and stays.
pub async fn promise2_late_renewal_reply_does_not_revive(target: &Target) {
    stalled_renewal_fires_lost_in_time(target, "late_renewal_reply", Fault::Delay(LEASE * 2)).await;
}

/// A backend whose renewal panics once does not kill the keeper: the next renewal keeps the
/// lock.
pub async fn renewal_panic_does_not_stop_the_keeper(target: &Target) {
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(LEASE)).await;
    let name = unique("renewal_panic");
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    faulty.set_times(Method::Renew, Fault::Panic, 1);
    // Three leases: several renewals after the one that panicked.
    let lost = tokio::time::timeout(LEASE * 3, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the lock was lost after one renewal panicked: {:?}",
        lost.ok()
    );
    assert_eq!(
        faulty.faulted(Method::Renew),
        1,
        "the renewal never panicked"
    );
    assert!(
        faulty.calls(Method::Renew) >= 3,
        "the keeper stopped renewing after a panic ({} renewals)",
        faulty.calls(Method::Renew)
    );
    assert!(guard.is_held().await.expect("is_held"), "the lock is gone");
    guard.release().await.expect("release");
}

/// Promise 2: a renewal still on its way when the caller sets a longer fixed lease runs on the
/// server after it and shortens the lease there again. The client counts the shorter lease,
/// so `lost()` fires before a rival is granted.
pub async fn promise2_set_lease_during_a_renewal_fires_lost_before_a_rival(target: &Target) {
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(LEASE)).await;
    let name = unique("set_lease_during_renewal");
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    // The next renewal waits half a second before it reaches the server.
    let before = faulty.calls(Method::Renew);
    faulty.set_times(Method::Renew, Fault::Delay(Duration::from_millis(500)), 1);
    let held_back = tokio::time::timeout(Duration::from_secs(5), async {
        while faulty.calls(Method::Renew) == before {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(held_back.is_ok(), "the keeper never renewed");
    // The long fixed lease reaches the server first; the renewal lands after it.
    guard
        .set_lease(Duration::from_secs(8))
        .await
        .expect("set_lease");
    lost_before_a_rival(
        target,
        &name,
        &guard,
        "the renewal ended the lease on the server",
    )
    .await;
}

/// Promise 2: a `set_lease` whose reply is lost may have shortened the lease on the server;
/// the client counts the shorter lease, so `lost()` fires before a rival is granted.
pub async fn promise2_set_lease_with_a_lost_reply_fires_lost_before_a_rival(target: &Target) {
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(LEASE)).await;
    let name = unique("set_lease_lost_reply");
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    // No renewal gets through from now on: the lease the server keeps is the one set below.
    faulty.set(Method::Renew, Fault::Hang);
    faulty.set_times(Method::Extend, Fault::LoseReply(Duration::ZERO), 1);
    let answer = guard.set_lease(Duration::from_millis(400)).await;
    assert_eq!(
        faulty.faulted(Method::Extend),
        1,
        "the extension was not faulted"
    );
    assert!(
        answer.is_err(),
        "a set_lease whose reply was lost reported success"
    );
    lost_before_a_rival(target, &name, &guard, "the server's lease was shortened").await;
}

/// A rival client asks for `name` while `guard` holds it: `guard`'s `lost()` must fire, and
/// before the rival is granted (`why` says why the lock must end).
async fn lost_before_a_rival(target: &Target, name: &str, guard: &Guard, why: &str) {
    let rival = rival_grant(target, name);
    let lost = lost_at(guard, Duration::from_secs(30)).await;
    let (granted_at, rival_guard) = rival.await.expect("the rival's task");
    let lost = lost.unwrap_or_else(|| panic!("lost() never fired, though {why}"));
    assert!(
        lost <= granted_at,
        "lost() fired {:?} after a rival was granted the lock",
        lost - granted_at
    );
    rival_guard.release().await.expect("release the rival");
}

/// Promises 1, 2 and 6: a renewal that reaches the server late (held back 300 ms, within the
/// keeper's patience for it, the rest of the 600 ms lease), after
/// its owner released that grant and took the name again with a fixed 5 s lease, leaves the
/// new grant's lease alone: the renewal is about the earlier grant (its fencing token), not
/// whatever the owner holds now. Before, it set the new grant's lease to the renewed 600 ms,
/// and a rival was granted the lock while the new guard held it, not lost.
pub async fn promise6_a_late_renewal_leaves_a_newer_grant_alone(target: &Target) {
    let lease = Duration::from_millis(600);
    let (locks, faulty) = faulty_client(target, ConnectOptions::new().lease(lease)).await;
    let name = unique("late_renewal_newer_grant");
    let me = locks.holder();
    let mutex = me.mutex(name.as_str()).unwrap();
    let first = mutex.acquire().await.expect("the first grant");
    let held_back = Duration::from_millis(300);
    faulty.set_times(Method::Renew, Fault::Delay(held_back), 1);
    let start = Instant::now();
    while faulty.faulted(Method::Renew) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no renewal within 5 s of a 600 ms lease"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let renewal_sent_at = Instant::now() + held_back;
    first.release().await.expect("release the first grant");
    let second = mutex
        .acquire_with(
            AcquireOptions::new()
                .lease(Duration::from_secs(5))
                .wait(Duration::from_secs(2)),
        )
        .await
        .expect("the second grant");
    assert!(
        Instant::now() < renewal_sent_at,
        "the second grant came after the held-back renewal was sent: the case tested nothing"
    );
    // Past the held-back renewal and a lease of 600 ms after it, with room for a loaded
    // machine: the rival must still be refused, and the guard must still hold.
    tokio::time::sleep_until(renewal_sent_at + lease + Duration::from_millis(600)).await;
    newer_grant_still_holds(target, &name, second).await;
}
