//! The Kafka protocol layer: the dispatch table from API key to handler, request and
//! response codecs (the `kafka-protocol` crate), version gating and error mapping.
//!
//! Owns: [`SUPPORTED_APIS`] — the single table ApiVersions is built from, so an API is
//! advertised exactly when it has a handler here, at exactly the versions listed;
//! decoding a frame into a request; encoding the response with the right header version.
//!
//! Never does: hold state of its own (every handler calls the owners in [`Context`]),
//! file I/O, or spawn long-lived tasks. No `unwrap` on anything from the network: a frame
//! that does not decode closes the connection with a log line (Kafka does the same).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::group::GroupCoordinator;
use crate::ingest::Ingest;
use crate::replica::ReplicaManager;
use crate::server::{Outcome, RequestHandler};
use crate::topics::Topics;
use crate::transform::inline::InlineRegistry;

mod add_offsets_to_txn;
mod add_partitions_to_txn;
mod alter_configs;
mod alter_partition_reassignments;
mod alter_replica_log_dirs;
mod api_versions;
mod consumer_group_describe;
mod consumer_group_heartbeat;
mod create_partitions;
mod create_topics;
mod delete_groups;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod describe_log_dirs;
mod describe_producers;
mod describe_quorum;
mod describe_transactions;
mod elect_leaders;
mod end_txn;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod incremental_alter_configs;
mod init_producer_id;
mod join_group;
mod leave_group;
pub(crate) mod legacy;
mod list_groups;
mod list_offsets;
mod list_partition_reassignments;
mod list_transactions;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod offset_for_leader_epoch;
pub mod produce;
pub mod records;
mod sync_group;
mod txn_offset_commit;
mod write_txn_markers;

/// One implemented API: its key and the version range implemented and tested.
#[derive(Debug, Clone, Copy)]
pub struct ApiSpec {
    /// The API key.
    pub key: ApiKey,
    /// Lowest version handled.
    pub min_version: i16,
    /// Highest version handled.
    pub max_version: i16,
}

const fn api(key: ApiKey, min_version: i16, max_version: i16) -> ApiSpec {
    ApiSpec {
        key,
        min_version,
        max_version,
    }
}

/// The dispatch table. ApiVersions answers with exactly this list. Ranges cover what real
/// clients negotiate: librdkafka 2.x (Metadata ≤ 13, Produce ≤ 10, Fetch ≤ 16), kafkajs
/// (non-flexible: Metadata 6, Produce 7, Fetch 11), kafka-python 3, aiokafka (ApiVersions
/// v0, Metadata v5), the Java client. Lower bounds are the `kafka-protocol` crate's.
pub const SUPPORTED_APIS: &[ApiSpec] = &[
    api(ApiKey::Produce, 3, 12),
    api(ApiKey::Fetch, 4, 16),
    api(ApiKey::ListOffsets, 1, 8),
    api(ApiKey::OffsetForLeaderEpoch, 2, 4),
    api(ApiKey::Metadata, 0, 13),
    api(ApiKey::ApiVersions, 0, 4),
    api(ApiKey::CreateTopics, 2, 7),
    api(ApiKey::DeleteTopics, 1, 6),
    api(ApiKey::InitProducerId, 0, 4),
    api(ApiKey::DescribeConfigs, 1, 4),
    api(ApiKey::CreatePartitions, 0, 3),
    api(ApiKey::AlterConfigs, 0, 2),
    api(ApiKey::IncrementalAlterConfigs, 0, 1),
    api(ApiKey::FindCoordinator, 0, 6),
    api(ApiKey::JoinGroup, 0, 9),
    api(ApiKey::SyncGroup, 0, 5),
    api(ApiKey::Heartbeat, 0, 4),
    api(ApiKey::LeaveGroup, 0, 5),
    api(ApiKey::OffsetCommit, 0, 9),
    api(ApiKey::OffsetFetch, 0, 9),
    api(ApiKey::ListGroups, 0, 5),
    api(ApiKey::DescribeGroups, 0, 6),
    api(ApiKey::DeleteGroups, 0, 2),
    api(ApiKey::OffsetDelete, 0, 0),
    api(ApiKey::DescribeCluster, 0, 2),
    api(ApiKey::DescribeQuorum, 0, 2),
    api(ApiKey::AlterPartitionReassignments, 0, 1),
    api(ApiKey::ListPartitionReassignments, 0, 0),
    api(ApiKey::ElectLeaders, 0, 2),
    api(ApiKey::DescribeLogDirs, 1, 4),
    // v0 has no codec in the crate (Kafka 4.0 dropped it).
    api(ApiKey::AlterReplicaLogDirs, 1, 2),
    api(ApiKey::DeleteRecords, 0, 2),
    api(ApiKey::AddPartitionsToTxn, 0, 4),
    api(ApiKey::AddOffsetsToTxn, 0, 3),
    api(ApiKey::EndTxn, 0, 5),
    // v0 has no codec in the crate (Kafka 4.0 dropped it); brokers send v1.
    api(ApiKey::WriteTxnMarkers, 1, 1),
    api(ApiKey::TxnOffsetCommit, 0, 5),
    api(ApiKey::DescribeProducers, 0, 0),
    api(ApiKey::DescribeTransactions, 0, 0),
    api(ApiKey::ListTransactions, 0, 1),
    // KIP-848; not advertised when group.coordinator.rebalance.protocols leaves out
    // `consumer` (api_versions.rs).
    api(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    api(ApiKey::ConsumerGroupDescribe, 0, 1),
];

/// The supported range of `key`, if it is implemented.
pub fn supported(key: ApiKey) -> Option<&'static ApiSpec> {
    SUPPORTED_APIS.iter().find(|a| a.key == key)
}

