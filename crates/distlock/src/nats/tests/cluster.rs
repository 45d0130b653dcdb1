//! A 3-node JetStream cluster of the test's own, with an R3 bucket: the stream's leader is
//! killed while a lock is held and contended.

use std::time::{Duration, Instant};

use super::launch::Servers;
use crate::{ConnectOptions, Locks};

/// Connects, retrying while the new cluster elects its leaders (creating the bucket needs
/// JetStream's metadata leader).
async fn connect_when_ready(url: &str, options: ConnectOptions) -> Locks {
    let began = Instant::now();
    loop {
        match crate::connect_with(url, options.clone()).await {
            Ok(locks) => return locks,
            Err(e) if began.elapsed() < Duration::from_secs(90) => {
                eprintln!("the cluster is not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the cluster never served the bucket: {e}"),
        }
    }
}

/// The index of the node that leads `stream`, as the cluster reports it.
async fn stream_leader(servers: &Servers, stream: &str) -> usize {
    let began = Instant::now();
    loop {
        let client = async_nats::connect(servers.hosts().split(',').next().unwrap())
            .await
            .expect("connect to the cluster");
        let leader = match async_nats::jetstream::new(client).get_stream(stream).await {
            Ok(stream) => stream
                .cached_info()
                .cluster
                .as_ref()
                .and_then(|cluster| cluster.leader.clone()),
            Err(_) => None,
        };
        if let Some(index) =
            leader.and_then(|leader| servers.nodes.iter().position(|node| node.name == leader))
        {
            return index;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the stream {stream} has no leader"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Promises 1, 2 and 3 on an R3 bucket: with the stream's leader killed (SIGKILL) while a
/// lock is held and a rival keeps asking, the cluster answers again from a new leader and
/// still holds the grant (an acknowledged write is on a majority). The rival is granted only
/// if the holder's renewals could not reach the new leader within its lease, and then only
/// after the holder fired `lost()`, with a larger token; otherwise the holder keeps the lock
/// and the rival gets it after the release, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_2_3_an_r3_grant_survives_the_stream_leader_killed_while_contended() {
    const LEASE: Duration = Duration::from_secs(6);
    let mut servers = Servers::cluster();
    let url = format!("nats://{}/failover?replicas=3", servers.hosts());
    let holder = connect_when_ready(&url, ConnectOptions::new().lease(LEASE)).await;
    let rival = connect_when_ready(&url, ConnectOptions::new()).await;
    let name = format!("failover/{}", uuid::Uuid::new_v4().simple());
    let guard = holder.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    let token = guard.fencing_token();
    let leader = stream_leader(&servers, "KV_failover").await;
    eprintln!("killing the stream leader {}", servers.nodes[leader].name);
    servers.nodes[leader].kill();
    let killed_at = Instant::now();

    let rival_mutex = rival.mutex(name.as_str()).unwrap();
    let window = LEASE * 2;
    // The holder's loss, timed by a task of its own so that the rival's loop cannot delay
    // the reading.
    let guard = std::sync::Arc::new(guard);
    let watch = tokio::spawn({
        let guard = guard.clone();
        async move {
            guard.lost().await;
            Instant::now()
        }
    });
    let (answered_at, granted) = async {
            let mut answered_at = None;
            while killed_at.elapsed() < window {
                match rival_mutex.try_acquire().await {
                    Ok(Some(granted)) => return (answered_at, Some((Instant::now(), granted))),
                    Ok(None) => {
                        answered_at.get_or_insert_with(Instant::now);
                    }
                    Err(e) => eprintln!("the rival's attempt failed: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (answered_at, None)
    }
    .await;
    let lost_at = if granted.is_some() || watch.is_finished() {
        tokio::time::timeout(Duration::from_secs(10), watch).await.ok().map(|t| t.unwrap())
    } else {
        watch.abort();
        let _ = watch.await;
        None
    };
    match granted {
        Some((granted_at, granted)) => {
            let lost_at = lost_at.expect("the rival was granted but the holder never fired lost()");
            assert!(
                lost_at < granted_at,
                "the rival was granted {:?} before the holder fired lost()",
                lost_at - granted_at
            );
            assert!(granted.fencing_token() > token);
            eprintln!(
                "the holder lost the lock {:?} after the kill; the rival was granted {:?} after it",
                lost_at - killed_at,
                granted_at - killed_at
            );
            granted.release().await.unwrap();
        }
        None => {
            let answered_at = answered_at.expect("the cluster never answered after the kill");
            let guard = std::sync::Arc::into_inner(guard).expect("the watch has ended");
            let kept = lost_at.is_none() && !guard.is_lost();
            eprintln!(
                "the cluster answered {:?} after the kill; the holder {} the lock",
                answered_at - killed_at,
                if kept { "kept" } else { "lost" }
            );
            if kept {
                assert!(guard.is_held().await.unwrap(), "the grant did not survive");
                guard.release().await.unwrap();
            }
            let granted = rival_mutex
                .acquire_with(crate::AcquireOptions::new().wait(Duration::from_secs(30)))
                .await
                .unwrap();
            assert!(granted.fencing_token() > token);
            granted.release().await.unwrap();
        }
    }
    // The killed node comes back and catches up; the cluster still serves the lock.
    servers.restart(leader);
    let again = rival_mutex.acquire().await.unwrap();
    again.release().await.unwrap();
}
