//! What one database says to lock, unlock and look at session locks: the [`Dialect`] that
//! PostgreSQL's advisory locks (session and transaction-scoped) and MySQL's named locks
//! implement for the shared client in `crate::session`.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::Published;
use crate::error::Result;
use crate::name::{LockKind, LockName};

/// What one database says to lock, unlock and look at session locks. Implemented by the
/// PostgreSQL and MySQL backends; not for use outside this crate.
#[async_trait]
pub trait Dialect: Send + Sync + 'static {
    /// One session.
    type Conn: Send + 'static;
    /// A lock as the server names it.
    type Key: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static;
    /// The URL scheme, for errors.
    const SCHEME: &'static str;
    /// True when a session holds at most one lock at a time (a transaction's locks end
    /// together): every acquisition then takes a connection of its own.
    const ONE_LOCK_PER_SESSION: bool = false;
    /// True when a dropped waiter's statement is stopped by closing its connection, which the
    /// server notices, instead of by [`Dialect::cancel`] (a session that a pooler may hand to
    /// another client next has no id to cancel by).
    const CANCEL_BY_CLOSING: bool = false;

    /// True when the database keeps locks of `kind` ([`Backend::supports`](crate::backend::Backend::supports)); the key of such
    /// a name ([`Dialect::key`]) says its mode to every statement.
    fn keeps(kind: &LockKind) -> bool;
    /// The server's name for a lock (with its mode, where the database has several).
    fn key(name: &LockName) -> Self::Key;
    /// Opens a session and tells its id (for cancel and terminate).
    async fn open(&self) -> Result<(Self::Conn, u64)>;
    /// Takes the lock if it is free and bumps its fencing counter: the token, or `None`.
    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        name: &LockName,
    ) -> Result<Option<u64>>;
    /// Waits up to `max` for the lock, then as `try_lock`. `None` when the time ran out or
    /// the wait was cancelled.
    async fn lock_waiting(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        name: &LockName,
        max: Duration,
    ) -> Result<Option<u64>>;
    /// Unlocks once: false when this session did not hold it.
    async fn unlock(&self, conn: &mut Self::Conn, key: &Self::Key) -> Result<bool>;
    /// Unlocks everything this session holds.
    async fn unlock_all(&self, conn: &mut Self::Conn) -> Result<()>;
    /// Undoes what [`Dialect::lock_waiting`] set on the session for its wait, so that the
    /// connection's next statements (a try, on an idle connection) run without it.
    async fn after_wait(&self, conn: &mut Self::Conn) -> Result<()>;
    /// Which of `keys` this session holds; an error when the session is gone.
    async fn held(&self, conn: &mut Self::Conn, keys: &[Self::Key]) -> Result<HashSet<Self::Key>>;
    /// The sessions holding `key`, asked on the operator's pool.
    async fn holders(&self, key: &Self::Key) -> Result<Vec<u64>>;
    /// [`Backend::list_held`](crate::backend::Backend::list_held), on the operator's pool: the names under `prefix` whose lock
    /// some session holds now, in byte order, at most `limit`.
    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>>;
    /// Ends a session; true when it existed.
    async fn terminate(&self, session: u64) -> Result<bool>;
    /// Ends every session holding `key` ([`Backend::force_unlock`](crate::backend::Backend::force_unlock)); true when one ended. A
    /// dialect whose sessions a pooler hands from client to client looks and ends in one
    /// statement, so that it never ends a session that has moved on to another client.
    async fn terminate_holders(&self, key: &Self::Key) -> Result<bool> {
        let mut freed = false;
        for session in self.holders(key).await? {
            freed |= self.terminate(session).await?;
        }
        Ok(freed)
    }
    /// Stops the statement a session runs: asked on `via` (an idle lock connection of the
    /// client) when given, else on the operator's pool. An error when it could not be asked
    /// (a session that has ended already is no error).
    async fn cancel(&self, via: Option<&mut Self::Conn>, session: u64) -> Result<()>;
    /// One round trip.
    async fn ping(&self) -> Result<()>;
    /// [`Backend::publish`](crate::backend::Backend::publish), on the operator's pool: published records live in a table.
    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published>;
    /// [`Backend::read_published`](crate::backend::Backend::read_published), on the operator's pool.
    async fn read_published(&self, key: &LockName) -> Result<Option<Published>>;
    /// [`Backend::withdraw`](crate::backend::Backend::withdraw), on the operator's pool.
    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool>;
}
