//! The SQLite lock's waiter: its queue ticket (fair mode), polling with backoff and the
//! bell that rings it on a release.

use super::*;

/// Waits for a release by polling with a read-only query: SQLite cannot notify other
/// processes. In fair mode it also keeps its ticket fresh and returns only when the lock is
/// free and no live ticket is ahead of its own.
pub(super) struct SqliteWaiter {
    pub(super) backend: SqliteBackend,
    pub(super) name: String,
    pub(super) owner: String,
    /// A reader of a reader-writer lock: only a writer's ticket ahead holds it back.
    pub(super) reader: bool,
    pub(super) ticket: Option<i64>,
    /// Woken by a release's doorbell (fair mode on Linux); without one, waiters poll closely.
    pub(super) listener: Option<Listener>,
    pub(super) refreshed: tokio::time::Instant,
    pub(super) poll: Duration,
}

/// What a poll saw.
pub(super) struct Poll {
    pub(super) free: bool,
    /// Live tickets ahead of ours (0 without fair mode): how far back we are.
    pub(super) ahead: u32,
    /// Those of them that hold us back: all of them, or a reader's non-reader tickets.
    pub(super) blocking: u32,
    /// False when our ticket was removed (we were too slow to refresh it).
    pub(super) ticket_alive: bool,
}

/// One look at the lock and the queue, for a reader when `reader`.
pub(super) fn look(
    conn: &Connection,
    name: &str,
    ticket: Option<i64>,
    reader: bool,
) -> rusqlite::Result<Poll> {
    let now = now_ms();
    let free = live_row(conn, name, now)?.is_none() && (reader || !readers_hold(conn, name, now)?);
    let Some(ticket) = ticket else {
        return Ok(Poll {
            free,
            ahead: 0,
            blocking: 0,
            ticket_alive: true,
        });
    };
    let (ahead, blocking, ticket_alive): (u32, u32, bool) = query_row(
        conn,
        "SELECT
             (SELECT COUNT(*) FROM distlock_waiters
              WHERE name = ?1 AND seen_at_ms > ?2 AND ticket < ?3),
             (SELECT COUNT(*) FROM distlock_waiters
              WHERE name = ?1 AND seen_at_ms > ?2 AND ticket < ?3
                AND (?4 = 0 OR kind IS NOT 'r')),
             EXISTS (SELECT 1 FROM distlock_waiters WHERE ticket = ?3)",
        params![name, now - TICKET_STALE_MS, ticket, reader],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    Ok(Poll {
        free,
        ahead,
        blocking,
        ticket_alive,
    })
}

impl Poll {
    /// Our turn: the lock is free and nobody is queued ahead of us.
    pub(super) fn our_turn(&self) -> bool {
        self.free && self.blocking == 0 && self.ticket_alive
    }
}

impl SqliteWaiter {
    pub(super) async fn poll_once(&self) -> Result<Poll> {
        let (name, ticket, reader) = (self.name.clone(), self.ticket, self.reader);
        self.backend
            .run("poll the lock", move |conn| look(conn, &name, ticket, reader))
            .await
    }

    /// Looks every 200 µs on a blocking thread for up to `watch`, returning at our turn or
    /// with the last look. The connection is taken only for each look.
    pub(super) async fn watch_closely(&self, watch: Duration) -> Result<Poll> {
        let (name, ticket, reader) = (self.name.clone(), self.ticket, self.reader);
        let connection = self.backend.connection.clone();
        let busy_timeout = self.backend.busy_timeout;
        tokio::task::spawn_blocking(move || {
            let end = std::time::Instant::now() + watch;
            loop {
                std::thread::sleep(CLOSE_POLL);
                let poll = {
                    let conn = lock_connection(&connection, busy_timeout);
                    look(&conn, &name, ticket, reader)?
                };
                if poll.our_turn() || !poll.ticket_alive || std::time::Instant::now() >= end {
                    return Ok(poll);
                }
            }
        })
        .await
        .map_err(|e| Error::backend(SCHEME, "poll the lock", e))?
        .map_err(backend_error("poll the lock"))
    }

    /// Refreshes the ticket, or takes a new one at the back of the queue if it was removed.
    pub(super) async fn refresh_ticket(&mut self, alive: bool) -> Result<()> {
        let Some(ticket) = self.ticket else {
            return Ok(());
        };
        if alive {
            self.backend
                .run("refresh a waiter", move |conn| {
                    execute(
                        conn,
                        "UPDATE distlock_waiters SET seen_at_ms = ?2 WHERE ticket = ?1",
                        params![ticket, now_ms()],
                    )
                })
                .await?;
        } else {
            let ticket = self.backend.take_ticket(&self.name, &self.owner, self.reader);
            self.ticket = Some(ticket.await?);
        }
        self.refreshed = tokio::time::Instant::now();
        Ok(())
    }
}

#[async_trait]
impl ReleaseWaiter for SqliteWaiter {
    async fn wait(&mut self, max: Duration) -> Woken {
        self.wait_for_release(max).await;
        Woken::Retry
    }

    async fn leave(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        // The ticket is forgotten only once it is deleted: cancelled before, the drop
        // deletes it again (a delete of a gone ticket changes nothing).
        if self
            .backend
            .run("leave the queue", move |conn| delete_ticket(conn, ticket))
            .await
            .is_ok()
        {
            self.ticket = None;
        }
    }
}

/// Removes a waiter's ticket from the queue.
fn delete_ticket(conn: &Connection, ticket: i64) -> rusqlite::Result<usize> {
    execute(
        conn,
        "DELETE FROM distlock_waiters WHERE ticket = ?1",
        [ticket],
    )
}

impl SqliteWaiter {
    pub(super) async fn wait_for_release(&mut self, max: Duration) {
        if self.listener.is_some() {
            return self.wait_for_bell(max).await;
        }
        let deadline = tokio::time::Instant::now() + max;
        let mut close_to_front = false;
        let mut first_look = true;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return;
            }
            let poll = if first_look {
                // Look at once to learn our place in the queue: a waiter next in line must
                // not spend a timer tick before it starts watching closely.
                first_look = false;
                self.poll_once().await
            } else if close_to_front {
                // The first two in the queue watch closely, so that a handoff costs a fraction
                // of a millisecond, not a timer tick.
                self.watch_closely(CLOSE_WATCH.min(deadline - now)).await
            } else {
                // Jitter spreads the polls of many waiters.
                let nap = self.poll.mul_f64(0.75 + fastrand::f64() * 0.5);
                if now + nap >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
                tokio::time::sleep(nap).await;
                self.poll_once().await
            };
            // An error is treated as "maybe free": the caller's next attempt reports it.
            let Ok(poll) = poll else {
                return;
            };
            let refresh_due = !poll.ticket_alive || self.refreshed.elapsed() >= TICKET_REFRESH;
            if refresh_due && self.refresh_ticket(poll.ticket_alive).await.is_err() {
                return;
            }
            if poll.our_turn() {
                self.poll = POLL_FIRST;
                return;
            }
            close_to_front = self.ticket.is_some() && poll.ticket_alive && poll.ahead <= 1;
            self.poll = if self.ticket.is_some() {
                // A millisecond per waiter ahead: each of them holds the lock for at least a
                // handoff, so we move up to watching closely before our turn comes.
                (POLL_FIRST * poll.ahead.max(1)).min(POLL_MAX)
            } else {
                (self.poll * 2).min(POLL_MAX)
            };
        }
    }
}

