//! Record-level validation of produced batches: every record of a batch is walked (after a
//! bounded decompression for compressed batches) before the batch may reach the log, so
//! the broker never stores bytes a consumer cannot parse. Kafka's `LogValidator` does the
//! same for client batches.
//!
//! Owns: the record layout (protocol guide, "Record", magic 2), the compression codecs'
//! framing as Kafka clients write them (gzip; snappy both xerial-framed and raw; the
//! standard LZ4 frame, with or without block/content checksums; zstd), and the cap on
//! decompressed bytes. Never does: change the batch (it is stored exactly as sent), keep
//! the decompressed bytes, or allocate per record.
//!
//! Record layout (varints are zigzag, as Kafka's `ByteUtils.readVarint`):
//!
//! ```text
//! length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
//! keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
//! headerCount varint | headers: keyLength varint (>= 0) key valueLength varint (-1 = null) value
//! ```
//!
//! Checks, in order: no control batch and no transactional batch (weir has no
//! transactions); the body decompresses within [`RecordLimits::max_decompressed_bytes`];
//! then per record: each length fits in the bytes left, each field ends inside the record,
//! the record's length equals what its fields take, offsetDelta is the record's index
//! (Kafka requires consecutive deltas in v2 client batches); finally the record count equals
//! the header's recordCount, the last offsetDelta equals lastOffsetDelta, and no bytes
//! follow the last record. With [`RecordLimits::require_keys`] (compacted topics) every
//! record with a null key is then reported, all at once ([`RecordError::Keyless`]).
//!
//! Error mapping, as Kafka: bytes that do not parse (lengths, varints, truncation,
//! decompression, the cap) → CORRUPT_MESSAGE (2); well-formed bytes with wrong contents
//! (offset deltas, record count, trailing records, control/transactional, a null key on a
//! compacted topic) →
//! INVALID_RECORD (87). Messages name the record index (0-based).

use kafka_protocol::ResponseError;

use crate::log::codec::{self, DecompressError};
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
            "control batches (attributes bit 5) are not accepted from clients: weir does not \
             support transactions or control batches"
                .into(),
        ));
    }
    if batch.is_transactional() {
        return Err(RecordError::invalid(
            "transactional batches (attributes bit 4) are not supported: weir does not \
             support transactions or control batches"
                .into(),
        ));
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
// Record walk

/// A record field, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Length,
    Attributes,
    TimestampDelta,
    OffsetDelta,
    KeyLength,
    ValueLength,
    HeaderCount,
    HeaderKeyLength,
    HeaderValueLength,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Length => "record length",
            Field::Attributes => "attributes",
            Field::TimestampDelta => "timestampDelta",
            Field::OffsetDelta => "offsetDelta",
            Field::KeyLength => "key length",
            Field::ValueLength => "value length",
            Field::HeaderCount => "header count",
            Field::HeaderKeyLength => "header key length",
            Field::HeaderValueLength => "header value length",
        }
    }
}

/// What went wrong inside one record. Small and `Copy` so the hot loop carries no
/// strings; turned into a [`RecordError`] (with the record index) only on failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The field runs past the end of the record (or of the records, for the length).
    Truncated(Field),
    /// A varint longer than 5 bytes (varlong: 10) or wider than 32 (64) bits.
    VarintTooLong(Field),
    /// A length or count below what the field allows (-1 for nullable fields, else 0).
    Negative(Field, i32),
    /// A length or count larger than the bytes left in the record.
    PastEnd(Field, i32, usize),
    /// The record's length does not match what its fields take.
    LengthMismatch { declared: i32, used: usize },
    /// offsetDelta is not the record's index.
    OffsetDelta(i32),
}

