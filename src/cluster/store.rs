//! Where metadata records are made durable: the [`MetadataLog`] trait and its one
//! implementation today, [`FileMetadataLog`].
//!
//! Owns: the on-disk form of the metadata under `<log.dirs>/__cluster_metadata/`:
//! `meta.properties` (cluster id, written once), `topics/<name>.toml` (one small file per
//! topic: name, id, partition count, replication factor, config overrides) and
//! `producer_id` (the producer ids reserved). Every file is written to a temporary name,
//! fsynced and renamed, so a crash leaves the old or the new file, never half of one. The
//! layout is the one weir has always written: a data directory of an earlier version opens
//! unchanged, and one written now opens in an earlier version.
//!
//! The replicated metadata log (`cluster/raft/`, openraft, `__cluster_metadata` as a
//! log) implements the same trait; the file store is what it migrates from, and what
//! unit tests of the layers above use.
//!
//! Never does: interpret records beyond storing them (the image is built by
//! [`super::MetadataDelta`]), or hold a lock of its own (the caller serialises appends).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::image::{MetadataRecord, PartitionState, TopicMeta};
use super::MetadataError;

/// A durable, ordered store of metadata records. Narrow on purpose: a file store, an
/// in-memory store in tests and a replicated (Raft) log all fit.
///
/// A local store makes records durable when asked and is the only writer. A replicated
/// log (`cluster/raft/`) also commits changes proposed by other nodes: `append` returns
/// the offset its change landed at, and [`MetadataLog::take_committed`] hands back every
/// change committed since the last call, that one included, in log order, for the
/// caller to apply to its image.
pub trait MetadataLog: Send + std::fmt::Debug {
    /// The records that rebuild the metadata written so far, oldest first (a log may
    /// return a compacted form: one `TopicCreated` per live topic instead of its history).
    /// Called once, at start-up, before any [`MetadataLog::append`].
    ///
    /// Errors: [`MetadataError`] when the store cannot be read or does not parse.
    fn replay(&mut self) -> Result<Vec<MetadataRecord>, MetadataError>;

    /// Makes `records` durable, in order: when it returns `Ok`, a restart replays them.
    /// The caller has applied them to its image first (they are valid there) and makes
    /// them visible only after this returns `Ok`. A replicated log proposes them and
    /// returns once they are committed and applied by its own state machine, with the
    /// offset of their entry (`Some`); a local store returns `None`.
    ///
    /// Errors: [`MetadataError`] when they cannot be written (or committed in time); the
    /// caller then treats the change as not made. (The file store writes one file per
    /// record: records before the failing one may be durable. Each is a whole change of
    /// its own.)
    fn append(&mut self, records: &[MetadataRecord]) -> Result<Option<u64>, MetadataError>;

    /// The changes committed since the last call (or since what `replay` returned), in
    /// log order: what other nodes proposed, and this node's own after `append`. A local
    /// store has none.
    fn take_committed(&mut self) -> Vec<super::raft::Committed> {
        Vec::new()
    }

    /// What a thread applying other nodes' changes waits on (`None`: a local store, where
    /// no change comes from elsewhere).
    fn committed_queue(&self) -> Option<std::sync::Arc<super::raft::CommittedQueue>> {
        None
    }

    /// Who leads the quorum and where broker heartbeats go (`None`: a local store, a
    /// node alone without registrations).
    fn quorum(&self) -> Option<std::sync::Arc<super::raft::QuorumHandle>> {
        None
    }

    /// Tests: the answer to the next committed proposal is lost once, so a replicated log
    /// proposes it again (a local store has no answer to lose).
    #[cfg(test)]
    fn lose_next_answer(&self) {}

    /// Tests: how many changes `append` found committed twice (a replicated log).
    #[cfg(test)]
    fn changes_committed_twice(&self) -> u64 {
        0
    }
}

/// The topic file, field for field what weir has always written (`topics/<name>.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TopicFile {
    name: String,
    id: Uuid,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
}

