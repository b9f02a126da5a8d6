//! Metadata (key 3), v0–v13. Protocol guide "Metadata"; KIP-516 (topic ids, v10+),
//! KIP-430 (authorized operations, not computed: left at "not requested").
//!
//! Lists every registered broker that is not fenced (KIP-631), each at its advertised
//! endpoint of the listener the request came in on (`Context::listener_name`; this broker
//! at its own, and listed even before it is registered);
//! `controller_id` is this broker (see [`metadata_controller_id`]: KRaft brokers name a
//! live broker, KIP-590, and every weir broker takes admin requests and forwards them to
//! the quorum). Then the requested topics: `null` (or an
//! empty list at v0) means all. A missing topic is created
//! when `auto.create.topics.enable` is on and the request allows it (v4+ field; always at
//! v0–v3, as in Kafka). Each partition's leader, leader epoch, replicas and ISR are the
//! metadata image's (placed by `cluster::placement`; on a single node: this broker, epoch
//! 0); a partition whose leader is fenced lists leader -1 and LEADER_NOT_AVAILABLE (5).
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_TOPIC_EXCEPTION (17),
//! UNKNOWN_TOPIC_ID (100) for an id lookup that finds nothing.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{is_internal_topic, MetadataImage, TopicMeta};

use super::Context;
use crate::topics;

/// A topic's entry: each partition's leader, epoch, replicas and ISR as the image has
/// them, except that a partition with no leader, or one whose broker is fenced or in
/// controlled shutdown, is listed with leader -1 and LEADER_NOT_AVAILABLE (5), as Kafka
/// lists an offline partition; replicas on such brokers, and replicas their broker
/// reported on a failed log dir (KIP-112, `ReplicasOffline`), are its
/// `offline_replicas`. A
/// leader without an endpoint on `listener` (the request's listener name) is listed as
/// leader -1 with LISTENER_NOT_FOUND (72) from v6, LEADER_NOT_AVAILABLE before (Kafka's
/// `KRaftMetadataCache`, `errorUnavailableListeners`).
fn topic_entry(
    image: &MetadataImage,
    t: &TopicMeta,
    listener: &str,
    version: i16,
) -> MetadataResponseTopic {
    let partitions = t
        .partition_states
        .iter()
        .zip(0..)
        .map(|(p, i)| {
            let nodes = |ids: &[i32]| ids.iter().copied().map(BrokerId).collect::<Vec<_>>();
            let inactive = |id: i32| {
                image.broker(id).is_some_and(|b| !b.is_active())
                    || image.replica_offline(t.id, i, id)
            };
            let offline = p.leader == -1 || inactive(p.leader);
            let offline_replicas: Vec<i32> = p
                .replicas
                .iter()
                .copied()
                .filter(|r| inactive(*r))
                .collect();
            let unreachable = !offline
                && p.leader != image.node_id()
                && image
                    .broker(p.leader)
                    .is_some_and(|b| endpoint_named(b, listener).is_none());
            let (leader, error) = if offline {
                (-1, ResponseError::LeaderNotAvailable.code())
            } else if unreachable && version >= 6 {
                (-1, ResponseError::ListenerNotFound.code())
            } else if unreachable {
                (-1, ResponseError::LeaderNotAvailable.code())
            } else {
                (p.leader, 0)
            };
            MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_error_code(error)
                .with_leader_id(BrokerId(leader))
                .with_leader_epoch(p.leader_epoch)
                .with_replica_nodes(nodes(&p.replicas))
                .with_isr_nodes(nodes(&p.isr))
                .with_offline_replicas(nodes(&offline_replicas))
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(t.name.clone()))))
        .with_topic_id(t.id)
        .with_is_internal(is_internal_topic(&t.name))
        .with_partitions(partitions)
}

fn error_entry(name: Option<String>, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(|n| TopicName(StrBytes::from_string(n))))
        .with_error_code(error.code())
}

/// `broker`'s endpoint of listener `name`: what a request that came in on listener
/// `name` is told (Metadata, FindCoordinator, DescribeCluster).
pub(super) fn endpoint_named<'a>(
    broker: &'a crate::cluster::BrokerRegistration,
    name: &str,
) -> Option<&'a crate::cluster::BrokerEndpoint> {
    broker.endpoints.iter().find(|e| e.name == name)
}

/// A broker as Metadata and DescribeCluster list it.
#[derive(Debug)]
pub(super) struct ListedBroker {
    pub(super) id: i32,
    pub(super) host: String,
    pub(super) port: i32,
    pub(super) rack: Option<String>,
    pub(super) fenced: bool,
}

