//! Several guards held as one: the parts of a [`MultiGuard`](crate::MultiGuard) and of a
//! [`WriteGuard`](crate::WriteGuard). Lost when any part is lost; released together.

use std::time::Duration;

use futures_util::future::{join_all, select_all};

use crate::Guard;
use crate::error::{Error, LossReason, Result};
use crate::options::AcquireOptions;

/// How long a set waits for its parts' renewing requests before it sets their fixed lease.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// Guards acquired together, released together.
#[derive(Debug)]
pub(crate) struct GuardSet {
    parts: Vec<Guard>,
}

impl GuardSet {
    /// The parts, all held now, as one set with `options`' fixed lease starting now (they
    /// were acquired with the renewed lease while the others were awaited). `None` when a
    /// part was lost meanwhile: the parts are released in the background.
    pub(crate) async fn held(parts: Vec<Guard>, options: AcquireOptions) -> Result<Option<Self>> {
        let set = GuardSet { parts };
        if let Some(lease) = options.fixed_lease() {
            join_all(
                set.parts
                    .iter()
                    .map(|part| part.renewal_settled(SETTLE_LIMIT)),
            )
            .await;
            set.set_lease(lease).await?;
        }
        Ok((!set.is_lost()).then_some(set))
    }

    /// One guard acquired with its own lease, as a set.
    pub(crate) fn one(guard: Guard) -> Self {
        GuardSet { parts: vec![guard] }
    }

    pub(crate) fn parts(&self) -> &[Guard] {
        &self.parts
    }

    /// Resolves with the first part's loss.
    pub(crate) async fn lost(&self) -> Error {
        if self.parts.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.parts.iter().map(|part| Box::pin(part.lost()));
        select_all(waits).await.0
    }

    /// The first lost part's reason.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.parts.iter().find_map(Guard::loss_reason)
    }

    /// True once any part is known lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.parts.iter().any(Guard::is_lost)
    }

    /// Turns every part's lease into the fixed `lease` from now (the parts were acquired with
    /// the renewed lease while the others were awaited); the first error wins.
    pub(crate) async fn set_lease(&self, lease: Duration) -> Result<()> {
        let results = join_all(self.parts.iter().map(|part| part.set_lease(lease))).await;
        results.into_iter().collect()
    }

    /// Moves the end of every part's fixed lease; the first error wins.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<()> {
        let results = join_all(self.parts.iter().map(|part| part.extend(lease))).await;
        results.into_iter().collect()
    }

    /// Releases every part at once; reports the first error after all have been tried.
    ///
    /// Cancel safe: each part's release finishes in the background when dropped.
    pub(crate) async fn release(self) -> Result<()> {
        let results = join_all(self.parts.into_iter().map(Guard::release)).await;
        results.into_iter().collect()
    }
}
