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
    let url = database();
    let holder = distlock::connect_with(
        &url,
        distlock::ConnectOptions::new().lease(Duration::from_millis(600)),
    )
    .await
    .unwrap();
    let name = format!("pg/killed/{}", uuid::Uuid::new_v4().simple());
    let guard = holder
        .mutex(name.as_str())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let rival = distlock::connect(&url).await.unwrap();
    assert!(
        rival
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );

    kill_the_session_holding(&url, &name).await;

    let granted = rival
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the lock of the killed session was not freed");
    assert!(granted.fencing_token() > guard.fencing_token());
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not fire after the session was killed");
    assert!(lost.is_lock_lost());
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_advisory_waiters_are_granted_by_the_server() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(advisory())).await;
}

/// Promise 2 (as far as a session lock allows: the server frees it the moment its session
/// ends): when the lock connection is killed, every lock it held fires `lost()` within a
/// second or two, fixed-lease and renewed alike, and another owner of the same client gets
/// the lock at once instead of waiting for the stale entry's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_killed_lock_connection_fires_lost_for_every_lease() {
    let url = database();
    let holder = distlock::connect(&url).await.unwrap();
    let id = uuid::Uuid::new_v4().simple();
    let (fixed_name, renewed_name) = (
        format!("pg/killed/{id}/fixed"),
        format!("pg/killed/{id}/renewed"),
    );
    let fixed = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().lease(Duration::from_secs(120)))
        .await
        .unwrap();
    let renewed = holder
        .mutex(renewed_name.as_str())
        .unwrap()
        .acquire()
        .await
        .unwrap();

    kill_the_session_holding(&url, &fixed_name).await;

    for (what, guard) in [("fixed-lease", &fixed), ("renewed", &renewed)] {
        let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("the {what} lock's lost() did not fire after its session was killed")
            });
        assert!(lost.is_lock_lost());
    }
    // Another owner of the same client is not held up by what the killed session held.
    let again = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(3)))
        .await
        .expect("the same client could not take the lock its killed session held");
    assert!(again.fencing_token() > fixed.fencing_token());
    again.release().await.unwrap();
}
