//! A source task: poll → append → store offsets → `commit`, until shutdown.
//!
//! After a poll that returned nothing the task waits `poll.interval.ms`, or less: for a
//! connector with a `file` key, a notify watcher on the file's directory wakes it as soon
//! as anything there changes (an append, a rotation), so a line is picked up within
//! milliseconds without polling faster.
//!
//! Records are appended in poll order and offsets stored for exactly what was settled
//! ([`write`]): a record the topic refuses is never followed by an append of what comes
//! after it, so no restart appends the same records twice; it fails the task for good or
//! goes to the dead-letter topic, by `errors.tolerance` (docs/connectors.md).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;

use tokio::sync::watch;

use super::{Deps, Progress, TaskError};
use kafka_protocol::ResponseError;

use crate::connect::config::{ConnectorClass, ConnectorConfig, ErrorTolerance};
use crate::connect::smt::{Chain, ChainRecord};
use crate::dead_letter::{self, DeadLetter, Owner, Stage};
use crate::ingest::IngestError;
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
        let written = write(c, deps, &mut chain, records).await?;
        if !written.positions.is_empty() {
            deps.offsets
                .commit(&c.name, &written.positions)
                .map_err(TaskError::Runtime)?;
            task.commit(&written.positions).await?;
            progress.made();
        }
        if let Some(e) = written.failure {
            return Err(e);
        }
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

/// What became of one poll's records.
struct Written {
    /// The offset of each source partition after the longest run of the poll's records
    /// (from its start) that are settled: appended, dropped by the chain, or skipped
    /// under `errors.tolerance=all`. Exactly what may be stored: nothing after a record
    /// that was not written.
    positions: Vec<SourcePosition>,
    /// Why writing stopped before the end, if it did; nothing after that point was
    /// appended by this call except, for an append that failed part-way (an I/O or
    /// leadership error), later batches of that same append (at least once).
    failure: Option<TaskError>,
}

/// A source partition and offset, as the guest gave them.
type Origin = (Vec<(String, String)>, Vec<(String, String)>);

/// Runs `records` through the `transforms` chain and the converters and appends them in
/// order (runs of the same topic as one append each, split by [`Ingest`] into batches
/// that fit `max.message.bytes`).
///
/// A record the topic refuses whatever is retried ([`Ingest::first_refused`]: too
/// large, or keyless on a compacted topic) is never appended and nothing after it is
/// appended first: under `errors.tolerance=none` writing stops there with
/// [`TaskError::Refused`]; under `all` it goes to `errors.deadletterqueue.topic.name`
/// (stage `KAFKA_PRODUCE`) when one is set and takes it, else it is logged, and writing
/// goes on. Either way [`Written::positions`] covers exactly the settled records.
///
/// Errors (the whole poll, nothing appended): a record names no topic and the connector
/// has none; the chain fails under `errors.tolerance=none`.
///
/// [`Ingest`]: crate::ingest::Ingest
/// [`Ingest::first_refused`]: crate::ingest::Ingest::first_refused
async fn write(
    c: &ConnectorConfig,
    deps: &Deps,
    chain: &mut Chain,
    records: Vec<SourceRecord>,
) -> Result<Written, TaskError> {
    let now = now_ms();
    let n = records.len();
    let mut origins: Vec<Origin> = Vec::with_capacity(n);
    let mut items: Vec<ChainRecord> = Vec::with_capacity(n);
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
        origins.push((r.source_partition, r.source_offset));
    }
    if !chain.is_empty() {
        let skip = c.errors_tolerance == ErrorTolerance::All;
        let (out, failed) = chain.apply(-1, items, skip).await?;
        for (index, reason) in failed {
            tracing::warn!(connector = %c.name, record = index, error = %reason, "record skipped (errors.tolerance=all)");
        }
        items = out;
    }
    for (_, _, record) in &mut items {
        record.key = c.key_converter.to_topic(record.key.take());
        record.value = c.value_converter.to_topic(record.value.take());
    }
    let (done, failure) = append_in_order(c, deps, &items, &origins).await;
    // A record is settled when none of its outputs is among those left unwritten (the
    // chain keeps the order of its input, so these are the records before the first).
    let settled = items[done..].iter().map(|(i, _, _)| *i).min().unwrap_or(n);
    Ok(Written {
        positions: positions(&origins[..settled]),
        failure,
    })
}

/// The last offset of each source partition among `origins`, in order of first sight.
fn positions(origins: &[Origin]) -> Vec<SourcePosition> {
    let mut positions: Vec<SourcePosition> = Vec::new();
    for (partition, offset) in origins {
        match positions
            .iter_mut()
            .find(|p| p.source_partition == *partition)
        {
            Some(p) => p.source_offset = offset.clone(),
            None => positions.push(SourcePosition {
                source_partition: partition.clone(),
                source_offset: offset.clone(),
            }),
        }
    }
    positions
}

