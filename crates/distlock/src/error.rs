//! The one public error type.

use std::time::Duration;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in distlock.
///
/// Match on the variant, or ask a predicate such as [`Error::is_timeout`]. New variants may be
/// added in minor releases, so a `match` needs a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait time ran out before the lock was granted.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock was held by this guard but no longer is: its lease ran out, a renewal was
    /// refused, its session ended or an operator force-unlocked it. Nobody holds it now.
    #[error("lock {name:?} was lost: {reason}")]
    LockLost {
        /// The lock name.
        name: String,
        /// What is known about why.
        reason: LossReason,
    },

    /// The caller does not own the lock it tried to release or extend; someone else holds it.
    /// Nothing was changed.
    #[error("lock {name:?} is held by another owner; nothing was changed")]
    NotOwner {
        /// The lock name.
        name: String,
    },

    /// This backend cannot do what was asked.
    #[error("the {backend} backend does not support {operation}")]
    Unsupported {
        /// The backend, as its URL scheme names it.
        backend: &'static str,
        /// What was asked.
        operation: &'static str,
    },

    /// The URL names a backend whose cargo feature is not compiled in.
    #[error(
        "the {scheme}:// backend is not compiled in; enable the distlock cargo feature \"{feature}\""
    )]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The cargo feature that provides it.
        feature: &'static str,
    },

    /// A store refused a write made under a lock, because a newer holder of that lock has
    /// written since: this writer's lease had run out. Nothing was changed.
    #[error(
        "the write to {item:?} under fencing token {token} was refused: the store has accepted token {accepted} since; the lock was lost before the write"
    )]
    Fenced {
        /// The item (or segment) written.
        item: String,
        /// The refused writer's token.
        token: u64,
        /// The newest token the store has accepted for the item.
        accepted: u64,
    },

    /// Bad input from the caller: a lock name, a duration, a URL. Says what was wrong and what
    /// to do.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was invalid ("lock name", "lease", "URL", ...).
        what: &'static str,
        /// What was wrong with it and what is accepted.
        reason: String,
    },

    /// The server refused this client's identity: a wrong password or an unknown user, or a
    /// lock path that belongs to another identity (ZooKeeper's node ACLs). Says what to fix;
    /// retrying with the same URL does not help.
    #[error("the {backend} server refused to let this client {operation}: {reason}")]
    NotAuthorized {
        /// The backend, as its URL scheme names it.
        backend: &'static str,
        /// What distlock was doing.
        operation: &'static str,
        /// What the server said, and what to change.
        reason: String,
    },

    /// The backend's server or storage failed, or could not be reached.
    #[error("{backend} backend failed while trying to {operation}: {source}")]
    Backend {
        /// The backend, as its URL scheme names it.
        backend: &'static str,
        /// What distlock was doing.
        operation: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
}

/// Why a held lock was lost: carried by [`Error::LockLost`] and
/// [`Guard::loss_reason`](crate::Guard::loss_reason).
///
/// New variants may be added in minor releases, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum LossReason {
    /// A fixed lease ([`AcquireOptions::lease`](crate::AcquireOptions::lease)) ended.
    #[error("its fixed lease ran out")]
    LeaseRanOut,
    /// A renewed lock's lease ran out by the client's clock before a renewal succeeded (the
    /// server was slow, unreachable or down).
    #[error("the lease ran out before a renewal succeeded")]
    RenewalTooLate,
    /// A renewal, extension or release found the lock free on the server: its lease had ended
    /// there, or an operator force-unlocked it.
    #[error("the server no longer held it (its lease ended there, or it was force-unlocked)")]
    NotHeld,
    /// A renewal, extension or release found another owner holding the lock.
    #[error("another owner holds it now")]
    HeldByOther,
    /// The session or connection the lock lived in ended (ZooKeeper session, PostgreSQL or
    /// MySQL lock connection).
    #[error("the session the lock lived in was lost")]
    SessionLost,
    /// The client had given the lock up and it was then granted anew to the same owner: the
    /// older guard's grant ended.
    #[error("its lease ran out and the lock was granted anew")]
    GrantedAnew,
    /// A lock handed over by its releaser ran out before the new holder's extension reached
    /// the server.
    #[error("the lock handed over ran out before it was extended")]
    HandoverRanOut,
}

impl Error {
    /// True when a wait ran out ([`Error::Timeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True when a held lock was lost ([`Error::LockLost`]).
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }

    /// True when a store refused a stale holder's write ([`Error::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced { .. })
    }

    /// True when the caller is not the lock's owner ([`Error::NotOwner`]).
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Error::NotOwner { .. })
    }

    /// True when the backend cannot do this, or is not compiled in.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            Error::Unsupported { .. } | Error::FeatureDisabled { .. }
        )
    }

    /// True when the caller's input was rejected ([`Error::InvalidInput`]).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput { .. })
    }

    /// True when the server refused the client's identity ([`Error::NotAuthorized`]).
    pub fn is_not_authorized(&self) -> bool {
        matches!(self, Error::NotAuthorized { .. })
    }

    /// True when the backend failed ([`Error::Backend`]); such errors may pass on retry.
    pub fn is_backend(&self) -> bool {
        matches!(self, Error::Backend { .. })
    }

    /// The wait for the lock `name`, begun at `start`, ran out.
    pub(crate) fn timed_out(name: impl ToString, start: tokio::time::Instant) -> Self {
        Error::Timeout {
            name: name.to_string(),
            waited: start.elapsed(),
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }

    /// The server refused the client's identity, while distlock was doing `operation`;
    /// `reason` says what it said and what to change.
    /// Compiled in every build, so that a backend names no feature here.
    #[cfg_attr(not(feature = "all-backends"), allow(dead_code))]
    pub(crate) fn not_authorized(
        backend: &'static str,
        operation: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Error::NotAuthorized {
            backend,
            operation,
            reason: reason.into(),
        }
    }

    /// Wraps a client library's error. For backend implementations.
    pub fn backend(
        backend: &'static str,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            operation,
            source: source.into(),
        }
    }
}

/// `Result<T, distlock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
