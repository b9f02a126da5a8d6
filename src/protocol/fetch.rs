//! Fetch (key 1), v4–v16. Protocol guide "Fetch"; KIP-74 (response `max_bytes`, first batch
//! whole), KIP-227 (incremental fetch sessions, v7+), KIP-516 (topic ids, v13+), KIP-392
//! (`preferred_read_replica` -1).
//!
//! Fetch sessions (KIP-227; the cache and its rules are `crate::fetch_session`): a
//! consumer's full request with `session_epoch` 0 gets a new non-zero `session_id` when a
//! slot of `max.incremental.fetch.session.cache.slots` is free (or one can be evicted),
//! else 0; epoch -1 is a full request without a session (and closes the one named).
//! An incremental request (`session_id` N, the expected epoch) lists only partitions
//! added or changed and `forgotten_topics_data`; the handler reads every partition of
//! the session and answers only those with records, a changed high watermark, log start
//! offset or last stable offset, an error or a preferred replica. A parked fetch reads
//! the session's partitions on every wake-up and updates the session once, when it is
//! answered. Followers' fetches (`replica_id` ≥ 0) stay sessionless (`session_id` 0):
//! one fetcher per leader, its partitions change with leadership, and a full request per
//! round is what weir's fetcher sends anyway. Top-level errors, with no partitions:
//! FETCH_SESSION_ID_NOT_FOUND (70), INVALID_FETCH_SESSION_EPOCH (71),
//! FETCH_SESSION_TOPIC_ID_ERROR (106: an incremental request whose version names topics
//! otherwise than the session did).
//!
//! Reads whole stored batches from each partition, up to `partition_max_bytes` per
//! partition and `max_bytes` per response; the first batch of the response is returned
//! whole even if larger, and never past the high watermark.
//!
//! Transactions (KIP-98): with `isolation_level` 1 (read_committed) a consumer reads only
//! below the last stable offset and gets `aborted_transactions`: the (producer id, first
//! offset) of every aborted transaction overlapping the records returned, which the client
//! uses to drop their records (`Partition::read` with `FetchIsolation::ReadCommitted`).
//! Every response reports the real `last_stable_offset` (the high watermark when no
//! transaction is open). read_uncommitted (0) reads to the high watermark with an empty
//! `aborted_transactions`, as before. A parked read_committed fetch waits on the high
//! watermark like the others: the last stable offset only moves forward when the high
//! watermark does (a marker counts once replicated; see `replica.rs`).
//!
//! If fewer than `min_bytes` are ready, the request parks in the purgatory on the high
//! watermarks of the partitions it reads until one advances or `max_wait_ms` passes, then
//! reads again (a consumer's, at the deadline, only if a watermark moved meanwhile; else
//! its first read is the answer). An empty partition gets a zero-length record set, never
//! null (older librdkafka fails on null).
//!
//! A fetch with a `replica_id` (v4–v14; `replica_state.replica_id` from v15) of 0 or more
//! is a follower's (Kafka's replica fetch, no other RPC): it reads up to the log end
//! offset, not the high watermark, records the follower's log end offset (which moves the
//! high watermark and may bring the follower back into the ISR,
//! `Partition::read_for_follower`) and parks on the log end offset instead.
//!
//! Reads from followers (KIP-392). A consumer's Fetch from v11 (which carries `rack_id`,
//! the client's `client.rack`) may be served by any replica this broker hosts, leader or
//! follower, as Kafka does: a follower reads up to its own high watermark (the leader's,
//! as its last fetch response gave it, capped at its log end offset), an offset between
//! that and its log end offset gets an empty record set, one past its log end offset
//! OFFSET_OUT_OF_RANGE (the client goes back to the leader); the same
//! `current_leader_epoch` checks as on the leader; records read so count in
//! `weir_follower_fetch_records_total`. With `replica.selector.class` set to the
//! rack-aware selector, a leader answering a consumer v11+ whose `rack_id` names another
//! rack than its own and an in-sync follower on an active broker in that rack holds the
//! fetch offset sets `preferred_read_replica` to that follower and returns no records for
//! the partition (the client moves to it; `replica::select_read_replica`), and answers at
//! once. Older versions and the leader selector keep consumers on the leader.
//!
//! Errors returned per partition: OFFSET_OUT_OF_RANGE (1), UNKNOWN_TOPIC_OR_PARTITION (3),
//! NOT_LEADER_OR_FOLLOWER (6) when another broker leads the partition (v4–v10) or this
//! broker hosts no replica of it (v11+),
//! KAFKA_STORAGE_ERROR (56), FENCED_LEADER_EPOCH (74) / UNKNOWN_LEADER_EPOCH (75) when
//! `current_leader_epoch` (v9+) is older / newer than the partition's (KIP-320),
//! UNKNOWN_TOPIC_ID (100).

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ProducerId, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::ResponseError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::MetadataImage;
use crate::config::ReplicaSelector;
use crate::fetch_session::{
    FetchContext, PartitionFetch, PartitionSent, SessionError, SessionRequest, TopicFetch,
    TopicKey, INVALID_SESSION_ID,
};
use crate::log::{stored_record_count, AbortedTxn, FileRegion, LogError};
use crate::purgatory::Wake;
use crate::replica::{
    select_read_replica, FetchIsolation, Partition, PartitionOffsets, PartitionRead,
    ReadReplicaCandidate, ReplicaError,
};
use crate::server::{Outcome, ResponsePart};

