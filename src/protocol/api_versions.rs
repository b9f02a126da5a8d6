//! ApiVersions (key 18), v0–v4. KIP-35, KIP-511 (client software name, flexible v3+),
//! KIP-584 (features, v3+).
//!
//! Answers with [`super::SUPPORTED_APIS`] and one feature, `transaction.version`
//! (KIP-890): supported 0–2 (listed at v4 only, as Kafka lists no feature whose minimum
//! is 0 to older requests, KAFKA-17492), finalized at `transaction.version` (absent at
//! 0), with a features epoch that grows across restarts (the broker's start time in ms):
//! the Java client reads finalized features only with an epoch ≥ 0, and again only when
//! it grows. A request at a version above v4
//! gets UNSUPPORTED_VERSION (35) in a v0 body listing the supported APIs, so the client
//! retries with a version it finds there (KIP-511); that path lives in `handle_frame`,
//! because such a request cannot be decoded.
//!
//! Errors returned: UNSUPPORTED_VERSION (35).

use std::sync::OnceLock;

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
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

/// Kafka's feature name for the transaction protocol version (KIP-890).
const TRANSACTION_VERSION: &str = "transaction.version";
/// The highest `transaction.version` weir implements (KIP-890 part 2).
const TRANSACTION_VERSION_MAX: i16 = 2;

/// The features epoch: this process's start time (ms since the Unix epoch), fixed at the
/// first ApiVersions, so a restart with another `transaction.version` raises it.
fn features_epoch() -> i64 {
    static EPOCH: OnceLock<i64> = OnceLock::new();
    *EPOCH.get_or_init(crate::replica::now_ms)
}

/// Handles a decodable ApiVersions request. `transaction_version` is the finalized level
/// of `transaction.version` (the config key of that name).
pub(super) fn handle(
    _request: ApiVersionsRequest,
    version: i16,
    consumer_protocol: bool,
    transaction_version: i16,
) -> ApiVersionsResponse {
    let name = || StrBytes::from_static_str(TRANSACTION_VERSION);
    let supported = if version >= 4 {
        vec![SupportedFeatureKey::default()
            .with_name(name())
            .with_min_version(0)
            .with_max_version(TRANSACTION_VERSION_MAX)]
    } else {
        Vec::new()
    };
    let finalized = if transaction_version > 0 {
        vec![FinalizedFeatureKey::default()
            .with_name(name())
            .with_min_version_level(transaction_version)
            .with_max_version_level(transaction_version)]
    } else {
        Vec::new()
    };
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(api_keys(consumer_protocol))
        .with_supported_features(supported)
        .with_finalized_features_epoch(features_epoch())
        .with_finalized_features(finalized)
}

/// The answer to an ApiVersions request at a version weir does not know, to be encoded as
/// v0 (error 35 plus the supported list).
pub(super) fn unsupported_version() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_keys(true))
}
