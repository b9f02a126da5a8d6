//! Record batch v2 headers: validation, the few header fields the log rewrites at append
//! time, and splitting a produce payload into batches.
//!
//! Owns: the byte layout of the 61-byte record batch header (Kafka protocol guide,
//! "Record Batch", magic 2) and its CRC-32C. Never does: decompress, decode or re-encode
//! records (apart from `first_record_at_or_after`, a walk with `records` over
//! *uncompressed* record timestamps used by ListOffsets), touch files, or know about requests.
//!
//! Layout (big-endian):
//!
//! | bytes  | field                 | in CRC |
//! |--------|-----------------------|--------|
//! | 0..8   | baseOffset i64        | no     |
//! | 8..12  | batchLength i32       | no     |
//! | 12..16 | partitionLeaderEpoch  | no     |
//! | 16     | magic i8 (= 2)        | no     |
//! | 17..21 | crc u32 (CRC-32C)     | no     |
//! | 21..23 | attributes i16        | yes    |
//! | 23..27 | lastOffsetDelta i32   | yes    |
//! | 27..35 | baseTimestamp i64     | yes    |
//! | 35..43 | maxTimestamp i64      | yes    |
//! | 43..51 | producerId i64        | yes    |
//! | 51..53 | producerEpoch i16     | yes    |
//! | 53..57 | baseSequence i32      | yes    |
//! | 57..61 | recordCount i32       | yes    |
//! | 61..   | records               | yes    |

use bytes::Bytes;

use super::records::Records;

/// Size of the record batch v2 header in bytes (protocol guide, "Record Batch").
pub const BATCH_HEADER_BYTES: usize = 61;
/// Bytes before `batchLength` counts: baseOffset (8) + batchLength (4). A batch occupies
/// `batchLength + LOG_OVERHEAD_BYTES` bytes.
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// The only record batch format weir stores (`magic` byte).
pub const MAGIC_V2: i8 = 2;

pub(crate) const BASE_OFFSET_AT: usize = 0;
pub(crate) const BATCH_LENGTH_AT: usize = 8;
pub(crate) const LEADER_EPOCH_AT: usize = 12;
pub(crate) const MAGIC_AT: usize = 16;
pub(crate) const CRC_AT: usize = 17;
pub(crate) const ATTRIBUTES_AT: usize = 21;
pub(crate) const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
pub(crate) const RECORD_COUNT_AT: usize = 57;

pub(crate) const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

/// Why a batch was refused. Each variant maps to one Kafka error code; the protocol layer
/// does the mapping ([`BatchError::kafka_error_code`] gives it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Bad length, magic or CRC: the bytes are not a well-formed v2 batch.
    /// Kafka `CORRUPT_MESSAGE` (2).
    #[error("corrupt record batch at byte {position} of the payload: {reason}")]
    CorruptMessage {
        /// Byte position of the batch inside the payload handed to `split_batches`
        /// (0 for `validate`).
        position: usize,
        /// What was wrong, with the values seen.
        reason: String,
    },
    /// Well-formed bytes with inconsistent contents (negative or mismatched record count,
    /// negative lastOffsetDelta). Kafka `INVALID_RECORD` (87).
    #[error("invalid record batch: {reason}")]
    InvalidRecord {
        /// What was wrong, with the values seen.
        reason: String,
    },
    /// Compression codec outside 0..=4 (none, gzip, snappy, lz4, zstd).
    /// Kafka `UNSUPPORTED_COMPRESSION_TYPE` (76).
    #[error("unsupported compression codec {codec}")]
    UnsupportedCompression {
        /// The three low attribute bits as sent.
        codec: u8,
    },
}

impl BatchError {
    /// The Kafka error code for this error: 2 (CORRUPT_MESSAGE), 87 (INVALID_RECORD) or
    /// 76 (UNSUPPORTED_COMPRESSION_TYPE).
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            BatchError::CorruptMessage { .. } => 2,
            BatchError::InvalidRecord { .. } => 87,
            BatchError::UnsupportedCompression { .. } => 76,
        }
    }
}

/// Compression codec of a batch (attributes bits 0-2). The log never decompresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// 0: records stored as-is.
    None,
    /// 1
    Gzip,
    /// 2
    Snappy,
    /// 3
    Lz4,
    /// 4
    Zstd,
}

