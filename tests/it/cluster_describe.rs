//! Describing a cluster (issue 12): DescribeQuorum (key 55) answered by every node of a
//! three-process quorum with the leader's view of `__cluster_metadata`, and
//! `weir cluster describe` naming the cluster id, the three brokers and their states,
//! the leader and the voters; a kill -9'd broker shows up fenced.

use std::process::Command;

use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::{DescribeQuorumRequest, DescribeQuorumResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::free_ports;
use crate::harness::{decode, poll_for, BinaryBroker, RawConn, TestBroker};

/// Three combined nodes on free CONTROLLER ports, each with `more` overrides.
fn three_nodes(dirs: &[tempfile::TempDir], ports: &[u16], more: &[&str]) -> Vec<BinaryBroker> {
    (1..=3).map(|id| node(dirs, ports, id, more)).collect()
}

/// `controller.quorum.voters` for `ports` (node i+1 at ports[i]).
fn voters(ports: &[u16]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// Node `id` (1-based) of the quorum on `ports`, data in `dirs[id - 1]`.
fn node(dirs: &[tempfile::TempDir], ports: &[u16], id: usize, more: &[&str]) -> BinaryBroker {
    let mut overrides = vec![
        format!("node.id={id}"),
        format!("controller.quorum.voters={}", voters(ports)),
        "controller.listener.names=CONTROLLER".to_string(),
        format!(
            "listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{}",
            ports[id - 1]
        ),
    ];
    overrides.extend(more.iter().map(|o| o.to_string()));
    let refs: Vec<&str> = overrides.iter().map(String::as_str).collect();
    BinaryBroker::spawn(dirs[id - 1].path(), 0, &refs)
}

fn ask_for(topic: &str, partitions: &[i32]) -> DescribeQuorumRequest {
    DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partitions(
            partitions
                .iter()
                .map(|&i| PartitionData::default().with_partition_index(i))
                .collect(),
        )])
}

fn describe_quorum(
    bootstrap: &str,
    request: &DescribeQuorumRequest,
    version: i16,
) -> DescribeQuorumResponse {
    let mut conn = RawConn::connect(bootstrap);
    decode(
        conn.request(request, version, 55)
            .expect("a DescribeQuorum answer"),
        version,
    )
}

/// (leader, epoch, high watermark, [(voter, log end offset)]) of an error-free answer.
type Quorum = (i32, i32, i64, Vec<(i32, i64)>);

fn quorum_of(r: &DescribeQuorumResponse) -> Result<Quorum, String> {
    let [t] = &r.topics[..] else {
        return Err(format!("{r:?}"));
    };
    let [p] = &t.partitions[..] else {
        return Err(format!("{r:?}"));
    };
    if r.error_code != 0 || p.error_code != 0 || t.topic_name.0.as_str() != "__cluster_metadata" {
        return Err(format!("{r:?}"));
    }
    let voters = p
        .current_voters
        .iter()
        .map(|v| (v.replica_id.0, v.log_end_offset))
        .collect();
    Ok((p.leader_id.0, p.leader_epoch, p.high_watermark, voters))
}

/// A quorum whose leader has every voter caught up, as node `bootstrap` answers.
fn settled_quorum(bootstrap: &str) -> Result<Quorum, String> {
    let q = quorum_of(&describe_quorum(
        bootstrap,
        &ask_for("__cluster_metadata", &[0]),
        1,
    ))?;
    let (_, _, hw, voters) = &q;
    let ids: Vec<i32> = voters.iter().map(|v| v.0).collect();
    if ids == [1, 2, 3] && *hw > 0 && voters.iter().all(|v| v.1 == *hw) {
        Ok(q)
    } else {
        Err(format!("{q:?}"))
    }
}

/// `weir cluster describe --bootstrap-server bootstrap`: (exit success, stdout, stderr).
fn weir_describe(bootstrap: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["cluster", "describe", "--bootstrap-server", bootstrap])
        .output()
        .expect("run weir cluster describe");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The output's lines, split on whitespace.
