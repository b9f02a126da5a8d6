//! `weir group describe`: Kafka's three views of a group (`kafka-consumer-groups.sh
//! --describe`, `--members`, `--state`).
//!
//! Which partitions the offsets view shows: those assigned to a member (decoded from the
//! member's ConsumerProtocolAssignment in DescribeGroups) and every partition of every
//! non-internal topic with a committed offset (OffsetFetch for all of them, keeping the
//! ones at 0 or above), so an empty group still shows what it committed.
//!
//! A group of the consumer protocol (KIP-848) is described with ConsumerGroupDescribe
//! (key 69) at its coordinator (FindCoordinator first) instead of DescribeGroups, which
//! does not describe such groups: `--members` then adds each member's EPOCH, ASSIGNMENT
//! and TARGET-ASSIGNMENT, `--state` the GROUP-EPOCH and TARGET-ASSIGNMENT-EPOCH, as
//! `kafka-consumer-groups.sh --verbose` does for them.
//!
//! COORDINATOR in `--state`: rdkafka 0.39 exposes neither FindCoordinator nor the broker
//! that answered DescribeGroups, so it is the cluster's only broker, or `-` when the
//! cluster has several.

use std::collections::BTreeMap;

use anyhow::Context as _;
use clap::Args;
use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup;
use kafka_protocol::messages::{ApiKey, ConsumerGroupDescribeRequest, GroupId};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::groups::GroupInfo;
use rdkafka::metadata::Metadata;
use rdkafka::{Offset, TopicPartitionList};

use super::{
    all_partitions, consumer, does_not_exist, fetch_groups, find_live_group, note_state, table,
    write_stdout, GROUP_REQUEST_TIMEOUT,
};
use crate::cli::client::{CliContext, KafkaErrorText};
use crate::cli::wire::{connect_coordinator, error_text, version_of, Conn};
use crate::cli::ClientArgs;

/// `weir group describe` options.
#[derive(Debug, Args)]
pub(crate) struct DescribeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Group id.
    pub group: String,
    /// One row per member: GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS.
    #[arg(long, conflicts_with = "state")]
    pub members: bool,
    /// One row for the group: GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS.
    #[arg(long)]
    pub state: bool,
}

/// A partition: topic and partition id.
type TopicPartition = (String, i32);

/// Who a partition is assigned to, for the offsets view.
#[derive(Debug, Clone)]
struct Owner {
    consumer_id: String,
    host: String,
    client_id: String,
}

/// Runs `weir group describe`.
///
/// Errors: the group does not exist (`Consumer group 'X' does not exist.`); the broker's
/// error for OffsetFetch; a broker that cannot be reached. A log end offset that cannot be
/// read is `-` (LAG too), with a warning on stderr.
pub(super) fn run(args: DescribeArgs) -> anyhow::Result<()> {
    let group = args.group.as_str();
    let (consumer, metadata) = consumer(&args.client, Some(group))?;
    if let Some(d) = describe_consumer_group(&args.client.bootstrap_server, group)? {
        note_state(group, d.group_state.as_str());
        let text = if args.state {
            consumer_state_view(&d, &metadata)
        } else if args.members {
            consumer_members_view(&d)
        } else {
            let mut owners: BTreeMap<TopicPartition, Owner> = BTreeMap::new();
            for m in &d.members {
                let owner = Owner {
                    consumer_id: m.member_id.to_string(),
                    host: m.client_host.to_string(),
                    client_id: m.client_id.to_string(),
                };
                for t in &m.assignment.topic_partitions {
                    for p in &t.partitions {
                        owners.insert((t.topic_name.0.to_string(), *p), owner.clone());
                    }
                }
            }
            offsets_view(&consumer, group, owners, &metadata)?
        };
        return write_stdout(&text);
    }
    let groups = fetch_groups(&consumer, Some(group))?;
    let info = find_live_group(&groups, group).ok_or_else(|| does_not_exist(group))?;
    note_state(group, info.state());
    let text = if args.state {
        state_view(info, &metadata)
    } else if args.members {
        members_view(info)
    } else {
        offsets_view(&consumer, info.name(), owners_of(info), &metadata)?
    };
    write_stdout(&text)
}

