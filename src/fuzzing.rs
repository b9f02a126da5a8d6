//! Entry points for fuzzing: the decoders that read bytes from the network or from a
//! plugin, wrapped so the cargo-fuzz targets in `fuzz/` and the bounded property tests run
//! by `cargo test` feed them exactly as the broker does. Not an API (hidden from the docs);
//! it widens no module's visibility, it only calls through.
//!
//! Owns: the properties every input must keep — no panic, and a decoded input that
//! re-encodes decodes to the same value — written as `assert!`s, so a fuzzer (which
//! treats a panic as a crash) and a test see the same failure; and the valid seed inputs
//! (request frames of every supported API and version, produced batches in every codec,
//! transform outputs) that fuzzers start from and tests mutate. Never does: I/O, or
//! change what the wrapped decoders accept.
//!
//! Entry points, one per decoder:
//!
//! | function               | decoder                                              | bytes from |
//! |------------------------|------------------------------------------------------|------------|
//! | [`request_frame`]      | `protocol::decode_frame` (header + body, every API)  | a client   |
//! | [`produce_payload`]    | `log::split_batches`, `protocol::records::validate_records`, `log::rewrite::decode_records` | a client's Produce |
//! | [`transform_output`]   | `plugin::transform::decode_output` ("weir batch v1") | a plugin   |

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::{Encodable, StrBytes};

use crate::log::rewrite::{decode_records, BatchBuilder};
use crate::log::{split_batches, Compression};
use crate::protocol::records::{validate_records, RecordLimits};
use crate::protocol::{decode_frame, legacy, SUPPORTED_APIS};
use crate::server::Outcome;

/// What [`request_frame`] made of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameVerdict {
    /// Decoded into a request of this API key and version (handed to its handler).
    Request {
        /// The API key.
        api_key: i16,
        /// The request version.
        version: i16,
    },
    /// Answered without a handler (ApiVersions at an unsupported version, KIP-511).
    Respond,
    /// The connection is closed, for this reason.
    Close(String),
}

/// Decodes one request frame (the bytes after the 4-byte size prefix) as the broker does
/// before dispatching it, then re-encodes a decoded request (which must not panic either).
///
/// Equality after a round trip is not asserted here: for arbitrary bytes it does not hold
/// in `kafka-protocol` 0.18 (an unknown tagged field whose tag is 2^31 or more decodes, but
/// the encoder drops it while still counting it, found by `fuzz/`). weir never re-encodes
/// a request, so that is no fault of the broker's; [`request_frame_round_trips`] asserts
/// the round trip for the valid frames clients send.
pub fn request_frame(frame: &[u8]) -> FrameVerdict {
    let decoded = match decode_frame(Bytes::copy_from_slice(frame)) {
        Ok(d) => d,
        Err(Outcome::Close(reason)) => return FrameVerdict::Close(reason),
        Err(Outcome::Respond(_) | Outcome::RespondParts { .. }) => return FrameVerdict::Respond,
        Err(Outcome::NoResponse) => panic!("decode_frame never answers NoResponse"),
    };
    if !legacy::is_legacy_offset_commit(decoded.key, decoded.version) {
        let _ = encode_frame(
            decoded.key,
            decoded.version,
            &decoded.header,
            &decoded.request,
        );
    }
    FrameVerdict::Request {
        api_key: decoded.key as i16,
        version: decoded.version,
    }
}

/// Asserts that `frame` decodes, and that its request re-encoded at the same version
/// decodes to the same header and request (OffsetCommit v0–v1, decoded by hand, only
/// decode). Meant for valid frames: [`seed_request_frames`] and frames tests build.
pub fn request_frame_round_trips(frame: &[u8]) {
    let decoded = match decode_frame(Bytes::copy_from_slice(frame)) {
        Ok(d) => d,
        Err(Outcome::Close(reason)) => panic!("frame does not decode: {reason}"),
        Err(_) => panic!("frame is not a request"),
    };
    assert!(decoded.trailing.is_empty(), "trailing bytes after the body");
    if legacy::is_legacy_offset_commit(decoded.key, decoded.version) {
        return; // the crate has no encoder for these versions
    }
    let again = encode_frame(
        decoded.key,
        decoded.version,
        &decoded.header,
        &decoded.request,
    )
    .expect("a decoded request re-encodes");
    match decode_frame(again) {
        Ok(d) => {
            assert_eq!(d.header, decoded.header, "request header round trip");
            assert_eq!(d.request, decoded.request, "request body round trip");
            assert!(d.trailing.is_empty(), "re-encoded frame has trailing bytes");
        }
        Err(Outcome::Close(reason)) => panic!("re-encoded request does not decode: {reason}"),
        Err(_) => panic!("re-encoded request is not a request"),
    }
}

