//! Record-level validation of produced batches: every record of a batch is walked (after a
//! bounded decompression for compressed batches) before the batch may reach the log, so
//! the broker never stores bytes a consumer cannot parse. Kafka's `LogValidator` does the
//! same for client batches.
//!
//! Owns: the rules for client batches on top of the record layout (the layout and its
//! bounds checks are `log::records`'s walker, shared with every other reader of records),
//! and the cap on decompressed bytes (the codecs, as Kafka clients frame them, are
//! `log::codec`'s). Never does: change the batch (it is stored exactly as sent), keep the
//! decompressed bytes, or allocate per record.
//!
//! Checks, in order: no control batch (only a leader writes markers: Kafka's
//! `LogValidator` refuses a client's with INVALID_RECORD, "Clients are not allowed to
//! write control records"); a transactional batch (KIP-98) must carry a producer id and a
//! base sequence (Kafka: INVALID_RECORD otherwise); the body decompresses within [`RecordLimits::max_decompressed_bytes`];
//! then the walk: per record, each length fits in the bytes left, each field ends inside
//! the record, the record's length equals what its fields take, and here offsetDelta is
//! the record's index (Kafka requires consecutive deltas in v2 client batches); the record
//! count equals the header's recordCount and no bytes follow the last record; finally the
//! last offsetDelta equals lastOffsetDelta. With [`RecordLimits::require_keys`] (compacted
//! topics) every record with a null key is then reported, all at once
//! ([`RecordError::Keyless`]).
//!
//! Error mapping, as Kafka: bytes that do not parse (lengths, varints, truncation,
//! decompression, the cap) → CORRUPT_MESSAGE (2); well-formed bytes with wrong contents
//! (offset deltas, record count, trailing records, a control batch, a transactional batch
//! without a producer id, a null key on a compacted topic) →
//! INVALID_RECORD (87). Messages name the record index (0-based).

use kafka_protocol::ResponseError;

use crate::log::codec::{self, DecompressError};
use crate::log::records::{Records, WalkError};
use crate::log::{Compression, ValidatedBatch};

/// How many times `max.message.bytes` a batch may decompress to. Kafka has no such cap
/// (it streams), but weir validates a whole decompressed batch at once, so this bounds the
/// memory one produce can make the broker use: a 147 KB gzip batch expanding to 150 MB is
/// refused after 8 × 1 MiB (default `max.message.bytes`) of output. Real batches compress
/// 2–5× (text/JSON up to ~10× only with zstd at high levels), well under 8×.
pub const DECOMPRESSION_FACTOR: usize = 8;

/// Limits for [`validate_records`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimits {
    /// Hard cap on the decompressed size of one batch's records; a batch whose records
    /// decompress to more is refused with CORRUPT_MESSAGE. The decompression buffer never
    /// grows past it (plus one byte); codec state adds a bounded amount on top (lz4 ≤ 4 MiB
    /// block buffer, zstd's window: reserved up to 2^27, touched only as output is made).
    pub max_decompressed_bytes: usize,
    /// Refuse a record whose key is null (a topic with `cleanup.policy` containing
    /// `compact`): INVALID_RECORD (87), "Compacted topic cannot accept message without key"
    /// (Kafka's `LogValidator`, KIP-467).
    pub require_keys: bool,
}

impl RecordLimits {
    /// The limits for a topic with the given `max.message.bytes`:
    /// [`DECOMPRESSION_FACTOR`] × `max_message_bytes` decompressed bytes.
    pub fn for_max_message_bytes(max_message_bytes: usize) -> RecordLimits {
        RecordLimits {
            max_decompressed_bytes: max_message_bytes.saturating_mul(DECOMPRESSION_FACTOR),
            require_keys: false,
        }
    }
}

