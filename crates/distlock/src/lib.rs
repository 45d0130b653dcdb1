//! Distributed locks that say when they are lost and hand out fencing tokens, over one API
//! for several backends.
//!
//! Two instances of a service that both read "12 in stock", both sell 10 and both write back
//! end at -8. A `std::sync::Mutex` only orders the tasks of one process; a distributed lock
//! orders every process that shares the backend.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! use std::time::Duration;
//!
//! // `sqlite:///var/lib/app/locks.db` shares locks between the processes of one machine;
//! // `memory://` keeps them in this process (tests, single-process programs).
//! let locks = distlock::connect("memory://").await?;
//! let stock = locks.mutex("stock/iphone-15")?;
//!
//! let guard = stock.acquire().await?;           // waits; lease 30 s, renewed every 10 s
//! let token = guard.fencing_token();            // send it with every write you make
//! // ... read the stock, check it, write it back with `token` ...
//! guard.release().await?;                       // tells you if the lock was lost
//!
//! // Give up after 2 s; hold for a fixed 5 s lease without renewal.
//! let opts = distlock::AcquireOptions::new()
//!     .wait(Duration::from_secs(2))
//!     .lease(Duration::from_secs(5));
//! let guard = stock.acquire_with(opts).await?;
//! assert!(guard.fencing_token() > token);
//! # guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Choosing a backend
//!
//! | URL | backend | feature | waiters served | frees a crashed holder's lock |
//! |---|---|---|---|---|
//! | `memory://` or `memory://NAME` | this process only | always on | in arrival order | when the lease ends |
//! | `sqlite:///path/locks.db` | table-record lock in an SQLite file (one machine) | `sqlite` (default) | in arrival order (`?fair=false`: first to ask) | when the lease ends |
//! | `redis://host:6379/` | reentrant lock in Lua scripts, pub/sub wake-up (standalone server) | `redis` | in arrival order (`?fair=false`: first to ask) | when the lease ends |
//! | `redis+spin://host:6379/` | the same lock, waiters poll with backoff (the spin lock) | `redis` | first poll after the release | when the lease ends |
//! | `rediss://host:6379/?ca=/path/ca.pem` | the reentrant lock over TLS | `redis` | as `redis://` | when the lease ends |
//! | `redis+sentinel://s1:26379,s2:26379/service` | the reentrant lock on the master a Sentinel group names, found again after a failover | `redis` | as `redis://` | when the lease ends |
//! | `redis+cluster://n1:7000,n2:7001/` | the reentrant lock on a Redis Cluster, sharded pub/sub wake-up | `redis` | as `redis://` | when the lease ends |
//! | `redlock://h1:6379,h2:6379,h3:6379/` | Redlock: held while a majority of independent Redis masters holds it, fencing tokens agreed by that majority | `redis` | first to ask after the release | when the lease ends |
//! | `zk://h1:2181,h2:2181/base/path` | ZooKeeper sequential-node lock (Curator-compatible), one watch per waiter | `zookeeper` | in arrival order | when its session times out (`?session_timeout=`, 10 s) |
//! | `postgres://user@host:5432/db` (or `postgresql://`) | PostgreSQL session advisory locks, each on a connection the lock owns | `postgres` | in the server's queue order | when its connection closes |
//! | `postgres://user@host:5432/db?mode=table` | table-record lock in a PostgreSQL table, LISTEN/NOTIFY wake-up | `postgres` | first to ask after the release | when the lease ends |
//! | `postgres://user@pooler:6432/db?mode=transaction` | PostgreSQL transaction-scoped advisory locks, each in a transaction its connection keeps open: works through PgBouncer in transaction mode | `postgres` | in the server's queue order | when its transaction ends |
//! | `zk+naive://h1:2181/` | one ephemeral node that every waiter watches (the herd effect, for comparison) | `zookeeper` | first to ask after the release | when its session times out |
//! | `etcd://h1:2379,h2:2379/prefix` | etcd lease-and-revision lock (the layout of etcd's `concurrency.Mutex` and `etcdctl lock`), one watch per waiter | `etcd` | in arrival order | when the client's etcd lease runs out (`?lease_ttl=`, 10 s) |
//! | `mysql://user@host:3306/db` (or `mariadb://`) | MySQL/MariaDB named locks (`GET_LOCK`), each on a connection the lock owns | `mysql` | in the server's order | when its connection closes |
//! | `mysql://user@host:3306/db?mode=table` | table-record lock in a MySQL table; waiters in other clients poll | `mysql` | first to ask after the release | when the lease ends |
//! | `nats://h1:4222,h2:4222/bucket` | NATS JetStream key-value bucket: compare-and-set on the key's revision, a subscription to the key's subject wakes waiters | `nats` | first to ask after the release | when the lease ends, by the server's clock |
//!
//! Each scheme's query options are in [`SCHEMES`]; an unknown key is refused with the list of
//! known ones. Every Redis URL takes `?fair=false` (first to ask wins) and `?spin=true` (the spin lock's
//! polling instead of pub/sub). Redis replicates asynchronously: a failover can lose a grant,
//! and only a resource that checks fencing tokens is safe then (see `docs/backends/redis.md`).
//!
//! Redlock (`redlock://`) asks an odd number of independent masters and survives the loss of
//! a minority of them; see `docs/backends/redis.md` for its fencing tokens and its limits.
//!
//! ZooKeeper keeps no leases: its locks live as long as the client's session, and distlock
//! keeps the API's leases in the holder's client (see `docs/backends/zookeeper.md` and
//! [`Locks::session`]).
//!
//! PostgreSQL and MySQL session locks live in their connection: the server frees them the
//! moment it closes (see `docs/backends/postgres.md` and `docs/backends/mysql.md`).
//!
//! etcd keeps every lock of a client under one etcd lease, kept alive by one stream; the
//! API's leases are kept in the holder's client, and a lost etcd lease fires `lost()` on every
//! lock under it (see `docs/backends/etcd.md` and [`Locks::session`]).
//!
//! # Beyond the mutex
//!
//! Every backend also offers, on the same core (so each has leases, renewal, loss and
//! fencing tokens): a [`Semaphore`] ([`Locks::semaphore`]), a reader-writer lock
//! ([`RwLock`], [`Locks::rwlock`]), several locks taken all or nothing ([`MultiLock`],
//! [`Locks::multi_lock`]), and leader election ([`Election`], [`Locks::election`]) whose
//! term is a fencing token. Most are built on the backend's mutex; ZooKeeper keeps the
//! reader-writer lock and the election in Apache Curator's layouts, etcd the election in that
//! of its Go client, and PostgreSQL the reader-writer lock in its shared advisory locks, so
//! Java and Go services and plain SQL share them. `docs/primitives/` says how each
//! is built and what it costs.
//!
//! # Ownership, leases and loss
//!
//! * Every acquisition through a [`Mutex`] from [`Locks::mutex`] is its own owner, so tasks
//!   sharing a handle exclude each other. Reentrancy is explicit: a [`Holder`] from
//!   [`Locks::holder`] is an owner identity that re-enters locks it holds, and
//!   [`Guard::reenter`] takes another hold on a held lock. The lock is free once every
//!   [`Guard`] of its owner has been released.
//! * A lock acquired without a lease is held with the client's lease (30 s by default) and
//!   renewed every third of it by one background task per client, in batches. A lock
//!   acquired with [`AcquireOptions::lease`] is not renewed: it frees itself when the lease
//!   ends, even while its guard lives.
//! * [`Guard::lost`] resolves when the lock is known lost: a renewal refused, the lease run
//!   out without a successful renewal, an operator's force-unlock noticed at the next renewal.
//!   A pause longer than the lease (GC, swap, a stopped VM) can let another holder in
//!   *before* the old holder notices; only a resource that checks [`Guard::fencing_token`]
//!   refuses the late writer.
//! * [`Guard::extend`] moves the end of a fixed lease; [`Guard::set_lease`] turns a renewed
//!   lock into a fixed lease. Why a lock was lost is a [`LossReason`].
//! * Dropping a guard releases in the background; [`Guard::release`] reports errors.
//!
//! # Without async
//!
//! With the `blocking` feature, `distlock::blocking` has the same client, primitives and
//! guards without `async`, for synchronous programs: `blocking::connect(url)` starts a Tokio
//! runtime of the client's own on a background thread, and each method blocks the calling
//! thread until it is answered; `lost()` blocks, `is_lost()` does not. `docs/blocking.md`
//! says how it works and what it cannot do.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The registry: every backend, the cargo feature that compiles it in, and the file of its
/// URL schemes. A backend's module (`src/<backend>.rs` and its folder) is compiled with its
/// feature; its scheme rows always are, so that a URL of a backend this build lacks says
/// which feature would compile it in. Adding a backend is a line here.
macro_rules! backends {
    ($($module:ident $(: $feature:literal)?, $schemes:ident at $path:literal;)*) => {
        $(
            $(#[cfg(feature = $feature)])?
            pub mod $module;
            #[path = $path]
            mod $schemes;
        )*
        /// Each backend's scheme rows, in the registry's order ([`scheme::SCHEMES`]).
        const BACKEND_SCHEMES: &[&[Scheme]] = &[$($schemes::SCHEMES),*];
    };
}

backends! {
    memory, memory_schemes at "memory/schemes.rs";
    sqlite: "sqlite", sqlite_schemes at "sqlite/schemes.rs";
    redis: "redis", redis_schemes at "redis/schemes.rs";
    zookeeper: "zookeeper", zookeeper_schemes at "zookeeper/schemes.rs";
    postgres: "postgres", postgres_schemes at "postgres/schemes.rs";
    mysql: "mysql", mysql_schemes at "mysql/schemes.rs";
    etcd: "etcd", etcd_schemes at "etcd/schemes.rs";
    nats: "nats", nats_schemes at "nats/schemes.rs";
}

pub mod backend;
#[cfg(feature = "bench")]
mod bare;
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
mod cleanup;
mod client;
#[cfg(feature = "conformance")]
pub mod conformance;
mod describe;
mod driver;
mod election;
mod error;
#[cfg(feature = "fault")]
pub mod fault;
mod finish;
mod guard_set;
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod hooks;
mod keeper;
pub mod meter;
mod multi;
mod mutex;
mod name;
mod open;
mod options;
mod percent;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
mod queue;
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper",
    feature = "etcd"
))]
mod reaper;
mod redact;
mod rwlock;
mod schedule;
pub mod scheme;
mod semaphore;
// Compiled in every build: the demo's scheme rows name the servers of the tests.
#[cfg_attr(not(feature = "conformance"), allow(dead_code))]
mod servers;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
pub mod stock;
mod wake;

