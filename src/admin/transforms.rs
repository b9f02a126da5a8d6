//! `/transforms`: deploy, replace, list, describe and delete transform deployments.
//!
//! - `POST /transforms`, JSON body [`TransformSpec`] → 201 + status; 409 when the name
//!   exists; 400 for a bad spec, one closing a cycle of deployments (named: "a -> b ->
//!   a"), or a component that does not load (the message names the problem: not a
//!   component, a connector, wrong world, missing import or export, `open` refused the
//!   config).
//! - `PUT /transforms/{name}` → 200 (replaced) or 201 (created) + status; the body's
//!   `name` may be omitted, and must match the path when given.
//! - `GET /transforms` → array of status; `GET /transforms/{name}` → status or 404.
//! - `DELETE /transforms/{name}` → 204, or 404.
//!
//! Bodies are parsed here (not by axum's `Json` extractor) so every refusal is the admin
//! API's JSON error with a message.
//!
//! On a cluster these routes are answered by the connect leader (`connect::forward`),
//! where async deployments run. An inline deployment applies on whichever broker leads a
//! partition of its input, so a deploy of one is answered only once every other live
//! broker reports it RUNNING with the same component (or after
//! [`INSTALL_WAIT_MS`]): records produced after the answer are transformed on every
//! leader — a redaction never misses the first records on some broker.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::{AdminState, ApiError};
use crate::transform::{DeployError, Mode, TransformSpec, TransformStatus};

/// How long (ms) a deploy of an inline transform waits for every other live broker to
/// install it before answering anyway (a broker that cannot load the component reports
/// FAILED in its own `GET /transforms/{name}` and its log).
pub(crate) const INSTALL_WAIT_MS: u64 = 30_000;

/// The `/transforms` routes.
pub(crate) fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/transforms", get(list).post(create))
        .route(
            "/transforms/{name}",
            get(describe).put(replace).delete(delete),
        )
}

impl From<DeployError> for ApiError {
    fn from(e: DeployError) -> ApiError {
        let status = match &e {
            DeployError::Invalid(_) => StatusCode::BAD_REQUEST,
            DeployError::Conflict(_) => StatusCode::CONFLICT,
            DeployError::NotFound(_) => StatusCode::NOT_FOUND,
            DeployError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Parses a spec body; with `name` (PUT), fills or checks its name.
fn parse(body: &[u8], name: Option<&str>) -> Result<TransformSpec, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")))?;
    if let (Some(name), Some(obj)) = (name, value.as_object_mut()) {
        match obj.get("name") {
            None => {
                obj.insert("name".into(), serde_json::Value::String(name.into()));
            }
            Some(serde_json::Value::String(n)) if n == name => {}
            Some(other) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("name {other} in the body differs from {name:?} in the path"),
                ))
            }
        }
    }
    TransformSpec::from_json_value(value).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))
}

async fn create(State(state): State<Arc<AdminState>>, body: Bytes) -> Result<Response, ApiError> {
    let spec = parse(&body, None)?;
    let status = state.transforms.create(spec).await?;
    installed_everywhere(&state, &status).await;
    Ok((StatusCode::CREATED, Json(status)).into_response())
}

async fn replace(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let spec = parse(&body, Some(&name))?;
    let (status, created) = state.transforms.replace(spec).await?;
    installed_everywhere(&state, &status).await;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(status)).into_response())
}

async fn list(State(state): State<Arc<AdminState>>) -> Response {
    Json(state.transforms.list().await).into_response()
}

async fn describe(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    match state.transforms.get(&name).await {
        Some(s) => Ok(Json(s).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no transform named {name}"),
        )),
    }
}

async fn delete(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    // On a task of its own: a client that disconnects drops this handler, and must not
    // stop the delete between stopping the runner and forgetting its progress.
    let transforms = state.transforms.clone();
    tokio::spawn(async move { transforms.delete(&name).await })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

/// Waits (at most [`INSTALL_WAIT_MS`]) until every other live broker with an admin
/// listener answers `GET /transforms/{name}` (asked not to forward) with `status`'s
/// component version, RUNNING. Async deployments run here only: no wait. A broker that
/// does not get there is logged.
async fn installed_everywhere(state: &AdminState, status: &TransformStatus) {
    if status.mode != Mode::Inline {
        return;
    }
    let image = state.metadata.image();
    let me = image.node_id();
    let urls: Vec<(i32, String)> = crate::cluster::live_brokers(&image)
        .into_iter()
        .filter(|id| *id != me)
        .filter_map(|id| {
            let b = image.broker(id)?;
            let e = b
                .endpoints
                .iter()
                .find(|e| e.name == crate::connect::leader::ADMIN_ENDPOINT)?;
            Some((
                id,
                format!("http://{}:{}/transforms/{}", e.host, e.port, status.name),
            ))
        })
        .collect();
    if urls.is_empty() {
        return;
    }
    let (name, version) = (status.name.clone(), status.version.clone());
    let waited = tokio::task::spawn_blocking(move || {
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(INSTALL_WAIT_MS);
        let mut pending = urls;
        while !pending.is_empty() && std::time::Instant::now() < deadline {
            pending.retain(|(_, url)| !installed_at(url, me, &version));
            if !pending.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        pending.into_iter().map(|(id, _)| id).collect::<Vec<i32>>()
    })
    .await
    .unwrap_or_default();
    if !waited.is_empty() {
        tracing::warn!(transform = %name, brokers = ?waited, "inline transform not reported RUNNING by every broker in time; see those brokers' logs");
    }
}

/// Whether the broker at `url` (its `GET /transforms/{name}`) runs `version`.
fn installed_at(url: &str, me: i32, version: &str) -> bool {
    let answer = ureq::get(url)
        .timeout(std::time::Duration::from_secs(2))
        .set(super::connect::FORWARDED_HEADER, &me.to_string())
        .call();
    let Ok(response) = answer else {
        return false;
    };
    response
        .into_json::<TransformStatus>()
        .is_ok_and(|s| s.version == version && s.state == crate::transform::RunState::Running)
}
