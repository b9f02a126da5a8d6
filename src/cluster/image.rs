//! The metadata image and the records that change it.
//!
//! Owns: [`MetadataImage`] — an immutable snapshot of the cluster metadata (topics by name
//! and by id with per-partition replicas, leader, leader epoch and ISR; the producer ids
//! reserved; the registered brokers with their epochs and fencing; the replicas on a
//! broker's failed log dir, KIP-112/KIP-858; the dynamic broker configs by resource,
//! KIP-226; the cluster id and this node's id) — and
//! [`MetadataRecord`], the closed set
//! of changes, applied to an image as one [`MetadataDelta`]. Both are plain values:
//! applying a delta reads no clock and touches no file, so it is tested with plain values
//! and replayed the same way at start-up (Kafka's `MetadataImage`, `MetadataDelta` and
//! the KRaft records of `metadata/src/main/resources/common/metadata/`).
//!
//! Never does: I/O (that is the [`super::MetadataLog`]) or decide anything (the callers
//! in `cluster` validate before they build records; a record that does not apply to the
//! image is refused with [`ImageError`], never half applied).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::DynamicLayers;

/// One partition's replica assignment and leadership (Kafka's `PartitionRegistration`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Node ids holding a replica, the preferred leader first.
    pub replicas: Vec<i32>,
    /// In-sync replicas (node ids), a subset of `replicas`.
    pub isr: Vec<i32>,
    /// Node id of the leader (-1: none).
    pub leader: i32,
    /// Incremented at each leader change (KIP-101); 0 when created.
    pub leader_epoch: i32,
    /// Incremented at every change of leader or ISR (KIP-497's `partition_epoch`, Kafka's
    /// `PartitionRegistration.partitionEpoch`); 0 when created. A leader's ISR change
    /// names the epoch it saw, so a stale leader cannot overwrite a newer ISR.
    #[serde(default)]
    pub partition_epoch: i32,
    /// During a reassignment (KIP-455), the replicas of the target not in the original
    /// assignment: in `replicas`, catching up; empty otherwise.
    #[serde(default)]
    pub adding_replicas: Vec<i32>,
    /// During a reassignment (KIP-455), the original replicas not in the target: in
    /// `replicas` (after the target's) until the reassignment completes; empty otherwise.
    #[serde(default)]
    pub removing_replicas: Vec<i32>,
}

impl PartitionState {
    /// A partition whose only replica is `node_id`, leader at epoch 0: every partition of a
    /// single-node cluster.
    pub fn single_node(node_id: i32) -> PartitionState {
        PartitionState {
            replicas: vec![node_id],
            isr: vec![node_id],
            leader: node_id,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        }
    }

    /// Whether a reassignment is in progress (KIP-455): replicas are being added or
    /// removed.
    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas a reassignment in progress moves to (`replicas` without the removing
    /// ones), or `replicas` when none is.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas
            .iter()
            .copied()
            .filter(|r| !self.removing_replicas.contains(r))
            .collect()
    }

    /// Whether `broker_id` is in the ISR.
    pub fn in_isr(&self, broker_id: i32) -> bool {
        self.isr.contains(&broker_id)
    }

    /// This partition with leader `leader` and ISR `isr`: the partition epoch one up, the
    /// leader epoch one up when the leader is another (KIP-101: a new leadership is a new
    /// epoch; an ISR change keeps it). What a `PartitionChanged` record carries.
    pub fn changed(&self, leader: i32, isr: Vec<i32>) -> PartitionState {
        PartitionState {
            replicas: self.replicas.clone(),
            isr,
            leader,
            leader_epoch: self.leader_epoch + i32::from(leader != self.leader),
            partition_epoch: self.partition_epoch + 1,
            adding_replicas: self.adding_replicas.clone(),
            removing_replicas: self.removing_replicas.clone(),
        }
    }

    /// `next` (replicas, ISR, leader, reassignment) as the one change after this state:
    /// the partition epoch one up from this one's, the leader epoch one up when the
    /// leader differs (whatever epochs `next` carries). What a `PartitionChanged` built
    /// in several steps (a reassignment completed, then a leader elected) carries.
    pub fn succeeded_by(&self, next: PartitionState) -> PartitionState {
        PartitionState {
            leader_epoch: self.leader_epoch + i32::from(next.leader != self.leader),
            partition_epoch: self.partition_epoch + 1,
            ..next
        }
    }
}

/// Whether `new` may replace `current` in a `PartitionChanged` made against
/// `expected_partition_epoch`: the epoch matches, both epochs move forward (the leader
/// epoch strictly when the leader changes), the ISR and leader are among the replicas.
fn check_partition_change(
    current: &PartitionState,
    expected_partition_epoch: i32,
    new: &PartitionState,
) -> Result<(), String> {
    if current.partition_epoch != expected_partition_epoch {
        return Err(format!(
            "at partition epoch {}, not {expected_partition_epoch}",
            current.partition_epoch
        ));
    }
    if new.partition_epoch <= current.partition_epoch {
        return Err(format!(
            "partition epoch {} does not grow from {}",
            new.partition_epoch, current.partition_epoch
        ));
    }
    let leader_moved = new.leader != current.leader;
    if new.leader_epoch < current.leader_epoch
        || (leader_moved && new.leader_epoch == current.leader_epoch)
    {
        return Err(format!(
            "leader epoch {} does not grow from {}",
            new.leader_epoch, current.leader_epoch
        ));
    }
    let in_replicas = |id: &i32| new.replicas.contains(id);
    if new.replicas.is_empty()
        || !new.isr.iter().all(in_replicas)
        || (new.leader != -1 && !in_replicas(&new.leader))
    {
        return Err(format!(
            "leader {} or ISR {:?} outside replicas {:?}",
            new.leader, new.isr, new.replicas
        ));
    }
    if !new.adding_replicas.iter().all(in_replicas)
        || !new.removing_replicas.iter().all(in_replicas)
        || new
            .adding_replicas
            .iter()
            .any(|r| new.removing_replicas.contains(r))
    {
        return Err(format!(
            "adding {:?} or removing {:?} outside replicas {:?} or overlapping",
            new.adding_replicas, new.removing_replicas, new.replicas
        ));
    }
    Ok(())
}

/// One topic as the metadata image knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Topic name.
    pub name: String,
    /// Topic id (KIP-516), used by Metadata v10+ and Fetch v13+.
    pub id: Uuid,
    /// Number of partitions (only grows); always `partition_states.len()`.
    pub partitions: i32,
    /// Replication factor as created (1 on a single node).
    pub replication_factor: i16,
    /// Topic-level config overrides (`retention.ms`, ...), Kafka names.
    pub configs: BTreeMap<String, String>,
    /// Per-partition replicas, leader, leader epoch and ISR, by partition index (shared:
    /// a copy of the topic does not copy them).
    #[serde(with = "shared_slice")]
    pub partition_states: Arc<[PartitionState]>,
}

impl TopicMeta {
    /// The partitions `before` (this topic earlier) also had whose state (leader, ISR,
    /// replicas, epochs) differs now, as (index, state before, state now).
    pub fn changed_partitions<'a>(
        &'a self,
        before: &'a TopicMeta,
    ) -> impl Iterator<Item = (i32, &'a PartitionState, &'a PartitionState)> + 'a {
        before
            .partition_states
            .iter()
            .zip(self.partition_states.iter())
            .zip(0..)
            .filter(|((old, new), _)| old != new)
            .map(|((old, new), index)| (index, old, new))
    }

    /// The state of partition `index`, if the topic has it.
    pub fn partition(&self, index: i32) -> Option<&PartitionState> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partition_states.get(i))
    }
}