/// A host and port given to clients in Metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: i32,
}

/// What the handlers call: the owners, built and handed over by the composition root
/// (`broker`). Holds only references: the protocol layer has no state, and nothing below
/// it holds this (each layer gets its own dependencies from `broker`).
#[derive(Debug, Clone)]
pub struct Context {
    /// Broker configuration.
    pub config: Arc<BrokerConfig>,
    /// Cluster metadata (topics, ids, producer ids).
    pub metadata: Arc<Metadata>,
    /// Hosted partitions and their logs.
    pub replicas: Arc<ReplicaManager>,
    /// Consumer groups and committed offsets.
    pub groups: Arc<GroupCoordinator>,
    /// Transactional ids coordinated here (transactions, KIP-98).
    pub txn: Arc<crate::txn::TransactionCoordinator>,
    /// Topic creation and config changes (CreateTopics, auto-creation, AlterConfigs).
    pub topics: Topics,
    /// The name of the Kafka listener this request came in on (`listeners`, e.g.
    /// `PLAINTEXT`): Metadata, FindCoordinator and DescribeCluster give every broker's
    /// endpoint of this name.
    pub listener_name: String,
    /// What Metadata advertises for this broker on that listener.
    pub advertised: Endpoint,
    /// Inline transforms, applied to produced batches of their input topic.
    pub inline: Arc<InlineRegistry>,
    /// The broker's own writes: records an inline transform fails go to its dead-letter
    /// topic through it.
    pub ingest: Arc<Ingest>,
    /// The broker's metrics (request counts, bytes in and out per topic).
    pub metrics: crate::metrics::Metrics,
    /// Consumers' incremental fetch sessions (KIP-227), owned by `fetch_session`.
    pub fetch_sessions: Arc<crate::fetch_session::FetchSessions>,
}

/// Partition `index` of `topic` when this broker leads it: what Produce, ListOffsets and
/// a consumer's Fetch act on.
///
/// Errors: NOT_LEADER_OR_FOLLOWER (6) when the partition exists but another broker leads
/// it (this one hosts a follower replica, or none) — clients refresh Metadata and go to
/// the leader; UNKNOWN_TOPIC_OR_PARTITION (3) when the metadata has no such partition;
/// KAFKA_STORAGE_ERROR (56) when its log dir is offline (KIP-112).
pub(crate) fn leader_partition(
    ctx: &Context,
    topic: &str,
    index: i32,
) -> Result<Arc<crate::replica::Partition>, kafka_protocol::ResponseError> {
    use kafka_protocol::ResponseError;
    match ctx.replicas.partition(topic, index) {
        Some(p) if p.is_offline() => Err(ResponseError::KafkaStorageError),
        Some(p) if p.is_leader() => Ok(p),
        Some(_) => Err(ResponseError::NotLeaderOrFollower),
        None if ctx.metadata.image().partition(topic, index).is_some() => {
            Err(ResponseError::NotLeaderOrFollower)
        }
        None => Err(ResponseError::UnknownTopicOrPartition),
    }
}

