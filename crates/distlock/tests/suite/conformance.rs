//! The conformance suite on every backend compiled into this crate, and behaviour specific
//! to one backend.

use distlock::conformance::Target;
#[cfg(feature = "redis")]
use distlock::conformance::servers;

#[cfg(feature = "blocking")]
mod blocking;

fn memory() -> Target {
    // A named store, so that the two clients a case connects share it.
    Target::new(format!(
        "memory://conformance-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ))
}

#[cfg(feature = "sqlite")]
fn sqlite(query: &str) -> Target {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}{query}", dir.path().join("locks.db").display());
    Target::with_resource(url, dir)
}

/// The Redis server `scripts/test` starts, under `scheme` (`redis`, `redis+spin`).
#[cfg(feature = "redis")]
fn redis(scheme: &str) -> String {
    servers::with_scheme(&servers::REDIS.url(), scheme)
}

#[cfg(feature = "redis")]
fn redis_sentinel() -> String {
    servers::REDIS_SENTINEL.url()
}

#[cfg(feature = "redis")]
fn redis_cluster() -> String {
    servers::REDIS_CLUSTER.url()
}

#[cfg(feature = "redis")]
fn redis_tls() -> String {
    servers::REDIS_TLS.url()
}

distlock::conformance_suite!(memory, memory());
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_tls, Target::new(redis_tls()));
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_sentinel, Target::new(redis_sentinel()));
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_cluster, Target::new(redis_cluster()));
#[cfg(feature = "redis")]
distlock::conformance_suite!(
    redis_cluster_spin,
    Target::new(servers::with_query(&redis_cluster(), "spin=true"))
);
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis, Target::new(redis("redis")));
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_spin, Target::new(redis("redis+spin")));
#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_unfair, Target::new(redis_unfair()));
/// The lock over a `redis::Client` the application already has, opened through a factory as a
/// backend outside this crate would be.
#[cfg(feature = "redis")]
fn redis_from_client() -> Target {
    let url = redis("redis");
    Target::from_factory(format!("{url} (from a client)"), move || {
        let client = ::redis::Client::open(url.as_str()).expect("a valid Redis URL");
        async move {
            let backend = distlock::redis::RedisBackend::from_client(client).await?;
            let backend: std::sync::Arc<dyn distlock::backend::Backend> =
                std::sync::Arc::new(backend);
            Ok(backend)
        }
    })
}

#[cfg(feature = "redis")]
distlock::conformance_suite!(redis_from_client, redis_from_client());
#[cfg(feature = "redis")]
distlock::wire_fault_suite!(redis_wire, Target::new(redis("redis")));
#[cfg(feature = "redis")]
distlock::wire_fault_suite!(redis_spin_wire, Target::new(redis("redis+spin")));
#[cfg(feature = "redis")]
distlock::wire_fault_suite!(redis_unfair_wire, Target::new(redis_unfair()));

/// The Redisson race: `?fair=false`.
#[cfg(feature = "redis")]
fn redis_unfair() -> String {
    servers::with_query(&redis("redis"), "fair=false")
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(redis("redis"))).await;
}

/// TLS checks the server: without the CA that signed its certificate, or with a CA file that
/// cannot be read, the connection is refused with an error that says why.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_tls_refuses_a_server_it_cannot_verify() {
    let url = redis_tls();
    let without_ca = url.split('?').next().unwrap_or_default().to_owned();
    let err = distlock::connect(&without_ca).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "the error does not say the certificate was refused: {err}"
    );
    let err = distlock::connect(&format!("{without_ca}?ca=/nonexistent/ca.pem"))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&Target::new(redis_cluster())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_waiters_are_served_in_order() {
    distlock::conformance::fair_waiters_are_served_in_order(&memory()).await;
}
#[cfg(feature = "sqlite")]
distlock::conformance_suite!(sqlite, sqlite(""));
#[cfg(feature = "sqlite")]
distlock::conformance_suite!(sqlite_unfair, sqlite("?fair=false"));

/// Checks for fair backends, shared by the SQLite and Redis tests below.
#[cfg(any(feature = "sqlite", feature = "redis"))]
mod fair_checks {
    use std::time::Duration;

    use distlock::backend::{Acquired, Backend};

