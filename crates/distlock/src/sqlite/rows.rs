//! The statements the SQLite backend runs on its rows: the live row of a lock, its queue's
//! head, and retries of a busy file.

use super::*;

/// The live row of `name`: (owner, holds, fencing token, expires at ms).
pub(super) fn live_row(
    conn: &Connection,
    name: &str,
    now: i64,
) -> rusqlite::Result<Option<(String, i64, i64, i64)>> {
    query_row(
        conn,
        "SELECT owner, holds, fencing_token, expires_at_ms FROM distlock_locks
         WHERE name = ?1 AND expires_at_ms > ?2",
        params![name, now],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
    )
    .optional()
}

/// What an acquire attempt finds.
pub(super) enum Found {
    /// Held by another owner or, in fair mode, free but reserved for another's ticket.
    Busy(Acquired),
    /// Held by `owner` already: (holds, fencing token).
    Ours(i64, i64),
    /// Free (or an expired row) and `owner`'s to take.
    Free,
}

pub(super) fn find(
    conn: &Connection,
    name: &str,
    owner: &str,
    fair: bool,
    now: i64,
) -> rusqlite::Result<Found> {
    Ok(match live_row(conn, name, now)? {
        Some((holder, _, _, expires_at)) if holder != owner => Found::Busy(Acquired::Held {
            ttl: Some(Duration::from_millis(
                u64::try_from(expires_at - now).unwrap_or(0),
            )),
        }),
        Some((_, holds, token, _)) => Found::Ours(holds, token),
        // Readers of the name's reader-writer lock ([`readers`]).
        None if readers_hold(conn, name, now)? => Found::Busy(Acquired::Held { ttl: None }),
        None if fair && queue_head(conn, name, now)?.is_some_and(|head| head != owner) => {
            Found::Busy(Acquired::Held { ttl: None })
        }
        None => Found::Free,
    })
}

/// Files made before doorbells have no `bell` column in `distlock_waiters`.
pub(super) fn add_bell_column(conn: &Connection) -> rusqlite::Result<()> {
    let has_bell: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('distlock_waiters') WHERE name = 'bell')",
        [],
        |row| row.get(0),
    )?;
    if !has_bell {
        conn.execute_batch("ALTER TABLE distlock_waiters ADD COLUMN bell TEXT")?;
    }
    Ok(())
}

/// The doorbell of the oldest live ticket queued for `name`, if it has one.
pub(super) fn head_bell(
    conn: &Connection,
    name: &str,
    now: i64,
) -> rusqlite::Result<Option<String>> {
    Ok(query_row(
        conn,
        "SELECT bell FROM distlock_waiters
         WHERE name = ?1 AND seen_at_ms > ?2 ORDER BY ticket LIMIT 1",
        params![name, now - TICKET_STALE_MS],
        |row| row.get::<_, Option<String>>(0),
    )
    .optional()?
    .flatten())
}

/// The owner of the oldest live ticket queued for `name`, if any.
fn queue_head(conn: &Connection, name: &str, now: i64) -> rusqlite::Result<Option<String>> {
    query_row(
        conn,
        "SELECT owner FROM distlock_waiters
         WHERE name = ?1 AND seen_at_ms > ?2 ORDER BY ticket LIMIT 1",
        params![name, now - TICKET_STALE_MS],
        |row| row.get(0),
    )
    .optional()
}

/// Runs a statement through the connection's statement cache (parsing SQL costs more than
/// running these statements).
pub(super) fn execute(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Reads one row through the statement cache.
pub(super) fn query_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    row: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, row)
}
