//! Record batches the broker writes itself — committed group offsets, connector offsets
//! and status, records it routes (HTTP produce, transform outputs, dead letters): magic 2,
//! uncompressed, CreateTime, no producer id (not idempotent; transactional offset commits
//! carry the producer's id and epoch), offsets 0..n-1 within the
//! batch, headers in order with repeated keys kept (KIP-82). Encoded with the same
//! `rewrite::BatchBuilder` as inline transforms, so the record layout has one writer
//! (and one reader, `records`). Never does: compression, control batches (markers), appending (the
//! caller appends).

use bytes::Bytes;

use super::batch::{Compression, TimestampType, BATCH_HEADER_BYTES, MAGIC_V2};
use super::rewrite::BatchBuilder;

/// Attributes bit 4: the batch is part of a transaction.
const TRANSACTIONAL_ATTRIBUTE: i16 = 0x10;

/// One record for [`encode`] (see [`record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// offsetDelta within its batch.
    pub offset_delta: i64,
    /// CreateTime, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Key; `None` is null.
    pub key: Option<Bytes>,
    /// Value; `None` is null.
    pub value: Option<Bytes>,
    /// Headers in order (keys UTF-8 by Kafka's contract; repeats kept), `None` a null
    /// value.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// One record at `offset_delta` within its batch, with a CreateTime of `timestamp_ms`
/// (milliseconds since the Unix epoch), no producer id and no sequence.
pub fn record(
    offset_delta: i64,
    timestamp_ms: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<(Bytes, Option<Bytes>)>,
) -> Record {
    Record {
        offset_delta,
        timestamp_ms,
        key,
        value,
        headers,
    }
}

/// Encodes `records` (from [`record`], offset deltas increasing) as one uncompressed
/// magic-2 batch: the bytes a client would send, ready for `log::split_batches`.
/// baseTimestamp is the first record's timestamp, maxTimestamp the largest,
/// lastOffsetDelta the last record's offset delta, partitionLeaderEpoch 0 (the log
/// stamps its own at append).
///
/// Errors: no records, offset deltas not increasing from 0 or beyond `i32`, or a field
/// too large for the format (the message says which).
pub fn encode(records: &[Record]) -> Result<Bytes, String> {
    encode_with(records, None)
}

/// As [`encode`], as a transactional batch of producer `(producer_id, producer_epoch)`
/// when `transactional` is set (attributes bit 4, base sequence -1: Kafka writes a
/// coordinator's transactional offset commits so, `TxnOffsetCommit`), otherwise with no
/// producer id.
///
/// Errors: as [`encode`].
pub fn encode_with(records: &[Record], transactional: Option<(i64, i16)>) -> Result<Bytes, String> {
    let producer = transactional.map(|(producer_id, producer_epoch)| ProducerFields {
        producer_id,
        producer_epoch,
        base_sequence: -1,
        transactional: true,
    });
    encode_as(records, producer)
}

/// The producer fields of a batch [`encode_as`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerFields {
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// The first record's sequence (-1: none, not idempotent).
    pub base_sequence: i32,
    /// Attributes bit 4: part of a transaction.
    pub transactional: bool,
}

/// As [`encode`], stamped with `producer`'s id, epoch, base sequence and transactional
/// bit (an idempotent or transactional producer's batch, as a client would send it), or
/// with no producer id when `None`.
///
/// Errors: as [`encode`].
pub fn encode_as(records: &[Record], producer: Option<ProducerFields>) -> Result<Bytes, String> {
    let fail = |e: String| format!("cannot encode a record batch: {e}");
    let last = records
        .last()
        .ok_or_else(|| fail("no records".into()))?
        .offset_delta;
    let last_offset_delta =
        i32::try_from(last).map_err(|_| fail(format!("offset delta {last} beyond i32")))?;
    let mut header = [0u8; BATCH_HEADER_BYTES];
    header[16] = MAGIC_V2 as u8;
    header[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
    let p = producer.unwrap_or(ProducerFields {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        transactional: false,
    });
    if p.transactional {
        header[21..23].copy_from_slice(&TRANSACTIONAL_ATTRIBUTE.to_be_bytes());
    }
    header[43..51].copy_from_slice(&p.producer_id.to_be_bytes());
    header[51..53].copy_from_slice(&p.producer_epoch.to_be_bytes());
    header[53..57].copy_from_slice(&p.base_sequence.to_be_bytes());
    let mut builder = BatchBuilder::with_header(
        header,
        last_offset_delta,
        TimestampType::CreateTime,
        Compression::None,
    );
    for r in records {
        let offset_delta = i32::try_from(r.offset_delta)
            .map_err(|_| fail(format!("offset delta {} beyond i32", r.offset_delta)))?;
        builder
            .push(
                offset_delta,
                r.timestamp_ms,
                r.key.as_deref(),
                r.value.as_deref(),
                r.headers.iter().map(|(k, v)| (&k[..], v.as_deref())),
            )
            .map_err(|e| fail(e.to_string()))?;
    }
    let batch = builder.finish().map_err(|e| fail(e.to_string()))?;
    Ok(batch.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records from [`record`] with offset deltas 0..n encode as one batch of n records,
    /// with no producer id and no base sequence.
    #[test]
    fn records_encode_as_one_batch() {
        let records: Vec<Record> = (0..5)
            .map(|i| {
                record(
                    i,
                    1_000 + i,
                    None,
                    Some(Bytes::from_static(b"v")),
                    Default::default(),
                )
            })
            .collect();
        let batches = crate::log::split_batches(encode(&records).unwrap()).unwrap();
        assert_eq!(batches.len(), 1);
        let batch = &batches[0];
        assert_eq!(batch.record_count(), 5);
        assert_eq!(batch.last_offset(), 4);
        assert_eq!((batch.producer_id(), batch.base_sequence()), (-1, -1));
    }
}