fn words(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The broker lines (`ID HOST:PORT STATE...`) of `weir cluster describe`'s output.
fn broker_states(text: &str) -> Vec<(i32, String, String)> {
    words(text)
        .into_iter()
        .filter(|w| w.len() >= 3 && w[1].starts_with("127.0.0.1:"))
        .filter_map(|w| Some((w[0].parse().ok()?, w[1].clone(), w[2..].join(" "))))
        .collect()
}

/// Issue 12, DescribeQuorum (KIP-595/KIP-836/KIP-853): three `weir` processes; every node
/// answers v0, v1 and v2 with the same leader, epoch and voters (a non-leader asks the
/// leader, as a Kafka broker forwards to the active controller), every voter caught up
/// to the high watermark; at v1 the leader's timestamps are set and the followers' are
/// -1; at v2 `nodes` gives each voter's CONTROLLER listener. Asking for another
/// partition gets UNKNOWN_TOPIC_OR_PARTITION; ApiVersions advertises key 55 v0–v2.
#[test]
fn every_node_describes_the_quorum_as_its_leader_sees_it() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports = free_ports(3);
    let nodes = three_nodes(&dirs, &ports, &[]);
    let (leader, epoch, _, _) = poll_for("a leader with every voter caught up", 30, || {
        settled_quorum(&nodes[0].bootstrap)
    });
    assert!((1..=3).contains(&leader) && epoch > 0, "{leader} {epoch}");
    for n in &nodes {
        for version in 0..=2 {
            let r = describe_quorum(&n.bootstrap, &ask_for("__cluster_metadata", &[0]), version);
            let (l, e, hw, voters) = quorum_of(&r).expect("no error");
            assert_eq!((l, e), (leader, epoch), "v{version} from {}", n.bootstrap);
            assert!(hw > 0);
            assert_eq!(voters.iter().map(|v| v.0).collect::<Vec<_>>(), [1, 2, 3]);
            let p = &r.topics[0].partitions[0];
            assert!(p.observers.is_empty());
            if version >= 1 {
                for v in &p.current_voters {
                    let known = v.replica_id.0 == leader;
                    assert_eq!(v.last_fetch_timestamp > 0, known, "{v:?}");
                    assert_eq!(v.last_caught_up_timestamp > 0, known, "{v:?}");
                }
            }
            if version >= 2 {
                let nodes: Vec<(i32, u16)> = r
                    .nodes
                    .iter()
                    .map(|n| (n.node_id.0, n.listeners[0].port))
                    .collect();
                assert_eq!(nodes, [(1, ports[0]), (2, ports[1]), (3, ports[2])]);
            } else {
                assert!(r.nodes.is_empty());
            }
        }
    }
    // Only __cluster_metadata-0 is described (Kafka's KafkaRaftClient).
    for bad in [
        ask_for("__cluster_metadata", &[1]),
        ask_for("other", &[0, 2]),
    ] {
        let r = describe_quorum(&nodes[1].bootstrap, &bad, 1);
        assert_eq!(r.error_code, 0);
        let codes: Vec<i16> = r.topics[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect();
        assert_eq!(codes, vec![3; bad.topics[0].partitions.len()], "{r:?}");
    }
    let mut conn = RawConn::connect(&nodes[2].bootstrap);
    let versions: kafka_protocol::messages::ApiVersionsResponse = decode(
        conn.request(
            &kafka_protocol::messages::ApiVersionsRequest::default(),
            3,
            1,
        )
        .expect("an ApiVersions answer"),
        3,
    );
    let dq = versions
        .api_keys
        .iter()
        .find(|a| a.api_key == 55)
        .expect("DescribeQuorum advertised");
    assert_eq!((dq.min_version, dq.max_version), (0, 2));
    for n in &nodes {
        assert!(!n.stderr_text().contains("panicked"), "{}", n.stderr_text());
    }
}

/// DescribeQuorum on a single node: it leads its one-voter quorum.
#[test]
fn a_single_node_is_its_own_quorum() {
    let broker = TestBroker::start();
    let r = describe_quorum(&broker.bootstrap, &ask_for("__cluster_metadata", &[0]), 2);
    let (leader, epoch, hw, voters) = quorum_of(&r).expect("no error");
    assert_eq!(voters.len(), 1);
    assert_eq!(voters[0].0, leader);
    assert_eq!(voters[0].1, hw);
    assert!(epoch >= 1 && hw > 0, "{r:?}");
    let (ok, out, err) = weir_describe(&broker.bootstrap);
    assert!(ok, "{out}{err}");
    assert!(words(&out).contains(&vec!["CurrentVoters:".to_string(), format!("[{leader}]")]));
}

/// Issue 12, `weir cluster describe` on three `weir` processes (short broker sessions):
/// the cluster id, all three brokers online at their ports, the leader and three voters
/// with their log end offsets and lag; after kill -9 of a broker that does not lead the
/// quorum, once its session lapses the output (from a surviving node) shows it fenced.
#[test]
fn cluster_describe_names_brokers_quorum_and_a_fenced_broker() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports = free_ports(3);
    let session = [
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ];
    let mut nodes: Vec<Option<BinaryBroker>> = three_nodes(&dirs, &ports, &session)
        .into_iter()
        .map(Some)
        .collect();
    let first = nodes[0].as_ref().unwrap().bootstrap.clone();
    let addresses: Vec<String> = nodes
        .iter()
        .flatten()
        .map(|n| n.bootstrap.clone())
        .collect();
    let (leader, _, _, _) = poll_for("a leader with every voter caught up", 30, || {
        settled_quorum(&first)
    });
    let out = poll_for(
        "weir cluster describe lists three brokers online",
        30,
        || {
            let (ok, out, err) = weir_describe(&first);
            let online: Vec<(i32, String, String)> = (1..=3)
                .map(|id| {
                    (
                        id,
                        addresses[(id - 1) as usize].clone(),
                        "online".to_string(),
                    )
                })
                .collect();
            if ok && broker_states(&out) == online {
                Ok(out)
            } else {
                Err(format!("{out}{err}"))
            }
        },
    );
    let w = words(&out);
    let mut conn = RawConn::connect(&first);
    let meta: kafka_protocol::messages::MetadataResponse = decode(
        conn.request(
            &kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![])),
            12,
            1,
        )
        .expect("a Metadata answer"),
        12,
    );
    let cluster_id = meta.cluster_id.expect("a cluster id").to_string();
    assert!(
        w.contains(&vec!["ClusterId:".to_string(), cluster_id]),
        "{out}"
    );
    assert!(
        w.contains(&vec!["LeaderId:".to_string(), leader.to_string()]),
        "{out}"
    );
    assert!(
        w.contains(&vec!["CurrentVoters:".to_string(), "[1,2,3]".to_string()]),
        "{out}"
    );
    let voter_rows: Vec<(String, String)> = w
        .iter()
        .filter(|l| l.len() == 6 && (l[5] == "Leader" || l[5] == "Follower"))
        .map(|l| (l[0].clone(), l[5].clone()))
        .collect();
    assert_eq!(voter_rows.len(), 3, "{out}");
    assert_eq!(
        voter_rows[0],
        (leader.to_string(), "Leader".to_string()),
        "{out}"
    );

    // kill -9 a broker that does not lead the quorum.
    let victim = if leader == 3 { 2 } else { 3 };
    let _ = nodes[victim - 1].take().expect("running").kill9();
    let survivor = addresses[leader as usize - 1].clone();
    let out = poll_for(&format!("broker {victim} shown fenced"), 20, || {
        let (ok, out, err) = weir_describe(&survivor);
        let states = broker_states(&out);
        let fenced = states
            .iter()
            .any(|(id, _, s)| *id == victim as i32 && s == "fenced");
        if ok && fenced && states.len() == 3 {
            Ok(out)
        } else {
            Err(format!("{out}{err}"))
        }
    });
    // The survivors stay online; the quorum still lists three voters.
    let online = broker_states(&out)
        .into_iter()
        .filter(|(_, _, s)| s == "online")
        .count();
    assert_eq!(online, 2, "{out}");
    assert!(words(&out).contains(&vec!["CurrentVoters:".to_string(), "[1,2,3]".to_string()]));
    for n in nodes.iter().flatten() {
        assert!(!n.stderr_text().contains("panicked"), "{}", n.stderr_text());
    }
}

