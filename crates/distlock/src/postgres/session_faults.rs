//! Faults inside a statement that no proxy can cause on a healthy connection (an unlock that
//! fails while its connection lives on, as after a stray cancel; a check's answer held back
//! after the server gave it), made by a dialect that fails or holds chosen statements and
//! otherwise talks to the real server.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;

use super::PgAdvisory;
use crate::backend::{Acquired, Backend, Extended, Owner, Published, Released, Renewing, Woken};
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};
use crate::servers;
use crate::session::{Dialect, SessionBackend};

/// A dialect whose next `failing_unlocks` unlocks fail without reaching the server, whose
/// next `hanging_unlocks` unlocks never answer (nor reach it), and which, while `held_back`
/// names a key, holds every answer of a "what do you hold" check that asked about that key
/// (after the server answered it) until the gate is closed.
struct FailingUnlocks<D: Dialect> {
    inner: D,
    failing_unlocks: AtomicU32,
    hanging_unlocks: AtomicU32,
    held_back: StdMutex<Option<(D::Key, Arc<Semaphore>)>>,
}

impl<D: Dialect> FailingUnlocks<D> {
    /// Holds the answers of checks that ask about `key` until the returned gate is closed.
    fn hold_answers_about(&self, key: D::Key) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self
            .held_back
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((key, gate.clone()));
        gate
    }
}

#[async_trait]
impl<D: Dialect> Dialect for FailingUnlocks<D> {
    type Conn = D::Conn;
    type Key = D::Key;
    const SCHEME: &'static str = D::SCHEME;

    fn keeps(kind: &LockKind) -> bool {
        D::keeps(kind)
    }
    fn key(name: &LockName) -> Self::Key {
        D::key(name)
    }
    async fn open(&self) -> Result<(Self::Conn, u64)> {
        self.inner.open().await
    }
    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        name: &LockName,
    ) -> Result<Option<u64>> {
        self.inner.try_lock(conn, key, name).await
    }
    async fn lock_waiting(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        name: &LockName,
        max: Duration,
    ) -> Result<Option<u64>> {
        self.inner.lock_waiting(conn, key, name, max).await
    }
    async fn unlock(&self, conn: &mut Self::Conn, key: &Self::Key) -> Result<bool> {
        let failing = self
            .failing_unlocks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Error::backend(D::SCHEME, "unlock", "an injected failure"));
        }
        let hanging = self
            .hanging_unlocks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if hanging.is_ok() {
            std::future::pending::<()>().await;
        }
        self.inner.unlock(conn, key).await
    }
    async fn unlock_all(&self, conn: &mut Self::Conn) -> Result<()> {
        self.inner.unlock_all(conn).await
    }
    async fn after_wait(&self, conn: &mut Self::Conn) -> Result<()> {
        self.inner.after_wait(conn).await
    }
    async fn held(&self, conn: &mut Self::Conn, keys: &[Self::Key]) -> Result<HashSet<Self::Key>> {
        let gate = self
            .held_back
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .filter(|(key, _)| keys.contains(key));
        let answer = self.inner.held(conn, keys).await;
        if let Some((_, gate)) = gate {
            // Closed: the answer goes on.
            let _closed = gate.acquire().await;
        }
        answer
    }
    async fn holders(&self, key: &Self::Key) -> Result<Vec<u64>> {
        self.inner.holders(key).await
    }
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.inner.list_held(prefix, limit).await
    }
    async fn terminate(&self, session: u64) -> Result<bool> {
        self.inner.terminate(session).await
    }
    async fn cancel(&self, via: Option<&mut Self::Conn>, session: u64) -> Result<()> {
        self.inner.cancel(via, session).await
    }
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        self.inner.publish(key, record).await
    }
    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        self.inner.read_published(key).await
    }
    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        self.inner.withdraw(key, term).await
    }
}

fn unique(what: &str) -> LockName {
    LockName::new(format!("faulty/{what}/{}", uuid::Uuid::new_v4().simple())).unwrap()
}

/// A client on the fault-injecting dialect, and a plain rival client.
async fn clients() -> (SessionBackend<FailingUnlocks<PgAdvisory>>, Arc<dyn Backend>) {
    let url = servers::POSTGRES.url();
    let rival = super::connect(&url).await.expect("the rival client");
    let backend = SessionBackend::new(FailingUnlocks {
        inner: PgAdvisory::for_tests(&url).await,
        failing_unlocks: AtomicU32::new(0),
        hanging_unlocks: AtomicU32::new(0),
        held_back: StdMutex::new(None),
    });
    (backend, rival)
}

