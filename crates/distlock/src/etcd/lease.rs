//! The etcd backend's background work: the client's one etcd lease (granted, kept alive by
//! one stream, given up and replaced when lost) and the reaper of ended leases and
//! left-behind keys.

use super::api::etcdserverpb::LeaseKeepAliveRequest;
use super::*;
use crate::reaper::Reap;

/// How long the keep-alive waits before opening its stream again after a failure.
const REOPEN_AFTER: Duration = Duration::from_millis(200);

/// Grants a lease of `ttl` (whole seconds); answers its id and the TTL the server granted.
pub(super) async fn grant(rpc: &Rpc, ttl: Duration) -> Result<(i64, Duration)> {
    let seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    let granted = tokio::time::timeout(REQUEST_TIMEOUT, rpc.lease_grant(seconds))
        .await
        .map_err(|_| {
            Error::backend(
                SCHEME,
                "grant a lease",
                format!("no answer within {REQUEST_TIMEOUT:?}"),
            )
        })?
        .map_err(|status| rpc.failed("grant a lease", status))?;
    if !granted.error.is_empty() {
        return Err(Error::backend(SCHEME, "grant a lease", granted.error));
    }
    let ttl = Duration::from_secs(u64::try_from(granted.ttl).unwrap_or(0).max(1));
    Ok((granted.id, ttl))
}

/// Why a lease is given up.
enum Ended {
    /// The server no longer has it, or it was not renewed for half its TTL.
    Lost(&'static str),
    /// The backend was dropped.
    Closed,
}

/// Keeps the client's lease alive for as long as the backend lives; when it is lost, reports
/// the loss and takes a new one. Revokes the lease when the backend is dropped.
pub(super) async fn keep_alive(shared: Weak<Shared>, rpc: Rpc) {
    loop {
        let current = {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let state = strong.state();
            (
                state.lease,
                state.generation,
                state.ttl,
                strong.url.lease_ttl,
            )
        };
        match current {
            (Some(lease), generation, ttl, _) => match renew(&shared, &rpc, lease, ttl).await {
                Ended::Lost(why) => {
                    let Some(strong) = shared.upgrade() else {
                        return;
                    };
                    strong.lose_lease(generation, why);
                }
                Ended::Closed => {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), rpc.lease_revoke(lease)).await;
                    return;
                }
            },
            (None, _, _, asked) => {
                let granted = grant(&rpc, asked).await;
                let Some(strong) = shared.upgrade() else {
                    if let Ok((lease, _)) = granted {
                        let _ =
                            tokio::time::timeout(Duration::from_secs(1), rpc.lease_revoke(lease))
                                .await;
                    }
                    return;
                };
                match granted {
                    Ok((lease, ttl)) => {
                        let mut state = strong.state();
                        state.lease = Some(lease);
                        state.ttl = ttl;
                        drop(state);
                        tracing::info!(lease = format!("{lease:x}"), "new etcd lease");
                        strong.set_state(SessionState::Connected);
                    }
                    Err(error) => {
                        drop(strong);
                        tracing::warn!(%error, "granting a new etcd lease failed; retrying");
                        tokio::time::sleep(REOPEN_AFTER).await;
                    }
                }
            }
        }
    }
}

/// Renews `lease` every third of its TTL through one keep-alive stream, opened again when it
/// breaks, until the lease is lost or the backend is dropped.
async fn renew(shared: &Weak<Shared>, rpc: &Rpc, lease: i64, ttl: Duration) -> Ended {
    // The server ends the lease a TTL after the last keep-alive it received; a keep-alive
    // sent at `renewed` was received after it. Half a TTL leaves room for a slow answer.
    let mut renewed = Instant::now();
    let give_up = |renewed: Instant| renewed + ttl / 2;
    loop {
        if shared.strong_count() == 0 {
            return Ended::Closed;
        }
        if Instant::now() >= give_up(renewed) {
            return Ended::Lost("no keep-alive was answered for half the lease's TTL");
        }
        let sent = Instant::now();
        // The stream opens with a first keep-alive, whose answer says whether the lease is
        // still there.
        let opened = tokio::time::timeout_at(give_up(renewed), async {
            let (keeper, mut stream) = rpc.lease_keep_alive(lease).await?;
            let first = stream.message().await?;
            Ok::<_, tonic::Status>((keeper, stream, first))
        })
        .await;
        let (keeper, mut stream) = match opened {
            Err(_) => continue,
            Ok(Ok((_, _, Some(answer)))) if answer.ttl <= 0 => {
                return Ended::Lost("the server no longer has the lease");
            }
            Ok(Ok((keeper, stream, Some(_)))) => (keeper, stream),
            Ok(Ok((_, _, None))) => {
                tracing::debug!("the etcd keep-alive stream ended at once");
                suspend(shared);
                tokio::time::sleep_until((Instant::now() + REOPEN_AFTER).min(give_up(renewed)))
                    .await;
                continue;
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "opening the etcd keep-alive stream failed");
                suspend(shared);
                tokio::time::sleep_until((Instant::now() + REOPEN_AFTER).min(give_up(renewed)))
                    .await;
                continue;
            }
        };
        renewed = sent;
        connect(shared);
        loop {
            tokio::time::sleep_until((renewed + ttl / 3).min(give_up(renewed))).await;
            if shared.strong_count() == 0 {
                return Ended::Closed;
            }
            let sent = Instant::now();
            if keeper
                .send(LeaseKeepAliveRequest { id: lease })
                .await
                .is_err()
            {
                break;
            }
            match tokio::time::timeout_at(give_up(renewed), stream.message()).await {
                Ok(Ok(Some(answer))) if answer.ttl > 0 => {
                    renewed = sent;
                    connect(shared);
                }
                Ok(Ok(Some(_))) => return Ended::Lost("the server no longer has the lease"),
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
            }
        }
        suspend(shared);
    }
}

