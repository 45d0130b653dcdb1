//! The same locks without `async`, for synchronous programs (feature `blocking`), in the
//! style of `reqwest::blocking`: each client runs its requests on a Tokio runtime of its own
//! on a background thread, and every method blocks the calling thread until it is answered.
//!
//! ```
//! use std::time::Duration;
//!
//! # fn main() -> distlock::Result<()> {
//! let locks = distlock::blocking::connect("memory://")?;
//! let stock = locks.mutex("stock/iphone-15")?;
//!
//! let guard = stock.acquire()?;                 // blocks; lease 30 s, renewed in the background
//! let token = guard.fencing_token();            // send it with every write you make
//! // ... read the stock, check it, write it back with `token` ...
//! assert!(!guard.is_lost());                    // asks no server
//! guard.release()?;                             // tells you if the lock was lost
//!
//! // Threads sharing a handle exclude each other: each acquisition is its own owner.
//! let sold = std::thread::scope(|scope| {
//!     let workers: Vec<_> = (0..4)
//!         .map(|_| scope.spawn(|| stock.run(|_token| 1)))
//!         .collect();
//!     let sold = workers.into_iter().map(|worker| worker.join().expect("a worker panicked"));
//!     sold.sum::<distlock::Result<u32>>()
//! })?;
//! assert_eq!(sold, 4);
//!
//! // Give up after 2 s with `Error::Timeout`.
//! let opts = distlock::AcquireOptions::new().wait(Duration::from_secs(2));
//! let guard = stock.acquire_with(opts)?;
//! assert!(guard.fencing_token() > token);
//! assert!(guard.lost_timeout(Duration::from_millis(10)).is_none()); // still held
//! guard.release()?;
//! # Ok(())
//! # }
//! ```
//!
//! # When to use it
//!
//! In a program with no async runtime: a command-line tool, a job, a thread-per-request
//! server, a library with a synchronous API. A program that already runs Tokio uses the async
//! API ([`crate::Locks`]): it shares that program's runtime instead of starting another, and
//! its waits can be cancelled.
//!
//! # The threading model
//!
//! * [`connect`] starts a thread that owns a multi-threaded Tokio runtime with two worker
//!   threads, and connects on it. Everything the client does runs there: the requests of
//!   the calling threads, the renewal of held locks, the wake-ups of waiters.
//! * A blocking method hands its request to the runtime and parks the calling thread on a
//!   channel until the answer comes. It never calls Tokio's `block_on`, so it never panics,
//!   also when called from inside an async runtime; but it blocks that thread like any
//!   blocking call (as `reqwest::blocking` does): on a current-thread runtime every task
//!   stops meanwhile. From async code, use the async API, or call it in `spawn_blocking`.
//! * Handles and guards are `Send` and `Sync`: threads share a [`Mutex`] by reference or by
//!   clone, and a guard can be released on another thread than the one that acquired it.
//!   A lock is owned by the acquisition, never by the thread (see [`Holder`] for reentrancy).
//! * Each [`connect`] makes one client with one runtime; [`Locks`] clones, and every handle
//!   and guard made from them, share it and keep it running. A guard keeps renewing its lock
//!   after the [`Locks`] it came from is dropped.
//! * When the last handle or guard of a client is dropped, its runtime's thread waits up to
//!   [`SHUTDOWN_GRACE`] for the releases that dropped guards started, then stops the
//!   runtime; the drop that was last blocks until that thread has ended (at most about
//!   [`SHUTDOWN_GRACE`] and one more second, usually a round trip). So a guard dropped right
//!   before `main` returns is still released, not left to its lease. A guard leaked with
//!   `mem::forget` keeps its runtime, and renews its lock, until the process exits.
//!
//! # Waits and timeouts
//!
//! A blocking call cannot be cancelled. [`Mutex::acquire`] waits without a limit; bound a
//! wait with [`AcquireOptions::wait`](crate::AcquireOptions::wait) and
//! [`Mutex::acquire_with`]: the calling thread is back after about that long (plus a round
//! trip) with [`Error::Timeout`](crate::Error::Timeout), and the acquisition leaves nothing
//! behind, no hold and no place in a queue (the async acquisition, which is cancel safe, is
//! dropped at its limit on the runtime). A zero wait tries once, as `try_acquire` does.
//!
//! # Loss
//!
//! Renewals run on the runtime whatever the calling thread does, even while it sits in a
//! long computation. [`Guard::is_lost`] says without blocking whether the client knows the
//! lock is lost; [`Guard::lost`] blocks until it is, and [`Guard::lost_timeout`] at most a
//! given time. Long work checks between its steps; [`Mutex::run`] cannot stop a closure at
//! the loss as the async `run` drops its future, so it lets the closure finish and answers
//! with the loss.
//!
//! # What has no blocking counterpart
//!
//! * [`crate::Locks::session`]: a `tokio::sync::watch` receiver, for async code.
//! * [`crate::Locks::run_exclusive`] (scheduled jobs) and the `#[locked]` attribute, which
//!   wrap async work.
//! * [`crate::Election::observe`] and `observe_every`, a stream: ask
//!   [`Election::leader`] instead.
//! * [`crate::ReadGuard::slot`] and [`crate::Leadership::guard`], which lend async guards.
//! * The [`stock`](crate::stock) module and the `conformance` suite, async by nature.
//!
//! A backend you open yourself (a `fault::FaultyBackend` wrapper, one over your own pool)
//! goes through [`Locks::with_backend`], which opens it on the client's runtime.
//!
//! # Errors
//!
//! The same [`Error`](crate::Error) as the async API. A request that panics on the runtime
//! (a bug), or that the runtime cannot run, answers with
//! [`Error::Backend`](crate::Error::Backend) naming the backend and the operation; the
//! calling thread does not panic, and the client goes on working.

mod election;
mod guard;
mod held;
mod locks;
mod multi;
mod mutex;
mod runtime;
mod rwlock;
mod semaphore;

pub use self::election::{Election, Leadership};
pub use self::guard::Guard;
pub use self::locks::Locks;
pub use self::multi::{MultiGuard, MultiLock};
pub use self::mutex::{Holder, Mutex};
pub use self::runtime::SHUTDOWN_GRACE;
pub use self::rwlock::{ReadGuard, RwLock, WriteGuard};
pub use self::semaphore::Semaphore;

use self::runtime::Runtime;
use crate::error::Result;
use crate::options::ConnectOptions;

/// Starts a client's runtime thread and connects, on it, to the backend a URL names, with
/// default options. See the crate docs for the URLs.
///
/// # Errors
/// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a malformed URL or an unknown
///   scheme.
/// - [`Error::FeatureDisabled`](crate::Error::FeatureDisabled) when the backend's cargo
///   feature is not compiled in.
/// - [`Error::Backend`](crate::Error::Backend) when the backend cannot be reached or set up,
///   or the runtime's thread cannot be started.
pub fn connect(url: &str) -> Result<Locks> {
    connect_with(url, ConnectOptions::default())
}

/// As [`connect`], with options; see [`ConnectOptions`].
///
/// # Errors
/// As [`connect`], and [`Error::InvalidInput`](crate::Error::InvalidInput) for options out of
/// range.
pub fn connect_with(url: &str, options: ConnectOptions) -> Result<Locks> {
    let (scheme, _) = crate::scheme::of_url(url)?;
    let runtime = Runtime::start()?;
    runtime.name_backend(scheme.name);
    let url = url.to_owned();
    let locks = runtime.call("connect", async move {
        crate::connect_with(&url, options).await
    })?;
    Ok(Locks::new(locks, runtime))
}
