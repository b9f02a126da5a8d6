//! `GET /metrics`: the broker's metrics in Prometheus' text exposition format (0.0.4),
//! for a Prometheus scrape job pointed at the admin listener.
//!
//! The counters and histograms recorded by the hot paths come from the broker's
//! [`crate::metrics::Metrics`]; the gauges that describe state — each partition's log
//! start and end offsets and size, each group's lag per committed partition, each
//! connector's task states — are read from their owners here, at scrape time
//! ([`crate::metrics::Scrape`]), so appends pay nothing for them and a deleted topic,
//! group or connector leaves no stale series. Names and labels: `crate::metrics`.
//!
//! The collection runs on a blocking thread: reading a partition's offsets takes its log
//! lock, which a compaction may hold for a while.
//!
//! Errors: 500 (`{"error_code": 500, "message": ...}`) only if the collecting thread
//! fails.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{AdminState, ApiError};
use crate::connect::{ConnectorStatus, TaskState};
use crate::metrics::{Scrape, CONTENT_TYPE};

/// `GET /metrics`.
pub(crate) fn routes() -> Router<Arc<AdminState>> {
    Router::new().route("/metrics", get(scrape))
}

async fn scrape(State(state): State<Arc<AdminState>>) -> Response {
    let connectors = state
        .connect
        .current()
        .map(|runtime| runtime.statuses())
        .unwrap_or_default();
    let rendered = tokio::task::spawn_blocking(move || {
        let scrape = collect(&state, &connectors);
        state.metrics.render(scrape)
    })
    .await;
    match rendered {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("collecting metrics failed: {e}"),
        )
        .into_response(),
    }
}

/// Reads the scrape-time gauges from the owners.
fn collect(state: &AdminState, connectors: &BTreeMap<String, ConnectorStatus>) -> Scrape {
    let scrape = Scrape::new();
    scrape.log_open_files(crate::log::fdcache::stats());
    let mut high_watermarks: HashMap<(String, i32), i64> = HashMap::new();
    for p in state.replicas.partitions() {
        scrape.partition(&p.topic, p.index, p.log_gauges());
        high_watermarks.insert((p.topic.clone(), p.index), p.high_watermark());
    }
    let groups = &state.groups;
    for group in groups.list() {
        for (topic, partitions) in groups.fetch_offsets(&group.group_id, None) {
            for (index, committed) in partitions {
                let (Some(committed), Some(hw)) =
                    (committed, high_watermarks.get(&(topic.clone(), index)))
                else {
                    continue;
                };
                // A committed offset past the high watermark (the log was truncated or
                // deleted and recreated) is no lag.
                let lag = (hw - committed.offset).max(0);
                scrape.group_lag(&group.group_id, &topic, index, lag);
            }
        }
    }
    // weir runs one task per connector: its state is the task's.
    for (name, status) in connectors {
        for s in TaskState::ALL {
            scrape.connector_tasks(name, s.name(), u32::from(status.state == s));
        }
    }
    scrape
}
