//! The one walker of Kafka's record format (magic 2): every reader of records — produce
//! validation (`protocol::records`), inline transforms (`rewrite`), compaction
//! (`compact`), time lookups (`batch::first_record_at_or_after`), async transforms and
//! sink connectors ([`StoredBatches`]) — goes through [`Records`].
//!
//! Owns: the layout of one record inside a batch's (decompressed) records section
//! (Kafka protocol guide, "Record"; headers from KIP-82), the bounds checks on every
//! varint, length and count in it, and the errors that say which record is wrong and how
//! ([`WalkError`]). Never does: decompress (`codec` does, the caller chooses the cap),
//! check the batch header or its CRC (`batch`), decide what a fault means to a caller
//! (CORRUPT_MESSAGE vs INVALID_RECORD, corruption of the log), or allocate: a
//! [`RecordView`] borrows from the section.
//!
//! Record layout (varints are zigzag, as Kafka's `ByteUtils.readVarint`/`readVarlong`):
//!
//! ```text
//! length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
//! keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
//! headerCount varint | headers: keyLength varint (>= 0) key valueLength varint (-1 = null) value
//! ```
//!
//! Checks, per record: a varint is at most 5 bytes and fits 32 bits (a varlong: 10 bytes,
//! 64 bits); the record length is not negative and fits in the bytes left; every field
//! ends inside the record; lengths are -1 (nullable fields only) or more; the header count
//! is not negative and at most half the bytes left (a header takes at least two); the
//! fields take exactly the record's length. Per section: the header's recordCount is not
//! negative, the bytes hold that many records ([`Fault::Missing`]) and nothing follows
//! the last ([`Fault::Trailing`]). Offset deltas are not checked (a compacted or
//! transformed batch has gaps); `protocol::records` checks them for client batches.
//!
//! Nothing read from the bytes sizes an allocation: the walker allocates nothing, and
//! the owned forms ([`decode_section`], [`StoredBatches`]) grow one record per record
//! actually parsed.

use bytes::Bytes;

use super::batch::{BatchHeader, Compression, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES};
use super::codec::{self, DecompressError};

/// Largest decompressed records section a reader of stored batches handles for one batch
/// (8 × an 8 MiB `max.message.bytes`): the cleaner keeps a batch beyond it whole and
/// leaves its keys out of the offset map; async transforms and sink connectors pass it to
/// [`StoredBatches`].
pub const MAX_DECOMPRESSED_BATCH_BYTES: usize = 64 << 20;

/// A field of a record, named in [`WalkError`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The record's length varint.
    Length,
    /// The attributes byte (unused in magic 2).
    Attributes,
    /// timestampDelta varlong.
    TimestampDelta,
    /// offsetDelta varint.
    OffsetDelta,
    /// The key's length varint (-1 = null).
    KeyLength,
    /// The value's length varint (-1 = null).
    ValueLength,
    /// The header count varint.
    HeaderCount,
    /// A header key's length varint (never null).
    HeaderKeyLength,
    /// A header value's length varint (-1 = null).
    HeaderValueLength,
}

impl Field {
    /// The field's name in error messages.
    pub fn name(self) -> &'static str {
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

    /// What the field must fit in: the record length in the section, the rest in the
    /// record.
    fn within(self) -> &'static str {
        match self {
            Field::Length => "records",
            _ => "record",
        }
    }
}

/// What is wrong with a records section, at [`WalkError::index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The field runs past the end of the record (or of the section, for the length).
    Truncated(Field),
    /// A varint longer than 5 bytes (a varlong: 10) or wider than 32 (64) bits.
    VarintTooLong(Field),
    /// A length or count below what the field allows (-1 for nullable fields, else 0).
    Negative(Field, i32),
    /// A length or count larger than the bytes left (given) in the record or section.
    PastEnd(Field, i32, usize),
    /// The record's length does not match what its fields take.
    LengthMismatch {
        /// The record's length varint.
        declared: i32,
        /// Bytes its fields take.
        used: usize,
    },
    /// The batch header's recordCount is negative.
    NegativeCount,
    /// The section ends before record `index` (recordCount says there are more).
    Missing,
    /// Bytes follow the last record recordCount announces.
    Trailing {
        /// How many.
        bytes: usize,
    },
}

impl Fault {
    /// True for faults of the count (the records parse, recordCount disagrees with
    /// them): [`Fault::NegativeCount`], [`Fault::Missing`], [`Fault::Trailing`]. Kafka
    /// answers these with INVALID_RECORD, the rest (bytes that do not parse) with
    /// CORRUPT_MESSAGE.
    pub fn is_count(&self) -> bool {
        matches!(
            self,
            Fault::NegativeCount | Fault::Missing | Fault::Trailing { .. }
        )
    }
}

/// Why a records section could not be walked: the record at fault (0-based `index`; for
/// [`Fault::Trailing`] it equals `count`), the batch's recordCount and what is wrong.
/// The message names all three, e.g. "record 3 (of 5): key length 900 exceeds the 12
/// bytes left in the record".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct WalkError {
    /// Index of the record at fault in the batch.
    pub index: i32,
    /// The batch header's recordCount.
    pub count: i32,
    /// What is wrong.
    pub fault: Fault,
}

