//! One acquisition attempt of a Redlock: the gate, the other masters, one token for the
//! majority, and giving back exactly what a failed attempt took.
//!
//! Every script of an attempt carries the attempt's id; a master that granted or re-entered
//! marks the lock's hash with it, so the give-back takes back this attempt's hold and nothing
//! else — also on a master whose answer was lost, where the attempt may or may not have run.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::{RedlockBackend, SCHEME};
use crate::backend::{Acquired, Owner};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::redis::{Keys, acquired, millis};

/// How long a master that failed as a gate is not asked first.
const GATE_PAUSE: Duration = Duration::from_secs(1);

/// One master's part of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Not asked.
    NotAsked,
    /// Granted, with this token and the owner's holds there (more than 1: re-entered).
    Granted { token: u64, holds: u32 },
    /// Held by another owner.
    Held(Option<Duration>),
    /// No answer: it may have run.
    Unknown,
}

/// What the granting masters make of an attempt.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A majority had no hold of the owner and granted afresh: the owner did not hold the
    /// lock. Holds other masters still had are left over from an earlier grant.
    Fresh,
    /// A majority re-entered holds the owner had: the owner held the lock.
    Reentry,
    /// Neither: not granted.
    Undecided,
}

fn verdict(parts: &[Part], quorum: usize) -> Verdict {
    let count = |reentered: bool| {
        parts
            .iter()
            .filter(|p| matches!(p, Part::Granted { holds, .. } if (*holds > 1) == reentered))
            .count()
    };
    if count(false) >= quorum {
        Verdict::Fresh
    } else if count(true) >= quorum {
        Verdict::Reentry
    } else {
        Verdict::Undecided
    }
}

impl RedlockBackend {
    pub(super) async fn attempt(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        let started = Instant::now();
        let keys = Keys::of(name);
        let kept = self.kept(lease);
        let id = format!("{:016x}", fastrand::u64(..));
        let mut parts = vec![Part::NotAsked; self.masters.len()];
        let mut gate = None;
        for i in self.gate_order(name) {
            parts[i] = self.acquire_on(i, &keys, owner, kept, 0, &id).await;
            match parts[i] {
                Part::Granted { token, .. } => {
                    gate = Some(token);
                    break;
                }
                Part::Held(_) => break,
                Part::Unknown => {
                    let until = self.now_ms() + millis(GATE_PAUSE);
                    self.masters[i]
                        .passed_over_until
                        .store(until, Ordering::Relaxed);
                }
                Part::NotAsked => {}
            }
        }
        if let Some(floor) = gate {
            let rest: Vec<usize> = (0..parts.len())
                .filter(|&i| parts[i] == Part::NotAsked)
                .collect();
            let answers = join_all(
                rest.iter()
                    .map(|&i| self.acquire_on(i, &keys, owner, kept, floor, &id)),
            )
            .await;
            for (i, part) in rest.into_iter().zip(answers) {
                parts[i] = part;
            }
        }
        if let Some(granted) = self.agree(&keys, owner, &parts, &id).await {
            // Valid while the client's deadline for it has not passed.
            if crate::options::lease_deadline(started, lease) > Instant::now() {
                return Ok(granted);
            }
            tracing::warn!(lock = %name, elapsed = ?started.elapsed(), "redlock: the masters granted after the lease ran out; giving it back");
        }
        let touched: Vec<usize> = (0..parts.len())
            .filter(|&i| matches!(parts[i], Part::Granted { .. } | Part::Unknown))
            .collect();
        self.give_back(name, owner, &id, touched, kept).await;
        let answered = parts
            .iter()
            .filter(|p| matches!(p, Part::Granted { .. } | Part::Held(_)))
            .count();
        let held = parts.iter().any(|p| matches!(p, Part::Held(_)));
        if !held && answered < self.quorum {
            return Err(Error::backend(
                SCHEME,
                "acquire",
                format!(
                    "only {answered} of {} masters answered within {:?}, a majority needs {}: \
                     check that the masters run and are reachable, or raise request_timeout",
                    self.masters.len(),
                    self.request_timeout,
                    self.quorum
                ),
            ));
        }
        // Try again when the shortest lease seen runs out, and soon when none was seen (a
        // majority granted too late, or disagreed): a release may not be announced to us.
        let ttl = parts
            .iter()
            .filter_map(|p| match p {
                Part::Held(ttl) => *ttl,
                _ => None,
            })
            .min()
            .unwrap_or(self.request_timeout);
        Ok(Acquired::Held { ttl: Some(ttl) })
    }

