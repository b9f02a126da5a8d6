//! Broker registration, heartbeats and fencing (KIP-631, Kafka's `BrokerHeartbeatManager`
//! and `ReplicationControlManager`'s fencing).
//!
//! Owns: [`BrokerSessions`], the active controller's in-memory table of last heartbeats
//! (never written to the log: a heartbeat every `broker.heartbeat.interval.ms` per broker
//! would grow it without end); [`session_changes`], the fence and unfence records the
//! active controller proposes from that table and the image; and the two tasks a broker
//! runs ([`heartbeat_loop`]: tell the active controller this broker is alive, registering
//! first if start-up could not; [`fence_loop`]: on the active controller, propose those
//! records). A newly elected controller starts every registered broker's clock afresh, as
//! KRaft does. The controller never fences its own broker: it is alive while it runs the
//! check (combined mode), so a single node never fences itself.
//!
//! Duplicate registrations (KIP-631's DUPLICATE_BROKER_REGISTRATION, 101):
//! [`duplicate_registration`] is the active controller's check of a registration another
//! node sends it, against the image and [`BrokerSessions`]; [`register_at_start`] retries
//! a refused one for a session and then stops the broker.
//!
//! Controlled shutdown (KIP-631's `wantShutDown`): when a broker of a multi-node quorum
//! stops, its heartbeat task commits `BrokerShuttingDown` for its epoch (every image
//! shows it shutting down, clients stop being told of it, its partitions go offline),
//! then, as KRaft's controller does once such a broker has nothing left to hand over
//! (`SHUTDOWN_NOW`), `BrokerFenced`: it is fenced at once rather than after
//! `broker.session.timeout.ms`. Heartbeats never unfence a broker in controlled
//! shutdown; registering again (a restart) does. Bounded by
//! [`CONTROLLED_SHUTDOWN_TIMEOUT`]: the broker stops anyway when the quorum does not
//! commit in time (its session then lapses as a killed broker's does).
//!
//! A failed log dir (KIP-112, KIP-858): [`offline_replica_records`] is the
//! `ReplicasOffline` record a broker commits for its replicas on the dir, with the
//! elections it makes necessary ([`Metadata::report_offline_replicas`]).
//!
//! Never does: decide the records' effects (`image.rs`), or block a task on a commit
//! outside `spawn_blocking` (or, for the bounded controlled shutdown, a thread of its
//! own). Every wait is bounded; both tasks end on the shutdown watch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::election::{leadership_changes, rebalance_changes};
use super::image::{BrokerEndpoint, MetadataDelta, MetadataImage, MetadataRecord};
use super::{Metadata, MetadataError, UpdateError};

/// Most brokers the active controller keeps a heartbeat time for; a heartbeat of a
/// further broker id is dropped.
pub(crate) const MAX_BROKER_SESSIONS: usize = 4096;

/// Longest a stopping broker waits for its controlled shutdown to be committed before it
/// stops anyway.
pub(crate) const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// The active controller's last heartbeat per broker (Kafka's `BrokerHeartbeatManager`):
/// in memory only; cleared when this node starts or stops leading. Also what the Raft
/// network saw of each broker's CONTROLLER listener and heartbeat connections, the
/// evidence that lets a killed broker be fenced before its session lapses
/// ([`session_changes`], docs/cluster.md "Fencing a killed broker early").
#[derive(Debug, Default)]
pub(crate) struct BrokerSessions {
    inner: Mutex<SessionTable>,
    /// Woken when that evidence changes (a refused connect, a heartbeat connection
    /// closed), so the fence task looks at once rather than at its next tick.
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct SessionTable {
    /// Since when this node leads (`None`: it does not); every clock starts here.
    leading_since: Option<Instant>,
    /// Broker id → (epoch heartbeat with, when).
    last: HashMap<i32, (i64, Instant)>,
    /// Broker id → when this leader first saw it registered at that epoch (set by
    /// [`session_changes`]; a refusal before it may be of an earlier incarnation).
    epoch_seen: HashMap<i32, (i64, Instant)>,
    /// Broker id (= its voter id) → when the latest connect to its CONTROLLER listener
    /// that was refused (ECONNREFUSED: nothing listens there) was started; removed when a
    /// connect succeeds or it heartbeats.
    refused: HashMap<i32, Instant>,
    /// Broker id → how many connections to this node are open that its heartbeats came on.
    heartbeat_connections: HashMap<i32, u32>,
    /// `broker.session.timeout.ms` and `broker.heartbeat.interval.ms` of this node (set by
    /// [`fence_loop`]; `None`: Kafka's defaults), for [`duplicate_registration`].
    timing: Option<(Duration, Duration)>,
}

/// Kafka's defaults of `broker.session.timeout.ms` and `broker.heartbeat.interval.ms`,
/// what [`duplicate_registration`] assumes before [`fence_loop`] sets this node's.
const DEFAULT_SESSION_TIMING: (Duration, Duration) =
    (Duration::from_millis(9000), Duration::from_millis(2000));

/// An open connection heartbeats of `broker_id` came on (see
/// [`BrokerSessions::heartbeat_connection`]); dropping it says the connection closed.
#[derive(Debug)]
pub(crate) struct HeartbeatConnection {
    sessions: Arc<BrokerSessions>,
    broker_id: i32,
}

impl HeartbeatConnection {
    /// The broker whose heartbeats came on this connection.
    pub(crate) fn broker_id(&self) -> i32 {
        self.broker_id
    }
}

impl Drop for HeartbeatConnection {
    fn drop(&mut self) {
        {
            let mut t = self.sessions.table();
            if let Some(n) = t.heartbeat_connections.get_mut(&self.broker_id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    t.heartbeat_connections.remove(&self.broker_id);
                }
            }
        }
        self.sessions.changed.notify_one();
    }
}

