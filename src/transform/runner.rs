//! The `async` runtime of one deployment: one task looping over the input topic's
//! partitions, reading whole stored batches from the replica manager (in process, no
//! Kafka client), calling the transform on up to [`CHUNK_MAX_RECORDS`] records at a time,
//! writing its outputs through [`Ingest`], then committing progress as the committed
//! offsets of the group `transform-<name>` in `__consumer_offsets`.
//!
//! Delivery with `processing.guarantee=at_least_once` (default): outputs are written
//! before progress is committed, so a crash between the two re-transforms that chunk
//! after a restart (duplicates at most since the last progress commit; nothing lost).
//!
//! With `exactly_once`, each chunk is one Kafka transaction of the transactional id
//! `transform-<name>` ([`crate::txn::producer::TxnProducer`]): its outputs and dead
//! letters are written as transactional batches, its progress committed with
//! TxnOffsetCommit, then EndTxn commits all of it at once; a read_committed consumer of
//! the outputs sees each chunk whole or not at all. A failure anywhere in the chunk
//! aborts the transaction and reads the chunk again from the committed progress; a
//! restarted runner's InitProducerId aborts what its previous incarnation left open and
//! fences it. Progress is read back only once stable (no transaction of it completing).
//! Kafka Streams' exactly_once_v2, with one producer per deployment; its input is read
//! read_committed (`WorkerIo::read`), so chained exactly-once deployments compose.
//!
//! One task for all partitions (not one per partition): a deployment is one instance of
//! the component (instances are not pooled yet), so partition tasks would only take turns
//! on it. Partitions are visited round-robin, one chunk each per pass. The task runs on a
//! thread of its own (see `manager`), so a guest spinning until its deadline stalls only
//! its own deployment.
//!
//! Failures: a failing call is narrowed down to the records at fault — the record the
//! plugin names, or, for a trap, timeout, out-of-memory or bad output, by re-running the
//! chunk record by record (the plugin host replaces a trapped instance). Each failing
//! record then follows `errors.tolerance`: `none` commits progress up to it and stops the
//! deployment (FAILED, with the message and the record's topic/partition/offset); `all`
//! writes it to the dead-letter topic with Kafka Connect's error headers (or counts and
//! logs it when there is none) and goes on.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::{Deployment, Guarantee, Owners, RunState, Tolerance};
use crate::dead_letter::{self, DeadLetter, Owner, Stage};
use crate::ingest::{Ingest, IngestError};
use crate::log::records::{StoredBatches, MAX_DECOMPRESSED_BATCH_BYTES};
use crate::plugin::{BatchContext, PluginError, Record, Transform};
use crate::txn::producer::{TxnOwners, TxnProducer};
use crate::worker_io::WorkerIo;

/// Most records given to the transform in one call.
pub const CHUNK_MAX_RECORDS: usize = 1000;
/// Most bytes read from one partition per pass (whole batches; the first is always whole).
pub const READ_MAX_BYTES: usize = 1 << 20;
/// Longest idle wait before the loop looks again (topics created later, new partitions),
/// in milliseconds. Appends wake it earlier through the purgatory's signal.
pub const IDLE_WAIT_MS: u64 = 1_000;

/// The idle wait (ms) of a runner reading some input partition from another broker.
pub const REMOTE_IDLE_WAIT_MS: u64 = 100;

/// `transaction.timeout.ms` of an exactly-once deployment's transactions (capped by the
/// broker's `transaction.max.timeout.ms`): one chunk's; a runner that dies mid-chunk
/// has it aborted by its successor's InitProducerId, or by the coordinator then.
pub const TXN_TIMEOUT_MS: i32 = 60_000;

/// Pause after an aborted exactly-once chunk before it is read again, in ms.
pub const TXN_RETRY_BACKOFF_MS: u64 = 500;

