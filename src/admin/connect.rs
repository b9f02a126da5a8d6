//! The Kafka Connect REST API (Kafka documentation "Connect → REST API", KIP-875 for
//! stop and offsets), over [`crate::connect::ConnectRuntime`]:
//!
//! | route | answer |
//! |---|---|
//! | `GET /connectors[?expand=status&expand=info]` | names, or `{name: {status, info}}` |
//! | `POST /connectors` `{"name", "config"}` | 201 + info; 409 exists; 400 bad config (every error validate would report, in Kafka Connect's message) |
//! | `GET /connectors/{name}` | `{name, config, tasks: [{connector, task}], type}` |
//! | `GET /connectors/{name}/config` | the properties |
//! | `PUT /connectors/{name}/config` | 201 created / 200 updated + info; 409 file-defined |
//! | `GET /connectors/{name}/status` | `{name, connector: {state, worker_id}, tasks: [{id, state, worker_id, trace?}], type}` |
//! | `PUT /connectors/{name}/pause`, `/resume` | 202 |
//! | `PUT /connectors/{name}/stop` | 204 (Kafka Connect's answer; KIP-875) |
//! | `POST /connectors/{name}/restart` | 204; with `includeTasks`/`onlyFailed`: 202 + status showing RESTARTING |
//! | `GET /connectors/{name}/tasks` | `[{"id": {connector, task}, "config"}]` |
//! | `GET /connectors/{name}/tasks/{id}/status` | the task's status |
//! | `POST /connectors/{name}/tasks/{id}/restart` | 204 |
//! | `GET /connectors/{name}/offsets` | `{"offsets": [{partition, offset}]}` |
//! | `DELETE` / `PATCH /connectors/{name}/offsets` | 200 `{"message"}`; 400 unless STOPPED |
//! | `DELETE /connectors/{name}` | 204; 409 file-defined |
//! | `GET /connector-plugins` | `[{class, type, version}]` |
//! | `PUT /connector-plugins/{plugin}/config/validate` | `ConfigInfos`, with the broker's ceiling and the component checked too |
//!
//! Errors: `{"error_code": <status>, "message"}`: 404 unknown connector or task, 409
//! conflict (exists, file-defined, still stopping), 400 bad body or config, 500 when the
//! config store cannot be written. Bodies are parsed here (not by axum's `Json`
//! extractor) so every refusal has this shape.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::Value;

use super::{AdminState, ApiError};
use crate::connect::config::ConnectorConfig;
use crate::connect::{catalog, ConnectError, ConnectRuntime, Origin, Placement, TargetState};

/// The `/connectors` and `/connector-plugins` routes.
pub(crate) fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/connectors", get(list).post(create))
        .route("/connectors/{name}", get(info).delete(delete))
        .route("/connectors/{name}/config", get(config).put(put_config))
        .route("/connectors/{name}/status", get(status))
        .route("/connectors/{name}/pause", put(pause))
        .route("/connectors/{name}/resume", put(resume))
        .route("/connectors/{name}/stop", put(stop))
        .route("/connectors/{name}/restart", post(restart))
        .route("/connectors/{name}/tasks", get(tasks))
        .route("/connectors/{name}/tasks/{task}/status", get(task_status))
        .route(
            "/connectors/{name}/tasks/{task}/restart",
            post(task_restart),
        )
        .route(
            "/connectors/{name}/offsets",
            get(offsets).delete(reset_offsets).patch(alter_offsets),
        )
        .route("/connector-plugins", get(plugins))
        .route("/connector-plugins/{plugin}/config/validate", put(validate))
}

