//! weir's built-in `file-sink` connector: appends each record's value as a line to a
//! file, as Kafka Connect's `FileStreamSink`.
//!
//! Keys: `file` (required; created if missing; the runtime grants the file's directory,
//! read-write, and nothing else).
//!
//! - `put` writes the batch's lines (value bytes then `\n`; a null value writes the line
//!   `null`, as `FileStreamSink` prints it) in one write; `flush` fsyncs the file, so the
//!   runtime commits the offsets only of lines that are on disk.
//! - After a crash the runtime puts again what was put after the last flush: those lines
//!   are appended again (at-least-once).
//! - A crash in the middle of a `put` can leave a torn last line (the write reached the
//!   file in parts). Every committed record's line ended with `\n` before its offset was
//!   committed, so bytes after the file's last `\n` belong to a record that is put again:
//!   `open` cuts them off (logged), and the file never holds a torn line.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

wit_bindgen::generate!({
    world: "sink-connector",
    path: "../../wit",
});

use exports::weir::plugin::sink::Guest;
use weir::plugin::connector_types::{PutResult, SinkRecord, TopicOffset, TopicPartition};
use weir::plugin::log::{log, Level};
use weir::plugin::types::PluginError;

struct State {
    path: String,
    file: File,
    buf: Vec<u8>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn error(message: String) -> PluginError {
    PluginError {
        message,
        record_index: None,
    }
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, PluginError>) -> Result<T, PluginError> {
    STATE.with(|s| match s.borrow_mut().as_mut() {
        Some(state) => f(state),
        None => Err(error("called before open".into())),
    })
}

/// The byte offset just after the last `\n` of the file (`len` bytes long), 0 when it has
/// none; read backwards in chunks.
fn end_of_last_line(file: &mut File, len: u64) -> std::io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let part = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(part)?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

struct FileSink;

impl Guest for FileSink {
    fn open(
        config: Vec<(String, String)>,
        _partitions: Vec<TopicPartition>,
    ) -> Result<(), PluginError> {
        let path = config
            .iter()
            .rev()
            .find(|(k, _)| k == "file")
            .map(|(_, v)| v.clone())
            .filter(|f| !f.is_empty())
            .ok_or_else(|| error("missing required key `file`".into()))?;
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| error(format!("cannot open {path} for appending: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| error(format!("cannot stat {path}: {e}")))?
            .len();
        let whole = end_of_last_line(&mut file, len)
            .map_err(|e| error(format!("cannot read {path}: {e}")))?;
        if whole < len {
            file.set_len(whole)
                .map_err(|e| error(format!("cannot cut the torn last line of {path}: {e}")))?;
            log(
                Level::Warn,
                &format!(
                    "{path} ended with {} bytes of a torn line (a crash during a write); cut off, the record is put again",
                    len - whole
                ),
            );
        }
        log(Level::Info, &format!("appending to {path}"));
        STATE.with(|s| {
            *s.borrow_mut() = Some(State {
                path,
                file,
                buf: Vec::new(),
            })
        });
        Ok(())
    }

    fn put(records: Vec<SinkRecord>) -> Result<PutResult, PluginError> {
        with_state(|s| {
            s.buf.clear();
            for r in &records {
                match &r.record.value {
                    Some(v) => s.buf.extend_from_slice(v),
                    None => s.buf.extend_from_slice(b"null"),
                }
                s.buf.push(b'\n');
            }
            s.file
                .write_all(&s.buf)
                .map_err(|e| error(format!("cannot write {}: {e}", s.path)))?;
            Ok(PutResult {
                errant: Vec::new(),
                retry: None,
            })
        })
    }

    fn flush(_offsets: Vec<TopicOffset>) -> Result<(), PluginError> {
        with_state(|s| {
            s.file
                .sync_all()
                .map_err(|e| error(format!("cannot fsync {}: {e}", s.path)))
        })
    }

    fn close() {
        STATE.with(|s| *s.borrow_mut() = None);
    }
}

export!(FileSink);
