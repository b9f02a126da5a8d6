//! Tests of the partition log: round trips across rolls, KIP-74 reads, recovery of torn
//! and corrupt tails, index rebuilds, retention, time lookups, idempotence, truncation,
//! and a property test against a `Vec<batch>` model.

use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;

use super::batch::testing::{batch, BatchSpec};
use super::batch::{validate_stored, ValidatedBatch, LOG_OVERHEAD_BYTES};
use super::*;

const NOW_MS: i64 = 1_700_000_000_000;

fn small_config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        segment_ms: i64::MAX / 2,
        retention_ms: -1,
        retention_bytes: -1,
        index_interval_bytes: 100,
        segment_index_bytes: 10 << 20,
        flush_messages: None,
        flush_ms: None,
        ..LogConfig::default()
    }
}

fn opts() -> AppendOptions {
    AppendOptions {
        log_append_time_ms: None,
        leader_epoch: 3,
    }
}

/// Appends and returns the bytes the log should have stored.
fn append(log: &mut PartitionLog, b: ValidatedBatch) -> (AppendInfo, Bytes) {
    append_in_epoch(log, b, 3)
}

/// Appends as leader of `leader_epoch` and returns the bytes the log should have stored.
fn append_in_epoch(
    log: &mut PartitionLog,
    b: ValidatedBatch,
    leader_epoch: i32,
) -> (AppendInfo, Bytes) {
    let mut expected = b.clone();
    let options = AppendOptions {
        log_append_time_ms: None,
        leader_epoch,
    };
    let info = log.append(b, options, NOW_MS).expect("append");
    expected.set_base_offset(info.base_offset);
    expected.set_partition_leader_epoch(leader_epoch);
    (info, expected.to_bytes())
}

/// Splits read bytes into (base offset, last offset), checking every CRC.
fn batches_of(bytes: &Bytes) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize
            + LOG_OVERHEAD_BYTES;
        let b = validate_stored(bytes.slice(at..at + len), at).expect("stored batch valid");
        out.push((b.base_offset(), b.last_offset()));
        at += len;
    }
    out
}

fn read_all(log: &PartitionLog) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 1 << 20, i64::MAX).expect("read");
        let batches = batches_of(&r.bytes);
        assert!(!batches.is_empty(), "no progress at {offset}");
        offset = batches.last().unwrap().1 + 1;
        out.extend_from_slice(&r.bytes);
    }
    out
}

fn last_log_file(dir: &Path) -> std::path::PathBuf {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.pop().unwrap()
}

thread_local! {
    /// WARN messages of this thread while `with_warnings` runs (`None` otherwise).
    static CAPTURED: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// A global tracing subscriber that hands WARN messages to the emitting thread's capture,
/// to assert that recovery said what it did. Global rather than scoped per test: with
/// scoped subscribers in parallel test threads, tracing may cache a call site as "never
/// interested" and drop the event (seen as a flaky warning count).
struct Router;

struct MessageVisitor<'a>(&'a mut String);

impl tracing::field::Visit for MessageVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl tracing::Subscriber for Router {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut MessageVisitor(&mut text));
            CAPTURED.with(|c| {
                if let Some(v) = c.borrow_mut().as_mut() {
                    v.push(text);
                }
            });
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn with_warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(Router)
            .expect("no other global subscriber in the unit tests");
    });
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let seen = CAPTURED.with(|c| c.borrow_mut().take().unwrap_or_default());
    (out, seen)
}

/// The descriptor cache may close a segment's files between any two operations (an
/// eviction): appends (with index entries), reads, time lookups, flushes, truncation and a
/// reopen all go on through reopened handles, and every byte is still there.
#[test]
fn files_closed_between_operations_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    let mut expected = Vec::new();
    for i in 0..40 {
        log.close_files();
        let (_, bytes) = append(&mut log, batch(1 + i % 5, 1_000 + i as i64));
        expected.extend_from_slice(&bytes);
        if i % 7 == 0 {
            log.close_files();
            log.flush_at(NOW_MS).unwrap();
        }
    }
    assert!(log.segment_count() > 3, "segments: {}", log.segment_count());
    assert!(
        log.open_files() > 0,
        "appends reopened the active segment's files"
    );
    log.close_files();
    assert_eq!(log.open_files(), 0);
    assert_eq!(read_all(&log), expected);
    log.close_files();
    let found = log.offset_for_timestamp(1_020).unwrap();
    assert!(found.is_some_and(|(_, ts)| ts >= 1_020), "{found:?}");
    // Idle segments stay closed: only what a read touched was reopened.
    log.close_files();
    let r = log.read(0, 1, i64::MAX).unwrap();
    assert!(!r.bytes.is_empty());
    assert_eq!(log.open_files(), 1, "the first segment's .log only");
    // The index written through reopened handles is whole: a reopen trusts it.
    log.close_files();
    drop(log);
    let (mut log, warnings) =
        with_warnings(|| PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(read_all(&log), expected);
    log.close_files();
    let leo = log.log_end_offset();
    log.truncate_to(leo - 1, NOW_MS).unwrap();
    log.close_files();
    let (info, _) = append(&mut log, batch(2, 5_000));
    assert!(info.base_offset < leo);
}

#[test]
fn round_trip_across_rolls_and_reads_from_mid_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    let mut expected = Vec::new();
    let mut ranges = Vec::new();
    for i in 0..40 {
        let (info, bytes) = append(&mut log, batch(1 + i % 5, 1_000 + i as i64));
        assert!(!info.duplicate);
        assert_eq!(info.log_append_time_ms, -1);
        ranges.push((info.base_offset, info.last_offset));
        expected.extend_from_slice(&bytes);
    }
    assert!(log.segment_count() > 3, "segments: {}", log.segment_count());
    assert_eq!(log.log_end_offset(), ranges.last().unwrap().1 + 1);
    assert_eq!(read_all(&log), expected);
    for &(base, last) in &ranges {
        for offset in base..=last {
            let r = log.read(offset, 1, i64::MAX).unwrap();
            assert_eq!(batches_of(&r.bytes), vec![(base, last)], "offset {offset}");
            assert_eq!(r.first_batch_base_offset, Some(base));
        }
    }
    // Reopen: same bytes, appends continue.
    drop(log);
    let mut log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    assert_eq!(read_all(&log), expected);
    let (info, _) = append(&mut log, batch(2, 5_000));
    assert_eq!(info.base_offset, ranges.last().unwrap().1 + 1);
}

/// `read_region` (issue 17's zero-copy read) returns exactly the batches `read` copies,
/// for every fetch offset, a spread of `max_bytes` (below one batch, between batch
/// boundaries, across index entries) and every `max_offset` (mid-segment high watermarks
/// and last stable offsets), on a log of several segments whose batches vary in size;
/// and the same errors. Its `last_offset` bounds the records read from above and stops
/// below the next batch.
#[test]
fn read_region_is_read_without_the_copy() {
    // An index entry at nearly every batch, and none at all (headers scanned from the first).
    for index_interval_bytes in [100, 1 << 20] {
        read_region_matches_read(LogConfig {
            index_interval_bytes,
            ..small_config(1_000)
        });
    }
}

fn read_region_matches_read(config: LogConfig) {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    for i in 0..40 {
        append(&mut log, batch(1 + (i * 7) % 6, 1_000 + i as i64));
    }
    assert!(log.segment_count() > 3, "segments: {}", log.segment_count());
    let leo = log.log_end_offset();
    let mut max_offsets: Vec<i64> = (0..=leo).step_by(3).collect();
    max_offsets.push(i64::MAX);
    for offset in 0..=leo {
        for max_bytes in [1, 60, 100, 150, 333, 700, 1_000, 1 << 20] {
            for &max_offset in &max_offsets {
                let copied = log.read(offset, max_bytes, max_offset).unwrap();
                let region = log.read_region(offset, max_bytes, max_offset).unwrap();
                let case = format!("offset {offset} max_bytes {max_bytes} max_offset {max_offset}");
                match region {
                    None => assert!(copied.bytes.is_empty(), "{case}"),
                    Some(region) => {
                        let bytes = region.read_to_bytes().unwrap();
                        assert_eq!(bytes, copied.bytes, "{case}");
                        assert_eq!(Some(region.base_offset), copied.first_batch_base_offset);
                        let batches = batches_of(&bytes);
                        let last = batches.last().unwrap().1;
                        assert!(region.last_offset >= last, "{case}");
                        let next = log.read(last + 1, 1, i64::MAX).unwrap();
                        if let Some(next_base) = next.first_batch_base_offset {
                            assert!(region.last_offset < next_base, "{case}");
                        }
                    }
                }
            }
        }
    }
    assert!(matches!(
        log.read_region(leo + 1, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.read_region(-1, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn kip74_max_bytes_max_offset_and_range_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    let (_, a) = append(&mut log, batch(3, 10));
    let (_, b) = append(&mut log, batch(3, 20));
    let (_, _c) = append(&mut log, batch(3, 30));
    // First batch whole even with max_bytes 1.
    let r = log.read(0, 1, i64::MAX).unwrap();
    assert_eq!(r.bytes.len(), a.len());
    // Exactly two batches fit.
    let r = log.read(0, a.len() + b.len(), i64::MAX).unwrap();
    assert_eq!(batches_of(&r.bytes), vec![(0, 2), (3, 5)]);
    let r = log.read(0, a.len() + b.len() - 1, i64::MAX).unwrap();
    assert_eq!(batches_of(&r.bytes), vec![(0, 2)]);
    // max_offset (high watermark) bounds the read.
    let r = log.read(0, 1 << 20, 6).unwrap();
    assert_eq!(batches_of(&r.bytes), vec![(0, 2), (3, 5)]);
    let r = log.read(6, 1 << 20, 6).unwrap();
    assert!(r.bytes.is_empty() && r.first_batch_base_offset.is_none());
    // LEO reads empty; beyond it is out of range.
    assert!(log.read(9, 100, i64::MAX).unwrap().bytes.is_empty());
    match log.read(10, 100, i64::MAX) {
        Err(e @ LogError::OffsetOutOfRange { .. }) => assert_eq!(
            e.kafka_error(),
            kafka_protocol::ResponseError::OffsetOutOfRange
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        log.read(-1, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn recovery_cuts_torn_tail_and_continues() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(1 << 20);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let mut expected = Vec::new();
    let mut last_whole_end = 0;
    for i in 0..30 {
        let (info, bytes) = append(&mut log, batch(4, i));
        if i < 29 {
            expected.extend_from_slice(&bytes);
            last_whole_end = info.last_offset + 1;
        }
    }
    drop(log);
    let path = last_log_file(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 7).unwrap();
    drop(file);
    let (log, warnings) = with_warnings(|| PartitionLog::open(dir.path(), config.clone(), NOW_MS));
    let mut log = log.unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("truncated_bytes") && w.contains("from_offset=116")),
        "{warnings:?}"
    );
    assert_eq!(log.log_end_offset(), last_whole_end);
    assert_eq!(read_all(&log), expected);
    let (info, _) = append(&mut log, batch(2, 99));
    assert_eq!(info.base_offset, last_whole_end);
}

#[test]
fn recovery_cuts_at_corrupt_crc() {
    let dir = tempfile::tempdir().unwrap();
    // One index entry at most: the scan covers the whole segment.
    let mut config = small_config(1 << 20);
    config.index_interval_bytes = 4096;
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let mut positions = Vec::new();
    let mut position = 0u64;
    for i in 0..20 {
        let (info, bytes) = append(&mut log, batch(2, i));
        positions.push((position, info.base_offset));
        position += bytes.len() as u64;
    }
    drop(log);
    // Flip a record byte in batch 15: it and everything after it go.
    let path = last_log_file(dir.path());
    let mut raw = std::fs::read(&path).unwrap();
    let (corrupt_at, corrupt_offset) = positions[15];
    raw[corrupt_at as usize + 70] ^= 0x55;
    std::fs::write(&path, &raw).unwrap();
    let (log, warnings) = with_warnings(|| PartitionLog::open(dir.path(), config.clone(), NOW_MS));
    let mut log = log.unwrap();
    assert!(warnings.iter().any(|w| w.contains("crc")), "{warnings:?}");
    assert_eq!(log.log_end_offset(), corrupt_offset);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), corrupt_at);
    let (info, _) = append(&mut log, batch(1, 50));
    assert_eq!(info.base_offset, corrupt_offset);
    assert_eq!(batches_of(&Bytes::from(read_all(&log))).len(), 16);
}

#[test]
fn missing_and_corrupt_indexes_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(2_000);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let mut expected = Vec::new();
    for i in 0..60 {
        expected.extend_from_slice(&append(&mut log, batch(2, i)).1);
    }
    let segments = log.segment_count();
    assert!(segments >= 3);
    drop(log);
    let mut indexes: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "index"))
        .collect();
    indexes.sort();
    let first_index_len = std::fs::metadata(&indexes[0]).unwrap().len();
    assert!(first_index_len >= 16, "index has entries");
    // Closed segment: missing index. Second closed: non-monotonic entries. Active: missing.
    std::fs::remove_file(&indexes[0]).unwrap();
    let mut raw = std::fs::read(&indexes[1]).unwrap();
    raw[0..8].copy_from_slice(&[0xff; 8]);
    std::fs::write(&indexes[1], &raw).unwrap();
    std::fs::remove_file(indexes.last().unwrap()).unwrap();
    let ((), warnings) = with_warnings(|| {
        let log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
        assert_eq!(log.segment_count(), segments);
        // Reads go through every segment's index (lazily loading and rebuilding).
        assert_eq!(read_all(&log), expected);
        for offset in (0..120).step_by(7) {
            let r = log.read(offset, 1, i64::MAX).unwrap();
            let (base, last) = batches_of(&r.bytes)[0];
            assert!(base <= offset && offset <= last);
        }
    });
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings[2].contains("corrupt"), "{warnings:?}");
    assert_eq!(
        std::fs::metadata(&indexes[0]).unwrap().len(),
        first_index_len
    );
}

