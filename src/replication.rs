//! Replication between brokers: the follower fetchers and the leader's ISR upkeep (Kafka's
//! `ReplicaFetcherManager` / `ReplicaFetcherThread`, `AlterPartitionManager` and
//! `ReplicaManager.maybeShrinkIsr`; KIP-101, KIP-279, KIP-497).
//!
//! Owns: one fetcher task per leader broker this broker follows partitions of. A fetcher
//! first truncates each newly followed partition to the leader's log by leader epoch
//! (OffsetForLeaderEpoch, v3 with `replica_id`: the follower's latest epoch is asked, its
//! log is cut where the leader's copy of that epoch ends — never by high watermark
//! alone), then sends Kafka Fetch requests carrying `replica_id` (no new RPC) for all of
//! them from their log end offsets, appends what comes back as the leader stored it
//! (`Partition::append_as_follower`) and takes the leader's high watermark. The ISR task:
//! every `replica.lag.time.max.ms / 2` each led partition drops followers not caught up
//! for `replica.lag.time.max.ms`; shrink and expand requests (a follower catching up is
//! noticed in its fetch, `Partition::read_for_follower`) are committed to the metadata
//! log as `PartitionChanged` records checked by partition epoch (`Metadata::alter_isr`).
//! The lag check looks only at partitions led here with another broker in the ISR,
//! listed again only when roles changed.
//!
//! A failed log dir (KIP-112): its partitions are not fetched into, and the offline
//! task reports them to the controller ([`Metadata::report_offline_replicas`]: they
//! leave the ISR, their leaderships move), woken by the dir going offline, at most
//! [`OFFLINE_REPORT_ATTEMPTS`] tries a wake, then again every [`OFFLINE_RETRY`] while
//! one is not committed.
//!
//! Fetchers follow the roles the metadata gives (`replica.rs`), looked at every
//! [`RECONCILE_INTERVAL`] and walked only when they changed (`replica::roles_version`);
//! a partition that stops being followed from a leader leaves
//! that leader's fetcher at its next round. Every wait is bounded; everything ends on the
//! shutdown watch.
//!
//! Never does: decide leadership (the controller does, `cluster/election.rs`), or write a
//! partition it leads.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, OffsetForLeaderEpochRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::watch;

use crate::cluster::brokers::stopped_within;
use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::log::{split_fetched, LogError};
use crate::peer::{broker_address, PeerConn};
use crate::replica::{now_ms, Partition, ReplicaManager};

/// How often the fetcher set is brought in line with the partitions' roles.
pub(crate) const RECONCILE_INTERVAL: Duration = Duration::from_millis(100);

/// Tries of one report of offline replicas before it waits for [`OFFLINE_RETRY`].
const OFFLINE_REPORT_ATTEMPTS: u32 = 5;

/// Pause between two tries of a report, and between two rounds of tries.
const OFFLINE_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How often a report of offline replicas not committed yet is tried again.
const OFFLINE_RETRY: Duration = Duration::from_secs(10);

/// Fetch version followers speak: v12 (topic names, `replica_id`, `current_leader_epoch`).
const FETCH_VERSION: i16 = 12;

/// OffsetForLeaderEpoch version followers speak: v3 (`replica_id`).
const OFFSET_FOR_LEADER_EPOCH_VERSION: i16 = 3;

/// Largest response a follower reads: the broker's own frame limit.
fn max_response_bytes(config: &BrokerConfig) -> usize {
    config.socket_request_max_bytes.max(1 << 20)
}

/// One followed partition in a fetcher.
#[derive(Debug, Clone)]
struct Followed {
    partition: Arc<Partition>,
    /// The leader epoch this broker follows it at.
    leader_epoch: i32,
    /// Truncated to the leader's log for this epoch (KIP-101) and fetching.
    truncated: bool,
}

type Key = (String, i32);

/// A fetcher's partitions, shared with the task.
type FollowedSet = Arc<Mutex<BTreeMap<Key, Followed>>>;

