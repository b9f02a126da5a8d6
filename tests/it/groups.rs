//! Consumer groups with real clients: confluent-kafka, kafka-python and kafkajs members
//! (tests/compat/group_member.{py,js}, one process each, so a member can be closed or
//! killed with SIGKILL) and librdkafka from Rust; raw frames for the cases real clients
//! never send (old versions, bad input, every advertised version).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

use crate::harness::{repo_root, wait_until, TestBroker};

/// One group member process and what it has printed so far.
pub(crate) struct Member {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Member {
    /// Starts `group_member.py` (confluent-kafka, kafka-python), `group_member.js`
    /// (kafkajs) or `kip848_member.mjs` (platformatic: @platformatic/kafka on KIP-848's
    /// consumer protocol) with extra options.
    pub(crate) fn spawn(
        client: &str,
        bootstrap: &str,
        topic: &str,
        group: &str,
        extra: &[&str],
    ) -> Member {
        let mut cmd = if client == "kafkajs" {
            let mut c = Command::new("node");
            c.arg("tests/compat/group_member.js");
            c
        } else if client == "platformatic" {
            let mut c = Command::new("node");
            c.arg("tests/compat/kip848_member.mjs");
            c
        } else {
            let mut c = Command::new("python3");
            c.arg("tests/compat/group_member.py");
            c
        };
        cmd.args([bootstrap, topic, group, client])
            .args(extra)
            .current_dir(repo_root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .expect("spawn group member (tests/install-deps.sh)");
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Member {
            name: format!("{client}-{}", child.id()),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The last reported assignment (`None` before the first).
    pub(crate) fn assignment(&self) -> Option<BTreeSet<i32>> {
        self.lines()
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("assigned "))
            .map(|a| {
                a.split(',')
                    .filter(|p| *p != "-")
                    .map(|p| p.parse().unwrap())
                    .collect()
            })
    }

    pub(crate) fn assignment_changes(&self) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.starts_with("assigned "))
            .count()
    }

    /// `(partition, offset)` of every record read, in order.
    pub(crate) fn records(&self) -> Vec<(i32, i64)> {
        self.events("record ")
    }

    /// Last committed offset per partition.
    pub(crate) fn last_commits(&self) -> BTreeMap<i32, i64> {
        self.events("committed ").into_iter().collect()
    }

    fn events(&self, prefix: &str) -> Vec<(i32, i64)> {
        self.lines()
            .iter()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|r| {
                let mut it = r.split(' ');
                (
                    it.next().unwrap().parse().unwrap(),
                    it.next().unwrap().parse().unwrap(),
                )
            })
            .collect()
    }

    /// Clean stop: stdin closes, the member commits and leaves the group.
    pub(crate) fn close(&mut self) {
        self.stdin.take();
        wait_until(&format!("{} closes", self.name), 60, || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ))
        .unwrap();
    assert!(r[0].is_ok(), "create {topic}: {:?}", r[0]);
}