#[test]
fn read_checks_stored_base_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1_000);
    config.index_interval_bytes = 4096;
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    let mut positions = Vec::new();
    let mut position = 0;
    for i in 0..12 {
        let (info, bytes) = append(&mut log, batch(2, i));
        positions.push((position, info.base_offset));
        position += bytes.len();
    }
    assert!(log.segment_count() > 1);
    // Rewrite batch 2's baseOffset (outside the CRC) in the closed first segment.
    let first = dir.path().join(format!("{:020}.log", 0));
    let mut raw = std::fs::read(&first).unwrap();
    let (at, _) = positions[2];
    raw[at..at + 8].copy_from_slice(&1i64.to_be_bytes());
    std::fs::write(&first, raw).unwrap();
    let (_, base3) = positions[3];
    match log.read(base3, 1, i64::MAX) {
        Err(e @ LogError::Corrupt { .. }) => assert_eq!(
            e.kafka_error(),
            kafka_protocol::ResponseError::KafkaStorageError
        ),
        other => panic!("{other:?}"),
    }
    assert!(log.read(0, 1, i64::MAX).is_ok());
}

#[test]
fn retention_by_bytes_moves_log_start_and_keeps_active() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1_000);
    config.retention_bytes = 2_500;
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    for i in 0..40 {
        append(&mut log, batch(3, NOW_MS + i));
    }
    let before = log.segment_count();
    let deleted = log.apply_retention(NOW_MS).unwrap();
    assert!(deleted > 0);
    assert_eq!(log.segment_count(), before - deleted);
    assert!(log.size_bytes() <= 2_500 + 1_000);
    assert!(log.log_start_offset() > 0);
    assert!(matches!(
        log.read(0, 10, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let r = log.read(log.log_start_offset(), 10, i64::MAX).unwrap();
    assert_eq!(r.first_batch_base_offset, Some(log.log_start_offset()));
    // Nothing more to delete; the survivors reopen with the same log start.
    assert_eq!(log.apply_retention(NOW_MS).unwrap(), 0);
    let start = log.log_start_offset();
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    assert_eq!(log.log_start_offset(), start);
}

#[test]
fn increment_log_start_offset_deletes_below_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    for i in 0..40 {
        append(&mut log, batch(3, NOW_MS + i));
    }
    let (leo, before) = (log.log_end_offset(), log.segment_count());
    // Above the given bound (the high watermark) or the LEO: OFFSET_OUT_OF_RANGE.
    assert!(matches!(
        log.increment_log_start_offset(leo - 5, leo - 10),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.increment_log_start_offset(leo + 1, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // Inside a batch of a later segment.
    let start = leo / 2 + 1;
    assert!(log.increment_log_start_offset(start, leo).unwrap());
    assert_eq!(log.log_start_offset(), start);
    assert!(
        log.segment_count() < before,
        "segments wholly below deleted"
    );
    assert!(matches!(
        log.read(start - 1, 10, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let r = log.read(start, 10, i64::MAX).unwrap();
    assert!(r.first_batch_base_offset.unwrap() <= start);
    // Lower: no change.
    assert!(!log.increment_log_start_offset(3, leo).unwrap());
    assert_eq!(log.log_start_offset(), start);
    // A time lookup never answers below the start.
    assert!(log.offset_for_timestamp(0).unwrap().unwrap().0 >= start);
    // Retention keeps a start inside the first segment.
    assert_eq!(log.apply_retention(NOW_MS).unwrap(), 0);
    assert_eq!(log.log_start_offset(), start);
    let segments = log.segment_count();
    drop(log);
    let mut log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(log.segment_count(), segments);
    // A follower truncated below its start restarts there, and forgets the checkpoint.
    log.truncate_to(start - 2, NOW_MS).unwrap();
    assert_eq!(log.log_start_offset(), start - 2);
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config(1_000), NOW_MS).unwrap();
    assert_eq!(
        (log.log_start_offset(), log.log_end_offset()),
        (start - 2, start - 2)
    );
}

#[test]
fn retention_by_time_then_all_expired_rolls_and_continues_from_leo() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1_000);
    config.retention_ms = 60_000;
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    for i in 0..20 {
        append(&mut log, batch(3, NOW_MS + i * 1_000));
    }
    // Only segments whose largest timestamp is older than 60 s go.
    let deleted = log.apply_retention(NOW_MS + 75_000).unwrap();
    assert!(deleted >= 1);
    let start = log.log_start_offset();
    assert!(start > 0);
    assert!(log.read(start, 1, i64::MAX).is_ok());
    // Everything expired: roll, delete all, log start = LEO.
    let leo = log.log_end_offset();
    log.apply_retention(NOW_MS + 10_000_000).unwrap();
    assert_eq!(log.log_start_offset(), leo);
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(log.segment_count(), 1);
    assert!(log.read(leo, 100, i64::MAX).unwrap().bytes.is_empty());
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(log.log_start_offset(), leo);
    let (info, _) = append(&mut log, batch(1, NOW_MS + 10_000_000));
    assert_eq!(info.base_offset, leo);
    assert_eq!(info.log_start_offset, leo);
}

/// Model answer for ListOffsets: first record with timestamp >= target.
fn model_lookup(records: &[(i64, i64)], target: i64) -> Option<(i64, i64)> {
    let max = records.iter().map(|r| r.1).max()?;
    if max < target {
        return None;
    }
    records.iter().copied().find(|r| r.1 >= target)
}

#[test]
fn time_index_lookups_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(900);
    config.index_interval_bytes = 50;
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(log.offset_for_timestamp(0).unwrap(), None);
    assert_eq!(log.max_timestamp().unwrap(), None);
    let mut records = Vec::new(); // (offset, timestamp)
    for i in 0..50i64 {
        // Timestamps mostly rise, with a dip every 7th batch.
        let base_ts = if i % 7 == 3 {
            100 + i * 10 - 35
        } else {
            100 + i * 10
        };
        let (info, _) = append(&mut log, BatchSpec::new(3, base_ts).build());
        for k in 0..3 {
            records.push((info.base_offset + k, base_ts + k));
        }
    }
    assert!(log.segment_count() > 4);
    for reopen in [false, true] {
        if reopen {
            drop(log);
            log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
        }
        for target in (50..700).step_by(3) {
            assert_eq!(
                log.offset_for_timestamp(target).unwrap(),
                model_lookup(&records, target),
                "target {target} reopen {reopen}"
            );
        }
        let max = records.iter().map(|r| r.1).max().unwrap();
        let first_max = *records.iter().find(|r| r.1 == max).unwrap();
        assert_eq!(log.max_timestamp().unwrap(), Some(first_max));
    }
}

#[test]
fn max_timestamp_in_middle_segment_is_record_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(500), NOW_MS).unwrap();
    for i in 0..10 {
        let spec = if i == 4 {
            let mut s = BatchSpec::new(4, 1_000);
            s.records[2].0 = 9_000; // record offset base+2 holds ts 10_000
            s
        } else {
            BatchSpec::new(4, 2_000 + i)
        };
        append(&mut log, spec.build());
    }
    assert!(log.segment_count() > 2);
    assert_eq!(log.max_timestamp().unwrap(), Some((18, 10_000)));
    assert_eq!(log.offset_for_timestamp(10_001).unwrap(), None);
}

#[test]
fn log_append_time_rewrites_header_and_is_batch_level_for_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    let options = AppendOptions {
        log_append_time_ms: Some(NOW_MS),
        leader_epoch: 7,
    };
    let info = log.append(batch(5, 10), options, NOW_MS).unwrap();
    assert_eq!(info.log_append_time_ms, NOW_MS);
    let r = log.read(0, 1 << 20, i64::MAX).unwrap();
    let stored = validate(r.bytes.clone()).unwrap();
    assert_eq!(stored.timestamp_type(), TimestampType::LogAppendTime);
    assert_eq!(stored.max_timestamp(), NOW_MS);
    assert_eq!(stored.partition_leader_epoch(), 7);
    assert_eq!(log.offset_for_timestamp(12).unwrap(), Some((0, NOW_MS)));
}

fn idempotent(count: usize, pid: i64, epoch: i16, seq: i32) -> ValidatedBatch {
    BatchSpec::new(count, NOW_MS)
        .idempotent(pid, epoch, seq)
        .build()
}