/// Timestamp type of a batch (attributes bit 3); `message.timestamp.type` in Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// Bit 3 clear: timestamps set by the producer.
    CreateTime,
    /// Bit 3 set: maxTimestamp set by the broker at append; records' own timestamps are
    /// ignored by readers.
    LogAppendTime,
}

/// A record batch whose length, magic, CRC-32C, compression codec and counts were checked
/// by [`validate`]. The only type `PartitionLog::append` accepts (a precondition in a type).
///
/// The header is held as a copy so the log can rewrite baseOffset, partitionLeaderEpoch and
/// (for LogAppendTime) attributes/maxTimestamp/crc without copying the records; the stored
/// bytes are `header() ++ records()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedBatch {
    header: [u8; BATCH_HEADER_BYTES],
    bytes: Bytes,
}

/// Checks one complete record batch v2 (protocol guide, "Record Batch").
///
/// `bytes` must hold exactly one batch. Checks: at least 61 bytes; `batchLength + 12 ==
/// bytes.len()`; magic 2; CRC-32C over attributes..end; compression codec 0..=4;
/// `lastOffsetDelta >= 0`; `recordCount >= 0`; and, as Kafka's LogValidator requires of
/// client batches, `recordCount == lastOffsetDelta + 1`. Records are not decoded.
///
/// Errors: [`BatchError::CorruptMessage`] (length, magic, CRC), [`BatchError::InvalidRecord`]
/// (counts), [`BatchError::UnsupportedCompression`] (codec).
pub fn validate(bytes: Bytes) -> Result<ValidatedBatch, BatchError> {
    let batch = validate_stored(bytes, 0)?;
    let count = batch.record_count();
    let last_offset_delta = batch.last_offset_delta();
    if i64::from(count) != i64::from(last_offset_delta) + 1 {
        return Err(BatchError::InvalidRecord {
            reason: format!(
                "recordCount {count} does not match lastOffsetDelta {last_offset_delta} + 1"
            ),
        });
    }
    Ok(batch)
}

/// Checks a batch the broker re-encoded itself (`log::rewrite`): the structural checks of
/// [`validate_stored`] plus `recordCount <= lastOffsetDelta + 1`, because a rewritten batch
/// may leave offset gaps (dropped records), as a compacted one does.
///
/// Errors: as [`validate`].
pub(crate) fn validate_rewritten(bytes: Bytes) -> Result<ValidatedBatch, BatchError> {
    let batch = validate_stored(bytes, 0)?;
    let count = batch.record_count();
    let last_offset_delta = batch.last_offset_delta();
    if i64::from(count) > i64::from(last_offset_delta) + 1 {
        return Err(BatchError::InvalidRecord {
            reason: format!("recordCount {count} exceeds lastOffsetDelta {last_offset_delta} + 1"),
        });
    }
    Ok(batch)
}

/// Structural checks only (what recovery and replicated data need): length, magic, CRC,
/// codec, non-negative counts. `position` is only used in error messages.
pub(crate) fn validate_stored(bytes: Bytes, position: usize) -> Result<ValidatedBatch, BatchError> {
    let corrupt = |reason: String| BatchError::CorruptMessage { position, reason };
    if bytes.len() < BATCH_HEADER_BYTES {
        return Err(corrupt(format!(
            "{} bytes is shorter than the {BATCH_HEADER_BYTES}-byte header",
            bytes.len()
        )));
    }
    let mut header = [0u8; BATCH_HEADER_BYTES];
    header.copy_from_slice(&bytes[..BATCH_HEADER_BYTES]);
    let batch_length = read_i32(&header, BATCH_LENGTH_AT);
    if i64::from(batch_length) + LOG_OVERHEAD_BYTES as i64 != bytes.len() as i64 {
        return Err(corrupt(format!(
            "batchLength {batch_length} + {LOG_OVERHEAD_BYTES} != {} bytes",
            bytes.len()
        )));
    }
    let magic = header[MAGIC_AT] as i8;
    if magic != MAGIC_V2 {
        return Err(corrupt(format!("magic {magic}, only 2 is supported")));
    }
    let stored_crc = read_u32(&header, CRC_AT);
    let computed_crc = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
    if stored_crc != computed_crc {
        return Err(corrupt(format!(
            "crc {stored_crc:#010x} stored, {computed_crc:#010x} computed"
        )));
    }
    let batch = ValidatedBatch { header, bytes };
    let codec = (batch.attributes() & COMPRESSION_MASK) as u8;
    if codec > 4 {
        return Err(BatchError::UnsupportedCompression { codec });
    }
    if batch.last_offset_delta() < 0 {
        return Err(BatchError::InvalidRecord {
            reason: format!("lastOffsetDelta {} is negative", batch.last_offset_delta()),
        });
    }
    if batch.record_count() < 0 {
        return Err(BatchError::InvalidRecord {
            reason: format!("recordCount {} is negative", batch.record_count()),
        });
    }
    Ok(batch)
}

