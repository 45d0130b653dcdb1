//! Leader election, built on a backend's mutex and its published records.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt;

use super::primitives::{PROMPTLY, drop_after_polls};
use super::{Target, UNLOCK_LEASE, client, faulty_client, unique, unlock_lease_client};
use crate::backend::MAX_PUBLISHED_VALUE;
use crate::fault::{Fault, Method};
use crate::{AcquireOptions, ConnectOptions, Leader, Leadership, LossReason};

/// How long a whole case may take before it counts as hung.
const CASE_LIMIT: Duration = Duration::from_secs(120);

/// Runs a case's body under [`CASE_LIMIT`], so that no await of it can hang the suite.
async fn bounded(case: &str, body: impl Future<Output = ()>) {
    tokio::time::timeout(CASE_LIMIT, body)
        .await
        .unwrap_or_else(|_| panic!("{case} did not finish within {CASE_LIMIT:?}"));
}

/// Awaits `future` for at most `limit`, panicking with `what` when it does not finish.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}

/// Asserts that `leader` names `leadership`: its term, value and owner.
/// In the backend's own layout the holder is the leader's node or key, which the term
/// already pins down.
fn names(leader: Option<Leader>, leadership: &Leadership, what: &str) {
    let leader = leader.unwrap_or_else(|| panic!("{what}: leader() says nobody leads"));
    assert_eq!(leader.term, leadership.term(), "{what}: another term leads");
    assert_eq!(leader.value, leadership.value(), "{what}: another value");
    if leadership.guard().name().ends_with("#leader") {
        assert_eq!(
            leader.holder,
            leadership.guard().owner().as_str(),
            "{what}: another holder"
        );
    } else {
        assert!(!leader.holder.is_empty(), "{what}: no holder");
    }
}

/// Promise 1: four campaigners on two clients, several rounds each. Each elected one finds
/// itself named by `leader()` with its term; never two lead at once; the terms of all
/// leaderships strictly increase in the order they were granted.
pub async fn promise1_election_has_one_leader_at_a_time(target: &Target) {
    bounded("promise1_election_has_one_leader_at_a_time", async {
        let name = unique("election_one");
        let clients = [client(target).await, client(target).await];
        let leading = Arc::new(AtomicUsize::new(0));
        let terms = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for task in 0..4 {
            let election = clients[task % 2].election(name.as_str()).unwrap();
            let (leading, terms) = (leading.clone(), terms.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..4 {
                    let what = format!("task {task} round {round}");
                    let leadership = election
                        .campaign_with(
                            format!("task-{task}"),
                            AcquireOptions::new().wait(Duration::from_secs(60)),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{what}: campaign: {e}"));
                    assert_eq!(
                        leading.fetch_add(1, Ordering::SeqCst),
                        0,
                        "{what}: two leaders at once"
                    );
                    {
                        let mut terms = terms.lock().unwrap();
                        if let Some(last) = terms.last() {
                            assert!(
                                leadership.term() > *last,
                                "{what}: term {} after term {last}",
                                leadership.term()
                            );
                        }
                        terms.push(leadership.term());
                    }
                    names(election.leader().await.unwrap(), &leadership, &what);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    leading.fetch_sub(1, Ordering::SeqCst);
                    leadership
                        .resign()
                        .await
                        .unwrap_or_else(|e| panic!("{what}: resign: {e}"));
                }
            }));
        }
        for task in tasks {
            task.await.expect("a campaigning task panicked");
        }
        assert_eq!(
            terms.lock().unwrap().len(),
            16,
            "not every round was elected"
        );
        let election = clients[0].election(name.as_str()).unwrap();
        assert!(
            election.leader().await.unwrap().is_none(),
            "a leader is named after everyone resigned"
        );
    })
    .await;
}

