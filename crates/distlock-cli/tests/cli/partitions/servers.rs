//! The deployments of the partition scenarios, each server on a lab host of its own: a
//! ZooKeeper ensemble, an etcd cluster, a Redis master and replica with three Sentinels, and
//! three independent Redis masters for Redlock. What each server needs is what
//! scripts/zookeeper-deployment, scripts/etcd-deployment and scripts/redis-deployment know,
//! bound to the hosts' lab addresses instead of 127.0.0.1.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::lab::Lab;

/// How long a deployment may take to be ready on a loaded machine.
const READY: Duration = Duration::from_secs(40);

/// A deployment running in a lab.
pub struct Deployment {
    /// The backend URL the workers use (the lab's addresses).
    pub url: String,
    /// The hosts of its servers, in order.
    pub servers: Vec<&'static str>,
}

/// Runs `bash -c script` in `host` with a time limit; its output when it succeeded.
fn shell(lab: &Lab, host: &str, script: &str) -> Option<String> {
    let output = lab
        .command(host, "timeout")
        .args(["3", "bash", "-c", script])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A ZooKeeper four-letter word's answer from `host`'s server.
fn zk_word(lab: &Lab, host: &str, word: &str) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/{}/2181 && echo {word} >&3 && cat <&3",
        lab.ip(host)
    );
    shell(lab, host, &script).unwrap_or_default()
}

/// Three ZooKeeper servers on `hosts` (one ensemble, tickTime 500 ms as
/// scripts/zookeeper-deployment has it, so that 2 s sessions are allowed).
pub fn zookeeper(lab: &mut Lab, hosts: [&'static str; 3]) -> Deployment {
    let jar = "/usr/share/java/zookeeper.jar";
    assert!(
        std::path::Path::new(jar).exists(),
        "{jar} is missing: install Debian's zookeeper package (scripts/test does)"
    );
    let peers: Vec<String> = hosts
        .iter()
        .enumerate()
        .map(|(i, host)| format!("server.{}={}:2888:3888", i + 1, lab.ip(host)))
        .collect();
    for (i, host) in hosts.iter().enumerate() {
        let dir = lab.dir(&format!("zk-{host}"));
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("a data directory");
        std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
        let config = format!(
            "tickTime=500\ninitLimit=20\nsyncLimit=4\ndataDir={}\nclientPort=2181\n\
             clientPortAddress={}\nmaxClientCnxns=1000\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,stat,mntr\n{}\n",
            data.display(),
            lab.ip(host),
            peers.join("\n")
        );
        let cfg = dir.join("zoo.cfg");
        std::fs::write(&cfg, config).expect("zoo.cfg");
        let mut command = lab.command(host, "java");
        command
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-cp"])
            .arg(format!("/etc/zookeeper/conf:{jar}"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&cfg);
        lab.spawn(host, "ZooKeeper", command, &dir.join("server.log"));
    }
    lab.wait_for("the ZooKeeper ensemble", READY, |lab| {
        hosts.iter().all(|host| {
            let reply = zk_word(lab, host, "srvr");
            reply.contains("Mode: leader") || reply.contains("Mode: follower")
        })
    });
    let url: Vec<String> = hosts
        .iter()
        .map(|h| format!("{}:2181", lab.ip(h)))
        .collect();
    Deployment {
        url: format!("zk://{}/?session_timeout=2s", url.join(",")),
        servers: hosts.to_vec(),
    }
}

/// The host of the ZooKeeper ensemble's leader, if one answers so.
pub fn zookeeper_leader(lab: &Lab, deployment: &Deployment) -> Option<&'static str> {
    deployment
        .servers
        .iter()
        .copied()
        .find(|host| zk_word(lab, host, "srvr").contains("Mode: leader"))
}

/// Three etcd members on `hosts`, one cluster.
pub fn etcd(lab: &mut Lab, hosts: [&'static str; 3]) -> Deployment {
    let initial: Vec<String> = hosts
        .iter()
        .map(|host| format!("{host}=http://{}:2380", lab.ip(host)))
        .collect();
    let initial = initial.join(",");
    for host in hosts {
        let dir = lab.dir(&format!("etcd-{host}"));
        let ip = lab.ip(host);
        let mut command = lab.command(host, "etcd");
        command
            .args(["--name", host, "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &format!("http://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
            ])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "distlock-lab"]);
        lab.spawn(host, "etcd", command, &dir.join("server.log"));
    }
    let endpoints: Vec<String> = hosts
        .iter()
        .map(|h| format!("{}:2379", lab.ip(h)))
        .collect();
    lab.wait_for("the etcd cluster", READY, |lab| {
        hosts.iter().all(|host| {
            let script = format!(
                "ETCDCTL_API=3 etcdctl --endpoints=http://{}:2379 --command-timeout=2s endpoint health",
                lab.ip(host)
            );
            shell(lab, host, &script).is_some()
        })
    });
    Deployment {
        url: format!("etcd://{}/?lease_ttl=2s", endpoints.join(",")),
        servers: hosts.to_vec(),
    }
}