/// Appends `items` in order, each run of one topic up to its first refused record at a
/// time (see [`write`]). Returns how many items from the start are settled, and why it
/// stopped before the end, if it did.
async fn append_in_order(
    c: &ConnectorConfig,
    deps: &Deps,
    items: &[ChainRecord],
    origins: &[Origin],
) -> (usize, Option<TaskError>) {
    let mut done = 0;
    while done < items.len() {
        let topic = items[done].1.as_str();
        let end = items[done..]
            .iter()
            .position(|(_, t, _)| t != topic)
            .map_or(items.len(), |k| done + k);
        let meta = match deps.ingest.topic(topic) {
            Ok(meta) => meta,
            Err(e) => {
                return (
                    done,
                    Some(TaskError::Runtime(format!("writing to {topic}: {e}"))),
                )
            }
        };
        while done < end {
            let refused = deps
                .ingest
                .first_refused(&meta, items[done..end].iter().map(|(_, _, r)| r))
                .map(|(k, e)| (done + k, e));
            let stop = refused.as_ref().map_or(end, |(k, _)| *k);
            if stop > done {
                let run: Vec<Record> = items[done..stop]
                    .iter()
                    .map(|(_, _, r)| r.clone())
                    .collect();
                let results = match deps
                    .ingest
                    .append_each(topic, &run, &vec![None; run.len()])
                    .await
                {
                    Ok(results) => results,
                    Err(e) => {
                        return (
                            done,
                            Some(TaskError::Runtime(format!("writing to {topic}: {e}"))),
                        )
                    }
                };
                for result in results {
                    if let Err(e) = result {
                        return (
                            done,
                            Some(TaskError::Runtime(format!("writing to {topic}: {e}"))),
                        );
                    }
                    done += 1;
                }
            }
            if let Some((k, e)) = refused {
                let (partition, offset) = &origins[items[k].0];
                let located = format!(
                    "record refused by topic {topic}: {e} (source partition {partition:?}, offset {offset:?})"
                );
                if let Err(failure) = tolerate_refused(c, deps, &items[k], &e, located).await {
                    return (done, Some(failure));
                }
                done += 1;
            }
        }
    }
    (done, None)
}

/// Applies `errors.tolerance` to a record its topic refuses (`error`; `located` says
/// which record): `none` fails the task ([`TaskError::Refused`]); `all` writes it to the
/// dead-letter topic with Kafka Connect's headers (stage `KAFKA_PRODUCE`, partition and
/// offset -1: it was never in a topic) when one is set and it fits there, else logs it
/// as skipped.
///
/// Errors: as said, and a dead-letter append that fails.
async fn tolerate_refused(
    c: &ConnectorConfig,
    deps: &Deps,
    item: &ChainRecord,
    error: &IngestError,
    located: String,
) -> Result<(), TaskError> {
    if c.errors_tolerance == ErrorTolerance::None {
        return Err(TaskError::Refused(located));
    }
    let (_, topic, record) = item;
    let Some(dlq) = &c.dlq_topic else {
        tracing::warn!(connector = %c.name, error = %located, "record skipped (errors.tolerance=all, no dead-letter topic)");
        return Ok(());
    };
    let letter = DeadLetter {
        record: record.clone(),
        topic: topic.clone(),
        partition: -1,
        offset: -1,
        stage: Stage::KafkaProduce,
        class_name: match &c.class {
            ConnectorClass::BuiltIn(name) => name.to_string(),
            ConnectorClass::Path(path) => path.display().to_string(),
        },
        kind: match error.error {
            ResponseError::MessageTooLarge => "RecordTooLargeException",
            ResponseError::InvalidRecord => "InvalidRecordException",
            _ => "KafkaException",
        },
        message: located.clone(),
    };
    let owner = Owner::Connector { name: &c.name };
    match dead_letter::write(&deps.ingest, dlq, owner, vec![letter]).await {
        Ok(_) => {
            tracing::warn!(connector = %c.name, error = %located, dlq = %dlq, "record sent to the dead-letter topic");
            Ok(())
        }
        // The dead-letter topic refuses it too (it is as large there): retrying cannot
        // help, and errors.tolerance=all says skip.
        Err(e)
            if matches!(
                e.error,
                ResponseError::MessageTooLarge | ResponseError::InvalidRecord
            ) =>
        {
            tracing::error!(connector = %c.name, error = %located, dlq = %dlq, dlq_error = %e, "record skipped: the dead-letter topic refuses it too");
            Ok(())
        }
        Err(e) => Err(TaskError::Runtime(format!(
            "cannot write to the dead-letter topic {dlq}: {e}"
        ))),
    }
}