/// Promise 2: a leadership whose mutex is force-unlocked fires `lost()` within a bound, and
/// once another campaigns, a follower's `leader()` names the new leader with a larger term.
pub async fn promise2_leadership_lost_when_its_lock_is_lost(target: &Target) {
    bounded("promise2_leadership_lost_when_its_lock_is_lost", async {
        let name = unique("election_lost");
        let locks = unlock_lease_client(target).await;
        let operator = client(target).await;
        let follower = client(target).await.election(name.as_str()).unwrap();
        let election = locks.election(name.as_str()).unwrap();
        let first = within(PROMPTLY, "campaign", election.campaign("first"))
            .await
            .unwrap();
        names(follower.leader().await.unwrap(), &first, "the follower");
        assert!(
            operator.force_unlock(election.lock_name()).await.unwrap(),
            "the election's mutex was not held"
        );
        let lost = within(
            UNLOCK_LEASE * 3,
            "lost() after a force-unlock",
            first.lost(),
        )
        .await;
        assert!(
            matches!(
                lost,
                crate::Error::LockLost {
                    reason: LossReason::NotHeld | LossReason::SessionLost,
                    ..
                }
            ),
            "expected the server's answer or the session's end as the reason, got {lost}"
        );
        let next = within(
            Duration::from_secs(10),
            "the next campaign",
            operator.election(name.as_str()).unwrap().campaign("second"),
        )
        .await
        .unwrap();
        assert!(
            next.term() > first.term(),
            "term {} after term {}",
            next.term(),
            first.term()
        );
        names(
            follower.leader().await.unwrap(),
            &next,
            "the follower after the change",
        );
        let resigned = first.resign().await;
        assert!(
            resigned
                .as_ref()
                .is_err_and(|e| e.is_lock_lost() || e.is_not_owner()),
            "resigning a lost leadership: {resigned:?}"
        );
        names(
            follower.leader().await.unwrap(),
            &next,
            "the follower after the lost leader resigned",
        );
        next.resign().await.unwrap();
    })
    .await;
}

/// A crashed leader (its leadership forgotten, as a killed process's) on a fixed lease is
/// replaced: a waiting campaign is elected once the lease ends, with a larger term, and
/// `observe()` yields the old leader first and then the new one.
pub async fn crashed_leader_is_replaced(target: &Target) {
    bounded("crashed_leader_is_replaced", async {
        let name = unique("election_crash");
        let lease = Duration::from_millis(2000);
        let crashing = client(target).await.election(name.as_str()).unwrap();
        let observer = client(target).await.election(name.as_str()).unwrap();
        let waiting = client(target).await.election(name.as_str()).unwrap();
        // Before the campaign: its lease starts at its grant, which comes after this.
        let started = tokio::time::Instant::now();
        let crashed = within(
            PROMPTLY,
            "campaign",
            crashing.campaign_with("crashing", AcquireOptions::new().lease(lease)),
        )
        .await
        .unwrap();
        let old_term = crashed.term();
        std::mem::forget(crashed);
        let mut changes = Box::pin(observer.observe());
        let first = within(
            Duration::from_secs(5),
            "observe's first answer",
            changes.next(),
        )
        .await
        .expect("the stream ended")
        .unwrap()
        .expect("observe() names nobody while the crashed leader's lease runs");
        assert_eq!(
            first.term, old_term,
            "observe() did not start with the leader"
        );
        let next = within(
            Duration::from_secs(10),
            "the waiting campaign",
            waiting.campaign_with(
                "waiting",
                AcquireOptions::new().wait(Duration::from_secs(10)),
            ),
        )
        .await
        .expect("the crashed leader's lease did not end");
        assert!(
            started.elapsed() >= lease - Duration::from_millis(100),
            "elected {:?} after a {lease:?} lease began",
            started.elapsed()
        );
        assert!(
            next.term() > old_term,
            "term {} after {old_term}",
            next.term()
        );
        within(
            Duration::from_secs(5),
            "observe() showing the new leader",
            async {
                loop {
                    let seen = changes
                        .next()
                        .await
                        .expect("the stream ended")
                        .unwrap_or_else(|e| panic!("observe: {e}"));
                    match seen {
                        // Between the two leaderships nobody leads.
                        None => {}
                        Some(leader) if leader.term == next.term() => {
                            assert_eq!(leader.value, "waiting");
                            break;
                        }
                        Some(leader) => panic!("observe() yielded term {} in between", leader.term),
                    }
                }
            },
        )
        .await;
        next.resign().await.unwrap();
    })
    .await;
}