impl BrokerSessions {
    fn table(&self) -> std::sync::MutexGuard<'_, SessionTable> {
        // Poisoned only by a panic while holding it: a bug.
        self.inner.lock().expect("broker sessions lock poisoned")
    }

    /// Notes a heartbeat of `broker_id` at `broker_epoch`.
    pub(crate) fn record(&self, broker_id: i32, broker_epoch: i64, at: Instant) {
        let mut t = self.table();
        if t.last.len() < MAX_BROKER_SESSIONS || t.last.contains_key(&broker_id) {
            t.last.insert(broker_id, (broker_epoch, at));
        }
        t.refused.remove(&broker_id);
    }

    /// Notes that a connect to `broker_id`'s CONTROLLER listener, started at `started`,
    /// was refused (ECONNREFUSED), and wakes the fence task.
    pub(crate) fn note_refused(&self, broker_id: i32, started: Instant) {
        {
            let mut t = self.table();
            if t.refused.len() < MAX_BROKER_SESSIONS || t.refused.contains_key(&broker_id) {
                let latest = t
                    .refused
                    .get(&broker_id)
                    .map_or(started, |r| (*r).max(started));
                t.refused.insert(broker_id, latest);
            }
        }
        self.changed.notify_one();
    }

    /// Notes that `broker_id`'s CONTROLLER listener answered (something listens there).
    pub(crate) fn note_reachable(&self, broker_id: i32) {
        let mut t = self.table();
        if !t.refused.is_empty() {
            t.refused.remove(&broker_id);
        }
    }

    /// Notes a connection that heartbeats of `broker_id` came on; open until the returned
    /// guard is dropped.
    pub(crate) fn heartbeat_connection(self: &Arc<Self>, broker_id: i32) -> HeartbeatConnection {
        let mut t = self.table();
        if t.heartbeat_connections.len() < MAX_BROKER_SESSIONS
            || t.heartbeat_connections.contains_key(&broker_id)
        {
            *t.heartbeat_connections.entry(broker_id).or_insert(0) += 1;
            drop(t);
            HeartbeatConnection {
                sessions: self.clone(),
                broker_id,
            }
        } else {
            // Not counted (beyond the table's bound): a guard that counts nothing would
            // undercount; count it under a key that never names a broker instead.
            drop(t);
            HeartbeatConnection {
                sessions: self.clone(),
                broker_id: i32::MIN,
            }
        }
    }

    /// Waits until the evidence of [`BrokerSessions::note_refused`] or a closed heartbeat
    /// connection changes (or was changed since the last wait).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Tells whether this node leads now; a change of leadership starts every clock
    /// afresh at `now`.
    pub(crate) fn set_leading(&self, leading: bool, now: Instant) {
        let mut t = self.table();
        match (leading, t.leading_since) {
            (true, None) => {
                t.last.clear();
                t.epoch_seen.clear();
                t.leading_since = Some(now);
            }
            (false, Some(_)) => {
                t.last.clear();
                t.epoch_seen.clear();
                t.leading_since = None;
            }
            _ => {}
        }
    }

    /// Notes this node's `broker.session.timeout.ms` and `broker.heartbeat.interval.ms`.
    pub(crate) fn set_timing(&self, session_timeout: Duration, heartbeat_interval: Duration) {
        self.table().timing = Some((session_timeout, heartbeat_interval));
    }

    /// Since when this node leads, if it does.
    fn leading_since(&self) -> Option<Instant> {
        self.table().leading_since
    }

    /// When `broker_id` last heartbeat at `broker_epoch` (since this node leads).
    pub(crate) fn last_heartbeat(&self, broker_id: i32, broker_epoch: i64) -> Option<Instant> {
        self.table()
            .last
            .get(&broker_id)
            .filter(|(epoch, _)| *epoch == broker_epoch)
            .map(|(_, at)| *at)
    }

    /// Whether `broker_id` at `broker_epoch` is gone by the network's evidence, noting at
    /// `now` when this leader first sees that epoch: a connect to its CONTROLLER listener
    /// started after this leader first saw the epoch (so after that incarnation listened)
    /// and after its last heartbeat was refused, and no connection its heartbeats came on
    /// is open. A live broker listens and keeps its heartbeat connection: never gone.
    fn gone(&self, broker_id: i32, broker_epoch: i64, now: Instant) -> bool {
        let mut t = self.table();
        let seen = match t.epoch_seen.get(&broker_id) {
            Some((epoch, at)) if *epoch == broker_epoch => *at,
            _ => {
                if t.epoch_seen.len() < MAX_BROKER_SESSIONS || t.epoch_seen.contains_key(&broker_id)
                {
                    t.epoch_seen.insert(broker_id, (broker_epoch, now));
                }
                return false;
            }
        };
        let Some(&refused) = t.refused.get(&broker_id) else {
            return false;
        };
        let heartbeat = t
            .last
            .get(&broker_id)
            .filter(|(epoch, _)| *epoch == broker_epoch)
            .map(|(_, at)| *at);
        refused > seen
            && heartbeat.is_none_or(|h| h < refused)
            && !t.heartbeat_connections.contains_key(&broker_id)
    }

    /// Whether the network's evidence (not the session timeout) says `broker_id` is gone
    /// (for the log line of a fence).
    pub(crate) fn refused(&self, broker_id: i32) -> bool {
        self.table().refused.contains_key(&broker_id)
    }
}

