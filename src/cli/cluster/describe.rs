//! `weir cluster describe`: the cluster as a Kafka client sees it, in the spirit of
//! `kafka-cluster.sh cluster-id` plus `kafka-metadata-quorum.sh describe --status` and
//! `--replication`.
//!
//! Speaks the Kafka protocol directly (librdkafka has neither API): ApiVersions to learn
//! the versions, DescribeCluster (key 60; v2 with `include_fenced_brokers` when the
//! broker offers it, KIP-1073) for the cluster id, the controller and every broker with
//! its state, and DescribeQuorum (key 55, KIP-595/KIP-836) for the controller quorum. The
//! bootstrap addresses are tried in order until one answers. Output on stdout:
//!
//! ```text
//! ClusterId:      <id>
//! ControllerId:   2
//!
//! BrokerId  Address          State
//! 1         127.0.0.1:9092   online
//! 3         127.0.0.1:9096   fenced
//!
//! LeaderId:       2
//! LeaderEpoch:    3
//! HighWatermark:  57
//! MaxFollowerLag: 0
//! CurrentVoters:  [1,2,3]
//! CurrentObservers: []
//!
//! NodeId  LogEndOffset  Lag  LastFetchTimestamp  LastCaughtUpTimestamp  Status
//! 2       57            0    1764657000000       1764657000000          Leader
//! ```
//!
//! A broker's state is `online` (registered, unfenced), `fenced`, or `shutting down`
//! (listed by DescribeCluster v2 with fenced brokers included, unfenced, yet left out of
//! the plain listing: a broker in controlled shutdown). Lag is the leader's log end
//! offset minus the voter's (`unknown` when the leader does not know the voter's).
//!
//! Errors (exit code 1): no bootstrap address answers DescribeCluster, or it answers
//! with an error; a DescribeQuorum error is printed in place of the quorum.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Context as _;
use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::{
    ApiKey, DescribeClusterRequest, DescribeClusterResponse, DescribeQuorumRequest,
    DescribeQuorumResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::cli::wire::{error_text, version_of, Conn};

/// The controller quorum's log (KIP-500).
const METADATA_TOPIC: &str = "__cluster_metadata";

/// Highest versions this command speaks.
const DESCRIBE_CLUSTER_MAX: i16 = 2;
const DESCRIBE_QUORUM_MAX: i16 = 2;

/// One broker's line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BrokerLine {
    id: i32,
    address: String,
    state: &'static str,
}

/// What the broker answered.
#[derive(Debug)]
struct Described {
    cluster_id: String,
    controller_id: i32,
    brokers: Vec<BrokerLine>,
    /// The quorum, or why it could not be described.
    quorum: Result<DescribeQuorumResponse, String>,
}

/// Asks the broker at `addr`.
fn ask(addr: &str) -> anyhow::Result<Described> {
    let (mut conn, versions) = Conn::open(addr)?;
    let cluster_version = version_of(&versions, ApiKey::DescribeCluster, DESCRIBE_CLUSTER_MAX)
        .context("the broker does not offer DescribeCluster (key 60)")?;
    let describe =
        |conn: &mut Conn, include_fenced: bool| -> anyhow::Result<DescribeClusterResponse> {
            let r = conn.call(
                &DescribeClusterRequest::default()
                    .with_endpoint_type(1)
                    .with_include_fenced_brokers(include_fenced),
                cluster_version,
            )?;
            anyhow::ensure!(
                r.error_code == 0,
                "DescribeCluster: {}",
                error_text(r.error_code, r.error_message.as_ref())
            );
            Ok(r)
        };
    let cluster: DescribeClusterResponse = describe(&mut conn, false)?;
    let listed: BTreeSet<i32> = cluster.brokers.iter().map(|b| b.broker_id.0).collect();
    let all = if cluster_version >= 2 {
        describe(&mut conn, true)?
    } else {
        cluster.clone()
    };
    let mut brokers: Vec<BrokerLine> = all
        .brokers
        .iter()
        .map(|b| BrokerLine {
            id: b.broker_id.0,
            address: format!("{}:{}", b.host.as_str(), b.port),
            state: if b.is_fenced {
                "fenced"
            } else if listed.contains(&b.broker_id.0) {
                "online"
            } else {
                "shutting down"
            },
        })
        .collect();
    brokers.sort_by_key(|b| b.id);
    let quorum = match version_of(&versions, ApiKey::DescribeQuorum, DESCRIBE_QUORUM_MAX) {
        None => Err("the broker does not offer DescribeQuorum (key 55)".to_string()),
        Some(v) => {
            let request = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
                .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
            conn.call(&request, v).map_err(|e| format!("{e:#}"))
        }
    };
    Ok(Described {
        cluster_id: all.cluster_id.as_str().to_string(),
        controller_id: all.controller_id.0,
        brokers,
        quorum,
    })
}

