//! How the client's state names a grant of a session lock.

use std::fmt;

use crate::backend::Owner;
use crate::name::{LockKind, LockName};

/// How the client's state names a grant: the lock name, and for a reader also its owner
/// (readers of one client hold one name together, each on a session of its own).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct HeldKey {
    name: LockName,
    reader: Option<Owner>,
}

impl HeldKey {
    pub(super) fn of(name: &LockName, owner: &Owner) -> Self {
        HeldKey {
            name: name.clone(),
            reader: matches!(name.kind(), LockKind::Read).then(|| owner.clone()),
        }
    }
}

impl fmt::Display for HeldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.name, f)
    }
}
