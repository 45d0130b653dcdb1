//! What a majority of masters says: the answers of every master to one request, combined
//! into the one answer of the Redlock.

use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Extended, LockInfo, ReleaseWaiter, Released, Woken};
use crate::error::{Error, Result};
use crate::redis::waiter::RedisWaiter;

use super::SCHEME;

/// The answers of every master to one request (in master order).
pub(super) struct Answers<T>(pub(super) Vec<Result<T>>);

impl<T> Answers<T> {
    fn answered(&self) -> impl Iterator<Item = &T> {
        self.0.iter().filter_map(|answer| answer.as_ref().ok())
    }

    /// An error unless at least `quorum` masters answered: the first master's error.
    pub(super) fn require(self, quorum: usize, operation: &'static str) -> Result<Vec<T>> {
        let answered = self.answered().count();
        if answered >= quorum {
            return Ok(self.0.into_iter().filter_map(Result::ok).collect());
        }
        let errors: Vec<Error> = self.0.into_iter().filter_map(Result::err).collect();
        // Masters that refuse the login (or a command) are a refusal, not an outage.
        if let Some(refusal) = errors.iter().find(|error| error.is_not_authorized()) {
            return Err(Error::not_authorized(
                SCHEME,
                operation,
                format!(
                    "only {answered} masters answered; a majority needs {quorum}, and a master \
                     refused: {refusal}"
                ),
            ));
        }
        let first = errors
            .into_iter()
            .next()
            .map_or_else(String::new, |error| format!(" (first: {error})"));
        Err(Error::backend(
            SCHEME,
            operation,
            format!(
                "only {answered} masters answered; a majority needs {quorum}{first}: \
                 check that the masters run and are reachable"
            ),
        ))
    }
}

