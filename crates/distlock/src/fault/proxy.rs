//! A loopback TCP proxy that injects faults into the requests it carries: the faults of the
//! network between a client and its server, in the middle of a request.
//!
//! The proxy knows nothing of the protocol it carries. A *request* is what the client writes
//! in one go, and its *reply* is what the server writes back next, which is what a client with
//! one request in flight on a connection sees.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use distlock::fault::FaultProxy;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! // An echo server stands in for the real one.
//! let server = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server_address = server.local_addr()?;
//! tokio::spawn(async move {
//!     while let Ok((mut stream, _)) = server.accept().await {
//!         tokio::spawn(async move {
//!             let mut buffer = [0u8; 64];
//!             while let Ok(n @ 1..) = stream.read(&mut buffer).await {
//!                 let _ = stream.write_all(&buffer[..n]).await;
//!             }
//!         });
//!     }
//! });
//!
//! let proxy = FaultProxy::start(server_address).await?;
//! let mut client = tokio::net::TcpStream::connect(proxy.address()).await?;
//! proxy.lose_next_reply();
//! client.write_all(b"ping").await?;
//! // The server got the request and answered; the client sees its connection cut instead.
//! let mut buffer = [0u8; 4];
//! assert!(!matches!(client.read(&mut buffer).await, Ok(4)));
//! assert_eq!(proxy.replies_lost(), 1);
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// How the proxy forwards what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// At once.
    Pass,
    /// After a pause, both ways.
    Delay(Duration),
    /// Not at all, both ways, until healed: what it read is held, as TCP would retransmit it.
    Blackhole,
}

/// Picks the requests whose replies [`FaultProxy::lose_reply_of_next`] loses.
type RequestFilter = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

struct Shared {
    target: SocketAddr,
    mode: watch::Sender<Mode>,
    /// How many of the next requests lose their replies.
    lose_replies: AtomicU64,
    /// The next request the first of these accepts loses its reply; then the next one.
    lose_matching: StdMutex<VecDeque<RequestFilter>>,
    replies_lost: AtomicU64,
    requests: AtomicU64,
    /// Bumped by [`FaultProxy::reset`]: every connection open then is cut.
    resets: watch::Sender<u64>,
    /// Set by [`FaultProxy::partition`]: new connections are closed at once.
    refusing: AtomicBool,
    /// Set by [`FaultProxy::lose_next_reply_then_partition`]: the next lost reply partitions.
    partition_on_loss: AtomicBool,
    connections: AtomicU64,
    accepted: AtomicU64,
}

