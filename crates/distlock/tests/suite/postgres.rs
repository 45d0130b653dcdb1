//! The PostgreSQL backend on the real server `scripts/test` makes sure of: the conformance
//! suite on advisory locks and on the table-record lock (from a URL and from a pool), and a
//! killed lock connection.

use distlock::conformance::{Target, servers};

fn database() -> String {
    servers::POSTGRES.url()
}

fn table() -> String {
    servers::with_query(&database(), "mode=table")
}

fn advisory() -> String {
    database()
}

distlock::conformance_suite!(postgres_table, Target::new(table()));
distlock::conformance_suite!(postgres_advisory, Target::new(advisory()));
distlock::wire_fault_suite!(postgres_table_wire, Target::new(table()));
distlock::wire_fault_suite!(postgres_advisory_wire, Target::new(advisory()));

/// A backend made from an application's own pool, opened through a factory as a backend
/// outside this crate would be.
fn from_pool(mode: distlock::postgres::Mode) -> Target {
    let url = database();
    Target::from_factory(format!("{url} ({mode:?}, from a pool)"), move || {
        let url = url.clone();
        async move {
            let pool = sqlx::PgPool::connect(&url)
                .await
                .expect("the application's pool");
            distlock::postgres::from_pool(pool, mode).await
        }
    })
}

distlock::conformance_suite!(
    postgres_advisory_from_pool,
    from_pool(distlock::postgres::Mode::Advisory)
);
distlock::conformance_suite!(
    postgres_table_from_pool,
    from_pool(distlock::postgres::Mode::Table)
);

use std::time::Duration;

/// Kills the session holding the advisory lock `name`, as an administrator would
/// (`pg_terminate_backend`); exactly one must hold it.
async fn kill_the_session_holding(url: &str, name: &str) {
    let admin = sqlx::PgPool::connect(url).await.unwrap();
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(distlock::postgres::advisory_key(name))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(killed, vec![(true,)], "exactly one session held the lock");
}

/// An advisory lock lives in its connection: when an administrator kills that session
/// (`pg_terminate_backend`), the server frees the lock at once, another client gets it with a
/// larger token, and the holder's guard reports the loss at its next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_lock_connection_frees_the_lock_and_fires_lost() {
    crate::killed_session::frees_the_lock_and_fires_lost(
        &database(),
        "pg/killed",
        |url, name| async move {
            kill_the_session_holding(&url, &name).await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_advisory_waiters_are_granted_by_the_server() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(advisory())).await;
}

/// Promise 2: every lock of a killed lock connection fires `lost()`, fixed-lease and renewed
/// alike (see [`crate::killed_session`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_killed_lock_connection_fires_lost_for_every_lease() {
    crate::killed_session::promise2_fires_lost_for_every_lease(
        &database(),
        "pg/killed",
        |url, name| async move {
            kill_the_session_holding(&url, &name).await;
        },
    )
    .await;
}

/// The sessions holding the advisory key of `name`, with their mode (`ShareLock` or
/// `ExclusiveLock`).
async fn advisory_holders(admin: &sqlx::PgPool, name: &str) -> Vec<(i32, String)> {
    sqlx::query_as(
        "SELECT pid, mode FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted
           AND ((classid::bigint << 32) | objid::bigint) = $1
         ORDER BY pid",
    )
    .bind(distlock::postgres::advisory_key(name))
    .fetch_all(admin)
    .await
    .unwrap()
}

/// Promise 1 for reader-writer locks on PostgreSQL's own shared advisory locks: readers of
/// one client hold the name's key in shared mode on sessions of their own (together), a writer
/// holds it in exclusive mode on one session; a plain connection taking the key in exclusive
/// mode excludes distlock's readers and one taking it in shared mode excludes its writer; and
/// a mutex and a reader-writer lock of one name in one client exclude each other (a session
/// never conflicts with itself, so they must not share one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_rwlocks_are_postgres_shared_advisory_locks() {
    use sqlx::Connection;
    let url = advisory();
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let locks = distlock::connect(&url).await.unwrap();
    let name = format!("pg-rwlock-{}", uuid::Uuid::new_v4().simple());
    let rwlock = locks.rwlock(name.as_str()).unwrap();
    assert!(
        rwlock.is_native(),
        "PostgreSQL advisory locks keep reader-writer locks"
    );

    let reads = [rwlock.read().await.unwrap(), rwlock.read().await.unwrap()];
    let holders = advisory_holders(&admin, &name).await;
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(
        holders.iter().all(|(_, mode)| mode == "ShareLock"),
        "{holders:?}"
    );
    assert!(reads[1].fencing_token() > reads[0].fencing_token());
    let mut plain = sqlx::PgConnection::connect(&url).await.unwrap();
    let key = distlock::postgres::advisory_key(&name);
    let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert!(!got, "an exclusive advisory lock beside distlock's readers");
    let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock_shared($1)")
        .bind(key)
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert!(
        got,
        "a shared advisory lock refused beside distlock's readers"
    );
    let [first, second] = reads;
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert!(
        rwlock.try_write().await.unwrap().is_none(),
        "distlock wrote beside a plain shared advisory lock"
    );
    let (_,): (bool,) = sqlx::query_as("SELECT pg_advisory_unlock_shared($1)")
        .bind(key)
        .fetch_one(&mut plain)
        .await
        .unwrap();

    let write = rwlock.write().await.unwrap();
    let holders = advisory_holders(&admin, &name).await;
    assert_eq!(holders.len(), 1, "a write holds one session: {holders:?}");
    assert_eq!(holders[0].1, "ExclusiveLock");
    let mutex = locks.mutex(name.as_str()).unwrap();
    assert!(
        mutex.try_acquire().await.unwrap().is_none(),
        "a mutex of the same name beside a write of the same client"
    );
    write.release().await.unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert!(
        rwlock.try_read().await.unwrap().is_none(),
        "a read beside a mutex of the same name of the same client"
    );
    assert!(
        rwlock.try_write().await.unwrap().is_none(),
        "a write beside a mutex of the same name of the same client"
    );
    guard.release().await.unwrap();
    let read = rwlock
        .try_read()
        .await
        .unwrap()
        .expect("a read once all is free");
    read.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !advisory_holders(&admin, &name).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a session still holds the key after every release");
}

