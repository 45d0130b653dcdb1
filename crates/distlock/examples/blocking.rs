//! Distributed locks in a program with no async code (`distlock::blocking`): four threads
//! sell 40 tickets kept in a plain file, each sale a read-modify-write of that file under one
//! distlock mutex in an SQLite lock file. Every write carries the grant's fencing token, and
//! the file refuses a token older than the newest it has seen.
//!
//! ```text
//! cargo run -p distlock --example blocking --features blocking
//! ```
//!
//! Any other URL works the same (`redis://127.0.0.1:6379/` with `--features blocking,redis`);
//! SQLite in a temporary directory needs no server.

use std::path::Path;
use std::thread;
use std::time::Duration;

use distlock::AcquireOptions;
use distlock::blocking::Mutex;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TICKETS: u32 = 40;

fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    // Starts the client's runtime thread and connects on it.
    let locks = distlock::blocking::connect(&url)?;

    let store = dir.path().join("tickets.txt");
    std::fs::write(&store, format!("{TICKETS} 0"))?;
    let sale = locks.mutex("concert/7")?;

    // Threads share the handle; each acquisition is its own owner, so they exclude each other.
    let sold = thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (sale, store) = (&sale, store.as_path());
                scope.spawn(move || sell(sale, store))
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err("a worker panicked".into()))
            })
            .collect::<Result<Vec<u32>, BoxError>>()
    })?;

    // `run` acquires, runs the closure with the token, and releases.
    let (left, newest) = sale.run(|_token| read(&store))??;
    println!("sold {sold:?} tickets per thread; {left} left; newest fencing token {newest}");
    assert_eq!(sold.iter().sum::<u32>(), TICKETS);
    assert_eq!(left, 0);
    // Dropping `locks` and `sale` stops the runtime thread once every release is done.
    Ok(())
}

/// Sells tickets one at a time until none are left; returns how many this thread sold.
fn sell(sale: &Mutex, store: &Path) -> Result<u32, BoxError> {
    let mut sold = 0;
    loop {
        // Blocks at most 10 s, then `Error::Timeout`.
        let guard = sale.acquire_with(AcquireOptions::new().wait(Duration::from_secs(10)))?;
        let (left, _) = read(store)?;
        if left == 0 {
            guard.release()?;
            return Ok(sold);
        }
        // The lock is renewed on the runtime while this thread works; `is_lost` asks no server.
        if guard.is_lost() {
            return Err(guard.lost().into());
        }
        write(store, left - 1, guard.fencing_token())?;
        // Reports a lock lost meanwhile; dropping the guard would release in the background.
        guard.release()?;
        sold += 1;
    }
}

/// The tickets left and the newest fencing token the file has accepted.
fn read(store: &Path) -> Result<(u32, u64), BoxError> {
    let text = std::fs::read_to_string(store)?;
    let mut fields = text.split_whitespace();
    let left = fields.next().ok_or("no ticket count")?.parse()?;
    let newest = fields.next().ok_or("no token")?.parse()?;
    Ok((left, newest))
}

/// Writes the count under `token`, refusing a token older than the newest accepted: the
/// check a fenced store makes, so that a holder whose lease ran out cannot write.
fn write(store: &Path, left: u32, token: u64) -> Result<(), BoxError> {
    let (_, newest) = read(store)?;
    if token < newest {
        return Err(format!("token {token} refused: the store has seen {newest}").into());
    }
    std::fs::write(store, format!("{left} {token}"))?;
    Ok(())
}
