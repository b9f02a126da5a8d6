//! Consumer-group benchmark: an in-process broker (release build) and librdkafka consumers.
//!
//! ```text
//! cargo bench --bench groups [-- ROUNDS]
//! ```
//! Figures 1 and 2 are taken for both group protocols, classic and KIP-848's consumer
//! protocol (`group.protocol=consumer`, heartbeats every 500 ms by the broker's
//! `group.consumer.heartbeat.interval.ms`); figure 2 also counts how often one of the nine
//! stable members was left with no partition during a join (classic with librdkafka's
//! default eager assignors: every member gives up everything; consumer protocol: members
//! keep what they keep).
//!
//! Three figures, all measured in the same run against the same broker:
//! 1. **subscribe → first record** for a new consumer in a new group, ROUNDS times (default
//!    5), with the broker's default `group.initial.rebalance.delay.ms` (3000, Kafka's): the
//!    time is the delay plus the broker's and client's own overhead, printed separately.
//! 2. **10-member rebalance**: 9 members are stable; a 10th subscribes and the time until it
//!    holds an assignment (the whole group has synced: the leader's SyncGroup answers every
//!    member at once) is taken, then it closes and the group is let settle; repeated
//!    ROUNDS × 4 times, p50 and p99. Members use `heartbeat.interval.ms=500` (the default
//!    3000 would make the figure mostly the client's heartbeat wait).
//! 3. **group consume vs manual assignment**: 2 M records of 100 B on 6 partitions, read by
//!    one consumer with `assign()` and by 3 group members; the group's time runs from its
//!    first record to the last (the three subscribe together and get their partitions in
//!    one rebalance). Printed as records/s and
//!    the ratio group / manual.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

// The integration tests' broker start (`TestBroker`), shared so benches measure the broker
// the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &AdminOptions::new(),
    ))
    .unwrap();
}

fn produce(bootstrap: &str, topic: &str, n: usize, bytes: usize) {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let value = vec![b'x'; bytes];
    for _ in 0..n {
        let mut r = BaseRecord::<(), [u8]>::to(topic).payload(&value[..]);
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    r = back;
                    p.poll(Duration::from_millis(5));
                }
            }
        }
    }
    p.flush(Duration::from_secs(120)).unwrap();
}

