//! Several locks of one backend taken all-or-nothing, in one global order so that callers
//! who list them in different orders cannot deadlock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, LossReason, Result};
use crate::guard_set::GuardSet;
use crate::keeper::ClientInner;
use crate::mutex::Mutex;
use crate::name::LockName;
use crate::options::AcquireOptions;

/// [`MultiLock::MAX_NAMES`].
pub(crate) const MAX_MULTI_NAMES: usize = 256;

/// Several locks taken together, made by [`Locks::multi_lock`](crate::Locks::multi_lock)
/// (Redisson's `MultiLock`, Curator's `InterProcessMultiLock`).
///
/// The names are taken one after another in one global order (ASCII case folded, then by
/// bytes), whatever order the caller gave: two multi-locks over overlapping names, or a multi-lock and a caller that takes the
/// same mutexes in that order, cannot deadlock. (A caller that takes the mutexes one by one in
/// another order still can; take them through a `MultiLock`.) When the wait runs out or a part
/// fails, every part already taken is given back: nothing is held unless everything is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("memory://").await?;
/// let transfer = locks.multi_lock(["account/7", "account/3"])?;
/// let guard = transfer.acquire().await?;
/// assert!(locks.is_locked("account/3").await? && locks.is_locked("account/7").await?);
/// let token_of_7 = guard.fencing_token("account/7");
/// # assert!(token_of_7.is_some());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    client: Arc<ClientInner>,
    /// Sorted, no duplicates.
    names: Arc<[LockName]>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names)
            .finish()
    }
}

impl MultiLock {
    /// The most names a [`MultiLock`] takes.
    pub const MAX_NAMES: usize = MAX_MULTI_NAMES;

    pub(crate) fn new<I, S>(client: Arc<ClientInner>, names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut parsed = names
            .into_iter()
            .map(|name| LockName::new(name))
            .collect::<Result<Vec<_>>>()?;
        if parsed.is_empty() || parsed.len() > MAX_MULTI_NAMES {
            return Err(Error::invalid(
                "lock names",
                format!(
                    "{} names given; a multi-lock takes 1 to {MAX_MULTI_NAMES}",
                    parsed.len()
                ),
            ));
        }
        // ASCII case folded first, so that backends whose names ignore case (MySQL's named
        // locks) see one order too; then the bytes, so that the order is total.
        parsed.sort_by(|a, b| {
            (a.as_str().to_ascii_lowercase(), a.as_str())
                .cmp(&(b.as_str().to_ascii_lowercase(), b.as_str()))
        });
        if let Some(pair) = parsed.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::invalid(
                "lock names",
                format!("{:?} is named twice; name each lock once", pair[0].as_str()),
            ));
        }
        Ok(MultiLock {
            client,
            names: parsed.into(),
        })
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(LockName::as_str)
    }

    /// Waits for every lock, without a limit, each held with the client's renewed lease.
    ///
    /// # Notable errors
    /// [`Error::Backend`] when the backend fails; the parts already taken are given back.
    ///
    /// # Cancel safety
    /// Cancel safe: the parts taken so far are given back in the background, and the part
    /// being acquired is as cancel safe as [`Mutex::acquire`].
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.acquire_with(AcquireOptions::new()).await
    }

    /// Tries each lock once: `None` (and nothing held) when any is held by someone else.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MultiLock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_inner(AcquireOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Every lock within one wait limit (for all parts together) and/or with a fixed lease
    /// (for every part, from the moment all are held: the parts are acquired with the
    /// client's renewed lease while the others are awaited).
    ///
    /// # Notable errors
    /// - [`Error::Timeout`] when the wait runs out; nothing is held.
    /// - [`Error::InvalidInput`] for a bad lease or wait.
    /// - [`Error::Backend`] when the backend fails; nothing is held.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MultiLock::acquire`].
    pub async fn acquire_with(&self, options: AcquireOptions) -> Result<MultiGuard> {
        let start = Instant::now();
        self.acquire_inner(options)
            .await?
            .ok_or_else(|| Error::timed_out(self.names().collect::<Vec<_>>().join(", "), start))
    }

    async fn acquire_inner(&self, options: AcquireOptions) -> Result<Option<MultiGuard>> {
        options.validate()?;
        let start = Instant::now();
        loop {
            // One owner for every part, so the parts name one holder.
            let owner = self.client.new_owner();
            let mut parts = Vec::with_capacity(self.names.len());
            for name in self.names.iter() {
                let part = Mutex::new(self.client.clone(), name.clone(), Some(owner.clone()));
                // Each part with the renewed lease: a fixed lease starts once all are held.
                // On `None`, an error, or a drop of this future, `parts` is dropped, and each
                // guard in it releases its part in the background.
                match part
                    .acquire_inner(options.renewed().wait_left(start))
                    .await?
                {
                    Some(guard) => parts.push(guard),
                    None => return Ok(None),
                }
            }
            // A part lost while the others were awaited: give everything back, start again.
            if let Some(parts) = GuardSet::held(parts, options).await? {
                return Ok(Some(MultiGuard { parts }));
            }
        }
    }
}

/// Every lock of a [`MultiLock`]. Lost when any part is lost; dropping it releases every part
/// in the background.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiGuard {
    parts: GuardSet,
}

impl MultiGuard {
    /// The fencing token of the part `name`, or `None` when the multi-lock has no such part.
    /// Each part's token grows with the grants of that name.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.parts
            .parts()
            .iter()
            .find(|part| part.name() == name)
            .map(crate::Guard::fencing_token)
    }

    /// Every part's name and fencing token, in the order they were taken.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.parts
            .parts()
            .iter()
            .map(|part| (part.name(), part.fencing_token()))
            .collect()
    }

    /// Resolves when any part is known lost.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> Error {
        self.parts.lost().await
    }

    /// Why a part was lost, once known.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.parts.loss_reason()
    }

    /// Moves the end of every part's fixed lease.
    ///
    /// # Notable errors
    /// As [`Guard::extend`](crate::Guard::extend), the first part's error.
    ///
    /// # Cancel safety
    /// Dropping the future may have moved some parts' lease ends.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.parts.extend(lease).await
    }

    /// Releases every part.
    ///
    /// # Notable errors
    /// The first part's error, after every part was tried.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release completes in the background.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }
}
