//! Rate limit of the warnings a peer's bad input causes (issue 15).
//!
//! Owns: per peer IP address, when its last warning was logged and how many were
//! suppressed since; a table bounded at [`MAX_PEERS`] entries. Never does: logging
//! itself, reading the clock (the caller passes `now`), or deciding what is a warning.
//!
//! Rule: at most one warning line per peer per [`WARN_INTERVAL`]; the first line after a
//! quiet spell carries `suppressed`, the number of lines dropped since the previous one.
//! Keyed by IP, not by socket address: a client that closes and reconnects (each bad
//! frame closes its connection) gets a new port every time. When the table is full of
//! peers warned within the interval, any further peer shares one overflow entry, so many
//! addresses together still log at most one extra line per interval. Ten seconds and 1024
//! peers are constants, not config keys: Kafka has no such key, and the values only bound
//! log volume (a first warning from each peer is always logged).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one warning line per peer per this long.
pub(crate) const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Most peers remembered; more share one entry.
pub(crate) const MAX_PEERS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// When the last line was logged.
    logged_at: Instant,
    /// Lines dropped since.
    suppressed: u64,
}

impl Slot {
    fn new(now: Instant) -> Slot {
        Slot {
            logged_at: now,
            suppressed: 0,
        }
    }

    /// `Some(suppressed)` and restarts the interval when a line may be logged at `now`;
    /// else counts one more suppressed line.
    fn admit(&mut self, now: Instant, interval: Duration) -> Option<u64> {
        if now.saturating_duration_since(self.logged_at) >= interval {
            let suppressed = self.suppressed;
            *self = Slot::new(now);
            Some(suppressed)
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[derive(Debug)]
struct Table<K> {
    peers: HashMap<K, Slot>,
    /// Shared by the peers that find the table full.
    overflow: Option<Slot>,
}

/// Which warnings to log, per peer IP (or per any other key `K`: the plugin host keys its
/// limit warnings by plugin name); see the module doc. Shared by every connection of a
/// listener (`std` mutex, held for a map lookup only).
#[derive(Debug)]
pub(crate) struct PeerWarnings<K = IpAddr> {
    interval: Duration,
    max_peers: usize,
    table: Mutex<Table<K>>,
}

impl<K: Hash + Eq> PeerWarnings<K> {
    /// The broker's limiter: [`WARN_INTERVAL`], [`MAX_PEERS`].
    pub(crate) fn new() -> PeerWarnings<K> {
        PeerWarnings::with_limits(WARN_INTERVAL, MAX_PEERS)
    }

    /// A limiter with its own interval and table bound (`max_peers >= 1`).
    pub(crate) fn with_limits(interval: Duration, max_peers: usize) -> PeerWarnings<K> {
        PeerWarnings {
            interval,
            max_peers: max_peers.max(1),
            table: Mutex::new(Table {
                peers: HashMap::new(),
                overflow: None,
            }),
        }
    }

    /// Whether a warning caused by `peer` may be logged at `now`: `Some(n)` to log it,
    /// saying that `n` lines were suppressed since the previous one; `None` to drop it
    /// (it is counted).
    pub(crate) fn admit(&self, peer: K, now: Instant) -> Option<u64> {
        // A poisoned lock only means another connection panicked mid-lookup; the counts
        // are still usable.
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = table.peers.get_mut(&peer) {
            return slot.admit(now, self.interval);
        }
        if table.peers.len() >= self.max_peers {
            // Forget peers quiet for a whole interval; their suppressed count was shown
            // or is of lines older than the interval.
            let interval = self.interval;
            table
                .peers
                .retain(|_, s| now.saturating_duration_since(s.logged_at) < interval);
        }
        if table.peers.len() < self.max_peers {
            table.peers.insert(peer, Slot::new(now));
            return Some(0);
        }
        match &mut table.overflow {
            Some(slot) => slot.admit(now, self.interval),
            None => {
                table.overflow = Some(Slot::new(now));
                Some(0)
            }
        }
    }

    /// Peers remembered (for tests: the bound holds).
    #[cfg(test)]
    fn peers(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peers
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    #[test]
    fn one_line_per_peer_per_interval_then_the_suppressed_count() {
        let w = PeerWarnings::with_limits(Duration::from_secs(10), 16);
        let t0 = Instant::now();
        assert_eq!(w.admit(ip(1), t0), Some(0));
        for i in 0..999 {
            assert_eq!(w.admit(ip(1), t0 + Duration::from_millis(i)), None);
        }
        // Another peer is not held back by the first.
        assert_eq!(w.admit(ip(2), t0), Some(0));
        assert_eq!(w.admit(ip(1), t0 + Duration::from_secs(9)), None);
        // The next line, an interval later, says how many were dropped.
        assert_eq!(w.admit(ip(1), t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(w.admit(ip(1), t0 + Duration::from_secs(11)), None);
        assert_eq!(w.admit(ip(1), t0 + Duration::from_secs(20)), Some(1));
        assert_eq!(w.admit(ip(1), t0 + Duration::from_secs(40)), Some(0));
    }

    #[test]
    fn the_table_is_bounded_and_extra_peers_share_one_entry() {
        let w = PeerWarnings::with_limits(Duration::from_secs(10), 4);
        let t0 = Instant::now();
        for n in 0..4 {
            assert_eq!(w.admit(ip(n), t0), Some(0));
        }
        // Full of recently warned peers: 1000 more peers log one line between them.
        let logged = (4..1004).filter(|n| w.admit(ip(*n), t0).is_some()).count();
        assert_eq!(logged, 1);
        assert_eq!(w.peers(), 4);
        // An interval later the quiet entries make room again.
        let later = t0 + Duration::from_secs(10);
        for n in 0..4 {
            assert_eq!(w.admit(ip(5000 + n), later), Some(0));
        }
        assert_eq!(w.peers(), 4);
        // Full again: the overflow entry's next line reports the 999 it dropped.
        assert_eq!(w.admit(ip(6000), later), Some(999));
        assert_eq!(w.admit(ip(6001), later), None);
        assert_eq!(w.peers(), 4);
    }
}
