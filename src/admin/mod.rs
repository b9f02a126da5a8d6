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

pub(crate) mod connect;
pub(crate) mod metrics;
pub(crate) mod records;
pub(crate) mod transforms;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::watch;

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

/// The admin router over `state`.
pub(crate) fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/topics/{topic}/records", post(records::produce))
        .route(
            "/v3/clusters/{cluster_id}/topics/{topic}/records",
            post(records::produce_v3),
        )
        .merge(transforms::routes())
        .merge(
            connect::routes().route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                connect::forward,
            )),
        )
        .merge(metrics::routes())
        .with_state(state)
}

async fn root(
    axum::extract::State(state): axum::extract::State<Arc<AdminState>>,
) -> Json<serde_json::Value> {
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
