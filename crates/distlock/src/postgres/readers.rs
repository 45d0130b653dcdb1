//! Reader-writer locks in the table-record lock (`?mode=table`): a row per reader.
//!
//! A writer (and a mutex of the same name) holds the name's row in `distlock_locks` as the
//! mutex does, with the same statements. Readers hold that row together: its owner is the
//! empty string (no client's owner is empty), its lease ends no earlier than any reader's,
//! and `holds` counts the readers. Each reader has a row of its own in
//! `distlock_rw_readers`, with its hold count, lease and fencing token; the writer's
//! statements need not know about them, since the name's row already turns them away.
//!
//! Every change to the readers takes the name's row lock first (after the fencing counter's
//! row, the order the writer's statement takes them in), in a PL/pgSQL function whose
//! statements each see what was committed before the lock was taken: a grant and a release
//! are one call each, and the count they write is exact. A reader's lease is renewed with the
//! name's row first, in one statement: a reader's row is never renewed past the name's.
//!
//! A writer that waits marks itself in `distlock_rw_writers` for [`WRITER_MARK`] at a time,
//! refreshing the mark each time it is turned away; readers that do not hold yet are turned
//! away while a fresh mark exists (writer preference). The waiter takes its mark away when it
//! goes (or its drop does, in the background); a mark left behind ends by itself.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::{db_error, holds_u32, millis, token_u64};
use crate::backend::{Acquired, Extended, Owner, Released, Renewing};
use crate::error::Result;
use crate::name::LockName;

/// How long a writer that was turned away keeps later readers out, unless it asks again.
pub(super) const WRITER_MARK: Duration = Duration::from_secs(2);
/// How soon a turned-away writer (or a reader turned away by a writer's mark) asks again at
/// the latest; well within [`WRITER_MARK`].
const RECHECK: Duration = Duration::from_millis(500);

/// The readers' tables and functions, made with the other tables (under the schema's lock).
/// The functions carry a version in their names: a later layout adds new ones.
pub(super) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS distlock_rw_readers (
        name          text        NOT NULL,
        owner         text        NOT NULL,
        holds         integer     NOT NULL,
        fencing_token bigint      NOT NULL,
        expires_at    timestamptz NOT NULL,
        PRIMARY KEY (name, owner)
    )",
    "CREATE TABLE IF NOT EXISTS distlock_rw_writers (
        name  text        NOT NULL,
        owner text        NOT NULL,
        until timestamptz NOT NULL,
        PRIMARY KEY (name, owner)
    )",
];

/// The functions, made when missing (under the schema's lock).
pub(super) const FUNCTIONS: &[(&str, &str)] = &[
    ("distlock_rw_read_v1", READ_ACQUIRE_FUNCTION),
    ("distlock_rw_unread_v1", READ_RELEASE_FUNCTION),
];

/// A reader's grant. Returns `(granted, holds, token, ttl_ms)`: on a refusal `ttl_ms` is
/// how long to wait before asking again (0: at once).
const READ_ACQUIRE_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION distlock_rw_read_v1(p_name text, p_owner text, p_lease_ms bigint,
                                               p_recheck_ms bigint)
