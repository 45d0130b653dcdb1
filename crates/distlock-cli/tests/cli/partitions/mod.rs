//! Partitions between the servers (issue #33): each deployment runs on hosts of its own in a
//! lab of network namespaces ([`lab`]), `distlock check` runs its workers on two client
//! hosts (`--worker-netns`) and injects nothing itself, and the test cuts and heals the lab
//! network on a schedule while the check runs. The history is judged afterwards as always:
//! promise 1 (at most one holder: overlaps only where the earlier holder had been told),
//! promise 2 (`lost()` before a rival's grant) and promise 3 (fencing tokens grow strictly,
//! and the fenced register refuses stale writes and loses no update).
//!
//! ZooKeeper, etcd and Redlock must show no overlap at all. A Redis Sentinel group replicates
//! asynchronously, so its failover grants the lock twice (the documented limit): the check
//! reports those overlaps and passes only when fencing refused every stale write.
//!
//! Needs root, `ip` and `iptables`: without them every test here fails with the reason.

mod delay;
mod lab;
mod servers;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::BIN;
use lab::Lab;
use servers::Deployment;

/// How long each check runs.
const CHECK_S: u64 = 20;
/// How long a check may take past its run (its workers stop, the history is judged).
const CHECK_GRACE: Duration = Duration::from_secs(90);
/// Healthy time before the first fault, and between rounds.
const CALM: Duration = Duration::from_secs(3);
/// How long one partition lasts: past the 2 s sessions and leases, and past a Sentinel
/// failover (1 s down-after, then the election).
const CUT: Duration = Duration::from_secs(7);
/// How many runs a scenario gets to show a fault's effect (a failover, a double grant, a
/// holder told): the effect hangs on timings a loaded machine does not keep, while every
/// run must keep the promises.
const ATTEMPTS: u32 = 3;

/// The clients' hosts: `c1` is cut off with the leader, `c2` stays with the majority.
const CLIENTS: [&str; 2] = ["c1", "c2"];

/// The deployments under test.
#[derive(Clone, Copy, Debug)]
enum Backend {
    ZooKeeper,
    Etcd,
    Sentinel,
    Redlock,
}

impl Backend {
    fn servers(self) -> [&'static str; 3] {
        match self {
            Backend::ZooKeeper => ["z1", "z2", "z3"],
            Backend::Etcd => ["e1", "e2", "e3"],
            Backend::Sentinel => ["r1", "r2", "r3"],
            Backend::Redlock => ["m1", "m2", "m3"],
        }
    }

    fn deploy(self, lab: &mut Lab) -> Deployment {
        let [a, b, c] = self.servers();
        match self {
            Backend::ZooKeeper => servers::zookeeper(lab, [a, b, c]),
            Backend::Etcd => servers::etcd(lab, [a, b, c]),
            // The master on r1, its replica on r2, a Sentinel on each of the three.
            Backend::Sentinel => servers::sentinel(lab, a, b, [a, b, c]),
            Backend::Redlock => servers::redlock(lab, [a, b, c]),
        }
    }

    /// The workers' lease (`check --lease-ms`): a hold the test aims a partition at lasts one
    /// and a half of it, past the 2 s ZooKeeper sessions and etcd leases of the URLs.
    fn lease_ms(self) -> u64 {
        match self {
            Backend::ZooKeeper | Backend::Etcd => 3000,
            Backend::Sentinel | Backend::Redlock => 1000,
        }
    }

    /// The clients' port on every server host.
    fn port(self) -> u16 {
        match self {
            Backend::ZooKeeper => 2181,
            Backend::Etcd => 2379,
            Backend::Sentinel | Backend::Redlock => 6379,
        }
    }

