//! The transaction coordinator: Kafka's transaction protocol (KIP-98; protocol guide
//! "InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn"; KIP-360 epoch
//! bumps; KIP-890 part 1's verify-only AddPartitionsToTxn).
//!
//! Owns: every transactional id this broker coordinates (the leader of its
//! `__transaction_state` partition, [`store::partition_for`]): its producer id and epoch,
//! state (Empty → Ongoing → PrepareCommit/PrepareAbort → CompleteCommit/CompleteAbort),
//! partitions, timeout; the state changes, each logged to `__transaction_state` and
//! replicated (acks=all) before it is answered; writing the transaction markers
//! ([`marker`]) to every partition of a completing transaction, here or through
//! WriteTxnMarkers to the partition's leader; aborting transactions open past their
//! timeout and forgetting ids idle past `transactional.id.expiration.ms`
//! ([`TransactionCoordinator::run_timers`]).
//!
//! Never does: write records of a transaction (producers do, to the partition leaders),
//! compute a last stable offset (the partition's log does), or hold offsets committed in
//! a transaction (the group coordinator does until the marker).
//!
//! Loading: a `__transaction_state` partition this broker has just started to lead is
//! read whole before its ids are served (Kafka's `loadTransactionsForTxnTopicPartition`);
//! a transaction found PrepareCommit/PrepareAbort there has its markers written again
//! (they are idempotent for readers). The coordinator epoch in markers is the leader
//! epoch of that partition, so a deposed coordinator's late markers are fenced
//! (TRANSACTION_COORDINATOR_FENCED, 52).
//!
//! All state sits behind one `std` mutex, never held across `.await`.

pub(crate) mod marker;
pub(crate) mod producer;
pub(crate) mod store;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::ResponseError;

use crate::cluster::Metadata;
use crate::config::TransactionSettings;
use crate::replica::{now_ms, ReplicationWait};
use marker::MarkerWriter;
pub use store::TxnState;
pub(crate) use store::TRANSACTION_STATE_TOPIC;
use store::{partition_for, TxnRecord, TxnStore};

/// Longest a state change waits for the in-sync replicas of its `__transaction_state`
/// partition (as an offset commit, Kafka's `request.timeout.ms` for coordinator writes).
const STATE_WRITE_TIMEOUT_MS: u64 = 5000;
/// Longest EndTxn waits for its markers before answering (the outcome is decided and
/// durable once PrepareCommit/PrepareAbort is logged; Kafka answers then, weir a little
/// later when the markers are quick, so a commit is readable when it returns).
const END_TXN_MARKER_WAIT_MS: u64 = 2000;
/// How long a partition leader retries an implicit add (KIP-890 part 2) answered
/// CONCURRENT_TRANSACTIONS, and its pause between tries (Kafka's
/// `add.partitions.to.txn.retry.backoff.max.ms` and `.backoff.ms` defaults).
const IMPLICIT_ADD_RETRY_MS: u64 = 100;
const IMPLICIT_ADD_BACKOFF_MS: u64 = 20;
/// Pause between two rounds of marker writes to partitions that refused them.
const MARKER_RETRY_MS: u64 = 200;
/// An epoch this close to `i16::MAX` gets a new producer id instead of a bump (Kafka's
/// `isEpochExhausted`).
const EPOCH_EXHAUSTED: i16 = i16::MAX - 1;
/// Kafka's transaction version 2 (KIP-890 part 2: an epoch bump per transaction), as
/// `TransactionLogValue` records it.
const TV2: i16 = 2;

/// What an EndTxn does, decided under the state lock.
enum EndDecision {
    /// A retry of an EndTxn already decided: answered with this (producer id, epoch).
    AlreadyDone((i64, i16)),
    /// Log this Prepare* record; the epoch it replaces.
    Prepare(TxnRecord, i16),
}

/// One transactional id's state in memory: the logged record and what is in flight.
#[derive(Debug, Clone)]
struct TxnEntry {
    record: TxnRecord,
    /// The epoch before the last bump (KIP-360: a producer retrying InitProducerId with
    /// it is answered with the current one), -1 when none.
    last_epoch: i16,
    /// A completion (markers, then Complete*) is running for the current state.
    completing: bool,
    /// A state change of a request is being logged (Kafka's `pendingState`): another
    /// request that would change the state meanwhile gets CONCURRENT_TRANSACTIONS, so
    /// two changes never start from the same state and one never overwrites the other.
    writing: bool,
}

