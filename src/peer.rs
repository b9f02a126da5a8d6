//! Requests from this broker to another broker of the cluster, over that broker's
//! `inter.broker.listener.name` endpoint, in the Kafka wire protocol (no RPC of weir's
//! own): the follower fetchers' Fetch and OffsetForLeaderEpoch (`replication.rs`), and
//! the Produce that forwards a record batch the broker writes itself (`ingest`,
//! `internal_topic`) to the partition's leader when that is another broker.
//!
//! Owns: [`PeerConn`] (one TCP connection: a request, then its response; bounded in time
//! and in response size), [`broker_address`] (where a broker id is reached, from the
//! metadata image), and [`PeerClients`] (one pooled connection per peer broker for
//! forwarded produces). Never does: decide where a record goes (the caller names the
//! leader from the metadata image) or retry a request that may have been applied (a
//! forwarded produce is not idempotent: see [`PeerClients::produce`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, GroupId, OffsetCommitRequest, OffsetFetchRequest,
    ProduceRequest, RequestHeader, ResponseHeader, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::ResponseError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::Metadata;
use crate::config::BrokerConfig;

/// Longest a connection to a peer, or one request on it beyond its own wait, may take.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Produce version a forwarding broker speaks: v9 (flexible, topic names, per-partition
/// `error_message`).
const PRODUCE_VERSION: i16 = 9;

/// How long a forwarded internal-topic append waits for the leader's in-sync replicas.
pub(crate) const FORWARD_TIMEOUT_MS: i32 = 10_000;

/// Fetch version a broker reading another's partition speaks: v12 (topic names).
const CONSUMER_FETCH_VERSION: i16 = 12;

/// OffsetFetch version spoken to a coordinator: v7 (one group, `require_stable`).
const OFFSET_FETCH_VERSION: i16 = 7;

/// OffsetCommit version spoken to a coordinator: v7 (`group_instance_id`).
const OFFSET_COMMIT_VERSION: i16 = 7;

/// Largest response read on a pooled connection: a Produce or offsets answer is small, a
/// consumer Fetch is bounded by its own `max_bytes`.
const MAX_PEER_RESPONSE_BYTES: usize = 64 << 20;

/// One connection to a peer broker: a request, then its response.
#[derive(Debug)]
pub(crate) struct PeerConn {
    stream: TcpStream,
    correlation_id: i32,
    client_id: StrBytes,
    max_response_bytes: usize,
}

impl PeerConn {
    /// Connects to `addr` (`host:port`) within [`IO_TIMEOUT`]; requests carry
    /// `client_id`, responses above `max_response_bytes` fail the call.
    ///
    /// Errors: the connect's I/O error, or `TimedOut`.
    pub(crate) async fn connect(
        addr: &str,
        client_id: String,
        max_response_bytes: usize,
    ) -> std::io::Result<Self> {
        let stream = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
        let _ = stream.set_nodelay(true);
        Ok(PeerConn {
            stream,
            correlation_id: 0,
            client_id: StrBytes::from_string(client_id),
            max_response_bytes,
        })
    }

    /// Whether the peer has closed this (idle) connection: it reads as end of stream
    /// without waiting. A pooled connection is checked before each use, so a peer that
    /// restarted costs a reconnect, never a request sent into a dead connection.
    fn closed_by_peer(&self) -> bool {
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            // End of stream, an error, or bytes nobody asked for: unusable either way.
            Ok(_) | Err(_) => true,
        }
    }

    /// Sends `req` at `version`; waits for its response at most `wait` plus
    /// [`IO_TIMEOUT`].
    ///
    /// Errors: I/O, a timeout, a response over the size bound, one for another
    /// correlation id, or one that does not decode. The connection is then unusable.
    pub(crate) async fn call<R: Request>(
        &mut self,
        req: &R,
        version: i16,
        wait: Duration,
    ) -> anyhow::Result<R::Response> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("API key {}", R::KEY))?;
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut buf = BytesMut::with_capacity(256);
        buf.extend_from_slice(&[0; 4]);
        header.encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let len = u32::try_from(buf.len() - 4)?;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let exchange = async {
            self.stream.write_all(&buf).await?;
            let len = self.stream.read_u32().await? as usize;
            anyhow::ensure!(
                len <= self.max_response_bytes,
                "{key:?} response of {len} bytes is too large"
            );
            let mut body = vec![0u8; len];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, anyhow::Error>(Bytes::from(body))
        };
        let mut body = tokio::time::timeout(wait + IO_TIMEOUT, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("{key:?} timed out"))??;
        let h = ResponseHeader::decode(&mut body, key.response_header_version(version))?;
        anyhow::ensure!(
            h.correlation_id == self.correlation_id,
            "{key:?} response for another request"
        );
        R::Response::decode(&mut body, version)
    }
}

