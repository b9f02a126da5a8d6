//! Re-encoding a produced record batch with new records at the same offsets: what an
//! inline transform (`transform::apply`) needs to rewrite a batch before it is appended.
//!
//! Owns: decoding a batch's records ([`decode_records`]: bounded decompression through
//! `codec`, then the record walker `records`), encoding records into a batch that takes the producer
//! fields of the batch it replaces ([`BatchBuilder`]), and compressing a records section
//! with any of Kafka's codecs as clients write them. Never does: call plugins, touch files,
//! or decide which records to keep.
//!
//! Offsets and sequences: a rewritten batch keeps the input batch's lastOffsetDelta,
//! producerId, producerEpoch, baseSequence and partitionLeaderEpoch, and every output
//! record keeps the offset delta of the input record it came from. The batch therefore
//! occupies exactly the offsets (and sequence numbers) the client's batch would have, so
//! an idempotent producer's next sequence and its retries line up; a dropped record leaves
//! a gap, as compaction does (`compact.rs`), and recordCount may be less than
//! lastOffsetDelta + 1. A batch whose records were all dropped is still written (empty,
//! uncompressed, as Kafka's cleaner keeps an empty batch for the producer state) so the
//! offsets and the sequence numbers stay consumed.

use std::io::Write;

use bytes::Bytes;

use super::batch::{
    validate_rewritten, BatchError, Compression, TimestampType, ValidatedBatch, BATCH_HEADER_BYTES,
    LOG_OVERHEAD_BYTES, MAGIC_V2,
};
use super::codec::{self, DecompressError};
use super::records::decode_section;

/// Why a batch could not be decoded or re-encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// The records do not decompress or parse (the message says where). The produce path
    /// validated them first (`protocol::records`), so this means a limit was hit.
    #[error("cannot decode records: {reason}")]
    Decode {
        /// Index of the record in the batch (the record count when the section has
        /// trailing bytes).
        index: i32,
        /// What was wrong.
        reason: String,
    },
    /// The records section decompresses to more than the cap given.
    #[error("records decompress to more than {cap_bytes} bytes")]
    TooLarge {
        /// The cap.
        cap_bytes: usize,
    },
    /// An output record's offset delta is outside `0..=lastOffsetDelta` or not above the
    /// previous record's (a caller bug; refused rather than written).
    #[error("offset delta {offset_delta} after {previous} (lastOffsetDelta {last_offset_delta})")]
    OffsetDelta {
        /// Delta given.
        offset_delta: i32,
        /// Delta of the previous record (-1 for none).
        previous: i32,
        /// The batch's lastOffsetDelta.
        last_offset_delta: i32,
    },
    /// A field over `i32::MAX` bytes, or the batch over 2 GiB.
    #[error("{0}")]
    TooBig(String),
    /// The compressor failed (an I/O error into memory: not expected).
    #[error("{codec} compression failed: {reason}")]
    Compress {
        /// Codec name.
        codec: &'static str,
        /// The codec's message.
        reason: String,
    },
    /// The encoded batch failed its own validation (a bug here).
    #[error("rewritten batch is invalid: {0}")]
    Invalid(#[from] BatchError),
}

pub use super::records::DecodedRecord;

/// Decodes every record of `batch`, decompressing into at most `max_decompressed_bytes`,
/// with the record walker (`log::records`).
///
/// Errors: [`RewriteError::TooLarge`] past the cap; [`RewriteError::Decode`] for bytes
/// that do not decompress or parse, or a record count that does not match (naming the
/// record, as [`super::records::WalkError`] does).
pub fn decode_records(
    batch: &ValidatedBatch,
    max_decompressed_bytes: usize,
) -> Result<Vec<DecodedRecord>, RewriteError> {
    let codec = batch.compression();
    let section = if codec == Compression::None {
        batch.records_bytes()
    } else {
        match codec::decompress(codec, batch.records(), max_decompressed_bytes) {
            Ok(v) => Bytes::from(v),
            Err(DecompressError::TooLarge) => {
                return Err(RewriteError::TooLarge {
                    cap_bytes: max_decompressed_bytes,
                })
            }
            Err(DecompressError::Bad(reason)) => {
                return Err(RewriteError::Decode {
                    index: 0,
                    reason: format!("{} records do not decompress: {reason}", codec::name(codec)),
                })
            }
        }
    };
    decode_section(&section, batch.record_count(), batch.base_timestamp()).map_err(|e| {
        RewriteError::Decode {
            index: e.index,
            reason: e.to_string(),
        }
    })
}