/// Header then body at the codec version the broker decodes `(key, version)` with; `None`
/// when the crate refuses to encode the value at that version.
fn encode_frame(
    key: ApiKey,
    version: i16,
    header: &RequestHeader,
    request: &RequestKind,
) -> Option<Bytes> {
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, key.request_header_version(version))
        .ok()?;
    request
        .encode(&mut buf, legacy::codec_version(key, version))
        .ok()?;
    Some(buf.freeze())
}

/// What [`produce_payload`] made of a Produce `records` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadVerdict {
    /// Every batch passed header and record validation: the broker would append them.
    Accepted {
        /// Batches in the payload.
        batches: usize,
        /// Records over all batches.
        records: usize,
    },
    /// Refused with this Kafka error code (2 CORRUPT_MESSAGE, 87 INVALID_RECORD,
    /// 76 UNSUPPORTED_COMPRESSION_TYPE).
    Refused(i16),
}

/// Cap on decompressed bytes used by [`produce_payload`]: `max.message.bytes` at Kafka's
/// default (1 MiB) times the broker's factor, as the produce path uses.
const FUZZ_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Validates a Produce request's `records` field as the produce path does: split into
/// batches and header checks (`log::split_batches`), then every record
/// (`validate_records`). Each accepted batch must also decode with the record decoder
/// inline transforms use (`decode_records`) into `recordCount` records with offset deltas
/// 0..n, and its ListOffsets timestamp scan must not panic (asserted).
pub fn produce_payload(bytes: &[u8], require_keys: bool) -> PayloadVerdict {
    let batches = match split_batches(Bytes::copy_from_slice(bytes)) {
        Ok(b) => b,
        Err(e) => return PayloadVerdict::Refused(e.kafka_error_code()),
    };
    let limits = RecordLimits {
        require_keys,
        ..RecordLimits::for_max_message_bytes(FUZZ_MAX_MESSAGE_BYTES)
    };
    let mut records = 0usize;
    for batch in &batches {
        // Header fields read on the produce path: none may panic on client values.
        let _ = (
            batch.last_offset(),
            batch.compression(),
            batch.timestamp_type(),
        );
        if let Err(e) = validate_records(batch, limits) {
            return PayloadVerdict::Refused(e.kafka_error().code());
        }
        let decoded = match decode_records(batch, limits.max_decompressed_bytes) {
            Ok(d) => d,
            Err(e) => panic!("validate_records accepted a batch decode_records refuses: {e}"),
        };
        assert_eq!(decoded.len(), batch.record_count() as usize, "record count");
        for (i, r) in decoded.iter().enumerate() {
            assert_eq!(r.offset_delta as usize, i, "offset deltas are 0..n");
            if require_keys {
                assert!(r.key.is_some(), "a keyless record passed require_keys");
            }
        }
        // As stored: the log assigns the base offset, then ListOffsets may scan it.
        let mut stored = batch.clone();
        stored.set_base_offset(1_000);
        let stored = stored.to_bytes();
        let _ = crate::log::batch::first_record_at_or_after(&stored, i64::MIN);
        let _ = crate::log::batch::first_record_at_or_after(&stored, i64::MAX);
        records += decoded.len();
    }
    PayloadVerdict::Accepted {
        batches: batches.len(),
        records,
    }
}

/// Rewrites the CRC-32C of every batch in a produce payload whose batchLength fits in
/// what is left, so that mutated bytes reach the checks behind the checksum. Stops at the
/// first batch that does not fit. Only for fuzzing: the broker never repairs a CRC.
pub fn fix_crcs(payload: &mut [u8]) {
    use crate::log::batch::{BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES};
    const BATCH_LENGTH_AT: usize = 8;
    const CRC_AT: usize = 17;
    const ATTRIBUTES_AT: usize = 21;
    let mut pos = 0usize;
    while payload.len() - pos >= BATCH_HEADER_BYTES {
        let at = pos + BATCH_LENGTH_AT;
        let length = i32::from_be_bytes([
            payload[at],
            payload[at + 1],
            payload[at + 2],
            payload[at + 3],
        ]);
        let Ok(length) = usize::try_from(length) else {
            return;
        };
        let total = length.saturating_add(LOG_OVERHEAD_BYTES);
        if total < BATCH_HEADER_BYTES || total > payload.len() - pos {
            return;
        }
        let crc = crc32c::crc32c(&payload[pos + ATTRIBUTES_AT..pos + total]);
        payload[pos + CRC_AT..pos + CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        pos += total;
    }
}

/// Reads `buf` as a transform's output ("weir batch v1" output layout) for an input batch
/// of `input_count` records, as the host does after `apply`, and reads every field of
/// every record. `Ok` holds the record count, `Err` the host's message.
pub fn transform_output(buf: &[u8], input_count: usize) -> Result<usize, String> {
    let out = crate::plugin::transform_decode_output(buf.to_vec(), input_count)?;
    let mut n = 0usize;
    for r in out.iter() {
        assert!(
            (r.input_index as usize) < input_count,
            "input index in range"
        );
        let owned = r.to_output();
        assert_eq!(owned.record.headers.len(), r.headers().len());
        n += 1;
    }
    assert_eq!(n, out.len());
    Ok(n)
}

/// One input record of a transform, as plain values: key, value, timestamp (ms), headers.
pub type PlainRecord = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    i64,
    Vec<(String, Option<Vec<u8>>)>,
);

