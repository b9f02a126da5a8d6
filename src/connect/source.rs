//! A source task: poll → append → store offsets → `commit`, until shutdown.

use std::time::Duration;

use tokio::sync::watch;

use super::{Deps, Progress, TaskError};
use crate::connect::config::ConnectorConfig;
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
        .load_source_connector(&path, &c.file_grants(false))
        .await?;
    let stored = deps.offsets.positions(&c.name);
    task.open(&c.pairs, &stored).await?;
    deps.set_running(c);
    let idle = Duration::from_millis(c.poll_interval_ms);
    while !*shutdown.borrow() {
        let records = task.poll(c.batch_size).await?;
        if records.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep(idle) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let positions = write(c, deps, records).await?;
        deps.offsets
            .commit(&c.name, &positions)
            .map_err(TaskError::Runtime)?;
        task.commit(&positions).await?;
        progress.made();
    }
    task.close().await?;
    Ok(())
}

/// Appends `records` (runs of the same topic as one append each, keeping order) and
/// returns the last offset of each source partition.
async fn write(
    c: &ConnectorConfig,
    deps: &Deps,
    records: Vec<SourceRecord>,
) -> Result<Vec<SourcePosition>, TaskError> {
    let now = now_ms();
    let mut positions: Vec<SourcePosition> = Vec::new();
    let mut run_topic: Option<String> = None;
    let mut run: Vec<Record> = Vec::new();
    for r in records {
        let topic = r.topic.clone().or_else(|| c.topic.clone()).ok_or_else(|| {
            TaskError::Runtime(
                "a record names no topic and the connector has no `topic` key".into(),
            )
        })?;
        if run_topic.as_deref() != Some(topic.as_str()) {
            flush(deps, &run_topic, &mut run).await?;
            run_topic = Some(topic);
        }
        let mut record = r.record;
        if record.timestamp_ms <= 0 {
            record.timestamp_ms = now;
        }
        run.push(record);
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
