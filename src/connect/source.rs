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
//!
//! Exactly once (KIP-618; the broker's `connect.exactly.once.source.support=enabled`):
//! the task's records, its dead letters and the source offsets of what they settled are
//! written in one transaction of the transactional id [`transactional_id`]
//! (`connect-cluster-<connector>-0`, Kafka's `<groupId>-<connector>-<taskId>`): one per
//! non-empty poll (`transaction.boundary=poll`) or one for all polls within
//! `transaction.boundary.interval.ms` (`interval`), committed with EndTxn. On start the
//! task calls InitProducerId first (fencing a predecessor and aborting what it left
//! open), then reads its committed offsets back
//! ([`super::store::SourceOffsets::reload_committed`]), then opens and polls. Any write
//! failure aborts the transaction and ends the attempt: the next one starts from the
//! committed offsets, so a read_committed consumer sees each source record once.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::Watcher as _;

use tokio::sync::watch;

use super::{Deps, Progress, TaskError};
use kafka_protocol::ResponseError;

use crate::connect::config::{
    ConnectorClass, ConnectorConfig, ConnectorKind, ErrorTolerance, TransactionBoundary,
};
use crate::connect::smt::{Chain, ChainRecord};
use crate::dead_letter::{self, DeadLetter, Owner, Stage};
use crate::ingest::{IngestError, RecordResult};
use crate::plugin::{Record, SourcePosition, SourceRecord};
use crate::replica::now_ms;
use crate::txn::producer::{TxnOwners, TxnProducer};

/// The group id in an exactly-once source task's transactional id (Kafka Connect's
/// `group.id` of a distributed worker; `connect-cluster` in Kafka's sample config).
pub(crate) const CONNECT_GROUP_ID: &str = "connect-cluster";

/// `transaction.timeout.ms` of an exactly-once source task's transactions, in ms (Kafka's
/// producer default; twice `transaction.boundary.interval.ms` when that is longer; capped
/// by `transaction.max.timeout.ms`): a task killed mid-transaction has it aborted by its
/// successor's InitProducerId, or by the coordinator after this long.
pub(crate) const TXN_TIMEOUT_MS: i32 = 60_000;

/// Longest wait at start for a predecessor's transaction holding this connector's
/// offsets to get its marker, in ms.
const RELOAD_WAIT_MS: u64 = 30_000;

/// The transactional id of `connector`'s task (KIP-618's `<groupId>-<connector>-<taskId>`:
/// group [`CONNECT_GROUP_ID`], weir's one task 0).
pub(crate) fn transactional_id(connector: &str) -> String {
    format!("{CONNECT_GROUP_ID}-{connector}-0")
}

/// The open transaction of an exactly-once task and what it will commit.
struct Exactly {
    producer: TxnProducer,
    boundary: TransactionBoundary,
    /// When the open transaction began; `None`: none is open.
    opened: Option<Instant>,
    /// The source offsets its records settled, one per source partition.
    positions: Vec<SourcePosition>,
}

impl Exactly {
    /// The producer of `c`'s task when the broker runs sources exactly once.
    fn of(c: &ConnectorConfig, deps: &Deps) -> Option<Exactly> {
        if !deps.exactly_once_source || c.kind != ConnectorKind::Source {
            return None;
        }
        let owners = TxnOwners {
            metadata: deps.ctx.metadata.clone(),
            txn: deps.ctx.txn.clone(),
            groups: deps.ctx.groups.clone(),
            peers: deps.ingest.peers(),
        };
        let boundary_ms = match c.transaction_boundary {
            TransactionBoundary::Poll => 0,
            TransactionBoundary::Interval(ms) => ms.saturating_mul(2),
        };
        let timeout_ms = i32::try_from(boundary_ms)
            .unwrap_or(i32::MAX)
            .max(TXN_TIMEOUT_MS)
            .min(deps.transaction_max_timeout_ms)
            .max(1);
        Some(Exactly {
            producer: TxnProducer::new(owners, transactional_id(&c.name), timeout_ms),
            boundary: c.transaction_boundary,
            opened: None,
            positions: Vec::new(),
        })
    }

