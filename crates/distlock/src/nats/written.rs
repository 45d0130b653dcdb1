//! What this client last wrote to each lock key it holds: the revision of the write, the
//! value and when it was sent and answered. A renewal, a reentry or a release of a grant
//! written here goes straight to a write conditioned on that revision (one round trip)
//! instead of reading the key first (two): the condition is the whole check, since a key
//! whose revision is still the one this client wrote still holds the value it wrote. Where
//! anything else wrote the key since, the write fails and the caller reads the key as before.
//!
//! A remembered write is used only while its lease surely runs by the server's clock: the
//! server stamped the write after it was sent, so the lease runs at least until `sent +
//! lease`, and at most until `answered + lease`. `sent` is read from both of this machine's
//! clocks, and both must show time left: the monotonic one does not count a suspended
//! machine, the wall clock can be set back.
//!
//! The revision alone identifies the write: a bucket deleted and created again within a
//! lease, whose new stream reaches the same revision, would be taken for the old one (a
//! limit `docs/backends/nats.md` states).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::record::Grant;

/// How many keys the memory keeps at most; past it, new grants are not remembered (they
/// take the two-round-trip path).
const KEYS: usize = 1 << 16;

/// One write of this client to a lock key.
#[derive(Debug, Clone)]
pub(super) struct Written {
    /// The revision the write made.
    pub(super) revision: u64,
    /// The value written, its token resolved (`Some`).
    pub(super) grant: Grant,
    /// When the write was sent, by the monotonic clock and by the wall clock, and when its
    /// answer came.
    pub(super) sent: Instant,
    pub(super) sent_wall: SystemTime,
    pub(super) answered: Instant,
}

impl Written {
    /// The grant's fencing token.
    pub(super) fn token(&self) -> u64 {
        self.grant.token_at(self.revision)
    }

    /// What is left of the lease at least, by the server's clock; `None` when it may have
    /// run out.
    pub(super) fn surely_left(&self, now: Instant, now_wall: SystemTime) -> Option<Duration> {
        // A wall clock set back since the write reads as no time passed: the monotonic
        // clock still counts.
        let by_wall = now_wall.duration_since(self.sent_wall).unwrap_or_default();
        let elapsed = now.saturating_duration_since(self.sent).max(by_wall);
        Duration::from_millis(self.grant.lease_ms)
            .checked_sub(elapsed)
            .filter(|left| !left.is_zero())
    }

    /// What is left of the lease at most, by the server's clock.
    pub(super) fn at_most_left(&self, now: Instant) -> Duration {
        Duration::from_millis(self.grant.lease_ms)
            .saturating_sub(now.saturating_duration_since(self.answered))
    }
}

/// The writes of this client, by key.
#[derive(Debug, Default)]
pub(super) struct Writes {
    by_key: Mutex<HashMap<String, Written>>,
    /// The keys this client deleted, with the revision of the delete: the next grant of the
    /// key here writes on that revision straight away, and only reads the key when
    /// something else wrote it since.
    deleted: Mutex<HashMap<String, u64>>,
}

impl Writes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last write to `key`, if it was `owner`'s and its lease surely still runs. A
    /// write whose lease may have run out is forgotten.
    pub(super) fn live(&self, key: &str, owner: &str) -> Option<Written> {
        let mut map = self.map();
        let written = map.get(key)?;
        if written.surely_left(Instant::now(), SystemTime::now()).is_none() {
            map.remove(key);
            return None;
        }
        (written.grant.owner == owner).then(|| written.clone())
    }

    /// Keeps `written` as the last write to `key`, unless a later one is kept already. At
    /// [`KEYS`] keys, the writes whose lease may have run out make room first.
    pub(super) fn remember(&self, key: &str, written: Written) {
        let mut map = self.map();
        if let Some(kept) = map.get_mut(key) {
            if kept.revision < written.revision {
                *kept = written;
            }
            return;
        }
        if map.len() >= KEYS {
            let (now, now_wall) = (Instant::now(), SystemTime::now());
            map.retain(|_, kept| kept.surely_left(now, now_wall).is_some());
        }
        if map.len() < KEYS {
            map.insert(key.to_owned(), written);
        }
    }

    /// Keeps `revision` as that of this client's delete of `key`.
    pub(super) fn remember_deleted(&self, key: &str, revision: u64) {
        let mut deleted = self.deleted.lock().unwrap_or_else(|p| p.into_inner());
        if deleted.len() >= KEYS {
            deleted.clear();
        }
        let kept = deleted.entry(key.to_owned()).or_insert(revision);
        *kept = (*kept).max(revision);
    }

    /// The revision of this client's delete of `key`, taken out of the memory: one attempt
    /// uses it.
    pub(super) fn take_deleted(&self, key: &str) -> Option<u64> {
        self.deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    }

    /// Forgets the write of `revision` to `key` (deleted, or found overtaken); a later one
    /// stays.
    pub(super) fn forget(&self, key: &str, revision: u64) {
        let mut map = self.map();
        if map.get(key).is_some_and(|kept| kept.revision <= revision) {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(revision: u64, owner: &str, lease_ms: u64) -> Written {
        let now = Instant::now();
        Written {
            revision,
            grant: Grant {
                owner: owner.into(),
                holds: 1,
                lease_ms,
                token: Some(revision),
            },
            sent: now,
            sent_wall: SystemTime::now(),
            answered: now,
        }
    }

    #[test]
    fn later_writes_win_and_forgetting_spares_them() {
        let writes = Writes::default();
        writes.remember("k", written(5, "me", 60_000));
        writes.remember("k", written(3, "me", 60_000));
        assert_eq!(writes.live("k", "me").map(|w| w.revision), Some(5));
        assert!(writes.live("k", "other").is_none());
        writes.forget("k", 4);
        assert_eq!(writes.live("k", "me").map(|w| w.revision), Some(5));
        writes.forget("k", 5);
        assert!(writes.live("k", "me").is_none());
        writes.remember_deleted("k", 9);
        writes.remember_deleted("k", 8);
        assert_eq!(writes.take_deleted("k"), Some(9));
        assert_eq!(writes.take_deleted("k"), None);
    }

    #[test]
    fn a_write_whose_lease_may_have_run_out_is_not_used() {
        let writes = Writes::default();
        let mut old = written(7, "me", 10);
        std::thread::sleep(Duration::from_millis(20));
        writes.remember("k", old.clone());
        assert!(writes.live("k", "me").is_none(), "the monotonic clock ran past the lease");
        assert!(writes.live("k", "me").is_none(), "and the write was forgotten");
        old.grant.lease_ms = 60_000;
        old.sent = Instant::now();
        old.sent_wall = SystemTime::now() - Duration::from_secs(61);
        writes.remember("k", old);
        assert!(writes.live("k", "me").is_none(), "the wall clock ran past the lease");
        let fresh = written(8, "me", 60_000);
        let now = (Instant::now(), SystemTime::now());
        assert!(fresh.surely_left(now.0, now.1).is_some());
        assert!(fresh.at_most_left(now.0) <= Duration::from_secs(60));
    }
}