use super::Context;

/// The longest `max_wait_ms` honoured (a limit on every wait).
const MAX_WAIT_MS_LIMIT: i32 = 5 * 60 * 1000;

/// Largest record set sent from its file (`sendfile(2)`); a larger one (a single batch
/// above every limit, KIP-74) is copied.
const REGION_MAX_BYTES: usize = 64 << 20;
/// Most record sets one response sends from files; more are copied.
const REGIONS_MAX: usize = 1 << 20;
/// Record sets smaller than this are copied when read (one `pread`) instead of sent with
/// `sendfile(2)`: a file part costs two system calls (the bytes before it are written out
/// first), and a consumer caught up on many partitions gets many small sets, whose files
/// it would otherwise hold open until the response is sent.
const SENDFILE_MIN_BYTES: usize = 16 << 10;

/// Record sets held as files by responses not yet sent, over all connections.
static REGIONS_HELD: AtomicUsize = AtomicUsize::new(0);

/// One record set's share of the budget of segment files that unsent responses may hold
/// open: a quarter of `log.open.files.max` (at least 16). A held file keeps its
/// descriptor open even after the descriptor cache closes its slot (`fdcache.rs`, soft
/// bound), so without a budget a fetch of thousands of partitions, or many queued
/// responses, could exhaust `RLIMIT_NOFILE`. Past the budget sets are copied. Given
/// back when the part is sent or dropped.
#[derive(Debug)]
pub(super) struct RegionHold;

impl RegionHold {
    fn take() -> Option<RegionHold> {
        let budget = (crate::log::fdcache::stats().max_open / 4).max(16);
        REGIONS_HELD
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < budget).then_some(held + 1)
            })
            .ok()
            .map(|_| RegionHold)
    }
}

impl Drop for RegionHold {
    fn drop(&mut self) {
        REGIONS_HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Stands in for the record sets that stay in their files while the response is built:
/// region `k` of `len` bytes is the `records` field `placeholders()[k..k + len]`, which
/// has the real length (the response's byte counts, KIP-74 limits, min_bytes and
/// sessions all see it) and is recognised by its address when the response is encoded,
/// where the file is written instead ([`PartsBuf`]). Allocated zeroed once (`calloc`,
/// which maps fresh zero pages for a block this large) and never read or written, so it
/// costs address space, not memory; a `static` array would put 65 MiB of zeros in the
/// binary.
fn placeholders() -> &'static [u8] {
    static PLACEHOLDERS: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();
    PLACEHOLDERS.get_or_init(|| vec![0u8; REGION_MAX_BYTES + REGIONS_MAX].leak())
}

/// The placeholder of region `index` of `len` bytes, `None` past the limits.
fn placeholder(index: usize, len: usize) -> Option<Bytes> {
    (index < REGIONS_MAX && len <= REGION_MAX_BYTES && len > 0)
        .then(|| Bytes::from_static(&placeholders()[index..index + len]))
}

/// The region a `records` slice stands in for: its index, if the slice is a placeholder.
fn placeholder_index(records: &[u8]) -> Option<usize> {
    let start = placeholders().as_ptr() as usize;
    let at = records.as_ptr() as usize;
    (!records.is_empty() && at >= start && at < start + REGIONS_MAX).then(|| at - start)
}

/// One partition's read: its batches in memory, or in a segment file.
struct Read {
    offsets: PartitionOffsets,
    bytes: Bytes,
    region: Option<FileRegion>,
    aborted_transactions: Option<Vec<AbortedTxn>>,
}

impl From<PartitionRead> for Read {
    fn from(r: PartitionRead) -> Read {
        Read {
            offsets: r.offsets,
            bytes: r.bytes,
            region: None,
            aborted_transactions: r.aborted_transactions,
        }
    }
}

/// A buffer that encodes a Fetch response in parts: the bytes kafka-protocol writes, and,
/// where it writes a placeholder's records, the region's file instead (not copied).
/// kafka-protocol writes a `records` field with one `put_slice` of the whole slice, and
/// the Fetch response has no length written back into earlier bytes (no gaps): the
/// unit tests hold every version's parts to the crate's own encoding.
struct PartsBuf {
    head: BytesMut,
    parts: Vec<ResponsePart>,
    len: usize,
    regions: Vec<Option<(FileRegion, RegionHold)>>,
    /// A placeholder was written whose region was not there (or already sent).
    missing_region: bool,
}

impl PartsBuf {
    fn push_head(&mut self) {
        if !self.head.is_empty() {
            self.len += self.head.len();
            let head = self.head.split().freeze();
            self.parts.push(ResponsePart::Bytes(head));
        }
    }

