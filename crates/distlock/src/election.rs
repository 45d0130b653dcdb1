//! Leader election on any backend: a mutex that the leader holds, and a record the leader
//! publishes, ordered by the mutex's fencing tokens.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::time::Instant;

use crate::backend::{Backend, MAX_PUBLISHED_VALUE, Published};
use crate::error::{Error, LossReason, Result};
use crate::finish::FinishOnDrop;
use crate::keeper::ClientInner;
use crate::mutex::{Guard, Mutex};
use crate::name::{LockKind, LockName};
use crate::options::{AcquireOptions, MAX_DURATION};

/// [`Election::DEFAULT_OBSERVE_EVERY`].
pub(crate) const DEFAULT_OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// A leader election, made by [`Locks::election`](crate::Locks::election).
///
/// # How it works
/// The leader is the holder of the mutex `<name>#leader`: a campaign acquires it as a fresh
/// owner (with all a mutex has: waiting, lease and renewal, [`Leadership::lost`]), then
/// publishes a record under the election's name: the grant's fencing token as the **term**,
/// the leader's value and its owner. The backend keeps the record of the largest term it was
/// given (a record of an older term is refused, also after the newer one was withdrawn), so
/// terms order leaderships as tokens order grants: a leader that learns of a larger term knows
/// its leadership is over, and a resource that checks terms refuses a former leader's writes.
///
/// Followers ask [`Election::leader`]: the published record while the mutex is held by its
/// leader, `None` while nobody holds it. On backends that do not tell the holder's token it
/// may name the previous leader until the new one publishes (the new leader holds the mutex
/// before its record is published); the term tells which leader is newer.
///
/// ## In the backend's own layout
/// On a backend that keeps elections itself ([`Election::is_native`]: ZooKeeper, in the
/// layout of Curator's `LeaderLatch`; etcd, in that of its `concurrency.Election`), the
/// election is the lock `<name>` itself: each candidate's place in line (a node or key) holds
/// its value from the moment it is made, the first in line leads, and its token is the term.
/// Nothing is published apart: [`Election::leader`] reads the first in line, so Java and Go
/// services campaigning on the same path or prefix take part in the same election.
///
/// A crashed leader's mutex frees itself as that backend's mutex does (its lease ends, or its
/// session or connection does); a waiting campaign is then elected with a larger term.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let election = locks.election("scheduler")?;
/// let leadership = election.campaign("node-a:8080").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.value, "node-a:8080");
/// assert_eq!(leader.term, leadership.term());    // the term is the fencing token
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// The key the leader's record is published under: the election's name.
    key: LockName,
    /// The mutex the leader holds: `<name>#leader`, or `<name>` in the backend's own layout.
    lock: LockName,
    /// The backend keeps the election itself (the first in line leads).
    native: bool,
    observe_every: Duration,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("observe_every", &self.observe_every)
            .finish()
    }
}

/// Who leads an election, as its record says ([`Election::leader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leadership's term: the fencing token of its grant of the election's mutex.
    pub term: u64,
    /// What the leader published with its campaign.
    pub value: String,
    /// The owner holding the election's mutex, as backends store it; in the backend's own
    /// layout, the leader's node (ZooKeeper) or key (etcd).
    pub holder: String,
}

impl Election {
    /// How often [`Election::observe`] asks who leads, unless [`Election::observe_every`] says
    /// otherwise.
    pub const DEFAULT_OBSERVE_EVERY: Duration = DEFAULT_OBSERVE_EVERY;

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Result<Self> {
        let key = LockName::new(name.as_str())?;
        // Checked on every backend, also where the election is the lock of its own name, so
        // that a name is valid on every backend or on none.
        let lock = LockName::new(format!("{name}#leader")).map_err(|_| {
            Error::invalid(
                "election name",
                format!(
                    "the name is {} bytes long; with its lock's suffix (\"#leader\") it must fit \
                     in {} bytes",
                    name.len(),
                    crate::name::MAX_NAME_BYTES
                ),
            )
        })?;
        let leader_kind = LockKind::Leader(Arc::from(""));
        if client.backend.supports(&leader_kind) {
            return Ok(Election {
                client,
                name: name.into(),
                lock: key.clone(),
                key: key.with_kind(leader_kind),
                native: true,
                observe_every: DEFAULT_OBSERVE_EVERY,
            });
        }
        Ok(Election {
            client,
            name: name.into(),
            key,
            lock,
            native: false,
            observe_every: DEFAULT_OBSERVE_EVERY,
        })
    }

