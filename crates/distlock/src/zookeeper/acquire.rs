//! The tries of a grant: the sequential lock's create-and-look, the naive lock's single node,
//! a holder's reentry, and who holds a lock we do not.

use super::*;
use crate::queue::Queue as _;

impl Shared {
    /// Re-enters a lock `owner` holds. `None` when it does not hold it (any more).
    pub(super) async fn reenter(
        &self,
        session: &Session,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Option<Acquired>> {
        let key = (name.clone(), owner.clone());
        let Some((path, token)) = self
            .state()
            .held(&key)
            .map(|held| (held.key.clone(), held.token))
        else {
            return Ok(None);
        };
        let alive = self.exists(session, &path, token).await?;
        let mut state = self.state();
        let generation = state.generation;
        match state.held.get_mut(&key) {
            Some(held) if held.key == path && held.generation == generation => {
                if alive {
                    held.holds += 1;
                    held.expires_at = held.expires_at.max(Instant::now() + lease);
                    Ok(Some(Acquired::Granted {
                        fencing_token: token,
                        holds: held.holds,
                    }))
                } else {
                    state.held.remove(&key);
                    Ok(None)
                }
            }
            _ => Ok(None),
        }
    }

    pub(super) async fn try_acquire_sequential(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let session = self.session();
        if let Some(granted) = self.reenter(&session, name, owner, lease).await? {
            return Ok(granted);
        }
        let lock = lock_path(&self.url.base, name.as_str());
        let (waiter, queued_node) = {
            let state = self.state();
            match state.waiter_of(name, owner) {
                Some(id) => (Some(id), state.waiters[&id].node.clone()),
                None => (None, None),
            }
        };
        // A one-off attempt first looks: when anyone holds or waits, it would only queue
        // and leave again, two writes the ensemble must log and sync, for the same answer.
        // A failed look (a lost connection) is no answer: the attempt goes on to queue, which
        // handles a lost connection.
        if waiter.is_none()
            && matches!(
                self.line(&session, &lock, name.kind()).await,
                Ok(line) if recipes::would_wait(name.kind(), &line)
            )
        {
            return Ok(Acquired::Held { ttl: None });
        }
        // A node made by an earlier attempt has stood behind others: a waiter behind it may be
        // watching it without knowing it is first now (see `Shared::mark_held`).
        let waited = queued_node.is_some();
        let node = match queued_node {
            Some(node) => node,
            None => {
                let node = self
                    .create_node(&session, &lock, name.kind(), owner)
                    .await?;
                if let Some(id) = waiter {
                    let mut state = self.state();
                    match state.waiters.get_mut(&id) {
                        Some(queued)
                            if queued.generation == session.generation && queued.node.is_none() =>
                        {
                            queued.node = Some(node.clone());
                        }
                        _ => {
                            // The waiter left while the node was being made, or another
                            // attempt of the same owner made the waiter's node first: this
                            // node is nobody's (tracked over the other, that one would stay
                            // queued for the session's life and block the lock).
                            drop(state);
                            self.orphan(node.key, None, session.generation);
                            return Ok(Acquired::Held {
                                ttl: Some(Duration::ZERO),
                            });
                        }
                    }
                }
                node
            }
        };
        let line = match self.line(&session, &lock, name.kind()).await {
            Ok(line) => line,
            Err(error) => {
                // A waiter's node stays queued for its next attempt; a one-off attempt's
                // node must not stay behind.
                if waiter.is_none() {
                    self.orphan(node.key, None, session.generation);
                }
                return Err(error);
            }
        };
        let position = line.iter().position(|c| c == child_name(&node.key));
        match position {
            Some(at) if recipes::blocker(name.kind(), &line, at).is_none() => {
                if self.record_grant(name, owner, &node, lease, session.generation, waiter) {
                    // Uncontended (nobody behind, never behind anyone): no mark.
                    if waited || line.len() > at + 1 {
                        self.mark_held(session.clone(), &node, name.kind(), owner);
                    }
                    return Ok(Acquired::Granted {
                        fencing_token: node.token,
                        holds: 1,
                    });
                }
                if waiter.is_none() {
                    self.orphan(node.key, None, session.generation);
                }
                Ok(Acquired::Held {
                    ttl: Some(Duration::ZERO),
                })
            }
            Some(_) => {
                if waiter.is_none() {
                    // A one-off attempt leaves the queue at once.
                    if let Err(error) = self.delete_node(&session, &node.key, None).await {
                        tracing::warn!(%error, "leaving the queue failed; deleting in the background");
                        self.orphan(node.key, None, session.generation);
                    }
                }
                Ok(Acquired::Held { ttl: None })
            }
            None => {
                // Our node is gone (an operator removed it): queue again at the next attempt.
                if let Some(id) = waiter
                    && let Some(queued) = self.state().waiters.get_mut(&id)
                {
                    queued.node = None;
                }
                Ok(Acquired::Held {
                    ttl: Some(Duration::ZERO),
                })
            }
        }
    }

    pub(super) async fn try_acquire_naive(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let session = self.session();
        if let Some(granted) = self.reenter(&session, name, owner, lease).await? {
            return Ok(granted);
        }
        let path: Arc<str> = lock_path(&self.url.base, name.as_str()).into();
        let data = Self::node_data(owner);
        for _ in 0..ATTEMPTS {
            let node = match session
                .client
                .create(&path, &data, &self.url.node(zk::CreateMode::Ephemeral))
                .await
            {
                Ok((stat, _)) => Node {
                    key: path.clone(),
                    token: token_of(&stat),
                },
                Err(zk::Error::NodeExists) => return Ok(Acquired::Held { ttl: None }),
                Err(zk::Error::NoNode) => {
                    session
                        .client
                        .mkdir(&self.url.base, &self.url.node(zk::CreateMode::Persistent))
                        .await
                        .map_err(|e| self.err("create the base path", e))?;
                    continue;
                }
                Err(zk::Error::ConnectionLoss) => {
                    self.connected(&session).await?;
                    let stat = session
                        .client
                        .check_stat(&path)
                        .await
                        .map_err(|e| self.err("check the lock node", e))?;
                    match stat {
                        None => continue,
                        // Ours if our session made it and no other owner of this client holds it.
                        Some(stat)
                            if stat.ephemeral_owner == session.client.session_id().0
                                && !self.state().held.values().any(|held| held.key == path) =>
                        {
                            Node {
                                key: path.clone(),
                                token: token_of(&stat),
                            }
                        }
                        Some(_) => return Ok(Acquired::Held { ttl: None }),
                    }
                }
                Err(e) => return Err(self.err("create the lock node", e)),
            };
            if self.record_grant(name, owner, &node, lease, session.generation, None) {
                return Ok(Acquired::Granted {
                    fencing_token: node.token,
                    holds: 1,
                });
            }
            self.orphan(node.key, Some(node.token), session.generation);
            return Ok(Acquired::Held {
                ttl: Some(Duration::ZERO),
            });
        }
        Err(self.err("create the lock node", zk::Error::ConnectionLoss))
    }

    /// Who holds a lock we do not: used to answer a release or extension by a non-holder.
    pub(super) async fn not_ours(&self, name: &LockName) -> Result<(Released, Extended)> {
        // A reader's hold is its own: other readers holding do not make it another's.
        if !matches!(name.kind(), LockKind::Read) && self.is_locked(name).await? {
            Ok((Released::HeldByOther, Extended::HeldByOther))
        } else {
            Ok((Released::NotHeld, Extended::NotHeld))
        }
    }

    pub(super) async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let session = self.session();
        let path = lock_path(&self.url.base, name.as_str());
        self.catch_up(&session, &path, "check the lock node")
            .await?;
        if self.url.naive {
            match session.client.check_stat(&path).await {
                Ok(stat) => Ok(stat.is_some()),
                Err(e) => Err(self.err("check the lock node", e)),
            }
        } else {
            Ok(!self.queue(&session, &path).await?.is_empty())
        }
    }
}
