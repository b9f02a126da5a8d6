//! An in-broker transactional producer: the part of a Kafka client's transaction manager
//! (Java's `TransactionManager`) that an exactly-once worker inside the broker needs —
//! one transactional id, its producer id and epoch, a sequence number per partition, and
//! the coordinator calls of one transaction (KIP-98; protocol guide "InitProducerId",
//! "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn").
//!
//! Each call goes to the broker coordinating the id (or the group): this broker's
//! [`TransactionCoordinator`] / [`GroupCoordinator`] in process when it is this one,
//! else the same request over the peer connection ([`PeerClients::call`]), answered by
//! that broker's handlers. Retriable answers (COORDINATOR_LOAD_IN_PROGRESS,
//! CONCURRENT_TRANSACTIONS, NOT_COORDINATOR while leadership moves, a lost connection)
//! are tried again for up to [`RETRY_FOR_MS`].
//!
//! The records themselves are written by the caller (`Ingest` with
//! [`TxnProducer::batch_producer`]) to partitions added first with
//! [`TxnProducer::add_partitions`], so a leader's KIP-890 check passes.
//!
//! After any failed call the producer forgets its id and epoch: the next
//! [`TxnProducer::begin`] calls InitProducerId again, which aborts whatever the failed
//! transaction left open (the coordinator bumps the epoch, fencing late writes of the
//! old one), as Kafka's clients recover from an abortable error.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, GroupId,
    InitProducerIdRequest, ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::TransactionCoordinator;
use crate::cluster::Metadata;
use crate::group::store::partition_for;
use crate::group::{GroupCoordinator, OffsetToCommit, TxnCommitRequest, OFFSETS_TOPIC};
use crate::peer::PeerClients;
use crate::worker_io::remote_group_coordinator;

/// How long one coordinator call is retried while the answer is retriable, in ms.
pub(crate) const RETRY_FOR_MS: u64 = 30_000;
/// Pause between two tries, in ms.
const RETRY_BACKOFF_MS: u64 = 100;
/// Longest wait for one remote answer.
const CALL_WAIT: Duration = Duration::from_secs(30);

/// What a transactional producer inside the broker reaches.
#[derive(Clone)]
pub(crate) struct TxnOwners {
    /// Coordinators and leaders.
    pub(crate) metadata: Arc<Metadata>,
    /// This broker's transaction coordinator.
    pub(crate) txn: Arc<TransactionCoordinator>,
    /// This broker's group coordinator.
    pub(crate) groups: Arc<GroupCoordinator>,
    /// Connections to the other brokers.
    pub(crate) peers: Arc<PeerClients>,
}

/// The producer id, epoch and next base sequence per partition that a transactional
/// batch is written with (shared with `Ingest`, which advances the sequences).
#[derive(Debug)]
pub(crate) struct BatchProducer {
    /// The transactional id (a forwarded Produce names it, for the leader's KIP-890 check).
    pub(crate) transactional_id: String,
    /// Producer id.
    pub(crate) producer_id: i64,
    /// Producer epoch.
    pub(crate) producer_epoch: i16,
    sequences: Mutex<HashMap<(String, i32), i32>>,
}

impl BatchProducer {
    /// The base sequence of the next batch of `count` records to `topic`-`partition`,
    /// advanced past them (Kafka's sequences wrap at `i32::MAX`).
    pub(crate) fn next_sequence(&self, topic: &str, partition: i32, count: usize) -> i32 {
        let mut sequences = self
            .sequences
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = sequences.entry((topic.to_string(), partition)).or_insert(0);
        let base = *next;
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        *next = if base > i32::MAX - count {
            count - (i32::MAX - base) - 1
        } else {
            base + count
        };
        base
    }
}

/// One transactional id's producer (see the module doc).
pub(crate) struct TxnProducer {
    owners: TxnOwners,
    transactional_id: String,
    timeout_ms: i32,
    producer: Option<Arc<BatchProducer>>,
    /// Partitions added to the open transaction.
    added: BTreeSet<(String, i32)>,
    /// Whether a transaction is open (begun and not ended).
    open: bool,
}

/// Whether an answer is worth another try.
fn retriable(e: ResponseError) -> bool {
    matches!(
        e,
        ResponseError::CoordinatorLoadInProgress
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::NotCoordinator
            | ResponseError::ConcurrentTransactions
            | ResponseError::NetworkException
            | ResponseError::RequestTimedOut
            | ResponseError::NotEnoughReplicas
            | ResponseError::NotEnoughReplicasAfterAppend
            | ResponseError::NotLeaderOrFollower
            | ResponseError::LeaderNotAvailable
    )
}