    /// The election's name: the key its leader's record is published under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mutex the leader holds, `<name>#leader`, or `<name>` when the backend keeps the
    /// election itself (an operator can inspect or force-unlock it).
    pub fn lock_name(&self) -> &str {
        self.lock.as_str()
    }

    /// True when the backend keeps the election in its own layout (see the type's docs).
    pub fn is_native(&self) -> bool {
        self.native
    }

    /// The same election, observed every `every` ([`Election::observe`]); 100 ms by default.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for zero or more than a day.
    pub fn observe_every(mut self, every: Duration) -> Result<Self> {
        if every.is_zero() || every > MAX_DURATION {
            return Err(Error::invalid(
                "observe interval",
                format!("{every:?} asked; give more than zero and at most {MAX_DURATION:?}"),
            ));
        }
        self.observe_every = every;
        Ok(self)
    }

    /// Waits, without a limit, to lead; publishes `value` (at most
    /// [`Published::MAX_VALUE`] bytes) as the leader's (in the backend's own layout the value
    /// is stored with the candidate's place in line instead). Held with the client's renewed
    /// lease.
    ///
    /// # Notable errors
    /// - [`Error::InvalidInput`] for a value over [`Published::MAX_VALUE`] bytes.
    /// - [`Error::LockLost`] when a larger term was published before this one: the
    ///   leadership ended before it could begin (its mutex was lost meanwhile). Nothing is
    ///   held. (Not in the backend's own layout, where nothing is published.)
    /// - [`Error::Backend`] when the backend fails; nothing is kept (a publish that failed
    ///   is withdrawn and the mutex released in the background).
    ///
    /// # Cancel safety
    /// Cancel safe: a campaign dropped while it waits leaves nothing, as a dropped mutex
    /// acquisition does; one dropped while it publishes finishes the publish in the background,
    /// then withdraws the record and releases the mutex.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        self.campaign_with(value, AcquireOptions::new()).await
    }

    /// As [`Election::campaign`], with a wait limit and/or a fixed lease for the leadership
    /// (a leadership on a fixed lease ends when it runs out; [`Leadership::lost`] fires then).
    ///
    /// # Notable errors
    /// As [`Election::campaign`], and [`Error::Timeout`] when the wait runs out, and
    /// [`Error::InvalidInput`] for a bad lease or wait.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Election::campaign`].
    pub async fn campaign_with(
        &self,
        value: impl Into<String>,
        options: AcquireOptions,
    ) -> Result<Leadership> {
        let value = value.into();
        if value.len() > MAX_PUBLISHED_VALUE {
            return Err(Error::invalid(
                "published value",
                format!(
                    "the value is {} bytes long; an election publishes at most \
                     {MAX_PUBLISHED_VALUE} bytes (publish where to find more, not the data)",
                    value.len()
                ),
            ));
        }
        let start = Instant::now();
        let lock = if self.native {
            // The candidate's place in line holds its value: nothing to publish apart.
            self.lock
                .clone()
                .with_kind(LockKind::Leader(value.as_str().into()))
        } else {
            self.lock.clone()
        };
        let mutex = Mutex::new(self.client.clone(), lock, None);
        let Some(guard) = mutex.acquire_inner(options).await? else {
            return Err(Error::timed_out(&self.name, start));
        };
        if self.native {
            return Ok(Leadership {
                guard: Some(guard),
                backend: self.client.backend.clone(),
                key: self.key.clone(),
                value,
                native: true,
            });
        }
        let term = guard.fencing_token();
        let record = Published::new(term, value, guard.owner().as_str());
        let backend = self.client.backend.clone();
        let publish = {
            let (backend, key, record) = (backend.clone(), self.key.clone(), record.clone());
            async move {
                let stored = backend.publish(&key, &record).await;
                (guard, stored)
            }
        };
        let key = self.key.clone();
        // Dropped while publishing: the publish finishes, then nothing of it stays.
        let (guard, stored) = FinishOnDrop::new(publish, move |(guard, _)| async move {
            withdraw_and_release(backend, key, term, guard, false).await;
        })
        .await;
        let leadership = Leadership {
            guard: Some(guard),
            backend: self.client.backend.clone(),
            key: self.key.clone(),
            value: record.value,
            native: false,
        };
        match stored {
            Ok(stored) if stored.term > term => {
                tracing::debug!(election = %self.name, term, newer = stored.term, "a newer term was published first");
                drop(leadership);
                Err(Error::LockLost {
                    name: self.lock.to_string(),
                    reason: LossReason::HeldByOther,
                })
            }
            // The mutex was lost while the record was published: the leadership is over.
            Ok(_) if leadership.loss_reason().is_some() => {
                let error = leadership.guard_ref().lost().await;
                drop(leadership);
                Err(error)
            }
            Ok(_) => {
                tracing::debug!(election = %self.name, term, "elected");
                Ok(leadership)
            }
            // Dropping the leadership withdraws whatever the publish may have stored.
            Err(error) => Err(error),
        }
    }

    /// Who leads now: the published record while the election's mutex is held, `None` while
    /// nobody holds it; in the backend's own layout, the first candidate in line (see the
    /// type's docs), `None` while nobody stands in line. Where the backend tells the holder's
    /// fencing token (memory, SQLite, Redis, Redlock), the record must also be the holder's
    /// (its term the token): a new leader that has not published yet shows as `None`. On
    /// PostgreSQL and MySQL it may name the previous leader until the new one publishes (about
    /// a round trip, unless the new leader stalls before publishing; then until its mutex
    /// frees); the term tells which is newer.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let backend = &self.client.backend;
        let Some(record) = backend.read_published(&self.key).await? else {
            return Ok(None);
        };
        if self.native {
            // The first in line: the holder itself.
            return Ok(Some(Leader {
                term: record.term,
                value: record.value,
                holder: record.holder,
            }));
        }
        let holder = backend.inspect(&self.lock).await?;
        if !holder.locked
            || holder
                .fencing_token
                .is_some_and(|token| token != record.term)
        {
            return Ok(None);
        }
        Ok(Some(Leader {
            term: record.term,
            value: record.value,
            holder: record.holder,
        }))
    }

    /// A stream of who leads: the current leader first, then each change of term (or to and
    /// from `None`), found by asking [`Election::leader`] every
    /// [`observe_every`](Election::observe_every) (100 ms by default), so a change shows
    /// within that interval plus a round trip, and a leadership shorter than the interval may
    /// not show at all. An error is yielded as it comes and the stream goes on asking. It
    /// holds one answer at a time and stops asking when dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> distlock::Result<()> {
    /// use futures_util::StreamExt;
    /// let locks = distlock::connect("memory://").await?;
    /// let election = locks.election("scheduler")?;
    /// let mut changes = Box::pin(election.observe());
    /// assert_eq!(changes.next().await.transpose()?, Some(None)); // nobody leads yet
    /// let leadership = election.campaign("node-a").await?;
    /// let now = changes.next().await.transpose()?.flatten().expect("a leader");
    /// assert_eq!(now.term, leadership.term());
    /// # leadership.resign().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let election = self.clone();
        // State: whether a request was made yet, and the term last yielded (`None` inside:
        // nobody led; `None` outside: nothing yielded yet).
        futures_util::stream::unfold(
            (election, false, None::<Option<u64>>),
            |(election, asked, last)| async move {
                if asked {
                    tokio::time::sleep(election.observe_every).await;
                }
                loop {
                    match election.leader().await {
                        Ok(now) => {
                            let term = now.as_ref().map(|leader| leader.term);
                            if last != Some(term) {
                                return Some((Ok(now), (election, true, Some(term))));
                            }
                        }
                        Err(error) => return Some((Err(error), (election, true, last))),
                    }
                    tokio::time::sleep(election.observe_every).await;
                }
            },
        )
    }
}