#[test]
fn idempotent_producer_duplicates_ordering_and_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(1 << 20);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let first = log.append(idempotent(3, 42, 0, 0), opts(), NOW_MS).unwrap();
    let second = log.append(idempotent(2, 42, 0, 3), opts(), NOW_MS).unwrap();
    assert_eq!((second.base_offset, second.last_offset), (3, 4));
    // Retry of the first batch: original offsets, nothing written.
    let retry = log.append(idempotent(3, 42, 0, 0), opts(), NOW_MS).unwrap();
    assert!(retry.duplicate);
    assert_eq!(
        (retry.base_offset, retry.last_offset),
        (first.base_offset, first.last_offset)
    );
    assert_eq!(log.log_end_offset(), 5);
    // Gap and replay of an unseen older sequence: out of order.
    let gap = log
        .append(idempotent(1, 42, 0, 7), opts(), NOW_MS)
        .unwrap_err();
    assert_eq!(
        gap.kafka_error(),
        kafka_protocol::ResponseError::OutOfOrderSequenceNumber
    );
    assert!(matches!(
        log.append(idempotent(2, 42, 0, 1), opts(), NOW_MS),
        Err(LogError::OutOfOrderSequence {
            expected_sequence: 5,
            ..
        })
    ));
    // New epoch must start at 0; then the old epoch is fenced.
    assert!(matches!(
        log.append(idempotent(1, 42, 1, 5), opts(), NOW_MS),
        Err(LogError::OutOfOrderSequence { .. })
    ));
    log.append(idempotent(1, 42, 1, 0), opts(), NOW_MS).unwrap();
    let fenced = log
        .append(idempotent(1, 42, 0, 5), opts(), NOW_MS)
        .unwrap_err();
    assert_eq!(
        fenced.kafka_error(),
        kafka_protocol::ResponseError::InvalidProducerEpoch
    );
    // Unknown producer: any sequence (KIP-360).
    log.append(idempotent(1, 77, 4, 1_000), opts(), NOW_MS)
        .unwrap();
    // State survives a reopen (replay of the active segment).
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    let retry = log
        .append(idempotent(1, 77, 4, 1_000), opts(), NOW_MS)
        .unwrap();
    assert!(retry.duplicate);
    assert!(log.append(idempotent(1, 42, 0, 5), opts(), NOW_MS).is_err());
}

#[test]
fn producer_state_survives_roll_and_reopen_via_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(300);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let original = log.append(idempotent(2, 9, 0, 0), opts(), NOW_MS).unwrap();
    for _ in 0..5 {
        append(&mut log, batch(5, NOW_MS));
    }
    assert!(
        log.segment_count() > 2,
        "the producer's batch is in a closed segment"
    );
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    let retry = log.append(idempotent(2, 9, 0, 0), opts(), NOW_MS).unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.base_offset, original.base_offset);
    assert!(log.append(idempotent(1, 9, 0, 5), opts(), NOW_MS).is_err());
    log.append(idempotent(1, 9, 0, 2), opts(), NOW_MS).unwrap();
}

#[test]
fn truncate_to_mid_batch_and_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(600);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let mut expected = Vec::new();
    let mut ranges = Vec::new();
    for i in 0..20 {
        let (info, bytes) = append(&mut log, batch(3, i));
        ranges.push((info.base_offset, bytes.len()));
        expected.push(bytes);
    }
    // Offset 31 is inside batch [30, 32]: that batch goes too.
    log.truncate_to(31, NOW_MS).unwrap();
    assert_eq!(log.log_end_offset(), 30);
    let kept: Vec<u8> = expected[..10].concat();
    assert_eq!(read_all(&log), kept);
    let (info, _) = append(&mut log, batch(1, 5));
    assert_eq!(info.base_offset, 30);
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(log.log_end_offset(), 31);
    log.truncate_to(0, NOW_MS).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
    assert_eq!(append(&mut log, batch(1, 5)).0.base_offset, 0);
}

/// A truncation whose removed batch also holds the log start (DeleteRecords moved it
/// inside the batch) leaves no readable record: the log restarts empty at the batch's
/// base offset, so the log start never ends above the log end (a follower's high
/// watermark is clamped between the two, which panicked when they crossed).
#[test]
fn truncate_inside_the_batch_holding_the_log_start_restarts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(600);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    for i in 0..4 {
        append(&mut log, batch(3, i));
    }
    // Batches [0,2] [3,5] [6,8] [9,11]; the log start goes inside [9,11].
    assert!(log.increment_log_start_offset(10, 12).unwrap());
    log.truncate_to(11, NOW_MS).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (9, 9));
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (9, 9));
    assert_eq!(append(&mut log, batch(3, 9)).0.base_offset, 9);
}

/// A follower below the leader's log start restarts empty there (Kafka's
/// `truncateFullyAndStartAt`): every segment goes, the start and end are `offset`, also
/// after a reopen, and the next append gets it.
#[test]
fn truncate_fully_and_start_at_restarts_the_log_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(600);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    for i in 0..20 {
        append(&mut log, batch(3, i));
    }
    assert!(log.segment_count() > 1);
    log.truncate_fully_and_start_at(1000, NOW_MS).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1000, 1000));
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.latest_epoch(), None);
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1000, 1000));
    assert_eq!(append(&mut log, batch(2, 5)).0.base_offset, 1000);
    assert_eq!(log.log_end_offset(), 1002);
}

#[test]
fn rolls_on_segment_ms_and_full_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1 << 20);
    config.segment_ms = 1_000;
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    append(&mut log, batch(1, 10_000));
    append(&mut log, batch(1, 10_500));
    assert_eq!(log.segment_count(), 1);
    append(&mut log, batch(1, 11_001));
    assert_eq!(log.segment_count(), 2);

    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(1 << 20);
    config.index_interval_bytes = 0; // an entry before every batch but the first
    config.segment_index_bytes = 24; // 3 offset entries, 2 time entries
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    for i in 0..10 {
        append(&mut log, batch(1, i));
    }
    assert!(log.segment_count() >= 3, "{}", log.segment_count());
    assert_eq!(batches_of(&Bytes::from(read_all(&log))).len(), 10);
}

#[test]
fn flush_settings_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topic-0");
    let mut config = small_config(1 << 20);
    config.flush_messages = Some(2);
    config.flush_ms = Some(1_000);
    let mut log = PartitionLog::open(&path, config, NOW_MS).unwrap();
    append(&mut log, batch(1, 1));
    assert!(!log.maybe_flush(NOW_MS + 10).unwrap());
    assert!(log.maybe_flush(NOW_MS + 2_000).unwrap());
    append(&mut log, batch(3, 1));
    log.flush().unwrap();
    assert!(path.exists());
    log.delete().unwrap();
    assert!(!path.exists());
}

#[test]
fn invalid_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(0);
    let err = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap_err();
    assert_eq!(
        err.kafka_error(),
        kafka_protocol::ResponseError::InvalidConfig
    );
    config.segment_bytes = 1 << 40;
    assert!(PartitionLog::open(dir.path(), config, NOW_MS).is_err());
}

// ---------------------------------------------------------------------------------------
// Property test against a model.

#[derive(Debug, Clone)]
enum Op {
    Append {
        records: usize,
        ts: i64,
        /// The leader epoch goes up by this much first.
        epoch_bump: i32,
    },
    Read {
        pick: usize,
        max_bytes: usize,
        hw_back: i64,
    },
    Reopen,
    RetainBytes {
        limit: i64,
    },
    CutTail {
        bytes: u64,
    },
    TruncateTo {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..6, 0i64..10_000, prop_oneof![3 => Just(0), 1 => 1i32..3])
            .prop_map(|(records, ts, epoch_bump)| Op::Append { records, ts, epoch_bump }),
        3 => (any::<usize>(), 1usize..600, 0i64..3).prop_map(|(pick, max_bytes, hw_back)| Op::Read { pick, max_bytes, hw_back }),
        1 => Just(Op::Reopen),
        1 => (200i64..2_000).prop_map(|limit| Op::RetainBytes { limit }),
        1 => (1u64..150).prop_map(|bytes| Op::CutTail { bytes }),
        1 => any::<usize>().prop_map(|pick| Op::TruncateTo { pick }),
    ]
}

struct Model {
    /// (base offset, last offset, stored bytes)
    batches: Vec<(i64, i64, Bytes)>,
    log_start_offset: i64,
    log_end_offset: i64,
    leader_epoch: i32,
}

