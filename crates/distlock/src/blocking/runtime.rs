//! The runtime a blocking client runs its requests on: a Tokio runtime owned by a thread of
//! its own, shared by every handle and guard made from the client, stopped when the last of
//! them is dropped.

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::mpsc;

use crate::error::{Error, Result};

/// The worker threads of a blocking client's runtime: renewals, wake-ups and the requests
/// of the calling threads run there.
const WORKER_THREADS: usize = 2;

/// How long the runtime's thread, once the last handle and guard of its client are gone,
/// waits for the work they left in the background (the releases of dropped guards) before it
/// stops the runtime. Whatever has not finished by then is dropped: its locks free when their
/// leases end.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long stopping the runtime then waits for blocking work (SQLite's statements).
const STOP_LIMIT: Duration = Duration::from_secs(1);

/// What errors call the backend before it is known.
const UNKNOWN_BACKEND: &str = "the blocking client's";

/// The identity of the next runtime started (0 is none).
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// On the threads of a blocking client's runtime, that runtime's identity (0 elsewhere):
    /// such a thread must never wait for its own runtime, neither for a request (the request
    /// could be queued behind the waiting thread itself) nor for the runtime to stop.
    static RUNTIME_OF_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// True on a thread of runtime `id`.
fn on_runtime(id: u64) -> bool {
    RUNTIME_OF_THREAD.try_with(Cell::get).unwrap_or(0) == id
}

/// A Tokio runtime on a thread of its own. Dropping the last `Arc` of it stops the runtime
/// after [`SHUTDOWN_GRACE`] at most, and waits for its thread to end.
pub(crate) struct Runtime {
    /// Tells this runtime's threads apart from other runtimes'.
    id: u64,
    handle: tokio::runtime::Handle,
    /// The backend's scheme, for the errors of requests the runtime could not answer; unset
    /// until the backend is known.
    scheme: OnceLock<&'static str>,
    /// Dropped to tell the runtime's thread to stop.
    stop: Option<std_mpsc::Sender<()>>,
    /// Never sent on: every background task holds a clone, and the runtime's thread waits
    /// until all are dropped (or [`SHUTDOWN_GRACE`] has passed) before it stops the runtime.
    unfinished: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts the runtime's thread and the runtime on it.
    pub(crate) fn start() -> Result<Arc<Runtime>> {
        let scheme = UNKNOWN_BACKEND;
        let operation = "start the blocking client's runtime";
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let (stop_tx, stop_rx) = std_mpsc::channel();
        let (unfinished_tx, unfinished_rx) = mpsc::channel(1);
        let id = NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("distlock-blocking".into())
            .spawn(move || own(id, ready_tx, stop_rx, unfinished_rx))
            .map_err(|error| Error::backend(scheme, operation, error))?;
        // The runtime is built on its own thread, so that a failure leaves nothing to drop
        // here, where dropping a runtime could be refused (inside an async context).
        let handle = match ready_rx.recv() {
            Ok(Ok(handle)) => handle,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(Error::backend(scheme, operation, error));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::backend(
                    scheme,
                    operation,
                    "the runtime's thread ended before the runtime was built",
                ));
            }
        };
        Ok(Arc::new(Runtime {
            id,
            handle,
            scheme: OnceLock::new(),
            stop: Some(stop_tx),
            unfinished: Some(unfinished_tx),
            thread: Some(thread),
        }))
    }

    /// Runs `request` on the runtime and blocks the calling thread until it is answered.
    ///
    /// The request future is dropped, with everything it holds, before its answer is sent,
    /// also when it panics: what a request borrows through a clone (a guard's `Arc`) is given
    /// back by the time `call` returns. A request that panics, or that the runtime drops,
    /// answers with [`Error::Backend`]; nothing here panics, also inside an async context.
    pub(crate) fn call<T, F>(&self, operation: &'static str, request: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let scheme = self.scheme();
        if on_runtime(self.id) {
            // The request would be queued on this very thread, which would wait for it.
            return Err(Error::backend(
                scheme,
                operation,
                "a blocking call on a thread of the client's own runtime (from a backend or \
                 hook run by that client) would wait forever; use the async API there",
            ));
        }
        let (answer_tx, answer_rx) = std_mpsc::sync_channel(1);
        drop(self.handle.spawn(async move {
            // The request is dropped at the end of this statement, before the answer is sent.
            let answer = match AssertUnwindSafe(request).catch_unwind().await {
                Ok(answer) => answer,
                Err(_) => Err(Error::backend(
                    scheme,
                    operation,
                    "the request panicked on the blocking client's runtime",
                )),
            };
            let _ = answer_tx.send(answer);
        }));
        answer_rx.recv().unwrap_or_else(|_| {
            Err(Error::backend(
                scheme,
                operation,
                "the blocking client's runtime stopped before the request was answered",
            ))
        })
    }

    /// Runs `work` on the runtime without waiting for it; the runtime does not stop before it
    /// has finished or [`SHUTDOWN_GRACE`] has passed.
    pub(crate) fn spawn_background<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let unfinished = self.unfinished.clone();
        drop(self.handle.spawn(async move {
            work.await;
            drop(unfinished);
        }));
    }

    /// Drops `value` on the runtime: the async handles' drops may need a Tokio context (a
    /// driver's pooled connection is given back by a task).
    pub(crate) fn drop_in<T: Send + 'static>(&self, value: T) {
        self.spawn_background(async move { drop(value) });
    }

    /// Names the backend the client runs on, in the errors of requests the runtime could not
    /// answer. The first name given stays.
    pub(crate) fn name_backend(&self, scheme: &'static str) {
        let _ = self.scheme.set(scheme);
    }

    /// The scheme of the backend the client runs on, once known.
    pub(crate) fn scheme(&self) -> &'static str {
        self.scheme.get().copied().unwrap_or(UNKNOWN_BACKEND)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        drop(self.unfinished.take());
        // The runtime's thread sees the channel closed.
        drop(self.stop.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        // On a thread of a runtime, joining could wait for that thread itself: let it end
        // on its own.
        if on_runtime(self.id) {
            return;
        }
        if thread.join().is_err() {
            tracing::warn!("the blocking client's runtime thread panicked while it stopped");
        }
    }
}

