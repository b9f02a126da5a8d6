//! Issue 13, test 6: partition reassignment (KIP-455) between `weir` processes under
//! load. Three brokers; a topic with one partition on brokers {1, 2} (replication factor
//! 2, `min.insync.replicas=2`); a confluent-kafka producer (acks=all, idempotent,
//! `tests/compat/fault_producer.py`) sends sequence-numbered records throughout. The
//! partition moves {1, 2} → {2, 3} with `weir partition reassign --execute` (its leader,
//! 1, hands over), `--verify` reports it complete, Metadata lists replicas [2, 3] and
//! broker 1's partition directory is gone; then kafkajs' admin client
//! (`tests/compat/reassign.js`) adds a third replica, {2, 3} → {2, 3, 1}. The load stops
//! and the partition is read from the beginning: every acknowledged record exactly once,
//! at its offset, in order, and no delivery error.
//!
//! A second test covers what needs no load: cancellation of a reassignment that cannot
//! finish (its new broker is paused with SIGSTOP), `--list`, and Kafka's error codes over
//! raw AlterPartitionReassignments requests.
//!
//! Every wait is bounded; every process is stopped (the producer is killed on drop, a
//! paused broker gets SIGCONT on drop before `ThreeNodes`' drop kills it).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

use crate::cluster_fixture::ThreeNodes;
use crate::harness::{decode, poll_for, repo_root, RawConn};
use crate::rdkafka_client::admin;
use crate::replication::describe;
use crate::replication_faults::{check, read_all, spawn_producer, ProducerLog};

/// The longest the producer may send; the test stops it well before with its stop file.
const PRODUCE_MAX_S: u64 = 240;

/// Creates `topic` with one partition per entry of `assignment` (its replicas, leader
/// first) and `min.insync.replicas=2`.
async fn create_placed(bootstrap: &str, topic: &str, assignment: &[&[i32]]) {
    let t = NewTopic::new(
        topic,
        assignment.len() as i32,
        TopicReplication::Variable(assignment),
    )
    .set("min.insync.replicas", "2");
    let created = admin(bootstrap)
        .create_topics(
            &[t],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }
}