/// Promise 4 for the connections a reader or writer takes: a waiter's connection whose wait
/// ran out goes back to the idle connections without its wait's `lock_timeout`, so a later
/// try on it waits for the token sequence like any other, instead of failing with a lock
/// timeout. Two tries at once take both idle connections (the waiter's and the writer's)
/// while another transaction holds the sequence for 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_connection_is_reused_without_its_lock_timeout() {
    use sqlx::Connection;
    let url = advisory();
    let locks = distlock::connect(&url).await.unwrap();
    let name = format!("pg-idle-{}", uuid::Uuid::new_v4().simple());
    let rwlock = locks.rwlock(name.as_str()).unwrap();
    let write = rwlock.write().await.unwrap();
    let waited = rwlock
        .read_with(distlock::AcquireOptions::new().wait(Duration::from_millis(300)))
        .await;
    assert!(waited.unwrap_err().is_timeout());
    write.release().await.unwrap();
    let mut plain = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut row = plain.begin().await.unwrap();
    // A no-op change that holds the sequence against `nextval` until the commit.
    sqlx::query("ALTER SEQUENCE distlock_token_seq CACHE 1")
        .execute(&mut *row)
        .await
        .unwrap();
    let tries = [0, 1].map(|_| {
        let rwlock = rwlock.clone();
        tokio::spawn(async move { rwlock.try_read().await })
    });
    // Longer than the wait's `lock_timeout` (at most 300 ms), had it stayed set.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    row.commit().await.unwrap();
    for try_read in tries {
        let read = tokio::time::timeout(Duration::from_secs(10), try_read)
            .await
            .expect("a try did not end")
            .unwrap()
            .expect("a try on a waiter's idle connection failed")
            .expect("a free read was refused");
        read.release().await.unwrap();
    }
}

/// Promise 1 across databases: advisory keys are per database, so a lock of one name held
/// in another database of the same server is another lock. This database's client neither
/// lists it, nor sees it held, nor frees it (force-unlock kills the holding sessions: it must
/// not kill another database's).
#[tokio::test]
async fn advisory_locks_of_another_database_are_other_locks() {
    let name = format!("other-db/{}", uuid::Uuid::new_v4().simple());
    let here = distlock::connect(&advisory()).await.unwrap();
    let other_url = database().replacen("/test", "/postgres", 1);
    assert_ne!(other_url, database(), "the test database is not named test");
    let there = distlock::connect(&other_url).await.unwrap();
    let held_there = there.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(there.is_locked(&name).await.unwrap());
    assert!(
        !here.is_locked(&name).await.unwrap(),
        "held in another database"
    );
    assert!(
        !here
            .list_held("other-db/", 1000)
            .await
            .unwrap()
            .contains(&name),
        "listed a lock of another database"
    );
    assert!(
        !here.force_unlock(&name).await.unwrap(),
        "force-unlock here reported a lock of another database as freed"
    );
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(2), held_there.lost())
            .await
            .is_err(),
        "force-unlock here ended a holder in another database"
    );
    assert!(there.is_locked(&name).await.unwrap());
    held_there.release().await.unwrap();
}

/// A process whose acquisitions take turns keeps one server connection (a fleet of N
/// processes needs about N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_client_keeps_one_connection() {
    distlock::conformance::session_client_keeps_one_connection(&Target::new(advisory())).await;
}

/// Promise 4: a waiter dropped before its statement was sent never sends it (current-thread
/// runtime: the drop comes before the waiter's task runs).
#[tokio::test(flavor = "current_thread")]
async fn promise4_an_advisory_waiter_dropped_before_its_statement_sends_none() {
    distlock::conformance::session_waiter_dropped_before_its_statement_sends_none(&Target::new(
        advisory(),
    ))
    .await;
}