/// A remote coordinator's answer `code` (0: done) from broker `broker`.
fn answered(code: i16, broker: i32) -> Result<(), (ResponseError, String)> {
    match error_of(code) {
        None => Ok(()),
        Some(e) => Err((e, format!("at broker {broker}"))),
    }
}

fn error_of(code: i16) -> Option<ResponseError> {
    (code != 0)
        .then(|| ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError))
}

impl TxnProducer {
    /// A producer of `transactional_id` whose transactions time out after `timeout_ms`
    /// (at most `transaction.max.timeout.ms`). Nothing is asked before [`Self::begin`].
    pub(crate) fn new(owners: TxnOwners, transactional_id: String, timeout_ms: i32) -> Self {
        TxnProducer {
            owners,
            transactional_id,
            timeout_ms,
            producer: None,
            added: BTreeSet::new(),
            open: false,
        }
    }

    /// The producer id and epoch batches of the open transaction carry.
    pub(crate) fn batch_producer(&self) -> Option<Arc<BatchProducer>> {
        self.producer.clone()
    }

    /// Opens a transaction: gets a producer id and epoch first when there is none
    /// (InitProducerId, which aborts what an earlier incarnation left open).
    ///
    /// Errors: the coordinator's Kafka error and a message.
    pub(crate) async fn begin(&mut self) -> Result<(), String> {
        self.init().await?;
        self.added.clear();
        self.open = true;
        Ok(())
    }

    /// Gets a producer id and epoch when there is none (InitProducerId: what an earlier
    /// incarnation left open is aborted, so its offsets committed in that transaction
    /// stop being pending).
    ///
    /// Errors: the coordinator's Kafka error and a message.
    pub(crate) async fn init(&mut self) -> Result<(), String> {
        if self.producer.is_none() {
            let (producer_id, producer_epoch) = self
                .retrying("InitProducerId", |p| Box::pin(p.init_once()))
                .await?;
            tracing::info!(transactional_id = %self.transactional_id, producer_id, producer_epoch, "transactional producer initialised");
            self.producer = Some(Arc::new(BatchProducer {
                transactional_id: self.transactional_id.clone(),
                producer_id,
                producer_epoch,
                sequences: Mutex::new(HashMap::new()),
            }));
        }
        Ok(())
    }

    /// Adds `partitions` not added yet to the open transaction (AddPartitionsToTxn).
    ///
    /// Errors: as [`Self::begin`]; the producer is reset.
    pub(crate) async fn add_partitions(
        &mut self,
        partitions: &[(String, i32)],
    ) -> Result<(), String> {
        let new: Vec<(String, i32)> = partitions
            .iter()
            .filter(|p| !self.added.contains(*p))
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let result = self
            .retrying("AddPartitionsToTxn", |p| {
                let new = new.clone();
                Box::pin(async move { p.add_partitions_once(&new).await })
            })
            .await;
        self.settle(result)?;
        self.added.extend(new);
        Ok(())
    }

