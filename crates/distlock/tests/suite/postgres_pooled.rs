//! PostgreSQL's transaction-scoped advisory locks (`?mode=transaction`) through PgBouncer in
//! transaction mode, the real pooler `scripts/test` starts in front of the real server: the
//! conformance and wire-fault suites, the server's own queue order, a killed holder, a
//! dropped waiter leaving the server's queue, and more waiting clients than the pooler has
//! server connections.

use std::time::Duration;

use distlock::conformance::{Target, servers};

/// Through the pooler.
fn pooled() -> String {
    servers::with_query(&servers::PGBOUNCER.url(), "mode=transaction")
}

/// Straight to the server, for looking at its lock table.
async fn admin() -> sqlx::PgPool {
    sqlx::PgPool::connect(&servers::POSTGRES.url())
        .await
        .unwrap()
}

/// The pooler keeps 30 server connections, shared by the tests that run at once: a case that
/// holds thousands of locks holds 10.
fn target() -> Target {
    Target::new(pooled()).holding_at_most(10)
}

distlock::conformance_suite!(postgres_transaction, target());
distlock::wire_fault_suite!(postgres_transaction_wire, Target::new(pooled()));

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_transaction_waiters_are_granted_by_the_server() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(pooled())).await;
}

/// The server's entries for the advisory key of `name`: (granted, waiting).
async fn entries(admin: &sqlx::PgPool, name: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted)
         FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(distlock::postgres::advisory_key(name))
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The server process holding `name`'s advisory key; exactly one must.
async fn holding_backend(admin: &sqlx::PgPool, name: &str) -> i32 {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(distlock::postgres::advisory_key(name))
    .fetch_all(admin)
    .await
    .unwrap();
    assert_eq!(pids.len(), 1, "backends holding {name}: {pids:?}");
    pids[0]
}

/// Polls `entries` until `done` holds, for at most `max`.
async fn until(
    admin: &sqlx::PgPool,
    name: &str,
    max: Duration,
    done: impl Fn((i64, i64)) -> bool,
) -> (i64, i64) {
    let deadline = tokio::time::Instant::now() + max;
    loop {
        let now = entries(admin, name).await;
        if done(now) || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn unique(what: &str) -> String {
    format!("pgx/{what}/{}", uuid::Uuid::new_v4().simple())
}

/// Promise 4: a waiter dropped while its statement waits in the server leaves nothing behind.
/// Its connection closes, the pooler closes the server connection it had, and the server
/// drops the wait; the lock, released afterwards, is held by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_dropped_waiter_leaves_the_servers_queue() {
    let admin = admin().await;
    let locks = distlock::connect(&pooled()).await.unwrap();
    let name = unique("dropped");
    let held = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let waiter_locks = distlock::connect(&pooled()).await.unwrap();
    let waiter_name = name.clone();
    let waiter = tokio::spawn(async move {
        let mutex = waiter_locks.mutex(waiter_name.as_str()).unwrap();
        mutex
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(60)))
            .await
    });
    let queued = until(&admin, &name, Duration::from_secs(10), |(_, w)| w == 1).await;
    assert_eq!(queued, (1, 1), "the waiter never queued in the server");

    waiter.abort();
    let _ = waiter.await;
    let after = until(&admin, &name, Duration::from_secs(3), |(_, w)| w == 0).await;
    assert_eq!(
        after,
        (1, 0),
        "the dropped waiter stayed in the server's queue"
    );

    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        entries(&admin, &name).await,
        (0, 0),
        "someone holds the lock"
    );
}

/// Promise 2 as session locks keep it: an administrator who ends the backend holding the lock
/// frees it at once (another client gets it with a larger token), and the holder's `lost()`
/// fires at its next check. The pooler closes the holder's client connection with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_killed_backend_frees_the_lock_and_fires_lost() {
    let admin = admin().await;
    crate::killed_session::frees_the_lock_and_fires_lost(&pooled(), "killed", |_, name| {
        let admin = admin.clone();
        async move {
            let pid = holding_backend(&admin, &name).await;
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .unwrap();
            assert!(killed, "the holding backend was already gone");
        }
    })
    .await;
}

/// More clients wait than the pooler has server connections (60 against its 30): those
/// without one wait in the pooler, holding no server connection, and every client is granted
/// in turn, each grant alone (promise 1) with a larger token than the one before (promise 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promise1_more_waiting_clients_than_server_connections_are_all_served() {
    const CLIENTS: usize = 60;
    let name = unique("fleet");
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (name, inside, tokens) = (name.clone(), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let locks = distlock::connect(&pooled()).await.unwrap();
            let guard = locks
                .mutex(name.as_str())
                .unwrap()
                .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(60)))
                .await
                .unwrap();
            let others = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokens.lock().unwrap().push(guard.fencing_token());
            tokio::time::sleep(Duration::from_millis(5)).await;
            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            guard.release().await.unwrap();
            others
        }));
    }
    for task in tasks {
        let others = tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("a client was not served in 90 s")
            .unwrap();
        assert_eq!(others, 0, "two clients held the lock at once");
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), CLIENTS);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens did not grow with every grant: {tokens:?}"
    );
}