impl WalkError {
    fn describe(&self) -> String {
        let WalkError {
            index,
            count,
            fault,
        } = *self;
        let at = format!("record {index} (of {count})");
        match fault {
            Fault::Truncated(f) => {
                format!("{at}: {} runs past the end of the {}", f.name(), f.within())
            }
            Fault::VarintTooLong(f) => {
                format!("{at}: {} is a malformed or too long varint", f.name())
            }
            Fault::Negative(f, v) => format!("{at}: {} {v} is invalid (negative)", f.name()),
            Fault::PastEnd(f, v, left) => format!(
                "{at}: {} {v} exceeds the {left} bytes left in the {}",
                f.name(),
                f.within()
            ),
            Fault::LengthMismatch { declared, used } => {
                format!("{at}: record length is {declared} but its fields take {used} bytes")
            }
            Fault::NegativeCount => format!("recordCount {count} is negative"),
            Fault::Missing => format!(
                "recordCount is {count} but the batch holds {index} records (record {index} \
                 is missing)"
            ),
            Fault::Trailing { bytes } => format!(
                "recordCount is {count} but {bytes} bytes follow record {} (the last one)",
                i64::from(count) - 1
            ),
        }
    }
}

/// One record, borrowed from the records section it was walked in. Every field was
/// bounds-checked by [`Records`], headers included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Index of the record in its batch (0-based).
    pub index: i32,
    /// The attributes byte (unused in magic 2; kept as sent).
    pub attributes: i8,
    /// timestampDelta: the record's timestamp minus the batch's baseTimestamp, in ms.
    pub timestamp_delta: i64,
    /// offsetDelta: the record's offset minus the batch's baseOffset.
    pub offset_delta: i32,
    /// Key; `None` is null.
    pub key: Option<&'a [u8]>,
    /// Value; `None` is null (a tombstone).
    pub value: Option<&'a [u8]>,
    /// Headers, in order, repeated keys kept (KIP-82).
    pub headers: Headers<'a>,
    /// The whole record as stored: its length varint and body.
    pub raw: &'a [u8],
}

impl RecordView<'_> {
    /// The owned form, its fields zero-copy slices of `section`, the `Bytes` this record
    /// was walked in (asserted: a slice of another buffer is a caller bug), with the
    /// timestamp `base_timestamp_ms + timestampDelta` (saturating).
    pub fn to_decoded(&self, section: &Bytes, base_timestamp_ms: i64) -> DecodedRecord {
        let slice = |b: &[u8]| section.slice_ref(b);
        DecodedRecord {
            offset_delta: self.offset_delta,
            timestamp_ms: base_timestamp_ms.saturating_add(self.timestamp_delta),
            key: self.key.map(slice),
            value: self.value.map(slice),
            headers: self
                .headers
                .map(|(k, v)| (slice(k), v.map(slice)))
                .collect(),
        }
    }
}

/// A record's headers, in order (KIP-82: keys may repeat; a key is UTF-8 by contract,
/// given here as bytes): `(key, value)` with `None` a null value. Walked and checked with
/// the record, so iterating cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    /// The header bytes after the count.
    bytes: &'a [u8],
    /// Headers not yet yielded.
    left: usize,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let mut p = 0;
        let header = (|| {
            let key = bytes_field::<true>(self.bytes, &mut p, Field::HeaderKeyLength, false)?;
            let value = bytes_field::<true>(self.bytes, &mut p, Field::HeaderValueLength, true)?;
            Ok::<_, Fault>((key.unwrap_or_default(), value))
        })();
        match header {
            Ok(h) => {
                self.bytes = &self.bytes[p..];
                self.left -= 1;
                Some(h)
            }
            // Not reachable: the walk checked these bytes. Stop rather than panic.
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Headers<'_> {}

/// The walker: an iterator over the records of one (decompressed) records section,
/// yielding a [`RecordView`] per record, then — if the section and the batch header's
/// `record_count` disagree — one [`WalkError`] ([`Fault::Missing`],
/// [`Fault::Trailing`]). After an error it yields nothing more. Zero-copy; a caller that
/// stops early (a time lookup) reads no further.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    section: &'a [u8],
    pos: usize,
    index: i32,
    count: i32,
    done: bool,
}

impl<'a> Records<'a> {
    /// Walks `section` (a batch's records, decompressed; see `codec`) holding
    /// `record_count` records (the batch header's recordCount, not trusted).
    pub fn new(section: &'a [u8], record_count: i32) -> Records<'a> {
        Records {
            section,
            pos: 0,
            index: 0,
            count: record_count,
            done: false,
        }
    }

    fn fail(&mut self, fault: Fault) -> Option<Result<RecordView<'a>, WalkError>> {
        self.done = true;
        Some(Err(self.error(fault)))
    }

    #[cold]
    fn error(&self, fault: Fault) -> WalkError {
        WalkError {
            index: self.index,
            count: self.count,
            fault,
        }
    }