RETURNS TABLE (granted boolean, holds integer, token bigint, ttl_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    held    distlock_locks%ROWTYPE;
    mine    distlock_rw_readers%ROWTYPE;
    now_at  timestamptz;
    ends_at timestamptz;
    drawn   bigint;
BEGIN
    -- The fencing counter's row, then the name's: the order of the writer's statement.
    LOOP
        PERFORM 1 FROM distlock_fencing f WHERE f.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO distlock_fencing (name, last_token) VALUES (p_name, 0)
        ON CONFLICT (name) DO NOTHING;
    END LOOP;
    LOOP
        SELECT * INTO held FROM distlock_locks l WHERE l.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO distlock_locks (name, owner, holds, fencing_token, expires_at)
        VALUES (p_name, '', 0, 0, '-infinity') ON CONFLICT (name) DO NOTHING;
    END LOOP;
    now_at := clock_timestamp();
    ends_at := now_at + p_lease_ms * interval '1 millisecond';
    IF held.owner <> '' AND held.expires_at > now_at THEN
        -- A writer (or a mutex) holds the name.
        RETURN QUERY SELECT false, 0, 0::bigint,
            least(p_recheck_ms, ceil(extract(epoch FROM held.expires_at - now_at) * 1000)::bigint);
        RETURN;
    END IF;
    IF held.owner <> '' OR held.expires_at <= now_at THEN
        -- No reader holds: the rows left are from readers whose leases ended.
        DELETE FROM distlock_rw_readers r WHERE r.name = p_name;
    ELSE
        DELETE FROM distlock_rw_readers r WHERE r.name = p_name AND r.expires_at <= now_at;
    END IF;
    SELECT * INTO mine FROM distlock_rw_readers r WHERE r.name = p_name AND r.owner = p_owner;
    IF FOUND THEN
        -- Re-entry: one more hold of the same grant, whose lease is never shortened.
        UPDATE distlock_rw_readers r SET holds = least(r.holds + 1, 2147483647),
            expires_at = greatest(r.expires_at, ends_at)
        WHERE r.name = p_name AND r.owner = p_owner;
        UPDATE distlock_locks l SET expires_at = greatest(l.expires_at, ends_at)
        WHERE l.name = p_name;
        RETURN QUERY SELECT true, least(mine.holds + 1, 2147483647), mine.fencing_token, 0::bigint;
        RETURN;
    END IF;
    DELETE FROM distlock_rw_writers w WHERE w.name = p_name AND w.until <= now_at;
    IF EXISTS (SELECT 1 FROM distlock_rw_writers w WHERE w.name = p_name) THEN
        -- A writer waits: later readers wait behind it.
        RETURN QUERY SELECT false, 0, 0::bigint, p_recheck_ms;
        RETURN;
    END IF;
    UPDATE distlock_fencing f SET last_token = f.last_token + 1 WHERE f.name = p_name
    RETURNING f.last_token INTO drawn;
    INSERT INTO distlock_rw_readers (name, owner, holds, fencing_token, expires_at)
    VALUES (p_name, p_owner, 1, drawn, ends_at);
    UPDATE distlock_locks l SET owner = '',
        holds = (SELECT count(*) FROM distlock_rw_readers r WHERE r.name = p_name),
        fencing_token = drawn,
        expires_at = CASE WHEN l.owner = '' AND l.expires_at > now_at
                          THEN greatest(l.expires_at, ends_at) ELSE ends_at END
    WHERE l.name = p_name;
    RETURN QUERY SELECT true, 1, drawn, 0::bigint;
END
$fn$"#;

/// A reader's release: the holds it has left, -1 when it holds nothing (nobody holds the
/// name, or only other readers), -2 when a writer holds the name. The last reader's release
/// frees the name and announces it.
const READ_RELEASE_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION distlock_rw_unread_v1(p_name text, p_owner text)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    held   distlock_locks%ROWTYPE;
    mine   distlock_rw_readers%ROWTYPE;
    now_at timestamptz;
    others bigint;
BEGIN
    SELECT * INTO held FROM distlock_locks l WHERE l.name = p_name FOR UPDATE;
    now_at := clock_timestamp();
    IF NOT FOUND OR held.expires_at <= now_at THEN
        RETURN -1;
    END IF;
    IF held.owner <> '' THEN
        RETURN -2;
    END IF;
    SELECT * INTO mine FROM distlock_rw_readers r
    WHERE r.name = p_name AND r.owner = p_owner AND r.expires_at > now_at;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    IF mine.holds > 1 THEN
        UPDATE distlock_rw_readers r SET holds = r.holds - 1
        WHERE r.name = p_name AND r.owner = p_owner;
        RETURN mine.holds - 1;
    END IF;
    DELETE FROM distlock_rw_readers r WHERE r.name = p_name AND r.owner = p_owner;
    SELECT count(*) INTO others FROM distlock_rw_readers r
    WHERE r.name = p_name AND r.expires_at > now_at;
    IF others = 0 THEN
        DELETE FROM distlock_rw_readers r WHERE r.name = p_name;
        DELETE FROM distlock_locks l WHERE l.name = p_name;
        PERFORM pg_notify('distlock_release', p_name);
    ELSE
        UPDATE distlock_locks l SET holds = others WHERE l.name = p_name;
    END IF;
    RETURN 0;
END
$fn$"#;

const READ_ACQUIRE: &str = "SELECT * FROM distlock_rw_read_v1($1, $2, $3, $4)";

const READ_RELEASE: &str = "SELECT distlock_rw_unread_v1($1, $2)";

/// Extends one reader's grant: the name's row first (only while readers hold it), then the
/// reader's row, only if the name's row was extended.
const READ_EXTEND: &str = "
WITH held AS (
    UPDATE distlock_locks l
    SET expires_at = greatest(l.expires_at, clock_timestamp() + $3 * interval '1 millisecond')
    WHERE l.name = $1 AND l.owner = '' AND l.expires_at > clock_timestamp()
      AND EXISTS (
          SELECT 1 FROM distlock_rw_readers r
          WHERE r.name = $1 AND r.owner = $2 AND r.fencing_token = $4
            AND r.expires_at > clock_timestamp()
      )
    RETURNING l.name
)
UPDATE distlock_rw_readers r SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
FROM held
WHERE r.name = held.name AND r.owner = $2 AND r.fencing_token = $4
  AND r.expires_at > clock_timestamp()
RETURNING 1";

/// Renews many readers' grants: the names' rows first (only while readers hold them), then
/// the readers' rows of the names whose rows were renewed.
const READ_RENEW: &str = "
WITH k AS (
    SELECT * FROM unnest($1::text[], $2::text[], $4::bigint[]) AS k(name, owner, token)
), held AS (
    UPDATE distlock_locks l
    SET expires_at = greatest(l.expires_at, clock_timestamp() + $3 * interval '1 millisecond')
    WHERE l.name = ANY($1::text[]) AND l.owner = '' AND l.expires_at > clock_timestamp()
    RETURNING l.name
)
UPDATE distlock_rw_readers r SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
FROM k
WHERE r.name = k.name AND r.owner = k.owner AND r.fencing_token = k.token
  AND r.expires_at > clock_timestamp()
  AND r.name IN (SELECT name FROM held)
RETURNING r.name, r.owner";

/// A reader's holds, while readers hold the name.
const READ_HOLDS: &str = "
SELECT r.holds FROM distlock_rw_readers r JOIN distlock_locks l ON l.name = r.name
WHERE r.name = $1 AND r.owner = $2 AND r.expires_at > clock_timestamp()
  AND l.owner = '' AND l.expires_at > clock_timestamp()";

/// True when a writer (or a mutex) holds the name.
const WRITER_HOLDS: &str = "
SELECT 1 FROM distlock_locks
WHERE name = $1 AND owner <> '' AND expires_at > clock_timestamp()";

/// A waiting writer's mark, made or refreshed.
const MARK: &str = "
INSERT INTO distlock_rw_writers (name, owner, until)
VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (name, owner) DO UPDATE SET until = excluded.until";

/// A turned-away writer: refreshes its mark if it has one, and reads the name's lease.
const WRITER_REFUSED: &str = "
WITH mark AS (
    UPDATE distlock_rw_writers SET until = clock_timestamp() + $3 * interval '1 millisecond'
    WHERE name = $1 AND owner = $2
    RETURNING 1
)
SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint,
       (SELECT count(*) FROM mark)
FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp()";

const UNMARK: &str = "
WITH gone AS (DELETE FROM distlock_rw_writers WHERE name = $1 AND owner = $2 RETURNING 1)
SELECT pg_notify('distlock_release', $1) FROM gone";

/// True for the names whose readers this module keeps.
pub(super) fn is_reader(name: &LockName) -> bool {
    matches!(name.kind(), crate::LockKind::Read)
}

/// A reader's try.
pub(super) async fn acquire_read(
    pool: &PgPool,
    name: &LockName,
    owner: &Owner,
    lease: Duration,
) -> Result<Acquired> {
    let (granted, holds, token, ttl_ms): (bool, i32, i64, i64) = sqlx::query_as(READ_ACQUIRE)
        .bind(name.as_str())
        .bind(owner.as_str())
        .bind(millis(lease))
        .bind(millis(RECHECK))
        .fetch_one(pool)
        .await
        .map_err(db_error("acquire a read lock"))?;
    Ok(if granted {
        Acquired::Granted {
            fencing_token: token_u64(token),
            holds: holds_u32(holds),
        }
    } else {
        Acquired::Held {
            ttl: Some(Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0))),
        }
    })
}

