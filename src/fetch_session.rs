//! Incremental fetch sessions (KIP-227): the broker's cache of consumers' fetch sessions,
//! shaped after Kafka's `FetchManager` / `FetchSessionCache` / `CachedPartition`.
//!
//! Owns: the sessions (id, epoch, the partitions a consumer fetches with their fetch
//! offset, `partition_max_bytes`, log start offset, and the high watermark / log start
//! offset / last stable offset last sent), the slot limit
//! `max.incremental.fetch.session.cache.slots` and eviction. [`FetchSessionCache`] is a
//! sans-IO state machine (time is passed in, no socket, no lock); [`FetchSessions`] is
//! the shared handle the Fetch handler (`protocol::fetch`) calls, a `Mutex` over the cache
//! held only for the bookkeeping of one request, never across a read or an `.await`.
//!
//! Never does: read a log, or know the wire format beyond the session fields. The
//! handler turns a FetchRequest into a [`SessionRequest`], reads what the returned
//! [`FetchContext`] says, and hands the response back ([`FetchSessions::create`],
//! [`FetchSessions::complete`]), which updates the session exactly once per answered
//! request (a parked fetch reads several times, completes once).
//!
//! Protocol (KIP-227; request `session_id`, `session_epoch`, `forgotten_topics_data`,
//! Fetch v7+):
//! - epoch 0 ([`INITIAL_EPOCH`]), a full request: closes `session_id` if given, then
//!   creates a session when a slot is free or one can be evicted; the response carries
//!   its id (non-zero), or 0 when none was created (the client keeps sending full
//!   requests);
//! - epoch -1 ([`FINAL_EPOCH`]): a full request without a session; closes `session_id`
//!   if given; the response's session id is 0;
//! - otherwise incremental: the request lists only partitions added or changed and
//!   forgets others; the broker reads every partition of the session and answers only
//!   those with records, a changed high watermark, log start offset or last stable
//!   offset, an error or a preferred read replica (Kafka's `maybeUpdateResponseData`).
//!   Partitions answered move to the end of the session's order, so a response size
//!   limit never starves the last ones. The epoch the client must send next is
//!   [`next_epoch`] of the one it sent.
//!
//! Errors, top level, with no partitions (Kafka's `SessionErrorContext`):
//! FETCH_SESSION_ID_NOT_FOUND (70) for an unknown session id, INVALID_FETCH_SESSION_EPOCH
//! (71) for an epoch other than the session's (or a session moved on while a fetch was
//! parked), FETCH_SESSION_TOPIC_ID_ERROR (106) when an incremental request's version does
//! not match the session's topic naming (topic ids from v13, names before).
//!
//! Eviction (`FetchSessionCache.tryEvict`): when every slot is taken, a new session
//! replaces the least recently used one if it has been idle for more than
//! [`EVICTION_AGE_MS`]; otherwise the smallest session older than that age (as of its
//! last use) if the newcomer has strictly more partitions; otherwise no session is
//! created. Decision: followers' fetches (`replica_id` ≥ 0) stay sessionless (session id
//! 0), so Kafka's privileged (follower) sessions do not exist here; slots 0 disables
//! sessions altogether.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use uuid::Uuid;

use crate::metrics::FetchSessionMetrics;

/// The session id of "no session" (Kafka's `INVALID_SESSION_ID`).
pub const INVALID_SESSION_ID: i32 = 0;
/// Epoch of a full request asking for a new session (Kafka's `INITIAL_EPOCH`).
pub const INITIAL_EPOCH: i32 = 0;
/// Epoch of a full request that wants no session (Kafka's `FINAL_EPOCH`).
pub const FINAL_EPOCH: i32 = -1;
/// Idle time after which a session may be evicted by any newcomer, and age after which
/// a smaller session may be evicted by a larger one, in milliseconds (Kafka's
/// `min.incremental.fetch.session.eviction.ms` default).
pub const EVICTION_AGE_MS: i64 = 120_000;
/// Tries at drawing an unused random session id before giving up (no session then).
const SESSION_ID_TRIES: usize = 64;