/// Partition `index` of `topic` when this broker hosts a replica of it, leader or
/// follower: what a consumer's Fetch v11+ reads (KIP-392, reads from followers).
///
/// Errors: NOT_LEADER_OR_FOLLOWER (6) when the partition exists but this broker hosts no
/// replica of it; UNKNOWN_TOPIC_OR_PARTITION (3) when the metadata has no such partition;
/// KAFKA_STORAGE_ERROR (56) when its log dir is offline (KIP-112).
pub(crate) fn replica_partition(
    ctx: &Context,
    topic: &str,
    index: i32,
) -> Result<Arc<crate::replica::Partition>, kafka_protocol::ResponseError> {
    use kafka_protocol::ResponseError;
    match ctx.replicas.partition(topic, index) {
        Some(p) if p.is_offline() => Err(ResponseError::KafkaStorageError),
        Some(p) => Ok(p),
        None if ctx.metadata.image().partition(topic, index).is_some() => {
            Err(ResponseError::NotLeaderOrFollower)
        }
        None => Err(ResponseError::UnknownTopicOrPartition),
    }
}

/// PRODUCER_FENCED (90, KIP-588) as versions of an API before `since` know it:
/// INVALID_PRODUCER_EPOCH (47), as Kafka answers older clients.
pub(crate) fn fenced_before(
    error: kafka_protocol::ResponseError,
    version: i16,
    since: i16,
) -> kafka_protocol::ResponseError {
    use kafka_protocol::ResponseError;
    if error == ResponseError::ProducerFenced && version < since {
        ResponseError::InvalidProducerEpoch
    } else {
        error
    }
}

/// The protocol layer as the server sees it.
#[derive(Debug)]
pub struct Handler {
    ctx: Context,
}

impl Handler {
    /// A handler over the given owners.
    pub fn new(ctx: Context) -> Handler {
        Handler { ctx }
    }
}

/// Size of the fixed part every request header starts with: api key, version, correlation id.
const HEADER_PREFIX_BYTES: usize = 8;

impl RequestHandler for Handler {
    async fn handle(self: Arc<Self>, frame: Bytes, peer: SocketAddr) -> Outcome {
        let started = std::time::Instant::now();
        let key = frame.first_chunk::<2>().map(|k| i16::from_be_bytes(*k));
        let outcome = handle_frame(&self.ctx, frame, peer).await;
        if let Some(key) = key {
            self.ctx.metrics.request(key, started.elapsed());
        }
        outcome
    }
}

/// One request frame, decoded by [`decode_frame`].
#[derive(Debug)]
pub(crate) struct DecodedFrame {
    /// The API key, implemented (in [`SUPPORTED_APIS`]).
    pub key: ApiKey,
    /// The request version, inside the key's supported range.
    pub version: i16,
    /// The header's correlation id.
    pub correlation_id: i32,
    /// The request header.
    pub header: RequestHeader,
    /// The request body.
    pub request: RequestKind,
    /// Bytes left after the body (ignored, as Kafka does; logged).
    pub trailing: Bytes,
}