/// The metadata file store of a single node, under `<log.dirs>/__cluster_metadata/`.
///
/// It stores what a single node has: every partition's only replica, leader and ISR is
/// this node at leader epoch 0, so per-partition state is not written but rebuilt at
/// replay ([`PartitionState::single_node`]); a record with any other partition state is
/// refused ([`MetadataError::Unsupported`]).
#[derive(Debug)]
pub(crate) struct FileMetadataLog {
    dir: PathBuf,
    node_id: i32,
    /// The topics as stored, by id: a record names a topic by id, the file by name.
    topics: HashMap<Uuid, TopicFile>,
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError + '_ {
    move |source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync of the directory.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), MetadataError> {
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

impl FileMetadataLog {
    /// The store in `dir` (`<log.dirs>/__cluster_metadata`), created if missing, for node
    /// `node_id`.
    ///
    /// Errors: [`MetadataError::Io`] when the directory cannot be created.
    pub(crate) fn open(dir: &Path, node_id: i32) -> Result<FileMetadataLog, MetadataError> {
        let topics_dir = dir.join("topics");
        std::fs::create_dir_all(&topics_dir).map_err(io_err(&topics_dir))?;
        Ok(FileMetadataLog {
            dir: dir.to_path_buf(),
            node_id,
            topics: HashMap::new(),
        })
    }

    fn topic_path(&self, name: &str) -> PathBuf {
        self.dir.join("topics").join(format!("{name}.toml"))
    }

    fn write_topic(&self, t: &TopicFile) -> Result<(), MetadataError> {
        let path = self.topic_path(&t.name);
        let text = toml::to_string(t).map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&path, text.as_bytes())
    }

    fn check_states(&self, states: &[PartitionState]) -> Result<(), MetadataError> {
        let single = PartitionState::single_node(self.node_id);
        match states.iter().find(|s| **s != single) {
            None => Ok(()),
            Some(s) => Err(MetadataError::Unsupported(format!(
                "the single-node metadata store holds partitions led by node {} only, not {s:?}",
                self.node_id
            ))),
        }
    }

    fn known(&mut self, id: Uuid) -> Result<&mut TopicFile, MetadataError> {
        self.topics
            .get_mut(&id)
            .ok_or_else(|| MetadataError::Unsupported(format!("no stored topic with id {id}")))
    }
}

