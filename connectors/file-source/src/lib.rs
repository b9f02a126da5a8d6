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
//!   after the line's newline>, fingerprint: <hash of the file's first bytes>}`. `open`
//!   resumes from the stored position of the stored file.
//! - A file that does not exist yet is waited for (polls return nothing). Any other
//!   error opening or reading it (the sandbox refusing a path outside the grant, say)
//!   fails the poll with the OS's message.
//!
//! **Which file a position belongs to.** A position alone is ambiguous once the file is
//! rotated, so the offset also carries a fingerprint: FNV-1a 64 of the file's first
//! `min(position, 1024)` bytes — bytes already read, which an appended-to file never
//! changes. Each time the file is (re)opened its first bytes are checked against it:
//! - they match and the file is at least `position` long: the same file, read on;
//! - otherwise the file at `file` is a new one (rename-and-recreate) or was emptied in
//!   place (copytruncate). Before reading it from byte 0, the rest of the old file is
//!   read: the directory is searched for a file with the stored fingerprint and at least
//!   `position` bytes (the renamed file, or copytruncate's copy), and its complete lines
//!   after `position` are emitted first. When none is found (a plain truncation) the
//!   unread rest is gone, which is logged.
//!
//! The descriptor stays open across polls while lines are left to read, so each read is
//! checked the same way through the descriptor itself (a renamed or deleted file read
//! on is still the right file): a file emptied in place and written again drops what
//! was read, and the next poll follows the rotation. The checks also cover the bytes
//! read but not yet emitted (a poll of a new file reads several chunks before any
//! line is consumed).
//!
//! So after either kind of rotation every line is emitted once and in order, provided the
//! rotated file stays in the directory until it is drained. Inode numbers are not used:
//! WASI does not expose them, and copytruncate keeps the inode while changing the file.

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

/// How many of a file's first bytes its fingerprint covers.
const FINGERPRINT_BYTES: u64 = 1024;

/// FNV-1a 64: offset basis and prime.
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `state`.
fn fnv(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// The fingerprint of a file's first `min(position, FINGERPRINT_BYTES)` bytes, kept as
/// lines are consumed.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    hash: u64,
    /// Bytes covered: `min(position, FINGERPRINT_BYTES)`.
    len: u64,
}

impl Fingerprint {
    const EMPTY: Fingerprint = Fingerprint {
        hash: FNV_BASIS,
        len: 0,
    };

    /// Extends over consumed bytes starting at file offset `at`.
    fn consume(&mut self, at: u64, bytes: &[u8]) {
        if at != self.len || self.len >= FINGERPRINT_BYTES {
            return;
        }
        let take = (FINGERPRINT_BYTES - self.len).min(bytes.len() as u64) as usize;
        self.hash = fnv(self.hash, &bytes[..take]);
        self.len += take as u64;
    }

    fn text(&self) -> String {
        format!("{:016x}", self.hash)
    }
}

/// The file being read and where.
struct State {
    /// The configured file.
    path: String,
    /// Its directory (searched for the rotated file).
    dir: String,
    /// The file read now: `path`, or a rotated file whose rest is being read first.
    reading: String,
    /// Byte offset of `pending[0]` in `reading`: just after the last emitted line.
    position: u64,
    /// Fingerprint of `reading`'s bytes before `position`.
    fingerprint: Fingerprint,
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

/// Length of the open file `f` and whether its first `fp.len` bytes have fingerprint
/// `fp` (read from byte 0; the caller puts the position back where it needs it). A file
/// cut shorter while it is read does not match.
fn head_matches(f: &mut File, fp: Fingerprint) -> std::io::Result<(u64, bool)> {
    let len = f.metadata()?.len();
    if len < fp.len {
        return Ok((len, false));
    }
    let mut head = vec![0u8; fp.len as usize];
    f.seek(SeekFrom::Start(0))?;
    match f.read_exact(&mut head) {
        Ok(()) => Ok((len, fnv(FNV_BASIS, &head) == fp.hash)),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok((len, false)),
        Err(e) => Err(e),
    }
}

/// Length of `path` and whether its first `fp.len` bytes have fingerprint `fp`;
/// `Ok(None)` when it does not exist.
fn matches(path: &str, fp: Fingerprint) -> Result<Option<(u64, bool)>, PluginError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(error(format!("cannot open {path}: {e}"))),
    };
    head_matches(&mut f, fp)
        .map(Some)
        .map_err(|e| error(format!("cannot read {path}: {e}")))
}

