//! Bounded decompression of record-batch bodies, shared by record validation on produce
//! (`protocol::records`) and the log cleaner (`log::compact`).
//!
//! Owns: the compression codecs' framing as Kafka clients write them (gzip; snappy both
//! xerial-framed and raw; the standard LZ4 frame, with or without block/content
//! checksums; zstd) and a hard cap on the decompressed bytes. Never does: parse records,
//! compress, or touch files.

use std::io::{self, Read};

use super::batch::Compression;
/// First reservation of the decompression buffer: a guess from the compressed size,
/// grown by doubling (never beyond the cap + 1) when the guess is short.
const MIN_INITIAL_BUFFER: usize = 64 * 1024;
const INITIAL_RATIO: usize = 4;

/// The xerial snappy-java stream header: magic (8 bytes), version and compatible version
/// (4 bytes each). Kafka's Java client writes this framing; a body without the magic is
/// one raw snappy block (as snappy-java's `SnappyInputStream` falls back to).
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;

/// Why a body did not decompress.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    /// The output would exceed the cap given to [`decompress`].
    #[error("decompresses to more than the cap")]
    TooLarge,
    /// The codec refused the bytes (the codec's message).
    #[error("{0}")]
    Bad(String),
}

impl From<io::Error> for DecompressError {
    fn from(e: io::Error) -> DecompressError {
        DecompressError::Bad(e.to_string())
    }
}

/// Kafka's name of a codec (`compression.type` values): none, gzip, snappy, lz4, zstd.
pub fn name(codec: Compression) -> &'static str {
    match codec {
        Compression::None => "none",
        Compression::Gzip => "gzip",
        Compression::Snappy => "snappy",
        Compression::Lz4 => "lz4",
        Compression::Zstd => "zstd",
    }
}

/// Decompresses a batch's records section (`input`) written with `codec` into a new
/// buffer of at most `cap` bytes (`Compression::None` copies). Memory is bounded by
/// `cap + 1` whatever the input claims.
///
/// Errors: [`DecompressError::TooLarge`] past `cap`; [`DecompressError::Bad`] when the
/// codec refuses the bytes.
pub fn decompress(
    codec: Compression,
    input: &[u8],
    cap: usize,
) -> Result<Vec<u8>, DecompressError> {
    let initial = input
        .len()
        .saturating_mul(INITIAL_RATIO)
        .max(MIN_INITIAL_BUFFER)
        .min(cap.saturating_add(1));
    let mut out = Vec::with_capacity(initial);
    match codec {
        Compression::None => {
            if input.len() > cap {
                return Err(DecompressError::TooLarge);
            }
            out.extend_from_slice(input);
            Ok(())
        }
        Compression::Gzip => gzip(input, cap, &mut out),
        Compression::Snappy => snappy(input, cap, &mut out),
        Compression::Lz4 => lz4(input, cap, &mut out),
        Compression::Zstd => zstd(input, cap, &mut out),
    }?;
    Ok(out)
}

/// Reads `r` to its end into `out`, failing once more than `cap` bytes come out. The
/// buffer grows by doubling from its initial capacity and never beyond `cap + 1`.
fn read_capped<R: Read>(r: &mut R, cap: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let limit = cap.saturating_add(1);
    loop {
        let room = out.capacity() - out.len();
        if room == 0 {
            if out.len() >= limit {
                return Err(DecompressError::TooLarge);
            }
            let target = out
                .capacity()
                .max(MIN_INITIAL_BUFFER)
                .saturating_mul(2)
                .min(limit);
            out.reserve_exact(target - out.len());
            continue;
        }
        let before = out.len();
        // `take(room)` keeps read_to_end from growing the buffer on its own.
        r.by_ref().take(room as u64).read_to_end(out)?;
        if out.len() - before < room {
            // End of the stream before the buffer filled up.
            return if out.len() > cap {
                Err(DecompressError::TooLarge)
            } else {
                Ok(())
            };
        }
    }
}

/// gzip: one member, as librdkafka reads it (bytes after the first member are ignored, as
/// by Java's `GZIPInputStream` when they are not another member).
fn gzip(input: &[u8], cap: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let mut d = flate2::bufread::GzDecoder::new(input);
    read_capped(&mut d, cap, out)
}

/// snappy: xerial-framed (magic header, then `u32` big-endian length + raw block, repeated)
/// or, without the magic, one raw block. Each block's decompressed length is read from
/// its header and checked against the cap before anything is allocated for it.
fn snappy(input: &[u8], cap: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let block = |compressed: &[u8], out: &mut Vec<u8>| -> Result<(), DecompressError> {
        let len = snap::raw::decompress_len(compressed)
            .map_err(|e| DecompressError::Bad(format!("bad snappy block header: {e}")))?;
        if len > cap - out.len() {
            return Err(DecompressError::TooLarge);
        }
        let start = out.len();
        out.resize(start + len, 0);
        let n = snap::raw::Decoder::new()
            .decompress(compressed, &mut out[start..])
            .map_err(|e| DecompressError::Bad(format!("bad snappy block: {e}")))?;
        out.truncate(start + n);
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        return block(input, out);
    }
    if input.len() < XERIAL_HEADER_BYTES {
        return Err(DecompressError::Bad(format!(
            "xerial snappy header truncated at {} bytes",
            input.len()
        )));
    }
    let mut rest = &input[XERIAL_HEADER_BYTES..];
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(DecompressError::Bad(
                "xerial snappy block length truncated".into(),
            ));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len > tail.len() {
            return Err(DecompressError::Bad(format!(
                "xerial snappy block of {len} bytes, only {} left",
                tail.len()
            )));
        }
        block(&tail[..len], out)?;
        rest = &tail[len..];
    }
    Ok(())
}

/// lz4: the standard LZ4 frame (what Kafka's `KafkaLZ4BlockOutputStream` and librdkafka
/// write), block and content checksums verified when present. A truncated frame is an
/// error; bytes after the end mark are ignored (as Kafka's reader does).
fn lz4(input: &[u8], cap: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let mut d = lz4::Decoder::new(input)?;
    read_capped(&mut d, cap, out)?;
    let (_, finished) = d.finish();
    finished.map_err(|_| DecompressError::Bad("lz4 frame is truncated (no end mark)".into()))
}

/// zstd: one or more frames. Windows up to 2^27 are accepted (zstd's default limit, as
/// Kafka's zstd-jni): Java producers stream without a pledged size, so their frames declare
/// the level's full window (2 MiB at level 3, 128 MiB at 22) whatever the batch size. The
/// window is allocated but only touched as output is produced, which the cap bounds.
fn zstd(input: &[u8], cap: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let mut d = zstd::stream::read::Decoder::with_buffer(input)?;
    d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
    read_capped(&mut d, cap, out)
}

/// zstd's own default `ZSTD_WINDOWLOG_LIMIT_DEFAULT`.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;
