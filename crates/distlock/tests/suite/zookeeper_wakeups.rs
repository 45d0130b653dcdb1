//! How ZooKeeper waiters are woken, on the standalone server `scripts/test` starts: one
//! waiter per release with `zk://` (no herd), every waiter with `zk+naive://`, and a handoff
//! of one write and one notification.

use std::time::Duration;

use distlock::conformance::servers;

fn standalone() -> String {
    servers::ZOOKEEPER.url()
}

fn naive() -> String {
    servers::with_scheme(&servers::ZOOKEEPER.url(), "zk+naive")
}

fn unique(case: &str) -> String {
    format!("zk/{case}/{}", uuid::Uuid::new_v4().simple())
}

/// A client of its own holding `name`: the holder the waiters queue behind.
async fn hold(url: &str, name: &str) -> (distlock::Locks, distlock::Guard) {
    let holder = distlock::connect(url).await.unwrap();
    let held = holder.mutex(name).unwrap().acquire().await.unwrap();
    (holder, held)
}

/// Waiters on the sequential lock are woken one per release (and once more per grant after
/// waiting); on the naive lock every waiter is woken by every release (the herd).
async fn notifications_for(url: &str, waiters: usize) -> (u64, u64) {
    let name = unique("herd");
    let (_holder, held) = hold(url, &name).await;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let locks = distlock::connect(url).await.unwrap();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let guard = locks.mutex(name).unwrap().acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.release().await.unwrap();
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = distlock::hooks::zookeeper_watch_notifications();
    held.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    // Every waiter's release but the last one's had someone waiting, and so did the holder's.
    (
        distlock::hooks::zookeeper_watch_notifications() - before,
        waiters as u64,
    )
}

/// One notification per release, and at most one more per grant after waiting (the mark that
/// sends the waiter behind to look while the new holder holds): never one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sequential_lock_wakes_one_waiter_per_release() {
    let (notifications, releases) = notifications_for(&standalone(), 8).await;
    assert!(
        (releases..2 * releases).contains(&notifications),
        "{notifications} watch notifications for {releases} releases"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_lock_wakes_every_waiter() {
    let (notifications, releases) = notifications_for(&naive(), 8).await;
    assert!(
        notifications >= 3 * releases,
        "{notifications} watch notifications for {releases} releases: no herd"
    );
    eprintln!("naive: {notifications} notifications for {releases} releases");
}

/// The number of contenders' nodes under the lock node of `name` (default base).
async fn queued(raw: &zookeeper_client::Client, name: &str) -> usize {
    let path = format!("/distlock/locks/{}", name.replace('/', "%2F"));
    raw.list_children(&path)
        .await
        .map_or(0, |children| children.len())
}

/// A waiter queued behind another waiter is granted on its watch alone: the waiter ahead,
/// granted when the holder released, marks its node, which sends the one behind to look at
/// the line while it holds; its release is then the last thing the one behind waits for, and
/// the handoff is one write (the delete) and one notification, with no look after it. (The
/// counters are per process: nextest runs each test in a process of its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_waiter_is_granted_on_its_watch_alone() {
    let url = standalone();
    let server = url.split_once("://").map_or("", |(_, rest)| rest);
    let raw = zookeeper_client::Client::connector()
        .connect(server.split(['/', '?', ',']).next().unwrap_or_default())
        .await
        .expect("raw ZooKeeper client");
    let name = unique("watch_grant");
    let (_holder, held) = hold(&url, &name).await;
    let notified = distlock::hooks::zookeeper_watch_notifications;
    let before = (notified(), distlock::hooks::zookeeper_watch_grants());
    let mut waiters = Vec::new();
    for first in [true, false] {
        let locks = distlock::connect(&url).await.unwrap();
        let mutex = locks.mutex(name.as_str()).unwrap();
        waiters.push(tokio::spawn(async move {
            let guard = mutex.acquire().await.unwrap();
            if first {
                // Hold until the mark has woken the waiter behind (the holder's release woke
                // this one), and that one has looked and watched again.
                let marked = async {
                    while notified() < before.0 + 2 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                };
                // Without a mark nothing comes: the assertion below says so.
                let _ = tokio::time::timeout(Duration::from_secs(3), marked).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            guard.release().await.unwrap();
        }));
        // Queued, and watching the node ahead, before the next one comes.
        let nodes = waiters.len() + 1;
        tokio::time::timeout(Duration::from_secs(10), async {
            while queued(&raw, &name).await < nodes {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a waiter did not queue within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        for waiter in waiters {
            waiter.await.unwrap();
        }
    })
    .await
    .expect("the waiters were not served within 10 s");
    // The first waiter watched the holder (first in line); the second watched the first
    // waiter, which was not first in line when the second queued.
    assert_eq!(
        distlock::hooks::zookeeper_watch_grants() - before.1,
        2,
        "a waiter looked at the line after its predecessor's release"
    );
}