fn check_against_model(log: &PartitionLog, model: &Model) {
    assert_eq!(log.log_start_offset(), model.log_start_offset);
    assert_eq!(log.log_end_offset(), model.log_end_offset);
    let all: Vec<u8> = model
        .batches
        .iter()
        .flat_map(|b| b.2.iter().copied())
        .collect();
    assert_eq!(read_all(log), all);
    // The epoch cache: the first batch of each epoch among the batches left.
    let mut expected: Vec<(i32, i64)> = Vec::new();
    for (base_offset, _, bytes) in &model.batches {
        let epoch = i32::from_be_bytes(bytes[12..16].try_into().unwrap());
        if expected.last().is_none_or(|last| epoch > last.0) {
            expected.push((epoch, *base_offset));
        }
    }
    let cached: Vec<(i32, i64)> = log
        .epochs
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect();
    if model.batches.is_empty() {
        // Retention that deleted every batch leaves the latest epoch at the new log start
        // (= LEO) until the next open drops it.
        assert!(
            cached.is_empty() || cached == [(model.leader_epoch, model.log_end_offset)],
            "{cached:?} for an empty log"
        );
    } else {
        assert_eq!(cached, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config(700);
        config.index_interval_bytes = 64;
        let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
        let mut model = Model { batches: Vec::new(), log_start_offset: 0, log_end_offset: 0, leader_epoch: 0 };
        for op in ops {
            match op {
                Op::Append { records, ts, epoch_bump } => {
                    model.leader_epoch += epoch_bump;
                    let (info, bytes) = append_in_epoch(&mut log, batch(records, ts), model.leader_epoch);
                    prop_assert_eq!(info.base_offset, model.log_end_offset);
                    model.log_end_offset = info.last_offset + 1;
                    model.batches.push((info.base_offset, info.last_offset, bytes));
                }
                Op::Read { pick, max_bytes, hw_back } => {
                    let span = (model.log_end_offset - model.log_start_offset + 1) as usize;
                    let offset = model.log_start_offset + (pick % span) as i64;
                    let hw = model.log_end_offset - hw_back;
                    let r = log.read(offset, max_bytes, hw).unwrap();
                    let got = batches_of(&r.bytes);
                    let first = model.batches.iter().position(|b| b.1 >= offset);
                    match first {
                        Some(i) if model.batches[i].1 < hw => {
                            prop_assert!(!got.is_empty());
                            prop_assert_eq!(got[0], (model.batches[i].0, model.batches[i].1));
                            prop_assert!(got.len() == 1 || r.bytes.len() <= max_bytes);
                            for (k, g) in got.iter().enumerate() {
                                let m = &model.batches[i + k];
                                prop_assert_eq!(*g, (m.0, m.1));
                                prop_assert!(m.1 < hw);
                            }
                        }
                        _ => prop_assert!(got.is_empty()),
                    }
                }
                Op::Reopen => {
                    drop(log);
                    log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
                }
                Op::RetainBytes { limit } => {
                    let mut retain = config.clone();
                    retain.retention_bytes = limit;
                    drop(log);
                    log = PartitionLog::open(dir.path(), retain, NOW_MS).unwrap();
                    log.apply_retention(NOW_MS).unwrap();
                    let start = log.log_start_offset();
                    prop_assert!(start >= model.log_start_offset);
                    prop_assert!(start == model.log_end_offset || model.batches.iter().any(|b| b.0 == start));
                    model.batches.retain(|b| b.0 >= start);
                    model.log_start_offset = start;
                    drop(log);
                    log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
                }
                Op::CutTail { bytes } => {
                    drop(log);
                    let path = last_log_file(dir.path());
                    let len = std::fs::metadata(&path).unwrap().len();
                    let cut = bytes.min(len);
                    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                    file.set_len(len - cut).unwrap();
                    drop(file);
                    let base: i64 = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                    // Batches of the last file that still end within it survive.
                    let mut end = 0u64;
                    let new_len = len - cut;
                    model.batches.retain(|b| {
                        if b.0 < base { return true; }
                        end += b.2.len() as u64;
                        end <= new_len
                    });
                    model.log_end_offset = model.batches.last().map_or(base.max(model.log_start_offset), |b| (b.1 + 1).max(base));
                    log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
                }
                Op::TruncateTo { pick } => {
                    let span = (model.log_end_offset - model.log_start_offset + 1) as usize;
                    let offset = model.log_start_offset + (pick % span) as i64;
                    log.truncate_to(offset, NOW_MS).unwrap();
                    if offset <= model.log_start_offset {
                        model.batches.clear();
                        model.log_start_offset = offset;
                        model.log_end_offset = offset;
                    } else if offset < model.log_end_offset {
                        model.batches.retain(|b| b.1 < offset);
                        model.log_end_offset = model.batches.last().map_or(model.log_start_offset, |b| b.1 + 1);
                    }
                }
            }
            check_against_model(&log, &model);
        }
    }
}

#[test]
fn set_config_applies_to_later_rolls_and_retention_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 30), NOW_MS).unwrap();
    for i in 0..20 {
        append(&mut log, batch(3, NOW_MS + i));
    }
    assert_eq!(log.segment_count(), 1);
    let size = log.size_bytes();
    // An invalid config is refused and the old one stays.
    assert!(matches!(
        log.set_config(small_config(0)),
        Err(LogError::InvalidConfig { .. })
    ));
    assert_eq!(log.config().segment_bytes, 1 << 30);
    // Smaller segments and a byte retention: nothing is rewritten at once...
    let mut smaller = small_config(1_000);
    smaller.retention_bytes = 2_500;
    log.set_config(smaller.clone()).unwrap();
    assert_eq!(log.config(), &smaller);
    assert_eq!((log.segment_count(), log.size_bytes()), (1, size));
    // ...later appends roll at the new size and retention follows the new limit.
    for i in 0..40 {
        append(&mut log, batch(3, NOW_MS + 100 + i));
    }
    assert!(log.segment_count() > 3, "segments: {}", log.segment_count());
    assert!(log.apply_retention(NOW_MS).unwrap() > 0);
    assert!(log.size_bytes() <= 2_500 + 1_000);
}

// ---------------------------------------------------------------------------------------
// Compaction (`compact.rs`): what a consumer reading from the log start sees afterwards.

use kafka_protocol::records::{
    Compression as Codec, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType as RecordTimestampType,
};

/// A record a consumer sees: (offset, key, value); `None` value = tombstone.
type Seen = (i64, Option<String>, Option<String>);

/// A batch of `(key, value)` records (None = null) with timestamps `ts`, as a client
/// would encode it with `codec`.
fn keyed_batch(records: &[(Option<&str>, Option<&str>)], ts: i64, codec: Codec) -> ValidatedBatch {
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: RecordTimestampType::Creation,
            offset: i as i64,
            sequence: i as i32 - 1,
            timestamp: ts,
            key: k.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .unwrap();
    validate(buf.freeze()).expect("encoded batch is valid")
}

fn text(b: &Option<Bytes>) -> Option<String> {
    b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
}

/// Every record from the log start, decoded by kafka-protocol as a consumer would.
fn consume(log: &PartitionLog) -> Vec<Seen> {
    let mut bytes = Bytes::from(read_all(log));
    RecordBatchDecoder::decode_all(&mut bytes)
        .expect("stored batches decode")
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| (r.offset, text(&r.key), text(&r.value)))
        .collect()
}

fn compact_config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        cleanup_policy: CleanupPolicy {
            delete: false,
            compact: true,
        },
        min_cleanable_dirty_ratio: 0.0,
        ..small_config(segment_bytes)
    }
}

/// key → (offset, value) of the latest record of each key.
fn latest_by_key(records: &[Seen]) -> std::collections::BTreeMap<String, (i64, Option<String>)> {
    let mut latest = std::collections::BTreeMap::new();
    for (offset, key, value) in records {
        if let Some(key) = key {
            latest.insert(key.clone(), (*offset, value.clone()));
        }
    }
    latest
}

/// Ten rounds of values for keys k0..k4, then a few records in the active segment.
fn fill_rounds(log: &mut PartitionLog) {
    for round in 0..10 {
        let values: Vec<String> = (0..5).map(|k| format!("r{round}-k{k}")).collect();
        let keys: Vec<String> = (0..5).map(|k| format!("k{k}")).collect();
        let records: Vec<(Option<&str>, Option<&str>)> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
            .collect();
        append(log, keyed_batch(&records, NOW_MS + round, Codec::None));
    }
}

#[test]
fn compaction_keeps_the_latest_value_per_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config(400);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    fill_rounds(&mut log);
    append(
        &mut log,
        keyed_batch(&[(Some("k0"), Some("active"))], NOW_MS + 50, Codec::None),
    );
    assert!(log.segment_count() > 3, "several closed segments");
    let before = consume(&log);
    let (start, leo) = (log.log_start_offset(), log.log_end_offset());
    let active_base = log.segments.last().unwrap().base_offset;
    let active_before = log.read(active_base, 1 << 20, i64::MAX).unwrap().bytes;

    let stats = log.compact(NOW_MS + 100).unwrap();
    assert!(stats.cleaned, "{stats:?}");
    assert!(
        stats.records_removed > 0 && stats.bytes_removed() > 0,
        "{stats:?}"
    );
    assert_eq!(stats.first_dirty_offset, active_base);
    let after = consume(&log);

    // Survivors are records of the original log, at their original offsets, increasing.
    for record in &after {
        assert!(before.contains(record), "{record:?} was never written");
    }
    assert!(after.windows(2).all(|w| w[0].0 < w[1].0), "{after:?}");
    // Nothing a consumer cares about is lost: the latest value of each key is there.
    assert_eq!(latest_by_key(&after), latest_by_key(&before));
    // Below the active segment only latest values remain (k0's is in the active segment).
    let latest = latest_by_key(&before);
    for (offset, key, _) in after.iter().filter(|r| r.0 < active_base) {
        assert_eq!(
            latest[key.as_ref().unwrap()].0,
            *offset,
            "{key:?} at {offset}"
        );
    }
    assert!(!after
        .iter()
        .any(|r| r.1.as_deref() == Some("k0") && r.0 < active_base));
    // The active segment, the log start and the log end are untouched.
    assert_eq!(
        log.read(active_base, 1 << 20, i64::MAX).unwrap().bytes,
        active_before
    );
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (start, leo));
    // Every offset still reads: an offset in a gap gives the next batch after it.
    for offset in start..leo {
        let r = log.read(offset, 1, i64::MAX).unwrap();
        let batches = batches_of(&r.bytes);
        assert!(batches[0].1 >= offset, "read at {offset} gave {batches:?}");
    }
    // Nothing more is dirty: a second run does nothing.
    assert!(!log.compact(NOW_MS + 200).unwrap().cleaned);
    // Reopening reads the same records and keeps the checkpoint.
    drop(log);
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(consume(&log), after);
    assert_eq!(log.first_dirty_offset(), active_base);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (start, leo));
}

#[test]
fn compaction_waits_for_the_dirty_ratio_and_the_compaction_lag() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = compact_config(400);
    config.min_cleanable_dirty_ratio = 0.5;
    config.min_compaction_lag_ms = 60_000;
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    fill_rounds(&mut log);
    // Push the last round out of the active segment, so compaction leaves clean bytes.
    let other = "o".repeat(350);
    append(
        &mut log,
        keyed_batch(
            &[(Some("other"), Some(other.as_str()))],
            NOW_MS,
            Codec::None,
        ),
    );
    // Everything is newer than the lag: nothing is cleanable yet (KIP-58).
    let stats = log.compact(NOW_MS + 1_000).unwrap();
    assert!(!stats.cleaned && stats.dirty_ratio == 0.0, "{stats:?}");
    let stats = log.compact(NOW_MS + 120_000).unwrap();
    assert!(stats.cleaned && stats.dirty_ratio == 1.0, "{stats:?}");
    // New dirty data: cleaned only once dirty / (clean + dirty) reaches the ratio.
    for i in 0..8 {
        let v = "z".repeat(100);
        append(
            &mut log,
            keyed_batch(&[(Some("k2"), Some(v.as_str()))], NOW_MS + i, Codec::None),
        );
    }
    config.min_cleanable_dirty_ratio = 1.0;
    log.set_config(config.clone()).unwrap();
    let stats = log.compact(NOW_MS + 120_000).unwrap();
    assert!(!stats.cleaned, "{stats:?}");
    assert!(
        stats.dirty_ratio > 0.0 && stats.dirty_ratio < 1.0,
        "{stats:?}"
    );
    config.min_cleanable_dirty_ratio = stats.dirty_ratio;
    log.set_config(config).unwrap();
    let stats = log.compact(NOW_MS + 120_000).unwrap();
    assert!(stats.cleaned, "{stats:?}");
    let seen = consume(&log);
    let k2 = seen.iter().filter(|r| r.1.as_deref() == Some("k2")).count();
    assert!(
        k2 <= 2,
        "one k2 below the checkpoint, one in the active segment: {seen:?}"
    );
}