/// `Arc<[T]>` as a plain sequence (serde's `rc` feature is not on, and one field needs it).
mod shared_slice {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<T: Serialize, S: Serializer>(
        items: &Arc<[T]>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        items[..].serialize(s)
    }

    pub(super) fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<[T]>, D::Error> {
        Vec::<T>::deserialize(d).map(Arc::from)
    }
}

/// One endpoint a registered broker advertises (Kafka's `BrokerEndpoint` of
/// `RegisterBrokerRecord`, KIP-631): an `advertised.listeners` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoint {
    /// Listener name, e.g. `PLAINTEXT`.
    pub name: String,
    /// Host clients connect to.
    pub host: String,
    /// Port clients connect to.
    pub port: i32,
}

/// A broker as the metadata knows it (Kafka's `BrokerRegistration`): its latest
/// registration and whether it is fenced (KIP-631).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    /// The broker's `node.id`.
    pub broker_id: i32,
    /// Epoch of this registration: greater than every epoch handed out before it, to any
    /// broker, so a restarted broker's epoch is higher than its previous one.
    pub broker_epoch: i64,
    /// Random per process start: tells a restart from a retried registration.
    pub incarnation_id: Uuid,
    /// Advertised endpoints, the first being the one Metadata lists.
    pub endpoints: Vec<BrokerEndpoint>,
    /// `broker.rack`, if set (Metadata v1+, DescribeCluster).
    pub rack: Option<String>,
    /// Fenced: its session lapsed (no heartbeat for `broker.session.timeout.ms`) or it
    /// shut down; clients are not told of it.
    pub fenced: bool,
    /// In controlled shutdown (KIP-631's `inControlledShutdown`): it asked to stop;
    /// clients are not told of it, no new replica goes to it, heartbeats do not unfence
    /// it; cleared only by registering again.
    #[serde(default)]
    pub in_controlled_shutdown: bool,
}

impl BrokerRegistration {
    /// Whether it is active (Kafka's term): neither fenced nor in controlled shutdown.
    /// Only active brokers are listed to clients, lead partitions online and get new
    /// replicas.
    pub fn is_active(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }
}

/// A metadata change. Closed: every consumer matches every variant, so a new kind of
/// change (later `LeaderAndIsrChanged`, Kafka's `PartitionChangeRecord`, and
/// `BrokerRegistered`, its `RegisterBrokerRecord`) is handled wherever records are.
/// Serde: the entries of the Raft log `__cluster_metadata` (`cluster/raft/`) are these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetadataRecord {
    /// A new topic with all its partitions (Kafka: `TopicRecord`, one `PartitionRecord`
    /// per partition, a `ConfigRecord` per override).
    TopicCreated(TopicMeta),
    /// Partitions appended to a topic, numbered from its current count (Kafka: one
    /// `PartitionRecord` per new partition, from CreatePartitions).
    PartitionsAdded {
        /// The topic.
        topic_id: Uuid,
        /// The new partitions, in index order.
        partitions: Vec<PartitionState>,
        /// The index of the first new partition (Kafka's `PartitionRecord.partitionId`):
        /// the record is refused unless the topic has exactly that many partitions, so
        /// a copy committed again (a retried proposal) does not add them twice. `None`
        /// in records written before it existed: appended at the current count.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_partition: Option<i32>,
    },
    /// A topic's config overrides replaced as a whole (Kafka: `ConfigRecord`s).
    TopicConfigsChanged {
        /// The topic.
        topic_id: Uuid,
        /// The new overrides.
        configs: BTreeMap<String, String>,
    },
    /// A topic removed with its partitions (Kafka: `RemoveTopicRecord`).
    TopicDeleted {
        /// The topic.
        topic_id: Uuid,
    },
    /// Producer ids below `reserved_until` are reserved: none is handed out twice, even
    /// across restarts and nodes (Kafka: `ProducerIdsRecord`). Strictly grows.
    ProducerIdsReserved {
        /// The first producer id not reserved yet.
        reserved_until: i64,
    },
    /// A broker (re-)registered, unfenced, replacing any earlier registration of its id
    /// (Kafka: `RegisterBrokerRecord`, KIP-631). `broker_epoch` must exceed every epoch
    /// in the image.
    BrokerRegistered {
        /// The broker's `node.id`.
        broker_id: i32,
        /// The new epoch.
        broker_epoch: i64,
        /// Random per process start.
        incarnation_id: Uuid,
        /// Advertised endpoints, the first being the one Metadata lists.
        endpoints: Vec<BrokerEndpoint>,
        /// `broker.rack`.
        rack: Option<String>,
    },
    /// A broker's session lapsed: fenced (Kafka: `FenceBrokerRecord`). Applies only to
    /// its current epoch, unfenced.
    BrokerFenced {
        /// The broker.
        broker_id: i32,
        /// Its current epoch.
        broker_epoch: i64,
    },
    /// A fenced broker heartbeat again: unfenced (Kafka: `UnfenceBrokerRecord`). Applies
    /// only to its current epoch, fenced.
    BrokerUnfenced {
        /// The broker.
        broker_id: i32,
        /// Its current epoch.
        broker_epoch: i64,
    },
    /// A partition's leader, ISR or replicas changed (Kafka: `PartitionChangeRecord`,
    /// KIP-497): an election by the controller, or an ISR change a leader asked for.
    /// Applies only when the partition is at `expected_partition_epoch` (a change made
    /// against an older state, e.g. by a stale leader, is refused) and `state` moves its
    /// epochs forward ([`PartitionState::changed`] builds it).
    PartitionChanged {
        /// The topic.
        topic_id: Uuid,
        /// The partition index.
        partition: i32,
        /// The partition epoch the change was made against.
        expected_partition_epoch: i32,
        /// The partition's new state.
        state: PartitionState,
    },
    /// A broker is shutting down (Kafka: `BrokerRegistrationChangeRecord` with
    /// `inControlledShutdown`, KIP-631): not active any more until it registers again.
    /// Applies only to its current epoch, not in controlled shutdown yet.
    BrokerShuttingDown {
        /// The broker.
        broker_id: i32,
        /// Its current epoch.
        broker_epoch: i64,
    },
    /// A transform deployment made or replaced through the admin API (weir's own record,
    /// no Kafka counterpart): every broker learns it, installs it when it is inline and
    /// runs it when it is async and this broker is the connect leader (`transform`).
    TransformDeployed {
        /// The deployment's name.
        name: String,
        /// Its spec as JSON (`transform::TransformSpec`; opaque to the metadata).
        spec: String,
    },
    /// A transform deployment deleted through the admin API. Applies only to a deployment
    /// the image has.
    TransformDeleted {
        /// The deployment's name.
        name: String,
    },
    /// The dynamic configs of a broker resource replaced as a whole (Kafka: `ConfigRecord`s
    /// of resource type BROKER, KIP-226): `resource` "" is the cluster default every broker
    /// applies, "<node id>" one broker's own; an empty map removes them. Keys and values
    /// were checked by the caller (`config::check_dynamic_change`).
    BrokerConfigsChanged {
        /// "" or a node id in decimal.
        resource: String,
        /// The new dynamic configs, Kafka names.
        configs: BTreeMap<String, String>,
    },
    /// A broker's replicas of `partitions` are offline: the log dir holding them failed
    /// (KIP-112; KRaft carries it as the broker's offline dirs and replica directories,
    /// KIP-858, weir as the partitions themselves). Elections treat each as inactive for
    /// its partition until the broker registers again (a restart, the disk fixed).
    /// Applies only to the broker's current epoch and to partitions that exist.
    ReplicasOffline {
        /// The broker.
        broker_id: i32,
        /// Its current epoch.
        broker_epoch: i64,
        /// (topic id, partition index) of each replica now offline.
        partitions: Vec<(Uuid, i32)>,
    },
}