/// Decodes one request frame (without its size prefix): the fixed header prefix, the API
/// key and version against [`SUPPORTED_APIS`], the request header and the body.
///
/// Errors (never a panic): the [`Outcome`] to answer with instead — `Close` with the reason
/// for a short frame, an unknown or unsupported key or version, or bytes that do not
/// decode; `Respond` with UNSUPPORTED_VERSION for ApiVersions at an unknown version
/// (KIP-511).
pub(crate) fn decode_frame(mut frame: Bytes) -> Result<DecodedFrame, Outcome> {
    if frame.len() < HEADER_PREFIX_BYTES {
        return Err(Outcome::Close(format!(
            "frame of {} bytes is shorter than a request header",
            frame.len()
        )));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Err(Outcome::Close(format!("unknown API key {raw_key}")));
    };
    let Some(spec) = supported(key) else {
        return Err(Outcome::Close(format!(
            "API {key:?} (key {raw_key}) is not supported"
        )));
    };
    if version < spec.min_version || version > spec.max_version {
        if key == ApiKey::ApiVersions {
            // KIP-511: answer UNSUPPORTED_VERSION in a v0 body so the client retries lower.
            return Err(respond(
                ResponseKind::ApiVersions(api_versions::unsupported_version()),
                key,
                0,
                0,
                correlation_id,
            ));
        }
        return Err(Outcome::Close(format!(
            "{key:?} v{version} is outside the supported range v{}-v{}",
            spec.min_version, spec.max_version
        )));
    }
    let header_version = key.request_header_version(version);
    // The codec returns errors for malformed input; a panic inside it would be its bug, but
    // is caught here too, so one bad frame can only ever close its own connection.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let header = RequestHeader::decode(&mut frame, header_version)
            .map_err(|e| format!("bad {key:?} v{version} request header: {e}"))?;
        let request = if legacy::is_legacy_offset_commit(key, version) {
            RequestKind::OffsetCommit(
                legacy::decode_offset_commit(&mut frame, version)
                    .map_err(|e| format!("bad {key:?} v{version} request body: {e}"))?,
            )
        } else {
            RequestKind::decode(key, &mut frame, legacy::codec_version(key, version))
                .map_err(|e| format!("bad {key:?} v{version} request body: {e}"))?
        };
        Ok::<_, String>((header, request))
    }));
    let (header, request) = match decoded {
        Ok(Ok(d)) => d,
        Ok(Err(reason)) => return Err(Outcome::Close(reason)),
        Err(_) => {
            return Err(Outcome::Close(format!(
                "{key:?} v{version} request made the decoder panic"
            )))
        }
    };
    Ok(DecodedFrame {
        key,
        version,
        correlation_id,
        header,
        request,
        trailing: frame,
    })
}

/// Handles one request frame (without its size prefix).
pub async fn handle_frame(ctx: &Context, frame: Bytes, peer: SocketAddr) -> Outcome {
    let DecodedFrame {
        key,
        version,
        correlation_id,
        header,
        request,
        trailing,
    } = match decode_frame(frame) {
        Ok(d) => d,
        Err(outcome) => return outcome,
    };
    if !trailing.is_empty() {
        tracing::debug!(%peer, ?key, version, extra = ?&trailing[..trailing.len().min(32)], "trailing bytes after request body");
    }
    let client_id = header
        .client_id
        .as_ref()
        .map(|c| c.as_str().to_string())
        .unwrap_or_default();
    if let RequestKind::Fetch(request) = request {
        // Its record sets may stay in their files until the socket sends them.
        let (response, regions) = fetch::handle(ctx, request, version).await;
        fetch::count_bytes_out(ctx, &response);
        let outcome = fetch::encode(&response, regions, version, correlation_id);
        if let Outcome::RespondParts { parts, .. } = &outcome {
            let from_files: usize = parts
                .iter()
                .map(|part| match part {
                    crate::server::ResponsePart::File { len, .. } => *len,
                    crate::server::ResponsePart::Bytes(_) => 0,
                })
                .sum();
            ctx.metrics.sent_from_files(from_files as u64);
        }
        return outcome;
    }
    let response = match dispatch(ctx, request, version, &client_id, peer).await {
        Some(r) => r,
        None => return Outcome::NoResponse,
    };
    // Old versions whose body layout equals a newer one's are encoded as that one (the
    // header version is the same: both are non-flexible).
    respond(
        response,
        key,
        version,
        legacy::codec_version(key, version),
        correlation_id,
    )
}