/// Promise 4: a waiting campaign dropped after 1 to 7 polls, with the leader resigning
/// before, during or after its wait, leaves nothing: another client campaigns and wins
/// promptly, and the record it finds then is its own, never the dropped campaign's.
pub async fn promise4_cancelled_campaign_leaves_nothing(target: &Target) {
    bounded("promise4_cancelled_campaign_leaves_nothing", async {
        let name = unique("election_cancel");
        let locks = client(target).await;
        let other = client(target).await;
        let election = locks.election(name.as_str()).unwrap();
        let check = other.election(name.as_str()).unwrap();
        let mut dropped_while_pending = 0;
        for round in 1..=16usize {
            let leader = within(PROMPTLY, "the blocking campaign", check.campaign("blocker"))
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            let (elected, pending) = drop_after_polls(
                round,
                election.campaign_with(
                    format!("dropped-{round}"),
                    AcquireOptions::new().wait(Duration::from_secs(10)),
                ),
                async {
                    leader.resign().await.expect("resign the blocker");
                },
            )
            .await;
            dropped_while_pending += usize::from(pending);
            if let Some(leadership) = elected {
                leadership.resign().await.unwrap();
            }
            let winner = check
                .campaign_with("check", AcquireOptions::new().wait(PROMPTLY))
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: a dropped campaign left its mutex held: {e}")
                });
            names(
                check.leader().await.unwrap(),
                &winner,
                &format!("round {round}: the winner"),
            );
            within(PROMPTLY, "resign", winner.resign()).await.unwrap();
        }
        assert!(
            dropped_while_pending >= 4,
            "only {dropped_while_pending} campaigns were dropped while pending"
        );
    })
    .await;
}