/// What a writer that was turned away waits for at most: the name's lease, or
/// [`RECHECK`] while it waits with a mark (which this refreshes).
pub(super) async fn writer_refused(pool: &PgPool, name: &LockName, owner: &Owner) -> Result<Duration> {
    let row: Option<(i64, i64)> = sqlx::query_as(WRITER_REFUSED)
        .bind(name.as_str())
        .bind(owner.as_str())
        .bind(millis(WRITER_MARK))
        .fetch_optional(pool)
        .await
        .map_err(db_error("read the lease"))?;
    // Freed between the two statements: try again at once.
    Ok(row.map_or(Duration::ZERO, |(ms, marked)| {
        let ttl = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        if marked > 0 { ttl.min(RECHECK) } else { ttl }
    }))
}

/// A reader's release.
pub(super) async fn release_read(pool: &PgPool, name: &LockName, owner: &Owner) -> Result<Released> {
    let (left,): (i32,) = sqlx::query_as(READ_RELEASE)
        .bind(name.as_str())
        .bind(owner.as_str())
        .fetch_one(pool)
        .await
        .map_err(db_error("release a read lock"))?;
    Ok(match left {
        -2 => Released::HeldByOther,
        left if left < 0 => Released::NotHeld,
        left => Released::Released {
            remaining_holds: holds_u32(left),
        },
    })
}

