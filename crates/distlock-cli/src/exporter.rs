//! `--metrics-addr`: the library's metrics (named in `distlock::meter`) served in the
//! Prometheus text format over HTTP while a long-running command runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::failure::{CliResult, Failure};

/// Histogram buckets, in seconds: from half a millisecond (a lock on loopback) to a minute
/// (a long wait or hold).
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// The longest request head read; anything longer is refused.
const MAX_REQUEST: usize = 8 * 1024;
/// Requests answered at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its request head.
const READ_LIMIT: Duration = Duration::from_secs(2);

/// Where to serve the metrics (flattened into the long-running commands).
#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// Serve distlock's metrics in the Prometheus text format at http://ADDR/metrics while
    /// the command runs (e.g. 127.0.0.1:9100; port 0 picks a free port). The address is
    /// printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// The running HTTP endpoint; it stops when dropped.
pub struct Exporter {
    task: JoinHandle<()>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Installs the Prometheus recorder and serves it, when `--metrics-addr` was given.
pub async fn serve(args: &MetricsArgs) -> CliResult<Option<Exporter>> {
    let Some(addr) = args.metrics_addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr).await.map_err(|error| {
        Failure::usage(format!(
            "cannot serve metrics on {addr}: {error}; pick another --metrics-addr"
        ))
    })?;
    let local = listener.local_addr()?;
    let recorder = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .map_err(|error| Failure::failed(format!("metrics buckets: {error}")))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|error| Failure::failed(format!("installing the metrics recorder: {error}")))?;
    // One write, so that the lines of processes sharing a stderr (a check's workers) do not
    // interleave.
    let line = format!("distlock: metrics at http://{local}/metrics\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let task = tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, _)) => {
                    let handle = handle.clone();
                    tokio::spawn(async move {
                        let answer = tokio::time::timeout(READ_LIMIT * 2, answer(stream, &handle));
                        if let Ok(Err(error)) = answer.await {
                            tracing::debug!(%error, "metrics request failed");
                        }
                        drop(slot);
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a metrics request failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(Some(Exporter { task }))
}

/// Answers one request: the metrics page for `GET /metrics`, 404 for any other path, 400
/// for anything that is not a GET.
async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    let read_head = async {
        while head.len() < MAX_REQUEST {
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                break;
            }
            // Only the new bytes (and the three before them) can complete the blank line.
            let from = head.len().saturating_sub(3);
            head.extend_from_slice(&chunk[..read]);
            if head[from..].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(READ_LIMIT, read_head).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(error),
        // Too slow to send a request: the connection is closed unanswered.
        Err(_) => return Ok(()),
    }
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(&[]);
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (words.next(), words.next());
    let (status, body) = match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => {
            handle.run_upkeep();
            ("200 OK", handle.render())
        }
        (Some(b"GET"), Some(_)) => ("404 Not Found", "only /metrics is served\n".to_owned()),
        _ => ("400 Bad Request", "send GET /metrics\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