    /// Commits `offsets` (topic, partition, next offset) for `group` inside the open
    /// transaction: AddOffsetsToTxn at the transaction coordinator, then TxnOffsetCommit
    /// at the group's; visible only when the transaction commits.
    ///
    /// Errors: as [`Self::begin`]; the producer is reset.
    pub(crate) async fn send_offsets(
        &mut self,
        group: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<(), String> {
        let group = group.to_string();
        let g = group.clone();
        let result = self
            .retrying("AddOffsetsToTxn", |p| {
                let g = g.clone();
                Box::pin(async move { p.add_offsets_once(&g).await })
            })
            .await;
        self.settle(result)?;
        let offsets = offsets.to_vec();
        let result = self
            .retrying("TxnOffsetCommit", |p| {
                let (group, offsets) = (group.clone(), offsets.clone());
                Box::pin(async move { p.txn_offset_commit_once(&group, &offsets).await })
            })
            .await;
        self.settle(result)
    }

    /// Ends the open transaction (EndTxn): commits it with `commit`, else aborts it.
    /// Returns once the outcome is decided and its markers written (or the coordinator's
    /// marker wait passed).
    ///
    /// Errors: as [`Self::begin`]; the producer is reset (the next `begin` aborts what
    /// is left open).
    pub(crate) async fn end(&mut self, commit: bool) -> Result<(), String> {
        if !self.open {
            return Ok(());
        }
        let result = if self.added.is_empty() && commit {
            // Nothing was added: there is no transaction at the coordinator to end.
            Ok(())
        } else {
            self.retrying("EndTxn", move |p| Box::pin(p.end_once(commit)))
                .await
        };
        self.open = false;
        self.added.clear();
        self.settle(result)
    }

    /// Forgets the producer id and epoch after a failure (see the module doc).
    pub(crate) fn reset(&mut self) {
        self.producer = None;
        self.added.clear();
        self.open = false;
    }

    fn settle<T>(&mut self, result: Result<T, String>) -> Result<T, String> {
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// Runs `call` until it succeeds, fails with a non-retriable error, or
    /// [`RETRY_FOR_MS`] passed.
    async fn retrying<'a, T>(
        &'a self,
        what: &str,
        call: impl Fn(
            &'a Self,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, (ResponseError, String)>> + Send + 'a>,
        >,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(RETRY_FOR_MS);
        loop {
            match call(self).await {
                Ok(v) => return Ok(v),
                Err((e, message)) if retriable(e) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(transactional_id = %self.transactional_id, error = ?e, %message, "{what}: trying again");
                    tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
                }
                Err((e, message)) => {
                    return Err(format!(
                        "{what} of transactional id {}: Kafka error {e:?} ({}): {message}",
                        self.transactional_id,
                        e.code()
                    ))
                }
            }
        }
    }

    /// The broker coordinating the id: `None` for this one.
    fn txn_coordinator(&self) -> Result<Option<i32>, (ResponseError, String)> {
        self.owners.txn.ensure_state_topic().map_err(|e| {
            (
                e,
                "the transaction state topic cannot be created".to_string(),
            )
        })?;
        match self.owners.txn.coordinator_of(&self.transactional_id) {
            None | Some(-1) => Err((
                ResponseError::CoordinatorNotAvailable,
                "its __transaction_state partition has no leader".into(),
            )),
            Some(me) if me == self.owners.metadata.node_id() => Ok(None),
            Some(other) => Ok(Some(other)),
        }
    }

    fn ids(&self) -> Result<(i64, i16), (ResponseError, String)> {
        self.producer
            .as_ref()
            .map(|p| (p.producer_id, p.producer_epoch))
            .ok_or((
                ResponseError::InvalidProducerIdMapping,
                "no producer id".into(),
            ))
    }

    fn tid(&self) -> TransactionalId {
        TransactionalId(StrBytes::from_string(self.transactional_id.clone()))
    }

    async fn init_once(&self) -> Result<(i64, i16), (ResponseError, String)> {
        match self.txn_coordinator()? {
            None => self
                .owners
                .txn
                .init_producer_id(&self.transactional_id, self.timeout_ms, None)
                .await
                .map_err(|e| (e, "at this broker".into())),
            Some(broker) => {
                let request = InitProducerIdRequest::default()
                    .with_transactional_id(Some(self.tid()))
                    .with_transaction_timeout_ms(self.timeout_ms)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1);
                let r = self
                    .owners
                    .peers
                    .call(broker, &request, 4, CALL_WAIT)
                    .await?;
                answered(r.error_code, broker).map(|()| (r.producer_id.0, r.producer_epoch))
            }
        }
    }