/// `weir partition reassign ARGS -b BOOTSTRAP`: (exit status success, stdout + stderr).
fn reassign_cli(bootstrap: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .arg("60")
        .arg(crate::harness::weir_bin())
        .args(["partition", "reassign", "-b", bootstrap])
        .args(args)
        .output()
        .expect("weir partition reassign");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Writes Kafka's reassignment JSON moving `topic`-`partition` to `replicas`.
fn write_plan(path: &Path, topic: &str, partition: i32, replicas: &[i32]) {
    let ids: Vec<String> = replicas.iter().map(i32::to_string).collect();
    std::fs::write(
        path,
        format!(
            r#"{{"version":1,"partitions":[{{"topic":"{topic}","partition":{partition},"replicas":[{}]}}]}}"#,
            ids.join(",")
        ),
    )
    .unwrap();
}

/// Polls `--verify` until it reports the plan in `file` complete (exit 0); at most
/// `timeout_secs`. Returns how many polls said "still in progress".
fn verify_until_complete(bootstrap: &str, file: &Path, name: &str, timeout_secs: u64) -> usize {
    let mut in_progress = 0;
    poll_for(
        &format!("--verify reports {name} complete"),
        timeout_secs,
        || {
            let (ok, text) = reassign_cli(
                bootstrap,
                &[
                    "--reassignment-json-file",
                    file.to_str().unwrap(),
                    "--verify",
                ],
            );
            if ok && text.contains(&format!("Reassignment of partition {name} is completed.")) {
                Ok(())
            } else {
                if text.contains("is still in progress.") {
                    in_progress += 1;
                }
                Err(text)
            }
        },
    );
    in_progress
}

/// Issue 13, test 6: see the module doc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_move_and_grow_under_load_with_no_record_lost_or_duplicated() {
    const TOPIC: &str = "moving";
    let started = Instant::now();
    let nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=3000",
        "broker.heartbeat.interval.ms=300",
    ]);
    create_placed(&nodes.bootstrap(1), TOPIC, &[&[1, 2]]).await;
    poll_for("the partition on {1, 2} with both in sync", 30, || {
        let d = describe(&nodes.bootstrap_all(), TOPIC)?;
        match d.as_slice() {
            [p] if p.replicas == [1, 2] && p.isr.len() == 2 && p.leader == 1 => Ok(()),
            _ => Err(format!("{d:?}")),
        }
    });
    let partition_dir_1 = nodes.log_dir(1).join(format!("{TOPIC}-0"));
    assert!(partition_dir_1.is_dir(), "{}", partition_dir_1.display());
    assert!(!nodes.log_dir(3).join(format!("{TOPIC}-0")).exists());

    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("producer.log");
    let stop = work.path().join("stop");
    let mut producer = spawn_producer(
        &nodes.bootstrap_all(),
        TOPIC,
        1,
        PRODUCE_MAX_S,
        &out,
        Some(&stop),
    );
    let acked_so_far =
        || ProducerLog::parse(&std::fs::read_to_string(&out).unwrap_or_default()).acked_count();
    producer.wait_for_acks(&out, 100);

    // Step 1: {1, 2} → {2, 3} with the CLI; the leader (1) leaves.
    let plan = work.path().join("move.json");
    write_plan(&plan, TOPIC, 0, &[2, 3]);
    let (ok, text) = reassign_cli(
        &nodes.bootstrap_all(),
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--execute",
        ],
    );
    assert!(ok, "--execute: {text}");
    assert!(
        text.contains(r#""replicas":[1,2]"#)
            && text.contains("Successfully started partition reassignment for moving-0"),
        "{text}"
    );
    let moved_at = acked_so_far();
    let polls = verify_until_complete(&nodes.bootstrap_all(), &plan, "moving-0", 60);
    eprintln!(
        "{{1,2}} -> {{2,3}} complete ({polls} --verify polls in progress), {} records acknowledged",
        acked_so_far()
    );
    poll_for(
        "Metadata lists replicas [2, 3] from every broker",
        30,
        || {
            for b in [1, 2, 3] {
                let d = describe(&nodes.bootstrap(b), TOPIC)?;
                match d.as_slice() {
                    [p] if p.replicas == [2, 3]
                        && p.isr.iter().copied().collect::<BTreeSet<_>>()
                            == BTreeSet::from([2, 3])
                        && [2, 3].contains(&p.leader) => {}
                    _ => return Err(format!("broker {b}: {d:?}")),
                }
            }
            Ok(())
        },
    );
    poll_for("broker 1's partition directory is deleted", 30, || {
        if partition_dir_1.exists() {
            Err(partition_dir_1.display().to_string())
        } else {
            Ok(())
        }
    });
    assert!(nodes.log_dir(3).join(format!("{TOPIC}-0")).is_dir());
    // Load keeps flowing to the new leader.
    poll_for("acknowledgements after the move", 30, || {
        if acked_so_far() >= moved_at + 300 {
            Ok(())
        } else {
            Err(format!("{} acknowledged", acked_so_far()))
        }
    });

    // Step 2: kafkajs adds a third replica, {2, 3} → {2, 3, 1}.
    let out_js = Command::new("timeout")
        .arg("90")
        .arg("node")
        .args([
            "tests/compat/reassign.js",
            &nodes.bootstrap_all(),
            TOPIC,
            "0",
            "2,3,1",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("node: {e} (tests/install-deps.sh installs it)"));
    let js = format!(
        "{}{}",
        String::from_utf8_lossy(&out_js.stdout),
        String::from_utf8_lossy(&out_js.stderr)
    );
    eprintln!("{}", js.trim());
    assert!(
        out_js.status.success() && js.contains("kafkajs ok: refused INVALID_REPLICA_ASSIGNMENT"),
        "kafkajs: {js}"
    );
    let grow = work.path().join("grow.json");
    write_plan(&grow, TOPIC, 0, &[2, 3, 1]);
    let grown_at = acked_so_far();
    verify_until_complete(&nodes.bootstrap_all(), &grow, "moving-0", 60);
    poll_for("Metadata lists replicas [2, 3, 1], all in sync", 30, || {
        let d = describe(&nodes.bootstrap_all(), TOPIC)?;
        match d.as_slice() {
            [p] if p.replicas == [2, 3, 1] && p.isr.len() == 3 => Ok(()),
            _ => Err(format!("{d:?}")),
        }
    });
    assert!(
        partition_dir_1.is_dir(),
        "broker 1 hosts the partition again"
    );
    let (ok, text) = reassign_cli(&nodes.bootstrap_all(), &["--list"]);
    assert!(
        ok && text.contains("No partition reassignments found."),
        "{text}"
    );
    poll_for(
        "acknowledgements after the third replica joined",
        30,
        || {
            if acked_so_far() >= grown_at + 300 {
                Ok(())
            } else {
                Err(format!("{} acknowledged", acked_so_far()))
            }
        },
    );

    // Stop the load; read everything back.
    std::fs::write(&stop, b"").unwrap();
    let status = poll_for("the producer to finish", 90, || {
        producer
            .0
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(String::new)
    });
    let summary = std::fs::read_to_string(out.with_extension("stdout")).unwrap_or_default();
    let produced = ProducerLog::parse(&std::fs::read_to_string(&out).unwrap());
    let read = read_all(&nodes.bootstrap_all(), TOPIC, 1);
    let v = check(&produced, &read, 1);
    let failed: usize = produced.failed.values().map(BTreeSet::len).sum();
    let sent: u64 = produced.sent.values().sum();
    eprintln!(
        "reassignment: sent {sent}, acknowledged {}, failed {failed}, unanswered {}, \
         client errors {}, read {}, lost {}, duplicated {}, out of order {}, never sent {}, \
         at another offset {}; the test {:.1} s",
        v.acknowledged,
        produced.unanswered,
        produced.errors.len(),
        v.read,
        v.lost.len(),
        v.duplicated.len(),
        v.out_of_order.len(),
        v.never_sent.len(),
        v.moved.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        produced.done && status.success(),
        "the producer did not finish cleanly ({status}): {summary}"
    );
    assert_eq!(
        failed, 0,
        "delivery failures: {:?}",
        produced.failure_reasons
    );
    assert_eq!(produced.unanswered, 0, "unanswered records");
    assert!(
        produced.errors.is_empty(),
        "client errors: {:?}",
        produced.errors
    );
    v.assert_clean();
    assert!(
        v.acknowledged >= 700,
        "only {} acknowledged",
        v.acknowledged
    );
    assert_eq!(
        v.read, v.acknowledged,
        "read {} of {}",
        v.read, v.acknowledged
    );
    nodes.assert_no_panic();
}

/// SIGCONT on drop: a failing test never leaves a stopped broker.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.0.to_string())
            .status();
    }
}

