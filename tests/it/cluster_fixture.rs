//! Shared fixtures of the cluster tests: [`ThreeNodes`], three `weir` processes forming
//! one controller quorum on free loopback ports, and [`produce_keyed`] / [`read_keyed`],
//! the "produce N keyed records with acks=all, read them all back" round trip.
//!
//! Every wait has a deadline; `ThreeNodes`' drop kills every node it still runs (each a
//! `BinaryBroker`, killed on drop), then removes the data dirs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::cluster::{free_ports, logged_leader, quorum_node_on, raw_listed_brokers};
use crate::harness::{poll_for, BinaryBroker};
use crate::netns::TestNet;
use crate::rdkafka_client::producer;

/// What a node of [`ThreeNodes`] runs (`process.roles`, KIP-631).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `broker,controller`: a voter that serves clients (every node of `start_n`).
    Combined,
    /// `controller`: a voter with only its CONTROLLER listener.
    Controller,
    /// `broker`: not a voter (a Raft learner), only a PLAINTEXT listener.
    Broker,
}

impl Role {
    fn is_voter(self) -> bool {
        self != Role::Broker
    }

    fn is_broker(self) -> bool {
        self != Role::Controller
    }
}

/// Three combined broker/controller nodes, ids 1, 2, 3, all voters (or, from
/// [`ThreeNodes::start_roles`], any number of nodes of any [`Role`]).
pub(crate) struct ThreeNodes {
    /// Index `id - 1`; `None` while that node is killed.
    nodes: Vec<Option<BinaryBroker>>,
    /// Each node's CONTROLLER port (its `controller.quorum.voters` entry; unused by a
    /// broker-only node).
    ports: Vec<u16>,
    /// Each node's role, index `id - 1`.
    roles: Vec<Role>,
    /// `controller.quorum.voters`, the same on every node.
    voters: String,
    /// Extra `--override`s every node gets (at each start).
    overrides: Vec<String>,
    /// More `--override`s of one node (index `id - 1`), after `overrides`.
    node_overrides: Vec<Vec<String>>,
    /// Each node's `log.dirs`; kept over a restart; dropped after the nodes.
    dirs: Vec<tempfile::TempDir>,
    /// The network namespaces the nodes run in (node `id` is host `id`), when started
    /// with [`ThreeNodes::start_on`]; dropped after the nodes.
    net: Option<TestNet>,
}

impl ThreeNodes {
    /// Starts the three nodes with `overrides` on top of the quorum keys, and waits (at
    /// most 30 s) until each one's Metadata lists brokers 1, 2 and 3.
    pub(crate) fn start(overrides: &[&str]) -> ThreeNodes {
        ThreeNodes::start_n(3, overrides)
    }

    /// As [`ThreeNodes::start`] with `n` nodes, ids `1..=n`, all voters (5: a quorum
    /// that survives two nodes down).
    pub(crate) fn start_n(n: usize, overrides: &[&str]) -> ThreeNodes {
        ThreeNodes::start_each(n, overrides, |_| Vec::new())
    }

    /// As [`ThreeNodes::start_n`], node `id` also getting the overrides `each(id)`
    /// (e.g. its own `broker.rack`).
    pub(crate) fn start_each(
        n: usize,
        overrides: &[&str],
        each: impl Fn(i32) -> Vec<String>,
    ) -> ThreeNodes {
        ThreeNodes::start_in(None, &vec![Role::Combined; n], overrides, each)
    }

    /// Nodes `1..=roles.len()`, node `id` running `roles[id - 1]`; the voters are the
    /// controllers (combined or controller-only). Waits (at most 30 s) until each broker
    /// lists every broker.
    pub(crate) fn start_roles(roles: &[Role], overrides: &[&str]) -> ThreeNodes {
        ThreeNodes::start_in(None, roles, overrides, |_| Vec::new())
    }