    fn into_outcome(mut self) -> Outcome {
        self.push_head();
        Outcome::RespondParts {
            len: self.len,
            parts: self.parts,
        }
    }
}

// SAFETY: every method forwards to the `BytesMut` that holds the bytes written so far
// (`head`), whose own implementation upholds `BufMut`'s contract; `put_slice` either
// forwards too or copies nothing into it.
#[allow(unsafe_code)]
unsafe impl bytes::BufMut for PartsBuf {
    fn remaining_mut(&self) -> usize {
        self.head.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's promise (`cnt` bytes of `chunk_mut` initialised) is about
        // `head`'s chunk, which is what `chunk_mut` returned.
        unsafe { self.head.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        self.head.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        let index = placeholder_index(src);
        match index.and_then(|k| self.regions.get_mut(k)?.take()) {
            None if index.is_some() => {
                // A placeholder without its region (a bug of ours): its zeros must not
                // reach a client as records; `encode` closes the connection instead.
                self.missing_region = true;
                self.head.extend_from_slice(src);
            }
            Some((region, hold)) => {
                self.push_head();
                self.len += region.len;
                self.parts.push(ResponsePart::File {
                    file: region.file,
                    position: region.position,
                    len: region.len,
                    hold: Some(Box::new(hold)),
                });
            }
            None => self.head.extend_from_slice(src),
        }
    }
}

impl ByteBufMut for PartsBuf {
    fn offset(&self) -> usize {
        self.head.len()
    }

    fn seek(&mut self, offset: usize) {
        ByteBufMut::seek(&mut self.head, offset)
    }

