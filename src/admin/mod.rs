//! The admin HTTP listener (`admin.listeners`, default `http://127.0.0.1:8083`, Kafka
//! Connect's port): JSON over HTTP/1.1 with axum.
//!
//! Routes: `GET /` (version and cluster id, as Kafka Connect's root resource). Each owner
//! adds its routes in its own file: the HTTP produce endpoint (`records.rs`:
//! `POST /topics/{topic}/records` and REST Proxy v3's
//! `POST /v3/clusters/{cluster_id}/topics/{topic}/records`), transforms (`/transforms`),
//! the Connect REST API (`connect.rs`: `/connectors`, `/connector-plugins`), and
//! Prometheus metrics (`metrics.rs`: `GET /metrics`).
//!
//! Errors are JSON bodies `{"error_code": <HTTP status>, "message": "..."}`, the shape
//! Kafka Connect and Confluent's REST Proxy use.
//!
//! Request bodies in flight are bounded across all requests (`admin.max.inflight.request.bytes`,
//! default 256 MiB; issue 15: each body had a cap but not their number, and eight
//! concurrent 100 MB produce bodies took the broker from 62 MB to 637 MB). Before its body
//! is read, a request reserves its `Content-Length`, capped at its route's body limit
//! (`socket.request.max.bytes` for HTTP produce, axum's 2 MiB default elsewhere), or that
//! whole limit when it is chunked (its length is unknown); the reservation is returned when
//! its answer is ready, by then the body and everything built from it is dropped (no route
//! caches bodies). A request that does not fit the bytes left gets **503** Service
//! Unavailable with `Retry-After: 1`: it is not too large, the broker is busy, and a retry
//! may pass (413 would tell the client to shrink a request that is fine). A request
//! larger than the whole bound can never fit and gets **413**. The default lets two HTTP
//! produce bodies of the default 100 MiB `socket.request.max.bytes` be read at once.
//! The bound is on body bytes, not on what handling them costs: an HTTP produce body
//! peaks at about 4x its size (records, batches, per-record answers; issue 15's figures
//! in `benches/RESULTS.md`), so lower this key to lower the broker's peak.

pub(crate) mod connect;
pub(crate) mod metrics;
pub(crate) mod records;
pub(crate) mod transforms;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::ingest::Ingest;
use crate::transform::TransformManager;

/// What every admin route can reach, handed over by the composition root (`broker`).
#[derive(Debug)]
pub(crate) struct AdminState {
    /// Broker configuration (`socket.request.max.bytes` bounds HTTP produce bodies).
    pub config: Arc<BrokerConfig>,
    /// Cluster metadata (the cluster id).
    pub metadata: Arc<Metadata>,
    /// Writes records into topics (HTTP produce).
    pub ingest: Arc<Ingest>,
    /// Transform deployments (`/transforms`).
    pub transforms: Arc<TransformManager>,
    /// The connectors (`/connectors`, `/connector-plugins`).
    pub connect: Arc<crate::connect::ConnectHandle>,
    /// Hosted partitions (`/metrics`: log offsets and sizes).
    pub replicas: Arc<crate::replica::ReplicaManager>,
    /// Consumer groups (`/metrics`: group lag).
    pub groups: Arc<crate::group::GroupCoordinator>,
    /// This broker's metrics recorder (`/metrics`).
    pub metrics: crate::metrics::Metrics,
}

/// An error answer: HTTP status and a message, as `{"error_code": status, "message": ...}`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error_code": self.status.as_u16(),
            "message": self.message,
        });
        (self.status, Json(body)).into_response()
    }
}

/// The body limit of the routes that read their body with axum's `Bytes` extractor
/// (axum's `DefaultBodyLimit`, 2 MiB).
const DEFAULT_BODY_MAX_BYTES: u64 = 2 << 20;

/// Bytes one permit of [`InflightBytes`] stands for (a tokio semaphore takes at most
/// `u32::MAX` permits at once; in KiB that is 4 TiB).
const PERMIT_BYTES: u64 = 1024;

