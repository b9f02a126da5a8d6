//! A sink task: read the subscribed topics from the group `connect-<name>`'s committed
//! offsets → `put` → every `offset.flush.interval.ms` (and at stop) `flush` → commit.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::records::RecordBatchDecoder;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Deps, Progress, TaskError};
use crate::connect::config::{ConnectorConfig, ErrorTolerance};
use crate::connect::smt::{Chain, ChainRecord};
use crate::group::{CommitRequest, OffsetToCommit};
use crate::log::LogError;
use crate::plugin::{Header, Record, SinkConnector, SinkRecord, TopicOffset};

/// Most bytes read from one partition per read.
const READ_BYTES: usize = 1 << 20;

/// How often a sink whose topics do not exist yet looks again.
const TOPIC_WAIT_MS: u64 = 500;

/// The consumer group holding a sink's progress.
pub fn group_id(connector: &str) -> String {
    format!("connect-{connector}")
}

/// Runs one attempt of the task until `shutdown` (Ok) or a failure (Err).
///
/// The at-least-once window: offsets are committed only after `flush`, so a crash puts
/// again what was put since the last flush (at most `offset.flush.interval.ms` of
/// records). A graceful stop flushes and commits first: no duplicates.
pub(super) async fn run(
    c: &ConnectorConfig,
    deps: &Deps,
    progress: &mut Progress,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), TaskError> {
    let mut partitions: Vec<(String, i32)> = Vec::new();
    for topic in &c.topics {
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            if let Some(meta) = deps.ctx.metadata.topic(topic) {
                partitions.extend((0..meta.partitions).map(|p| (topic.clone(), p)));
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(TOPIC_WAIT_MS)) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    let group = group_id(&c.name);
    let mut positions: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (topic, p) in &partitions {
        let committed = deps
            .ctx
            .groups
            .fetch_offsets(&group, Some(&[(topic.clone(), vec![*p])]))
            .into_iter()
            .flat_map(|(_, parts)| parts)
            .find_map(|(_, c)| c.map(|c| c.offset));
        let start = match committed {
            Some(o) => o,
            // Kafka Connect's sink consumers default to auto.offset.reset=earliest.
            None => deps
                .ctx
                .replicas
                .partition(topic, *p)
                .map(|part| part.with_log(|l| l.log_start_offset()))
                .unwrap_or(0),
        };
        positions.insert((topic.clone(), *p), start);
    }
    let path = c.component_path(&deps.plugin_path);
    let mut task = deps
        .plugins
        .load_sink_connector(&path, &c.file_grants(true))
        .await?;
    let mut chain = Chain::load(&deps.plugins, &c.transforms).await?;
    task.open(&c.pairs, &partitions).await?;
    deps.set_running(c);
    let flush_every = Duration::from_millis(c.offset_flush_interval_ms);
    let mut next_flush = Instant::now() + flush_every;
    let mut committed = positions.clone();
    loop {
        let mut ticket = deps.ctx.replicas.purgatory().ticket();
        let batch = read_batch(deps, &mut positions, c.batch_size as usize)?;
        let read_some = !batch.is_empty();
        let batch = prepare(c, &mut chain, batch).await?;
        if !batch.is_empty() {
            task.put(&batch).await?;
        }
        if read_some {
            progress.made();
        }
        let stopping = *shutdown.borrow();
        if stopping || Instant::now() >= next_flush {
            if positions != committed {
                flush_and_commit(&mut task, deps, &group, &positions).await?;
                committed = positions.clone();
            }
            next_flush = Instant::now() + flush_every;
        }
        if stopping {
            break;
        }
        if !read_some {
            tokio::select! {
                _ = ticket.changed() => {}
                _ = tokio::time::sleep_until(next_flush) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    task.close().await?;
    Ok(())
}

async fn flush_and_commit(
    task: &mut SinkConnector,
    deps: &Deps,
    group: &str,
    positions: &BTreeMap<(String, i32), i64>,
) -> Result<(), TaskError> {
    let offsets: Vec<TopicOffset> = positions
        .iter()
        .map(|((topic, partition), offset)| TopicOffset {
            topic: topic.clone(),
            partition: *partition,
            offset: *offset,
        })
        .collect();
    task.flush(&offsets).await?;
    let request = CommitRequest {
        group_id: group.to_string(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: offsets
            .iter()
            .map(|o| OffsetToCommit {
                topic: o.topic.clone(),
                partition: o.partition,
                offset: o.offset,
                leader_epoch: -1,
                metadata: None,
            })
            .collect(),
    };
    let errors = deps.ctx.groups.commit(&request);
    if let Some(e) = errors.into_iter().flatten().next() {
        return Err(TaskError::Runtime(format!(
            "committing the offsets of group {group}: Kafka error {e:?} (is a client using that group?)"
        )));
    }
    Ok(())
}

/// Converts each record's key and value for the connector (`key.converter`,
/// `value.converter`), then runs the `transforms` chain. A record that fails either
/// fails the task under `errors.tolerance=none`; under `all` it is skipped with a log
/// line (its offset is still committed: it was handled).
async fn prepare(
    c: &ConnectorConfig,
    chain: &mut Chain,
    batch: Vec<SinkRecord>,
) -> Result<Vec<SinkRecord>, TaskError> {
    let skip = c.errors_tolerance == ErrorTolerance::All;
    let mut converted = Vec::with_capacity(batch.len());
    for mut r in batch {
        let result = c
            .key_converter
            .from_topic("key", r.record.key.take())
            .and_then(|k| {
                r.record.key = k;
                c.value_converter.from_topic("value", r.record.value.take())
            });
        match result {
            Ok(v) => {
                r.record.value = v;
                converted.push(r);
            }
            Err(e) => {
                let located = format!("{}-{} at offset {}: {e}", r.topic, r.partition, r.offset);
                if !skip {
                    return Err(TaskError::Runtime(located));
                }
                tracing::warn!(connector = %c.name, error = %located, "record skipped (errors.tolerance=all)");
            }
        }
    }
    if chain.is_empty() || converted.is_empty() {
        return Ok(converted);
    }
    let items: Vec<ChainRecord> = converted
        .iter()
        .enumerate()
        .map(|(i, r)| (i, r.topic.clone(), r.record.clone()))
        .collect();
    let (out, failed) = chain.apply(-1, items, skip).await?;
    for (i, reason) in failed {
        let r = &converted[i];
        tracing::warn!(connector = %c.name, topic = %r.topic, partition = r.partition, offset = r.offset, error = %reason, "record skipped (errors.tolerance=all)");
    }
    Ok(out
        .into_iter()
        .map(|(i, topic, record)| SinkRecord {
            record,
            topic,
            partition: converted[i].partition,
            offset: converted[i].offset,
        })
        .collect())
}

/// Up to `max` records from the partitions, each from its position, advancing them.
fn read_batch(
    deps: &Deps,
    positions: &mut BTreeMap<(String, i32), i64>,
    max: usize,
) -> Result<Vec<SinkRecord>, TaskError> {
    let mut out = Vec::new();
    for ((topic, p), position) in positions.iter_mut() {
        if out.len() >= max {
            break;
        }
        let Some(partition) = deps.ctx.replicas.partition(topic, *p) else {
            continue;
        };
        let read = partition.with_log(|l| {
            let hw = l.log_end_offset();
            match l.read(*position, READ_BYTES, hw) {
                Err(LogError::OffsetOutOfRange { log_start_offset, .. }) if *position < log_start_offset => {
                    tracing::warn!(topic = %topic, partition = p, from = *position, to = log_start_offset, "sink position below the log start (deleted by retention); skipping ahead");
                    *position = log_start_offset;
                    l.read(*position, READ_BYTES, hw)
                }
                other => other,
            }
        });
        let read = read
            .map_err(|e| TaskError::Runtime(format!("reading {topic}-{p} at {position}: {e}")))?;
        if read.bytes.is_empty() {
            continue;
        }
        let mut bytes = read.bytes;
        let sets = RecordBatchDecoder::decode_all(&mut bytes)
            .map_err(|e| TaskError::Runtime(format!("decoding {topic}-{p} at {position}: {e}")))?;
        'sets: for set in sets {
            for r in set.records {
                if r.offset < *position || r.control || r.transactional {
                    continue;
                }
                if out.len() >= max {
                    break 'sets;
                }
                *position = r.offset + 1;
                out.push(SinkRecord {
                    record: Record {
                        key: r.key,
                        value: r.value,
                        headers: r
                            .headers
                            .into_iter()
                            .map(|(k, v)| Header {
                                key: k.to_string(),
                                value: v,
                            })
                            .collect(),
                        timestamp_ms: r.timestamp,
                    },
                    topic: topic.clone(),
                    partition: *p,
                    offset: r.offset,
                });
            }
        }
    }
    Ok(out)
}