/// Why the active controller `controller_id` (this process, whose broker registers with
/// `own_incarnation`) refuses, at `now`, a registration of `broker_id` with
/// `incarnation_id` that another node sent it (a `Propose` RPC): Kafka's
/// DUPLICATE_BROKER_REGISTRATION (101), `ClusterControlManager.registerBroker` (KIP-631).
/// `None`: it may go ahead. Refused when
/// - `broker_id` is this controller's own id and the incarnation is not this process's
///   (this process is alive with that id), or
/// - the image holds a registration of `broker_id` with another incarnation id that is
///   not fenced and whose session is live: heard from at its epoch within
///   `broker.session.timeout.ms` (clocks start when this node began to lead, as for
///   fencing), unless the network says that incarnation is gone (weir's addition, so a
///   killed broker restarted at once is not refused for a whole session): no connection
///   its heartbeats came on is open here and it has not been heard from for two
///   `broker.heartbeat.interval.ms` (a live broker heartbeats every interval, on one
///   connection it keeps open).
///
/// A registration with the same incarnation id is a retry; one of a fenced broker, or
/// one whose session lapsed, a restart: both go ahead. The text names the broker, the
/// registration it would replace and why it is thought alive.
pub(crate) fn duplicate_registration(
    image: &MetadataImage,
    sessions: &BrokerSessions,
    controller_id: i32,
    own_incarnation: uuid::Uuid,
    broker_id: i32,
    incarnation_id: uuid::Uuid,
    now: Instant,
) -> Option<String> {
    if broker_id == controller_id {
        return (incarnation_id != own_incarnation).then(|| {
            format!(
                "Another broker is registered with that broker id: node.id={broker_id} is the active controller's own id, and that process is alive"
            )
        });
    }
    let existing = image.broker(broker_id)?;
    if existing.incarnation_id == incarnation_id || existing.fenced {
        return None;
    }
    let t = sessions.table();
    let (session_timeout, heartbeat_interval) = t.timing.unwrap_or(DEFAULT_SESSION_TIMING);
    // A controller that does not lead yet in the session table is about to: its clocks
    // start now.
    let since = t.leading_since.unwrap_or(now);
    let heard = t
        .last
        .get(&broker_id)
        .filter(|(epoch, _)| *epoch == existing.broker_epoch)
        .map(|(_, at)| *at);
    let seen = heard.map_or(since, |at| at.max(since));
    let silent_for = now.saturating_duration_since(seen);
    if silent_for > session_timeout {
        return None;
    }
    let connected = t.heartbeat_connections.contains_key(&broker_id);
    if !connected && silent_for > heartbeat_interval * 2 {
        return None;
    }
    Some(format!(
        "Another broker is registered with that broker id: node.id={broker_id} is registered at broker epoch {} (incarnation {}, endpoint {}) and alive: heard from {} ms ago (broker.session.timeout.ms={}){}",
        existing.broker_epoch,
        existing.incarnation_id,
        existing
            .endpoints
            .first()
            .map_or_else(|| "none".to_string(), |e| format!("{}:{}", e.host, e.port)),
        silent_for.as_millis(),
        session_timeout.as_millis(),
        if connected {
            ", its heartbeat connection open"
        } else {
            ""
        }
    ))
}

/// The records the active controller `controller_id` proposes at `now`: a fence for each
/// unfenced broker not heard from (at its current epoch) for longer than
/// `session_timeout` since the later of its last heartbeat and the start of this
/// leadership, or gone by the network's evidence (its CONTROLLER listener refused a
/// connect since, no heartbeat connection of it open: `BrokerSessions::gone`); an
/// unfence for each fenced broker heard from within it. Its own broker
/// is never fenced (and unfenced if a previous controller fenced it). Empty when this
/// node does not lead.
pub(crate) fn session_changes(
    image: &MetadataImage,
    sessions: &BrokerSessions,
    controller_id: i32,
    now: Instant,
    session_timeout: Duration,
) -> Vec<MetadataRecord> {
    let Some(since) = sessions.leading_since() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for b in image.brokers() {
        let (broker_id, broker_epoch) = (b.broker_id, b.broker_epoch);
        let last = sessions.last_heartbeat(broker_id, broker_epoch);
        let alive = if b.in_controlled_shutdown {
            // Stopping (even this controller's own broker): never unfenced by
            // heartbeats; fenced when its session lapses, if its own fence did not commit.
            let seen = last.map_or(since, |at| at.max(since));
            !b.fenced && now.saturating_duration_since(seen) <= session_timeout
        } else if broker_id == controller_id {
            true
        } else if b.fenced {
            // Heard from within the session, and not gone since by the network's evidence:
            // the heartbeats a killed broker sent before it was fenced early do not
            // unfence it (they did, and it flapped every tick until its session lapsed).
            last.is_some_and(|at| now.saturating_duration_since(at) <= session_timeout)
                && !sessions.gone(broker_id, broker_epoch, now)
        } else {
            let seen = last.map_or(since, |at| at.max(since));
            now.saturating_duration_since(seen) <= session_timeout
                && !sessions.gone(broker_id, broker_epoch, now)
        };
        match (b.fenced, alive) {
            (false, false) => out.push(MetadataRecord::BrokerFenced {
                broker_id,
                broker_epoch,
            }),
            (true, true) => out.push(MetadataRecord::BrokerUnfenced {
                broker_id,
                broker_epoch,
            }),
            _ => {}
        }
    }
    out
}

/// `records` followed by the elections they make necessary once applied to `image`
/// ([`leadership_changes`]: a fenced or stopping broker's leaderships move to another ISR
/// member, it leaves the ISRs; a returning broker's offline partitions come back;
/// `unclean_default` is the broker's `unclean.leader.election.enable`).
fn with_elections(
    image: &MetadataImage,
    mut records: Vec<MetadataRecord>,
    unclean_default: bool,
) -> Vec<MetadataRecord> {
    if records.is_empty() {
        // Nothing to apply first: the image as it is (no copy of every partition).
        return leadership_changes(image, unclean_default);
    }
    // Records that do not apply get no elections: the update refuses them anyway.
    if let Ok(delta) = MetadataDelta::apply(std::sync::Arc::new(image.clone()), records.clone()) {
        records.extend(leadership_changes(delta.after(), unclean_default));
    }
    records
}

