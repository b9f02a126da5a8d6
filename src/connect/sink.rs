//! A sink task: read the subscribed topics from the group `connect-<name>`'s committed
//! offsets → `put` → every `offset.flush.interval.ms` (and at stop) `flush` → commit.
//!
//! With `topics.regex` the task consumes every partition of every matching topic, and
//! looks at the metadata every [`REGEX_RESCAN_MS`]: when the matching partitions changed
//! (a topic created or deleted, partitions added), it flushes, commits and closes as at
//! a stop, then opens a new instance with the new partition list — Kafka Connect's
//! consumer rebalance (close + open of `SinkTask`), without losing or repeating a record.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Deps, Progress, TaskError};
use crate::connect::config::{ConnectorClass, ConnectorConfig, ErrorTolerance, TopicsRegex};
use crate::connect::smt::{Chain, ChainRecord};
use crate::dead_letter::{self, DeadLetter, Owner, Stage};
use crate::log::records::{StoredBatches, MAX_DECOMPRESSED_BATCH_BYTES};
use crate::plugin::{ErrantRecord, Record, SinkConnector, SinkRecord, TopicOffset};

/// Most bytes read from one partition per read.
const READ_BYTES: usize = 1 << 20;

/// How often a sink whose topics do not exist yet looks again.
const TOPIC_WAIT_MS: u64 = 500;

/// How often a `topics.regex` sink looks for a change in its matching partitions (the
/// Java consumer's `metadata.max.age.ms` is 5 minutes; a broker-local look is cheap).
pub(super) const REGEX_RESCAN_MS: u64 = 3_000;

/// The consumer group holding a sink's progress.
pub(crate) fn group_id(connector: &str) -> String {
    format!("connect-{connector}")
}

/// Runs one attempt of the task until `shutdown` (Ok) or a failure (Err).
///
/// The at-least-once window: offsets are committed only after `flush`, so a crash puts
/// again what was put since the last flush (at most `offset.flush.interval.ms` of
/// records). A graceful stop flushes and commits first: no duplicates; so does a
/// `topics.regex` reassignment.
pub(super) async fn run(
    c: &ConnectorConfig,
    deps: &Deps,
    progress: &mut Progress,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), TaskError> {
    loop {
        match run_assigned(c, deps, progress, shutdown).await? {
            Ended::Stopped => return Ok(()),
            Ended::Reassigned => {
                tracing::info!(connector = %c.name, "topics.regex: the matching partitions changed; reopening the sink");
            }
        }
    }
}

/// How [`run_assigned`] ended without a failure.
enum Ended {
    /// Told to stop.
    Stopped,
    /// Its `topics.regex` matches other partitions now (flushed, committed, closed).
    Reassigned,
}

/// Every partition of the topics `regex` matches now, sorted.
fn matching(deps: &Deps, regex: &TopicsRegex) -> Vec<(String, i32)> {
    let mut partitions: Vec<(String, i32)> = deps
        .ctx
        .metadata
        .topics()
        .into_iter()
        .filter(|t| regex.matches(&t.name))
        .flat_map(|t| (0..t.partitions).map(move |p| (t.name.clone(), p)))
        .collect();
    partitions.sort();
    partitions
}

