//! weir's built-in `file-source` connector: one record per line of a file, as Kafka
//! Connect's `FileStreamSource`.
//!
//! Keys: `file` (required; the runtime grants the file's directory, read-only, and
//! nothing else), `batch.size` (most lines per poll; the runtime passes it as
//! `max-records`).
//!
//! - A line ends at `\n`; a `\r` before it is dropped (CR LF files give the same records
//!   as LF files). The value is the line's bytes (not checked as UTF-8), the key null.
//! - A last line without its newline is not emitted until the newline arrives; then it is
//!   emitted as one line (what was appended joined to what was there).
//! - Source partition `{filename: <file>}`, source offset `{position: <byte offset just
//!   after the line's newline>}`. `open` resumes from the stored position.
//! - A file that does not exist yet is waited for (polls return nothing). Any other
//!   error opening or reading it (the sandbox refusing a path outside the grant, say)
//!   fails the poll with the OS's message.
//!
//! Not yet: following rotation and truncation (a file shorter than the position is
//! reported and waited on), notify instead of polling.

use std::cell::RefCell;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};

wit_bindgen::generate!({
    world: "source-connector",
    path: "../../wit",
});

use exports::weir::plugin::source::Guest;
use weir::plugin::connector_types::{SourcePosition, SourceRecord};
use weir::plugin::log::{log, Level};
use weir::plugin::types::{PluginError, Record};

/// Bytes read from the file per `read` call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Longest line kept whole, in bytes: a longer one fails the poll (the guest's memory is
/// capped; an unbounded line would exhaust it).
const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

struct State {
    path: String,
    /// Byte offset of `pending[0]` in the file: just after the last emitted line.
    position: u64,
    /// Bytes read after `position` that do not yet end a line.
    pending: Vec<u8>,
    file: Option<File>,
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

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

impl State {
    /// Opens the file when it exists; `Ok(false)` while it does not.
    fn ensure_open(&mut self) -> Result<bool, PluginError> {
        if self.file.is_some() {
            return Ok(true);
        }
        match File::open(&self.path) {
            Ok(mut f) => {
                let len = f
                    .metadata()
                    .map_err(|e| error(format!("cannot stat {}: {e}", self.path)))?
                    .len();
                if len < self.position {
                    log(
                        Level::Warn,
                        &format!(
                            "{} is {len} bytes, shorter than the stored position {}: waiting for it to grow (truncation is not followed yet)",
                            self.path, self.position
                        ),
                    );
                    return Ok(false);
                }
                // Bytes already read into `pending` are not read again.
                let resume = self.position + self.pending.len() as u64;
                if len < resume {
                    self.pending.clear();
                }
                f.seek(SeekFrom::Start(self.position + self.pending.len() as u64))
                    .map_err(|e| error(format!("cannot seek {}: {e}", self.path)))?;
                self.file = Some(f);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(error(format!("cannot open {}: {e}", self.path))),
        }
    }

    fn poll(&mut self, max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        if !self.ensure_open()? {
            return Ok(Vec::new());
        }
        let max = max_records.max(1) as usize;
        let mut lines = self.pending.iter().filter(|&&b| b == b'\n').count();
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        while lines < max {
            let Some(file) = self.file.as_mut() else {
                break;
            };
            let n = file
                .read(&mut chunk)
                .map_err(|e| error(format!("cannot read {}: {e}", self.path)))?;
            if n == 0 {
                // End of file. WASI's file input stream stays closed once it reported the
                // end, so appended bytes would never be seen through it: reopen at the
                // next poll (cheap, and where rotation will be noticed).
                self.file = None;
                break;
            }
            lines += chunk[..n].iter().filter(|&&b| b == b'\n').count();
            self.pending.extend_from_slice(&chunk[..n]);
            if lines == 0 && self.pending.len() > MAX_LINE_BYTES {
                return Err(error(format!(
                    "{}: a line at byte {} is longer than {MAX_LINE_BYTES} bytes",
                    self.path, self.position
                )));
            }
        }
        let mut out = Vec::with_capacity(lines.min(max));
        let mut start = 0;
        while out.len() < max {
            let Some(nl) = self.pending[start..].iter().position(|&b| b == b'\n') else {
                break;
            };
            let end = start + nl;
            let mut line = &self.pending[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let next = self.position + (end + 1) as u64;
            out.push(SourceRecord {
                record: Record {
                    key: None,
                    value: Some(line.to_vec()),
                    headers: Vec::new(),
                    timestamp_ms: 0,
                },
                source_partition: vec![("filename".into(), self.path.clone())],
                source_offset: vec![("position".into(), next.to_string())],
                topic: None,
            });
            start = end + 1;
        }
        self.pending.drain(..start);
        self.position += start as u64;
        Ok(out)
    }
}

struct FileSource;

impl Guest for FileSource {
    fn open(
        config: Vec<(String, String)>,
        offsets: Vec<SourcePosition>,
    ) -> Result<(), PluginError> {
        let path = get(&config, "file")
            .filter(|f| !f.is_empty())
            .ok_or_else(|| error("missing required key `file`".into()))?
            .to_string();
        let mut position = 0;
        for o in &offsets {
            if get(&o.source_partition, "filename") == Some(path.as_str()) {
                let p = get(&o.source_offset, "position").unwrap_or("0");
                position = p
                    .parse()
                    .map_err(|_| error(format!("stored position `{p}` is not a byte offset")))?;
            }
        }
        log(Level::Info, &format!("reading {path} from byte {position}"));
        STATE.with(|s| {
            *s.borrow_mut() = Some(State {
                path,
                position,
                pending: Vec::new(),
                file: None,
            })
        });
        Ok(())
    }

    fn poll(max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        STATE.with(|s| match s.borrow_mut().as_mut() {
            Some(state) => state.poll(max_records),
            None => Err(error("poll before open".into())),
        })
    }

    fn commit(_offsets: Vec<SourcePosition>) {}

    fn close() {
        STATE.with(|s| *s.borrow_mut() = None);
    }
}

export!(FileSource);
