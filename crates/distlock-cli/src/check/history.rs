//! The history `distlock check` records, and the checks it runs on it offline (after
//! Jepsen's approach: record every operation with its times, then judge the whole history).
//!
//! Times are microseconds since the Unix epoch, read on one machine by every process.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

/// One event a worker logs, as one JSON line, the moment it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub enum Event {
    /// The worker is about to call `acquire`.
    Ask { w: u32, at: u64 },
    /// `acquire` returned a guard with this token (logged right after).
    Grant { w: u32, token: u64, at: u64 },
    /// This hold will outlast the lease (renewed meanwhile): the checker's partitions aim at
    /// such holds, so that the server may end the lease while the holder is inside.
    Long { w: u32, token: u64, at: u64 },
    /// The holder is about to read and write the register under its token.
    WriteBegin { w: u32, token: u64, at: u64 },
    /// The register answered the write: accepted or refused (fenced, or failed).
    Write {
        w: u32,
        token: u64,
        at: u64,
        ok: bool,
    },
    /// The holder stops using the lock (logged right before its release is sent);
    /// `lost_at` when its guard had reported the loss, and when it did.
    End {
        w: u32,
        token: u64,
        at: u64,
        lost_at: Option<u64>,
    },
}

/// How long after the server's grant a running worker logs it, at most: the margin by which a
/// cut before the logged grant may still have struck the grant's connection.
const GRANT_LOGGED_WITHIN_US: u64 = 100_000;

/// How many allowed overlaps the verdict lists (it counts them all).
const OVERLAPS_LISTED: usize = 20;

/// A fault the checker caused to one worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// SIGSTOP at `from`, SIGCONT at `to`.
    Pause { w: u32, from: u64, to: u64 },
    /// SIGKILL at `at`.
    Kill { w: u32, at: u64 },
    /// Every connection of the worker reset at `at`. `frees` when the backend's locks end
    /// with their connection (session locks): the server may then grant the lock to another
    /// before the holder's `lost()` fires, the documented limit that fencing covers.
    Cut { w: u32, at: u64, frees: bool },
    /// The worker's next request after `at` reached the server and its reply was lost (its
    /// connection cut as the reply began); `frees` as for [`Fault::Cut`].
    LostReply { w: u32, at: u64, frees: bool },
    /// Nothing passed between the worker and the server from `from` to `to` (longer than a
    /// lease). Excuses nothing: the holder's client must report the loss before its lease
    /// can end on the server.
    Partition { w: u32, from: u64, to: u64 },
}

impl Fault {
    fn worker(&self) -> u32 {
        match *self {
            Fault::Pause { w, .. }
            | Fault::Kill { w, .. }
            | Fault::Cut { w, .. }
            | Fault::LostReply { w, .. }
            | Fault::Partition { w, .. } => w,
        }
    }

    fn began(&self) -> u64 {
        match *self {
            Fault::Pause { from, .. } | Fault::Partition { from, .. } => from,
            Fault::Kill { at, .. } | Fault::Cut { at, .. } | Fault::LostReply { at, .. } => at,
        }
    }

    /// True when the fault may let a rival be granted before the holder learns of the loss:
    /// the holder could not act (paused, killed), or the server freed its lock with its
    /// connection.
    fn excuses_overlap(&self) -> bool {
        match *self {
            Fault::Pause { .. } | Fault::Kill { .. } => true,
            Fault::Cut { frees, .. } | Fault::LostReply { frees, .. } => frees,
            Fault::Partition { .. } => false,
        }
    }

    /// True when the fault struck holder `w` of a grant it asked for at `asked` and logged
    /// at `granted`, before `before`, and excuses an overlap. A pause or kill counts from the
    /// ask (a stopped worker may have been granted without logging it); a cut or a lost reply
    /// only from shortly before the logged grant (the connections of a worker still waiting
    /// hold nothing of this grant).
    fn excuses(&self, w: u32, asked: u64, granted: u64, before: u64) -> bool {
        let from = match self {
            Fault::Cut { .. } | Fault::LostReply { .. } => {
                granted.saturating_sub(GRANT_LOGGED_WITHIN_US).max(asked)
            }
            _ => asked,
        };
        let began = self.began();
        self.worker() == w && from <= began && began < before && self.excuses_overlap()
    }