    fn range(&mut self, r: std::ops::Range<usize>) -> &mut [u8] {
        ByteBufMut::range(&mut self.head, r)
    }
}

/// Encodes a Fetch response (header and body) whose record sets may be `regions` behind
/// placeholders: the bytes around them in memory, each region as a file part for
/// `sendfile(2)`. Without regions it is one part. Errors: `Outcome::Close` with the
/// reason when the crate refuses to encode (a field this version lacks).
pub(super) fn encode(
    response: &FetchResponse,
    regions: Vec<(FileRegion, RegionHold)>,
    version: i16,
    correlation_id: i32,
) -> Outcome {
    let partitions: usize = response.responses.iter().map(|t| t.partitions.len()).sum();
    let mut buf = PartsBuf {
        head: BytesMut::with_capacity(256 + 64 * response.responses.len() + 128 * partitions),
        parts: Vec::with_capacity(2 * regions.len() + 1),
        len: 0,
        regions: regions.into_iter().map(Some).collect(),
        missing_region: false,
    };
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    if let Err(e) = header.encode(&mut buf, ApiKey::Fetch.response_header_version(version)) {
        return Outcome::Close(format!("cannot encode Fetch response header: {e}"));
    }
    if let Err(e) = response.encode(&mut buf, version) {
        return Outcome::Close(format!("cannot encode Fetch v{version} response: {e}"));
    }
    if buf.missing_region {
        tracing::error!("a Fetch response's record set placeholder had no file region");
        return Outcome::Close("Fetch response without one of its record sets".into());
    }
    buf.into_outcome()
}

fn partition_error(index: i32, error: ResponseError) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(error.code())
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_records(Some(Bytes::new()))
}

/// One pass over the requested partitions; returns the response and the bytes it holds.
/// Pushes onto `watches` the high watermark watch of every partition it read, taken
/// before the read, so the caller can park on exactly those partitions.
fn read_once(
    ctx: &Context,
    request: &FetchRequest,
    plan: &[TopicFetch],
    version: i16,
    watches: &mut Vec<watch::Receiver<i64>>,
    regions: &mut Vec<(FileRegion, RegionHold)>,
) -> (Vec<FetchableTopicResponse>, usize) {
    let replica_id = replica_id(request, version);
    // KIP-392: a consumer's Fetch v11+ may read a follower replica, and the leader may
    // send it to one in its rack.
    let from_any_replica = replica_id < 0 && version >= 11;
    let client_rack = request.rack_id.as_str();
    let select_by_rack = from_any_replica
        && ctx.config.replica_selector == ReplicaSelector::RackAware
        && !client_rack.is_empty();
    let mut image: Option<std::sync::Arc<MetadataImage>> = None;
    let now_ms = crate::replica::now_ms();
    // isolation_level (v4+): 1 is READ_COMMITTED.
    let isolation = if request.isolation_level == 1 {
        FetchIsolation::ReadCommitted
    } else {
        FetchIsolation::HighWatermark
    };
    let budget = response_budget(ctx, request, replica_id);
    let mut remaining = budget;
    let mut total = 0usize;
    let mut topics = Vec::with_capacity(plan.len());
    for topic in plan {
        let meta = match &topic.topic {
            TopicKey::Id(id) => ctx.metadata.topic_by_id(*id),
            TopicKey::Name(name) => ctx.metadata.topic(name),
        };
        let unknown = if version >= 13 {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let Some(meta) = &meta else {
                partitions.push(partition_error(p.partition, unknown));
                continue;
            };
            // Followers fetch from the leader; consumers too before v11.
            let lookup = if from_any_replica {
                super::replica_partition(ctx, &meta.name, p.partition)
            } else {
                super::leader_partition(ctx, &meta.name, p.partition)
            };
            let partition = match lookup {
                Ok(partition) => partition,
                Err(e) => {
                    partitions.push(partition_error(p.partition, e));
                    continue;
                }
            };
            let current_leader_epoch = if version >= 9 {
                p.current_leader_epoch
            } else {
                -1
            };
            if let Err(e) = partition.check_leader_epoch(current_leader_epoch) {
                partitions.push(partition_error(p.partition, e.kafka_error()));
                continue;
            }
            let is_leader = partition.is_leader();
            if select_by_rack && is_leader {
                let image = image.get_or_insert_with(|| ctx.metadata.image());
                if let Some(preferred) =
                    preferred_read_replica(ctx, &partition, client_rack, p.fetch_offset, image)
                {
                    // Kafka's answer: no records, the offsets, the replica to go to.
                    let offsets = partition.offsets();
                    partitions.push(
                        PartitionData::default()
                            .with_partition_index(p.partition)
                            .with_high_watermark(offsets.high_watermark)
                            .with_last_stable_offset(offsets.last_stable_offset)
                            .with_log_start_offset(offsets.log_start_offset)
                            .with_preferred_read_replica(BrokerId(preferred))
                            .with_records(Some(Bytes::new())),
                    );
                    continue;
                }
            }
            watches.push(if replica_id >= 0 {
                partition.watch_log_end_offset()
            } else {
                partition.watch_high_watermark()
            });
            let limit = (p.partition_max_bytes.max(0) as usize).min(remaining);
            let first = total == 0;
            let read = if replica_id >= 0 {
                // A follower always records its fetch offset, even with no room for bytes.
                partition
                    .read_for_follower(
                        replica_id,
                        current_leader_epoch,
                        p.fetch_offset,
                        if limit == 0 && !first {
                            0
                        } else {
                            limit.max(1)
                        },
                        now_ms,
                    )
                    .map(|r| Some(Read::from(r)))
            } else if limit == 0 && !first {
                Ok(None)
            } else if ctx.config.fetch_sendfile_enable && is_leader {
                // Zero-copy: the batches stay in their segment file until the socket
                // writer sends them (`encode`). Reads a follower serves (KIP-392) are
                // copied: their metric counts the records in the bytes.
                partition
                    .read_region(p.fetch_offset, limit.max(1), isolation)
                    .map(|r| {
                        Some(Read {
                            offsets: r.offsets,
                            bytes: Bytes::new(),
                            aborted_transactions: r.aborted_transactions,
                            region: r.region,
                        })
                    })
                    .map_err(ReplicaError::from)
            } else {
                partition
                    .read(p.fetch_offset, limit.max(1), isolation)
                    .map(|r| Some(Read::from(r)))
                    .map_err(ReplicaError::from)
            };
            let offsets = match &read {
                Ok(Some(r)) => r.offsets,
                _ => partition.offsets(),
            };
            let data = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(offsets.high_watermark)
                .with_last_stable_offset(offsets.last_stable_offset)
                .with_log_start_offset(offsets.log_start_offset);
            match read {
                Ok(Some(r)) => {
                    let mut bytes = r.bytes;
                    let mut region = r.region;
                    let mut aborted = r.aborted_transactions;
                    let read_bytes = region.as_ref().map_or(bytes.len(), |r| r.len);
                    // KIP-74: only the response's first batch may exceed the limits.
                    if !first && read_bytes > limit {
                        bytes = Bytes::new();
                        region = None;
                        aborted = aborted.map(|_| Vec::new());
                    }
                    if let Some(region) = region {
                        let held = (region.len >= SENDFILE_MIN_BYTES)
                            .then(RegionHold::take)
                            .flatten();
                        let standing_in = held
                            .and_then(|hold| Some((placeholder(regions.len(), region.len)?, hold)));
                        bytes = match standing_in {
                            Some((placeholder, hold)) => {
                                regions.push((region, hold));
                                placeholder
                            }
                            // Small, too large, too many, or the budget of held files
                            // is spent: copied now, and the file let go at once.
                            None => match region.read_to_bytes() {
                                Ok(bytes) => bytes,
                                Err(e) => {
                                    tracing::error!(topic = %meta.name, partition = p.partition, error = %e, "fetch read failed");
                                    partitions.push(partition_error(
                                        p.partition,
                                        ResponseError::KafkaStorageError,
                                    ));
                                    continue;
                                }
                            },
                        };
                    }
                    let data = match aborted {
                        Some(list) => data.with_aborted_transactions(Some(
                            list.iter()
                                .map(|t| {
                                    AbortedTransaction::default()
                                        .with_producer_id(ProducerId(t.producer_id))
                                        .with_first_offset(t.first_offset)
                                })
                                .collect(),
                        )),
                        None => data,
                    };
                    if replica_id < 0 && !is_leader {
                        ctx.metrics
                            .fetched_from_follower(&meta.name, stored_record_count(&bytes));
                    }
                    total += bytes.len();
                    remaining = remaining.saturating_sub(bytes.len());
                    partitions.push(data.with_records(Some(bytes)));
                }
                Ok(None) => partitions.push(data.with_records(Some(Bytes::new()))),
                Err(ReplicaError::Log(LogError::OffsetOutOfRange { .. })) => partitions.push(
                    data.with_error_code(ResponseError::OffsetOutOfRange.code())
                        .with_records(Some(Bytes::new())),
                ),
                Err(e @ ReplicaError::Log(_)) => {
                    tracing::error!(topic = %meta.name, partition = p.partition, error = %e, "fetch read failed");
                    partitions.push(partition_error(p.partition, e.kafka_error()));
                }
                Err(e) => partitions.push(partition_error(p.partition, e.kafka_error())),
            }
        }
        let (name, topic_id) = match (&meta, &topic.topic) {
            (_, TopicKey::Id(id)) => (TopicName::default(), *id),
            (Some(m), TopicKey::Name(_)) => (
                TopicName(StrBytes::from_string(m.name.clone())),
                Default::default(),
            ),
            (None, TopicKey::Name(name)) => (
                TopicName(StrBytes::from_string(name.clone())),
                Default::default(),
            ),
        };
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(name)
                .with_topic_id(topic_id)
                .with_partitions(partitions),
        );
    }
    (topics, total)
}

