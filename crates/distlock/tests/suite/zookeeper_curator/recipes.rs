//! Curator's `InterProcessReadWriteLock` and `LeaderLatch` beside distlock's `RwLock` and `Election`.
//!
//! On ZooKeeper distlock keeps both in Curator's layout: readers and writers are
//! `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>` children of one path, candidates
//! `_c_<uuid>-latch-<seq>` children holding their participant id. These tests put a real
//! Curator client and distlock on the same path and check that each side sees the other.

use std::time::Duration;

use distlock::AcquireOptions;
use tokio::time::{Instant, timeout};

use super::harness::*;

/// The children of `setup`'s lock path in line order (by their 10-digit sequence).
async fn line(setup: &Setup) -> Vec<String> {
    let mut children = match timeout(STEP, setup.zk.list_children(&setup.path)).await {
        Ok(Ok(children)) => children,
        Ok(Err(zookeeper_client::Error::NoNode)) => Vec::new(),
        Ok(Err(e)) => panic!("listing {}: {e}", setup.path),
        Err(_) => panic!("listing {} timed out", setup.path),
    };
    children.sort_by_key(|child| child[child.len().saturating_sub(10)..].to_owned());
    children
}

/// True for a node named as Curator names a node with `marker`: `_c_<uuid>-<marker><10 digits>`.
fn named_as_curator(node: &str, marker: &str) -> bool {
    let Some(rest) = node.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, sequence)) = rest.split_once(&format!("-{marker}")) else {
        return false;
    };
    uuid::Uuid::parse_str(uuid).is_ok()
        && sequence.len() == 10
        && sequence.bytes().all(|b| b.is_ascii_digit())
}

