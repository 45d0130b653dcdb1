//! The ZooKeeper backend's background tasks: the reaper of ended leases and left-behind nodes,
//! and the session supervisor.

use super::*;
use crate::reaper::Reap;

/// Deletes nodes whose lease ended and nodes left behind, in the background, through the
/// client-side reaper ([`crate::reaper`]).
impl Reap for Shared {
    type Work = Orphan;

    fn due(&self, now: Instant) -> (Vec<Orphan>, Option<Instant>) {
        // The naive lock's nodes share one path: delete only the ended hold's.
        let naive = self.url.naive;
        self.state()
            .due(now, |_, held| (naive.then_some(held.token), None))
    }

    async fn reap(&self, work: Vec<Orphan>) -> bool {
        let session = self.session();
        let mut failed = Vec::new();
        for orphan in work {
            if orphan.generation != session.generation {
                self.state().reaped(&orphan);
                continue;
            }
            if let Some(lookups) = orphan.extra {
                match self.delete_protected(&session, &orphan.key).await {
                    Ok(true) => {}
                    Ok(false) if lookups > 0 => failed.push(Orphan {
                        extra: Some(lookups - 1),
                        ..orphan
                    }),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(prefix = %orphan.key, %error, "looking for a lock node failed; retrying");
                        failed.push(orphan);
                    }
                }
                continue;
            }
            match self.delete_node(&session, &orphan.key, orphan.token).await {
                Ok(_) => self.state().reaped(&orphan),
                Err(error) => {
                    tracing::warn!(node = %orphan.key, %error, "deleting a lock node failed; retrying");
                    failed.push(orphan);
                }
            }
        }
        let retry = !failed.is_empty();
        self.state().orphans.extend(failed);
        retry
    }
}

/// Follows the session: publishes Connected/Suspended, and when the session is lost (expired,
/// or disconnected for half a session timeout), forgets its locks and opens a new one.
pub(super) async fn supervise(shared: Weak<Shared>, mut watcher: zk::StateWatcher) {
    loop {
        let state = watcher.state();
        let suspended = match state {
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => false,
            zk::SessionState::Disconnected => true,
            _ => {
                match renew_session(&shared).await {
                    Some(next) => watcher = next,
                    None => return,
                }
                continue;
            }
        };
        let timeout = {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            strong.status.send_if_modified(|status| {
                let state = if suspended {
                    SessionState::Suspended
                } else {
                    SessionState::Connected
                };
                let changed = status.state != state;
                status.state = state;
                changed
            });
            if suspended {
                tracing::warn!(cluster = %strong.url.cluster, "ZooKeeper connection lost; locks are suspended");
            }
            // The server expires a session a session timeout after it last heard from the
            // client, and the client is heard from at least every third of it: after half a
            // timeout without a connection, give the locks up before the server can.
            strong.session().client.session_timeout() / 2
        };
        if !suspended {
            watcher.changed().await;
            continue;
        }
        if tokio::time::timeout(timeout, watcher.changed())
            .await
            .is_err()
        {
            tracing::warn!(
                "disconnected for a whole session timeout; treating the session as lost"
            );
            match renew_session(&shared).await {
                Some(next) => watcher = next,
                None => return,
            }
        }
    }
}

/// Forgets the lost session's locks, reports the loss, and connects a new session. `None`
/// when the backend is gone.
async fn renew_session(shared: &Weak<Shared>) -> Option<zk::StateWatcher> {
    {
        let strong = shared.upgrade()?;
        let lost = strong.state().end_generation().len();
        tracing::warn!(locks = lost, "ZooKeeper session lost; its locks are lost");
        strong.status.send_modify(|status| {
            status.state = SessionState::Suspended;
            status.sessions_lost += 1;
        });
    }
    let mut backoff = Duration::from_millis(50);
    loop {
        let (url, generation) = {
            let strong = shared.upgrade()?;
            let generation = strong.state().generation;
            (strong.url.clone(), generation)
        };
        match url.connector().connect(&url.cluster).await {
            Ok(client) => {
                let strong = shared.upgrade()?;
                let watcher = client.state_watcher();
                *strong
                    .current
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Arc::new(Session { client, generation });
                tracing::info!("new ZooKeeper session");
                return Some(watcher);
            }
            Err(error) => {
                tracing::warn!(%error, "opening a new ZooKeeper session failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