/// The most bytes a response to `request` may hold (KIP-74; Kafka's `fetchMaxBytes`): the
/// request's `max_bytes`, capped by the broker's `fetch.max.bytes` so that a request
/// listing one big partition many times cannot make the broker build a response of any
/// size. A follower's cap is the larger of that and `replica.fetch.response.max.bytes`:
/// `fetch.max.bytes` is sized for consumers (weir's default, 2 MiB, is below the 10 MiB
/// followers ask for), and followers, which keep no fetch session, would otherwise catch
/// up in smaller steps and could leave their last partitions unserved behind a backlog on
/// the first ones.
fn response_budget(ctx: &Context, request: &FetchRequest, replica_id: i32) -> usize {
    let cap = if replica_id >= 0 {
        ctx.config
            .fetch_max_bytes
            .max(ctx.config.replication.fetch_response_max_bytes.max(0) as usize)
    } else {
        ctx.config.fetch_max_bytes
    };
    (request.max_bytes.max(0) as usize).min(cap)
}

/// KIP-392 on the leader: the in-sync follower on an active broker in `client_rack` that
/// a consumer fetching `fetch_offset` should read from instead
/// ([`select_read_replica`]), or `None` to serve it here.
fn preferred_read_replica(
    ctx: &Context,
    partition: &Partition,
    client_rack: &str,
    fetch_offset: i64,
    image: &MetadataImage,
) -> Option<i32> {
    let candidates: Vec<(ReadReplicaCandidate, Option<&str>)> = partition
        .in_sync_followers()
        .into_iter()
        .filter_map(|c| {
            let broker = image.broker(c.broker_id).filter(|b| b.is_active())?;
            Some((c, broker.rack.as_deref()))
        })
        .collect();
    select_read_replica(
        client_rack,
        ctx.config.rack.as_deref(),
        fetch_offset,
        &candidates,
    )
}

/// Whether a partition of the response sends the consumer to another replica (KIP-392):
/// answered at once, as Kafka does.
fn has_preferred_replica(topics: &[FetchableTopicResponse]) -> bool {
    topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| p.preferred_read_replica.0 >= 0))
}

/// The fetching replica's broker id: 0 or more for a follower, -1 for a consumer
/// (`replica_id` until v14, `replica_state.replica_id` from v15, KIP-903).
fn replica_id(request: &FetchRequest, version: i16) -> i32 {
    if version >= 15 {
        request.replica_state.replica_id.0
    } else {
        request.replica_id.0
    }
}

