//! Redlock with a fault *during* an acquisition that touches several masters: a master that
//! does not answer, a reply lost after the script ran, holds left on a minority. Each test
//! runs on masters of its own behind fault proxies.

use std::time::Duration;

use distlock::AcquireOptions;
use tokio::time::timeout;

use crate::common::redlock::{OwnMasters, ProxiedMasters, lock_key, name_with_gate};

/// Asserts that no master has the lock.
fn assert_free_everywhere(masters: &ProxiedMasters, name: &str) {
    for i in 0..3 {
        assert_eq!(
            masters.cli(i, &["exists", &lock_key(name)]),
            "0",
            "master {i}"
        );
    }
}

/// A re-entry that may not wait, under a timeout.
async fn reenter_once(me: &distlock::Holder, name: &str) -> distlock::Result<distlock::Guard> {
    timeout(
        Duration::from_secs(5),
        me.mutex(name)
            .unwrap()
            .acquire_with(AcquireOptions::new().wait(Duration::ZERO)),
    )
    .await
    .expect("the re-entry ends")
}

/// Heals proxy `i` and waits until the client's connection through it is back: a failed
/// attempt's give-back retries the masters it did not reach, and the first request that
/// passes after the heal shows the reconnection. Without it a request right after the heal
/// could find that master still reconnecting and count it as not answering.
async fn heal_and_reconnect(masters: &ProxiedMasters, i: usize) {
    let before = masters.proxies[i].requests();
    masters.proxies[i].heal();
    let start = std::time::Instant::now();
    while masters.proxies[i].requests() == before {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "nothing reached master {i} within 5 s of the heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its reply on its way.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The owner's holds on the lock's master `i` ("" when none).
fn holds(masters: &ProxiedMasters, i: usize, name: &str, owner: &str) -> String {
    masters.cli(i, &["hget", &lock_key(name), owner])
}

/// Promises 1, 2 and 3: a holder re-enters while the two masters that carry its grant do not
/// answer (the third had lost the grant). The re-entry is not granted, and the give-back takes
/// back only what the re-entry took: the holder still holds the lock on those two masters, a
/// rival is refused, and once they answer the re-entry is granted with the grant's own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_reentry_that_fails_leaves_the_holders_grant_alone() {
    let own = OwnMasters::start();
    let masters = ProxiedMasters::start(&own).await;
    let locks = distlock::connect(&masters.url("?request_timeout=200ms"))
        .await
        .unwrap();
    let name = name_with_gate("reentry", 0);
    let me = locks.holder();
    let owner = me.owner().as_str().to_owned();
    let first = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    // Master 0, the gate, loses the grant (a restart, an operator).
    masters.cli(0, &["del", &lock_key(&name)]);
    masters.proxies[1].partition();
    masters.proxies[2].partition();
    let again = reenter_once(&me, &name).await;
    assert!(again.is_err(), "re-entered with one master of three");
    heal_and_reconnect(&masters, 1).await;
    heal_and_reconnect(&masters, 2).await;
    assert_eq!(
        holds(&masters, 0, &name, &owner),
        "",
        "the gate kept the failed re-entry"
    );
    assert_eq!(
        holds(&masters, 1, &name, &owner),
        "1",
        "master 1 lost the holder's grant"
    );
    assert_eq!(
        holds(&masters, 2, &name, &owner),
        "1",
        "master 2 lost the holder's grant"
    );
    let rival = distlock::connect(&masters.url("")).await.unwrap();
    let taken = rival.mutex(&name).unwrap().try_acquire().await.unwrap();
    assert!(
        taken.is_none(),
        "a rival was granted a lock the holder holds"
    );
    assert!(first.is_held().await.unwrap());

    // With every master answering, the re-entry is granted and keeps the grant's token; the
    // gate, granting afresh, is given that token too.
    let again = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert_eq!(again.fencing_token(), first.fencing_token());
    let token = first.fencing_token().to_string();
    assert_eq!(masters.cli(0, &["hget", &lock_key(&name), ":token"]), token);
    again.release().await.unwrap();
    first.release().await.unwrap();
    assert_free_everywhere(&masters, &name);
}

/// Promise 4: a re-entry whose reply is lost on one master (its script ran there) while
/// another master does not answer is given back exactly: every master is left with the one
/// hold it had, and the holder's release frees the lock everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise4_a_reentry_with_a_lost_reply_is_given_back_exactly() {
    let own = OwnMasters::start();
    let masters = ProxiedMasters::start(&own).await;
    let locks = distlock::connect(&masters.url("?request_timeout=200ms"))
        .await
        .unwrap();
    let name = name_with_gate("lost-reentry", 0);
    let me = locks.holder();
    let owner = me.owner().as_str().to_owned();
    let first = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    masters.proxies[1].lose_next_reply();
    masters.proxies[2].partition();
    let again = reenter_once(&me, &name).await;
    assert!(again.is_err(), "re-entered without a majority's answer");
    assert_eq!(masters.proxies[1].replies_lost(), 1, "no reply was lost");
    heal_and_reconnect(&masters, 2).await;
    // The give-back of master 1 may be retried in the background: give it time.
    let start = std::time::Instant::now();
    while holds(&masters, 1, &name, &owner) != "1" {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "master 1 keeps {} holds",
            holds(&masters, 1, &name, &owner)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..3 {
        assert_eq!(holds(&masters, i, &name, &owner), "1", "master {i}");
    }
    first.release().await.unwrap();
    assert_free_everywhere(&masters, &name);
}

/// Promise 4: holds left on a minority by an earlier grant (a release that did not reach that
/// master) do not turn the owner's next acquisition into a re-entry of them: a majority
/// grants afresh, the leftover is reset to the new grant, and the token is new and larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise3_a_leftover_hold_on_a_minority_is_reset_by_a_fresh_grant() {
    let own = OwnMasters::start();
    let masters = ProxiedMasters::start(&own).await;
    let locks = distlock::connect(&masters.url("")).await.unwrap();
    let name = name_with_gate("leftover", 0);
    let me = locks.holder();
    let owner = me.owner().as_str().to_owned();
    let first = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let old = first.fencing_token();
    // Master 2 does not hear the release.
    masters.proxies[2].partition();
    first.release().await.unwrap();
    masters.proxies[2].heal();
    assert_eq!(
        holds(&masters, 2, &name, &owner),
        "1",
        "the leftover is not there"
    );
    let second = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(
        second.fencing_token() > old,
        "token {} after {old}",
        second.fencing_token()
    );
    for i in 0..3 {
        assert_eq!(holds(&masters, i, &name, &owner), "1", "master {i}");
    }
    second.release().await.unwrap();
    assert_free_everywhere(&masters, &name);
}