/// The `ReplicasOffline` record broker `broker_id` commits for its replicas of
/// `partitions` (topic name, index) on a failed log dir, from `image`: only partitions
/// that exist, have `broker_id` among their replicas with at least one other replica
/// (a sole replica has nowhere to move: it stays leader answering KAFKA_STORAGE_ERROR, as
/// on a single node) and are not marked offline yet. Empty when none is left or the
/// broker is not registered (nothing to report against).
pub(crate) fn offline_replica_records(
    image: &MetadataImage,
    broker_id: i32,
    partitions: &[(String, i32)],
) -> Vec<MetadataRecord> {
    let Some(broker) = image.broker(broker_id) else {
        return Vec::new();
    };
    let mut keys: Vec<(uuid::Uuid, i32)> = partitions
        .iter()
        .filter_map(|(topic, index)| {
            let meta = image.topic(topic)?;
            let state = meta.partition(*index)?;
            let elsewhere = state.replicas.iter().any(|r| *r != broker_id);
            (state.replicas.contains(&broker_id)
                && elsewhere
                && !image.replica_offline(meta.id, *index, broker_id))
            .then_some((meta.id, *index))
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return Vec::new();
    }
    vec![MetadataRecord::ReplicasOffline {
        broker_id,
        broker_epoch: broker.broker_epoch,
        partitions: keys,
    }]
}

impl Metadata {
    /// Commits this broker's replicas of `partitions` (topic, index) as offline (its log
    /// dir holding them failed), with the elections that follows (they leave the ISR,
    /// leaderships move to another active ISR replica; `unclean_default` is the broker's
    /// `unclean.leader.election.enable`), as one change ([`offline_replica_records`]).
    /// Blocks until committed. Returns how many replicas it marked (0: nothing to do), or
    /// `None` when the image does not hold this process's registration yet (a restart
    /// whose registration is not committed: a mark at the earlier incarnation's epoch
    /// would be cleared by it; the caller tries again later).
    ///
    /// Errors: [`MetadataError`]: not committed in time, or refused on apply (a
    /// concurrent change; the caller tries again).
    pub(crate) fn report_offline_replicas(
        &self,
        partitions: &[(String, i32)],
        unclean_default: bool,
    ) -> Result<Option<usize>, MetadataError> {
        let me = self.node_id();
        let own_incarnation = self.quorum().map(|q| q.incarnation_id());
        let mut marked = None;
        let result = self.update(|image| {
            let registered = image
                .broker(me)
                .is_some_and(|b| own_incarnation.is_none_or(|i| i == b.incarnation_id));
            if !registered {
                return Ok(Vec::new());
            }
            let records = offline_replica_records(image, me, partitions);
            marked = Some(match records.first() {
                Some(MetadataRecord::ReplicasOffline { partitions, .. }) => partitions.len(),
                _ => 0,
            });
            Ok::<_, std::convert::Infallible>(if records.is_empty() {
                records
            } else {
                with_elections(image, records, unclean_default)
            })
        });
        match result {
            Ok(_) | Err(UpdateError::Incomplete(_)) => Ok(marked),
            Err(UpdateError::Refused(never)) => match never {},
            Err(UpdateError::NotApplied(e)) => Err(e),
        }
    }
}

/// What the active controller proposes at `now`: [`session_changes`] and the elections
/// they (or an earlier change, e.g. a registration, or a topic's
/// `unclean.leader.election.enable` turned on) call for. Empty when this node does not
/// lead.
pub(crate) fn controller_changes(
    image: &MetadataImage,
    sessions: &BrokerSessions,
    controller_id: i32,
    now: Instant,
    settings: &SessionSettings,
) -> Vec<MetadataRecord> {
    if sessions.leading_since().is_none() {
        return Vec::new();
    }
    with_elections(
        image,
        session_changes(
            image,
            sessions,
            controller_id,
            now,
            settings.session_timeout,
        ),
        settings.unclean_leader_election_enable,
    )
}

/// What a broker's session tasks need.
#[derive(Debug, Clone)]
pub(crate) struct SessionSettings {
    /// Advertised endpoints (the first is what Metadata lists).
    pub(crate) endpoints: Vec<BrokerEndpoint>,
    /// `broker.rack`, if any.
    pub(crate) rack: Option<String>,
    /// `broker.heartbeat.interval.ms`.
    pub(crate) heartbeat_interval: Duration,
    /// `broker.session.timeout.ms`.
    pub(crate) session_timeout: Duration,
    /// `unclean.leader.election.enable`, the broker default (topics may override it):
    /// what the elections this node makes as controller or when it stops follow.
    pub(crate) unclean_leader_election_enable: bool,
}

/// What the active controller's leader rebalance needs (`auto.leader.rebalance.enable`
/// and the `leader.imbalance.*` keys, Kafka's names).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RebalanceSettings {
    /// `auto.leader.rebalance.enable`: without it the task ends at once.
    pub(crate) enabled: bool,
    /// `leader.imbalance.check.interval.seconds`.
    pub(crate) check_interval: Duration,
    /// `leader.imbalance.per.broker.percentage`.
    pub(crate) per_broker_percentage: u32,
}

/// Most preferred elections one rebalance check makes (KRaft's
/// `maxElectionsPerImbalance`); the rest wait for the next check.
pub(crate) const MAX_REBALANCE_ELECTIONS: usize = 1000;

/// Registers this broker (blocking: the change commits through the quorum, at most
/// `COMMIT_TIMEOUT_MS`) and returns its new broker epoch, with a log line
/// (`registered broker_id=ID broker_epoch=E`).
///
/// Errors: [`MetadataError`]: the registration could not be committed (no quorum), or
/// [`MetadataError::DuplicateBrokerRegistration`] (101): the active controller refused it.
pub(crate) fn register_blocking(
    metadata: &Metadata,
    settings: &SessionSettings,
) -> Result<i64, MetadataError> {
    let r = metadata.register_broker(settings.endpoints.clone(), settings.rack.clone())?;
    tracing::info!(
        "registered broker_id={} broker_epoch={} incarnation_id={}",
        r.broker_id,
        r.broker_epoch,
        r.incarnation_id
    );
    Ok(r.broker_epoch)
}

/// How often a registration refused as a duplicate is tried again at start-up (at most;
/// `broker.heartbeat.interval.ms` when shorter).
const DUPLICATE_RETRY_EVERY: Duration = Duration::from_millis(500);

