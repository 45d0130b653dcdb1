//! The metrics the client reports through the `metrics` facade, read back from a recorder
//! installed for this test binary (one test: the recorder is global).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use distlock::meter;

const FIVE: Duration = Duration::from_secs(5);
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// What the recorder reported so far. A snapshot of the debugging recorder drains every
/// series (a gauge too: it reads back what was added since), so they are summed here.
#[derive(Default)]
struct Seen {
    series: Mutex<HashMap<Series, f64>>,
}

/// A series: its name and labels.
type Series = (String, Vec<(String, String)>);

impl Seen {
    /// The sum of a counter's series (or the count of a histogram's samples, or a gauge's
    /// value) named `name` whose labels include every `(key, value)` of `labels`.
    fn total(&self, snapshotter: &Snapshotter, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut series = self.series.lock().unwrap();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let id = (
                key.key().name().to_owned(),
                key.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
            );
            let entry = series.entry(id).or_default();
            match value {
                DebugValue::Counter(count) => *entry += count as f64,
                DebugValue::Gauge(gauge) => *entry += gauge.into_inner(),
                DebugValue::Histogram(samples) => *entry += samples.len() as f64,
            }
        }
        series
            .iter()
            .filter(|((series_name, series_labels), _)| {
                series_name == name
                    && labels
                        .iter()
                        .all(|(k, v)| series_labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|(_, value)| value)
            .sum()
    }
}

/// Grants (first try and after a wait), tries refused, timeouts, cancelled waits, holds,
/// renewals and losses are each counted once, under the backend's label; the gauges come
/// back to zero when nothing is held or waited for.
#[tokio::test]
async fn metrics_count_every_acquisition_outcome_hold_renewal_and_loss() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = Seen::default();
    recorder.install().expect("install the test recorder");
    let locks = distlock::connect_with(
        "memory://metrics",
        distlock::ConnectOptions::new().lease(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let memory = [("backend", "memory")];

    let held = tokio::time::timeout(FIVE, locks.mutex("m/a").unwrap().acquire())
        .await
        .unwrap()
        .unwrap();
    let granted = [("backend", "memory"), ("waited", "false")];
    assert_eq!(seen.total(&snapshotter, meter::GRANTS, &granted), 1.0);
    assert_eq!(seen.total(&snapshotter, meter::HELD, &memory), 1.0);

    let refused = locks.mutex("m/a").unwrap().try_acquire().await.unwrap();
    assert!(refused.is_none());
    let busy = [("backend", "memory"), ("outcome", "busy")];
    assert_eq!(seen.total(&snapshotter, meter::ACQUIRE_SECONDS, &busy), 1.0);
    assert_eq!(seen.total(&snapshotter, meter::TIMEOUTS, &memory), 0.0);

    let timed_out = tokio::time::timeout(
        FIVE,
        locks
            .mutex("m/a")
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_millis(50))),
    )
    .await
    .unwrap();
    assert!(timed_out.is_err_and(|e| e.is_timeout()));
    assert_eq!(seen.total(&snapshotter, meter::TIMEOUTS, &memory), 1.0);

    // A wait dropped by its caller: counted as waiting while it waits, then cancelled.
    let mutex = locks.mutex("m/a").unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(100), mutex.acquire()).await;
    assert!(cancelled.is_err(), "acquired a held lock");
    let dropped = [("backend", "memory"), ("outcome", "cancelled")];
    assert_eq!(
        seen.total(&snapshotter, meter::ACQUIRE_SECONDS, &dropped),
        1.0
    );
    assert_eq!(seen.total(&snapshotter, meter::WAITING, &memory), 0.0);

    // A waiter granted after the holder's release, while renewals keep the holder's lease.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.mutex("m/a").unwrap().acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(seen.total(&snapshotter, meter::WAITING, &memory), 1.0);
    held.release().await.unwrap();
    let second = tokio::time::timeout(FIVE, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after_wait = [("backend", "memory"), ("waited", "true")];
    assert_eq!(seen.total(&snapshotter, meter::GRANTS, &after_wait), 1.0);
    assert_eq!(seen.total(&snapshotter, meter::HOLD_SECONDS, &memory), 1.0);
    let renewed = [("backend", "memory"), ("outcome", "renewed")];
    assert!(seen.total(&snapshotter, meter::RENEWALS, &renewed) >= 1.0);
    assert!(seen.total(&snapshotter, meter::RENEWAL_SECONDS, &memory) >= 1.0);
    second.release().await.unwrap();

    // A fixed lease that runs out: one loss, with its reason.
    let short = tokio::time::timeout(
        FIVE,
        locks
            .mutex("m/b")
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().lease(Duration::from_millis(100))),
    )
    .await
    .unwrap()
    .unwrap();
    tokio::time::timeout(FIVE, short.lost()).await.unwrap();
    let ran_out = [("backend", "memory"), ("reason", "lease_ran_out")];
    assert_eq!(seen.total(&snapshotter, meter::LOSSES, &ran_out), 1.0);
    drop(short);
    // Every grant's hold ended: nothing held, nothing waiting.
    for _ in 0..100 {
        if seen.total(&snapshotter, meter::HELD, &memory) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.total(&snapshotter, meter::HELD, &memory), 0.0);
    assert_eq!(seen.total(&snapshotter, meter::WAITING, &memory), 0.0);
    assert_eq!(seen.total(&snapshotter, meter::HOLD_SECONDS, &memory), 3.0);
}
