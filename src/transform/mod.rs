//! Transform deployments: a `transform` component attached to an input topic.
//!
//! `async` mode (the default) consumes the input topic and writes the outputs; `inline`
//! mode rewrites produced batches before they are appended (see [`inline`]).

pub mod apply;
pub mod inline;

use std::sync::atomic::{AtomicU64, Ordering};

/// `errors.tolerance` (Kafka Connect's key and values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tolerance {
    /// `none` (default): the first failing record stops the transform (FAILED).
    #[default]
    None,
    /// `all`: failing records go to the dead-letter topic, the rest flow on.
    All,
}

/// A deployment's counters (shown by `weir transform list`). Relaxed atomics: figures,
/// not synchronisation.
#[derive(Debug, Default)]
pub struct Stats {
    /// Records given to the transform.
    pub records_in: AtomicU64,
    /// Records it emitted (and that were written).
    pub records_out: AtomicU64,
    /// Records that failed (sent to the dead-letter topic or refused).
    pub errors: AtomicU64,
    /// Nanoseconds spent in transform calls.
    pub busy_ns: AtomicU64,
}

impl Stats {
    /// Adds one call's figures.
    pub fn record_call(&self, records_in: u64, records_out: u64, busy_ns: u64) {
        self.records_in.fetch_add(records_in, Ordering::Relaxed);
        self.records_out.fetch_add(records_out, Ordering::Relaxed);
        self.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
    }

    /// Mean nanoseconds per input record (0 before the first record).
    pub fn mean_ns_per_record(&self) -> u64 {
        let n = self.records_in.load(Ordering::Relaxed);
        self.busy_ns
            .load(Ordering::Relaxed)
            .checked_div(n)
            .unwrap_or(0)
    }
}