/// Encodes `records` in the "weir batch v1" input layout (as the host sends them to a
/// transform) and builds the output an identity transform answers: each input record
/// behind its index, to the default topic, or to `topic` when given.
pub fn identity_output(records: &[PlainRecord], topic: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for (i, r) in records.iter().enumerate() {
        let mut one = Vec::new();
        crate::plugin::transform_encode_input(&[plain_to_record(r)], &mut one)
            .expect("a small record encodes");
        out.extend_from_slice(&(i as u32).to_le_bytes());
        match topic {
            None => out.extend_from_slice(&(-1i32).to_le_bytes()),
            Some(t) => {
                out.extend_from_slice(&(t.len() as i32).to_le_bytes());
                out.extend_from_slice(t.as_bytes());
            }
        }
        out.extend_from_slice(&one[4..]); // the record, without the count
    }
    out
}

/// Decodes an identity transform's output (from [`identity_output`]) and checks that every
/// record came back unchanged (asserted).
pub fn transform_round_trip(records: &[PlainRecord], topic: Option<&str>) {
    let buf = identity_output(records, topic);
    let out = crate::plugin::transform_decode_output(buf, records.len())
        .expect("an identity output decodes");
    assert_eq!(out.len(), records.len());
    for (i, (got, want)) in out.iter().zip(records).enumerate() {
        assert_eq!(got.input_index as usize, i);
        assert_eq!(got.topic, topic);
        assert_eq!(got.to_output().record, plain_to_record(want));
    }
}

fn plain_to_record(r: &PlainRecord) -> crate::plugin::Record {
    crate::plugin::Record {
        key: r.0.clone().map(Bytes::from),
        value: r.1.clone().map(Bytes::from),
        timestamp_ms: r.2,
        headers: r
            .3
            .iter()
            .map(|(k, v)| crate::plugin::Header {
                key: k.clone(),
                value: v.clone().map(Bytes::from),
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Seeds: valid inputs to start fuzzing from and to mutate in tests.

/// Valid request frames (without the size prefix): every API in the dispatch table at
/// every supported version, with a populated body where the version can carry it.
pub fn seed_request_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for spec in SUPPORTED_APIS {
        for version in spec.min_version..=spec.max_version {
            if legacy::is_legacy_offset_commit(spec.key, version) {
                frames.push(legacy_offset_commit_frame(version));
                continue;
            }
            let header = RequestHeader::default()
                .with_request_api_key(spec.key as i16)
                .with_request_api_version(version)
                .with_correlation_id(i32::from(version) + 1)
                .with_client_id(Some(StrBytes::from_static_str("weir-fuzz")));
            let frame = [sample_request(spec.key, version), default_request(spec.key)]
                .into_iter()
                .flatten()
                .find_map(|body| encode_frame(spec.key, version, &header, &body));
            if let Some(f) = frame {
                frames.push(f.to_vec());
            }
        }
    }
    frames
}

/// An OffsetCommit v0 or v1 frame (older than the crate's codec), written by hand as
/// `protocol::legacy` documents the layout.
fn legacy_offset_commit_frame(version: i16) -> Vec<u8> {
    fn string(b: &mut BytesMut, s: &str) {
        b.put_i16(s.len() as i16);
        b.put_slice(s.as_bytes());
    }
    let mut b = BytesMut::new();
    b.put_i16(ApiKey::OffsetCommit as i16);
    b.put_i16(version);
    b.put_i32(7);
    string(&mut b, "weir-fuzz");
    string(&mut b, "group-1");
    if version == 1 {
        b.put_i32(1); // generation
        string(&mut b, "member-1");
    }
    b.put_i32(1);
    string(&mut b, "topic-a");
    b.put_i32(1);
    b.put_i32(0); // partition
    b.put_i64(42); // offset
    if version == 1 {
        b.put_i64(-1); // timestamp
    }
    string(&mut b, "meta");
    b.to_vec()
}

fn default_request(key: ApiKey) -> Option<RequestKind> {
    use kafka_protocol::messages::*;
    Some(match key {
        ApiKey::Produce => RequestKind::Produce(ProduceRequest::default()),
        ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
        ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
        ApiKey::OffsetForLeaderEpoch => {
            RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default())
        }
        ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default()),
        ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
        ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
        ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
        ApiKey::DescribeConfigs => RequestKind::DescribeConfigs(DescribeConfigsRequest::default()),
        ApiKey::CreatePartitions => {
            RequestKind::CreatePartitions(CreatePartitionsRequest::default())
        }
        ApiKey::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default()),
        ApiKey::IncrementalAlterConfigs => {
            RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default())
        }
        ApiKey::FindCoordinator => RequestKind::FindCoordinator(FindCoordinatorRequest::default()),
        ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
        ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
        ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
        ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
        ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
        ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(DeleteGroupsRequest::default()),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        ApiKey::DescribeQuorum => RequestKind::DescribeQuorum(DescribeQuorumRequest::default()),
        ApiKey::AlterPartitionReassignments => {
            RequestKind::AlterPartitionReassignments(AlterPartitionReassignmentsRequest::default())
        }
        ApiKey::ListPartitionReassignments => {
            RequestKind::ListPartitionReassignments(ListPartitionReassignmentsRequest::default())
        }
        ApiKey::ElectLeaders => RequestKind::ElectLeaders(ElectLeadersRequest::default()),
        ApiKey::DescribeLogDirs => RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default()),
        ApiKey::AlterReplicaLogDirs => {
            RequestKind::AlterReplicaLogDirs(AlterReplicaLogDirsRequest::default())
        }
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
        ApiKey::WriteTxnMarkers => RequestKind::WriteTxnMarkers(WriteTxnMarkersRequest::default()),
        ApiKey::DescribeProducers => {
            RequestKind::DescribeProducers(DescribeProducersRequest::default())
        }
        ApiKey::AddPartitionsToTxn => {
            RequestKind::AddPartitionsToTxn(AddPartitionsToTxnRequest::default())
        }
        ApiKey::AddOffsetsToTxn => RequestKind::AddOffsetsToTxn(AddOffsetsToTxnRequest::default()),
        ApiKey::EndTxn => RequestKind::EndTxn(EndTxnRequest::default()),
        ApiKey::TxnOffsetCommit => RequestKind::TxnOffsetCommit(TxnOffsetCommitRequest::default()),
        ApiKey::DescribeTransactions => {
            RequestKind::DescribeTransactions(DescribeTransactionsRequest::default())
        }
        ApiKey::ListTransactions => {
            RequestKind::ListTransactions(ListTransactionsRequest::default())
        }
        ApiKey::ConsumerGroupHeartbeat => {
            RequestKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::default())
        }
        ApiKey::ConsumerGroupDescribe => {
            RequestKind::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default())
        }
        _ => return None,
    })
}