/// The partitions to consume: every partition of each of `topics`, waiting for each to
/// exist; with `topics.regex`, those of the matching topics, waiting for one to exist.
/// `None` when told to stop while waiting.
async fn assignment(
    c: &ConnectorConfig,
    deps: &Deps,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Vec<(String, i32)>> {
    let wait = Duration::from_millis(TOPIC_WAIT_MS);
    if let Some(regex) = &c.topics_regex {
        loop {
            if *shutdown.borrow() {
                return None;
            }
            let partitions = matching(deps, regex);
            if !partitions.is_empty() {
                return Some(partitions);
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    let mut partitions: Vec<(String, i32)> = Vec::new();
    for topic in &c.topics {
        loop {
            if *shutdown.borrow() {
                return None;
            }
            if let Some(meta) = deps.ctx.metadata.topic(topic) {
                partitions.extend((0..meta.partitions).map(|p| (topic.clone(), p)));
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    Some(partitions)
}

/// One instance over one partition list: until `shutdown`, a failure, or (with
/// `topics.regex`) a change in the matching partitions.
async fn run_assigned(
    c: &ConnectorConfig,
    deps: &Deps,
    progress: &mut Progress,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Ended, TaskError> {
    let Some(partitions) = assignment(c, deps, shutdown).await else {
        return Ok(Ended::Stopped);
    };
    let group = group_id(&c.name);
    let mut positions: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (topic, p) in &partitions {
        let committed = deps
            .io()
            .committed_offset(&group, topic, *p)
            .await
            .map_err(TaskError::Runtime)?;
        let start = match committed {
            Some(o) => o,
            // Kafka Connect's sink consumers default to auto.offset.reset=earliest.
            None => deps
                .ctx
                .replicas
                .partition(topic, *p)
                .map(|part| part.offsets().log_start_offset)
                .unwrap_or(0),
        };
        positions.insert((topic.clone(), *p), start);
    }
    let path = c.component_path(&deps.plugin_path);
    let mut task = deps
        .plugins
        .load_sink_connector(&path, &deps.grants(c, true))
        .await?;
    let mut chain = Chain::load(&deps.plugins, &c.transforms).await?;
    task.open(&c.pairs, &partitions).await?;
    deps.set_running(c);
    let flush_every = Duration::from_millis(c.offset_flush_interval_ms);
    let mut next_flush = Instant::now() + flush_every;
    let mut committed = positions.clone();
    let rescan_every = Duration::from_millis(REGEX_RESCAN_MS);
    let mut next_rescan = Instant::now() + rescan_every;
    let mut reassigned = false;
    loop {
        if let Some(regex) = &c.topics_regex {
            if Instant::now() >= next_rescan {
                reassigned = matching(deps, regex) != partitions;
                next_rescan = Instant::now() + rescan_every;
            }
        }
        // Taken before reading, so an advance between the read and the wait is not missed.
        let mut watches: Vec<_> = positions
            .keys()
            .filter_map(|(topic, p)| deps.ctx.replicas.partition(topic, *p))
            .map(|part| part.watch_high_watermark())
            .collect();
        let batch = read_batch(deps, &mut positions, c.batch_size as usize).await?;
        let read_some = !batch.is_empty();
        let (batch, failed) = prepare(c, &mut chain, batch).await?;
        tolerate(c, deps, failed).await?;
        if batch.is_empty() {
            // Everything read was skipped or dead-lettered: handled.
            if read_some {
                progress.made();
            }
        } else {
            deliver(
                c,
                deps,
                &mut task,
                &batch,
                &mut positions,
                progress,
                shutdown,
            )
            .await?;
        }
        let stopping = *shutdown.borrow() || reassigned;
        if stopping || Instant::now() >= next_flush {
            if positions != committed {
                flush_and_commit(&mut task, deps, &group, &positions).await?;
                committed = positions.clone();
            }
            next_flush = Instant::now() + flush_every;
        }
        if stopping {
            break;
        }
        if !read_some {
            tokio::select! {
                _ = crate::purgatory::any_changed(&mut watches) => {}
                _ = tokio::time::sleep_until(next_flush) => {}
                _ = tokio::time::sleep_until(next_rescan), if c.topics_regex.is_some() => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    task.close().await?;
    if reassigned && !*shutdown.borrow() {
        return Ok(Ended::Reassigned);
    }
    Ok(Ended::Stopped)
}

/// Puts `batch` until every record of it is settled (Kafka Connect's
/// `RetriableException` loop, but the waiting is the host's: a sink never sleeps).
///
/// After each `put`: its errant records go to [`report_errant`]; if it asked for a
/// retry, the host waits `after_ms` (capped by `retry.backoff.max.ms`, cut short by
/// shutdown) and puts only the unsettled rest, so a record the sink accepted is never
/// put twice by this loop. Stopped during a wait: `positions` go back to the first
/// unsettled record of each partition, so the commit at stop covers only settled
/// records and the rest is put again after the restart.
///
/// Retries still asked for once `errors.retry.timeout` has passed without a `put`
/// settling a record (since the first `put` of `batch`, or the last one that settled
/// some) are spent: the unsettled records take the error path as errant ones
/// (exception class `RetriesExhausted`): the dead-letter topic or a log line under
/// `errors.tolerance=all`, the task FAILED at once under `none` ([`TaskError::Refused`]).
///
/// Errors: a `put` failure; an errant record under `errors.tolerance=none`; a DLQ
/// append failure; retries spent under `none`.
async fn deliver(
    c: &ConnectorConfig,
    deps: &Deps,
    task: &mut SinkConnector,
    batch: &[SinkRecord],
    positions: &mut BTreeMap<(String, i32), i64>,
    progress: &mut Progress,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), TaskError> {
    // Since the first put that settled nothing after the last one that did: a sink
    // moving through a long batch in several calls is not retrying.
    let mut started = Instant::now();
    let mut rest = batch;
    loop {
        let outcome = task.put(rest).await?;
        report_errant(c, deps, rest, &outcome.errant).await?;
        let Some(retry) = outcome.retry else {
            progress.made();
            return Ok(());
        };
        if retry.settled > 0 {
            progress.made();
            started = Instant::now();
        }
        rest = &rest[(retry.settled as usize).min(rest.len())..];
        let Some(first) = rest.first() else {
            return Ok(());
        };
        let out_of_time = c
            .retry_timeout_ms
            .is_some_and(|t| started.elapsed() >= Duration::from_millis(t));
        if out_of_time {
            // The retries are spent: the rest takes the error path now. A restart would
            // only put the same records again (resending what may have arrived).
            let reason = format!(
                "not delivered: the sink still asked to retry after errors.retry.timeout ({} ms)",
                c.retry_timeout_ms.unwrap_or(0)
            );
            if c.errors_tolerance == ErrorTolerance::None {
                return Err(TaskError::Refused(format!(
                    "{reason} (record {}-{} offset {})",
                    first.topic, first.partition, first.offset
                )));
            }
            let failed = rest
                .iter()
                .map(|r| Failed {
                    record: r.clone(),
                    stage: Stage::TaskPut,
                    kind: "RetriesExhausted",
                    reason: reason.clone(),
                })
                .collect();
            tolerate(c, deps, failed).await?;
            progress.made();
            return Ok(());
        }
        let wait_ms = retry.after_ms.min(c.retry_backoff_max_ms);
        tracing::debug!(connector = %c.name, unsettled = rest.len(), wait_ms, "sink asked to retry");
        if !*shutdown.borrow() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                _ = shutdown.changed() => {}
            }
        }
        if *shutdown.borrow() {
            for r in rest.iter().rev() {
                positions.insert((r.topic.clone(), r.partition), r.offset);
            }
            return Ok(());
        }
    }
}

/// The errant records of a `put` of `batch` (KIP-610), as [`tolerate`] takes them.
async fn report_errant(
    c: &ConnectorConfig,
    deps: &Deps,
    batch: &[SinkRecord],
    errant: &[ErrantRecord],
) -> Result<(), TaskError> {
    let failed = errant
        .iter()
        .filter_map(|e| {
            let r = batch.get(e.index as usize)?;
            Some(Failed {
                record: r.clone(),
                stage: Stage::TaskPut,
                kind: "ErrantRecord",
                reason: e.reason.clone(),
            })
        })
        .collect();
    tolerate(c, deps, failed).await
}

/// A record that failed on its way to the connector: as read from the topic, the stage
/// that failed it, the kind of failure (the DLQ's exception class name) and why.
struct Failed {
    record: SinkRecord,
    stage: Stage,
    kind: &'static str,
    reason: String,
}

/// Applies `errors.tolerance` to failed records: under `none` the first one fails the
/// task; under `all` each goes to `errors.deadletterqueue.topic.name` as it was read from
/// the topic, written by [`dead_letter::write`] (stage `TASK_PUT` and exception class
/// `ErrantRecord` for a sink's report, `KEY_CONVERTER`/`VALUE_CONVERTER` and
/// `DataException` for a converter, `TRANSFORMATION` and `Transform` for the chain), or is
/// logged and skipped without one.
///
/// Errors: as said, and a failed DLQ append.
async fn tolerate(c: &ConnectorConfig, deps: &Deps, failed: Vec<Failed>) -> Result<(), TaskError> {
    let mut dead: Vec<DeadLetter> = Vec::with_capacity(failed.len());
    for f in failed {
        let r = &f.record;
        let located = format!(
            "{} (record {}-{} offset {})",
            f.reason, r.topic, r.partition, r.offset
        );
        match (c.errors_tolerance, &c.dlq_topic) {
            (ErrorTolerance::None, _) => return Err(TaskError::Runtime(located)),
            (ErrorTolerance::All, None) => {
                tracing::warn!(connector = %c.name, error = %located, "record skipped (errors.tolerance=all, no dead-letter topic)");
            }
            (ErrorTolerance::All, Some(_)) => dead.push(DeadLetter {
                record: r.record.clone(),
                topic: r.topic.clone(),
                partition: r.partition,
                offset: r.offset,
                stage: f.stage,
                class_name: stage_class(c, f.stage),
                kind: f.kind,
                message: f.reason,
            }),
        }
    }
    if let Some(dlq) = &c.dlq_topic {
        let owner = Owner::Connector { name: &c.name };
        dead_letter::write(&deps.ingest, dlq, owner, dead)
            .await
            .map_err(|e| {
                TaskError::Runtime(format!("cannot write to the dead-letter topic {dlq}: {e}"))
            })?;
    }
    Ok(())
}

/// The component of a failed stage, for the DLQ's `__connect.errors.class.name`: the
/// connector's `connector.class` for its own `put`, the converter's name, or `smt` for
/// the transform chain.
fn stage_class(c: &ConnectorConfig, stage: Stage) -> String {
    match stage {
        Stage::TaskPut | Stage::KafkaProduce => match &c.class {
            ConnectorClass::BuiltIn(name) => name.to_string(),
            ConnectorClass::Path(path) => path.display().to_string(),
        },
        Stage::KeyConverter => c.key_converter.class_name().to_string(),
        Stage::ValueConverter => c.value_converter.class_name().to_string(),
        Stage::Transformation => "smt".to_string(),
    }
}

async fn flush_and_commit(
    task: &mut SinkConnector,
    deps: &Deps,
    group: &str,
    positions: &BTreeMap<(String, i32), i64>,
) -> Result<(), TaskError> {
    let offsets: Vec<TopicOffset> = positions
        .iter()
        .map(|((topic, partition), offset)| TopicOffset {
            topic: topic.clone(),
            partition: *partition,
            offset: *offset,
        })
        .collect();
    task.flush(&offsets).await?;
    let committed: Vec<(String, i32, i64)> = offsets
        .iter()
        .map(|o| (o.topic.clone(), o.partition, o.offset))
        .collect();
    let errors = deps
        .io()
        .commit(group, &committed)
        .await
        .map_err(TaskError::Runtime)?;
    if let Some(e) = errors.into_iter().flatten().next() {
        return Err(TaskError::Runtime(format!(
            "committing the offsets of group {group}: Kafka error {e:?} (is a client using that group?)"
        )));
    }
    Ok(())
}

/// Converts each record's key and value for the connector (`key.converter`,
/// `value.converter`), then runs the `transforms` chain. Returns the records to put and
/// those that failed either stage (as read, for [`tolerate`]; their offsets are still
/// committed: they were handled). Under `errors.tolerance=none` the chain's first
/// failure fails the task here; a conversion failure does through [`tolerate`].
async fn prepare(
    c: &ConnectorConfig,
    chain: &mut Chain,
    batch: Vec<SinkRecord>,
) -> Result<(Vec<SinkRecord>, Vec<Failed>), TaskError> {
    if chain.is_empty() && c.key_converter.passes_through() && c.value_converter.passes_through() {
        // The default: nothing to do per record.
        return Ok((batch, Vec::new()));
    }
    let skip = c.errors_tolerance == ErrorTolerance::All;
    let mut failed = Vec::new();
    let mut originals = Vec::with_capacity(batch.len());
    let mut converted = Vec::with_capacity(batch.len());
    for r in batch {
        let key = c.key_converter.to_connector("key", r.record.key.clone());
        let value = c
            .value_converter
            .to_connector("value", r.record.value.clone());
        match key.and_then(|k| value.map(|v| (k, v))) {
            Ok((key, value)) => {
                let mut out = r.clone();
                out.record.key = key;
                out.record.value = value;
                converted.push(out);
                originals.push(r);
            }
            Err(e) => {
                let stage = if e.side == "key" {
                    Stage::KeyConverter
                } else {
                    Stage::ValueConverter
                };
                failed.push(Failed {
                    record: r,
                    stage,
                    kind: "DataException",
                    reason: e.to_string(),
                });
                if !skip {
                    return Ok((Vec::new(), failed));
                }
            }
        }
    }
    if chain.is_empty() || converted.is_empty() {
        return Ok((converted, failed));
    }
    let items: Vec<ChainRecord> = converted
        .iter()
        .enumerate()
        .map(|(i, r)| (i, r.topic.clone(), r.record.clone()))
        .collect();
    let (out, chain_failed) = chain.apply(-1, items, skip).await?;
    for (i, reason) in chain_failed {
        failed.push(Failed {
            record: originals[i].clone(),
            stage: Stage::Transformation,
            kind: "Transform",
            reason,
        });
    }
    let out = out
        .into_iter()
        .map(|(i, topic, record)| SinkRecord {
            record,
            topic,
            partition: converted[i].partition,
            offset: converted[i].offset,
        })
        .collect();
    Ok((out, failed))
}

/// Up to `max` records from the partitions, each from its position, advancing them. A
/// partition is read from this broker's replica (leader or follower, to the high
/// watermark) when it holds one, else from its leader (a consumer Fetch).
async fn read_batch(
    deps: &Deps,
    positions: &mut BTreeMap<(String, i32), i64>,
    max: usize,
) -> Result<Vec<SinkRecord>, TaskError> {
    let mut out = Vec::new();
    for ((topic, p), position) in positions.iter_mut() {
        if out.len() >= max {
            break;
        }
        let bytes = deps
            .io()
            .read(topic, *p, position, READ_BYTES, true)
            .await
            .map_err(TaskError::Runtime)?;
        if bytes.is_empty() {
            continue;
        }
        // Every batch of the read decodes before the position moves (as before: a bad
        // batch fails the read as a whole).
        let batches = StoredBatches::new(bytes, MAX_DECOMPRESSED_BATCH_BYTES)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TaskError::Runtime(format!("decoding {topic}-{p} at {position}: {e}")))?;
        'batches: for batch in batches {
            if batch.is_control {
                // A transaction marker: nothing to deliver; read on after it.
                let end = batch.base_offset + i64::from(batch.last_offset_delta) + 1;
                *position = (*position).max(end);
                continue;
            }
            for r in batch.records {
                let offset = batch.base_offset + i64::from(r.offset_delta);
                if offset < *position {
                    continue;
                }
                if out.len() >= max {
                    break 'batches;
                }
                *position = offset + 1;
                out.push(SinkRecord {
                    record: Record::from(r),
                    topic: topic.clone(),
                    partition: *p,
                    offset,
                });
            }
        }
    }
    Ok(out)
}
