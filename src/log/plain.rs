//! Record batches the broker writes itself — committed group offsets, connector offsets
//! and status, records it routes (HTTP produce, transform outputs, dead letters): magic 2,
//! uncompressed, CreateTime, no producer id (not idempotent), offsets 0..n-1 within the
//! batch. Never does: compression, transactions, appending (the caller appends).

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// One record at `offset_delta` within its batch, with a CreateTime of `timestamp_ms`
/// (milliseconds since the Unix epoch), no producer id and no sequence.
///
/// The record's `sequence` is the batch's base sequence (-1: none) plus `offset_delta`,
/// as kafka-protocol's decoder reports it: its encoder keeps consecutive records in one
/// batch only while offset minus sequence stays the same, so a constant -1 would give
/// every record a batch of its own.
pub fn record(
    offset_delta: i64,
    timestamp_ms: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: IndexMap<StrBytes, Option<Bytes>>,
) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: offset_delta,
        sequence: (offset_delta as i32).wrapping_sub(1),
        timestamp: timestamp_ms,
        key,
        value,
        headers,
    }
}

/// Encodes `records` (from [`record`]) as one uncompressed magic-2 batch: the bytes a
/// client would send, ready for `log::split_batches`.
///
/// Errors: the encoder's message (a field too large for the format).
pub fn encode(records: &[Record]) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("cannot encode a record batch: {e}"))?;
    Ok(buf.freeze())
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