/// A request with the fields real clients fill, where the version has them (the caller
/// falls back to [`default_request`] when this one does not encode at `version`).
fn sample_request(key: ApiKey, version: i16) -> Option<RequestKind> {
    use kafka_protocol::messages::*;
    let topic = || TopicName(StrBytes::from_static_str("topic-a"));
    let group = || GroupId(StrBytes::from_static_str("group-1"));
    Some(match key {
        ApiKey::Produce => {
            use produce_request::{PartitionProduceData, TopicProduceData};
            let batch = seed_produce_payloads().into_iter().next()?;
            RequestKind::Produce(
                ProduceRequest::default()
                    .with_acks(-1)
                    .with_timeout_ms(1000)
                    .with_topic_data(vec![TopicProduceData::default()
                        .with_name(topic())
                        .with_partition_data(vec![PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(Bytes::from(batch)))])]),
            )
        }
        ApiKey::Fetch => {
            use fetch_request::{FetchPartition, FetchTopic};
            let mut t = FetchTopic::default().with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(5)
                .with_partition_max_bytes(1 << 20)]);
            if version < 13 {
                t = t.with_topic(topic());
            }
            RequestKind::Fetch(
                FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_wait_ms(100)
                    .with_min_bytes(1)
                    .with_max_bytes(1 << 20)
                    .with_topics(vec![t]),
            )
        }
        ApiKey::ListOffsets => {
            use list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
            RequestKind::ListOffsets(
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(-1)])]),
            )
        }
        ApiKey::Metadata => {
            use metadata_request::MetadataRequestTopic;
            RequestKind::Metadata(MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic())),
            ])))
        }
        ApiKey::ApiVersions => RequestKind::ApiVersions(
            ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("weir-fuzz"))
                .with_client_software_version(StrBytes::from_static_str("1.0")),
        ),
        ApiKey::CreateTopics => {
            use create_topics_request::{CreatableTopic, CreatableTopicConfig};
            RequestKind::CreateTopics(
                CreateTopicsRequest::default()
                    .with_timeout_ms(1000)
                    .with_topics(vec![CreatableTopic::default()
                        .with_name(topic())
                        .with_num_partitions(3)
                        .with_replication_factor(1)
                        .with_configs(vec![CreatableTopicConfig::default()
                            .with_name(StrBytes::from_static_str("retention.ms"))
                            .with_value(Some(StrBytes::from_static_str("1000")))])]),
            )
        }
        ApiKey::OffsetCommit => {
            use offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
            RequestKind::OffsetCommit(
                OffsetCommitRequest::default()
                    .with_group_id(group())
                    .with_generation_id_or_member_epoch(1)
                    .with_member_id(StrBytes::from_static_str("member-1"))
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(42)])]),
            )
        }
        ApiKey::OffsetFetch if version < 8 => {
            use offset_fetch_request::OffsetFetchRequestTopic;
            RequestKind::OffsetFetch(
                OffsetFetchRequest::default()
                    .with_group_id(group())
                    .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                        .with_name(topic())
                        .with_partition_indexes(vec![0, 1])])),
            )
        }
        ApiKey::JoinGroup => {
            use join_group_request::JoinGroupRequestProtocol;
            RequestKind::JoinGroup(
                JoinGroupRequest::default()
                    .with_group_id(group())
                    .with_session_timeout_ms(10_000)
                    .with_rebalance_timeout_ms(10_000)
                    .with_protocol_type(StrBytes::from_static_str("consumer"))
                    .with_protocols(vec![JoinGroupRequestProtocol::default()
                        .with_name(StrBytes::from_static_str("range"))
                        .with_metadata(Bytes::from_static(b"\x00\x01"))]),
            )
        }
        ApiKey::Heartbeat => RequestKind::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(group())
                .with_generation_id(1)
                .with_member_id(StrBytes::from_static_str("member-1")),
        ),
        ApiKey::FindCoordinator if version < 4 => {
            RequestKind::FindCoordinator(FindCoordinatorRequest::default().with_key(group().0))
        }
        ApiKey::OffsetForLeaderEpoch => {
            use offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
            let request = if version >= 3 {
                // A follower's (broker 2); older versions have no replica_id.
                OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(2))
            } else {
                OffsetForLeaderEpochRequest::default()
            };
            RequestKind::OffsetForLeaderEpoch(request.with_topics(
                vec![OffsetForLeaderTopic::default()
                        .with_topic(topic())
                        .with_partitions(vec![OffsetForLeaderPartition::default()
                            .with_partition(0)
                            .with_current_leader_epoch(if version >= 2 { 0 } else { -1 })
                            .with_leader_epoch(0)])],
            ))
        }
        ApiKey::DescribeLogDirs => {
            use describe_log_dirs_request::DescribableLogDirTopic;
            RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default().with_topics(Some(
                vec![DescribableLogDirTopic::default()
                    .with_topic(topic())
                    .with_partitions(vec![0, 1])],
            )))
        }
        ApiKey::AlterReplicaLogDirs => {
            use alter_replica_log_dirs_request::{AlterReplicaLogDir, AlterReplicaLogDirTopic};
            RequestKind::AlterReplicaLogDirs(AlterReplicaLogDirsRequest::default().with_dirs(
                vec![AlterReplicaLogDir::default()
                    .with_path(StrBytes::from_static_str("/data/b"))
                    .with_topics(vec![AlterReplicaLogDirTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![0, 1])])],
            ))
        }
        ApiKey::DescribeQuorum => {
            use describe_quorum_request::{PartitionData, TopicData};
            RequestKind::DescribeQuorum(DescribeQuorumRequest::default().with_topics(vec![
                TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                    .with_partitions(vec![PartitionData::default().with_partition_index(0)]),
            ]))
        }
        ApiKey::AlterPartitionReassignments => {
            use alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
            // A move to brokers 2 and 3, and a cancellation (null replicas).
            RequestKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsRequest::default()
                    .with_timeout_ms(30_000)
                    .with_allow_replication_factor_change(true)
                    .with_topics(vec![ReassignableTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            ReassignablePartition::default()
                                .with_partition_index(0)
                                .with_replicas(Some(vec![BrokerId(2), BrokerId(3)])),
                            ReassignablePartition::default().with_partition_index(1),
                        ])]),
            )
        }
        ApiKey::ListPartitionReassignments => {
            use list_partition_reassignments_request::ListPartitionReassignmentsTopics;
            RequestKind::ListPartitionReassignments(
                ListPartitionReassignmentsRequest::default()
                    .with_timeout_ms(30_000)
                    .with_topics(Some(vec![ListPartitionReassignmentsTopics::default()
                        .with_name(topic())
                        .with_partition_indexes(vec![0, 1])])),
            )
        }
        ApiKey::ElectLeaders => {
            use elect_leaders_request::TopicPartitions;
            RequestKind::ElectLeaders(
                ElectLeadersRequest::default()
                    .with_election_type(if version >= 1 { 1 } else { 0 })
                    .with_topic_partitions(Some(vec![TopicPartitions::default()
                        .with_topic(topic())
                        .with_partitions(vec![0, 1])]))
                    .with_timeout_ms(1000),
            )
        }
        _ => return None,
    })
}

