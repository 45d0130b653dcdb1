//! The ticket service as its users meet it: two service processes on loopback ports share
//! one backend, 1,000 HTTP orders for 100 tickets arrive at once, half at each process.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TICKETS: u64 = 100;
const ORDERS: usize = 1000;

/// A running service process; killed (by its PID) when dropped.
struct Service {
    _child: Child,
    base: String,
}

async fn start(args: &[&str]) -> Service {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickets"))
        .args(["--port", "0"])
        // Every order is answered within the test's bound: on a loaded 2-core machine the
        // 1,000 orders through one SQLite lock took 50-82 s, and over 120 s beside the
        // partition lab's servers, past the default 60 s wait.
        .args(["--wait-s", "230"])
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the ticket service");
    let stdout = child.stdout.take().expect("the service's stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the service did not say where it listens within 30 s")
        .expect("read the service's stdout")
        .expect("the service exited before listening");
    let base = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_owned();
    Service {
        _child: child,
        base,
    }
}

/// What 1,000 concurrent orders got back.
#[derive(Debug, Default)]
struct Outcome {
    sold: Vec<serde_json::Value>,
    sold_out: usize,
    other: Vec<String>,
}

/// Puts `TICKETS` tickets of a new concert on sale through the first service, then sends
/// `ORDERS` orders at once, alternating between the services.
async fn sell(services: &[Service]) -> (u64, Outcome) {
    let concert = fastrand_concert();
    let client = reqwest::Client::builder()
        // Longer than the service's own wait for the lock (230 s).
        .timeout(Duration::from_secs(240))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let put = client
        .put(format!("{}/concerts/{concert}", services[0].base))
        .json(&serde_json::json!({ "tickets": TICKETS }))
        .send()
        .await
        .expect("put the concert on sale");
    assert_eq!(put.status(), 204, "{:?}", put.text().await);
    let mut orders = tokio::task::JoinSet::new();
    for i in 0..ORDERS {
        let url = format!(
            "{}/concerts/{concert}/orders",
            services[i % services.len()].base
        );
        let client = client.clone();
        orders.spawn(async move {
            let response = client
                .post(url)
                .json(&serde_json::json!({ "buyer": format!("buyer-{i}") }))
                .send()
                .await?;
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await?;
            Ok::<_, reqwest::Error>((status, body))
        });
    }
    let mut outcome = Outcome::default();
    let all = async {
        while let Some(answer) = orders.join_next().await {
            match answer.expect("order task") {
                Ok((201, receipt)) => outcome.sold.push(receipt),
                Ok((409, body)) => {
                    assert_eq!(body["error"], "sold out", "a 409 that is not sold out");
                    outcome.sold_out += 1;
                }
                Ok((status, body)) => outcome.other.push(format!("{status}: {body}")),
                Err(error) => outcome.other.push(error.to_string()),
            }
        }
    };
    // Within nextest's end for a hung test (300 s).
    tokio::time::timeout(Duration::from_secs(270), all)
        .await
        .expect("1,000 orders did not finish within 270 s");
    (concert, outcome)
}

fn fastrand_concert() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (nanos % 1_000_000_000) as u64 + u64::from(std::process::id()) * 1_000_000_000
}

async fn left(service: &Service, concert: u64) -> u64 {
    let body: serde_json::Value = reqwest::get(format!("{}/concerts/{concert}", service.base))
        .await
        .expect("GET the concert")
        .json()
        .await
        .expect("the concert as JSON");
    body["left"].as_u64().expect("left is a number")
}

/// Promise 1 and 5 end to end: with the lock, exactly 100 tickets are sold, every other
/// order is a clean 409 "sold out", every ticket is sold once (the receipts' "left" values
/// are 99 down to 0, each once), the fencing tokens are all different, and both services
/// say none are left.
async fn sells_exactly_the_tickets(args: &[&str]) {
    let services = [start(args).await, start(args).await];
    let (concert, outcome) = sell(&services).await;
    assert!(
        outcome.other.is_empty(),
        "orders neither sold nor sold out: {:?}",
        outcome.other
    );
    assert_eq!(outcome.sold.len() as u64, TICKETS, "tickets sold");
    assert_eq!(
        outcome.sold_out,
        ORDERS - TICKETS as usize,
        "orders refused as sold out"
    );
    let lefts: HashSet<u64> = outcome
        .sold
        .iter()
        .map(|r| r["left"].as_u64().unwrap())
        .collect();
    assert_eq!(lefts, (0..TICKETS).collect(), "a ticket sold twice or lost");
    let tokens: HashSet<u64> = outcome
        .sold
        .iter()
        .map(|r| r["fencing_token"].as_u64().unwrap())
        .collect();
    assert_eq!(
        tokens.len() as u64,
        TICKETS,
        "promise 3: a fencing token given twice"
    );
    for service in &services {
        assert_eq!(
            left(service, concert).await,
            0,
            "stock left at {}",
            service.base
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_two_processes_sell_exactly_100_tickets_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let backend = format!("sqlite://{}", dir.path().join("locks.db").display());
    sells_exactly_the_tickets(&["--backend", &backend]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_two_processes_sell_exactly_100_tickets_on_redis() {
    sells_exactly_the_tickets(&["--backend", "redis://127.0.0.1:6379/"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_two_processes_sell_exactly_100_tickets_on_postgres() {
    sells_exactly_the_tickets(&["--backend", "postgres://root@127.0.0.1:5432/test"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_two_processes_sell_exactly_100_tickets_on_zookeeper() {
    sells_exactly_the_tickets(&[
        "--backend",
        "zk://127.0.0.1:2181/",
        "--store",
        "redis://127.0.0.1:6379/",
    ])
    .await;
}

/// The same orders without the lock oversell: the test above could fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_two_processes_oversell() {
    let dir = tempfile::tempdir().unwrap();
    let backend = format!("sqlite://{}", dir.path().join("locks.db").display());
    let args = ["--backend", backend.as_str(), "--no-lock", "--work-ms", "5"];
    let services = [start(&args).await, start(&args).await];
    let (_, outcome) = sell(&services).await;
    assert!(
        outcome.sold.len() as u64 > TICKETS,
        "without the lock only {} were sold (others: {:?})",
        outcome.sold.len(),
        outcome.other.first()
    );
}