/// Builds the batch that replaces `template`: records pushed in increasing offset-delta
/// order, then [`BatchBuilder::finish`]. See the module docs for what is kept.
#[derive(Debug)]
pub struct BatchBuilder {
    template: [u8; BATCH_HEADER_BYTES],
    last_offset_delta: i32,
    timestamp_type: TimestampType,
    codec: Compression,
    /// Uncompressed records section.
    records: Vec<u8>,
    /// One record's body, reused.
    body: Vec<u8>,
    count: i32,
    previous_delta: i32,
    base_timestamp_ms: Option<i64>,
    max_timestamp_ms: i64,
}

impl BatchBuilder {
    /// A builder for a batch replacing `template`, compressed with `codec`.
    pub fn new(template: &ValidatedBatch, codec: Compression) -> BatchBuilder {
        BatchBuilder::with_header(
            *template.header(),
            template.last_offset_delta(),
            template.timestamp_type(),
            codec,
        )
    }

    /// A builder from a header's bytes (see [`BatchBuilder::new`]); `last_offset_delta`
    /// and `timestamp_type` must be the ones in `header`. For `plain`, which has no
    /// batch to replace.
    pub(crate) fn with_header(
        header: [u8; BATCH_HEADER_BYTES],
        last_offset_delta: i32,
        timestamp_type: TimestampType,
        codec: Compression,
    ) -> BatchBuilder {
        BatchBuilder {
            template: header,
            last_offset_delta,
            timestamp_type,
            codec,
            records: Vec::new(),
            body: Vec::new(),
            count: 0,
            previous_delta: -1,
            base_timestamp_ms: None,
            max_timestamp_ms: i64::MIN,
        }
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// True before the first [`BatchBuilder::push`].
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one record at `offset_delta` (the input record's delta; must be above the
    /// previous record's and at most the template's lastOffsetDelta).
    ///
    /// Errors: [`RewriteError::OffsetDelta`]; [`RewriteError::TooBig`] for a field over
    /// `i32::MAX` bytes.
    pub fn push<'a>(
        &mut self,
        offset_delta: i32,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), RewriteError> {
        if offset_delta <= self.previous_delta || offset_delta > self.last_offset_delta {
            return Err(RewriteError::OffsetDelta {
                offset_delta,
                previous: self.previous_delta,
                last_offset_delta: self.last_offset_delta,
            });
        }
        let base = *self.base_timestamp_ms.get_or_insert(timestamp_ms);
        let body = &mut self.body;
        body.clear();
        body.push(0); // record attributes: unused
        put_varlong(body, timestamp_ms.wrapping_sub(base));
        put_varlong(body, i64::from(offset_delta));
        put_nullable(body, key)?;
        put_nullable(body, value)?;
        put_len(body, headers.len())?;
        for (k, v) in headers {
            put_nullable(body, Some(k))?;
            put_nullable(body, v)?;
        }
        put_len(&mut self.records, body.len())?;
        self.records.extend_from_slice(body);
        self.count += 1;
        self.previous_delta = offset_delta;
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        Ok(())
    }

    /// Compresses the records and writes the header: baseOffset 0 (the log assigns it),
    /// partitionLeaderEpoch, attributes (timestamp type; codec bits = the codec, or none
    /// for an empty batch), lastOffsetDelta, producerId/Epoch and baseSequence from the
    /// template; baseTimestamp = the first record's timestamp and maxTimestamp the
    /// largest (an empty batch keeps the template's); recordCount; CRC-32C.
    ///
    /// Errors: [`RewriteError::Compress`], [`RewriteError::TooBig`], or
    /// [`RewriteError::Invalid`] if the result fails `validate_rewritten` (a bug).
    pub fn finish(self) -> Result<ValidatedBatch, RewriteError> {
        let codec = if self.count == 0 {
            Compression::None
        } else {
            self.codec
        };
        let section = compress(codec, &self.records)?;
        let t = &self.template;
        let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + section.len());
        out.extend_from_slice(&0i64.to_be_bytes());
        let batch_length =
            i32::try_from(BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + section.len())
                .map_err(|_| RewriteError::TooBig("rewritten batch over 2 GiB".into()))?;
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&t[12..16]); // partitionLeaderEpoch
        out.push(MAGIC_V2 as u8);
        out.extend_from_slice(&[0; 4]); // crc, below
        let template_attributes = i16::from_be_bytes([t[21], t[22]]);
        let attributes = (template_attributes & !CODEC_BITS) | codec_bits(codec);
        out.extend_from_slice(&attributes.to_be_bytes());
        out.extend_from_slice(&self.last_offset_delta.to_be_bytes());
        match self.base_timestamp_ms {
            Some(base) => {
                out.extend_from_slice(&base.to_be_bytes());
                // LogAppendTime batches: maxTimestamp is the broker's to set at append.
                let max = match self.timestamp_type {
                    TimestampType::CreateTime => self.max_timestamp_ms,
                    TimestampType::LogAppendTime => {
                        i64::from_be_bytes(t[35..43].try_into().unwrap_or_default())
                    }
                };
                out.extend_from_slice(&max.to_be_bytes());
            }
            None => out.extend_from_slice(&t[27..43]), // baseTimestamp, maxTimestamp
        }
        out.extend_from_slice(&t[43..57]); // producerId, producerEpoch, baseSequence
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&section);
        let crc = crc32c::crc32c(&out[21..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        Ok(validate_rewritten(Bytes::from(out))?)
    }
}

