//! `weir group reset-offsets`: compute new committed offsets for a group and print them
//! (`--dry-run`) or commit them (`--execute`), as `kafka-consumer-groups.sh
//! --reset-offsets` does.
//!
//! Refused while the group has members (any state but Empty or Dead): their commits would
//! overwrite the reset, and the broker only takes a member-less commit (generation -1)
//! from an empty group. New offsets are clamped into [log start, log end] of each
//! partition, with a note on stderr, as Kafka does. `--execute` commits with OffsetCommit
//! from a consumer that carries the `group.id` but never joins, then reads the offsets
//! back: they must be what was committed.

use std::collections::BTreeMap;

use clap::Args;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::Metadata;
use rdkafka::{Offset, TopicPartitionList};

use super::describe::committed_offsets;
use super::{consumer, fetch_groups, table, write_stdout, GROUP_REQUEST_TIMEOUT};
use crate::cli::client::{self, CliContext, KafkaErrorText};
use crate::cli::ClientArgs;

/// `weir group reset-offsets` options. Exactly one way to compute the offsets and exactly
/// one of --dry-run/--execute.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("reset-spec")
        .required(true)
        .args(["to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by"])
))]
#[command(group(
    clap::ArgGroup::new("mode")
        .required(true)
        .args(["dry_run", "execute"])
))]
pub(crate) struct ResetArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Group id.
    pub group: String,
    /// Topic to reset: `TOPIC` (every partition) or `TOPIC:P,P` (these partitions);
    /// repeatable.
    #[arg(long = "topic", value_name = "TOPIC[:P,P]", required = true, value_parser = parse_topic)]
    pub topics: Vec<TopicSpec>,
    /// Reset to the log start offset.
    #[arg(long = "to-earliest")]
    pub to_earliest: bool,
    /// Reset to the log end offset.
    #[arg(long = "to-latest")]
    pub to_latest: bool,
    /// Reset to this offset (clamped into the partition's range).
    #[arg(
        long = "to-offset",
        value_name = "OFFSET",
        allow_negative_numbers = true
    )]
    pub to_offset: Option<i64>,
    /// Reset to the first offset whose timestamp is at or after this time (the log end if
    /// none): YYYY-MM-DDTHH:mm:SS[.sss] followed by `Z`, `+hh:mm` or `-hh:mm`; without a
    /// zone the time is UTC (Kafka's tool takes the local zone then).
    #[arg(long = "to-datetime", value_name = "DATETIME", value_parser = parse_datetime_ms)]
    pub to_datetime: Option<i64>,
    /// Move the committed offset by N (negative: back), clamped into the partition's
    /// range; every partition must have a committed offset.
    #[arg(long = "shift-by", value_name = "N", allow_negative_numbers = true)]
    pub shift_by: Option<i64>,
    /// Print the new offsets without committing them.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Commit the new offsets.
    #[arg(long)]
    pub execute: bool,
}

/// A `--topic` value: a topic and, optionally, some of its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicSpec {
    /// Topic name.
    pub topic: String,
    /// Partitions to reset; every partition when `None`.
    pub partitions: Option<Vec<i32>>,
}

/// How the new offset of each partition is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    /// Milliseconds since the Unix epoch.
    Datetime(i64),
    ShiftBy(i64),
}

fn parse_topic(s: &str) -> Result<TopicSpec, String> {
    let (topic, partitions) = match s.split_once(':') {
        None => (s, None),
        Some((topic, list)) => {
            let ids = list
                .split(',')
                .map(|p| match p.trim().parse::<i32>() {
                    Ok(id) if id >= 0 => Ok(id),
                    _ => Err(format!("bad partition '{p}' in '{s}'")),
                })
                .collect::<Result<Vec<i32>, String>>()?;
            (topic, Some(ids))
        }
    };
    if topic.is_empty() {
        return Err(format!("no topic name in '{s}'"));
    }
    Ok(TopicSpec {
        topic: topic.to_string(),
        partitions,
    })
}

/// Parses `YYYY-MM-DDTHH:mm:SS[.fraction][Z|+hh:mm|-hh:mm|+hhmm|-hhmm]` (Kafka's
/// `--to-datetime` format, offset optional) into milliseconds since the Unix epoch; no
/// zone means UTC. Digits of the fraction past milliseconds are dropped. The shape is
/// checked here (a date, `T`, hours, minutes and seconds); `jiff` does the calendar.
fn parse_datetime_ms(s: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "expected a date-time like 2026-11-29T12:00:00.000 (optionally Z or +hh:mm), got '{s}'"
        )
    };
    let b = s.as_bytes();
    if b.len() < 19 || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let ts = match s.parse::<jiff::Timestamp>() {
        Ok(ts) => ts,
        Err(_) => {
            let civil: jiff::civil::DateTime = s.parse().map_err(|_| bad())?;
            jiff::tz::Offset::UTC
                .to_timestamp(civil)
                .map_err(|_| bad())?
        }
    };
    Ok(ts.as_millisecond())
}