/// A record that does not apply to the image it is applied to. From a caller's records
/// it is a bug; from a replayed log it means the log is corrupt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata record does not apply: {0}")]
pub struct ImageError(pub String);

/// The cluster metadata at one point: immutable, shared behind an `Arc`
/// ([`super::Metadata::image`]); a change makes a new image ([`MetadataDelta`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataImage {
    cluster_id: String,
    node_id: i32,
    topics: BTreeMap<String, Arc<TopicMeta>>,
    topic_names_by_id: HashMap<Uuid, String>,
    producer_ids_reserved_until: i64,
    brokers: BTreeMap<i32, BrokerRegistration>,
    /// Transform deployments made through the admin API: name → spec JSON.
    transforms: BTreeMap<String, Arc<str>>,
    /// Dynamic broker configs (KIP-226) by resource: "" the cluster default, "<id>" one
    /// broker; never an empty map.
    broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// (topic id, partition) → brokers whose replica of it is on a failed log dir
    /// ([`MetadataRecord::ReplicasOffline`]); cleared per broker by its registration,
    /// per topic by its deletion, per replica when it leaves the assignment. Never an
    /// empty set.
    offline_replicas: BTreeMap<(Uuid, i32), BTreeSet<i32>>,
}

impl MetadataImage {
    /// The image of a cluster with no topics and no producer id reserved.
    pub fn empty(cluster_id: impl Into<String>, node_id: i32) -> MetadataImage {
        MetadataImage {
            cluster_id: cluster_id.into(),
            node_id,
            topics: BTreeMap::new(),
            topic_names_by_id: HashMap::new(),
            producer_ids_reserved_until: 0,
            brokers: BTreeMap::new(),
            transforms: BTreeMap::new(),
            broker_configs: BTreeMap::new(),
            offline_replicas: BTreeMap::new(),
        }
    }

    /// Whether `broker_id`'s replica of partition `partition` of topic `topic_id` is on a
    /// failed log dir ([`MetadataRecord::ReplicasOffline`]).
    pub fn replica_offline(&self, topic_id: Uuid, partition: i32, broker_id: i32) -> bool {
        self.offline_replicas
            .get(&(topic_id, partition))
            .is_some_and(|s| s.contains(&broker_id))
    }

    /// Whether `broker_id` can serve its replica of `topic_id`'s `partition`: the broker is
    /// active ([`BrokerRegistration::is_active`]) and that replica is not offline. What
    /// elections and ISR changes go by.
    pub fn replica_active(&self, topic_id: Uuid, partition: i32, broker_id: i32) -> bool {
        self.broker(broker_id)
            .is_some_and(BrokerRegistration::is_active)
            && !self.replica_offline(topic_id, partition, broker_id)
    }

    /// Per broker, the replicas it reported offline, as [`MetadataRecord::ReplicasOffline`]
    /// partitions (sorted).
    fn offline_by_broker(&self) -> BTreeMap<i32, Vec<(Uuid, i32)>> {
        let mut out: BTreeMap<i32, Vec<(Uuid, i32)>> = BTreeMap::new();
        for (key, brokers) in &self.offline_replicas {
            for b in brokers {
                out.entry(*b).or_default().push(*key);
            }
        }
        out
    }

    /// The [`MetadataRecord::ReplicasOffline`] record of each broker in `by_broker`.
    fn offline_records(
        &self,
        by_broker: BTreeMap<i32, Vec<(Uuid, i32)>>,
        out: &mut Vec<MetadataRecord>,
    ) {
        for (broker_id, partitions) in by_broker {
            if let Some(b) = self.broker(broker_id) {
                out.push(MetadataRecord::ReplicasOffline {
                    broker_id,
                    broker_epoch: b.broker_epoch,
                    partitions,
                });
            }
        }
    }

    /// The dynamic configs set on broker resource `resource` ("" the cluster default,
    /// "<id>" one broker); `None` when none is.
    pub fn broker_configs(&self, resource: &str) -> Option<&BTreeMap<String, String>> {
        self.broker_configs.get(resource)
    }

    /// Whether this node's dynamic config layers differ between this image and `other`.
    pub fn dynamic_layers_differ(&self, other: &MetadataImage) -> bool {
        let me = self.node_id.to_string();
        self.broker_configs.get("") != other.broker_configs.get("")
            || self.broker_configs.get(&me) != other.broker_configs.get(&me)
    }