/// Walks `count` records in `buf`; see the module doc.
fn walk(
    buf: &[u8],
    count: i32,
    last_offset_delta: i32,
    require_keys: bool,
) -> Result<(), RecordError> {
    let mut pos = 0usize;
    let mut index: i32 = 0;
    // Allocated only when a keyless record is found where keys are required.
    let mut keyless: Vec<i32> = Vec::new();
    while pos < buf.len() {
        if index == count {
            return Err(RecordError::invalid(format!(
                "recordCount is {count} but {} bytes follow record {} (the last one)",
                buf.len() - pos,
                i64::from(count) - 1
            )));
        }
        match record(buf, &mut pos, index) {
            Ok(key_is_null) => {
                if require_keys && key_is_null {
                    keyless.push(index);
                }
            }
            Err(fault) => return Err(describe(fault, index, count)),
        }
        index += 1;
    }
    if index != count {
        return Err(RecordError::invalid(format!(
            "recordCount is {count} but the batch holds {index} records (record {index} is \
             missing)"
        )));
    }
    if count > 0 && index - 1 != last_offset_delta {
        return Err(RecordError::invalid(format!(
            "lastOffsetDelta is {last_offset_delta} but record {} has offsetDelta {}",
            index - 1,
            index - 1
        )));
    }
    if !keyless.is_empty() {
        return Err(RecordError::Keyless { indexes: keyless });
    }
    Ok(())
}

fn describe(fault: Fault, index: i32, count: i32) -> RecordError {
    let at = format!("record {index} (of {count})");
    match fault {
        Fault::Truncated(f) => RecordError::corrupt(format!(
            "{at}: {} runs past the end of the {}",
            f.name(),
            if f == Field::Length {
                "records"
            } else {
                "record"
            }
        )),
        Fault::VarintTooLong(f) => RecordError::corrupt(format!(
            "{at}: {} is a malformed or too long varint",
            f.name()
        )),
        Fault::Negative(f, v) => {
            RecordError::corrupt(format!("{at}: {} {v} is invalid (negative)", f.name()))
        }
        Fault::PastEnd(f, v, left) => RecordError::corrupt(format!(
            "{at}: {} {v} exceeds the {left} bytes left in the {}",
            f.name(),
            if f == Field::Length {
                "records"
            } else {
                "record"
            }
        )),
        Fault::LengthMismatch { declared, used } => RecordError::corrupt(format!(
            "{at}: record length is {declared} but its fields take {used} bytes"
        )),
        Fault::OffsetDelta(found) => RecordError::invalid(format!(
            "{at}: offsetDelta is {found}, expected {index} (offsets must be consecutive from 0)"
        )),
    }
}

/// One record starting at `*pos` in `buf`; advances `*pos` past it. Returns whether its
/// key is null.
#[inline(always)]
fn record(buf: &[u8], pos: &mut usize, index: i32) -> Result<bool, Fault> {
    let length = varint(buf, pos, Field::Length)?;
    let left = buf.len() - *pos;
    if length < 0 {
        return Err(Fault::Negative(Field::Length, length));
    }
    if length as usize > left {
        return Err(Fault::PastEnd(Field::Length, length, left));
    }
    let body = &buf[*pos..*pos + length as usize];
    *pos += length as usize;

    let mut p = 0usize;
    // attributes (unused in v2 records)
    if body.is_empty() {
        return Err(Fault::Truncated(Field::Attributes));
    }
    p += 1;
    varlong_skip(body, &mut p, Field::TimestampDelta)?;
    let offset_delta = varint(body, &mut p, Field::OffsetDelta)?;
    if offset_delta != index {
        return Err(Fault::OffsetDelta(offset_delta));
    }
    let key_length = bytes_field(body, &mut p, Field::KeyLength, true)?;
    bytes_field(body, &mut p, Field::ValueLength, true)?;
    let headers = varint(body, &mut p, Field::HeaderCount)?;
    if headers < 0 {
        return Err(Fault::Negative(Field::HeaderCount, headers));
    }
    // Every header takes at least two bytes (two one-byte lengths).
    if headers as usize > (body.len() - p) / 2 {
        return Err(Fault::PastEnd(Field::HeaderCount, headers, body.len() - p));
    }
    for _ in 0..headers {
        bytes_field(body, &mut p, Field::HeaderKeyLength, false)?;
        bytes_field(body, &mut p, Field::HeaderValueLength, true)?;
    }
    if p != body.len() {
        return Err(Fault::LengthMismatch {
            declared: length,
            used: p,
        });
    }
    Ok(key_length < 0)
}