/// The last offset of the last whole batch in `bytes` (concatenated stored batches, as a
/// read returns them), walking the headers only; `None` when `bytes` holds no whole batch.
/// A length that runs past the end stops the walk (what came before counts).
pub fn last_offset_in(bytes: &[u8]) -> Option<i64> {
    let mut position = 0usize;
    let mut last = None;
    while bytes.len() - position >= BATCH_HEADER_BYTES {
        let header = BatchHeader::parse(&bytes[position..position + BATCH_HEADER_BYTES]);
        let total = header.total_bytes();
        if total < BATCH_HEADER_BYTES as i64 || total as u64 > (bytes.len() - position) as u64 {
            break;
        }
        last = Some(header.last_offset());
        position += total as usize;
    }
    last
}

/// Splits a produce request's `records` field (zero or more concatenated v2 batches) into
/// validated batches, each a zero-copy slice of `bytes`.
///
/// An empty payload gives an empty vector (the caller decides whether that is an error).
/// Trailing bytes too short to be a batch, or a batchLength that runs past the end, are
/// [`BatchError::CorruptMessage`] with the byte position of the offending batch; each batch
/// is then checked as [`validate`] does.
pub fn split_batches(bytes: Bytes) -> Result<Vec<ValidatedBatch>, BatchError> {
    let mut batches = Vec::new();
    let mut position = 0usize;
    while position < bytes.len() {
        let remaining = bytes.len() - position;
        if remaining < BATCH_HEADER_BYTES {
            return Err(BatchError::CorruptMessage {
                position,
                reason: format!("{remaining} trailing bytes are shorter than a batch header"),
            });
        }
        let batch_length = read_i32(&bytes[position..], BATCH_LENGTH_AT);
        let total = i64::from(batch_length) + LOG_OVERHEAD_BYTES as i64;
        if total < BATCH_HEADER_BYTES as i64 || total > remaining as i64 {
            return Err(BatchError::CorruptMessage {
                position,
                reason: format!("batchLength {batch_length} with {remaining} bytes left"),
            });
        }
        let end = position + total as usize;
        let batch = validate(bytes.slice(position..end)).map_err(|e| match e {
            BatchError::CorruptMessage { reason, .. } => {
                BatchError::CorruptMessage { position, reason }
            }
            other => other,
        })?;
        batches.push(batch);
        position = end;
    }
    Ok(batches)
}

/// Splits the `records` of a leader's Fetch response partition (zero or more concatenated
/// stored v2 batches) into batches for `PartitionLog::append_as_follower`, each a
/// zero-copy slice of `bytes` that keeps the leader's baseOffset, partitionLeaderEpoch and
/// timestamps.
///
/// Each whole batch gets the structural checks of recovery (`validate_stored`: batchLength,
/// magic, CRC-32C, codec, non-negative counts) but not `validate`'s `recordCount ==
/// lastOffsetDelta + 1`, because a batch the leader's cleaner rewrote keeps its
/// lastOffsetDelta with fewer records. A trailing partial batch (fewer bytes left than a
/// header, or a batchLength running past the end) is dropped, not an error: a Kafka leader
/// may end a size-limited response mid-batch (weir's own leader sends whole batches), and
/// the follower fetches the rest next time; Kafka's fetcher stops there the same way
/// (`ByteBufferLogInputStream`). If even the first batch is partial the result is empty.
///
/// Errors: [`BatchError::CorruptMessage`] (batchLength below the header size, magic, CRC;
/// with the byte position in `bytes`), [`BatchError::InvalidRecord`],
/// [`BatchError::UnsupportedCompression`]. Kafka's fetcher answers a corrupt fetched batch
/// by failing that partition's fetch (`CorruptRecordException`) and retrying.
pub fn split_fetched(bytes: Bytes) -> Result<Vec<ValidatedBatch>, BatchError> {
    let mut batches = Vec::new();
    let mut position = 0usize;
    while let Some(end) = whole_batch_end(&bytes, position)? {
        batches.push(validate_stored(bytes.slice(position..end), position)?);
        position = end;
    }
    Ok(batches)
}

