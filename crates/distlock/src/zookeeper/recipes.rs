//! The node kinds of Apache Curator's recipes: the mutex's `lock-`, the reader-writer lock's
//! `__READ__` and `__WRIT__`, and the leader latch's `latch-`. Every kind is an ephemeral
//! sequential child `_c_<uuid>-<marker><sequence>` of the lock's path. Each recipe lines up
//! its own nodes only, by sequence number (Curator's sorting strips the recipe's own markers
//! and leaves every other node behind them), so three families share a path without waiting
//! for each other: the mutex's, the reader-writer lock's (readers and writers in one line),
//! and the latch's. Within a line:
//!
//! * a reader holds once no writer (`__WRIT__`) is ahead of it, and watches the last writer
//!   ahead of it (readers never wait for readers);
//! * every other kind holds when it is first in its line, and watches the node just ahead.
//!
//! A leader latch's node keeps the candidate's value as its data (Curator's participant id),
//! so the first node in line names the leader.

use super::*;
use crate::name::LockKind;

/// The marker of Curator's `InterProcessMutex` (and `LeaderSelector`).
const LOCK: &str = "lock-";
/// The markers of Curator's `InterProcessReadWriteLock`.
const READ: &str = "__READ__";
const WRITE: &str = "__WRIT__";
/// The marker of Curator's `LeaderLatch`.
const LATCH: &str = "latch-";

/// The marker that names a node of `kind`.
pub(super) fn marker(kind: &LockKind) -> &'static str {
    match kind {
        LockKind::Read => READ,
        LockKind::Write => WRITE,
        LockKind::Leader(_) => LATCH,
        _ => LOCK,
    }
}

/// The kinds the sequential lock keeps (all of them; the naive lock keeps the mutex only).
pub(super) fn keeps(kind: &LockKind) -> bool {
    matches!(
        kind,
        LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Leader(_)
    )
}

/// The data a new node of `kind` holds: a candidate's value, or who made the node.
pub(super) fn data(kind: &LockKind, owner: &Owner) -> Vec<u8> {
    match kind {
        LockKind::Leader(value) => value.as_bytes().to_vec(),
        _ => Shared::node_data(owner),
    }
}

/// The sequence number of a node of any kind (`..__READ__0000000042`), `None` for children
/// that are none of them.
fn sequence_of(child: &str) -> Option<u64> {
    [LOCK, READ, WRITE, LATCH].iter().find_map(|marker| {
        let at = child.rfind(marker)?;
        child[at + marker.len()..].parse().ok()
    })
}

fn is_writer(child: &str) -> bool {
    child.contains(WRITE)
}

/// The recipes whose nodes wait for each other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Mutex,
    ReadWrite,
    Latch,
}

fn family_of(kind: &LockKind) -> Family {
    match kind {
        LockKind::Read | LockKind::Write => Family::ReadWrite,
        LockKind::Leader(_) => Family::Latch,
        _ => Family::Mutex,
    }
}

fn family_of_child(child: &str) -> Option<Family> {
    // A protected name's uuid is hex and hyphens: it holds no marker.
    if child.contains(READ) || child.contains(WRITE) {
        Some(Family::ReadWrite)
    } else if child.contains(LATCH) {
        Some(Family::Latch)
    } else if child.contains(LOCK) {
        Some(Family::Mutex)
    } else {
        None
    }
}

/// The nodes of every recipe among `children`, by sequence number.
pub(super) fn queue(children: Vec<String>) -> Vec<String> {
    let mut nodes: Vec<(u64, String)> = children
        .into_iter()
        .filter_map(|child| sequence_of(&child).map(|seq| (seq, child)))
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, child)| child).collect()
}

/// The line a node of `kind` stands in: the nodes of its recipe in `all` (a [`queue`]).
pub(super) fn line(kind: &LockKind, all: Vec<String>) -> Vec<String> {
    let family = family_of(kind);
    all.into_iter()
        .filter(|child| family_of_child(child) == Some(family))
        .collect()
}

/// The nodes that hold now, in every recipe's line of `all` (a [`queue`]): the first of the
/// mutex's and the latch's lines; the first writer of the reader-writer line if it is first,
/// else every reader ahead of its first writer.
pub(super) fn holders(all: &[String]) -> Vec<String> {
    let mut holders = Vec::new();
    for family in [Family::Mutex, Family::Latch] {
        if let Some(first) = all.iter().find(|c| family_of_child(c) == Some(family)) {
            holders.push(first.clone());
        }
    }
    let mut read_write = all
        .iter()
        .filter(|c| family_of_child(c) == Some(Family::ReadWrite));
    match read_write.next() {
        Some(first) if is_writer(first) => holders.push(first.clone()),
        Some(first) => {
            holders.push(first.clone());
            holders.extend(read_write.take_while(|c| !is_writer(c)).cloned());
        }
        None => {}
    }
    holders
}

