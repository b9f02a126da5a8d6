//! Watching `connect.config.dir` with notify: any create, change, rename or removal of a
//! file in it wakes the runtime, which re-reads the whole directory (so renames and
//! editors' write-to-temp-then-rename are handled the same way). Events are debounced:
//! after the first, the runtime waits [`DEBOUNCE_MS`] and takes every event that arrived
//! meanwhile as one change, as `transform.config.dir` reloads do.

use std::path::Path;
use std::time::Duration;

use notify::Watcher as _;
use tokio::sync::mpsc;

/// Quiet time after an event before the directory is re-read (ms).
pub const DEBOUNCE_MS: u64 = 200;

/// A watch on one directory.
pub struct DirWatch {
    /// Kept alive for the watch to last; `None` when notify could not start.
    _watcher: Option<notify::RecommendedWatcher>,
    /// One slot: an event waiting to be seen (more coalesce into it).
    events: mpsc::Receiver<()>,
}

impl DirWatch {
    /// Watches `dir` (not recursively). A watcher that cannot start is logged: the
    /// directory is then read at start only.
    pub fn new(dir: &Path) -> DirWatch {
        let (tx, events) = mpsc::channel(1);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                return;
            }
            // Full means a change is already waiting to be seen: this one joins it.
            let _ = tx.try_send(());
        })
        .and_then(|mut w| {
            w.watch(dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch connect.config.dir: files are read at start only");
                None
            }
        };
        DirWatch {
            _watcher: watcher,
            events,
        }
    }

    /// Waits for a change (debounced); `false` when no change can come any more.
    pub async fn changed(&mut self) -> bool {
        if self.events.recv().await.is_none() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(DEBOUNCE_MS)).await;
        while self.events.try_recv().is_ok() {}
        true
    }
}