/// Calls the handler of one decoded request. `None` means no response (acks=0).
async fn dispatch(
    ctx: &Context,
    request: RequestKind,
    version: i16,
    client_id: &str,
    peer: SocketAddr,
) -> Option<ResponseKind> {
    Some(match request {
        RequestKind::ApiVersions(r) => ResponseKind::ApiVersions(api_versions::handle(
            r,
            version,
            ctx.config.group.consumer_protocol_enabled,
            ctx.config.transaction.version,
        )),
        RequestKind::ConsumerGroupHeartbeat(r) => ResponseKind::ConsumerGroupHeartbeat(
            consumer_group_heartbeat::handle(ctx, r, version, client_id, peer),
        ),
        RequestKind::ConsumerGroupDescribe(r) => {
            ResponseKind::ConsumerGroupDescribe(consumer_group_describe::handle(ctx, r, version))
        }
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata::handle(ctx, r, version)),
        RequestKind::Produce(r) => {
            return produce::handle(ctx, r, version, client_id)
                .await
                .map(ResponseKind::Produce)
        }
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(list_offsets::handle(ctx, r, version))
        }
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch::handle(ctx, r))
        }
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(create_topics::handle(ctx, r, version))
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(delete_topics::handle(ctx, r, version))
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(create_partitions::handle(ctx, r, version))
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(describe_configs::handle(ctx, r, version))
        }
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(alter_configs::handle(ctx, r, version))
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            incremental_alter_configs::handle(ctx, r, version),
        ),
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(init_producer_id::handle(ctx, r, version).await)
        }
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(add_partitions_to_txn::handle(ctx, r, version).await)
        }
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(add_offsets_to_txn::handle(ctx, r, version).await)
        }
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(end_txn::handle(ctx, r, version).await),
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(txn_offset_commit::handle(ctx, r, version).await)
        }
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(describe_transactions::handle(ctx, r, version))
        }
        RequestKind::ListTransactions(r) => {
            ResponseKind::ListTransactions(list_transactions::handle(ctx, r, version))
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator::handle(ctx, r, version))
        }
        RequestKind::JoinGroup(r) => {
            ResponseKind::JoinGroup(join_group::handle(ctx, r, version, client_id, peer).await)
        }
        RequestKind::SyncGroup(r) => {
            ResponseKind::SyncGroup(sync_group::handle(ctx, r, version).await)
        }
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(heartbeat::handle(ctx, r, version)),
        RequestKind::LeaveGroup(r) => {
            ResponseKind::LeaveGroup(leave_group::handle(ctx, r, version))
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(offset_commit::handle(ctx, r, version).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(offset_fetch::handle(ctx, r, version))
        }
        RequestKind::ListGroups(r) => {
            ResponseKind::ListGroups(list_groups::handle(ctx, r, version))
        }
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(describe_groups::handle(ctx, r, version))
        }
        RequestKind::DeleteGroups(r) => {
            ResponseKind::DeleteGroups(delete_groups::handle(ctx, r, version))
        }
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(offset_delete::handle(ctx, r, version))
        }
        RequestKind::DescribeCluster(r) => {
            ResponseKind::DescribeCluster(describe_cluster::handle(ctx, r, version))
        }
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(describe_log_dirs::handle(ctx, r, version))
        }
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(alter_replica_log_dirs::handle(ctx, r, version))
        }
        RequestKind::DescribeQuorum(r) => {
            ResponseKind::DescribeQuorum(describe_quorum::handle(ctx, r, version).await)
        }
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            alter_partition_reassignments::handle(ctx, r, version),
        ),
        RequestKind::ListPartitionReassignments(r) => ResponseKind::ListPartitionReassignments(
            list_partition_reassignments::handle(ctx, r, version),
        ),
        RequestKind::ElectLeaders(r) => {
            ResponseKind::ElectLeaders(elect_leaders::handle(ctx, r, version))
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(delete_records::handle(ctx, r, version))
        }
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(describe_producers::handle(ctx, r, version))
        }
        RequestKind::WriteTxnMarkers(r) => {
            ResponseKind::WriteTxnMarkers(write_txn_markers::handle(ctx, r, version).await)
        }
        // Not in SUPPORTED_APIS, so `handle_frame` closed the connection before decoding.
        other => {
            tracing::error!(request = ?std::mem::discriminant(&other), "request for an API outside the dispatch table");
            return None;
        }
    })
}

/// Bytes to reserve for an encoded response: a Fetch response is mostly its record sets,
/// so reserve them up front instead of growing (and copying) the buffer as they go in.
fn size_hint(response: &ResponseKind) -> usize {
    match response {
        ResponseKind::Fetch(f) => {
            let records: usize = f
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.records.as_ref().map_or(0, |r| r.len()) + 128)
                .sum();
            records + 64 * f.responses.len() + 256
        }
        _ => 256,
    }
}

fn respond(
    response: ResponseKind,
    key: ApiKey,
    version: i16,
    body_version: i16,
    correlation_id: i32,
) -> Outcome {
    let mut buf = BytesMut::with_capacity(size_hint(&response));
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    if let Err(e) = header.encode(&mut buf, key.response_header_version(version)) {
        return Outcome::Close(format!("cannot encode {key:?} response header: {e}"));
    }
    if let Err(e) = response.encode(&mut buf, body_version) {
        return Outcome::Close(format!("cannot encode {key:?} v{version} response: {e}"));
    }
    Outcome::Respond(buf)
}