/// The runtime's thread: builds the runtime, hands its handle over, and when told to stop,
/// waits for the background work (at most [`SHUTDOWN_GRACE`]) and stops it.
fn own(
    id: u64,
    ready: std_mpsc::SyncSender<std::io::Result<tokio::runtime::Handle>>,
    stop: std_mpsc::Receiver<()>,
    mut unfinished: mpsc::Receiver<()>,
) {
    RUNTIME_OF_THREAD.set(id);
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name("distlock-blocking-worker")
        .on_thread_start(move || RUNTIME_OF_THREAD.set(id))
        .enable_all()
        .build();
    let runtime = match built {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    if ready.send(Ok(runtime.handle().clone())).is_ok() {
        // Nothing is ever sent: this returns when the last handle is dropped.
        let _ = stop.recv();
        runtime.block_on(async {
            // `None` once every background task has dropped its sender.
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, unfinished.recv()).await;
        });
    }
    runtime.shutdown_timeout(STOP_LIMIT);
}

/// A value whose drop runs on the runtime, which it keeps running while it lives: the async
/// handle inside each blocking handle.
pub(crate) struct OnRuntime<T: Send + 'static> {
    /// `None` only while dropped.
    value: Option<T>,
    runtime: Arc<Runtime>,
}

impl<T: Send + 'static> OnRuntime<T> {
    pub(crate) fn new(value: T, runtime: Arc<Runtime>) -> Self {
        OnRuntime {
            value: Some(value),
            runtime,
        }
    }

    /// Another value kept by the same runtime.
    pub(crate) fn with<U: Send + 'static>(&self, value: U) -> OnRuntime<U> {
        OnRuntime::new(value, self.runtime.clone())
    }

    pub(crate) fn get(&self) -> &T {
        // Taken only by `Drop`.
        self.value
            .as_ref()
            .expect("the value is present until it is dropped")
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }
}

impl<T: Send + Clone + 'static> Clone for OnRuntime<T> {
    fn clone(&self) -> Self {
        self.with(self.get().clone())
    }
}

impl<T: Send + fmt::Debug + 'static> fmt::Debug for OnRuntime<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => value.fmt(f),
            None => f.write_str("(dropped)"),
        }
    }
}

impl<T: Send + 'static> Drop for OnRuntime<T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            self.runtime.drop_in(value);
        }
    }
}