/// Withdraws the record of `term`, unless the backend keeps the election itself (the release
/// of the candidate's lock ends its record then).
async fn withdraw(backend: &dyn Backend, key: &LockName, term: u64, native: bool) -> Result<bool> {
    if native {
        return Ok(true);
    }
    backend.withdraw(key, term).await
}

/// Withdraws the record of `term` (see [`withdraw`]) and releases `guard`, both to their end.
async fn withdraw_and_release(
    backend: Arc<dyn Backend>,
    key: LockName,
    term: u64,
    guard: Guard,
    native: bool,
) {
    if let Err(error) = withdraw(&*backend, &key, term, native).await {
        tracing::warn!(election = %key, term, %error, "withdrawing a leader's record failed; a newer term replaces it");
    }
    if let Err(error) = guard.release().await {
        tracing::debug!(election = %key, term, %error, "the leadership's release failed");
    }
}

/// Leading an election: the guard of its mutex and the term it published. Resign with
/// [`Leadership::resign`]; dropping it resigns in the background.
#[must_use = "the leadership ends as soon as it is dropped"]
pub struct Leadership {
    /// `None` once resigned or dropped.
    guard: Option<Guard>,
    backend: Arc<dyn Backend>,
    key: LockName,
    value: String,
    /// The backend keeps the election itself: nothing to withdraw.
    native: bool,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.key)
            .field("guard", &self.guard)
            .field("value", &self.value)
            .finish()
    }
}