/// Produces `n` records, record i to partition i % partitions, acks=all.
pub(crate) fn produce(bootstrap: &str, topic: &str, partitions: i32, n: usize, tag: &str) {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for i in 0..n {
        let value = format!("{tag}-{i}");
        let key = format!("k{i}");
        let mut record = BaseRecord::to(topic)
            .key(&key)
            .payload(&value)
            .partition(i as i32 % partitions);
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    // Back-off while librdkafka's queue is full (its thread drains it).
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

pub(crate) fn assignments(members: &[&Member]) -> Vec<Option<BTreeSet<i32>>> {
    members.iter().map(|m| m.assignment()).collect()
}

/// True when the members' assignments are disjoint and cover 0..partitions.
pub(crate) fn covers(members: &[&Member], partitions: i32) -> bool {
    let mut seen = BTreeSet::new();
    for a in assignments(members) {
        let Some(a) = a else { return false };
        for p in a {
            if !seen.insert(p) {
                return false;
            }
        }
    }
    seen == (0..partitions).collect()
}

pub(crate) fn all_records(members: &[&Member]) -> Vec<(i32, i64)> {
    members.iter().flat_map(|m| m.records()).collect()
}

/// Issue case 1: queue semantics inside a group (each record once, 2 partitions each),
/// broadcast across groups.
#[test]
fn three_members_share_six_partitions_and_another_group_reads_everything() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "queue", 6);
    let members: Vec<Member> = (0..3)
        .map(|_| Member::spawn("confluent-kafka", &b.bootstrap, "queue", "q", &[]))
        .collect();
    let refs: Vec<&Member> = members.iter().collect();
    wait_until("3 members own 2 partitions each", 60, || {
        covers(&refs, 6)
            && assignments(&refs)
                .iter()
                .all(|a| a.as_ref().unwrap().len() == 2)
    });
    produce(&b.bootstrap, "queue", 6, 600, "q");
    wait_until("the group read 600 records", 60, || {
        all_records(&refs).len() >= 600
    });
    let read = all_records(&refs);
    let unique: BTreeSet<_> = read.iter().copied().collect();
    assert_eq!(read.len(), 600, "a record was read twice inside one group");
    assert_eq!(unique.len(), 600);
    for m in &members {
        let mine: BTreeSet<i32> = m.records().iter().map(|r| r.0).collect();
        assert_eq!(
            Some(mine),
            m.assignment(),
            "{} read outside its assignment",
            m.name
        );
    }
    let other = Member::spawn("confluent-kafka", &b.bootstrap, "queue", "broadcast", &[]);
    wait_until("a second group reads all 600 again", 60, || {
        other.records().len() >= 600
    });
    let again: BTreeSet<_> = other.records().into_iter().collect();
    assert_eq!(again, unique);
}

/// Issue case 2: an idle 4th member takes over when a member closes; a member killed -9
/// loses its partitions after session.timeout.ms. Nothing is lost; duplicates only at or
/// after the dead member's last commit.
#[test]
fn idle_member_takes_over_and_a_killed_members_partitions_move() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "idle", 3);
    let mut members: Vec<Member> = (0..4)
        .map(|_| {
            Member::spawn(
                "confluent-kafka",
                &b.bootstrap,
                "idle",
                "g",
                &["--session-ms", "6000"],
            )
        })
        .collect();
    wait_until(
        "3 members own one partition each and one is idle",
        60,
        || {
            let refs: Vec<&Member> = members.iter().collect();
            let sizes: Vec<usize> = assignments(&refs)
                .iter()
                .map(|a| a.as_ref().map_or(99, |a| a.len()))
                .collect();
            covers(&refs, 3) && sizes.iter().filter(|s| **s == 0).count() == 1
        },
    );
    produce(&b.bootstrap, "idle", 3, 150, "one");
    wait_until("150 records read", 60, || {
        all_records(&members.iter().collect::<Vec<_>>()).len() >= 150
    });
    let idle = members
        .iter()
        .position(|m| m.assignment().unwrap().is_empty())
        .unwrap();
    let closing = (idle + 1) % 4;
    members[closing].close();
    wait_until(
        "the idle member takes over the closed member's partition",
        60,
        || members[idle].assignment().is_some_and(|a| a.len() == 1),
    );
    let killed = (idle + 2) % 4;
    let killed_partition = *members[killed].assignment().unwrap().iter().next().unwrap();
    members[killed].kill9();
    let survivors: Vec<usize> = (0..4).filter(|i| *i != closing && *i != killed).collect();
    wait_until(
        "the killed member's partition moves after the session timeout",
        60,
        || {
            let refs: Vec<&Member> = survivors.iter().map(|i| &members[*i]).collect();
            covers(&refs, 3)
        },
    );
    produce(&b.bootstrap, "idle", 3, 150, "two");
    wait_until("every record read at least once", 60, || {
        let read: BTreeSet<_> = all_records(&members.iter().collect::<Vec<_>>())
            .into_iter()
            .collect();
        read.len() >= 300
    });
    let read = all_records(&members.iter().collect::<Vec<_>>());
    let mut count: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in &read {
        *count.entry(*r).or_default() += 1;
    }
    for p in 0..3 {
        for o in 0..100 {
            assert!(count.contains_key(&(p, o)), "record {p}/{o} lost");
        }
    }
    let killed_commit = members[killed].last_commits();
    for ((p, o), n) in count {
        if n > 1 {
            assert_eq!(
                p, killed_partition,
                "duplicate {p}/{o} outside the killed member's partition"
            );
            let committed = killed_commit.get(&p).copied().unwrap_or(0);
            assert!(
                o >= committed,
                "duplicate {p}/{o} below the last commit {committed}"
            );
        }
    }
}