/// Promise 4: a publish whose reply is lost (it took effect) fails its campaign and leaves
/// nothing: the record is withdrawn and the mutex released in the background, so another
/// client is elected promptly and finds its own record. A resign whose withdrawal fails
/// still releases the mutex, and the record left behind is not reported as a leader.
pub async fn promise4_lost_publish_reply_leaves_nothing(target: &Target) {
    bounded("promise4_lost_publish_reply_leaves_nothing", async {
        let name = unique("election_lost_publish");
        let (locks, faulty) = faulty_client(target, ConnectOptions::new()).await;
        let election = locks.election(name.as_str()).unwrap();
        let other = client(target).await.election(name.as_str()).unwrap();
        if election.is_native() {
            // Nothing is published apart: the candidate's place in line is what a lost reply
            // must not leave behind.
            return lost_candidate_reply_leaves_nothing(&election, &other, &faulty).await;
        }
        faulty.set_times(Method::Publish, Fault::LoseReply(Duration::ZERO), 1);
        let err = within(PROMPTLY, "campaign", election.campaign("lost-reply"))
            .await
            .unwrap_err();
        assert!(err.is_backend(), "a lost publish reply: {err}");
        assert_eq!(faulty.faulted(Method::Publish), 1, "the fault did not run");
        // The publish took effect on the server; the failed campaign withdraws it in the
        // background, so no record of it stays.
        let raw = target
            .open()
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", target.label()));
        let key = crate::LockName::new(name.as_str()).unwrap();
        within(PROMPTLY, "the failed campaign's withdrawal", async {
            while raw.read_published(&key).await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let winner = other
            .campaign_with("winner", AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("the failed campaign left its mutex held: {e}"));
        names(other.leader().await.unwrap(), &winner, "the winner");
        within(PROMPTLY, "resign", winner.resign()).await.unwrap();
        assert!(
            other.leader().await.unwrap().is_none(),
            "a leader is named after the only one resigned"
        );
        faulty.set_times(Method::Withdraw, Fault::Fail(Duration::ZERO), 1);
        let leadership = within(PROMPTLY, "campaign", election.campaign("no-withdraw"))
            .await
            .unwrap();
        let err = within(PROMPTLY, "resign", leadership.resign())
            .await
            .unwrap_err();
        assert!(err.is_backend(), "a failed withdrawal: {err}");
        assert!(
            other.leader().await.unwrap().is_none(),
            "a resigned leader whose withdrawal failed is still named"
        );
        let next = other
            .campaign_with("next", AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("the resign left its mutex held: {e}"));
        names(other.leader().await.unwrap(), &next, "the next leader");
        next.resign().await.unwrap();
    })
    .await;
}

/// In the backend's own layout: a campaign whose first attempt's reply is lost (the
/// candidate's node or key was made, and may have been granted) leaves nothing in line: the
/// campaign fails or leads, and after it another client is elected promptly and named.
async fn lost_candidate_reply_leaves_nothing(
    election: &crate::Election,
    other: &crate::Election,
    faulty: &crate::fault::FaultyBackend,
) {
    // The attempt makes the node or key (a subscription makes none).
    for method in [Method::TryAcquire] {
        faulty.set_times(method, Fault::LoseReply(Duration::ZERO), 1);
        let result = within(
            PROMPTLY,
            "campaign",
            election.campaign_with("lost-reply", AcquireOptions::new().wait(PROMPTLY)),
        )
        .await;
        assert_eq!(faulty.faulted(method), 1, "the fault did not run");
        if let Ok(leadership) = result {
            leadership.resign().await.unwrap();
        }
        let winner = other
            .campaign_with("winner", AcquireOptions::new().wait(PROMPTLY))
            .await
            .unwrap_or_else(|e| panic!("{method:?}: the lost reply left a candidate in line: {e}"));
        names(other.leader().await.unwrap(), &winner, "the winner");
        within(PROMPTLY, "resign", winner.resign()).await.unwrap();
        assert!(
            other.leader().await.unwrap().is_none(),
            "{method:?}: a leader is named after the only one resigned"
        );
    }
}

/// The backend's published records, asked directly: a record of a smaller term is refused
/// and the stored one returned (terms compared exactly, across digit counts and beyond 2^53);
/// a withdrawal takes only its own term; a withdrawn record reads as none and still refuses
/// smaller terms; records of two keys are apart, and apart from a lock of the same name.
pub async fn published_records_keep_the_largest_term(target: &Target) {
    use crate::backend::Published;
    bounded("published_records_keep_the_largest_term", async {
        let backend = target
            .open()
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", target.label()));
        let key = crate::LockName::new(unique("published")).unwrap();
        let other = crate::LockName::new(format!("{key}/other")).unwrap();
        let record = |term: u64, value: &str| Published::new(term, value, "client:1");
        let publish = |term: u64, value: &'static str| {
            let (backend, key) = (backend.clone(), key.clone());
            async move { backend.publish(&key, &record(term, value)).await.unwrap() }
        };
        assert_eq!(backend.read_published(&key).await.unwrap(), None);
        assert_eq!(publish(9, "nine").await, record(9, "nine"));
        assert_eq!(publish(10, "ten").await, record(10, "ten"), "10 after 9");
        assert_eq!(publish(9, "late").await, record(10, "ten"), "9 after 10");
        let big = (1u64 << 53) + 1;
        assert_eq!(publish(big, "").await, record(big, ""), "an empty value");
        assert_eq!(
            publish(big - 1, "x").await,
            record(big, ""),
            "2^53 after 2^53 + 1"
        );
        assert_eq!(
            backend.read_published(&key).await.unwrap(),
            Some(record(big, ""))
        );
        assert_eq!(backend.read_published(&other).await.unwrap(), None);
        assert!(
            !backend.is_locked(&key).await.unwrap(),
            "a record is a lock"
        );
        assert!(
            !backend.withdraw(&key, 10).await.unwrap(),
            "withdrew another term"
        );
        assert!(
            backend.withdraw(&key, big).await.unwrap(),
            "did not withdraw its term"
        );
        assert!(
            !backend.withdraw(&key, big).await.unwrap(),
            "withdrew twice"
        );
        assert_eq!(backend.read_published(&key).await.unwrap(), None);
        let refused = publish(big - 1, "stale").await;
        assert!(
            refused.is_withdrawn() && refused.term == big,
            "a smaller term after a withdrawal: {refused:?}"
        );
        assert_eq!(backend.read_published(&key).await.unwrap(), None);
        assert_eq!(publish(big + 1, "next").await, record(big + 1, "next"));
        assert_eq!(
            backend.read_published(&key).await.unwrap(),
            Some(record(big + 1, "next"))
        );
    })
    .await;
}

/// Bad input is refused with a typed error: a value over [`Published::MAX_VALUE`](crate::backend::Published::MAX_VALUE) bytes, a
/// name too long for its mutex's suffix, a zero observe interval. A value of exactly the
/// limit, with newlines and non-ASCII text, comes back intact; after a resign nobody leads.
pub async fn election_refuses_bad_input(target: &Target) {
    bounded("election_refuses_bad_input", async {
        let name = unique("election_input");
        let locks = client(target).await;
        let election = locks.election(name.as_str()).unwrap();
        let err = election
            .campaign("x".repeat(MAX_PUBLISHED_VALUE + 1))
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "an oversized value: {err}");
        assert!(
            !locks.is_locked(election.lock_name()).await.unwrap(),
            "a refused campaign took the mutex"
        );
        // Also where the election is the lock of its own name: a name is valid on every
        // backend or on none.
        let err = locks
            .election("n".repeat(crate::name::MAX_NAME_BYTES))
            .unwrap_err();
        assert!(
            err.is_invalid_input(),
            "a name without room for #leader: {err}"
        );
        let err = election.clone().observe_every(Duration::ZERO).unwrap_err();
        assert!(err.is_invalid_input(), "a zero observe interval: {err}");
        let mut value = "line one\nzwei – ünïcode\n".to_string();
        value.push_str(&"v".repeat(MAX_PUBLISHED_VALUE - value.len()));
        let leadership = within(PROMPTLY, "campaign", election.campaign(value.as_str()))
            .await
            .unwrap();
        let leader = election.leader().await.unwrap();
        names(leader, &leadership, "a value of the largest size");
        leadership.resign().await.unwrap();
        assert!(
            election.leader().await.unwrap().is_none(),
            "a leader is named after the resign"
        );
    })
    .await;
}

