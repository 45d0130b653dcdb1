//! The SQLite backend's own tests: files made before doorbells and reader-writer locks,
//! URLs, a cancelled writer.

use super::*;

/// A file made before doorbells gains the column; on Linux a waiter's ticket names its
/// handle's bell, so that a release can ring it.
#[tokio::test]
async fn tickets_carry_the_bell_also_in_files_made_before_bells() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE distlock_waiters (
                 ticket INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                 owner TEXT NOT NULL, seen_at_ms INTEGER NOT NULL)",
        )
        .unwrap();
    let backend = SqliteBackend::open(path.to_str().unwrap()).await.unwrap();
    let name = LockName::new("belled").unwrap();
    let waiter = backend
        .subscribe(&name, &Owner::new("test", 1), Duration::from_secs(1))
        .await
        .unwrap();
    let bell: Option<String> = backend
        .run("read", |conn| {
            conn.query_row("SELECT bell FROM distlock_waiters", [], |row| row.get(0))
        })
        .await
        .unwrap();
    assert_eq!(
        bell.as_deref(),
        backend.bell.as_ref().map(|bell| bell.name()),
        "the ticket does not name the bell"
    );
    assert_eq!(bell.is_some(), cfg!(target_os = "linux"));
    drop(waiter);
}

#[test]
fn urls_parse_or_say_what_is_wrong() {
    let url = parse_url("/tmp/x.db").unwrap();
    assert_eq!(url.path, PathBuf::from("/tmp/x.db"));
    assert_eq!(url.busy_timeout, DEFAULT_BUSY_TIMEOUT);
    assert!(url.fair);
    assert!(!parse_url("/tmp/x.db?fair=false").unwrap().fair);
    let url = parse_url("rel/x.db?busy_timeout_ms=250").unwrap();
    assert_eq!(url.path, PathBuf::from("rel/x.db"));
    assert_eq!(url.busy_timeout, Duration::from_millis(250));
    for bad in [
        "",
        "?busy_timeout_ms=5",
        "/x.db?busy_timeout_ms=0",
        "/x.db?busy_timeout_ms=abc",
        "/x.db?mode=ro",
        "/x.db?fair=maybe",
    ] {
        assert!(parse_url(bad).unwrap_err().is_invalid_input(), "{bad:?}");
    }
}

/// Fair mode: a long queue keeps every ticket live and its order through a wait several
/// times a ticket's staleness (1 s). Waiters far back look seldom (up to every 250 ms, from
/// 45 tickets back); a refresh spaced past the staleness would drop a ticket from the live
/// count and send its waiter to the back of the queue.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_queue_keeps_its_order_while_its_waiters_look_seldom() {
    const WAITERS: usize = 50;
    const NAME: &str = "long-queue";
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("queue.db").display());
    let holder = crate::connect(&url).await.unwrap();
    let held = holder.mutex(NAME).unwrap().acquire().await.unwrap();
    let live = async || holder.inspect(NAME).await.unwrap().waiters;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for id in 0..WAITERS {
        // A client (and doorbell) per waiter, as if each were another process.
        let locks = crate::connect(&url).await.unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let wait = crate::AcquireOptions::new().wait(Duration::from_secs(60));
            let mutex = locks.mutex(NAME).unwrap();
            let guard = mutex.acquire_with(wait).await.unwrap();
            order.lock().unwrap().push(id);
            guard.release().await.unwrap();
        }));
        // This waiter has its ticket before the next one comes.
        let queued = Some(id as u64 + 1);
        tokio::time::timeout(Duration::from_secs(10), async {
            while live().await != queued {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a waiter did not queue within 10 s");
    }
    // Several staleness periods with the whole queue waiting: every ticket stays live.
    let end = tokio::time::Instant::now() + Duration::from_millis(3 * TICKET_STALE_MS as u64);
    while tokio::time::Instant::now() < end {
        assert_eq!(
            live().await,
            Some(WAITERS as u64),
            "a waiter's ticket went stale"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        for waiter in waiters {
            waiter.await.expect("waiter panicked");
        }
    })
    .await
    .expect("the queue was not served within 30 s");
    assert_eq!(
        *order.lock().unwrap(),
        (0..WAITERS).collect::<Vec<_>>(),
        "a waiter lost its place in the queue"
    );
}

/// A reader's ticket is marked as a reader's also in a file made before reader-writer locks
/// (which gains the column when opened), so that a writer's ticket alone holds readers back.
#[tokio::test]
async fn reader_tickets_are_marked_also_in_files_made_before_rwlocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE distlock_waiters (
                 ticket INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                 owner TEXT NOT NULL, seen_at_ms INTEGER NOT NULL, bell TEXT)",
        )
        .unwrap();
    let backend = SqliteBackend::open(path.to_str().unwrap()).await.unwrap();
    let reader = LockName::new("marked")
        .unwrap()
        .with_kind(crate::LockKind::Read);
    let writer = reader.clone().with_kind(crate::LockKind::Write);
    let lease = Duration::from_secs(1);
    let (first, second) = (Owner::new("test", 1), Owner::new("test", 2));
    let read = backend.subscribe(&reader, &first, lease).await.unwrap();
    let write = backend.subscribe(&writer, &second, lease).await.unwrap();
    let kinds: Vec<Option<String>> = backend
        .run("read", |conn| {
            conn.prepare("SELECT kind FROM distlock_waiters ORDER BY ticket")?
                .query_map([], |row| row.get(0))?
                .collect()
        })
        .await
        .unwrap();
    assert_eq!(kinds, [Some(READER_TICKET.to_owned()), None]);
    drop((read, write));
}

/// Promise 4: a writer cancelled while it waits for a reader takes its ticket away with it,
/// so later readers are not held back by a writer who is gone (fair mode and without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_cancelled_writer_leaves_no_ticket_that_holds_readers_back() {
    let dir = tempfile::tempdir().unwrap();
    for fair in [true, false] {
        let path = dir.path().join(format!("cancelled-{fair}.db"));
        let url = format!("sqlite://{}?fair={fair}", path.display());
        let locks = crate::connect(&url).await.unwrap();
        let lock = locks.rwlock("cancelled").unwrap();
        let read = lock.read().await.unwrap();
        let writing = tokio::time::timeout(Duration::from_millis(300), lock.write()).await;
        assert!(writing.is_err(), "promise 1: a writer was granted beside a reader");
        let backend = SqliteBackend::open(path.to_str().unwrap()).await.unwrap();
        let tickets = || {
            backend.run("count the tickets", |conn| {
                conn.query_row("SELECT COUNT(*) FROM distlock_waiters", [], |row| {
                    row.get::<_, i64>(0)
                })
            })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tickets().await.unwrap() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "promise 4: the cancelled writer's ticket is still queued (fair={fair})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let second = lock.try_read().await.unwrap();
        assert!(second.is_some(), "a reader was refused beside a reader");
        read.release().await.unwrap();
        second.unwrap().release().await.unwrap();
    }
}