/// The address (`host:port`) of broker `broker_id`'s `inter.broker.listener.name`
/// endpoint (else its first), from its registration in the metadata image; `None` when
/// it is not registered.
pub(crate) fn broker_address(
    metadata: &Metadata,
    config: &BrokerConfig,
    broker_id: i32,
) -> Option<String> {
    let image = metadata.image();
    let b = image.broker(broker_id)?;
    let name = &config.cluster.inter_broker_listener_name;
    let e = b
        .endpoints
        .iter()
        .find(|e| &e.name == name)
        .or_else(|| b.endpoints.first())?;
    Some(format!("{}:{}", e.host, e.port))
}

/// The client id of this broker's requests to its peers: `weir-broker-<node.id>`.
pub(crate) fn broker_client_id(node_id: i32) -> String {
    format!("{BROKER_CLIENT_ID_PREFIX}{node_id}")
}

const BROKER_CLIENT_ID_PREFIX: &str = "weir-broker-";

/// Whether a request with `client_id` is another broker's forwarded write: the id is
/// [`broker_client_id`] of a broker registered in `image`. As Kafka's `__admin_client`
/// exemption, a name, not an authentication: the listener trusts its clients as
/// PLAINTEXT does, and what it unlocks (appending to the connect runtime's topics) is
/// what the REST API already allows anyone who reaches it.
pub(crate) fn is_broker_client(client_id: &str, image: &crate::cluster::MetadataImage) -> bool {
    client_id
        .strip_prefix(BROKER_CLIENT_ID_PREFIX)
        .and_then(|id| id.parse::<i32>().ok())
        .is_some_and(|id| image.broker(id).is_some())
}

/// Where a forwarded batch went: the leader's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducedRemotely {
    /// The batch's base offset in the leader's log.
    pub base_offset: i64,
    /// The log-append time the leader stamped, -1 for CreateTime.
    pub log_append_time_ms: i64,
}

/// What a consumer Fetch from a partition's leader returned.
#[derive(Debug, Clone)]
pub(crate) struct FetchedRemotely {
    /// Whole record batches as the leader stores them (empty: nothing past the offset).
    pub records: Bytes,
    /// The leader's log start offset.
    pub log_start_offset: i64,
    /// The offset was outside the leader's log (OFFSET_OUT_OF_RANGE): no records; the
    /// caller moves to `log_start_offset` when it was below it.
    pub out_of_range: bool,
    /// read_committed only: the aborted transactions overlapping the records, as
    /// (producer id, first offset).
    pub aborted: Vec<(i64, i64)>,
}

/// A pooled connection to one peer, and the address it was made to.
type Slot = Arc<tokio::sync::Mutex<Option<(String, PeerConn)>>>;

/// One pooled connection per peer broker, for forwarded produces. Requests to one peer
/// take turns on its connection; peers are independent. Cheap to share (`Arc`).
#[derive(Debug)]
pub(crate) struct PeerClients {
    metadata: Arc<Metadata>,
    config: Arc<BrokerConfig>,
    slots: Mutex<HashMap<i32, Slot>>,
    /// The runtime the pooled connections live on (the broker's): every exchange runs
    /// there, whichever runtime the caller is on. A transform runner has a runtime of
    /// its own, which ends with it: a connection made on it would die with it, failing
    /// later callers ("the Tokio context is being shut down").
    home: Option<tokio::runtime::Handle>,
}