/// Runs replication until `shutdown`: the fetchers and the ISR task.
pub(crate) async fn run(
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    config: Arc<BrokerConfig>,
    shutdown: watch::Receiver<bool>,
) {
    let isr = tokio::spawn(isr_task(
        metadata.clone(),
        replicas.clone(),
        config.clone(),
        shutdown.clone(),
    ));
    let offline = tokio::spawn(offline_task(
        metadata.clone(),
        replicas.clone(),
        config.replication.unclean_leader_election_enable,
        shutdown.clone(),
    ));
    fetcher_manager(metadata, replicas, config, shutdown).await;
    let _ = isr.await;
    let _ = offline.await;
}

/// Reports the replicas on failed log dirs to the controller whenever a dir goes offline
/// (KIP-112's `LogDirFailureChannel` → the controller; KIP-858): one
/// `ReplicasOffline` change with its elections, off the async workers. Not committed
/// (no quorum in time, a concurrent change): tried again, [`OFFLINE_REPORT_ATTEMPTS`]
/// times, then every [`OFFLINE_RETRY`]. Partitions already marked are left out, so a
/// dir is reported once.
async fn offline_task(
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    unclean_default: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let notify = replicas.offline_dir_notify();
    let mut pending = false;
    loop {
        tokio::select! {
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    return;
                }
                continue;
            }
            _ = notify.notified() => {}
            _ = tokio::time::sleep(OFFLINE_RETRY), if pending => {}
        }
        pending = true;
        for attempt in 1..=OFFLINE_REPORT_ATTEMPTS {
            let partitions = replicas.offline_partitions();
            if partitions.is_empty() {
                pending = false;
                break;
            }
            let m = metadata.clone();
            let result = tokio::task::spawn_blocking(move || {
                m.report_offline_replicas(&partitions, unclean_default)
            })
            .await;
            match result {
                Ok(Ok(Some(marked))) => {
                    if marked > 0 {
                        tracing::warn!(replicas = marked, "replicas on a failed log dir reported offline: they leave the ISR and their leaderships move");
                    }
                    pending = false;
                    break;
                }
                Ok(Ok(None)) => {
                    tracing::warn!(attempt, "offline replicas not reported: this broker's registration is not committed yet")
                }
                Ok(Err(e)) => {
                    tracing::warn!(attempt, error = %e, "offline replicas not reported; trying again")
                }
                Err(e) => tracing::warn!(attempt, error = %e, "offline replica report task failed"),
            }
            if stopped_within(&mut shutdown, OFFLINE_RETRY_PAUSE).await {
                return;
            }
        }
        if pending {
            tracing::error!(
                "offline replicas not reported after {OFFLINE_REPORT_ATTEMPTS} tries; trying again in {} s",
                OFFLINE_RETRY.as_secs()
            );
        }
    }
}

/// Commits the ISR changes leaders ask for, and every `replica.lag.time.max.ms / 2` has
/// each led partition check its followers' lag.
async fn isr_task(
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    config: Arc<BrokerConfig>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(mut changes) = replicas.take_isr_changes() else {
        return;
    };
    let lag_ms = config.replication.lag_time_max_ms;
    let tick = Duration::from_millis((lag_ms / 2).clamp(100, 5000) as u64);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut led: Vec<Arc<Partition>> = Vec::new();
    let mut led_at: Option<u64> = None;
    loop {
        tokio::select! {
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    return;
                }
            }
            _ = interval.tick() => {
                // Only partitions led here with another broker in the ISR can shrink; the
                // list is rebuilt when roles changed (`replica::roles_version`), not
                // every tick: at 100,000 single-replica partitions the walk found nothing.
                let version = crate::replica::roles_version();
                if led_at != Some(version) {
                    led_at = Some(version);
                    led = replicas
                        .partitions()
                        .into_iter()
                        .filter(|p| p.leads_with_followers_in_isr())
                        .collect();
                }
                let now = now_ms();
                for p in &led {
                    p.maybe_shrink_isr(now, lag_ms);
                }
            }
            change = changes.recv() => {
                let Some(change) = change else { return };
                let m = metadata.clone();
                let c = change.clone();
                let result = tokio::task::spawn_blocking(move || {
                    m.alter_isr(&c.topic, c.partition, c.partition_epoch, c.isr)
                })
                .await;
                let committed = matches!(result, Ok(Ok(true)));
                match result {
                    Ok(Ok(true)) => tracing::info!(topic = %change.topic, partition = change.partition, isr = ?change.isr, "ISR changed"),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(topic = %change.topic, partition = change.partition, error = %e, "ISR change not committed; asked again at the next check"),
                    Err(e) => tracing::warn!(error = %e, "ISR change task failed"),
                }
                if let Some(p) = replicas.partition(&change.topic, change.partition) {
                    p.isr_change_done(change.partition_epoch, committed);
                }
            }
        }
    }
}

