//! Issue 12's split roles (KIP-631): controller-only nodes (`process.roles=controller`,
//! voters with only a CONTROLLER listener) and broker-only nodes (`process.roles=broker`,
//! Raft learners of `__cluster_metadata`), with real clients (librdkafka) against
//! `weir` processes on 127.0.0.1 ([`ThreeNodes::start_roles`]). Every wait is bounded;
//! the fixture's drop kills every node.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use crate::cluster_fixture::{produce_keyed, read_keyed, Role, ThreeNodes};
use crate::harness::{poll_for, weir_bin};
use crate::rdkafka_client::admin;

const SPLIT: [Role; 5] = [
    Role::Controller,
    Role::Controller,
    Role::Controller,
    Role::Broker,
    Role::Broker,
];

/// Creates `name` with `partitions` partitions of `rf` replicas through `bootstrap`.
///
/// Errors: the topic error, as text.
async fn create(bootstrap: &str, name: &str, partitions: i32, rf: i32) -> Result<(), String> {
    let t = NewTopic::new(name, partitions, TopicReplication::Fixed(rf));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let res = admin(bootstrap)
        .create_topics(&[t], &opts)
        .await
        .map_err(|e| e.to_string())?;
    for r in res {
        r.map_err(|(_, e)| e.to_string())?;
    }
    Ok(())
}

/// The broker ids librdkafka's Metadata lists through `bootstrap`, sorted.
fn rdkafka_brokers(bootstrap: &str) -> Result<Vec<i32>, String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let m = c
        .fetch_metadata(None, Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let mut ids: Vec<i32> = m.brokers().iter().map(|b| b.id()).collect();
    ids.sort();
    Ok(ids)
}

/// Each partition's leader of `topic` as librdkafka's Metadata through `bootstrap` has it.
fn leaders(bootstrap: &str, topic: &str) -> Result<Vec<i32>, String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let m = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let t = m.topics().first().ok_or("no topic")?;
    let mut parts: Vec<(i32, i32)> = t
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    parts.sort();
    Ok(parts.into_iter().map(|(_, l)| l).collect())
}

/// Produces `n` keyed records with acks=all, all acknowledged, and reads back exactly
/// the acknowledged ones (no loss, no duplicate).
async fn round_trip(bootstrap: &str, topic: &str, partitions: i32, n: usize) {
    let produced = produce_keyed(bootstrap, topic, n, Some(partitions)).await;
    produced.assert_all_acked(n);
    let read = read_keyed(bootstrap, topic, partitions, n);
    read.assert_exactly(&produced.acked);
}

/// 3 controller-only voters and 2 broker-only learners: Metadata lists exactly the two
/// brokers; a topic of replication factor 2 takes records with acks=all and gives them
/// back exactly; `weir cluster describe` shows 3 voters, 2 observers and the 2 brokers;
/// the controllers host no partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_and_two_brokers_serve_clients() {
    let nodes = ThreeNodes::start_roles(&SPLIT, &[]);
    let bootstrap = nodes.bootstrap_all();
    poll_for(
        "rdkafka lists brokers 4 and 5",
        20,
        || match rdkafka_brokers(&bootstrap)? {
            ids if ids == [4, 5] => Ok(()),
            ids => Err(format!("{ids:?}")),
        },
    );
    create(&nodes.bootstrap(4), "split", 4, 2).await.unwrap();
    round_trip(&bootstrap, "split", 4, 1000).await;

    let out = std::process::Command::new(weir_bin())
        .args([
            "cluster",
            "describe",
            "--bootstrap-server",
            &nodes.bootstrap(5),
        ])
        .output()
        .expect("weir cluster describe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("CurrentVoters:    [1,2,3]"), "{text}");
    assert!(text.contains("CurrentObservers: [4,5]"), "{text}");
    let brokers: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("BrokerId"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(brokers.len(), 2, "{text}");
    for (line, id) in brokers.iter().zip([4, 5]) {
        assert!(line.starts_with(&id.to_string()), "{text}");
        assert!(line.ends_with("online"), "{text}");
    }
    // The controllers host nothing: no partition directory in their log dirs.
    for id in 1..=3 {
        let hosted: Vec<String> = std::fs::read_dir(nodes.log_dir(id))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("split-"))
            .collect();
        assert!(hosted.is_empty(), "controller {id} hosts {hosted:?}");
    }
    nodes.assert_no_panic();
}

/// kill -9 of the active controller, a controller-only node: the other two elect a new
/// one, a topic can be created again, and records keep going in and out exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_controller_killed_with_9_is_replaced() {
    let mut nodes = ThreeNodes::start_roles(&SPLIT, &[]);
    let bootstrap = nodes.bootstrap_all();
    create(&nodes.bootstrap(4), "before", 2, 2).await.unwrap();
    let produced = produce_keyed(&bootstrap, "before", 300, Some(2)).await;
    produced.assert_all_acked(300);

    let leader = nodes.leader();
    assert!(
        (1..=3).contains(&leader),
        "leader {leader} is no controller"
    );
    nodes.kill9(leader);
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    loop {
        match create(&nodes.bootstrap(5), "after", 2, 2).await {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("CreateTopics after the kill: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no topic created within 30 s of the kill: {e}"),
        }
    }
    eprintln!(
        "kill -9 of controller {leader} to a created topic: {} ms",
        killed.elapsed().as_millis()
    );
    let new_leader = nodes.leader_other_than(Some(leader), 20);
    assert!((1..=3).contains(&new_leader), "leader {new_leader}");

    round_trip(&bootstrap, "after", 2, 500).await;
    // The earlier records are all still there, exactly once.
    read_keyed(&bootstrap, "before", 2, 300).assert_exactly(&produced.acked);
    nodes.assert_no_panic();
}