/// The rival gets `name` within 3 s (`what` says what should have freed it).
async fn rival_gets(rival: &Arc<dyn Backend>, name: &LockName, what: &str) {
    let rival_owner = Owner::new("rival", 1);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let tried = rival
            .try_acquire(name, &rival_owner, Duration::from_secs(30))
            .await
            .unwrap();
        if matches!(tried, Acquired::Granted { .. }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lock was still held 3 s after {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rival.release(name, &rival_owner).await.unwrap();
}

/// `owner` takes each of `names` on the client's one lock connection.
async fn hold_both(backend: &impl Backend, owner: &Owner, names: [&LockName; 2]) {
    for name in names {
        let acquired = backend
            .try_acquire(name, owner, Duration::from_secs(30))
            .await
            .unwrap();
        granted(acquired, name.as_str());
    }
}

fn granted(acquired: Acquired, what: &str) {
    assert!(
        matches!(acquired, Acquired::Granted { holds: 1, .. }),
        "{what}: {acquired:?}"
    );
}

/// Promise 4 (and 1, 2 for the other lock): a release whose unlock failed on a connection
/// that lives on, because another lock of the client is held on it, leaves no hold behind:
/// the unlock is tried again in the background, so another client gets the lock promptly,
/// while the other lock stays held and is not reported lost. Before, the lock stayed held on
/// the server, by nobody, for as long as the other lock was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_failed_unlock_is_retried_while_other_locks_keep_its_connection() {
    let (backend, rival) = clients().await;
    let mut status = backend.session().expect("session locks report sessions");
    status.borrow_and_update();
    let owner = Owner::new("failing-unlock", 1);
    let rival_owner = Owner::new("rival", 1);
    let lease = Duration::from_secs(30);
    let (released, kept) = (unique("released"), unique("kept"));
    hold_both(&backend, &owner, [&released, &kept]).await;

    backend.dialect().failing_unlocks.store(1, Ordering::SeqCst);
    let answer = backend.release(&released, &owner).await.unwrap();
    assert_eq!(
        answer,
        Released::NotHeld,
        "a failed unlock was called a release"
    );
    assert_eq!(
        backend.dialect().failing_unlocks.load(Ordering::SeqCst),
        0,
        "the injected failure was not used"
    );

    rival_gets(&rival, &released, "its unlock failed").await;
    assert_eq!(
        backend.holds(&kept, &owner).await.unwrap(),
        1,
        "the other lock was lost"
    );
    assert!(
        !status.has_changed().unwrap(),
        "a lost session was reported for a connection that lives on"
    );
    assert!(
        matches!(
            rival.try_acquire(&kept, &rival_owner, lease).await.unwrap(),
            Acquired::Held { .. }
        ),
        "the rival was granted a lock still held"
    );
}

/// Promise 4 with no other lock on the connection: a lease that ended and whose unlock failed
/// closes its connection (nothing else is held there), which frees the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_failed_unlock_of_an_ended_lease_closes_its_connection() {
    let (backend, rival) = clients().await;
    backend.dialect().failing_unlocks.store(1, Ordering::SeqCst);
    let owner = Owner::new("failing-unlock", 1);
    let name = unique("ended");
    let lease = Duration::from_millis(300);
    granted(
        backend.try_acquire(&name, &owner, lease).await.unwrap(),
        "the lock",
    );
    rival_gets(
        &rival,
        &name,
        "its lease of 300 ms ended and its unlock failed",
    )
    .await;
    assert_eq!(
        backend.dialect().failing_unlocks.load(Ordering::SeqCst),
        0,
        "the injected failure was not used"
    );
    assert_eq!(
        backend.release(&name, &owner).await.unwrap(),
        Released::NotHeld
    );
}

/// Promise 4 for a release cancelled while its unlock is in flight, on a connection another
/// lock keeps open: the unlock is handed to the background, so the lock does not stay held
/// by nobody for as long as the other lock is; the other lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_release_cancelled_during_its_unlock_still_unlocks() {
    let (backend, rival) = clients().await;
    let owner = Owner::new("cancelled-release", 1);
    let (released, kept) = (unique("cancelled"), unique("kept"));
    hold_both(&backend, &owner, [&released, &kept]).await;
    backend.dialect().hanging_unlocks.store(1, Ordering::SeqCst);
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        backend.release(&released, &owner),
    );
    assert!(cut.await.is_err(), "the hanging unlock answered");
    rival_gets(
        &rival,
        &released,
        "its release was cancelled during the unlock",
    )
    .await;
    assert_eq!(
        backend.holds(&kept, &owner).await.unwrap(),
        1,
        "the other lock was lost"
    );
    assert_eq!(
        backend.release(&kept, &owner).await.unwrap(),
        Released::Released { remaining_holds: 0 }
    );
}

/// `owner`'s first hold of `name`, taken by a try that must be granted: its token.
async fn first_grant(
    backend: &impl Backend,
    name: &LockName,
    owner: &Owner,
    lease: Duration,
) -> u64 {
    match backend.try_acquire(name, owner, lease).await.unwrap() {
        Acquired::Granted {
            fencing_token,
            holds: 1,
        } => fencing_token,
        refused => panic!("{name}: {refused:?}"),
    }
}