/// Valid Produce `records` payloads as clients send them: one batch in each codec (none,
/// gzip, snappy, lz4, zstd), with keys, null values and headers, and two batches back to
/// back.
pub fn seed_produce_payloads() -> Vec<Vec<u8>> {
    let headers = vec![
        (Bytes::from_static(b"h"), Some(Bytes::from_static(b"v"))),
        (Bytes::from_static(b"h"), None),
    ];
    let records: Vec<_> = (0..4)
        .map(|i| {
            crate::log::plain::record(
                i,
                1_700_000_000_000 + i,
                Some(Bytes::from(format!("key-{i}"))),
                (i != 2).then(|| Bytes::from(format!("value {i} {}", "x".repeat(i as usize * 8)))),
                if i == 1 { headers.clone() } else { Vec::new() },
            )
        })
        .collect();
    let Ok(plain) = crate::log::plain::encode(&records) else {
        return Vec::new();
    };
    let mut payloads = vec![plain.to_vec()];
    let Ok(template) = crate::log::validate(plain.clone()) else {
        return payloads;
    };
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        if let Some(b) = recompress(&template, codec) {
            payloads.push(b);
        }
    }
    let mut two = plain.to_vec();
    two.extend_from_slice(payloads.last().map_or(&[][..], Vec::as_slice));
    payloads.push(two);
    payloads
}