/// Runs `weir group reset-offsets`.
///
/// Errors: the group has members (Kafka's "Assignments can only be reset if the group 'X'
/// is inactive, but the current state is S."); an unknown topic or partition
/// (`UNKNOWN_TOPIC_OR_PARTITION`); `--shift-by` on a partition with no committed offset;
/// the broker's error for ListOffsets, OffsetFetch or OffsetCommit; offsets read back after
/// the commit that differ from the plan.
pub(super) fn run(args: ResetArgs) -> anyhow::Result<()> {
    let target = match (
        args.to_earliest,
        args.to_latest,
        args.to_offset,
        args.to_datetime,
        args.shift_by,
    ) {
        (true, ..) => Target::Earliest,
        (_, true, ..) => Target::Latest,
        (_, _, Some(n), ..) => Target::Offset(n),
        (_, _, _, Some(ms), _) => Target::Datetime(ms),
        (.., Some(n)) => Target::ShiftBy(n),
        _ => anyhow::bail!(
            "one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by is required"
        ),
    };
    let group = args.group.as_str();
    let (consumer, metadata) = consumer(&args.client, Some(group))?;
    let groups = fetch_groups(&consumer, Some(group))?;
    if let Some(info) = groups.groups().iter().find(|g| g.name() == group) {
        if !matches!(info.state(), "Empty" | "Dead") {
            anyhow::bail!(
                "Assignments can only be reset if the group '{group}' is inactive, but the \
                 current state is {}.",
                info.state()
            );
        }
    }
    // DescribeGroups answers Dead for a consumer-protocol group (KIP-848): its members
    // are in ConsumerGroupDescribe.
    if let Some(d) = super::describe::describe_consumer_group(&args.client.bootstrap_server, group)?
    {
        if !d.members.is_empty() {
            anyhow::bail!(
                "Assignments can only be reset if the group '{group}' is inactive, but the \
                 current state is {}.",
                d.group_state.as_str()
            );
        }
    }
    let partitions = partitions_to_reset(&metadata, &args.topics)?;
    let plan = plan(&consumer, &partitions, target)?;

    let rows: Vec<Vec<String>> = plan
        .iter()
        .map(|((topic, p), offset)| {
            vec![
                group.to_string(),
                topic.clone(),
                p.to_string(),
                offset.to_string(),
            ]
        })
        .collect();
    if args.execute {
        commit(&consumer, &plan)?;
    }
    write_stdout(&table(
        &["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        &rows,
        &[30, 30, 10, 0],
    ))
}

/// The partitions `--topic` names, checked against the cluster's metadata.
fn partitions_to_reset(
    metadata: &Metadata,
    specs: &[TopicSpec],
) -> anyhow::Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    for spec in specs {
        let topic = client::find_topic(metadata, &spec.topic)?;
        let mut existing: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        existing.sort_unstable();
        let chosen = match &spec.partitions {
            None => existing,
            Some(wanted) => {
                for p in wanted {
                    if !existing.contains(p) {
                        anyhow::bail!(
                            "partition {p} of topic '{}': {}",
                            spec.topic,
                            client::code_text(RDKafkaErrorCode::UnknownTopicOrPartition)
                        );
                    }
                }
                wanted.clone()
            }
        };
        out.extend(chosen.into_iter().map(|p| (spec.topic.clone(), p)));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The new offset of each partition, clamped into [log start, log end].
fn plan(
    consumer: &BaseConsumer<CliContext>,
    partitions: &[(String, i32)],
    target: Target,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let committed = match target {
        Target::ShiftBy(_) => committed_offsets(consumer, partitions)?,
        Target::Earliest | Target::Latest | Target::Offset(_) | Target::Datetime(_) => {
            BTreeMap::new()
        }
    };
    let by_time = match target {
        Target::Datetime(ms) => offsets_for_time(consumer, partitions, ms)?,
        Target::Earliest | Target::Latest | Target::Offset(_) | Target::ShiftBy(_) => {
            BTreeMap::new()
        }
    };
    let mut plan = BTreeMap::new();
    for tp in partitions {
        let (topic, p) = (tp.0.as_str(), tp.1);
        let (log_start, log_end) = consumer
            .fetch_watermarks(topic, p, GROUP_REQUEST_TIMEOUT)
            .map_err(|e| {
                anyhow::anyhow!("offsets of {topic}-{p}: {}", consumer.context().explain(&e))
            })?;
        let wanted = match target {
            Target::Earliest => log_start,
            Target::Latest => log_end,
            Target::Offset(n) => n,
            Target::Datetime(_) => by_time.get(tp).copied().unwrap_or(log_end),
            Target::ShiftBy(n) => match committed.get(tp) {
                Some(current) => current.saturating_add(n),
                None => anyhow::bail!(
                    "Cannot shift offset for partition {topic}-{p} since there is no current \
                     committed offset"
                ),
            },
        };
        let offset = if wanted < log_start {
            eprintln!(
                "New offset ({wanted}) is lower than earliest offset for topic partition \
                 {topic}-{p}. Value will be set to {log_start}"
            );
            log_start
        } else if wanted > log_end {
            eprintln!(
                "New offset ({wanted}) is higher than latest offset for topic partition \
                 {topic}-{p}. Value will be set to {log_end}"
            );
            log_end
        } else {
            wanted
        };
        plan.insert(tp.clone(), offset);
    }
    Ok(plan)
}

/// ListOffsets by timestamp: per partition, the first offset at or after `timestamp_ms`;
/// absent when no record is that recent.
fn offsets_for_time(
    consumer: &BaseConsumer<CliContext>,
    partitions: &[(String, i32)],
    timestamp_ms: i64,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, p) in partitions {
        tpl.add_partition_offset(topic, *p, Offset::Offset(timestamp_ms))
            .map_err(|e| anyhow::anyhow!("{topic}-{p}: {}", KafkaErrorText(&e)))?;
    }
    let found = consumer
        .offsets_for_times(tpl, GROUP_REQUEST_TIMEOUT)
        .map_err(|e| {
            anyhow::anyhow!(
                "offsets for time {timestamp_ms}: {}",
                consumer.context().explain(&e)
            )
        })?;
    let mut out = BTreeMap::new();
    for elem in found.elements() {
        if let Err(e) = elem.error() {
            anyhow::bail!(
                "offset for time of {}-{}: {}",
                elem.topic(),
                elem.partition(),
                KafkaErrorText(&e)
            );
        }
        if let Offset::Offset(o) = elem.offset() {
            out.insert((elem.topic().to_string(), elem.partition()), o);
        }
    }
    Ok(out)
}

/// Commits `plan` (OffsetCommit, generation -1) and reads it back.
fn commit(
    consumer: &BaseConsumer<CliContext>,
    plan: &BTreeMap<(String, i32), i64>,
) -> anyhow::Result<()> {
    let mut tpl = TopicPartitionList::with_capacity(plan.len());
    for ((topic, p), offset) in plan {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*offset))
            .map_err(|e| anyhow::anyhow!("{topic}-{p}: {}", KafkaErrorText(&e)))?;
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(|e| anyhow::anyhow!("commit offsets: {}", consumer.context().explain(&e)))?;
    let partitions: Vec<(String, i32)> = plan.keys().cloned().collect();
    let stored = committed_offsets(consumer, &partitions)?;
    if &stored != plan {
        anyhow::bail!(
            "commit offsets: the broker kept {stored:?} instead of {plan:?} (did a consumer \
             join the group meanwhile?)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_parse() {
        assert_eq!(
            parse_topic("orders"),
            Ok(TopicSpec {
                topic: "orders".to_string(),
                partitions: None
            })
        );
        assert_eq!(
            parse_topic("orders:0,2"),
            Ok(TopicSpec {
                topic: "orders".to_string(),
                partitions: Some(vec![0, 2])
            })
        );
        assert!(parse_topic("orders:").is_err());
        assert!(parse_topic("orders:x").is_err());
        assert!(parse_topic(":1").is_err());
    }

    #[test]
    fn datetimes_parse_as_kafka_writes_them() {
        assert_eq!(parse_datetime_ms("1970-01-01T00:00:00.000"), Ok(0));
        assert_eq!(parse_datetime_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_datetime_ms("2026-11-29T12:00:00.000+01:00"),
            Ok(1_795_950_000_000)
        );
        assert_eq!(
            parse_datetime_ms("2026-11-29T11:00:00.000"),
            Ok(1_795_950_000_000)
        );
        assert_eq!(
            parse_datetime_ms("2000-02-29T23:59:59.123Z"),
            Ok(951_868_799_123)
        );
        assert_eq!(
            parse_datetime_ms("2000-02-29T23:59:59.1234567Z"),
            Ok(951_868_799_123)
        );
        assert_eq!(
            parse_datetime_ms("1969-12-31T00:00:00-0530"),
            Ok(-66_600_000)
        );
        for bad in [
            "2026-11-29",
            "2026-11-29 12:00:00",
            "2026-13-01T00:00:00",
            "2025-02-29T00:00:00",
            "2026-11-29T24:00:00",
            "2026-11-29T12:00",
            "2026-11-29T12:00:00.",
            "2026-11-29T12:00:00+1",
            "26-11-29T12:00:00",
        ] {
            assert!(parse_datetime_ms(bad).is_err(), "{bad}");
        }
    }
}