/// Promise 2: a hold is a transaction idle between statements, and a server whose sessions
/// end idle transactions after 200 ms (`idle_in_transaction_session_timeout`, set here for the
/// client's sessions, straight to the server) still keeps it: the lock's transaction turns
/// that timeout off for itself. Without that, the server would free the lock unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_an_idle_transaction_timeout_does_not_end_a_hold() {
    let strict = servers::with_query(
        &servers::POSTGRES.url(),
        "mode=transaction&options[idle_in_transaction_session_timeout]=200",
    );
    let locks = distlock::connect(&strict).await.unwrap();
    let name = unique("idle-timeout");
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost(), "the hold was ended by the idle timeout");
    let rival = distlock::connect(&pooled()).await.unwrap();
    let mutex = rival.mutex(name.as_str()).unwrap();
    assert!(
        mutex.try_acquire().await.unwrap().is_none(),
        "a rival took a lock that is held"
    );
    guard.release().await.unwrap();
    assert!(mutex.try_acquire().await.unwrap().is_some());
}

/// Promises 1 and 3 through a pool the application already has (`from_pool` with
/// `Mode::Transaction`): the client takes the pool's connect options, excludes a client that
/// connected by URL and is excluded by it, and its tokens and that client's grow together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_client_from_an_applications_pool_excludes_one_by_url() {
    let options: sqlx::postgres::PgConnectOptions = servers::PGBOUNCER.url().parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(options);
    let backend = distlock::postgres::from_pool(pool, distlock::postgres::Mode::Transaction);
    let backend = backend.await.unwrap();
    let app = distlock::Locks::with_backend(backend, distlock::ConnectOptions::new()).unwrap();
    let by_url = distlock::connect(&pooled()).await.unwrap();
    let name = unique("from_pool");
    let mut last = 0;
    for round in 0..4 {
        let (holder, other) = if round % 2 == 0 {
            (&app, &by_url)
        } else {
            (&by_url, &app)
        };
        let guard = crate::common::hold(holder, name.as_str()).await;
        assert!(
            guard.fencing_token() > last,
            "round {round}: token not larger"
        );
        last = guard.fencing_token();
        let tried = other
            .mutex(name.as_str())
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        assert!(tried.is_none(), "round {round}: granted twice");
        assert!(other.is_locked(&name).await.unwrap(), "round {round}");
        guard.release().await.unwrap();
    }
    assert!(!app.is_locked(&name).await.unwrap());
}

/// `url` (a `postgres://` URL) with the database `database` instead of its own.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// Promise 2: a check of the holder's transaction that fails in the server does not end the
/// hold. Any error inside a transaction block aborts it, and the server frees an aborted
/// transaction's locks at once, before `lost()` could fire; the check runs under a savepoint
/// instead. Here the check waits behind an operator's lock on the `pg_locks` view and is
/// cancelled there; afterwards the holder still holds, on the same backend, and nobody else is
/// granted the lock. In a database of its own: a lock on a view holds up that database's
/// readers of it only, and no other test reads `pg_locks` there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_check_that_fails_in_the_server_does_not_free_the_hold() {
    const DATABASE: &str = "distlock_view_lock";
    let server_url = with_database(&servers::POSTGRES.url(), "postgres");
    let server = sqlx::PgPool::connect(&server_url).await.unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&server)
            .await
            .unwrap();
    if !exists {
        // 42P04: made meanwhile by another run.
        if let Err(e) = sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
            .execute(&server)
            .await
        {
            let code = e.as_database_error().and_then(|e| e.code());
            assert!(matches!(code.as_deref(), Some("42P04" | "23505")), "{e}");
        }
    }
    let admin_url = with_database(&servers::POSTGRES.url(), DATABASE);
    let admin = sqlx::PgPool::connect(&admin_url).await.unwrap();
    let pooled_url = with_database(&pooled(), DATABASE);
    let holder = within(Duration::from_secs(10), distlock::connect(&pooled_url)).await;
    let holder = holder.unwrap();
    // The view is locked before the grant, so that no check of the holder's (which keeps
    // its share of the view's lock until the transaction ends) comes first.
    let mut blocker = admin.begin().await.unwrap();
    let lock_view = sqlx::query("SET LOCAL lock_timeout = '5s'")
        .execute(&mut *blocker)
        .await
        .and(
            sqlx::query("LOCK TABLE pg_catalog.pg_locks IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *blocker)
                .await,
        );
    lock_view.unwrap();
    let name = unique("failed_check");
    let mutex = holder.mutex(name.as_str()).unwrap();
    let guard = within(Duration::from_secs(10), mutex.try_acquire()).await;
    let guard = guard.unwrap().expect("a new lock is free");
    let pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 1 AND granted
           AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(distlock::postgres::advisory_key(&name))
    .fetch_one(&mut *blocker)
    .await
    .unwrap();
    // Cancels the holder's check once it waits behind the view's lock, then lifts the lock.
    let cancel = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let waits: Option<String> =
                sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&admin)
                    .await
                    .unwrap();
            if waits.as_deref() == Some("Lock") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the check never waited"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
            .bind(pid)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert!(cancelled, "the holder's backend is gone");
        blocker.rollback().await.unwrap();
    };
    let (held, ()) = tokio::join!(within(Duration::from_secs(10), guard.is_held()), cancel);
    assert!(
        held.unwrap(),
        "the holder no longer holds after a failed check"
    );
    assert!(!guard.is_lost(), "{:?}", guard.loss_reason());
    assert_eq!(entries(&admin, &name).await, (1, 0));
    let rival = distlock::connect(&pooled_url).await.unwrap();
    let rival = rival.mutex(name.as_str()).unwrap();
    let tried = within(Duration::from_secs(10), rival.try_acquire()).await;
    assert!(
        tried.unwrap().is_none(),
        "granted to another after a failed check"
    );
    within(Duration::from_secs(10), guard.release())
        .await
        .unwrap();
}

/// `future`'s output, or a panic naming the limit it ran past.
async fn within<T>(limit: Duration, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("not done within {limit:?}"))
}
