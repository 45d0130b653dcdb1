//! Several guards held as one: the parts of a [`MultiGuard`](crate::MultiGuard) and of a
//! [`WriteGuard`](crate::WriteGuard). Lost when any part is lost; released together.

use std::time::Duration;

use futures_util::future::{join_all, select_all};

use crate::Guard;
use crate::error::{Error, LossReason, Result};

/// Guards acquired together, released together.
#[derive(Debug)]
pub(crate) struct GuardSet {
    parts: Vec<Guard>,
}

impl GuardSet {
    pub(crate) fn new(parts: Vec<Guard>) -> Self {
        GuardSet { parts }
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