    /// The dynamic config layers this node applies: its own resource and the cluster
    /// default (the precedence is `config::DynamicLayers`'s).
    pub fn dynamic_layers(&self) -> DynamicLayers<'_> {
        DynamicLayers {
            per_broker: self.broker_configs.get(&self.node_id.to_string()),
            cluster_default: self.broker_configs.get(""),
        }
    }

    /// The transform deployments made through the admin API, by name, each spec as the
    /// JSON its [`MetadataRecord::TransformDeployed`] carried.
    pub fn transforms(&self) -> &BTreeMap<String, Arc<str>> {
        &self.transforms
    }

    /// The cluster id (KIP-78, 22 base64url characters).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// This broker's node id.
    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// The topic named `name`.
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name).map(|t| &**t)
    }

    /// The broker leading `topic`-`partition`; `None` for an unknown partition or one
    /// with no leader (its replicas offline).
    pub fn leader_of(&self, topic: &str, partition: i32) -> Option<i32> {
        self.topic(topic)?
            .partition(partition)
            .map(|p| p.leader)
            .filter(|leader| *leader >= 0)
    }

    /// The topic with id `id` (Fetch v13+, DeleteTopics v6, Metadata v12+).
    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicMeta> {
        self.topic_names_by_id
            .get(&id)
            .and_then(|name| self.topic(name))
    }

    /// Every topic, by name.
    pub fn topics(&self) -> impl Iterator<Item = &TopicMeta> {
        self.topics.values().map(|t| &**t)
    }

    /// Number of topics.
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// The replicas, leader, leader epoch and ISR of `topic`'s partition `index`: what
    /// Metadata, ListOffsets (`leader_epoch`) and Fetch answer with.
    pub fn partition(&self, topic: &str, index: i32) -> Option<&PartitionState> {
        self.topic(topic).and_then(|t| t.partition(index))
    }

    /// An existing topic whose name equals `name` once `.` and `_` are made alike (Kafka
    /// refuses such a pair: their metric names collide).
    pub fn colliding_topic(&self, name: &str) -> Option<&str> {
        let norm = name.replace('.', "_");
        self.topics
            .keys()
            .find(|t| t.as_str() != name && t.replace('.', "_") == norm)
            .map(String::as_str)
    }

    /// Producer ids below this are reserved (handed out or about to be).
    pub fn producer_ids_reserved_until(&self) -> i64 {
        self.producer_ids_reserved_until
    }

    /// Every registered broker, fenced or not, by id.
    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values()
    }

    /// The registration of broker `broker_id`.
    pub fn broker(&self, broker_id: i32) -> Option<&BrokerRegistration> {
        self.brokers.get(&broker_id)
    }

    /// The brokers clients are told of: registered and active (neither fenced nor in
    /// controlled shutdown), by id.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| b.is_active())
    }

    /// The highest broker epoch handed out (0: none); the next registration's must be
    /// greater.
    pub fn max_broker_epoch(&self) -> i64 {
        self.brokers
            .values()
            .map(|b| b.broker_epoch)
            .max()
            .unwrap_or(0)
    }

    /// The records that register `b` as it is (its fencing included).
    fn registration_records(b: &BrokerRegistration, out: &mut Vec<MetadataRecord>) {
        out.push(MetadataRecord::BrokerRegistered {
            broker_id: b.broker_id,
            broker_epoch: b.broker_epoch,
            incarnation_id: b.incarnation_id,
            endpoints: b.endpoints.clone(),
            rack: b.rack.clone(),
        });
        if b.in_controlled_shutdown {
            out.push(MetadataRecord::BrokerShuttingDown {
                broker_id: b.broker_id,
                broker_epoch: b.broker_epoch,
            });
        }
        if b.fenced {
            out.push(MetadataRecord::BrokerFenced {
                broker_id: b.broker_id,
                broker_epoch: b.broker_epoch,
            });
        }
    }

    /// Registrations in epoch order: the order they replay in (epochs must grow).
    fn brokers_by_epoch(&self) -> Vec<&BrokerRegistration> {
        let mut brokers: Vec<&BrokerRegistration> = self.brokers.values().collect();
        brokers.sort_by_key(|b| b.broker_epoch);
        brokers
    }

    /// The records that build this image from [`MetadataImage::empty`] (a snapshot as
    /// records: what a listener registered late is given, and what a log may compact to).
    pub fn to_records(&self) -> Vec<MetadataRecord> {
        let mut out: Vec<MetadataRecord> = self
            .topics()
            .map(|t| MetadataRecord::TopicCreated(t.clone()))
            .collect();
        if self.producer_ids_reserved_until > 0 {
            out.push(MetadataRecord::ProducerIdsReserved {
                reserved_until: self.producer_ids_reserved_until,
            });
        }
        for b in self.brokers_by_epoch() {
            MetadataImage::registration_records(b, &mut out);
        }
        for (name, spec) in &self.transforms {
            out.push(MetadataRecord::TransformDeployed {
                name: name.clone(),
                spec: spec.to_string(),
            });
        }
        for (resource, configs) in &self.broker_configs {
            out.push(MetadataRecord::BrokerConfigsChanged {
                resource: resource.clone(),
                configs: configs.clone(),
            });
        }
        self.offline_records(self.offline_by_broker(), &mut out);
        out
    }

    /// The records that turn this image into `after`: per topic a deletion, a creation,
    /// added partitions or new configs, then the producer id reservation. What a node
    /// applies when the replicated log hands it a snapshot instead of the entries it
    /// missed (`cluster/raft/`). A partition whose leader or ISR differs gets one
    /// `PartitionChanged` (its leader and partition epochs are not replayed one by one:
    /// `TopicCreated` of a snapshot carries them), after the broker records.
    pub fn changes_to(&self, after: &MetadataImage) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        // After the broker records: a broker unfenced or registered again may join an
        // ISR only once it is active and its replicas are not offline.
        let mut partition_changes = Vec::new();
        for t in self.topics() {
            if after.topic_by_id(t.id).is_none_or(|a| a.name != t.name) {
                out.push(MetadataRecord::TopicDeleted { topic_id: t.id });
            }
        }
        for a in after.topics() {
            match self.topic_by_id(a.id).filter(|b| b.name == a.name) {
                None => out.push(MetadataRecord::TopicCreated(a.clone())),
                Some(b) => {
                    if a.partitions > b.partitions {
                        out.push(MetadataRecord::PartitionsAdded {
                            topic_id: a.id,
                            partitions: a.partition_states[b.partition_states.len()..].to_vec(),
                            first_partition: Some(b.partitions),
                        });
                    }
                    for (index, old, new) in a.changed_partitions(b) {
                        partition_changes.push(MetadataRecord::PartitionChanged {
                            topic_id: a.id,
                            partition: index,
                            expected_partition_epoch: old.partition_epoch,
                            state: new.clone(),
                        });
                    }
                    if a.configs != b.configs {
                        out.push(MetadataRecord::TopicConfigsChanged {
                            topic_id: a.id,
                            configs: a.configs.clone(),
                        });
                    }
                }
            }
        }
        if after.producer_ids_reserved_until > self.producer_ids_reserved_until {
            out.push(MetadataRecord::ProducerIdsReserved {
                reserved_until: after.producer_ids_reserved_until,
            });
        }
        for a in after.brokers_by_epoch() {
            match self.broker(a.broker_id) {
                Some(b) if b.broker_epoch == a.broker_epoch => {
                    if a.in_controlled_shutdown && !b.in_controlled_shutdown {
                        out.push(MetadataRecord::BrokerShuttingDown {
                            broker_id: a.broker_id,
                            broker_epoch: a.broker_epoch,
                        });
                    }
                    if a.fenced && !b.fenced {
                        out.push(MetadataRecord::BrokerFenced {
                            broker_id: a.broker_id,
                            broker_epoch: a.broker_epoch,
                        });
                    } else if !a.fenced && b.fenced {
                        out.push(MetadataRecord::BrokerUnfenced {
                            broker_id: a.broker_id,
                            broker_epoch: a.broker_epoch,
                        });
                    }
                }
                _ => MetadataImage::registration_records(a, &mut out),
            }
        }
        out.extend(partition_changes);
        for name in self.transforms.keys() {
            if !after.transforms.contains_key(name) {
                out.push(MetadataRecord::TransformDeleted { name: name.clone() });
            }
        }
        for (name, spec) in &after.transforms {
            if self.transforms.get(name) != Some(spec) {
                out.push(MetadataRecord::TransformDeployed {
                    name: name.clone(),
                    spec: spec.to_string(),
                });
            }
        }
        for resource in self.broker_configs.keys() {
            if !after.broker_configs.contains_key(resource) {
                out.push(MetadataRecord::BrokerConfigsChanged {
                    resource: resource.clone(),
                    configs: BTreeMap::new(),
                });
            }
        }
        for (resource, configs) in &after.broker_configs {
            if self.broker_configs.get(resource) != Some(configs) {
                out.push(MetadataRecord::BrokerConfigsChanged {
                    resource: resource.clone(),
                    configs: configs.clone(),
                });
            }
        }
        // Offline replicas only grow within a registration: what `after` has beyond
        // `self` (all of it for a broker registered anew above, which cleared its own).
        let mut new_offline = after.offline_by_broker();
        for (broker_id, partitions) in new_offline.iter_mut() {
            let same_epoch = matches!(
                (self.broker(*broker_id), after.broker(*broker_id)),
                (Some(b), Some(a)) if b.broker_epoch == a.broker_epoch
            );
            if same_epoch {
                partitions.retain(|(t, p)| !self.replica_offline(*t, *p, *broker_id));
            }
        }
        new_offline.retain(|_, p| !p.is_empty());
        after.offline_records(new_offline, &mut out);
        out
    }

    /// The first broker `new` adds to `current`'s ISR that may not join it, if any:
    /// KIP-841's rule (Kafka's AlterPartition answers INELIGIBLE_REPLICA, 107) that only an
    /// active broker (registered, unfenced, not in controlled shutdown) enters an ISR. A
    /// fenced broker taken in would be skipped by the next election as inactive while the
    /// high watermark counted on it; a restarted one is unfenced by its first heartbeat
    /// and joins then.
    ///
    /// A replica on a failed log dir ([`MetadataRecord::ReplicasOffline`]) may not join
    /// either (KIP-858's rule for offline dirs).
    pub(crate) fn ineligible_isr_joiner(
        &self,
        topic_id: Uuid,
        partition: i32,
        current: &PartitionState,
        new: &PartitionState,
    ) -> Option<i32> {
        new.isr
            .iter()
            .copied()
            .filter(|id| !current.isr.contains(id))
            .find(|id| !self.replica_active(topic_id, partition, *id))
    }

    /// The registration of `broker_id` at `broker_epoch`, for a fence or unfence.
    fn current_registration(
        &mut self,
        broker_id: i32,
        broker_epoch: i64,
    ) -> Result<&mut BrokerRegistration, ImageError> {
        match self.brokers.get_mut(&broker_id) {
            Some(b) if b.broker_epoch == broker_epoch => Ok(b),
            Some(b) => Err(ImageError(format!(
                "broker {broker_id} is at epoch {}, not {broker_epoch}",
                b.broker_epoch
            ))),
            None => Err(ImageError(format!("broker {broker_id} is not registered"))),
        }
    }

    fn name_of(&self, id: Uuid) -> Result<&str, ImageError> {
        self.topic_names_by_id
            .get(&id)
            .map(String::as_str)
            .ok_or_else(|| ImageError(format!("no topic with id {id}")))
    }

    fn apply_one(&mut self, record: &MetadataRecord) -> Result<(), ImageError> {
        match record {
            MetadataRecord::TopicCreated(t) => {
                if self.topics.contains_key(&t.name) {
                    return Err(ImageError(format!("topic {} exists", t.name)));
                }
                if self.topic_names_by_id.contains_key(&t.id) {
                    return Err(ImageError(format!("topic id {} exists", t.id)));
                }
                if t.partitions < 1 || t.partition_states.len() != t.partitions as usize {
                    return Err(ImageError(format!(
                        "topic {} has {} partitions and {} partition states",
                        t.name,
                        t.partitions,
                        t.partition_states.len()
                    )));
                }
                self.topic_names_by_id.insert(t.id, t.name.clone());
                self.topics.insert(t.name.clone(), Arc::new(t.clone()));
            }
            MetadataRecord::PartitionsAdded {
                topic_id,
                partitions,
                first_partition,
            } => {
                let name = self.name_of(*topic_id)?.to_string();
                let old = &self.topics[&name];
                if let Some(first) = first_partition.filter(|&f| f != old.partitions) {
                    return Err(ImageError(format!(
                        "topic {name} has {} partitions, so partitions from {first} cannot be added (added already?)",
                        old.partitions
                    )));
                }
                let states: Arc<[PartitionState]> = old
                    .partition_states
                    .iter()
                    .chain(partitions)
                    .cloned()
                    .collect();
                let count = i32::try_from(states.len())
                    .map_err(|_| ImageError(format!("topic {name}: too many partitions")))?;
                let updated = TopicMeta {
                    partitions: count,
                    partition_states: states,
                    ..(**old).clone()
                };
                self.topics.insert(name, Arc::new(updated));
            }
            MetadataRecord::TopicConfigsChanged { topic_id, configs } => {
                let name = self.name_of(*topic_id)?.to_string();
                let updated = TopicMeta {
                    configs: configs.clone(),
                    ..(*self.topics[&name]).clone()
                };
                self.topics.insert(name, Arc::new(updated));
            }
            MetadataRecord::TopicDeleted { topic_id } => {
                let name = self.name_of(*topic_id)?.to_string();
                self.topics.remove(&name);
                self.topic_names_by_id.remove(topic_id);
                self.offline_replicas.retain(|(t, _), _| t != topic_id);
            }
            MetadataRecord::ProducerIdsReserved { reserved_until } => {
                // Strictly: two nodes reserving the same block from one image must not
                // both succeed.
                if *reserved_until <= self.producer_ids_reserved_until {
                    return Err(ImageError(format!(
                        "producer ids reserved until {} would not grow to {reserved_until}",
                        self.producer_ids_reserved_until
                    )));
                }
                self.producer_ids_reserved_until = *reserved_until;
            }
            MetadataRecord::BrokerRegistered {
                broker_id,
                broker_epoch,
                incarnation_id,
                endpoints,
                rack,
            } => {
                // Strictly: two registrations from one image must not both succeed, and a
                // restarted broker's epoch must exceed its previous one.
                let max = self.max_broker_epoch();
                if *broker_epoch <= max {
                    return Err(ImageError(format!(
                        "broker {broker_id}'s epoch {broker_epoch} is not above the highest epoch {max}"
                    )));
                }
                self.brokers.insert(
                    *broker_id,
                    BrokerRegistration {
                        broker_id: *broker_id,
                        broker_epoch: *broker_epoch,
                        incarnation_id: *incarnation_id,
                        endpoints: endpoints.clone(),
                        rack: rack.clone(),
                        fenced: false,
                        in_controlled_shutdown: false,
                    },
                );
                // A new registration is a restart: its dirs were checked at start-up.
                for brokers in self.offline_replicas.values_mut() {
                    brokers.remove(broker_id);
                }
                self.offline_replicas
                    .retain(|_, brokers| !brokers.is_empty());
            }
            MetadataRecord::BrokerFenced {
                broker_id,
                broker_epoch,
            } => {
                let b = self.current_registration(*broker_id, *broker_epoch)?;
                if b.fenced {
                    return Err(ImageError(format!("broker {broker_id} is fenced already")));
                }
                b.fenced = true;
            }
            MetadataRecord::BrokerUnfenced {
                broker_id,
                broker_epoch,
            } => {
                let b = self.current_registration(*broker_id, *broker_epoch)?;
                if !b.fenced {
                    return Err(ImageError(format!("broker {broker_id} is not fenced")));
                }
                b.fenced = false;
            }
            MetadataRecord::PartitionChanged {
                topic_id,
                partition,
                expected_partition_epoch,
                state,
            } => {
                let name = self.name_of(*topic_id)?.to_string();
                let old = &self.topics[&name];
                let Some(current) = old.partition(*partition) else {
                    return Err(ImageError(format!(
                        "topic {name} has no partition {partition}"
                    )));
                };
                check_partition_change(current, *expected_partition_epoch, state)
                    .map_err(|e| ImageError(format!("{name}-{partition}: {e}")))?;
                if let Some(id) = self.ineligible_isr_joiner(*topic_id, *partition, current, state)
                {
                    return Err(ImageError(format!(
                        "{name}-{partition}: broker {id} cannot join the ISR: it is fenced, \
                         shutting down or not registered (KIP-841), or its replica is offline \
                         (KIP-858)"
                    )));
                }
                // A replica that leaves the assignment leaves its offline mark too.
                if let Some(brokers) = self.offline_replicas.get_mut(&(*topic_id, *partition)) {
                    brokers.retain(|b| state.replicas.contains(b));
                    if brokers.is_empty() {
                        self.offline_replicas.remove(&(*topic_id, *partition));
                    }
                }
                let old = &self.topics[&name];
                let mut states = old.partition_states.to_vec();
                states[*partition as usize] = state.clone();
                let updated = TopicMeta {
                    partition_states: states.into(),
                    ..(**old).clone()
                };
                self.topics.insert(name, Arc::new(updated));
            }
            MetadataRecord::BrokerShuttingDown {
                broker_id,
                broker_epoch,
            } => {
                let b = self.current_registration(*broker_id, *broker_epoch)?;
                if b.in_controlled_shutdown {
                    return Err(ImageError(format!(
                        "broker {broker_id} is shutting down already"
                    )));
                }
                b.in_controlled_shutdown = true;
            }
            MetadataRecord::TransformDeployed { name, spec } => {
                self.transforms
                    .insert(name.clone(), Arc::from(spec.as_str()));
            }
            MetadataRecord::TransformDeleted { name } => {
                if self.transforms.remove(name).is_none() {
                    return Err(ImageError(format!("no transform deployment named {name}")));
                }
            }
            MetadataRecord::BrokerConfigsChanged { resource, configs } => {
                if !resource.is_empty() && resource.parse::<u32>().is_err() {
                    return Err(ImageError(format!(
                        "broker config resource {resource:?} is neither \"\" nor a node id"
                    )));
                }
                if configs.is_empty() {
                    self.broker_configs.remove(resource);
                } else {
                    self.broker_configs
                        .insert(resource.clone(), configs.clone());
                }
            }
            MetadataRecord::ReplicasOffline {
                broker_id,
                broker_epoch,
                partitions,
            } => {
                self.current_registration(*broker_id, *broker_epoch)?;
                for (topic_id, partition) in partitions {
                    let name = self.name_of(*topic_id)?;
                    if self.topics[name].partition(*partition).is_none() {
                        return Err(ImageError(format!(
                            "topic {name} has no partition {partition}"
                        )));
                    }
                }
                for key in partitions {
                    self.offline_replicas
                        .entry(*key)
                        .or_default()
                        .insert(*broker_id);
                }
            }
        }
        Ok(())
    }
}