    /// The same walk as the iterator, driven from inside: `f` gets every record in order
    /// and the first walk fault or `f`'s first error ends it. For the hot loops: a view
    /// handed to an inlined closure stays in registers, where `next`'s
    /// `Option<Result<RecordView, _>>` is built in memory for every record — that cost the
    /// produce path about a quarter more broker CPU per record (benches/RESULTS.md, "Issue
    /// 11 A/B", run 5).
    ///
    /// Errors: the walk's [`WalkError`] (converted by `E: From<WalkError>`), or `f`'s.
    #[inline(always)]
    pub fn try_each<E: From<WalkError>>(
        self,
        f: impl FnMut(RecordView<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.walk_each::<E, true>(f)
    }

    /// [`Records::try_each`] for a caller that needs no bytes, only each record's
    /// [`RecordCheck`]: the same walk and the same checks (every length bounds-checked,
    /// headers included), without building the slices of a [`RecordView`]. Produce
    /// validation walks every record of every client batch with it: the slices cost it ~15%
    /// more instructions per record (benches/RESULTS.md, "Issue 11 A/B", run 10).
    ///
    /// Errors: as [`Records::try_each`].
    #[inline(always)]
    pub fn check_each<E: From<WalkError>>(
        self,
        mut f: impl FnMut(RecordCheck) -> Result<(), E>,
    ) -> Result<(), E> {
        self.walk_each::<E, false>(|view| {
            f(RecordCheck {
                index: view.index,
                offset_delta: view.offset_delta,
                key_is_null: view.key.is_none(),
            })
        })
    }

    /// The walk of [`Records::try_each`] (`VIEW`) and [`Records::check_each`] (not
    /// `VIEW`: the views' slices are left empty, so they must not escape this module).
    #[inline(always)]
    fn walk_each<E: From<WalkError>, const VIEW: bool>(
        self,
        mut f: impl FnMut(RecordView<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.done {
            return Ok(());
        }
        // Locals, not fields: they stay in registers across the loop.
        let (section, count) = (self.section, self.count);
        let (mut pos, mut index) = (self.pos, self.index);
        let error = |fault: Fault, index: i32| WalkError {
            index,
            count,
            fault,
        };
        if count < 0 {
            return Err(error(Fault::NegativeCount, index).into());
        }
        while index < count {
            if pos == section.len() {
                return Err(error(Fault::Missing, index).into());
            }
            match record::<VIEW>(section, &mut pos, index) {
                Ok(view) => {
                    index += 1;
                    f(view)?;
                }
                Err(fault) => return Err(error(fault, index).into()),
            }
        }
        let left = section.len() - pos;
        if left > 0 {
            return Err(error(Fault::Trailing { bytes: left }, index).into());
        }
        Ok(())
    }
}

/// What [`Records::check_each`] gives of a record: enough to check a client's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordCheck {
    /// Index of the record in its batch (0-based).
    pub index: i32,
    /// offsetDelta as sent.
    pub offset_delta: i32,
    /// Whether the key is null.
    pub key_is_null: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordView<'a>, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.count < 0 {
            return self.fail(Fault::NegativeCount);
        }
        if self.index == self.count {
            self.done = true;
            let left = self.section.len() - self.pos;
            if left > 0 {
                return self.fail(Fault::Trailing { bytes: left });
            }
            return None;
        }
        if self.pos == self.section.len() {
            return self.fail(Fault::Missing);
        }
        match record::<true>(self.section, &mut self.pos, self.index) {
            Ok(view) => {
                self.index += 1;
                Some(Ok(view))
            }
            Err(fault) => self.fail(fault),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // At most the records left, plus one error; the bytes bound it too (a record
        // takes at least 7 bytes).
        let left = usize::try_from(self.count - self.index).unwrap_or(0);
        let by_bytes = (self.section.len() - self.pos) / 7;
        (0, Some(left.min(by_bytes) + 1))
    }
}

/// One record starting at `*pos` in `section`; advances `*pos` past it. Without `VIEW` the
/// view's slices (key, value, headers, raw) are empty: the checks are the same.
#[inline(always)]
fn record<'a, const VIEW: bool>(
    section: &'a [u8],
    pos: &mut usize,
    index: i32,
) -> Result<RecordView<'a>, Fault> {
    let start = *pos;
    let length = varint(section, pos, Field::Length)?;
    let left = section.len() - *pos;
    if length < 0 {
        return Err(Fault::Negative(Field::Length, length));
    }
    if length as usize > left {
        return Err(Fault::PastEnd(Field::Length, length, left));
    }
    let body = &section[*pos..*pos + length as usize];
    *pos += length as usize;
    let raw: &[u8] = if VIEW { &section[start..*pos] } else { &[] };

    let attributes = *body.first().ok_or(Fault::Truncated(Field::Attributes))? as i8;
    let mut p = 1usize;
    let timestamp_delta = varlong(body, &mut p, Field::TimestampDelta)?;
    let offset_delta = varint(body, &mut p, Field::OffsetDelta)?;
    let key = bytes_field::<VIEW>(body, &mut p, Field::KeyLength, true)?;
    let value = bytes_field::<VIEW>(body, &mut p, Field::ValueLength, true)?;
    let header_count = varint(body, &mut p, Field::HeaderCount)?;
    if header_count < 0 {
        return Err(Fault::Negative(Field::HeaderCount, header_count));
    }
    // Every header takes at least two bytes (two one-byte lengths).
    if header_count as usize > (body.len() - p) / 2 {
        return Err(Fault::PastEnd(
            Field::HeaderCount,
            header_count,
            body.len() - p,
        ));
    }
    let headers_at = p;
    for _ in 0..header_count {
        bytes_field::<false>(body, &mut p, Field::HeaderKeyLength, false)?;
        bytes_field::<false>(body, &mut p, Field::HeaderValueLength, true)?;
    }
    if p != body.len() {
        return Err(Fault::LengthMismatch {
            declared: length,
            used: p,
        });
    }
    Ok(RecordView {
        index,
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers: Headers {
            bytes: if VIEW { &body[headers_at..] } else { &[] },
            left: header_count as usize,
        },
        raw,
    })
}