pub use crate::backend::{SessionState, SessionStatus};
pub use crate::client::Locks;
pub use crate::describe::Described;
pub use crate::election::{Election, Leader, Leadership};
pub use crate::error::{BoxError, Error, LossReason, Result};
pub use crate::multi::{MultiGuard, MultiLock};
pub use crate::mutex::{Guard, Holder, Mutex};
pub use crate::name::{LockKind, LockName};
pub use crate::open::{open_backend, validate_url};
pub use crate::options::{AcquireOptions, ConnectOptions};
pub use crate::redact::redact_url;
pub use crate::rwlock::{ReadGuard, RwLock, WriteGuard};
pub use crate::schedule::Schedule;
pub use crate::scheme::{SCHEMES, Scheme, UrlOption};
pub use crate::semaphore::Semaphore;

/// Runs the body of an `async fn` under a distlock mutex: acquire, run the body with the
/// grant's fencing token, drop the body at once if the lock is lost, release.
///
/// ```
/// use std::time::Duration;
///
/// struct Shop {
///     locks: distlock::Locks,
/// }
///
/// struct Order {
///     concert_id: u64,
///     seats: u32,
/// }
///
/// #[derive(Debug)]
/// enum ShopError {
///     SoldOut,
///     Lock(distlock::Error),
/// }
///
/// impl From<distlock::Error> for ShopError {
///     fn from(error: distlock::Error) -> Self {
///         ShopError::Lock(error)
///     }
/// }
///
/// impl Shop {
///     /// Sells seats of one concert at a time, whichever instance of the shop takes the order.
///     #[distlock::locked(locks = self.locks, name = "concert:{order.concert_id}", wait = "5s", token = fencing_token)]
///     async fn sell(&self, order: Order) -> Result<u64, ShopError> {
///         // Here, and only here, this caller holds `concert:<id>`; pass the token with
///         // every write so that a store can refuse a holder whose lock ran out.
///         if order.seats > 4 {
///             return Err(ShopError::SoldOut);
///         }
///         assert!(self.locks.is_locked(&format!("concert:{}", order.concert_id)).await?);
///         Ok(fencing_token)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ShopError> {
/// let shop = Shop { locks: distlock::connect("memory://").await? };
/// let first = shop.sell(Order { concert_id: 7, seats: 2 }).await?;
/// let second = shop.sell(Order { concert_id: 7, seats: 1 }).await?;
/// assert!(second > first);                                 // fencing tokens grow
/// assert!(matches!(shop.sell(Order { concert_id: 7, seats: 9 }).await, Err(ShopError::SoldOut)));
/// assert!(!shop.locks.is_locked("concert:7").await?);      // released every time
///
/// // Held elsewhere: `busy = "fail"` answers at once with `Error::Timeout`.
/// #[distlock::locked(locks = locks, name = "report/{day}", busy = "fail")]
/// async fn report(locks: &distlock::Locks, day: u32) -> distlock::Result<()> {
///     Ok(())
/// }
/// let held = shop.locks.mutex("report/3")?.acquire().await?;
/// assert!(report(&shop.locks, 3).await.unwrap_err().is_timeout());
/// held.release().await?;
/// report(&shop.locks, 3).await?;
/// # let _ = Duration::ZERO;
/// # Ok(())
/// # }
/// ```
///
/// # Options
///
/// | option | meaning |
/// |---|---|
/// | `locks = EXPR` (required) | the client: an expression giving a [`Locks`], a `&Locks`, an `Arc<Locks>` or anything else that dereferences to one (`self.locks`, an argument, a `static LazyLock<Locks>`) |
/// | `name = "..."` (required) | the lock name, a format string whose placeholders name the function's arguments or their fields: `"concert:{req.concert_id}"`, `"user/{id:04}"`, `"{self.shard}"`; `{{` and `}}` are braces. Built before the body runs |
/// | `wait = "5s"` | give up with [`Error::Timeout`] after waiting this long; a literal with `ms`, `s`, `m` or `h`, or any `Duration` expression. Default: wait without a limit |
/// | `lease = "30s"` | hold for this fixed lease, without renewal ([`AcquireOptions::lease`]); the lock is lost when it ends. Default: the client's lease, renewed |
/// | `busy = "fail"` | try once: [`Error::Timeout`] at once when another holds the lock. `busy = "wait"` is the default; `"fail"` takes no `wait` |
/// | `token = IDENT` | the name the body sees the fencing token (a `u64`) as |
///
/// # Errors
///
/// The function must return a `Result<T, E>` with `E: From<distlock::Error>` (or a
/// [`Result<T>`](crate::Result)). A bad lock name, a failed acquisition ([`Error::Timeout`],
/// a backend error), a loss while the body runs ([`Error::LockLost`]) and a release that
/// found the lock gone are turned into `E` by `From` and returned; the body's own `Result`
/// is returned as is. This is [`Mutex::run_with`]'s contract, which the expansion calls.
///
/// # Lost lock
///
/// If the lock is lost while the body runs, the body is dropped at its next await point and
/// the function returns the loss: no work goes on unprotected.
///
/// # Cancel safety
///
/// Dropping the function's future drops the body and releases the lock in the background,
/// as dropping a [`Guard`] does. `docs/locked.md` says more, with what the attribute
/// expands to.
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use distlock_macros::locked;