/// A batch of records applied to an image as one change: the image before, the records,
/// and the image after. What a [`super::MetadataListener`] is given.
#[derive(Debug, Clone)]
pub struct MetadataDelta {
    before: Arc<MetadataImage>,
    after: Arc<MetadataImage>,
    records: Vec<MetadataRecord>,
}

impl MetadataDelta {
    /// Applies `records` in order to `before`.
    ///
    /// Errors: [`ImageError`] when a record does not apply (unknown topic id, a name or id
    /// that exists, producer ids going back, partition counts that disagree); `before` is
    /// unchanged, nothing is half applied.
    pub fn apply(
        before: Arc<MetadataImage>,
        records: Vec<MetadataRecord>,
    ) -> Result<MetadataDelta, ImageError> {
        let mut after = (*before).clone();
        for r in &records {
            after.apply_one(r)?;
        }
        Ok(MetadataDelta {
            before,
            after: Arc::new(after),
            records,
        })
    }

    /// The image the records were applied to.
    pub fn before(&self) -> &MetadataImage {
        &self.before
    }

    /// The image they made.
    pub fn after(&self) -> &Arc<MetadataImage> {
        &self.after
    }

    /// The records, in order.
    pub fn records(&self) -> &[MetadataRecord] {
        &self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, partitions: i32) -> TopicMeta {
        TopicMeta {
            name: name.to_string(),
            id: Uuid::new_v4(),
            partitions,
            replication_factor: 1,
            configs: BTreeMap::new(),
            partition_states: (0..partitions)
                .map(|_| PartitionState::single_node(7))
                .collect(),
        }
    }