/// A length-prefixed byte field: its length (-1 = null when `nullable`) and bytes (empty
/// without `SLICE`: the bounds are checked all the same).
#[inline(always)]
fn bytes_field<'a, const SLICE: bool>(
    body: &'a [u8],
    p: &mut usize,
    field: Field,
    nullable: bool,
) -> Result<Option<&'a [u8]>, Fault> {
    let len = varint(body, p, field)?;
    if len < 0 {
        if len == -1 && nullable {
            return Ok(None);
        }
        return Err(Fault::Negative(field, len));
    }
    let left = body.len() - *p;
    if len as usize > left {
        return Err(Fault::PastEnd(field, len, left));
    }
    let bytes: &[u8] = if SLICE {
        &body[*p..*p + len as usize]
    } else {
        &[]
    };
    *p += len as usize;
    Ok(Some(bytes))
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
            return Ok(unzigzag32(u32::from(b0)));
        }
        if let Some(&b1) = buf.get(p + 1) {
            if b1 < 0x80 {
                *pos = p + 2;
                return Ok(unzigzag32(u32::from(b0 & 0x7f) | u32::from(b1) << 7));
            }
        }
    }
    varint_slow(buf, pos, field)
}

#[inline(always)]
fn unzigzag32(raw: u32) -> i32 {
    ((raw >> 1) as i32) ^ -((raw & 1) as i32)
}

#[inline(always)]
fn unzigzag64(raw: u64) -> i64 {
    ((raw >> 1) as i64) ^ -((raw & 1) as i64)
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
            return Ok(unzigzag32(raw));
        }
    }
    Err(Fault::VarintTooLong(field))
}

/// A zigzag varlong (Kafka `readVarlong`): at most 10 bytes, fitting 64 bits.
#[inline(always)]
fn varlong(buf: &[u8], pos: &mut usize, field: Field) -> Result<i64, Fault> {
    let p = *pos;
    if let Some(&b0) = buf.get(p) {
        if b0 < 0x80 {
            *pos = p + 1;
            return Ok(unzigzag64(u64::from(b0)));
        }
        if let Some(&b1) = buf.get(p + 1) {
            if b1 < 0x80 {
                *pos = p + 2;
                return Ok(unzigzag64(u64::from(b0 & 0x7f) | u64::from(b1) << 7));
            }
        }
    }
    varlong_slow(buf, pos, field)
}

#[inline(never)]
fn varlong_slow(buf: &[u8], pos: &mut usize, field: Field) -> Result<i64, Fault> {
    let mut raw: u64 = 0;
    for i in 0..10 {
        let b = *buf.get(*pos + i).ok_or(Fault::Truncated(field))?;
        if i == 9 && b > 0x01 {
            // A continuation bit in the 10th byte, or bits beyond the 64th.
            return Err(Fault::VarintTooLong(field));
        }
        raw |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            *pos += i + 1;
            return Ok(unzigzag64(raw));
        }
    }
    Err(Fault::VarintTooLong(field))
}

// ---------------------------------------------------------------------------------------
// Owned forms

/// One record, decoded: fields are zero-copy slices of the (decompressed) records
/// section. What inline transforms re-encode and async readers hand to plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    /// offsetDelta in its batch.
    pub offset_delta: i32,
    /// baseTimestamp + timestampDelta, ms since the epoch (saturating).
    pub timestamp_ms: i64,
    /// Key; `None` is null.
    pub key: Option<Bytes>,
    /// Value; `None` is null.
    pub value: Option<Bytes>,
    /// Headers in order, repeated keys kept: raw key bytes (UTF-8 by Kafka's contract)
    /// and value (`None` is null).
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// Every record of `section` (a batch's records, decompressed, holding `record_count`
/// records by its header), owned, with timestamps from `base_timestamp_ms`.
///
/// Errors: the first [`WalkError`] of the walk.
pub fn decode_section(
    section: &Bytes,
    record_count: i32,
    base_timestamp_ms: i64,
) -> Result<Vec<DecodedRecord>, WalkError> {
    Records::new(section, record_count)
        .map(|r| r.map(|view| view.to_decoded(section, base_timestamp_ms)))
        .collect()
}