/// The epoch after `epoch` (Kafka's `FetchMetadata.nextEpoch`): -1 stays -1, `i32::MAX`
/// wraps to 1 (0 is reserved for new sessions).
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// How a request names a topic: by name before Fetch v13, by topic id from v13 (KIP-516).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TopicKey {
    /// Fetch v7–v12.
    Name(String),
    /// Fetch v13+.
    Id(Uuid),
}

/// What a consumer asks of one partition: the request's per-partition fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionFetch {
    /// Partition index.
    pub partition: i32,
    /// Offset to read from.
    pub fetch_offset: i64,
    /// Most bytes to return for this partition.
    pub partition_max_bytes: i32,
    /// The client's leader epoch (KIP-320), -1 if none.
    pub current_leader_epoch: i32,
    /// The client's log start offset (-1 for consumers).
    pub log_start_offset: i64,
}

/// The partitions of one topic, in the order they are read and answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFetch {
    /// The topic as the request names it.
    pub topic: TopicKey,
    /// Its partitions.
    pub partitions: Vec<PartitionFetch>,
}

/// What a response says of one partition, as far as a session cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSent {
    /// High watermark sent.
    pub high_watermark: i64,
    /// Log start offset sent.
    pub log_start_offset: i64,
    /// Last stable offset sent.
    pub last_stable_offset: i64,
    /// Partition error code (0 for none).
    pub error_code: i16,
    /// Whether record bytes were returned.
    pub has_records: bool,
    /// Whether the response names a preferred read replica (KIP-392).
    pub has_preferred_replica: bool,
}

/// The session fields of a consumer's Fetch (v7+), decoded by the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRequest {
    /// `session_id` (0: none).
    pub session_id: i32,
    /// `session_epoch`.
    pub session_epoch: i32,
    /// Whether topics are named by id (v13+).
    pub uses_topic_ids: bool,
    /// `topics`: every partition (full) or those added or changed (incremental).
    pub topics: Vec<TopicFetch>,
    /// `forgotten_topics_data`: partitions leaving the session (incremental only).
    pub forgotten: Vec<(TopicKey, i32)>,
}

/// A session error, answered at the top level with no partitions and session id 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionError {
    /// FETCH_SESSION_ID_NOT_FOUND (70).
    IdNotFound,
    /// INVALID_FETCH_SESSION_EPOCH (71).
    InvalidEpoch,
    /// FETCH_SESSION_TOPIC_ID_ERROR (106).
    TopicIdError,
}

impl SessionError {
    /// The Kafka error code.
    pub fn code(self) -> i16 {
        match self {
            SessionError::IdNotFound => 70,
            SessionError::InvalidEpoch => 71,
            SessionError::TopicIdError => 106,
        }
    }
}

/// What to read for one request, and how to answer it (Kafka's `FetchContext`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchContext {
    /// Read the request's partitions, answer them all with session id 0.
    Sessionless,
    /// Read the request's partitions, then try [`FetchSessions::create`]; answer them all.
    Full,
    /// Read `topics` (the whole session, updated by the request), then
    /// [`FetchSessions::complete`] with `session_id` and `epoch`.
    Incremental {
        /// The session.
        session_id: i32,
        /// The session's epoch after this request (checked again at completion).
        epoch: i32,
        /// Every partition of the session, in its order.
        topics: Vec<TopicFetch>,
    },
    /// Answer with this error and nothing else.
    Error(SessionError),
}

impl FetchContext {
    /// The context's name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchContext::Sessionless => "sessionless",
            FetchContext::Full => "full",
            FetchContext::Incremental { .. } => "incremental",
            FetchContext::Error(SessionError::IdNotFound) => "FETCH_SESSION_ID_NOT_FOUND",
            FetchContext::Error(SessionError::InvalidEpoch) => "INVALID_FETCH_SESSION_EPOCH",
            FetchContext::Error(SessionError::TopicIdError) => "FETCH_SESSION_TOPIC_ID_ERROR",
        }
    }
}

/// One partition of a session (Kafka's `CachedPartition`).
#[derive(Debug, Clone)]
struct Cached {
    fetch: PartitionFetch,
    high_watermark: i64,
    log_start_offset: i64,
    last_stable_offset: i64,
    /// Position in the session's order.
    seq: u64,
}