#[test]
fn tombstones_go_only_after_delete_retention_and_keyless_records_go_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = compact_config(300);
    config.delete_retention_ms = 60_000;
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    append(
        &mut log,
        keyed_batch(
            &[
                (Some("gone"), Some("v1")),
                (None, Some("no key")),
                (Some("kept"), Some("v")),
            ],
            NOW_MS,
            Codec::None,
        ),
    );
    append(
        &mut log,
        keyed_batch(&[(Some("gone"), None)], NOW_MS, Codec::None),
    );
    let filler = "f".repeat(300);
    append(
        &mut log,
        keyed_batch(
            &[(Some("filler"), Some(filler.as_str()))],
            NOW_MS,
            Codec::None,
        ),
    );
    append(
        &mut log,
        keyed_batch(&[(Some("a"), Some("1"))], NOW_MS, Codec::None),
    );
    assert!(log.segment_count() >= 3);

    log.compact(NOW_MS + 1_000).unwrap();
    let seen = consume(&log);
    assert_eq!(
        seen,
        vec![
            (2, Some("kept".into()), Some("v".into())),
            (3, Some("gone".into()), None),
            (4, Some("filler".into()), Some(filler.clone())),
            (5, Some("a".into()), Some("1".into())),
        ]
    );
    // Past delete.retention.ms the tombstone goes too, at the next run (new dirty data).
    let more = "m".repeat(300);
    append(
        &mut log,
        keyed_batch(&[(Some("b"), Some(more.as_str()))], NOW_MS, Codec::None),
    );
    append(
        &mut log,
        keyed_batch(&[(Some("c"), Some("3"))], NOW_MS, Codec::None),
    );
    let stats = log.compact(NOW_MS + 61_000).unwrap();
    assert!(stats.cleaned, "{stats:?}");
    let seen = consume(&log);
    assert!(
        !seen.iter().any(|r| r.1.as_deref() == Some("gone")),
        "{seen:?}"
    );
    assert_eq!(seen[0], (2, Some("kept".into()), Some("v".into())));
}

#[test]
fn compressed_batches_are_compacted_and_rewritten_uncompressed() {
    for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        // Every batch gets a segment of its own.
        let mut log = PartitionLog::open(dir.path(), compact_config(50), NOW_MS).unwrap();
        let partly = keyed_batch(
            &[
                (Some("k1"), Some("a")),
                (Some("k2"), Some("b")),
                (Some("k1"), Some("c")),
            ],
            NOW_MS,
            codec,
        );
        append(&mut log, partly);
        let whole = keyed_batch(
            &[(Some("k3"), Some("d")), (Some("k4"), Some("e"))],
            NOW_MS,
            codec,
        );
        let (_, whole_stored) = append(&mut log, whole);
        let pad = "p".repeat(200);
        append(
            &mut log,
            keyed_batch(&[(Some("k5"), Some(pad.as_str()))], NOW_MS, codec),
        );
        assert_eq!(log.segment_count(), 3, "{codec:?}");

        let stats = log.compact(NOW_MS).unwrap();
        assert_eq!(stats.records_removed, 1, "{codec:?} {stats:?}");
        let bytes = Bytes::from(read_all(&log));
        let stored: Vec<ValidatedBatch> = {
            let mut out = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize
                    + LOG_OVERHEAD_BYTES;
                out.push(validate_stored(bytes.slice(at..at + len), at).unwrap());
                at += len;
            }
            out
        };
        // The partly kept batch: same offsets, uncompressed, two records.
        assert_eq!(stored[0].base_offset(), 0);
        assert_eq!(stored[0].last_offset(), 2);
        assert_eq!(stored[0].compression(), Compression::None);
        assert_eq!(stored[0].record_count(), 2);
        // A batch that keeps every record is stored byte for byte, still compressed.
        assert_eq!(stored[1].to_bytes(), whole_stored, "{codec:?}");
        assert_eq!(
            consume(&log)[..4],
            [
                (1, Some("k2".into()), Some("b".into())),
                (2, Some("k1".into()), Some("c".into())),
                (3, Some("k3".into()), Some("d".into())),
                (4, Some("k4".into()), Some("e".into())),
            ]
        );
    }
}

#[test]
fn emptied_segments_leave_a_gap_and_the_log_start_stays() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = compact_config(200);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    let big = "v".repeat(200);
    for _ in 0..5 {
        append(
            &mut log,
            keyed_batch(&[(Some("k"), Some(big.as_str()))], NOW_MS, Codec::None),
        );
    }
    append(
        &mut log,
        keyed_batch(&[(Some("k"), Some("last"))], NOW_MS, Codec::None),
    );
    assert_eq!(log.segment_count(), 6);
    let stats = log.compact(NOW_MS).unwrap();
    // Every closed record is superseded by the one in the active segment: the first
    // segment stays (empty), the four after it go.
    assert_eq!(
        (stats.segments_rewritten, stats.segments_deleted),
        (1, 4),
        "{stats:?}"
    );
    assert_eq!(log.segment_count(), 2);
    assert_eq!(log.log_start_offset(), 0);
    let r = log.read(0, 1, i64::MAX).unwrap();
    assert_eq!(r.first_batch_base_offset, Some(5));
    assert_eq!(
        consume(&log),
        vec![(5, Some("k".into()), Some("last".into()))]
    );
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(log.segment_count(), 2);
    assert_eq!(
        log.read(0, 1, i64::MAX).unwrap().first_batch_base_offset,
        Some(5)
    );
    // With `delete` added, time retention is not blocked by the emptied first segment.
    config.cleanup_policy.delete = true;
    config.retention_ms = 1_000;
    log.set_config(config).unwrap();
    let deleted = log.apply_retention(NOW_MS + 10_000).unwrap();
    assert_eq!(deleted, 2);
    assert_eq!(log.log_start_offset(), 6);
}