/// Connects to the backend a URL names, with default options. See the crate docs for the
/// URLs.
///
/// # Errors
/// - [`Error::InvalidInput`] for a malformed URL or an unknown scheme.
/// - [`Error::FeatureDisabled`] when the backend's cargo feature is not compiled in.
/// - [`Error::Backend`] when the backend cannot be reached or set up.
pub async fn connect(url: &str) -> Result<Locks> {
    connect_with(url, ConnectOptions::default()).await
}

/// Connects with options; see [`ConnectOptions`].
///
/// # Errors
/// As [`connect`], and [`Error::InvalidInput`] for options out of range.
pub async fn connect_with(url: &str, options: ConnectOptions) -> Result<Locks> {
    options.validate()?;
    let backend = open_backend(url).await?;
    Locks::with_backend(backend, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_get_typed_errors() {
        assert!(connect("nonsense").await.unwrap_err().is_invalid_input());
        assert!(connect("ftp://x").await.unwrap_err().is_invalid_input());
        #[cfg(feature = "sqlite")]
        {
            assert!(connect("sqlite://").await.unwrap_err().is_invalid_input());
            let err = connect("sqlite:///no/such/dir/x.db").await.unwrap_err();
            assert!(err.is_invalid_input(), "{err}");
            assert!(err.to_string().contains("does not exist"), "{err}");
        }
        #[cfg(not(feature = "sqlite"))]
        {
            let err = connect("sqlite:///tmp/x.db").await.unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::FeatureDisabled {
                        feature: "sqlite",
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("\"sqlite\""), "{err}");
        }
        #[cfg(not(feature = "mysql"))]
        {
            let err = connect("mariadb://127.0.0.1/").await.unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::FeatureDisabled {
                        feature: "mysql",
                        ..
                    }
                ),
                "{err}"
            );
        }
        #[cfg(not(feature = "redis"))]
        {
            let err = connect("redis://127.0.0.1/").await.unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::FeatureDisabled {
                        feature: "redis",
                        ..
                    }
                ),
                "{err}"
            );
        }
        let err = connect_with("memory://", ConnectOptions::new().lease(Duration::ZERO))
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
    }

    use std::time::Duration;
}

/// The README's examples, compiled and run as doc tests so that the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
