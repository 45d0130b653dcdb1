//! The SQLite backend's own tests: files made before doorbells, URLs.

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