/// Issue case 3: committed offsets survive a broker restart, and consumers with
/// auto.offset.reset=latest resume exactly there.
#[test]
fn committed_offsets_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = TestBroker::start_in(dir.path(), &[]);
    create_topic(&b.bootstrap, "resume", 2);
    produce(&b.bootstrap, "resume", 2, 100, "before");
    let mut first = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "resume",
        "r",
        &["--max", "60"],
    );
    wait_until("the first consumer reads 60 and stops", 60, || {
        first.lines().iter().any(|l| l == "closed")
    });
    let commits = first.last_commits();
    first.close();
    b.stop();

    let b = TestBroker::start_in(dir.path(), &[]);
    produce(&b.bootstrap, "resume", 2, 40, "after");
    let again = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "resume",
        "r",
        &["--reset", "latest"],
    );
    wait_until("the restarted consumer reads the other 80", 60, || {
        again.records().len() >= 80
    });
    let read = again.records();
    for p in 0..2 {
        let first_read = read.iter().find(|r| r.0 == p).map(|r| r.1);
        assert_eq!(
            first_read,
            Some(commits[&p]),
            "partition {p} did not resume at its committed offset"
        );
    }
    assert_eq!(read.len(), 80, "records read twice or skipped: {read:?}");
}

/// Issue case 4: kafka-python and kafkajs (range and round-robin) and librdkafka with
/// cooperative-sticky complete rebalances as members join and leave.
#[test]
fn every_client_rebalances_as_members_join_and_leave() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "rebal", 6);
    let cases: [(&str, &str); 5] = [
        ("kafka-python", "range"),
        ("kafka-python", "roundrobin"),
        ("kafkajs", "range"),
        ("kafkajs", "roundrobin"),
        ("confluent-kafka", "cooperative-sticky"),
    ];
    for (client, assignor) in cases {
        let group = format!("{client}-{assignor}");
        let spawn = || {
            Member::spawn(
                client,
                &b.bootstrap,
                "rebal",
                &group,
                &["--assignor", assignor, "--session-ms", "10000"],
            )
        };
        let mut a = spawn();
        let mut m2 = spawn();
        wait_until(
            &format!("{group}: 2 members cover 6 partitions"),
            90,
            || covers(&[&a, &m2], 6),
        );
        let m3 = spawn();
        wait_until(
            &format!("{group}: 3 members cover 6 partitions"),
            90,
            || {
                covers(&[&a, &m2, &m3], 6)
                    && [&a, &m2, &m3]
                        .iter()
                        .all(|m| m.assignment().is_some_and(|s| s.len() == 2))
            },
        );
        m2.close();
        wait_until(
            &format!("{group}: 2 members cover 6 partitions again"),
            90,
            || covers(&[&a, &m3], 6),
        );
        a.close();
        wait_until(
            &format!("{group}: the last member owns everything"),
            90,
            || covers(&[&m3], 6),
        );
    }
}