/// The brokers of `image` clients are told of, by id: the active ones (and the fenced or
/// shutting-down ones too with `include_fenced`, DescribeCluster v2), each at its endpoint
/// named as the request's listener (a broker without one is not listed, as in Kafka); this
/// broker at the endpoint it advertises now, and also when it is not registered (yet, or
/// on a store without registrations).
pub(super) fn listed_brokers(
    ctx: &Context,
    image: &MetadataImage,
    include_fenced: bool,
) -> Vec<ListedBroker> {
    let me = image.node_id();
    let this = |rack: Option<String>, fenced: bool| ListedBroker {
        id: me,
        host: ctx.advertised.host.clone(),
        port: ctx.advertised.port,
        rack,
        fenced,
    };
    let mut out: Vec<ListedBroker> = image
        .brokers()
        .filter(|b| include_fenced || b.is_active())
        .filter_map(|b| {
            if b.broker_id == me {
                return Some(this(b.rack.clone(), b.fenced));
            }
            let e = endpoint_named(b, &ctx.listener_name)?;
            Some(ListedBroker {
                id: b.broker_id,
                host: e.host.clone(),
                port: e.port,
                rack: b.rack.clone(),
                fenced: b.fenced,
            })
        })
        .collect();
    if image.broker(me).is_none() {
        out.push(this(None, false));
        out.sort_by_key(|b| b.id);
    }
    out
}

/// Metadata's `controller_id` among the `listed` brokers: this broker when it is listed,
/// else the quorum leader when listed, else the first listed (-1: none).
///
/// Why not the quorum leader (DescribeCluster's): clients send controller-bound admin
/// requests to the broker Metadata names (librdkafka's DescribeConfigs of topics,
/// CreateTopics, DeleteTopics...) and wait for that broker to be up. Right after the
/// active controller dies the other nodes still name it until the quorum elects another
/// (1.5-2 s), and a client that fetched Metadata then waited for the dead node until its
/// request timeout (found by a tryout: `weir topic describe` 40 s, then timed out).
/// Kafka's KRaft brokers name a random live broker for the same reason (KIP-590: clients
/// do not reach the controller; `KRaftMetadataCache.getControllerId`); weir names the
/// broker that answered, the one live broker the client certainly reaches (a random one
/// of the image may be dead but not yet fenced, the very case). Every weir broker takes
/// admin requests and forwards the change to the quorum leader.
fn metadata_controller_id(ctx: &Context, image: &MetadataImage, listed: &[ListedBroker]) -> i32 {
    let me = image.node_id();
    let is_listed = |id: i32| listed.iter().any(|b| b.id == id);
    if is_listed(me) {
        return me;
    }
    match ctx.metadata.active_controller() {
        Some(leader) if is_listed(leader) => leader,
        _ => listed.first().map_or(-1, |b| b.id),
    }
}

/// DescribeCluster's `controller_id`: the quorum leader when it is a registered broker
/// (combined mode), else this broker: a controller-only leader is no broker a client
/// can reach, and Kafka's KRaft brokers name a live broker then too (KIP-590; every weir
/// broker forwards admin changes to the leader).
pub(super) fn controller_id(ctx: &Context, image: &MetadataImage) -> i32 {
    ctx.metadata
        .active_controller()
        .filter(|leader| image.broker(*leader).is_some())
        .unwrap_or_else(|| image.node_id())
}

/// Handles a Metadata request.
pub(super) fn handle(ctx: &Context, request: MetadataRequest, version: i16) -> MetadataResponse {
    let all = match &request.topics {
        None => true,
        Some(list) => list.is_empty() && version == 0,
    };
    let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
    let image = ctx.metadata.image();
    let topics = if all {
        image
            .topics()
            .map(|t| topic_entry(&image, t, &ctx.listener_name, version))
            .collect()
    } else {
        let mut out = Vec::new();
        for req in request.topics.unwrap_or_default() {
            match req.name {
                Some(name) => {
                    let name = name.0.as_str().to_string();
                    match topics::get_or_auto_create(&ctx.topics, &name, allow_auto_create) {
                        Ok(t) => out.push(topic_entry(&image, &t, &ctx.listener_name, version)),
                        Err(e) => out.push(error_entry(Some(name), e.error)),
                    }
                }
                None => match image.topic_by_id(req.topic_id) {
                    Some(t) => out.push(topic_entry(&image, t, &ctx.listener_name, version)),
                    None => out.push(
                        error_entry(None, ResponseError::UnknownTopicId)
                            .with_topic_id(req.topic_id),
                    ),
                },
            }
        }
        out
    };
    let listed = listed_brokers(ctx, &image, false);
    let controller = metadata_controller_id(ctx, &image, &listed);
    let brokers = listed
        .into_iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.id))
                .with_host(StrBytes::from_string(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(StrBytes::from_string))
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(image.cluster_id().to_string())))
        .with_controller_id(BrokerId(controller))
        .with_topics(topics)
}
