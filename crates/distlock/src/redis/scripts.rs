//! The Lua scripts of the Redis lock (the `.lua` files beside this module), put together
//! once per backend.

use redis::Script;

/// KEYS: lock, fence. ARGV: owner, lease ms.
/// Returns {1, token, holds} when granted, {0, pttl} when held by another owner.
const ACQUIRE: &str = include_str!("lua/acquire.lua");

/// Lua: the two ways an acquire succeeds, shared by the acquire scripts. `grant` makes a new
/// grant with the next fencing token; `reenter` adds a hold to the owner's grant and never
/// shortens its lease. (A waiter that was handed the lock takes it by its waiter id, through
/// ENQUEUE, before it lets its owner ask: an owner asking would re-enter.)
///
/// The token is the larger of the counter plus one and the server's clock in microseconds.
/// The counter alone would go back after a failover that lost the last grants, or after a
/// restart of a server that keeps nothing on disk; with the clock, tokens keep growing across
/// both, as long as the new master's clock is not behind the old one's by more than the time
/// the failover took. (Lua numbers are doubles: exact up to 2^53, about 285 years of
/// microseconds.)
const GRANTING: &str = include_str!("lua/granting.lua");

/// Lua: the first waiter of a fair queue whose ticket is fresh, removing stale ones; nil when
/// none. And `pass_on`: gives a lock that was just freed to that waiter. Prefixed to the
/// scripts that need them (after GRANTING).
///
/// Queue members are waiter ids, `<owner>#<n>`: one owner may wait in several tasks. A
/// waiter's terms (`<lease ms> <refresh number>`) say how long a lease it wants and which of
/// its refreshes the server saw last. A waiter with a lease hands over at once: `pass_on`
/// grants it the lock, marks the grant `:handoff` = its id and `:seq` = that refresh number,
/// and announces `!<id> <token> <refresh number>`; the waiter holds the lock as soon as the
/// message arrives, without asking. A waiter without one (lease 0: too short to hand over
/// safely) is only named, and asks.
const LIVE_HEAD: &str = include_str!("lua/live_head.lua");

/// KEYS: lock, fence, channel, queue, seen, terms. ARGV: owner, stale ms.
/// Returns the holds left (0: freed and passed on), -1 when free, -2 when held by another.
/// A freed lock goes to the first queued waiter (fair mode), or is announced to anyone.
const RELEASE: &str = include_str!("lua/release.lua");

/// KEYS: lock, fence, queue, seen, terms. ARGV: owner, lease ms, stale ms.
/// As ACQUIRE, but a free lock goes only to an owner whose waiter is first in the queue (or
/// anyone when nobody waits): returns {0, -3} when it is reserved for another.
const ACQUIRE_FAIR: &str = include_str!("lua/acquire_fair.lua");

/// KEYS: queue, seen, ticket, terms, lock. ARGV: waiter id, lease ms (0: do not hand over),
/// refresh number. If the lock was handed to this waiter, answers that grant: {1, token,
/// refresh number}. Otherwise queues the waiter at the back unless it is queued, marks it seen
/// now, records its terms: {0}. Also the refresh.
///
/// Taking a handover changes nothing on the server: `:handoff` stays this waiter's id until the
/// lock is freed. Asked again (a retry after a lost reply), it answers the same grant; and a
/// waiter that goes away without having read the answer (cancelled, or its reply lost) still
/// gives the lock back through LEAVE, which only a waiter that did not take the lock sends.
const ENQUEUE: &str = include_str!("lua/enqueue.lua");

/// KEYS: lock, fence, channel, queue, seen, terms. ARGV: waiter id, stale ms. Leaves the
/// queue. A lock handed to this waiter, which did not take it (the waiter sends LEAVE only
/// then), is given back (one hold); a free lock is passed on to the next waiter.
const LEAVE: &str = include_str!("lua/leave.lua");

