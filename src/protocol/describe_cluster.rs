//! DescribeCluster (key 60), v0–v2. KIP-700 (the API), KIP-919 (v1: `endpoint_type`),
//! KIP-1073 (v2: `include_fenced_brokers`, `is_fenced`).
//!
//! Answers with the cluster id, the active controller as `controller_id` (the quorum
//! leader; this broker while none is known) and the brokers Metadata lists (registered,
//! not fenced, KIP-631), plus the fenced ones with `is_fenced` when v2 asks for them.
//! `cluster_authorized_operations` is not computed (no authorizer; KIP-430): it stays at
//! "not requested", -2147483648, as in Metadata.
//!
//! Errors (whole response): UNSUPPORTED_ENDPOINT_TYPE (115) for `endpoint_type` 2
//! (controllers: a broker does not describe the controller listeners, as in Kafka),
//! INVALID_REQUEST (42) for any other type than 1 (brokers).

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::metadata::{controller_id, listed_brokers};
use super::Context;

/// `endpoint_type` asking for brokers (KIP-919).
const ENDPOINT_TYPE_BROKERS: i8 = 1;
/// `endpoint_type` asking for controllers (KIP-919).
const ENDPOINT_TYPE_CONTROLLERS: i8 = 2;

/// `cluster_authorized_operations` when not computed (Kafka's `Integer.MIN_VALUE`).
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// Handles a DescribeCluster request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeClusterRequest,
    version: i16,
) -> DescribeClusterResponse {
    let image = ctx.metadata.image();
    let response = DescribeClusterResponse::default()
        .with_endpoint_type(request.endpoint_type)
        .with_cluster_id(StrBytes::from_string(image.cluster_id().to_string()))
        .with_controller_id(BrokerId(controller_id(ctx, &image)))
        .with_cluster_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED);
    // v0 has no endpoint type: brokers.
    let endpoint_type = if version >= 1 {
        request.endpoint_type
    } else {
        ENDPOINT_TYPE_BROKERS
    };
    let refused = match endpoint_type {
        ENDPOINT_TYPE_BROKERS => None,
        ENDPOINT_TYPE_CONTROLLERS => Some((
            ResponseError::UnsupportedEndpointType,
            "a broker does not describe the controllers".to_string(),
        )),
        other => Some((
            ResponseError::InvalidRequest,
            format!("endpoint type {other} is unknown"),
        )),
    };
    if let Some((error, message)) = refused {
        return response
            .with_controller_id(BrokerId(-1))
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message)));
    }
    let include_fenced = version >= 2 && request.include_fenced_brokers;
    let brokers = listed_brokers(ctx, &image, include_fenced)
        .into_iter()
        .map(|b| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.id))
                .with_host(StrBytes::from_string(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(StrBytes::from_string))
                .with_is_fenced(b.fenced)
        })
        .collect();
    response.with_brokers(brokers)
}