/// A broker-only node killed with -9 and restarted: it catches up on the metadata as a
/// learner, registers again, rejoins the ISRs and leads its preferred partitions again
/// (the controller's leader rebalance); nothing acknowledged is lost or duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_only_node_killed_with_9_rejoins() {
    let mut nodes = ThreeNodes::start_roles(
        &SPLIT,
        &[
            "auto.leader.rebalance.enable=true",
            "leader.imbalance.check.interval.seconds=1",
        ],
    );
    create(&nodes.bootstrap(4), "rejoin", 4, 2).await.unwrap();
    let bootstrap = nodes.bootstrap_all();
    let first = produce_keyed(&bootstrap, "rejoin", 400, Some(4)).await;
    first.assert_all_acked(400);
    let preferred = leaders(&nodes.bootstrap(4), "rejoin").unwrap();
    assert!(preferred.contains(&5), "{preferred:?}");

    nodes.kill9(5);
    // Node 4 alone: it leads every partition once 5 is fenced.
    poll_for("node 4 leads every partition", 30, || {
        match leaders(&nodes.bootstrap(4), "rejoin")? {
            l if l.iter().all(|&b| b == 4) => Ok(()),
            l => Err(format!("{l:?}")),
        }
    });
    let alone = produce_keyed(&nodes.bootstrap(4), "rejoin", 200, Some(4)).await;
    alone.assert_all_acked(200);

    nodes.restart(5);
    nodes.wait_for_brokers(4, &[4, 5], 30);
    nodes.wait_for_brokers(5, &[4, 5], 30);
    poll_for(
        "node 5 leads its preferred partitions again",
        60,
        || match leaders(&nodes.bootstrap(5), "rejoin")? {
            l if l == preferred => Ok(()),
            l => Err(format!("{l:?}, preferred {preferred:?}")),
        },
    );
    // Everything acknowledged, read through node 5: `produce_keyed` numbers from 0 each
    // time, so records 0..200 were produced twice (before and during the outage) and must
    // be read exactly twice, records 200..400 exactly once; nothing else.
    let read = read_keyed(&nodes.bootstrap(5), "rejoin", 4, 600);
    let lost: Vec<usize> = (0..400).filter(|i| !read.seen.contains_key(i)).collect();
    let wrong: Vec<(usize, usize)> = read
        .seen
        .iter()
        .map(|(i, n)| (*i, *n))
        .filter(|(i, n)| *n != if *i < 200 { 2 } else { 1 })
        .collect();
    eprintln!(
        "acknowledged 600, read {}, lost {}, read a wrong number of times {}",
        read.seen.values().sum::<usize>(),
        lost.len(),
        wrong.len()
    );
    assert!(lost.is_empty(), "lost {lost:?}");
    assert!(wrong.is_empty(), "(record, times read): {wrong:?}");
    assert!(read.bad.is_empty(), "{:?}", read.bad);
    // And it takes new records on the partitions it leads.
    create(&nodes.bootstrap(5), "rejoin-after", 2, 2)
        .await
        .unwrap();
    round_trip(&nodes.bootstrap(5), "rejoin-after", 2, 300).await;
    nodes.assert_no_panic();
}

/// A mixed cluster: 3 combined nodes and 1 broker-only node. Every broker is listed; a
/// topic with a replica on each of the 4 takes and gives back records exactly, through
/// the broker-only node too; DescribeQuorum shows it as an observer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_combined_nodes_and_one_broker_only_node() {
    let roles = [Role::Combined, Role::Combined, Role::Combined, Role::Broker];
    let nodes = ThreeNodes::start_roles(&roles, &[]);
    let bootstrap = nodes.bootstrap_all();
    poll_for(
        "rdkafka lists brokers 1 to 4",
        20,
        || match rdkafka_brokers(&nodes.bootstrap(4))? {
            ids if ids == [1, 2, 3, 4] => Ok(()),
            ids => Err(format!("{ids:?}")),
        },
    );
    create(&nodes.bootstrap(4), "mixed", 4, 4).await.unwrap();
    round_trip(&nodes.bootstrap(4), "mixed", 4, 800).await;
    // Created through a combined node, written and read through every broker.
    create(&nodes.bootstrap(1), "mixed-all", 2, 2)
        .await
        .unwrap();
    round_trip(&bootstrap, "mixed-all", 2, 200).await;
    let out = std::process::Command::new(weir_bin())
        .args([
            "cluster",
            "describe",
            "--bootstrap-server",
            &nodes.bootstrap(4),
        ])
        .output()
        .expect("weir cluster describe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CurrentVoters:    [1,2,3]"), "{text}");
    assert!(text.contains("CurrentObservers: [4]"), "{text}");
    nodes.assert_no_panic();
}