/// KEYS: lock. ARGV: owner, lease ms, token. Returns 1 when extended, -1 when free (or the
/// token is another grant's), -2 when held by another. A reader's lease is its own.
const EXTEND: &str = include_str!("lua/extend.lua");

/// KEYS: the locks. ARGV: lease ms, then an owner and a token per key. Returns 1 or 0 per
/// key: 1 when the owner still holds that grant (as the holder, or as a reader whose lease
/// had not ended).
const RENEW: &str = include_str!("lua/renew.lua");

/// Lua: the readers of a reader-writer lock, kept in the lock's hash beside the mutex's
/// fields. While readers hold, `:mode` is `r` and each reader has its holds under its owner,
/// its token under `:t:<owner>` and the end of its own lease (server milliseconds) under
/// `:e:<owner>`; the key lives until the last reader's lease ends. A writer holds the hash
/// as a mutex does, so a mutex of the same name is the same lock. `live_readers` drops the
/// readers whose lease ended (and the key with the last); `renew_one` renews a reader's or a
/// holder's grant by its token. Prefixed after GRANTING (and LIVE_HEAD where a script passes
/// a freed lock on).
const READERS: &str = include_str!("lua/readers.lua");

/// KEYS: lock, fence, writers. ARGV: owner, lease ms, `1` for a reader (`0`: a writer),
/// mark ms, recheck ms. Writer preference: a reader is turned away while any writer's mark
/// in the sorted set `writers` is fresh; a writer turned away that has a mark (it marked
/// itself with RW_MARK when it began to wait) moves it to `mark` ms from now, and anyone
/// turned away is told to try again within `recheck` ms, so a waiting writer's mark stays
/// fresh. A writer's grant takes its mark away. Replies as ACQUIRE.
const RW_ACQUIRE: &str = include_str!("lua/rw_acquire.lua");

/// KEYS: writers. ARGV: owner, mark ms. A writer that begins to wait marks itself until
/// `mark` ms from now (its waiter takes the mark away when it goes).
const RW_MARK: &str = include_str!("lua/rw_mark.lua");

/// KEYS: lock. ARGV: owner. A reader's holds: 0 once its own lease ended, even while other
/// readers keep the key.
const RW_HOLDS: &str = include_str!("lua/rw_holds.lua");

/// KEYS: lock, fence, channel, queue, seen, terms. ARGV: owner, stale ms. A reader's release:
/// the holds left, or -1 when the owner is no reader holding it (a reader's hold is its own);
/// the last reader's release frees the lock and passes it on as RELEASE does.
const RW_RELEASE: &str = include_str!("lua/rw_release.lua");

/// No KEYS. ARGV: lease ms, then lock key and owner pairs, all served by the node that runs
/// it. As RENEW, for a Cluster node: the keys are not declared because they span slots,
/// which Redis 7 allows with this flag for keys of the node's own slots (and refuses
/// otherwise, as after a slot moved).
const RENEW_ON_NODE: &str = include_str!("lua/renew_on_node.lua");

/// KEYS: lock, fence, channel, queue, seen, terms. ARGV: stale ms. Returns 1 when the lock
/// was held; the freed lock is passed on as by a release.
const FORCE_UNLOCK: &str = include_str!("lua/force_unlock.lua");

/// KEYS: the published record. ARGV: term, value, holder. Returns the record stored after it.
const PUBLISH: &str = include_str!("lua/publish.lua");

/// KEYS: the published record. ARGV: term. Returns 1 when it withdrew the record of that term.
const WITHDRAW: &str = include_str!("lua/withdraw.lua");

