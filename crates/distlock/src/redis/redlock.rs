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
use super::{Keys, RedisBackend, acquired, millis};
use crate::backend::{Acquired, Backend, Extended, LockInfo, Owner, ReleaseWaiter, Released};
use crate::error::{Error, Result};
use crate::name::LockName;

mod quorum;
mod url;

const SCHEME: &str = "redlock";

/// How long a master that failed as a gate is not asked first.
const GATE_PAUSE: Duration = Duration::from_secs(1);
/// The part of the drift allowance that does not grow with the lease.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// One master, connected on first use when it was down at connect time.
struct Master {
    url: String,
    redis: tokio::sync::OnceCell<RedisBackend>,
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

/// Checks a URL as connecting would, without connecting ([`crate::scheme::validate`]).
pub(crate) fn check_url(url: &str) -> Result<()> {
    RedlockUrl::parse(url).map(|_| ())
}

/// The outcome of one master's part of an acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Not asked.
    NotAsked,
    /// Granted, with this token and the owner's holds there.
    Granted { token: u64, holds: u32 },
    /// Held by another owner.
    Held(Option<Duration>),
    /// No answer: it may have granted.
    Unknown,
}

impl RedlockBackend {
    /// Connects to every master of a `redlock://h1:port,h2:port,h3:port/` URL.
    ///
    /// A master that cannot be reached now is connected later, when it comes back; the
    /// connection fails only when fewer than a majority answer.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL (fewer than 3 masters, an even number, a
    /// master named twice, an option out of range); [`Error::Backend`] when a majority cannot
    /// be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let url = RedlockUrl::parse(url)?;
        let masters: Vec<Master> = url
            .masters
            .iter()
            .map(|master| Master {
                url: format!("{master}{}fair=false", query_joiner(master)),
                redis: tokio::sync::OnceCell::new(),
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
        let reached = join_all(backend.masters.iter().map(|m| async move {
            let connected = m.redis().await;
            if let Err(error) = &connected {
                tracing::warn!(master = %m.url, %error, "redlock: a master is not reachable");
            }
            connected.is_ok()
        }))
        .await;
        let reached = reached.into_iter().filter(|r| *r).count();
        if reached < backend.quorum {
            return Err(Error::backend(
                SCHEME,
                "connect",
                format!(
                    "only {reached} of {} masters reachable, a majority needs {}: check that \
                     the masters run and are reachable",
                    backend.masters.len(),
                    backend.quorum
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
                    format!("a master did not answer within {:?}", self.request_timeout),
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

    async fn acquire_on(
        &self,
        master: usize,
        keys: &Keys,
        owner: &Owner,
        kept: Duration,
        floor: u64,
    ) -> Part {
        let request = async {
            let reply: Vec<i64> = self
                .scripts
                .acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(millis(kept))
                .arg(floor)
                .invoke_async(&mut self.masters[master].redis().await?.connection.clone())
                .await
                .map_err(|e| Error::backend(SCHEME, "acquire", e))?;
            acquired(&reply)
        };
        match self.bounded(request).await {
            Ok(Acquired::Granted {
                fencing_token,
                holds,
            }) => Part::Granted {
                token: fencing_token,
                holds,
            },
            Ok(Acquired::Held { ttl }) => Part::Held(ttl),
            Err(error) => {
                tracing::debug!(%error, master, "redlock: no answer to an acquire");
                Part::Unknown
            }
        }
    }

    /// Raises the counter of master `master` to `token` and makes it the grant's token.
    async fn confirm_on(&self, master: usize, keys: &Keys, owner: &Owner, token: u64) -> bool {
        let request = async {
            let reply: i64 = self
                .scripts
                .confirm
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(token)
                .invoke_async(&mut self.masters[master].redis().await?.connection.clone())
                .await
                .map_err(|e| Error::backend(SCHEME, "confirm", e))?;
            Ok(reply == 1)
        };
        self.bounded(request).await.unwrap_or(false)
    }

    /// Gives back one hold on each of `masters` (an acquisition that did not reach a
    /// majority); a master that does not answer keeps it until its lease ends.
    async fn give_back(&self, name: &LockName, owner: &Owner, masters: Vec<usize>) {
        join_all(masters.into_iter().map(|i| {
            self.bounded(async move { self.masters[i].redis().await?.release(name, owner).await })
        }))
        .await;
    }
}

impl Master {
    /// The connection to this master, made now if it was not yet.
    async fn redis(&self) -> Result<&RedisBackend> {
        self.redis
            .get_or_try_init(|| RedisBackend::connect(&self.url))
            .await
    }
}

/// `?` or `&`, whichever appends an option to `url`'s query.
fn query_joiner(url: &str) -> char {
    if url.contains('?') { '&' } else { '?' }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    async fn ping(&self) -> Result<()> {
        self.ask_all(|m| async move { m.redis().await?.ping().await })
            .await
            .require(self.quorum, "ping")
            .map(|_| ())
    }

    /// The gate first, then every other master at once with the gate's token as the floor;
    /// then, when the granting masters disagree on the token (a master whose counter was
    /// ahead), the largest becomes every granter's token by a second script. The lock is held
    /// when a majority carries that token and the lease has not run out.
    ///
    /// Re-entry: the token is the one the owner's holds already carry.
    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let started = Instant::now();
        let keys = Keys::of(name);
        let kept = self.kept(lease);
        let mut parts = vec![Part::NotAsked; self.masters.len()];
        let mut gate = None;
        for i in self.gate_order(name) {
            parts[i] = self.acquire_on(i, &keys, owner, kept, 0).await;
            match parts[i] {
                Part::Granted { token, .. } => {
                    gate = Some(token);
                    break;
                }
                Part::Held(_) => break,
                Part::Unknown => {
                    let until = self.now_ms() + millis(GATE_PAUSE);
                    self.masters[i]
                        .passed_over_until
                        .store(until, Ordering::Relaxed);
                }
                Part::NotAsked => {}
            }
        }
        if let Some(floor) = gate {
            let rest: Vec<usize> = (0..parts.len())
                .filter(|&i| parts[i] == Part::NotAsked)
                .collect();
            let answers = join_all(
                rest.iter()
                    .map(|&i| self.acquire_on(i, &keys, owner, kept, floor)),
            )
            .await;
            for (i, part) in rest.into_iter().zip(answers) {
                parts[i] = part;
            }
        }
        let outcome = self.settle_parts(&keys, owner, &parts).await;
        if let Some(acquired @ Acquired::Granted { .. }) = outcome {
            if started.elapsed() < lease {
                return Ok(acquired);
            }
            tracing::warn!(lock = %name, elapsed = ?started.elapsed(), "redlock: the masters granted after the lease ran out; giving it back");
        }
        // Not held: give back what was granted, and what may have been when this was a fresh
        // attempt (a re-entry's unanswered requests may not have run, and the holds they
        // would take back are the owner's own).
        let reentry = parts
            .iter()
            .any(|p| matches!(p, Part::Granted { holds, .. } if *holds > 1));
        let back: Vec<usize> = (0..parts.len())
            .filter(|&i| match parts[i] {
                Part::Granted { .. } => true,
                Part::Unknown => !reentry,
                _ => false,
            })
            .collect();
        let answered = parts
            .iter()
            .any(|p| matches!(p, Part::Granted { .. } | Part::Held(_)));
        if !answered {
            // Nobody answered: the outcome is unknown, which the client settles.
            return Err(Error::backend(
                SCHEME,
                "acquire",
                "no master answered: check that the masters run and are reachable",
            ));
        }
        self.give_back(name, owner, back).await;
        let ttl = parts
            .iter()
            .filter_map(|p| match p {
                Part::Held(ttl) => Some(*ttl),
                _ => None,
            })
            .min()
            .flatten();
        Ok(Acquired::Held { ttl })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let waiters: Vec<Box<dyn ReleaseWaiter>> = self
            .ask_all(|m| async move { m.redis().await?.subscribe(name, owner, lease).await })
            .await
            .0
            .into_iter()
            .filter_map(Result::ok)
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
            .ask_all(|m| async move { m.redis().await?.release(name, owner).await })
            .await
            .require(self.quorum, "release")?;
        Ok(quorum::released(&answers))
    }

    async fn extend(&self, name: &LockName, owner: &Owner, lease: Duration) -> Result<Extended> {
        let kept = self.kept(lease);
        let answers = self
            .ask_all(|m| async move { m.redis().await?.extend(name, owner, kept).await })
            .await
            .require(self.quorum, "extend")?;
        Ok(quorum::extended(&answers, self.quorum))
    }

    async fn renew(&self, locks: &[(LockName, Owner)], lease: Duration) -> Result<Vec<bool>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let kept = self.kept(lease);
        let answers = self
            .ask_all(|m| async move { m.redis().await?.renew(locks, kept).await })
            .await;
        let answers = answers.require(1, "renew")?;
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
            .ask_all(|m| async move { m.redis().await?.inspect(name).await })
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
            .ask_all(|m| async move { m.redis().await?.holds(name, owner).await })
            .await
            .require(self.quorum, "query the lock")?;
        Ok(quorum::agreed(answers, self.quorum))
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let answers = self
            .ask_all(|m| async move { m.redis().await?.force_unlock(name).await })
            .await
            .require(1, "force unlock")?;
        Ok(answers.contains(&true))
    }
}

impl RedlockBackend {
    /// Whether `parts` make a grant: a majority granted, and carries one token after the
    /// masters that disagree were raised to it.
    async fn settle_parts(&self, keys: &Keys, owner: &Owner, parts: &[Part]) -> Option<Acquired> {
        let granted: Vec<(usize, u64, u32)> = parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match *p {
                Part::Granted { token, holds } => Some((i, token, holds)),
                _ => None,
            })
            .collect();
        if granted.len() < self.quorum {
            return None;
        }
        let holds = granted.iter().map(|&(_, _, holds)| holds).max()?;
        // A re-entry keeps the token of the holds it re-enters; a fresh grant takes the largest.
        let token = if holds > 1 {
            granted
                .iter()
                .filter(|&&(_, _, h)| h > 1)
                .map(|&(_, token, _)| token)
                .max()?
        } else {
            granted.iter().map(|&(_, token, _)| token).max()?
        };
        let disagreeing: Vec<usize> = granted
            .iter()
            .filter(|&&(_, t, _)| t != token)
            .map(|&(i, _, _)| i)
            .collect();
        let confirmed = join_all(
            disagreeing
                .iter()
                .map(|&i| self.confirm_on(i, keys, owner, token)),
        )
        .await;
        let carrying = granted.len() - disagreeing.len() + confirmed.iter().filter(|c| **c).count();
        (carrying >= self.quorum).then_some(Acquired::Granted {
            fencing_token: token,
            holds,
        })
    }
}
