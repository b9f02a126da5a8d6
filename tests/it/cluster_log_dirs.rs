//! Issue 15: a failed log dir on a cluster takes only its partitions offline (KIP-112,
//! KIP-858). Node 1 of three has two log dirs; its dir `b` fails under acks=all load,
//! either filled to ENOSPC (a 2 MiB tmpfs; root only) or by a partition directory
//! replaced with a plain file, so the next segment roll fails. Its replicas there are
//! reported offline: their leaderships move within a bound, Metadata lists them in
//! `offline_replicas` and not in the ISR, producing goes on through the new leader, and
//! every acknowledged record is read back once. Its partitions in dir `a` keep their
//! roles. Restarted with the dir fixed, node 1's replicas rejoin the ISR.
//!
//! Bounded: every wait has a deadline; `ThreeNodes`' drop kills the nodes, the tmpfs is
//! unmounted on every path.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::FutureRecord;

use crate::cluster_fixture::{keyed_key, keyed_value, read_keyed, ThreeNodes};
use crate::harness::{decode, poll_for, RawConn};
use crate::rdkafka_client::{admin, producer};

const T: &str = "faildir";
const PARTITIONS: i32 = 4;

/// Longest a leadership may take to leave the failed dir.
const FAILOVER_BOUND: Duration = Duration::from_secs(15);

/// How dir `b` is made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// A 2 MiB tmpfs filled to ENOSPC.
    Full,
    /// The partition's directory replaced by a plain file: the next roll fails.
    Replaced,
}

/// Unmounts its tmpfs when dropped (lazily: a node may still hold files in it).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// One partition as a node's Metadata v12 lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    error: i16,
    leader: i32,
    leader_epoch: i32,
    isr: Vec<i32>,
    offline: Vec<i32>,
}

/// Every partition of `T` as node `via` lists it (raw Metadata v12 to that node).
fn listed(nodes: &ThreeNodes, via: i32) -> Result<Vec<Listed>, String> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut conn = RawConn::connect(&nodes.bootstrap(via));
    let req = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str(T))))]));
    let body = conn
        .request(&req, 12, 1)
        .ok_or_else(|| "no Metadata answer".to_string())?;
    let m: MetadataResponse = decode(body, 12);
    let t = m.topics.first().ok_or("no topic")?;
    let mut out: Vec<(i32, Listed)> = t
        .partitions
        .iter()
        .map(|p| {
            (
                p.partition_index,
                Listed {
                    error: p.error_code,
                    leader: p.leader_id.0,
                    leader_epoch: p.leader_epoch,
                    isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                    offline: p.offline_replicas.iter().map(|b| b.0).collect(),
                },
            )
        })
        .collect();
    out.sort_by_key(|(i, _)| *i);
    if out.len() != PARTITIONS as usize {
        return Err(format!("{} partitions listed", out.len()));
    }
    Ok(out.into_iter().map(|(_, l)| l).collect())
}

/// Indexes of `T`'s partition directories in `dir`.
fn partitions_in(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    name.strip_prefix(&format!("{T}-"))?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Produces records `range` (`keyed_key(i)`, `keyed_value(i)`, partition `i % 4`) with an
/// idempotent acks=all producer: all queued, then awaited. Returns the acknowledged ones
/// and the first error.
async fn produce(bootstrap: &str, range: std::ops::Range<usize>) -> (Vec<usize>, Option<String>) {
    let p = producer(
        bootstrap,
        &[
            ("acks", "all"),
            ("enable.idempotence", "true"),
            ("message.timeout.ms", "60000"),
        ],
    );
    let mut deliveries = Vec::new();
    for i in range {
        let (key, value) = (keyed_key(i), keyed_value(i));
        let record = FutureRecord::to(T)
            .key(&key)
            .payload(&value)
            .partition(i as i32 % PARTITIONS);
        deliveries.push((
            i,
            p.send_result(record).map_err(|(e, _)| e).expect("queued"),
        ));
    }
    let (mut acked, mut error) = (Vec::new(), None);
    for (i, d) in deliveries {
        match d.await {
            Ok(Ok(_)) => acked.push(i),
            Ok(Err((e, _))) => {
                error.get_or_insert(format!("record {i}: {e}"));
            }
            Err(_) => {
                error.get_or_insert(format!("record {i}: delivery cancelled"));
            }
        }
    }
    (acked, error)
}

/// Fills the file system of `dir` until a write fails (ENOSPC).
fn fill(dir: &Path) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    for _ in 0..64 {
        if f.write_all(&chunk).and_then(|()| f.sync_all()).is_err() {
            return;
        }
    }
    panic!("4 MiB went into a 2 MiB tmpfs");
}

