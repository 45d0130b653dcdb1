//! Curator's `InterProcessMutex` and distlock's mutex on one path.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::{AcquireOptions, Locks};
use tokio::time::{Instant, timeout};

use super::harness::*;

/// Promise 1: at most one holder per name, with a real Curator client holding. While
/// Curator's `InterProcessMutex` holds the path distlock uses for the name, distlock's
/// `try_acquire` answers `None` and a waiting `acquire_with` queues behind Curator's node (as
/// Curator's own view of the queue shows); it is granted only after Curator was told to
/// release, and Curator's node is gone when the grant returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_curator_holder_excludes_distlock_until_it_releases() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;

    assert_eq!(
        curator.command(&format!("acquire {path} 5000"), STEP).await,
        "acquired"
    );
    let held = curator.participants(&path).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(curator_layout(leaf(&held[0])), "{held:?}");
    let curator_node = leaf(&held[0]).to_owned();

    let mutex = setup.locks.mutex(setup.name).unwrap();
    let tried = timeout(STEP, mutex.try_acquire())
        .await
        .expect("try_acquire hung");
    assert!(
        tried.unwrap().is_none(),
        "distlock's try_acquire was granted while Curator holds"
    );
    assert!(
        timeout(STEP, setup.locks.is_locked(setup.name))
            .await
            .unwrap()
            .unwrap()
    );

    let setup = Arc::new(setup);
    let waiter = tokio::spawn({
        let setup = setup.clone();
        async move {
            let guard = setup
                .locks
                .mutex(setup.name)
                .unwrap()
                .acquire_with(AcquireOptions::new().wait(Duration::from_secs(30)))
                .await
                .expect("distlock was not granted after Curator released");
            let granted = Instant::now();
            (guard, granted, setup.queue().await)
        }
    });
    // The waiter's node joins the queue behind Curator's, in both recipes' order.
    let start = Instant::now();
    let queue = loop {
        let queue = setup.queue().await;
        if queue.len() == 2 || start.elapsed() > STEP {
            break queue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(queue.len(), 2, "distlock's waiter never queued: {queue:?}");
    assert_eq!(queue[0], curator_node);
    assert!(curator_layout(&queue[1]), "{queue:?}");
    let seen_by_curator: Vec<String> = curator
        .participants(&path)
        .await
        .iter()
        .map(|node| leaf(node).to_owned())
        .collect();
    assert_eq!(
        seen_by_curator, queue,
        "Curator orders distlock's waiter behind its own node"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "distlock was granted while Curator holds"
    );

    // The grant may reach distlock before Curator's `released` line reaches us (the deletion's
    // watch and Curator's reply race), so the order asserted is: not granted before the
    // release was asked for, and Curator's node gone when the grant returns.
    let release_sent = Instant::now();
    assert_eq!(curator.command("release", STEP).await, "released");
    let (guard, granted, queue_at_grant) = timeout(STEP, waiter)
        .await
        .expect("distlock was not granted within 20 s of Curator's release")
        .unwrap();
    assert!(granted >= release_sent);
    assert!(
        !queue_at_grant.contains(&curator_node),
        "granted while Curator's node is there: {queue_at_grant:?}"
    );
    assert_eq!(queue_at_grant.len(), 1, "{queue_at_grant:?}");
    assert!(setup.holder_data().await.starts_with("distlock "));
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    curator.exit().await;
    Arc::into_inner(setup).unwrap().clean_up().await;
}

/// Promise 1: at most one holder per name, with distlock holding. While distlock holds, a real
/// Curator client's `acquire(500 ms)` times out (and leaves the queue); Curator sees distlock's
/// node as the holder; a Curator client waiting when distlock releases is granted then, and
/// then distlock is refused until Curator releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_distlock_holder_excludes_curator_until_it_releases() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;
    let mutex = setup.locks.mutex(setup.name).unwrap();

    let guard = timeout(STEP, mutex.acquire()).await.unwrap().unwrap();
    let queue = setup.queue().await;
    assert_eq!(queue.len(), 1, "{queue:?}");
    let distlock_node = queue[0].clone();
    let seen_by_curator = curator.participants(&path).await;
    assert_eq!(
        seen_by_curator.iter().map(|n| leaf(n)).collect::<Vec<_>>(),
        [distlock_node.as_str()],
        "Curator sees distlock's node as the holder"
    );

    let asked = Instant::now();
    assert_eq!(
        curator.command(&format!("acquire {path} 500"), STEP).await,
        "timeout",
        "Curator was granted while distlock holds"
    );
    assert!(asked.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        setup.queue().await,
        std::slice::from_ref(&distlock_node),
        "Curator's timed-out node left the queue"
    );

    // A Curator client that waits is granted when distlock releases, not before.
    curator.send(&format!("acquire {path} 20000"));
    let start = Instant::now();
    while setup.queue().await.len() < 2 {
        assert!(start.elapsed() < STEP, "Curator never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if curator.has_reply() {
        let reply = curator.reply(STEP).await;
        panic!("Curator answered {reply:?} while distlock holds");
    }
    let release_started = Instant::now();
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    assert_eq!(curator.reply(STEP).await, "acquired");
    let curator_granted = Instant::now();
    assert!(curator_granted >= release_started);
    assert!(
        !setup.queue().await.contains(&distlock_node),
        "distlock's node outlived its release"
    );
    assert!(!setup.holder_data().await.starts_with("distlock "));

    let other = setup.other_client().await;
    for locks in [&setup.locks, &other] {
        let tried = timeout(STEP, locks.mutex(setup.name).unwrap().try_acquire())
            .await
            .expect("try_acquire hung")
            .unwrap();
        assert!(tried.is_none(), "distlock was granted while Curator holds");
    }
    assert_eq!(curator.command("release", STEP).await, "released");
    let guard = timeout(STEP, mutex.try_acquire())
        .await
        .unwrap()
        .unwrap()
        .expect("distlock was refused after Curator released");
    timeout(STEP, guard.release()).await.unwrap().unwrap();
    curator.exit().await;
    setup.clean_up().await;
}

/// Who holds the lock, as the test's drivers know it for certain: from the grant until the
/// release is asked for.
#[derive(Default)]
struct Holding {
    holder: Option<&'static str>,
    /// Every grant in order.
    history: Vec<&'static str>,
}

impl Holding {
    fn enter(this: &StdMutex<Holding>, who: &'static str) {
        let mut holding = this.lock().unwrap();
        if let Some(other) = holding.holder {
            panic!(
                "{who} was granted while {other} holds (grants so far: {:?})",
                holding.history
            );
        }
        holding.holder = Some(who);
        holding.history.push(who);
    }

    fn leave(this: &StdMutex<Holding>, who: &'static str) {
        let mut holding = this.lock().unwrap();
        assert_eq!(holding.holder, Some(who));
        holding.holder = None;
    }
}

/// Rounds per contender in the queueing test, and how long each grant is held.
const ROUNDS: usize = 6;
const HOLD: Duration = Duration::from_millis(100);

/// Promise 1: at most one holder per name while Curator and distlock queue on one lock. A
/// Curator client and two distlock clients (three sessions) each take the lock `ROUNDS` times,
/// holding it 100 ms and queueing again at once. Whenever a driver knows its side holds (from
/// the grant until it asks for the release), no other side does, and the node first in line
/// is the holder's. Each side gets every round, and the grants pass between Curator and
/// distlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_curator_and_distlock_queue_on_one_lock_without_overlap() {
    let setup = Setup::new().await;
    let path = setup.path.clone();
    let mut curator = Curator::start(&setup.connect).await;
    let other = setup.other_client().await;
    let holding = StdMutex::new(Holding::default());

    let curator_side = async {
        for round in 0..ROUNDS {
            let reply = curator
                .command(&format!("acquire {path} 30000"), STEP * 2)
                .await;
            assert_eq!(reply, "acquired", "Curator's round {round}");
            Holding::enter(&holding, "curator");
            let data = setup.holder_data().await;
            assert!(
                !data.starts_with("distlock "),
                "Curator holds but a distlock node is first in line"
            );
            tokio::time::sleep(HOLD).await;
            Holding::leave(&holding, "curator");
            assert_eq!(curator.command("release", STEP).await, "released");
        }
    };
    let distlock_side = |locks: Locks, who: &'static str| {
        let setup = &setup;
        let holding = &holding;
        async move {
            let mutex = locks.mutex(setup.name).unwrap();
            for round in 0..ROUNDS {
                let guard = timeout(
                    STEP * 2,
                    mutex.acquire_with(AcquireOptions::new().wait(Duration::from_secs(30))),
                )
                .await
                .unwrap_or_else(|_| panic!("{who}'s round {round} hung"))
                .unwrap_or_else(|e| panic!("{who}'s round {round}: {e}"));
                Holding::enter(holding, who);
                let data = setup.holder_data().await;
                assert!(
                    data.starts_with("distlock "),
                    "{who} holds but the node first in line is not distlock's: {data:?}"
                );
                tokio::time::sleep(HOLD).await;
                Holding::leave(holding, who);
                timeout(STEP, guard.release()).await.unwrap().unwrap();
            }
        }
    };
    let started = Instant::now();
    tokio::join!(
        curator_side,
        distlock_side(setup.locks.clone(), "distlock A"),
        distlock_side(other, "distlock B"),
    );
    let history = holding.into_inner().unwrap().history;
    for who in ["curator", "distlock A", "distlock B"] {
        assert_eq!(
            history.iter().filter(|h| **h == who).count(),
            ROUNDS,
            "{history:?}"
        );
    }
    let handoffs = history
        .windows(2)
        .filter(|pair| (pair[0] == "curator") != (pair[1] == "curator"))
        .count();
    assert!(
        handoffs >= ROUNDS,
        "the lock rarely passed between Curator and distlock: {history:?}"
    );
    eprintln!(
        "{} grants in {:?}, {handoffs} between Curator and distlock: {history:?}",
        history.len(),
        started.elapsed()
    );
    assert!(setup.queue().await.is_empty(), "nodes left behind");
    curator.exit().await;
    setup.clean_up().await;
}
