//! The topic id a partition directory belongs to: Kafka's `partition.metadata` file
//! (KIP-516), `version: 0` and `topic_id: <id>` (the id as Kafka prints a `Uuid`:
//! URL-safe base64 of its 16 bytes, no padding).
//!
//! Directories are named by topic name only, so without the id a directory left by a
//! deleted topic (its broker was down at the delete) is indistinguishable from one of a
//! new topic of the same name: its old records would reappear at the new topic's offsets,
//! and truncation by leader epoch cannot tell them apart either (both start at epoch 0).
//! [`claim`] settles it before a partition's log is opened.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::checkpoint::write_atomically;
use super::segment::io_error;
use super::LogError;

/// The file's name in a partition directory (Kafka's).
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// What [`claim`] found in a partition directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// No directory yet, or it names this topic id: open it.
    Ours,
    /// A directory without the file (made by an earlier weir): adopted as this topic's;
    /// the file is written.
    Adopted,
    /// The directory belonged to another topic id (a deleted topic of the same name): it
    /// was renamed `<topic>-<partition>.<uuid>-delete` with its records
    /// (`delete::rename_for_delete`), for the caller to remove; a new directory is made.
    StrayRemoved {
        /// The other topic id.
        stray_topic_id: uuid::Uuid,
        /// Where the old directory went.
        renamed: PathBuf,
    },
}

fn format(topic_id: uuid::Uuid) -> String {
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic_id.as_bytes());
    format!("version: 0\ntopic_id: {id}\n")
}

/// The topic id in a `partition.metadata` text; `None` when it does not parse.
fn parse(text: &str) -> Option<uuid::Uuid> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "version: 0" {
        return None;
    }
    let id = lines.next()?.trim().strip_prefix("topic_id:")?.trim();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id)
        .ok()?;
    uuid::Uuid::from_slice(&bytes).ok()
}

/// Makes `dir` the directory of topic `topic_id`'s partition, before its log is opened
/// (Kafka's `Partition.checkOrSetTopicId` and KIP-858's stray logs): a directory whose
/// `partition.metadata` names another id is renamed away for removal (as a deleted
/// partition's is: `delete.rs`); the file is written (temp file,
/// fsync, rename, directory fsync) wherever it is missing, so the directory must exist
/// or is created. A file that does not parse is treated as missing (warned about):
/// refusing to start over it would keep a partition offline for a file only this
/// check reads.
///
/// Errors: [`LogError::Io`]: the directory cannot be read, renamed, created or written.
pub fn claim(dir: &Path, topic_id: uuid::Uuid) -> Result<Claim, LogError> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let existed = dir.exists();
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = parse(&text);
            if id.is_none() {
                tracing::warn!(path = %path.display(), "partition.metadata does not parse; rewritten");
            }
            id
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("read", &path)(e)),
    };
    let claim = match found {
        Some(id) if id == topic_id => return Ok(Claim::Ours),
        Some(other) => match super::delete::rename_for_delete(dir)? {
            Some(renamed) => Claim::StrayRemoved {
                stray_topic_id: other,
                renamed,
            },
            // Read a moment ago: gone since, so nothing of it is left.
            None => Claim::Ours,
        },
        None if existed => Claim::Adopted,
        None => Claim::Ours,
    };
    std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
    write_atomically(dir, PARTITION_METADATA_FILE, &format(topic_id))?;
    Ok(claim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_of_another_topic_id_is_removed_and_the_new_one_claimed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t-0");
        let (old, new) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        assert_eq!(claim(&dir, old).unwrap(), Claim::Ours);
        std::fs::write(dir.join("00000000000000000000.log"), b"old records").unwrap();
        assert_eq!(claim(&dir, old).unwrap(), Claim::Ours);
        assert!(dir.join("00000000000000000000.log").exists());
        let Claim::StrayRemoved {
            stray_topic_id,
            renamed,
        } = claim(&dir, new).unwrap()
        else {
            panic!("not removed");
        };
        assert_eq!(stray_topic_id, old);
        assert!(renamed.join("00000000000000000000.log").exists());
        assert!(!dir.join("00000000000000000000.log").exists());
        assert_eq!(claim(&dir, new).unwrap(), Claim::Ours);
        let text = std::fs::read_to_string(dir.join(PARTITION_METADATA_FILE)).unwrap();
        assert_eq!(parse(&text), Some(new));
        // Kafka's layout: a 22-character id.
        assert_eq!(text.lines().nth(1).unwrap().len(), "topic_id: ".len() + 22);
    }

    #[test]
    fn a_directory_without_the_file_or_with_a_broken_one_is_adopted() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t-0");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("00000000000000000000.log"), b"records").unwrap();
        let id = uuid::Uuid::new_v4();
        assert_eq!(claim(&dir, id).unwrap(), Claim::Adopted);
        assert!(dir.join("00000000000000000000.log").exists());
        std::fs::write(dir.join(PARTITION_METADATA_FILE), "garbage").unwrap();
        assert_eq!(claim(&dir, id).unwrap(), Claim::Adopted);
        assert_eq!(claim(&dir, id).unwrap(), Claim::Ours);
    }
}