#[test]
fn cleanup_policy_decides_whether_retention_deletes() {
    for (delete, compact) in [(false, true), (true, true), (true, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = compact_config(300);
        config.cleanup_policy = CleanupPolicy { delete, compact };
        config.retention_ms = 1_000;
        config.retention_bytes = 100;
        let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
        fill_rounds(&mut log);
        let before = log.segment_count();
        let stats = log.compact(NOW_MS).unwrap();
        assert_eq!(stats.cleaned, compact, "{delete} {compact}");
        let deleted = log.apply_retention(NOW_MS + 10_000).unwrap();
        if delete {
            assert!(
                deleted > 0 && log.log_start_offset() > 0,
                "{delete} {compact}"
            );
        } else {
            // compact alone: never deleted by time or size (Kafka).
            assert_eq!(deleted, 0);
            assert_eq!(log.log_start_offset(), 0);
            assert!(log.segment_count() <= before);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_crash_before_or_during_the_swap_recovers_a_consistent_log() {
    let original = tempfile::tempdir().unwrap();
    let config = compact_config(400);
    let mut log = PartitionLog::open(original.path(), config.clone(), NOW_MS).unwrap();
    fill_rounds(&mut log);
    let before = consume(&log);
    drop(log);
    // Crash image 1: the compacted copy of segment 0 written (`.cleaned`), not swapped.
    let compacted = tempfile::tempdir().unwrap();
    copy_dir(original.path(), compacted.path());
    let mut log = PartitionLog::open(compacted.path(), config.clone(), NOW_MS).unwrap();
    log.compact(NOW_MS).unwrap();
    let after = consume(&log);
    drop(log);
    let crashed = tempfile::tempdir().unwrap();
    copy_dir(original.path(), crashed.path());
    let segment0 = super::segment::file_path(crashed.path(), 0, "log");
    let cleaned = crashed.path().join("00000000000000000000.log.cleaned");
    std::fs::copy(
        super::segment::file_path(compacted.path(), 0, "log"),
        &cleaned,
    )
    .unwrap();
    std::fs::write(
        crashed.path().join("00000000000000000000.log.swap"),
        b"junk",
    )
    .unwrap();
    let log = PartitionLog::open(crashed.path(), config.clone(), NOW_MS).unwrap();
    assert!(!cleaned.exists(), "leftover .cleaned removed on open");
    assert_eq!(consume(&log), before);
    drop(log);
    // Crash image 2: the swap renamed segment 0's copy in, its indexes not yet rebuilt.
    std::fs::copy(
        super::segment::file_path(compacted.path(), 0, "log"),
        &segment0,
    )
    .unwrap();
    for extension in ["index", "timeindex"] {
        std::fs::remove_file(super::segment::file_path(crashed.path(), 0, extension)).unwrap();
    }
    let (log, warnings) =
        with_warnings(|| PartitionLog::open(crashed.path(), config.clone(), NOW_MS).unwrap());
    assert!(
        warnings.iter().any(|w| w.contains("rebuilding")),
        "{warnings:?}"
    );
    let partly = consume(&log);
    assert_eq!(latest_by_key(&partly), latest_by_key(&before));
    // Finishing the compaction gives what an uninterrupted one gave.
    let mut log = log;
    log.compact(NOW_MS).unwrap();
    assert_eq!(consume(&log), after);
}

#[test]
fn corrupt_data_aborts_compaction_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config(400);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    fill_rounds(&mut log);
    drop(log);
    // Flip a byte inside the records of the second segment (its CRC no longer matches).
    let mut logs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let mut bytes = std::fs::read(&logs[1]).unwrap();
    bytes[70] ^= 0xff;
    std::fs::write(&logs[1], &bytes).unwrap();
    let snapshot = |dir: &Path| -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
            .collect();
        files.sort();
        files
    };
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    let before = snapshot(dir.path());
    match log.compact(NOW_MS) {
        Err(LogError::Corrupt { path, .. }) => assert_eq!(path, logs[1]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(snapshot(dir.path()), before, "no log file changed");
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .to_string_lossy()
                .ends_with(".cleaned")
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[derive(Debug, Clone)]
enum CompactOp {
    /// Keys from a small set; `None` value = tombstone.
    Append(Vec<(u8, Option<u8>)>, bool),
    Compact,
    Reopen,
}

fn compact_op() -> impl Strategy<Value = CompactOp> {
    let record = (0u8..6, proptest::option::weighted(0.85, any::<u8>()));
    prop_oneof![
        6 => (proptest::collection::vec(record, 1..5), any::<bool>())
            .prop_map(|(records, gzip)| CompactOp::Append(records, gzip)),
        2 => Just(CompactOp::Compact),
        1 => Just(CompactOp::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Against a model (every record ever appended): compaction keeps a subset at the same
    /// offsets, never changes the latest value of a key (tombstones are kept: the default
    /// delete.retention.ms is a day), and leaves only latest values below its checkpoint.
    #[test]
    fn compaction_matches_a_last_write_wins_model(ops in proptest::collection::vec(compact_op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let config = compact_config(300);
        let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
        let mut model: Vec<Seen> = Vec::new();
        for op in ops {
            match op {
                CompactOp::Append(records, gzip) => {
                    let owned: Vec<(String, Option<String>)> = records
                        .iter()
                        .map(|(k, v)| (format!("k{k}"), v.map(|v| format!("v{v}"))))
                        .collect();
                    let refs: Vec<(Option<&str>, Option<&str>)> = owned
                        .iter()
                        .map(|(k, v)| (Some(k.as_str()), v.as_deref()))
                        .collect();
                    let codec = if gzip { Codec::Gzip } else { Codec::None };
                    let (info, _) = append(&mut log, keyed_batch(&refs, NOW_MS, codec));
                    for (i, (k, v)) in owned.into_iter().enumerate() {
                        model.push((info.base_offset + i as i64, Some(k), v));
                    }
                }
                CompactOp::Compact => {
                    let stats = log.compact(NOW_MS).unwrap();
                    if stats.cleaned {
                        let seen = consume(&log);
                        let latest = latest_by_key(&model);
                        for (offset, key, _) in seen.iter().filter(|r| r.0 < stats.first_dirty_offset) {
                            prop_assert_eq!(latest[key.as_ref().unwrap()].0, *offset);
                        }
                    }
                }
                CompactOp::Reopen => {
                    drop(log);
                    log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
                }
            }
            let seen = consume(&log);
            for record in &seen {
                prop_assert!(model.contains(record), "{:?} never written", record);
            }
            prop_assert!(seen.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert_eq!(latest_by_key(&seen), latest_by_key(&model));
            prop_assert_eq!(log.log_end_offset(), model.len() as i64);
            prop_assert_eq!(log.log_start_offset(), 0);
        }
    }
}

// Compaction in three steps (plan under the lock, prepare without it, install under it).

/// Names of the cleaner's files (`*.cleaned`) in `dir`.
fn cleaned_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cleaned"))
        .collect();
    names.sort();
    names
}

#[test]
fn install_is_refused_when_retention_deleted_a_planned_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = compact_config(400);
    config.cleanup_policy.delete = true;
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    fill_rounds(&mut log);
    let plan = log.plan_compaction(NOW_MS);
    assert!(plan.is_due());
    let prepared = plan.prepare(&mut CleanerThrottle::unlimited()).unwrap();
    assert!(
        cleaned_files(dir.path())
            .iter()
            .any(|n| n.ends_with(".log.cleaned")),
        "the copies are on disk before the install"
    );
    // Retention deletes the oldest (planned) segment between prepare and install.
    config.retention_bytes = (log.size_bytes() - log.segments[0].size_bytes) as i64;
    log.set_config(config.clone()).unwrap();
    assert_eq!(log.apply_retention(NOW_MS).unwrap(), 1);
    let after_retention = consume(&log);
    let start = log.log_start_offset();
    assert!(start > 0);

    let stats = log.install_compaction(prepared).unwrap();
    assert!(!stats.cleaned && stats.discarded, "{stats:?}");
    assert_eq!(
        consume(&log),
        after_retention,
        "nothing but retention's segment went"
    );
    assert_eq!(cleaned_files(dir.path()), Vec::<String>::new());
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(consume(&log), after_retention);
    // The next run compacts what retention left.
    let stats = log.compact(NOW_MS).unwrap();
    assert!(stats.cleaned && !stats.discarded, "{stats:?}");
    assert_eq!(
        latest_by_key(&consume(&log)),
        latest_by_key(&after_retention)
    );
    assert_eq!(log.log_start_offset(), start);
}

#[test]
fn install_is_refused_after_a_truncation_below_the_planned_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), compact_config(400), NOW_MS).unwrap();
    fill_rounds(&mut log);
    let plan = log.plan_compaction(NOW_MS);
    let prepared = plan.prepare(&mut CleanerThrottle::unlimited()).unwrap();
    // A follower's truncation cuts the records the offset map saw last: the map may have
    // removed older values because of records that no longer exist.
    let leo = log.log_end_offset();
    log.truncate_to(leo - 3, NOW_MS).unwrap();
    let before = consume(&log);
    let stats = log.install_compaction(prepared).unwrap();
    assert!(stats.discarded && !stats.cleaned, "{stats:?}");
    assert_eq!(consume(&log), before);
    assert_eq!(cleaned_files(dir.path()), Vec::<String>::new());
}

#[test]
fn readers_and_appends_go_on_during_prepare_and_see_consistent_data() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::RwLock;

    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), compact_config(400), NOW_MS).unwrap();
    fill_rounds(&mut log);
    let before = consume(&log);
    let log = RwLock::new(log);
    let plan = log.write().unwrap().plan_compaction(NOW_MS);
    assert!(plan.is_due());
    // The plan's segments hold ~3 KB: read twice at 6 KB/s, the prepare takes ~1 s.
    let mut throttle = CleanerThrottle::new(6_000.0);
    let preparing = AtomicBool::new(true);
    let reads_during_prepare = AtomicUsize::new(0);
    let appended: RwLock<Vec<Seen>> = RwLock::new(Vec::new());
    let prepared = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while preparing.load(Ordering::SeqCst) {
                    let (seen, appended_then) = {
                        let log = log.read().unwrap();
                        (consume(&log), appended.read().unwrap().clone())
                    };
                    // What a reader sees under the shared lock is the log as written:
                    // the records from before the plan, then the appends so far.
                    let (old, new) = seen.split_at(before.len().min(seen.len()));
                    assert_eq!(old, &before[..]);
                    assert_eq!(new, &appended_then[..new.len()]);
                    assert_eq!(new.len(), appended_then.len());
                    reads_during_prepare.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        // A producer appends (rolling segments) while the copies are prepared.
        s.spawn(|| {
            for i in 0..6 {
                if !preparing.load(Ordering::SeqCst) {
                    break;
                }
                let key = format!("k{}", i % 5);
                let value = format!("during-{i}-{}", "v".repeat(100));
                let mut log = log.write().unwrap();
                let mut appended = appended.write().unwrap();
                let (info, _) = append(
                    &mut log,
                    keyed_batch(&[(Some(&key), Some(&value))], NOW_MS + 20, Codec::None),
                );
                appended.push((info.base_offset, Some(key), Some(value)));
                drop((log, appended));
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        let prepared = plan.prepare(&mut throttle).unwrap();
        preparing.store(false, Ordering::SeqCst);
        prepared
    });
    assert!(
        reads_during_prepare.load(Ordering::SeqCst) > 0,
        "readers ran during the prepare"
    );
    let appended = appended.into_inner().unwrap();
    assert!(!appended.is_empty(), "appends ran during the prepare");
    let mut log = log.into_inner().unwrap();
    let stats = log.install_compaction(prepared).unwrap();
    assert!(
        stats.cleaned,
        "appends and rolls do not spoil the plan: {stats:?}"
    );
    let model: Vec<Seen> = before.iter().chain(&appended).cloned().collect();
    let after = consume(&log);
    for record in &after {
        assert!(model.contains(record), "{record:?} never written");
    }
    assert_eq!(latest_by_key(&after), latest_by_key(&model));
    assert_eq!(log.log_end_offset(), model.last().unwrap().0 + 1);
}

// ---- Leader epochs (KIP-101, KIP-279) and the follower's append ----

fn epoch_pairs(log: &PartitionLog) -> Vec<(i32, i64)> {
    log.epochs
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect()
}

fn end(leader_epoch: i32, end_offset: i64) -> EpochEndOffset {
    EpochEndOffset {
        leader_epoch,
        end_offset,
    }
}

/// Epochs 1 (offsets 0..6), 3 (6..12), 5 (12..15), batches of 3 records; with
/// `small_config(350)` three batches to a segment.
fn log_with_epochs(dir: &Path, config: LogConfig) -> PartitionLog {
    let mut log = PartitionLog::open(dir, config, NOW_MS).unwrap();
    for (epoch, count) in [(1, 2), (3, 2), (5, 1)] {
        for _ in 0..count {
            append_in_epoch(&mut log, batch(3, NOW_MS), epoch);
        }
    }
    log
}

#[test]
fn epochs_follow_appends_and_answer_offsets_for_leader_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    assert_eq!(log.latest_epoch(), None);
    assert_eq!(log.end_offset_for_epoch(0), EpochEndOffset::UNDEFINED);
    // A negative epoch (a batch no leader stamped) is not an epoch.
    append_in_epoch(&mut log, batch(2, NOW_MS), -1);
    assert_eq!(log.latest_epoch(), None);
    for (epoch, count) in [(1, 2), (3, 2), (2, 1), (5, 1)] {
        for _ in 0..count {
            append_in_epoch(&mut log, batch(3, NOW_MS), epoch);
        }
    }
    // The epoch 2 batch at 14 came after epoch 3: not a new epoch.
    assert_eq!(epoch_pairs(&log), vec![(1, 2), (3, 8), (5, 17)]);
    assert_eq!(log.latest_epoch(), Some(5));
    assert_eq!(log.log_end_offset(), 20);
    assert_eq!(log.end_offset_for_epoch(5), end(5, 20));
    assert_eq!(log.end_offset_for_epoch(3), end(3, 17));
    assert_eq!(log.end_offset_for_epoch(4), end(3, 17));
    assert_eq!(log.end_offset_for_epoch(2), end(1, 8));
    assert_eq!(log.end_offset_for_epoch(1), end(1, 8));
    assert_eq!(log.end_offset_for_epoch(0), end(0, 2));
    assert_eq!(log.end_offset_for_epoch(6), EpochEndOffset::UNDEFINED);
    assert_eq!(log.end_offset_for_epoch(-1), EpochEndOffset::UNDEFINED);
    // Becoming leader of epoch 7 before appending anything: epoch 5 now has an end.
    log.assign_epoch_start_offset(7).unwrap();
    assert_eq!(log.end_offset_for_epoch(5), end(5, 20));
    assert_eq!(log.end_offset_for_epoch(6), end(5, 20));
    assert_eq!(log.end_offset_for_epoch(7), end(7, 20));
    // A stale (older) leader epoch changes nothing.
    log.assign_epoch_start_offset(6).unwrap();
    assert_eq!(log.latest_epoch(), Some(7));
}

#[test]
fn epochs_persist_across_reopen_in_kafkas_format() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(350);
    let log = log_with_epochs(dir.path(), config.clone());
    assert!(log.segment_count() > 1);
    let checkpoint = dir.path().join("leader-epoch-checkpoint");
    assert_eq!(
        std::fs::read_to_string(&checkpoint).unwrap(),
        "0\n3\n1 0\n3 6\n5 12\n"
    );
    drop(log);
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), vec![(1, 0), (3, 6), (5, 12)]);
    assert_eq!(log.end_offset_for_epoch(3), end(3, 12));
}

#[test]
fn a_missing_or_unparsable_checkpoint_is_rebuilt_from_the_batch_headers() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(350);
    let log = log_with_epochs(dir.path(), config.clone());
    let expected = epoch_pairs(&log);
    drop(log);
    let checkpoint = dir.path().join("leader-epoch-checkpoint");
    let written = std::fs::read_to_string(&checkpoint).unwrap();
    // Missing: a log written before epochs were kept.
    std::fs::remove_file(&checkpoint).unwrap();
    let log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), expected);
    assert_eq!(std::fs::read_to_string(&checkpoint).unwrap(), written);
    drop(log);
    // Garbage: rebuilt too, with a warning.
    std::fs::write(&checkpoint, "0\n7\n1 0\n").unwrap();
    let (log, warnings) = with_warnings(|| PartitionLog::open(dir.path(), config, NOW_MS));
    assert_eq!(epoch_pairs(&log.unwrap()), expected);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("leader epoch checkpoint")),
        "{warnings:?}"
    );
    // An empty log without a checkpoint writes none.
    let empty = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(empty.path(), small_config(600), NOW_MS).unwrap();
    assert_eq!(log.latest_epoch(), None);
    assert!(!empty.path().join("leader-epoch-checkpoint").exists());
}