/// Why a batch's records were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The records do not parse (or do not decompress). Kafka CORRUPT_MESSAGE (2).
    #[error("corrupt records: {reason}")]
    Corrupt {
        /// What was wrong, naming the record index.
        reason: String,
    },
    /// The records parse but break a rule for client batches. Kafka INVALID_RECORD (87).
    #[error("invalid records: {reason}")]
    Invalid {
        /// What was wrong, naming the record index.
        reason: String,
    },
    /// Records with a null key in a batch for a compacted topic. Kafka INVALID_RECORD (87)
    /// with one `record_errors` entry per record (KIP-467), so a client fails those records
    /// with INVALID_RECORD and the rest of the batch with a retriable local error.
    #[error(
        "invalid records: {} of the batch's records have no key (first: record {}): {KEYLESS_RECORD}",
        indexes.len(),
        indexes.first().copied().unwrap_or(0)
    )]
    Keyless {
        /// The 0-based indexes of the keyless records in the batch, ascending; never empty.
        indexes: Vec<i32>,
    },
}

/// Kafka's message for a keyless record sent to a compacted topic (`LogValidator`).
pub const KEYLESS_RECORD: &str = "Compacted topic cannot accept message without key";

impl RecordError {
    /// The Kafka error: CORRUPT_MESSAGE (2) or INVALID_RECORD (87).
    pub fn kafka_error(&self) -> ResponseError {
        match self {
            RecordError::Corrupt { .. } => ResponseError::CorruptMessage,
            RecordError::Invalid { .. } | RecordError::Keyless { .. } => {
                ResponseError::InvalidRecord
            }
        }
    }

    /// The records at fault, for Produce v8+ `record_errors` (KIP-467): their indexes in
    /// the batch. Empty when the error is about the batch as a whole.
    pub fn record_indexes(&self) -> &[i32] {
        match self {
            RecordError::Keyless { indexes } => indexes,
            RecordError::Corrupt { .. } | RecordError::Invalid { .. } => &[],
        }
    }

    fn corrupt(reason: String) -> RecordError {
        RecordError::Corrupt { reason }
    }

    fn invalid(reason: String) -> RecordError {
        RecordError::Invalid { reason }
    }
}

/// Checks every record of a client batch (see the module doc for the rules). Uncompressed
/// batches are walked in place; compressed ones are decompressed into one per-batch
/// buffer of at most `limits.max_decompressed_bytes` first. Nothing is allocated per
/// record, and nothing at all for a valid uncompressed batch.
pub fn validate_records(batch: &ValidatedBatch, limits: RecordLimits) -> Result<(), RecordError> {
    if batch.is_control() {
        return Err(RecordError::invalid(
            "clients are not allowed to write control records (attributes bit 5): \
             transaction markers are written by the partition leader"
                .into(),
        ));
    }
    if batch.is_transactional() && (batch.producer_id() < 0 || batch.base_sequence() < 0) {
        return Err(RecordError::invalid(format!(
            "a transactional batch needs a producer id and a base sequence (got producer id \
             {}, base sequence {})",
            batch.producer_id(),
            batch.base_sequence()
        )));
    }
    let count = batch.record_count();
    let last_offset_delta = batch.last_offset_delta();
    let codec = batch.compression();
    if codec == Compression::None {
        return walk(
            batch.records(),
            count,
            last_offset_delta,
            limits.require_keys,
        );
    }
    let records = decompress(codec, batch.records(), limits.max_decompressed_bytes)?;
    walk(&records, count, last_offset_delta, limits.require_keys)
}

// ---------------------------------------------------------------------------------------
// Record walk (the layout and its bounds checks are `log::records`'s)

/// Walks `count` records in `buf` with the log's record walker and applies the client
/// batch rules on top: offsetDelta is the record's index, the last one is
/// `last_offset_delta`, and (with `require_keys`) no key is null. See the module doc.
fn walk(
    buf: &[u8],
    count: i32,
    last_offset_delta: i32,
    require_keys: bool,
) -> Result<(), RecordError> {
    // Allocated only when a keyless record is found where keys are required.
    let mut keyless: Vec<i32> = Vec::new();
    let walked = Records::new(buf, count).check_each(|record| {
        let index = record.index;
        if record.offset_delta != index {
            return Err(Stop::OffsetDelta {
                index,
                found: record.offset_delta,
            });
        }
        if require_keys && record.key_is_null {
            keyless.push(index);
        }
        Ok(())
    });
    match walked {
        Ok(()) => {}
        Err(Stop::Walk(e)) => return Err(e.into()),
        Err(Stop::OffsetDelta { index, found }) => {
            return Err(RecordError::invalid(format!(
                "record {index} (of {count}): offsetDelta is {found}, expected {index} \
                 (offsets must be consecutive from 0)"
            )))
        }
    }
    if count > 0 && count - 1 != last_offset_delta {
        return Err(RecordError::invalid(format!(
            "lastOffsetDelta is {last_offset_delta} but record {} has offsetDelta {}",
            count - 1,
            count - 1
        )));
    }
    if !keyless.is_empty() {
        return Err(RecordError::Keyless { indexes: keyless });
    }
    Ok(())
}

