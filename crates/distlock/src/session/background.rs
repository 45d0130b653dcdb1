//! The session backend's background tasks: the watcher of lock connections and the reaper of
//! ended leases.

use super::*;
use crate::reaper::Reap;

/// Asks every lock connection that holds locks, every [`WATCH_INTERVAL`], whether it still
/// holds them. Locks a connection lost (it died, or was terminated) are forgotten, and the
/// client is told through a lost session, so that their guards fire `lost()` whatever their
/// lease. Ends with the backend.
pub(super) async fn watch_sessions<D: Dialect>(shared: Weak<Shared<D>>) {
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.retire_unused_primary();
        let grants: Vec<Option<Asked<D>>> = strong
            .state()
            .held
            .iter()
            .map(|(slot, held)| Some(Asked::of(slot, held)))
            .collect();
        let answers = strong.ask_connections(&grants).await;
        let mut gone = 0;
        for (grant, answer) in grants.iter().zip(answers) {
            // A connection that failed was given up with its grants, and the client told.
            if let Some(grant) = grant
                && answer == Some(false)
                && strong.forget_grant(&grant.slot, &grant.conn, grant.token)
            {
                tracing::debug!(lock = %grant.slot, "the lock's session no longer holds it");
                gone += 1;
            }
        }
        if gone > 0 {
            strong
                .status
                .send_modify(|status| status.sessions_lost += 1);
        }
    }
}

/// Unlocks in the background, through the client-side reaper ([`crate::reaper`]): leases
/// that ended and grants nobody took.
impl<D: Dialect> Reap for Shared<D> {
    type Work = Unlock<D>;

    fn due(&self, now: Instant) -> (Vec<Self::Work>, Option<Instant>) {
        let mut state = self.state();
        let expired: Vec<HeldKey> = state
            .held
            .iter()
            .filter(|(_, held)| held.expires_at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            if let Some(held) = state.held.remove(&name) {
                tracing::debug!(lock = %name, "the lease ended; unlocking");
                state.ending.mark(&name);
                state.unlock.push((held.conn, held.key, Some(name)));
            }
        }
        let next_end = state.held.values().map(|held| held.expires_at).min();
        (std::mem::take(&mut state.unlock), next_end)
    }

    async fn reap(&self, work: Vec<Self::Work>) -> bool {
        let mut kept = false;
        let mut work = work.into_iter();
        while let Some((conn, key, ended)) = work.next() {
            match self.unlock(&conn, &key).await {
                Ok(_) => {
                    if let Some(name) = ended {
                        self.state().ending.unmark(&name);
                    }
                    self.after_unlock(conn).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "unlocking in the background failed");
                    // Kept to try again while something else has the connection (the watcher
                    // gives it up, and its grants, if it is dead); else it closes here.
                    let later = work
                        .as_slice()
                        .iter()
                        .filter(|(queued, _, _)| Arc::ptr_eq(queued, &conn))
                        .count();
                    kept |= self.unlock_failed(conn, key, ended, later).await;
                }
            }
        }
        kept
    }
}