/// One stored batch read back from the log, its records decoded (see [`StoredBatches`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    /// baseOffset: a record's offset is this plus its offsetDelta.
    pub base_offset: i64,
    /// lastOffsetDelta: the batch spans `base_offset ..= base_offset + last_offset_delta`
    /// even when compaction or a transform removed records.
    pub last_offset_delta: i32,
    /// Attributes bit 5: a control batch (its records are markers, not data; they are
    /// not decoded and `records` is empty).
    pub is_control: bool,
    /// Attributes bit 4: part of a transaction.
    pub is_transactional: bool,
    /// The batch's producer id (-1: none).
    pub producer_id: i64,
    /// For a control batch, its marker's type (the control record key's second int16:
    /// 0 ABORT, 1 COMMIT); `None` for data batches or an unreadable marker.
    pub control_type: Option<i16>,
    /// The records, in order.
    pub records: Vec<DecodedRecord>,
}

/// Stored batches (whole, as `PartitionLog::read` returns them), decoded one at a time:
/// each is decompressed within a cap and walked with [`Records`]. A partial batch at the
/// end (a read cut at its byte limit) ends the iteration. What async transforms and sink
/// connectors read.
///
/// Errors (one, then the iteration ends): a batch length under the header size, codec
/// bits outside 0..=4, records that do not decompress or decompress past the cap, or a
/// [`WalkError`]; the message names the batch's base offset. The log checked these
/// batches when they were appended, so an error means corruption or a cap too small.
#[derive(Debug, Clone)]
pub struct StoredBatches {
    bytes: Bytes,
    max_decompressed_bytes: usize,
    done: bool,
}

impl StoredBatches {
    /// Decodes the batches in `bytes`, decompressing each into at most
    /// `max_decompressed_bytes`.
    pub fn new(bytes: Bytes, max_decompressed_bytes: usize) -> StoredBatches {
        StoredBatches {
            bytes,
            max_decompressed_bytes,
            done: false,
        }
    }

    fn decode_one(&self, batch: Bytes) -> Result<StoredBatch, String> {
        let header = BatchHeader::parse(&batch);
        let at = format!("batch at offset {}", header.base_offset);
        let codec = header
            .compression()
            .ok_or_else(|| format!("{at}: compression codec bits {}", header.attributes & 7))?;
        let mut out = StoredBatch {
            base_offset: header.base_offset,
            last_offset_delta: header.last_offset_delta,
            is_control: header.is_control(),
            is_transactional: header.is_transactional(),
            producer_id: header.producer_id,
            control_type: None,
            records: Vec::new(),
        };
        if out.is_control {
            // Markers are written uncompressed (Kafka's `EndTransactionMarker`); only the
            // first record's key is looked at.
            let section = batch.slice(BATCH_HEADER_BYTES..);
            out.control_type = Records::new(&section, header.record_count.min(1))
                .next()
                .and_then(|r| r.ok())
                .and_then(|view| view.to_decoded(&section, header.base_timestamp).key)
                .filter(|k| k.len() >= 4)
                .map(|k| i16::from_be_bytes([k[2], k[3]]));
            return Ok(out);
        }
        let section = batch.slice(BATCH_HEADER_BYTES..);
        let section = if codec == Compression::None {
            section
        } else {
            match codec::decompress(codec, &section, self.max_decompressed_bytes) {
                Ok(v) => Bytes::from(v),
                Err(DecompressError::TooLarge) => {
                    return Err(format!(
                        "{at}: {} records decompress to more than {} bytes",
                        codec::name(codec),
                        self.max_decompressed_bytes
                    ))
                }
                Err(DecompressError::Bad(why)) => {
                    return Err(format!(
                        "{at}: {} records do not decompress: {why}",
                        codec::name(codec)
                    ))
                }
            }
        };
        out.records = decode_section(&section, header.record_count, header.base_timestamp)
            .map_err(|e| format!("{at}: {e}"))?;
        Ok(out)
    }
}

impl Iterator for StoredBatches {
    type Item = Result<StoredBatch, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.bytes.len() < LOG_OVERHEAD_BYTES {
            return None;
        }
        let length =
            i32::from_be_bytes([self.bytes[8], self.bytes[9], self.bytes[10], self.bytes[11]]);
        let total = usize::try_from(length)
            .ok()
            .and_then(|l| l.checked_add(LOG_OVERHEAD_BYTES));
        let Some(total) = total.filter(|&t| t >= BATCH_HEADER_BYTES) else {
            self.done = true;
            return Some(Err(format!("batch length {length} is invalid")));
        };
        if total > self.bytes.len() {
            // A partial batch at the end of a read.
            self.done = true;
            return None;
        }
        let batch = self.bytes.split_to(total);
        let result = self.decode_one(batch);
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::testing::{put_varlong, BatchSpec};
    use crate::log::rewrite::BatchBuilder;
    use crate::log::{plain, split_batches, ValidatedBatch};
    use proptest::prelude::*;