    fn apply(image: &Arc<MetadataImage>, records: Vec<MetadataRecord>) -> Arc<MetadataImage> {
        MetadataDelta::apply(image.clone(), records)
            .unwrap()
            .after()
            .clone()
    }

    #[test]
    fn deltas_create_grow_configure_and_delete_topics() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let t = topic("orders", 2);
        let id = t.id;
        let one = apply(&empty, vec![MetadataRecord::TopicCreated(t.clone())]);
        assert!(
            empty.topic("orders").is_none(),
            "the old image is unchanged"
        );
        assert_eq!(one.topic("orders"), Some(&t));
        assert_eq!(one.topic_by_id(id), Some(&t));
        let p = one.partition("orders", 1).unwrap();
        assert_eq!(
            (p.leader, p.leader_epoch, &p.replicas[..], &p.isr[..]),
            (7, 0, &[7][..], &[7][..])
        );
        assert!(one.partition("orders", 2).is_none());
        assert!(one.partition("orders", -1).is_none());
        assert_eq!(one.colliding_topic("orders"), None);

        let configs = BTreeMap::from([("retention.ms".to_string(), "5".to_string())]);
        let two = apply(
            &one,
            vec![
                MetadataRecord::PartitionsAdded {
                    topic_id: id,
                    partitions: vec![PartitionState::single_node(7); 3],
                    first_partition: Some(2),
                },
                MetadataRecord::TopicConfigsChanged {
                    topic_id: id,
                    configs: configs.clone(),
                },
            ],
        );
        let grown = two.topic("orders").unwrap();
        // The same partitions again (a retried proposal committed twice) are refused.
        let again = MetadataRecord::PartitionsAdded {
            topic_id: id,
            partitions: vec![PartitionState::single_node(7); 3],
            first_partition: Some(2),
        };
        assert!(MetadataDelta::apply(two.clone(), vec![again]).is_err());
        assert_eq!((grown.partitions, grown.partition_states.len()), (5, 5));
        assert_eq!(grown.configs, configs);
        assert_eq!(one.topic("orders").unwrap().partitions, 2);