#[test]
fn open_repairs_a_checkpoint_ahead_of_or_behind_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(1 << 20);
    let log = log_with_epochs(dir.path(), config.clone());
    drop(log);
    let checkpoint = dir.path().join("leader-epoch-checkpoint");
    // Ahead: an epoch assigned before a batch that a crash lost (LEO is 15).
    std::fs::write(&checkpoint, "0\n4\n1 0\n3 6\n5 12\n6 15\n").unwrap();
    let log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), vec![(1, 0), (3, 6), (5, 12)]);
    drop(log);
    // Behind: the write of epoch 5's entry failed; the active segment's headers add it.
    std::fs::write(&checkpoint, "0\n2\n1 0\n3 6\n").unwrap();
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), vec![(1, 0), (3, 6), (5, 12)]);
    assert_eq!(
        std::fs::read_to_string(&checkpoint).unwrap(),
        "0\n3\n1 0\n3 6\n5 12\n"
    );
}

#[test]
fn truncation_and_retention_trim_the_epoch_cache() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(350);
    let mut log = log_with_epochs(dir.path(), config.clone());
    // Offset 13 is inside epoch 5's only batch [12, 14]: the batch and the epoch go.
    log.truncate_to(13, NOW_MS).unwrap();
    assert_eq!(log.log_end_offset(), 12);
    assert_eq!(epoch_pairs(&log), vec![(1, 0), (3, 6)]);
    assert_eq!(log.end_offset_for_epoch(3), end(3, 12));
    log.truncate_to(9, NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), vec![(1, 0), (3, 6)]);
    // Offset 7 is inside epoch 3's first batch [6, 8]: the LEO ends at 6, epoch 3 goes.
    log.truncate_to(7, NOW_MS).unwrap();
    assert_eq!(log.log_end_offset(), 6);
    assert_eq!(epoch_pairs(&log), vec![(1, 0)]);
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), vec![(1, 0)]);
    // Emptying the log empties the cache.
    log.truncate_to(0, NOW_MS).unwrap();
    assert_eq!(log.latest_epoch(), None);
    drop(log);

    // Retention: the entry spanning the new log start starts there (truncateFromStart).
    let dir = tempfile::tempdir().unwrap();
    let mut log = log_with_epochs(dir.path(), config.clone());
    let mut retain = config.clone();
    retain.retention_bytes = 1; // all but the active segment
    log.set_config(retain).unwrap();
    assert!(log.apply_retention(NOW_MS).unwrap() > 0);
    let start = log.log_start_offset();
    assert!(start > 0 && start < 12, "log start {start}");
    let first_epoch = if start < 6 { 1 } else { 3 };
    let mut expected = vec![(first_epoch, start)];
    expected.extend([(3, 6), (5, 12)].into_iter().filter(|e| e.1 > start));
    assert_eq!(epoch_pairs(&log), expected);
    drop(log);
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(epoch_pairs(&log), expected);
    // An epoch older than any left: its end is where the history left starts.
    assert_eq!(log.end_offset_for_epoch(0), end(0, start));
}

/// The leader's stored bytes from `offset`, as a Fetch response would carry them.
fn fetched(log: &PartitionLog, offset: i64) -> Vec<ValidatedBatch> {
    let mut bytes = Vec::new();
    let mut at = offset;
    while at < log.log_end_offset() {
        let r = log.read(at, 1 << 20, i64::MAX).unwrap();
        at = batches_of(&r.bytes).last().unwrap().1 + 1;
        bytes.extend_from_slice(&r.bytes);
    }
    split_fetched(Bytes::from(bytes)).unwrap()
}

#[test]
fn follower_append_keeps_offsets_epochs_and_bytes() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let config = small_config(350);
    let mut leader = log_with_epochs(leader_dir.path(), config.clone());
    let options = AppendOptions {
        log_append_time_ms: Some(NOW_MS + 5),
        leader_epoch: 5,
    };
    leader.append(batch(2, NOW_MS), options, NOW_MS).unwrap();
    let mut follower = PartitionLog::open(follower_dir.path(), config.clone(), NOW_MS).unwrap();
    for b in fetched(&leader, 0) {
        let (base_offset, last_offset) = (b.base_offset(), b.last_offset());
        let info = follower.append_as_follower(b, NOW_MS + 60_000).unwrap();
        assert_eq!(
            (info.base_offset, info.last_offset),
            (base_offset, last_offset)
        );
        assert!(!info.duplicate);
    }
    assert_eq!(read_all(&follower), read_all(&leader));
    assert_eq!(follower.log_end_offset(), 17);
    assert_eq!(follower.segment_count(), leader.segment_count());
    assert_eq!(epoch_pairs(&follower), epoch_pairs(&leader));
    for epoch in -1..7 {
        assert_eq!(
            follower.end_offset_for_epoch(epoch),
            leader.end_offset_for_epoch(epoch)
        );
    }
    // The LogAppendTime batch kept the leader's time.
    let last = fetched(&follower, 15).pop().unwrap();
    assert_eq!(last.timestamp_type(), TimestampType::LogAppendTime);
    assert_eq!(last.max_timestamp(), NOW_MS + 5);
    drop(follower);
    let follower = PartitionLog::open(follower_dir.path(), config, NOW_MS).unwrap();
    assert_eq!(read_all(&follower), read_all(&leader));
    assert_eq!(epoch_pairs(&follower), epoch_pairs(&leader));
}

#[test]
fn follower_append_refuses_an_overlap_and_accepts_a_compaction_gap() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let leader = log_with_epochs(leader_dir.path(), small_config(1 << 20));
    let batches = fetched(&leader, 0);
    let mut follower =
        PartitionLog::open(follower_dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    follower
        .append_as_follower(batches[0].clone(), NOW_MS)
        .unwrap();
    // The same batch again: an overlap, nothing written.
    let err = follower
        .append_as_follower(batches[0].clone(), NOW_MS)
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::UnexpectedAppendOffset {
                expected: 3,
                got: 0
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.kafka_error(),
        kafka_protocol::ResponseError::UnknownServerError
    );
    assert_eq!(follower.log_end_offset(), 3);
    // A batch after a gap (the leader's cleaner removed batch [3, 5] whole): kept at its
    // offsets, the gap stays a gap, as on the leader.
    follower
        .append_as_follower(batches[2].clone(), NOW_MS)
        .unwrap();
    assert_eq!(follower.log_end_offset(), 9);
    assert_eq!(
        batches_of(&Bytes::from(read_all(&follower))),
        [(0, 2), (6, 8)]
    );
    assert_eq!(epoch_pairs(&follower), vec![(1, 0), (3, 6)]);
    let r = follower.read(4, 1 << 20, i64::MAX).unwrap();
    assert_eq!(r.first_batch_base_offset, Some(6));
    // The batch the gap skipped, now below the log end offset: an overlap.
    assert!(matches!(
        follower.append_as_follower(batches[1].clone(), NOW_MS),
        Err(LogError::UnexpectedAppendOffset {
            expected: 9,
            got: 3
        })
    ));
}

#[test]
fn a_copied_batch_retried_through_the_new_leader_is_a_duplicate() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let config = small_config(1 << 20);
    let mut leader = PartitionLog::open(leader_dir.path(), config.clone(), NOW_MS).unwrap();
    append_in_epoch(&mut leader, batch(2, NOW_MS), 4);
    let original = append_in_epoch(&mut leader, idempotent(3, 42, 0, 0), 4).0;
    let mut follower = PartitionLog::open(follower_dir.path(), config.clone(), NOW_MS).unwrap();
    for b in fetched(&leader, 0) {
        follower.append_as_follower(b, NOW_MS).unwrap();
    }
    // Across a reopen too: producer state comes back from the copied headers.
    drop(follower);
    let mut follower = PartitionLog::open(follower_dir.path(), config, NOW_MS).unwrap();
    // The follower becomes leader of epoch 5; the producer never got its answer and retries.
    follower.assign_epoch_start_offset(5).unwrap();
    let options = AppendOptions {
        log_append_time_ms: None,
        leader_epoch: 5,
    };
    let retry = follower
        .append(idempotent(3, 42, 0, 0), options, NOW_MS)
        .unwrap();
    assert!(retry.duplicate);
    assert_eq!(
        (retry.base_offset, retry.last_offset),
        (original.base_offset, original.last_offset)
    );
    assert_eq!(follower.log_end_offset(), 5);
    // The producer's next sequence follows on; a gap in sequences is still refused.
    assert!(matches!(
        follower.append(idempotent(1, 42, 0, 4), options, NOW_MS),
        Err(LogError::OutOfOrderSequence {
            expected_sequence: 3,
            ..
        })
    ));
    let next = follower
        .append(idempotent(1, 42, 0, 3), options, NOW_MS)
        .unwrap();
    assert_eq!((next.base_offset, next.duplicate), (5, false));
    assert_eq!(epoch_pairs(&follower), vec![(4, 0), (5, 5)]);
}

#[test]
fn truncating_at_the_end_drops_an_epoch_assigned_without_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = log_with_epochs(dir.path(), small_config(1 << 20));
    // Leader of epoch 6 at offset 15, then follower again before writing anything.
    log.assign_epoch_start_offset(6).unwrap();
    log.truncate_to(15, NOW_MS).unwrap();
    assert_eq!(log.log_end_offset(), 15);
    assert_eq!(log.latest_epoch(), Some(5));
    // The new leader's epoch-5 batches from 15 on extend epoch 5.
    let mut copy = batch(2, NOW_MS);
    copy.set_base_offset(15);
    copy.set_partition_leader_epoch(5);
    log.append_as_follower(copy, NOW_MS).unwrap();
    assert_eq!(log.end_offset_for_epoch(5), end(5, 17));
}

// ---------------------------------------------------------------------------------------
// Transactions (KIP-98): ongoing transactions, markers, the aborted transaction index,
// read_committed's aborted list, compaction with transactions.

/// A transactional batch of `producer_id` (epoch 0) from sequence `sequence`, one record
/// per `(key, value)`.
fn txn_batch(producer_id: i64, sequence: i32, records: &[(&str, &str)]) -> ValidatedBatch {
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: 0,
            timestamp_type: RecordTimestampType::Creation,
            offset: i as i64,
            sequence: sequence + i as i32,
            timestamp: NOW_MS,
            key: Some(Bytes::copy_from_slice(k.as_bytes())),
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Codec::None,
        },
    )
    .unwrap();
    let batch = validate(buf.freeze()).expect("encoded batch is valid");
    assert!(batch.is_transactional());
    batch
}

fn marker(log: &mut PartitionLog, producer_id: i64, commit: bool) -> i64 {
    let info = log
        .append_txn_marker(
            producer_id,
            0,
            TxnMarker {
                commit,
                coordinator_epoch: 1,
            },
            opts(),
            NOW_MS,
        )
        .expect("marker");
    assert_eq!(info.base_offset, info.last_offset);
    info.base_offset
}

fn aborted(producer_id: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id,
        first_offset: first,
        last_offset: last,
        last_stable_offset: lso,
    }
}

/// Every record from the log start as a consumer decodes it: (offset, key, control).
fn consume_all(log: &PartitionLog) -> Vec<(i64, Option<String>, bool)> {
    let mut bytes = Bytes::from(read_all(log));
    RecordBatchDecoder::decode_all(&mut bytes)
        .expect("decodes")
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| (r.offset, text(&r.key), r.control))
        .collect()
}