fn has_error(topics: &[FetchableTopicResponse]) -> bool {
    topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| p.error_code != 0))
}

/// The request's topic naming: by id from v13 (KIP-516), by name before.
fn topic_key(version: i16, name: &TopicName, id: uuid::Uuid) -> TopicKey {
    if version >= 13 {
        TopicKey::Id(id)
    } else {
        TopicKey::Name(name.0.to_string())
    }
}

/// The request's partitions, in its order.
fn request_plan(request: &FetchRequest, version: i16) -> Vec<TopicFetch> {
    request
        .topics
        .iter()
        .map(|t| TopicFetch {
            topic: topic_key(version, &t.topic, t.topic_id),
            partitions: t
                .partitions
                .iter()
                .map(|p| PartitionFetch {
                    partition: p.partition,
                    fetch_offset: p.fetch_offset,
                    partition_max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                    log_start_offset: p.log_start_offset,
                })
                .collect(),
        })
        .collect()
}

/// The session fields of a consumer's Fetch v7+ (KIP-227).
fn session_request(request: &FetchRequest, version: i16, plan: Vec<TopicFetch>) -> SessionRequest {
    SessionRequest {
        session_id: request.session_id,
        session_epoch: request.session_epoch,
        uses_topic_ids: version >= 13,
        topics: plan,
        forgotten: request
            .forgotten_topics_data
            .iter()
            .flat_map(|t| {
                let key = topic_key(version, &t.topic, t.topic_id);
                t.partitions.iter().map(move |p| (key.clone(), *p))
            })
            .collect(),
    }
}

/// What the response says of each partition, for the session.
fn sent(topics: &[FetchableTopicResponse]) -> Vec<Vec<PartitionSent>> {
    topics
        .iter()
        .map(|t| {
            t.partitions
                .iter()
                .map(|p| PartitionSent {
                    high_watermark: p.high_watermark,
                    log_start_offset: p.log_start_offset,
                    last_stable_offset: p.last_stable_offset,
                    error_code: p.error_code,
                    has_records: p.records.as_ref().is_some_and(|r| !r.is_empty()),
                    has_preferred_replica: p.preferred_read_replica.0 >= 0,
                })
                .collect()
        })
        .collect()
}

fn session_error(error: SessionError) -> FetchResponse {
    FetchResponse::default()
        .with_error_code(error.code())
        .with_session_id(INVALID_SESSION_ID)
}

/// Answers a request that was read: creates the session of a full request, or keeps only
/// the partitions an incremental response must carry. Runs once per request.
fn answer(
    ctx: &Context,
    context: &FetchContext,
    plan: &[TopicFetch],
    version: i16,
    mut topics: Vec<FetchableTopicResponse>,
) -> FetchResponse {
    let now_ms = crate::replica::now_ms();
    let session_id = match context {
        FetchContext::Sessionless | FetchContext::Error(_) => INVALID_SESSION_ID,
        FetchContext::Full => {
            let sent = sent(&topics);
            let partitions = plan
                .iter()
                .zip(sent)
                .flat_map(|(t, sent)| {
                    t.partitions
                        .iter()
                        .zip(sent)
                        .map(|(p, s)| (t.topic.clone(), *p, s))
                })
                .collect();
            ctx.fetch_sessions.create(now_ms, version >= 13, partitions)
        }
        FetchContext::Incremental {
            session_id, epoch, ..
        } => {
            let keep =
                match ctx
                    .fetch_sessions
                    .complete(now_ms, *session_id, *epoch, plan, &sent(&topics))
                {
                    Ok(keep) => keep,
                    Err(e) => return session_error(e),
                };
            for (topic, keep) in topics.iter_mut().zip(keep) {
                let mut keep = keep.into_iter();
                topic.partitions.retain(|_| keep.next().unwrap_or(true));
            }
            topics.retain(|t| !t.partitions.is_empty());
            *session_id
        }
    };
    FetchResponse::default()
        .with_error_code(0)
        .with_session_id(session_id)
        .with_responses(topics)
}