/// `owner` takes `name` as a waiter does: on a lock connection of its own (not the primary).
async fn wait_for(backend: &impl Backend, name: &LockName, owner: &Owner) -> u64 {
    let mut waiter = backend
        .subscribe(name, owner, Duration::from_secs(30))
        .await
        .unwrap();
    match waiter.wait(Duration::from_secs(5)).await {
        Woken::Granted { fencing_token, .. } => fencing_token,
        other => panic!("the free lock {name} was not granted to its waiter: {other:?}"),
    }
}

/// The rival is refused `name` for `how_long` (the lock is not freed behind its holder).
async fn rival_refused(rival: &Arc<dyn Backend>, name: &LockName, how_long: Duration) {
    let rival_owner = Owner::new("rival", 1);
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let tried = rival
            .try_acquire(name, &rival_owner, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(
            matches!(tried, Acquired::Held { .. }),
            "the rival was granted {name} while its holder held it: {tried:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Promises 1, 2 and 6: a renewal whose answer is on its way while its holder releases the
/// lock and takes it again on another connection leaves the new grant alone. Before, the
/// renewal found the entry's connection among none it had asked and forgot the new grant:
/// its connection closed, the server freed the lock, and a rival was granted it while the
/// live guard was told nothing until the next renewal. One thread: the renewal has taken
/// its snapshot of the grants before the release begins.
#[tokio::test(flavor = "current_thread")]
async fn promise6_a_renewal_in_flight_leaves_a_new_grant_of_the_name_alone() {
    let (backend, rival) = clients().await;
    let owner = Owner::new("re-taking", 1);
    let (other, name) = (unique("other"), unique("re-taken"));
    // `other` on the primary connection, `name` on a waiter's connection of its own.
    let other_token = first_grant(&backend, &other, &owner, Duration::from_secs(30)).await;
    let first = wait_for(&backend, &name, &owner).await;
    // The renewal asks the primary first (for `other`); its answer is held back there.
    let gate = backend
        .dialect()
        .hold_answers_about(PgAdvisory::key(&other));
    let renewing = backend.clone();
    let locks = vec![
        Renewing {
            lock: (other.clone(), owner.clone()),
            fencing_token: other_token,
        },
        Renewing {
            lock: (name.clone(), owner.clone()),
            fencing_token: first,
        },
    ];
    let (started, began) = oneshot::channel();
    let renewal = tokio::spawn(async move {
        let _ = started.send(());
        renewing.renew(&locks, Duration::from_secs(30)).await
    });
    began.await.unwrap();
    assert_eq!(
        backend.release(&name, &owner).await.unwrap(),
        Released::Released { remaining_holds: 0 }
    );
    let second = wait_for(&backend, &name, &owner).await;
    assert!(
        second > first,
        "the second grant's token {second} <= {first}"
    );
    assert!(!renewal.is_finished(), "the renewal was not held back");
    gate.close();
    let renewed = tokio::time::timeout(Duration::from_secs(10), renewal)
        .await
        .expect("the renewal answered once let go")
        .unwrap()
        .unwrap();
    // The first grant of `name` is gone (released); the renewal says so, and leaves the
    // second alone.
    assert_eq!(renewed, [true, false], "the renewal's answers");
    assert_eq!(
        backend.holds(&name, &owner).await.unwrap(),
        1,
        "the new grant was forgotten by the renewal of the one before"
    );
    rival_refused(&rival, &name, Duration::from_millis(600)).await;
    assert_eq!(
        backend.release(&name, &owner).await.unwrap(),
        Released::Released { remaining_holds: 0 }
    );
}

/// Promises 2 and 6: an extension whose check answered "held" while the lease ended (the lock
/// is being unlocked) is refused, not answered `Extended` for a lock that is going away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise6_an_extension_racing_the_lease_end_is_refused() {
    let (backend, _rival) = clients().await;
    let owner = Owner::new("extending", 1);
    let name = unique("ending");
    let token = first_grant(&backend, &name, &owner, Duration::from_millis(300)).await;
    let gate = backend.dialect().hold_answers_about(PgAdvisory::key(&name));
    let extending = backend.clone();
    let (owner2, name2) = (owner.clone(), name.clone());
    let extension = tokio::spawn(async move {
        extending
            .extend(&name2, &owner2, token, Duration::from_secs(30))
            .await
    });
    // The lease ends while the check's answer is held back: the reaper takes the grant.
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.records_grant(&name, &owner) {
        assert!(Instant::now() < deadline, "the lease of 300 ms did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.close();
    let extended = tokio::time::timeout(Duration::from_secs(10), extension)
        .await
        .expect("the extension answered once let go")
        .unwrap()
        .unwrap();
    assert_eq!(
        extended,
        Extended::NotHeld,
        "an extension of a lock whose lease ended"
    );
}