/// `template`'s records re-encoded as one batch compressed with `codec`.
fn recompress(template: &crate::log::ValidatedBatch, codec: Compression) -> Option<Vec<u8>> {
    let records = decode_records(template, 1 << 20).ok()?;
    let mut builder = BatchBuilder::new(template, codec);
    for r in &records {
        builder
            .push(
                r.offset_delta,
                r.timestamp_ms,
                r.key.as_deref(),
                r.value.as_deref(),
                r.headers.iter().map(|(k, v)| (&k[..], v.as_deref())),
            )
            .ok()?;
    }
    Some(builder.finish().ok()?.to_bytes().to_vec())
}

/// Valid transform outputs and their input batch sizes: an identity answer, one routed to a
/// named topic, and an empty one (every record dropped).
pub fn seed_transform_outputs() -> Vec<(Vec<u8>, usize)> {
    let records: Vec<PlainRecord> = vec![
        (
            Some(b"k".to_vec()),
            Some(b"{\"a\":1}".to_vec()),
            42,
            vec![("h".into(), None), ("trace".into(), Some(b"abc".to_vec()))],
        ),
        (None, None, -1, vec![]),
        (None, Some(vec![0; 40]), 1_700_000_000_000, vec![]),
    ];
    vec![
        (identity_output(&records, None), records.len()),
        (identity_output(&records, Some("routed")), records.len()),
        (0u32.to_le_bytes().to_vec(), 2),
    ]
}