fn suspend(shared: &Weak<Shared>) {
    if let Some(strong) = shared.upgrade() {
        strong.set_state(SessionState::Suspended);
    }
}

fn connect(shared: &Weak<Shared>) {
    if let Some(strong) = shared.upgrade() {
        strong.set_state(SessionState::Connected);
    }
}

impl Shared {
    pub(super) fn set_state(&self, state: SessionState) {
        self.status.send_if_modified(|status| {
            let changed = status.state != state;
            status.state = state;
            changed
        });
    }

    /// Forgets the locks of lease `generation` (unless already done), reports the loss, and
    /// lets the keep-alive task take a new lease.
    pub(super) fn lose_lease(&self, generation: u64, why: &'static str) {
        let mut state = self.state();
        if state.generation != generation || state.lease.is_none() {
            return;
        }
        let old = state.lease.take();
        let ended = state.end_generation();
        let lost = ended.len();
        let watches: Vec<i64> = ended.into_iter().map(|held| held.extra.watch).collect();
        state.keys.clear();
        drop(state);
        tracing::warn!(locks = lost, why, "etcd lease lost; its locks are lost");
        for watch in watches {
            self.unwatch(watch);
        }
        self.status.send_modify(|status| {
            status.state = SessionState::Suspended;
            status.sessions_lost += 1;
        });
        if let Some(old) = old {
            // Frees the old keys at once when the server can be reached.
            let rpc = self.rpc.clone();
            crate::cleanup::spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, rpc.lease_revoke(old)).await;
            });
        }
    }
}

/// How long after its first delete the key of a put that never answered is deleted again: a
/// proposal the server accepted is applied or dropped within a few election timeouts.
const LATE_PUT: Duration = Duration::from_secs(10);

/// Deletes keys whose lease ended and keys left behind, in the background, through the
/// client-side reaper ([`crate::reaper`]).
impl Reap for Shared {
    type Work = Orphan;

    fn due(&self, now: Instant) -> (Vec<Orphan>, Option<Instant>) {
        self.state().due(now, |_, held| {
            self.unwatch(held.extra.watch);
            (Some(held.token), None)
        })
    }

    async fn reap(&self, work: Vec<Orphan>) -> bool {
        let mut failed = Vec::new();
        for orphan in work {
            if orphan.generation != self.state().generation {
                self.state().reaped(&orphan);
                continue;
            }
            match self.delete_key(&orphan.key, orphan.token).await {
                Ok(_)
                    if orphan.token.is_none()
                        && orphan.extra.is_none_or(|until| until > Instant::now()) =>
                {
                    // A put that never answered may still be applied: delete again until it
                    // cannot be any more.
                    let mut orphan = orphan;
                    orphan.extra.get_or_insert(Instant::now() + LATE_PUT);
                    failed.push(orphan);
                }
                Ok(_) => {
                    let mut state = self.state();
                    state.reaped(&orphan);
                    if orphan.generation == state.generation {
                        state.keys.remove(&orphan.key);
                    }
                }
                Err(error) => {
                    tracing::warn!(key = %orphan.key, %error, "deleting a lock key failed; retrying");
                    failed.push(orphan);
                }
            }
        }
        let retry = !failed.is_empty();
        self.state().orphans.extend(failed);
        retry
    }
}
