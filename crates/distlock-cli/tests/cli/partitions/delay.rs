//! Delaying forwarders on the lab's client hosts. The test kernel has no `netem`, so the lab
//! cannot delay packets; instead each client host runs distlock's
//! [`FaultProxy`](distlock::fault::FaultProxy) in front of every server, on 127.0.0.1 of its
//! own namespace (the same ports on every host, so one backend URL serves the workers of
//! every host), and the test delays one host's forwarders. Only client↔server links can be
//! delayed this way, and only for backends whose clients connect to the addresses their URL
//! names (not a Sentinel group, whose clients follow the addresses the Sentinels announce).

use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use distlock::fault::FaultProxy;
use tokio::sync::mpsc;

/// The first port the forwarders listen on, in every client host.
const FIRST_PORT: u16 = 20_000;

enum Order {
    Delay(Duration),
    Heal,
}

/// One client host's forwarders: a thread inside the host's namespace, running them.
struct HostForwarders {
    orders: Option<mpsc::UnboundedSender<Order>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The forwarders of every client host; stopped when dropped.
pub struct Forwarders {
    hosts: Vec<(String, HostForwarders)>,
}

impl Forwarders {
    /// Starts, in each namespace of `hosts` (name, namespace), a forwarder to each of
    /// `targets`, and answers them with the address each target has through them
    /// (127.0.0.1 of whichever client host).
    pub fn start(hosts: &[(&str, String)], targets: &[SocketAddr]) -> (Forwarders, Vec<String>) {
        let through: Vec<String> = (0..targets.len())
            .map(|i| format!("127.0.0.1:{}", FIRST_PORT + i as u16))
            .collect();
        let mut forwarders = Forwarders { hosts: Vec::new() };
        for (name, ns) in hosts {
            let (orders, mut received) = mpsc::unbounded_channel();
            let (ready, started) = std::sync::mpsc::channel();
            let ns = ns.clone();
            let targets = targets.to_vec();
            let thread = std::thread::spawn(move || {
                let entered = std::fs::File::open(format!("/run/netns/{ns}")).and_then(|file| {
                    // SAFETY: setns with a namespace file this thread holds open; it moves this
                    // thread alone into the namespace, so the sockets made below are there.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
                if let Err(error) = entered {
                    let _ = ready.send(Err(format!("cannot enter {ns}: {error}")));
                    return;
                }
                // One thread: every socket of the forwarders is made on it, in the namespace.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = ready.send(Err(format!("no runtime: {error}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut proxies = Vec::new();
                    for (i, target) in targets.iter().enumerate() {
                        let listen = SocketAddr::from(([127, 0, 0, 1], FIRST_PORT + i as u16));
                        match FaultProxy::start_on(listen, *target).await {
                            Ok(proxy) => proxies.push(proxy),
                            Err(error) => {
                                let _ =
                                    ready.send(Err(format!("cannot listen on {listen}: {error}")));
                                return;
                            }
                        }
                    }
                    let _ = ready.send(Ok(()));
                    while let Some(order) = received.recv().await {
                        for proxy in &proxies {
                            match order {
                                Order::Delay(delay) => proxy.delay(delay),
                                Order::Heal => proxy.heal(),
                            }
                        }
                    }
                });
            });
            let started = started
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|e| Err(format!("no answer: {e}")));
            forwarders.hosts.push((
                (*name).to_owned(),
                HostForwarders {
                    orders: Some(orders),
                    thread: Some(thread),
                },
            ));
            if let Err(error) = started {
                panic!("the forwarders of {name}: {error}");
            }
        }
        (forwarders, through)
    }

    fn order(&self, host: &str, order: impl Fn() -> Order) {
        for (name, forwarders) in &self.hosts {
            if name == host
                && let Some(orders) = &forwarders.orders
            {
                let _ = orders.send(order());
            }
        }
    }

    /// Everything between `host`'s workers and the servers waits `delay` each way.
    pub fn delay(&self, host: &str, delay: Duration) {
        self.order(host, || Order::Delay(delay));
    }

    /// No delay on `host`'s links again.
    pub fn heal(&self, host: &str) {
        self.order(host, || Order::Heal);
    }
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        for (_, forwarders) in &mut self.hosts {
            // Closing the channel ends the thread's loop, and with it its forwarders.
            forwarders.orders = None;
            if let Some(thread) = forwarders.thread.take() {
                let _ = thread.join();
            }
        }
    }
}