    /// The mechanism, without timing: with a waiter queued, a newcomer is refused a free lock
    /// in fair mode and granted it without.
    pub async fn queued_waiter_reserves_a_free_lock(backend: &dyn Backend, name: &str, fair: bool) {
        let locks = distlock::connect("memory://").await.unwrap();
        let (waiter, newcomer) = (locks.holder(), locks.holder());
        let name = distlock::LockName::new(name).unwrap();
        let lease = Duration::from_secs(5);
        let queued = backend
            .subscribe(&name, waiter.owner(), lease)
            .await
            .unwrap();
        let answer = backend
            .try_acquire(&name, newcomer.owner(), lease)
            .await
            .unwrap();
        if fair {
            assert_eq!(
                answer,
                Acquired::Held { ttl: None },
                "fair mode let a newcomer in"
            );
            let first = backend
                .try_acquire(&name, waiter.owner(), lease)
                .await
                .unwrap();
            assert!(matches!(first, Acquired::Granted { .. }), "{first:?}");
        } else {
            assert!(matches!(answer, Acquired::Granted { .. }), "{answer:?}");
        }
        drop(queued);
        backend.force_unlock(&name).await.unwrap();
    }

    /// A waiter queues for `name` and vanishes without leaving the queue (its runtime is
    /// leaked with it); the next acquirer must get the lock within `bound` of its release.
    pub async fn abandoned_waiter_delays_at_most(url: &str, name: &str, bound: Duration) {
        let locks = distlock::connect(url).await.unwrap();
        let held = locks.mutex(name).unwrap().acquire().await.unwrap();
        let (url_owned, abandoned) = (url.to_owned(), name.to_owned());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let locks = distlock::connect(&url_owned).await.unwrap();
                let mutex = locks.mutex(abandoned).unwrap();
                let _ = tokio::time::timeout(Duration::from_millis(300), mutex.acquire()).await;
            });
            std::mem::forget(runtime);
        })
        .join()
        .unwrap();
        held.release().await.unwrap();
        let start = std::time::Instant::now();
        let guard = locks
            .mutex(name)
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
            .await
            .expect("an abandoned waiter blocked the lock");
        assert!(start.elapsed() < bound, "{:?}", start.elapsed());
        guard.release().await.unwrap();
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_fair_mode {
    use std::time::Duration;

    use super::fair_checks;
    use super::sqlite;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn waiters_are_served_in_order() {
        let target = sqlite("");
        distlock::conformance::fair_waiters_are_served_in_order(&target).await;
    }

    #[tokio::test]
    async fn a_queued_waiter_reserves_a_free_lock_only_in_fair_mode() {
        for (query, fair) in [("", true), ("?fair=false", false)] {
            let target = sqlite(query);
            let path = target
                .url()
                .expect("an SQLite target has a URL")
                .trim_start_matches("sqlite://")
                .to_owned();
            let backend = distlock::sqlite::SqliteBackend::open(&path).await.unwrap();
            fair_checks::queued_waiter_reserves_a_free_lock(&backend, "reserved", fair).await;
        }
    }

    /// A stale ticket (1 s) delays a free lock by at most about that, never for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_abandoned_ticket_goes_stale() {
        let target = sqlite("");
        fair_checks::abandoned_waiter_delays_at_most(
            target.url().expect("an SQLite target has a URL"),
            "stale",
            Duration::from_millis(1500),
        )
        .await;
    }
}

#[cfg(feature = "redis")]
mod redis_server_loss {
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use distlock::ConnectOptions;

    /// A redis-server of this test's own on a free loopback port, ended when dropped.
    struct OwnRedis {
        child: Child,
        port: u16,
    }

    impl OwnRedis {
        fn start() -> Self {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server is installed (scripts/test installs it)");
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "redis-server did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            OwnRedis { child, port }
        }
    }

