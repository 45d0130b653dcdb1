//! The MySQL/MariaDB backend on the real server `scripts/test` makes sure of: the conformance
//! suite on named locks and on the table-record lock, and a killed lock connection.

use std::time::Duration;

use distlock::conformance::{Target, servers};

fn database() -> String {
    servers::MYSQL.url()
}

fn table() -> String {
    servers::with_query(&database(), "mode=table")
}

fn named() -> String {
    database()
}

distlock::conformance_suite!(mysql_table, Target::new(table()));
distlock::conformance_suite!(mysql_named, Target::new(named()));
distlock::wire_fault_suite!(mysql_table_wire, Target::new(table()));
distlock::wire_fault_suite!(mysql_named_wire, Target::new(named()));

/// A backend made from an application's own pool, opened through a factory as a backend
/// outside this crate would be.
fn from_pool(mode: distlock::mysql::Mode) -> Target {
    let url = database();
    Target::from_factory(format!("{url} ({mode:?}, from a pool)"), move || {
        let url = url.clone();
        async move {
            let pool = sqlx::MySqlPool::connect(&url)
                .await
                .expect("the application's pool");
            distlock::mysql::from_pool(&pool, mode).await
        }
    })
}

distlock::conformance_suite!(
    mysql_named_from_pool,
    from_pool(distlock::mysql::Mode::Named)
);
distlock::conformance_suite!(
    mysql_table_from_pool,
    from_pool(distlock::mysql::Mode::Table)
);

/// Kills the connection holding the named lock `name`, as an administrator would (`KILL`).
async fn kill_the_connection_holding(url: &str, name: &str) {
    let admin = sqlx::MySqlPool::connect(url).await.unwrap();
    let (holder_id,): (Option<i64>,) = sqlx::query_as("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(distlock::mysql::server_lock_name(name))
        .fetch_one(&admin)
        .await
        .unwrap();
    let holder_id = holder_id.expect("no connection holds the lock");
    sqlx::raw_sql(&format!("KILL CONNECTION {holder_id}"))
        .execute(&admin)
        .await
        .unwrap();
}

/// A named lock lives in its connection: when an administrator kills that connection
/// (`KILL`), the server frees the lock at once, another client gets it with a larger token,
/// and the holder's guard reports the loss at its next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_lock_connection_frees_the_lock_and_fires_lost() {
    let url = database();
    let holder = distlock::connect_with(
        &url,
        distlock::ConnectOptions::new().lease(Duration::from_millis(600)),
    )
    .await
    .unwrap();
    let name = format!("mysql/killed/{}", uuid::Uuid::new_v4().simple());
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

    kill_the_connection_holding(&url, &name).await;

    let granted = rival
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the lock of the killed connection was not freed");
    assert!(granted.fencing_token() > guard.fencing_token());
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not fire after the connection was killed");
    assert!(lost.is_lock_lost());
    granted.release().await.unwrap();
}

/// Names longer than the server's 64 characters still lock: two clients exclude each other
/// on a 300-byte name, and the server sees the hashed name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_are_hashed_and_still_exclude() {
    let url = database();
    let name = format!(
        "mysql/long/{}/{}",
        uuid::Uuid::new_v4().simple(),
        "n".repeat(260)
    );
    let a = distlock::connect(&url).await.unwrap();
    let b = distlock::connect(&url).await.unwrap();
    let guard = a.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(
        b.mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let admin = sqlx::MySqlPool::connect(&url).await.unwrap();
    let (used,): (Option<i64>,) = sqlx::query_as("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(distlock::mysql::server_lock_name(&name))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(used.is_some(), "the server does not know the hashed name");
    guard.release().await.unwrap();
    let again = b.mutex(name.as_str()).unwrap().try_acquire().await.unwrap();
    assert!(again.is_some());
    again.unwrap().release().await.unwrap();
}

/// Two names that differ only in case are two locks on this server (MariaDB compares
/// user-lock names byte for byte), and the table lock agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_differing_in_case_are_two_locks() {
    for target in [named(), table()] {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let a = distlock::connect(&target).await.unwrap();
        let b = distlock::connect(&target).await.unwrap();
        let upper = a
            .mutex(format!("case/{id}/Stock"))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let lower = b
            .mutex(format!("case/{id}/stock"))
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .expect("the lower-case name was refused while the upper-case one was held");
        lower.release().await.unwrap();
        upper.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_named_waiters_are_granted_by_the_server() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(named())).await;
}

/// Promise 2 (as far as a session lock allows: the server frees it the moment its connection
/// dies): when the lock connection is killed, every lock it held fires `lost()` within a
/// second or two, fixed-lease and renewed alike, and another owner of the same client gets
/// the lock at once instead of waiting for the stale entry's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_killed_lock_connection_fires_lost_for_every_lease() {
    let url = database();
    let holder = distlock::connect(&url).await.unwrap();
    let id = uuid::Uuid::new_v4().simple();
    let (fixed_name, renewed_name) = (
        format!("mysql/killed/{id}/fixed"),
        format!("mysql/killed/{id}/renewed"),
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

    kill_the_connection_holding(&url, &fixed_name).await;

    for (what, guard) in [("fixed-lease", &fixed), ("renewed", &renewed)] {
        let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("the {what} lock's lost() did not fire after its connection was killed")
            });
        assert!(lost.is_lock_lost());
    }
    // Another owner of the same client is not held up by what the killed connection held.
    let again = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(3)))
        .await
        .expect("the same client could not take the lock its killed connection held");
    assert!(again.fencing_token() > fixed.fencing_token());
    again.release().await.unwrap();
}

/// A process whose acquisitions take turns keeps one server connection (a fleet of N
/// processes needs about N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_lock_client_keeps_one_connection() {
    distlock::conformance::session_client_keeps_one_connection(&Target::new(named())).await;
}

/// Promise 4: a waiter dropped before its statement was sent never sends it (current-thread
/// runtime: the drop comes before the waiter's task runs).
#[tokio::test(flavor = "current_thread")]
async fn promise4_a_named_lock_waiter_dropped_before_its_statement_sends_none() {
    distlock::conformance::session_waiter_dropped_before_its_statement_sends_none(&Target::new(
        named(),
    ))
    .await;
}
