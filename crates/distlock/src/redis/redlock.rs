//! Redlock: one lock over an odd number of independent Redis masters, held while a majority
//! of them holds it, with fencing tokens agreed by that majority.
//!
//! Each master keeps the standalone lock's keys (`distlock:{<name>}:lock`, `:fence`,
//! `:released`) and runs its scripts. An acquisition asks the name's **gate** first: the
//! masters are ordered by address and each name starts at its own one (a hash of the name),
//! so that contenders meet at the same master and one of them wins there; a gate that does not
//! answer is passed over (and asked first by nobody in this client for a second). A gate that
//! says "held" ends the attempt: no split votes, no releasing and retrying in lockstep. The
//! winner then asks every other master at once, with the gate's token as a floor; it holds
//! the lock when a majority granted, every master of that majority carries the same token
//! (the largest granted: masters whose own counter was further get a second script that raises
//! the others, see [`RedlockBackend::try_acquire`]), and the lease has not run out meanwhile.
//! Otherwise it gives back what it got.
//!
//! Every master keeps a lock `lease × (1 + clock_drift) + 2 ms`, so that a master whose clock
//! runs fast by up to that share still keeps it for the whole lease the client counts. Each
//! request to a master may take `request_timeout`; a master that does not answer in time
//! counts as not granting. Release, extension and renewal go to every master; a renewal
//! holds while a majority renewed. Waiters listen for releases on every master.
//!
//! See `docs/backends/redis.md` for the argument behind the fencing tokens and the limits.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use tokio::time::Instant;

use self::quorum::{Answers, AnyMaster};
use self::url::RedlockUrl;
use super::scripts::RedlockScripts;
use super::waiter::RedisWaiter;
use super::{Keys, RedisBackend, millis};
use crate::backend::{
    Acquired, Backend, Extended, LockInfo, Owner, Published, ReleaseWaiter, Released, Renewing,
};
use crate::error::{Error, Result};
use crate::name::LockName;

mod attempt;
mod quorum;
mod url;

const SCHEME: &str = "redlock";

/// How long one master's SCAN for [`Backend::list_held`] may take: it walks the master's
/// whole keyspace, which the request timeout is not meant for.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The part of the drift allowance that does not grow with the lease.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// One master; one that was down at connect time is connected by a background task.
struct Master {
    url: String,
    redis: std::sync::OnceLock<RedisBackend>,
    /// A background task is connecting.
    connecting: std::sync::atomic::AtomicBool,
    /// Milliseconds after the backend's epoch until which this master is not asked first.
    passed_over_until: AtomicU64,
}

/// The Redlock over independent masters.
#[derive(Clone)]
pub struct RedlockBackend {
    masters: Arc<[Master]>,
    quorum: usize,
    request_timeout: Duration,
    clock_drift: f64,
    scripts: Arc<RedlockScripts>,
    epoch: Instant,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("masters", &self.masters.len())
            .field("request_timeout", &self.request_timeout)
            .field("clock_drift", &self.clock_drift)
            .finish_non_exhaustive()
    }
}

/// Connects to the masters a `redlock://` URL names; see [`RedlockBackend::connect`].
///
/// # Errors
/// As [`RedlockBackend::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(RedlockBackend::connect(url).await?))
}

/// Checks a URL as connecting would, without connecting ([`crate::validate_url`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    RedlockUrl::parse(url).map(|_| ())
}

