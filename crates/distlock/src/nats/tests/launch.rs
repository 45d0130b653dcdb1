//! NATS servers a test starts for itself (Debian's `nats-server`, which `scripts/test`
//! installs): a server that requires a login or TLS, or a 3-node JetStream cluster, each on
//! free loopback ports with its files in a temporary directory. The servers are children of
//! the test and end with it, by their PID.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `count` distinct free TCP ports on 127.0.0.1, each held until all are chosen (then given
/// back for the servers to bind).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1"))
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().expect("its address").port())
        .collect()
}

fn answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// One `nats-server` process and its configuration.
pub(super) struct Node {
    pub(super) name: String,
    pub(super) port: u16,
    config: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) {
        assert!(self.child.is_none(), "{} runs already", self.name);
        let log = std::fs::File::create(self.config.with_extension("log")).expect("the log");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server (scripts/test installs Debian's nats-server)");
        self.child = Some(child);
        let began = Instant::now();
        while !answers(self.port) {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "nats-server {} did not listen on {}; see {}",
                self.name,
                self.port,
                self.config.with_extension("log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends the server with SIGKILL, by its PID.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Servers of one test, with their directory.
pub(super) struct Servers {
    pub(super) nodes: Vec<Node>,
    pub(super) dir: tempfile::TempDir,
}

impl Servers {
    /// The `host:port` list of every node, for a URL.
    pub(super) fn hosts(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(super) fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Starts node `index` again after [`Node::kill`], with its store as it was.
    pub(super) fn restart(&mut self, index: usize) {
        self.nodes[index].start();
    }

    /// One server with JetStream and, in its configuration, what `extra` returns
    /// (`authorization`, `tls`) given the servers' directory.
    pub(super) fn single(extra: impl FnOnce(&Path) -> String) -> Servers {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_ports(1)[0];
        let config = dir.path().join("n1.conf");
        let extra = extra(dir.path());
        write(
            &config,
            &format!(
                "server_name: n1\nlisten: 127.0.0.1:{port}\njetstream {{ store_dir: {store:?} }}\n{extra}\n",
                store = dir.path().join("n1"),
            ),
        );
        let mut node = Node {
            name: "n1".into(),
            port,
            config,
            child: None,
        };
        node.start();
        Servers {
            nodes: vec![node],
            dir,
        }
    }

    /// A JetStream cluster of three nodes, `n1` to `n3`.
    pub(super) fn cluster() -> Servers {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let free = free_ports(6);
        let ports: Vec<(u16, u16)> = free.chunks(2).map(|pair| (pair[0], pair[1])).collect();
        let mut nodes = Vec::new();
        for (i, (port, route)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let routes = ports
                .iter()
                .filter(|(_, other)| other != route)
                .map(|(_, other)| format!("nats-route://127.0.0.1:{other}"))
                .collect::<Vec<_>>()
                .join(", ");
            let config = dir.path().join(format!("{name}.conf"));
            write(
                &config,
                &format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{port}\n\
                     jetstream {{ store_dir: {store:?} }}\n\
                     cluster {{ name: distlock-tests\n listen: 127.0.0.1:{route}\n routes: [{routes}] }}\n",
                    store = dir.path().join(&name),
                ),
            );
            nodes.push(Node {
                name,
                port: *port,
                config,
                child: None,
            });
        }
        for node in &mut nodes {
            node.start();
        }
        Servers { nodes, dir }
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A CA (`ca.pem`), a server certificate it signed for 127.0.0.1 (`server.pem`,
/// `server-key.pem`), and a CA that signed nothing (`other-ca.pem`), made by `openssl` in
/// `dir`.
pub(super) fn certificates(dir: &Path) {
    for (name, subject) in [("ca", "test-ca"), ("other-ca", "other-ca")] {
        openssl(
            dir,
            &format!(
                "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=distlock-nats-{subject} \
                 -keyout {name}.key -out {name}.pem"
            ),
        );
    }
    signed(dir, "server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
}

/// A client certificate (`client.pem`, `client-key.pem`) signed by the CA of
/// [`certificates`].
pub(super) fn client_certificate(dir: &Path) {
    signed(dir, "client", "app", "extendedKeyUsage=clientAuth\n");
}

/// `NAME.pem` and `NAME-key.pem` for `common_name`, signed by `ca.pem` with `extensions`.
fn signed(dir: &Path, name: &str, common_name: &str, extensions: &str) {
    openssl(
        dir,
        &format!(
            "req -newkey rsa:2048 -nodes -subj /CN={common_name} -keyout {name}-key.pem \
             -out {name}.csr"
        ),
    );
    write(&dir.join(format!("{name}.ext")), extensions);
    openssl(
        dir,
        &format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
             -extfile {name}.ext -out {name}.pem"
        ),
    );
}

fn openssl(dir: &Path, args: &str) {
    let output = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("run openssl (scripts/test installs it)");
    assert!(
        output.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