/// Promises 1, 2 and 6: a re-entry whose replies are lost on the two masters besides the gate,
/// which then stay unreachable for 1.3 s, is given back once, by its own id. Before, the
/// client also settled the failed attempt with a plain release once the masters answered,
/// and the give-back retried in the background took a second hold: the holder's holds went
/// from 1 to 0 on every master, a rival was granted the lock, and the holder's guard was not
/// told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise6_a_failed_reentry_is_given_back_once() {
    let own = OwnMasters::start();
    let masters = ProxiedMasters::start(&own).await;
    // The give-back retries a master once per request timeout: a second apart, it comes
    // after the masters are healed (1.3 s) and the client has asked them again.
    let locks = distlock::connect(&masters.url("?request_timeout=1s"))
        .await
        .unwrap();
    let name = name_with_gate("given-back-once", 0);
    let me = locks.holder();
    let owner = me.owner().as_str().to_owned();
    let first = me.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    masters.proxies[1].lose_next_reply_then_partition();
    masters.proxies[2].lose_next_reply_then_partition();
    let healing = async {
        let start = std::time::Instant::now();
        while masters.proxies[1].replies_lost() + masters.proxies[2].replies_lost() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the re-entry's replies were not lost"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(1300)).await;
        masters.proxies[1].heal();
        masters.proxies[2].heal();
    };
    let (again, ()) = tokio::join!(reenter_once(&me, &name), healing);
    assert!(again.is_err(), "re-entered with the gate's answer alone");
    // The background give-back reaches masters 1 and 2 within a few of its retries.
    let start = std::time::Instant::now();
    while (1..3).any(|i| holds(&masters, i, &name, &owner) != "1") {
        let now: Vec<String> = (0..3).map(|i| holds(&masters, i, &name, &owner)).collect();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the holder's holds on the masters: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past a few more retries of the give-back: nothing takes a second hold.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for i in 0..3 {
        assert_eq!(holds(&masters, i, &name, &owner), "1", "master {i}");
    }
    let rival = distlock::connect(&masters.url("")).await.unwrap();
    let taken = rival.mutex(&name).unwrap().try_acquire().await.unwrap();
    assert!(
        taken.is_none(),
        "a rival was granted a lock the holder holds"
    );
    assert!(first.is_held().await.unwrap(), "the holder's grant is gone");
    first.release().await.unwrap();
    assert_free_everywhere(&masters, &name);
}