/// Waits until the line has `count` nodes with `marker`.
async fn until_in_line(setup: &Setup, marker: &str, count: usize) {
    timeout(STEP, async {
        while line(setup)
            .await
            .iter()
            .filter(|node| node.contains(marker))
            .count()
            < count
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{count} {marker} nodes never stood in line"));
}

/// Promise 1 for reader-writer locks, across implementations: Curator's
/// `InterProcessReadWriteLock` and distlock's `RwLock` on one path share reads and exclude
/// writes both ways. A Curator reader and a distlock reader hold together; a distlock writer
/// waits for both, and while it waits a new reader of either side is refused (a queued writer
/// blocks later readers); it is granted only after Curator's reader released; while it writes,
/// Curator can neither read nor write; a Curator writer queued behind it blocks distlock's
/// readers, and gets the lock when distlock's writer releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_curator_and_distlock_read_write_locks_exclude_each_other() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let rwlock = setup.locks.rwlock(setup.name).unwrap();
    assert!(
        rwlock.is_native(),
        "ZooKeeper keeps the reader-writer lock itself"
    );
    let mut curator = Curator::start(&setup.connect).await;
    let mut second = Curator::start(&setup.connect).await;

    assert_eq!(
        curator
            .command(&format!("read-acquire {path} 5000"), STEP)
            .await,
        "acquired"
    );
    let read = timeout(STEP, rwlock.try_read())
        .await
        .unwrap()
        .unwrap()
        .expect("a distlock reader was refused beside Curator's reader");
    let readers = line(&setup).await;
    assert_eq!(readers.len(), 2, "{readers:?}");
    assert!(
        readers
            .iter()
            .all(|node| named_as_curator(node, "__READ__")),
        "{readers:?}"
    );

    let other = setup.other_client().await;
    let writing = other.rwlock(setup.name).unwrap();
    let writer = tokio::spawn(async move {
        let write = writing.write_with(AcquireOptions::new().wait(STEP)).await;
        (write, Instant::now())
    });
    until_in_line(&setup, "__WRIT__", 1).await;
    assert!(
        named_as_curator(&line(&setup).await[2], "__WRIT__"),
        "distlock's writer is not named as Curator's"
    );
    assert!(
        rwlock.try_read().await.unwrap().is_none(),
        "a distlock reader overtook a queued distlock writer"
    );
    assert_eq!(
        second
            .command(&format!("read-acquire {path} 500"), STEP)
            .await,
        "timeout",
        "a Curator reader overtook a queued distlock writer"
    );
    read.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished(),
        "distlock's writer was granted beside Curator's reader"
    );
    let released = Instant::now();
    assert_eq!(
        curator.command(&format!("read-release {path}"), STEP).await,
        "released"
    );
    let (write, granted) = timeout(STEP, writer).await.unwrap().unwrap();
    let write = write.expect("distlock's writer was not granted after the readers left");
    assert!(
        granted >= released,
        "granted before Curator's reader released"
    );

    assert_eq!(
        second
            .command(&format!("read-acquire {path} 500"), STEP)
            .await,
        "timeout",
        "Curator read while distlock writes"
    );
    assert_eq!(
        second
            .command(&format!("write-acquire {path} 500"), STEP)
            .await,
        "timeout",
        "Curator wrote while distlock writes"
    );
    // A mutex of the same name stands in another line (as Curator's `InterProcessMutex`
    // does): free beside the write, and no deadlock for a writer that also takes it.
    let mutex = setup.locks.mutex(setup.name).unwrap();
    let beside = mutex.try_acquire().await.unwrap();
    assert!(
        beside.is_some(),
        "a mutex of the same name waited for the writer"
    );
    if let Some(guard) = beside {
        guard.release().await.unwrap();
    }
    curator.send(&format!("write-acquire {path} 20000"));
    until_in_line(&setup, "__WRIT__", 2).await;
    assert!(
        rwlock.try_read().await.unwrap().is_none(),
        "a distlock reader overtook a queued Curator writer"
    );
    assert!(
        !curator.has_reply(),
        "Curator wrote beside distlock's writer"
    );
    write.release().await.unwrap();
    assert_eq!(curator.reply(STEP).await, "acquired");
    assert!(
        rwlock.try_read().await.unwrap().is_none(),
        "distlock read while Curator writes"
    );
    assert_eq!(
        curator
            .command(&format!("write-release {path}"), STEP)
            .await,
        "released"
    );
    let read = rwlock
        .read_with(AcquireOptions::new().wait(STEP))
        .await
        .expect("distlock could not read after Curator's writer left");
    read.release().await.unwrap();
    curator.exit().await;
    second.exit().await;
    timeout(STEP, async {
        while !line(&setup).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("nodes left behind");
    setup.clean_up().await;
}

/// Promise 1 for elections, across implementations: Curator's `LeaderLatch` and distlock's
/// `Election` on one path are one race. While Curator's latch leads, distlock's `leader()`
/// names it (its participant id) and a distlock campaign waits; it is elected once the latch
/// closes, its node is a latch node holding its value, Curator's latches see distlock as the
/// leader and do not lead, and a waiting latch leads once distlock resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_curator_leader_latch_and_distlock_election_exclude_each_other() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let election = setup.locks.election(setup.name).unwrap();
    assert!(election.is_native(), "ZooKeeper keeps the election itself");
    let mut curator = Curator::start(&setup.connect).await;

    assert_eq!(
        curator
            .command(&format!("latch-start {path} java-1"), STEP)
            .await,
        "started"
    );
    assert_eq!(
        curator
            .command(&format!("latch-await {path} 20000"), STEP)
            .await,
        "leading"
    );
    let leader = election
        .leader()
        .await
        .unwrap()
        .expect("Curator's latch leads");
    assert_eq!(leader.value, "java-1");
    assert!(named_as_curator(&leader.holder, "latch-"), "{leader:?}");

    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let leadership = election
                .campaign_with("distlock", AcquireOptions::new().wait(STEP))
                .await;
            (leadership, Instant::now())
        })
    };
    until_in_line(&setup, "latch-", 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !campaign.is_finished(),
        "distlock was elected while Curator's latch leads"
    );
    assert_eq!(
        curator.command(&format!("latch-leader {path}"), STEP).await,
        "leader java-1"
    );
    let closed = Instant::now();
    assert_eq!(
        curator.command(&format!("latch-close {path}"), STEP).await,
        "closed"
    );
    let (leadership, elected) = timeout(STEP, campaign).await.unwrap().unwrap();
    let leadership = leadership.expect("distlock was not elected after the latch closed");
    assert!(elected >= closed, "elected before Curator's latch closed");
    let leader = election.leader().await.unwrap().expect("distlock leads");
    assert_eq!(
        (leader.term, leader.value.as_str()),
        (leadership.term(), "distlock")
    );
    // A mutex of the same name stands in another line (as Curator's mutex and latch do).
    let mutex = setup.locks.mutex(setup.name).unwrap();
    let beside = mutex.try_acquire().await.unwrap();
    assert!(
        beside.is_some(),
        "a mutex of the same name waited for the leader"
    );
    if let Some(guard) = beside {
        guard.release().await.unwrap();
    }
    let nodes = line(&setup).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(named_as_curator(&nodes[0], "latch-"), "{nodes:?}");
    assert_eq!(leader.holder, nodes[0]);
    let (data, _) = setup
        .zk
        .get_data(&format!("{path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(
        data, b"distlock",
        "the candidate's node does not hold its value"
    );

    assert_eq!(
        curator
            .command(&format!("latch-start {path} java-2"), STEP)
            .await,
        "started"
    );
    until_in_line(&setup, "latch-", 2).await;
    assert_eq!(
        curator.command(&format!("latch-leader {path}"), STEP).await,
        "leader distlock",
        "Curator does not see distlock as the leader"
    );
    assert_eq!(
        curator
            .command(&format!("latch-await {path} 500"), STEP)
            .await,
        "timeout",
        "Curator's latch led while distlock leads"
    );
    curator.send(&format!("latch-await {path} 20000"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !curator.has_reply(),
        "Curator's latch led while distlock leads"
    );
    timeout(STEP, leadership.resign()).await.unwrap().unwrap();
    assert_eq!(curator.reply(STEP).await, "leading");
    let leader = election
        .leader()
        .await
        .unwrap()
        .expect("Curator's latch leads");
    assert_eq!(leader.value, "java-2");
    assert_eq!(
        curator.command(&format!("latch-close {path}"), STEP).await,
        "closed"
    );
    curator.exit().await;
    setup.clean_up().await;
}
