//! Watching `connect.config.dir`: any create, change, rename or removal of a file in it
//! wakes the runtime, which re-reads the whole directory (so renames and editors'
//! write-to-temp-then-rename are handled the same way). Events are debounced by
//! [`crate::fswatch`] (quiet for [`crate::fswatch::DEBOUNCE_MS`]), as
//! `transform.config.dir` reloads are; changes that arrive before the runtime looks
//! coalesce into one.

use std::path::Path;

use tokio::sync::mpsc;

use crate::fswatch;

/// A watch on one directory.
pub(super) struct DirWatch {
    /// Kept alive for the watch to last; `None` when notify could not start.
    _watcher: Option<fswatch::Debounced>,
    /// One slot: a change waiting to be seen (more coalesce into it).
    events: mpsc::Receiver<()>,
}

impl DirWatch {
    /// Watches `dir` (not recursively). A watcher that cannot start is logged: the
    /// directory is then read at start only.
    pub(super) fn new(dir: &Path) -> DirWatch {
        let (tx, events) = mpsc::channel(1);
        let watcher = fswatch::debounced(move |_paths| {
            // Full means a change is already waiting to be seen: this one joins it.
            let _ = tx.try_send(());
        })
        .and_then(|mut w| {
            w.watcher()
                .watch(dir, notify::RecursiveMode::NonRecursive)?;
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

    /// Waits for a change (already debounced); `false` when no change can come any more.
    pub(super) async fn changed(&mut self) -> bool {
        self.events.recv().await.is_some()
    }
}