impl From<ConnectError> for ApiError {
    fn from(e: ConnectError) -> ApiError {
        let status = match &e {
            ConnectError::Invalid(_) => StatusCode::BAD_REQUEST,
            ConnectError::NotFound(_) => StatusCode::NOT_FOUND,
            ConnectError::Conflict(_) => StatusCode::CONFLICT,
            ConnectError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Longest a request waits for this broker's connect runtime to start (it starts when
/// this broker becomes the connect leader: at start-up, or after a failover).
const RUNTIME_WAIT: Duration = Duration::from_secs(15);

/// Header marking a request one broker forwarded to the connect leader: the receiver
/// answers it itself (never forwards it again, so leadership moving in between costs a
/// 503, never a loop).
pub(crate) const FORWARDED_HEADER: &str = "x-weir-forwarded-by";

/// Longest a forwarded request may take (stop and offsets requests wait up to 30 s).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest request or response body forwarded (connector configs are small).
const MAX_FORWARDED_BODY_BYTES: usize = 4 << 20;

/// This broker's connect runtime, waiting up to [`RUNTIME_WAIT`] for it to start.
///
/// Errors: 503 naming where connectors run when this broker does not run them.
async fn runtime(state: &AdminState) -> Result<ConnectRuntime, ApiError> {
    let deadline = tokio::time::Instant::now() + RUNTIME_WAIT;
    loop {
        if let Some(runtime) = state.connect.current() {
            return Ok(runtime);
        }
        let placement = state.connect.placement();
        if tokio::time::Instant::now() >= deadline || !matches!(placement, Placement::Here) {
            let whereabouts = match placement {
                Placement::Here => "it is starting on this broker".to_string(),
                Placement::Elsewhere(broker, url) => {
                    format!("they run on broker {broker} ({url})")
                }
                Placement::Unknown(why) => why,
            };
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("this broker does not run the connectors now: {whereabouts}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Middleware of every connect route: a request to a broker that is not the connect
/// leader is forwarded to the leader's admin API and its answer returned as it is
/// (Kafka Connect's workers forward to their leader likewise); any other is handled here.
pub(crate) async fn forward(
    State(state): State<Arc<AdminState>>,
    request: Request,
    next: Next,
) -> Response {
    if request.headers().contains_key(FORWARDED_HEADER) {
        return next.run(request).await;
    }
    match state.connect.placement() {
        Placement::Elsewhere(broker, url) => {
            let me = state.metadata.node_id();
            proxy(me, broker, &url, request)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        Placement::Here | Placement::Unknown(_) => next.run(request).await,
    }
}

/// Sends `request` to `base` (broker `broker`'s admin API) and returns its answer.
///
/// Errors: 413 for a body over [`MAX_FORWARDED_BODY_BYTES`]; 502 when the leader cannot
/// be reached or its answer read.
async fn proxy(me: i32, broker: i32, base: &str, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_FORWARDED_BODY_BYTES)
        .await
        .map_err(|e| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("body: {e}")))?;
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let url = format!("{base}{path}");
    let method = parts.method.to_string();
    let target = url.clone();
    let answer = tokio::task::spawn_blocking(move || -> Result<(u16, String, Vec<u8>), String> {
        let call = ureq::request(&method, &target)
            .timeout(FORWARD_TIMEOUT)
            .set("Content-Type", "application/json")
            .set(FORWARDED_HEADER, &me.to_string());
        let sent = if body.is_empty() {
            call.call()
        } else {
            call.send_bytes(&body)
        };
        let response = match sent {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(e.to_string()),
        };
        let status = response.status();
        let content_type = response.content_type().to_string();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(response.into_reader(), MAX_FORWARDED_BODY_BYTES as u64),
            &mut bytes,
        )
        .map_err(|e| e.to_string())?;
        Ok((status, content_type, bytes))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let unreachable = |e: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("cannot forward to the connect leader, broker {broker} ({url}): {e}"),
        )
    };
    let (status, content_type, bytes) = answer.map_err(unreachable)?;
    let status =
        StatusCode::from_u16(status).map_err(|e| unreachable(format!("its answer: {e}")))?;
    Ok((
        status,
        [(axum::http::header::CONTENT_TYPE, content_type)],
        bytes,
    )
        .into_response())
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("body is not JSON: {e}")))
}

fn properties(value: &Value) -> Result<BTreeMap<String, String>, ApiError> {
    ConnectorConfig::properties_from_json(Origin::Rest.path(), value)
        .map_err(|e| bad(e.to_string()))
}

/// The values of query parameter `key` in `query` (`a=1&a=2` gives both).
fn query_values(query: &Option<String>, key: &str) -> Vec<String> {
    query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .collect()
}

/// A boolean query parameter (absent: false).
fn query_bool(query: &Option<String>, key: &str) -> Result<bool, ApiError> {
    match query_values(query, key).last().map(String::as_str) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(bad(format!("{key}={v}: expected true or false"))),
    }
}

async fn list(
    State(state): State<Arc<AdminState>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let expand = query_values(&query, "expand");
    let status = expand.iter().any(|e| e == "status");
    let info = expand.iter().any(|e| e == "info");
    if let Some(other) = expand.iter().find(|e| *e != "status" && *e != "info") {
        return Err(bad(format!("expand={other}: expected status or info")));
    }
    if status || info {
        return Ok(Json(runtime(&state).await?.expanded(status, info).await).into_response());
    }
    Ok(Json(runtime(&state).await?.names().await).into_response())
}

async fn create(State(state): State<Arc<AdminState>>, body: Bytes) -> Result<Response, ApiError> {
    let body = json_body(&body)?;
    let config = body
        .get("config")
        .ok_or_else(|| bad("the body needs a \"config\" object"))?;
    let props = properties(config)?;
    let name = match body.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(_) => return Err(bad("\"name\" must be a string")),
        None => props
            .get("name")
            .cloned()
            .ok_or_else(|| bad("the body needs a \"name\""))?,
    };
    if name.trim().is_empty() {
        return Err(bad("Connector name must not be empty"));
    }
    let info = runtime(&state).await?.create(&name, props).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn info(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.info(&name).await?).into_response())
}