impl MetadataLog for FileMetadataLog {
    fn replay(&mut self) -> Result<Vec<MetadataRecord>, MetadataError> {
        let topics_dir = self.dir.join("topics");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&topics_dir).map_err(io_err(&topics_dir))? {
            let path = entry.map_err(io_err(&topics_dir))?.path();
            // `*.tmp` is a write a crash cut short: the `.toml` beside it (if any) holds.
            if path.extension().and_then(|e| e.to_str()) == Some("toml") {
                files.push(path);
            }
        }
        files.sort();
        let mut records = Vec::with_capacity(files.len() + 1);
        self.topics.clear();
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
            let t: TopicFile = toml::from_str(&text).map_err(|e| MetadataError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
            if t.partitions < 1 {
                return Err(MetadataError::Corrupt {
                    path,
                    message: format!("{} partitions", t.partitions),
                });
            }
            let states = vec![PartitionState::single_node(self.node_id); t.partitions as usize];
            records.push(MetadataRecord::TopicCreated(TopicMeta {
                name: t.name.clone(),
                id: t.id,
                partitions: t.partitions,
                replication_factor: t.replication_factor,
                configs: t.configs.clone(),
                partition_states: states.into(),
            }));
            self.topics.insert(t.id, t);
        }
        let pid_path = self.dir.join("producer_id");
        match std::fs::read_to_string(&pid_path) {
            Ok(text) => {
                let reserved_until =
                    text.trim()
                        .parse::<i64>()
                        .map_err(|e| MetadataError::Corrupt {
                            path: pid_path.clone(),
                            message: e.to_string(),
                        })?;
                records.push(MetadataRecord::ProducerIdsReserved { reserved_until });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&pid_path)(e)),
        }
        Ok(records)
    }

    fn append(&mut self, records: &[MetadataRecord]) -> Result<Option<u64>, MetadataError> {
        for record in records {
            match record {
                MetadataRecord::TopicCreated(t) => {
                    self.check_states(&t.partition_states)?;
                    let file = TopicFile {
                        name: t.name.clone(),
                        id: t.id,
                        partitions: t.partitions,
                        replication_factor: t.replication_factor,
                        configs: t.configs.clone(),
                    };
                    self.write_topic(&file)?;
                    self.topics.insert(t.id, file);
                }
                MetadataRecord::PartitionsAdded {
                    topic_id,
                    partitions,
                    first_partition,
                } => {
                    self.check_states(partitions)?;
                    let added = i32::try_from(partitions.len()).map_err(|_| {
                        MetadataError::Unsupported("too many partitions".to_string())
                    })?;
                    let mut file = self.known(*topic_id)?.clone();
                    if let Some(first) = first_partition.filter(|&f| f != file.partitions) {
                        return Err(MetadataError::Unsupported(format!(
                            "topic {} has {} partitions, so partitions from {first} cannot be added",
                            file.name, file.partitions
                        )));
                    }
                    file.partitions += added;
                    self.write_topic(&file)?;
                    self.topics.insert(*topic_id, file);
                }
                MetadataRecord::TopicConfigsChanged { topic_id, configs } => {
                    let mut file = self.known(*topic_id)?.clone();
                    file.configs = configs.clone();
                    self.write_topic(&file)?;
                    self.topics.insert(*topic_id, file);
                }
                MetadataRecord::TopicDeleted { topic_id } => {
                    let name = self.known(*topic_id)?.name.clone();
                    let path = self.topic_path(&name);
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_err(&path)(e)),
                    }
                    self.topics.remove(topic_id);
                }
                MetadataRecord::ProducerIdsReserved { reserved_until } => {
                    write_atomic(
                        &self.dir.join("producer_id"),
                        reserved_until.to_string().as_bytes(),
                    )?;
                }
                // The earlier layout has no place for them; a broker on this store (only
                // the upgrade test makes one) is alone and never registers.
                MetadataRecord::BrokerRegistered { .. }
                | MetadataRecord::BrokerFenced { .. }
                | MetadataRecord::BrokerUnfenced { .. }
                | MetadataRecord::BrokerShuttingDown { .. }
                | MetadataRecord::ReplicasOffline { .. }
                | MetadataRecord::PartitionChanged { .. } => {
                    return Err(MetadataError::Unsupported(
                        "the single-node metadata file store holds no broker registrations"
                            .to_string(),
                    ))
                }
                MetadataRecord::TransformDeployed { .. }
                | MetadataRecord::TransformDeleted { .. }
                | MetadataRecord::BrokerConfigsChanged { .. } => {
                    return Err(MetadataError::Unsupported(
                        "the single-node metadata file store holds no transform deployments nor dynamic broker configs"
                            .to_string(),
                    ))
                }
            }
        }
        Ok(None)
    }
}

/// A [`MetadataLog`] in memory, for tests: keeps every record, and fails the next
/// append when told to (to drive the not-applied paths).
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct MemoryMetadataLog {
    pub(crate) records: Vec<MetadataRecord>,
    pub(crate) fail_next_append: bool,
}

#[cfg(test)]
impl MetadataLog for MemoryMetadataLog {
    fn replay(&mut self) -> Result<Vec<MetadataRecord>, MetadataError> {
        Ok(self.records.clone())
    }