/// A transaction as DescribeTransactions and ListTransactions report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnDescription {
    /// The transactional id.
    pub transactional_id: String,
    /// Its state.
    pub state: TxnState,
    /// Producer id and epoch.
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms`.
    pub timeout_ms: i32,
    /// When the open transaction began (-1: none).
    pub start_ms: i64,
    /// Partitions of the open (or completing) transaction.
    pub partitions: Vec<(String, i32)>,
}

/// The coordinator of the transactional ids whose `__transaction_state` partitions this
/// broker leads.
pub struct TransactionCoordinator {
    txns: Mutex<HashMap<String, TxnEntry>>,
    /// `__transaction_state` partition → the leader epoch it was loaded at. Locked before
    /// `txns` when both are held.
    loaded: Mutex<HashMap<i32, i32>>,
    store: TxnStore,
    metadata: Arc<Metadata>,
    markers: MarkerWriter,
    settings: TransactionSettings,
    /// Wakes EndTxn requests waiting for a completion.
    completed: tokio::sync::watch::Sender<u64>,
    /// This coordinator, for the completions it spawns.
    this: std::sync::Weak<TransactionCoordinator>,
    /// The broker's runtime (the one `new` ran on), where completions are spawned: a
    /// caller on a runtime of its own (an exactly-once transform's runner thread) would
    /// otherwise take the completion down with that runtime when it stops.
    home: Option<tokio::runtime::Handle>,
}

/// Clears `completing` of its id when a completion task is dropped before it ends (see
/// [`TransactionCoordinator::complete`]); disarmed (`coordinator: None`) when it ends.
struct CompletionGuard {
    coordinator: Option<Arc<TransactionCoordinator>>,
    id: String,
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        if let Some(coordinator) = self.coordinator.take() {
            coordinator.finish_completion(&self.id, None);
        }
    }
}

impl std::fmt::Debug for TransactionCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionCoordinator")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl TransactionCoordinator {
    /// A coordinator over the broker's owners; nothing is read until a partition of
    /// `__transaction_state` is led here and used.
    pub fn new(
        metadata: Arc<Metadata>,
        replicas: Arc<crate::replica::ReplicaManager>,
        groups: Arc<crate::group::GroupCoordinator>,
        config: Arc<crate::config::BrokerConfig>,
    ) -> Arc<TransactionCoordinator> {
        let settings = config.transaction;
        let store = TxnStore::new(metadata.clone(), replicas.clone(), settings);
        let markers = MarkerWriter::new(metadata.clone(), replicas, groups, config);
        Arc::new_cyclic(|this| TransactionCoordinator {
            txns: Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
            store,
            metadata,
            markers,
            settings,
            completed: tokio::sync::watch::channel(0).0,
            this: this.clone(),
            home: tokio::runtime::Handle::try_current().ok(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TxnEntry>> {
        self.txns
            .lock()
            .expect("transaction coordinator lock poisoned")
    }

    /// Creates `__transaction_state` if needed (FindCoordinator for a transactional id
    /// does this first, as Kafka).
    ///
    /// Errors: COORDINATOR_NOT_AVAILABLE (15) when it cannot be created.
    pub fn ensure_state_topic(&self) -> Result<(), ResponseError> {
        self.store.ensure_topic().map(|_| ()).map_err(|e| {
            tracing::error!(error = %e, "transaction coordinator unavailable");
            ResponseError::CoordinatorNotAvailable
        })
    }

    /// The broker coordinating `transactional_id` in the current image: the leader of its
    /// `__transaction_state` partition (-1: none), `None` while the topic does not exist.
    pub fn coordinator_of(&self, transactional_id: &str) -> Option<i32> {
        let image = self.metadata.image();
        let topic = image.topic(TRANSACTION_STATE_TOPIC)?;
        Some(
            topic
                .partition(partition_for(transactional_id, topic.partitions))
                .map_or(-1, |p| p.leader),
        )
    }

    /// Checks that this broker coordinates `transactional_id` and that its partition is
    /// loaded for the current leadership.
    ///
    /// Errors: NOT_COORDINATOR (16) when another broker leads the partition (or the topic
    /// does not exist yet: the client asks FindCoordinator, which creates it),
    /// COORDINATOR_LOAD_IN_PROGRESS (14) when it cannot be loaded now.
    fn coordinating(&self, transactional_id: &str) -> Result<(), ResponseError> {
        let Some(partitions) = self.store.partitions() else {
            return Err(ResponseError::NotCoordinator);
        };
        let partition = partition_for(transactional_id, partitions);
        let Some(epoch) = self.store.leader_epoch_here(partition) else {
            return Err(ResponseError::NotCoordinator);
        };
        if self.coordinator_of(transactional_id) != Some(self.metadata.node_id()) {
            return Err(ResponseError::NotCoordinator);
        }
        self.ensure_loaded(partition, epoch)
    }

    /// Loads partition `index` (led here at `epoch`) unless it was loaded at that epoch:
    /// its ids replace what memory held for them, and transactions found completing get
    /// their markers written again.
    fn ensure_loaded(&self, index: i32, epoch: i32) -> Result<(), ResponseError> {
        let mut loaded = self.loaded.lock().expect("transaction loads lock poisoned");
        if loaded.get(&index) == Some(&epoch) {
            return Ok(());
        }
        let found = self.store.load_partition(index).map_err(|e| {
            tracing::error!(partition = index, error = %e, "cannot load {TRANSACTION_STATE_TOPIC}");
            ResponseError::CoordinatorLoadInProgress
        })?;
        let partitions = self.store.partitions().unwrap_or(1);
        let mut resume = Vec::new();
        {
            let mut txns = self.lock();
            txns.retain(|id, _| partition_for(id, partitions) != index);
            for (id, record) in found {
                if matches!(record.state, TxnState::Dead) {
                    continue;
                }
                if matches!(
                    record.state,
                    TxnState::PrepareCommit | TxnState::PrepareAbort
                ) {
                    resume.push(id.clone());
                }
                txns.insert(
                    id,
                    TxnEntry {
                        record,
                        last_epoch: -1,
                        completing: false,
                        writing: false,
                    },
                );
            }
        }
        loaded.insert(index, epoch);
        drop(loaded);
        tracing::info!(
            partition = index,
            leader_epoch = epoch,
            completing = resume.len(),
            "leading {TRANSACTION_STATE_TOPIC} partition: its transactions are loaded"
        );
        for id in resume {
            self.start_completion(&id);
        }
        Ok(())
    }

    /// Logs `record` for `id` and waits (at most [`STATE_WRITE_TIMEOUT_MS`]) until every
    /// in-sync replica has it. Called with the state lock released.
    ///
    /// Errors: NOT_COORDINATOR (16) when this broker stopped leading the partition,
    /// COORDINATOR_NOT_AVAILABLE (15) when the append fails or the replicas do not
    /// acknowledge in time (Kafka's mapping of a failed transaction log append).
    async fn write_state(&self, id: &str, record: Option<&TxnRecord>) -> Result<(), ResponseError> {
        self.store.append(id, record).map_err(|e| {
            tracing::warn!(transactional_id = id, error = %e, "cannot log a transaction state");
            ResponseError::CoordinatorNotAvailable
        })?;
        let Some(partitions) = self.store.partitions() else {
            return Err(ResponseError::NotCoordinator);
        };
        let Some(partition) = self.store.partition(partition_for(id, partitions)) else {
            return Err(ResponseError::NotCoordinator);
        };
        let end = partition.offsets().log_end_offset;
        match partition
            .wait_for_high_watermark(end - 1, STATE_WRITE_TIMEOUT_MS)
            .await
        {
            ReplicationWait::Replicated => Ok(()),
            ReplicationWait::NotLeader => Err(ResponseError::NotCoordinator),
            ReplicationWait::TimedOut | ReplicationWait::NotEnoughReplicasAfterAppend => {
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// InitProducerId for a transactional id: a producer id and a bumped epoch (a new id
    /// with epoch 0 the first time, or when the epoch is exhausted), fencing every older
    /// producer of the same id. An open transaction is aborted first (its markers written
    /// with the bumped epoch); while that completes the answer is CONCURRENT_TRANSACTIONS
    /// (51) and the client retries. `expected` is KIP-360's (producer id, epoch) of a
    /// producer recovering from an abortable error.
    ///
    /// Errors: INVALID_REQUEST (42) for an empty id, INVALID_TRANSACTION_TIMEOUT (50),
    /// NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
    /// CONCURRENT_TRANSACTIONS (51), PRODUCER_FENCED (90) when `expected` is not the
    /// current producer, COORDINATOR_NOT_AVAILABLE (15) when the state cannot be logged,
    /// UNKNOWN_SERVER_ERROR (-1) when no producer id can be allocated.
    pub async fn init_producer_id(
        &self,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), ResponseError> {
        if transactional_id.is_empty() || transactional_id.len() > i16::MAX as usize {
            return Err(ResponseError::InvalidRequest);
        }
        if timeout_ms <= 0 || timeout_ms > self.settings.max_timeout_ms {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        self.coordinating(transactional_id)?;
        // An open transaction is aborted with a bumped epoch first.
        let fenced = {
            let mut txns = self.lock();
            match txns.get_mut(transactional_id) {
                Some(e) if e.completing || e.writing => {
                    return Err(ResponseError::ConcurrentTransactions)
                }
                Some(e) => match e.record.state {
                    TxnState::PrepareCommit | TxnState::PrepareAbort => {
                        return Err(ResponseError::ConcurrentTransactions)
                    }
                    TxnState::Ongoing => {
                        let mut record = e.record.clone();
                        record.producer_epoch = bump(record.producer_epoch);
                        record.state = TxnState::PrepareAbort;
                        record.last_update_ms = now_ms();
                        // Kafka's pending PrepareEpochFence: no other change meanwhile.
                        e.writing = true;
                        Some((record, e.record.producer_epoch))
                    }
                    _ => None,
                },
                None => None,
            }
        };
        if let Some((record, prior_epoch)) = fenced {
            tracing::info!(
                transactional_id,
                producer_id = record.producer_id,
                producer_epoch = record.producer_epoch,
                "a new producer fences the open transaction: aborting it"
            );
            let written = self.write_state(transactional_id, Some(&record)).await;
            self.finish_write(transactional_id, &record, prior_epoch, written)?;
            self.start_completion(transactional_id);
            if !self
                .wait_completed(transactional_id, END_TXN_MARKER_WAIT_MS)
                .await
            {
                return Err(ResponseError::ConcurrentTransactions);
            }
        }
        let now = now_ms();
        let (record, last_epoch) = {
            let mut txns = self.lock();
            match txns.get_mut(transactional_id) {
                None => (None, -1),
                Some(e) if e.completing || e.writing => {
                    return Err(ResponseError::ConcurrentTransactions)
                }
                Some(e) => {
                    if let Some((pid, epoch)) = expected {
                        let current = (e.record.producer_id, e.record.producer_epoch);
                        let retried = (e.record.producer_id, e.last_epoch);
                        if (pid, epoch) != current && (pid, epoch) != retried {
                            return Err(ResponseError::ProducerFenced);
                        }
                        if (pid, epoch) == retried && e.last_epoch >= 0 {
                            // A retry of the bump it already got (KIP-360).
                            return Ok(current);
                        }
                    }
                    e.writing = true;
                    (Some(e.record.clone()), e.record.producer_epoch)
                }
            }
        };
        let clear_writing = || {
            if let Some(e) = self.lock().get_mut(transactional_id) {
                e.writing = false;
            }
        };
        let new = match record {
            Some(r) if r.producer_epoch < EPOCH_EXHAUSTED => TxnRecord {
                producer_epoch: r.producer_epoch + 1,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                last_update_ms: now,
                start_ms: -1,
                previous_producer_id: -1,
                next_producer_id: -1,
                ..r
            },
            _ => {
                let producer_id = self.metadata.next_producer_id().map_err(|e| {
                    tracing::error!(error = %e, "cannot allocate a producer id");
                    clear_writing();
                    ResponseError::UnknownServerError
                })?;
                TxnRecord::v0(
                    producer_id,
                    0,
                    timeout_ms,
                    TxnState::Empty,
                    BTreeSet::new(),
                    now,
                    -1,
                )
            }
        };
        if let Err(e) = self.write_state(transactional_id, Some(&new)).await {
            clear_writing();
            return Err(e);
        }
        let answer = (new.producer_id, new.producer_epoch);
        self.lock().insert(
            transactional_id.to_string(),
            TxnEntry {
                record: new,
                last_epoch,
                completing: false,
                writing: false,
            },
        );
        Ok(answer)
    }

    /// After a fencing PrepareAbort (`record`, replacing epoch `prior_epoch`) was logged,
    /// or failed to be (`written`): clears `writing` and, on success, makes it the state.
    ///
    /// Errors: the write's; CONCURRENT_TRANSACTIONS (51) when the id changed meanwhile.
    fn finish_write(
        &self,
        id: &str,
        record: &TxnRecord,
        prior_epoch: i16,
        written: Result<(), ResponseError>,
    ) -> Result<(), ResponseError> {
        let mut txns = self.lock();
        let Some(e) = txns.get_mut(id) else {
            return written.and(Err(ResponseError::ConcurrentTransactions));
        };
        e.writing = false;
        written?;
        if e.record.producer_id != record.producer_id || e.record.producer_epoch != prior_epoch {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if record.producer_epoch != prior_epoch {
            e.last_epoch = prior_epoch;
        }
        e.record = record.clone();
        Ok(())
    }

    /// The checks every call of a producer shares (Kafka's order): the id is known and
    /// holds `producer_id`, the epoch is current, nothing is completing.
    fn check_producer(
        entry: Option<&TxnEntry>,
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<&TxnEntry, ResponseError> {
        let Some(e) = entry else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        if e.record.producer_id != producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if e.record.producer_epoch != producer_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(e)
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's `__consumer_offsets`
    /// partition): the transaction becomes Ongoing with `partitions` added, logged before
    /// the answer. Adding partitions already in it writes nothing.
    ///
    /// `implicit` is KIP-890 part 2's add by a partition leader (a Produce v12 or a
    /// TxnOffsetCommit v5 of a producer that sends no AddPartitionsToTxn): it may start a
    /// transaction after one that ended with an epoch bump (EndTxn v5, or a timeout),
    /// whose late writes the bump fences. After one that ended without a bump, a write at
    /// the same epoch may be such a late write: refused as KIP-890 part 1 refuses it
    /// (weir's rule; Kafka trusts the request version alone).
    ///
    /// Errors: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
    /// INVALID_PRODUCER_ID_MAPPING (49), PRODUCER_FENCED (90), CONCURRENT_TRANSACTIONS
    /// (51) while the previous transaction completes, COORDINATOR_NOT_AVAILABLE (15);
    /// `implicit`: INVALID_TXN_STATE (48) as above.
    pub async fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
        implicit: bool,
    ) -> Result<(), ResponseError> {
        self.coordinating(transactional_id)?;
        let record = {
            let mut txns = self.lock();
            let e = Self::check_producer(txns.get(transactional_id), producer_id, producer_epoch)?;
            if implicit
                && matches!(
                    e.record.state,
                    TxnState::CompleteCommit | TxnState::CompleteAbort
                )
                && e.record.client_transaction_version < TV2
            {
                return Err(ResponseError::InvalidTxnState);
            }
            if e.completing
                || e.writing
                || matches!(
                    e.record.state,
                    TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence
                )
            {
                return Err(ResponseError::ConcurrentTransactions);
            }
            let ongoing = e.record.state == TxnState::Ongoing;
            if ongoing && partitions.iter().all(|p| e.record.partitions.contains(p)) {
                return Ok(());
            }
            let mut r = e.record.clone();
            let now = now_ms();
            if !ongoing {
                r.partitions.clear();
                r.start_ms = now;
            }
            r.state = TxnState::Ongoing;
            r.partitions.extend(partitions.iter().cloned());
            r.last_update_ms = now;
            if let Some(e) = txns.get_mut(transactional_id) {
                e.writing = true;
            }
            r
        };
        let written = self.write_state(transactional_id, Some(&record)).await;
        let mut txns = self.lock();
        if let Some(e) = txns.get_mut(transactional_id) {
            e.writing = false;
            if written.is_ok() && e.record.producer_epoch == record.producer_epoch {
                e.record = record;
            }
        }
        written
    }

    /// KIP-890 part 1's verification (AddPartitionsToTxn v4+ `verify_only`, and a
    /// partition leader asking before it accepts a transactional write): whether each of
    /// `partitions` is in the producer's open transaction. Nothing is written.
    ///
    /// Errors: as [`TransactionCoordinator::add_partitions`] for the whole request;
    /// per partition INVALID_TXN_STATE (48) when it is not in the transaction.
    pub fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        self.coordinating(transactional_id)?;
        let txns = self.lock();
        let e = Self::check_producer(txns.get(transactional_id), producer_id, producer_epoch)?;
        Ok(partitions
            .iter()
            .map(|p| {
                (e.record.state != TxnState::Ongoing || !e.record.partitions.contains(p))
                    .then_some(ResponseError::InvalidTxnState)
            })
            .collect())
    }

    /// KIP-890, at a partition leader: before it accepts the first transactional batch of
    /// producer `(producer_id, producer_epoch)` on `topic`-`partition` (or a
    /// TxnOffsetCommit v5 on the group's `__consumer_offsets` partition), it asks the
    /// id's coordinator, here or through AddPartitionsToTxn v4 at another broker. Part 1
    /// (`add` false: Produce v3–v11): whether the partition was added to the producer's
    /// open transaction ([`TransactionCoordinator::verify_partitions`]), so a late write
    /// of an aborted transaction, or one that skipped AddPartitionsToTxn, is refused.
    /// Part 2 (`add` true: Produce v12): the leader adds the partition itself
    /// ([`TransactionCoordinator::add_partitions`], `implicit`); CONCURRENT_TRANSACTIONS
    /// while the previous transaction completes is retried for up to
    /// [`IMPLICIT_ADD_RETRY_MS`] (Kafka's `add.partitions.to.txn.retry.backoff.max.ms`).
    ///
    /// Errors: INVALID_TXN_STATE (48) when the partition is not in the transaction (or
    /// may not be added), INVALID_PRODUCER_EPOCH (47) for a fenced producer (the
    /// coordinator's PRODUCER_FENCED, as a partition answers it),
    /// INVALID_PRODUCER_ID_MAPPING (49), CONCURRENT_TRANSACTIONS (51),
    /// NOT_ENOUGH_REPLICAS (19, retriable, as Kafka maps a coordinator it cannot reach)
    /// when no coordinator answers.
    pub async fn verify_write(
        &self,
        transactional_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        topic: &str,
        partition: i32,
        add: bool,
    ) -> Result<(), ResponseError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(IMPLICIT_ADD_RETRY_MS);
        loop {
            let result = self
                .verify_write_once(
                    transactional_id,
                    (producer_id, producer_epoch),
                    topic,
                    partition,
                    add,
                )
                .await;
            match result {
                Err(ResponseError::ConcurrentTransactions)
                    if add && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(IMPLICIT_ADD_BACKOFF_MS)).await;
                }
                other => return other,
            }
        }
    }

    async fn verify_write_once(
        &self,
        transactional_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        topic: &str,
        partition: i32,
        add: bool,
    ) -> Result<(), ResponseError> {
        let me = self.metadata.node_id();
        let wanted = [(topic.to_string(), partition)];
        let unreachable = |e: ResponseError| match e {
            ResponseError::NotCoordinator
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::CoordinatorLoadInProgress
            | ResponseError::NetworkException
            | ResponseError::NotLeaderOrFollower => ResponseError::NotEnoughReplicas,
            // What a partition answers a fenced epoch (the log's own check): clients
            // treat 47 in a Produce as fenced and fatal, 90 as abortable.
            ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch,
            other => other,
        };
        match self.coordinator_of(transactional_id) {
            Some(c) if c == me && add => self
                .add_partitions(transactional_id, producer_id, producer_epoch, &wanted, true)
                .await
                .map_err(unreachable),
            Some(c) if c == me => {
                let per = self
                    .verify_partitions(transactional_id, producer_id, producer_epoch, &wanted)
                    .map_err(unreachable)?;
                per.into_iter().flatten().next().map_or(Ok(()), Err)
            }
            Some(c) if c >= 0 => self
                .markers
                .verify_or_add_remote(
                    c,
                    transactional_id,
                    (producer_id, producer_epoch),
                    topic,
                    partition,
                    !add,
                )
                .await
                .map_err(unreachable),
            _ => Err(ResponseError::NotEnoughReplicas),
        }
    }

    /// EndTxn: logs PrepareCommit (or PrepareAbort), then writes the markers and logs
    /// CompleteCommit/CompleteAbort. Answers once the decision is logged and replicated
    /// and the markers are written, or [`END_TXN_MARKER_WAIT_MS`] later while they are
    /// still being written (the outcome is decided; a partition whose leader is away
    /// gets its marker when it returns). A retry of a completed EndTxn succeeds.
    ///
    /// `epoch_bump` is KIP-890 part 2 (EndTxn v5, transaction version 2): the decision is
    /// logged with the epoch bumped, the markers carry it, and the answer is the producer
    /// id and epoch the producer goes on with (a new id with epoch 0 when the epoch runs
    /// out); a retry with the epoch before the bump is answered as the first was; an
    /// abort with no transaction open bumps the epoch too. Without it the answer is
    /// `None` and the epoch stays (Kafka's transaction version 0/1).
    ///
    /// Errors: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
    /// INVALID_PRODUCER_ID_MAPPING (49), PRODUCER_FENCED (90), INVALID_TXN_STATE (48)
    /// (nothing open, or the other outcome already decided), CONCURRENT_TRANSACTIONS (51)
    /// while the same outcome is still being completed, COORDINATOR_NOT_AVAILABLE (15),
    /// UNKNOWN_SERVER_ERROR (-1) when an exhausted epoch needs a producer id and none can
    /// be allocated.
    pub async fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        epoch_bump: bool,
    ) -> Result<Option<(i64, i16)>, ResponseError> {
        self.coordinating(transactional_id)?;
        // An exhausted epoch needs a new producer id: allocated before the lock is taken
        // (it may write a reservation to the metadata log).
        let exhausted = epoch_bump
            && self
                .lock()
                .get(transactional_id)
                .is_some_and(|e| e.record.producer_epoch >= EPOCH_EXHAUSTED);
        let next_producer_id = if exhausted {
            Some(self.metadata.next_producer_id().map_err(|e| {
                tracing::error!(error = %e, "cannot allocate a producer id");
                ResponseError::UnknownServerError
            })?)
        } else {
            None
        };
        let (record, prior_epoch) = {
            let mut txns = self.lock();
            let decided = if epoch_bump {
                Self::decide_end_v2(
                    txns.get(transactional_id),
                    producer_id,
                    producer_epoch,
                    commit,
                    next_producer_id,
                )?
            } else {
                Self::decide_end_v1(
                    txns.get(transactional_id),
                    producer_id,
                    producer_epoch,
                    commit,
                )?
            };
            let (record, prior_epoch) = match decided {
                EndDecision::AlreadyDone(answer) => return Ok(epoch_bump.then_some(answer)),
                EndDecision::Prepare(record, prior_epoch) => (record, prior_epoch),
            };
            if let Some(e) = txns.get_mut(transactional_id) {
                e.writing = true;
            }
            (record, prior_epoch)
        };
        let written = self.write_state(transactional_id, Some(&record)).await;
        {
            let mut txns = self.lock();
            match txns.get_mut(transactional_id) {
                Some(e) => {
                    e.writing = false;
                    written?;
                    if e.record.producer_id != record.producer_id
                        || e.record.producer_epoch != prior_epoch
                    {
                        return Err(ResponseError::ProducerFenced);
                    }
                    if record.producer_epoch != prior_epoch {
                        e.last_epoch = prior_epoch;
                    }
                    e.record = record.clone();
                }
                None => return Err(ResponseError::ProducerFenced),
            }
        }
        self.start_completion(transactional_id);
        self.wait_completed(transactional_id, END_TXN_MARKER_WAIT_MS)
            .await;
        let answer = match record.next_producer_id {
            next if next >= 0 => (next, 0),
            _ => (record.producer_id, record.producer_epoch),
        };
        Ok(epoch_bump.then_some(answer))
    }

    /// EndTxn v0–v4 (transaction version 0/1): the epoch stays.
    fn decide_end_v1(
        entry: Option<&TxnEntry>,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<EndDecision, ResponseError> {
        let e = Self::check_producer(entry, producer_id, producer_epoch)?;
        if e.writing {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let current = (e.record.producer_id, e.record.producer_epoch);
        match (e.record.state, commit) {
            (TxnState::Ongoing, _) if !e.completing => {}
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                return Ok(EndDecision::AlreadyDone(current))
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                return Err(ResponseError::ConcurrentTransactions)
            }
            _ => return Err(ResponseError::InvalidTxnState),
        }
        let mut r = e.record.clone();
        r.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        r.last_update_ms = now_ms();
        r.client_transaction_version = 0;
        r.previous_producer_id = -1;
        r.next_producer_id = -1;
        Ok(EndDecision::Prepare(r, e.record.producer_epoch))
    }

    /// EndTxn v5 (KIP-890 part 2, Kafka's `TransactionCoordinator.endTransaction` with
    /// transaction version 2): which requests are retries of one already decided (the
    /// epoch one below the bumped one, or the last epoch of the producer id an exhausted
    /// epoch replaced), and the transitions:
    ///
    /// | state | commit | abort |
    /// |---|---|---|
    /// | Ongoing | bump → PrepareCommit | bump → PrepareAbort |
    /// | Empty | INVALID_TXN_STATE | bump → PrepareAbort (nothing to mark) |
    /// | CompleteCommit | retry: done; else INVALID_TXN_STATE | retry: INVALID_TXN_STATE; else bump → PrepareAbort |
    /// | CompleteAbort | INVALID_TXN_STATE | retry: done; else bump → PrepareAbort |
    ///
    /// While a transition is in progress (PrepareCommit/PrepareAbort: markers going out)
    /// every EndTxn v5 gets CONCURRENT_TRANSACTIONS first, as Kafka answers its pending
    /// state.
    fn decide_end_v2(
        entry: Option<&TxnEntry>,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        next_producer_id: Option<i64>,
    ) -> Result<EndDecision, ResponseError> {
        let Some(e) = entry else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        // Kafka's first check: a transition in progress (logging a change, or the markers
        // of a decided transaction still going out) answers CONCURRENT_TRANSACTIONS
        // whatever the request, and the client retries it.
        if e.writing
            || e.completing
            || matches!(
                e.record.state,
                TxnState::PrepareCommit | TxnState::PrepareAbort
            )
        {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let r = &e.record;
        let retry_on_bump = i32::from(r.producer_epoch) == i32::from(producer_epoch) + 1;
        let retry_on_overflow = r.previous_producer_id >= 0
            && r.previous_producer_id == producer_id
            && producer_epoch == EPOCH_EXHAUSTED
            && r.producer_epoch == 0;
        let retry = retry_on_bump || retry_on_overflow;
        if r.producer_id != producer_id && !retry_on_overflow {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        let valid_epoch = match r.state {
            TxnState::Ongoing | TxnState::Empty => producer_epoch == r.producer_epoch,
            // (Answered CONCURRENT_TRANSACTIONS above.)
            TxnState::PrepareCommit | TxnState::PrepareAbort => retry_on_bump,
            TxnState::CompleteCommit | TxnState::CompleteAbort => {
                retry || producer_epoch == r.producer_epoch
            }
            TxnState::Dead | TxnState::PrepareEpochFence => producer_epoch == r.producer_epoch,
        };
        if !valid_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        let current = (r.producer_id, r.producer_epoch);
        if r.producer_epoch >= EPOCH_EXHAUSTED && next_producer_id.is_none() {
            // The epoch ran out after `end_txn` looked (a timeout abort bumped it): no
            // producer id was allocated for it yet; the client retries.
            return Err(ResponseError::ConcurrentTransactions);
        }
        let prepare = |state: TxnState| {
            let mut next = r.clone();
            next.state = state;
            let now = now_ms();
            next.last_update_ms = now;
            if r.state != TxnState::Ongoing {
                // An abort with nothing open: only the epoch moves.
                next.partitions.clear();
                next.start_ms = now;
            }
            next.client_transaction_version = TV2;
            next.previous_producer_id = -1;
            match next_producer_id {
                Some(id) => {
                    next.producer_epoch = r.producer_epoch.saturating_add(1);
                    next.next_producer_id = id;
                }
                None => {
                    // Below EPOCH_EXHAUSTED (checked above): no overflow.
                    next.producer_epoch = r.producer_epoch + 1;
                    next.next_producer_id = -1;
                }
            }
            EndDecision::Prepare(next, r.producer_epoch)
        };
        match (r.state, commit) {
            (TxnState::Ongoing, _) if e.completing => Err(ResponseError::ConcurrentTransactions),
            (TxnState::Ongoing, true) => Ok(prepare(TxnState::PrepareCommit)),
            (TxnState::Ongoing, false) => Ok(prepare(TxnState::PrepareAbort)),
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) if retry => {
                Ok(EndDecision::AlreadyDone(current))
            }
            (TxnState::CompleteCommit, false) if !retry => Ok(prepare(TxnState::PrepareAbort)),
            (TxnState::CompleteAbort | TxnState::Empty, false) => {
                Ok(prepare(TxnState::PrepareAbort))
            }
            _ => Err(ResponseError::InvalidTxnState),
        }
    }

    /// Waits until `id` is no longer completing, at most `timeout_ms`; whether it is done.
    async fn wait_completed(&self, id: &str, timeout_ms: u64) -> bool {
        let mut rx = self.completed.subscribe();
        let done = |this: &Self| {
            this.lock().get(id).is_none_or(|e| {
                !e.completing
                    && !matches!(
                        e.record.state,
                        TxnState::PrepareCommit | TxnState::PrepareAbort
                    )
            })
        };
        let wait = async {
            loop {
                if done(self) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(timeout_ms), wait).await;
        done(self)
    }

    /// Starts writing the markers of `id`'s PrepareCommit/PrepareAbort transaction (once:
    /// a completion already running is left alone), on a task of its own on the broker's
    /// runtime.
    fn start_completion(&self, id: &str) {
        let job = {
            let mut txns = self.lock();
            let Some(e) = txns.get_mut(id) else { return };
            if e.completing
                || !matches!(
                    e.record.state,
                    TxnState::PrepareCommit | TxnState::PrepareAbort
                )
            {
                return;
            }
            e.completing = true;
            e.record.clone()
        };
        let Some(this) = self.this.upgrade() else {
            return;
        };
        let id = id.to_string();
        let task = async move { this.complete(id, job).await };
        match &self.home {
            Some(home) => drop(home.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    /// Writes the markers of `record` (PrepareCommit/PrepareAbort) until every partition
    /// has one (or is gone), then logs CompleteCommit/CompleteAbort. Stops when this broker
    /// stops coordinating the id (the new coordinator resumes from the log).
    async fn complete(self: Arc<Self>, id: String, record: TxnRecord) {
        // Should the task be dropped before it ends (its runtime shutting down), the id is
        // not left `completing` forever: the next timer tick starts it again.
        let mut guard = CompletionGuard {
            coordinator: Some(self.clone()),
            id: id.clone(),
        };
        self.complete_markers(&id, record).await;
        guard.coordinator = None;
    }

    async fn complete_markers(&self, id: &str, record: TxnRecord) {
        let commit = record.state == TxnState::PrepareCommit;
        let mut left: Vec<(String, i32)> = record.partitions.iter().cloned().collect();
        let mut rounds = 0u32;
        loop {
            let Some(coordinator_epoch) = self.coordinator_epoch(id) else {
                tracing::info!(transactional_id = %id, "no longer the coordinator: markers left to the new one");
                self.finish_completion(id, None);
                return;
            };
            left = self
                .markers
                .write(
                    record.producer_id,
                    record.producer_epoch,
                    commit,
                    coordinator_epoch,
                    left,
                )
                .await;
            if left.is_empty() {
                break;
            }
            rounds += 1;
            if rounds % 25 == 1 {
                tracing::warn!(transactional_id = %id, partitions = ?left, "transaction markers not written yet; retrying");
            }
            tokio::time::sleep(Duration::from_millis(MARKER_RETRY_MS)).await;
        }
        let mut done = TxnRecord {
            state: if commit {
                TxnState::CompleteCommit
            } else {
                TxnState::CompleteAbort
            },
            partitions: BTreeSet::new(),
            last_update_ms: now_ms(),
            start_ms: -1,
            ..record.clone()
        };
        if record.next_producer_id >= 0 {
            // An EndTxn v5 on an exhausted epoch: the markers went out with the old id at
            // the last epoch; the transactional id moves to the new one (KIP-890 part 2).
            done.previous_producer_id = record.producer_id;
            done.producer_id = record.next_producer_id;
            done.producer_epoch = 0;
            done.next_producer_id = -1;
        }
        // The outcome is in every partition now: a failed write of Complete* only means a
        // later coordinator writes the markers again.
        let logged = self.write_state(id, Some(&done)).await;
        if let Err(e) = logged {
            tracing::warn!(transactional_id = %id, error = ?e, "cannot log the transaction's completion");
        }
        self.finish_completion(id, Some((&record, done)));
    }

    /// Ends a completion of `id`; `done` is the Prepare* record it completed and the
    /// Complete* record logged, which becomes the state unless the state moved on.
    fn finish_completion(&self, id: &str, done: Option<(&TxnRecord, TxnRecord)>) {
        // (`CompletionGuard` calls this when a completion task is dropped.)
        {
            let mut txns = self.lock();
            if let Some(e) = txns.get_mut(id) {
                e.completing = false;
                if let Some((prepared, record)) = done {
                    if (
                        e.record.producer_id,
                        e.record.producer_epoch,
                        e.record.state,
                    ) == (
                        prepared.producer_id,
                        prepared.producer_epoch,
                        prepared.state,
                    ) {
                        e.record = record;
                    }
                }
            }
        }
        self.completed.send_modify(|n| *n += 1);
    }

    /// The coordinator epoch for `id`'s markers (the leader epoch of its partition here),
    /// `None` when this broker no longer leads it.
    fn coordinator_epoch(&self, id: &str) -> Option<i32> {
        let partitions = self.store.partitions()?;
        self.store.leader_epoch_here(partition_for(id, partitions))
    }

    /// Describes `transactional_id` (DescribeTransactions).
    ///
    /// Errors: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
    /// TRANSACTIONAL_ID_NOT_FOUND (105).
    pub fn describe(&self, transactional_id: &str) -> Result<TxnDescription, ResponseError> {
        self.coordinating(transactional_id)?;
        let txns = self.lock();
        let e = txns
            .get(transactional_id)
            .ok_or(ResponseError::TransactionalIdNotFound)?;
        Ok(describe(transactional_id, e))
    }

    /// Every transaction this broker coordinates (ListTransactions), after loading every
    /// partition it leads.
    pub fn list(&self) -> Vec<TxnDescription> {
        self.load_led_partitions();
        let txns = self.lock();
        let mut out: Vec<TxnDescription> = txns.iter().map(|(id, e)| describe(id, e)).collect();
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        out
    }

    fn load_led_partitions(&self) {
        let Some(partitions) = self.store.partitions() else {
            return;
        };
        for index in 0..partitions {
            if let Some(epoch) = self.store.leader_epoch_here(index) {
                let _ = self.ensure_loaded(index, epoch);
            }
        }
    }

    /// One pass of the timers: loads newly led partitions (resuming their completions),
    /// aborts transactions open past their timeout (fencing the producer with an epoch
    /// bump, as Kafka's `abortTimedOutTransactions`), and, when `expire` is set, forgets
    /// ids idle past `transactional.id.expiration.ms` (a tombstone).
    async fn tick(&self, expire: bool) {
        self.load_led_partitions();
        let now = now_ms();
        let (orphaned, timed_out, expired) = {
            let mut txns = self.lock();
            // Prepared with no completion running: its task was dropped (see `complete`).
            let orphaned: Vec<String> = txns
                .iter()
                .filter(|(_, e)| {
                    !e.completing
                        && matches!(
                            e.record.state,
                            TxnState::PrepareCommit | TxnState::PrepareAbort
                        )
                })
                .map(|(id, _)| id.clone())
                .collect();
            let timed_out: Vec<(String, TxnRecord)> = txns
                .iter_mut()
                .filter(|(_, e)| {
                    !e.completing
                        && !e.writing
                        && e.record.state == TxnState::Ongoing
                        && e.record.start_ms + i64::from(e.record.timeout_ms) < now
                })
                .map(|(id, e)| {
                    // Kafka's pending PrepareEpochFence: an add or an EndTxn meanwhile
                    // gets CONCURRENT_TRANSACTIONS, none is lost under the abort.
                    e.writing = true;
                    (id.clone(), e.record.clone())
                })
                .collect();
            let expired: Vec<String> = if expire {
                txns.iter()
                    .filter(|(_, e)| {
                        !e.completing
                            && matches!(
                                e.record.state,
                                TxnState::Empty
                                    | TxnState::CompleteCommit
                                    | TxnState::CompleteAbort
                            )
                            && e.record.last_update_ms + self.settings.id_expiration_ms < now
                    })
                    .map(|(id, _)| id.clone())
                    .collect()
            } else {
                Vec::new()
            };
            (orphaned, timed_out, expired)
        };
        for id in orphaned {
            if self.coordinator_epoch(&id).is_some() {
                self.start_completion(&id);
            }
        }
        for (id, record) in timed_out {
            let fenced = TxnRecord {
                // Up to i16::MAX: under transaction version 2, i16::MAX - 1 is an epoch
                // like another, and the abort must still fence it (the next
                // InitProducerId or EndTxn v5 moves to a new producer id).
                producer_epoch: record.producer_epoch.saturating_add(1),
                state: TxnState::PrepareAbort,
                last_update_ms: now,
                // Kafka logs the cluster's transaction version here. At 2 the epoch bump
                // fences late writes of the aborted transaction, so the producer's next
                // one may start with an implicit add.
                client_transaction_version: if self.settings.version >= TV2 {
                    TV2
                } else {
                    record.client_transaction_version
                },
                ..record.clone()
            };
            tracing::info!(
                transactional_id = %id,
                producer_id = record.producer_id,
                timeout_ms = record.timeout_ms,
                "transaction open past its timeout: aborting it"
            );
            let written = self.write_state(&id, Some(&fenced)).await;
            if self
                .finish_write(&id, &fenced, record.producer_epoch, written)
                .is_err()
            {
                continue;
            }
            self.start_completion(&id);
        }
        for id in expired {
            if self.write_state(&id, None).await.is_ok() {
                self.lock().remove(&id);
                tracing::info!(transactional_id = %id, "transactional id expired");
            }
        }
    }

    /// The coordinator's timers until `shutdown`: every
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms` a [`tick`] (loads,
    /// timeouts), and expiry every
    /// `transaction.remove.expired.transaction.cleanup.interval.ms`.
    ///
    /// [`tick`]: TransactionCoordinator::tick
    pub async fn run_timers(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let every = Duration::from_millis(self.settings.abort_timed_out_interval_ms.max(10));
        let expire_every = self.settings.remove_expired_interval_ms.max(10);
        let mut last_expiry = now_ms();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
            let now = now_ms();
            let expire = now - last_expiry >= expire_every as i64;
            if expire {
                last_expiry = now;
            }
            self.tick(expire).await;
        }
    }
}

/// `epoch + 1`, kept below `i16::MAX` (an exhausted epoch gets a new producer id at the
/// next InitProducerId).
fn bump(epoch: i16) -> i16 {
    epoch.saturating_add(1).min(i16::MAX - 1)
}

fn describe(id: &str, e: &TxnEntry) -> TxnDescription {
    TxnDescription {
        transactional_id: id.to_string(),
        state: e.record.state,
        producer_id: e.record.producer_id,
        producer_epoch: e.record.producer_epoch,
        timeout_ms: e.record.timeout_ms,
        start_ms: e.record.start_ms,
        partitions: e.record.partitions.iter().cloned().collect(),
    }
}

#[cfg(test)]
mod tests;