impl PeerClients {
    /// Clients to the brokers `metadata` registers, reached as `config` says.
    pub(crate) fn new(metadata: Arc<Metadata>, config: Arc<BrokerConfig>) -> PeerClients {
        PeerClients {
            metadata,
            config,
            slots: Mutex::new(HashMap::new()),
            home: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn slot(&self, broker_id: i32) -> Slot {
        let mut slots = match self.slots.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Broker ids are registered brokers' (bounded by the image): the map stays small.
        slots.entry(broker_id).or_default().clone()
    }

    /// Sends `req` at `version` to broker `broker_id` on its pooled connection (made, or
    /// made again, as needed) and returns its response, waiting at most `wait` plus
    /// [`IO_TIMEOUT`]. Requests to one broker take turns.
    ///
    /// Errors: NOT_LEADER_OR_FOLLOWER (6) when `broker_id` is not registered;
    /// NETWORK_EXCEPTION (13) when the connection or the exchange fails (the request may
    /// or may not have been applied; the connection is dropped).
    pub(crate) async fn call<R>(
        &self,
        broker_id: i32,
        req: &R,
        version: i16,
        wait: Duration,
    ) -> Result<R::Response, (ResponseError, String)>
    where
        R: Request + Clone + Send + Sync + 'static,
        R::Response: Send + 'static,
    {
        let Some(addr) = broker_address(&self.metadata, &self.config, broker_id) else {
            return Err((
                ResponseError::NotLeaderOrFollower,
                format!("broker {broker_id} is not registered"),
            ));
        };
        let exchange = exchange(
            self.slot(broker_id),
            broker_id,
            addr,
            broker_client_id(self.config.node_id),
            req.clone(),
            version,
            wait,
        );
        match &self.home {
            None => exchange.await,
            Some(home) => home.spawn(exchange).await.unwrap_or_else(|e| {
                Err((
                    ResponseError::NetworkException,
                    format!("request to broker {broker_id} not completed: {e}"),
                ))
            }),
        }
    }

    /// Sends `batch` (one or more whole magic-2 record batches) for `topic`-`partition`
    /// to `leader` as a Produce with acks=all (-1), `timeout_ms` and `transactional_id`
    /// (the batch's producer's, for a transactional batch), and returns the
    /// leader's answer. The leader treats it as any client's Produce: its checks, its
    /// inline transform, its ISR wait.
    ///
    /// Never retried here: a request that reached the leader may have been appended even
    /// when its answer is lost, and a forwarded batch carries no producer id that would
    /// make a retry safe. The caller decides (its records are at least once).
    ///
    /// Errors: the leader's error code and message (NOT_LEADER_OR_FOLLOWER (6) when it
    /// stopped leading, REQUEST_TIMED_OUT (7), NOT_ENOUGH_REPLICAS (19), ...); those of
    /// [`PeerClients::call`].
    pub(crate) async fn produce(
        &self,
        leader: i32,
        topic: &str,
        partition: i32,
        batch: Bytes,
        timeout_ms: i32,
        transactional_id: Option<&str>,
    ) -> Result<ProducedRemotely, (ResponseError, String)> {
        let request = ProduceRequest::default()
            .with_transactional_id(
                transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_string()))),
            )
            .with_acks(-1)
            .with_timeout_ms(timeout_ms)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch))])]);
        let wait = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
        let response = self
            .call(leader, &request, PRODUCE_VERSION, wait)
            .await
            .map_err(|(e, m)| (e, format!("forwarding to its leader: {m}")))?;
        let answer = response
            .responses
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| &t.partition_responses)
            .find(|p| p.index == partition);
        let Some(p) = answer else {
            return Err((
                ResponseError::UnknownServerError,
                format!("broker {leader} answered without {topic}-{partition}"),
            ));
        };
        match ResponseError::try_from_code(p.error_code) {
            None => Ok(ProducedRemotely {
                base_offset: p.base_offset,
                log_append_time_ms: p.log_append_time_ms,
            }),
            Some(error) => Err((
                error,
                format!(
                    "its leader, broker {leader}, refused it: {}",
                    p.error_message
                        .as_deref()
                        .unwrap_or(error.to_string().as_str())
                ),
            )),
        }
    }

    /// The offsets group `group_id` committed for `partitions` of `topic`, asked of its
    /// coordinator, broker `coordinator` (OffsetFetch v7); `None` for a partition with
    /// none. Stable offsets only (`require_stable`, KIP-447): an offset committed in a
    /// transaction still open is UNSTABLE_OFFSET_COMMIT (88), to ask again.
    ///
    /// Errors: the coordinator's error (NOT_COORDINATOR (16) when it stopped being it,
    /// COORDINATOR_LOAD_IN_PROGRESS (14), ...); those of [`PeerClients::call`].
    pub(crate) async fn fetch_committed(
        &self,
        coordinator: i32,
        group_id: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>, (ResponseError, String)> {
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group_id.to_string())))
            .with_require_stable(true)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_indexes(partitions.to_vec())]));
        let response = self
            .call(coordinator, &request, OFFSET_FETCH_VERSION, Duration::ZERO)
            .await?;
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            return Err((
                error,
                format!("broker {coordinator} refused OffsetFetch of {group_id}"),
            ));
        }
        let mut out = Vec::with_capacity(partitions.len());
        for p in response
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| &t.partitions)
        {
            if let Some(error) = ResponseError::try_from_code(p.error_code) {
                return Err((
                    error,
                    format!(
                        "broker {coordinator}: OffsetFetch of {group_id} for {topic}-{}",
                        p.partition_index
                    ),
                ));
            }
            out.push((
                p.partition_index,
                (p.committed_offset >= 0).then_some(p.committed_offset),
            ));
        }
        Ok(out)
    }

    /// Commits `offsets` (topic, partition, offset) for group `group_id` outside group
    /// management (generation -1, as a sink's standalone commit) at its coordinator,
    /// broker `coordinator` (OffsetCommit v7). Returns each offset's error, in order.
    ///
    /// Errors: those of [`PeerClients::call`].
    pub(crate) async fn commit_offsets(
        &self,
        coordinator: i32,
        group_id: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<Vec<Option<ResponseError>>, (ResponseError, String)> {
        let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
        for (topic, partition, offset) in offsets {
            let p = OffsetCommitRequestPartition::default()
                .with_partition_index(*partition)
                .with_committed_offset(*offset)
                .with_committed_leader_epoch(-1);
            match topics.last_mut() {
                Some(t) if t.name.0.as_str() == topic => t.partitions.push(p),
                _ => topics.push(
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.clone())))
                        .with_partitions(vec![p]),
                ),
            }
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group_id.to_string())))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(topics);
        let response = self
            .call(coordinator, &request, OFFSET_COMMIT_VERSION, Duration::ZERO)
            .await?;
        let answered: HashMap<(&str, i32), i16> = response
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| ((t.name.0.as_str(), p.partition_index), p.error_code))
            })
            .collect();
        Ok(offsets
            .iter()
            .map(
                |(topic, partition, _)| match answered.get(&(topic.as_str(), *partition)) {
                    Some(code) => ResponseError::try_from_code(*code),
                    None => Some(ResponseError::UnknownServerError),
                },
            )
            .collect())
    }

    /// Reads `topic`-`partition` from `offset` on its leader, broker `leader`, as a
    /// consumer does (Fetch v12, `replica_id` -1, no wait, up to `max_bytes` of whole
    /// batches, to the high watermark, or with `read_committed` to the last stable offset
    /// with the aborted transactions): the record batches and the log start offset.
    ///
    /// OFFSET_OUT_OF_RANGE (1) is an answer, not an error: [`FetchedRemotely::out_of_range`].
    ///
    /// Errors: the leader's other partition errors (NOT_LEADER_OR_FOLLOWER (6), ...);
    /// those of [`PeerClients::call`].
    pub(crate) async fn fetch_records(
        &self,
        leader: i32,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        read_committed: bool,
    ) -> Result<FetchedRemotely, (ResponseError, String)> {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(i8::from(read_committed))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(max_bytes)])]);
        let response = self
            .call(leader, &request, CONSUMER_FETCH_VERSION, Duration::ZERO)
            .await?;
        let Some(p) = response
            .responses
            .iter()
            .filter(|t| t.topic.0.as_str() == topic)
            .flat_map(|t| &t.partitions)
            .find(|p| p.partition_index == partition)
        else {
            return Err((
                ResponseError::UnknownServerError,
                format!("broker {leader} answered without {topic}-{partition}"),
            ));
        };
        match ResponseError::try_from_code(p.error_code) {
            None => Ok(FetchedRemotely {
                records: p.records.clone().unwrap_or_default(),
                log_start_offset: p.log_start_offset,
                out_of_range: false,
                aborted: p
                    .aborted_transactions
                    .iter()
                    .flatten()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect(),
            }),
            Some(ResponseError::OffsetOutOfRange) => Ok(FetchedRemotely {
                records: Bytes::new(),
                log_start_offset: p.log_start_offset,
                out_of_range: true,
                aborted: Vec::new(),
            }),
            Some(error) => Err((
                error,
                format!("reading {topic}-{partition} at {offset} from broker {leader}"),
            )),
        }
    }

    /// [`PeerClients::produce`] (as `transactional_id`'s when given) for a caller that
    /// cannot await (a store appending under its own lock): the calling thread waits, bounded by [`FORWARD_TIMEOUT_MS`] plus
    /// [`IO_TIMEOUT`], while the runtime's other threads go on (`block_in_place`).
    ///
    /// Errors: as [`PeerClients::produce`]; NOT_LEADER_OR_FOLLOWER when called outside a
    /// multi-threaded Tokio runtime (nothing is sent: it could not wait there).
    pub(crate) fn produce_blocking(
        &self,
        leader: i32,
        topic: &str,
        partition: i32,
        batch: Bytes,
        transactional_id: Option<&str>,
    ) -> Result<ProducedRemotely, (ResponseError, String)> {
        let handle = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => h,
            _ => {
                return Err((
                    ResponseError::NotLeaderOrFollower,
                    format!("led by broker {leader}, and this thread cannot forward to it"),
                ))
            }
        };
        tokio::task::block_in_place(|| {
            handle.block_on(self.produce(
                leader,
                topic,
                partition,
                batch,
                FORWARD_TIMEOUT_MS,
                transactional_id,
            ))
        })
    }
}

