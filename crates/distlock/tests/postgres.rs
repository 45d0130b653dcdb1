//! The PostgreSQL backend on the real server `scripts/test` makes sure of: the conformance
//! suite on advisory locks and on the table-record lock, and a killed lock connection.

use distlock::conformance::Target;

/// The database the tests use: `DISTLOCK_POSTGRES_URL`, or the local default. Fails, never
/// skips, when the server does not answer.
fn database() -> String {
    let url = std::env::var("DISTLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/test".into());
    let address = url
        .split_once('@')
        .map_or("", |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_owned();
    if std::net::TcpStream::connect(&address).is_err() {
        panic!("PostgreSQL is not reachable at {address} ({url}); start it with scripts/test");
    }
    url
}

fn table() -> Target {
    let url = database();
    let separator = if url.contains('?') { '&' } else { '?' };
    Target::new(format!("{url}{separator}mode=table"))
}

fn advisory() -> Target {
    Target::new(database())
}

distlock::conformance_suite!(postgres_table, table());
distlock::conformance_suite!(postgres_advisory, advisory());

use std::time::Duration;

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

    // Kill the holding session from outside, as an administrator would.
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let key = distlock::postgres::advisory_key(&name);
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(key)
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(killed, vec![(true,)], "exactly one session held the lock");

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
    distlock::conformance::fair_waiters_are_served_in_order(advisory().url()).await;
}