/// The broker ids Metadata lists on `bootstrap`.
fn listed_ids(bootstrap: &str) -> Vec<i32> {
    let mut conn = RawConn::connect(bootstrap);
    let meta: kafka_protocol::messages::MetadataResponse = decode(
        conn.request(
            &kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![])),
            12,
            1,
        )
        .expect("a Metadata answer"),
        12,
    );
    let mut ids: Vec<i32> = meta.brokers.iter().map(|b| b.node_id.0).collect();
    ids.sort_unstable();
    ids
}

/// Issue 12, controlled shutdown (KIP-631): three `weir` processes with a long broker
/// session (30 s) so that only the controlled path can explain what follows. SIGTERM to a
/// broker that does not lead the quorum: it logs its controlled shutdown, the others stop
/// listing it well within the session timeout (the wait is bounded at 15 s), and
/// `weir cluster describe` shows it fenced; restarted, it registers again and is online.
#[test]
fn a_terminated_broker_is_fenced_at_once_and_comes_back() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports = free_ports(3);
    let session = [
        "broker.session.timeout.ms=30000",
        "broker.heartbeat.interval.ms=300",
    ];
    let mut nodes: Vec<Option<BinaryBroker>> = three_nodes(&dirs, &ports, &session)
        .into_iter()
        .map(Some)
        .collect();
    let first = nodes[0].as_ref().unwrap().bootstrap.clone();
    let (leader, _, _, _) = poll_for("a leader with every voter caught up", 30, || {
        settled_quorum(&first)
    });
    let survivor = nodes[leader as usize - 1]
        .as_ref()
        .unwrap()
        .bootstrap
        .clone();
    poll_for("every node lists three brokers", 30, || {
        let seen: Vec<Vec<i32>> = nodes
            .iter()
            .flatten()
            .map(|n| listed_ids(&n.bootstrap))
            .collect();
        if seen.iter().all(|ids| ids == &[1, 2, 3]) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let victim = if leader == 3 { 2 } else { 3 };
    let stderr = nodes[victim - 1].take().expect("running").terminate();
    assert!(
        stderr.contains(&format!("controlled shutdown: fenced broker_id={victim}")),
        "{stderr}"
    );
    // Bounded well below broker.session.timeout.ms (30 s): only the controlled
    // shutdown can have unlisted it.
    for n in nodes.iter().flatten() {
        let b = n.bootstrap.clone();
        poll_for(&format!("{b} stops listing broker {victim}"), 15, || {
            let ids = listed_ids(&b);
            if ids.contains(&(victim as i32)) {
                Err(format!("{ids:?}"))
            } else {
                Ok(())
            }
        });
    }
    let (ok, out, err) = weir_describe(&survivor);
    assert!(ok, "{out}{err}");
    let states = broker_states(&out);
    assert!(
        states
            .iter()
            .any(|(id, _, s)| *id == victim as i32 && s == "fenced"),
        "{out}"
    );
    // Restarted over its data: registers again, online.
    nodes[victim - 1] = Some(node(&dirs, &ports, victim, &session));
    poll_for(&format!("broker {victim} online again"), 30, || {
        let (ok, out, err) = weir_describe(&survivor);
        let online: Vec<i32> = broker_states(&out)
            .into_iter()
            .filter(|(_, _, s)| s == "online")
            .map(|(id, _, _)| id)
            .collect();
        if ok && online == [1, 2, 3] {
            Ok(())
        } else {
            Err(format!("{out}{err}"))
        }
    });
    for n in nodes.iter().flatten() {
        assert!(!n.stderr_text().contains("panicked"), "{}", n.stderr_text());
    }
}