/// Publishes race: 12 tasks over 3 backends (clients) publish terms 1 to 12 in a shuffled order
/// at once, on one key. Every answer has a term at least the one sent (a publish never reports
/// an older record as standing), and the record left is term 12's: the backend's
/// compare-and-store is atomic, not a read then a write.
pub async fn published_records_race_to_the_largest_term(target: &Target) {
    use crate::backend::Published;
    bounded("published_records_race_to_the_largest_term", async {
        let key = crate::LockName::new(unique("published_race")).unwrap();
        let mut backends = Vec::new();
        for _ in 0..3 {
            backends.push(
                target
                    .open()
                    .await
                    .unwrap_or_else(|e| panic!("open {}: {e}", target.label())),
            );
        }
        let mut terms: Vec<u64> = (1..=12).collect();
        fastrand::shuffle(&mut terms);
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(terms.len()));
        let mut tasks = Vec::new();
        for (index, term) in terms.into_iter().enumerate() {
            let (backend, key, start) = (backends[index % 3].clone(), key.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let record = Published::new(term, format!("term {term}"), "client:1");
                let stored = backend
                    .publish(&key, &record)
                    .await
                    .unwrap_or_else(|e| panic!("publish {term}: {e}"));
                assert!(
                    stored.term >= term,
                    "publishing {term} answered the older {}",
                    stored.term
                );
            }));
        }
        for task in tasks {
            task.await
                .unwrap_or_else(|e| panic!("a publishing task failed: {e}"));
        }
        let left = backends[0].read_published(&key).await.unwrap();
        assert_eq!(
            left.map(|record| (record.term, record.value)),
            Some((12, "term 12".to_string())),
            "a smaller term overwrote a larger one"
        );
    })
    .await;
}