/// The host of the etcd cluster's leader, if the members agree on one.
pub fn etcd_leader(lab: &Lab, deployment: &Deployment) -> Option<&'static str> {
    deployment.servers.iter().copied().find(|host| {
        let script = format!(
            "ETCDCTL_API=3 etcdctl --endpoints=http://{}:2379 --command-timeout=2s endpoint status -w json",
            lab.ip(host)
        );
        let Some(json) = shell(lab, host, &script) else {
            return false;
        };
        let Ok(status) = serde_json::from_str::<serde_json::Value>(&json) else {
            return false;
        };
        let status = &status[0]["Status"];
        status["leader"].as_u64().is_some()
            && status["leader"].as_u64() == status["header"]["member_id"].as_u64()
    })
}

/// A redis-server on `host`'s lab address, port 6379, keeping nothing on disk.
fn redis_server(lab: &mut Lab, host: &str, extra: &[&str]) {
    let dir = lab.dir(&format!("redis-{host}"));
    let mut command = lab.command(host, "redis-server");
    command
        .args([
            "--bind",
            &lab.ip(host),
            "--port",
            "6379",
            "--protected-mode",
            "no",
        ])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .args(extra);
    lab.spawn(host, "redis-server", command, &dir.join("server.log"));
}

fn redis_cli(lab: &Lab, host: &str, target: &str, port: u16, args: &str) -> String {
    let script = format!("redis-cli -h {} -p {port} {args}", lab.ip(target));
    shell(lab, host, &script).unwrap_or_default()
}

/// A Redis master on `master`, its replica on `replica`, and a Sentinel (port 26379) on each
/// of `sentinels`, monitoring the service `distlock` with quorum 2 and a master silent for
/// 1 s taken as down (scripts/redis-deployment's settings).
pub fn sentinel(
    lab: &mut Lab,
    master: &'static str,
    replica: &'static str,
    sentinels: [&'static str; 3],
) -> Deployment {
    redis_server(lab, master, &[]);
    let master_ip = lab.ip(master);
    redis_server(lab, replica, &["--replicaof", &master_ip, "6379"]);
    for host in sentinels {
        let dir = lab.dir(&format!("sentinel-{host}"));
        let config = format!(
            "bind {}\nport 26379\nprotected-mode no\ndir {}\n\
             sentinel monitor distlock {master_ip} 6379 2\n\
             sentinel down-after-milliseconds distlock 1000\n\
             sentinel failover-timeout distlock 5000\n\
             sentinel parallel-syncs distlock 1\n",
            lab.ip(host),
            dir.display()
        );
        let file = dir.join("sentinel.conf");
        std::fs::write(&file, config).expect("sentinel.conf");
        let mut command = lab.command(host, "redis-server");
        command.arg(&file).arg("--sentinel");
        lab.spawn(host, "redis-sentinel", command, &dir.join("server.log"));
    }
    let replica_ip = lab.ip(replica);
    lab.wait_for("the Sentinel group", READY, |lab| {
        sentinels.iter().all(|host| {
            let replicas = redis_cli(lab, host, host, 26379, "sentinel replicas distlock");
            let peers = redis_cli(lab, host, host, 26379, "sentinel sentinels distlock");
            replicas.contains(&replica_ip) && peers.matches("26379").count() >= 2
        }) && redis_cli(lab, replica, replica, 6379, "info replication")
            .contains("master_link_status:up")
    });
    let addresses: Vec<String> = sentinels
        .iter()
        .map(|h| format!("{}:26379", lab.ip(h)))
        .collect();
    Deployment {
        url: format!("redis+sentinel://{}/distlock", addresses.join(",")),
        servers: vec![master, replica],
    }
}

/// The host of the master the Sentinel on `host` names now.
pub fn sentinel_master(lab: &Lab, host: &str, deployment: &Deployment) -> Option<&'static str> {
    let answer = redis_cli(
        lab,
        host,
        host,
        26379,
        "sentinel get-master-addr-by-name distlock",
    );
    let ip = answer.lines().next()?.trim().to_owned();
    deployment
        .servers
        .iter()
        .copied()
        .find(|server| lab.ip(server) == ip)
}

/// Three independent Redis masters on `hosts`, for Redlock.
pub fn redlock(lab: &mut Lab, hosts: [&'static str; 3]) -> Deployment {
    for host in hosts {
        redis_server(lab, host, &[]);
    }
    lab.wait_for("the Redlock masters", READY, |lab| {
        hosts
            .iter()
            .all(|host| redis_cli(lab, host, host, 6379, "ping").contains("PONG"))
    });
    let addresses: Vec<String> = hosts
        .iter()
        .map(|h| format!("{}:6379", lab.ip(h)))
        .collect();
    Deployment {
        url: format!("redlock://{}/", addresses.join(",")),
        servers: hosts.to_vec(),
    }
}

/// True when `distlock status` run on `client` gets an answer from the deployment.
pub fn answers(lab: &Lab, client: &str, url: &str) -> bool {
    let mut command: Command = lab.command(client, "timeout");
    command
        .args(["10", super::BIN, "status", "--backend", url, "lab-probe"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command.status().is_ok_and(|s| s.success())
}
