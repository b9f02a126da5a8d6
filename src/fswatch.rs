//! Watching files for changes: notify's recommended watcher with reads filtered out, and
//! one debouncer (`notify-debouncer-mini`) for everything that reloads on a change —
//! `connect.config.dir`, `transform.config.dir` and the directories of deployed transform
//! components.
//!
//! Owns: which file events count as a change (not `Access`: opening or closing a file to
//! read it — the broker reads the files it watches, and each read would otherwise come
//! back as a change, forever) and the quiet time ([`DEBOUNCE_MS`]). Never does: read the
//! files or decide what a change means; the callers do.

use std::path::PathBuf;
use std::time::Duration;

use notify::Watcher;

/// Quiet time after the last event on a path before it is reported (ms): a write in
/// several steps (editors' write-to-temp-then-rename, a copy) is reported once.
pub(crate) const DEBOUNCE_MS: u64 = 200;

/// notify's recommended watcher that drops `Access` events (see the module doc). Use it
/// directly for an immediate wake-up, or through [`debounced`].
#[derive(Debug)]
pub(crate) struct ChangesOnly(notify::RecommendedWatcher);

impl Watcher for ChangesOnly {
    fn new<F: notify::EventHandler>(
        mut handler: F,
        config: notify::Config,
    ) -> notify::Result<Self> {
        let filter = move |event: notify::Result<notify::Event>| {
            if !matches!(&event, Ok(e) if e.kind.is_access()) {
                handler.handle_event(event);
            }
        };
        notify::RecommendedWatcher::new(filter, config).map(ChangesOnly)
    }

    fn watch(&mut self, path: &std::path::Path, mode: notify::RecursiveMode) -> notify::Result<()> {
        self.0.watch(path, mode)
    }

    fn unwatch(&mut self, path: &std::path::Path) -> notify::Result<()> {
        self.0.unwatch(path)
    }

    fn configure(&mut self, option: notify::Config) -> notify::Result<bool> {
        self.0.configure(option)
    }

    fn kind() -> notify::WatcherKind {
        notify::RecommendedWatcher::kind()
    }
}

/// A debounced watcher; add paths with `.watcher().watch(path, mode)`. Dropping it stops
/// the watch and the debouncer's thread.
pub(crate) type Debounced = notify_debouncer_mini::Debouncer<ChangesOnly>;

/// A watcher that calls `on_change` with the paths that changed, each once it has been
/// quiet for [`DEBOUNCE_MS`] (paths still changing are held back until they settle).
/// `on_change` runs on the debouncer's thread: it must not block.
///
/// Errors: notify cannot start a watcher (e.g. the inotify instance limit).
pub(crate) fn debounced(
    mut on_change: impl FnMut(Vec<PathBuf>) + Send + 'static,
) -> notify::Result<Debounced> {
    let config =
        notify_debouncer_mini::Config::default().with_timeout(Duration::from_millis(DEBOUNCE_MS));
    notify_debouncer_mini::new_debouncer_opt(
        config,
        move |result: notify_debouncer_mini::DebounceEventResult| match result {
            Ok(events) => {
                let settled: Vec<PathBuf> = events
                    .into_iter()
                    .filter(|e| e.kind == notify_debouncer_mini::DebouncedEventKind::Any)
                    .map(|e| e.path)
                    .collect();
                if !settled.is_empty() {
                    on_change(settled);
                }
            }
            Err(e) => tracing::warn!(error = %e, "file watch error"),
        },
    )
}
