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

/// Names with unlocks on their way on one of the client's sessions, each counted once per
/// unlock (a release's, the reaper's): a name is marked until the last of them is done.
#[derive(Default)]
pub(super) struct Ending(std::collections::HashMap<HeldKey, u32>);

impl Ending {
    /// One more unlock of `slot` on its way.
    pub(super) fn mark(&mut self, slot: &HeldKey) {
        *self.0.entry(slot.clone()).or_insert(0) += 1;
    }

    /// One unlock of `slot` done.
    pub(super) fn unmark(&mut self, slot: &HeldKey) {
        if let Some(count) = self.0.get_mut(slot) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(slot);
            }
        }
    }

    pub(super) fn contains(&self, slot: &HeldKey) -> bool {
        self.0.contains_key(slot)
    }
}