    /// The fault's name in reports.
    /// Every [`kind`](Self::kind), named as `--faults` names them.
    pub const KINDS: [&'static str; 5] = ["pause", "kill", "cut", "lose-reply", "partition"];

    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pause { .. } => "pause",
            Fault::Kill { .. } => "kill",
            Fault::Cut { .. } => "cut",
            Fault::LostReply { .. } => "lose-reply",
            Fault::Partition { .. } => "partition",
        }
    }
}

/// One grant, put together from its events.
#[derive(Debug, Clone, Copy)]
struct Hold {
    w: u32,
    token: u64,
    /// When its worker called `acquire`: the server granted it between this and `from`.
    asked: u64,
    from: u64,
    /// When the holder stopped using it; `None` when its worker was killed before.
    to: Option<u64>,
    /// When its guard reported the loss, if it did.
    lost_at: Option<u64>,
}

/// What the checks found.
#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    pub acquisitions: u64,
    /// Grants whose guard reported the loss (`lost()`) while the holder still used them.
    pub losses_reported: u64,
    pub writes_accepted: u64,
    /// Writes by holders whose lease had ended, refused by their fencing token.
    pub stale_writes_refused: u64,
    /// Writes whose answer never came (the worker was killed): they may have landed.
    pub writes_unknown: u64,
    /// Two grants overlapping in time where the earlier holder had been paused, killed or had
    /// reported the loss: what fencing is for.
    pub overlaps_excused: u64,
    /// Two grants overlapping in time with nothing on the client side that explains it: no
    /// fault of the checker's on the earlier holder and no `lost()` before the other grant
    /// (a double grant by the servers). A violation unless the backend's documented limits
    /// allow it ([`check`]'s `overlaps_allowed`); then listed in `overlaps`.
    pub overlaps_unexcused: u64,
    /// Of those, the ones where the earlier holder's write was refused by the register.
    pub overlaps_unexcused_fenced: u64,
    /// The first unexcused overlaps, when the backend's documented limits allow them.
    pub overlaps: Vec<String>,
    pub register: u64,
    /// Violations of the promises that fencing cannot cover: a token granted twice or going
    /// back, an older token accepted after a newer one, an update lost or made twice.
    pub unfenced_violations: u64,
    pub violations: Vec<String>,
}