/// Registers this broker at start-up ([`register_blocking`], blocking). A registration
/// refused with DUPLICATE_BROKER_REGISTRATION (101) is tried again, with the same
/// incarnation id, every heartbeat interval (at most [`DUPLICATE_RETRY_EVERY`]) for
/// `broker.session.timeout.ms` + `broker.heartbeat.interval.ms`: long enough for the
/// session of this node's own previous incarnation (killed, restarted at once) to lapse,
/// as Kafka's broker retries its registration; a broker still refused after that is
/// another live process with this `node.id`. Returns the broker epoch, or `None` when the
/// quorum could not commit it (no leader yet: the heartbeat task retries in the
/// background, and the broker serves meanwhile, as before).
///
/// Errors: still refused as a duplicate at the end of that time: the text names
/// `node.id`, error 101 and the controller's reason; the broker must stop (logged too).
pub(crate) fn register_at_start(
    metadata: &Metadata,
    settings: &SessionSettings,
) -> Result<Option<i64>, String> {
    let give_up_after = settings.session_timeout + settings.heartbeat_interval;
    let pause = settings
        .heartbeat_interval
        .clamp(Duration::from_millis(10), DUPLICATE_RETRY_EVERY);
    let mut first_refused: Option<Instant> = None;
    loop {
        match register_blocking(metadata, settings) {
            Ok(epoch) => return Ok(Some(epoch)),
            Err(MetadataError::DuplicateBrokerRegistration(why)) => {
                let since = *first_refused.get_or_insert_with(Instant::now);
                if since.elapsed() >= give_up_after {
                    let node_id = metadata.node_id();
                    let message = format!(
                        "node.id={node_id} is already registered by another live broker: the active controller refused this node's registration with DUPLICATE_BROKER_REGISTRATION (101) for {} ms (broker.session.timeout.ms + broker.heartbeat.interval.ms): {why}. Another process runs with node.id={node_id}; give this node another node.id (and its own controller.quorum.voters entry) or stop the other one",
                        since.elapsed().as_millis()
                    );
                    tracing::error!("{message}; this node stops");
                    return Err(message);
                }
                tracing::info!(
                    "broker registration refused with DUPLICATE_BROKER_REGISTRATION (101), retrying until the previous incarnation's session lapses: {why}"
                );
                std::thread::sleep(pause);
            }
            Err(e) => {
                tracing::warn!(error = %e, "broker registration failed; retrying in the background");
                return Ok(None);
            }
        }
    }
}

/// Sleeps `d`, or returns `true` at once when `shutdown` turns true (or its sender is gone).
pub(crate) async fn stopped_within(shutdown: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        r = shutdown.changed() => r.is_err() || *shutdown.borrow(),
        () = tokio::time::sleep(d) => false,
    }
}

/// Every `broker.heartbeat.interval.ms`, tells the active controller this broker (at
/// `epoch`) is alive; registers first when `epoch` is `None` (start-up could not), retrying
/// each interval. Ends when `shutdown` turns true. No quorum (a local store): registers
/// nothing and ends.
pub(crate) async fn heartbeat_loop(
    metadata: Arc<Metadata>,
    settings: SessionSettings,
    mut epoch: Option<i64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(quorum) = metadata.quorum().cloned() else {
        return;
    };
    let interval = settings.heartbeat_interval.max(Duration::from_millis(10));
    let ttl = interval.clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut client = super::raft::HeartbeatClient::default();
    let mut failing = false;
    loop {
        match epoch {
            None => {
                let (m, s) = (metadata.clone(), settings.clone());
                match tokio::task::spawn_blocking(move || register_blocking(&m, &s)).await {
                    Ok(Ok(e)) => epoch = Some(e),
                    Ok(Err(e @ MetadataError::DuplicateBrokerRegistration(_))) => {
                        tracing::error!(
                            error = %e,
                            "broker registration refused: another live broker has node.id={}; retrying (this node stays unregistered)",
                            metadata.node_id()
                        )
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "broker registration failed; retrying")
                    }
                    Err(e) => tracing::warn!(error = %e, "broker registration task failed"),
                }
            }
            Some(e) => {
                let sent = quorum
                    .heartbeat(&mut client, metadata.node_id(), e, ttl)
                    .await;
                match sent {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("broker heartbeats reach the active controller again");
                    }
                    Ok(()) => {}
                    Err(why) if !failing => {
                        failing = true;
                        tracing::warn!(error = %why, "broker heartbeat not delivered");
                    }
                    Err(why) => tracing::debug!(error = %why, "broker heartbeat not delivered"),
                }
            }
        }
        if stopped_within(&mut shutdown, interval).await {
            if let Some(e) = epoch {
                if quorum.voter_count() > 1 || !quorum.is_voter() {
                    controlled_shutdown(metadata, e, settings.unclean_leader_election_enable).await;
                }
            }
            return;
        }
    }
}

/// The records that put `broker_id` at `broker_epoch` in controlled shutdown and then
/// fence it, those of the two steps not in `image` yet (none when it registered again).
fn shutdown_records(
    image: &MetadataImage,
    broker_id: i32,
    broker_epoch: i64,
) -> [Vec<MetadataRecord>; 2] {
    let Some(b) = image
        .broker(broker_id)
        .filter(|b| b.broker_epoch == broker_epoch)
    else {
        return [Vec::new(), Vec::new()];
    };
    let shutting = if b.in_controlled_shutdown {
        Vec::new()
    } else {
        vec![MetadataRecord::BrokerShuttingDown {
            broker_id,
            broker_epoch,
        }]
    };
    let fence = if b.fenced {
        Vec::new()
    } else {
        vec![MetadataRecord::BrokerFenced {
            broker_id,
            broker_epoch,
        }]
    };
    [shutting, fence]
}

/// This broker (at `epoch`) stops: commits its controlled shutdown, then its fence (see
/// the module doc), through the quorum, on a thread of its own; waits at most
/// [`CONTROLLED_SHUTDOWN_TIMEOUT`], then lets the broker stop anyway (the thread gives up
/// within `COMMIT_TIMEOUT_MS`; the process may end first).
async fn controlled_shutdown(metadata: Arc<Metadata>, epoch: i64, unclean_default: bool) {
    let me = metadata.node_id();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("weir-shutdown".into())
        .spawn(move || {
            let mut result = Ok(());
            for step in 0..2 {
                let committed = metadata.update(|image| {
                    let mut records = shutdown_records(image, me, epoch);
                    let step_records = std::mem::take(&mut records[step]);
                    // Leadership moves off this broker with its first step.
                    Ok::<_, std::convert::Infallible>(if step_records.is_empty() {
                        step_records
                    } else {
                        with_elections(image, step_records, unclean_default)
                    })
                });
                match committed {
                    Ok(_) => {}
                    Err(UpdateError::Refused(never)) => match never {},
                    Err(e) => {
                        result = Err(e.to_string());
                        break;
                    }
                }
                if step == 0 {
                    tracing::info!(
                        "controlled shutdown: broker_id={me} broker_epoch={epoch} is shutting down"
                    );
                }
            }
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "controlled shutdown not started; stopping anyway");
        return;
    }
    match tokio::time::timeout(CONTROLLED_SHUTDOWN_TIMEOUT, rx).await {
        Ok(Ok(Ok(()))) => tracing::info!(
            "controlled shutdown: fenced broker_id={me} broker_epoch={epoch}: it stops"
        ),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "controlled shutdown not committed; stopping anyway")
        }
        Ok(Err(_)) => tracing::warn!("controlled shutdown thread ended; stopping anyway"),
        Err(_) => tracing::warn!(
            "controlled shutdown not committed within {} ms; stopping anyway",
            CONTROLLED_SHUTDOWN_TIMEOUT.as_millis()
        ),
    }
}