        let three = apply(&two, vec![MetadataRecord::TopicDeleted { topic_id: id }]);
        assert!(three.topic("orders").is_none());
        assert!(three.topic_by_id(id).is_none());
        assert_eq!(three.topic_count(), 0);
    }

    #[test]
    fn broker_configs_are_layers_replayed_and_diffed() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let set = |resource: &str, pairs: &[(&str, &str)]| MetadataRecord::BrokerConfigsChanged {
            resource: resource.to_string(),
            configs: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let one = apply(
            &empty,
            vec![
                set("", &[("log.retention.ms", "5")]),
                set("7", &[("message.max.bytes", "9")]),
                set("8", &[("message.max.bytes", "10")]),
            ],
        );
        let layers = one.dynamic_layers();
        assert_eq!(layers.cluster_default.unwrap()["log.retention.ms"], "5");
        assert_eq!(layers.per_broker.unwrap()["message.max.bytes"], "9");
        assert!(one.dynamic_layers_differ(&empty));
        let replayed = apply(&empty, one.to_records());
        assert_eq!(replayed, one);
        let two = apply(&one, vec![set("7", &[])]);
        assert!(two.broker_configs("7").is_none());
        assert_eq!(apply(&one, one.changes_to(&two)), two);
        assert!(MetadataDelta::apply(one.clone(), vec![set("x", &[("a", "b")])]).is_err());
    }

    #[test]
    fn records_that_do_not_apply_change_nothing() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let t = topic("a.b", 1);
        let one = apply(&empty, vec![MetadataRecord::TopicCreated(t.clone())]);
        assert_eq!(one.colliding_topic("a_b"), Some("a.b"));
        let again = topic("a.b", 1);
        // The second record fails: the first is not applied either.
        let err = MetadataDelta::apply(
            one.clone(),
            vec![
                MetadataRecord::TopicCreated(topic("c", 1)),
                MetadataRecord::TopicCreated(again),
            ],
        )
        .unwrap_err();
        assert!(err.0.contains("exists"), "{err}");
        assert!(one.topic("c").is_none());
        let unknown = Uuid::new_v4();
        for r in [
            MetadataRecord::TopicDeleted { topic_id: unknown },
            MetadataRecord::TopicConfigsChanged {
                topic_id: unknown,
                configs: BTreeMap::new(),
            },
            MetadataRecord::PartitionsAdded {
                topic_id: unknown,
                partitions: vec![],
                first_partition: None,
            },
        ] {
            assert!(MetadataDelta::apply(one.clone(), vec![r]).is_err());
        }
        let mut bad = topic("d", 2);
        bad.partitions = 3;
        assert!(
            MetadataDelta::apply(one.clone(), vec![MetadataRecord::TopicCreated(bad)]).is_err()
        );
        let reserved = apply(
            &one,
            vec![MetadataRecord::ProducerIdsReserved {
                reserved_until: 1000,
            }],
        );
        assert_eq!(reserved.producer_ids_reserved_until(), 1000);
        assert!(MetadataDelta::apply(
            reserved.clone(),
            vec![MetadataRecord::ProducerIdsReserved { reserved_until: 5 }]
        )
        .is_err());
    }

    #[test]
    fn an_image_rebuilds_from_its_records() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let image = apply(
            &empty,
            vec![
                MetadataRecord::TopicCreated(topic("x", 3)),
                MetadataRecord::TopicCreated(topic("y", 1)),
                MetadataRecord::ProducerIdsReserved {
                    reserved_until: 2000,
                },
            ],
        );
        let rebuilt = apply(&empty, image.to_records());
        assert_eq!(*rebuilt, *image);
    }

    #[test]
    fn changes_to_turns_one_image_into_another() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let (x, y, z) = (topic("x", 3), topic("y", 1), topic("z", 2));
        let before = apply(
            &empty,
            vec![
                MetadataRecord::TopicCreated(x.clone()),
                MetadataRecord::TopicCreated(y.clone()),
            ],
        );
        let after = apply(
            &before,
            vec![
                MetadataRecord::TopicDeleted { topic_id: x.id },
                MetadataRecord::PartitionsAdded {
                    topic_id: y.id,
                    partitions: vec![PartitionState::single_node(7); 2],
                    first_partition: None,
                },
                MetadataRecord::TopicConfigsChanged {
                    topic_id: y.id,
                    configs: BTreeMap::from([("retention.ms".into(), "1".into())]),
                },
                MetadataRecord::TopicCreated(z),
                MetadataRecord::ProducerIdsReserved {
                    reserved_until: 1000,
                },
            ],
        );
        assert_eq!(*apply(&before, before.changes_to(&after)), *after);
        assert!(after.changes_to(&after).is_empty());
        // Records survive the serde form the Raft log stores.
        let json = serde_json::to_string(&after.to_records()).unwrap();
        let back: Vec<MetadataRecord> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, after.to_records());
    }

    #[test]
    fn reassignment_states_apply_replay_and_old_records_still_load() {
        let empty = Arc::new(MetadataImage::empty("c", 7));
        let mut t = topic("r", 1);
        t.partition_states = vec![PartitionState {
            replicas: vec![1, 2],
            isr: vec![1, 2],
            leader: 1,
            ..PartitionState::single_node(1)
        }]
        .into();
        let id = t.id;
        let one = apply(&empty, vec![MetadataRecord::TopicCreated(t)]);
        let current = one.partition("r", 0).unwrap().clone();
        let moving = current.succeeded_by(PartitionState {
            replicas: vec![2, 3, 1],
            adding_replicas: vec![3],
            removing_replicas: vec![1],
            ..current.clone()
        });
        let change = |state: PartitionState| MetadataRecord::PartitionChanged {
            topic_id: id,
            partition: 0,
            expected_partition_epoch: current.partition_epoch,
            state,
        };
        let two = apply(&one, vec![change(moving.clone())]);
        let p = two.partition("r", 0).unwrap();
        assert!(p.is_reassigning());
        assert_eq!(p.target_replicas(), [2, 3]);
        assert_eq!(*apply(&empty, two.to_records()), *two);
        assert_eq!(*apply(&one, one.changes_to(&two)), *two);
        // Adding or removing replicas outside `replicas`, or both at once, never apply.
        for bad in [
            PartitionState {
                adding_replicas: vec![4],
                ..moving.clone()
            },
            PartitionState {
                removing_replicas: vec![4],
                ..moving.clone()
            },
            PartitionState {
                adding_replicas: vec![1],
                ..moving.clone()
            },
        ] {
            let e = MetadataDelta::apply(one.clone(), vec![change(bad)]).unwrap_err();
            assert!(e.0.contains("adding"), "{e}");
        }
        // A state written before reassignment existed (no such fields) loads as none.
        let old = r#"{"replicas":[1,2],"isr":[1],"leader":1,"leader_epoch":2,"partition_epoch":5}"#;
        let s: PartitionState = serde_json::from_str(old).unwrap();
        assert!(!s.is_reassigning());
        assert_eq!((s.partition_epoch, s.target_replicas()), (5, vec![1, 2]));
    }

    fn registered(broker_id: i32, broker_epoch: i64, port: i32) -> MetadataRecord {
        MetadataRecord::BrokerRegistered {
            broker_id,
            broker_epoch,
            incarnation_id: Uuid::new_v4(),
            endpoints: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port,
            }],
            rack: None,
        }
    }

    fn live(image: &MetadataImage) -> Vec<(i32, i64)> {
        image
            .live_brokers()
            .map(|b| (b.broker_id, b.broker_epoch))
            .collect()
    }

    #[test]
    fn brokers_register_are_fenced_unfenced_and_reregister_with_a_higher_epoch() {
        let empty = Arc::new(MetadataImage::empty("c", 1));
        let two = apply(&empty, vec![registered(1, 1, 9092), registered(2, 2, 9094)]);
        assert_eq!(live(&two), [(1, 1), (2, 2)]);
        assert_eq!(two.max_broker_epoch(), 2);
        assert_eq!(two.broker(2).unwrap().endpoints[0].port, 9094);

        let fenced = apply(
            &two,
            vec![MetadataRecord::BrokerFenced {
                broker_id: 2,
                broker_epoch: 2,
            }],
        );
        assert_eq!(live(&fenced), [(1, 1)]);
        assert!(fenced.broker(2).unwrap().fenced);
        assert_eq!(fenced.brokers().count(), 2);
        let unfenced = apply(
            &fenced,
            vec![MetadataRecord::BrokerUnfenced {
                broker_id: 2,
                broker_epoch: 2,
            }],
        );
        assert_eq!(live(&unfenced), [(1, 1), (2, 2)]);

        // A restart registers again: a new epoch above every other, unfenced.
        let restarted = apply(&fenced, vec![registered(2, 3, 9096)]);
        assert_eq!(live(&restarted), [(1, 1), (2, 3)]);
        assert_eq!(restarted.broker(2).unwrap().endpoints[0].port, 9096);
        assert_eq!(restarted.brokers().count(), 2);
    }

    #[test]
    fn stale_broker_records_are_refused() {
        let empty = Arc::new(MetadataImage::empty("c", 1));
        let image = apply(&empty, vec![registered(1, 1, 9092), registered(2, 5, 9094)]);
        let refused = |records: Vec<MetadataRecord>| {
            MetadataDelta::apply(image.clone(), records)
                .expect_err("refused")
                .0
        };
        // An epoch not above the highest (two registrations made from one image).
        assert!(refused(vec![registered(3, 5, 1)]).contains("not above"));
        assert!(refused(vec![registered(1, 2, 1)]).contains("not above"));
        // A fence or unfence of an epoch that is not the broker's current one.
        let stale = refused(vec![MetadataRecord::BrokerFenced {
            broker_id: 2,
            broker_epoch: 4,
        }]);
        assert!(stale.contains("at epoch 5"), "{stale}");
        assert!(refused(vec![MetadataRecord::BrokerFenced {
            broker_id: 9,
            broker_epoch: 1,
        }])
        .contains("not registered"));
        assert!(refused(vec![MetadataRecord::BrokerUnfenced {
            broker_id: 1,
            broker_epoch: 1,
        }])
        .contains("not fenced"));
        let fence = MetadataRecord::BrokerFenced {
            broker_id: 1,
            broker_epoch: 1,
        };
        assert!(refused(vec![fence.clone(), fence]).contains("fenced already"));
        assert_eq!(live(&image), [(1, 1), (2, 5)], "nothing applied");
    }

    #[test]
    fn registrations_survive_snapshots_and_catch_up() {
        let empty = Arc::new(MetadataImage::empty("c", 1));
        let before = apply(
            &empty,
            vec![
                MetadataRecord::TopicCreated(topic("x", 1)),
                registered(3, 1, 1),
                registered(1, 2, 2),
                registered(2, 3, 3),
                MetadataRecord::BrokerFenced {
                    broker_id: 3,
                    broker_epoch: 1,
                },
            ],
        );
        // The snapshot (the image as records) rebuilds registrations, epochs and fencing.
        let rebuilt = apply(&empty, before.to_records());
        assert_eq!(*rebuilt, *before);
        assert!(rebuilt.broker(3).unwrap().fenced);
        let after = apply(
            &before,
            vec![
                registered(1, 4, 5),
                MetadataRecord::BrokerUnfenced {
                    broker_id: 3,
                    broker_epoch: 1,
                },
                MetadataRecord::BrokerFenced {
                    broker_id: 2,
                    broker_epoch: 3,
                },
                registered(4, 5, 6),
            ],
        );
        // A lagging node given a snapshot catches up through the same records.
        assert_eq!(*apply(&before, before.changes_to(&after)), *after);
        assert!(after.changes_to(&after).is_empty());
        // Controlled shutdown: inactive, then fenced; rebuilt and caught up alike.
        let shut = MetadataRecord::BrokerShuttingDown {
            broker_id: 4,
            broker_epoch: 5,
        };
        let stopping = apply(&after, vec![shut.clone()]);
        let b4 = stopping.broker(4).unwrap();
        assert!(b4.in_controlled_shutdown && !b4.fenced && !b4.is_active());
        assert!(!stopping.live_brokers().any(|b| b.broker_id == 4));
        let stopped = apply(
            &stopping,
            vec![MetadataRecord::BrokerFenced {
                broker_id: 4,
                broker_epoch: 5,
            }],
        );
        assert_eq!(*apply(&empty, stopped.to_records()), *stopped);
        assert_eq!(*apply(&after, after.changes_to(&stopped)), *stopped);
        let twice = MetadataDelta::apply(stopping.clone(), vec![shut]);
        assert!(twice.is_err());
        // Registering again clears it.
        let back = apply(&stopped, vec![registered(4, 6, 6)]);
        assert!(back.broker(4).unwrap().is_active());
        let json = serde_json::to_string(&after.to_records()).unwrap();
        let back: Vec<MetadataRecord> = serde_json::from_str(&json).unwrap();
        assert_eq!(*apply(&empty, back), *after);
    }

    #[test]
    fn offline_replicas_apply_at_the_current_epoch_and_survive_snapshots_until_a_restart() {
        let empty = Arc::new(MetadataImage::empty("c", 1));
        let (x, y) = (topic("x", 2), topic("y", 1));
        let (xid, yid) = (x.id, y.id);
        let base = apply(
            &empty,
            vec![
                MetadataRecord::TopicCreated(x),
                MetadataRecord::TopicCreated(y),
                registered(1, 1, 1),
                registered(2, 2, 2),
            ],
        );
        let offline = |broker_id, broker_epoch, partitions: Vec<(Uuid, i32)>| {
            MetadataRecord::ReplicasOffline {
                broker_id,
                broker_epoch,
                partitions,
            }
        };
        let refused = |records| MetadataDelta::apply(base.clone(), records).unwrap_err().0;
        assert!(refused(vec![offline(1, 0, vec![(xid, 0)])]).contains("epoch"));
        assert!(refused(vec![offline(3, 1, vec![(xid, 0)])]).contains("not registered"));
        assert!(refused(vec![offline(1, 1, vec![(xid, 2)])]).contains("no partition"));
        assert!(refused(vec![offline(1, 1, vec![(Uuid::new_v4(), 0)])]).contains("no topic"));
        let marked = apply(
            &base,
            vec![
                offline(1, 1, vec![(xid, 0), (yid, 0)]),
                offline(2, 2, vec![(xid, 0)]),
            ],
        );
        assert!(marked.replica_offline(xid, 0, 1) && marked.replica_offline(xid, 0, 2));
        assert!(!marked.replica_offline(xid, 1, 1));
        assert!(!marked.replica_active(yid, 0, 1) && marked.replica_active(xid, 1, 1));
        // The snapshot (the image as records, through serde as the Raft log stores them)
        // and a lagging node's catch-up rebuild it.
        let json = serde_json::to_string(&marked.to_records()).unwrap();
        let back: Vec<MetadataRecord> = serde_json::from_str(&json).unwrap();
        assert_eq!(*apply(&empty, back), *marked);
        assert_eq!(*apply(&base, base.changes_to(&marked)), *marked);
        // A restart (registration) clears the broker's own; a deleted topic its own.
        let later = apply(
            &marked,
            vec![
                registered(1, 3, 1),
                MetadataRecord::TopicDeleted { topic_id: yid },
                offline(1, 3, vec![(xid, 1)]),
            ],
        );
        assert!(!later.replica_offline(xid, 0, 1) && later.replica_offline(xid, 0, 2));
        assert!(later.replica_offline(xid, 1, 1));
        assert!(!later.offline_replicas.contains_key(&(yid, 0)));
        assert_eq!(*apply(&marked, marked.changes_to(&later)), *later);
        assert_eq!(*apply(&empty, later.to_records()), *later);
        assert!(later.changes_to(&later).is_empty());
        // A node catching up over a restart and a rejoin of the ISR: the registration
        // comes before the ISR change that needs it (else refused as offline).
        let z = TopicMeta {
            replication_factor: 2,
            partition_states: vec![PartitionState {
                replicas: vec![1, 2],
                isr: vec![2],
                leader: 2,
                leader_epoch: 1,
                partition_epoch: 1,
                adding_replicas: Vec::new(),
                removing_replicas: Vec::new(),
            }]
            .into(),
            ..topic("z", 1)
        };
        let zid = z.id;
        let with_z = apply(
            &later,
            vec![
                MetadataRecord::TopicCreated(z),
                offline(1, 3, vec![(zid, 0)]),
            ],
        );
        let state = with_z.partition("z", 0).unwrap().changed(2, vec![2, 1]);
        let join = MetadataRecord::PartitionChanged {
            topic_id: zid,
            partition: 0,
            expected_partition_epoch: 1,
            state,
        };
        assert!(MetadataDelta::apply(with_z.clone(), vec![join.clone()]).is_err());
        let rejoined = apply(&with_z, vec![registered(1, 4, 1), join]);
        assert_eq!(*apply(&with_z, with_z.changes_to(&rejoined)), *rejoined);
    }
}