/// Issue case 5: a static member restarted within its session timeout gets its partitions
/// back and the other member sees no rebalance.
#[test]
fn a_restarted_static_member_gets_its_partitions_without_a_rebalance() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "static", 4);
    let opts = |id: &'static str| ["--instance-id", id, "--session-ms", "30000"];
    let a = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "static",
        "s",
        &opts("member-a"),
    );
    let mut bm = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "static",
        "s",
        &opts("member-b"),
    );
    wait_until("two static members cover 4 partitions", 60, || {
        covers(&[&a, &bm], 4)
    });
    let before_a = a.assignment_changes();
    let b_parts = bm.assignment().unwrap();
    bm.kill9();
    let restarted = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "static",
        "s",
        &opts("member-b"),
    );
    wait_until("the restarted member has its partitions", 60, || {
        restarted.assignment().is_some()
    });
    assert_eq!(restarted.assignment().unwrap(), b_parts);
    // Proves an absence: give a rebalance, if one were coming, time to reach the other
    // member (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        a.assignment_changes(),
        before_a,
        "the other member saw a rebalance"
    );
    assert!(covers(&[&a, &restarted], 4));
}

/// `__consumer_offsets` is created through the same path as a client's CreateTopics, all
/// or nothing: when one of its partition logs cannot be created (a file where its directory
/// goes), FindCoordinator answers COORDINATOR_NOT_AVAILABLE and nothing is left half
/// created — no topic in the metadata, no partition directory, nothing in the metadata log
/// (a restart brings none of it back). Once the obstacle is gone the next FindCoordinator
/// creates it, and a real consumer commits and reads back.
#[test]
fn a_failed_offsets_topic_creation_leaves_nothing_behind() {
    use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
    use kafka_protocol::protocol::StrBytes;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    use crate::harness::{decode, RawConn};

    let dir = tempfile::tempdir().unwrap();
    let overrides = ["offsets.topic.num.partitions=4"];
    let b = TestBroker::start_in(dir.path(), &overrides);
    let blocker = b.data_dir.join("__consumer_offsets-2");
    std::fs::write(&blocker, "not a partition directory").unwrap();
    let find = |bootstrap: &str, id: i32| -> i16 {
        let mut c = RawConn::connect(bootstrap);
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str("g"))
            .with_key_type(0);
        let r: FindCoordinatorResponse = decode(c.request(&req, 3, id).unwrap(), 3);
        r.error_code
    };
    assert_eq!(find(&b.bootstrap, 1), 15, "COORDINATOR_NOT_AVAILABLE");
    let metadata = |bootstrap: &str| -> Vec<String> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .unwrap();
        let md = c.fetch_metadata(None, Duration::from_secs(10)).unwrap();
        md.topics().iter().map(|t| t.name().to_string()).collect()
    };
    let nothing_left = |b: &TestBroker, when: &str| {
        assert!(
            !metadata(&b.bootstrap).contains(&"__consumer_offsets".to_string()),
            "the topic was left in the metadata ({when})"
        );
        for i in [0, 1, 3] {
            let dir = b.data_dir.join(format!("__consumer_offsets-{i}"));
            assert!(!dir.exists(), "{} was left behind ({when})", dir.display());
        }
        assert!(blocker.is_file(), "what was not ours stays");
    };
    nothing_left(&b, "after the failed creation");
    // Nothing reached the metadata log either: had the creation been committed, the
    // restart's replay would list the topic and open its partitions 0, 1 and 3 (or fail
    // to start on partition 2).
    b.stop();
    let b = TestBroker::start_in(dir.path(), &overrides);
    nothing_left(&b, "after a restart");

    std::fs::remove_file(&blocker).unwrap();
    assert_eq!(find(&b.bootstrap, 2), 0);
    for i in 0..4 {
        assert!(b.data_dir.join(format!("__consumer_offsets-{i}")).is_dir());
    }
    assert!(metadata(&b.bootstrap).contains(&"__consumer_offsets".to_string()));

    create_topic(&b.bootstrap, "work", 1);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "g")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("work", 0, Offset::Offset(0))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
    let mut wanted = TopicPartitionList::new();
    wanted.add_partition("work", 0);
    let committed = consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        committed.find_partition("work", 0).unwrap().offset(),
        Offset::Offset(0)
    );
}