/// The index of the node that the node of `kind` at `at` in `line` waits for; `None` when it
/// holds.
pub(super) fn blocker(kind: &LockKind, line: &[String], at: usize) -> Option<usize> {
    match kind {
        LockKind::Read => line[..at].iter().rposition(|child| is_writer(child)),
        _ => at.checked_sub(1),
    }
}

/// True when a node of `kind` added at the end of `line` would have to wait.
pub(super) fn would_wait(kind: &LockKind, line: &[String]) -> bool {
    blocker(kind, line, line.len()).is_some()
}

/// True when the node the waiter watched, at `blocker`, was the last thing it waited for:
/// its deletion grants the waiter without another look at the line.
pub(super) fn last_blocker(kind: &LockKind, blocker: usize) -> bool {
    // A reader's writer ahead may have other writers ahead of it; a node of any other kind
    // waits for everything ahead.
    !matches!(kind, LockKind::Read) && blocker == 0
}

impl Shared {
    /// The line a node of `kind` stands in under `lock`, first first; empty when the lock
    /// node is gone.
    pub(super) async fn line(
        &self,
        session: &Session,
        lock: &str,
        kind: &LockKind,
    ) -> Result<Vec<String>> {
        Ok(line(kind, self.queue(session, lock).await?))
    }

    /// The first candidate in line of a leader latch: its creation zxid as the term, its data
    /// as the value, its node's name as the holder.
    pub(super) async fn read_leader(&self, name: &LockName) -> Result<Option<Published>> {
        let session = self.session();
        let lock = lock_path(&self.url.base, name.as_str());
        // A leader another session was told it is, before this read began, is seen.
        self.catch_up(&session, &lock, "read the leader").await?;
        for _ in 0..ATTEMPTS {
            let line = self.line(&session, &lock, name.kind()).await?;
            let Some(first) = line.first() else {
                return Ok(None);
            };
            match session.client.get_data(&format!("{lock}/{first}")).await {
                Ok((data, stat)) => {
                    let value = String::from_utf8_lossy(&data).into_owned();
                    return Ok(Some(Published::new(token_of(&stat), value, first.as_str())));
                }
                // Gone meanwhile: the next in line leads now.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(self.err("read the leader", e)),
            }
        }
        Err(self.err("read the leader", zk::Error::NoNode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(children: &[&str]) -> Vec<String> {
        queue(children.iter().map(|c| c.to_string()).collect())
    }

    #[test]
    fn every_kind_sorts_by_sequence_and_each_recipe_has_its_line() {
        let l = sorted(&[
            "_c_b-__WRIT__0000000003",
            "_c_a-lock-0000000002",
            "other",
            "_c_c-__READ__0000000001",
            "_c_d-latch-0000000004",
        ]);
        assert_eq!(
            l,
            [
                "_c_c-__READ__0000000001",
                "_c_a-lock-0000000002",
                "_c_b-__WRIT__0000000003",
                "_c_d-latch-0000000004"
            ]
        );
        assert_eq!(
            line(&LockKind::Write, l.clone()),
            ["_c_c-__READ__0000000001", "_c_b-__WRIT__0000000003"]
        );
        assert_eq!(
            line(&LockKind::Exclusive, l.clone()),
            ["_c_a-lock-0000000002"]
        );
        assert_eq!(
            line(&LockKind::Leader("v".into()), l.clone()),
            ["_c_d-latch-0000000004"]
        );
        assert_eq!(
            holders(&l),
            [
                "_c_a-lock-0000000002",
                "_c_d-latch-0000000004",
                "_c_c-__READ__0000000001"
            ]
        );
    }

    #[test]
    fn every_reader_ahead_of_the_first_writer_holds() {
        let l = sorted(&[
            "_c_a-__READ__0000000001",
            "_c_b-__READ__0000000002",
            "_c_c-__WRIT__0000000003",
            "_c_d-__READ__0000000004",
        ]);
        assert_eq!(
            holders(&l),
            ["_c_a-__READ__0000000001", "_c_b-__READ__0000000002"]
        );
        assert_eq!(holders(&l[2..]), ["_c_c-__WRIT__0000000003"]);
    }

    #[test]
    fn readers_wait_only_for_writers_ahead() {
        let l = sorted(&[
            "_c_a-__READ__0000000001",
            "_c_b-__WRIT__0000000002",
            "_c_c-__READ__0000000003",
            "_c_d-lock-0000000004",
            "_c_e-__READ__0000000005",
        ]);
        assert_eq!(blocker(&LockKind::Read, &l, 0), None);
        assert_eq!(blocker(&LockKind::Read, &l, 2), Some(1));
        assert_eq!(blocker(&LockKind::Read, &l, 4), Some(1));
        assert_eq!(blocker(&LockKind::Write, &l, 1), Some(0));
        assert_eq!(blocker(&LockKind::Exclusive, &l, 3), Some(2));
        assert!(would_wait(&LockKind::Read, &l));
        assert!(!would_wait(&LockKind::Read, &l[..1]));
        assert!(would_wait(&LockKind::Write, &l[..1]));
        assert!(!would_wait(&LockKind::Write, &[]));
    }
}
