//! The conformance cases that make sense without `async`, run through `distlock::blocking` on
//! memory, SQLite and Redis: one test per case and backend, named
//! `blocking::<backend>::<case>`. Every wait is bounded (`WAIT`), and every case runs on a
//! thread of its own that fails the test when it has not finished within `CASE_LIMIT`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use distlock::backend::Backend;
use distlock::blocking::{self, Locks};
use distlock::conformance::Target;
use distlock::fault::{Fault, FaultyBackend, Method};
use distlock::{AcquireOptions, ConnectOptions};

/// The longest any one wait of a case may take.
const WAIT: Duration = Duration::from_secs(30);

/// The longest a whole case may take.
const CASE_LIMIT: Duration = Duration::from_secs(90);

/// Waits at most [`WAIT`].
fn bounded() -> AcquireOptions {
    AcquireOptions::new().wait(WAIT)
}

/// Runs `case` on a thread of its own; fails when it panics or has not finished within
/// [`CASE_LIMIT`] (a blocking call cannot be interrupted: a hung case is left behind).
fn within(case: &'static str, body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = thread::Builder::new()
        .name(case.into())
        .spawn(move || {
            body();
            let _ = done_tx.send(());
        })
        .expect("a thread for the case");
    match done_rx.recv_timeout(CASE_LIMIT) {
        Ok(()) => worker.join().expect("the case finished"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{case} did not finish within {CASE_LIMIT:?}")
        }
    }
}

/// Asks `done` every 10 ms until it says yes; fails when it has not within [`WAIT`].
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "not within {WAIT:?}: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// A lock name of its own for each run of a case.
fn name(case: &str) -> String {
    format!(
        "blocking/{case}/{}-{}",
        std::process::id(),
        fastrand::u64(..)
    )
}

fn url(target: &Target) -> &str {
    target.url().expect("the blocking cases connect by URL")
}

fn connect(target: &Target) -> Locks {
    blocking::connect(url(target)).unwrap_or_else(|e| panic!("connect {}: {e}", target.label()))
}

/// A client whose locks are renewed every third of `lease`.
fn connect_with_lease(target: &Target, lease: Duration) -> Locks {
    blocking::connect_with(url(target), ConnectOptions::new().lease(lease))
        .unwrap_or_else(|e| panic!("connect {}: {e}", target.label()))
}

/// A client over `target` inside a [`FaultyBackend`] that meets `method` with `fault`,
/// opened on the client's runtime.
fn connect_faulty(target: &Target, lease: Duration, method: Method, fault: Fault) -> Locks {
    let url = url(target).to_owned();
    blocking::Locks::with_backend(
        move || async move {
            let backend = FaultyBackend::new(distlock::open_backend(&url).await?);
            backend.set(method, fault);
            let backend: Arc<dyn Backend> = backend;
            Ok(backend)
        },
        ConnectOptions::new().lease(lease),
    )
    .unwrap_or_else(|e| panic!("connect {} through a fault wrapper: {e}", target.label()))
}