/// The scripts of one backend, with `publish` turned into `spublish` on a Cluster (which
/// announces releases on the lock's shard only).
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) acquire_fair: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) renew: Script,
    pub(super) force_unlock: Script,
    pub(super) enqueue: Script,
    pub(super) rw_acquire: Script,
    pub(super) rw_release: Script,
    pub(super) rw_mark: Script,
    pub(super) rw_holds: Script,
    /// RENEW_ON_NODE with its helpers, sent as the text of an EVAL.
    pub(super) renew_on_node: String,
    pub(super) leave: Script,
    pub(super) publish_record: Script,
    pub(super) withdraw_record: Script,
}

impl Scripts {
    pub(super) fn new(cluster: bool) -> Self {
        let publish = if cluster { "spublish" } else { "publish" };
        let script =
            |text: String| Script::new(&text.replace("'publish'", &format!("'{publish}'")));
        Scripts {
            acquire: script(format!("{GRANTING}{ACQUIRE}")),
            acquire_fair: script(format!("{GRANTING}{LIVE_HEAD}{ACQUIRE_FAIR}")),
            release: script(format!("{GRANTING}{LIVE_HEAD}{RELEASE}")),
            extend: script(format!("{READERS}{EXTEND}")),
            renew: script(format!("{READERS}{RENEW}")),
            rw_acquire: script(format!("{GRANTING}{READERS}{RW_ACQUIRE}")),
            rw_release: script(format!("{GRANTING}{LIVE_HEAD}{READERS}{RW_RELEASE}")),
            rw_mark: script(format!("{READERS}{RW_MARK}")),
            rw_holds: script(format!("{READERS}{RW_HOLDS}")),
            // The flags line comes first.
            renew_on_node: match RENEW_ON_NODE.split_once('\n') {
                Some((flags, body)) => format!("{flags}\n{READERS}{body}"),
                None => RENEW_ON_NODE.to_owned(),
            },
            force_unlock: script(format!("{GRANTING}{LIVE_HEAD}{FORCE_UNLOCK}")),
            enqueue: script(ENQUEUE.to_owned()),
            leave: script(format!("{GRANTING}{LIVE_HEAD}{LEAVE}")),
            publish_record: Script::new(PUBLISH),
            withdraw_record: Script::new(WITHDRAW),
        }
    }
}

/// KEYS: lock, fence. ARGV: owner, lease ms, floor (0: none), attempt id. As ACQUIRE, for one
/// master of a Redlock: without a floor a fresh grant takes its token as ACQUIRE does (the
/// counter and the clock); with one, the larger of the counter plus one and the floor, so that
/// the masters asked after the first agree on the first one's token. A grant or re-entry marks
/// the hash with the field `:a:<attempt id>`, so that REDLOCK_UNDO can take back exactly what
/// this attempt did.
const REDLOCK_ACQUIRE: &str = include_str!("lua/redlock_acquire.lua");

/// KEYS: lock, fence. ARGV: owner, token, reset (`1`: set the owner's holds to 1). While the
/// owner holds the lock here, raises the counter to the token (never lowers it), records the
/// token as the grant's and, with reset, drops holds left over from an earlier grant: 1; 0
/// when the owner does not hold it.
const REDLOCK_CONFIRM: &str = include_str!("lua/redlock_confirm.lua");

/// KEYS: lock, channel. ARGV: owner, attempt id. Takes back the hold that attempt added, if
/// it did (its mark is there), freeing and announcing the lock when it was the last: 1; else
/// 0. Idempotent, so it can be sent to a master whose answer was lost.
const REDLOCK_UNDO: &str = include_str!("lua/redlock_undo.lua");

/// The scripts a Redlock sends to each master besides the standalone lock's.
pub(super) struct RedlockScripts {
    pub(super) acquire: Script,
    pub(super) confirm: Script,
    pub(super) undo: Script,
}

impl RedlockScripts {
    pub(super) fn new() -> Self {
        RedlockScripts {
            acquire: Script::new(&format!("{GRANTING}{REDLOCK_ACQUIRE}")),
            confirm: Script::new(REDLOCK_CONFIRM),
            undo: Script::new(REDLOCK_UNDO),
        }
    }
}
