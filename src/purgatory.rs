//! The delayed-operation purgatory: long-poll Fetch requests park here until new data
//! arrives or their deadline passes, without holding a thread.
//!
//! Owns: a wake-up signal bumped by every append, and a bound on how many operations may
//! be parked at once (`fetch.purgatory.max.size`); a request that finds the purgatory full
//! answers at once, as if its deadline had passed.
//!
//! Never does: know what a Fetch is. A parked operation is "a condition to re-check, or a
//! deadline"; the caller re-runs its own check after every wake-up.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

/// Parked operations and the signal that wakes them.
#[derive(Debug)]
pub struct Purgatory {
    appended: watch::Sender<u64>,
    slots: Arc<Semaphore>,
}

/// Why [`Purgatory::park`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Something was appended since the operation parked: re-check the condition.
    Appended,
    /// The deadline passed (or the purgatory was full): answer with what there is.
    Deadline,
}

impl Purgatory {
    /// A purgatory holding at most `max_parked` operations at once.
    pub fn new(max_parked: usize) -> Purgatory {
        let (appended, _) = watch::channel(0);
        Purgatory {
            appended,
            slots: Arc::new(Semaphore::new(max_parked)),
        }
    }

    /// Called after every append: wakes every parked operation to re-check.
    pub fn notify_appended(&self) {
        self.appended.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A ticket taken *before* the condition is checked, so an append between the check and
    /// the park is not missed.
    pub fn ticket(&self) -> watch::Receiver<u64> {
        let mut rx = self.appended.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// Waits until an append happens after `ticket` was taken, or `wait_ms` passes.
    /// Returns at once with [`Wake::Deadline`] if `max_parked` operations already wait.
    pub async fn park(&self, ticket: &mut watch::Receiver<u64>, wait_ms: u64) -> Wake {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            return Wake::Deadline;
        };
        match tokio::time::timeout(Duration::from_millis(wait_ms), ticket.changed()).await {
            Ok(Ok(())) => Wake::Appended,
            // The sender lives as long as the broker; a closed channel means shutdown.
            Ok(Err(_)) | Err(_) => Wake::Deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn park_wakes_on_append_or_deadline() {
        let p = Arc::new(Purgatory::new(1));
        let mut t = p.ticket();
        let start = tokio::time::Instant::now();
        assert_eq!(p.park(&mut t, 500).await, Wake::Deadline);
        assert!(start.elapsed() >= Duration::from_millis(500));

        let mut t = p.ticket();
        let p2 = p.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            p2.notify_appended();
        });
        let start = tokio::time::Instant::now();
        assert_eq!(p.park(&mut t, 10_000).await, Wake::Appended);
        assert!(start.elapsed() < Duration::from_millis(1000));

        // An append between ticket and park is not missed.
        let mut t = p.ticket();
        p.notify_appended();
        assert_eq!(p.park(&mut t, 10_000).await, Wake::Appended);
    }

    #[tokio::test(start_paused = true)]
    async fn full_purgatory_answers_at_once() {
        let p = Arc::new(Purgatory::new(1));
        let p2 = p.clone();
        let parked = tokio::spawn(async move {
            let mut t = p2.ticket();
            p2.park(&mut t, 10_000).await
        });
        tokio::task::yield_now().await;
        let mut t = p.ticket();
        assert_eq!(p.park(&mut t, 10_000).await, Wake::Deadline);
        p.notify_appended();
        assert_eq!(parked.await.unwrap(), Wake::Appended);
    }
}