/// How long an at-least-once output write refused with an error that may clear (a
/// leader moving, a broker fenced for a moment: `write_may_succeed_again`) is tried
/// again before the records count as failed, in ms: the producer's
/// `delivery.timeout.ms` default. A stopping runner stops retrying.
pub const OUTPUT_RETRY_MS: u64 = 120_000;

/// How long a progress commit refused with a retriable Kafka error (the coordinator
/// moving or loading, `__consumer_offsets` created by this very commit) is tried again,
/// in ms: a restart resumes from the committed progress, so progress given up on is
/// copied again. A stopping runner does not retry (its stop is waited for).
pub const COMMIT_RETRY_MS: u64 = 10_000;

/// Pause between the tries of a write or a commit refused with a retriable error, in ms
/// (the producer's `retry.backoff.ms` default).
pub const RETRY_BACKOFF_MS: u64 = 100;

/// Whether an output write refused with `error` may succeed when tried again: a leader
/// moving, dead or fenced, or an ISR short for a moment. Not every code Kafka calls
/// retriable: weir answers CORRUPT_MESSAGE for a batch it cannot encode (always again),
/// and UNKNOWN_TOPIC_OR_PARTITION for a partition a re-created topic lacks.
fn write_may_succeed_again(error: kafka_protocol::ResponseError) -> bool {
    use kafka_protocol::ResponseError as E;
    matches!(
        error,
        E::NotLeaderOrFollower
            | E::LeaderNotAvailable
            | E::NetworkException
            | E::RequestTimedOut
            | E::NotEnoughReplicas
            | E::NotEnoughReplicasAfterAppend
            | E::KafkaStorageError
    )
}

/// Whether a progress commit refused with `error` may succeed when tried again: the
/// group's coordinator moving, loading or out of reach.
fn commit_may_succeed_again(error: kafka_protocol::ResponseError) -> bool {
    use kafka_protocol::ResponseError as E;
    matches!(
        error,
        E::CoordinatorNotAvailable
            | E::NotCoordinator
            | E::CoordinatorLoadInProgress
            | E::NetworkException
            | E::RequestTimedOut
    )
}

/// The error that stops a deployment (FAILED).
#[derive(Debug)]
struct Fatal(String);

/// One piece of work on a chunk: a range of records to transform, or one record known
/// to be bad (the plugin named it).
enum Work {
    Range(usize, usize),
    Bad(usize, String, &'static str),
}

/// The task of one async deployment.
pub(crate) struct Runner {
    pub(crate) d: Arc<Deployment>,
    pub(crate) ctx: Owners,
    pub(crate) ingest: Arc<Ingest>,
    pub(crate) transform: Transform,
    pub(crate) version: String,
    pub(crate) stop: watch::Receiver<bool>,
    /// Next offset to read per input partition (from the committed progress at start).
    positions: HashMap<i32, i64>,
    /// The transactional producer of an `exactly_once` deployment.
    txn: Option<TxnProducer>,
    /// Why the open transaction must be aborted (an output or dead letter not written).
    txn_broken: Option<String>,
}

impl Runner {
    /// A runner for `d` with a loaded `transform` of `version`.
    pub(crate) fn new(
        d: Arc<Deployment>,
        ctx: Owners,
        ingest: Arc<Ingest>,
        transform: Transform,
        version: String,
        stop: watch::Receiver<bool>,
    ) -> Runner {
        let txn = (d.spec.guarantee == Guarantee::ExactlyOnce).then(|| {
            let owners = TxnOwners {
                metadata: ctx.metadata.clone(),
                txn: ctx.txn.clone(),
                groups: ctx.groups.clone(),
                peers: ingest.peers(),
            };
            let timeout_ms = TXN_TIMEOUT_MS.min(ctx.config.transaction.max_timeout_ms);
            TxnProducer::new(owners, d.spec.group_id(), timeout_ms)
        });
        Runner {
            d,
            ctx,
            ingest,
            transform,
            version,
            stop,
            positions: HashMap::new(),
            txn,
            txn_broken: None,
        }
    }