    /// Whether `parts` make a grant: a majority granted afresh or re-entered, and carries one
    /// token once the granting masters that disagree were raised to it.
    async fn agree(
        &self,
        keys: &Keys,
        owner: &Owner,
        parts: &[Part],
        id: &str,
    ) -> Option<Acquired> {
        let verdict = verdict(parts, self.quorum);
        let granted: Vec<(usize, u64, u32)> = parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match *p {
                Part::Granted { token, holds } => Some((i, token, holds)),
                _ => None,
            })
            .collect();
        let (token, holds) = match verdict {
            Verdict::Undecided => return None,
            // A fresh grant takes the largest token; holds left over from an earlier grant
            // are reset to this one.
            Verdict::Fresh => (granted.iter().map(|g| g.1).max()?, 1),
            // A re-entry keeps the token of the grant it re-enters.
            Verdict::Reentry => (
                granted.iter().filter(|g| g.2 > 1).map(|g| g.1).max()?,
                super::quorum::agreed(granted.iter().map(|g| g.2).collect(), self.quorum),
            ),
        };
        let reset = verdict == Verdict::Fresh;
        let disagreeing: Vec<usize> = granted
            .iter()
            .filter(|&&(_, t, h)| t != token || (reset && h != 1))
            .map(|g| g.0)
            .collect();
        let confirmed = join_all(
            disagreeing
                .iter()
                .map(|&i| self.confirm_on(i, keys, owner, token, reset, id)),
        )
        .await;
        let carrying = granted.len() - disagreeing.len() + confirmed.iter().filter(|c| **c).count();
        (carrying >= self.quorum).then_some(Acquired::Granted {
            fencing_token: token,
            holds,
        })
    }

    async fn acquire_on(
        &self,
        master: usize,
        keys: &Keys,
        owner: &Owner,
        kept: Duration,
        floor: u64,
        id: &str,
    ) -> Part {
        let request = async {
            let reply: Vec<i64> = self
                .scripts
                .acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(millis(kept))
                .arg(floor)
                .arg(id)
                .invoke_async(&mut self.masters[master].redis()?.connection.clone())
                .await
                .map_err(master_error("acquire"))?;
            acquired(&reply)
        };
        match self.bounded(request).await {
            Ok(Acquired::Granted {
                fencing_token,
                holds,
            }) => Part::Granted {
                token: fencing_token,
                holds,
            },
            Ok(Acquired::Held { ttl }) => Part::Held(ttl),
            Err(error) => {
                tracing::debug!(%error, master, "redlock: no answer to an acquire");
                Part::Unknown
            }
        }
    }

    /// Raises the counter of master `master` to `token` and makes it the grant's token (and,
    /// with `reset`, the owner's holds there 1, and the marks of other attempts gone: a
    /// give-back of an earlier attempt still retried in the background then finds no mark
    /// there and leaves this grant's hold alone).
    async fn confirm_on(
        &self,
        master: usize,
        keys: &Keys,
        owner: &Owner,
        token: u64,
        reset: bool,
        id: &str,
    ) -> bool {
        let request = async {
            let reply: i64 = self
                .scripts
                .confirm
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(token)
                .arg(if reset { "1" } else { "0" })
                .arg(id)
                .invoke_async(&mut self.masters[master].redis()?.connection.clone())
                .await
                .map_err(master_error("confirm"))?;
            Ok(reply == 1)
        };
        self.bounded(request).await.unwrap_or(false)
    }

    /// Takes back attempt `id`'s hold on each of `masters`. Masters that do not answer are
    /// asked again in the background until they do or their lease (`kept`) has passed, so
    /// that a hold left on a name's gate does not stop every contender there for a lease.
    async fn give_back(
        &self,
        name: &LockName,
        owner: &Owner,
        id: &str,
        masters: Vec<usize>,
        kept: Duration,
    ) {
        let keys = Keys::of(name);
        let undone = join_all(masters.iter().map(|&i| self.undo_on(i, &keys, owner, id))).await;
        let left: Vec<usize> = masters
            .into_iter()
            .zip(undone)
            .filter(|(_, undone)| !undone)
            .map(|(i, _)| i)
            .collect();
        if left.is_empty() {
            return;
        }
        let backend = self.clone();
        let (owner, id) = (owner.clone(), id.to_owned());
        let until = Instant::now() + kept;
        // Not counted as a clean-up a process waits for: it retries masters that did not
        // answer for the whole lease, and a hold it misses ends with that lease anyway.
        tokio::spawn(async move {
            let mut left = left;
            while !left.is_empty() && Instant::now() < until {
                tokio::time::sleep(backend.request_timeout).await;
                let undone =
                    join_all(left.iter().map(|&i| backend.undo_on(i, &keys, &owner, &id))).await;
                left = left
                    .into_iter()
                    .zip(undone)
                    .filter(|(_, undone)| !undone)
                    .map(|(i, _)| i)
                    .collect();
            }
        });
    }

    /// True when master `master` answered the give-back (whether or not it had a hold).
    async fn undo_on(&self, master: usize, keys: &Keys, owner: &Owner, id: &str) -> bool {
        let request = async {
            let _: i64 = self
                .scripts
                .undo
                .key(&keys.lock)
                .key(&keys.channel)
                .arg(owner.as_str())
                .arg(id)
                .invoke_async(&mut self.masters[master].redis()?.connection.clone())
                .await
                .map_err(master_error("give back"))?;
            Ok(())
        };
        self.bounded(request).await.is_ok()
    }
}

/// A master's error: its refusal of the URL's login or of a command as
/// [`Error::NotAuthorized`], anything else as [`Error::Backend`].
fn master_error(operation: &'static str) -> impl FnOnce(redis::RedisError) -> Error {
    move |error| {
        crate::redis::refused(operation, &error)
            .unwrap_or_else(|| Error::backend(SCHEME, operation, error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(holds: u32) -> Part {
        Part::Granted { token: 1, holds }
    }

    #[test]
    fn a_majority_decides_fresh_or_reentry() {
        use Part::{Held, Unknown};
        assert_eq!(
            verdict(&[granted(1), granted(1), Unknown], 2),
            Verdict::Fresh
        );
        assert_eq!(
            verdict(&[granted(2), granted(1), granted(1)], 2),
            Verdict::Fresh
        );
        assert_eq!(
            verdict(&[granted(3), granted(2), granted(1)], 2),
            Verdict::Reentry
        );
        assert_eq!(
            verdict(&[granted(2), granted(1), Unknown], 2),
            Verdict::Undecided
        );
        assert_eq!(
            verdict(&[granted(1), Held(None), Unknown], 2),
            Verdict::Undecided
        );
    }
}