/// Extends a reader's grant with `fencing_token`.
pub(super) async fn extend_read(
    pool: &PgPool,
    name: &LockName,
    owner: &Owner,
    fencing_token: u64,
    lease: Duration,
) -> Result<Extended> {
    let extended = sqlx::query(READ_EXTEND)
        .bind(name.as_str())
        .bind(owner.as_str())
        .bind(millis(lease))
        .bind(i64::try_from(fencing_token).unwrap_or(-1))
        .fetch_optional(pool)
        .await
        .map_err(db_error("extend a read lock"))?;
    if extended.is_some() {
        return Ok(Extended::Extended);
    }
    Ok(if writer_holds(pool, name).await? {
        Extended::HeldByOther
    } else {
        Extended::NotHeld
    })
}

/// Renews readers' grants; the answer is in the order of `locks`.
pub(super) async fn renew_reads(
    pool: &PgPool,
    locks: &[&Renewing],
    lease: Duration,
) -> Result<Vec<bool>> {
    let names: Vec<&str> = locks.iter().map(|r| r.lock.0.as_str()).collect();
    let owners: Vec<&str> = locks.iter().map(|r| r.lock.1.as_str()).collect();
    let tokens: Vec<i64> = locks
        .iter()
        .map(|r| i64::try_from(r.fencing_token).unwrap_or(-1))
        .collect();
    let renewed: Vec<(String, String)> = sqlx::query_as(READ_RENEW)
        .bind(&names)
        .bind(&owners)
        .bind(millis(lease))
        .bind(&tokens)
        .fetch_all(pool)
        .await
        .map_err(db_error("renew read locks"))?;
    let renewed: std::collections::HashSet<(String, String)> = renewed.into_iter().collect();
    Ok(locks
        .iter()
        .map(|r| renewed.contains(&(r.lock.0.as_str().to_owned(), r.lock.1.as_str().to_owned())))
        .collect())
}

/// A reader's holds of the name (0 when it holds none).
pub(super) async fn read_holds(pool: &PgPool, name: &LockName, owner: &Owner) -> Result<u32> {
    let holds: Option<(i32,)> = sqlx::query_as(READ_HOLDS)
        .bind(name.as_str())
        .bind(owner.as_str())
        .fetch_optional(pool)
        .await
        .map_err(db_error("read the lock"))?;
    Ok(holds.map_or(0, |(holds,)| holds_u32(holds)))
}

async fn writer_holds(pool: &PgPool, name: &LockName) -> Result<bool> {
    let row: Option<(i32,)> = sqlx::query_as(WRITER_HOLDS)
        .bind(name.as_str())
        .fetch_optional(pool)
        .await
        .map_err(db_error("read the lock"))?;
    Ok(row.is_some())
}

/// For a writer of a reader-writer lock that begins to wait: its mark, which turns later
/// readers away while it waits. `None` for anyone else.
pub(super) async fn mark_writer(
    pool: &PgPool,
    name: &LockName,
    owner: &Owner,
) -> Result<Option<WriterMark>> {
    if !matches!(name.kind(), crate::LockKind::Write) {
        return Ok(None);
    }
    // Made before the request: a mark whose reply was lost is taken away all the same when
    // it is dropped, and ends by itself.
    let mark = WriterMark {
        pool: pool.clone(),
        name: name.as_str().to_owned(),
        owner: owner.as_str().to_owned(),
        removed: false,
    };
    sqlx::query(MARK)
        .bind(&mark.name)
        .bind(&mark.owner)
        .bind(millis(WRITER_MARK))
        .execute(pool)
        .await
        .map_err(db_error("mark a waiting writer"))?;
    Ok(Some(mark))
}

/// A waiting writer's mark in `distlock_rw_writers`; taken away when the waiter leaves or is
/// dropped.
pub(super) struct WriterMark {
    pool: PgPool,
    name: String,
    owner: String,
    /// Taken away: nothing to do on drop.
    removed: bool,
}

impl WriterMark {
    /// Takes the mark away, waking the readers it held back. Best effort: a mark left behind
    /// ends by itself.
    pub(super) async fn remove(&mut self) {
        self.removed = unmark(&self.pool, &self.name, &self.owner).await;
    }
}

/// Takes `owner`'s mark away: true when the server answered.
async fn unmark(pool: &PgPool, name: &str, owner: &str) -> bool {
    sqlx::query(UNMARK)
        .bind(name)
        .bind(owner)
        .execute(pool)
        .await
        .is_ok()
}

impl Drop for WriterMark {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.pool.clone();
            let (name, owner) = (
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.owner),
            );
            crate::cleanup::spawn_on(&runtime, async move {
                unmark(&pool, &name, &owner).await;
            });
        }
    }
}