/// Judges a history: `events` from every worker, `faults` the checker caused, `register` the
/// register's final value. `overlaps_allowed` when the backend's documented limits allow two
/// holders at once (asynchronous replication): an overlap that nothing on the client side
/// explains is then reported, not a violation, and fencing must keep the register right.
pub fn check(events: &[Event], faults: &[Fault], register: u64, overlaps_allowed: bool) -> Verdict {
    let mut verdict = Verdict {
        register,
        ..Verdict::default()
    };
    // Whether each grant's write was accepted (absent: no answer, or no write).
    let written: HashMap<(u32, u64), bool> = events
        .iter()
        .filter_map(|event| match *event {
            Event::Write { w, token, ok, .. } => Some(((w, token), ok)),
            _ => None,
        })
        .collect();
    let holds = holds(events, faults);
    verdict.acquisitions = holds.len() as u64;
    verdict.losses_reported = holds.iter().filter(|h| h.lost_at.is_some()).count() as u64;

    // Promise 3: no token twice, and a grant that began after another ended has a larger one.
    let mut seen: HashMap<u64, u32> = HashMap::new();
    for hold in &holds {
        if let Some(other) = seen.insert(hold.token, hold.w) {
            verdict.violations.push(format!(
                "token {} was granted twice (workers {other} and {})",
                hold.token, hold.w
            ));
        }
    }
    let mut by_end: Vec<&Hold> = holds.iter().filter(|h| h.to.is_some()).collect();
    by_end.sort_by_key(|h| h.to);
    let mut by_start: Vec<&Hold> = holds.iter().collect();
    by_start.sort_by_key(|h| h.from);
    // The largest token of the holds ended before each acquire began, by a sweep.
    let mut by_ask: Vec<&Hold> = holds.iter().collect();
    by_ask.sort_by_key(|h| h.asked);
    let mut ended = by_end.iter().peekable();
    let mut largest_ended: Option<&Hold> = None;
    for hold in &by_ask {
        while let Some(done) = ended.next_if(|d| d.to.is_some_and(|to| to < hold.asked)) {
            if largest_ended.is_none_or(|l| done.token > l.token) {
                largest_ended = Some(done);
            }
        }
        if let Some(earlier) = largest_ended
            && earlier.token >= hold.token
        {
            verdict.violations.push(format!(
                "worker {} asked at {} and was granted token {}, after worker {}'s grant with token {} had ended",
                hold.w, hold.asked, hold.token, earlier.w, earlier.token
            ));
        }
    }

    let token_violations = verdict.violations.len();

    // Promises 1 and 2: two holds overlap only when the earlier grant's holder (the smaller
    // token: it may have logged its grant late, stopped right after the server granted it)
    // had been told of the loss, or had been stopped or killed, before the other was granted.
    for (i, a) in by_start.iter().enumerate() {
        let a_to = a.to.unwrap_or(u64::MAX);
        for b in by_start[i + 1..].iter().take_while(|b| b.from < a_to) {
            let (earlier, later) = if a.token < b.token { (a, b) } else { (b, a) };
            let told = earlier.lost_at.is_some_and(|at| at < later.from);
            let struck = faults
                .iter()
                .any(|f| f.excuses(earlier.w, earlier.asked, earlier.from, later.from));
            if told || struck {
                verdict.overlaps_excused += 1;
                continue;
            }
            verdict.overlaps_unexcused += 1;
            if written.get(&(earlier.w, earlier.token)) == Some(&false) {
                verdict.overlaps_unexcused_fenced += 1;
            }
            let overlap = format!(
                "worker {} (token {}) held the lock from {} to {} and worker {} (token {}) from {}, with no fault that excuses it (a pause, a kill, a cut of a lock that ends with its connection) and no lost() on token {} before the other grant",
                a.w, a.token, a.from, a_to, b.w, b.token, b.from, earlier.token
            );
            if overlaps_allowed {
                if verdict.overlaps.len() < OVERLAPS_LISTED {
                    verdict.overlaps.push(overlap);
                }
            } else {
                verdict.violations.push(overlap);
            }
        }
    }
    let overlap_violations = verdict.violations.len();

    // Fencing: once the register accepted a token, it never accepts an older one afterwards.
    let mut begins: HashMap<(u32, u64), u64> = HashMap::new();
    let mut answered: HashSet<(u32, u64)> = HashSet::new();
    let mut accepted: Vec<(u64, u64, u64)> = Vec::new(); // (begin, answer, token)
    for event in events {
        match *event {
            Event::WriteBegin { w, token, at } => {
                begins.insert((w, token), at);
            }
            Event::Write { w, token, at, ok } => {
                answered.insert((w, token));
                if ok {
                    verdict.writes_accepted += 1;
                    accepted.push((begins.get(&(w, token)).copied().unwrap_or(at), at, token));
                } else {
                    verdict.stale_writes_refused += 1;
                }
            }
            _ => {}
        }
    }
    verdict.writes_unknown = begins.keys().filter(|k| !answered.contains(k)).count() as u64;
    accepted.sort_by_key(|&(_, answer, _)| answer);
    let mut newest: Option<(u64, u64)> = None; // (answer, token)
    for &(begin, answer, token) in &accepted {
        if let Some((newest_answer, newest_token)) = newest
            && newest_answer < begin
            && token < newest_token
        {
            verdict.violations.push(format!(
                "the register accepted token {token} (a write begun at {begin}) after it had accepted token {newest_token}"
            ));
        }
        if newest.is_none_or(|(_, t)| token > t) {
            newest = Some((answer, token));
        }
    }

    // No lost update: every accepted write added one.
    let low = verdict.writes_accepted;
    let high = low + verdict.writes_unknown;
    if register < low || register > high {
        verdict.violations.push(format!(
            "the register holds {register} but {low} writes were accepted (and {} may have landed): an update was lost or made twice",
            verdict.writes_unknown
        ));
    }
    // The token checks come before the overlaps, the register's after.
    verdict.unfenced_violations =
        (verdict.violations.len() - overlap_violations + token_violations) as u64;
    verdict
}