/// One AlterPartitionReassignments v0 request over a raw connection: (topic, partition,
/// replicas or `None` to cancel) → each partition's error code, in order.
fn alter_raw(bootstrap: &str, wanted: &[(&str, i32, Option<&[i32]>)]) -> Vec<i16> {
    let topics = wanted
        .iter()
        .map(|(t, p, r)| {
            ReassignableTopic::default()
                .with_name(TopicName(StrBytes::from_string(t.to_string())))
                .with_partitions(vec![ReassignablePartition::default()
                    .with_partition_index(*p)
                    .with_replicas(r.map(|r| r.iter().copied().map(BrokerId).collect()))])
        })
        .collect();
    let mut conn = RawConn::connect(bootstrap);
    let body = conn
        .request(
            &AlterPartitionReassignmentsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(topics),
            0,
            1,
        )
        .expect("an AlterPartitionReassignments answer");
    let r: AlterPartitionReassignmentsResponse = decode(body, 0);
    assert_eq!(r.error_code, 0);
    r.responses
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// Cancellation, `--list`, and Kafka's errors: a reassignment to a paused broker cannot
/// finish, `--list` and ListPartitionReassignments show it, `--verify` exits 1, `--cancel`
/// reverts it; cancelling again is NO_REASSIGNMENT_IN_PROGRESS (85) over the wire and
/// "None ... active" from the CLI; an empty list, a broker twice or an unknown broker is
/// INVALID_REPLICA_ASSIGNMENT (39), an unknown partition UNKNOWN_TOPIC_OR_PARTITION (3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reassignment_that_cannot_finish_is_listed_and_cancelled() {
    const TOPIC: &str = "stuck";
    let nodes = ThreeNodes::start(&["broker.heartbeat.interval.ms=300"]);
    // The paused broker is not the quorum leader (pausing that one would stall every
    // metadata change until the quorum elects another).
    let stuck = if nodes.leader() == 3 { 2 } else { 3 };
    let [a, b]: [i32; 2] = (1..=3)
        .filter(|id| *id != stuck)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let boot = nodes.bootstrap(a);
    create_placed(&boot, TOPIC, &[&[a, b]]).await;
    poll_for("the partition on two brokers, both in sync", 30, || {
        let d = describe(&boot, TOPIC)?;
        match d.as_slice() {
            [p] if p.replicas == [a, b] && p.isr.len() == 2 => Ok(()),
            _ => Err(format!("{d:?}")),
        }
    });
    assert_eq!(
        alter_raw(
            &boot,
            &[
                (TOPIC, 0, Some(&[])),
                (TOPIC, 0, Some(&[a, a])),
                (TOPIC, 0, Some(&[a, 9])),
                (TOPIC, 5, Some(&[a, b])),
                ("nope", 0, Some(&[a, b])),
                (TOPIC, 0, None),
                (TOPIC, 0, Some(&[a, b])),
            ],
        ),
        [39, 39, 39, 3, 3, 85, 0],
        "empty, duplicate, unknown broker, unknown partition, unknown topic, \
         cancelling nothing, the same replicas"
    );

    // Broker `stuck` paused (its session has not lapsed yet: it is still registered,
    // active): a move to {a, stuck} adds it, and it cannot catch up.
    let work = tempfile::tempdir().unwrap();
    let plan = work.path().join("stuck.json");
    write_plan(&plan, TOPIC, 0, &[a, stuck]);
    let pid = nodes.node(stuck).pid();
    let status = Command::new("kill")
        .arg("-STOP")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let paused = Paused(pid);
    let (ok, text) = reassign_cli(
        &boot,
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--execute",
        ],
    );
    assert!(ok, "--execute: {text}");
    let (ok, text) = reassign_cli(&boot, &["--list"]);
    assert!(
        ok && text.contains(&format!(
            "stuck-0: replicas: {a},{stuck},{b}. adding: {stuck}. removing: {b}."
        )),
        "{text}"
    );
    let mut conn = RawConn::connect(&boot);
    let body = conn
        .request(&ListPartitionReassignmentsRequest::default(), 0, 1)
        .expect("a ListPartitionReassignments answer");
    let listed: ListPartitionReassignmentsResponse = decode(body, 0);
    let p = &listed.topics[0].partitions[0];
    assert_eq!(
        (
            listed.topics[0].name.0.as_str(),
            p.partition_index,
            p.adding_replicas.as_slice(),
            p.removing_replicas.as_slice()
        ),
        (TOPIC, 0, &[BrokerId(stuck)][..], &[BrokerId(b)][..])
    );
    let (ok, text) = reassign_cli(
        &boot,
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--verify",
        ],
    );
    assert!(
        !ok && text.contains("Reassignment of partition stuck-0 is still in progress."),
        "{text}"
    );
    let (ok, text) = reassign_cli(
        &boot,
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--execute",
        ],
    );
    assert!(
        !ok && text.contains("existing partition assignment"),
        "a second --execute without --additional: {text}"
    );
    let (ok, text) = reassign_cli(
        &boot,
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--cancel",
        ],
    );
    assert!(
        ok && text.contains("Successfully cancelled partition reassignment(s) for: stuck-0"),
        "{text}"
    );
    let d = describe(&boot, TOPIC).expect("describe");
    assert_eq!(d[0].replicas, [a, b], "{d:?}");
    let (ok, text) = reassign_cli(
        &boot,
        &[
            "--reassignment-json-file",
            plan.to_str().unwrap(),
            "--cancel",
        ],
    );
    assert!(
        ok && text.contains("None of the specified partition reassignments are active."),
        "{text}"
    );
    assert_eq!(alter_raw(&boot, &[(TOPIC, 0, None)]), [85]);
    drop(paused);
    nodes.assert_no_panic();
}