async fn a_failed_dir_moves_its_leaderships_away(way: Way) {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let mut way = way;
    let mut mounted = None;
    if way == Way::Full {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
            .arg(&b)
            .output();
        if out.as_ref().is_ok_and(|o| o.status.success()) {
            mounted = Some(Mounted(b.clone()));
        } else {
            eprintln!(
                "cannot mount a tmpfs ({out:?}); the dir fails by a partition directory \
                 replaced with a file instead"
            );
            way = Way::Replaced;
        }
    }
    let dirs = format!("log.dirs={},{}", a.display(), b.display());
    let mut nodes = ThreeNodes::start_each(3, &[], |id| {
        if id == 1 {
            vec![dirs.clone()]
        } else {
            Vec::new()
        }
    });
    // Node 1 is the first replica (the leader) of partitions 0, 1 and 3; its four
    // replicas are spread over its two dirs.
    let assignment: [&[i32]; 4] = [&[1, 2, 3], &[1, 3, 2], &[2, 3, 1], &[1, 2, 3]];
    let topic = NewTopic::new(T, PARTITIONS, TopicReplication::Variable(&assignment))
        .set("segment.bytes", "4096");
    let created = admin(&nodes.bootstrap(2))
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    poll_for(
        "every partition led by its first replica, ISR full",
        30,
        || {
            let l = listed(&nodes, 2)?;
            let ok = l
                .iter()
                .zip(assignment)
                .all(|(p, r)| p.leader == r[0] && p.isr.len() == 3);
            ok.then_some(()).ok_or(format!("{l:?}"))
        },
    );
    let (in_a, in_b) = (partitions_in(&a), partitions_in(&b));
    let led = |i: &&i32| assignment[**i as usize][0] == 1;
    let failing = *in_b
        .iter()
        .find(led)
        .unwrap_or_else(|| panic!("a {in_a:?} b {in_b:?}"));
    let healthy: Vec<i32> = in_a.iter().filter(led).copied().collect();
    assert!(!healthy.is_empty(), "a {in_a:?} b {in_b:?}");
    eprintln!("way {way:?}: dir a holds {in_a:?}, dir b {in_b:?}; {failing} fails");

    // Before: every record acknowledged.
    let bootstrap = nodes.bootstrap_all();
    let mut acked: Vec<usize> = Vec::new();
    let (got, error) = produce(&bootstrap, 0..400).await;
    assert_eq!((got.len(), &error), (400, &None));
    acked.extend(got);
    let before = listed(&nodes, 2).unwrap();

    // The dir fails; the next appends to it meet the error.
    match way {
        Way::Full => fill(&b),
        Way::Replaced => {
            let dir = b.join(format!("{T}-{failing}"));
            std::fs::remove_dir_all(&dir).unwrap();
            std::fs::write(&dir, b"not a directory").unwrap();
        }
    }
    let failed_at = Instant::now();
    let load = {
        let bootstrap = bootstrap.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for round in 0..4 {
                let from = 400 + round * 400;
                out.push(produce(&bootstrap, from..from + 400).await);
            }
            out
        })
    };
    // Leadership moves within the bound, as every node lists.
    let moved = tokio::task::block_in_place(|| {
        poll_for(
            "the failing partition's leadership moves",
            FAILOVER_BOUND.as_secs(),
            || {
                let l = listed(&nodes, 2)?;
                let p = &l[failing as usize];
                (p.leader != 1 && p.leader != -1)
                    .then_some(failed_at.elapsed())
                    .ok_or(format!("{p:?}"))
            },
        )
    });
    eprintln!(
        "leadership of {T}-{failing} moved {} ms after the dir failed",
        moved.as_millis()
    );
    let rounds = load.await.unwrap();
    for (got, error) in rounds {
        assert_eq!(
            error, None,
            "acks=all production stops through the new leader"
        );
        acked.extend(got);
    }
    assert_eq!(acked.len(), 2000);
    for via in 1..=3 {
        let l = tokio::task::block_in_place(|| listed(&nodes, via)).unwrap();
        // Every partition of the failed dir (the whole dir goes offline) moved.
        for &f in &in_b {
            let p = &l[f as usize];
            assert!(p.leader == 2 || p.leader == 3, "node {via}, {f}: {p:?}");
            assert_eq!(
                (p.error, &p.offline[..]),
                (0, &[1][..]),
                "node {via}, {f}: {p:?}"
            );
            assert!(
                !p.isr.contains(&1) && p.isr.len() == 2,
                "node {via}, {f}: {p:?}"
            );
        }
        // The partitions of node 1's healthy dir keep their roles (leaders, epochs, ISR).
        for &h in &in_a {
            let (p, was) = (&l[h as usize], &before[h as usize]);
            assert_eq!(
                (p.leader, p.leader_epoch, p.isr.len(), p.offline.len()),
                (was.leader, was.leader_epoch, 3, 0),
                "node {via}, partition {h}: {p:?}"
            );
        }
    }
    let want = acked.len();
    let read = tokio::task::block_in_place(|| read_keyed(&bootstrap, T, PARTITIONS, want));
    read.assert_exactly(&acked.iter().copied().collect());
    assert!(
        nodes.node(1).stderr_text().contains("reported offline"),
        "{}",
        nodes.node(1).stderr_text()
    );

    // Restarted with the dir fixed (the tmpfs gone, the file removed): node 1's replica
    // comes back, empty, catches up and rejoins the ISR.
    nodes.kill9(1);
    match way {
        Way::Full => drop(mounted.take()),
        Way::Replaced => std::fs::remove_file(b.join(format!("{T}-{failing}"))).unwrap(),
    }
    nodes.restart(1);
    tokio::task::block_in_place(|| {
        poll_for("node 1 back in every ISR", 60, || {
            let l = listed(&nodes, 2)?;
            l.iter()
                .all(|p| p.isr.len() == 3 && p.offline.is_empty())
                .then_some(())
                .ok_or(format!("{l:?}"))
        })
    });
    let bootstrap = nodes.bootstrap_all();
    let read = tokio::task::block_in_place(|| read_keyed(&bootstrap, T, PARTITIONS, want));
    read.assert_exactly(&acked.iter().copied().collect());
    nodes.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_dir_moves_its_leaderships_away_and_a_restart_brings_its_replicas_back() {
    a_failed_dir_moves_its_leaderships_away(Way::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dir_failing_at_a_roll_moves_its_leaderships_away_and_a_restart_brings_them_back() {
    a_failed_dir_moves_its_leaderships_away(Way::Replaced).await;
}