/// Promise 1: four threads on two clients, five acquisitions each through shared handles,
/// never hold the lock together, and every acquisition is granted in turn.
fn promise1_threads_exclude_each_other(target: &Target) {
    let clients = [connect(target), connect(target)];
    let name = name("exclusion");
    let handles = clients
        .iter()
        .map(|locks| locks.mutex(name.as_str()).expect("a lock name"))
        .collect::<Vec<_>>();
    let (inside, most, granted) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    thread::scope(|scope| {
        for thread in 0..4 {
            let mutex = &handles[thread % 2];
            let (inside, most, granted) = (&inside, &most, &granted);
            scope.spawn(move || {
                for _ in 0..5 {
                    let guard = mutex
                        .acquire_with(bounded())
                        .expect("granted within the wait");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().expect("released while held");
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two threads held the lock at once"
    );
    assert_eq!(granted.load(Ordering::SeqCst), 20);
}

/// Promise 1: `try_acquire` answers `None` while another owner holds the lock, through the
/// same client and through another; `Some` once it is released.
fn promise1_try_acquire_is_none_while_held(target: &Target) {
    let (a, b) = (connect(target), connect(target));
    let name = name("try");
    let held = a
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    assert!(
        a.mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none()
    );
    assert!(
        b.mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none()
    );
    held.release().unwrap();
    let again = b.mutex(name.as_str()).unwrap().try_acquire().unwrap();
    again.expect("free once released").release().unwrap();
}

/// A wait that runs out answers `Error::Timeout` after about its length, and leaves nothing
/// behind: once the holder releases, the lock is free and taken at once.
fn wait_runs_out_with_timeout(target: &Target) {
    let (a, b) = (connect(target), connect(target));
    let name = name("timeout");
    let held = a
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let err = b
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(AcquireOptions::new().wait(wait))
        .unwrap_err();
    let waited = start.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(waited >= wait && waited < WAIT, "gave up after {waited:?}");
    held.release().unwrap();
    assert!(
        !b.is_locked(&name).unwrap(),
        "the timed-out wait left a hold"
    );
    let next = b.mutex(name.as_str()).unwrap().try_acquire().unwrap();
    next.expect("free after the timed-out wait")
        .release()
        .unwrap();
}

/// Promise 3: fencing tokens strictly grow with every grant, across two clients taking turns.
fn promise3_fencing_tokens_strictly_increase(target: &Target) {
    let clients = [connect(target), connect(target)];
    let name = name("tokens");
    let mut last = 0;
    for round in 0..6 {
        let guard = clients[round % 2]
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(bounded())
            .unwrap();
        let token = guard.fencing_token();
        assert!(token > last, "token {token} after {last}");
        last = token;
        guard.release().unwrap();
    }
}

/// Promise 2: when another client force-unlocks the lock, the holder's `lost()` returns
/// `Error::LockLost` (noticed at its next renewal, a third of its 1 s lease), and
/// `is_lost()` and `loss_reason()` say so without blocking.
fn promise2_force_unlock_fires_lost(target: &Target) {
    let holder = connect_with_lease(target, Duration::from_secs(1));
    let operator = connect(target);
    let name = name("force");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    assert!(!guard.is_lost());
    assert!(guard.lost_timeout(Duration::from_millis(50)).is_none());
    assert!(operator.force_unlock(&name).unwrap(), "the lock was held");
    let lost = guard
        .lost_timeout(WAIT)
        .expect("lost() fired within the wait");
    assert!(lost.is_lock_lost(), "{lost}");
    assert!(guard.is_lost());
    assert!(guard.loss_reason().is_some());
    // Known now: the unbounded wait answers at once.
    assert!(guard.lost().is_lock_lost());
    let err = guard.release().unwrap_err();
    assert!(err.is_lock_lost(), "{err}");
}

/// Promise 2: a release after an operator freed the lock (before a renewal could notice)
/// reports `Error::LockLost`; one after another owner took it meanwhile reports
/// `Error::NotOwner` and leaves that owner's hold alone.
fn release_reports_a_lock_lost_meanwhile(target: &Target) {
    let (holder, operator) = (connect(target), connect(target));
    let name = name("release-lost");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    assert!(operator.force_unlock(&name).unwrap());
    let err = guard.release().unwrap_err();
    assert!(err.is_lock_lost(), "{err}");

    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    assert!(operator.force_unlock(&name).unwrap());
    let rival = operator
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    let err = guard.release().unwrap_err();
    assert!(err.is_not_owner() || err.is_lock_lost(), "{err}");
    assert!(
        rival.is_held().unwrap(),
        "the stale release freed the rival's hold"
    );
    rival.release().unwrap();
}

/// Promise 1 and the release on drop: a dropped guard frees the lock in the background; a
/// client waiting for it is granted it long before the holder's 120 s lease could end.
fn dropped_guard_frees_the_lock(target: &Target) {
    let holder = connect_with_lease(target, Duration::from_secs(120));
    let waiter = connect(target);
    let name = name("drop");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    drop(guard);
    let next = waiter.mutex(name.as_str()).unwrap().acquire_with(bounded());
    next.expect("granted after the drop, within the wait")
        .release()
        .unwrap();
}

/// The runtime lives as long as the last guard: a guard outlives the client it came from and
/// keeps its lock past its 1 s lease (renewed on the runtime), and its release works.
fn guard_outlives_its_client(target: &Target) {
    let holder = connect_with_lease(target, Duration::from_secs(1));
    let observer = connect(target);
    let name = name("outlives");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    drop(holder);
    thread::sleep(Duration::from_millis(1_500));
    assert!(!guard.is_lost());
    assert!(
        guard.is_held().unwrap(),
        "not renewed once its client was dropped"
    );
    assert!(observer.is_locked(&name).unwrap());
    guard.release().unwrap();
    assert!(!observer.is_locked(&name).unwrap());
}

/// Dropping the last guard of a client (its `Locks` already dropped) waits for the guard's
/// release, which the backend delays by 500 ms here, before the runtime stops: the lock is
/// free when the drop returns, and the drop does not hang.
fn last_guard_dropped_releases_before_its_runtime_ends(target: &Target) {
    let delay = Duration::from_millis(500);
    let lease = Duration::from_secs(120);
    let holder = connect_faulty(target, lease, Method::Release, Fault::Delay(delay));
    let observer = connect(target);
    let name = name("last-drop");
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    drop(holder);
    let start = Instant::now();
    drop(guard);
    let took = start.elapsed();
    // Less a margin for the release's start, on the runtime, before the drop's own clock.
    assert!(
        took >= delay - Duration::from_millis(100),
        "did not wait for the release: {took:?}"
    );
    assert!(
        took < blocking::SHUTDOWN_GRACE + Duration::from_secs(2),
        "took {took:?}"
    );
    assert!(
        !observer.is_locked(&name).unwrap(),
        "the last drop returned before its release was done"
    );
}

/// A request that panics on the client's runtime answers with `Error::Backend` instead of
/// panicking in the caller, gives the guard it used back, and leaves the client working.
fn a_panicking_request_is_a_typed_error(target: &Target) {
    let locks = connect_faulty(target, Duration::from_secs(30), Method::Holds, Fault::Panic);
    let name = name("panic");
    let guard = locks
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    let err = guard.is_held().unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert!(
        locks.is_locked(&name).unwrap(),
        "the client stopped working"
    );
    guard
        .release()
        .expect("the guard was given back by the panicked request");
    assert!(!locks.is_locked(&name).unwrap());
}

/// Blocking calls made inside an async runtime (a current-thread one, where Tokio's
/// `block_on` would panic) work and do not panic; the client and a guard dropped there do not
/// hang.
fn works_inside_an_async_runtime(target: &Target) {
    let url = url(target).to_owned();
    let name = name("inside-async");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime");
    runtime.block_on(async move {
        let locks = blocking::connect(&url).expect("connected inside a runtime");
        let guard = locks
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(bounded())
            .unwrap();
        assert!(locks.is_locked(&name).unwrap());
        assert!(guard.lost_timeout(Duration::from_millis(10)).is_none());
        guard.release().unwrap();
        let dropped = locks
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(bounded())
            .unwrap();
        drop(dropped);
        drop(locks);
    });
}

/// Promise 1 for the semaphore: a try beyond its permits is `None`, and four threads taking
/// permits in turn never hold more than it has.
fn promise1_semaphore_admits_at_most_its_permits(target: &Target) {
    let locks = connect(target);
    let semaphore = locks.semaphore(name("semaphore"), 2).unwrap();
    let a = semaphore.acquire_with(bounded()).unwrap();
    let b = semaphore.acquire_with(bounded()).unwrap();
    assert!(semaphore.try_acquire().unwrap().is_none());
    a.release().unwrap();
    b.release().unwrap();
    let (inside, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    thread::scope(|scope| {
        for _ in 0..4 {
            let (semaphore, inside, most) = (&semaphore, &inside, &most);
            scope.spawn(move || {
                for _ in 0..3 {
                    let permit = semaphore.acquire_with(bounded()).expect("a permit in time");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().expect("released while held");
                }
            });
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!((1..=2).contains(&most), "{most} permits held at once");
}

/// Promise 1 for the reader-writer lock: readers of two clients share it, a writer waits for
/// them and then excludes readers and writers, and its token is larger than the reads'.
fn promise1_rwlock_readers_share_writer_excludes(target: &Target) {
    let (a, b) = (connect(target), connect(target));
    let name = name("rwlock");
    let (mine, theirs) = (
        a.rwlock(name.as_str()).unwrap(),
        b.rwlock(name.as_str()).unwrap(),
    );
    let r1 = mine.read_with(bounded()).unwrap();
    let r2 = theirs.read_with(bounded()).unwrap();
    assert!(
        theirs.try_write().unwrap().is_none(),
        "a writer got in with readers"
    );
    let newest_read = r1.fencing_token().max(r2.fencing_token());
    r1.release().unwrap();
    r2.release().unwrap();
    let write = mine.write_with(bounded()).unwrap();
    assert!(
        theirs.try_read().unwrap().is_none(),
        "a reader got in with a writer"
    );
    assert!(theirs.try_write().unwrap().is_none(), "two writers at once");
    assert!(write.fencing_token() > newest_read);
    assert!(!write.is_lost());
    write.release().unwrap();
    theirs.read_with(bounded()).unwrap().release().unwrap();
}

/// Promise 1 for the multi-lock: all or nothing. With one name held elsewhere a try keeps
/// none of them (the part it took first is given back); once that name is free, both are
/// taken, each with its token, and both released.
fn promise1_multi_lock_is_all_or_nothing(target: &Target) {
    let (a, b) = (connect(target), connect(target));
    let (first, second) = (name("multi-a"), name("multi-b"));
    let multi = a.multi_lock([first.as_str(), second.as_str()]).unwrap();
    let blocker = b
        .mutex(second.as_str())
        .unwrap()
        .acquire_with(bounded())
        .unwrap();
    assert!(multi.try_acquire().unwrap().is_none());
    // The part taken before the refusal is given back in the background.
    eventually("the part taken first is given back", || {
        !b.is_locked(&first).unwrap()
    });
    blocker.release().unwrap();
    let guard = multi.acquire_with(bounded()).unwrap();
    assert!(b.is_locked(&first).unwrap() && b.is_locked(&second).unwrap());
    assert!(guard.fencing_token(&first).is_some() && guard.fencing_token(&second).is_some());
    assert_eq!(guard.fencing_tokens().len(), 2);
    guard.release().unwrap();
    assert!(!b.is_locked(&first).unwrap() && !b.is_locked(&second).unwrap());
}

/// Promise 1 for elections: one leader at a time, whose term is its token; a rival's
/// campaign times out while it leads, and wins with a larger term once it resigns.
fn promise1_election_has_one_leader_at_a_time(target: &Target) {
    let (a, b) = (connect(target), connect(target));
    let name = name("election");
    let (mine, theirs) = (
        a.election(name.as_str()).unwrap(),
        b.election(name.as_str()).unwrap(),
    );
    let leading = mine.campaign_with("a", bounded()).unwrap();
    let leader = theirs.leader().unwrap().expect("someone leads");
    assert_eq!((leader.value.as_str(), leader.term), ("a", leading.term()));
    let wait = AcquireOptions::new().wait(Duration::from_millis(200));
    let err = theirs.campaign_with("b", wait).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let term = leading.term();
    leading.resign().unwrap();
    let next = theirs.campaign_with("b", bounded()).unwrap();
    assert!(next.term() > term);
    assert_eq!(next.value(), "b");
    next.resign().unwrap();
}

/// Handles and guards can be shared between threads and sent to them.
#[test]
fn handles_and_guards_are_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<blocking::Locks>();
    shared::<blocking::Mutex>();
    shared::<blocking::Holder>();
    shared::<blocking::Guard>();
    shared::<blocking::Semaphore>();
    shared::<blocking::RwLock>();
    shared::<blocking::ReadGuard>();
    shared::<blocking::WriteGuard>();
    shared::<blocking::MultiLock>();
    shared::<blocking::MultiGuard>();
    shared::<blocking::Election>();
    shared::<blocking::Leadership>();
}

/// A connection that fails answers with the async API's typed error, and the runtime thread
/// it started ends without hanging the caller.
#[test]
fn connect_errors_are_typed() {
    within("connect_errors_are_typed", || {
        let err = blocking::connect("nonsense").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let err = blocking::connect("memory://")
            .and_then(|_| {
                blocking::connect_with("memory://", ConnectOptions::new().lease(Duration::ZERO))
            })
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        #[cfg(feature = "sqlite")]
        {
            let err = blocking::connect("sqlite:///no/such/dir/x.db").unwrap_err();
            assert!(err.is_invalid_input(), "{err}");
        }
    });
}

/// One test per case in a module named after the backend; `$target` is evaluated afresh in
/// every test.
macro_rules! blocking_suite {
    ($backend:ident, $target:expr) => {
        blocking_suite!(@cases $backend, $target;
            promise1_threads_exclude_each_other,
            promise1_try_acquire_is_none_while_held,
            wait_runs_out_with_timeout,
            promise3_fencing_tokens_strictly_increase,
            promise2_force_unlock_fires_lost,
            release_reports_a_lock_lost_meanwhile,
            dropped_guard_frees_the_lock,
            guard_outlives_its_client,
            last_guard_dropped_releases_before_its_runtime_ends,
            a_panicking_request_is_a_typed_error,
            works_inside_an_async_runtime,
            promise1_semaphore_admits_at_most_its_permits,
            promise1_rwlock_readers_share_writer_excludes,
            promise1_multi_lock_is_all_or_nothing,
            promise1_election_has_one_leader_at_a_time,
        );
    };
    (@cases $backend:ident, $target:expr; $($case:ident),* $(,)?) => {
        mod $backend {
            $(
                #[test]
                fn $case() {
                    let target = $target;
                    super::within(stringify!($case), move || super::$case(&target));
                }
            )*
        }
    };
}

blocking_suite!(memory, crate::conformance::memory());
#[cfg(feature = "sqlite")]
blocking_suite!(sqlite, crate::conformance::sqlite(""));
#[cfg(feature = "redis")]
blocking_suite!(
    redis,
    distlock::conformance::Target::new(crate::conformance::redis("redis"))
);
