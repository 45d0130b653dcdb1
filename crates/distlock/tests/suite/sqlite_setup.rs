//! Setting up a new SQLite lock file from several processes at once: every first open must
//! succeed (the switch to WAL and the table creation meet each other there).

use std::sync::{Arc, Barrier};
use std::thread;

/// Openers per file: each is a client of its own on a thread of its own, as separate processes
/// starting together would be.
const OPENERS: usize = 8;
/// Fresh files per run.
const FILES: usize = 300;

#[test]
fn concurrent_first_opens_of_a_new_file_all_succeed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut failures = Vec::new();
    for file in 0..FILES {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("fresh-{file}.db")).display()
        );
        let start = Arc::new(Barrier::new(OPENERS));
        let openers: Vec<thread::JoinHandle<distlock::Result<()>>> = (0..OPENERS)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    start.wait();
                    runtime.block_on(async {
                        let locks = distlock::connect(&url).await?;
                        // The file is usable, not only opened.
                        let guard = locks.mutex("setup")?.try_acquire().await?;
                        if let Some(guard) = guard {
                            guard.release().await?;
                        }
                        distlock::Result::Ok(())
                    })
                })
            })
            .collect();
        for opener in openers {
            if let Err(error) = opener.join().expect("an opener panicked") {
                failures.push(format!("file {file}: {error}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} first opens failed:\n{}",
        failures.len(),
        FILES * OPENERS,
        failures.join("\n")
    );
}