/// One exchange of [`PeerClients::call`] on `slot`'s connection to broker `broker_id` at
/// `addr` (made, or made again, as needed; dropped when the exchange fails).
async fn exchange<R: Request + Sync>(
    slot: Slot,
    broker_id: i32,
    addr: String,
    client_id: String,
    req: R,
    version: i16,
    wait: Duration,
) -> Result<R::Response, (ResponseError, String)> {
    let mut conn = slot.lock().await;
    let reusable = matches!(&*conn, Some((a, c)) if a == &addr && !c.closed_by_peer());
    let c = match conn.as_mut() {
        Some((_, c)) if reusable => c,
        _ => {
            *conn = None;
            let c = PeerConn::connect(&addr, client_id, MAX_PEER_RESPONSE_BYTES)
                .await
                .map_err(|e| {
                    (
                        ResponseError::NetworkException,
                        format!("cannot connect to broker {broker_id} at {addr}: {e}"),
                    )
                })?;
            &mut conn.insert((addr.clone(), c)).1
        }
    };
    match c.call(&req, version, wait).await {
        Ok(r) => Ok(r),
        Err(e) => {
            *conn = None;
            Err((
                ResponseError::NetworkException,
                format!("request to broker {broker_id} at {addr} failed: {e:#}"),
            ))
        }
    }
}
