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

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::{AdminState, ApiError};
use crate::transform::{DeployError, TransformSpec};

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
    Ok((StatusCode::CREATED, Json(status)).into_response())
}

async fn replace(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let spec = parse(&body, Some(&name))?;
    let (status, created) = state.transforms.replace(spec).await?;
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
    state.transforms.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