/// On the active controller, every tick (a quarter of `broker.session.timeout.ms`, at
/// most `broker.heartbeat.interval.ms`) and whenever the network saw a broker go
/// ([`BrokerSessions::changed`]), proposes the fence and unfence records of
/// [`session_changes`]. Ends when `shutdown` turns true. No quorum: ends at once.
pub(crate) async fn fence_loop(
    metadata: Arc<Metadata>,
    settings: SessionSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(quorum) = metadata.quorum().cloned() else {
        return;
    };
    let timeout = settings.session_timeout;
    quorum
        .sessions()
        .set_timing(timeout, settings.heartbeat_interval);
    let settings = Arc::new(settings);
    let tick = (timeout / 4)
        .min(settings.heartbeat_interval)
        .max(Duration::from_millis(10));
    let me = metadata.node_id();
    // The last image this node, leading, found calling for no change: the elections
    // depend on the image alone, so while it stays the image (and no session changes)
    // the tick does not walk every partition again.
    let mut quiet: Option<Arc<MetadataImage>> = None;
    loop {
        let now = Instant::now();
        let sessions = quorum.sessions();
        sessions.set_leading(quorum.is_leader(), now);
        let image = metadata.image();
        let wanted = if quiet.as_ref().is_some_and(|q| Arc::ptr_eq(q, &image)) {
            session_changes(&image, sessions, me, now, settings.session_timeout)
        } else {
            controller_changes(&image, sessions, me, now, &settings)
        };
        quiet = (wanted.is_empty() && sessions.leading_since().is_some()).then_some(image);
        if !wanted.is_empty() {
            let (m, q, s) = (metadata.clone(), quorum.clone(), settings.clone());
            let proposed = tokio::task::spawn_blocking(move || {
                let mut proposed = Vec::new();
                m.update(|image| {
                    proposed = controller_changes(image, q.sessions(), me, Instant::now(), &s);
                    Ok::<_, std::convert::Infallible>(proposed.clone())
                })
                .map(|_| proposed)
            })
            .await;
            match proposed {
                Ok(Ok(records)) => {
                    for r in records {
                        match r {
                            MetadataRecord::BrokerFenced {
                                broker_id,
                                broker_epoch,
                            } if quorum.sessions().refused(broker_id) => tracing::info!(
                                "fenced broker_id={broker_id} broker_epoch={broker_epoch}: its CONTROLLER listener refuses connections and its heartbeat connection closed"
                            ),
                            MetadataRecord::BrokerFenced {
                                broker_id,
                                broker_epoch,
                            } => tracing::info!(
                                "fenced broker_id={broker_id} broker_epoch={broker_epoch}: no heartbeat for broker.session.timeout.ms"
                            ),
                            MetadataRecord::BrokerUnfenced {
                                broker_id,
                                broker_epoch,
                            } => tracing::info!(
                                "unfenced broker_id={broker_id} broker_epoch={broker_epoch}: heartbeats again"
                            ),
                            MetadataRecord::PartitionChanged {
                                topic_id,
                                partition,
                                state,
                                ..
                            } => tracing::info!(
                                %topic_id,
                                partition,
                                leader = state.leader,
                                leader_epoch = state.leader_epoch,
                                isr = ?state.isr,
                                "partition leadership changed"
                            ),
                            _ => {}
                        }
                    }
                }
                Ok(Err(UpdateError::Refused(never))) => match never {},
                Ok(Err(e)) => tracing::warn!(error = %e, "broker fencing not committed; retrying"),
                Err(e) => tracing::warn!(error = %e, "broker fencing task failed"),
            }
        }
        // The next tick, or sooner when the network saw a broker go.
        let woken = quorum.sessions().changed();
        tokio::select! {
            stopped = stopped_within(&mut shutdown, tick) => {
                if stopped {
                    return;
                }
            }
            () = woken => {}
        }
    }
}