/// Puts every grant's events together, in each worker's order; a grant of a killed worker
/// without an end ended, as far as its writes go, at the kill.
fn holds(events: &[Event], faults: &[Fault]) -> Vec<Hold> {
    let mut holds: Vec<Hold> = Vec::new();
    // Per worker: when it last asked, and its open hold.
    let mut asked: HashMap<u32, u64> = HashMap::new();
    let mut open: HashMap<u32, usize> = HashMap::new();
    for event in events {
        match *event {
            Event::Ask { w, at } => {
                asked.insert(w, at);
            }
            Event::Grant { w, token, at } => {
                open.insert(w, holds.len());
                holds.push(Hold {
                    w,
                    token,
                    asked: asked.get(&w).copied().unwrap_or(at),
                    from: at,
                    to: None,
                    lost_at: None,
                });
            }
            Event::End {
                w,
                token,
                at,
                lost_at,
            } => {
                if let Some(i) = open.remove(&w)
                    && holds[i].token == token
                {
                    holds[i].to = Some(at);
                    holds[i].lost_at = lost_at;
                }
            }
            _ => {}
        }
    }
    // Worker ids are never reused, so a worker is killed at most once; its grant may have
    // been logged between the moment the kill was noted and the signal.
    for hold in holds.iter_mut().filter(|h| h.to.is_none()) {
        hold.to = faults.iter().find_map(|f| match *f {
            Fault::Kill { w, at } if w == hold.w => Some(at.max(hold.from)),
            _ => None,
        });
    }
    holds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(w: u32, token: u64, from: u64, to: u64, ok: bool) -> Vec<Event> {
        vec![
            Event::Ask { w, at: from - 1 },
            Event::Grant { w, token, at: from },
            Event::WriteBegin {
                w,
                token,
                at: from + 1,
            },
            Event::Write {
                w,
                token,
                at: from + 2,
                ok,
            },
            Event::End {
                w,
                token,
                at: to,
                lost_at: None,
            },
        ]
    }

    #[test]
    fn a_clean_history_passes() {
        let mut events = round(1, 10, 100, 110, true);
        events.extend(round(2, 11, 120, 130, true));
        let verdict = check(&events, &[], 2, false);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!(verdict.acquisitions, 2);
    }

    #[test]
    fn an_unexcused_overlap_is_a_violation_and_a_paused_one_is_not() {
        let mut events = round(1, 10, 100, 150, true);
        events.extend(round(2, 11, 120, 130, true));
        assert_eq!(check(&events, &[], 2, false).violations.len(), 1);
        let pause = Fault::Pause {
            w: 1,
            from: 105,
            to: 140,
        };
        let verdict = check(&events, &[pause], 2, false);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!(verdict.overlaps_excused, 1);
    }

    #[test]
    fn a_network_fault_excuses_an_overlap_only_where_the_server_frees_the_lock() {
        let mut events = round(1, 10, 100, 150, true);
        events.extend(round(2, 11, 120, 130, true));
        for (fault, excused) in [
            (
                Fault::Cut {
                    w: 1,
                    at: 105,
                    frees: true,
                },
                true,
            ),
            (
                Fault::LostReply {
                    w: 1,
                    at: 105,
                    frees: true,
                },
                true,
            ),
            (
                Fault::Cut {
                    w: 1,
                    at: 105,
                    frees: false,
                },
                false,
            ),
            (
                Fault::LostReply {
                    w: 1,
                    at: 105,
                    frees: false,
                },
                false,
            ),
            (
                Fault::Partition {
                    w: 1,
                    from: 105,
                    to: 140,
                },
                false,
            ),
        ] {
            let verdict = check(&events, &[fault], 2, false);
            assert_eq!(verdict.violations.is_empty(), excused, "{fault:?}");
            assert_eq!(verdict.overlaps_excused, u64::from(excused), "{fault:?}");
        }
    }

    #[test]
    fn a_cut_while_the_holder_was_still_waiting_excuses_nothing() {
        // Worker 1 asked at 0 and was granted at 2 s; its connections were cut at 1 s,
        // while it waited: that cut cannot have freed this grant.
        let mut events = round(1, 10, 2_000_000, 2_500_000, true);
        events[0] = Event::Ask { w: 1, at: 0 };
        events.extend(round(2, 11, 2_100_000, 2_200_000, true));
        let cut = Fault::Cut {
            w: 1,
            at: 1_000_000,
            frees: true,
        };
        assert_eq!(check(&events, &[cut], 2, false).violations.len(), 1);
        let pause = Fault::Pause {
            w: 1,
            from: 1_000_000,
            to: 1_500_000,
        };
        assert!(check(&events, &[pause], 2, false).violations.is_empty());
    }

    #[test]
    fn a_grant_logged_late_by_a_paused_holder_is_excused_by_its_smaller_token() {
        // Worker 1 was granted token 10, then stopped before it logged the grant; worker 2
        // got token 11 meanwhile. Worker 1's write was refused.
        let mut events = round(2, 11, 120, 130, true);
        events.extend(round(1, 10, 125, 140, false));
        if let Some(Event::Ask { at, .. }) = events
            .iter_mut()
            .find(|e| matches!(e, Event::Ask { w: 1, .. }))
        {
            *at = 100;
        }
        assert_eq!(check(&events, &[], 1, false).violations.len(), 1);
        let pause = Fault::Pause {
            w: 1,
            from: 101,
            to: 119,
        };
        let verdict = check(&events, &[pause], 1, false);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_fault_or_a_loss_after_the_other_grant_excuses_nothing() {
        let mut events = round(1, 10, 100, 150, true);
        events.extend(round(2, 11, 120, 130, true));
        let late_pause = Fault::Pause {
            w: 1,
            from: 125,
            to: 140,
        };
        assert_eq!(check(&events, &[late_pause], 2, false).violations.len(), 1);
        let late_kill = Fault::Kill { w: 1, at: 125 };
        assert_eq!(check(&events, &[late_kill], 2, false).violations.len(), 1);
        if let Some(Event::End { lost_at, .. }) = events
            .iter_mut()
            .find(|e| matches!(e, Event::End { w: 1, .. }))
        {
            *lost_at = Some(125);
        }
        assert_eq!(check(&events, &[], 2, false).violations.len(), 1);
        if let Some(Event::End { lost_at, .. }) = events
            .iter_mut()
            .find(|e| matches!(e, Event::End { w: 1, .. }))
        {
            *lost_at = Some(115);
        }
        assert!(check(&events, &[], 2, false).violations.is_empty());
    }

    #[test]
    fn an_allowed_overlap_is_reported_and_only_unfenced_violations_count() {
        // Two holders at once (a double grant by the servers): the earlier's write was
        // refused by the register.
        let mut events = round(1, 10, 100, 150, false);
        events.extend(round(2, 11, 120, 130, true));
        let strict = check(&events, &[], 1, false);
        assert_eq!(strict.violations.len(), 1, "{:?}", strict.violations);
        assert_eq!(strict.unfenced_violations, 0);
        let allowed = check(&events, &[], 1, true);
        assert!(allowed.violations.is_empty(), "{:?}", allowed.violations);
        assert_eq!(
            (
                allowed.overlaps_unexcused,
                allowed.overlaps_unexcused_fenced,
                allowed.overlaps.len()
            ),
            (1, 1, 1)
        );
        // Without fencing both writes land on the same value: one update is lost.
        let mut events = round(1, 10, 100, 150, true);
        events.extend(round(2, 11, 120, 130, true));
        let lost = check(&events, &[], 1, true);
        assert_eq!(lost.unfenced_violations, 1, "{:?}", lost.violations);
        assert_eq!(lost.overlaps_unexcused_fenced, 0);
        assert!(lost.violations[0].contains("lost"), "{:?}", lost.violations);
    }

    #[test]
    fn a_token_granted_twice_to_one_worker_is_a_violation() {
        let mut events = round(1, 10, 100, 110, true);
        events.extend(round(1, 10, 120, 130, true));
        assert!(
            check(&events, &[], 2, false)
                .violations
                .iter()
                .any(|v| v.contains("granted twice"))
        );
    }

    #[test]
    fn a_token_that_goes_back_is_a_violation() {
        let mut events = round(1, 10, 100, 110, true);
        events.extend(round(2, 9, 120, 130, true));
        assert!(!check(&events, &[], 2, false).violations.is_empty());
    }

    #[test]
    fn a_lost_update_is_a_violation() {
        let mut events = round(1, 10, 100, 110, true);
        events.extend(round(2, 11, 120, 130, true));
        assert!(!check(&events, &[], 1, false).violations.is_empty());
    }

    #[test]
    fn an_older_token_accepted_after_a_newer_one_is_a_violation() {
        let mut events = round(2, 11, 100, 110, true);
        events.extend(round(1, 10, 120, 130, true));
        let verdict = check(&events, &[], 2, false);
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| v.contains("accepted token 10")),
            "{:?}",
            verdict.violations
        );
    }
}
