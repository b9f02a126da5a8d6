//! Deleting a partition directory the way Kafka's `LogManager.asyncDelete` does: the
//! directory is first renamed, atomically, to `<topic>-<partition>.<unique id>-delete`
//! ([`rename_for_delete`]), which frees its name at once for a new topic of the same name
//! (KIP-516: a re-created topic has a new topic id and must never share a file with the
//! old one), and is removed later, off the path of the change ([`remove`]). A directory
//! with the suffix is never a partition: start-up lists the leftovers
//! ([`list_delete_dirs`]) only to remove them.
//!
//! Owns only the names and the file-system steps; who may still write to the old files
//! (nobody, once its owner marked the partition deleted) is `replica.rs`'s concern.

use std::path::{Path, PathBuf};

use super::segment::{io_error, sync_dir};
use super::LogError;

/// The suffix of a directory waiting to be removed (Kafka's `LocalLog.DeleteDirSuffix`).
pub const DELETE_DIR_SUFFIX: &str = "-delete";

/// Longest file name most file systems take (Kafka's limit for the renamed directory).
const MAX_NAME_BYTES: usize = 255;

/// The name a deleted partition's directory `dir_name` (`<topic>-<partition>`) is renamed
/// to (Kafka's `LocalLog.logDeleteDirName`): `<topic>-<partition>.<random UUID, 32 hex
/// digits>-delete`, the `<topic>-<partition>` prefix cut so the name fits in 255 bytes.
/// Unique: deleting the same partition twice never collides.
pub fn delete_dir_name(dir_name: &str) -> String {
    delete_dir_name_with(dir_name, &uuid::Uuid::new_v4().as_simple().to_string())
}

/// [`delete_dir_name`] with the given id instead of a random one: a partition moved to
/// another log dir leaves its old directory under the id of its future copy
/// (`relocate.rs`), which is how start-up tells a committed move.
pub fn delete_dir_name_with(dir_name: &str, id: &str) -> String {
    let suffix = format!(".{id}{DELETE_DIR_SUFFIX}");
    let mut prefix = dir_name.to_string();
    let room = MAX_NAME_BYTES - suffix.len();
    while prefix.len() > room {
        prefix.pop();
    }
    prefix + &suffix
}

/// Whether `name` (a file name in a log dir) is a directory waiting to be removed.
pub fn is_delete_dir(name: &str) -> bool {
    name.ends_with(DELETE_DIR_SUFFIX)
}

/// Renames partition directory `dir` (`<log.dirs>/<topic>-<partition>`) to its
/// [`delete_dir_name`] in the same log dir and makes the rename durable (the log dir is
/// fsynced). The caller must have stopped every writer of the old files first. Returns
/// the new path, or `None` when `dir` does not exist (nothing to delete).
///
/// Errors: [`LogError::Io`] (KAFKA_STORAGE_ERROR, 56): the rename or the fsync failed;
/// after a failed rename `dir` keeps its name.
pub fn rename_for_delete(dir: &Path) -> Result<Option<PathBuf>, LogError> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Ok(None);
    };
    let to = parent.join(delete_dir_name(&name.to_string_lossy()));
    match std::fs::rename(dir, &to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("rename for delete", dir)(e)),
    }
    sync_dir(parent)?;
    Ok(Some(to))
}

/// Removes a renamed directory and everything in it; one already gone is fine.
///
/// Errors: [`LogError::Io`]: something in it cannot be removed (it stays for a later try).
pub fn remove(dir: &Path) -> Result<(), LogError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("remove deleted partition directory", dir)(e)),
    }
}

/// The directories in `log_dir` waiting to be removed (left by a broker that stopped
/// before removing them; Kafka's `LogManager.loadLogs` queues them for deletion instead of
/// loading them).
///
/// Errors: [`LogError::Io`]: `log_dir` cannot be listed.
pub fn list_delete_dirs(log_dir: &Path) -> Result<Vec<PathBuf>, LogError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(log_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_error("list", log_dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_error("list", log_dir))?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && entry.file_name().to_str().is_some_and(is_delete_dir) {
            out.push(entry.path());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_directory_frees_its_name_and_is_found_and_removed_later() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t-0");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("00000000000000000000.log"), b"old").unwrap();
        let renamed = rename_for_delete(&dir).unwrap().unwrap();
        assert!(!dir.exists());
        let name = renamed.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("t-0.") && is_delete_dir(name), "{name}");
        assert_eq!(name.len(), "t-0.".len() + 32 + "-delete".len());
        assert!(renamed.join("00000000000000000000.log").exists());
        // The name is free for the new topic's directory at once.
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(rename_for_delete(&root.path().join("u-0")).unwrap(), None);
        assert_eq!(
            list_delete_dirs(root.path()).unwrap(),
            vec![renamed.clone()]
        );
        remove(&renamed).unwrap();
        remove(&renamed).unwrap();
        assert!(list_delete_dirs(root.path()).unwrap().is_empty());
        assert!(dir.is_dir());
    }

    #[test]
    fn the_name_fits_a_file_system_and_never_repeats() {
        let long = "x".repeat(249);
        let name = delete_dir_name(&format!("{long}-2000000000"));
        assert_eq!(name.len(), MAX_NAME_BYTES);
        assert!(is_delete_dir(&name) && name.starts_with("xxx"));
        assert_ne!(delete_dir_name("t-0"), delete_dir_name("t-0"));
    }
}