/// Where the batch at `position` of `bytes` ends, by its header's batchLength; `None` for
/// a trailing partial batch (fewer bytes left than a header or than batchLength says).
///
/// Errors: [`BatchError::CorruptMessage`] when batchLength is shorter than a header.
fn whole_batch_end(bytes: &[u8], position: usize) -> Result<Option<usize>, BatchError> {
    let remaining = bytes.len() - position;
    if remaining < BATCH_HEADER_BYTES {
        return Ok(None);
    }
    let batch_length = read_i32(&bytes[position..], BATCH_LENGTH_AT);
    let total = i64::from(batch_length) + LOG_OVERHEAD_BYTES as i64;
    if total < BATCH_HEADER_BYTES as i64 {
        return Err(BatchError::CorruptMessage {
            position,
            reason: format!("batchLength {batch_length} is shorter than a batch header"),
        });
    }
    Ok((total <= remaining as i64).then_some(position + total as usize))
}

/// The records in `bytes`, whole stored v2 batches as a read returns them
/// (`PartitionLog::read`): the sum of the batch headers' recordCount, header by header
/// (the records themselves are not parsed). Stops at a trailing partial batch or a
/// batchLength shorter than a header; a negative count adds nothing. For metrics only:
/// the bytes are this broker's own, checked when they were appended.
pub fn stored_record_count(bytes: &[u8]) -> u64 {
    let mut count = 0u64;
    let mut position = 0usize;
    while let Ok(Some(end)) = whole_batch_end(bytes, position) {
        count += u64::try_from(read_i32(&bytes[position..], RECORD_COUNT_AT)).unwrap_or(0);
        position = end;
    }
    count
}

impl ValidatedBatch {
    /// Total size in bytes (header + records), as stored on disk.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a valid batch has at least its 61-byte header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// baseOffset (i64). Clients send 0; the log overwrites it with the assigned offset.
    pub fn base_offset(&self) -> i64 {
        read_i64(&self.header, BASE_OFFSET_AT)
    }

    /// baseOffset + lastOffsetDelta: the offset of the batch's last record.
    pub fn last_offset(&self) -> i64 {
        self.base_offset() + i64::from(self.last_offset_delta())
    }

    /// partitionLeaderEpoch (i32) as currently in the header.
    pub fn partition_leader_epoch(&self) -> i32 {
        read_i32(&self.header, LEADER_EPOCH_AT)
    }

    /// The stored CRC-32C (covers attributes..end).
    pub fn crc(&self) -> u32 {
        read_u32(&self.header, CRC_AT)
    }

    /// attributes (i16) raw.
    pub fn attributes(&self) -> i16 {
        read_i16(&self.header, ATTRIBUTES_AT)
    }

    /// lastOffsetDelta (i32, >= 0 after validation).
    pub fn last_offset_delta(&self) -> i32 {
        read_i32(&self.header, LAST_OFFSET_DELTA_AT)
    }

    /// baseTimestamp in ms since the epoch (-1 if none).
    pub fn base_timestamp(&self) -> i64 {
        read_i64(&self.header, BASE_TIMESTAMP_AT)
    }

    /// maxTimestamp in ms since the epoch (-1 if none); for LogAppendTime batches the
    /// broker's append time.
    pub fn max_timestamp(&self) -> i64 {
        read_i64(&self.header, MAX_TIMESTAMP_AT)
    }

    /// producerId (-1 when not idempotent).
    pub fn producer_id(&self) -> i64 {
        read_i64(&self.header, PRODUCER_ID_AT)
    }

    /// producerEpoch (-1 when not idempotent).
    pub fn producer_epoch(&self) -> i16 {
        read_i16(&self.header, PRODUCER_EPOCH_AT)
    }

    /// baseSequence (-1 when not idempotent).
    pub fn base_sequence(&self) -> i32 {
        read_i32(&self.header, BASE_SEQUENCE_AT)
    }

    /// recordCount (>= 0 after validation).
    pub fn record_count(&self) -> i32 {
        read_i32(&self.header, RECORD_COUNT_AT)
    }