fn consumer(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> BaseConsumer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The client settings of a member of `protocol` ("classic" or "consumer").
fn protocol_settings(protocol: &str) -> Vec<(&'static str, &'static str)> {
    if protocol == "consumer" {
        vec![("group.protocol", "consumer")]
    } else {
        vec![
            ("heartbeat.interval.ms", "500"),
            ("session.timeout.ms", "10000"),
        ]
    }
}

fn subscribe_to_first_record(bootstrap: &str, rounds: usize, protocol: &str) {
    let mut times = Vec::new();
    for i in 0..rounds {
        let extra = if protocol == "consumer" {
            protocol_settings(protocol)
        } else {
            Vec::new()
        };
        let c = consumer(bootstrap, &format!("first-{protocol}-{i}"), &extra);
        let t0 = Instant::now();
        c.subscribe(&["bench-small"]).unwrap();
        loop {
            if let Some(Ok(_)) = c.poll(Duration::from_millis(10)) {
                break;
            }
        }
        times.push(t0.elapsed().as_secs_f64());
        drop(c);
    }
    times.sort_by(f64::total_cmp);
    let p50 = percentile(&times, 0.5);
    if protocol == "consumer" {
        println!(
            "[consumer protocol] subscribe->first record (new group; KIP-848 has no initial rebalance delay): p50 {:.3} s, max {:.3} s",
            p50,
            times[times.len() - 1],
        );
    } else {
        println!(
            "[classic] subscribe->first record (new group, group.initial.rebalance.delay.ms=3000): p50 {:.3} s, max {:.3} s; overhead beyond the delay p50 {:.3} s",
            p50,
            times[times.len() - 1],
            p50 - 3.0
        );
    }
}

/// A member polling on its own thread; `assigned` is its partition count after the last
/// rebalance (-1 before the first).
struct Member {
    stop: Arc<AtomicBool>,
    assigned: Arc<Mutex<Option<usize>>>,
    /// Times its assignment went from some partitions to none.
    emptied: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    fn start(bootstrap: &str, group: &str, protocol: &str) -> Member {
        let c = consumer(bootstrap, group, &protocol_settings(protocol));
        c.subscribe(&["bench-small"]).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let assigned = Arc::new(Mutex::new(None));
        let emptied = Arc::new(AtomicUsize::new(0));
        let (s, a, e) = (stop.clone(), assigned.clone(), emptied.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = c.poll(Duration::from_millis(20));
                if let Ok(tpl) = c.assignment() {
                    let n = tpl.count();
                    let mut g = a.lock().unwrap();
                    if n == 0 && g.is_some_and(|before| before > 0) {
                        e.fetch_add(1, Ordering::Relaxed);
                    }
                    if n > 0 || g.is_some() {
                        *g = Some(n);
                    }
                }
            }
            c.unsubscribe();
            drop(c);
        });
        Member {
            stop,
            assigned,
            emptied,
            thread: Some(thread),
        }
    }

    fn assigned(&self) -> Option<usize> {
        *self.assigned.lock().unwrap()
    }

    fn close(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn ten_member_rebalance(bootstrap: &str, rounds: usize, protocol: &str) {
    let group = format!("ten-{protocol}");
    let members: Vec<Member> = (0..9)
        .map(|_| Member::start(bootstrap, &group, protocol))
        .collect();
    let settled = |ms: &[Member], n: usize| {
        ms.iter().filter_map(Member::assigned).sum::<usize>() == 12
            && ms.iter().filter(|m| m.assigned().is_some()).count() == n
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !settled(&members, 9) {
        assert!(Instant::now() < deadline, "9 members did not settle");
        std::thread::sleep(Duration::from_millis(20));
    }
    let emptied_before: usize = members
        .iter()
        .map(|m| m.emptied.load(Ordering::Relaxed))
        .sum();
    let mut times = Vec::new();
    for _ in 0..rounds * 4 {
        let t0 = Instant::now();
        let tenth = Member::start(bootstrap, &group, protocol);
        while tenth.assigned().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the 10th member got nothing"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        times.push(t0.elapsed().as_secs_f64());
        tenth.close();
        let t1 = Instant::now();
        while !settled(&members, 9) {
            assert!(
                t1.elapsed() < Duration::from_secs(60),
                "the group did not settle"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let emptied: usize = members
        .iter()
        .map(|m| m.emptied.load(Ordering::Relaxed))
        .sum::<usize>()
        - emptied_before;
    times.sort_by(f64::total_cmp);
    println!(
        "[{protocol}] 10-member group, a member joins -> it holds an assignment ({} joins and leaves, heartbeats every 500 ms): p50 {:.3} s, p99 {:.3} s; a stable member left with no partition {} times",
        times.len(),
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        emptied
    );
    for m in members {
        m.close();
    }
}

fn consume_throughput(bootstrap: &str, records: usize) {
    // Manual assignment: one consumer, every partition from the beginning.
    let c = consumer(bootstrap, "manual", &[]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition_offset("bench-big", p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let t0 = Instant::now();
    let mut n = 0;
    while n < records {
        if let Some(Ok(_)) = c.poll(Duration::from_millis(100)) {
            n += 1;
        }
    }
    let manual = records as f64 / t0.elapsed().as_secs_f64();
    drop(c);

    // Three group members; the clock starts at the first record any of them reads (they
    // subscribe together, so one rebalance gives all three their partitions at once).
    let total = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Mutex::new(None::<Instant>));
    let mut threads = Vec::new();
    for _ in 0..3 {
        let c = consumer(bootstrap, "three", &[]);
        c.subscribe(&["bench-big"]).unwrap();
        let (total, start) = (total.clone(), start.clone());
        threads.push(std::thread::spawn(move || {
            let mut partitions = BTreeSet::new();
            while total.load(Ordering::Relaxed) < records {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                    partitions.insert(m.partition());
                    if total.fetch_add(1, Ordering::Relaxed) == 0 {
                        *start.lock().unwrap() = Some(Instant::now());
                    }
                }
            }
            partitions.len()
        }));
    }
    let per_member: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let started = start.lock().unwrap().expect("records were read");
    let group = records as f64 / started.elapsed().as_secs_f64();
    println!(
        "consume {records} x 100 B on 6 partitions: manual assign {:.0} rec/s, 3 group members {:.0} rec/s (partitions read per member {:?}); group/manual = {:.2}",
        manual,
        group,
        per_member,
        group / manual
    );
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| a != "--bench")
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let broker = harness::TestBroker::start_in(
        dir.path(),
        &[
            "admin.listeners=",
            "group.consumer.heartbeat.interval.ms=500",
        ],
    );
    let bootstrap = broker.bootstrap.clone();
    create_topic(&bootstrap, "bench-small", 12);
    create_topic(&bootstrap, "bench-big", 6);
    produce(&bootstrap, "bench-small", 1200, 100);
    for protocol in ["classic", "consumer"] {
        subscribe_to_first_record(&bootstrap, rounds, protocol);
        ten_member_rebalance(&bootstrap, rounds, protocol);
    }
    let records = 2_000_000;
    produce(&bootstrap, "bench-big", records, 100);
    consume_throughput(&bootstrap, records);
    broker.stop();
}