/// Why the per-record walk stopped. Small and `Copy`: the closure `walk` hands the walker
/// returns it for every record, and a `RecordError` (a `String` inside) there made produce
/// validation ~40% slower per record (benches/RESULTS.md, "Issue 11 A/B", run 7); the
/// message is built once, after the walk.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// The bytes do not parse as records.
    Walk(WalkError),
    /// Record `index` has offsetDelta `found`.
    OffsetDelta { index: i32, found: i32 },
}

impl From<WalkError> for Stop {
    fn from(e: WalkError) -> Stop {
        Stop::Walk(e)
    }
}

/// Kafka's codes for a walk error: bytes that do not parse → CORRUPT_MESSAGE; a record
/// count that disagrees with well-formed records → INVALID_RECORD.
impl From<WalkError> for RecordError {
    #[cold]
    fn from(e: WalkError) -> RecordError {
        if e.fault.is_count() {
            RecordError::invalid(e.to_string())
        } else {
            RecordError::corrupt(e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------
// Bounded decompression (the codecs live in `log::codec`, shared with the log cleaner)

fn decompress(codec: Compression, input: &[u8], cap: usize) -> Result<Vec<u8>, RecordError> {
    codec::decompress(codec, input, cap).map_err(|e| match e {
        DecompressError::TooLarge => RecordError::corrupt(format!(
            "{} records decompress to more than {cap} bytes ({DECOMPRESSION_FACTOR} × \
             max.message.bytes); refused as a decompression bomb",
            codec::name(codec)
        )),
        DecompressError::Bad(why) => RecordError::corrupt(format!(
            "{} records do not decompress: {why}",
            codec::name(codec)
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::validate;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression as Codec, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use std::io::Write;

    const ATTRIBUTES_AT: usize = 21;
    const LAST_OFFSET_DELTA_AT: usize = 23;
    const RECORD_COUNT_AT: usize = 57;
    const HEADER: usize = 61;

    fn limits() -> RecordLimits {
        RecordLimits::for_max_message_bytes(1_048_588)
    }

    fn record(i: i64, value_bytes: usize) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // constant offset - sequence keeps all records in one batch
            sequence: (i - 1) as i32,
            timestamp: 1_700_000_000_000 + i,
            key: if i % 2 == 0 {
                Some(Bytes::from(format!("key-{i}")))
            } else {
                None
            },
            value: Some(Bytes::from(vec![b'v'; value_bytes])),
            headers: if i % 3 == 0 {
                [
                    ("h1".into(), Some(Bytes::from_static(b"one"))),
                    ("h2".into(), None),
                ]
                .into_iter()
                .collect()
            } else {
                Default::default()
            },
        }
    }

    /// A batch of `n` records encoded by kafka-protocol with `codec`.
    fn encoded(n: usize, value_bytes: usize, codec: Codec) -> Vec<u8> {
        let records: Vec<Record> = (0..n as i64).map(|i| record(i, value_bytes)).collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: codec,
            },
        )
        .unwrap();
        buf.to_vec()
    }

    fn fix_crc(bytes: &mut [u8]) {
        let crc = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    /// `template`'s header with `body` as the records, codec bits set to `codec`, length
    /// and CRC fixed.
    fn with_body(template: &[u8], codec: u8, body: &[u8]) -> Vec<u8> {
        let mut out = template[..HEADER].to_vec();
        out.extend_from_slice(body);
        let len = (out.len() - 12) as i32;
        out[8..12].copy_from_slice(&len.to_be_bytes());
        out[ATTRIBUTES_AT + 1] = (out[ATTRIBUTES_AT + 1] & !0x07) | codec;
        fix_crc(&mut out);
        out
    }

    fn set_i32(bytes: &mut [u8], at: usize, v: i32) {
        bytes[at..at + 4].copy_from_slice(&v.to_be_bytes());
        fix_crc(bytes);
    }

    fn check(bytes: Vec<u8>) -> Result<(), RecordError> {
        let batch = validate(Bytes::from(bytes)).expect("header-valid batch");
        validate_records(&batch, limits())
    }

    fn check_with(bytes: Vec<u8>, limits: RecordLimits) -> Result<(), RecordError> {
        let batch = validate(Bytes::from(bytes)).expect("header-valid batch");
        validate_records(&batch, limits)
    }

    fn code(r: Result<(), RecordError>) -> i16 {
        match r {
            Ok(()) => 0,
            Err(e) => e.kafka_error().code(),
        }
    }

    fn message(r: Result<(), RecordError>) -> String {
        r.expect_err("an error").to_string()
    }

    use crate::log::batch::testing::put_varlong as put_varint;

    /// One record body with the given fields (lengths written as given, contents as given).
    fn raw_record(
        offset_delta: i64,
        key_len: i64,
        key: &[u8],
        value: &[u8],
        tail: &[u8],
    ) -> Vec<u8> {
        let mut body = vec![0u8];
        put_varint(&mut body, 0);
        put_varint(&mut body, offset_delta);
        put_varint(&mut body, key_len);
        body.extend_from_slice(key);
        put_varint(&mut body, value.len() as i64);
        body.extend_from_slice(value);
        body.extend_from_slice(tail);
        body
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, body.len() as i64);
        out.extend_from_slice(body);
        out
    }

    fn one_record_batch_with(records: &[u8]) -> Vec<u8> {
        with_body(&encoded(1, 10, Codec::None), 0, records)
    }

    // ---- valid batches --------------------------------------------------------------

    #[test]
    fn valid_batches_of_every_codec() {
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            for n in [1, 7, 500] {
                let bytes = encoded(n, 100, codec);
                let batch = validate(Bytes::from(bytes)).unwrap();
                assert_eq!(batch.record_count(), n as i32, "{codec:?}: one batch");
                validate_records(&batch, limits())
                    .unwrap_or_else(|e| panic!("{codec:?} x{n}: {e}"));
            }
        }
    }

    fn uncompressed_records(n: usize) -> (Vec<u8>, Vec<u8>) {
        let plain = encoded(n, 100, Codec::None);
        let records = plain[HEADER..].to_vec();
        (plain, records)
    }

    #[test]
    fn snappy_raw_and_xerial_multi_block_are_accepted() {
        let (plain, records) = uncompressed_records(300); // ~35 KB: two xerial blocks
        let raw = snap::raw::Encoder::new().compress_vec(&records).unwrap();
        assert_eq!(check(with_body(&plain, 2, &raw)), Ok(()));
        let mut xerial = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        for chunk in records.chunks(32 * 1024) {
            let c = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            xerial.extend_from_slice(&(c.len() as u32).to_be_bytes());
            xerial.extend_from_slice(&c);
        }
        assert_eq!(check(with_body(&plain, 2, &xerial)), Ok(()));
        // A truncated xerial stream is corrupt.
        let cut = xerial[..xerial.len() - 3].to_vec();
        assert_eq!(code(check(with_body(&plain, 2, &cut))), 2);
    }

    #[test]
    fn lz4_frames_with_and_without_checksums_are_accepted() {
        use lz4::liblz4::BlockChecksum;
        use lz4::{BlockMode, BlockSize, ContentChecksum};
        let (plain, records) = uncompressed_records(300);
        for (block_sum, content_sum, mode) in [
            (false, false, BlockMode::Independent),
            (true, false, BlockMode::Independent),
            (false, true, BlockMode::Linked),
            (true, true, BlockMode::Linked),
        ] {
            let mut e = lz4::EncoderBuilder::new()
                .block_size(BlockSize::Max64KB)
                .block_mode(mode)
                .block_checksum(if block_sum {
                    BlockChecksum::BlockChecksumEnabled
                } else {
                    BlockChecksum::NoBlockChecksum
                })
                .checksum(if content_sum {
                    ContentChecksum::ChecksumEnabled
                } else {
                    ContentChecksum::NoChecksum
                })
                .build(Vec::new())
                .unwrap();
            e.write_all(&records).unwrap();
            let (frame, r) = e.finish();
            r.unwrap();
            assert_eq!(
                check(with_body(&plain, 3, &frame)),
                Ok(()),
                "block checksum {block_sum}, content checksum {content_sum}"
            );
            // Truncated (no end mark) → corrupt.
            let cut = frame[..frame.len() - 4].to_vec();
            assert_eq!(code(check(with_body(&plain, 3, &cut))), 2);
            if content_sum {
                // A flipped content checksum byte → corrupt.
                let mut bad = frame.clone();
                let last = bad.len() - 1;
                bad[last] ^= 0x55;
                assert_eq!(code(check(with_body(&plain, 3, &bad))), 2);
            }
        }
    }

    #[test]
    fn valid_null_key_value_and_headers() {
        // key null, value null, one header with null value
        let mut body = vec![0u8];
        put_varint(&mut body, 5);
        put_varint(&mut body, 0);
        put_varint(&mut body, -1); // key null
        put_varint(&mut body, -1); // value null
        put_varint(&mut body, 1); // one header
        put_varint(&mut body, 1);
        body.push(b'k');
        put_varint(&mut body, -1);
        assert_eq!(check(one_record_batch_with(&framed(&body))), Ok(()));
    }

    #[test]
    fn compacted_topics_require_keys_in_every_codec() {
        let keyed = RecordLimits {
            require_keys: true,
            ..limits()
        };
        for codec in [Codec::None, Codec::Gzip, Codec::Zstd] {
            // Record 0 has a key, record 1 has none.
            assert_eq!(check_with(encoded(1, 10, codec), keyed), Ok(()));
            // Every keyless record is named (records 1, 3, 5, 7, 9), not only the first.
            let r = check_with(encoded(10, 10, codec), keyed);
            assert_eq!(code(r.clone()), 87, "{codec:?}");
            assert_eq!(
                r.as_ref().unwrap_err().record_indexes(),
                &[1, 3, 5, 7, 9],
                "{codec:?}"
            );
            assert!(message(r).contains(KEYLESS_RECORD), "{codec:?}");
            assert_eq!(check_with(encoded(10, 10, codec), limits()), Ok(()));
        }
    }

    // ---- the tester's cases ---------------------------------------------------------

    #[test]
    fn record_count_a_million_but_one_record() {
        let mut b = encoded(1, 10, Codec::None);
        b[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
            .copy_from_slice(&999_999i32.to_be_bytes());
        set_i32(&mut b, RECORD_COUNT_AT, 1_000_000);
        let r = check(b);
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("record 1 is missing"));
    }

    #[test]
    fn fewer_and_more_records_than_declared() {
        // Header says 2, three records present.
        let three = encoded(3, 10, Codec::None);
        let mut b = three.clone();
        b[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&1i32.to_be_bytes());
        set_i32(&mut b, RECORD_COUNT_AT, 2);
        let r = check(b);
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("follow record 1"));
        // Header says 4, three present.
        let mut b = three;
        b[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&3i32.to_be_bytes());
        set_i32(&mut b, RECORD_COUNT_AT, 4);
        assert_eq!(code(check(b)), 87);
    }

    #[test]
    fn gzip_flag_on_a_body_that_is_not_gzip() {
        let plain = encoded(2, 10, Codec::None);
        let mut b = plain.clone();
        b[ATTRIBUTES_AT + 1] |= 1;
        fix_crc(&mut b);
        let r = check(b);
        assert_eq!(code(r.clone()), 2);
        assert!(message(r).contains("gzip"));
        // Same for the other codecs.
        for codec in [2u8, 3, 4] {
            let b = with_body(&plain, codec, &plain[HEADER..]);
            assert_eq!(code(check(b)), 2, "codec {codec}");
        }
        // A truncated gzip stream.
        let gz = encoded(5, 100, Codec::Gzip);
        let cut = with_body(&gz, 1, &gz[HEADER..gz.len() - 10]);
        assert_eq!(code(check(cut)), 2);
    }

    /// KIP-98: a client's control batch is INVALID_RECORD (Kafka's `LogValidator`); a
    /// transactional batch is accepted when it has a producer id and a sequence, refused
    /// (87) without.
    #[test]
    fn control_batches_are_refused_and_transactional_ones_accepted() {
        let mut control = encoded(1, 10, Codec::None);
        control[ATTRIBUTES_AT + 1] |= 0x20;
        fix_crc(&mut control);
        let r = check(control);
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("not allowed to write control records"));

        let mut anonymous = encoded(1, 10, Codec::None);
        anonymous[ATTRIBUTES_AT + 1] |= 0x10;
        fix_crc(&mut anonymous);
        let r = check(anonymous);
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("needs a producer id"));

        let mut txn = encoded(3, 10, Codec::None);
        txn[ATTRIBUTES_AT + 1] |= 0x10;
        txn[43..51].copy_from_slice(&7i64.to_be_bytes());
        txn[51..53].copy_from_slice(&0i16.to_be_bytes());
        txn[53..57].copy_from_slice(&0i32.to_be_bytes());
        fix_crc(&mut txn);
        assert_eq!(code(check(txn)), 0);
    }