    /// As [`ThreeNodes::start_n`], node `id` in `net`'s host `id` (its own network
    /// namespace and address), so [`ThreeNodes::cut`] can cut it off.
    pub(crate) fn start_on(net: TestNet, n: usize, overrides: &[&str]) -> ThreeNodes {
        ThreeNodes::start_in(Some(net), &vec![Role::Combined; n], overrides, |_| {
            Vec::new()
        })
    }

    fn start_in(
        net: Option<TestNet>,
        roles: &[Role],
        overrides: &[&str],
        each: impl Fn(i32) -> Vec<String>,
    ) -> ThreeNodes {
        let n = roles.len();
        let dirs: Vec<tempfile::TempDir> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        let ports = free_ports(n);
        let host = |id: usize| match &net {
            Some(net) => net.addr(id as i32),
            None => "127.0.0.1".to_string(),
        };
        let voters = (1..=n)
            .filter(|id| roles[id - 1].is_voter())
            .map(|id| format!("{id}@{}:{}", host(id), ports[id - 1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut me = ThreeNodes {
            nodes: Vec::new(),
            ports,
            roles: roles.to_vec(),
            voters,
            overrides: overrides.iter().map(|o| o.to_string()).collect(),
            node_overrides: (1..=n as i32).map(each).collect(),
            dirs,
            net,
        };
        me.nodes = (1..=n as i32).map(|id| Some(me.spawn(id))).collect();
        let brokers = me.broker_ids();
        for &id in &brokers {
            me.wait_for_brokers(id, &brokers, 30);
        }
        me
    }

    /// The ids of the nodes with a broker role, sorted.
    pub(crate) fn broker_ids(&self) -> Vec<i32> {
        (1..=self.roles.len() as i32)
            .filter(|id| self.roles[(id - 1) as usize].is_broker())
            .collect()
    }

    fn spawn(&self, id: i32) -> BinaryBroker {
        let i = (id - 1) as usize;
        let more: Vec<&str> = self
            .overrides
            .iter()
            .chain(&self.node_overrides[i])
            .map(String::as_str)
            .collect();
        let (netns, host) = match &self.net {
            Some(net) => (Some(net.namespace(id)), net.addr(id)),
            None => (None, "127.0.0.1".to_string()),
        };
        match self.roles[i] {
            Role::Combined => quorum_node_on(
                netns.as_deref(),
                &host,
                self.dirs[i].path(),
                id,
                &self.voters,
                self.ports[i],
                &more,
            ),
            role => {
                let listeners = if role == Role::Controller {
                    // No Kafka listener, and no admin one (the harness asks for one).
                    format!("listeners=CONTROLLER://{host}:{}", self.ports[i])
                } else {
                    format!("listeners=PLAINTEXT://{host}:0")
                };
                let mut overrides = vec![
                    format!("node.id={id}"),
                    format!(
                        "process.roles={}",
                        if role == Role::Controller {
                            "controller"
                        } else {
                            "broker"
                        }
                    ),
                    format!("controller.quorum.voters={}", self.voters),
                    "controller.listener.names=CONTROLLER".to_string(),
                    listeners,
                ];
                if role == Role::Controller {
                    overrides.push("admin.listeners=".to_string());
                }
                overrides.extend(more.iter().map(|o| o.to_string()));
                let refs: Vec<&str> = overrides.iter().map(String::as_str).collect();
                BinaryBroker::spawn_in(netns.as_deref(), self.dirs[i].path(), 0, &refs)
            }
        }
    }

    /// Cuts node `id` off the network (its process runs on); panics unless started with
    /// [`ThreeNodes::start_on`].
    pub(crate) fn cut(&self, id: i32) {
        self.net.as_ref().expect("started on a TestNet").cut(id);
    }

    /// Undoes [`ThreeNodes::cut`].
    pub(crate) fn heal(&self, id: i32) {
        self.net.as_ref().expect("started on a TestNet").heal(id);
    }

    /// Polls (raw Metadata) until node `id` lists exactly the broker ids `want`.
    pub(crate) fn wait_for_brokers(&self, id: i32, want: &[i32], timeout_secs: u64) {
        let b = self.bootstrap(id);
        poll_for(
            &format!("node {id} lists brokers {want:?}"),
            timeout_secs,
            || {
                let ids: Vec<i32> = raw_listed_brokers(&b)?.into_iter().map(|b| b.0).collect();
                if ids == want {
                    Ok(())
                } else {
                    Err(format!("{ids:?}"))
                }
            },
        );
    }

    /// Node `id` (panics when it is killed).
    pub(crate) fn node(&self, id: i32) -> &BinaryBroker {
        self.nodes[(id - 1) as usize]
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is not running"))
    }

    /// Node `id`'s Kafka address, `127.0.0.1:PORT` or its `TestNet` address (the port
    /// changes over a restart).
    pub(crate) fn bootstrap(&self, id: i32) -> String {
        self.node(id).bootstrap.clone()
    }

    /// Every running broker's address, comma-separated (a client's bootstrap list).
    pub(crate) fn bootstrap_all(&self) -> String {
        self.running()
            .filter(|(id, _)| self.roles[(id - 1) as usize].is_broker())
            .map(|(_, n)| n.bootstrap.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The running nodes with their ids.
    pub(crate) fn running(&self) -> impl Iterator<Item = (i32, &BinaryBroker)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i as i32 + 1, n.as_ref()?)))
    }

    /// `controller.quorum.voters` of the three nodes.
    pub(crate) fn voters(&self) -> &str {
        &self.voters
    }

    /// Node `id`'s `log.dirs` (kept over a restart).
    pub(crate) fn log_dir(&self, id: i32) -> &std::path::Path {
        self.dirs[(id - 1) as usize].path()
    }

    /// Node `id`'s CONTROLLER port.
    pub(crate) fn controller_port(&self, id: i32) -> u16 {
        self.ports[(id - 1) as usize]
    }

    /// kill -9 node `id`; returns its stderr.
    pub(crate) fn kill9(&mut self, id: i32) -> String {
        self.nodes[(id - 1) as usize]
            .take()
            .unwrap_or_else(|| panic!("node {id} is not running"))
            .kill9()
    }

    /// Starts node `id` again over its data dir (after [`ThreeNodes::kill9`]).
    pub(crate) fn restart(&mut self, id: i32) {
        assert!(self.nodes[(id - 1) as usize].is_none(), "node {id} runs");
        let node = self.spawn(id);
        self.nodes[(id - 1) as usize] = Some(node);
    }

    /// As [`ThreeNodes::restart`], node `id` also getting `extra` overrides, now and at
    /// every later restart (e.g. its earlier client port, for a restart the quorum
    /// cannot register: the metadata still names the old endpoint).
    pub(crate) fn restart_with(&mut self, id: i32, extra: &[String]) {
        self.node_overrides[(id - 1) as usize].extend(extra.iter().cloned());
        self.restart(id);
    }

    /// Polls (at most `timeout_secs`) until every running node's log names the same
    /// quorum leader, other than `not`, and returns it.
    pub(crate) fn leader_other_than(&self, not: Option<i32>, timeout_secs: u64) -> i32 {
        poll_for(
            "a quorum leader every running node agrees on",
            timeout_secs,
            || {
                let seen: Vec<(i32, Option<i32>)> = self
                    .running()
                    .map(|(id, n)| (id, logged_leader(n)))
                    .collect();
                let first = seen.first().and_then(|s| s.1);
                match first {
                    Some(l) if Some(l) != not && seen.iter().all(|s| s.1 == Some(l)) => Ok(l),
                    _ => Err(format!("leaders logged by (node, leader): {seen:?}")),
                }
            },
        )
    }

    /// The quorum leader every node agrees on (polled, at most 20 s).
    pub(crate) fn leader(&self) -> i32 {
        self.leader_other_than(None, 20)
    }

    /// Fails the test if a running node's stderr shows a panic.
    pub(crate) fn assert_no_panic(&self) {
        for (id, n) in self.running() {
            if let Some(excerpt) = n.panic_excerpt() {
                let text = n.stderr_text();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                panic!(
                    "node {id} panicked:\n{excerpt}\nits last 40 log lines:\n{}",
                    tail.join("\n")
                );
            }
        }
    }
}

impl Drop for ThreeNodes {
    fn drop(&mut self) {
        // Every node killed (`BinaryBroker`'s drop) before its directory goes.
        self.nodes.clear();
    }
}

/// The key of record `i` of [`produce_keyed`]: 97 distinct keys.
pub(crate) fn keyed_key(i: usize) -> String {
    format!("key-{}", i % 97)
}

/// The value of record `i` of [`produce_keyed`] (sorts as `i` does, below 10^6).
pub(crate) fn keyed_value(i: usize) -> String {
    format!("r{i:06}")
}

/// What [`produce_keyed`] got back.
#[derive(Debug, Default)]
pub(crate) struct Produced {
    /// Indexes of the records acknowledged.
    pub(crate) acked: BTreeSet<usize>,
    /// Indexes not acknowledged, with the error.
    pub(crate) failed: Vec<(usize, String)>,
}

impl Produced {
    /// Fails the test unless every one of `n` records was acknowledged.
    pub(crate) fn assert_all_acked(&self, n: usize) {
        assert!(
            self.failed.is_empty(),
            "{} of {n} not acknowledged, first: {:?}",
            self.failed.len(),
            self.failed.first()
        );
        assert_eq!(self.acked.len(), n);
    }
}

/// Produces `n` records (`keyed_key(i)`, `keyed_value(i)`) to `topic` through a librdkafka
/// producer bootstrapped to `bootstrap` with acks=all: all queued, then awaited. Record
/// `i` goes to partition `i % k` when `spread` is `Some(k)`, else where librdkafka's
/// partitioner puts its key. Returns which were acknowledged.
pub(crate) async fn produce_keyed(
    bootstrap: &str,
    topic: &str,
    n: usize,
    spread: Option<i32>,
) -> Produced {
    let p = producer(bootstrap, &[("acks", "all")]);
    let mut deliveries = Vec::with_capacity(n);
    for i in 0..n {
        let (key, value) = (keyed_key(i), keyed_value(i));
        let mut record = FutureRecord::to(topic).key(&key).payload(&value);
        if let Some(k) = spread {
            record = record.partition(i as i32 % k);
        }
        deliveries.push((
            i,
            p.send_result(record).map_err(|(e, _)| e).expect("queued"),
        ));
    }
    let mut out = Produced::default();
    for (i, d) in deliveries {
        match d.await {
            Ok(Ok(_)) => {
                out.acked.insert(i);
            }
            Ok(Err((e, _))) => out.failed.push((i, e.to_string())),
            Err(_) => out
                .failed
                .push((i, "delivery future cancelled".to_string())),
        }
    }
    out
}

/// What [`read_keyed`] read.
#[derive(Debug, Default)]
pub(crate) struct ReadBack {
    /// Record index → how many times it was read.
    pub(crate) seen: BTreeMap<usize, usize>,
    /// Key → the partitions it was read from.
    pub(crate) partitions_of_key: BTreeMap<String, BTreeSet<i32>>,
    /// Records whose key is not `keyed_key` of their value's index, or whose value does
    /// not parse.
    pub(crate) bad: Vec<String>,
}

impl ReadBack {
    /// Fails the test unless every index in `acked` was read exactly once, nothing else
    /// was read, and every key matches its value.
    pub(crate) fn assert_exactly(&self, acked: &BTreeSet<usize>) {
        self.assert_acked_and_maybe(acked, &(0..0));
    }

