//! The znodes: lock nodes created, found by their protected prefix, listed, read, marked and
//! deleted, and an operator's force-unlock.

use super::*;

impl Shared {
    pub(super) fn node_data(owner: &Owner) -> Vec<u8> {
        format!("distlock {owner}").into_bytes()
    }

    /// Makes the lock's container node (and the base path if it vanished).
    pub(super) async fn make_lock_node(&self, session: &Session, path: &str) -> Result<()> {
        for _ in 0..ATTEMPTS {
            match session
                .client
                .create(path, &[], &self.url.node(zk::CreateMode::Container))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => session
                    .client
                    .mkdir(&self.url.base, &self.url.node(zk::CreateMode::Persistent))
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
                .create(
                    &prefix,
                    &data,
                    &self.url.node(zk::CreateMode::EphemeralSequential),
                )
                .await
            {
                Ok((stat, sequence)) => {
                    return Ok(Node {
                        key: format!("{prefix}{sequence}").into(),
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
                            tracing::debug!(node = %node.key, "found the node of a create whose reply was lost");
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
                tracing::debug!(node = %node.key, "deleting the node of a failed create");
                self.delete_node(session, &node.key, None).await?;
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
                key: path.into(),
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

    /// Whether the leader still has `node`, ours: a `sync` and then a read of the node, sent
    /// together (the server answers a session's requests in order, so the read waits for the
    /// sync).
    pub(super) async fn probe(&self, session: &Session, node: &Node) -> Probe {
        let synced = session.client.sync(&node.key);
        let read = session.client.check_stat(&node.key);
        match tokio::join!(synced, read) {
            (Ok(()) | Err(zk::Error::NoNode), Ok(Some(stat))) if token_of(&stat) == node.token => {
                Probe::Alive
            }
            (Ok(()) | Err(zk::Error::NoNode), Ok(_)) => Probe::Gone,
            _ => Probe::Failed,
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

    /// Deletes every node that holds `name`, in every recipe's line (all readers of a
    /// read-write lock), including one granted on another server just before this call; the
    /// naive lock's one node. True when something was freed.
    pub(super) async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        let session = self.session();
        let lock = lock_path(&self.url.base, name.as_str());
        if self.url.naive {
            return match session.client.delete(&lock, None).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) => Err(self.err("force-unlock", e)),
            };
        }
        self.catch_up(&session, &lock, "force-unlock").await?;
        for _ in 0..ATTEMPTS {
            let holders = recipes::holders(&self.queue(&session, &lock).await?);
            if holders.is_empty() {
                return Ok(false);
            }
            let mut freed = false;
            for node in holders {
                match session.client.delete(&format!("{lock}/{node}"), None).await {
                    Ok(()) => freed = true,
                    // Released meanwhile.
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.err("force-unlock", e)),
                }
            }
            if freed {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Tells the waiter behind `node`, just granted, that it is first in line now: a `setData`
    /// of the node (its data unchanged) fires that waiter's watch, set while the node was not
    /// yet first, so the waiter looks at the line while we hold and then takes our release
    /// alone as its grant, with no look after it. One more write per grant that may have a
    /// waiter behind, sent in the background (the grant does not wait for it; a mark sent
    /// after our release finds no node). Only for the mutex: the nodes behind a writer are
    /// often readers, which look at the line after any change anyway.
    pub(super) fn mark_held(
        &self,
        session: Arc<Session>,
        node: &Node,
        kind: &LockKind,
        owner: &Owner,
    ) {
        if !matches!(kind, LockKind::Exclusive) {
            return;
        }
        let (path, data) = (node.key.clone(), recipes::data(kind, owner));
        let limit = self.url.session_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(limit, session.client.set_data(&path, &data, None)).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "marking a granted node failed (released already?)");
                }
                Err(_) => tracing::debug!("marking a granted node timed out"),
            }
        });
    }
}