    /// Opens a transaction unless one is open.
    async fn begin(&mut self) -> Result<(), TaskError> {
        if self.opened.is_none() {
            self.producer.begin().await.map_err(TaskError::Runtime)?;
            self.opened = Some(Instant::now());
        }
        Ok(())
    }

    /// Adds what one poll settled to the open transaction's offsets.
    fn settled(&mut self, positions: Vec<SourcePosition>) {
        for p in positions {
            match self
                .positions
                .iter_mut()
                .find(|q| q.source_partition == p.source_partition)
            {
                Some(q) => q.source_offset = p.source_offset,
                None => self.positions.push(p),
            }
        }
    }

    /// How long until the open transaction is to be committed (zero: now); `None` when
    /// none is open.
    fn until_due(&self) -> Option<Duration> {
        let opened = self.opened?;
        Some(match self.boundary {
            TransactionBoundary::Poll => Duration::ZERO,
            TransactionBoundary::Interval(ms) => {
                Duration::from_millis(ms).saturating_sub(opened.elapsed())
            }
        })
    }

    fn due(&self) -> bool {
        self.until_due().is_some_and(|d| d.is_zero())
    }

    /// Writes the offsets into the open transaction and commits it; returns the offsets
    /// committed (remembered as stored), empty when none was open.
    ///
    /// Errors: any failure, after which the transaction is aborted (or left for the
    /// next InitProducerId to abort).
    async fn commit(
        &mut self,
        c: &ConnectorConfig,
        deps: &Deps,
    ) -> Result<Vec<SourcePosition>, TaskError> {
        if self.opened.is_none() {
            return Ok(Vec::new());
        }
        let positions = std::mem::take(&mut self.positions);
        let result = self.write_offsets_and_end(c, deps, &positions).await;
        self.opened = None;
        match result {
            Ok(()) => {
                deps.offsets.remember(&c.name, &positions);
                Ok(positions)
            }
            Err(e) => {
                self.abort(c).await;
                Err(TaskError::Runtime(format!(
                    "exactly-once commit failed; the transaction is aborted: {e}"
                )))
            }
        }
    }

    async fn write_offsets_and_end(
        &mut self,
        c: &ConnectorConfig,
        deps: &Deps,
        positions: &[SourcePosition],
    ) -> Result<(), String> {
        if !positions.is_empty() {
            let (topic, partition) = deps.offsets.partition()?;
            self.producer
                .add_partitions(&[(topic.to_string(), partition)])
                .await?;
            let producer = self
                .producer
                .batch_producer()
                .ok_or_else(|| "no producer id".to_string())?;
            deps.offsets
                .write_transactional(&c.name, positions, &producer)?;
        }
        self.producer.end(true).await
    }

    /// Aborts the open transaction (EndTxn abort; unanswered, the next InitProducerId
    /// aborts it) and forgets the producer id.
    async fn abort(&mut self, c: &ConnectorConfig) {
        if let Err(e) = self.producer.end(false).await {
            tracing::debug!(connector = %c.name, error = %e, "abort not answered; the next InitProducerId aborts it");
        }
        self.producer.reset();
        self.opened = None;
        self.positions.clear();
    }
}

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
    let mut exactly = Exactly::of(c, deps);
    if let Some(x) = exactly.as_mut() {
        // KIP-618's order: fence the predecessor (its open transaction aborted), then
        // read the committed offsets, then poll.
        x.producer.init().await.map_err(TaskError::Runtime)?;
        deps.offsets
            .reload_committed(&c.name, RELOAD_WAIT_MS)
            .await
            .map_err(TaskError::Runtime)?;
    }
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
        let records = match task.poll(c.batch_size).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(x) = exactly.as_mut() {
                    x.abort(c).await;
                }
                return Err(e.into());
            }
        };
        if records.is_empty() {
            if let Some(x) = exactly.as_mut().filter(|x| x.due()) {
                let committed = x.commit(c, deps).await?;
                committed_to_task(&mut task, &committed, progress).await?;
                continue;
            }
            let wait = exactly
                .as_ref()
                .and_then(Exactly::until_due)
                .map_or(idle, |d| d.min(idle));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = changed.notified() => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let Some(x) = exactly.as_mut() else {
            let written = write(c, deps, &mut chain, records, None).await?;
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
            continue;
        };
        x.begin().await?;
        let written = match write(c, deps, &mut chain, records, Some(&mut x.producer)).await {
            Ok(w) => w,
            Err(e) => {
                x.abort(c).await;
                return Err(e);
            }
        };
        x.settled(written.positions);
        match written.failure {
            None if x.due() => {
                let committed = x.commit(c, deps).await?;
                committed_to_task(&mut task, &committed, progress).await?;
            }
            None => {}
            // A refused record: what precedes it is committed, as the at-least-once
            // path stores its offsets, then the task fails for good.
            Some(e @ TaskError::Refused(_)) => {
                let committed = x.commit(c, deps).await?;
                committed_to_task(&mut task, &committed, progress).await?;
                return Err(e);
            }
            Some(e) => {
                x.abort(c).await;
                return Err(e);
            }
        }
    }
    // A graceful stop commits the transaction in hand (interval boundaries).
    if let Some(x) = exactly.as_mut() {
        let committed = x.commit(c, deps).await?;
        committed_to_task(&mut task, &committed, progress).await?;
    }
    task.close().await?;
    Ok(())
}

