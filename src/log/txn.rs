//! Transaction bytes of the log (KIP-98): the transaction marker (control batch) format
//! and the aborted transaction index file (`<base_offset:020>.txnindex`).
//!
//! Owns: encoding the one-record control batch a leader writes to end a transaction
//! ([`encode_marker`]), recognising one in stored bytes ([`parse_marker`]), and the
//! on-disk format of the aborted transaction index, Kafka's `TransactionIndex`: a file of
//! fixed 34-byte entries, each `version i16 = 0, producer_id i64, first_offset i64,
//! last_offset i64, last_stable_offset i64`, big-endian, appended one per ABORT marker of
//! the segment that holds the marker. Never does: decide which transactions are ongoing
//! (`producer.rs`), which segment an entry goes to, or locking.
//!
//! Marker format (protocol guide, "Control Batches"; Kafka's `EndTransactionMarker`): a
//! batch with attributes transactional (bit 4) and control (bit 5), baseSequence -1, the
//! producer id and epoch of the transaction, and one record whose key is
//! `version i16 = 0, type i16` (0 = ABORT, 1 = COMMIT) and whose value is
//! `version i16 = 0, coordinator_epoch i32`.

use std::io::Write;
use std::path::Path;

use super::batch::{
    validate, BatchHeader, Compression, TimestampType, ValidatedBatch, BATCH_HEADER_BYTES, MAGIC_V2,
};
use super::records::Records;
use super::rewrite::BatchBuilder;
use super::segment::io_error;
use super::LogError;

/// Bytes of one aborted transaction index entry (Kafka's `AbortedTxn.TotalSize`).
pub(crate) const TXN_INDEX_ENTRY_BYTES: usize = 34;
/// The only entry version Kafka writes.
const TXN_INDEX_ENTRY_VERSION: i16 = 0;
/// Control record type of an ABORT marker (Kafka's `ControlRecordType.ABORT`).
const CONTROL_TYPE_ABORT: i16 = 0;
/// Control record type of a COMMIT marker (Kafka's `ControlRecordType.COMMIT`).
const CONTROL_TYPE_COMMIT: i16 = 1;
/// Attributes of a marker batch: transactional (0x10) and control (0x20), uncompressed,
/// CreateTime.
const MARKER_ATTRIBUTES: i16 = 0x10 | 0x20;

/// One entry of the aborted transaction index: a transaction of `producer_id` that
/// covered `[first_offset, last_offset]` (`last_offset` is its ABORT marker's offset) and
/// was aborted; `last_stable_offset` is the partition's first unstable offset right after
/// the marker (Kafka's `AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// The producer whose transaction was aborted.
    pub producer_id: i64,
    /// Offset of the transaction's first batch.
    pub first_offset: i64,
    /// Offset of its ABORT marker.
    pub last_offset: i64,
    /// The first unstable offset after the marker (its offset + 1 when no other
    /// transaction was open).
    pub last_stable_offset: i64,
}

/// What a transaction marker says (Kafka's `EndTransactionMarker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMarker {
    /// COMMIT (true) or ABORT (false).
    pub commit: bool,
    /// The epoch of the transaction coordinator that wrote it.
    pub coordinator_epoch: i32,
}

/// The control batch ending `producer_id`'s transaction, before the log assigns its
/// offset and leader epoch: attributes transactional + control, baseSequence -1, one
/// record at `timestamp_ms` (CreateTime) with the `EndTransactionMarker` key and value.
pub(crate) fn encode_marker(
    producer_id: i64,
    producer_epoch: i16,
    marker: TxnMarker,
    timestamp_ms: i64,
) -> ValidatedBatch {
    let mut header = [0u8; BATCH_HEADER_BYTES];
    header[16] = MAGIC_V2 as u8;
    header[21..23].copy_from_slice(&MARKER_ATTRIBUTES.to_be_bytes());
    header[43..51].copy_from_slice(&producer_id.to_be_bytes());
    header[51..53].copy_from_slice(&producer_epoch.to_be_bytes());
    header[53..57].copy_from_slice(&(-1i32).to_be_bytes());
    let mut key = [0u8; 4];
    let kind = if marker.commit {
        CONTROL_TYPE_COMMIT
    } else {
        CONTROL_TYPE_ABORT
    };
    key[2..4].copy_from_slice(&kind.to_be_bytes());
    let mut value = [0u8; 6];
    value[2..6].copy_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut builder =
        BatchBuilder::with_header(header, 0, TimestampType::CreateTime, Compression::None);
    builder
        .push(
            0,
            timestamp_ms,
            Some(&key),
            Some(&value),
            std::iter::empty::<(&[u8], Option<&[u8]>)>(),
        )
        .expect("a marker record has fixed small fields");
    let batch = builder
        .finish()
        .expect("an uncompressed one-record batch encodes");
    // `finish` validates as a rewritten batch; a marker must pass the client rules too.
    validate(batch.to_bytes()).expect("a marker batch is a valid batch")
}

