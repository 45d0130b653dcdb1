//! The cases every lock must pass before any fault: exclusion, waiting, leases and renewal,
//! reentrancy, ownership, fencing, loss, queries, names and inputs, cancellation, fairness.

use super::leases::assert_lost_by_the_lease_end;
use super::*;
use crate::LossReason;

/// 16 tasks on two clients each add 1 to a counter 10 times with a non-atomic
/// read-sleep-write under the lock: no update may be lost and no two holders may overlap.
pub async fn mutual_exclusion(target: &Target) {
    let name = unique("mutual_exclusion");
    let clients = [client(target).await, client(target).await];
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..16 {
        let mutex = clients[task % 2].mutex(name.as_str()).unwrap();
        let counter = counter.clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = mutex.acquire().await.expect("acquire");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                let read = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(300)).await;
                counter.store(read + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task panicked");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 160, "lost updates");
}

/// `try_acquire` on a held lock returns `None` without waiting for the lease.
pub async fn try_acquire_returns_at_once(target: &Target) {
    let name = unique("try_acquire");
    let locks = client(target).await;
    let held = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let start = Instant::now();
    let other = locks
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    assert!(other.is_none(), "a second holder got the lock");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "try_acquire waited {:?}",
        start.elapsed()
    );
    held.release().await.unwrap();
    let free = locks
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    assert!(free.is_some(), "try_acquire failed on a free lock");
}

/// A bounded wait on a held lock ends with a timeout error near the requested time.
pub async fn wait_times_out(target: &Target) {
    let name = unique("wait_times_out");
    let locks = client(target).await;
    let _held = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let err = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(wait))
        .await
        .expect_err("acquired a held lock");
    let waited = start.elapsed();
    assert!(err.is_timeout(), "expected a timeout, got {err}");
    assert!(waited >= wait, "gave up early, after {waited:?}");
    assert!(
        waited < wait + Duration::from_secs(2),
        "gave up late, after {waited:?}"
    );
}

/// A fixed lease frees the lock when it ends, though the guard still lives.
pub async fn fixed_lease_expires(target: &Target) {
    let name = unique("fixed_lease");
    let locks = client(target).await;
    let lease = Duration::from_millis(300);
    let start = Instant::now();
    let first = hold_for(&locks, name.as_str(), lease).await;
    let second = acquire_within(&locks, name.as_str(), Duration::from_secs(10))
        .await
        .expect("the lease did not free the lock");
    assert!(
        start.elapsed() >= lease - Duration::from_millis(50),
        "granted before the lease ended"
    );
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.is_held().await.unwrap());
    drop(first);
    assert!(
        second.is_held().await.unwrap(),
        "the expired guard's drop freed the new holder"
    );
}