/// Handles a Fetch request, long-polling per `max_wait_ms` / `min_bytes`: the response,
/// and the file regions its placeholders stand for ([`encode`] writes both).
pub(super) async fn handle(
    ctx: &Context,
    request: FetchRequest,
    version: i16,
) -> (FetchResponse, Vec<(FileRegion, RegionHold)>) {
    let wait_ms = request.max_wait_ms.clamp(0, MAX_WAIT_MS_LIMIT) as u64;
    let deadline = Instant::now() + std::time::Duration::from_millis(wait_ms);
    // Kafka's fetchMinBytes: never more than the response may hold. A min_bytes cut down
    // to the budget is met once what is left of the budget could not take another
    // partition's full share: whole batches may stop short of the budget itself, and
    // the fetch would otherwise park until max_wait_ms.
    let budget = response_budget(ctx, &request, replica_id(&request, version));
    let asked_min_bytes = request.min_bytes.max(0) as usize;
    let min_bytes = asked_min_bytes.min(budget);
    let request_plan = request_plan(&request, version);
    // Followers stay sessionless (see the module doc); sessions start at v7.
    let (context, plan) = if version >= 7 && replica_id(&request, version) < 0 {
        let session = session_request(&request, version, request_plan);
        let context = ctx
            .fetch_sessions
            .new_context(crate::replica::now_ms(), &session);
        tracing::debug!(
            session_id = session.session_id,
            session_epoch = session.session_epoch,
            context = context.kind(),
            "fetch session"
        );
        match context {
            FetchContext::Error(e) => return (session_error(e), Vec::new()),
            FetchContext::Incremental {
                session_id,
                epoch,
                topics,
            } => (
                FetchContext::Incremental {
                    session_id,
                    epoch,
                    topics: Vec::new(),
                },
                topics,
            ),
            context => (context, session.topics),
        }
    } else {
        (FetchContext::Sessionless, request_plan)
    };
    // The partitions read: an incremental request's are the session's.
    let largest_share = plan
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.partition_max_bytes.max(0) as usize)
        .max()
        .unwrap_or(0);
    let budget_spent = |total: usize| {
        asked_min_bytes > budget && total > 0 && budget - total.min(budget) < largest_share
    };
    loop {
        let mut watches = Vec::new();
        let mut regions = Vec::new();
        let (topics, total) = read_once(ctx, &request, &plan, version, &mut watches, &mut regions);
        let now = Instant::now();
        if min_bytes == 0
            || total >= min_bytes
            || budget_spent(total)
            || now >= deadline
            || has_error(&topics)
            || has_preferred_replica(&topics)
        {
            return (answer(ctx, &context, &plan, version, topics), regions);
        }
        // A parked read keeps its regions (and their share of the held-file budget)
        // until it reads again: the purgatory answers a full park at once with them.
        let left_ms = (deadline - now).as_millis() as u64;
        let wake = ctx
            .replicas
            .purgatory()
            .park(&mut watches, left_ms.max(1))
            .await;
        // With the purgatory full (woken before the deadline), answer now with what there
        // is. Past the deadline, a consumer's answer is this read's unless a partition's
        // watch fired since (its high watermark moved, its role changed, its log start
        // moved: DeleteRecords or retention, or it went away): reading every partition
        // again would find the same records and offsets, which a caught-up consumer of
        // many partitions would otherwise pay for twice per fetch (issue 17). A
        // follower's fetch reads again, as Kafka's does: the read records when it was
        // caught up.
        if wake == Wake::Deadline
            && (Instant::now() < deadline
                || (replica_id(&request, version) < 0
                    && !watches.iter().any(|w| w.has_changed().unwrap_or(true))))
        {
            return (answer(ctx, &context, &plan, version, topics), regions);
        }
    }
}