/// The request-body bytes all admin requests hold at once, bounded by
/// `admin.max.inflight.request.bytes` (see the module doc).
#[derive(Debug)]
struct InflightBytes {
    permits: Arc<Semaphore>,
    max_bytes: u64,
}

impl InflightBytes {
    fn new(max_bytes: u64) -> InflightBytes {
        let permits = max_bytes
            .div_ceil(PERMIT_BYTES)
            .min(Semaphore::MAX_PERMITS as u64) as usize;
        InflightBytes {
            permits: Arc::new(Semaphore::new(permits)),
            max_bytes,
        }
    }
}

/// One group of routes' share of the bound: their body limit.
#[derive(Debug, Clone)]
struct BodyBound {
    inflight: Arc<InflightBytes>,
    /// The largest body these routes read (bytes).
    body_max_bytes: u64,
}

/// Reserves the request's body bytes (see the module doc) for as long as it is handled.
/// Errors: 413 for a request larger than the whole bound, 503 with `Retry-After: 1` when
/// it does not fit now, each with a JSON error body.
async fn bound_body(State(bound): State<BodyBound>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bytes = match declared {
        // A larger one is refused by its route (413) without reading it.
        Some(n) => n.min(bound.body_max_bytes),
        None if headers.contains_key(header::TRANSFER_ENCODING) => bound.body_max_bytes,
        // HTTP/1.1: neither header, no body.
        None => 0,
    };
    let max_bytes = bound.inflight.max_bytes;
    if bytes > max_bytes {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body of {bytes} bytes exceeds admin.max.inflight.request.bytes {max_bytes}"
            ),
        )
        .into_response();
    }
    let permits = u32::try_from(bytes.div_ceil(PERMIT_BYTES)).unwrap_or(u32::MAX);
    let reserved = if permits == 0 {
        None
    } else {
        match bound
            .inflight
            .permits
            .clone()
            .try_acquire_many_owned(permits)
        {
            Ok(p) => Some(p),
            Err(_) => {
                let mut busy = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "admin requests already hold close to admin.max.inflight.request.bytes \
                         {max_bytes} bytes of request bodies; retry later"
                    ),
                )
                .into_response();
                busy.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return busy;
            }
        }
    };
    let response = next.run(request).await;
    drop(reserved);
    response
}

/// The admin router over `state`.
pub(crate) fn router(state: Arc<AdminState>) -> Router {
    let inflight = Arc::new(InflightBytes::new(
        state.config.admin_max_inflight_request_bytes,
    ));
    let produce = Router::new()
        .route("/topics/{topic}/records", post(records::produce))
        .route(
            "/v3/clusters/{cluster_id}/topics/{topic}/records",
            post(records::produce_v3),
        )
        .layer(axum::middleware::from_fn_with_state(
            BodyBound {
                inflight: inflight.clone(),
                body_max_bytes: state.config.socket_request_max_bytes as u64,
            },
            bound_body,
        ));
    let others = Router::new()
        .route("/", get(root))
        // Async transforms run on the connect leader, which also answers for them.
        .merge(
            transforms::routes().route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                connect::forward,
            )),
        )
        .merge(
            connect::routes().route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                connect::forward,
            )),
        )
        .merge(metrics::routes())
        .layer(axum::middleware::from_fn_with_state(
            BodyBound {
                inflight,
                body_max_bytes: DEFAULT_BODY_MAX_BYTES,
            },
            bound_body,
        ));
    produce.merge(others).with_state(state)
}

async fn root(State(state): State<Arc<AdminState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": "",
        "kafka_cluster_id": state.metadata.cluster_id(),
    }))
}

/// Serves the admin API on `listener` until `shutdown` becomes true.
///
/// Errors: the listener fails (logged by the caller).
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            while !*shutdown.borrow_and_update() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
}
