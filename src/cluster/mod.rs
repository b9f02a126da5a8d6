//! Cluster metadata: which topics exist, their ids, partition counts and topic-level
//! configs, this broker's identity, and producer-id allocation.
//!
//! Owns: the metadata image (`MetadataImage`) and its durable form. On a single node the
//! image is persisted as one small TOML file per topic under `<log.dirs>/__cluster_metadata/`
//! (written to a temporary name, fsynced and renamed, so a crash leaves the old or the new
//! file, never half of one). The replicated metadata log of DESIGN.md (openraft) replaces
//! this file store when replication lands; the API stays.
//!
//! Never does: serve client APIs or write partition data (that is `replica` + `log`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest legal topic name (Kafka's `Topic.MAX_NAME_LENGTH`).
pub const TOPIC_NAME_MAX_LENGTH: usize = 249;

/// Why a topic name is refused (Kafka: INVALID_TOPIC_EXCEPTION, code 17; a `.`/`_`
/// collision is also code 17 in Kafka's CreateTopics, with its own message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicNameError {
    /// Empty, `.` or `..`.
    #[error("topic name is illegal, it can't be empty, '.' or '..'")]
    Empty,
    /// Longer than 249 characters.
    #[error("topic name is illegal, it can't be longer than 249 characters")]
    TooLong,
    /// A character outside `[a-zA-Z0-9._-]`.
    #[error("topic name `{0}` is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'")]
    IllegalCharacter(String),
    /// Collides with an existing topic once `.` and `_` are treated alike.
    #[error("topic `{0}` collides with existing topic `{1}` ('.' and '_' are treated alike)")]
    Collision(String, String),
}

/// Checks a topic name as Kafka's `Topic.validate` does.
///
/// Errors: [`TopicNameError`] (Kafka INVALID_TOPIC_EXCEPTION, 17).
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(TopicNameError::Empty);
    }
    if name.len() > TOPIC_NAME_MAX_LENGTH {
        return Err(TopicNameError::TooLong);
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(TopicNameError::IllegalCharacter(name.to_string()));
    }
    Ok(())
}

/// Kafka's internal topics (reported with `is_internal` in Metadata), and the connect
/// runtime's `__connect_configs`, `__connect_offsets`, `__connect_status` and
/// `__connect_state`: only the broker writes them (a client's produce would bypass the
/// runtime's in-memory state), so they are refused to Produce and DeleteTopics like `__consumer_offsets`. Kafka
/// itself treats Connect's topics as ordinary topics because its workers are clients.
pub fn is_internal_topic(name: &str) -> bool {
    matches!(
        name,
        "__consumer_offsets"
            | "__transaction_state"
            | "__connect_configs"
            | "__connect_offsets"
            | "__connect_status"
            | "__connect_state"
    )
}

/// One topic as the metadata image knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Topic name.
    pub name: String,
    /// Topic id (KIP-516), used by Metadata v10+ and Fetch v13+.
    pub id: Uuid,
    /// Number of partitions (only grows).
    pub partitions: i32,
    /// Replication factor as created (1 on a single node).
    pub replication_factor: i16,
    /// Topic-level config overrides (`retention.ms`, ...), Kafka names.
    pub configs: BTreeMap<String, String>,
}

/// Errors of the metadata store: environment failures, with context.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Reading or writing a metadata file failed.
    #[error("metadata I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A metadata file does not parse.
    #[error("metadata file {path} is corrupt: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

/// The broker's identity and the durable metadata image.
#[derive(Debug)]
pub struct Metadata {
    dir: PathBuf,
    cluster_id: String,
    node_id: i32,
    topics: RwLock<BTreeMap<String, TopicMeta>>,
    /// Next producer id; a block of ids is reserved on disk ahead of use.
    producer_ids: std::sync::Mutex<ProducerIdBlock>,
}

#[derive(Debug)]
struct ProducerIdBlock {
    next: i64,
    reserved_until: i64,
}

