//! The readers of a reader-writer lock kept in the file: one row per reader in
//! `distlock_readers`, beside the writer's row in `distlock_locks` under the same name.
//!
//! A writer holds the name's `distlock_locks` row exactly as a mutex does, and the mutex of the
//! same name is the same lock. A reader holds a row of its own, with its own lease and fencing
//! token (from the name's one counter in `distlock_fencing`), so any number of readers hold at
//! once. Every grant counts in its statement what stands in its way: a writer needs no live
//! reader; a reader needs no live writer row and no live ticket of a writer (or a mutex)
//! queued before its own, which is the writer preference. Waiters of a reader-writer lock take
//! a ticket in fair mode and without it, and a reader's ticket is marked `kind = 'r'`.

use super::*;

/// The readers' table, made beside the others when a file is set up.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS distlock_readers (
    name          TEXT    NOT NULL,
    owner         TEXT    NOT NULL,
    holds         INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    lease_ms      INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, owner)
) WITHOUT ROWID;
";

/// The ticket kind of a reader in `distlock_waiters.kind`; every other ticket has none.
pub(super) const READER_TICKET: &str = "r";

/// Files made before reader-writer locks have no `kind` column in `distlock_waiters`.
pub(super) fn add_kind_column(conn: &Connection) -> rusqlite::Result<()> {
    let has_kind: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('distlock_waiters') WHERE name = 'kind')",
        [],
        |row| row.get(0),
    )?;
    if !has_kind {
        conn.execute_batch("ALTER TABLE distlock_waiters ADD COLUMN kind TEXT")?;
    }
    Ok(())
}

/// Whether a reader holds `name`.
pub(super) fn readers_hold(conn: &Connection, name: &str, now: i64) -> rusqlite::Result<bool> {
    query_row(
        conn,
        "SELECT EXISTS (SELECT 1 FROM distlock_readers WHERE name = ?1 AND expires_at_ms > ?2)",
        params![name, now],
        |row| row.get(0),
    )
}

/// `owner`'s live reader row of `name`: (holds, fencing token, expires at ms).
pub(super) fn live_reader(
    conn: &Connection,
    name: &str,
    owner: &str,
    now: i64,
) -> rusqlite::Result<Option<(i64, i64, i64)>> {
    query_row(
        conn,
        "SELECT holds, fencing_token, expires_at_ms FROM distlock_readers
         WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?3",
        params![name, owner, now],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .optional()
}

/// Whether a live ticket that is not a reader's is queued for `name` before `ticket` (before
/// the end of the queue when `None`).
pub(super) fn writer_queued(
    conn: &Connection,
    name: &str,
    ticket: Option<i64>,
    now: i64,
) -> rusqlite::Result<bool> {
    query_row(
        conn,
        "SELECT EXISTS (SELECT 1 FROM distlock_waiters
         WHERE name = ?1 AND seen_at_ms > ?2 AND ticket < ?3 AND kind IS NOT 'r')",
        params![name, now - TICKET_STALE_MS, ticket.unwrap_or(i64::MAX)],
        |row| row.get(0),
    )
}