/// Counts the record bytes `response` returns per topic (`weir_bytes_out_total`). From v13
/// the response names topics by id only, so the name comes from the metadata (a topic
/// deleted meanwhile is not counted).
pub(super) fn count_bytes_out(ctx: &Context, response: &FetchResponse) {
    for topic in &response.responses {
        let bytes: usize = topic
            .partitions
            .iter()
            .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
            .sum();
        if bytes == 0 {
            continue;
        }
        if !topic.topic.0.is_empty() {
            ctx.metrics.fetched(topic.topic.0.as_str(), bytes as u64);
        } else if let Some(meta) = ctx.metadata.topic_by_id(topic.topic_id) {
            ctx.metrics.fetched(&meta.name, bytes as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use kafka_protocol::messages::fetch_response::{EpochEndOffset, LeaderIdAndEpoch};
    use kafka_protocol::messages::BrokerId;

    use super::*;

    /// The bytes `outcome` puts on the wire after the size prefix, file parts read back,
    /// and how many file parts it has.
    fn wire_bytes(outcome: Outcome) -> (Vec<u8>, usize) {
        let Outcome::RespondParts { len, parts } = outcome else {
            panic!("not parts: {outcome:?}");
        };
        let files = parts
            .iter()
            .filter(|p| matches!(p, ResponsePart::File { .. }))
            .count();
        let mut out = Vec::new();
        for part in parts {
            match part {
                ResponsePart::Bytes(b) => out.extend_from_slice(&b),
                ResponsePart::File {
                    file,
                    position,
                    len,
                    ..
                } => {
                    let region = FileRegion {
                        file,
                        position,
                        len,
                        base_offset: 0,
                        last_offset: 0,
                    };
                    out.extend_from_slice(&region.read_to_bytes().unwrap());
                }
            }
        }
        assert_eq!(out.len(), len);
        (out, files)
    }

    /// Every version's response encoded in parts, with record sets behind placeholders,
    /// is byte for byte kafka-protocol's encoding of the same response with the bytes in
    /// memory: around regions, plain record sets, aborted transactions, a preferred read
    /// replica (v11+), tagged fields (v12+), topic names or ids (v13+).
    #[test]
    fn parts_are_the_crates_encoding_in_every_version() {
        let mut file = tempfile::tempfile().unwrap();
        let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        file.write_all(&content).unwrap();
        let file = Arc::new(file);
        let spans = [(0u64, 1_000usize), (1_000, 30_000), (37_777, 20_000)];
        for version in 4..=16i16 {
            let regions: Vec<(FileRegion, RegionHold)> = spans
                .iter()
                .map(|&(position, len)| {
                    let region = FileRegion {
                        file: Arc::clone(&file),
                        position,
                        len,
                        base_offset: 0,
                        last_offset: 0,
                    };
                    (region, RegionHold::take().expect("within the budget"))
                })
                .collect();
            let build = |records: &dyn Fn(usize) -> Bytes| {
                let partition = |index: i32, records: Bytes| {
                    PartitionData::default()
                        .with_partition_index(index)
                        .with_high_watermark(100 + i64::from(index))
                        .with_last_stable_offset(90)
                        .with_log_start_offset(if version >= 5 { 3 } else { -1 })
                        .with_records(Some(records))
                };
                let mut first = vec![
                    partition(0, records(0)),
                    partition(1, Bytes::from_static(b"in memory")),
                    partition(2, records(1)).with_aborted_transactions(Some(vec![
                        AbortedTransaction::default()
                            .with_producer_id(ProducerId(7))
                            .with_first_offset(5),
                    ])),
                ];
                if version >= 11 {
                    first.push(partition(3, Bytes::new()).with_preferred_read_replica(BrokerId(2)));
                }
                if version >= 12 {
                    first.push(
                        partition(4, Bytes::new())
                            .with_error_code(6)
                            .with_current_leader(
                                LeaderIdAndEpoch::default()
                                    .with_leader_id(BrokerId(1))
                                    .with_leader_epoch(4),
                            )
                            .with_diverging_epoch(
                                EpochEndOffset::default().with_epoch(2).with_end_offset(9),
                            ),
                    );
                }
                let topic = |name: &str, id: u128, partitions| {
                    let t = FetchableTopicResponse::default().with_partitions(partitions);
                    if version >= 13 {
                        t.with_topic_id(uuid::Uuid::from_u128(id))
                    } else {
                        t.with_topic(TopicName(StrBytes::from_string(name.into())))
                    }
                };
                let response = FetchResponse::default().with_responses(vec![
                    topic("a", 1, first),
                    topic("b", 2, vec![partition(0, records(2))]),
                ]);
                if version >= 7 {
                    response.with_session_id(12).with_error_code(0)
                } else {
                    response
                }
            };
            let with_placeholders =
                build(&|k| placeholder(k, spans[k].1).expect("within the limits"));
            let in_memory = build(&|k| {
                let (position, len) = spans[k];
                Bytes::copy_from_slice(&content[position as usize..position as usize + len])
            });
            let parts = encode(&with_placeholders, regions, version, 42);
            let mut expected = BytesMut::new();
            ResponseHeader::default()
                .with_correlation_id(42)
                .encode(
                    &mut expected,
                    ApiKey::Fetch.response_header_version(version),
                )
                .unwrap();
            in_memory.encode(&mut expected, version).unwrap();
            let (bytes, files) = wire_bytes(parts);
            assert_eq!(bytes, expected.to_vec(), "v{version}");
            assert_eq!(files, 3, "v{version}: a file part per region");
        }
    }

    /// A placeholder whose region is not among the response's closes the connection
    /// rather than sending its zeros as records.
    #[test]
    fn a_placeholder_without_its_region_is_not_sent() {
        let response =
            FetchResponse::default()
                .with_responses(vec![FetchableTopicResponse::default().with_partitions(
                    vec![PartitionData::default().with_records(Some(placeholder(0, 100).unwrap()))],
                )]);
        assert!(matches!(
            encode(&response, Vec::new(), 12, 1),
            Outcome::Close(_)
        ));
    }

    #[test]
    fn placeholders_stay_within_their_limits() {
        assert!(placeholder(0, 0).is_none());
        assert!(placeholder(REGIONS_MAX, 1).is_none());
        assert!(placeholder(0, REGION_MAX_BYTES + 1).is_none());
        let last = placeholder(REGIONS_MAX - 1, REGION_MAX_BYTES).unwrap();
        assert_eq!(placeholder_index(&last), Some(REGIONS_MAX - 1));
        assert_eq!(placeholder_index(b"elsewhere"), None);
        assert_eq!(
            placeholder_index(&placeholders()[REGIONS_MAX..REGIONS_MAX + 5]),
            None
        );
    }
}
