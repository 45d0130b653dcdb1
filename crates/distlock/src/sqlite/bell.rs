//! Doorbells: how a release wakes the waiter next in line, in whichever process it runs.
//!
//! SQLite cannot notify another process, so waiters would have to poll often to take a freed
//! lock quickly, and many waiters polling often use up the machine. Instead each
//! [`SqliteBackend`](super::SqliteBackend) handle binds a Unix datagram socket in Linux's
//! abstract namespace (no file; it goes away with the process), writes the socket's name into
//! its waiters' tickets, and a release sends the lock's name to the socket of the oldest live
//! ticket. The handle's listener wakes its waiters for that lock, which then look as before.
//!
//! A ring is a hint, never needed for correctness: one that is lost (a full socket buffer, a
//! waiter that left) is made up for by the waiters' slow polling, which also notices a lease
//! that expired. Elsewhere than Linux there are no bells and waiters poll closely.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::Notify;

/// The waiters of one backend handle, by lock name.
#[derive(Debug, Default)]
struct Rings {
    by_lock: StdMutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Rings {
    fn by_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Notify>, usize)>> {
        self.by_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring(&self, lock: &str) {
        if let Some((notify, _)) = self.by_lock().get(lock) {
            notify.notify_waiters();
        }
    }
}

/// One handle's doorbell: its socket's name, its listener, and a socket to ring others with.
#[derive(Debug)]
pub(crate) struct Bell {
    name: String,
    rings: Arc<Rings>,
    #[cfg(target_os = "linux")]
    sender: std::os::unix::net::UnixDatagram,
    #[cfg(target_os = "linux")]
    listener: tokio::task::JoinHandle<()>,
}

#[cfg(target_os = "linux")]
impl Drop for Bell {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// A waiter's registration: woken when its lock is rung.
#[derive(Debug)]
pub(crate) struct Listener {
    rings: Arc<Rings>,
    lock: String,
    notify: Arc<Notify>,
}

impl Listener {
    /// True when no other waiter of this handle waits for this lock: a ring for it is for
    /// this one.
    pub(crate) fn alone(&self) -> bool {
        self.rings
            .by_lock()
            .get(&self.lock)
            .is_none_or(|(_, users)| *users <= 1)
    }

    /// What a ring for this lock notifies. Enable a `notified()` of it before looking at the
    /// lock, so that a ring between the look and the wait is not lost.
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut by_lock = self.rings.by_lock();
        if let Some((_, users)) = by_lock.get_mut(&self.lock) {
            *users -= 1;
            if *users == 0 {
                by_lock.remove(&self.lock);
            }
        }
    }
}

/// The longest lock name a ring carries (lock names are at most 1024 bytes).
#[cfg(target_os = "linux")]
const MAX_RING: usize = 2048;

impl Bell {
    /// Binds a new bell and starts its listener; `None` where bells are not supported or the
    /// socket cannot be made (the waiters then poll).
    pub(crate) fn open() -> Option<Arc<Bell>> {
        match Self::try_open() {
            Ok(bell) => Some(Arc::new(bell)),
            Err(error) => {
                tracing::debug!(%error, "no doorbell for SQLite waiters; they poll");
                None
            }
        }
    }

    #[cfg(target_os = "linux")]
    fn try_open() -> std::io::Result<Bell> {
        let name = format!(
            "distlock/sqlite-bell/{}/{:016x}",
            std::process::id(),
            fastrand::u64(..)
        );
        let socket = std::os::unix::net::UnixDatagram::bind_addr(&address(&name)?)?;
        socket.set_nonblocking(true)?;
        let socket = tokio::net::UnixDatagram::from_std(socket)?;
        let sender = std::os::unix::net::UnixDatagram::unbound()?;
        sender.set_nonblocking(true)?;
        let rings = Arc::new(Rings::default());
        let listener = tokio::spawn(listen(socket, rings.clone()));
        Ok(Bell {
            name,
            rings,
            sender,
            listener,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn try_open() -> std::io::Result<Bell> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "doorbells use Linux's abstract socket namespace",
        ))
    }

    /// The name that waiters' tickets carry.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Registers a waiter for `lock`.
    pub(crate) fn listen(&self, lock: &str) -> Listener {
        let mut by_lock = self.rings.by_lock();
        let (notify, users) = by_lock
            .entry(lock.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        *users += 1;
        Listener {
            rings: self.rings.clone(),
            lock: lock.to_owned(),
            notify: notify.clone(),
        }
    }

    /// Tells the bell named `to` that `lock` was freed. Best effort and non-blocking.
    pub(crate) fn ring(&self, to: &str, lock: &str) {
        if to == self.name {
            self.rings.ring(lock);
            return;
        }
        #[cfg(target_os = "linux")]
        if let Err(error) = address(to).and_then(|a| self.sender.send_to_addr(lock.as_bytes(), &a))
        {
            // The waiter's process is gone or its buffer is full: polling covers it.
            tracing::trace!(%error, to, "a doorbell did not ring");
        }
    }
}

#[cfg(target_os = "linux")]
fn address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// Wakes the waiters of each lock rung, until the bell is dropped.
#[cfg(target_os = "linux")]
async fn listen(socket: tokio::net::UnixDatagram, rings: Arc<Rings>) {
    let mut buffer = vec![0; MAX_RING];
    loop {
        match socket.recv(&mut buffer).await {
            Ok(len) => {
                if let Ok(lock) = std::str::from_utf8(&buffer[..len]) {
                    rings.ring(lock);
                }
            }
            Err(error) => {
                tracing::debug!(%error, "the doorbell stopped listening; waiters poll");
                return;
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A ring from one handle's bell reaches the waiters of that lock at another's, and only
    /// those; a ring to a bell that is gone is dropped quietly.
    #[tokio::test]
    async fn a_ring_wakes_the_waiters_of_that_lock_only() {
        let (waiting, releasing) = (Bell::open().unwrap(), Bell::open().unwrap());
        assert_ne!(waiting.name(), releasing.name());
        let for_a = waiting.listen("a");
        let for_b = waiting.listen("b");
        let (notify_a, notify_b) = (for_a.notify(), for_b.notify());
        let (rung_a, rung_b) = (notify_a.notified(), notify_b.notified());
        tokio::pin!(rung_a, rung_b);
        rung_a.as_mut().enable();
        rung_b.as_mut().enable();
        releasing.ring(waiting.name(), "a");
        tokio::time::timeout(Duration::from_secs(5), &mut rung_a)
            .await
            .expect("the ring for a did not arrive");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut rung_b)
                .await
                .is_err(),
            "a ring for a woke the waiters of b"
        );
        // A handle rings its own waiters without a datagram.
        let rung_b_locally = notify_b.notified();
        tokio::pin!(rung_b_locally);
        rung_b_locally.as_mut().enable();
        waiting.ring(waiting.name(), "b");
        tokio::time::timeout(Duration::from_secs(5), rung_b_locally)
            .await
            .expect("a local ring did not arrive");
        let gone = Bell::open().unwrap();
        let gone_name = gone.name().to_owned();
        drop(gone);
        releasing.ring(&gone_name, "a");
        // Listeners leave the map when dropped.
        drop((for_a, for_b));
        assert!(waiting.rings.by_lock().is_empty());
    }
}