impl Leadership {
    fn guard_ref(&self) -> &Guard {
        // `guard` is only taken by `resign(self)` and `Drop`, after which no method can be
        // called.
        self.guard
            .as_ref()
            .expect("the leadership's guard is present until resign or drop")
    }

    /// The term: the fencing token of this leadership's grant of the election's mutex,
    /// larger than every earlier leadership's. Send it with every write a leader makes.
    pub fn term(&self) -> u64 {
        self.guard_ref().fencing_token()
    }

    /// The value this leader published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The guard of the election's mutex (its lease, [`Guard::is_held`], ...).
    pub fn guard(&self) -> &Guard {
        self.guard_ref()
    }

    /// Resolves when the leadership is known to be lost: its mutex's renewal was refused, its
    /// lease ran out, or its session ended (see [`Guard::lost`]). Returns the
    /// [`Error::LockLost`] to report.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> Error {
        self.guard_ref().lost().await
    }

    /// Why the leadership was lost, once the client knows it is. Cheap: asks no server.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard_ref().loss_reason()
    }

    /// Steps down: withdraws the published record (if it is still this term's), then releases
    /// the election's mutex, so that a waiting campaign is elected at once.
    ///
    /// # Notable errors
    /// - [`Error::LockLost`] when the leadership had already been lost (the record is
    ///   withdrawn all the same if it is still this term's).
    /// - [`Error::NotOwner`] when the leadership was lost and another leads now; only the
    ///   withdrawal of this term's record (if still there) was done.
    /// - [`Error::Backend`] when a request failed; the mutex then frees when its lease ends.
    ///
    /// # Cancel safety
    /// Cancel safe: if this future is dropped, the withdrawal and the release complete in the
    /// background.
    pub async fn resign(mut self) -> Result<()> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let term = guard.fencing_token();
        let (backend, key, native) = (self.backend.clone(), self.key.clone(), self.native);
        let resign = async move {
            let withdrawn = withdraw(&*backend, &key, term, native).await;
            let released = guard.release().await;
            released.and(withdrawn.map(drop))
        };
        let key = self.key.clone();
        FinishOnDrop::new(resign, move |result: Result<()>| async move {
            if let Err(error) = result {
                tracing::warn!(election = %key, %error, "resigning in the background failed");
            }
        })
        .await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let term = guard.fencing_token();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (backend, key) = (self.backend.clone(), self.key.clone());
                let release = withdraw_and_release(backend, key, term, guard, self.native);
                crate::cleanup::spawn_on(&runtime, release);
            }
            // The guard's own drop says what happens without a runtime; the record stays,
            // and the next term replaces it.
            Err(_) => drop(guard),
        }
    }
}