    /// The server to cut off with `c1`: the leader, the master, or one Redlock master.
    fn leader(self, lab: &Lab, deployment: &Deployment) -> Option<&'static str> {
        match self {
            Backend::ZooKeeper => servers::zookeeper_leader(lab, deployment),
            Backend::Etcd => servers::etcd_leader(lab, deployment),
            // r3 never holds a Redis server, so its Sentinel is always on the majority side.
            Backend::Sentinel => servers::sentinel_master(lab, "r3", deployment),
            Backend::Redlock => Some(self.servers()[0]),
        }
    }

    /// True when the servers on the majority side (every server but `cut_off`) act on the
    /// partition: a new leader or master among them; for Redlock, whose masters do not know
    /// each other, `c1` reaches none of them.
    fn majority_moved_on(self, lab: &Lab, deployment: &Deployment, cut_off: &str) -> bool {
        match self {
            Backend::Redlock => self
                .servers()
                .iter()
                .filter(|s| **s != cut_off)
                .all(|s| !lab.reaches("c1", s, self.port())),
            _ => self
                .leader(lab, deployment)
                .is_some_and(|leader| leader != cut_off),
        }
    }
}

/// What the test does to the lab while the check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    /// The leader (or master) and client host `c1` cut off from everything else, for
    /// [`CUT`] at a time, then healed for [`CALM`].
    LeaderWithClients,
    /// Client host `c1` cut off from everything else (every server), as above.
    ClientFromMajority,
    /// The leader and `c1` cut off and healed every second.
    Flapping,
    /// Every link between `c1`'s workers and the servers delayed by [`DELAY`] each way, for
    /// [`CUT`] at a time, through forwarders on the client hosts ([`delay`]).
    Delay,
    /// A share [`LOSS`] of the packets between the leader with `c1` and the rest dropped,
    /// for [`CUT`] at a time.
    Lossy,
}

/// The share of packets [`Schedule::Lossy`] drops.
const LOSS: f64 = 0.3;

/// The delay of [`Schedule::Delay`], each way.
const DELAY: Duration = Duration::from_millis(200);