impl RedlockBackend {
    /// Connects to every master of a `redlock://h1:port,h2:port,h3:port/` URL.
    ///
    /// A master that cannot be reached now is connected later, when it comes back; the
    /// connection fails only when fewer than a majority answer.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL (fewer than 3 masters, an even number, a
    /// master named twice, an option out of range); [`Error::NotAuthorized`] when no majority
    /// could be reached and a master refused the URL's credentials; [`Error::Backend`] when a
    /// majority cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = RedlockUrl::parse(url)?;
        let masters: Vec<Master> = url
            .masters
            .iter()
            .map(|master| Master {
                url: format!("{master}{}fair=false", query_joiner(master)),
                redis: std::sync::OnceLock::new(),
                connecting: std::sync::atomic::AtomicBool::new(false),
                passed_over_until: AtomicU64::new(0),
            })
            .collect();
        let backend = RedlockBackend {
            quorum: masters.len() / 2 + 1,
            masters: masters.into(),
            request_timeout: url.request_timeout,
            clock_drift: url.clock_drift,
            scripts: Arc::new(RedlockScripts::new()),
            epoch: Instant::now(),
        };
        let answers = join_all((0..backend.masters.len()).map(|i| {
            let masters = backend.masters.clone();
            async move {
                let master = &masters[i];
                match RedisBackend::connect(&master.url).await {
                    Ok(redis) => Ok(master.redis.set(redis).is_ok()),
                    Err(error) => {
                        tracing::warn!(master = %crate::redact::shown(&master.url), %error, "redlock: a master is not reachable; connecting in the background");
                        Master::connect_in_background(&masters, i);
                        Err(error)
                    }
                }
            }
        }))
        .await;
        let (mut refused, mut failed, mut reached) = (None, None, 0);
        for answer in answers {
            match answer {
                Ok(true) => reached += 1,
                Err(error) if error.is_not_authorized() => refused = refused.or(Some(error)),
                Err(error) => failed = failed.or(Some(error)),
                Ok(false) => {}
            }
        }
        // Masters that refuse the credentials are not masters that are down: without a
        // majority, say so.
        if reached < backend.quorum
            && let Some(refused) = refused
        {
            return Err(refused);
        }
        if reached < backend.quorum {
            return Err(Error::backend(
                SCHEME,
                "connect",
                format!(
                    "only {reached} of {} masters reachable, a majority needs {}: check that \
                     the masters run and are reachable{}",
                    backend.masters.len(),
                    backend.quorum,
                    failed.map_or_else(String::new, |error| format!(
                        " (the first failure: {error})"
                    ))
                ),
            ));
        }
        Ok(backend)
    }

    /// How long each master keeps a lock the client counts `lease` for.
    fn kept(&self, lease: Duration) -> Duration {
        lease + lease.mul_f64(self.clock_drift) + DRIFT_FLOOR
    }

    /// One master's answer within the request timeout.
    async fn bounded<T>(&self, request: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.request_timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(Error::backend(
                    SCHEME,
                    "request",
                    format!(
                        "a master did not answer within {:?} (request_timeout); raise it for \
                         distant masters",
                        self.request_timeout
                    ),
                ))
            })
    }

    /// Every master's answer to `request`, asked at once.
    async fn ask_all<'a, T, F, Fut>(&'a self, request: F) -> Answers<T>
    where
        F: Fn(&'a Master) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        Answers(join_all(self.masters.iter().map(|m| self.bounded(request(m)))).await)
    }

    fn now_ms(&self) -> u64 {
        millis(self.epoch.elapsed())
    }

    /// The masters in the order `name` asks them for its gate: from the name's own one on,
    /// those passed over last.
    fn gate_order(&self, name: &LockName) -> Vec<usize> {
        // FNV-1a: the same in every process.
        let hash = name
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let n = self.masters.len();
        let first = usize::try_from(hash % n as u64).unwrap_or(0);
        let now = self.now_ms();
        let mut order: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
        order.sort_by_key(|&i| self.masters[i].passed_over_until.load(Ordering::Relaxed) > now);
        order
    }
}

impl Master {
    /// The connection to this master; an error while it is not connected yet.
    fn redis(&self) -> Result<&RedisBackend> {
        self.redis.get().ok_or_else(|| {
            Error::backend(
                SCHEME,
                "request",
                format!(
                    "master {} is not connected yet",
                    crate::redact::shown(&self.url)
                ),
            )
        })
    }

    /// Connects master `i` in a task of its own, retrying until it answers or the backend is
    /// dropped: a slow connection (another region, TLS) is not cut by the request timeout.
    fn connect_in_background(masters: &Arc<[Master]>, i: usize) {
        if masters[i].connecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let masters = Arc::downgrade(masters);
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(all) = masters.upgrade() else { return };
                let master = &all[i];
                if let Ok(redis) = RedisBackend::connect(&master.url).await {
                    let _ = master.redis.set(redis);
                    tracing::info!(master = %crate::redact::shown(&master.url), "redlock: master connected");
                    return;
                }
                drop(all);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        });
    }
}

/// `?` or `&`, whichever appends an option to `url`'s query.
fn query_joiner(url: &str) -> char {
    if url.contains('?') { '&' } else { '?' }
}

crate::driver::driver!(check_url: check_url, open: connect);