    #[test]
    fn bad_key_lengths() {
        for key_len in [1_000_000i64, -7, 1 << 40, -2] {
            let body = raw_record(0, key_len, b"k", b"value", &[0]);
            let r = check(one_record_batch_with(&framed(&body)));
            assert_eq!(code(r.clone()), 2, "key length {key_len}");
            let m = message(r);
            assert!(m.contains("record 0") && m.contains("key length"), "{m}");
        }
    }

    #[test]
    fn bad_record_lengths() {
        let good = raw_record(0, -1, b"", b"value", &[0]);
        for length in [0i64, 1, -1, good.len() as i64 + 1, good.len() as i64 - 1] {
            let mut records = Vec::new();
            put_varint(&mut records, length);
            records.extend_from_slice(&good);
            let r = check(one_record_batch_with(&records));
            assert_eq!(code(r.clone()), 2, "record length {length}");
            assert!(message(r).contains("record 0"));
        }
        // Extra bytes inside the record after the headers.
        let body = raw_record(0, -1, b"", b"value", &[0, 0]);
        let r = check(one_record_batch_with(&framed(&body)));
        assert!(message(r).contains("fields take"));
    }

    #[test]
    fn bad_header_counts_and_header_lengths() {
        for tail in [
            {
                let mut t = Vec::new();
                put_varint(&mut t, 1_000_000_000);
                t
            },
            {
                let mut t = Vec::new();
                put_varint(&mut t, -3);
                t
            },
            // header key length -1 (header keys are not nullable)
            vec![2, 1, 0],
            // header value length -2
            vec![2, 2, b'k', 3],
            // header key longer than the record
            vec![2, 40, b'k', 0],
        ] {
            let body = raw_record(0, -1, b"", b"value", &tail);
            let r = check(one_record_batch_with(&framed(&body)));
            assert_eq!(code(r.clone()), 2, "tail {tail:?}");
            assert!(message(r).contains("record 0"));
        }
    }