/// The bounded run of the fuzz targets' inputs in `cargo test`: the same entry points fed
/// mutated seeds and random bytes (no panic), and random valid inputs (they round-trip).
/// The long runs are `fuzz/`'s (see fuzz/README.md).
#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// One edit of a valid input; positions are taken modulo its length.
    #[derive(Debug, Clone)]
    enum Mutation {
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, Vec<u8>),
        Remove(usize, usize),
        /// An i32 written over 4 bytes, big-endian (Kafka) or little-endian (weir batch v1).
        Word(usize, i32, bool),
        /// An i16 (Kafka string and array lengths in old versions), big-endian.
        Short(usize, i16),
    }

    fn interesting_i32() -> impl Strategy<Value = i32> {
        prop_oneof![
            Just(-1),
            Just(0),
            Just(1),
            Just(i32::MAX),
            Just(i32::MIN),
            Just(0x7fff),
            Just(0x1_0000),
            any::<i32>(),
        ]
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            3 => (any::<usize>(), 1..=255u8).prop_map(|(at, x)| Mutation::Flip(at, x)),
            1 => any::<usize>().prop_map(Mutation::Truncate),
            1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
                .prop_map(|(at, b)| Mutation::Insert(at, b)),
            1 => (any::<usize>(), 1..16usize).prop_map(|(at, n)| Mutation::Remove(at, n)),
            2 => (any::<usize>(), interesting_i32(), any::<bool>())
                .prop_map(|(at, v, le)| Mutation::Word(at, v, le)),
            1 => (any::<usize>(), prop_oneof![Just(-1i16), Just(i16::MAX), any::<i16>()])
                .prop_map(|(at, v)| Mutation::Short(at, v)),
        ]
    }

    fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
        let len = bytes.len();
        if len == 0 {
            if let Mutation::Insert(_, b) = m {
                bytes.extend_from_slice(b);
            }
            return;
        }
        match m {
            Mutation::Flip(at, x) => bytes[at % len] ^= x,
            Mutation::Truncate(at) => bytes.truncate(at % len),
            Mutation::Insert(at, b) => {
                let tail = bytes.split_off(at % (len + 1));
                bytes.extend_from_slice(b);
                bytes.extend_from_slice(&tail);
            }
            Mutation::Remove(at, n) => {
                let at = at % len;
                let end = (at + n).min(len);
                bytes.copy_within(end.., at);
                bytes.truncate(len - (end - at));
            }
            Mutation::Word(at, v, le) => {
                let raw = if *le {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                let at = at % len;
                let n = (len - at).min(4);
                bytes[at..at + n].copy_from_slice(&raw[..n]);
            }
            Mutation::Short(at, v) => {
                let at = at % len;
                let n = (len - at).min(2);
                bytes[at..at + n].copy_from_slice(&v.to_be_bytes()[..n]);
            }
        }
    }

    fn mutated(seeds: &[Vec<u8>]) -> impl Strategy<Value = Vec<u8>> {
        let seeds = seeds.to_vec();
        (0..seeds.len(), proptest::collection::vec(mutation(), 1..6)).prop_map(move |(i, ms)| {
            let mut bytes = seeds[i].clone();
            for m in &ms {
                apply(&mut bytes, m);
            }
            bytes
        })
    }

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            // A failure is a fixture to keep: shrink it, but do not spend the CI budget on it.
            max_shrink_iters: 2_000,
            ..ProptestConfig::default()
        }
    }

    #[test]
    fn every_seed_frame_decodes_and_round_trips() {
        let frames = seed_request_frames();
        let expected: usize = SUPPORTED_APIS
            .iter()
            .map(|a| (a.max_version - a.min_version + 1) as usize)
            .sum();
        assert_eq!(frames.len(), expected, "a seed for every API and version");
        for frame in &frames {
            let key = i16::from_be_bytes([frame[0], frame[1]]);
            let version = i16::from_be_bytes([frame[2], frame[3]]);
            assert_eq!(
                request_frame(frame),
                FrameVerdict::Request {
                    api_key: key,
                    version
                },
                "seed for key {key} v{version}"
            );
            request_frame_round_trips(frame);
        }
    }

    #[test]
    fn every_seed_payload_is_accepted() {
        let payloads = seed_produce_payloads();
        assert_eq!(
            payloads.len(),
            6,
            "one batch per codec and a two-batch payload"
        );
        for (i, p) in payloads.iter().enumerate() {
            let batches = if i == payloads.len() - 1 { 2 } else { 1 };
            assert_eq!(
                produce_payload(p, true),
                PayloadVerdict::Accepted {
                    batches,
                    records: 4 * batches
                },
                "seed payload {i}"
            );
        }
    }

    #[test]
    fn every_seed_output_decodes() {
        let outputs = seed_transform_outputs();
        let counts: Vec<_> = outputs
            .iter()
            .map(|(buf, n)| transform_output(buf, *n))
            .collect();
        assert_eq!(counts, vec![Ok(3), Ok(3), Ok(0)]);
    }

    /// Inputs the fuzzers found, kept as fixtures: each must go through its entry point
    /// without a panic, with the verdict noted.
    mod regressions {
        use super::*;

        /// `fuzz/` request_frame: a Metadata v9 frame whose header carries an unknown
        /// tagged field with tag >= 2^31. It decodes; kafka-protocol's encoder drops that
        /// field while counting it, so its re-encoding does not decode. weir never
        /// re-encodes requests: the frame must simply reach the Metadata handler.
        #[test]
        fn metadata_v9_with_a_tag_past_i32_max() {
            let frame = [
                0x00, 0x03, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x10, 0x00, 0x05,
                0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0xd3, 0x99,
                0x03, 0x00, 0x08, 0x00, 0xba, 0xba, 0xba, 0xba, 0xba, 0x00, 0x00, 0x00, 0x00, 0x00,
                0x00, 0x00, 0x72,
            ];
            assert_eq!(
                request_frame(&frame),
                FrameVerdict::Request {
                    api_key: 3,
                    version: 9
                }
            );
        }
    }

    proptest! {
        #![proptest_config(config(500))]

        #[test]
        fn metadata_requests_round_trip(
            version in 0..=13i16,
            correlation_id in any::<i32>(),
            client_id in proptest::option::of("[ -~]{0,20}"),
            topics in proptest::collection::vec("[a-zA-Z0-9._-]{1,40}", 0..5),
            auto_create in any::<bool>(),
        ) {
            use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
            use kafka_protocol::messages::{MetadataRequest, TopicName};
            let request = MetadataRequest::default()
                .with_topics(Some(
                    topics
                        .into_iter()
                        .map(|t| {
                            MetadataRequestTopic::default()
                                .with_name(Some(TopicName(StrBytes::from_string(t))))
                        })
                        .collect(),
                ))
                .with_allow_auto_topic_creation(auto_create || version < 4);
            let header = RequestHeader::default()
                .with_request_api_key(ApiKey::Metadata as i16)
                .with_request_api_version(version)
                .with_correlation_id(correlation_id)
                .with_client_id(client_id.map(StrBytes::from_string));
            let frame = encode_frame(ApiKey::Metadata, version, &header, &RequestKind::Metadata(request))
                .expect("encodes");
            request_frame_round_trips(&frame);
        }
    }

    proptest! {
        #![proptest_config(config(2_000))]

        #[test]
        fn mutated_request_frames_never_panic(frame in mutated(&seed_request_frames())) {
            let _ = request_frame(&frame);
        }

        #[test]
        fn random_bodies_behind_a_valid_prefix_never_panic(
            api in 0..SUPPORTED_APIS.len(),
            version_pick in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let spec = SUPPORTED_APIS[api];
            let span = (spec.max_version - spec.min_version + 1) as u16;
            let version = spec.min_version + (version_pick % span) as i16;
            let mut frame = Vec::new();
            frame.extend_from_slice(&(spec.key as i16).to_be_bytes());
            frame.extend_from_slice(&version.to_be_bytes());
            frame.extend_from_slice(&1i32.to_be_bytes());
            frame.extend_from_slice(&body);
            let _ = request_frame(&frame);
        }

        #[test]
        fn mutated_payloads_never_panic(payload in mutated(&seed_produce_payloads())) {
            let _ = produce_payload(&payload, false);
            let mut fixed = payload;
            fix_crcs(&mut fixed);
            let _ = produce_payload(&fixed, false);
            let _ = produce_payload(&fixed, true);
        }

        #[test]
        fn mutated_transform_outputs_never_panic(
            (buf, input_count) in (0..3usize, proptest::collection::vec(mutation(), 1..6), 0..5usize)
                .prop_map(|(i, ms, n)| {
                    let (mut buf, _) = seed_transform_outputs().swap_remove(i);
                    for m in &ms {
                        apply(&mut buf, m);
                    }
                    (buf, n)
                })
        ) {
            let _ = transform_output(&buf, input_count);
        }

        #[test]
        fn random_transform_outputs_never_panic(
            buf in proptest::collection::vec(any::<u8>(), 0..96),
            input_count in 0..5usize,
        ) {
            let _ = transform_output(&buf, input_count);
        }
    }

    fn plain_records() -> impl Strategy<Value = Vec<PlainRecord>> {
        let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24));
        let header = ("[a-z.]{0,8}", bytes());
        proptest::collection::vec(
            (
                bytes(),
                bytes(),
                any::<i64>(),
                proptest::collection::vec(header, 0..3),
            ),
            0..6,
        )
    }

    proptest! {
        #![proptest_config(config(500))]

        #[test]
        fn identity_transform_outputs_round_trip(
            records in plain_records(),
            topic in proptest::option::of("[a-z-]{0,12}"),
        ) {
            transform_round_trip(&records, topic.as_deref());
        }

        #[test]
        fn produced_batches_round_trip_in_every_codec(
            records in plain_records(),
            codec in prop_oneof![
                Just(Compression::None),
                Just(Compression::Gzip),
                Just(Compression::Snappy),
                Just(Compression::Lz4),
                Just(Compression::Zstd),
            ],
        ) {
            prop_assume!(!records.is_empty());
            let base_ms = 1_700_000_000_000i64;
            let encoded: Vec<_> = records
                .iter()
                .zip(0i64..)
                .map(|(r, i)| {
                    let headers = r
                        .3
                        .iter()
                        .map(|(k, v)| (Bytes::from(k.clone()), v.clone().map(Bytes::from)))
                        .collect();
                    crate::log::plain::record(
                        i,
                        base_ms + (r.2 % 1_000_000),
                        r.0.clone().map(Bytes::from),
                        r.1.clone().map(Bytes::from),
                        headers,
                    )
                })
                .collect();
            let plain = crate::log::plain::encode(&encoded).expect("small records encode");
            let template = crate::log::validate(plain.clone()).expect("encoded batch is valid");
            let payload = match codec {
                Compression::None => plain.to_vec(),
                c => recompress(&template, c).expect("recompresses"),
            };
            prop_assert_eq!(
                produce_payload(&payload, false),
                PayloadVerdict::Accepted { batches: 1, records: records.len() }
            );
            let batch = crate::log::validate(Bytes::from(payload)).expect("valid");
            let decoded = decode_records(&batch, 1 << 20).expect("decodes");
            prop_assert_eq!(decoded.len(), encoded.len());
            for (got, want) in decoded.iter().zip(&encoded) {
                prop_assert_eq!(&got.key, &want.key);
                prop_assert_eq!(&got.value, &want.value);
                prop_assert_eq!(got.timestamp_ms, want.timestamp_ms);
                // Headers in order, repeated keys kept.
                prop_assert_eq!(&got.headers, &want.headers);
            }
        }
    }
}