/// ConsumerGroupDescribe of `group` at its coordinator; `None` when the group is not a
/// consumer-protocol one (or does not exist, or the broker predates KIP-848): the
/// classic path describes it then.
///
/// Errors: no broker reachable; FindCoordinator or ConsumerGroupDescribe failing with
/// another error than GROUP_ID_NOT_FOUND (the broker's error and message).
pub(super) fn describe_consumer_group(
    bootstrap: &str,
    group: &str,
) -> anyhow::Result<Option<DescribedGroup>> {
    let (mut conn, versions) = Conn::bootstrap(bootstrap)?;
    if version_of(&versions, ApiKey::ConsumerGroupDescribe, 0).is_none() {
        return Ok(None);
    }
    let (_, mut conn, versions) = connect_coordinator(&mut conn, &versions, group, 0)?;
    let Some(version) = version_of(&versions, ApiKey::ConsumerGroupDescribe, 0) else {
        return Ok(None);
    };
    let response = conn.call(
        &ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![GroupId(StrBytes::from_string(group.to_string()))]),
        version,
    )?;
    let d = response
        .groups
        .into_iter()
        .next()
        .context("ConsumerGroupDescribe answered no group")?;
    if d.error_code == kafka_protocol::ResponseError::GroupIdNotFound.code() {
        return Ok(None);
    }
    anyhow::ensure!(
        d.error_code == 0,
        "ConsumerGroupDescribe of {group}: {}",
        error_text(d.error_code, d.error_message.as_ref())
    );
    Ok(Some(d))
}

/// `topic:p,p;topic:p` for an assignment (Kafka's verbose members view), `-` when empty.
fn assignment_text(
    a: &kafka_protocol::messages::consumer_group_describe_response::Assignment,
) -> String {
    let parts: Vec<String> = a
        .topic_partitions
        .iter()
        .filter(|t| !t.partitions.is_empty())
        .map(|t| {
            let mut p = t.partitions.clone();
            p.sort_unstable();
            let p: Vec<String> = p.iter().map(i32::to_string).collect();
            format!("{}:{}", t.topic_name.0, p.join(","))
        })
        .collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(";")
    }
}

fn consumer_state_view(d: &DescribedGroup, metadata: &Metadata) -> String {
    let coordinator = match metadata.brokers() {
        [only] => format!("{}:{}  ({})", only.host(), only.port(), only.id()),
        _ => "-".to_string(),
    };
    let rows = vec![vec![
        d.group_id.0.to_string(),
        coordinator,
        d.assignor_name.to_string(),
        d.group_state.to_string(),
        d.group_epoch.to_string(),
        d.assignment_epoch.to_string(),
        d.members.len().to_string(),
    ]];
    table(
        &[
            "GROUP",
            "COORDINATOR (ID)",
            "ASSIGNMENT-STRATEGY",
            "STATE",
            "GROUP-EPOCH",
            "TARGET-ASSIGNMENT-EPOCH",
            "#MEMBERS",
        ],
        &rows,
        &[15, 25, 20, 20, 12, 24, 0],
    )
}