    impl Drop for OwnRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// A waiter whose pub/sub connection is cut (as Sentinel does to every client of a
    /// demoted master) is woken by the next release all the same: the client opens a new
    /// connection by itself instead of leaving the waiter to sleep out the holder's lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_hears_releases_after_its_pub_sub_connection_is_cut() {
        let server = OwnRedis::start();
        // Unfair mode: a waiter relies on the announcement alone until the holder's lease
        // (30 s) runs out; fair mode would also ask every 250 ms.
        let url = format!("redis://127.0.0.1:{}/?fair=false", server.port);
        let holder = distlock::connect(&url).await.unwrap();
        let waiter = distlock::connect(&url).await.unwrap();
        let guard = holder.mutex("cut").unwrap().acquire().await.unwrap();
        let waiting = tokio::spawn(async move {
            let options = distlock::AcquireOptions::new().wait(Duration::from_secs(20));
            let started = Instant::now();
            let guard = waiter.mutex("cut").unwrap().acquire_with(options).await;
            (guard.map(|g| g.fencing_token()), started.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed = Command::new("redis-cli")
            .args([
                "-p",
                &server.port.to_string(),
                "client",
                "kill",
                "type",
                "pubsub",
            ])
            .output()
            .expect("redis-cli runs");
        assert_eq!(String::from_utf8_lossy(&killed.stdout).trim(), "1");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (granted, _) = waiting.await.unwrap();
        assert!(granted.is_ok(), "{granted:?}");
        assert!(
            released.elapsed() < Duration::from_secs(2),
            "the waiter was granted {:?} after the release: it slept out the lease",
            released.elapsed()
        );
    }

    /// A release announced while the waiter's pub/sub connection is down (cut, not yet
    /// opened again) is not slept through: when the connection is back, every waiter looks
    /// again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_during_the_pub_sub_reconnect_wakes_the_waiter() {
        let server = OwnRedis::start();
        let url = format!("redis://127.0.0.1:{}/?fair=false", server.port);
        let holder = distlock::connect(&url).await.unwrap();
        let waiter = distlock::connect(&url).await.unwrap();
        let guard = holder.mutex("gap").unwrap().acquire().await.unwrap();
        let waiting = tokio::spawn(async move {
            let options = distlock::AcquireOptions::new().wait(Duration::from_secs(20));
            waiter
                .mutex("gap")
                .unwrap()
                .acquire_with(options)
                .await
                .map(|g| g.fencing_token())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed = Command::new("redis-cli")
            .args([
                "-p",
                &server.port.to_string(),
                "client",
                "kill",
                "type",
                "pubsub",
            ])
            .output()
            .expect("redis-cli runs");
        assert_eq!(String::from_utf8_lossy(&killed.stdout).trim(), "1");
        // Within the 50 ms before the client opens its pub/sub connection again.
        let released = Instant::now();
        guard.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(25), waiting)
            .await
            .expect("the waiter hung")
            .unwrap();
        assert!(granted.is_ok(), "{granted:?}");
        assert!(
            released.elapsed() < Duration::from_secs(3),
            "the waiter was granted {:?} after a release it missed: it slept out the lease",
            released.elapsed()
        );
    }

    /// When the server goes away, renewals fail and `lost()` fires once the lease the client
    /// last secured has run out: within one lease of the server's death, never "never".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_fires_when_the_server_is_gone_for_a_lease() {
        let mut server = OwnRedis::start();
        let url = format!("redis://127.0.0.1:{}/", server.port);
        let lease = Duration::from_millis(600);
        let locks = distlock::connect_with(&url, ConnectOptions::new().lease(lease))
            .await
            .unwrap();
        let guard = locks.mutex("server-loss").unwrap().acquire().await.unwrap();
        tokio::time::sleep(lease).await;
        assert!(!guard.is_lost(), "lost while the server was up");
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let killed = Instant::now();
        let lost = tokio::time::timeout(lease * 5, guard.lost())
            .await
            .expect("lost() never fired with the server gone");
        assert!(lost.is_lock_lost());
        let after = killed.elapsed();
        assert!(
            after <= lease + Duration::from_millis(300),
            "lost {after:?} after the kill"
        );
    }
}

#[cfg(feature = "redis")]
mod redis_fair_mode {
    use std::time::Duration;

    use super::fair_checks;
    use super::{redis, redis_unfair};

    #[tokio::test]
    async fn a_queued_waiter_reserves_a_free_lock_only_in_fair_mode() {
        for (target, fair) in [(redis("redis"), true), (redis_unfair(), false)] {
            let backend = distlock::redis::RedisBackend::connect(&target)
                .await
                .unwrap();
            let name = format!("reserved/{}", fastrand::u64(..));
            fair_checks::queued_waiter_reserves_a_free_lock(&backend, &name, fair).await;
        }
    }

