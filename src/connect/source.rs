//! A source task: poll → append → store offsets → `commit`, until shutdown.
//!
//! After a poll that returned nothing the task waits `poll.interval.ms`, or less: for a
//! connector with a `file` key, a notify watcher on the file's directory wakes it as soon
//! as anything there changes (an append, a rotation), so a line is picked up within
//! milliseconds without polling faster.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;

use tokio::sync::watch;

use super::{Deps, Progress, TaskError};
use crate::connect::config::{ConnectorConfig, ErrorTolerance};
use crate::connect::smt::{Chain, ChainRecord};
use crate::plugin::{Record, SourcePosition, SourceRecord};
use crate::replica::now_ms;

/// Runs one attempt of the task until `shutdown` (Ok) or a failure (Err).
///
/// The at-least-once window: records are appended before their offsets are stored, so a
/// crash between the two re-reads at most the last poll (`batch.size` records) after a
/// restart. A graceful stop finishes the poll in hand first: no duplicates.
pub(super) async fn run(
    c: &ConnectorConfig,
    deps: &Deps,
    progress: &mut Progress,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), TaskError> {
    let path = c.component_path(&deps.plugin_path);
    let mut task = deps
        .plugins
        .load_source_connector(&path, &deps.grants(c, false))
        .await?;
    let mut chain = Chain::load(&deps.plugins, &c.transforms).await?;
    let stored = deps.offsets.positions(&c.name);
    task.open(&c.pairs, &stored).await?;
    deps.set_running(c);
    let idle = Duration::from_millis(c.poll_interval_ms);
    let changed = Arc::new(tokio::sync::Notify::new());
    let _watcher = c
        .file
        .as_deref()
        .and_then(Path::parent)
        .and_then(|dir| watch(&c.name, dir, changed.clone()));
    while !*shutdown.borrow() {
        let records = task.poll(c.batch_size).await?;
        if records.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep(idle) => {}
                _ = changed.notified() => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let positions = write(c, deps, &mut chain, records).await?;
        deps.offsets
            .commit(&c.name, &positions)
            .map_err(TaskError::Runtime)?;
        task.commit(&positions).await?;
        progress.made();
    }
    task.close().await?;
    Ok(())
}

/// A watcher on `dir` that signals `changed` on every modification of an entry (not on
/// reads, which the connector's own polls cause). `None` when the directory cannot be
/// watched (logged; the task then relies on `poll.interval.ms`).
fn watch(
    connector: &str,
    dir: &Path,
    changed: Arc<tokio::sync::Notify>,
) -> Option<crate::fswatch::ChangesOnly> {
    // Not debounced: a tailing task wakes as soon as the file grows.
    let made = crate::fswatch::ChangesOnly::new(
        move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                changed.notify_one();
            }
        },
        notify::Config::default(),
    );
    let mut watcher = match made {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(connector, error = %e, "cannot create a file watcher; polling every poll.interval.ms");
            return None;
        }
    };
    if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        tracing::warn!(connector, dir = %dir.display(), error = %e, "cannot watch the directory; polling every poll.interval.ms");
        return None;
    }
    Some(watcher)
}

/// Runs `records` through the `transforms` chain and the converters, appends them (runs
/// of the same topic as one append each, keeping order) and returns the last offset of
/// each source partition — of every record polled, a dropped one included.
async fn write(
    c: &ConnectorConfig,
    deps: &Deps,
    chain: &mut Chain,
    records: Vec<SourceRecord>,
) -> Result<Vec<SourcePosition>, TaskError> {
    let now = now_ms();
    let mut positions: Vec<SourcePosition> = Vec::new();
    let mut items: Vec<ChainRecord> = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        let topic = r.topic.clone().or_else(|| c.topic.clone()).ok_or_else(|| {
            TaskError::Runtime(
                "a record names no topic and the connector has no `topic` key".into(),
            )
        })?;
        let mut record = r.record;
        if record.timestamp_ms <= 0 {
            record.timestamp_ms = now;
        }
        items.push((i, topic, record));
        match positions
            .iter_mut()
            .find(|p| p.source_partition == r.source_partition)
        {
            Some(p) => p.source_offset = r.source_offset,
            None => positions.push(SourcePosition {
                source_partition: r.source_partition,
                source_offset: r.source_offset,
            }),
        }
    }
    if !chain.is_empty() {
        let skip = c.errors_tolerance == ErrorTolerance::All;
        let (out, failed) = chain.apply(-1, items, skip).await?;
        for (index, reason) in failed {
            tracing::warn!(connector = %c.name, record = index, error = %reason, "record skipped (errors.tolerance=all)");
        }
        items = out;
    }
    let mut run_topic: Option<String> = None;
    let mut run: Vec<Record> = Vec::new();
    for (_, topic, mut record) in items {
        record.key = c.key_converter.to_topic(record.key.take());
        record.value = c.value_converter.to_topic(record.value.take());
        if run_topic.as_deref() != Some(topic.as_str()) {
            flush(deps, &run_topic, &mut run).await?;
            run_topic = Some(topic);
        }
        run.push(record);
    }
    flush(deps, &run_topic, &mut run).await?;
    Ok(positions)
}

/// Appends a run of records for one topic (nothing for an empty run) and empties it.
async fn flush(
    deps: &Deps,
    topic: &Option<String>,
    run: &mut Vec<Record>,
) -> Result<(), TaskError> {
    if let Some(t) = topic {
        if !run.is_empty() {
            deps.ingest
                .append(t, None, run)
                .await
                .map_err(|e| TaskError::Runtime(format!("writing to {t}: {e}")))?;
        }
    }
    run.clear();
    Ok(())
}
