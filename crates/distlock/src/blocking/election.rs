//! The blocking [`Election`] and its [`Leadership`].

use std::fmt;
use std::time::Duration;

use super::held::{Held, blocking_guard};
use super::runtime::OnRuntime;
use crate::election::Leader;
use crate::error::{Error, LossReason, Result};
use crate::options::AcquireOptions;

/// A leader election, made by [`Locks::election`]: [`crate::Election`] without `async` (how
/// it works on each backend is said there). The leader's term is its grant's fencing token.
///
/// ```
/// # fn main() -> distlock::Result<()> {
/// let locks = distlock::blocking::connect("memory://")?;
/// let election = locks.election("scheduler")?;
/// let leadership = election.campaign("node-a:8080")?;
/// let leader = election.leader()?.expect("someone leads");
/// assert_eq!(leader.value, "node-a:8080");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign()?;
/// assert!(election.leader()?.is_none());
/// # Ok(())
/// # }
/// ```
///
/// [`crate::Election::observe`], a stream, has no blocking counterpart: ask
/// [`Election::leader`] when the answer is needed.
///
/// [`Locks::election`]: super::Locks::election
#[derive(Clone)]
pub struct Election {
    inner: OnRuntime<crate::Election>,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Election {
    pub(crate) fn new(inner: OnRuntime<crate::Election>) -> Self {
        Election { inner }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.inner.get().name()
    }

    /// The mutex the leader holds (an operator can inspect or force-unlock it).
    pub fn lock_name(&self) -> &str {
        self.inner.get().lock_name()
    }

    /// True when the backend keeps the election in its own layout (ZooKeeper, etcd).
    pub fn is_native(&self) -> bool {
        self.inner.get().is_native()
    }

    /// Blocks, without a limit, until this candidate leads; publishes `value` as the
    /// leader's. Held with the client's renewed lease.
    ///
    /// # Errors
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) for a value over
    ///   [`Published::MAX_VALUE`](crate::backend::Published::MAX_VALUE) bytes.
    /// - [`Error::LockLost`] when a larger term was published first: the leadership ended
    ///   before it began. Nothing is held.
    /// - [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    ///   runtime could not answer; nothing is kept.
    pub fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        self.campaign_with(value, AcquireOptions::new())
    }

    /// As [`Election::campaign`], with a wait limit and/or a fixed lease for the leadership.
    ///
    /// # Errors
    /// As [`Election::campaign`], and [`Error::Timeout`](crate::Error::Timeout) when the wait
    /// runs out, [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad lease or wait.
    pub fn campaign_with(
        &self,
        value: impl Into<String>,
        options: AcquireOptions,
    ) -> Result<Leadership> {
        let (election, value) = (self.inner.get().clone(), value.into());
        let leadership = self.inner.runtime().call("campaign", async move {
            election.campaign_with(value, options).await
        })?;
        Ok(Leadership {
            held: Held::new(leadership, self.inner.runtime().clone()),
        })
    }

    /// Who leads now (see [`crate::Election::leader`]); `None` while nobody does.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the backend fails, or the client's
    /// runtime could not answer.
    pub fn leader(&self) -> Result<Option<Leader>> {
        let election = self.inner.get().clone();
        self.inner
            .runtime()
            .call("read the leader", async move { election.leader().await })
    }
}

blocking_guard!(
    /// Leading an election: [`crate::Leadership`] without `async`. Resign with
    /// [`Leadership::resign`]; dropping it resigns in the background, as a dropped
    /// [`Guard`](super::Guard) releases.
    #[must_use = "the leadership ends as soon as it is dropped"]
    Leadership(crate::Leadership),
    "the leadership"
);

impl Leadership {
    /// The term: larger than every earlier leadership's. Send it with every write a leader
    /// makes.
    pub fn term(&self) -> u64 {
        self.held.get().term()
    }

    /// The value this leader published.
    pub fn value(&self) -> &str {
        self.held.get().value()
    }

    /// Steps down: withdraws the published record, then releases the election's mutex.
    ///
    /// # Errors
    /// - [`Error::LockLost`] when the leadership had already been lost.
    /// - [`Error::NotOwner`](crate::Error::NotOwner) when it was lost and another leads now.
    /// - [`Error::Backend`](crate::Error::Backend) when a request failed, or the client's
    ///   runtime could not answer; the mutex then frees when its lease ends.
    pub fn resign(self) -> Result<()> {
        self.held.release("resign")
    }
}
