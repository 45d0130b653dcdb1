//! A waiter of a session lock: a blocking statement on a connection of its own, in a task, so
//! that dropping the waiter cancels the statement instead of leaving it to grant.

use super::*;

/// The outcome of one blocking attempt, from its background task.
enum Outcome<D: Dialect> {
    Granted {
        conn: Arc<LockConn<D>>,
        token: u64,
        key: D::Key,
    },
    TimedOut,
    Failed(Error),
}

/// What a dropped waiter leaves in [`Pending::session`]: the task then knows that a cancel may
/// be on its way to the session it used.
const DROPPED: u64 = u64::MAX;

/// A blocking attempt in flight: its task's answer and its session (to cancel it).
pub(super) struct Pending<D: Dialect> {
    answer: oneshot::Receiver<Outcome<D>>,
    /// The session running the statement, 0 when none is.
    session: Arc<AtomicU64>,
    /// Told when the waiter is dropped, for a dialect that stops the statement by closing its
    /// connection ([`Dialect::CANCEL_BY_CLOSING`]): the task holds the connection.
    dropped: Arc<Notify>,
}

pub(super) struct SessionWaiter<D: Dialect> {
    pub(super) shared: Arc<Shared<D>>,
    pub(super) name: LockName,
    pub(super) owner: Owner,
    pub(super) lease: Duration,
    pub(super) pending: Option<Pending<D>>,
}

impl<D: Dialect> SessionWaiter<D> {
    fn start(&mut self, max: Duration) -> &mut Pending<D> {
        let (send, answer) = oneshot::channel();
        let session = Arc::new(AtomicU64::new(0));
        let shared = self.shared.clone();
        let name = self.name.clone();
        let task_session = session.clone();
        let dropped = Arc::new(Notify::new());
        let task_dropped = dropped.clone();
        tokio::spawn(async move {
            let outcome = blocking_attempt(&shared, &name, max, &task_session, &task_dropped).await;
            let granted = match &outcome {
                Outcome::Granted { conn, .. } => Some(conn.clone()),
                _ => None,
            };
            // The granted connection is reset after the grant is handed over, off its path;
            // taken before, so that its unlock (and so its return to the idle connections,
            // where a try would run with the wait's settings) waits for the reset.
            let mut reset = match &granted {
                Some(conn) => Some(conn.conn.lock().await),
                None => None,
            };
            if let Err(Outcome::Granted { conn, key, .. }) = send.send(outcome) {
                // Nobody took the grant: give it back.
                shared.state().unlock.push((conn, key, None));
                shared.reaper.notify_one();
            }
            if let (Some(c), Some(conn)) = (reset.as_deref_mut(), &granted)
                && let Err(error) = shared.dialect.after_wait(c).await
            {
                tracing::debug!(%error, "resetting a waiter's connection failed; it is not reused");
                conn.given_up.store(true, Ordering::SeqCst);
            }
            drop(reset);
        });
        self.pending.insert(Pending {
            answer,
            session,
            dropped,
        })
    }
}

