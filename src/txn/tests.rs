//! State-machine tests of the transaction coordinator over a real `__transaction_state`
//! (and partition logs) in a temporary directory, on one node.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::cluster::NewTopic;
use crate::config::BrokerConfig;
use crate::group::GroupCoordinator;
use crate::purgatory::Purgatory;
use crate::replica::ReplicaManager;

/// A coordinator over the broker state in `dir` (topic "t", 3 partitions, made when new),
/// as a (re)started broker builds it; `timeout_check_ms` is the abort timer's period.
fn open_in(dir: &Path) -> Arc<TransactionCoordinator> {
    let mut config = BrokerConfig::defaults();
    config.set_single_dir(dir);
    config.transaction.state_log_num_partitions = 3;
    config.transaction.max_timeout_ms = 60_000;
    config.transaction.id_expiration_ms = 60_000;
    config.group.offsets_topic_num_partitions = 3;
    let config = Arc::new(config);
    let metadata = Arc::new(Metadata::open(dir, 1).unwrap());
    let replicas =
        ReplicaManager::open(config.clone(), &metadata, Arc::new(Purgatory::new(10))).unwrap();
    metadata
        .ensure_topic(NewTopic {
            name: "t".to_string(),
            partitions: 3,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignment: Vec::new(),
        })
        .unwrap();
    let groups =
        Arc::new(GroupCoordinator::open(metadata.clone(), replicas.clone(), config.group).unwrap());
    let txn = TransactionCoordinator::new(metadata, replicas, groups, config);
    txn.ensure_state_topic().unwrap();
    txn
}

fn parts(list: &[i32]) -> Vec<(String, i32)> {
    list.iter().map(|p| ("t".to_string(), *p)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_bumps_the_epoch_and_keeps_the_producer_id() {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    assert_eq!(epoch, 0);
    let (pid2, epoch2) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    assert_eq!((pid2, epoch2), (pid, 1));
    // Another id: another producer id.
    let (other, _) = txn.init_producer_id("b", 10_000, None).await.unwrap();
    assert_ne!(other, pid);
    // KIP-360: a producer that is no longer current is fenced.
    assert_eq!(
        txn.init_producer_id("a", 10_000, Some((pid, 7))).await,
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        txn.init_producer_id("a", 60_001, None).await,
        Err(ResponseError::InvalidTransactionTimeout)
    );
    assert_eq!(
        txn.init_producer_id("", 1000, None).await,
        Err(ResponseError::InvalidRequest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_checks_follow_kafkas_order() {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    assert_eq!(
        txn.add_partitions("a", pid + 1, epoch, &parts(&[0])).await,
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        txn.add_partitions("unknown", pid, epoch, &parts(&[0]))
            .await,
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        txn.add_partitions("a", pid, epoch + 1, &parts(&[0])).await,
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        txn.end_txn("a", pid, epoch, true).await,
        Err(ResponseError::InvalidTxnState),
        "nothing open"
    );
    txn.add_partitions("a", pid, epoch, &parts(&[0, 1]))
        .await
        .unwrap();
    let d = txn.describe("a").unwrap();
    assert_eq!(d.state, TxnState::Ongoing);
    assert_eq!(d.partitions, parts(&[0, 1]));
    assert!(d.start_ms > 0);
    // Verification (KIP-890): in the transaction or not.
    assert_eq!(
        txn.verify_partitions("a", pid, epoch, &parts(&[1, 2]))
            .unwrap(),
        vec![None, Some(ResponseError::InvalidTxnState)]
    );
    assert_eq!(
        txn.describe("nope").err(),
        Some(ResponseError::TransactionalIdNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_reloaded_from_the_log_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (pid, epoch) = {
        let txn = open_in(dir.path());
        let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
        txn.add_partitions("a", pid, epoch, &parts(&[2]))
            .await
            .unwrap();
        (pid, epoch)
    };
    let txn = open_in(dir.path());
    let d = txn.describe("a").unwrap();
    assert_eq!(
        (
            d.producer_id,
            d.producer_epoch,
            d.state,
            d.partitions.clone()
        ),
        (pid, epoch, TxnState::Ongoing, parts(&[2]))
    );
    assert_eq!(txn.list().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_of_one_id_never_lose_a_partition() {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    for round in 0..20 {
        let (x, y) = (txn.clone(), txn.clone());
        let first =
            tokio::spawn(async move { x.add_partitions("a", pid, epoch, &parts(&[0])).await });
        let second =
            tokio::spawn(async move { y.add_partitions("a", pid, epoch, &parts(&[1])).await });
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        for r in [&first, &second] {
            assert!(
                matches!(r, Ok(()) | Err(ResponseError::ConcurrentTransactions)),
                "round {round}: {r:?}"
            );
        }
        let d = txn.describe("a").unwrap();
        for (r, p) in [(&first, 0), (&second, 1)] {
            if r.is_ok() {
                assert!(
                    d.partitions.contains(&("t".to_string(), p)),
                    "round {round}: {d:?}"
                );
            }
        }
        // What memory says is what the log says: a restart finds the same partitions.
        let reloaded = open_in(dir.path()).describe("a").unwrap();
        assert_eq!(reloaded.partitions, d.partitions, "round {round}");
        txn.end_txn("a", pid, epoch, false).await.ok();
        let _ = txn.wait_completed("a", 2000).await;
    }
}

/// Puts `id`'s open transaction in PrepareCommit in memory only, as EndTxn does once it
/// is logged, and returns whether a completion was already marked running.
fn prepare_commit_in_memory(txn: &TransactionCoordinator, id: &str) -> bool {
    let mut txns = txn.lock();
    let e = txns.get_mut(id).unwrap();
    e.record.state = TxnState::PrepareCommit;
    e.completing
}

/// Waits (at most 10 s) until `id` is CompleteCommit.
async fn wait_complete_commit(txn: &TransactionCoordinator, id: &str) {
    for _ in 0..200 {
        if txn.describe(id).unwrap().state == TxnState::CompleteCommit {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} not completed: {:?}", txn.describe(id).unwrap().state);
}

/// A completion started by a caller on a runtime of its own (an exactly-once
/// transform's runner thread calls the coordinator in-process) runs on the broker's
/// runtime: the caller's runtime stopping right after does not take it down, and the
/// transaction completes. (It was spawned on the caller's runtime: dropped with it, the id
/// stayed "completing" in PrepareCommit, and every later call for it got
/// CONCURRENT_TRANSACTIONS.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_outlives_the_runtime_of_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    txn.add_partitions("a", pid, epoch, &parts(&[0, 1]))
        .await
        .unwrap();
    assert!(!prepare_commit_in_memory(&txn, "a"));
    let caller = txn.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Started, then the runtime is dropped before it ran anything.
        rt.block_on(async { caller.start_completion("a") });
    })
    .join()
    .unwrap();
    wait_complete_commit(&txn, "a").await;
}

/// A Prepare* transaction left with no completion running (its task was dropped) is
/// completed by the next timer tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_resumes_a_prepared_transaction_nobody_completes() {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let (pid, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    txn.add_partitions("a", pid, epoch, &parts(&[2]))
        .await
        .unwrap();
    assert!(!prepare_commit_in_memory(&txn, "a"));
    txn.tick(false).await;
    wait_complete_commit(&txn, "a").await;
}
