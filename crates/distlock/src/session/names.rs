//! The names a client has recorded in `distlock_fencing` (the session locks' list of names
//! ever granted, which `list_held` reads: the servers' locks know only keys).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::name::LockName;

/// How many recorded names a client remembers before it forgets them all (and records each
/// again at its next grant).
const NAMES_KEPT: usize = 65_536;

/// The names recorded by this client.
#[derive(Debug, Default)]
pub(crate) struct RecordedNames(Mutex<HashSet<String>>);

impl RecordedNames {
    fn names(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// True when `name` was recorded (and not forgotten since).
    pub(crate) fn contains(&self, name: &LockName) -> bool {
        self.names().contains(name.as_str())
    }

    /// Notes that `name` is recorded.
    pub(crate) fn insert(&self, name: &LockName) {
        let mut names = self.names();
        if names.len() >= NAMES_KEPT {
            names.clear();
        }
        names.insert(name.as_str().to_owned());
    }
}