/// Keeps one fetcher per leader this broker follows partitions of.
async fn fetcher_manager(
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    config: Arc<BrokerConfig>,
    mut shutdown: watch::Receiver<bool>,
) {
    let me = config.node_id;
    let mut fetchers: HashMap<i32, (FollowedSet, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut walked_at: Option<u64> = None;
    loop {
        // Walk the partitions only when a role or the partition map changed since the
        // last walk, or a fetcher ended (`replica::roles_version`).
        let version = crate::replica::roles_version();
        if walked_at != Some(version) || fetchers.values().any(|(_, t)| t.is_finished()) {
            walked_at = Some(version);
            let mut wanted: BTreeMap<i32, Vec<(Arc<Partition>, i32)>> = BTreeMap::new();
            for p in replicas.partitions() {
                if let Some((leader_id, leader_epoch)) = p.followed_leader() {
                    // Nothing is fetched into a failed dir (KIP-112).
                    if leader_id >= 0 && leader_id != me && !p.is_offline() {
                        wanted.entry(leader_id).or_default().push((p, leader_epoch));
                    }
                }
            }
            fetchers.retain(|leader, (_, task)| {
                let keep = wanted.contains_key(leader) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            for (leader, parts) in wanted {
                let set = match fetchers.get(&leader) {
                    Some((set, _)) => set.clone(),
                    None => {
                        let set: FollowedSet = Arc::default();
                        let task = tokio::spawn(fetcher(
                            leader,
                            set.clone(),
                            metadata.clone(),
                            config.clone(),
                            shutdown.clone(),
                        ));
                        fetchers.insert(leader, (set.clone(), task));
                        set
                    }
                };
                let mut followed = set.lock().expect("fetcher set lock poisoned");
                let keys: std::collections::HashSet<Key> = parts
                    .iter()
                    .map(|(p, _)| (p.topic.clone(), p.index))
                    .collect();
                followed.retain(|k, _| keys.contains(k));
                for (p, leader_epoch) in parts {
                    let key = (p.topic.clone(), p.index);
                    match followed.get_mut(&key) {
                        Some(f)
                            if f.leader_epoch == leader_epoch && Arc::ptr_eq(&f.partition, &p) => {}
                        _ => {
                            followed.insert(
                                key,
                                Followed {
                                    partition: p,
                                    leader_epoch,
                                    truncated: false,
                                },
                            );
                        }
                    }
                }
            }
        }
        if stopped_within(&mut shutdown, RECONCILE_INTERVAL).await {
            for (_, (_, task)) in fetchers {
                task.abort();
            }
            return;
        }
    }
}

/// Fetches every partition in `set` from `leader` until `shutdown` (or the manager
/// aborts it).
async fn fetcher(
    leader: i32,
    set: FollowedSet,
    metadata: Arc<Metadata>,
    config: Arc<BrokerConfig>,
    mut shutdown: watch::Receiver<bool>,
) {
    let backoff = Duration::from_millis(config.replication.fetch_backoff_ms.max(10));
    let mut conn: Option<PeerConn> = None;
    let mut failing = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let followed: Vec<(Key, Followed)> = set
            .lock()
            .expect("fetcher set lock poisoned")
            .iter()
            .map(|(k, f)| (k.clone(), f.clone()))
            .collect();
        if followed.is_empty() {
            if stopped_within(&mut shutdown, RECONCILE_INTERVAL).await {
                return;
            }
            continue;
        }
        if conn.is_none() {
            let Some(addr) = broker_address(&metadata, &config, leader) else {
                if stopped_within(&mut shutdown, backoff).await {
                    return;
                }
                continue;
            };
            match PeerConn::connect(
                &addr,
                format!("weir-replica-fetcher-{}", config.node_id),
                max_response_bytes(&config),
            )
            .await
            {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    if !failing {
                        tracing::warn!(leader, %addr, error = %e, "cannot connect to the partition leader; retrying");
                        failing = true;
                    }
                    if stopped_within(&mut shutdown, backoff).await {
                        return;
                    }
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let round = async {
            let to_truncate: Vec<&(Key, Followed)> =
                followed.iter().filter(|(_, f)| !f.truncated).collect();
            if !to_truncate.is_empty() {
                truncate_by_epoch(c, &config, &to_truncate, &set).await?;
            }
            let fetching: Vec<&(Key, Followed)> = {
                let s = set.lock().expect("fetcher set lock poisoned");
                followed
                    .iter()
                    .filter(|(k, _)| s.get(k).is_some_and(|f| f.truncated))
                    .collect()
            };
            if fetching.is_empty() {
                return Ok::<bool, anyhow::Error>(false);
            }
            fetch_once(c, &config, &fetching, &set).await
        };
        let outcome = tokio::select! {
            r = round => r,
            _ = shutdown.changed() => return,
        };
        match outcome {
            Ok(backoff_needed) => {
                if failing {
                    tracing::info!(leader, "fetching from the partition leader again");
                    failing = false;
                }
                if backoff_needed && stopped_within(&mut shutdown, backoff).await {
                    return;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(leader, error = %e, "replica fetch failed; reconnecting");
                    failing = true;
                }
                conn = None;
                if stopped_within(&mut shutdown, backoff).await {
                    return;
                }
            }
        }
    }
}

/// Marks `key` in `set` (if still followed at `leader_epoch`) truncated or not.
fn set_truncated(set: &FollowedSet, key: &Key, leader_epoch: i32, truncated: bool) {
    if let Some(f) = set.lock().expect("fetcher set lock poisoned").get_mut(key) {
        if f.leader_epoch == leader_epoch {
            f.truncated = truncated;
        }
    }
}

/// KIP-101/KIP-279 truncation: asks the leader where each partition's latest local epoch
/// ends in its log and cuts the local log there (or at its own end of the epoch the
/// leader names, when the leader does not know the local one).
async fn truncate_by_epoch(
    conn: &mut PeerConn,
    config: &BrokerConfig,
    parts: &[&(Key, Followed)],
    set: &FollowedSet,
) -> anyhow::Result<()> {
    let mut by_topic: BTreeMap<&str, Vec<OffsetForLeaderPartition>> = BTreeMap::new();
    let mut asked: HashMap<Key, i32> = HashMap::new();
    for ((topic, index), f) in parts.iter().map(|e| (&e.0, &e.1)) {
        let Some(epoch) = f.partition.latest_epoch() else {
            // Nothing local: nothing to cut.
            set_truncated(set, &(topic.clone(), *index), f.leader_epoch, true);
            continue;
        };
        asked.insert((topic.clone(), *index), epoch);
        by_topic.entry(topic).or_default().push(
            OffsetForLeaderPartition::default()
                .with_partition(*index)
                .with_current_leader_epoch(f.leader_epoch)
                .with_leader_epoch(epoch),
        );
    }
    if by_topic.is_empty() {
        return Ok(());
    }
    let request = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(config.node_id))
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    OffsetForLeaderTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        );
    let response = conn
        .call(&request, OFFSET_FOR_LEADER_EPOCH_VERSION, Duration::ZERO)
        .await?;
    for t in response.topics {
        let topic = t.topic.0.to_string();
        for r in t.partitions {
            let key = (topic.clone(), r.partition);
            let Some(f) = parts.iter().find(|e| e.0 == key).map(|e| &e.1) else {
                continue;
            };
            if r.error_code != 0 {
                tracing::debug!(
                    topic,
                    partition = r.partition,
                    error = r.error_code,
                    "OffsetForLeaderEpoch refused; waiting for the metadata"
                );
                continue;
            }
            let asked_epoch = asked.get(&key).copied().unwrap_or(-1);
            let p = &f.partition;
            let leo = p.offsets().log_end_offset;
            let cut = if r.leader_epoch < 0 || r.end_offset < 0 {
                // The leader knows no epoch at or below ours: keep the log (Kafka falls
                // back to the high watermark; a leader elected from the ISR has every
                // committed record, and the fetch from our end says if we are beyond it).
                leo
            } else if r.leader_epoch < asked_epoch {
                // Our latest epoch is unknown to the leader: cut at the end of the epoch
                // it names, in our log and in its.
                let ours = p.end_offset_for_epoch(r.leader_epoch);
                if ours.end_offset >= 0 {
                    r.end_offset.min(ours.end_offset)
                } else {
                    r.end_offset
                }
            } else {
                r.end_offset
            };
            // Always, even at the end: it drops an epoch the log assigned and never wrote.
            p.truncate_to(cut, now_ms())?;
            set_truncated(set, &key, f.leader_epoch, true);
        }
    }
    Ok(())
}

/// One Fetch from the leader for `parts`; appends what it returns. Returns whether the
/// fetcher should back off before the next (a partition error the metadata must settle).
async fn fetch_once(
    conn: &mut PeerConn,
    config: &BrokerConfig,
    parts: &[&(Key, Followed)],
    set: &FollowedSet,
) -> anyhow::Result<bool> {
    let settings = &config.replication;
    let mut by_topic: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
    for ((topic, index), f) in parts.iter().map(|e| (&e.0, &e.1)) {
        let offsets = f.partition.offsets();
        by_topic.entry(topic).or_default().push(
            FetchPartition::default()
                .with_partition(*index)
                .with_current_leader_epoch(f.leader_epoch)
                .with_fetch_offset(offsets.log_end_offset)
                .with_log_start_offset(offsets.log_start_offset)
                .with_partition_max_bytes(settings.fetch_max_bytes),
        );
    }
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(config.node_id))
        .with_max_wait_ms(settings.fetch_wait_max_ms)
        .with_min_bytes(1)
        .with_max_bytes(settings.fetch_response_max_bytes)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        );
    let wait = Duration::from_millis(settings.fetch_wait_max_ms.max(0) as u64);
    let response = conn.call(&request, FETCH_VERSION, wait).await?;
    if response.error_code != 0 {
        anyhow::bail!("fetch refused with error {}", response.error_code);
    }
    let mut backoff = false;
    for t in response.responses {
        let topic = t.topic.0.to_string();
        for r in t.partitions {
            let key = (topic.clone(), r.partition_index);
            let Some(f) = parts.iter().find(|e| e.0 == key).map(|e| &e.1) else {
                continue;
            };
            match ResponseError::try_from_code(r.error_code) {
                None => {}
                Some(ResponseError::OffsetOutOfRange) => {
                    // Below the leader's log start: go on from there (Kafka's
                    // `truncateFullyAndStartAt`). Above its end: truncate by epoch again.
                    match f
                        .partition
                        .reset_to_leader_log_start(r.log_start_offset, now_ms())
                    {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(topic, partition = r.partition_index, "the leader has no records at this follower's log end offset; truncating by epoch again");
                            set_truncated(set, &key, f.leader_epoch, false);
                            backoff = true;
                        }
                        Err(e) => {
                            tracing::error!(topic, partition = r.partition_index, error = %e, "cannot restart the log at the leader's log start");
                            backoff = true;
                        }
                    }
                    continue;
                }
                Some(e) => {
                    tracing::debug!(topic, partition = r.partition_index, error = ?e, "replica fetch refused; waiting for the metadata");
                    backoff = true;
                    continue;
                }
            }
            let bytes = r.records.unwrap_or_default();
            let batches = match split_fetched(bytes) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(topic, partition = r.partition_index, error = %e, "the leader sent a corrupt batch; fetching again");
                    backoff = true;
                    continue;
                }
            };
            match f
                .partition
                .append_as_follower(batches, r.high_watermark, now_ms())
            {
                Ok(()) => {
                    if let Err(e) = f.partition.follow_leader_log_start(r.log_start_offset) {
                        tracing::error!(topic, partition = r.partition_index, error = %e, "cannot move the log start offset to the leader's");
                        backoff = true;
                    }
                }
                Err(e @ LogError::UnexpectedAppendOffset { .. }) => {
                    tracing::warn!(topic, partition = r.partition_index, error = %e, "follower log out of step with the leader; truncating by epoch again");
                    set_truncated(set, &key, f.leader_epoch, false);
                }
                Err(LogError::Deleted) => {
                    tracing::debug!(
                        topic,
                        partition = r.partition_index,
                        "partition deleted while its fetch was in flight"
                    );
                }
                Err(e) => {
                    tracing::error!(topic, partition = r.partition_index, error = %e, "cannot append replicated records");
                    backoff = true;
                }
            }
        }
    }
    Ok(backoff)
}