impl Cached {
    /// Whether the partition must be in an incremental response, updating what was sent
    /// (Kafka's `maybeUpdateResponseData(respData, updateResponseData = true)`).
    fn update_sent(&mut self, sent: &PartitionSent) -> bool {
        let mut must_respond = sent.has_records || sent.has_preferred_replica;
        if self.high_watermark != sent.high_watermark {
            must_respond = true;
            self.high_watermark = sent.high_watermark;
        }
        if self.log_start_offset != sent.log_start_offset {
            must_respond = true;
            self.log_start_offset = sent.log_start_offset;
        }
        if self.last_stable_offset != sent.last_stable_offset {
            must_respond = true;
            self.last_stable_offset = sent.last_stable_offset;
        }
        if sent.error_code != 0 {
            // Sent again once the error is gone.
            self.high_watermark = -1;
            must_respond = true;
        }
        must_respond
    }
}

#[derive(Debug)]
struct Session {
    /// The epoch the next request must carry.
    epoch: i32,
    uses_topic_ids: bool,
    created_ms: i64,
    last_used_ms: i64,
    /// `last_used_ms - created_ms` exceeded [`EVICTION_AGE_MS`] at the last use (Kafka
    /// decides this in `touch`).
    evictable: bool,
    partitions: HashMap<(TopicKey, i32), Cached>,
    /// The session's order: position → partition.
    order: BTreeMap<u64, (TopicKey, i32)>,
    next_seq: u64,
}

impl Session {
    fn touch(&mut self, now_ms: i64) {
        self.last_used_ms = now_ms;
        self.evictable = now_ms - self.created_ms > EVICTION_AGE_MS;
    }

    fn push(&mut self, topic: TopicKey, cached: Cached) {
        let key = (topic, cached.fetch.partition);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key.clone());
        self.partitions.insert(key, Cached { seq, ..cached });
    }

    /// Moves `key` to the end of the order.
    fn move_to_end(&mut self, key: &(TopicKey, i32)) {
        let seq = self.next_seq;
        if let Some(cached) = self.partitions.get_mut(key) {
            self.order.remove(&cached.seq);
            cached.seq = seq;
            self.order.insert(seq, key.clone());
            self.next_seq += 1;
        }
    }

    /// Kafka's `FetchSession.update`: adds or updates the request's partitions, removes
    /// the forgotten ones.
    fn update(&mut self, topics: &[TopicFetch], forgotten: &[(TopicKey, i32)]) {
        for topic in topics {
            for p in &topic.partitions {
                let key = (topic.topic.clone(), p.partition);
                if let Some(cached) = self.partitions.get_mut(&key) {
                    cached.fetch = *p;
                } else {
                    self.push(
                        topic.topic.clone(),
                        Cached {
                            fetch: *p,
                            high_watermark: -1,
                            log_start_offset: -1,
                            last_stable_offset: -1,
                            seq: 0,
                        },
                    );
                }
            }
        }
        for key in forgotten {
            if let Some(cached) = self.partitions.remove(key) {
                self.order.remove(&cached.seq);
            }
        }
    }

    /// Every partition in the session's order, consecutive partitions of one topic
    /// grouped.
    fn topics(&self) -> Vec<TopicFetch> {
        let mut out: Vec<TopicFetch> = Vec::new();
        for key in self.order.values() {
            let Some(cached) = self.partitions.get(key) else {
                continue;
            };
            match out.last_mut() {
                Some(last) if last.topic == key.0 => last.partitions.push(cached.fetch),
                _ => out.push(TopicFetch {
                    topic: key.0.clone(),
                    partitions: vec![cached.fetch],
                }),
            }
        }
        out
    }
}

/// The session cache: at most `max_slots` sessions. Sans-IO: every call takes the time.
#[derive(Debug)]
pub struct FetchSessionCache {
    max_slots: usize,
    sessions: HashMap<i32, Session>,
    /// xorshift64 state for session ids.
    rng: u64,
    evictions: u64,
}

impl FetchSessionCache {
    /// An empty cache of `max_slots` sessions (0: sessions disabled); `seed` draws the
    /// session ids (any value; 0 is replaced).
    pub fn new(max_slots: usize, seed: u64) -> FetchSessionCache {
        FetchSessionCache {
            max_slots,
            sessions: HashMap::new(),
            rng: seed.max(1),
            evictions: 0,
        }
    }