#[async_trait]
impl Backend for RedlockBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn supports(&self, kind: &crate::LockKind) -> bool {
        kind.is_exclusive()
    }

    async fn ping(&self) -> Result<()> {
        self.ask_all(|m| async move { m.redis()?.ping().await })
            .await
            .require(self.quorum, "ping")
            .map(|_| ())
    }

    /// See the module docs and `attempt.rs`: the gate, then the other masters at once, then
    /// one token for the majority.
    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        self.attempt(name, owner, lease).await
    }

    /// A failed attempt gives back its own holds, by its id (`attempt.rs`).
    fn undoes_failed_attempts(&self) -> bool {
        true
    }

    async fn subscribe(
        &self,
        name: &LockName,
        _owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        // Each subscription runs to its end in a task of its own: cut off by the request
        // timeout, it would leave its channel half-subscribed. One that answers late is
        // dropped then, which unsubscribes it.
        let subscriptions = (0..self.masters.len()).map(|i| {
            let (masters, keys) = (self.masters.clone(), Keys::of(name));
            let task = tokio::spawn(async move { masters[i].redis()?.listen(&keys).await });
            async move {
                match tokio::time::timeout(self.request_timeout, task).await {
                    Ok(Ok(Ok(waiter))) => Some(waiter),
                    _ => None,
                }
            }
        });
        let waiters: Vec<RedisWaiter> = join_all(subscriptions)
            .await
            .into_iter()
            .flatten()
            .collect();
        if waiters.is_empty() {
            return Err(Error::backend(
                SCHEME,
                "subscribe",
                "no master answered: check that the masters run and are reachable",
            ));
        }
        Ok(Box::new(AnyMaster(waiters)))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.release(name, owner).await })
            .await
            .require(self.quorum, "release")?;
        Ok(quorum::released(&answers, self.quorum))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        let kept = self.kept(lease);
        let answers = self
            .ask_all(|m| async move { m.redis()?.extend(name, owner, fencing_token, kept).await })
            .await
            .require(self.quorum, "extend")?;
        Ok(quorum::extended(&answers, self.quorum))
    }

    /// On every master, the grant with the majority's token (`agree` gives every master of
    /// the majority that token); a master whose hash carries another token does not renew.
    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let kept = self.kept(lease);
        // Fewer than a majority answering is an error, not a loss: the keeper keeps its
        // deadline and asks again.
        let answers = self
            .ask_all(|m| async move { m.redis()?.renew(locks, kept).await })
            .await
            .require(self.quorum, "renew")?;
        Ok((0..locks.len())
            .map(|i| {
                answers
                    .iter()
                    .filter(|renewed| renewed.get(i).copied().unwrap_or(false))
                    .count()
                    >= self.quorum
            })
            .collect())
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(self.inspect(name).await?.locked)
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.inspect(name).await })
            .await
            .require(self.quorum, "inspect the lock")?;
        let mut info = quorum::inspected(answers, self.quorum);
        // The masters keep the drift allowance on top of the lease the client counts.
        info.remaining_lease = info.remaining_lease.map(|left| {
            left.saturating_sub(DRIFT_FLOOR)
                .div_f64(1.0 + self.clock_drift)
        });
        Ok(info)
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.holds(name, owner).await })
            .await
            .require(self.quorum, "query the lock")?;
        Ok(quorum::agreed(answers, self.quorum))
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.force_unlock(name).await })
            .await
            .require(self.quorum, "force unlock")?;
        Ok(answers.contains(&true))
    }

    /// Written to every master; stands when a majority answered. The answer is the record of
    /// the largest term among theirs.
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.publish_record(key, record).await })
            .await
            .require(self.quorum, "publish")?;
        Ok(newest(answers.into_iter().map(Some)).unwrap_or_else(|| record.clone()))
    }

    /// The record of the largest term among a majority's answers (withdrawn: `None`). A
    /// record written to a majority is in every majority's answers.
    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.stored_record(key).await })
            .await
            .require(self.quorum, "read the published record")?;
        Ok(newest(answers.into_iter()).and_then(Published::live))
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        let answers = self
            .ask_all(|m| async move { m.redis()?.withdraw_record(key, term).await })
            .await
            .require(self.quorum, "withdraw")?;
        Ok(answers.contains(&true))
    }

    /// The names whose lock key a majority of the masters keep (the masters that do not
    /// answer count as not keeping it; fewer than a majority answering is an error). Every
    /// master is scanned at once, as the standalone lock is, each for its smallest names
    /// under the prefix, a few more than `limit`; when a master had more names than it sent and
    /// that leaves the answer unsure, every master is scanned again for four times as many.
    /// Each master's scan may take up to a minute, not the request timeout.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut keep = limit.saturating_add(16);
        loop {
            let scans = self.masters.iter().map(|master| async move {
                tokio::time::timeout(LIST_TIMEOUT, async {
                    master.redis()?.held_names(prefix, keep).await
                })
                .await
                .unwrap_or_else(|_| {
                    Err(Error::backend(
                        SCHEME,
                        "list the locks",
                        format!("a master's SCAN did not end within {LIST_TIMEOUT:?}"),
                    ))
                })
            });
            let answers = Answers(join_all(scans).await).require(self.quorum, "list the locks")?;
            if let Some(names) = quorum::listed(&answers, self.quorum, limit) {
                return Ok(names);
            }
            keep = keep.saturating_mul(4);
        }
    }
}

/// The record of the largest term among `records`; of one term, a withdrawn one (a
/// withdrawal that reached only some masters still ends the term).
fn newest(records: impl Iterator<Item = Option<Published>>) -> Option<Published> {
    records
        .flatten()
        .max_by_key(|record| (record.term, record.is_withdrawn()))
}