async fn delete(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let runtime = runtime(&state).await?;
    // On a task of its own: a client that disconnects (or a forwarding broker's timeout)
    // drops this handler, and must not stop the delete between stopping the connector
    // and forgetting its status.
    tokio::spawn(async move { runtime.delete(&name).await })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

async fn config(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.config(&name).await?).into_response())
}

async fn put_config(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let props = properties(&json_body(&body)?)?;
    let (info, created) = runtime(&state).await?.put_config(&name, props).await?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(info)).into_response())
}

async fn status(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.status(&name, None).await?).into_response())
}

async fn target(state: &AdminState, name: &str, t: TargetState) -> Result<StatusCode, ApiError> {
    runtime(state).await?.set_target(name, t).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn pause(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    target(&state, &name, TargetState::Paused).await
}

async fn resume(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    target(&state, &name, TargetState::Started).await
}

/// KIP-875's stop answers 204, not pause's 202: Kafka Connect's `stopConnector` completes
/// once the target state is written and returns no body.
async fn stop(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    target(&state, &name, TargetState::Stopped).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let include_tasks = query_bool(&query, "includeTasks")?;
    let only_failed = query_bool(&query, "onlyFailed")?;
    let restarted = runtime(&state)
        .await?
        .restart(&name, include_tasks, only_failed)
        .await?;
    if !include_tasks && !only_failed {
        // Kafka Connect's plain restart: the connector only, no body.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let status = runtime(&state)
        .await?
        .status(&name, Some(restarted))
        .await?;
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

async fn tasks(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.tasks(&name).await?).into_response())
}

async fn task_status(
    State(state): State<Arc<AdminState>>,
    Path((name, task)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let task = task_id(&name, &task)?;
    Ok(Json(runtime(&state).await?.task_status(&name, task).await?).into_response())
}

async fn task_restart(
    State(state): State<Arc<AdminState>>,
    Path((name, task)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let task = task_id(&name, &task)?;
    runtime(&state).await?.restart_task(&name, task).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn task_id(name: &str, task: &str) -> Result<u32, ApiError> {
    task.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Task {name}-{task} not found"),
        )
    })
}

async fn offsets(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.offsets(&name).await?).into_response())
}

async fn reset_offsets(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(runtime(&state).await?.reset_offsets(&name).await?).into_response())
}

async fn alter_offsets(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = json_body(&body)?;
    Ok(Json(runtime(&state).await?.alter_offsets(&name, &body).await?).into_response())
}

async fn plugins() -> Json<Value> {
    Json(catalog::plugins_json())
}

async fn validate(
    State(state): State<Arc<AdminState>>,
    Path(plugin): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let props = properties(&json_body(&body)?)?;
    if let Some(class) = props.get("connector.class") {
        if class != &plugin {
            return Err(bad(format!(
                "Included connector type {class} does not match request type {plugin}"
            )));
        }
    }
    match runtime(&state).await?.validate(&plugin, &props).await {
        Some(infos) => Ok(Json(infos).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Connector plugin {plugin} not found"),
        )),
    }
}