    #[test]
    fn offset_deltas_must_be_consecutive() {
        // Two records with deltas 0, 2 (lastOffsetDelta 1): INVALID_RECORD naming record 1.
        let mut records = framed(&raw_record(0, -1, b"", b"a", &[0]));
        records.extend(framed(&raw_record(2, -1, b"", b"b", &[0])));
        let b = with_body(&encoded(2, 10, Codec::None), 0, &records);
        let r = check(b);
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("record 1"));
        // Reversed: 1, 0.
        let mut records = framed(&raw_record(1, -1, b"", b"a", &[0]));
        records.extend(framed(&raw_record(0, -1, b"", b"b", &[0])));
        let b = with_body(&encoded(2, 10, Codec::None), 0, &records);
        assert_eq!(code(check(b)), 87);
    }

    #[test]
    fn malformed_varints() {
        // A key length varint of 6 bytes; a truncated varint at the end of the record.
        let mut body = vec![0u8, 0, 0];
        body.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        let r = check(one_record_batch_with(&framed(&body)));
        assert_eq!(code(r.clone()), 2);
        assert!(message(r).contains("varint"));
        let body = vec![0u8, 0, 0, 0x80];
        assert_eq!(code(check(one_record_batch_with(&framed(&body)))), 2);
        // A record length varint running past the end of the records.
        assert_eq!(code(check(one_record_batch_with(&[0x80]))), 2);
        // A timestampDelta varlong of 11 bytes.
        let mut body = vec![0u8];
        body.extend_from_slice(&[0xff; 10]);
        body.push(0);
        assert_eq!(code(check(one_record_batch_with(&framed(&body)))), 2);
    }

    #[test]
    fn decompression_bomb_is_refused() {
        // ~150 MB of one record's value, gzip'd to ~150 KB.
        let value_len = 150 << 20;
        let mut records = Vec::new();
        let mut body = vec![0u8, 0, 0, 1]; // attrs, ts 0, offsetDelta 0, key null
        put_varint(&mut body, value_len as i64);
        let mut len_prefix = Vec::new();
        put_varint(&mut len_prefix, (body.len() + value_len + 1) as i64);
        records.extend_from_slice(&len_prefix);
        records.extend_from_slice(&body);
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&records).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..150 {
            e.write_all(&zeros).unwrap();
        }
        e.write_all(&[0]).unwrap(); // header count
        let gz = e.finish().unwrap();
        assert!(gz.len() < 1 << 20, "{} bytes compressed", gz.len());
        let b = with_body(&encoded(1, 10, Codec::None), 1, &gz);
        let r = check(b);
        assert_eq!(code(r.clone()), 2);
        assert!(message(r).contains("decompression bomb"));
    }

    #[test]
    fn every_codec_honours_the_cap() {
        let (plain, records) = uncompressed_records(300);
        let small = RecordLimits {
            max_decompressed_bytes: records.len() - 1,
            require_keys: false,
        };
        let exact = RecordLimits {
            max_decompressed_bytes: records.len(),
            require_keys: false,
        };
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let b = encoded(300, 100, codec);
            assert!(b.len() < plain.len(), "{codec:?} compresses");
            let r = check_with(b.clone(), small);
            assert_eq!(code(r.clone()), 2, "{codec:?}");
            assert!(message(r).contains("decompression bomb"));
            assert_eq!(check_with(b, exact), Ok(()), "{codec:?}");
        }
        let raw = snap::raw::Encoder::new().compress_vec(&records).unwrap();
        let r = check_with(with_body(&plain, 2, &raw), small);
        assert!(message(r).contains("decompression bomb"));
    }

    #[test]
    fn zstd_frames_with_large_windows_and_small_caps() {
        // A streamed frame (no pledged size) declaring a 2^27 window, as a Java producer
        // at level 22 writes; accepted even under a small cap, and refused past a window
        // of 2^27.
        let (plain, records) = uncompressed_records(50);
        for (window_log, want) in [(27u32, 0i16), (28, 2)] {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            e.window_log(window_log).unwrap();
            e.long_distance_matching(true).unwrap();
            e.write_all(&records).unwrap();
            let frame = e.finish().unwrap();
            let b = with_body(&plain, 4, &frame);
            let r = check_with(
                b,
                RecordLimits {
                    max_decompressed_bytes: 64 * 1024,
                    require_keys: false,
                },
            );
            assert_eq!(code(r), want, "window log {window_log}");
        }
    }

    #[test]
    fn errors_inside_compressed_batches_name_the_record() {
        // Records 0..3 fine, record 3 with offsetDelta 7, inside lz4.
        let mut records = Vec::new();
        for i in 0..4 {
            let delta = if i == 3 { 7 } else { i };
            records.extend(framed(&raw_record(delta, -1, b"", b"x", &[0])));
        }
        let plain = encoded(4, 1, Codec::None);
        let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        e.write_all(&records).unwrap();
        let (frame, r) = e.finish();
        r.unwrap();
        let r = check(with_body(&plain, 3, &frame));
        assert_eq!(code(r.clone()), 87);
        assert!(message(r).contains("record 3 (of 4)"));
    }
}
