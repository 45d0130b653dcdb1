//! What the ZooKeeper backend does with its session: nodes created, found, deleted; locks
//! held, queued and ended.

use super::*;

impl Shared {
    pub(super) fn session(&self) -> Arc<Session> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update completes without a panic point: a poisoned lock is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn err(&self, operation: &'static str, error: zk::Error) -> Error {
        Error::backend(self.scheme, operation, error)
    }

    /// Makes this session's server catch up with the leader before a read (`sync`). Reads
    /// are answered by the server a session talks to, which may be a follower behind: a read
    /// about another session's nodes needs this to see what that session was told is done.
    /// A missing `path` is no error: the read that follows will say so.
    pub(super) async fn catch_up(
        &self,
        session: &Session,
        path: &str,
        operation: &'static str,
    ) -> Result<()> {
        match session.client.sync(path).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(self.err(operation, e)),
        }
    }

    pub(super) fn node_data(owner: &Owner) -> Vec<u8> {
        format!("distlock {owner}").into_bytes()
    }

    pub(super) fn orphan(&self, path: Arc<str>, token: Option<u64>, generation: u64) {
        self.state().orphans.push(Orphan {
            ended: None,
            path,
            token,
            generation,
            prefix_lookups: None,
            _counted: crate::cleanup::Counted::new(),
        });
        self.reaper.notify_one();
    }

    /// A create of a node starting with `prefix` may have landed although it failed: the
    /// reaper looks for that node (now and once more a little later) and deletes it, so that
    /// it cannot block the queue for the rest of the session.
    pub(super) fn orphan_prefix(&self, prefix: &str, generation: u64) {
        tracing::debug!(%prefix, "a lock node create has an unknown outcome; the reaper will look for it");
        self.state().orphans.push(Orphan {
            ended: None,
            path: prefix.into(),
            token: None,
            generation,
            prefix_lookups: Some(1),
            _counted: crate::cleanup::Counted::new(),
        });
        self.reaper.notify_one();
    }

    /// Waits until `session` is connected, at most a session timeout.
    pub(super) async fn connected(&self, session: &Session) -> Result<()> {
        let mut watcher = session.client.state_watcher();
        let deadline = Instant::now() + session.client.session_timeout();
        loop {
            match watcher.state() {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    return Ok(());
                }
                zk::SessionState::Disconnected => {
                    if tokio::time::timeout_at(deadline, watcher.changed())
                        .await
                        .is_err()
                    {
                        return Err(self.err("reconnect", zk::Error::ConnectionLoss));
                    }
                }
                state => return Err(self.err("reconnect", state_error(state))),
            }
        }
    }

    /// Makes the lock's container node (and the base path if it vanished).
    pub(super) async fn make_lock_node(&self, session: &Session, path: &str) -> Result<()> {
        for _ in 0..ATTEMPTS {
            match session.client.create(path, &[], &container()).await {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => session
                    .client
                    .mkdir(&self.url.base, &persistent())
                    .await
                    .map_err(|e| self.err("create the base path", e))?,
                Err(zk::Error::ConnectionLoss) => self.connected(session).await?,
                Err(e) => return Err(self.err("create the lock's node", e)),
            }
        }
        Err(self.err(
            "create the lock's node",
            zk::Error::UnexpectedError("it vanished after every attempt".into()),
        ))
    }

    /// Creates a protected ephemeral sequential node under `lock`. A create whose reply was
    /// lost with the connection is found again by its unique prefix.
    pub(super) async fn create_node(
        &self,
        session: &Session,
        lock: &str,
        kind: &LockKind,
        owner: &Owner,
    ) -> Result<Node> {
        let prefix = format!(
            "{lock}/{PROTECTED}{}-{}",
            uuid::Uuid::new_v4().hyphenated(),
            recipes::marker(kind)
        );
        let data = recipes::data(kind, owner);
        for _ in 0..ATTEMPTS {
            match session
                .client
                .create(&prefix, &data, &ephemeral_sequential())
                .await
            {
                Ok((stat, sequence)) => {
                    return Ok(Node {
                        path: format!("{prefix}{sequence}").into(),
                        token: token_of(&stat),
                    });
                }
                Err(zk::Error::NoNode) => self.make_lock_node(session, lock).await?,
                Err(zk::Error::ConnectionLoss) => {
                    let found = async {
                        self.connected(session).await?;
                        self.find_protected(session, lock, &prefix).await
                    }
                    .await;
                    match found {
                        Ok(Some(node)) => {
                            tracing::debug!(node = %node.path, "found the node of a create whose reply was lost");
                            return Ok(node);
                        }
                        // Not created: the next round creates it with the same prefix.
                        Ok(None) => {}
                        Err(error) => {
                            self.orphan_prefix(&prefix, session.generation);
                            return Err(error);
                        }
                    }
                }
                Err(e) => return Err(self.err("create a lock node", e)),
            }
        }
        self.orphan_prefix(&prefix, session.generation);
        Err(self.err("create a lock node", zk::Error::ConnectionLoss))
    }

    /// Deletes the node starting with the protected `prefix` (a full path prefix), if there
    /// is one; true when one was found.
    pub(super) async fn delete_protected(&self, session: &Session, prefix: &str) -> Result<bool> {
        let Some((lock, _)) = prefix.rsplit_once('/') else {
            return Ok(false);
        };
        match self.find_protected(session, lock, prefix).await? {
            Some(node) => {
                tracing::debug!(node = %node.path, "deleting the node of a failed create");
                self.delete_node(session, &node.path, None).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The node whose path starts with `prefix`, if the server has it.
    pub(super) async fn find_protected(
        &self,
        session: &Session,
        lock: &str,
        prefix: &str,
    ) -> Result<Option<Node>> {
        let wanted = child_name(prefix);
        // The server this session talks to now may be a follower that has not applied the
        // lost create yet: catching up first finds a node that exists (not created a second
        // time, or left behind).
        self.catch_up(session, lock, "look for a lock node").await?;
        let children = match session.client.list_children(lock).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err("look for a lock node", e)),
        };
        let Some(child) = children.into_iter().find(|c| c.starts_with(wanted)) else {
            return Ok(None);
        };
        let path = format!("{lock}/{child}");
        match session.client.check_stat(&path).await {
            Ok(Some(stat)) => Ok(Some(Node {
                path: path.into(),
                token: token_of(&stat),
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(self.err("look for a lock node", e)),
        }
    }

    /// The nodes of every recipe under `lock`, by sequence number; empty when the lock node
    /// is gone.
    pub(super) async fn queue(&self, session: &Session, lock: &str) -> Result<Vec<String>> {
        match session.client.list_children(lock).await {
            Ok(children) => Ok(queue(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.err("list the lock's queue", e)),
        }
    }

    /// Deletes one of our nodes; `Ok(false)` when it was already gone. For the naive lock's
    /// shared path, `token` makes sure it is still the node we made.
    pub(super) async fn delete_node(
        &self,
        session: &Session,
        path: &str,
        token: Option<u64>,
    ) -> Result<bool> {
        for _ in 0..ATTEMPTS {
            let version = match token {
                None => None,
                Some(token) => match session.client.check_stat(path).await {
                    Ok(Some(stat)) if token_of(&stat) == token => Some(stat.version),
                    Ok(_) => return Ok(false),
                    Err(zk::Error::ConnectionLoss) => {
                        self.connected(session).await?;
                        continue;
                    }
                    Err(e) => return Err(self.err("delete a lock node", e)),
                },
            };
            match session.client.delete(path, version).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                // The version moved since the look: a mutex's mark (a `setData` of the same data,
                // sent in the background after its grant) may have landed in between. Look again:
                // the token (the node's creation) tells whether it is still ours.
                Err(zk::Error::BadVersion) => continue,
                Err(zk::Error::ConnectionLoss) => {
                    self.connected(session).await?;
                    // The delete may have been applied: the next round finds out.
                    match session.client.check_stat(path).await {
                        Ok(None) => return Ok(true),
                        Ok(Some(_)) => continue,
                        Err(e) => return Err(self.err("delete a lock node", e)),
                    }
                }
                Err(e) => return Err(self.err("delete a lock node", e)),
            }
        }
        Err(self.err("delete a lock node", zk::Error::ConnectionLoss))
    }

    /// Whether our node still exists (and, for the naive lock, is still ours).
    pub(super) async fn exists(&self, session: &Session, path: &str, token: u64) -> Result<bool> {
        match session.client.check_stat(path).await {
            Ok(stat) => Ok(stat.is_some_and(|stat| token_of(&stat) == token)),
            Err(e) => Err(self.err("check a lock node", e)),
        }
    }

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
            .map(|held| (held.path.clone(), held.token))
        else {
            return Ok(None);
        };
        let alive = self.exists(session, &path, token).await?;
        let mut state = self.state();
        let generation = state.generation;
        match state.held.get_mut(&key) {
            Some(held) if held.path == path && held.generation == generation => {
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

    /// Records a grant of `node` to `owner`. False when it cannot stand: the session it was
    /// made in is gone, or the owner got the lock through another node meanwhile.
    pub(super) fn record_grant(
        &self,
        name: &LockName,
        owner: &Owner,
        node: &Node,
        lease: Duration,
        generation: u64,
        waiter: Option<u64>,
    ) -> bool {
        let mut state = self.state();
        let key = (name.clone(), owner.clone());
        if generation != state.generation || state.held(&key).is_some() {
            return false;
        }
        if let Some(id) = waiter {
            match state.waiters.get(&id) {
                Some(queued) if queued.node.as_ref().is_some_and(|n| n.path == node.path) => {
                    state.waiters.remove(&id);
                }
                _ => return false,
            }
        }
        let expires_at = Instant::now() + lease;
        state.held.insert(
            key,
            Held {
                path: node.path.clone(),
                token: node.token,
                holds: 1,
                expires_at,
                generation,
            },
        );
        drop(state);
        self.reaper.notify_one();
        true
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
                            self.orphan(node.path, None, session.generation);
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
                    self.orphan(node.path, None, session.generation);
                }
                return Err(error);
            }
        };
        let position = line.iter().position(|c| c == child_name(&node.path));
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
                    self.orphan(node.path, None, session.generation);
                }
                Ok(Acquired::Held {
                    ttl: Some(Duration::ZERO),
                })
            }
            Some(_) => {
                if waiter.is_none() {
                    // A one-off attempt leaves the queue at once.
                    if let Err(error) = self.delete_node(&session, &node.path, None).await {
                        tracing::warn!(%error, "leaving the queue failed; deleting in the background");
                        self.orphan(node.path, None, session.generation);
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
            let node = match session.client.create(&path, &data, &ephemeral()).await {
                Ok((stat, _)) => Node {
                    path: path.clone(),
                    token: token_of(&stat),
                },
                Err(zk::Error::NodeExists) => return Ok(Acquired::Held { ttl: None }),
                Err(zk::Error::NoNode) => {
                    session
                        .client
                        .mkdir(&self.url.base, &persistent())
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
                                && !self.state().held.values().any(|held| held.path == path) =>
                        {
                            Node {
                                path: path.clone(),
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
            self.orphan(node.path, Some(node.token), session.generation);
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

    /// Reads many of our nodes in one request: `true` where the node is still ours.
    pub(super) async fn read_many(
        &self,
        session: &Session,
        nodes: &[Option<(Arc<str>, u64)>],
    ) -> Result<Vec<bool>> {
        if nodes.iter().all(Option::is_none) {
            return Ok(vec![false; nodes.len()]);
        }
        let mut reader = session.client.new_multi_reader();
        for (path, _) in nodes.iter().flatten() {
            reader
                .add_get_data(path)
                .map_err(|e| self.err("check lock nodes", e))?;
        }
        let mut results = reader
            .commit()
            .await
            .map_err(|e| self.err("check lock nodes", e))?
            .into_iter();
        Ok(nodes
            .iter()
            .map(|node| match node {
                None => false,
                Some((_, token)) => matches!(
                    results.next(),
                    Some(zk::MultiReadResult::Data { stat, .. }) if token_of(&stat) == *token
                ),
            })
            .collect())
    }

    /// Our held nodes for `locks`, `None` where we hold none.
    pub(super) fn held_nodes(&self, locks: &[(LockName, Owner)]) -> Vec<Option<(Arc<str>, u64)>> {
        let state = self.state();
        locks
            .iter()
            .map(|key| state.held(key).map(|held| (held.path.clone(), held.token)))
            .collect()
    }
}