const PRODUCER_ID_BLOCK: i64 = 1000;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError + '_ {
    move |source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync of the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), MetadataError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Some(parent) = path.parent() {
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

impl Metadata {
    /// Opens (or creates) the metadata under `<log_dir>/__cluster_metadata`.
    ///
    /// Errors: [`MetadataError`] when the directory cannot be created or a file is corrupt.
    pub fn open(log_dir: &Path, node_id: i32) -> Result<Metadata, MetadataError> {
        let dir = log_dir.join("__cluster_metadata");
        let topics_dir = dir.join("topics");
        std::fs::create_dir_all(&topics_dir).map_err(io_err(&topics_dir))?;
        let meta_path = dir.join("meta.properties");
        let cluster_id = match std::fs::read_to_string(&meta_path) {
            Ok(text) => text
                .lines()
                .find_map(|l| l.strip_prefix("cluster.id="))
                .map(str::to_string)
                .ok_or_else(|| MetadataError::Corrupt {
                    path: meta_path.clone(),
                    message: "no cluster.id line".into(),
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = short_uuid(Uuid::new_v4());
                write_atomic(
                    &meta_path,
                    format!("version=1\ncluster.id={id}\nnode.id={node_id}\n").as_bytes(),
                )?;
                id
            }
            Err(e) => return Err(io_err(&meta_path)(e)),
        };
        let mut topics = BTreeMap::new();
        let entries = std::fs::read_dir(&topics_dir).map_err(io_err(&topics_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err(&topics_dir))?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
            let meta: TopicMeta = toml::from_str(&text).map_err(|e| MetadataError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
            topics.insert(meta.name.clone(), meta);
        }
        let pid_path = dir.join("producer_id");
        let reserved = match std::fs::read_to_string(&pid_path) {
            Ok(t) => t
                .trim()
                .parse::<i64>()
                .map_err(|e| MetadataError::Corrupt {
                    path: pid_path.clone(),
                    message: e.to_string(),
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(&pid_path)(e)),
        };
        Ok(Metadata {
            dir,
            cluster_id,
            node_id,
            topics: RwLock::new(topics),
            producer_ids: std::sync::Mutex::new(ProducerIdBlock {
                // Ids handed out before a crash are below `reserved`: start past them.
                next: reserved,
                reserved_until: reserved,
            }),
        })
    }

    /// The cluster id (generated at first start, KIP-78 style, 22 base64url characters).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// This broker's node id.
    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// A copy of one topic's metadata.
    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.read().get(name).cloned()
    }

    /// The topic with this id (Fetch v13+, DeleteTopics v6).
    pub fn topic_by_id(&self, id: Uuid) -> Option<TopicMeta> {
        self.read().values().find(|t| t.id == id).cloned()
    }

    /// A copy of every topic, by name.
    pub fn topics(&self) -> Vec<TopicMeta> {
        self.read().values().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, TopicMeta>> {
        // A poisoned lock means a panic while holding it: a bug, crash loudly.
        self.topics.read().expect("metadata lock poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, TopicMeta>> {
        self.topics.write().expect("metadata lock poisoned")
    }

    /// An existing topic whose name equals `name` once `.` and `_` are made alike.
    pub fn colliding_topic(&self, name: &str) -> Option<String> {
        let norm = name.replace('.', "_");
        self.read()
            .keys()
            .find(|t| t.as_str() != name && t.replace('.', "_") == norm)
            .cloned()
    }

    /// Adds a topic and persists it. Returns `Ok(None)` if the name already exists.
    ///
    /// Errors: [`MetadataError`] if it cannot be written (the topic is then not added).
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
    ) -> Result<Option<TopicMeta>, MetadataError> {
        let mut topics = self.write();
        if topics.contains_key(name) {
            return Ok(None);
        }
        let meta = TopicMeta {
            name: name.to_string(),
            id: Uuid::new_v4(),
            partitions,
            replication_factor,
            configs,
        };
        self.persist(&meta)?;
        topics.insert(name.to_string(), meta.clone());
        Ok(Some(meta))
    }

    /// Grows a topic to `partitions`; returns the updated metadata, or `None` if unknown.
    pub fn set_partitions(
        &self,
        name: &str,
        partitions: i32,
    ) -> Result<Option<TopicMeta>, MetadataError> {
        let mut topics = self.write();
        let Some(meta) = topics.get(name).cloned() else {
            return Ok(None);
        };
        let updated = TopicMeta { partitions, ..meta };
        self.persist(&updated)?;
        topics.insert(name.to_string(), updated.clone());
        Ok(Some(updated))
    }

    /// Replaces a topic's config overrides (AlterConfigs, IncrementalAlterConfigs) and
    /// persists them; returns the updated metadata, or `None` if the topic is unknown.
    /// The caller validates the configs first.
    ///
    /// Errors: [`MetadataError`] if it cannot be written (the image keeps the old configs).
    pub fn set_topic_configs(
        &self,
        name: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<Option<TopicMeta>, MetadataError> {
        let mut topics = self.write();
        let Some(meta) = topics.get(name).cloned() else {
            return Ok(None);
        };
        let updated = TopicMeta { configs, ..meta };
        self.persist(&updated)?;
        topics.insert(name.to_string(), updated.clone());
        Ok(Some(updated))
    }

    /// Removes a topic from the image and from disk; returns what was removed.
    pub fn delete_topic(&self, name: &str) -> Result<Option<TopicMeta>, MetadataError> {
        let mut topics = self.write();
        let Some(meta) = topics.remove(name) else {
            return Ok(None);
        };
        let path = self.topic_path(name);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                topics.insert(name.to_string(), meta);
                return Err(io_err(&path)(e));
            }
        }
        Ok(Some(meta))
    }

    fn topic_path(&self, name: &str) -> PathBuf {
        self.dir.join("topics").join(format!("{name}.toml"))
    }

    fn persist(&self, meta: &TopicMeta) -> Result<(), MetadataError> {
        let path = self.topic_path(&meta.name);
        let text = toml::to_string(meta).map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&path, text.as_bytes())
    }

    /// Hands out a new producer id (InitProducerId). Ids are unique across restarts: a
    /// block of [`PRODUCER_ID_BLOCK`] ids is reserved on disk before any of it is used.
    pub fn next_producer_id(&self) -> Result<i64, MetadataError> {
        let mut block = self.producer_ids.lock().expect("producer id lock poisoned");
        if block.next >= block.reserved_until {
            let until = block.reserved_until + PRODUCER_ID_BLOCK;
            write_atomic(&self.dir.join("producer_id"), until.to_string().as_bytes())?;
            block.reserved_until = until;
        }
        let id = block.next;
        block.next += 1;
        Ok(id)
    }
}

/// Kafka prints cluster ids as the 16 uuid bytes in unpadded base64url.
fn short_uuid(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert_eq!(validate_topic_name(".."), Err(TopicNameError::Empty));
        assert!(validate_topic_name("bad/name").is_err());
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
        assert_eq!(
            validate_topic_name(&"a".repeat(250)),
            Err(TopicNameError::TooLong)
        );
    }

    #[test]
    fn topics_and_producer_ids_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let m = Metadata::open(dir.path(), 1).unwrap();
        let t = m
            .create_topic("a.b", 3, 1, BTreeMap::new())
            .unwrap()
            .unwrap();
        assert!(m
            .create_topic("a.b", 3, 1, BTreeMap::new())
            .unwrap()
            .is_none());
        assert_eq!(m.colliding_topic("a_b"), Some("a.b".to_string()));
        let p1 = m.next_producer_id().unwrap();
        let cluster = m.cluster_id().to_string();
        assert_eq!(cluster.len(), 22);
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        assert_eq!(m.topic("a.b"), Some(t));
        assert_eq!(m.cluster_id(), cluster);
        assert!(m.next_producer_id().unwrap() > p1);
        m.set_partitions("a.b", 5).unwrap();
        let configs = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
        assert!(m
            .set_topic_configs("nope", configs.clone())
            .unwrap()
            .is_none());
        m.set_topic_configs("a.b", configs.clone())
            .unwrap()
            .unwrap();
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        let t = m.topic("a.b").unwrap();
        assert_eq!((t.partitions, &t.configs), (5, &configs));
        m.delete_topic("a.b").unwrap();
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        assert!(m.topics().is_empty());
    }
}