    /// Runs until stopped or FAILED.
    pub(crate) async fn run(mut self) {
        let name = self.d.spec.name.clone();
        tracing::info!(transform = %name, input = %self.d.spec.input, version = %short(&self.version), "transform started");
        loop {
            if *self.stop.borrow() {
                break;
            }
            // Taken before looking, so an append between the look and the wait is not missed.
            let mut watches = self.ctx.replicas.watch_high_watermarks(&self.d.spec.input);
            self.swap_pending();
            match self.pass().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(Fatal(message)) if *self.stop.borrow() => {
                    tracing::info!(transform = %name, error = %message, "transform stopped with records not written (read again from the committed progress)");
                    return;
                }
                Err(Fatal(message)) => {
                    tracing::error!(transform = %name, error = %message, "transform FAILED");
                    self.d.set_failed(message);
                    return;
                }
            }
            let idle_wait_ms = self.idle_wait_ms();
            tokio::select! {
                _ = crate::purgatory::any_changed(&mut watches) => {}
                _ = self.stop.changed() => {}
                _ = self.d.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(idle_wait_ms)) => {}
            }
        }
        tracing::info!(transform = %name, "transform stopped");
    }

    /// How long an idle runner waits before looking again: [`IDLE_WAIT_MS`] when every
    /// input partition has a replica here (an append wakes it sooner), else
    /// [`REMOTE_IDLE_WAIT_MS`] (appends on another broker wake nothing here).
    fn idle_wait_ms(&self) -> u64 {
        let input = &self.d.spec.input;
        let partitions = self.ctx.metadata.topic(input).map_or(0, |t| t.partitions);
        if (0..partitions).all(|p| self.ctx.replicas.partition(input, p).is_some()) {
            IDLE_WAIT_MS
        } else {
            REMOTE_IDLE_WAIT_MS
        }
    }

    /// Swaps in a reloaded component, if one is queued.
    fn swap_pending(&mut self) {
        if let Some(loaded) = self.d.take_pending() {
            tracing::info!(transform = %self.d.spec.name, from = %short(&self.version), to = %short(&loaded.version), "transform reloaded");
            self.transform = loaded.transform;
            self.version = loaded.version;
        }
    }

    /// One round over the input partitions: at most one chunk each. Returns whether any
    /// record was read.
    async fn pass(&mut self) -> Result<bool, Fatal> {
        let input = self.d.spec.input.clone();
        let Some(meta) = self.ctx.metadata.topic(&input) else {
            return Ok(false);
        };
        // Exactly-once: the producer first, so a transaction a killed predecessor left
        // open is aborted before the progress it holds pending is read (else the read
        // waits for the transaction timeout).
        if let Some(producer) = self.txn.as_mut() {
            if let Err(e) = producer.init().await {
                tracing::warn!(transform = %self.d.spec.name, error = %e, "transactional producer not initialised; trying again");
                tokio::time::sleep(Duration::from_millis(TXN_RETRY_BACKOFF_MS)).await;
                return Ok(false);
            }
        }
        let mut any = false;
        for p in 0..meta.partitions {
            if *self.stop.borrow() {
                break;
            }
            let Some((records, next)) = self.read(p).await? else {
                continue;
            };
            any = true;
            // Records read after a reload was queued (and so after its version showed)
            // meet the new component.
            self.swap_pending();
            if let Some(producer) = self.txn.as_mut() {
                if let Err(e) = producer.begin().await {
                    self.aborted(p, &e).await;
                    continue;
                }
            }
            let result = self.process(p, &records).await;
            let commit_at = match &result {
                Ok(()) => next,
                Err((_, failed_offset)) => *failed_offset,
            };
            if self.txn.is_some() {
                if let Err(e) = self.commit_transaction(p, commit_at).await {
                    self.aborted(p, &e).await;
                    continue;
                }
            } else {
                self.commit(p, commit_at).await;
            }
            self.positions.insert(p, commit_at);
            if let Err((fatal, _)) = result {
                return Err(fatal);
            }
        }
        Ok(any)
    }

    /// Exactly-once: commits partition `p`'s progress `offset` in the open transaction
    /// and commits it, unless a write failed in it.
    ///
    /// Errors: why the transaction was not committed (it is aborted, or left for the
    /// next InitProducerId to abort).
    async fn commit_transaction(&mut self, p: i32, offset: i64) -> Result<(), String> {
        let offsets = [(self.d.spec.input.clone(), p, offset)];
        let group = self.d.spec.group_id();
        let broken = self.txn_broken.take();
        let Some(producer) = self.txn.as_mut() else {
            return Ok(());
        };
        if let Some(why) = broken {
            if let Err(e) = producer.end(false).await {
                tracing::debug!(transform = %self.d.spec.name, error = %e, "abort not answered; the next InitProducerId aborts it");
            }
            producer.reset();
            return Err(why);
        }
        producer.send_offsets(&group, &offsets).await?;
        producer.end(true).await
    }

    /// Exactly-once: after the transaction of partition `p`'s chunk was aborted (`why`),
    /// forgets the position (the next read starts at the committed progress) and pauses.
    async fn aborted(&mut self, p: i32, why: &str) {
        tracing::warn!(transform = %self.d.spec.name, partition = p, error = %why, "exactly-once chunk aborted; it is read again from the committed progress");
        self.d.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.txn_broken = None;
        if let Some(producer) = self.txn.as_mut() {
            producer.reset();
        }
        self.positions.remove(&p);
        tokio::time::sleep(Duration::from_millis(TXN_RETRY_BACKOFF_MS)).await;
    }

    /// Writes `records` to `topic` (partitioned by the topic's partitioner): plainly,
    /// or in the open transaction of an exactly-once deployment (its partitions added
    /// first). A write that leaves the transaction unusable marks it broken.
    ///
    /// Errors: the first record's [`IngestError`].
    async fn append_records(&mut self, topic: &str, records: &[Record]) -> Result<(), IngestError> {
        let Some(producer) = self.txn.as_mut() else {
            return append_retrying(&self.d.spec.name, &self.ingest, &self.stop, topic, records)
                .await;
        };
        let given = vec![None; records.len()];
        let (meta, chosen) = self
            .ingest
            .choose_partitions(topic, records, &given)
            .await?;
        if let Some(Err(e)) = chosen.iter().find(|c| c.is_err()) {
            return Err(e.clone());
        }
        let partitions: Vec<(String, i32)> = chosen
            .iter()
            .flatten()
            .map(|p| (topic.to_string(), *p))
            .collect();
        if let Err(message) = producer.add_partitions(&partitions).await {
            self.txn_broken = Some(message.clone());
            return Err(IngestError {
                error: kafka_protocol::ResponseError::UnknownServerError,
                message,
            });
        }
        let batch_producer = producer.batch_producer();
        let results = self
            .ingest
            .append_chosen(&meta, records, chosen, batch_producer.as_deref())
            .await;
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(e) => {
                // Refusals of one record (never appended) fail that record; anything
                // else may have left a batch half known: the transaction is aborted.
                use kafka_protocol::ResponseError as E;
                if !matches!(e.error, E::InvalidRecord | E::MessageTooLarge) {
                    self.txn_broken = Some(e.to_string());
                }
                Err(e)
            }
        }
    }

    /// Reads and progress wherever the input partitions and the group's coordinator are.
    fn io(&self) -> WorkerIo<'_> {
        WorkerIo {
            metadata: &self.ctx.metadata,
            replicas: &self.ctx.replicas,
            groups: &self.ctx.groups,
            peers: self.ingest.peers_ref(),
        }
    }

    /// The committed progress of partition `p`, else its log start offset (this
    /// broker's replica's, or 0 for one read from its leader: the read moves it up).
    ///
    /// Errors: the group's coordinator cannot be asked.
    async fn start_position(&self, p: i32) -> Result<i64, String> {
        let input = &self.d.spec.input;
        let committed = self
            .io()
            .committed_offset(&self.d.spec.group_id(), input, p)
            .await?;
        Ok(committed.unwrap_or_else(|| {
            self.ctx
                .replicas
                .partition(input, p)
                .map_or(0, |part| part.offsets().log_start_offset)
        }))
    }

    /// Reads up to [`CHUNK_MAX_RECORDS`] records of partition `p` from its position, from
    /// this broker's replica or the partition's leader. Returns them with their offsets
    /// and the position after them, or `None` when there is nothing new (or the read
    /// failed: logged, tried again at the next pass).
    #[allow(clippy::type_complexity)]
    async fn read(&mut self, p: i32) -> Result<Option<(Vec<(i64, Record)>, i64)>, Fatal> {
        let input = self.d.spec.input.clone();
        let mut pos = match self.positions.get(&p) {
            Some(&pos) => pos,
            None => match self.start_position(p).await {
                Ok(pos) => {
                    self.positions.insert(p, pos);
                    pos
                }
                Err(e) => {
                    tracing::warn!(transform = %self.d.spec.name, partition = p, error = %e, "cannot read the progress; trying again");
                    return Ok(None);
                }
            },
        };
        // Exactly-once reads only committed input (Kafka Streams' exactly_once_v2 reads
        // read_committed; at_least_once reads what the high watermark covers).
        let read_committed = self.txn.is_some();
        let read = self
            .io()
            .read(&input, p, &mut pos, READ_MAX_BYTES, read_committed)
            .await;
        // Moved up when retention removed what was not transformed yet, or the topic was
        // recreated (auto.offset.reset=earliest).
        self.positions.insert(p, pos);
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(transform = %self.d.spec.name, partition = p, error = %e, "cannot read the input");
                return Ok(None);
            }
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        let (records, next) = decode(bytes, pos, CHUNK_MAX_RECORDS).map_err(|e| {
            Fatal(format!(
                "cannot decode the input at {input}-{p} offset {pos}: {e}"
            ))
        })?;
        if next <= pos {
            return Ok(None);
        }
        Ok(Some((records, next)))
    }

    /// Transforms one chunk of partition `p` and writes its outputs, isolating failing
    /// records. `Err` carries the fatal error and the offset progress may be committed at
    /// (the failing record's).
    async fn process(&mut self, p: i32, chunk: &[(i64, Record)]) -> Result<(), (Fatal, i64)> {
        let stats = self.d.stats.clone();
        stats
            .records_in
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        let records: Vec<Record> = chunk.iter().map(|(_, r)| r.clone()).collect();
        let mut work = vec![Work::Range(0, records.len())];
        while let Some(w) = work.pop() {
            let (s, e) = match w {
                Work::Bad(i, message, kind) => {
                    self.fail_record(p, chunk[i].0, &records[i], &message, kind)
                        .await
                        .map_err(|f| (f, chunk[i].0))?;
                    continue;
                }
                Work::Range(s, e) if s >= e => continue,
                Work::Range(s, e) => (s, e),
            };
            let context = BatchContext {
                topic: self.d.spec.input.clone(),
                partition: p,
                base_offset: chunk[s].0,
            };
            let started = Instant::now();
            let result = self.transform.apply(&context, &records[s..e]).await;
            stats
                .busy_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match result {
                Ok(out) => {
                    let failed = self.write_outputs(&out, s).await;
                    let stopping = *self.stop.borrow() && self.txn.is_none();
                    if let Some((i, message)) = failed.first().filter(|_| stopping) {
                        // Stopping while writes were retried (at least once): not the
                        // records' fault (no dead letter); progress stays before the
                        // first one. Exactly-once keeps its rule (records that cannot be
                        // written are dead-lettered in the transaction, or abort it).
                        return Err((Fatal(format!("stopped: {message}")), chunk[*i].0));
                    }
                    for (i, message) in failed {
                        self.fail_record(p, chunk[i].0, &records[i], &message, OUTPUT_WRITE)
                            .await
                            .map_err(|f| (f, chunk[i].0))?;
                    }
                }
                Err(err) => {
                    let kind = dead_letter::plugin_error_kind(&err);
                    let message = err.to_string();
                    let named = match &err {
                        PluginError::Failed {
                            record_index: Some(i),
                            ..
                        } if (*i as usize) < e - s => Some(s + *i as usize),
                        _ => None,
                    };
                    if let Some(i) = named {
                        work.push(Work::Range(i + 1, e));
                        work.push(Work::Bad(i, message, kind));
                        work.push(Work::Range(s, i));
                    } else if e - s == 1 {
                        work.push(Work::Bad(s, message, kind));
                    } else {
                        tracing::debug!(transform = %self.d.spec.name, error = %message, records = e - s, "call failed; re-running record by record");
                        for j in (s..e).rev() {
                            work.push(Work::Range(j, j + 1));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes a call's outputs (record indexes relative to `base`). Returns the input
    /// records whose outputs could not be written, with why.
    async fn write_outputs(
        &mut self,
        out: &crate::plugin::OutputBatch,
        base: usize,
    ) -> Vec<(usize, String)> {
        let d = self.d.clone();
        let spec = &d.spec;
        let mut by_topic: BTreeMap<&str, (Vec<Record>, Vec<usize>)> = BTreeMap::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        for r in out.iter() {
            let i = base + r.input_index as usize;
            let topic = r.topic.unwrap_or(spec.default_output());
            if topic == spec.input {
                failed.push((
                    i,
                    format!("plugin routed a record to the input topic {topic}, which would loop"),
                ));
                continue;
            }
            let entry = by_topic.entry(topic).or_default();
            entry.0.push(r.to_output().record);
            entry.1.push(i);
        }
        let mut written = 0u64;
        for (topic, (records, indexes)) in by_topic {
            match self.append_records(topic, &records).await {
                Ok(()) => written += records.len() as u64,
                Err(e) => {
                    let message = format!("cannot write to output topic {topic}: {e}");
                    for i in indexes {
                        if !failed.iter().any(|(j, _)| *j == i) {
                            failed.push((i, message.clone()));
                        }
                    }
                }
            }
        }
        self.d
            .stats
            .records_out
            .fetch_add(written, Ordering::Relaxed);
        failed.sort_by_key(|(i, _)| *i);
        failed
    }

    /// Applies `errors.tolerance` to one failing record at `offset` of partition `p`.
    async fn fail_record(
        &mut self,
        p: i32,
        offset: i64,
        record: &Record,
        message: &str,
        kind: &'static str,
    ) -> Result<(), Fatal> {
        let d = self.d.clone();
        let spec = &d.spec;
        self.d.stats.errors.fetch_add(1, Ordering::Relaxed);
        let located = format!("{message} (input {}-{p} offset {offset})", spec.input);
        match spec.tolerance {
            Tolerance::None => Err(Fatal(located)),
            Tolerance::All => {
                let Some(dlq) = &spec.dlq_topic else {
                    tracing::warn!(transform = %spec.name, error = %located, "record skipped (errors.tolerance=all, no dead-letter topic)");
                    return Ok(());
                };
                let stage = if kind == OUTPUT_WRITE {
                    Stage::KafkaProduce
                } else {
                    Stage::Transformation
                };
                let letter = DeadLetter {
                    record: record.clone(),
                    topic: spec.input.clone(),
                    partition: p,
                    offset,
                    stage,
                    class_name: self.transform.name().to_string(),
                    kind,
                    message: message.to_string(),
                };
                let version = self.version.clone();
                let owner = Owner::Transform {
                    name: &spec.name,
                    version: &version,
                };
                let records = dead_letter::records(owner, vec![letter]);
                self.append_records(dlq, &records)
                    .await
                    .map_err(|e| {
                        Fatal(format!(
                            "cannot write to the dead-letter topic {dlq}: {e}; failing record: {located}"
                        ))
                    })?;
                tracing::debug!(transform = %spec.name, error = %located, dlq = %dlq, "record sent to the dead-letter topic");
                Ok(())
            }
        }
    }

    /// Commits `offset` as the progress of partition `p` (group `transform-<name>`), at
    /// the group's coordinator wherever it is; a refusal that may clear
    /// ([`commit_may_succeed_again`]), or a coordinator that cannot be asked, is tried
    /// again every [`RETRY_BACKOFF_MS`] for at most [`COMMIT_RETRY_MS`], and not once the
    /// runner is stopping.
    async fn commit(&self, p: i32, offset: i64) {
        let offsets = [(self.d.spec.input.clone(), p, offset)];
        let deadline = Instant::now() + Duration::from_millis(COMMIT_RETRY_MS);
        loop {
            let failed = match self.io().commit(&self.d.spec.group_id(), &offsets).await {
                Ok(errors) => errors
                    .into_iter()
                    .flatten()
                    .next()
                    .map(|e| (commit_may_succeed_again(e), format!("{e:?}"))),
                Err(e) => Some((true, e)),
            };
            let Some((retriable, e)) = failed else {
                return;
            };
            if !retriable || Instant::now() >= deadline || *self.stop.borrow() {
                tracing::warn!(transform = %self.d.spec.name, partition = p, offset, error = %e, "progress not committed (it will be retried with the next chunk)");
                return;
            }
            tracing::debug!(transform = %self.d.spec.name, partition = p, offset, error = %e, "progress not committed yet; trying again");
            tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
        }
    }
}

/// Appends `records` to `topic` for deployment `transform`, at least once, partitioned
/// once by the topic's partitioner: records refused with an error that may clear
/// ([`write_may_succeed_again`]) are written again (to the partition's leader in the
/// metadata of then) every [`RETRY_BACKOFF_MS`] for at most [`OUTPUT_RETRY_MS`], until
/// `stop`, as a producer retries within `delivery.timeout.ms`. A retried record may have
/// been written already (a timeout after the append): at least once. Only a retry copies
/// records (those refused).
///
/// Errors: the first refusal that cannot clear ([`IngestError`]), or the last one that
/// may when the time is up or the runner stops.
async fn append_retrying(
    transform: &str,
    ingest: &Ingest,
    stop: &watch::Receiver<bool>,
    topic: &str,
    records: &[Record],
) -> Result<(), IngestError> {
    let given = vec![None; records.len()];
    let (mut meta, chosen) = ingest.choose_partitions(topic, records, &given).await?;
    let deadline = Instant::now() + Duration::from_millis(OUTPUT_RETRY_MS);
    let mut pending: Vec<usize> = (0..records.len()).collect();
    let mut results = ingest
        .append_chosen(&meta, records, chosen.clone(), None)
        .await;
    let mut tries = 1u32;
    loop {
        let mut again = Vec::new();
        let mut last = None;
        for (&i, result) in pending.iter().zip(results) {
            match result {
                Ok(_) => {}
                Err(e) if write_may_succeed_again(e.error) => {
                    again.push(i);
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let Some(e) = last else {
            if tries > 1 {
                tracing::info!(
                    transform,
                    topic,
                    tries,
                    "output records written after retries"
                );
            }
            return Ok(());
        };
        if Instant::now() >= deadline || *stop.borrow() {
            return Err(e);
        }
        if tries == 1 {
            tracing::warn!(transform, topic, records = again.len(), error = %e, "output records refused; trying again");
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
        meta = ingest.topic(topic)?;
        pending = again;
        let batch: Vec<Record> = pending.iter().map(|&i| records[i].clone()).collect();
        let choice = pending.iter().map(|&i| chosen[i].clone()).collect();
        results = ingest.append_chosen(&meta, &batch, choice, None).await;
    }
}

/// The failure kind of an output record that could not be written to its topic.
const OUTPUT_WRITE: &str = "OutputWrite";

/// The first 12 hex digits of a version.
pub(crate) fn short(version: &str) -> &str {
    version.get(..12).unwrap_or(version)
}

/// Decodes stored batches (as [`crate::log::PartitionLog::read`] returns them) into
/// records at offsets ≥ `from`, at most `max` of them. Control records are skipped.
/// Returns the records with their offsets and the offset to read next: after the last
/// record taken, or after the last batch read when every record of it was taken or
/// skipped (compaction leaves gaps).
///
/// Errors: a batch that does not decode (the log validated it at append, so this is
/// corruption).
pub(crate) fn decode(
    bytes: Bytes,
    from: i64,
    max: usize,
) -> Result<(Vec<(i64, Record)>, i64), String> {
    let mut out = Vec::new();
    let mut next = from;
    for batch in StoredBatches::new(bytes, MAX_DECOMPRESSED_BATCH_BYTES) {
        let batch = batch?;
        let batch_end = batch.base_offset + i64::from(batch.last_offset_delta) + 1;
        let mut full = false;
        if !batch.is_control {
            for r in batch.records {
                let offset = batch.base_offset + i64::from(r.offset_delta);
                if offset < from {
                    continue;
                }
                if out.len() == max {
                    full = true;
                    break;
                }
                next = offset + 1;
                out.push((offset, Record::from(r)));
            }
        }
        if full {
            break;
        }
        next = next.max(batch_end);
    }
    Ok((out, next))
}

impl Deployment {
    /// Marks the deployment FAILED with `message`.
    pub(crate) fn set_failed(&self, message: String) {
        let mut s = self.live();
        s.state = RunState::Failed;
        s.error = Some(message);
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record as KafkaRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    use super::decode;

    /// Stored batches as the log keeps them: `count` records each, from `base`, with
    /// `codec`.
    fn batches(specs: &[(i64, usize, Compression)]) -> bytes::Bytes {
        let mut buf = BytesMut::new();
        for &(base, count, codec) in specs {
            let records: Vec<KafkaRecord> = (0..count)
                .map(|i| KafkaRecord {
                    transactional: false,
                    control: false,
                    delete_horizon: false,
                    partition_leader_epoch: 0,
                    producer_id: -1,
                    producer_epoch: -1,
                    timestamp_type: TimestampType::Creation,
                    offset: base + i as i64,
                    sequence: -1,
                    timestamp: 7,
                    key: None,
                    value: Some(format!("v{}", base + i as i64).into()),
                    headers: Default::default(),
                })
                .collect();
            RecordBatchEncoder::encode(
                &mut buf,
                &records,
                &RecordEncodeOptions {
                    version: 2,
                    compression: codec,
                },
            )
            .unwrap();
        }
        buf.freeze()
    }

    fn values(out: &[(i64, crate::plugin::Record)]) -> Vec<(i64, String)> {
        out.iter()
            .map(|(o, r)| {
                let v = r.value.as_deref().unwrap_or_default();
                (*o, String::from_utf8_lossy(v).into_owned())
            })
            .collect()
    }

    #[test]
    fn decodes_from_the_middle_of_a_batch_across_codecs_up_to_a_limit() {
        let bytes = batches(&[(10, 3, Compression::None), (13, 2, Compression::Zstd)]);
        let (out, next) = decode(bytes.clone(), 11, 1000).unwrap();
        assert_eq!(
            values(&out),
            [(11, "v11"), (12, "v12"), (13, "v13"), (14, "v14")].map(|(o, v)| (o, v.to_string()))
        );
        assert_eq!(next, 15);
        // The limit stops inside a batch; the next read starts after the last taken.
        let (out, next) = decode(bytes.clone(), 10, 2).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(next, 12);
        // A partial batch at the end of a read is left for the next read (the encoder
        // writes the zstd records as batches of one: the cut takes the last).
        let cut = bytes.slice(..bytes.len() - 5);
        let (out, next) = decode(cut, 10, 1000).unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(next, 14);
    }
}
