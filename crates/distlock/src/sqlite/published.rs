//! Published records (an election's leader) in `distlock_published`, one row per key, apart
//! from the lock tables. A withdrawn record keeps its row and term with an empty holder.

use super::*;
use crate::backend::Published;

/// Made at open with the lock tables.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS distlock_published (
    name   TEXT    PRIMARY KEY,
    term   INTEGER NOT NULL,
    value  TEXT    NOT NULL,
    holder TEXT    NOT NULL
) WITHOUT ROWID;
";

/// The stored record of `name`, withdrawn or not.
fn stored(conn: &Connection, name: &str) -> rusqlite::Result<Option<Published>> {
    query_row(
        conn,
        "SELECT term, value, holder FROM distlock_published WHERE name = ?1",
        [name],
        |row| {
            let term: i64 = row.get(0)?;
            Ok(Published::new(
                u64::try_from(term).unwrap_or(0),
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
            ))
        },
    )
    .optional()
}

fn term_i64(term: u64) -> i64 {
    i64::try_from(term).unwrap_or(i64::MAX)
}

impl SqliteBackend {
    pub(super) async fn publish_record(
        &self,
        key: &LockName,
        record: &Published,
    ) -> Result<Published> {
        let name = key.as_str().to_owned();
        let record = record.clone();
        self.run("publish", move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let after = record.winner(stored(&tx, &name)?);
            execute(
                &tx,
                "INSERT OR REPLACE INTO distlock_published (name, term, value, holder)
                 VALUES (?1, ?2, ?3, ?4)",
                params![name, term_i64(after.term), after.value, after.holder],
            )?;
            tx.commit()?;
            Ok(after)
        })
        .await
    }

    pub(super) async fn read_record(&self, key: &LockName) -> Result<Option<Published>> {
        let name = key.as_str().to_owned();
        self.run("read the published record", move |conn| {
            Ok(stored(conn, &name)?.and_then(Published::live))
        })
        .await
    }

    pub(super) async fn withdraw_record(&self, key: &LockName, term: u64) -> Result<bool> {
        let name = key.as_str().to_owned();
        self.run("withdraw", move |conn| {
            let changed = execute(
                conn,
                "UPDATE distlock_published SET value = '', holder = ''
                 WHERE name = ?1 AND term = ?2 AND holder <> ''",
                params![name, term_i64(term)],
            )?;
            Ok(changed > 0)
        })
        .await
    }
}