/// The largest value that at least `quorum` of `values` reach: what a majority agrees on.
pub(super) fn agreed<T: Ord + Copy + Default>(mut values: Vec<T>, quorum: usize) -> T {
    values.sort_unstable_by(|a, b| b.cmp(a));
    values
        .get(quorum.saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

/// One release, as the masters that answered saw it: released when a majority released a
/// hold of the owner (with the most holds left among them); else the owner no longer held
/// the lock: held by another when a master says so, or free.
pub(super) fn released(answers: &[Released], quorum: usize) -> Released {
    let remaining: Vec<u32> = answers
        .iter()
        .filter_map(|answer| match answer {
            Released::Released { remaining_holds } => Some(*remaining_holds),
            _ => None,
        })
        .collect();
    match remaining.iter().max() {
        Some(&remaining_holds) if remaining.len() >= quorum => {
            Released::Released { remaining_holds }
        }
        _ if answers.contains(&Released::HeldByOther) => Released::HeldByOther,
        _ => Released::NotHeld,
    }
}

/// One extension: extended when a majority extended.
pub(super) fn extended(answers: &[Extended], quorum: usize) -> Extended {
    let count = |wanted: Extended| answers.iter().filter(|a| **a == wanted).count();
    if count(Extended::Extended) >= quorum {
        Extended::Extended
    } else if count(Extended::HeldByOther) > 0 {
        Extended::HeldByOther
    } else {
        Extended::NotHeld
    }
}

/// What the masters say about one lock: held when one owner holds it on a majority; its
/// token is the largest of them, its holds and lease what a majority has at least.
pub(super) fn inspected(answers: Vec<LockInfo>, quorum: usize) -> LockInfo {
    let holder = answers.iter().find_map(|info| {
        let holder = info.holder.as_ref()?;
        let count = answers
            .iter()
            .filter(|other| other.holder.as_ref() == Some(holder))
            .count();
        (count >= quorum).then(|| holder.clone())
    });
    let Some(holder) = holder else {
        return LockInfo::new(false);
    };
    let theirs: Vec<&LockInfo> = answers
        .iter()
        .filter(|info| info.holder.as_ref() == Some(&holder))
        .collect();
    let mut info = LockInfo::new(true);
    info.fencing_token = theirs.iter().filter_map(|i| i.fencing_token).max();
    info.holds = Some(agreed(
        theirs.iter().map(|i| i.holds.unwrap_or(0)).collect(),
        quorum,
    ));
    info.remaining_lease = Some(agreed(
        theirs
            .iter()
            .map(|i| i.remaining_lease.unwrap_or_default())
            .collect(),
        quorum,
    ));
    info.holder = Some(holder);
    info
}

/// Waits for a release announced by any master. One release is announced by every master
/// it reached, moments apart: after the first announcement the others are marked seen, so
/// that one release wakes a waiter once, not once per master.
pub(super) struct AnyMaster(pub(super) Vec<RedisWaiter>);

#[async_trait]
impl ReleaseWaiter for AnyMaster {
    async fn wait(&mut self, max: Duration) -> Woken {
        let waits = self.0.iter_mut().map(|waiter| waiter.wait(max));
        // Unqueued waiters only ever ask for a retry, which is all a Redlock waiter needs.
        let _ = futures_util::future::select_all(waits).await;
        for waiter in &mut self.0 {
            waiter.receiver.borrow_and_update();
        }
        Woken::Retry
    }
}

/// The names at least `quorum` masters list, the first `limit` of them, from each master's
/// answer to [`RedisBackend::held_names`](crate::redis::RedisBackend): its smallest names
/// and whether it left some out. A master that left names out is complete only up to its
/// largest listed name, so only names up to the smallest such bound are certain. `None` when
/// fewer than `limit` names are certain but more may be: ask again for more names.
pub(super) fn listed(
    answers: &[(Vec<String>, bool)],
    quorum: usize,
    limit: usize,
) -> Option<Vec<String>> {
    let bound = answers
        .iter()
        .filter(|(_, left_out)| *left_out)
        .filter_map(|(names, _)| names.last())
        .min();
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for (names, _) in answers {
        for name in names {
            *counts.entry(name.as_str()).or_default() += 1;
        }
    }
    let held: Vec<String> = counts
        .into_iter()
        .filter(|(name, count)| {
            *count >= quorum && bound.is_none_or(|bound| *name <= bound.as_str())
        })
        .map(|(name, _)| name.to_owned())
        .take(limit)
        .collect();
    (held.len() >= limit || bound.is_none()).then_some(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Security: masters that refuse the login leave no majority as a refusal, not as an
    /// outage; masters out of reach alone stay an outage.
    #[test]
    fn a_refusal_among_the_missing_answers_is_not_authorized() {
        let refused = || Error::not_authorized("redis", "acquire", "WRONGPASS");
        let down = || Error::backend(SCHEME, "acquire", "connection refused");
        let answers = Answers(vec![Ok(1_u8), Err(down()), Err(refused())]);
        let err = answers.require(2, "release").expect_err("no majority");
        assert!(err.is_not_authorized(), "{err}");
        assert!(err.to_string().contains("WRONGPASS"), "{err}");
        let answers = Answers(vec![Ok(1_u8), Err(down()), Err(down())]);
        let err = answers.require(2, "release").expect_err("no majority");
        assert!(err.is_backend(), "{err}");
        let answers = Answers(vec![Ok(1_u8), Ok(2), Err(refused())]);
        assert_eq!(answers.require(2, "release").unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_majority_agrees_on_the_quorum_th_largest() {
        assert_eq!(agreed(vec![2, 1, 1], 2), 1);
        assert_eq!(agreed(vec![2, 2, 0], 2), 2);
        assert_eq!(agreed(vec![0, 1, 0], 2), 0);
        assert_eq!(agreed(vec![3, 1, 2, 5, 4], 3), 3);
    }

    #[test]
    fn releases_combine() {
        use Released as R;
        let released_to = |remaining_holds| R::Released { remaining_holds };
        assert_eq!(
            released(&[released_to(0), R::NotHeld, released_to(1)], 2),
            released_to(1)
        );
        assert_eq!(
            released(&[R::NotHeld, R::HeldByOther, R::NotHeld], 2),
            R::HeldByOther
        );
        assert_eq!(released(&[R::NotHeld, R::NotHeld], 2), R::NotHeld);
        // One master released, a majority says another holds it: the owner had lost it.
        assert_eq!(
            released(&[released_to(0), R::HeldByOther, R::HeldByOther], 2),
            R::HeldByOther
        );
        assert_eq!(
            released(&[released_to(0), R::NotHeld, R::NotHeld], 2),
            R::NotHeld
        );
    }

    #[test]
    fn a_holder_on_a_minority_does_not_hold() {
        let held = |holder: &str, token| {
            let mut info = LockInfo::new(true);
            info.holder = Some(holder.into());
            info.fencing_token = Some(token);
            info.holds = Some(1);
            info
        };
        let info = inspected(vec![held("a", 5), held("b", 7), LockInfo::new(false)], 2);
        assert!(!info.locked);
        let info = inspected(vec![held("a", 5), held("b", 7), held("a", 6)], 2);
        assert_eq!(info.holder.as_deref(), Some("a"));
        assert_eq!(info.fencing_token, Some(6));
    }

    #[test]
    fn a_name_is_listed_when_a_majority_lists_it() {
        let list = |names: &[&str], left_out| {
            (
                names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                left_out,
            )
        };
        let answers = [
            list(&["a", "b", "c"], false),
            list(&["b", "c"], false),
            list(&["a", "c", "d"], false),
        ];
        assert_eq!(listed(&answers, 2, 10).unwrap(), ["a", "b", "c"]);
        assert_eq!(listed(&answers, 2, 1).unwrap(), ["a"]);
        // The third master has names past "b" it did not list: "c" is not certain there.
        let answers = [
            list(&["a", "c"], false),
            list(&["c"], false),
            list(&["a", "b"], true),
        ];
        assert_eq!(listed(&answers, 2, 1).unwrap(), ["a"]);
        assert_eq!(listed(&answers, 2, 2), None);
    }
}
