//! The delayed-operation purgatory: long-poll Fetch requests (and, with replication,
//! acks=all Produce requests) park here until a partition they wait on advances its high
//! watermark or their deadline passes, without holding a thread.
//!
//! Owns: a bound on how many operations may be parked at once
//! (`fetch.purgatory.max.size`; a request that finds the purgatory full answers at once,
//! as if its deadline had passed), and the wait on a set of per-partition high watermark
//! watches ([`crate::replica::Partition::watch_high_watermark`]). Operations are keyed per
//! partition: an append to one partition wakes only what waits on that partition, and
//! only once its high watermark moves (on a cluster, when the ISR has the records).
//!
//! Never does: know what a Fetch is. A parked operation is "a condition to re-check, or a
//! deadline"; the caller re-runs its own check after every wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

/// The bound on parked operations.
#[derive(Debug)]
pub struct Purgatory {
    slots: Arc<Semaphore>,
}

/// Why [`Purgatory::park`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A watched partition's high watermark moved (or the partition went away) since the
    /// operation took its watches: re-check the condition.
    Advanced,
    /// The deadline passed (or the purgatory was full): answer with what there is.
    Deadline,
}

/// Resolves when any of `watches` sees a new value since it was marked seen, or its
/// partition is gone (sender dropped). Pending forever for an empty set.
pub(crate) async fn any_changed(watches: &mut [watch::Receiver<i64>]) {
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = watches
        .iter_mut()
        .map(|w| {
            Box::pin(async move {
                // Err: the partition was deleted; wake so the caller re-checks.
                let _ = w.changed().await;
            }) as Pin<Box<dyn Future<Output = ()> + Send + '_>>
        })
        .collect();
    std::future::poll_fn(|cx| {
        for wait in waits.iter_mut() {
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await
}

impl Purgatory {
    /// A purgatory holding at most `max_parked` operations at once.
    pub fn new(max_parked: usize) -> Purgatory {
        Purgatory {
            slots: Arc::new(Semaphore::new(max_parked)),
        }
    }

    /// Waits until one of `watches` (taken *before* the condition was checked, so an
    /// advance between the check and the park is not missed) changes, or `wait_ms`
    /// passes. Returns at once with [`Wake::Deadline`] if `max_parked` operations
    /// already wait.
    pub async fn park(&self, watches: &mut [watch::Receiver<i64>], wait_ms: u64) -> Wake {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            return Wake::Deadline;
        };
        match tokio::time::timeout(Duration::from_millis(wait_ms), any_changed(watches)).await {
            Ok(()) => Wake::Advanced,
            Err(_) => Wake::Deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn park_wakes_on_its_partition_or_deadline() {
        let p = Arc::new(Purgatory::new(1));
        let (hw_a, _) = watch::channel(0i64);
        let (hw_b, _) = watch::channel(0i64);
        let mut watches = vec![hw_a.subscribe()];
        let start = tokio::time::Instant::now();
        assert_eq!(p.park(&mut watches, 500).await, Wake::Deadline);
        assert!(start.elapsed() >= Duration::from_millis(500));

        // An advance of another partition does not wake it; its own does.
        let mut watches = vec![hw_a.subscribe()];
        let hw_a2 = hw_a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            hw_b.send_replace(5);
            tokio::time::sleep(Duration::from_millis(10)).await;
            hw_a2.send_replace(7);
        });
        let start = tokio::time::Instant::now();
        assert_eq!(p.park(&mut watches, 10_000).await, Wake::Advanced);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(20) && waited < Duration::from_millis(1000));

        // An advance between taking the watch and parking is not missed.
        let mut watches = vec![hw_a.subscribe()];
        hw_a.send_replace(8);
        assert_eq!(p.park(&mut watches, 10_000).await, Wake::Advanced);

        // A deleted partition wakes its waiters.
        let (gone, _) = watch::channel(0i64);
        let mut watches = vec![gone.subscribe()];
        drop(gone);
        assert_eq!(p.park(&mut watches, 10_000).await, Wake::Advanced);
    }

    #[tokio::test(start_paused = true)]
    async fn full_purgatory_answers_at_once() {
        let p = Arc::new(Purgatory::new(1));
        let (hw, _) = watch::channel(0i64);
        let p2 = p.clone();
        let mut first = vec![hw.subscribe()];
        let parked = tokio::spawn(async move { p2.park(&mut first, 10_000).await });
        tokio::task::yield_now().await;
        let mut second = vec![hw.subscribe()];
        assert_eq!(p.park(&mut second, 10_000).await, Wake::Deadline);
        hw.send_replace(1);
        assert_eq!(parked.await.unwrap(), Wake::Advanced);
    }
}