fn consumer_members_view(d: &DescribedGroup) -> String {
    let rows: Vec<Vec<String>> = d
        .members
        .iter()
        .map(|m| {
            let partitions: usize = m
                .assignment
                .topic_partitions
                .iter()
                .map(|t| t.partitions.len())
                .sum();
            vec![
                d.group_id.0.to_string(),
                m.member_id.to_string(),
                m.instance_id
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |i| i.to_string()),
                m.client_host.to_string(),
                m.client_id.to_string(),
                partitions.to_string(),
                m.member_epoch.to_string(),
                assignment_text(&m.assignment),
                assignment_text(&m.target_assignment),
            ]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    table(
        &[
            "GROUP",
            "CONSUMER-ID",
            "GROUP-INSTANCE-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "EPOCH",
            "ASSIGNMENT",
            "TARGET-ASSIGNMENT",
        ],
        &rows,
        &[15, 15, 17, 15, 15, 11, 5, 15, 0],
    )
}

/// Who each assigned partition belongs to, from the classic members' assignments.
fn owners_of(info: &GroupInfo) -> BTreeMap<TopicPartition, Owner> {
    let mut owners: BTreeMap<TopicPartition, Owner> = BTreeMap::new();
    for m in info.members() {
        let owner = Owner {
            consumer_id: m.id().to_string(),
            host: m.client_host().to_string(),
            client_id: m.client_id().to_string(),
        };
        for (topic, partitions) in m
            .assignment()
            .and_then(parse_assignment)
            .unwrap_or_default()
        {
            for p in partitions {
                owners.insert((topic.clone(), p), owner.clone());
            }
        }
    }
    owners
}

fn state_view(info: &GroupInfo, metadata: &Metadata) -> String {
    let coordinator = match metadata.brokers() {
        [only] => format!("{}:{}  ({})", only.host(), only.port(), only.id()),
        _ => "-".to_string(),
    };
    let rows = vec![vec![
        info.name().to_string(),
        coordinator,
        info.protocol().to_string(),
        info.state().to_string(),
        info.members().len().to_string(),
    ]];
    table(
        &[
            "GROUP",
            "COORDINATOR (ID)",
            "ASSIGNMENT-STRATEGY",
            "STATE",
            "#MEMBERS",
        ],
        &rows,
        &[15, 25, 20, 20, 0],
    )
}

fn members_view(info: &GroupInfo) -> String {
    let rows: Vec<Vec<String>> = info
        .members()
        .iter()
        .map(|m| {
            let partitions: usize = m
                .assignment()
                .and_then(parse_assignment)
                .map_or(0, |topics| topics.iter().map(|(_, p)| p.len()).sum());
            vec![
                info.name().to_string(),
                m.id().to_string(),
                m.client_host().to_string(),
                m.client_id().to_string(),
                partitions.to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        // As Kafka: no table for a group without members (the note said so).
        return String::new();
    }
    table(
        &["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"],
        &rows,
        &[15, 15, 15, 15, 0],
    )
}

fn offsets_view(
    consumer: &BaseConsumer<CliContext>,
    group: &str,
    owners: BTreeMap<TopicPartition, Owner>,
    metadata: &Metadata,
) -> anyhow::Result<String> {
    let mut asked: Vec<TopicPartition> = all_partitions(metadata);
    asked.extend(owners.keys().cloned());
    asked.sort();
    asked.dedup();
    let committed = committed_offsets(consumer, &asked)?;

    let mut rows = Vec::new();
    for tp in asked {
        let offset = committed.get(&tp).copied();
        let owner = owners.get(&tp);
        if offset.is_none() && owner.is_none() {
            continue;
        }
        // A partition whose log end cannot be read (its topic deleted since it was
        // committed, say) still shows its committed offset, as Kafka shows it.
        let log_end = match consumer.fetch_watermarks(&tp.0, tp.1, GROUP_REQUEST_TIMEOUT) {
            Ok((_, high)) => Some(high),
            Err(e) => {
                eprintln!(
                    "weir: warning: log end offset of {}-{}: {}",
                    tp.0,
                    tp.1,
                    consumer.context().explain(&e)
                );
                None
            }
        };
        let dash = || "-".to_string();
        rows.push(vec![
            group.to_string(),
            tp.0.clone(),
            tp.1.to_string(),
            offset.map_or_else(dash, |o| o.to_string()),
            log_end.map_or_else(dash, |e| e.to_string()),
            match (offset, log_end) {
                (Some(o), Some(e)) => (e - o).max(0).to_string(),
                _ => dash(),
            },
            owner.map_or_else(dash, |o| o.consumer_id.clone()),
            owner.map_or_else(dash, |o| o.host.clone()),
            owner.map_or_else(dash, |o| o.client_id.clone()),
        ]);
    }
    if rows.is_empty() {
        return Ok(String::new());
    }
    Ok(table(
        &[
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        ],
        &rows,
        &[15, 15, 10, 15, 15, 15, 15, 15, 0],
    ))
}

/// OffsetFetch for `partitions` through `consumer`'s `group.id`: the committed offset of
/// each partition that has one (0 or above).
pub(super) fn committed_offsets(
    consumer: &BaseConsumer<CliContext>,
    partitions: &[TopicPartition],
) -> anyhow::Result<BTreeMap<TopicPartition, i64>> {
    if partitions.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, p) in partitions {
        tpl.add_partition(topic, *p);
    }
    let fetched = consumer
        .committed_offsets(tpl, GROUP_REQUEST_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("committed offsets: {}", consumer.context().explain(&e)))?;
    let mut out = BTreeMap::new();
    for elem in fetched.elements() {
        if let Err(e) = elem.error() {
            anyhow::bail!(
                "committed offset of {}-{}: {}",
                elem.topic(),
                elem.partition(),
                KafkaErrorText(&e)
            );
        }
        if let Offset::Offset(o) = elem.offset() {
            if o >= 0 {
                out.insert((elem.topic().to_string(), elem.partition()), o);
            }
        }
    }
    Ok(out)
}

/// Decodes a ConsumerProtocolAssignment (any version: v0–v3 share the prefix read here):
/// int16 version, int32 topic count, per topic an int16-length string and an int32 count
/// of int32 partitions; user data after that is ignored. `None` when the bytes are not
/// such an assignment (a member of a group that is not a consumer group, or truncated
/// bytes); counts are checked against the bytes left before anything is allocated.
pub(super) fn parse_assignment(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let topics = r.count(2 + 4)?;
    let mut out = Vec::with_capacity(topics);
    for _ in 0..topics {
        let name_len = usize::try_from(r.i16()?).ok()?;
        let name = String::from_utf8(r.take(name_len)?.to_vec()).ok()?;
        let partitions = r.count(4)?;
        let mut ids = Vec::with_capacity(partitions);
        for _ in 0..partitions {
            ids.push(r.i32()?);
        }
        out.push((name, ids));
    }
    Some(out)
}

/// A cursor over big-endian Kafka wire bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// An int32 element count; `None` if negative or if that many elements of at least
    /// `min_element_bytes` each cannot fit in the bytes left.
    fn count(&mut self, min_element_bytes: usize) -> Option<usize> {
        let n = usize::try_from(self.i32()?).ok()?;
        (n.checked_mul(min_element_bytes)? <= self.0.len()).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
        for (name, parts) in topics {
            b.extend_from_slice(&(name.len() as i16).to_be_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&(parts.len() as i32).to_be_bytes());
            for p in *parts {
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        b.extend_from_slice(&(-1i32).to_be_bytes()); // null user data
        b
    }

    #[test]
    fn assignments_decode() {
        let bytes = assignment(&[("orders", &[0, 2]), ("audit", &[1])]);
        assert_eq!(
            parse_assignment(&bytes),
            Some(vec![
                ("orders".to_string(), vec![0, 2]),
                ("audit".to_string(), vec![1])
            ])
        );
        assert_eq!(parse_assignment(&assignment(&[])), Some(vec![]));
    }

    #[test]
    fn bad_assignments_are_refused_without_allocating() {
        let bytes = assignment(&[("orders", &[0, 2])]);
        for cut in 0..bytes.len() - 4 {
            assert_eq!(parse_assignment(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut huge = Vec::new();
        huge.extend_from_slice(&0i16.to_be_bytes());
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(parse_assignment(&huge), None);
        let mut negative = Vec::new();
        negative.extend_from_slice(&0i16.to_be_bytes());
        negative.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(parse_assignment(&negative), None);
        assert_eq!(parse_assignment(b""), None);
    }
}