    /// Promise 2 for a handed-over grant: when the request that extends its short handover
    /// lease (1 s) fails, the new holder's `lost()` fires by the end of that short lease (the
    /// keeper is woken for it), not a renewal interval (lease / 3) later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn promise2_a_failed_handover_confirmation_fires_lost_by_the_handover_lease() {
        use distlock::fault::{Fault, FaultyBackend, Method};

        let target = redis("redis");
        let name = format!("handover-lost/{}", fastrand::u64(..));
        let holder = distlock::connect(&target).await.unwrap();
        let held = crate::common::hold(&holder, name.as_str()).await;
        let faulty = FaultyBackend::new(distlock::open_backend(&target).await.unwrap());
        // Every extension fails, so the handover is never confirmed.
        faulty.set(Method::Extend, Fault::Fail(Duration::ZERO));
        let waiter =
            distlock::Locks::with_backend(faulty.clone(), distlock::ConnectOptions::new()).unwrap();
        let waiting = tokio::spawn({
            let mutex = waiter.mutex(name.as_str()).unwrap();
            async move {
                mutex
                    .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(10)))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter hung")
            .unwrap()
            .expect("the waiter was not granted the lock");
        let granted_at = std::time::Instant::now();
        let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
        assert!(
            faulty.faulted(Method::Extend) >= 1,
            "no confirmation was attempted"
        );
        assert!(
            lost.is_ok(),
            "lost() did not fire although the handover was never confirmed"
        );
        let after = granted_at.elapsed();
        assert!(
            after <= Duration::from_millis(1300),
            "lost() fired {after:?} after the handover, past its 1 s lease"
        );
    }

    /// A release hands the lock straight to the first waiter: it holds the lock (one hold,
    /// the grant's token) when its wait returns, without asking; a waiter that missed the
    /// announcement takes the lock at its next refresh; a waiter dropped before taking it
    /// gives it back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_hands_the_lock_to_the_first_waiter() {
        use distlock::backend::{Acquired, Backend, Woken};

        let target = redis("redis");
        let backend = distlock::redis::RedisBackend::connect(&target)
            .await
            .unwrap();
        let locks = distlock::connect("memory://").await.unwrap();
        let name = distlock::LockName::new(format!("handover/{}", fastrand::u64(..))).unwrap();
        let lease = Duration::from_secs(30);
        let holder = locks.holder();
        let hold = || async {
            let granted = backend.try_acquire(&name, holder.owner(), lease).await;
            assert!(
                matches!(granted, Ok(Acquired::Granted { .. })),
                "{granted:?}"
            );
        };
        for missed_announcement in [false, true] {
            hold().await;
            let waiter = locks.holder();
            let mut queued = backend
                .subscribe(&name, waiter.owner(), lease)
                .await
                .unwrap();
            backend.release(&name, holder.owner()).await.unwrap();
            assert_eq!(backend.holds(&name, waiter.owner()).await.unwrap(), 1);
            if missed_announcement {
                // Past the refresh interval the waiter refreshes first, which takes the lock.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let woken = queued.wait(Duration::from_secs(5)).await;
            let Woken::Granted {
                lease: handover, ..
            } = woken
            else {
                panic!("the first waiter was not handed the lock: {woken:?}");
            };
            assert!(handover <= Duration::from_secs(1), "{handover:?}");
            drop(queued);
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Dropping a waiter that took the lock keeps it.
            assert_eq!(backend.holds(&name, waiter.owner()).await.unwrap(), 1);
            backend.release(&name, waiter.owner()).await.unwrap();
        }

        hold().await;
        let waiter = locks.holder();
        let queued = backend
            .subscribe(&name, waiter.owner(), lease)
            .await
            .unwrap();
        backend.release(&name, holder.owner()).await.unwrap();
        assert_eq!(backend.holds(&name, waiter.owner()).await.unwrap(), 1);
        drop(queued);
        let start = std::time::Instant::now();
        while backend.is_locked(&name).await.unwrap() {
            assert!(
                start.elapsed() < Duration::from_millis(500),
                "a waiter dropped before taking its lock kept it"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A waiter not seen for 1 s is skipped: it delays a free lock by about that.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_abandoned_waiter_goes_stale() {
        let target = redis("redis");
        let name = format!("stale/{}", fastrand::u64(..));
        fair_checks::abandoned_waiter_delays_at_most(&target, &name, Duration::from_millis(2000))
            .await;
    }
}