    /// One record body with every field as given (lengths written as given).
    fn body(
        offset_delta: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) -> Vec<u8> {
        let mut b = vec![0u8];
        put_varlong(&mut b, 3); // timestampDelta
        put_varlong(&mut b, offset_delta);
        for field in [key, value] {
            match field {
                None => put_varlong(&mut b, -1),
                Some(f) => {
                    put_varlong(&mut b, f.len() as i64);
                    b.extend_from_slice(f);
                }
            }
        }
        put_varlong(&mut b, headers.len() as i64);
        for (k, v) in headers {
            put_varlong(&mut b, k.len() as i64);
            b.extend_from_slice(k);
            match v {
                None => put_varlong(&mut b, -1),
                Some(v) => {
                    put_varlong(&mut b, v.len() as i64);
                    b.extend_from_slice(v);
                }
            }
        }
        b
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varlong(&mut out, body.len() as i64);
        out.extend_from_slice(body);
        out
    }

    fn walk(section: &[u8], count: i32) -> Result<Vec<RecordView<'_>>, WalkError> {
        Records::new(section, count).collect()
    }

    fn fault(section: &[u8], count: i32) -> WalkError {
        walk(section, count).expect_err("a walk error")
    }

    type Owned = (Vec<u8>, Option<Vec<u8>>);

    fn headers_of(r: &RecordView<'_>) -> Vec<Owned> {
        r.headers
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }

    /// A batch written by the inline-transform encoder (`rewrite::BatchBuilder`): record
    /// 0 with two `h` headers and a null-valued one, record 1 with a null key and value.
    fn rewritten(codec: Compression) -> ValidatedBatch {
        let template = BatchSpec::new(2, 1_000).build();
        let mut b = BatchBuilder::new(&template, codec);
        let headers: [(&[u8], Option<&[u8]>); 3] =
            [(b"h", Some(b"1")), (b"x", None), (b"h", Some(b"2"))];
        b.push(0, 1_000, Some(b"k"), Some(b"v"), headers.into_iter())
            .unwrap();
        b.push(1, 1_005, None, None, std::iter::empty()).unwrap();
        b.finish().unwrap()
    }

    fn section_of(batch: &ValidatedBatch) -> Bytes {
        let bytes = batch.to_bytes();
        StoredBatches::new(bytes.clone(), 1 << 20)
            .next()
            .expect("one batch")
            .expect("decodes");
        let records = bytes.slice(BATCH_HEADER_BYTES..);
        match batch.compression() {
            Compression::None => records,
            c => Bytes::from(codec::decompress(c, &records, 1 << 20).unwrap()),
        }
    }

    #[test]
    fn round_trip_with_the_rewrite_encoder_keeps_repeated_headers_in_order() {
        for codec in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let batch = rewritten(codec);
            let section = section_of(&batch);
            let records = walk(&section, batch.record_count()).unwrap();
            assert_eq!(records.len(), 2);
            let r = &records[0];
            assert_eq!((r.index, r.offset_delta, r.timestamp_delta), (0, 0, 0));
            assert_eq!((r.key, r.value), (Some(&b"k"[..]), Some(&b"v"[..])));
            assert_eq!(r.headers.len(), 3);
            assert_eq!(
                headers_of(r),
                [
                    (b"h".to_vec(), Some(b"1".to_vec())),
                    (b"x".to_vec(), None),
                    (b"h".to_vec(), Some(b"2".to_vec())),
                ]
            );
            let r = &records[1];
            assert_eq!((r.index, r.offset_delta, r.timestamp_delta), (1, 1, 5));
            assert_eq!((r.key, r.value), (None, None));
            assert_eq!(r.headers.len(), 0);
            // The raw records are the section, back to back.
            assert_eq!([records[0].raw, records[1].raw].concat(), &section[..]);
            // The owned form and the stored-batch reader agree.
            let owned = decode_section(&section, 2, 1_000).unwrap();
            assert_eq!(owned[1].timestamp_ms, 1_005);
            assert_eq!(owned[0].headers.len(), 3);
            assert_eq!(&owned[0].headers[2].0[..], b"h");
            let stored = StoredBatches::new(batch.to_bytes(), 1 << 20)
                .next()
                .unwrap()
                .unwrap();
            assert_eq!(stored.records, owned);
            assert!(!stored.is_control && !stored.is_transactional);
        }
    }

    #[test]
    fn round_trip_with_the_plain_encoder_keeps_repeated_headers() {
        let records: Vec<_> = (0..3)
            .map(|i| {
                plain::record(
                    i,
                    10 + i,
                    Some(Bytes::from(format!("k{i}"))),
                    (i != 1).then(|| Bytes::from(format!("v{i}"))),
                    vec![
                        ("a".into(), Some(Bytes::from_static(b"b"))),
                        ("a".into(), Some(Bytes::from_static(b"c"))),
                    ],
                )
            })
            .collect();
        let batch = split_batches(plain::encode(&records).unwrap())
            .unwrap()
            .remove(0);
        let section = batch.records_bytes();
        let walked = walk(&section, batch.record_count()).unwrap();
        assert_eq!(walked.len(), 3);
        for (i, r) in walked.iter().enumerate() {
            assert_eq!(r.offset_delta, i as i32);
            assert_eq!(batch.base_timestamp() + r.timestamp_delta, 10 + i as i64);
            assert_eq!(r.key, Some(format!("k{i}").as_bytes()));
            assert_eq!(r.value.is_none(), i == 1);
            assert_eq!(
                headers_of(r),
                [
                    (b"a".to_vec(), Some(b"b".to_vec())),
                    (b"a".to_vec(), Some(b"c".to_vec()))
                ]
            );
        }
    }

    #[test]
    fn truncated_input_fails_at_every_byte_and_names_the_record() {
        let batch = rewritten(Compression::None);
        let section = section_of(&batch);
        let first_len = walk(&section, 2).unwrap()[0].raw.len();
        for cut in 0..section.len() {
            let e = fault(&section[..cut], 2);
            let want = if cut < first_len { 0 } else { 1 };
            assert_eq!(e.index, want, "cut at {cut}: {e}");
            assert_eq!(
                e.fault == Fault::Missing,
                cut == 0 || cut == first_len,
                "{e}"
            );
            assert!(e.to_string().contains(&format!("record {want}")), "{e}");
        }
        // A cut inside a record: its length then promises more than is left.
        let e = fault(&section[..first_len - 1], 1);
        assert!(matches!(e.fault, Fault::PastEnd(Field::Length, ..)), "{e}");
    }

    #[test]
    fn negative_lengths_are_refused_with_the_field() {
        let cases: [(Vec<u8>, Fault); 5] = [
            // record length -1
            (vec![1], Fault::Negative(Field::Length, -1)),
            // key length -2
            (
                framed(&[0, 0, 0, 3, 0, 0]),
                Fault::Negative(Field::KeyLength, -2),
            ),
            // header count -3
            (
                framed(&[0, 0, 0, 1, 1, 5]),
                Fault::Negative(Field::HeaderCount, -3),
            ),
            // header key length -1 (header keys are never null)
            (
                framed(&[0, 0, 0, 1, 1, 2, 1, 0]),
                Fault::Negative(Field::HeaderKeyLength, -1),
            ),
            // header value length -2
            (
                framed(&[0, 0, 0, 1, 1, 2, 2, b'k', 3]),
                Fault::Negative(Field::HeaderValueLength, -2),
            ),
        ];
        for (section, want) in cases {
            let e = fault(&section, 1);
            assert_eq!(e.fault, want, "{e}");
            assert!(e.to_string().contains("record 0 (of 1)"), "{e}");
            assert!(e.to_string().contains("negative"), "{e}");
        }
    }

    #[test]
    fn lengths_past_the_end_mismatches_and_long_varints() {
        // A key of 1,000,000 bytes in a 10-byte record.
        let mut b = vec![0u8, 0, 0];
        put_varlong(&mut b, 1_000_000);
        b.extend_from_slice(b"k");
        let e = fault(&framed(&b), 1);
        assert!(
            matches!(e.fault, Fault::PastEnd(Field::KeyLength, 1_000_000, _)),
            "{e}"
        );
        // A header count of a billion: refused before any header is read.
        let e = fault(&framed(&[0, 0, 0, 1, 1, 0x80, 0xa8, 0xd6, 0xb9, 0x07]), 1);
        assert!(
            matches!(e.fault, Fault::PastEnd(Field::HeaderCount, ..)),
            "{e}"
        );
        // Extra bytes after the headers.
        let mut b = body(0, None, Some(b"v"), &[]);
        b.push(0);
        let e = fault(&framed(&b), 1);
        assert!(matches!(e.fault, Fault::LengthMismatch { .. }), "{e}");
        // A 6-byte varint key length; an 11-byte timestampDelta.
        let e = fault(&framed(&[0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]), 1);
        assert_eq!(e.fault, Fault::VarintTooLong(Field::KeyLength), "{e}");
        let mut b = vec![0u8];
        b.extend_from_slice(&[0xff; 10]);
        b.push(0);
        let e = fault(&framed(&b), 1);
        assert_eq!(e.fault, Fault::VarintTooLong(Field::TimestampDelta), "{e}");
        // An empty record has no attributes.
        assert_eq!(fault(&[0], 1).fault, Fault::Truncated(Field::Attributes));
    }

    #[test]
    fn a_count_that_lies() {
        let one = framed(&body(0, Some(b"k"), Some(b"v"), &[]));
        let e = fault(&one, 1_000_000);
        assert_eq!((e.index, e.fault), (1, Fault::Missing));
        assert!(e.to_string().contains("record 1 is missing"), "{e}");
        // The size hint does not trust the count.
        assert!(Records::new(&one, i32::MAX).size_hint().1.unwrap() <= 2);
        let two = [one.clone(), one.clone()].concat();
        let e = fault(&two, 1);
        assert_eq!(
            (e.index, e.fault),
            (1, Fault::Trailing { bytes: one.len() })
        );
        assert!(e.to_string().contains("follow record 0"), "{e}");
        assert_eq!(fault(&two, -1).fault, Fault::NegativeCount);
        assert_eq!(fault(&[], -1).fault, Fault::NegativeCount);
        assert!(walk(&[], 0).unwrap().is_empty());
        assert_eq!(fault(&[], 1).fault, Fault::Missing);
        // After an error, nothing more.
        let mut it = Records::new(&two, 1);
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());
    }

    #[test]
    fn varints_decode_as_kafka() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            8191,
            -8192,
            8192,
            i32::MAX as i64,
            i32::MIN as i64,
        ] {
            let mut buf = Vec::new();
            put_varlong(&mut buf, v);
            let mut pos = 0;
            assert_eq!(varint(&buf, &mut pos, Field::Length), Ok(v as i32));
            assert_eq!(pos, buf.len());
        }
        for v in [i64::MIN, i64::MAX, -1, 1 << 40] {
            let mut buf = Vec::new();
            put_varlong(&mut buf, v);
            let mut pos = 0;
            assert_eq!(varlong(&buf, &mut pos, Field::TimestampDelta), Ok(v));
            assert_eq!(pos, buf.len());
        }
        let mut buf = Vec::new();
        put_varlong(&mut buf, 1 << 40);
        assert_eq!(
            varint(&buf, &mut 0, Field::KeyLength),
            Err(Fault::VarintTooLong(Field::KeyLength))
        );
    }

    #[test]
    fn stored_batches_skip_control_and_stop_at_a_partial_batch() {
        let a = rewritten(Compression::Lz4).to_bytes();
        let mut control = BatchSpec::new(1, 0).build_bytes();
        control[22] |= 0x20;
        let crc = crc32c::crc32c(&control[21..]);
        control[17..21].copy_from_slice(&crc.to_be_bytes());
        let all = [&a[..], &control[..], &a[..a.len() - 1]].concat();
        let batches: Vec<_> = StoredBatches::new(Bytes::from(all), 1 << 20)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].records.len(), 2);
        assert!(batches[1].is_control && batches[1].records.is_empty());
        // Over the cap: an error naming the batch.
        let e = StoredBatches::new(a, 10).next().unwrap().unwrap_err();
        assert!(
            e.contains("batch at offset 0") && e.contains("more than 10"),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Hostile sections never panic, and what is yielded lies inside the section.
        #[test]
        fn hostile_sections_never_panic(
            section in proptest::collection::vec(any::<u8>(), 0..64),
            count in -2i32..6,
        ) {
            let mut seen = 0;
            for r in Records::new(&section, count) {
                match r {
                    Ok(view) => {
                        prop_assert_eq!(view.index, seen);
                        seen += 1;
                        prop_assert!(view.headers.count() <= view.raw.len());
                    }
                    Err(e) => {
                        prop_assert_eq!(e.index, seen);
                        let _ = e.to_string();
                    }
                }
            }
            prop_assert!(seen <= count.max(0));
        }

        /// The iterator, `try_each` and `check_each` are one walk: on any bytes they see the
        /// same records (index, offsetDelta, null key) and end with the same error.
        #[test]
        fn the_three_drivers_agree(
            mutate in proptest::option::of((0usize..64, any::<u8>())),
            cut in 0usize..64,
            count in -1i32..4,
        ) {
            let batch = rewritten(Compression::None);
            let mut section = section_of(&batch).to_vec();
            if let Some((at, byte)) = mutate {
                let at = at % section.len();
                section[at] = byte;
            }
            section.truncate(section.len() - cut % (section.len() + 1));
            let check = |v: &RecordView<'_>| RecordCheck {
                index: v.index,
                offset_delta: v.offset_delta,
                key_is_null: v.key.is_none(),
            };
            let (mut by_next, mut next_error) = (Vec::new(), None);
            for r in Records::new(&section, count) {
                match r {
                    Ok(v) => by_next.push(check(&v)),
                    Err(e) => next_error = Some(e),
                }
            }
            let mut by_try = Vec::new();
            let try_error = Records::new(&section, count)
                .try_each(|v| {
                    by_try.push(check(&v));
                    Ok::<(), WalkError>(())
                })
                .err();
            let mut by_check = Vec::new();
            let check_error = Records::new(&section, count)
                .check_each(|c| {
                    by_check.push(c);
                    Ok::<(), WalkError>(())
                })
                .err();
            prop_assert_eq!(&by_next, &by_try);
            prop_assert_eq!(&by_next, &by_check);
            prop_assert_eq!(next_error, try_error);
            prop_assert_eq!(next_error, check_error);
        }

        /// Mutating one byte of a valid section never panics.
        #[test]
        fn one_byte_mutations_never_panic(at in 0usize..64, byte in any::<u8>()) {
            let batch = rewritten(Compression::None);
            let mut section = section_of(&batch).to_vec();
            let at = at % section.len();
            section[at] = byte;
            for view in Records::new(&section, 2).flatten() {
                let _ = view.headers.collect::<Vec<_>>();
            }
        }
    }
}
