//! The MySQL/MariaDB backend on the real server `scripts/test` makes sure of: the conformance
//! suite on named locks and on the table-record lock, and a killed lock connection.

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
    crate::killed_session::frees_the_lock_and_fires_lost(
        &database(),
        "mysql/killed",
        |url, name| async move {
            kill_the_connection_holding(&url, &name).await;
        },
    )
    .await;
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
        let upper = crate::common::hold(&a, &format!("case/{id}/Stock")).await;
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

/// Promise 2: every lock of a killed lock connection fires `lost()`, fixed-lease and renewed
/// alike (see [`crate::killed_session`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_killed_lock_connection_fires_lost_for_every_lease() {
    crate::killed_session::promise2_fires_lost_for_every_lease(
        &database(),
        "mysql/killed",
        |url, name| async move {
            kill_the_connection_holding(&url, &name).await;
        },
    )
    .await;
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

/// A password the server refuses is `Error::NotAuthorized` (1045, access denied), in both
/// lock modes, and the message holds no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_is_not_authorized() {
    let url = database();
    let rest = url.strip_prefix("mysql://").expect("a mysql:// URL");
    let (user, hosts) = rest.split_once('@').expect("the MySQL URL names a user");
    let user = user.split(':').next().unwrap_or(user);
    let wrong = format!("mysql://{user}:not-the-pw@{hosts}");
    for url in [wrong.clone(), servers::with_query(&wrong, "mode=table")] {
        let err = tokio::time::timeout(std::time::Duration::from_secs(30), distlock::connect(&url))
            .await
            .expect("the refused connect took too long")
            .expect_err("a wrong password was let in");
        assert!(err.is_not_authorized(), "{err}");
        assert!(err.to_string().contains("1045"), "{err}");
        assert!(!err.to_string().contains("not-the-pw"), "{err}");
    }
}

/// MariaDB that takes only TLS connections with a password (`scripts/mariadb-deployment
/// secured`): the conformance suite over `ssl-mode=VERIFY_IDENTITY` with the server's CA.
fn secured() -> String {
    servers::MYSQL_SECURED.url()
}

distlock::conformance_suite!(mysql_secured_named, Target::new(secured()));
distlock::conformance_suite!(
    mysql_secured_table,
    Target::new(servers::with_query(&secured(), "mode=table"))
);

/// On the server that requires TLS: a connection without TLS is `Error::NotAuthorized`, a
/// certificate the URL's CA did not sign (none given: the system's roots) is refused as
/// untrusted; neither message holds the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tls_or_an_untrusted_certificate_is_refused() {
    let url = secured();
    let (base, _) = url.split_once('?').expect("the secured URL has options");
    let limit = std::time::Duration::from_secs(30);
    let plain = format!("{base}?ssl-mode=DISABLED");
    let err = tokio::time::timeout(limit, distlock::connect(&plain))
        .await
        .expect("the refused connect took too long")
        .expect_err("a connection without TLS was let in");
    assert!(err.is_not_authorized(), "{err}");
    assert!(!err.to_string().contains("app-pw"), "{err}");
    let untrusted = format!("{base}?ssl-mode=VERIFY_IDENTITY");
    let err = tokio::time::timeout(limit, distlock::connect(&untrusted))
        .await
        .expect("the refused connect took too long")
        .expect_err("a certificate no trusted CA signed was accepted");
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(
        text.contains("certificate") || text.contains("UnknownIssuer"),
        "not refused as an untrusted certificate: {text}"
    );
    assert!(!text.contains("app-pw"), "{text}");
}