impl State {
    /// Opens the file to read, following a rotation; `Ok(false)` while there is nothing
    /// to open.
    fn ensure_open(&mut self) -> Result<bool, PluginError> {
        if self.file.is_some() {
            return Ok(true);
        }
        let resume = self.position + self.pending.len() as u64;
        let fingerprint = self.resume_fingerprint();
        // The file being read is still there, whole: read on.
        let current = matches(&self.reading, fingerprint)?;
        let same = matches!(current, Some((len, true)) if len >= resume);
        if self.reading != self.path {
            // Draining a rotated file: switch to the new file once the writer uses it
            // (it has bytes) and the rotated file is read to its end.
            let new_len = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
            let drained = !same || current.is_some_and(|(len, _)| len <= resume);
            if new_len > 0 && drained {
                if !self.pending.is_empty() {
                    log(
                        Level::Warn,
                        &format!(
                            "{}: the rotated file ends without a newline; its last {} bytes were not emitted",
                            self.reading,
                            self.pending.len()
                        ),
                    );
                }
                self.switch_to_new();
            } else if !same {
                self.pending.clear();
                self.switch_to_new();
            }
        } else if !same && (self.position > 0 || !self.pending.is_empty()) {
            // `file` is another file now, or was emptied in place: read the rest of the
            // old one first when it is still in the directory.
            match self.find_rotated(fingerprint, resume)? {
                Some(rotated) => {
                    log(
                        Level::Info,
                        &format!(
                            "{} was rotated: reading the rest of {rotated} from byte {} first",
                            self.path, self.position
                        ),
                    );
                    self.reading = rotated;
                }
                None => {
                    log(
                        Level::Warn,
                        &format!(
                            "{} was truncated or replaced and the old file is gone: reading the new one from byte 0 (anything after byte {} of the old one was not read)",
                            self.path, resume
                        ),
                    );
                    self.switch_to_new();
                }
            }
        }
        match File::open(&self.reading) {
            Ok(mut f) => {
                let at = self.position + self.pending.len() as u64;
                f.seek(SeekFrom::Start(at))
                    .map_err(|e| error(format!("cannot seek {}: {e}", self.reading)))?;
                self.file = Some(f);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(error(format!("cannot open {}: {e}", self.reading))),
        }
    }

    /// Reads `path` from its start from now on.
    fn switch_to_new(&mut self) {
        self.reading = self.path.clone();
        self.position = 0;
        self.fingerprint = Fingerprint::EMPTY;
        self.pending.clear();
    }

    /// The fingerprint of `reading`'s bytes before the resume point (`position` plus the
    /// pending bytes): what the file read on must still start with.
    fn resume_fingerprint(&self) -> Fingerprint {
        let mut fingerprint = self.fingerprint;
        fingerprint.consume(self.position, &self.pending);
        fingerprint
    }

    /// Another file of the directory with the old file's `fingerprint` and at least
    /// `resume` bytes: the renamed file, or copytruncate's copy.
    fn find_rotated(
        &self,
        fingerprint: Fingerprint,
        resume: u64,
    ) -> Result<Option<String>, PluginError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                log(
                    Level::Warn,
                    &format!("cannot list {} to find the rotated file: {e}", self.dir),
                );
                return Ok(None);
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| format!("{}/{}", self.dir, e.file_name().to_string_lossy()))
            .filter(|p| *p != self.path)
            .collect();
        names.sort();
        for name in names {
            if let Some((len, true)) = matches(&name, fingerprint)? {
                if len >= resume {
                    return Ok(Some(name));
                }
            }
        }
        Ok(None)
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
                .map_err(|e| error(format!("cannot read {}: {e}", self.reading)))?;
            if n == 0 {
                // End of file. WASI's file input stream stays closed once it reported the
                // end, so appended bytes would never be seen through it: reopen at the
                // next poll (cheap, and where a rotation is noticed).
                self.file = None;
                break;
            }
            // The descriptor stays open across polls while lines are left to read. A file
            // emptied in place meanwhile (copytruncate) and written again past this offset
            // gave the new content's tail, which is neither the old file's next bytes nor
            // at this position in the new one: checked through the descriptor itself (a
            // renamed or deleted file read on is the right file), dropped, and the next
            // poll follows the rotation (the rest from the copy, then the new file).
            let at = self.position + self.pending.len() as u64;
            let read_to = at + n as u64;
            // resume_fingerprint(), field by field: `file` borrows `self.file`.
            let mut fingerprint = self.fingerprint;
            fingerprint.consume(self.position, &self.pending);
            fingerprint.consume(at, &chunk[..n]);
            let reading = &self.reading;
            let same = file
                .metadata()
                .and_then(|m| {
                    if !m.is_file() {
                        return Ok(true); // no length or head to compare
                    }
                    let (len, head) = head_matches(file, fingerprint)?;
                    file.seek(SeekFrom::Start(read_to))?;
                    Ok(head && len >= read_to)
                })
                .map_err(|e| error(format!("cannot read {reading}: {e}")))?;
            if !same {
                self.file = None;
                break;
            }
            lines += chunk[..n].iter().filter(|&&b| b == b'\n').count();
            self.pending.extend_from_slice(&chunk[..n]);
            if lines == 0 && self.pending.len() > MAX_LINE_BYTES {
                return Err(error(format!(
                    "{}: a line at byte {} is longer than {MAX_LINE_BYTES} bytes",
                    self.reading, self.position
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
            self.fingerprint
                .consume(self.position + start as u64, &self.pending[start..=end]);
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
                source_offset: vec![
                    ("position".into(), next.to_string()),
                    ("fingerprint".into(), self.fingerprint.text()),
                ],
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
        let dir = match path.rfind('/') {
            Some(0) => "/".to_string(),
            Some(i) => path[..i].to_string(),
            None => ".".to_string(),
        };
        let mut position = 0;
        let mut fingerprint = Fingerprint::EMPTY;
        for o in &offsets {
            if get(&o.source_partition, "filename") == Some(path.as_str()) {
                let p = get(&o.source_offset, "position").unwrap_or("0");
                position = p
                    .parse()
                    .map_err(|_| error(format!("stored position `{p}` is not a byte offset")))?;
                fingerprint.len = position.min(FINGERPRINT_BYTES);
                // An offset written before fingerprints existed names no file: trust the
                // position, as those versions did.
                fingerprint.hash = match get(&o.source_offset, "fingerprint") {
                    Some(h) => u64::from_str_radix(h, 16).map_err(|_| {
                        error(format!("stored fingerprint `{h}` is not a hex number"))
                    })?,
                    None => {
                        let mut head = vec![0u8; fingerprint.len as usize];
                        File::open(&path)
                            .and_then(|mut f| f.read_exact(&mut head))
                            .map(|()| fnv(FNV_BASIS, &head))
                            .unwrap_or(FNV_BASIS)
                    }
                };
            }
        }
        log(Level::Info, &format!("reading {path} from byte {position}"));
        STATE.with(|s| {
            *s.borrow_mut() = Some(State {
                reading: path.clone(),
                path,
                dir,
                position,
                fingerprint,
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