const CODEC_BITS: i16 = 0x07;

fn codec_bits(codec: Compression) -> i16 {
    match codec {
        Compression::None => 0,
        Compression::Gzip => 1,
        Compression::Snappy => 2,
        Compression::Lz4 => 3,
        Compression::Zstd => 4,
    }
}

/// Appends `value` as a zigzag varint (Kafka's varint and varlong share the encoding).
fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    while raw >= 0x80 {
        out.push((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), RewriteError> {
    let len = i32::try_from(len)
        .map_err(|_| RewriteError::TooBig(format!("a field of {len} bytes exceeds i32::MAX")))?;
    put_varlong(out, i64::from(len));
    Ok(())
}

fn put_nullable(out: &mut Vec<u8>, field: Option<&[u8]>) -> Result<(), RewriteError> {
    match field {
        None => put_varlong(out, -1),
        Some(b) => {
            put_len(out, b.len())?;
            out.extend_from_slice(b);
        }
    }
    Ok(())
}

/// xerial snappy framing as the Java client writes it (magic, version 1, compatible 1,
/// then `u32` length + raw block per 32 KiB of input). Readers also accept one raw block.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;

/// Compresses a records section with `codec` as Kafka clients write it: gzip (one member,
/// default level), snappy (xerial-framed), lz4 (standard frame, independent 64 KiB
/// blocks, no checksums — what Kafka's `KafkaLZ4BlockInputStream` reads), zstd (one
/// frame, level 3). `Compression::None` copies.
///
/// Errors: [`RewriteError::Compress`] (not expected: everything is in memory).
pub fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let fail = |reason: String| RewriteError::Compress {
        codec: codec::name(codec),
        reason,
    };
    match codec {
        Compression::None => Ok(input.to_vec()),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(
                Vec::with_capacity(input.len() / 2 + 64),
                flate2::Compression::default(),
            );
            e.write_all(input).map_err(|e| fail(e.to_string()))?;
            e.finish().map_err(|e| fail(e.to_string()))
        }
        Compression::Snappy => {
            let mut out = Vec::with_capacity(XERIAL_HEADER.len() + input.len() / 2 + 64);
            out.extend_from_slice(XERIAL_HEADER);
            let mut encoder = snap::raw::Encoder::new();
            let mut block = Vec::new();
            for chunk in input.chunks(XERIAL_BLOCK_BYTES) {
                block.resize(snap::raw::max_compress_len(chunk.len()), 0);
                let n = encoder
                    .compress(chunk, &mut block)
                    .map_err(|e| fail(e.to_string()))?;
                out.extend_from_slice(&(n as u32).to_be_bytes());
                out.extend_from_slice(&block[..n]);
            }
            Ok(out)
        }
        Compression::Lz4 => {
            let mut e = lz4::EncoderBuilder::new()
                .block_size(lz4::BlockSize::Max64KB)
                .block_mode(lz4::BlockMode::Independent)
                .checksum(lz4::ContentChecksum::NoChecksum)
                .build(Vec::with_capacity(input.len() / 2 + 64))
                .map_err(|e| fail(e.to_string()))?;
            e.write_all(input).map_err(|e| fail(e.to_string()))?;
            let (out, result) = e.finish();
            result.map_err(|e| fail(e.to_string()))?;
            Ok(out)
        }
        Compression::Zstd => zstd::bulk::compress(input, 3).map_err(|e| fail(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::testing::BatchSpec;
    use crate::log::{split_batches, validate};
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression as Codec, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType as KTimestampType,
    };

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn kcodec(c: Compression) -> Codec {
        match c {
            Compression::None => Codec::None,
            Compression::Gzip => Codec::Gzip,
            Compression::Snappy => Codec::Snappy,
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd => Codec::Zstd,
        }
    }

    /// A client batch of `n` records (idempotent: pid 42, epoch 3, seq 100) encoded by
    /// kafka-protocol with `codec`.
    fn client_batch(n: usize, codec: Compression) -> ValidatedBatch {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: 42,
                producer_epoch: 3,
                timestamp_type: KTimestampType::Creation,
                offset: i as i64,
                sequence: 100 + i as i32,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!("{{\"email\":\"u{i}@x.org\"}}"))),
                headers: [("h".into(), Some(Bytes::from_static(b"v")))]
                    .into_iter()
                    .collect(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: kcodec(codec),
            },
        )
        .unwrap();
        let mut batches = split_batches(buf.freeze()).unwrap();
        assert_eq!(batches.len(), 1);
        batches.remove(0)
    }

    /// Decodes a stored batch with kafka-protocol's own decoder (a real client's view).
    fn kdecode(batch: &ValidatedBatch) -> Vec<Record> {
        let mut bytes = batch.to_bytes();
        RecordBatchDecoder::decode(&mut bytes).unwrap().records
    }

    fn rewrite(
        batch: &ValidatedBatch,
        codec: Compression,
        keep: impl Fn(usize) -> bool,
    ) -> ValidatedBatch {
        let records = decode_records(batch, 1 << 20).unwrap();
        let mut b = BatchBuilder::new(batch, codec);
        for (i, r) in records.iter().enumerate() {
            if !keep(i) {
                continue;
            }
            let value = r.value.as_deref().map(|v| {
                String::from_utf8_lossy(v)
                    .replace("@x.org", "@***")
                    .into_bytes()
            });
            b.push(
                r.offset_delta,
                r.timestamp_ms,
                r.key.as_deref(),
                value.as_deref(),
                r.headers.iter().map(|(k, v)| (&k[..], v.as_deref())),
            )
            .unwrap();
        }
        b.finish().unwrap()
    }

    #[test]
    fn every_codec_round_trips_with_producer_fields_kept() {
        for codec in CODECS {
            for out_codec in CODECS {
                let input = client_batch(5, codec);
                let decoded = decode_records(&input, 1 << 20).unwrap();
                assert_eq!(decoded.len(), 5);
                assert_eq!(decoded[3].offset_delta, 3);
                assert_eq!(decoded[3].timestamp_ms, 1_003);
                let out = rewrite(&input, out_codec, |_| true);
                // Valid as a client batch too (no gaps): CRC, lengths, counts.
                validate(out.to_bytes()).unwrap();
                assert_eq!(out.compression(), out_codec, "{codec:?} -> {out_codec:?}");
                assert_eq!(out.producer_id(), 42);
                assert_eq!(out.producer_epoch(), 3);
                assert_eq!(out.base_sequence(), 100);
                assert_eq!(out.last_offset_delta(), 4);
                assert_eq!(out.record_count(), 5);
                assert_eq!(out.base_timestamp(), 1_000);
                assert_eq!(out.max_timestamp(), 1_004);
                assert_eq!(out.timestamp_type(), TimestampType::CreateTime);
                let records = kdecode(&out);
                assert_eq!(records.len(), 5);
                for (i, r) in records.iter().enumerate() {
                    assert_eq!(r.offset, i as i64);
                    assert_eq!(r.sequence, 100 + i as i32);
                    assert_eq!(r.producer_id, 42);
                    assert_eq!(r.timestamp, 1_000 + i as i64);
                    assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
                    assert_eq!(
                        r.value.as_deref(),
                        Some(format!("{{\"email\":\"u{i}@***\"}}").as_bytes())
                    );
                    assert_eq!(r.headers.len(), 1);
                }
                // And our own decoder reads it back (the protocol layer's view).
                let again = decode_records(&out, 1 << 20).unwrap();
                assert_eq!(again.len(), 5);
            }
        }
    }

    #[test]
    fn dropped_records_leave_gaps_at_the_same_offsets() {
        for codec in CODECS {
            let input = client_batch(6, codec);
            let out = rewrite(&input, codec, |i| i % 2 == 1 && i != 5);
            // Not a client batch any more (count != lastOffsetDelta + 1) ...
            assert!(validate(out.to_bytes()).is_err());
            // ... but a valid stored one.
            validate_rewritten(out.to_bytes()).unwrap();
            assert_eq!(
                out.last_offset_delta(),
                5,
                "the batch still spans 6 offsets"
            );
            assert_eq!(out.record_count(), 2);
            assert_eq!(out.base_sequence(), 100);
            assert_eq!(out.base_timestamp(), 1_001, "first kept record's timestamp");
            assert_eq!(out.max_timestamp(), 1_003);
            let offsets: Vec<i64> = kdecode(&out).iter().map(|r| r.offset).collect();
            assert_eq!(offsets, [1, 3]);
        }
    }

    #[test]
    fn an_emptied_batch_is_kept_uncompressed_with_its_offsets() {
        let input = client_batch(4, Compression::Zstd);
        let out = rewrite(&input, Compression::Zstd, |_| false);
        assert_eq!(out.record_count(), 0);
        assert_eq!(out.last_offset_delta(), 3);
        assert_eq!(out.compression(), Compression::None);
        assert_eq!(out.base_timestamp(), input.base_timestamp());
        assert_eq!(out.max_timestamp(), input.max_timestamp());
        assert_eq!(out.len(), BATCH_HEADER_BYTES);
        assert!(kdecode(&out).is_empty());
    }

    #[test]
    fn offset_deltas_must_increase_within_the_batch() {
        let input = client_batch(3, Compression::None);
        let mut b = BatchBuilder::new(&input, Compression::None);
        b.push(1, 0, None, None, std::iter::empty()).unwrap();
        for bad in [1, 0, 3, -1] {
            assert!(matches!(
                b.push(bad, 0, None, None, std::iter::empty()),
                Err(RewriteError::OffsetDelta { .. })
            ));
        }
        b.push(2, 0, None, None, std::iter::empty()).unwrap();
        assert_eq!(b.finish().unwrap().record_count(), 2);
    }

    #[test]
    fn non_idempotent_batches_keep_minus_one_fields() {
        let input = BatchSpec::new(3, 5_000).build();
        let out = rewrite(&input, Compression::Gzip, |_| true);
        assert_eq!(out.producer_id(), -1);
        assert_eq!(out.base_sequence(), -1);
        assert_eq!(out.producer_epoch(), -1);
        assert_eq!(kdecode(&out).len(), 3);
    }

    #[test]
    fn decode_is_bounded_and_refuses_garbage() {
        let input = client_batch(50, Compression::Gzip);
        assert!(matches!(
            decode_records(&input, 100),
            Err(RewriteError::TooLarge { cap_bytes: 100 })
        ));
        // A record count larger than the records present.
        let mut raw = BatchSpec::new(2, 0).build_bytes();
        raw[57..61].copy_from_slice(&1_000_000i32.to_be_bytes());
        let crc = crc32c::crc32c(&raw[21..]);
        raw[17..21].copy_from_slice(&crc.to_be_bytes());
        let b = validate_rewritten(Bytes::from(raw));
        assert!(b.is_err(), "count above lastOffsetDelta + 1 is refused");
    }
}