    async fn add_partitions_once(
        &self,
        partitions: &[(String, i32)],
    ) -> Result<(), (ResponseError, String)> {
        let (producer_id, producer_epoch) = self.ids()?;
        match self.txn_coordinator()? {
            None => self
                .owners
                .txn
                .add_partitions(
                    &self.transactional_id,
                    producer_id,
                    producer_epoch,
                    partitions,
                    false,
                )
                .await
                .map_err(|e| (e, "at this broker".into())),
            Some(broker) => {
                let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
                for (t, p) in partitions {
                    by_topic.entry(t).or_default().push(*p);
                }
                let request = AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(self.tid())
                    .with_v3_and_below_producer_id(ProducerId(producer_id))
                    .with_v3_and_below_producer_epoch(producer_epoch)
                    .with_v3_and_below_topics(
                        by_topic
                            .into_iter()
                            .map(|(t, ps)| {
                                AddPartitionsToTxnTopic::default()
                                    .with_name(TopicName(StrBytes::from_string(t.to_string())))
                                    .with_partitions(ps)
                            })
                            .collect(),
                    );
                let r = self
                    .owners
                    .peers
                    .call(broker, &request, 3, CALL_WAIT)
                    .await?;
                let first = r
                    .results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| &t.results_by_partition)
                    .find_map(|p| error_of(p.partition_error_code));
                answered(first.map_or(r.error_code, |e| e.code()), broker)
            }
        }
    }

    async fn add_offsets_once(&self, group: &str) -> Result<(), (ResponseError, String)> {
        let (producer_id, producer_epoch) = self.ids()?;
        match self.txn_coordinator()? {
            None => {
                self.owners
                    .groups
                    .ensure_offsets_topic()
                    .map_err(|e| (e, "the offsets topic cannot be created".into()))?;
                let partitions = self
                    .owners
                    .metadata
                    .topic(OFFSETS_TOPIC)
                    .map(|t| t.partitions)
                    .ok_or((
                        ResponseError::CoordinatorNotAvailable,
                        "no offsets topic".into(),
                    ))?;
                let partition = (OFFSETS_TOPIC.to_string(), partition_for(group, partitions));
                self.owners
                    .txn
                    .add_partitions(
                        &self.transactional_id,
                        producer_id,
                        producer_epoch,
                        &[partition],
                        false,
                    )
                    .await
                    .map_err(|e| (e, "at this broker".into()))
            }
            Some(broker) => {
                let request = AddOffsetsToTxnRequest::default()
                    .with_transactional_id(self.tid())
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(producer_epoch)
                    .with_group_id(GroupId(StrBytes::from_string(group.to_string())));
                let r = self
                    .owners
                    .peers
                    .call(broker, &request, 3, CALL_WAIT)
                    .await?;
                answered(r.error_code, broker)
            }
        }
    }

    async fn txn_offset_commit_once(
        &self,
        group: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<(), (ResponseError, String)> {
        let (producer_id, producer_epoch) = self.ids()?;
        let coordinator = remote_group_coordinator(&self.owners.metadata, group)
            .map_err(|m| (ResponseError::CoordinatorNotAvailable, m))?;
        match coordinator {
            None => {
                let req = TxnCommitRequest {
                    group_id: group.to_string(),
                    producer_id,
                    producer_epoch,
                    generation_id: -1,
                    member_id: String::new(),
                    group_instance_id: None,
                    offsets: OffsetToCommit::from_progress(offsets),
                };
                if let Some(e) = self
                    .owners
                    .groups
                    .txn_commit(&req)
                    .into_iter()
                    .flatten()
                    .next()
                {
                    return Err((e, "at this broker".into()));
                }
                self.owners
                    .groups
                    .await_replicated(group)
                    .await
                    .map_err(|e| (e, "at this broker".into()))
            }
            Some(broker) => {
                let mut by_topic: std::collections::BTreeMap<&str, Vec<(i32, i64)>> =
                    Default::default();
                for (t, p, o) in offsets {
                    by_topic.entry(t).or_default().push((*p, *o));
                }
                let request = TxnOffsetCommitRequest::default()
                    .with_transactional_id(self.tid())
                    .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(producer_epoch)
                    .with_generation_id(-1)
                    .with_topics(
                        by_topic
                            .into_iter()
                            .map(|(t, ps)| {
                                TxnOffsetCommitRequestTopic::default()
                                    .with_name(TopicName(StrBytes::from_string(t.to_string())))
                                    .with_partitions(
                                        ps.into_iter()
                                            .map(|(p, o)| {
                                                TxnOffsetCommitRequestPartition::default()
                                                    .with_partition_index(p)
                                                    .with_committed_offset(o)
                                                    .with_committed_leader_epoch(-1)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    );
                let r = self
                    .owners
                    .peers
                    .call(broker, &request, 3, CALL_WAIT)
                    .await?;
                let first = r
                    .topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .find(|p| p.error_code != 0);
                answered(first.map_or(0, |p| p.error_code), broker)
            }
        }
    }

    async fn end_once(&self, commit: bool) -> Result<(), (ResponseError, String)> {
        let (producer_id, producer_epoch) = self.ids()?;
        match self.txn_coordinator()? {
            None => self
                .owners
                .txn
                .end_txn(
                    &self.transactional_id,
                    producer_id,
                    producer_epoch,
                    commit,
                    false,
                )
                .await
                .map(|_| ())
                .map_err(|e| (e, "at this broker".into())),
            Some(broker) => {
                let request = EndTxnRequest::default()
                    .with_transactional_id(self.tid())
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(producer_epoch)
                    .with_committed(commit);
                let r = self
                    .owners
                    .peers
                    .call(broker, &request, 3, CALL_WAIT)
                    .await?;
                answered(r.error_code, broker)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_advance_per_partition_and_wrap_at_i32_max() {
        let p = BatchProducer {
            transactional_id: "t".into(),
            producer_id: 1,
            producer_epoch: 0,
            sequences: Mutex::new(HashMap::new()),
        };
        assert_eq!(p.next_sequence("a", 0, 3), 0);
        assert_eq!(p.next_sequence("a", 0, 2), 3);
        assert_eq!(p.next_sequence("a", 1, 1), 0);
        assert_eq!(p.next_sequence("b", 0, 1), 0);
        p.sequences
            .lock()
            .unwrap()
            .insert(("a".into(), 0), i32::MAX - 1);
        // i32::MAX - 1 and i32::MAX, then 0 and 1: the next is 2.
        assert_eq!(p.next_sequence("a", 0, 4), i32::MAX - 1);
        assert_eq!(p.next_sequence("a", 0, 1), 2);
    }
}
