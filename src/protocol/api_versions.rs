//! ApiVersions (key 18), v0–v4. KIP-35, KIP-511 (client software name, flexible v3+).
//!
//! Answers with [`super::SUPPORTED_APIS`], nothing more. A request at a version above v4
//! gets UNSUPPORTED_VERSION (35) in a v0 body listing the supported APIs, so the client
//! retries with a version it finds there (KIP-511); that path lives in `handle_frame`,
//! because such a request cannot be decoded.
//!
//! Errors returned: UNSUPPORTED_VERSION (35).

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::ResponseError;

use super::SUPPORTED_APIS;

/// The advertised APIs: all of [`SUPPORTED_APIS`], but KIP-848's two when the consumer
/// group protocol is off (`group.coordinator.rebalance.protocols`), as Kafka does.
fn api_keys(consumer_protocol: bool) -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .filter(|a| {
            consumer_protocol
                || !matches!(
                    a.key,
                    ApiKey::ConsumerGroupHeartbeat | ApiKey::ConsumerGroupDescribe
                )
        })
        .map(|a| {
            ApiVersion::default()
                .with_api_key(a.key as i16)
                .with_min_version(a.min_version)
                .with_max_version(a.max_version)
        })
        .collect()
}

/// Handles a decodable ApiVersions request.
pub(super) fn handle(
    _request: ApiVersionsRequest,
    _version: i16,
    consumer_protocol: bool,
) -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(api_keys(consumer_protocol))
}

/// The answer to an ApiVersions request at a version weir does not know, to be encoded as
/// v0 (error 35 plus the supported list).
pub(super) fn unsupported_version() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_keys(true))
}