/// A reader's acquire, in the caller's write transaction: re-entered when `owner` reads
/// already; refused while a writer holds or a writer queued before `owner` waits; else a row
/// of its own with the name's next token.
pub(super) fn acquire_read(
    tx: &Connection,
    name: &str,
    owner: &str,
    lease_ms: i64,
    now: i64,
) -> rusqlite::Result<Acquired> {
    if let Some((_, _, _, expires_at)) = live_row(tx, name, now)? {
        return Ok(Acquired::Held {
            ttl: Some(Duration::from_millis(
                u64::try_from(expires_at - now).unwrap_or(0),
            )),
        });
    }
    if let Some((holds, token, _)) = live_reader(tx, name, owner, now)? {
        execute(
            tx,
            "UPDATE distlock_readers
             SET holds = holds + 1, expires_at_ms = MAX(expires_at_ms, ?3)
             WHERE name = ?1 AND owner = ?2",
            params![name, owner, now.saturating_add(lease_ms)],
        )?;
        return Ok(Acquired::Granted {
            fencing_token: u64::try_from(token).unwrap_or(0),
            holds: to_u32(holds + 1),
        });
    }
    let own: Option<i64> = query_row(
        tx,
        "SELECT MIN(ticket) FROM distlock_waiters WHERE name = ?1 AND owner = ?2",
        params![name, owner],
        |row| row.get(0),
    )?;
    if writer_queued(tx, name, own, now)? {
        return Ok(Acquired::Held { ttl: None });
    }
    // Readers whose lease ended (this owner's included) leave no row behind.
    execute(
        tx,
        "DELETE FROM distlock_readers WHERE name = ?1 AND expires_at_ms <= ?2",
        params![name, now],
    )?;
    execute(
        tx,
        "DELETE FROM distlock_waiters WHERE name = ?1 AND (owner = ?2 OR seen_at_ms <= ?3)",
        params![name, owner, now - TICKET_STALE_MS],
    )?;
    let token = next_token(tx, name)?;
    execute(
        tx,
        "INSERT INTO distlock_readers
         (name, owner, holds, fencing_token, lease_ms, created_at_ms, expires_at_ms)
         VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)",
        params![
            name,
            owner,
            token,
            lease_ms,
            now,
            now.saturating_add(lease_ms)
        ],
    )?;
    Ok(Acquired::Granted {
        fencing_token: u64::try_from(token).unwrap_or(0),
        holds: 1,
    })
}

/// A reader's release, in the caller's write transaction, and whether it freed the name (the
/// last reader left).
pub(super) fn release_read(
    tx: &Connection,
    name: &str,
    owner: &str,
    now: i64,
) -> rusqlite::Result<(Released, bool)> {
    Ok(match live_reader(tx, name, owner, now)? {
        None => (Released::NotHeld, false),
        Some((holds, _, _)) if holds > 1 => {
            execute(
                tx,
                "UPDATE distlock_readers SET holds = holds - 1 WHERE name = ?1 AND owner = ?2",
                params![name, owner],
            )?;
            let remaining_holds = to_u32(holds - 1);
            (Released::Released { remaining_holds }, false)
        }
        Some(_) => {
            execute(
                tx,
                "DELETE FROM distlock_readers WHERE name = ?1 AND owner = ?2",
                params![name, owner],
            )?;
            let freed = !readers_hold(tx, name, now)?;
            (Released::Released { remaining_holds: 0 }, freed)
        }
    })
}

/// A reader's extend of the grant with `token`, in the caller's write transaction.
pub(super) fn extend_read(
    tx: &Connection,
    name: &str,
    owner: &str,
    token: i64,
    lease_ms: i64,
    now: i64,
) -> rusqlite::Result<Extended> {
    Ok(match live_reader(tx, name, owner, now)? {
        Some((_, held_token, _)) if held_token == token => {
            execute(
                tx,
                "UPDATE distlock_readers SET expires_at_ms = ?3, lease_ms = ?4
                 WHERE name = ?1 AND owner = ?2",
                params![name, owner, now.saturating_add(lease_ms), lease_ms],
            )?;
            Extended::Extended
        }
        _ => Extended::NotHeld,
    })
}

/// The readers of `name` as [`Backend::inspect`] shows them: (holds, highest token, latest
/// lease end), `None` without a live reader.
pub(super) fn inspect_readers(
    conn: &Connection,
    name: &str,
    now: i64,
) -> rusqlite::Result<Option<(i64, i64, i64)>> {
    query_row(
        conn,
        "SELECT SUM(holds), MAX(fencing_token), MAX(expires_at_ms) FROM distlock_readers
         WHERE name = ?1 AND expires_at_ms > ?2",
        params![name, now],
        |row| {
            let holds: Option<i64> = row.get(0)?;
            Ok(holds.map(|holds| Ok::<_, rusqlite::Error>((holds, row.get(1)?, row.get(2)?))))
        },
    )?
    .transpose()
}

/// The name's next fencing token, for a writer and a reader alike.
pub(super) fn next_token(tx: &Connection, name: &str) -> rusqlite::Result<i64> {
    query_row(
        tx,
        "INSERT INTO distlock_fencing (name, last_token) VALUES (?1, 1)
         ON CONFLICT (name) DO UPDATE SET last_token = last_token + 1
         RETURNING last_token",
        [name],
        |row| row.get(0),
    )
}