/// The quorum part of the output, or why there is none.
fn quorum_text(out: &mut String, quorum: &DescribeQuorumResponse) -> Result<(), String> {
    if quorum.error_code != 0 {
        return Err(error_text(quorum.error_code, quorum.error_message.as_ref()));
    }
    let p = quorum
        .topics
        .iter()
        .filter(|t| t.topic_name.0.as_str() == METADATA_TOPIC)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == 0)
        .ok_or_else(|| format!("the answer has no {METADATA_TOPIC}-0"))?;
    if p.error_code != 0 {
        return Err(error_text(p.error_code, p.error_message.as_ref()));
    }
    let leader_end = p
        .current_voters
        .iter()
        .find(|v| v.replica_id == p.leader_id)
        .map_or(-1, |v| v.log_end_offset);
    let lag = |end: i64| (end >= 0 && leader_end >= 0).then(|| (leader_end - end).max(0));
    let max_lag = p
        .current_voters
        .iter()
        .chain(&p.observers)
        .filter_map(|v| lag(v.log_end_offset))
        .max()
        .unwrap_or(0);
    let ids = |vs: &[kafka_protocol::messages::describe_quorum_response::ReplicaState]| {
        let ids: Vec<String> = vs.iter().map(|v| v.replica_id.0.to_string()).collect();
        format!("[{}]", ids.join(","))
    };
    let _ = writeln!(out, "LeaderId:         {}", p.leader_id.0);
    let _ = writeln!(out, "LeaderEpoch:      {}", p.leader_epoch);
    let _ = writeln!(out, "HighWatermark:    {}", p.high_watermark);
    let _ = writeln!(out, "MaxFollowerLag:   {max_lag}");
    let _ = writeln!(out, "CurrentVoters:    {}", ids(&p.current_voters));
    let _ = writeln!(out, "CurrentObservers: {}", ids(&p.observers));
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<8}{:<14}{:<9}{:<20}{:<23}Status",
        "NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp"
    );
    let mut voters: Vec<_> = p
        .current_voters
        .iter()
        .map(|v| (v, "Follower"))
        .chain(p.observers.iter().map(|v| (v, "Observer")))
        .collect();
    // The leader first, as kafka-metadata-quorum.sh lists it.
    voters.sort_by_key(|(v, _)| (v.replica_id != p.leader_id, v.replica_id.0));
    for (v, role) in voters {
        let role = if v.replica_id == p.leader_id {
            "Leader"
        } else {
            role
        };
        let lag = lag(v.log_end_offset).map_or_else(|| "unknown".to_string(), |l| l.to_string());
        let _ = writeln!(
            out,
            "{:<8}{:<14}{:<9}{:<20}{:<23}{role}",
            v.replica_id.0,
            v.log_end_offset,
            lag,
            v.last_fetch_timestamp,
            v.last_caught_up_timestamp
        );
    }
    Ok(())
}

/// The whole output.
fn render(d: &Described) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ClusterId:        {}", d.cluster_id);
    let _ = writeln!(out, "ControllerId:     {}", d.controller_id);
    let _ = writeln!(out);
    let width = d
        .brokers
        .iter()
        .map(|b| b.address.len() + 2)
        .max()
        .unwrap_or(0)
        .max(9);
    let _ = writeln!(out, "{:<10}{:<width$}State", "BrokerId", "Address");
    for b in &d.brokers {
        let _ = writeln!(out, "{:<10}{:<width$}{}", b.id, b.address, b.state);
    }
    let _ = writeln!(out);
    match &d.quorum {
        Ok(q) => {
            if let Err(why) = quorum_text(&mut out, q) {
                let _ = writeln!(out, "Quorum: not described: {why}");
            }
        }
        Err(why) => {
            let _ = writeln!(out, "Quorum: not described: {why}");
        }
    }
    out
}

/// Runs `weir cluster describe` against `bootstrap` (`host:port[,host:port]`).
///
/// Errors: no address answers DescribeCluster without an error.
pub(in crate::cli) fn run(bootstrap: &str) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for addr in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match ask(addr) {
            Ok(d) => {
                print!("{}", render(&d));
                return Ok(());
            }
            Err(e) => failures.push(format!("{addr}: {e:#}")),
        }
    }
    anyhow::bail!("no broker answered: {}", failures.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::describe_quorum_response::{
        PartitionData as P, ReplicaState, TopicData as T,
    };
    use kafka_protocol::messages::BrokerId;

    #[test]
    fn renders_brokers_and_the_quorum_with_lags() {
        let voter = |id: i32, end: i64| {
            ReplicaState::default()
                .with_replica_id(BrokerId(id))
                .with_log_end_offset(end)
                .with_last_fetch_timestamp(-1)
                .with_last_caught_up_timestamp(-1)
        };
        let quorum = DescribeQuorumResponse::default().with_topics(vec![T::default()
            .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
            .with_partitions(vec![P::default()
                .with_leader_id(BrokerId(2))
                .with_leader_epoch(3)
                .with_high_watermark(57)
                .with_current_voters(vec![voter(1, 50), voter(2, 57), voter(3, -1)])])]);
        let d = Described {
            cluster_id: "abc".into(),
            controller_id: 2,
            brokers: vec![
                BrokerLine {
                    id: 1,
                    address: "127.0.0.1:9092".into(),
                    state: "online",
                },
                BrokerLine {
                    id: 3,
                    address: "127.0.0.1:9096".into(),
                    state: "fenced",
                },
            ],
            quorum: Ok(quorum),
        };
        let text = render(&d);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(lines.contains(&vec!["ClusterId:", "abc"]), "{text}");
        assert!(
            lines.contains(&vec!["3", "127.0.0.1:9096", "fenced"]),
            "{text}"
        );
        assert!(lines.contains(&vec!["MaxFollowerLag:", "7"]), "{text}");
        assert!(lines.contains(&vec!["CurrentVoters:", "[1,2,3]"]), "{text}");
        assert!(
            lines.contains(&vec!["2", "57", "0", "-1", "-1", "Leader"]),
            "{text}"
        );
        assert!(
            lines.contains(&vec!["1", "50", "7", "-1", "-1", "Follower"]),
            "{text}"
        );
        assert!(
            lines.contains(&vec!["3", "-1", "unknown", "-1", "-1", "Follower"]),
            "{text}"
        );
        let failed = Described {
            quorum: Err("nope".into()),
            ..d
        };
        assert!(render(&failed).contains("Quorum: not described: nope"));
    }
}
