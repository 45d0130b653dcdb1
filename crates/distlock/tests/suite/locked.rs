//! `#[distlock::locked]` on the memory and SQLite backends. Each case names the promise it
//! checks: 1 at most one holder per name; 2 `lost()` fires before anyone else can be
//! granted, so no work continues unprotected; 3 fencing tokens grow strictly with every
//! grant; 4 a cancelled or retried request leaves nothing behind; 5 stock never oversells.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex as StdMutex, OnceLock};
use std::time::{Duration, Instant};

use distlock::{ConnectOptions, Locks, LossReason};
use tokio::sync::{Barrier, oneshot};

/// The most any case may take; every await that can hang is under it.
const LIMIT: Duration = Duration::from_secs(30);

async fn within<T>(work: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, work)
        .await
        .expect("the case did not finish in time")
}

async fn memory() -> Locks {
    distlock::connect("memory://")
        .await
        .expect("memory backend")
}

/// Polls until nobody holds `name`.
async fn wait_until_free(locks: &Locks, name: &str) {
    within(async {
        while locks.is_locked(name).await.expect("is_locked") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// An application's error, as a `#[locked]` function returns it.
#[derive(Debug)]
enum AppError {
    Lock(distlock::Error),
    Refused(&'static str),
}

impl From<distlock::Error> for AppError {
    fn from(error: distlock::Error) -> Self {
        AppError::Lock(error)
    }
}

impl AppError {
    fn lock_error(self) -> distlock::Error {
        match self {
            AppError::Lock(error) => error,
            AppError::Refused(why) => panic!("expected a lock error, got the refusal {why:?}"),
        }
    }
}

/// A value read, then written back after a pause: two writers at once lose an update.
#[derive(Default)]
struct SlowCounter(StdMutex<u64>);

impl SlowCounter {
    async fn increment(&self) {
        let seen = *self.0.lock().unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        *self.0.lock().unwrap() = seen + 1;
    }

    fn get(&self) -> u64 {
        *self.0.lock().unwrap()
    }
}

#[distlock::locked(locks = locks, name = "counter/{shard}")]
async fn increment(locks: &Locks, shard: u32, counter: Arc<SlowCounter>) -> Result<(), AppError> {
    counter.increment().await;
    Ok(())
}

/// Promise 1: 50 concurrent calls on one name never overlap, and the lock is free after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_per_name() {
    let locks = memory().await;
    let counter = Arc::new(SlowCounter::default());
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (locks, counter) = (locks.clone(), counter.clone());
        calls.spawn(async move { increment(&locks, 1, counter).await });
    }
    within(async {
        while let Some(done) = calls.join_next().await {
            done.expect("task").expect("call");
        }
    })
    .await;
    assert_eq!(counter.get(), 50);
    assert!(!locks.is_locked("counter/1").await.unwrap());
}

#[distlock::locked(locks = locks, name = "meet/{id}")]
async fn meet(locks: Locks, id: u32, barrier: Arc<Barrier>) -> Result<u32, AppError> {
    barrier.wait().await;
    Ok(id)
}

/// Promise 1, its other side: calls on different names hold their locks at the same time
/// (each waits inside its body for the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_names_run_at_once() {
    let locks = memory().await;
    let barrier = Arc::new(Barrier::new(2));
    let (a, b) = within(async {
        tokio::join!(
            meet(locks.clone(), 1, barrier.clone()),
            meet(locks.clone(), 2, barrier.clone())
        )
    })
    .await;
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
}

#[distlock::locked(locks = locks, name = "tokens", token = fencing_token)]
async fn token_of(locks: &Locks) -> distlock::Result<u64> {
    Ok(fencing_token)
}

/// Promise 3: the token the body sees grows strictly with every call.
#[tokio::test]
async fn tokens_grow() {
    let locks = memory().await;
    let mut last = 0;
    for _ in 0..5 {
        let token = within(token_of(&locks)).await.unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
}

struct Order {
    concert_id: u64,
    row: char,
}

#[distlock::locked(locks = locks, name = "concert:{req.concert_id}")]
async fn concert_held(locks: &Locks, req: Order) -> Result<(bool, bool), AppError> {
    let _ = req.row;
    Ok((
        locks.is_locked("concert:7").await?,
        locks.is_locked("concert:8").await?,
    ))
}

#[distlock::locked(locks = locks, name = "seat:{req.row}-{seat:03}/{{x}}")]
async fn seat_held(locks: &Locks, req: Order, seat: u32) -> Result<bool, AppError> {
    Ok(locks.is_locked("seat:B-005/{x}").await?)
}

/// Promise 1, on the right name: the name comes from a field, an argument and a format
/// spec, and the body runs while exactly that name is held.
#[tokio::test]
async fn name_from_fields_arguments_and_specs() {
    let locks = memory().await;
    let order = Order {
        concert_id: 7,
        row: 'A',
    };
    assert_eq!(
        within(concert_held(&locks, order)).await.unwrap(),
        (true, false)
    );
    let order = Order {
        concert_id: 1,
        row: 'B',
    };
    assert!(within(seat_held(&locks, order, 5)).await.unwrap());
    assert!(!locks.is_locked("concert:7").await.unwrap());
    assert!(!locks.is_locked("seat:B-005/{x}").await.unwrap());
}

#[distlock::locked(locks = locks, name = "busy/{id}", busy = "fail")]
async fn try_once(locks: &Locks, id: u32, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// Promise 1: `busy = "fail"` answers `Timeout` at once while another holds the name, and
/// does not run the body.
#[tokio::test]
async fn busy_fail_tries_once() {
    let locks = memory().await;
    let ran = AtomicBool::new(false);
    let held = locks.mutex("busy/1").unwrap().acquire().await.unwrap();
    let start = Instant::now();
    let error = within(try_once(&locks, 1, &ran)).await.unwrap_err();
    assert!(error.lock_error().is_timeout());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(!ran.load(Ordering::SeqCst));
    held.release().await.unwrap();
    within(try_once(&locks, 1, &ran)).await.unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[distlock::locked(locks = locks, name = "wait", wait = "100ms")]
async fn wait_briefly(locks: &Locks) -> Result<(), AppError> {
    Ok(())
}

/// Promise 1: `wait = "100ms"` gives up with `Timeout` after about that long.
#[tokio::test]
async fn wait_limit_times_out() {
    let locks = memory().await;
    let held = locks.mutex("wait").unwrap().acquire().await.unwrap();
    let start = Instant::now();
    let error = within(wait_briefly(&locks)).await.unwrap_err();
    let waited = start.elapsed();
    assert!(error.lock_error().is_timeout());
    assert!(waited >= Duration::from_millis(90), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    held.release().await.unwrap();
    within(wait_briefly(&locks)).await.unwrap();
}

#[distlock::locked(locks = locks, name = "short-lease", lease = "300ms")]
async fn outlive_lease(locks: &Locks, finished: Arc<AtomicBool>) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

/// Promise 2: a body that outlives its fixed lease is dropped when the lock is lost, the
/// call answers `LockLost`, and the work after the loss never happens.
#[tokio::test]
async fn lost_lease_stops_the_body() {
    let locks = memory().await;
    let finished = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let error = within(outlive_lease(&locks, finished.clone()))
        .await
        .unwrap_err()
        .lock_error();
    let took = start.elapsed();
    assert!(
        matches!(
            error,
            distlock::Error::LockLost {
                reason: LossReason::LeaseRanOut,
                ..
            }
        ),
        "{error}"
    );
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Another caller gets the lock now; the dropped body never writes.
    let guard = within(locks.mutex("short-lease").unwrap().acquire())
        .await
        .unwrap();
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!finished.load(Ordering::SeqCst));
}

#[distlock::locked(locks = locks, name = "forced")]
async fn work_until_forced(
    locks: &Locks,
    started: oneshot::Sender<()>,
    finished: Arc<AtomicBool>,
) -> Result<(), AppError> {
    let _ = started.send(());
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

/// Promise 2: an operator's force-unlock is noticed at the next renewal; the body is dropped
/// and the call answers `LockLost`.
#[tokio::test]
async fn force_unlock_stops_the_body() {
    // A 300 ms client lease renews every 100 ms, so the loss is noticed within that.
    let options = ConnectOptions::new().lease(Duration::from_millis(300));
    let locks = distlock::connect_with("memory://", options).await.unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let (started, is_started) = oneshot::channel();
    let call = tokio::spawn({
        let (locks, finished) = (locks.clone(), finished.clone());
        async move { work_until_forced(&locks, started, finished).await }
    });
    within(is_started).await.unwrap();
    assert!(locks.force_unlock("forced").await.unwrap());
    let start = Instant::now();
    let error = within(call).await.unwrap().unwrap_err().lock_error();
    assert!(error.is_lock_lost(), "{error}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(!finished.load(Ordering::SeqCst));
}

#[distlock::locked(locks = locks, name = "cancel")]
async fn hold_forever(locks: &Locks, started: Option<oneshot::Sender<()>>) -> Result<(), AppError> {
    if let Some(started) = started {
        let _ = started.send(());
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// Promise 4: a call dropped while it waits for the lock leaves nothing behind.
#[tokio::test]
async fn cancelled_while_waiting_leaves_nothing() {
    let locks = memory().await;
    let held = locks.mutex("cancel").unwrap().acquire().await.unwrap();
    let waiting =
        tokio::time::timeout(Duration::from_millis(100), hold_forever(&locks, None)).await;
    assert!(waiting.is_err(), "the call should still be waiting");
    held.release().await.unwrap();
    wait_until_free(&locks, "cancel").await;
    let guard = within(
        locks
            .mutex("cancel")
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(1))),
    )
    .await
    .unwrap();
    guard.release().await.unwrap();
}

/// Promise 4: a call dropped while its body runs releases the lock (in the background).
#[tokio::test]
async fn cancelled_while_running_leaves_nothing() {
    let locks = memory().await;
    let (started, is_started) = oneshot::channel();
    let call = tokio::spawn({
        let locks = locks.clone();
        async move { hold_forever(&locks, Some(started)).await }
    });
    within(is_started).await.unwrap();
    assert!(locks.is_locked("cancel").await.unwrap());
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    wait_until_free(&locks, "cancel").await;
    let guard = within(
        locks
            .mutex("cancel")
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(1))),
    )
    .await
    .unwrap();
    guard.release().await.unwrap();
}

/// Where a `#[locked]` function finds its `Locks`: a field, an `Arc` field, a static.
struct Tickets {
    locks: Locks,
    shared: Arc<Locks>,
    shard: u32,
}

static LAZY_LOCKS: LazyLock<Locks> = LazyLock::new(|| {
    Locks::with_backend(
        Arc::new(distlock::memory::MemoryBackend::new()),
        ConnectOptions::default(),
    )
    .expect("memory client")
});

static SET_LOCKS: OnceLock<Locks> = OnceLock::new();

impl Tickets {
    #[distlock::locked(locks = self.locks, name = "tickets/{self.shard}/{n}", token = t)]
    async fn by_field(&self, n: u32) -> Result<u64, AppError> {
        assert!(
            self.locks
                .is_locked(&format!("tickets/{}/{n}", self.shard))
                .await?
        );
        Ok(t)
    }

    #[distlock::locked(locks = self.shared, name = "shared/{self.shard}")]
    async fn by_arc_field(&self) -> Result<bool, AppError> {
        Ok(self.shared.is_locked("shared/3").await?)
    }

    /// Takes `self` by value: the body owns it.
    #[distlock::locked(locks = self.shared, name = "owned/{self.shard}")]
    pub(crate) async fn into_shard(self) -> Result<u32, AppError> {
        Ok(self.shard)
    }
}

#[distlock::locked(locks = LAZY_LOCKS, name = "lazy")]
async fn by_lazy_static() -> Result<bool, AppError> {
    Ok(LAZY_LOCKS.is_locked("lazy").await?)
}

#[distlock::locked(locks = &*LAZY_LOCKS, name = "lazy-ref")]
async fn by_lazy_static_ref() -> Result<bool, AppError> {
    Ok(LAZY_LOCKS.is_locked("lazy-ref").await?)
}

#[distlock::locked(locks = SET_LOCKS.get().expect("set"), name = "once")]
async fn by_once_lock() -> Result<bool, AppError> {
    Ok(SET_LOCKS.get().expect("set").is_locked("once").await?)
}

/// Promise 1 through every way of naming the client: the body runs holding its lock.
#[tokio::test]
async fn locks_from_fields_arcs_and_statics() {
    let locks = memory().await;
    let tickets = Tickets {
        locks: locks.clone(),
        shared: Arc::new(locks.clone()),
        shard: 3,
    };
    let first = within(tickets.by_field(1)).await.unwrap();
    assert!(within(tickets.by_field(1)).await.unwrap() > first);
    assert!(within(tickets.by_arc_field()).await.unwrap());
    assert_eq!(within(tickets.into_shard()).await.unwrap(), 3);
    assert!(!locks.is_locked("owned/3").await.unwrap());

    assert!(within(by_lazy_static()).await.unwrap());
    assert!(within(by_lazy_static_ref()).await.unwrap());
    assert!(!LAZY_LOCKS.is_locked("lazy").await.unwrap());
    assert!(SET_LOCKS.set(memory().await).is_ok(), "set once");
    assert!(within(by_once_lock()).await.unwrap());
}

#[distlock::locked(locks = locks, name = "parse/{text}")]
async fn parse_under_lock(locks: &Locks, text: &str, mut tries: u32) -> Result<u32, AppError> {
    tries += 1;
    if text.is_empty() {
        return Err(AppError::Refused("empty"));
    }
    let number: u32 = text
        .parse()
        .map_err(|_| AppError::Refused("not a number"))?;
    if number == 0 {
        return Ok(tries);
    }
    let held = locks.is_locked(&format!("parse/{text}")).await?;
    Ok(number + u32::from(held))
}

/// Promise 4: `?` and `return` leave the body early with the body's own answer, and the lock
/// is released on every path.
#[tokio::test]
async fn question_mark_and_return() {
    let locks = memory().await;
    assert_eq!(within(parse_under_lock(&locks, "41", 0)).await.unwrap(), 42);
    assert_eq!(within(parse_under_lock(&locks, "0", 6)).await.unwrap(), 7);
    assert!(matches!(
        within(parse_under_lock(&locks, "x", 0)).await,
        Err(AppError::Refused("not a number"))
    ));
    let error = within(parse_under_lock(&locks, "", 0)).await;
    assert!(
        matches!(error, Err(AppError::Refused("empty"))),
        "{error:?}"
    );
    for text in ["41", "0", "x", ""] {
        assert!(!locks.is_locked(&format!("parse/{text}")).await.unwrap());
    }
}

#[distlock::locked(locks = locks, name = "{name}")]
async fn named(locks: &Locks, name: &str) -> Result<(), AppError> {
    Ok(())
}

/// A name `Locks::mutex` refuses is an error through `From`, before the body runs.
#[tokio::test]
async fn bad_name_is_an_error() {
    let locks = memory().await;
    let error = within(named(&locks, "")).await.unwrap_err().lock_error();
    assert!(error.is_invalid_input(), "{error}");
}

/// A stock whose check and write are separate steps, as in a real store.
struct Shelf {
    left: StdMutex<i64>,
    sold: AtomicU32,
}

#[distlock::locked(locks = locks, name = "stock/{item}", wait = "20s")]
async fn buy(locks: &Locks, item: &str, shelf: &Shelf) -> Result<bool, AppError> {
    let left = *shelf.left.lock().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    if left < 1 {
        return Ok(false);
    }
    *shelf.left.lock().unwrap() = left - 1;
    shelf.sold.fetch_add(1, Ordering::SeqCst);
    Ok(true)
}

/// Promise 5: 30 buyers for 10 items on an SQLite lock file sell exactly 10.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_never_oversells_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let locks = distlock::connect(&url).await.unwrap();
    let shelf = Arc::new(Shelf {
        left: StdMutex::new(10),
        sold: AtomicU32::new(0),
    });
    let mut buyers = tokio::task::JoinSet::new();
    for _ in 0..30 {
        let (locks, shelf) = (locks.clone(), shelf.clone());
        buyers.spawn(async move { buy(&locks, "pen", &shelf).await });
    }
    let mut bought = 0;
    within(async {
        while let Some(done) = buyers.join_next().await {
            bought += u32::from(done.expect("task").expect("call"));
        }
    })
    .await;
    assert_eq!(bought, 10);
    assert_eq!(shelf.sold.load(Ordering::SeqCst), 10);
    assert_eq!(*shelf.left.lock().unwrap(), 0);
    assert!(!locks.is_locked("stock/pen").await.unwrap());
}

#[distlock::locked(locks = locks, name = "plain/{mutex}", token = value)]
async fn same_names_as_the_expansion(
    locks: &Locks,
    mutex: u32,
    error: u32,
    outcome: u32,
) -> Result<(u32, u32, u32, bool), AppError> {
    Ok((mutex, error, outcome, value > 0))
}

/// Arguments named as the expansion's own variables are still the arguments in the body.
#[tokio::test]
async fn arguments_keep_their_names() {
    let locks = memory().await;
    let answer = within(same_names_as_the_expansion(&locks, 1, 2, 3))
        .await
        .unwrap();
    assert_eq!(answer, (1, 2, 3, true));
}

#[distlock::locked(locks = locks, name = "impl-trait/{id}", token = token)]
async fn described(locks: &Locks, id: u32) -> Result<impl std::fmt::Display, AppError> {
    Ok(format!("{id} under token {token}"))
}

/// A return type with `impl Trait` in it (an axum handler's `impl IntoResponse`) compiles,
/// and the body still runs under the lock.
#[tokio::test]
async fn impl_trait_in_the_return_type() {
    let locks = memory().await;
    let answer = within(described(&locks, 3)).await.unwrap();
    assert!(answer.to_string().starts_with("3 under token "), "{answer}");
}