async fn blocking_attempt<D: Dialect>(
    shared: &Shared<D>,
    name: &LockName,
    max: Duration,
    session: &AtomicU64,
    dropped: &Notify,
) -> Outcome<D> {
    let start = Instant::now();
    // When every waiting statement is taken (by waiters of locks that may be held by the
    // very task that now asks for this one), do not queue behind them: come back after a
    // short wait, so that the caller tries again on the primary connection. A nested
    // acquisition then polls instead of starving.
    let patience = max.min(PERMIT_PATIENCE);
    let permit = match tokio::time::timeout(patience, shared.waiting.clone().acquire_owned()).await
    {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) | Err(_) => return Outcome::TimedOut,
    };
    let max = max.saturating_sub(start.elapsed());
    if max.is_zero() {
        return Outcome::TimedOut;
    }
    // Held until the statement ends: it bounds waiting statements, not held locks.
    let _permit = permit;
    if session.load(Ordering::SeqCst) == DROPPED {
        return Outcome::TimedOut;
    }
    let conn = match shared.idle_or_new().await {
        Ok(conn) => conn,
        Err(error) => return Outcome::Failed(error),
    };
    // A waiter dropped before this point sent no cancel (there was no session to cancel): its
    // statement must not start, or it would wait in the server's queue, unseen, for all of
    // `max`, and take the lock on its way out.
    if session
        .compare_exchange(0, conn.session, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        shared.to_idle(conn);
        return Outcome::TimedOut;
    }
    let key = D::key(name);
    let result = {
        let mut c = conn.conn.lock().await;
        let waiting = shared.dialect.lock_waiting(&mut c, &key, name, max);
        if D::CANCEL_BY_CLOSING {
            tokio::select! {
                result = waiting => result,
                () = dropped.notified() => {
                    // The statement is left unfinished: the connection closes with this task's
                    // handle (its only one), and the server drops the wait, or a grant that
                    // landed meanwhile, when it sees the connection gone.
                    conn.given_up.store(true, Ordering::SeqCst);
                    return Outcome::TimedOut;
                }
            }
        } else {
            waiting.await
        }
    };
    // Done with the statement: a waiter that gives up from now on has nothing to cancel.
    if session.swap(0, Ordering::SeqCst) == DROPPED {
        // The waiter was dropped while the statement ran and sent a cancel, which may still
        // arrive: this session never serves another statement (it closes when let go).
        conn.given_up.store(true, Ordering::SeqCst);
    }
    match result {
        Ok(Some(token)) => Outcome::Granted { conn, token, key },
        failed => {
            // A statement that failed after it took the lock (a cancel landing between the
            // lock and the counter) leaves the session holding it: session locks outlive a
            // failed statement. This connection holds nothing else, so unlock everything
            // before it serves another waiter; if that fails, closing it frees everything.
            let clean = {
                let mut c = conn.conn.lock().await;
                shared.dialect.unlock_all(&mut c).await.is_ok()
                    && shared.dialect.after_wait(&mut c).await.is_ok()
            };
            if clean {
                shared.to_idle(conn);
            }
            match failed {
                Err(error) => Outcome::Failed(error),
                Ok(_) => Outcome::TimedOut,
            }
        }
    }
}

impl<D: Dialect> Drop for SessionWaiter<D> {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        // Stop the blocked statement; a grant that lands anyway is given back by the task.
        let session = pending.session.swap(DROPPED, Ordering::SeqCst);
        if D::CANCEL_BY_CLOSING {
            pending.dropped.notify_one();
            return;
        }
        if session != 0
            && session != DROPPED
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let shared = self.shared.clone();
            crate::cleanup::spawn_on(&runtime, async move {
                shared.cancel_statement(session).await;
            });
        }
    }
}

#[async_trait]
impl<D: Dialect> ReleaseWaiter for SessionWaiter<D> {
    async fn wait(&mut self, max: Duration) -> Woken {
        let deadline = Instant::now() + max;
        if self.pending.is_none() {
            self.start(max);
        }
        let Some(pending) = self.pending.as_mut() else {
            return Woken::Retry;
        };
        let outcome = tokio::select! {
            outcome = &mut pending.answer => outcome,
            // The server's own wait ends the statement; this is the backstop.
            _ = tokio::time::sleep_until(deadline + Duration::from_secs(1)) => return Woken::Retry,
        };
        self.pending = None;
        match outcome {
            Ok(Outcome::Granted { conn, token, key }) => {
                let since = Instant::now();
                let mut state = self.shared.state();
                let slot = HeldKey::of(&self.name, &self.owner);
                if state.held.contains_key(&slot) {
                    // Cannot happen (the server excludes this client's other sessions), but
                    // never record two holders.
                    state.unlock.push((conn, key, None));
                    drop(state);
                    self.shared.reaper.notify_one();
                    return Woken::Retry;
                }
                state.held.insert(
                    slot,
                    Held {
                        owner: self.owner.clone(),
                        holds: 1,
                        token,
                        key,
                        conn,
                        expires_at: since + self.lease,
                    },
                );
                drop(state);
                self.shared.reaper.notify_one();
                Woken::Granted {
                    fencing_token: token,
                    since,
                    lease: self.lease,
                }
            }
            Ok(Outcome::TimedOut) => Woken::Retry,
            Ok(Outcome::Failed(error)) => {
                tracing::warn!(%error, scheme = D::SCHEME, "waiting for a session lock failed");
                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100)))
                    .await;
                Woken::Retry
            }
            Err(_) => Woken::Retry,
        }
    }
}