/// Tells the task that `committed` offsets are stored (its `commit`), counting progress.
async fn committed_to_task(
    task: &mut crate::plugin::SourceConnector,
    committed: &[SourcePosition],
    progress: &mut Progress,
) -> Result<(), TaskError> {
    if !committed.is_empty() {
        task.commit(committed).await?;
        progress.made();
    }
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
    /// leadership error), that same append's batches to its other partitions (at least
    /// once).
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
    txn: Option<&mut TxnProducer>,
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
    let (done, failure) = append_in_order(c, deps, &items, &origins, txn).await;
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
    mut txn: Option<&mut TxnProducer>,
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
                let results = match append_run(deps, txn.as_deref_mut(), topic, &run).await {
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
                let refusal = tolerate_refused(c, deps, &items[k], &e, located, txn.as_deref_mut());
                if let Err(failure) = refusal.await {
                    return (done, Some(failure));
                }
                done += 1;
            }
        }
    }
    (done, None)
}

/// Appends `run` to `topic` (partitioned by the topic's partitioner): plainly, or as
/// transactional batches of `txn`'s open transaction, the partitions added to it first.
///
/// Errors: as [`crate::ingest::Ingest::append_each`]; an AddPartitionsToTxn failure as
/// UNKNOWN_SERVER_ERROR with its message.
async fn append_run(
    deps: &Deps,
    txn: Option<&mut TxnProducer>,
    topic: &str,
    run: &[Record],
) -> Result<Vec<RecordResult>, IngestError> {
    let given = vec![None; run.len()];
    let Some(producer) = txn else {
        return deps.ingest.append_each(topic, run, &given).await;
    };
    let (meta, chosen) = deps.ingest.choose_partitions(topic, run, &given).await?;
    let partitions: Vec<(String, i32)> = chosen
        .iter()
        .flatten()
        .map(|p| (topic.to_string(), *p))
        .collect();
    producer
        .add_partitions(&partitions)
        .await
        .map_err(|message| IngestError {
            error: ResponseError::UnknownServerError,
            message,
        })?;
    let batch_producer = producer.batch_producer();
    Ok(deps
        .ingest
        .append_chosen(&meta, run, chosen, batch_producer.as_deref())
        .await)
}

/// Applies `errors.tolerance` to a record its topic refuses (`error`; `located` says
/// which record): `none` fails the task ([`TaskError::Refused`]); `all` writes it to the
/// dead-letter topic with Kafka Connect's headers (stage `KAFKA_PRODUCE`, partition and
/// offset -1: it was never in a topic) when one is set and it fits there, else logs it
/// as skipped. An exactly-once task writes the dead letter in its transaction (`txn`).
///
/// Errors: as said, and a dead-letter append that fails.
async fn tolerate_refused(
    c: &ConnectorConfig,
    deps: &Deps,
    item: &ChainRecord,
    error: &IngestError,
    located: String,
    txn: Option<&mut TxnProducer>,
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
    let records = dead_letter::records(owner, vec![letter]);
    let written = append_run(deps, txn, dlq, &records)
        .await
        .and_then(|results| {
            results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err)
        });
    match written {
        Ok(()) => {
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