/// Asks a worker of `c1` (workers 0 and 2: `--worker-netns` gives c1 the even ids) for a
/// hold of one and a half leases at its next grant, through the check's flag file, and
/// waits until it has begun, so that the partition strikes a holder inside its critical
/// section. False when none began in time (the partition is made all the same).
fn aim_at_a_holder_in_c1(log_dir: &std::path::Path, round: u32) -> bool {
    let worker = if round % 2 == 0 { 0 } else { 2 };
    let flag = log_dir.join(format!("long-{worker}"));
    if std::fs::write(&flag, b"").is_err() {
        return false;
    }
    let log = log_dir.join(format!("worker-{worker}.jsonl"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text
            .lines()
            .rfind(|line| !line.is_empty())
            .is_some_and(|last| last.contains("\"e\":\"long\""))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&flag);
    false
}

/// The lab's processes that are not servers: ended with the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a scenario measured.
struct Outcome {
    report: Value,
    exit: Option<i32>,
    /// Partitions (or flaps) applied.
    faults: u32,
    /// Partitions that struck a worker of `c1` inside a hold longer than its lease.
    aimed: u32,
    /// Partitions after which the majority side was seen to move on.
    moved_on: u32,
    seconds: f64,
}

/// Runs `distlock check` with its workers on both client hosts while `schedule` cuts and
/// heals the lab, and returns its report.
fn run_scenario(backend: Backend, schedule: Schedule, extra: &[&str]) -> Outcome {
    let started = Instant::now();
    let [a, b, c] = backend.servers();
    let tag = format!("{backend:?}{schedule:?}")
        .chars()
        .filter(char::is_ascii_uppercase)
        .collect::<String>()
        .to_lowercase();
    let mut lab = Lab::new(&tag, &[a, b, c, CLIENTS[0], CLIENTS[1]]);
    let deployment = backend.deploy(&mut lab);
    lab.wait_for("the deployment answering both clients", CUT * 3, |lab| {
        CLIENTS
            .iter()
            .all(|client| servers::answers(lab, client, &deployment.url))
    });

    // With delays, every worker reaches the servers through forwarders on its own host.
    let mut url = deployment.url.clone();
    let forwarders = (schedule == Schedule::Delay).then(|| {
        let targets: Vec<std::net::SocketAddr> = backend
            .servers()
            .iter()
            .map(|s| {
                format!("{}:{}", lab.ip(s), backend.port())
                    .parse()
                    .expect("a lab address")
            })
            .collect();
        let hosts: Vec<(&str, String)> = CLIENTS.iter().map(|c| (*c, lab.ns(c))).collect();
        let (forwarders, through) = delay::Forwarders::start(&hosts, &targets);
        for (target, through) in targets.iter().zip(&through) {
            url = url.replace(&target.to_string(), through);
        }
        forwarders
    });
    let log_dir = lab.dir("check").join("history");
    let out = lab.dir("check").join("stdout");
    let err = lab.dir("check").join("stderr");
    let mut command = lab.command("c2", BIN);
    command
        .args(["check", "--backend", &url, "--json", "--faults", "none"])
        .args(["--duration-s", &CHECK_S.to_string(), "--workers", "4"])
        .args(["--lease-ms", &backend.lease_ms().to_string()])
        .arg("--log-dir")
        .arg(&log_dir)
        .args(["--worker-netns", &lab.ns("c1")])
        .args(["--worker-netns", &lab.ns("c2")])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("the check's output"))
        .stderr(std::fs::File::create(&err).expect("the check's errors"));
    let mut check = KillOnDrop(command.spawn().expect("run distlock check"));
    let check_started = Instant::now();
    let run_until = check_started + Duration::from_secs(CHECK_S) - CALM;

    let mut faults = 0;
    let mut moved_on = 0;
    let mut aimed = 0;
    // At most one round per CALM + CUT (or per 2 s when flapping), and never past the run.
    std::thread::sleep(CALM);
    while Instant::now() < run_until && faults < 20 {
        let Some(leader) = backend.leader(&lab, &deployment) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let side: Vec<&str> = match schedule {
            Schedule::ClientFromMajority => vec!["c1"],
            _ => vec![leader, "c1"],
        };
        if schedule != Schedule::Flapping && aim_at_a_holder_in_c1(&log_dir, faults) {
            aimed += 1;
        }
        faults += 1;
        if let Some(forwarders) = &forwarders {
            forwarders.delay("c1", DELAY);
            // Took effect when a request from c1 takes at least a round trip of delays.
            let asked = Instant::now();
            let _ = servers::answers(&lab, "c1", &url);
            if asked.elapsed() >= DELAY * 2 {
                moved_on += 1;
            }
            std::thread::sleep(CUT.saturating_sub(asked.elapsed()));
            forwarders.heal("c1");
            std::thread::sleep(CALM);
            continue;
        }
        if schedule == Schedule::Lossy {
            lab.lossy(&side, LOSS);
            std::thread::sleep(CUT);
            if lab.dropped() > 0 {
                moved_on += 1;
            }
            lab.heal();
            std::thread::sleep(CALM);
            continue;
        }
        lab.partition(&side);
        match schedule {
            Schedule::Flapping => {
                std::thread::sleep(Duration::from_secs(1));
            }
            _ => {
                let cut_until = Instant::now() + CUT;
                let mut seen = false;
                while Instant::now() < cut_until {
                    if !seen
                        && schedule == Schedule::LeaderWithClients
                        && backend.majority_moved_on(&lab, &deployment, leader)
                    {
                        seen = true;
                        moved_on += 1;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
                if schedule == Schedule::ClientFromMajority
                    && backend
                        .servers()
                        .iter()
                        .all(|s| !lab.reaches("c1", s, backend.port()))
                {
                    moved_on += 1;
                }
            }
        }
        lab.heal();
        std::thread::sleep(match schedule {
            Schedule::Flapping => Duration::from_secs(1),
            _ => CALM,
        });
    }
    lab.heal();

    let deadline = check_started + Duration::from_secs(CHECK_S) + CHECK_GRACE;
    let status = loop {
        if let Some(status) = check.0.try_wait().expect("wait for the check") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the check did not end within {CHECK_GRACE:?} of its run; its errors:\n{}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON report ({e}); exit {status}; stderr:\n{stderr}"));
    let outcome = Outcome {
        report,
        exit: status.code(),
        faults,
        aimed,
        moved_on,
        seconds: started.elapsed().as_secs_f64(),
    };
    eprintln!(
        "{backend:?} {schedule:?}: {:.1} s, {} faults ({} on a long hold in c1), took effect {} times; {}",
        outcome.seconds,
        outcome.faults,
        outcome.aimed,
        outcome.moved_on,
        summary(&outcome.report)
    );
    outcome
}

/// The report's counts, without its lists.
fn summary(report: &Value) -> String {
    let mut counts = report.clone();
    if let Some(fields) = counts.as_object_mut() {
        fields.remove("overlaps");
        fields.insert(
            "violations".into(),
            report["violations"].as_array().map_or(0, Vec::len).into(),
        );
    }
    counts.to_string()
}

fn number(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing: {report}"))
}

/// Runs a scenario until `shown` finds what its faults must have done, at most [`ATTEMPTS`]
/// times, and checks the promises with `always` on every run: a run that keeps them but
/// whose partition struck at the wrong moment proves nothing, so it is run again; a run that
/// breaks one fails at once.
fn until_shown(
    backend: Backend,
    schedule: Schedule,
    extra: &[&str],
    always: impl Fn(&Outcome),
    shown: impl Fn(&Outcome) -> Result<(), String>,
) {
    let mut missed = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let outcome = run_scenario(backend, schedule, extra);
        always(&outcome);
        match shown(&outcome) {
            Ok(()) => return,
            Err(why) => {
                eprintln!("{backend:?} {schedule:?}: run {attempt} of {ATTEMPTS}: {why}");
                missed.push(why);
            }
        }
    }
    panic!(
        "{backend:?} {schedule:?}: no run of {ATTEMPTS} showed the fault's effect:\n{}",
        missed.join("\n")
    );
}

/// Fails with `why` unless `ok`.
fn shows(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// Promises 1, 2 and 3 on a consensus store (or Redlock): no overlap at all, no violation.
fn keeps_every_promise(backend: Backend, schedule: Schedule) {
    until_shown(backend, schedule, &[], promises_kept, |outcome| {
        let report = &outcome.report;
        shows(number(report, "acquisitions") >= 20, || {
            format!("fewer than 20 grants: {}", summary(report))
        })?;
        shows(outcome.faults >= 1, || "no partition was made".into())?;
        let must_take_effect = match schedule {
            Schedule::Delay => Some("no request from c1 was delayed by the forwarders"),
            Schedule::Lossy => Some("the lossy links dropped no packet"),
            Schedule::LeaderWithClients | Schedule::ClientFromMajority => Some(
                "no partition took effect (the majority never moved on, or c1 still reached the servers)",
            ),
            Schedule::Flapping => None,
        };
        if let Some(why) = must_take_effect {
            shows(outcome.moved_on >= 1, || why.into())?;
        }
        if matches!(
            schedule,
            Schedule::LeaderWithClients | Schedule::ClientFromMajority
        ) {
            // Promise 2 exercised: a holder cut off inside its hold was told.
            shows(outcome.aimed >= 1, || {
                "no partition struck a holder in c1".into()
            })?;
            shows(number(report, "losses_reported") >= 1, || {
                format!("no holder was told of a loss: {}", summary(report))
            })?;
        }
        Ok(())
    });
}

/// Promises 1, 2 and 3 as every run must keep them: no violation, no overlap that a fault
/// does not excuse, and a check that passed.
fn promises_kept(outcome: &Outcome) {
    let report = &outcome.report;
    let violations = report["violations"].as_array().cloned().unwrap_or_default();
    assert!(violations.is_empty(), "{report}");
    assert_eq!(outcome.exit, Some(0), "{report}");
    assert_eq!(number(report, "overlaps_unexcused"), 0, "{report}");
}

/// One test per deployment and schedule, each named for what it cuts; the doc says which
/// promises it checks.
macro_rules! scenarios {
    ($($(#[$doc:meta])* $name:ident => $backend:ident, $schedule:ident;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $name() {
            keeps_every_promise(Backend::$backend, Schedule::$schedule);
        }
    )*};
}

scenarios! {
    /// Promises 1, 2, 3: the ZooKeeper leader cut off with client host c1; the majority
    /// elects a leader, c1's sessions expire, and no two workers ever hold at once.
    zookeeper_leader_cut_off_with_its_clients => ZooKeeper, LeaderWithClients;
    /// Promises 1, 2, 3: client host c1 cut off from the whole ensemble.
    zookeeper_client_cut_off_from_the_majority => ZooKeeper, ClientFromMajority;
    /// Promises 1, 2, 3: the leader and c1 cut off and healed every second.
    zookeeper_flapping_links => ZooKeeper, Flapping;
    /// Promises 1, 2, 3: the etcd leader cut off with client host c1.
    etcd_leader_cut_off_with_its_clients => Etcd, LeaderWithClients;
    /// Promises 1, 2, 3: client host c1 cut off from the whole etcd cluster.
    etcd_client_cut_off_from_the_majority => Etcd, ClientFromMajority;
    /// Promises 1, 2, 3: the etcd leader and c1 cut off and healed every second.
    etcd_flapping_links => Etcd, Flapping;
    /// Promises 1, 2, 3: one Redlock master cut off with client host c1, which then
    /// reaches one master of three and so can hold nothing.
    redlock_one_master_cut_off_with_its_clients => Redlock, LeaderWithClients;
    /// Promises 1, 2, 3: client host c1 cut off from every Redlock master.
    redlock_client_cut_off_from_the_masters => Redlock, ClientFromMajority;
    /// Promises 1, 2, 3: one Redlock master and c1 cut off and healed every second.
    redlock_flapping_links => Redlock, Flapping;
    /// Promises 1, 2, 3: c1's links to the ensemble delayed by 200 ms each way, 7 s at a
    /// time, with a long hold in c1 when each delay begins.
    zookeeper_client_links_delayed => ZooKeeper, Delay;
    /// Promises 1, 2, 3: c1's links to the etcd cluster delayed, as above.
    etcd_client_links_delayed => Etcd, Delay;
    /// Promises 1, 2, 3: c1's links to the Redlock masters delayed, as above: its grants'
    /// validity shrinks by the round trips.
    redlock_client_links_delayed => Redlock, Delay;
    /// Promises 1, 2, 3 on Redis Sentinel without a failover: client host c1 cut off from
    /// every server; its holder must be told before c2's workers are granted the lock by the
    /// same master, so not even the overlaps Sentinel's limits allow may appear.
    sentinel_client_cut_off_from_the_servers => Sentinel, ClientFromMajority;
    /// Promises 1, 2, 3: 30% of the packets between the ZooKeeper leader with c1 and the
    /// rest dropped, 7 s at a time.
    zookeeper_lossy_links => ZooKeeper, Lossy;
    /// Promises 1, 2, 3: 30% of the packets between the etcd leader with c1 and the rest
    /// dropped, 7 s at a time.
    etcd_lossy_links => Etcd, Lossy;
}

/// The Sentinel scenarios' common verdict: promise 3 and the fenced register hold (no
/// unfenced violation), while promise 1 has its documented limit (asynchronous
/// replication), so the overlaps of a failover are reported, not failed.
fn fencing_covers_the_overlaps(outcome: &Outcome) {
    let report = &outcome.report;
    assert_eq!(number(report, "unfenced_violations"), 0, "{report}");
    let violations = report["violations"].as_array().cloned().unwrap_or_default();
    assert!(violations.is_empty(), "{report}");
    assert_eq!(outcome.exit, Some(0), "{report}");
    assert!(
        report["overlap_limit"]
            .as_str()
            .is_some_and(|l| l.contains("asynchronous")),
        "{report}"
    );
}

/// What every Sentinel run must have done to count: enough grants and a partition made.
fn ran_with_faults(outcome: &Outcome) -> Result<(), String> {
    shows(number(&outcome.report, "acquisitions") >= 20, || {
        format!("fewer than 20 grants: {}", summary(&outcome.report))
    })?;
    shows(outcome.faults >= 1, || "no partition was made".into())
}

/// Promise 3 and fencing where promise 1 has its documented limit: the Redis master cut off
/// with client host c1. The Sentinels on the majority side promote the replica, which grants
/// the lock again while c1's workers still hold it on the old master: the check must show
/// that double grant (overlaps no fault explains) and the register must refuse the stale
/// writes (0 unfenced violations).
#[test]
fn sentinel_master_cut_off_with_its_clients_grants_twice_and_fencing_refuses_the_stale_writes() {
    until_shown(
        Backend::Sentinel,
        Schedule::LeaderWithClients,
        &[],
        fencing_covers_the_overlaps,
        |outcome| {
            ran_with_faults(outcome)?;
            shows(outcome.moved_on >= 1, || {
                "the Sentinels never failed over".into()
            })?;
            shows(number(&outcome.report, "overlaps_unexcused") >= 1, || {
                format!(
                    "the failover's double grant was not shown: {}",
                    summary(&outcome.report)
                )
            })
        },
    );
}

/// Promise 3 and fencing under flapping links between the Redis master (with c1) and the
/// rest: failovers may come and go; fencing must cover whatever overlaps they make.
#[test]
fn sentinel_flapping_links_stay_fenced() {
    until_shown(
        Backend::Sentinel,
        Schedule::Flapping,
        &[],
        fencing_covers_the_overlaps,
        ran_with_faults,
    );
}

/// The check can fail: the same failover with workers that write the register without
/// their fencing tokens (a resource that does not check them) loses updates, and the check
/// reports them as unfenced violations and exits 1.
#[test]
fn sentinel_double_grant_without_fencing_loses_updates() {
    until_shown(
        Backend::Sentinel,
        Schedule::LeaderWithClients,
        &["--unfenced", "--hold-us", "2000"],
        |outcome| {
            // A run that lost an update must fail the check.
            if number(&outcome.report, "unfenced_violations") >= 1 {
                assert_eq!(outcome.exit, Some(1), "{}", summary(&outcome.report));
            }
        },
        |outcome| {
            let report = &outcome.report;
            shows(number(report, "overlaps_unexcused") >= 1, || {
                format!("no double grant: {}", summary(report))
            })?;
            shows(number(report, "unfenced_violations") >= 1, || {
                format!("no update lost: {}", summary(report))
            })
        },
    );
}

/// The check can fail across the lab's hosts: promise 1 on `memory://`, a lock that is not
/// distributed (each worker process has its own), with workers on both client hosts, gives
/// overlaps and unfenced violations (tokens granted twice), and the check exits 1.
#[test]
fn a_lock_that_is_not_distributed_fails_across_hosts() {
    let lab = Lab::new("mem", &CLIENTS);
    let out = lab.dir("check").join("stdout");
    let mut command = lab.command("c2", BIN);
    command
        .args([
            "check",
            "--backend",
            "memory://lab",
            "--allow-unshared",
            "--json",
            "--faults",
            "none",
        ])
        .args(["--duration-s", "3", "--workers", "2"])
        .args([
            "--worker-netns",
            &lab.ns("c1"),
            "--worker-netns",
            &lab.ns("c2"),
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("the check's output"))
        .stderr(Stdio::null());
    let mut check = KillOnDrop(command.spawn().expect("run distlock check"));
    let deadline = Instant::now() + CHECK_GRACE;
    let status = loop {
        if let Some(status) = check.0.try_wait().expect("wait for the check") {
            break status;
        }
        assert!(Instant::now() < deadline, "the check did not end");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let report: Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    assert_eq!(status.code(), Some(1), "{}", summary(&report));
    assert!(
        number(&report, "overlaps_unexcused") >= 1,
        "{}",
        summary(&report)
    );
    assert!(
        number(&report, "unfenced_violations") >= 1,
        "{}",
        summary(&report)
    );
}