/// With a 300 ms renewed lease, a holder keeps the lock across several leases.
pub async fn renewal_keeps_holder_alive(target: &Target) {
    let name = unique("renewal");
    let locks = short_lease_client(target).await;
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    tokio::time::sleep(SHORT_LEASE * 4).await;
    if guard.is_lost() {
        panic!("lost while renewing: {:?}", guard.loss_reason());
    }
    assert!(guard.is_held().await.unwrap(), "not held after four leases");
    let other = client(target).await;
    assert!(
        other
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.expect("release after renewal");
    assert!(
        other
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

/// A holder re-enters; the lock is free after the last release only; a plain handle shared
/// by tasks does not re-enter.
pub async fn reentrant_holds_count(target: &Target) {
    let name = unique("reentrant");
    let locks = client(target).await;
    let holder = locks.holder();
    let rival = locks.mutex(name.as_str()).unwrap();
    let outer = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let inner = holder
        .mutex(name.as_str())
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("re-entry refused");
    let third = outer.reenter().await.expect("reenter refused");
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert_eq!(outer.fencing_token(), third.fencing_token());
    assert!(rival.try_acquire().await.unwrap().is_none());
    outer.release().await.unwrap();
    third.release().await.unwrap();
    assert!(
        rival.try_acquire().await.unwrap().is_none(),
        "freed with a hold left"
    );
    assert!(inner.is_held().await.unwrap());
    inner.release().await.unwrap();
    let guard = rival.try_acquire().await.unwrap();
    let guard = guard.expect("not freed after the last hold");
    // Tasks sharing one plain handle are distinct owners and exclude each other.
    assert!(
        rival.try_acquire().await.unwrap().is_none(),
        "a shared handle re-entered"
    );
    guard.release().await.unwrap();
}

/// A guard whose lease ran out cannot release or extend the next holder's lock.
pub async fn non_owner_cannot_release_or_extend(target: &Target) {
    let name = unique("non_owner");
    let locks = client(target).await;
    let stale = hold_for(&locks, name.as_str(), Duration::from_millis(200)).await;
    let holder = acquire_within(&locks, name.as_str(), Duration::from_secs(10))
        .await
        .unwrap();
    let err = stale
        .extend(Duration::from_secs(5))
        .await
        .expect_err("stale extend");
    assert!(err.is_not_owner(), "extend: expected not-owner, got {err}");
    let err = stale.release().await.expect_err("stale release");
    assert!(err.is_not_owner(), "release: expected not-owner, got {err}");
    assert!(
        holder.is_held().await.unwrap(),
        "the stale guard changed the new holder's lock"
    );
    holder.release().await.unwrap();
}

/// Tokens grow with every grant: across holders, clients, expiry and force-unlock.
pub async fn fencing_tokens_strictly_increase(target: &Target) {
    let name = unique("fencing");
    let (a, b) = (client(target).await, client(target).await);
    let mut last = 0;
    let mut check = |token: u64, when: &str| {
        assert!(token > last, "{when}: token {token} not above {last}");
        last = token;
    };
    let g = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    check(g.fencing_token(), "first grant");
    g.release().await.unwrap();
    let g = b.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    check(g.fencing_token(), "grant to another client");
    g.release().await.unwrap();
    let g = hold_for(&a, name.as_str(), Duration::from_millis(100)).await;
    check(g.fencing_token(), "fixed-lease grant");
    let lost = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() did not fire after the 100 ms lease");
    assert!(lost.is_lock_lost(), "{lost}");
    let g2 = b.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    check(g2.fencing_token(), "grant after expiry");
    assert!(a.force_unlock(&name).await.unwrap());
    let g3 = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    check(g3.fencing_token(), "grant after force-unlock");
    g3.release().await.unwrap();
}

/// `lost()` resolves when a fixed lease ends.
pub async fn lost_fires_on_expiry(target: &Target) {
    let name = unique("lost_expiry");
    let locks = client(target).await;
    let guard = hold_for(&locks, name.as_str(), Duration::from_millis(500)).await;
    assert!(!guard.is_lost());
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() did not fire after the lease");
    assert_lost_by_the_lease_end(&lost);
    assert_eq!(guard.loss_reason(), Some(LossReason::LeaseRanOut));
    let err = guard.release().await.expect_err("released a lost lock");
    assert!(err.is_lock_lost(), "expected lock-lost, got {err}");
}

/// `lost()` resolves when an operator force-unlocks a renewed lock (at the next renewal).
pub async fn lost_fires_on_force_unlock(target: &Target) {
    let name = unique("lost_force");
    let locks = unlock_lease_client(target).await;
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let operator = client(target).await;
    assert!(operator.force_unlock(&name).await.unwrap());
    let lost = tokio::time::timeout(UNLOCK_LEASE * 3, guard.lost())
        .await
        .expect("lost() did not fire after force-unlock");
    assert!(
        matches!(
            lost,
            crate::Error::LockLost {
                reason: LossReason::NotHeld | LossReason::SessionLost,
                ..
            }
        ),
        "expected the server's answer or the session's end as the reason, got {lost}"
    );
    assert!(!guard.is_held().await.unwrap());
}

/// `is_locked` and `is_held` follow acquire and release.
pub async fn queries_report_state(target: &Target) {
    let name = unique("queries");
    let locks = client(target).await;
    assert!(!locks.is_locked(&name).await.unwrap());
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(locks.is_locked(&name).await.unwrap());
    assert!(guard.is_held().await.unwrap());
    guard.release().await.unwrap();
    assert!(!locks.is_locked(&name).await.unwrap());
    assert!(
        !locks.force_unlock(&name).await.unwrap(),
        "force-unlocked a free lock"
    );
}

/// Empty names are refused; long, unicode and punctuated names work and stay distinct.
pub async fn odd_names(target: &Target) {
    let locks = client(target).await;
    let err = locks.mutex("").expect_err("empty name accepted");
    assert!(err.is_invalid_input());
    let err = locks
        .mutex("x".repeat(MAX_NAME_BYTES + 1))
        .expect_err("long name accepted");
    assert!(err.is_invalid_input());
    let base = unique("odd");
    let long = format!("{base}{}", "x".repeat(MAX_NAME_BYTES - base.len()));
    let names = [
        long,
        format!("{base}/锁/ä/🔒"),
        format!("{base}/a/b"),
        format!("{base}%2Fa%2Fb"),
        format!("{base}{{x}}"),
        format!("{base}:a:b"),
        format!("{base} with space"),
        format!("{base}'; DROP TABLE distlock_locks; --"),
    ];
    let mut guards = Vec::new();
    for name in &names {
        let guard = locks
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"))
            .unwrap_or_else(|| panic!("{name:?}: held by a different name's lock"));
        assert!(locks.is_locked(name).await.unwrap());
        guards.push(guard);
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    for name in &names {
        assert!(
            !locks.is_locked(name).await.unwrap(),
            "{name:?} still locked"
        );
    }
}

/// Zero and absurd durations are refused with a typed error and change nothing.
pub async fn bad_durations_are_rejected(target: &Target) {
    let name = unique("bad_durations");
    let locks = client(target).await;
    let mutex = locks.mutex(name.as_str()).unwrap();
    for lease in [Duration::ZERO, Duration::from_secs(365 * 24 * 3600)] {
        let err = mutex
            .acquire_with(AcquireOptions::new().lease(lease))
            .await
            .expect_err("accepted a bad lease");
        assert!(err.is_invalid_input(), "lease {lease:?}: {err}");
    }
    let err = mutex
        .acquire_with(AcquireOptions::new().wait(Duration::from_secs(400 * 24 * 3600)))
        .await
        .expect_err("accepted an absurd wait");
    assert!(err.is_invalid_input());
    assert!(
        !locks.is_locked(&name).await.unwrap(),
        "a refused acquire wrote a lock"
    );
    let guard = mutex.acquire().await.unwrap();
    let err = guard
        .extend(Duration::ZERO)
        .await
        .expect_err("zero extension");
    assert!(err.is_invalid_input());
    guard.release().await.unwrap();
}

/// One client holding 2,500 renewed locks keeps them all alive across three leases with a
/// handful of renewal requests (up to 1000 locks each), not one request per lock. The lease
/// is 3 s: a round of 2,500 renewals must land within it on a loaded machine too.
pub async fn renewal_is_batched(target: &Target) {
    let base = unique("batched");
    let lease = Duration::from_secs(3);
    let locks = target.client_with(ConnectOptions::new().lease(lease)).await;
    let mut guards = Vec::new();
    let count = target.held_at_most.unwrap_or(2500).min(2500);
    for i in 0..count {
        let mutex = locks.mutex(format!("{base}/{i}")).unwrap();
        guards.push(mutex.acquire().await.unwrap());
    }
    let before = locks.renewal_requests();
    tokio::time::sleep(lease * 3).await;
    let requests = locks.renewal_requests() - before;
    // Three leases at one round per third of a lease: about 9 rounds of 3 requests.
    assert!(
        requests >= 3,
        "only {requests} renewal requests: the locks were not renewed"
    );
    assert!(
        requests <= 3 * 12,
        "{requests} renewal requests for {count} locks: not batched"
    );
    for guard in &guards {
        assert!(!guard.is_lost(), "{} lost while renewing", guard.name());
    }
    let other = client(target).await;
    let last = other.mutex(format!("{base}/{}", count - 1)).unwrap();
    // A server slowed by a loaded machine may time a request out: that says nothing of the
    // lock, so the question is asked again (at most three times).
    let mut tries = 0;
    let rival = loop {
        tries += 1;
        match last.try_acquire().await {
            Ok(rival) => break rival,
            Err(error) if tries < 3 && error.is_backend() => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("a rival's try failed {tries} times: {error}"),
        }
    };
    assert!(rival.is_none(), "a renewed lock was free");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// For fair backends (not part of [`conformance_suite!`](crate::conformance_suite)): waiters
/// are served in arrival order, and a releaser cannot take the lock back ahead of them.
pub async fn fair_waiters_are_served_in_order(target: &Target) {
    let name = unique("fifo");
    let holder_client = client(target).await;
    let holder = holder_client.mutex(name.as_str()).unwrap();
    let held = holder.acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for id in 0..4 {
        // A client per waiter, as if each were another process.
        let locks = client(target).await;
        let (order, name) = (order.clone(), name.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locks.mutex(name).unwrap().acquire().await.unwrap();
            order.lock().unwrap().push(id);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        // Let this waiter queue before the next one arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await.unwrap();
    assert!(
        holder.try_acquire().await.unwrap().is_none(),
        "the releaser jumped the queue"
    );
    for waiter in waiters {
        waiter.await.expect("waiter panicked");
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3],
        "served out of order"
    );
}

/// Dropping a guard releases the lock in the background: another owner gets it long before
/// the 30 s lease would have freed it.
pub async fn dropped_guard_releases_in_background(target: &Target) {
    let name = unique("drop");
    let locks = client(target).await;
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    drop(guard);
    let start = Instant::now();
    let other = client(target).await;
    let guard = acquire_within(&other, name.as_str(), Duration::from_secs(5))
        .await
        .expect("a dropped guard kept the lock");
    assert!(start.elapsed() < Duration::from_secs(5));
    guard.release().await.unwrap();
}

/// `Locks::inspect` tells held from free, and every detail a backend gives is right: the
/// holder, its hold count, the grant's fencing token, a lease left no longer than the lease.
pub async fn inspect_reports_what_it_knows(target: &Target) {
    let name = unique("inspect");
    let locks = client(target).await;
    let free = locks.inspect(&name).await.expect("inspect a free lock");
    assert!(!free.locked, "a free lock inspected as held: {free:?}");
    assert_eq!(free.holder, None, "a free lock has a holder: {free:?}");
    let me = locks.holder();
    let guard = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let again = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let held = locks.inspect(&name).await.expect("inspect a held lock");
    assert!(held.locked, "a held lock inspected as free: {held:?}");
    if let Some(holder) = &held.holder {
        assert_eq!(holder, me.owner().as_str(), "{held:?}");
    }
    if let Some(holds) = held.holds {
        assert_eq!(holds, 2, "two guards of one holder: {held:?}");
    }
    if let Some(token) = held.fencing_token {
        assert_eq!(token, guard.fencing_token(), "{held:?}");
    }
    if let Some(left) = held.remaining_lease {
        assert!(
            left <= locks.lease(),
            "more lease left than granted: {held:?}"
        );
    }
    again.release().await.unwrap();
    guard.release().await.unwrap();
    let after = locks.inspect(&name).await.expect("inspect after release");
    assert!(
        !after.locked,
        "a released lock inspected as held: {after:?}"
    );
}

/// `list_held` names the locks held under a prefix, once each, in byte order, bounded by its
/// limit; a lock released is no longer listed; names outside the prefix are not listed.
pub async fn list_names_the_locks_held(target: &Target) {
    let prefix = format!("{}/", unique("list"));
    let locks = client(target).await;
    let backend = target.open().await.expect("open the backend");
    let a = hold(&locks, &format!("{prefix}a")).await;
    let b = hold(&locks, &format!("{prefix}b")).await;
    let outside = hold(&locks, &format!("{}x", prefix.trim_end_matches('/'))).await;
    let read = locks
        .rwlock(format!("{prefix}c"))
        .unwrap()
        .read()
        .await
        .expect("read lock");
    let listed = backend.list_held(&prefix, 100).await.expect("list_held");
    assert!(
        listed.starts_with(&[format!("{prefix}a"), format!("{prefix}b")]),
        "the two mutexes first, in byte order: {listed:?}"
    );
    assert!(
        listed[2..]
            .iter()
            .all(|name| name.starts_with(&format!("{prefix}c")))
            && listed.len() > 2,
        "the read lock's name (or its parts) after them: {listed:?}"
    );
    let mut once = listed.clone();
    once.dedup();
    assert_eq!(once, listed, "a name listed twice");
    let first = backend.list_held(&prefix, 1).await.expect("list_held");
    assert_eq!(first, [format!("{prefix}a")], "limit 1");
    a.release().await.expect("release");
    let start = tokio::time::Instant::now();
    loop {
        let listed = backend.list_held(&prefix, 100).await.expect("list_held");
        if !listed.contains(&format!("{prefix}a")) {
            assert!(listed.contains(&format!("{prefix}b")), "{listed:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a released lock is still listed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    read.release().await.expect("release the read lock");
    b.release().await.expect("release");
    outside.release().await.expect("release");
}