    /// Fails the test unless every index in `acked` was read exactly once, every other
    /// index read lies in `maybe` and those form a prefix of it (records a leader
    /// appended without acknowledging them may become committed later, Kafka allows
    /// that, but only in log order), nothing was read twice, and every key matches its
    /// value.
    pub(crate) fn assert_acked_and_maybe(
        &self,
        acked: &BTreeSet<usize>,
        maybe: &std::ops::Range<usize>,
    ) {
        let lost: Vec<&usize> = acked
            .iter()
            .filter(|i| !self.seen.contains_key(i))
            .collect();
        let duplicated: Vec<(&usize, &usize)> = self.seen.iter().filter(|(_, n)| **n > 1).collect();
        let unknown: Vec<&usize> = self
            .seen
            .keys()
            .filter(|i| !acked.contains(i) && !maybe.contains(i))
            .collect();
        let maybe_read: Vec<usize> = self
            .seen
            .keys()
            .copied()
            .filter(|i| !acked.contains(i) && maybe.contains(i))
            .collect();
        eprintln!(
            "acknowledged {}, read {}, lost {}, duplicated {}, not acknowledged but read {} \
             (of which {} in the allowed range {maybe:?})",
            acked.len(),
            self.seen.len(),
            lost.len(),
            duplicated.len(),
            unknown.len() + maybe_read.len(),
            maybe_read.len(),
        );
        assert!(
            lost.is_empty(),
            "lost {}, first {:?}",
            lost.len(),
            lost.first()
        );
        assert!(duplicated.is_empty(), "duplicated: {duplicated:?}");
        assert!(
            unknown.is_empty(),
            "read but never acknowledged: {unknown:?}"
        );
        let prefix: Vec<usize> = (maybe.start..maybe.start + maybe_read.len()).collect();
        assert_eq!(
            maybe_read, prefix,
            "unacknowledged records read out of log order (not a prefix of {maybe:?})"
        );
        assert!(self.bad.is_empty(), "{:?}", self.bad);
    }
}

/// Reads `topic`'s partitions `0..partitions` from the beginning through a librdkafka
/// consumer bootstrapped to `bootstrap` (assigned, nothing committed) until `want`
/// records are read or 60 s pass, then 1 s more to catch anything extra.
pub(crate) fn read_keyed(bootstrap: &str, topic: &str, partitions: i32, want: usize) -> ReadBack {
    read_keyed_as(bootstrap, topic, partitions, want, "read_uncommitted")
}

/// [`read_keyed`] by a consumer with `isolation.level` `isolation`.
pub(crate) fn read_keyed_as(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: usize,
    isolation: &str,
) -> ReadBack {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "read-keyed-no-commits")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for part in 0..partitions {
        tpl.add_partition_offset(topic, part, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = ReadBack::default();
    let mut read = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut extra: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if read >= want && extra.is_none() {
            extra = Some(now + Duration::from_secs(1));
        }
        if now > deadline || extra.is_some_and(|e| now > e) {
            break;
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        // librdkafka reports a broker it cannot reach (killed a moment ago, still in its
        // metadata) as a consumer error; it goes on fetching from the others.
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                eprintln!("read_keyed: consumer error (going on): {e}");
                continue;
            }
        };
        read += 1;
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).to_string();
        let value = String::from_utf8_lossy(msg.payload().unwrap_or_default()).to_string();
        match value
            .strip_prefix('r')
            .and_then(|v| v.parse::<usize>().ok())
        {
            Some(i) if keyed_key(i) == key => *out.seen.entry(i).or_default() += 1,
            _ => out.bad.push(format!("{key:?} = {value:?}")),
        }
        out.partitions_of_key
            .entry(key)
            .or_default()
            .insert(msg.partition());
    }
    out
}

/// kcat: `n` keyed records (`keyed_key(i):keyed_value(i)`) from stdin to `topic`, acks=all;
/// fails the test unless kcat delivered them all.
pub(crate) fn kcat_produce(bootstrap: &str, topic: &str, n: usize) {
    let mut input = String::with_capacity(n * 20);
    for i in 0..n {
        input.push_str(&format!("{}:{}\n", keyed_key(i), keyed_value(i)));
    }
    let mut kcat = Command::new("timeout")
        .args(["120", "kcat", "-P", "-b", bootstrap, "-t", topic, "-K:"])
        .args(["-X", "acks=all"])
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat -P");
    kcat.stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .expect("kcat stdin");
    let produced = kcat.wait_with_output().expect("kcat -P");
    assert!(produced.status.success(), "{produced:?}");
}