    fn append(&mut self, records: &[MetadataRecord]) -> Result<Option<u64>, MetadataError> {
        if std::mem::take(&mut self.fail_next_append) {
            return Err(MetadataError::Unsupported("injected append failure".into()));
        }
        self.records.extend_from_slice(records);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files exactly as weir wrote them before the metadata image (and still does).
    const OLD_TOPIC: &str = "name = \"orders.v1\"\n\
        id = \"67e55044-10b1-426f-9247-bb680e5fe0c8\"\n\
        partitions = 3\n\
        replication_factor = 1\n\
        \n\
        [configs]\n\
        \"cleanup.policy\" = \"compact\"\n\
        \"retention.ms\" = \"1000\"\n";
    const OLD_EMPTY_CONFIGS: &str = "name = \"__consumer_offsets\"\n\
        id = \"0b7c9c5e-4b8e-4f63-a7a8-3a1d1b0b4c11\"\n\
        partitions = 50\n\
        replication_factor = 1\n\
        \n\
        [configs]\n";

    fn old_layout(dir: &Path) {
        let md = dir.join("__cluster_metadata");
        std::fs::create_dir_all(md.join("topics")).unwrap();
        std::fs::write(
            md.join("meta.properties"),
            "version=1\ncluster.id=q1Sh-9_ISia_zwGINzRvyQ\nnode.id=1\n",
        )
        .unwrap();
        std::fs::write(md.join("topics/orders.v1.toml"), OLD_TOPIC).unwrap();
        std::fs::write(md.join("topics/__consumer_offsets.toml"), OLD_EMPTY_CONFIGS).unwrap();
        // A write a crash cut short: ignored.
        std::fs::write(md.join("topics/half.tmp"), "name = ").unwrap();
        std::fs::write(md.join("producer_id"), "2000").unwrap();
    }

    #[test]
    fn replays_a_directory_written_by_earlier_versions() {
        let dir = tempfile::tempdir().unwrap();
        old_layout(dir.path());
        let mut log = FileMetadataLog::open(&dir.path().join("__cluster_metadata"), 1).unwrap();
        let records = log.replay().unwrap();
        assert_eq!(records.len(), 3, "{records:?}");
        let MetadataRecord::TopicCreated(offsets) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!(
            (offsets.name.as_str(), offsets.partitions),
            ("__consumer_offsets", 50)
        );
        assert!(offsets.configs.is_empty());
        let MetadataRecord::TopicCreated(orders) = &records[1] else {
            panic!("{records:?}")
        };
        assert_eq!(orders.name, "orders.v1");
        assert_eq!(
            orders.id,
            "67e55044-10b1-426f-9247-bb680e5fe0c8"
                .parse::<Uuid>()
                .unwrap()
        );
        assert_eq!((orders.partitions, orders.replication_factor), (3, 1));
        assert_eq!(orders.configs["cleanup.policy"], "compact");
        assert_eq!(orders.configs["retention.ms"], "1000");
        assert_eq!(
            &orders.partition_states[..],
            &vec![PartitionState::single_node(1); 3][..]
        );
        assert_eq!(
            records[2],
            MetadataRecord::ProducerIdsReserved {
                reserved_until: 2000
            }
        );
    }

    #[test]
    fn writes_the_format_earlier_versions_read() {
        let dir = tempfile::tempdir().unwrap();
        old_layout(dir.path());
        let md = dir.path().join("__cluster_metadata");
        let mut log = FileMetadataLog::open(&md, 1).unwrap();
        let records = log.replay().unwrap();
        let MetadataRecord::TopicCreated(orders) = &records[1] else {
            panic!("{records:?}")
        };
        // Rewriting a topic unchanged gives the bytes the earlier version wrote.
        log.append(&[MetadataRecord::TopicConfigsChanged {
            topic_id: orders.id,
            configs: orders.configs.clone(),
        }])
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(md.join("topics/orders.v1.toml")).unwrap(),
            OLD_TOPIC
        );
        log.append(&[MetadataRecord::PartitionsAdded {
            topic_id: orders.id,
            partitions: vec![PartitionState::single_node(1); 2],
            first_partition: Some(3),
        }])
        .unwrap();
        let text = std::fs::read_to_string(md.join("topics/orders.v1.toml")).unwrap();
        assert!(text.contains("partitions = 5\n"), "{text}");
        // Another node's partition is not something this store can hold.
        let other = PartitionState::single_node(2);
        let err = log
            .append(&[MetadataRecord::PartitionsAdded {
                topic_id: orders.id,
                partitions: vec![other],
                first_partition: None,
            }])
            .unwrap_err();
        assert!(matches!(err, MetadataError::Unsupported(_)), "{err}");
        log.append(&[MetadataRecord::TopicDeleted {
            topic_id: orders.id,
        }])
        .unwrap();
        assert!(!md.join("topics/orders.v1.toml").exists());
        let mut again = FileMetadataLog::open(&md, 1).unwrap();
        assert_eq!(again.replay().unwrap().len(), 2);
    }
}