impl SqliteWaiter {
    /// Waits for a ring of this lock's doorbell, looking anyway (see [`bell_nap`]). A ring
    /// returns at once, without another look, when this is the only waiter of the lock in
    /// this handle or the last look found nobody queued ahead: a release rings the bell of
    /// the oldest live ticket, so it is almost surely our turn, and the attempt that follows
    /// checks that in its own transaction anyway.
    pub(super) async fn wait_for_bell(&mut self, max: Duration) {
        let Some(notify) = self.listener.as_ref().map(Listener::notify) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let rung = notify.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            // An error is treated as "maybe free": the caller's next attempt reports it.
            let Ok(poll) = self.poll_once().await else {
                return;
            };
            let refresh_due = !poll.ticket_alive || self.refreshed.elapsed() >= TICKET_REFRESH;
            if refresh_due && self.refresh_ticket(poll.ticket_alive).await.is_err() {
                return;
            }
            if poll.our_turn() {
                return;
            }
            let next_in_line = (poll.ticket_alive && poll.blocking == 0)
                || self.listener.as_ref().is_some_and(Listener::alone);
            // Awake in time to refresh the ticket, however far back it is.
            let wake = (tokio::time::Instant::now() + bell_nap(&poll))
                .min(self.refreshed + TICKET_REFRESH)
                .min(deadline);
            tokio::select! {
                () = &mut rung => {
                    if next_in_line {
                        return;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
        }
    }
}

/// How long a waiter with a doorbell sleeps between looks when no ring comes (±25%, so that
/// waiters spread out): longer the further back it is, so that hundreds of waiters do not
/// spend the machine on looks, but never long when the lock was free: the waiters ahead
/// may have left, or their ring been lost.
fn bell_nap(poll: &Poll) -> Duration {
    let ahead = if poll.ticket_alive && !poll.free {
        poll.ahead
    } else {
        0
    };
    (BELL_POLL + BELL_POLL_PER_AHEAD * ahead)
        .mul_f64(0.75 + fastrand::f64() * 0.5)
        .min(TICKET_REFRESH)
}

impl Drop for SqliteWaiter {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        // Leave the queue. Best effort: a ticket left behind is skipped once it is stale.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            crate::cleanup::spawn_on(&runtime, async move {
                let _ = backend
                    .run("leave the queue", move |conn| delete_ticket(conn, ticket))
                    .await;
            });
        }
    }
}