/// The marker held by a stored control batch (`records`: its records section, after the
/// header), or `None` when `header` is not a control batch or its first record is not a
/// well-formed `EndTransactionMarker` of a known type (Kafka skips unknown control
/// types; so does the log).
pub(crate) fn parse_marker(header: &BatchHeader, records: &[u8]) -> Option<TxnMarker> {
    if !header.is_control() || header.compression() != Some(Compression::None) {
        return None;
    }
    let record = Records::new(records, header.record_count).next()?.ok()?;
    let key = record.key?;
    if key.len() < 4 {
        return None;
    }
    let commit = match i16::from_be_bytes([key[2], key[3]]) {
        CONTROL_TYPE_ABORT => false,
        CONTROL_TYPE_COMMIT => true,
        _ => return None,
    };
    let coordinator_epoch = match record.value {
        Some(v) if v.len() >= 6 => i32::from_be_bytes([v[2], v[3], v[4], v[5]]),
        _ => -1,
    };
    Some(TxnMarker {
        commit,
        coordinator_epoch,
    })
}

/// Encodes entries in the `.txnindex` format.
pub(crate) fn encode_entries(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * TXN_INDEX_ENTRY_BYTES);
    for e in entries {
        out.extend_from_slice(&TXN_INDEX_ENTRY_VERSION.to_be_bytes());
        out.extend_from_slice(&e.producer_id.to_be_bytes());
        out.extend_from_slice(&e.first_offset.to_be_bytes());
        out.extend_from_slice(&e.last_offset.to_be_bytes());
        out.extend_from_slice(&e.last_stable_offset.to_be_bytes());
    }
    out
}

/// Reads a `.txnindex` file: `Ok(None)` when it does not exist. A torn last entry (a
/// crash mid-append) or an entry of an unknown version ends the read there with a
/// warning: the entries before it are kept (the active segment's index is rebuilt at open
/// anyway). Errors: `Io`.
pub(crate) fn read_index(path: &Path) -> Result<Option<Vec<AbortedTxn>>, LogError> {
    let raw = match std::fs::read(path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read", path)(e)),
    };
    let mut entries = Vec::with_capacity(raw.len() / TXN_INDEX_ENTRY_BYTES);
    for chunk in raw.chunks(TXN_INDEX_ENTRY_BYTES) {
        let field = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&chunk[at..at + 8]);
            i64::from_be_bytes(b)
        };
        if chunk.len() < TXN_INDEX_ENTRY_BYTES
            || i16::from_be_bytes([chunk[0], chunk[1]]) != TXN_INDEX_ENTRY_VERSION
        {
            tracing::warn!(file = %path.display(), "torn or unknown aborted transaction index entry; the rest is ignored");
            break;
        }
        entries.push(AbortedTxn {
            producer_id: field(2),
            first_offset: field(10),
            last_offset: field(18),
            last_stable_offset: field(26),
        });
    }
    Ok(Some(entries))
}

/// Appends one entry to the `.txnindex` file at `path` (created if absent). Errors: `Io`.
pub(crate) fn append_entry(path: &Path, entry: &AbortedTxn) -> Result<(), LogError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_error("open", path))?;
    file.write_all(&encode_entries(std::slice::from_ref(entry)))
        .map_err(io_error("append", path))
}

/// Replaces the `.txnindex` file at `path` with `entries` (temp file + rename); no
/// entries removes it. Errors: `Io`.
pub(crate) fn write_index(path: &Path, entries: &[AbortedTxn]) -> Result<(), LogError> {
    if entries.is_empty() {
        return super::segment::remove_if_exists(path);
    }
    let tmp = path.with_extension("txnindex.tmp");
    std::fs::write(&tmp, encode_entries(entries)).map_err(io_error("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_error("rename", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trips_in_kafkas_layout() {
        for (commit, kind) in [(false, 0u8), (true, 1u8)] {
            let batch = encode_marker(
                42,
                3,
                TxnMarker {
                    commit,
                    coordinator_epoch: 7,
                },
                1_000,
            );
            assert!(batch.is_control() && batch.is_transactional());
            assert_eq!(
                (
                    batch.producer_id(),
                    batch.producer_epoch(),
                    batch.base_sequence()
                ),
                (42, 3, -1)
            );
            assert_eq!(batch.record_count(), 1);
            let bytes = batch.to_bytes();
            let header = BatchHeader::parse(&bytes);
            let record = Records::new(&bytes[BATCH_HEADER_BYTES..], 1)
                .next()
                .unwrap()
                .unwrap();
            assert_eq!(record.key, Some(&[0u8, 0, 0, kind][..]));
            assert_eq!(record.value, Some(&[0u8, 0, 0, 0, 0, 7][..]));
            assert_eq!(
                parse_marker(&header, &bytes[BATCH_HEADER_BYTES..]),
                Some(TxnMarker {
                    commit,
                    coordinator_epoch: 7
                })
            );
        }
    }

    #[test]
    fn index_file_round_trips_and_survives_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.txnindex");
        assert_eq!(read_index(&path).unwrap(), None);
        let a = AbortedTxn {
            producer_id: 1,
            first_offset: 2,
            last_offset: 5,
            last_stable_offset: 6,
        };
        let b = AbortedTxn {
            producer_id: 9,
            first_offset: 7,
            last_offset: 10,
            last_stable_offset: 11,
        };
        append_entry(&path, &a).unwrap();
        append_entry(&path, &b).unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), 2 * TXN_INDEX_ENTRY_BYTES);
        assert_eq!(&raw[..2], &[0, 0]);
        assert_eq!(read_index(&path).unwrap(), Some(vec![a, b]));
        std::fs::write(&path, &raw[..TXN_INDEX_ENTRY_BYTES + 5]).unwrap();
        assert_eq!(read_index(&path).unwrap(), Some(vec![a]));
        write_index(&path, &[]).unwrap();
        assert!(!path.exists());
    }
}