/// A length-prefixed byte field: reads the length (-1 = null) and skips the bytes.
#[inline(always)]
fn bytes_field(body: &[u8], p: &mut usize, field: Field, nullable: bool) -> Result<i32, Fault> {
    let len = varint(body, p, field)?;
    if len < 0 {
        if len == -1 && nullable {
            return Ok(len);
        }
        return Err(Fault::Negative(field, len));
    }
    let left = body.len() - *p;
    if len as usize > left {
        return Err(Fault::PastEnd(field, len, left));
    }
    *p += len as usize;
    Ok(len)
}

/// A zigzag varint (Kafka `readVarint`): at most 5 bytes, and the value must fit 32 bits.
/// One- and two-byte varints (values -8192..8192: every length and offset delta of a
/// typical record) are decoded inline.
#[inline(always)]
fn varint(buf: &[u8], pos: &mut usize, field: Field) -> Result<i32, Fault> {
    let p = *pos;
    if let Some(&b0) = buf.get(p) {
        if b0 < 0x80 {
            *pos = p + 1;
            return Ok(unzigzag(u32::from(b0)));
        }
        if let Some(&b1) = buf.get(p + 1) {
            if b1 < 0x80 {
                *pos = p + 2;
                return Ok(unzigzag(u32::from(b0 & 0x7f) | u32::from(b1) << 7));
            }
        }
    }
    varint_slow(buf, pos, field)
}

#[inline(always)]
fn unzigzag(raw: u32) -> i32 {
    ((raw >> 1) as i32) ^ -((raw & 1) as i32)
}

#[inline(never)]
fn varint_slow(buf: &[u8], pos: &mut usize, field: Field) -> Result<i32, Fault> {
    let mut raw: u32 = 0;
    for i in 0..5 {
        let b = *buf.get(*pos + i).ok_or(Fault::Truncated(field))?;
        if i == 4 && b > 0x0f {
            // A continuation bit in the 5th byte, or bits beyond the 32nd.
            return Err(Fault::VarintTooLong(field));
        }
        raw |= u32::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            *pos += i + 1;
            return Ok(unzigzag(raw));
        }
    }
    Err(Fault::VarintTooLong(field))
}

/// Skips a zigzag varlong (Kafka `readVarlong`): at most 10 bytes, fitting 64 bits.
#[inline(always)]
fn varlong_skip(buf: &[u8], pos: &mut usize, field: Field) -> Result<(), Fault> {
    let p = *pos;
    match (buf.get(p), buf.get(p + 1)) {
        (Some(&b0), _) if b0 < 0x80 => {
            *pos = p + 1;
            Ok(())
        }
        (Some(_), Some(&b1)) if b1 < 0x80 => {
            *pos = p + 2;
            Ok(())
        }
        _ => varlong_skip_slow(buf, pos, field),
    }
}

#[inline(never)]
fn varlong_skip_slow(buf: &[u8], pos: &mut usize, field: Field) -> Result<(), Fault> {
    for i in 0..10 {
        let b = *buf.get(*pos + i).ok_or(Fault::Truncated(field))?;
        if b < 0x80 {
            if i == 9 && b > 0x01 {
                return Err(Fault::VarintTooLong(field));
            }
            *pos += i + 1;
            return Ok(());
        }
    }
    Err(Fault::VarintTooLong(field))
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

    #[test]
    fn control_and_transactional_batches_are_refused() {
        for bit in [0x20u8, 0x10] {
            let mut b = encoded(1, 10, Codec::None);
            b[ATTRIBUTES_AT + 1] |= bit;
            fix_crc(&mut b);
            let r = check(b);
            assert_eq!(code(r.clone()), 87);
            assert!(message(r).contains("not support transactions or control batches"));
        }
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
    fn unit_varint_decoding() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i32::MIN as i64,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            let mut pos = 0;
            assert_eq!(varint(&buf, &mut pos, Field::Length), Ok(v as i32));
            assert_eq!(pos, buf.len());
        }
        let mut buf = Vec::new();
        put_varint(&mut buf, 1 << 40);
        let mut pos = 0;
        assert!(varint(&buf, &mut pos, Field::KeyLength).is_err());
        let mut buf = Vec::new();
        put_varint(&mut buf, i64::MIN);
        let mut pos = 0;
        assert_eq!(varlong_skip(&buf, &mut pos, Field::TimestampDelta), Ok(()));
        assert_eq!(pos, 10);
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