/// Two producers open transactions: the first unstable offset is the earlier start; a
/// marker ends one, which stays unstable until the high watermark passes the marker; an
/// ABORT indexes the aborted range with the LSO after it; a non-transactional batch of a
/// producer inside a transaction is INVALID_TXN_STATE; fencing by producer and
/// coordinator epoch.
#[test]
fn markers_end_transactions_and_index_the_aborted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    append(&mut log, batch(2, NOW_MS)); // 0..1 plain
    append(&mut log, txn_batch(7, 0, &[("a", "1"), ("b", "1")])); // 2..3
    append(&mut log, txn_batch(8, 0, &[("c", "1")])); // 4
    append(&mut log, txn_batch(7, 2, &[("d", "1")])); // 5
    assert!(log.has_ongoing_txn(7) && log.has_ongoing_txn(8));
    assert_eq!(log.first_unstable_offset(6), Some(2));
    let plain_retry = BatchSpec::new(1, NOW_MS).idempotent(7, 0, 3).build();
    assert!(matches!(
        log.append(plain_retry, opts(), NOW_MS),
        Err(LogError::InvalidTxnState { producer_id: 7 })
    ));

    let abort_at = marker(&mut log, 7, false); // 6
    assert_eq!(abort_at, 6);
    assert!(!log.has_ongoing_txn(7));
    // Not replicated yet (HW 6): producer 7's transaction still holds the LSO at 2.
    assert_eq!(log.first_unstable_offset(6), Some(2));
    assert_eq!(log.first_unstable_offset(7), Some(4));
    assert_eq!(
        log.collect_aborted_txns(0, 100).unwrap(),
        vec![aborted(7, 2, 6, 4)]
    );
    let commit_at = marker(&mut log, 8, true); // 7
    assert_eq!(log.first_unstable_offset(8), None);
    assert_eq!(log.collect_aborted_txns(0, 100).unwrap().len(), 1);
    // Only ranges overlapping the read count.
    assert!(log.collect_aborted_txns(7, 100).unwrap().is_empty());
    assert!(log.collect_aborted_txns(0, 1).unwrap().is_empty());
    assert_eq!(log.collect_aborted_txns(6, 6).unwrap().len(), 1);

    // Fencing: an older coordinator epoch (52), an older producer epoch (47).
    let fenced = log.append_txn_marker(
        8,
        0,
        TxnMarker {
            commit: true,
            coordinator_epoch: 0,
        },
        opts(),
        NOW_MS,
    );
    assert!(matches!(
        fenced,
        Err(LogError::TransactionCoordinatorFenced { .. })
    ));
    assert_eq!(
        fenced.unwrap_err().kafka_error(),
        kafka_protocol::ResponseError::TransactionCoordinatorFenced
    );
    append(
        &mut log,
        BatchSpec::new(1, NOW_MS).idempotent(8, 2, 0).build(),
    );
    let stale = log.append_txn_marker(
        8,
        1,
        TxnMarker {
            commit: false,
            coordinator_epoch: 5,
        },
        opts(),
        NOW_MS,
    );
    assert!(matches!(stale, Err(LogError::InvalidProducerEpoch { .. })));
    assert_eq!(log.log_end_offset(), commit_at + 2);
    // The markers are control batches a consumer decodes as such.
    let control: Vec<i64> = consume_all(&log)
        .into_iter()
        .filter(|r| r.2)
        .map(|r| r.0)
        .collect();
    assert_eq!(control, vec![6, 7]);
}

/// The aborted transaction index is `<base>.txnindex` in Kafka's 34-byte format; it and
/// the open transactions survive a reopen, and recovery rebuilds them when the active
/// segment's `.txnindex` and producer snapshot are gone (or the index is stale).
#[test]
fn the_aborted_index_and_open_transactions_survive_reopen_and_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(1 << 20);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    append(&mut log, txn_batch(1, 0, &[("a", "1")])); // 0
    append(&mut log, txn_batch(2, 0, &[("b", "1")])); // 1
    marker(&mut log, 1, false); // 2
    append(&mut log, txn_batch(3, 0, &[("c", "1")])); // 3
    marker(&mut log, 2, false); // 4
    let expected = vec![aborted(1, 0, 2, 1), aborted(2, 1, 4, 3)];
    assert_eq!(log.collect_aborted_txns(0, 10).unwrap(), expected);
    let index = dir.path().join("00000000000000000000.txnindex");
    let raw = std::fs::read(&index).unwrap();
    assert_eq!(raw.len(), 2 * 34);
    // version 0, producer 1, first 0, last 2, LSO 1
    assert_eq!(&raw[..2], &[0, 0]);
    assert_eq!(&raw[2..10], &1i64.to_be_bytes());
    assert_eq!(&raw[18..26], &2i64.to_be_bytes());
    assert_eq!(&raw[26..34], &1i64.to_be_bytes());
    log.flush().unwrap();
    drop(log);

    let log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(log.collect_aborted_txns(0, 10).unwrap(), expected);
    assert!(log.has_ongoing_txn(3) && !log.has_ongoing_txn(1));
    assert_eq!(log.first_unstable_offset(i64::MAX), Some(3));
    drop(log);

    // Recovery: no index at all, then a stale one with an entry past the end.
    std::fs::remove_file(&index).unwrap();
    let log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(log.collect_aborted_txns(0, 10).unwrap(), expected);
    drop(log);
    let mut stale = expected.clone();
    stale.push(aborted(9, 7, 99, 100));
    std::fs::write(&index, txn::encode_entries(&stale)).unwrap();
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(log.collect_aborted_txns(0, 200).unwrap(), expected);
    assert_eq!(std::fs::read(&index).unwrap().len(), 2 * 34);
}

/// Open transactions and aborted entries are carried across a roll by the snapshot, so
/// a reopen that replays only the active segment still knows them; a transaction
/// spanning segments is in the aborted list of a read starting in the first one.
#[test]
fn a_transaction_spanning_segments_is_collected_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(300);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    append(&mut log, txn_batch(5, 0, &[("k", "first")])); // 0
    let mut sequence = 1;
    while log.segment_count() < 3 {
        append(&mut log, batch(1, NOW_MS));
        append(&mut log, txn_batch(5, sequence, &[("k", "more")]));
        sequence += 1;
    }
    drop(log);
    // The transaction opened in the first segment is known from the snapshot.
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW_MS).unwrap();
    assert_eq!(log.first_unstable_offset(i64::MAX), Some(0));
    let abort_at = marker(&mut log, 5, false);
    let entry = aborted(5, 0, abort_at, abort_at + 1);
    // A read from the first segment, up to anything past 0, needs it.
    assert_eq!(log.collect_aborted_txns(0, 1).unwrap(), vec![entry]);
    assert_eq!(log.collect_aborted_txns(2, abort_at).unwrap(), vec![entry]);
    assert!(log
        .collect_aborted_txns(abort_at + 1, abort_at + 5)
        .unwrap()
        .is_empty());
    let marker_segment = log.segments.last().unwrap().base_offset;
    assert!(marker_segment > 0);
    drop(log);
    // Rebuilt after losing the active segment's snapshot: the old index gave the start.
    std::fs::remove_file(dir.path().join(format!("{marker_segment:020}.snapshot"))).unwrap();
    let log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    assert_eq!(log.collect_aborted_txns(0, 1).unwrap(), vec![entry]);
}

/// Truncation removes the aborted entries at or above the new end, and reopens the
/// transaction the removed marker had ended.
#[test]
fn truncation_drops_aborted_entries_at_or_above_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(1 << 20), NOW_MS).unwrap();
    append(&mut log, txn_batch(1, 0, &[("a", "1")])); // 0
    marker(&mut log, 1, false); // 1
    append(&mut log, txn_batch(2, 0, &[("b", "1")])); // 2
    marker(&mut log, 2, false); // 3
    assert_eq!(log.collect_aborted_txns(0, 10).unwrap().len(), 2);
    log.truncate_to(3, NOW_MS).unwrap();
    assert_eq!(
        log.collect_aborted_txns(0, 10).unwrap(),
        vec![aborted(1, 0, 1, 2)]
    );
    assert!(log.has_ongoing_txn(2));
    assert_eq!(log.first_unstable_offset(i64::MAX), Some(2));
    log.truncate_to(0, NOW_MS).unwrap();
    assert!(log.collect_aborted_txns(0, 10).unwrap().is_empty());
    assert!(!dir.path().join("00000000000000000000.txnindex").exists());
}

/// Retention deletes a segment's `.txnindex` with it.
#[test]
fn retention_deletes_the_aborted_index_with_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(200);
    config.retention_bytes = 0;
    let mut log = PartitionLog::open(dir.path(), config, NOW_MS).unwrap();
    append(&mut log, txn_batch(1, 0, &[("a", "1")]));
    marker(&mut log, 1, false);
    append(&mut log, batch(3, NOW_MS));
    append(&mut log, batch(3, NOW_MS));
    let index = dir.path().join("00000000000000000000.txnindex");
    assert!(index.exists());
    assert!(log.apply_retention(NOW_MS).unwrap() > 0);
    assert!(!index.exists());
    assert!(log
        .collect_aborted_txns(log.log_start_offset(), i64::MAX)
        .unwrap()
        .is_empty());
}

/// Compaction drops an aborted transaction's records (they never shadow the committed
/// value of their key), keeps committed ones and every marker, and does not clean at or
/// past the first offset of a transaction still open.
#[test]
fn compaction_removes_aborted_records_and_keeps_committed_ones_and_markers() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), compact_config(250), NOW_MS).unwrap();
    append(
        &mut log,
        keyed_batch(&[(Some("k"), Some("committed"))], NOW_MS, Codec::None),
    ); // 0
    append(
        &mut log,
        txn_batch(1, 0, &[("k", "aborted"), ("x", "aborted")]),
    ); // 1..2
    marker(&mut log, 1, false); // 3
    append(&mut log, txn_batch(2, 0, &[("y", "in-commit")])); // 4
    marker(&mut log, 2, true); // 5
    append(&mut log, txn_batch(3, 0, &[("y", "open")])); // 6: still open
    for i in 0..6 {
        append(
            &mut log,
            keyed_batch(&[(Some("filler"), Some("v"))], NOW_MS + i, Codec::None),
        );
    }
    assert!(log.segment_count() > 3);
    let stats = log.compact(NOW_MS).unwrap();
    assert!(stats.cleaned, "{stats:?}");
    // Cleaned only below the open transaction.
    assert!(stats.first_dirty_offset <= 6, "{stats:?}");
    let seen = consume_all(&log);
    let offsets: Vec<i64> = seen.iter().map(|r| r.0).collect();
    assert!(offsets.contains(&0), "the committed k stays: {seen:?}");
    assert!(!offsets.contains(&1) && !offsets.contains(&2), "{seen:?}");
    assert!(offsets.contains(&3) && offsets.contains(&5), "markers stay");
    assert!(offsets.contains(&4), "a committed record stays");
    assert!(offsets.contains(&6), "the open transaction is not touched");
    let still_open = log.first_unstable_offset(i64::MAX);
    assert_eq!(still_open, Some(6));
}