    /// Compression codec from attributes bits 0-2 (0..=4 after validation).
    pub fn compression(&self) -> Compression {
        match self.attributes() & COMPRESSION_MASK {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => unreachable!("validate rejects codec {other}"),
        }
    }

    /// Attributes bit 4.
    pub fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_BIT != 0
    }

    /// Attributes bit 5 (transaction markers). The log stores control batches like any
    /// other; refusing them from plain clients is the protocol layer's call.
    pub fn is_control(&self) -> bool {
        self.attributes() & CONTROL_BIT != 0
    }

    /// Attributes bit 3.
    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes() & TIMESTAMP_TYPE_BIT != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    /// Sets baseOffset (bytes 0..8, outside the CRC).
    pub fn set_base_offset(&mut self, base_offset: i64) {
        self.header[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
    }

    /// Sets partitionLeaderEpoch (bytes 12..16, outside the CRC).
    pub fn set_partition_leader_epoch(&mut self, leader_epoch: i32) {
        self.header[LEADER_EPOCH_AT..LEADER_EPOCH_AT + 4]
            .copy_from_slice(&leader_epoch.to_be_bytes());
    }

    /// Applies `message.timestamp.type=LogAppendTime`: sets attributes bit 3 and
    /// maxTimestamp to `log_append_time_ms`, then recomputes the CRC-32C (one pass over
    /// the records; the records themselves are untouched, as in Kafka).
    pub fn set_log_append_time(&mut self, log_append_time_ms: i64) {
        let attributes = self.attributes() | TIMESTAMP_TYPE_BIT;
        self.header[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
        self.header[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8]
            .copy_from_slice(&log_append_time_ms.to_be_bytes());
        let crc = crc32c::crc32c(&self.header[ATTRIBUTES_AT..]);
        let crc = crc32c::crc32c_append(crc, &self.bytes[BATCH_HEADER_BYTES..]);
        self.header[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    }

    /// The (possibly rewritten) 61-byte header.
    pub fn header(&self) -> &[u8; BATCH_HEADER_BYTES] {
        &self.header
    }

    /// The records section, as the client sent it.
    pub fn records(&self) -> &[u8] {
        &self.bytes[BATCH_HEADER_BYTES..]
    }

    /// The records section as a zero-copy slice of the batch's bytes.
    pub(crate) fn records_bytes(&self) -> Bytes {
        self.bytes.slice(BATCH_HEADER_BYTES..)
    }

    /// The whole batch as it would be stored: current header followed by the records.
    /// Copies; meant for tests and replication, not the append path.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(self.records());
        Bytes::from(out)
    }
}

/// The header fields the log needs when it scans stored batches (recovery, reads,
/// indexes). Parsed from the first 61 bytes without any check beyond the slice length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses a header; `bytes` must hold at least [`BATCH_HEADER_BYTES`] (asserted: the
    /// callers read exactly that many).
    pub(crate) fn parse(bytes: &[u8]) -> BatchHeader {
        assert!(bytes.len() >= BATCH_HEADER_BYTES, "header slice too short");
        BatchHeader {
            base_offset: read_i64(bytes, BASE_OFFSET_AT),
            batch_length: read_i32(bytes, BATCH_LENGTH_AT),
            partition_leader_epoch: read_i32(bytes, LEADER_EPOCH_AT),
            magic: bytes[MAGIC_AT] as i8,
            crc: read_u32(bytes, CRC_AT),
            attributes: read_i16(bytes, ATTRIBUTES_AT),
            last_offset_delta: read_i32(bytes, LAST_OFFSET_DELTA_AT),
            base_timestamp: read_i64(bytes, BASE_TIMESTAMP_AT),
            max_timestamp: read_i64(bytes, MAX_TIMESTAMP_AT),
            producer_id: read_i64(bytes, PRODUCER_ID_AT),
            producer_epoch: read_i16(bytes, PRODUCER_EPOCH_AT),
            base_sequence: read_i32(bytes, BASE_SEQUENCE_AT),
            record_count: read_i32(bytes, RECORD_COUNT_AT),
        }
    }

    /// Total stored size: batchLength + 12 (may be nonsense if the header is corrupt).
    pub(crate) fn total_bytes(&self) -> i64 {
        i64::from(self.batch_length) + LOG_OVERHEAD_BYTES as i64
    }

    pub(crate) fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub(crate) fn is_uncompressed(&self) -> bool {
        self.attributes & COMPRESSION_MASK == 0
    }

    pub(crate) fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }

    pub(crate) fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    pub(crate) fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    /// The codec, or `None` for codec bits outside 0..=4 (only possible on corrupt data).
    pub(crate) fn compression(&self) -> Option<Compression> {
        match self.attributes & COMPRESSION_MASK {
            0 => Some(Compression::None),
            1 => Some(Compression::Gzip),
            2 => Some(Compression::Snappy),
            3 => Some(Compression::Lz4),
            4 => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// For an uncompressed CreateTime batch (`bytes` = one whole batch), the offset and
/// timestamp of the first record whose timestamp is >= `target_ms`, walking its records
/// with the record walker (`records`) only as far as that record. Returns `None` when no
/// record qualifies or the records before it do not decode (the caller then falls back to
/// the batch's base offset and maxTimestamp).
pub(crate) fn first_record_at_or_after(bytes: &[u8], target_ms: i64) -> Option<(i64, i64)> {
    let header = BatchHeader::parse(bytes.get(..BATCH_HEADER_BYTES)?);
    for record in Records::new(&bytes[BATCH_HEADER_BYTES..], header.record_count) {
        let record = record.ok()?;
        let timestamp = header.base_timestamp.checked_add(record.timestamp_delta)?;
        if timestamp >= target_ms {
            return Some((
                header.base_offset + i64::from(record.offset_delta),
                timestamp,
            ));
        }
    }
    None
}

fn read_i16(bytes: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn read_i32(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn read_i64(bytes: &[u8], at: usize) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    i64::from_be_bytes(raw)
}

/// Test helpers: building valid batches the way a client would.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Shape of a test batch.
    #[derive(Debug, Clone)]
    pub(crate) struct BatchSpec {
        pub records: Vec<(i64, Vec<u8>)>, // (timestamp delta, value)
        pub base_timestamp: i64,
        pub producer_id: i64,
        pub producer_epoch: i16,
        pub base_sequence: i32,
        pub attributes: i16,
    }

    impl BatchSpec {
        /// `count` records with 10-byte values, timestamps `base_timestamp + i`.
        pub(crate) fn new(count: usize, base_timestamp: i64) -> BatchSpec {
            BatchSpec {
                records: (0..count).map(|i| (i as i64, vec![b'v'; 10])).collect(),
                base_timestamp,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
                attributes: 0,
            }
        }

        pub(crate) fn idempotent(
            mut self,
            producer_id: i64,
            epoch: i16,
            base_sequence: i32,
        ) -> Self {
            self.producer_id = producer_id;
            self.producer_epoch = epoch;
            self.base_sequence = base_sequence;
            self
        }

        pub(crate) fn build_bytes(&self) -> Vec<u8> {
            let mut records = Vec::new();
            for (i, (ts_delta, value)) in self.records.iter().enumerate() {
                let mut body = Vec::new();
                body.push(0u8); // attributes
                put_varlong(&mut body, *ts_delta);
                put_varlong(&mut body, i as i64);
                put_varlong(&mut body, -1); // null key
                put_varlong(&mut body, value.len() as i64);
                body.extend_from_slice(value);
                put_varlong(&mut body, 0); // headers
                put_varlong(&mut records, body.len() as i64);
                records.extend_from_slice(&body);
            }
            let count = self.records.len() as i32;
            let max_delta = self.records.iter().map(|r| r.0).max().unwrap_or(0);
            let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + records.len());
            out.extend_from_slice(&0i64.to_be_bytes());
            let batch_length = (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + records.len()) as i32;
            out.extend_from_slice(&batch_length.to_be_bytes());
            out.extend_from_slice(&(-1i32).to_be_bytes());
            out.push(2);
            out.extend_from_slice(&0u32.to_be_bytes());
            out.extend_from_slice(&self.attributes.to_be_bytes());
            out.extend_from_slice(&(count - 1).max(0).to_be_bytes());
            out.extend_from_slice(&self.base_timestamp.to_be_bytes());
            out.extend_from_slice(&(self.base_timestamp + max_delta).to_be_bytes());
            out.extend_from_slice(&self.producer_id.to_be_bytes());
            out.extend_from_slice(&self.producer_epoch.to_be_bytes());
            out.extend_from_slice(&self.base_sequence.to_be_bytes());
            out.extend_from_slice(&count.to_be_bytes());
            out.extend_from_slice(&records);
            let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
            out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
            out
        }

        pub(crate) fn build(&self) -> ValidatedBatch {
            validate(Bytes::from(self.build_bytes())).expect("test batch is valid")
        }
    }

    /// Appends `value` as a zigzag varint (Kafka's varint and varlong share the encoding).
    pub(crate) fn put_varlong(out: &mut Vec<u8>, value: i64) {
        let mut raw = ((value << 1) ^ (value >> 63)) as u64;
        loop {
            if raw < 0x80 {
                out.push(raw as u8);
                return;
            }
            out.push((raw as u8 & 0x7f) | 0x80);
            raw >>= 7;
        }
    }

    /// A valid batch of `count` records with timestamps `base_timestamp + i`.
    pub(crate) fn batch(count: usize, base_timestamp: i64) -> ValidatedBatch {
        BatchSpec::new(count, base_timestamp).build()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn fix_crc(bytes: &mut [u8]) {
        let crc = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
        bytes[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn valid_batch_accessors() {
        let b = BatchSpec::new(3, 1_000).idempotent(7, 2, 10).build();
        assert_eq!(b.record_count(), 3);
        assert_eq!(b.last_offset_delta(), 2);
        assert_eq!(b.base_timestamp(), 1_000);
        assert_eq!(b.max_timestamp(), 1_002);
        assert_eq!(b.producer_id(), 7);
        assert_eq!(b.producer_epoch(), 2);
        assert_eq!(b.base_sequence(), 10);
        assert_eq!(b.compression(), Compression::None);
        assert_eq!(b.timestamp_type(), TimestampType::CreateTime);
        assert!(!b.is_transactional() && !b.is_control());
        assert_eq!(b.len(), b.to_bytes().len());
    }

    #[test]
    fn rejects_short_length_magic_crc() {
        let good = BatchSpec::new(2, 0).build_bytes();
        let short = Bytes::from(good[..40].to_vec());
        assert!(matches!(
            validate(short),
            Err(BatchError::CorruptMessage { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            validate(Bytes::from(long)),
            Err(BatchError::CorruptMessage { .. })
        ));
        let mut magic = good.clone();
        magic[MAGIC_AT] = 1;
        assert!(matches!(
            validate(Bytes::from(magic)),
            Err(BatchError::CorruptMessage { .. })
        ));
        let mut crc = good.clone();
        let last = crc.len() - 1;
        crc[last] ^= 0xff;
        let err = validate(Bytes::from(crc)).unwrap_err();
        assert_eq!(err.kafka_error_code(), 2);
    }

    #[test]
    fn rejects_bad_compression_and_counts() {
        let mut codec = BatchSpec::new(2, 0).build_bytes();
        codec[ATTRIBUTES_AT + 1] |= 5;
        fix_crc(&mut codec);
        let err = validate(Bytes::from(codec)).unwrap_err();
        assert_eq!(err, BatchError::UnsupportedCompression { codec: 5 });
        assert_eq!(err.kafka_error_code(), 76);

        let mut count = BatchSpec::new(2, 0).build_bytes();
        count[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&5i32.to_be_bytes());
        fix_crc(&mut count);
        let err = validate(Bytes::from(count)).unwrap_err();
        assert_eq!(err.kafka_error_code(), 87);

        let mut delta = BatchSpec::new(2, 0).build_bytes();
        delta[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
            .copy_from_slice(&(-1i32).to_be_bytes());
        fix_crc(&mut delta);
        assert!(matches!(
            validate(Bytes::from(delta)),
            Err(BatchError::InvalidRecord { .. })
        ));
    }

    #[test]
    fn split_several_and_reject_trailing() {
        let mut payload = BatchSpec::new(2, 0).build_bytes();
        payload.extend(BatchSpec::new(5, 10).build_bytes());
        let batches = split_batches(Bytes::from(payload.clone())).unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[1].record_count(), 5);
        let first_len = batches[0].len();
        payload.extend_from_slice(&[0u8; 20]);
        match split_batches(Bytes::from(payload.clone())) {
            Err(BatchError::CorruptMessage { position, .. }) => {
                assert_eq!(position, first_len + batches[1].len())
            }
            other => panic!("unexpected {other:?}"),
        }
        // batchLength runs past the end
        let truncated = Bytes::from(payload[..first_len + 70].to_vec());
        assert!(matches!(
            split_batches(truncated),
            Err(BatchError::CorruptMessage { position, .. }) if position == first_len
        ));
        assert!(split_batches(Bytes::new()).unwrap().is_empty());
    }

    /// Two batches as a leader stored them (offsets 100.. and 103.., epoch 7).
    fn stored_pair() -> Vec<u8> {
        let mut first = batch(3, 0);
        first.set_base_offset(100);
        first.set_partition_leader_epoch(7);
        let mut second = batch(2, 5);
        second.set_base_offset(103);
        second.set_partition_leader_epoch(7);
        let mut bytes = first.to_bytes().to_vec();
        bytes.extend_from_slice(&second.to_bytes());
        bytes
    }

    #[test]
    fn split_fetched_keeps_offsets_and_drops_a_trailing_partial_batch() {
        let whole = stored_pair();
        let batches = split_fetched(Bytes::from(whole.clone())).unwrap();
        let kept: Vec<_> = batches
            .iter()
            .map(|b| (b.base_offset(), b.last_offset(), b.partition_leader_epoch()))
            .collect();
        assert_eq!(kept, [(100, 102, 7), (103, 104, 7)]);
        let first_len = batches[0].len();
        // Cut inside the second batch's records, inside its header, inside its length.
        for cut in [
            whole.len() - 1,
            first_len + 30,
            first_len + 10,
            first_len + 3,
        ] {
            let batches = split_fetched(Bytes::from(whole[..cut].to_vec())).unwrap();
            assert_eq!(batches.len(), 1, "cut at {cut}");
            assert_eq!(batches[0].base_offset(), 100);
        }
        // Only a partial first batch, or nothing: no batch, no error.
        assert!(split_fetched(Bytes::from(whole[..first_len - 1].to_vec()))
            .unwrap()
            .is_empty());
        assert!(split_fetched(Bytes::new()).unwrap().is_empty());
        // A batch a cleaner rewrote (fewer records than its offsets span) is accepted.
        let mut compacted = whole[..first_len].to_vec();
        compacted[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&2i32.to_be_bytes());
        fix_crc(&mut compacted);
        assert!(validate(Bytes::from(compacted.clone())).is_err());
        assert_eq!(split_fetched(Bytes::from(compacted)).unwrap().len(), 1);
    }

    #[test]
    fn split_fetched_refuses_a_corrupt_batch_with_its_position() {
        let whole = stored_pair();
        let first_len = split_fetched(Bytes::from(whole.clone())).unwrap()[0].len();
        let mut crc = whole.clone();
        let last = crc.len() - 1;
        crc[last] ^= 0xff;
        match split_fetched(Bytes::from(crc)) {
            Err(BatchError::CorruptMessage { position, reason }) => {
                assert_eq!(position, first_len);
                assert!(reason.contains("crc"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let mut length = whole.clone();
        length[first_len + BATCH_LENGTH_AT..first_len + BATCH_LENGTH_AT + 4]
            .copy_from_slice(&10i32.to_be_bytes());
        assert!(matches!(
            split_fetched(Bytes::from(length)),
            Err(BatchError::CorruptMessage { position, .. }) if position == first_len
        ));
        let mut magic = whole;
        magic[MAGIC_AT] = 1;
        assert!(matches!(
            split_fetched(Bytes::from(magic)),
            Err(BatchError::CorruptMessage { position: 0, .. })
        ));
    }

    #[test]
    fn mutators_keep_crc_valid() {
        let mut b = batch(4, 500);
        b.set_base_offset(1234);
        b.set_partition_leader_epoch(9);
        let stored = validate(b.to_bytes()).unwrap();
        assert_eq!(stored.base_offset(), 1234);
        assert_eq!(stored.partition_leader_epoch(), 9);
        b.set_log_append_time(99_999);
        let stored = validate(b.to_bytes()).unwrap();
        assert_eq!(stored.timestamp_type(), TimestampType::LogAppendTime);
        assert_eq!(stored.max_timestamp(), 99_999);
        assert_eq!(stored.last_offset(), 1237);
    }

    #[test]
    fn record_timestamps_decode() {
        let bytes = BatchSpec::new(5, 100).build_bytes();
        assert_eq!(first_record_at_or_after(&bytes, 0), Some((0, 100)));
        assert_eq!(first_record_at_or_after(&bytes, 102), Some((2, 102)));
        assert_eq!(first_record_at_or_after(&bytes, 105), None);
    }
}
