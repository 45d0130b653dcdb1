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
/// disconnected for half a session timeout, or unconfirmed by the leader for as long while
/// something is at stake: see [`liveness`]), forgets its locks and opens a new one.
pub(super) async fn supervise(shared: Weak<Shared>, mut watcher: zk::StateWatcher) {
    // When the leader last confirmed the session alive. A session starts confirmed: its
    // handshake went through the leader.
    let mut confirmed = Instant::now();
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
                confirmed = Instant::now();
                continue;
            }
        };
        {
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
        }
        let since = suspended.then(Instant::now);
        let verdict = tokio::select! {
            _ = watcher.changed() => continue,
            verdict = liveness(&shared, &mut confirmed, since) => verdict,
        };
        match verdict {
            Verdict::Gone => return,
            Verdict::Disconnected => tracing::warn!(
                "disconnected for half a session timeout; treating the session as lost"
            ),
            Verdict::Unconfirmed => tracing::warn!(
                "the leader confirmed nothing for half a session timeout; treating the session as lost"
            ),
            Verdict::Ended => {
                tracing::warn!("the leader has none of the session's held nodes; treating the session as lost");
            }
        }
        match renew_session(&shared).await {
            Some(next) => watcher = next,
            None => return,
        }
        confirmed = Instant::now();
    }
}

/// What [`liveness`] found.
enum Verdict {
    /// The backend is gone.
    Gone,
    /// Disconnected for half a session timeout.
    Disconnected,
    /// Something is at stake, and the leader confirmed nothing for half a session timeout.
    Unconfirmed,
    /// Every held node probed is gone from the leader.
    Ended,
}

/// Keeps `confirmed` (when the leader last confirmed the session alive) and returns once the
/// session must be taken as lost: disconnected (since `disconnected`) for half a session
/// timeout, or unconfirmed for as long while it holds or queues something.
///
/// **Disconnected.** The server expires a session a session timeout after it last heard from
/// the client, and the client is heard from at least every third of it: after half a timeout
/// without a connection, the locks are given up before the server can end them.
///
/// **Unconfirmed.** A connection that looks fine proves little: a follower answers the
/// client's pings itself and tells the leader of them later, in its own pings, so a follower
/// that the leader no longer hears keeps the client connected while the leader expires the
/// session, deletes its nodes and grants its locks to others. The follower notices only after
/// the ensemble's `syncLimit`, which may be longer than the session timeout. So while
/// something is at stake, every sixth of a session timeout the session sends a `sync` (which
/// travels to the leader and back) and then reads one of its own ephemeral nodes
/// ([`Shared::confirm`]): found, and the session was alive at the leader at the sync, which
/// came after the probe was sent. The follower passes the client's activity on to the leader
/// in the pings it sent before that sync, so the leader cannot expire the session for a while
/// after it; half a session timeout after the last confirmed probe was sent, the session is
/// taken as lost, connected or not. The server answers a session's requests in order, so a
/// hung `sync` also holds the client's pings back, and the client soon sees its connection
/// drop: the clock keeps running through that. With nothing at stake there is nothing to
/// lose, and whatever comes to be at stake starts with a write, which the leader answers.
async fn liveness(
    shared: &Weak<Shared>,
    confirmed: &mut Instant,
    disconnected: Option<Instant>,
) -> Verdict {
    /// Probes in flight at once: a slow one does not hold the next back.
    const IN_FLIGHT: usize = 3;
    let timeout = match shared.upgrade() {
        Some(strong) => strong.session().client.session_timeout(),
        None => return Verdict::Gone,
    };
    let grace = timeout / 2;
    let disconnected = disconnected.map(|since| since + grace);
    let mut tick = tokio::time::interval(timeout / 6);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes = futures_util::stream::FuturesUnordered::new();
    loop {
        let unconfirmed = *confirmed + grace;
        let deadline = disconnected.map_or(unconfirmed, |until| until.min(unconfirmed));
        tokio::select! {
            _ = tick.tick() => {
                let Some(strong) = shared.upgrade() else {
                    return Verdict::Gone;
                };
                let session = strong.session();
                if strong.at_stake(session.generation).is_none() {
                    *confirmed = Instant::now();
                } else if probes.len() < IN_FLIGHT {
                    probes.push(async move {
                        tokio::time::timeout(grace, strong.confirm(&session)).await.ok()
                    });
                }
            }
            Some(answer) = futures_util::StreamExt::next(&mut probes) => match answer {
                Some(Some(sent)) => *confirmed = (*confirmed).max(sent),
                Some(None) => return Verdict::Ended,
                None => {}
            },
            () = tokio::time::sleep_until(deadline) => {
                if disconnected.is_some_and(|until| until <= Instant::now()) {
                    return Verdict::Disconnected;
                }
                let Some(strong) = shared.upgrade() else {
                    return Verdict::Gone;
                };
                let generation = strong.session().generation;
                if strong.at_stake(generation).is_some() {
                    return Verdict::Unconfirmed;
                }
                *confirmed = Instant::now();
            }
        }
    }
}

/// What one probe of [`Shared::probe`] found.
pub(super) enum Probe {
    /// The leader has the node, ours: the session was alive at the `sync`.
    Alive,
    /// The `sync` was answered, and the node is gone (or another's).
    Gone,
    /// No answer, or an error.
    Failed,
}

impl Shared {
    /// Probes until the leader confirms `session` alive, and returns when the confirmed
    /// probe was sent; `None` when every hold it probed was gone (the session ended).
    ///
    /// A held node the leader no longer has, while this client still records its hold, was
    /// deleted by someone else (a force-unlock): that hold is forgotten (its guard hears of it
    /// at its next check) and the next node at stake is probed. A waiter's node gone, or one
    /// this client released meanwhile, proves nothing either way: probed again after a pause.
    /// Nothing at stake any more counts as confirmed: there is nothing to lose.
    async fn confirm(&self, session: &Session) -> Option<Instant> {
        let mut pause = PROBE_PAUSE;
        let mut forgot = false;
        loop {
            let sent = Instant::now();
            let Some((node, held)) = self.at_stake(session.generation) else {
                return (!forgot).then_some(sent);
            };
            match self.probe(session, &node).await {
                Probe::Alive => return Some(sent),
                Probe::Gone if held && self.forget_hold(&node) => {
                    tracing::warn!(node = %node.key, "a held lock node is gone; its lock is lost");
                    forgot = true;
                    continue;
                }
                Probe::Gone | Probe::Failed => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PROBE_PAUSE_MAX);
        }
    }
}

/// The first pause between two probes of [`Shared::confirm`] when one proved nothing; it
/// doubles up to [`PROBE_PAUSE_MAX`].
const PROBE_PAUSE: Duration = Duration::from_millis(10);
const PROBE_PAUSE_MAX: Duration = Duration::from_millis(160);

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
