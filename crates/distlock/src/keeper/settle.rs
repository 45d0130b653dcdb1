//! Settling a request whose outcome is unknown.
//!
//! A request that failed (a lost reply, a timeout, a connection cut) may or may not have taken
//! effect on the server. An acquire that did leaves a hold nobody will release; a release that
//! did not leaves one hold too many. Neither may be retried blindly: the requests are not
//! idempotent. Instead, the client keeps, per lock name and owner, how many of its requests are
//! in flight, and after a failure asks the server how many holds the owner has
//! ([`Backend::holds`](crate::backend::Backend::holds)). When no other request of that owner on
//! that name started meanwhile, the guards the client registered are exactly the holds the
//! server should have, and every hold beyond them is released.
//!
//! A settle that cannot be sure (another request of the same owner is in flight, the server
//! does not answer) changes nothing; the left-over hold then frees at its lease end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Owner, Released};
use crate::error::Result;
use crate::keeper::ClientInner;
use crate::name::LockName;

/// How long settling may take before it gives up (the caller waits for it).
const PATIENCE: Duration = Duration::from_secs(2);

/// How many holds one settle releases at most: a request can leave at most one behind, so
/// more means the server answers something the client does not understand.
const MAX_RELEASES: u32 = 3;

/// The requests of one owner on one name that are in flight.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// How many are in flight now.
    count: u32,
    /// How many settles are watching this entry: it lives while they do, so that `changes`
    /// keeps counting.
    watchers: u32,
    /// Every request begun and every guard registered or unregistered for this owner and
    /// name while the entry lived: a settle that sees it move knows its count is stale.
    changes: u64,
}

/// Per lock name and owner, the requests of a client in flight.
#[derive(Default)]
pub(crate) struct Requests {
    in_flight: HashMap<(LockName, Owner), InFlight>,
}

impl Requests {
    fn release_entry(&mut self, key: &(LockName, Owner), request: bool) {
        if let Some(entry) = self.in_flight.get_mut(key) {
            if request {
                entry.count = entry.count.saturating_sub(1);
            } else {
                entry.watchers = entry.watchers.saturating_sub(1);
            }
            if entry.count == 0 && entry.watchers == 0 {
                self.in_flight.remove(key);
            }
        }
    }
}

/// One request in flight (or one acquisition, from its first request until its guard is
/// registered); dropping it ends it.
pub(crate) struct Ticket {
    client: Arc<ClientInner>,
    key: (LockName, Owner),
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.client.requests().release_entry(&self.key, true);
    }
}

/// A settle's watch on one owner and name.
struct Watch<'a> {
    client: &'a ClientInner,
    key: (LockName, Owner),
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.client.requests().release_entry(&self.key, false);
    }
}

impl ClientInner {
    /// Marks a request of `owner` on `name` in flight until the ticket is dropped.
    pub(crate) fn begin_request(self: &Arc<Self>, name: &LockName, owner: &Owner) -> Ticket {
        let key = (name.clone(), owner.clone());
        let mut requests = self.requests();
        let entry = requests.in_flight.entry(key.clone()).or_default();
        entry.count += 1;
        entry.changes += 1;
        drop(requests);
        Ticket {
            client: self.clone(),
            key,
        }
    }

    /// Tells a settle watching `owner` on `name` that a guard was registered or unregistered.
    pub(crate) fn guards_changed(&self, name: &LockName, owner: &Owner) {
        let mut requests = self.requests();
        if requests.in_flight.is_empty() {
            return;
        }
        if let Some(entry) = requests.in_flight.get_mut(&(name.clone(), owner.clone())) {
            entry.changes += 1;
        }
    }

    fn watch(&self, name: &LockName, owner: &Owner) -> Watch<'_> {
        let key = (name.clone(), owner.clone());
        self.requests()
            .in_flight
            .entry(key.clone())
            .or_default()
            .watchers += 1;
        Watch { client: self, key }
    }

    fn in_flight(&self, key: &(LockName, Owner)) -> InFlight {
        self.requests()
            .in_flight
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// After a request of `owner` on `name` failed (its ticket already dropped): releases the
    /// holds the server keeps beyond the guards this client registered. Never fails; gives up
    /// when it cannot be sure.
    ///
    /// `own` is how many tickets of `owner` on `name` the caller itself still holds (an
    /// acquisition's): those do not count as other requests in flight.
    pub(crate) async fn settle(self: &Arc<Self>, name: &LockName, owner: &Owner, own: u32) {
        let settled = tokio::time::timeout(PATIENCE, self.settle_now(name, owner, own)).await;
        match settled {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => tracing::debug!(
                lock = %name,
                "another request of the same owner is in flight; a hold left by the failed one frees at its lease end"
            ),
            Ok(Err(error)) => tracing::warn!(
                lock = %name, %error,
                "could not ask the server after a failed request; a hold it left frees at its lease end"
            ),
            Err(_elapsed) => tracing::warn!(
                lock = %name,
                "the server did not answer after a failed request; a hold it left frees at its lease end"
            ),
        }
    }

    /// Asks how many holds `owner` has, again after a pause while the connection that just
    /// failed recovers (the question changes nothing); the caller's timeout bounds it.
    async fn holds_patiently(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let mut pause = Duration::from_millis(10);
        loop {
            match self.backend.holds(name, owner).await {
                Ok(held) => return Ok(held),
                Err(error) if error.is_backend() => {
                    tracing::debug!(lock = %name, %error, "asking for the holds failed; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `Ok(true)` when the server's holds match the registered guards now.
    async fn settle_now(
        self: &Arc<Self>,
        name: &LockName,
        owner: &Owner,
        own: u32,
    ) -> Result<bool> {
        let key = (name.clone(), owner.clone());
        let _watch = self.watch(name, owner);
        for _ in 0..=MAX_RELEASES {
            let before = self.in_flight(&key);
            if before.count > own {
                return Ok(false);
            }
            let expected = self.registered_guards(name, owner);
            let held = self.holds_patiently(name, owner).await?;
            if self.in_flight(&key) != before || self.registered_guards(name, owner) != expected {
                return Ok(false);
            }
            if held <= expected {
                return Ok(true);
            }
            tracing::debug!(lock = %name, held, expected, "releasing a hold a failed request left");
            let released = {
                let _ticket = self.begin_request(name, owner);
                self.backend.release(name, owner).await
            };
            match released {
                Ok(Released::Released { .. }) => {}
                // Gone meanwhile (expired, force-unlocked): nothing left to settle.
                Ok(Released::NotHeld | Released::HeldByOther) => return Ok(true),
                // Unknown again: the next round asks the server.
                Err(error) => {
                    tracing::debug!(lock = %name, %error, "settling release failed; asking again");
                }
            }
        }
        Ok(false)
    }
}
