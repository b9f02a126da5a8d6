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
        sequence: -1,
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