/// A TCP proxy on a loopback port in front of one server, with faults the caller turns on
/// and off while clients use it. Dropping it stops it and cuts every connection it carries.
pub struct FaultProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("address", &self.address)
            .field("target", &self.shared.target)
            .field("mode", &*self.shared.mode.borrow())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.resets.send_modify(|n| *n += 1);
    }
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `target`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        FaultProxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target).await
    }

    /// Listens on `listen` (a loopback address, port 0 for a free one) and forwards every
    /// connection to `target`.
    ///
    /// # Errors
    /// When `listen` cannot be bound.
    pub async fn start_on(listen: SocketAddr, target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(listen).await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            mode: watch::Sender::new(Mode::Pass),
            lose_replies: AtomicU64::new(0),
            lose_matching: StdMutex::new(VecDeque::new()),
            replies_lost: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            resets: watch::Sender::new(0),
            refusing: AtomicBool::new(false),
            partition_on_loss: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            address,
            shared,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The server's address.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// The next request, on whichever connection, reaches the server; its reply does not
    /// reach the client, whose connection is cut as soon as the reply starts: the client
    /// cannot know whether the request took effect.
    pub fn lose_next_reply(&self) {
        self.shared.lose_replies.fetch_add(1, Ordering::SeqCst);
    }

    /// As [`lose_next_reply`](Self::lose_next_reply), and the moment the reply is lost the
    /// proxy partitions ([`partition`](Self::partition)) until healed: a server that ran the
    /// request and then went away, so that the client can neither learn the outcome nor undo
    /// it until the test heals the proxy.
    pub fn lose_next_reply_then_partition(&self) {
        self.shared.partition_on_loss.store(true, Ordering::SeqCst);
        self.lose_next_reply();
    }

    /// As [`lose_next_reply`](Self::lose_next_reply), for the next request that `filter`
    /// accepts (it sees the bytes the client wrote in one go): to lose the reply of one kind
    /// of request of a protocol the test knows. Called several times, the filters take
    /// turns: the second waits until the first has lost its reply.
    pub fn lose_reply_of_next(&self, filter: impl Fn(&[u8]) -> bool + Send + Sync + 'static) {
        self.shared
            .lose_matching
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Box::new(filter));
    }

    /// Everything read either way waits `delay` before it is forwarded.
    pub fn delay(&self, delay: Duration) {
        self.shared.mode.send_replace(Mode::Delay(delay));
    }

    /// Nothing passes either way until [`heal`](Self::heal); connections stay open, so a
    /// client sees a server that stopped answering (a partition), not a closed connection.
    pub fn blackhole(&self) {
        self.shared.mode.send_replace(Mode::Blackhole);
    }

    /// Cuts every open connection and closes new ones at once until [`heal`](Self::heal):
    /// a server that went away (its host down, a firewall that rejects).
    pub fn partition(&self) {
        self.shared.refusing.store(true, Ordering::SeqCst);
        self.reset();
    }

    /// Forwards at once again, delivers what a blackhole held, and accepts connections again.
    pub fn heal(&self) {
        self.shared.refusing.store(false, Ordering::SeqCst);
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// Cuts every open connection with a reset; new connections are accepted as before.
    pub fn reset(&self) {
        self.shared.resets.send_modify(|n| *n += 1);
    }

    /// How many replies [`lose_next_reply`](Self::lose_next_reply) kept from the client: lets
    /// a test assert that its fault happened.
    pub fn replies_lost(&self) -> u64 {
        self.shared.replies_lost.load(Ordering::SeqCst)
    }

    /// How many requests clients wrote through the proxy.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// How many connections the proxy carried so far (refused ones not counted).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many connections are open through the proxy now.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, most likely: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(carry(client, shared.clone()));
    }
}

/// Carries one connection until either side closes it, a reset cuts it, or a lost reply
/// dooms it.
async fn carry(client: TcpStream, shared: Arc<Shared>) {
    if shared.refusing.load(Ordering::SeqCst) {
        return;
    }
    let mut resets = shared.resets.subscribe();
    resets.borrow_and_update();
    let Ok(server) = TcpStream::connect(shared.target).await else {
        // The server refused: so does the proxy (the client sees its connection close).
        return;
    };
    for stream in [&client, &server] {
        // A cut is a reset, as a crashed peer or a middlebox would send, not a clean close.
        let _ = stream.set_zero_linger();
        let _ = stream.set_nodelay(true);
    }
    shared.connections.fetch_add(1, Ordering::SeqCst);
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let doomed = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(Notify::new());
    let requests = pump(
        client_read,
        server_write,
        Direction::Request,
        shared.clone(),
        doomed.clone(),
        cut.clone(),
    );
    let replies = pump(
        server_read,
        client_write,
        Direction::Reply,
        shared.clone(),
        doomed,
        cut.clone(),
    );
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
        _ = cut.notified() => {}
        _ = resets.changed() => {}
    }
    shared.connections.fetch_sub(1, Ordering::SeqCst);
    // Dropping the halves closes both sockets.
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

/// Forwards one direction of a connection, applying the proxy's mode to every chunk.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    shared: Arc<Shared>,
    doomed: Arc<AtomicBool>,
    cut: Arc<Notify>,
) {
    let mut mode = shared.mode.subscribe();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if direction == Direction::Reply && doomed.load(Ordering::SeqCst) {
            if shared.partition_on_loss.swap(false, Ordering::SeqCst) {
                // Refusing before the cut: the client's reconnection finds it partitioned.
                shared.refusing.store(true, Ordering::SeqCst);
                shared.resets.send_modify(|n| *n += 1);
            }
            shared.replies_lost.fetch_add(1, Ordering::SeqCst);
            cut.notify_one();
            return;
        }
        // Wait as the mode says; a blackhole holds the chunk until it is healed.
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if direction == Direction::Request {
            shared.requests.fetch_add(1, Ordering::SeqCst);
            let matched = {
                let mut filters = shared
                    .lose_matching
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let matched = filters.front().is_some_and(|f| f(&buffer[..n]));
                if matched {
                    filters.pop_front();
                }
                matched
            };
            let lose = matched
                || shared
                    .lose_replies
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            if lose {
                doomed.store(true, Ordering::SeqCst);
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