/// On the active controller, every `leader.imbalance.check.interval.seconds`, makes the
/// preferred elections of [`rebalance_changes`] (`auto.leader.rebalance.enable`; Kafka's
/// `checkAndTriggerAutoLeaderRebalance`), at most [`MAX_REBALANCE_ELECTIONS`] per check,
/// committed through the quorum off the runtime's threads. The first check comes one
/// interval after start. Ends when `shutdown` turns true; at once without a quorum or
/// with the key off.
pub(crate) async fn rebalance_loop(
    metadata: Arc<Metadata>,
    settings: RebalanceSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(quorum) = metadata.quorum().cloned() else {
        return;
    };
    if !settings.enabled {
        return;
    }
    let interval = settings.check_interval.max(Duration::from_millis(100));
    let pct = settings.per_broker_percentage;
    loop {
        if stopped_within(&mut shutdown, interval).await {
            return;
        }
        if !quorum.is_leader()
            || rebalance_changes(&metadata.image(), pct, MAX_REBALANCE_ELECTIONS).is_empty()
        {
            continue;
        }
        let m = metadata.clone();
        let committed = tokio::task::spawn_blocking(move || {
            let mut proposed = Vec::new();
            m.update(|image| {
                proposed = rebalance_changes(image, pct, MAX_REBALANCE_ELECTIONS);
                Ok::<_, std::convert::Infallible>(proposed.clone())
            })
            .map(|image| (proposed, image))
        })
        .await;
        match committed {
            Ok(Ok((records, image))) => {
                for r in records {
                    if let MetadataRecord::PartitionChanged {
                        topic_id,
                        partition,
                        state,
                        ..
                    } = r
                    {
                        let topic = image.topic_by_id(topic_id).map(|t| t.name.clone());
                        tracing::info!(
                            topic = topic.as_deref().unwrap_or("?"),
                            partition,
                            leader = state.leader,
                            leader_epoch = state.leader_epoch,
                            "auto leader rebalance: the preferred replica leads again"
                        );
                    }
                }
            }
            Ok(Err(UpdateError::Refused(never))) => match never {},
            // Another change came first (a fence, an ISR change): the next check retries.
            Ok(Err(e)) => tracing::warn!(error = %e, "auto leader rebalance not committed"),
            Err(e) => tracing::warn!(error = %e, "auto leader rebalance task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::MetadataDelta;

    fn image_with(brokers: &[(i32, i64, bool)]) -> Arc<MetadataImage> {
        let mut records = Vec::new();
        for &(broker_id, broker_epoch, fenced) in brokers {
            records.push(MetadataRecord::BrokerRegistered {
                broker_id,
                broker_epoch,
                incarnation_id: uuid::Uuid::new_v4(),
                endpoints: vec![],
                rack: None,
            });
            if fenced {
                records.push(MetadataRecord::BrokerFenced {
                    broker_id,
                    broker_epoch,
                });
            }
        }
        let empty = Arc::new(MetadataImage::empty("c", 1));
        MetadataDelta::apply(empty, records)
            .unwrap()
            .after()
            .clone()
    }

    #[test]
    fn lapsed_sessions_are_fenced_and_fresh_heartbeats_unfence() {
        let timeout = Duration::from_millis(1500);
        let t0 = Instant::now();
        let sessions = BrokerSessions::default();
        let image = image_with(&[(1, 1, false), (2, 2, false), (3, 3, true)]);
        // Not leading: nothing.
        assert!(session_changes(&image, &sessions, 1, t0, timeout).is_empty());
        sessions.set_leading(true, t0);
        // A new leader gives every broker a full session from now.
        assert!(session_changes(&image, &sessions, 1, t0 + timeout, timeout).is_empty());
        sessions.record(2, 2, t0 + Duration::from_millis(1000));
        let later = t0 + Duration::from_millis(2000);
        assert!(session_changes(&image, &sessions, 1, later, timeout).is_empty());
        // Broker 2 stops: fenced once its session lapses; the controller (1) never is.
        let lapsed = t0 + Duration::from_millis(2600);
        assert_eq!(
            session_changes(&image, &sessions, 1, lapsed, timeout),
            [MetadataRecord::BrokerFenced {
                broker_id: 2,
                broker_epoch: 2
            }]
        );
        // A heartbeat of a stale epoch does not count; one at the current epoch unfences.
        sessions.record(3, 2, lapsed);
        assert_eq!(
            session_changes(&image, &sessions, 1, lapsed, timeout).len(),
            1
        );
        sessions.record(3, 3, lapsed);
        assert_eq!(
            session_changes(&image, &sessions, 1, lapsed, timeout),
            [
                MetadataRecord::BrokerFenced {
                    broker_id: 2,
                    broker_epoch: 2
                },
                MetadataRecord::BrokerUnfenced {
                    broker_id: 3,
                    broker_epoch: 3
                }
            ]
        );
        // Losing the lead forgets every heartbeat; leading again restarts the clocks.
        sessions.set_leading(false, lapsed);
        assert!(session_changes(&image, &sessions, 1, lapsed, timeout).is_empty());
        sessions.set_leading(true, lapsed);
        assert!(session_changes(&image, &sessions, 1, lapsed, timeout).is_empty());
        // A broker in controlled shutdown, fenced, is not unfenced by a heartbeat, and one
        // not fenced yet is fenced once its session lapses, the controller's own included.
        let stopping = MetadataDelta::apply(
            image_with(&[(1, 1, false), (3, 3, true)]),
            vec![
                MetadataRecord::BrokerShuttingDown {
                    broker_id: 1,
                    broker_epoch: 1,
                },
                MetadataRecord::BrokerShuttingDown {
                    broker_id: 3,
                    broker_epoch: 3,
                },
            ],
        )
        .unwrap()
        .after()
        .clone();
        sessions.record(3, 3, lapsed);
        assert!(session_changes(&stopping, &sessions, 1, lapsed, timeout).is_empty());
        assert_eq!(
            session_changes(&stopping, &sessions, 1, lapsed + timeout * 2, timeout),
            [MetadataRecord::BrokerFenced {
                broker_id: 1,
                broker_epoch: 1
            }]
        );
        assert_eq!(
            shutdown_records(&stopping, 3, 3),
            [Vec::<MetadataRecord>::new(), Vec::new()],
            "in controlled shutdown and fenced already"
        );
        assert_eq!(
            shutdown_records(&stopping, 3, 2),
            [Vec::<MetadataRecord>::new(), Vec::new()],
            "stale epoch"
        );
        assert_eq!(
            shutdown_records(&image_with(&[(2, 2, false)]), 2, 2)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [1, 1]
        );
        // A fenced controller broker (fenced by an earlier leader) is unfenced by itself.
        let fenced_me = image_with(&[(1, 1, true)]);
        assert_eq!(
            session_changes(&fenced_me, &sessions, 1, lapsed, timeout),
            [MetadataRecord::BrokerUnfenced {
                broker_id: 1,
                broker_epoch: 1
            }]
        );
    }

    #[test]
    fn a_broker_whose_listener_refuses_and_whose_heartbeat_connection_closed_is_fenced_early() {
        let timeout = Duration::from_secs(9);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let sessions = Arc::new(BrokerSessions::default());
        let image = image_with(&[(1, 1, false), (2, 2, false), (3, 3, false)]);
        sessions.set_leading(true, t0);
        let fence2 = [MetadataRecord::BrokerFenced {
            broker_id: 2,
            broker_epoch: 2,
        }];
        // The first look notes when this leader saw each epoch; a refusal from before
        // that (maybe of an earlier incarnation, or before this leader led) proves nothing.
        sessions.note_refused(2, t0);
        assert!(session_changes(&image, &sessions, 1, t0 + ms(1), timeout).is_empty());
        assert!(session_changes(&image, &sessions, 1, t0 + ms(2), timeout).is_empty());
        // Broker 2 heartbeats on a connection that stays open: a refused connect to its
        // listener (a one-way firewall, a listener restarting) does not fence it.
        let conn = sessions.heartbeat_connection(2);
        sessions.record(2, 2, t0 + ms(10));
        sessions.note_refused(2, t0 + ms(20));
        assert!(session_changes(&image, &sessions, 1, t0 + ms(30), timeout).is_empty());
        // A connection on which it heartbeat is still open (it reconnected): not fenced.
        let again = sessions.heartbeat_connection(2);
        drop(conn);
        assert!(session_changes(&image, &sessions, 1, t0 + ms(30), timeout).is_empty());
        // Killed: its heartbeat connection closes and its listener refuses: fenced at once,
        // long before the session timeout.
        drop(again);
        assert_eq!(
            session_changes(&image, &sessions, 1, t0 + ms(30), timeout),
            fence2
        );
        // Once fenced, its heartbeats from before the kill do not unfence it.
        let fenced = image_with(&[(1, 1, false), (2, 2, true), (3, 3, false)]);
        assert!(session_changes(&fenced, &sessions, 1, t0 + ms(35), timeout).is_empty());
        // A heartbeat after the refusal (or a connect that succeeds) says it lives.
        sessions.record(2, 2, t0 + ms(40));
        assert_eq!(
            session_changes(&fenced, &sessions, 1, t0 + ms(45), timeout),
            [MetadataRecord::BrokerUnfenced {
                broker_id: 2,
                broker_epoch: 2,
            }]
        );
        assert!(session_changes(&image, &sessions, 1, t0 + ms(50), timeout).is_empty());
        sessions.note_refused(2, t0 + ms(60));
        assert_eq!(
            session_changes(&image, &sessions, 1, t0 + ms(70), timeout),
            fence2
        );
        sessions.note_reachable(2);
        assert!(session_changes(&image, &sessions, 1, t0 + ms(70), timeout).is_empty());
        // A refusal before its heartbeat: the heartbeat is later news.
        sessions.note_refused(2, t0 + ms(75));
        sessions.record(2, 2, t0 + ms(80));
        assert!(session_changes(&image, &sessions, 1, t0 + ms(90), timeout).is_empty());
        // Restarted as epoch 4: refusals of the dead incarnation do not fence the new one
        // before it heartbeats; only a refusal after this leader saw epoch 4 counts.
        let restarted = image_with(&[(1, 1, false), (3, 3, false), (2, 4, false)]);
        sessions.note_refused(2, t0 + ms(100));
        assert!(session_changes(&restarted, &sessions, 1, t0 + ms(110), timeout).is_empty());
        assert!(session_changes(&restarted, &sessions, 1, t0 + ms(120), timeout).is_empty());
        sessions.note_refused(2, t0 + ms(130));
        assert_eq!(
            session_changes(&restarted, &sessions, 1, t0 + ms(140), timeout),
            [MetadataRecord::BrokerFenced {
                broker_id: 2,
                broker_epoch: 4
            }]
        );
        // The controller's own broker is never fenced, whatever the network says; neither
        // is anything while this node does not lead.
        sessions.note_refused(1, t0 + ms(150));
        assert_eq!(
            session_changes(&restarted, &sessions, 1, t0 + ms(160), timeout).len(),
            1
        );
        sessions.set_leading(false, t0 + ms(170));
        assert!(session_changes(&restarted, &sessions, 1, t0 + ms(180), timeout).is_empty());
    }

    #[test]
    fn a_registration_of_a_live_brokers_id_by_another_incarnation_is_refused() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let sessions = Arc::new(BrokerSessions::default());
        sessions.set_timing(ms(1500), ms(300));
        let image = image_with(&[(1, 1, false), (2, 2, false), (3, 3, true)]);
        let registered = image.broker(2).unwrap().incarnation_id;
        let (me, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let check = |broker_id, incarnation, at| {
            duplicate_registration(&image, &sessions, 1, me, broker_id, incarnation, at)
        };
        sessions.set_leading(true, t0);
        // Broker 2 heartbeats on a connection it keeps open: another incarnation of id 2
        // is refused, naming the id and the registration it would replace.
        let conn = sessions.heartbeat_connection(2);
        sessions.record(2, 2, t0 + ms(100));
        let why = check(2, other, t0 + ms(200)).expect("a live broker's id");
        assert!(
            why.contains("node.id=2 is registered at broker epoch 2") && why.contains("alive"),
            "{why}"
        );
        // The same incarnation is a retry; a fenced broker's id or one never registered,
        // a (re)start.
        assert_eq!(check(2, registered, t0 + ms(200)), None);
        assert_eq!(check(3, other, t0 + ms(200)), None);
        assert_eq!(check(4, other, t0 + ms(200)), None);
        // The controller's own id: only this process registers it.
        assert!(check(1, other, t0 + ms(200)).is_some());
        assert_eq!(check(1, me, t0 + ms(200)), None);
        // Connected but silent for longer than two heartbeats (partitioned, hung):
        // refused until its session lapses, as in Kafka.
        assert!(check(2, other, t0 + ms(1100)).is_some());
        assert_eq!(check(2, other, t0 + ms(100 + 1501)), None);
        // Killed: its heartbeat connection closed. Refused within two heartbeat intervals
        // of its last heartbeat, then accepted (a restart need not wait out the session).
        drop(conn);
        assert!(check(2, other, t0 + ms(600)).is_some());
        assert_eq!(check(2, other, t0 + ms(701)), None);
        // A controller that just took the lead counts from then, as for fencing.
        sessions.set_leading(false, t0 + ms(800));
        sessions.set_leading(true, t0 + ms(800));
        assert!(check(2, other, t0 + ms(1000)).is_some());
        assert_eq!(check(2, other, t0 + ms(1401)), None);
    }
}
