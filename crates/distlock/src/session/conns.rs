//! The lock connections: which one a try or a waiter takes (the primary, idle ones), what
//! they hold (asked patiently), and forgetting or giving up what they no longer hold.

use super::*;

impl<D: Dialect> Shared<D> {
    pub(super) async fn primary(&self) -> Result<Arc<LockConn<D>>> {
        let mut primary = self.primary.lock().await;
        if let Some(conn) = primary.as_ref() {
            return Ok(conn.clone());
        }
        let conn = LockConn::open(&self.dialect).await?;
        *primary = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets a primary connection that failed, so that the next request opens another.
    pub(super) async fn drop_primary(&self, failed: &Arc<LockConn<D>>) {
        let mut primary = self.primary.lock().await;
        if primary.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
            *primary = None;
        }
    }

    /// An idle lock connection, if one is kept.
    pub(super) fn take_idle(&self) -> Option<Arc<LockConn<D>>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop()
    }

    /// A connection for a waiter: an idle one, else the primary when nothing holds or uses it
    /// (so that a client whose first try failed waits on that try's connection), else a new
    /// one.
    pub(super) async fn idle_or_new(&self) -> Result<Arc<LockConn<D>>> {
        if let Some(conn) = self.take_idle() {
            return Ok(conn);
        }
        self.retire_unused_primary();
        match self.take_idle() {
            Some(conn) => Ok(conn),
            None => LockConn::open(&self.dialect).await,
        }
    }

    /// A waiter's connection that holds nothing now: keep it for the next waiter.
    ///
    /// Only the last handle goes idle: a connection that another task still has (a try or a
    /// release in flight on a former primary, a watcher's check) is never handed to a waiter,
    /// whose blocking statement would share its session; it closes with its last handle.
    pub(super) fn to_idle(&self, conn: Arc<LockConn<D>>) {
        if conn.given_up.load(Ordering::SeqCst) || Arc::strong_count(&conn) != 1 {
            return;
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if idle.len() < IDLE_KEPT {
            idle.push(conn);
        }
    }

    /// As [`Shared::held_keys`], asked up to three times before an error counts: a healthy
    /// connection's query can fail once (a stray cancel meant for a waiter's statement that
    /// ran on it earlier), and calling its locks lost would close it and free them.
    pub(super) async fn held_keys_surely(
        &self,
        conn: &LockConn<D>,
        keys: &[D::Key],
    ) -> Result<HashSet<D::Key>> {
        let mut attempt = 1;
        loop {
            match self.held_keys(conn, keys).await {
                Ok(held) => return Ok(held),
                Err(error) if attempt >= HELD_ATTEMPTS => return Err(error),
                Err(error) => {
                    tracing::debug!(%error, attempt, "asking a lock connection what it holds failed; asking again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// After a successful unlock on `conn`: a waiter's connection holding nothing more goes
    /// idle.
    pub(super) async fn after_unlock(&self, conn: Arc<LockConn<D>>) {
        if self
            .primary
            .lock()
            .await
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &conn))
        {
            return;
        }
        let in_use = self
            .state()
            .held
            .values()
            .any(|held| Arc::ptr_eq(&held.conn, &conn));
        if !in_use {
            self.to_idle(conn);
        }
    }

    /// An unlock of `key` on `conn` failed (or a failed try may have taken it): the
    /// connection may still hold it. It is never reused (neither primary nor idle again).
    /// While anything else has the connection (other grants, a request in flight on it; not
    /// other unlocks waiting for the reaper, `queued_elsewhere` of them outside the state),
    /// the unlock is kept for the reaper's next pass, and `ending` (the name whose lease
    /// ended or whose owner released it) stays marked as ending, which keeps the client's
    /// other owners from the name meanwhile: closing a connection that holds other owners'
    /// locks would free them before their guards could fire `lost()`, and leaving it would
    /// keep this lock held, by nobody, for as long as the longest of them. Otherwise the
    /// connection closes with its last handle, which frees the lock. True when the unlock
    /// was kept (the caller wakes the reaper if it should try at once).
    pub(super) async fn unlock_failed(
        &self,
        conn: Arc<LockConn<D>>,
        key: D::Key,
        ending: Option<HeldKey>,
        queued_elsewhere: usize,
    ) -> bool {
        conn.given_up.store(true, Ordering::SeqCst);
        self.drop_primary(&conn).await;
        let mut state = self.state();
        let queued = state
            .unlock
            .iter()
            .filter(|(queued, _, _)| Arc::ptr_eq(queued, &conn))
            .count();
        // Handles beyond this one and the queued unlocks': grants (recorded, or a try in
        // flight that has not recorded its grant yet), a check, a waiter's reset.
        let in_use = Arc::strong_count(&conn) > 1 + queued + queued_elsewhere;
        if in_use {
            // The name's mark passes to the kept unlock.
            state.unlock.push((conn, key, ending));
        } else if let Some(name) = &ending {
            state.ending.unmark(name);
        }
        in_use
    }

    /// [`Shared::unlock_failed`] for a failed try's unlock (no name marked), retried at once.
    async fn unlock_failed_now(&self, conn: Arc<LockConn<D>>, key: D::Key) {
        if self.unlock_failed(conn, key, None, 0).await {
            self.reaper.notify_one();
        }
    }

    pub(super) async fn is_locked(&self, name: &LockName) -> Result<bool> {
        Ok(!self.dialect.holders(&D::key(name)).await?.is_empty())
    }

    /// The token of `owner`'s grant of `name` when the server still holds it; `None` when
    /// the owner holds no grant, or the server let the grant go (then forgotten, and its
    /// guard told), or its connection failed (given up with its grants). Only the grant this
    /// check asked about is ever forgotten: a later grant of the name is left alone.
    pub(super) async fn alive(&self, name: &LockName, owner: &Owner) -> Result<Option<u64>> {
        let slot = HeldKey::of(name, owner);
        let Some((conn, key, token)) = self
            .state()
            .held
            .get(&slot)
            .filter(|held| &held.owner == owner)
            .map(|held| (held.conn.clone(), held.key.clone(), held.token))
        else {
            return Ok(None);
        };
        match self
            .held_keys_surely(&conn, std::slice::from_ref(&key))
            .await
        {
            Ok(keys) if keys.contains(&key) => Ok(Some(token)),
            Ok(_) => {
                // The server let it go: nothing is left there. Its guard is told.
                if self.forget_grant(&slot, &conn, token) {
                    self.status.send_modify(|status| status.sessions_lost += 1);
                }
                Ok(None)
            }
            Err(error) => {
                // The connection cannot say what it holds: it is given up, every lock on it
                // with it. Forgetting them drops the last handles, which closes it, and the
                // server frees what it held; their guards are told. Forgetting only this
                // lock would leave it held on a connection that lives on.
                tracing::warn!(%error, "a lock connection failed; its locks are lost");
                self.lose_connection(&conn).await;
                Ok(None)
            }
        }
    }

    /// Gives up a lock connection: no longer the primary, every grant on it forgotten (so
    /// that it closes), and the client told of a lost session.
    pub(super) async fn lose_connection(&self, conn: &Arc<LockConn<D>>) {
        conn.given_up.store(true, Ordering::SeqCst);
        self.drop_primary(conn).await;
        let forgotten = {
            let mut state = self.state();
            let before = state.held.len();
            state.held.retain(|_, held| !Arc::ptr_eq(&held.conn, conn));
            before - state.held.len()
        };
        if forgotten > 0 {
            self.status.send_modify(|status| status.sessions_lost += 1);
        }
    }

    /// Forgets the grant of `name` with `token` on `conn` (not a later grant made meanwhile);
    /// true when it was still there. Every background answer forgets through this check.
    pub(super) fn forget_grant(&self, slot: &HeldKey, conn: &Arc<LockConn<D>>, token: u64) -> bool {
        let mut state = self.state();
        let current = state
            .held
            .get(slot)
            .is_some_and(|held| Arc::ptr_eq(&held.conn, conn) && held.token == token);
        if current {
            state.held.remove(slot);
        }
        current
    }

    /// The grants of `locks` (for their owners) as the state records them now, in order;
    /// `None` where an owner holds none.
    pub(super) fn grants_of(&self, locks: &[(LockName, Owner)]) -> Vec<Option<Asked<D>>> {
        let state = self.state();
        locks
            .iter()
            .map(|(name, owner)| {
                let slot = HeldKey::of(name, owner);
                let held = state.held.get(&slot).filter(|h| &h.owner == owner)?;
                Some(Asked::of(&slot, held))
            })
            .collect()
    }

    /// Asks each lock connection holding some of `grants` which of them it still holds: one
    /// query per connection, not one per lock. In order: `Some(held)` per grant asked about,
    /// `None` where there was none or its connection failed (given up with its grants by
    /// [`Shared::lose_connection`]).
    pub(super) async fn ask_connections(&self, grants: &[Option<Asked<D>>]) -> Vec<Option<bool>> {
        let mut by_conn: Vec<ConnKeys<D>> = Vec::new();
        for grant in grants.iter().flatten() {
            match by_conn
                .iter_mut()
                .find(|(c, _)| Arc::ptr_eq(c, &grant.conn))
            {
                Some((_, keys)) => keys.push(grant.key.clone()),
                None => by_conn.push((grant.conn.clone(), vec![grant.key.clone()])),
            }
        }
        let mut answered: Vec<ConnHolds<D>> = Vec::new();
        for (conn, keys) in by_conn {
            match self.held_keys_surely(&conn, &keys).await {
                Ok(held) => answered.push((conn, held)),
                Err(error) => {
                    tracing::warn!(%error, "a lock connection failed; its locks are lost");
                    self.lose_connection(&conn).await;
                }
            }
        }
        grants
            .iter()
            .map(|grant| {
                let grant = grant.as_ref()?;
                answered
                    .iter()
                    .find(|(conn, _)| Arc::ptr_eq(conn, &grant.conn))
                    .map(|(_, held)| held.contains(&grant.key))
            })
            .collect()
    }

    /// Makes the primary connection an idle one when nothing holds or uses it (only the
    /// primary slot refers to it: no grant, unlock or request has it), so that the next try
    /// or wait takes it instead of opening a connection beside it. Skipped while the primary's
    /// slot is busy (a connection being opened, or handed out): never waits on it.
    pub(super) fn retire_unused_primary(&self) {
        let Ok(mut primary) = self.primary.try_lock() else {
            return;
        };
        if primary
            .as_ref()
            .is_some_and(|conn| Arc::strong_count(conn) == 1)
            && let Some(conn) = primary.take()
        {
            self.to_idle(conn);
        }
    }

    /// Stops the statement `session` runs (a dropped waiter's): asked on an idle lock
    /// connection when the client keeps one, so that it needs no connection of the operator's
    /// pool (which closes its idle ones, and cannot open one when the server is full).
    pub(super) async fn cancel_statement(&self, session: u64) {
        if let Some(conn) = self.take_idle() {
            let cancelled = {
                let mut c = conn.conn.lock().await;
                self.dialect.cancel(Some(&mut c), session).await
            };
            match cancelled {
                Ok(()) => {
                    self.to_idle(conn);
                    return;
                }
                // It may have died while idle: never reused, and the pool asks instead.
                Err(error) => {
                    tracing::debug!(%error, "cancelling on an idle lock connection failed");
                    conn.given_up.store(true, Ordering::SeqCst);
                }
            }
        }
        if let Err(error) = self.dialect.cancel(None, session).await {
            tracing::debug!(%error, "cancelling a dropped waiter's statement failed");
        }
    }

    /// An exclusive lock's try on `idle`, an idle lock connection; if that connection fails
    /// (it may have died while idle), once more on the primary.
    pub(super) async fn try_on_idle(
        &self,
        name: &LockName,
        key: &D::Key,
        idle: Arc<LockConn<D>>,
    ) -> Result<(Arc<LockConn<D>>, Option<u64>)> {
        let token = {
            let mut c = idle.conn.lock().await;
            self.dialect.try_lock(&mut c, key, name).await
        };
        let error = match token {
            Ok(token) => return Ok((idle, token)),
            Err(error) => error,
        };
        // The lock may have been taken before the statement failed: a connection that cannot
        // say is never reused (closing it frees it).
        if self.unlock(&idle, key).await.is_ok() {
            self.to_idle(idle);
        } else {
            self.unlock_failed_now(idle, key.clone()).await;
        }
        tracing::debug!(%error, "a try on an idle lock connection failed; trying the primary");
        self.try_on_connection(name, key, D::ONE_LOCK_PER_SESSION)
            .await
    }

    /// One try of `key` for `name`: on the primary connection, or (`own_session`) on an idle
    /// or new connection of its own. The connection and the token when granted.
    pub(super) async fn try_on_connection(
        &self,
        name: &LockName,
        key: &D::Key,
        own_session: bool,
    ) -> Result<(Arc<LockConn<D>>, Option<u64>)> {
        // An idle connection may have died while it was idle (a server restart, an idle
        // timeout): a failure on one is tried once more on a new connection.
        let mut from_idle = own_session;
        loop {
            let conn = if !own_session {
                self.primary().await?
            } else if from_idle {
                match self.take_idle() {
                    Some(conn) => conn,
                    None => {
                        from_idle = false;
                        LockConn::open(&self.dialect).await?
                    }
                }
            } else {
                LockConn::open(&self.dialect).await?
            };
            let token = {
                let mut c = conn.conn.lock().await;
                self.dialect.try_lock(&mut c, key, name).await
            };
            let error = match token {
                Ok(token) => return Ok((conn, token)),
                Err(error) => error,
            };
            // The lock may have been taken before the statement failed. A connection
            // that cannot say is never reused: closing it (its last handle dropped, also
            // as a former primary) frees it.
            if self.unlock(&conn, key).await.is_err() {
                self.unlock_failed_now(conn, key.clone()).await;
            } else {
                self.drop_primary(&conn).await;
                if own_session {
                    self.to_idle(conn);
                }
            }
            if !from_idle {
                return Err(error);
            }
            tracing::debug!(%error, "a try on an idle lock connection failed; trying a new one");
            from_idle = false;
        }
    }
}

/// A release's unlock of a name marked as ending. Dropped with the release: unmarks the
/// name, or, when the release was dropped before its unlock answered or before a failed one
/// was settled, hands the unlock (and the mark) to the reaper. Unlocking again is harmless
/// while the mark keeps the client's other owners from taking the name on that session.
pub(super) struct Unlocking<'a, D: Dialect> {
    pub(super) shared: &'a Shared<D>,
    pub(super) slot: HeldKey,
    pub(super) in_flight: Option<(Arc<LockConn<D>>, D::Key)>,
    /// Settled by [`Shared::unlock_failed`], mark and all.
    pub(super) settled: bool,
}

impl<D: Dialect> Drop for Unlocking<'_, D> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut state = self.shared.state();
        match self.in_flight.take() {
            Some((conn, key)) => {
                // Dropped inside `unlock_failed`: given up, but maybe still the primary.
                if conn.given_up.load(Ordering::SeqCst)
                    && let Ok(mut primary) = self.shared.primary.try_lock()
                    && primary.as_ref().is_some_and(|p| Arc::ptr_eq(p, &conn))
                {
                    *primary = None;
                }
                state.unlock.push((conn, key, Some(self.slot.clone())));
                drop(state);
                self.shared.reaper.notify_one();
            }
            None => state.ending.unmark(&self.slot),
        }
    }
}

impl<D: Dialect> Shared<D> {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State<D>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// True while an unlock of `name` is on its way (its lease ended, its release is in
    /// flight or being retried) and no owner of this client holds it: the server's lock is
    /// not anyone's then.
    pub(super) fn lease_ending(&self, key: &HeldKey) -> bool {
        let state = self.state();
        state.ending.contains(key) && !state.held.contains_key(key)
    }

    pub(super) async fn unlock(&self, conn: &LockConn<D>, key: &D::Key) -> Result<bool> {
        let mut c = conn.conn.lock().await;
        self.dialect.unlock(&mut c, key).await
    }

    pub(super) async fn held_keys(
        &self,
        conn: &LockConn<D>,
        keys: &[D::Key],
    ) -> Result<HashSet<D::Key>> {
        let mut c = conn.conn.lock().await;
        self.dialect.held(&mut c, keys).await
    }
}
