//! The write phase of a segmented order that spans several segments: every write lands, or
//! every unit taken is put back, even when the caller stops waiting half-way (promise 5).

use std::sync::Arc;

use super::{Hints, Stock};
use crate::error::{Error, Result};
use crate::finish::FinishOnDrop;
use crate::mutex::Guard;

/// How often a put-back under a fresh lock is tried before the order gives up on it.
const PUT_BACK_ATTEMPTS: u32 = 3;

/// One segment's part of an order: its index, its quantity when read, the units to take.
#[derive(Debug, Clone, Copy)]
pub(super) struct Part {
    pub index: usize,
    pub before: u64,
    pub units: u64,
}

/// Writes every part under the segment locks in `guards` (one per segment, by index), then
/// releases them. Runs to the end in the background if the caller drops it. Answers how many
/// segments the order took from.
pub(super) async fn write_parts(
    segments: Vec<Stock>,
    guards: Vec<Guard>,
    parts: Vec<Part>,
    hints: Arc<Hints>,
) -> Result<u32> {
    let item = segments.first().map(|s| s.item.clone()).unwrap_or_default();
    FinishOnDrop::new(
        write_all(segments, guards, parts, hints),
        move |result| async move {
            if let Err(error) = result {
                tracing::warn!(%item, %error, "a cancelled multi-segment order failed");
            }
        },
    )
    .await
}

async fn write_all(
    segments: Vec<Stock>,
    guards: Vec<Guard>,
    parts: Vec<Part>,
    hints: Arc<Hints>,
) -> Result<u32> {
    // Parts written, and a part whose write failed without a refusal: it may have landed (a
    // lost reply), so it is restored too (the absolute quantity read, written under the lock
    // still held, is right whether it landed or not).
    let mut touched: Vec<Part> = Vec::new();
    let mut uncertain: Option<Part> = None;
    let mut failure = None;
    for part in &parts {
        let segment = &segments[part.index];
        let token = guards[part.index].fencing_token();
        match segment
            .store
            .write_fenced(&segment.item, part.before - part.units, token)
            .await
        {
            Ok(()) => {
                hints.saw(part.index, part.before - part.units);
                touched.push(*part);
            }
            Err(error) => {
                // Refused by fencing: it did not land. Any other failure may have.
                if !error.is_fenced() {
                    uncertain = Some(*part);
                }
                failure = Some(error);
                break;
            }
        }
    }
    let Some(error) = failure else {
        release_all(&segments, guards).await;
        return Ok(u32::try_from(touched.len()).unwrap_or(u32::MAX));
    };
    // All or nothing: put back what this order took. Under the locks still held, writing
    // the quantity read restores it (again after a failure whose outcome is unknown). A
    // refused write (the lock was lost and someone else wrote since) cannot restore by
    // writing a quantity: the units are added back under a fresh lock, after ours go.
    let mut later = Vec::new();
    let mut unknown = 0u64;
    for part in &touched {
        match restore(&segments[part.index], &guards[part.index], part.before).await {
            Restored::Yes => hints.saw(part.index, part.before),
            Restored::Refused => later.push(*part),
            Restored::Unknown => unknown += part.units,
        }
    }
    if let Some(part) = uncertain {
        match restore(&segments[part.index], &guards[part.index], part.before).await {
            Restored::Yes => hints.saw(part.index, part.before),
            // Whether its write landed before the lock was lost cannot be known now.
            Restored::Refused | Restored::Unknown => unknown += part.units,
        }
    }
    release_all(&segments, guards).await;
    let mut unrestored = unknown;
    for part in later {
        if !put_back(&segments[part.index], part.units).await {
            unrestored += part.units;
        }
    }
    if unrestored > 0 {
        let item = segments.first().map_or("", |s| s.item.as_str());
        tracing::error!(%item, unrestored, "units of a failed order could not be put back");
        return Err(Error::backend(
            "stock",
            "put back a failed order's units",
            format!(
                "up to {unrestored} units taken from {item} by a failed order could not be put back ({error})"
            ),
        ));
    }
    Err(error)
}

enum Restored {
    Yes,
    /// Fenced: the lock was lost and someone else used the segment.
    Refused,
    /// The store kept failing; whether the quantity is right is unknown.
    Unknown,
}

/// Writes the quantity read back under the lock still held, trying again after failures
/// (the write is idempotent).
async fn restore(segment: &Stock, guard: &Guard, before: u64) -> Restored {
    let mut maybe_landed = false;
    for _ in 0..PUT_BACK_ATTEMPTS {
        match segment
            .store
            .write_fenced(&segment.item, before, guard.fencing_token())
            .await
        {
            Ok(()) => return Restored::Yes,
            // A refusal after a try whose outcome is unknown: that try may have restored the
            // units before the lock was lost, and adding them again would make stock.
            Err(error) if error.is_fenced() && maybe_landed => return Restored::Unknown,
            Err(error) if error.is_fenced() => return Restored::Refused,
            Err(error) => {
                maybe_landed = true;
                tracing::warn!(item = %segment.item, %error, "putting units back failed; trying again");
            }
        }
    }
    Restored::Unknown
}

/// Adds `units` back to a segment under a fresh lock; true when it landed. Tried again only
/// when the lock could not be had (nothing was written); a failed write may have landed, and
/// adding twice would make stock that does not exist.
async fn put_back(segment: &Stock, units: u64) -> bool {
    for _ in 0..PUT_BACK_ATTEMPTS {
        match segment.restock(units).await {
            Ok(_) => return true,
            Err(error) if error.is_timeout() => {
                tracing::warn!(item = %segment.item, %error, "putting units back: the lock was busy; trying again");
            }
            Err(error) => {
                tracing::error!(item = %segment.item, %error, units, "putting units back failed");
                return false;
            }
        }
    }
    false
}

async fn release_all(segments: &[Stock], guards: Vec<Guard>) {
    for (segment, guard) in segments.iter().zip(guards) {
        if let Err(error) = guard.release().await {
            tracing::debug!(item = %segment.item, %error, "releasing a segment lock failed");
        }
    }
}