    /// Sessions cached.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is cached.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Sessions evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The epoch session `session_id` expects next, if it exists.
    pub fn epoch(&self, session_id: i32) -> Option<i32> {
        self.sessions.get(&session_id).map(|s| s.epoch)
    }

    /// Kafka's `FetchManager.newContext`: what `request` reads and how it is answered.
    /// An incremental request updates its session here (partitions, epoch, last use).
    pub fn new_context(&mut self, now_ms: i64, request: &SessionRequest) -> FetchContext {
        let full = request.session_epoch == INITIAL_EPOCH || request.session_epoch == FINAL_EPOCH;
        if full {
            if request.session_id != INVALID_SESSION_ID {
                self.sessions.remove(&request.session_id);
            }
            return if request.session_epoch == FINAL_EPOCH || self.max_slots == 0 {
                FetchContext::Sessionless
            } else {
                FetchContext::Full
            };
        }
        let Some(session) = self.sessions.get_mut(&request.session_id) else {
            return FetchContext::Error(SessionError::IdNotFound);
        };
        if session.epoch != request.session_epoch {
            return FetchContext::Error(SessionError::InvalidEpoch);
        }
        if session.uses_topic_ids != request.uses_topic_ids {
            return FetchContext::Error(SessionError::TopicIdError);
        }
        session.update(&request.topics, &request.forgotten);
        session.touch(now_ms);
        session.epoch = next_epoch(session.epoch);
        FetchContext::Incremental {
            session_id: request.session_id,
            epoch: session.epoch,
            topics: session.topics(),
        }
    }

    /// Kafka's `maybeCreateSession` after a full request was read: `partitions` are the
    /// request's with what the response sent. Returns the new session's id, or
    /// [`INVALID_SESSION_ID`] when no slot is free and none can be evicted.
    pub fn create(
        &mut self,
        now_ms: i64,
        uses_topic_ids: bool,
        partitions: Vec<(TopicKey, PartitionFetch, PartitionSent)>,
    ) -> i32 {
        if self.max_slots == 0 {
            return INVALID_SESSION_ID;
        }
        if self.sessions.len() >= self.max_slots && !self.try_evict(now_ms, partitions.len()) {
            return INVALID_SESSION_ID;
        }
        let Some(id) = self.fresh_id() else {
            return INVALID_SESSION_ID;
        };
        let mut session = Session {
            epoch: next_epoch(INITIAL_EPOCH),
            uses_topic_ids,
            created_ms: now_ms,
            last_used_ms: now_ms,
            evictable: false,
            partitions: HashMap::with_capacity(partitions.len()),
            order: BTreeMap::new(),
            next_seq: 0,
        };
        for (topic, fetch, sent) in partitions {
            let mut cached = Cached {
                fetch,
                high_watermark: -1,
                log_start_offset: -1,
                last_stable_offset: -1,
                seq: 0,
            };
            cached.update_sent(&sent);
            session.push(topic, cached);
        }
        self.sessions.insert(id, session);
        id
    }

    /// Kafka's `IncrementalFetchContext.updateAndGenerateResponseData`: `sent[i][j]` is
    /// what the response says of `topics[i].partitions[j]` (the context's topics, read in
    /// that order). Updates the session and returns which partitions to answer, in the
    /// same shape. Errors: [`SessionError::InvalidEpoch`] (71) when the session moved on
    /// since [`FetchSessionCache::new_context`], [`SessionError::IdNotFound`] (70) when it
    /// is gone (closed or evicted meanwhile).
    pub fn complete(
        &mut self,
        now_ms: i64,
        session_id: i32,
        epoch: i32,
        topics: &[TopicFetch],
        sent: &[Vec<PartitionSent>],
    ) -> Result<Vec<Vec<bool>>, SessionError> {
        let session = self
            .sessions
            .get_mut(&session_id)
            .ok_or(SessionError::IdNotFound)?;
        if session.epoch != epoch {
            return Err(SessionError::InvalidEpoch);
        }
        session.touch(now_ms);
        let mut keep = Vec::with_capacity(topics.len());
        for (topic, sent) in topics.iter().zip(sent) {
            let mut row = Vec::with_capacity(topic.partitions.len());
            // One key per topic, its partition set in turn: a topic name is cloned once,
            // not per partition (a caught-up session of 1,000 partitions completes every
            // fetch).
            let mut key = (topic.topic.clone(), 0);
            for (p, sent) in topic.partitions.iter().zip(sent) {
                key.1 = p.partition;
                let must = session
                    .partitions
                    .get_mut(&key)
                    .is_some_and(|c| c.update_sent(sent));
                if must {
                    session.move_to_end(&key);
                }
                row.push(must);
            }
            keep.push(row);
        }
        Ok(keep)
    }

    /// Kafka's `tryEvict` for an unprivileged newcomer of `size` partitions.
    fn try_evict(&mut self, now_ms: i64, size: usize) -> bool {
        let stale = self
            .sessions
            .iter()
            .min_by_key(|(id, s)| (s.last_used_ms, **id))
            .filter(|(_, s)| now_ms - s.last_used_ms > EVICTION_AGE_MS)
            .map(|(id, _)| *id);
        let victim = stale.or_else(|| {
            self.sessions
                .iter()
                .filter(|(_, s)| s.evictable)
                .min_by_key(|(id, s)| (s.partitions.len(), **id))
                .filter(|(_, s)| size > s.partitions.len())
                .map(|(id, _)| *id)
        });
        match victim {
            Some(id) => {
                self.sessions.remove(&id);
                self.evictions += 1;
                true
            }
            None => false,
        }
    }

    /// A random positive id no session has.
    fn fresh_id(&mut self) -> Option<i32> {
        for _ in 0..SESSION_ID_TRIES {
            // xorshift64
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let id = (self.rng >> 33) as i32;
            if id > 0 && !self.sessions.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

/// The broker's session cache, shared by every connection's Fetch handler: the cache
/// under a short-held lock, and its metrics (`weir_fetch_sessions`,
/// `weir_fetch_session_evictions_total`, `weir_incremental_fetches_total`).
#[derive(Debug)]
pub struct FetchSessions {
    cache: Mutex<FetchSessionCache>,
    metrics: FetchSessionMetrics,
}

impl FetchSessions {
    /// A cache of `max_slots` sessions (`max.incremental.fetch.session.cache.slots`).
    pub fn new(max_slots: usize, metrics: FetchSessionMetrics) -> FetchSessions {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        FetchSessions {
            cache: Mutex::new(FetchSessionCache::new(max_slots, seed)),
            metrics,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut FetchSessionCache) -> T) -> T {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let evictions = cache.evictions();
        let out = f(&mut cache);
        self.metrics.sessions.set(cache.len() as f64);
        self.metrics
            .evictions
            .increment(cache.evictions() - evictions);
        out
    }

    /// [`FetchSessionCache::new_context`].
    pub fn new_context(&self, now_ms: i64, request: &SessionRequest) -> FetchContext {
        let context = self.with(|c| c.new_context(now_ms, request));
        if matches!(context, FetchContext::Incremental { .. }) {
            self.metrics.incremental.increment(1);
        }
        context
    }

    /// [`FetchSessionCache::create`].
    pub fn create(
        &self,
        now_ms: i64,
        uses_topic_ids: bool,
        partitions: Vec<(TopicKey, PartitionFetch, PartitionSent)>,
    ) -> i32 {
        self.with(|c| c.create(now_ms, uses_topic_ids, partitions))
    }

    /// [`FetchSessionCache::complete`].
    pub fn complete(
        &self,
        now_ms: i64,
        session_id: i32,
        epoch: i32,
        topics: &[TopicFetch],
        sent: &[Vec<PartitionSent>],
    ) -> Result<Vec<Vec<bool>>, SessionError> {
        self.with(|c| c.complete(now_ms, session_id, epoch, topics, sent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(t: &str) -> TopicKey {
        TopicKey::Name(t.to_string())
    }

    fn fetch(partition: i32, fetch_offset: i64) -> PartitionFetch {
        PartitionFetch {
            partition,
            fetch_offset,
            partition_max_bytes: 1 << 20,
            current_leader_epoch: -1,
            log_start_offset: -1,
        }
    }

    fn sent(high_watermark: i64, has_records: bool) -> PartitionSent {
        PartitionSent {
            high_watermark,
            log_start_offset: 0,
            last_stable_offset: high_watermark,
            error_code: 0,
            has_records,
            has_preferred_replica: false,
        }
    }

    fn request(session_id: i32, session_epoch: i32, topics: Vec<TopicFetch>) -> SessionRequest {
        SessionRequest {
            session_id,
            session_epoch,
            uses_topic_ids: false,
            topics,
            forgotten: Vec::new(),
        }
    }

    fn topic(t: &str, partitions: &[(i32, i64)]) -> TopicFetch {
        TopicFetch {
            topic: name(t),
            partitions: partitions.iter().map(|&(p, o)| fetch(p, o)).collect(),
        }
    }

    /// A session over `t` partitions 0..n, all sent with high watermark 10.
    fn session_of(cache: &mut FetchSessionCache, now_ms: i64, t: &str, n: i32) -> i32 {
        let full = request(0, INITIAL_EPOCH, vec![]);
        assert_eq!(cache.new_context(now_ms, &full), FetchContext::Full);
        cache.create(
            now_ms,
            false,
            (0..n)
                .map(|p| (name(t), fetch(p, 0), sent(10, true)))
                .collect(),
        )
    }

    #[test]
    fn next_epoch_wraps_as_kafka() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(41), 42);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(-1), -1);
    }

    #[test]
    fn full_request_creates_a_session_and_incremental_reads_all_answers_changes() {
        let mut cache = FetchSessionCache::new(10, 7);
        let id = session_of(&mut cache, 1_000, "t", 3);
        assert!(id > 0);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.epoch(id), Some(1));

        // Incremental, epoch 1: p1 moved on; the session reads all three partitions.
        let inc = request(id, 1, vec![topic("t", &[(1, 5)])]);
        let FetchContext::Incremental {
            session_id,
            epoch,
            topics,
        } = cache.new_context(2_000, &inc)
        else {
            panic!("incremental");
        };
        assert_eq!((session_id, epoch), (id, 2));
        assert_eq!(topics, vec![topic("t", &[(0, 0), (1, 5), (2, 0)])]);
        // p0's high watermark changed and p1 returned records; p2 is unchanged.
        let keep = cache
            .complete(
                2_000,
                id,
                epoch,
                &topics,
                &[vec![sent(11, false), sent(10, true), sent(10, false)]],
            )
            .unwrap();
        assert_eq!(keep, vec![vec![true, true, false]]);
        // Answered partitions move to the end of the order.
        let FetchContext::Incremental { topics, .. } =
            cache.new_context(3_000, &request(id, 2, vec![]))
        else {
            panic!("incremental");
        };
        assert_eq!(topics, vec![topic("t", &[(2, 0), (0, 0), (1, 5)])]);
        let keep = cache
            .complete(
                3_000,
                id,
                3,
                &topics,
                &[vec![sent(10, false), sent(11, false), sent(10, false)]],
            )
            .unwrap();
        assert_eq!(keep, vec![vec![false, false, false]], "nothing changed");
    }

    #[test]
    fn incremental_adds_and_forgets_partitions() {
        let mut cache = FetchSessionCache::new(10, 7);
        let id = session_of(&mut cache, 0, "a", 2);
        let mut inc = request(id, 1, vec![topic("b", &[(0, 3)])]);
        inc.forgotten = vec![(name("a"), 0)];
        let FetchContext::Incremental { topics, .. } = cache.new_context(1, &inc) else {
            panic!("incremental");
        };
        assert_eq!(topics, vec![topic("a", &[(1, 0)]), topic("b", &[(0, 3)])]);
        // A new partition is always answered once (nothing was sent for it yet).
        let keep = cache
            .complete(
                1,
                id,
                2,
                &topics,
                &[vec![sent(10, false)], vec![sent(0, false)]],
            )
            .unwrap();
        assert_eq!(keep, vec![vec![false], vec![true]]);
    }

    #[test]
    fn errors_are_kafkas() {
        let mut cache = FetchSessionCache::new(10, 7);
        let id = session_of(&mut cache, 0, "t", 1);
        let unknown = if id == 12345 { 54321 } else { 12345 };
        assert_eq!(
            cache.new_context(1, &request(unknown, 1, vec![])),
            FetchContext::Error(SessionError::IdNotFound)
        );
        assert_eq!(SessionError::IdNotFound.code(), 70);
        assert_eq!(
            cache.new_context(1, &request(id, 5, vec![])),
            FetchContext::Error(SessionError::InvalidEpoch)
        );
        assert_eq!(SessionError::InvalidEpoch.code(), 71);
        let mut by_id = request(id, 1, vec![]);
        by_id.uses_topic_ids = true;
        assert_eq!(
            cache.new_context(1, &by_id),
            FetchContext::Error(SessionError::TopicIdError)
        );
        assert_eq!(SessionError::TopicIdError.code(), 106);
        // The errors left the session as it was: epoch 1 still works.
        assert!(matches!(
            cache.new_context(1, &request(id, 1, vec![])),
            FetchContext::Incremental { epoch: 2, .. }
        ));
        // A parked fetch completing after another request moved the session on: 71.
        let FetchContext::Incremental { topics, .. } =
            cache.new_context(2, &request(id, 2, vec![]))
        else {
            panic!("incremental");
        };
        assert_eq!(
            cache.complete(2, id, 2, &topics, &[vec![sent(10, false)]]),
            Err(SessionError::InvalidEpoch)
        );
    }

    #[test]
    fn final_epoch_closes_and_stays_sessionless() {
        let mut cache = FetchSessionCache::new(10, 7);
        let id = session_of(&mut cache, 0, "t", 1);
        assert_eq!(
            cache.new_context(1, &request(id, FINAL_EPOCH, vec![topic("t", &[(0, 0)])])),
            FetchContext::Sessionless
        );
        assert!(cache.is_empty());
        assert_eq!(
            cache.new_context(1, &request(id, 1, vec![])),
            FetchContext::Error(SessionError::IdNotFound)
        );
        // A full request naming a session closes it and may open another.
        let id = session_of(&mut cache, 0, "t", 1);
        assert_eq!(
            cache.new_context(1, &request(id, INITIAL_EPOCH, vec![])),
            FetchContext::Full
        );
        assert!(cache.is_empty());
    }

    #[test]
    fn eviction_when_full_follows_kafka() {
        let mut cache = FetchSessionCache::new(2, 7);
        let a = session_of(&mut cache, 0, "a", 2);
        let b = session_of(&mut cache, 10, "b", 5);
        // Full, both young: no session for the newcomer, whatever its size.
        assert_eq!(session_of(&mut cache, 20, "c", 100), INVALID_SESSION_ID);
        assert_eq!(cache.evictions(), 0);
        // b stays in use; a idles past the eviction age and is replaced.
        let t = EVICTION_AGE_MS + 100;
        assert!(matches!(
            cache.new_context(t, &request(b, 1, vec![])),
            FetchContext::Incremental { .. }
        ));
        let c = session_of(&mut cache, t + 1, "c", 1);
        assert!(c > 0);
        assert_eq!(cache.epoch(a), None, "the idle session was evicted");
        assert_eq!(cache.evictions(), 1);
        // Nothing idle: b (older than the age at its last use, 5 partitions) gives way
        // only to a newcomer with more partitions.
        let t2 = t + 1_000;
        assert!(matches!(
            cache.new_context(t2, &request(b, 2, vec![])),
            FetchContext::Incremental { .. }
        ));
        assert_eq!(session_of(&mut cache, t2, "d", 5), INVALID_SESSION_ID);
        let d = session_of(&mut cache, t2, "d", 6);
        assert!(d > 0);
        assert_eq!(cache.epoch(b), None);
        assert!(cache.epoch(c).is_some(), "c is young, not evictable");
        assert_eq!(cache.evictions(), 2);
    }

    #[test]
    fn zero_slots_disable_sessions() {
        let mut cache = FetchSessionCache::new(0, 7);
        assert_eq!(
            cache.new_context(0, &request(0, INITIAL_EPOCH, vec![])),
            FetchContext::Sessionless
        );
        assert_eq!(cache.create(0, false, vec![]), INVALID_SESSION_ID);
    }
}
