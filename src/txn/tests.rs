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

/// A coordinator in a fresh directory, and the producer id and epoch of id "a" (its
/// transaction timeout 10 s). The directory lives as long as the returned guard.
async fn started() -> (tempfile::TempDir, Arc<TransactionCoordinator>, (i64, i16)) {
    let dir = tempfile::tempdir().unwrap();
    let txn = open_in(dir.path());
    let producer = txn.init_producer_id("a", 10_000, None).await.unwrap();
    (dir, txn, producer)
}

/// Makes `id`'s open transaction older than its timeout, runs a timer tick (which
/// aborts it), waits for the abort to complete and returns the id's description.
async fn time_out(txn: &TransactionCoordinator, id: &str) -> TxnDescription {
    txn.lock().get_mut(id).unwrap().record.start_ms = 1;
    txn.tick(false).await;
    assert!(txn.wait_completed(id, 5000).await);
    txn.describe(id).unwrap()
}

fn parts(list: &[i32]) -> Vec<(String, i32)> {
    list.iter().map(|p| ("t".to_string(), *p)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_bumps_the_epoch_and_keeps_the_producer_id() {
    let (_dir, txn, (pid, epoch)) = started().await;
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
    let (_dir, txn, (pid, epoch)) = started().await;
    assert_eq!(
        txn.add_partitions("a", pid + 1, epoch, &parts(&[0]), false)
            .await,
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        txn.add_partitions("unknown", pid, epoch, &parts(&[0]), false)
            .await,
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        txn.add_partitions("a", pid, epoch + 1, &parts(&[0]), false)
            .await,
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        txn.end_txn("a", pid, epoch, true, false).await,
        Err(ResponseError::InvalidTxnState),
        "nothing open"
    );
    txn.add_partitions("a", pid, epoch, &parts(&[0, 1]), false)
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
        txn.add_partitions("a", pid, epoch, &parts(&[2]), false)
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
    let (dir, txn, (pid, epoch)) = started().await;
    for round in 0..20 {
        let (x, y) = (txn.clone(), txn.clone());
        let first =
            tokio::spawn(
                async move { x.add_partitions("a", pid, epoch, &parts(&[0]), false).await },
            );
        let second =
            tokio::spawn(
                async move { y.add_partitions("a", pid, epoch, &parts(&[1]), false).await },
            );
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
        txn.end_txn("a", pid, epoch, false, false).await.ok();
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
    let (_dir, txn, (pid, epoch)) = started().await;
    txn.add_partitions("a", pid, epoch, &parts(&[0, 1]), false)
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
    let (_dir, txn, (pid, epoch)) = started().await;
    txn.add_partitions("a", pid, epoch, &parts(&[2]), false)
        .await
        .unwrap();
    assert!(!prepare_commit_in_memory(&txn, "a"));
    txn.tick(false).await;
    wait_complete_commit(&txn, "a").await;
}

/// The stored transaction version of `id` (what a reload reads back).
fn stored_version(txn: &TransactionCoordinator, id: &str) -> i16 {
    txn.lock()
        .get(id)
        .unwrap()
        .record
        .client_transaction_version
}

/// KIP-890 part 2 (EndTxn v5): each EndTxn bumps the epoch and answers with it; a retry
/// with the epoch before the bump gets the same answer; the transitions of Kafka's
/// `endTransaction` table; the old epoch is fenced; all of it survives a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_v5_bumps_the_epoch_and_a_retry_gets_the_same_answer() {
    let (dir, txn, (pid, e0)) = started().await;
    // The leader adds the partition (Produce v12): no AddPartitionsToTxn.
    txn.add_partitions("a", pid, e0, &parts(&[0]), true)
        .await
        .unwrap();
    assert_eq!(
        txn.end_txn("a", pid, e0, true, true).await,
        Ok(Some((pid, e0 + 1)))
    );
    let d = txn.describe("a").unwrap();
    assert_eq!(
        (d.state, d.producer_epoch),
        (TxnState::CompleteCommit, e0 + 1)
    );
    // Retried (its answer was lost): the same answer, nothing written again.
    assert_eq!(
        txn.end_txn("a", pid, e0, true, true).await,
        Ok(Some((pid, e0 + 1)))
    );
    assert_eq!(
        txn.end_txn("a", pid, e0, false, true).await,
        Err(ResponseError::InvalidTxnState),
        "an abort retried after a commit"
    );
    assert_eq!(
        txn.end_txn("a", pid, e0 + 1, true, true).await,
        Err(ResponseError::InvalidTxnState),
        "a commit with nothing open"
    );
    // A late write of the committed transaction: its epoch is fenced.
    assert_eq!(
        txn.add_partitions("a", pid, e0, &parts(&[1]), true).await,
        Err(ResponseError::ProducerFenced)
    );
    // The next transaction, at the bumped epoch, aborted.
    txn.add_partitions("a", pid, e0 + 1, &parts(&[1]), true)
        .await
        .unwrap();
    assert_eq!(
        txn.end_txn("a", pid, e0 + 1, false, true).await,
        Ok(Some((pid, e0 + 2)))
    );
    // An abort with nothing open still bumps (a producer aborting after a failed send).
    assert_eq!(
        txn.end_txn("a", pid, e0 + 2, false, true).await,
        Ok(Some((pid, e0 + 3)))
    );
    assert_eq!(
        txn.end_txn("a", pid, e0 + 1, false, true).await,
        Err(ResponseError::ProducerFenced),
        "two epochs back is not a retry"
    );
    assert_eq!(stored_version(&txn, "a"), TV2);
    let reloaded = open_in(dir.path());
    let d = reloaded.describe("a").unwrap();
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.state),
        (pid, e0 + 3, TxnState::CompleteAbort)
    );
    assert_eq!(stored_version(&reloaded, "a"), TV2);
    assert_eq!(
        reloaded.end_txn("a", pid, e0 + 2, false, true).await,
        Ok(Some((pid, e0 + 3))),
        "a retry after a coordinator change"
    );
}

/// An implicit add (Produce v12) after a transaction that ended without an epoch bump
/// (EndTxn v0–v4) is refused: at that epoch it may be a late write of the ended
/// transaction, which KIP-890 part 1 refuses. AddPartitionsToTxn still adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_implicit_add_after_an_end_without_a_bump_is_refused() {
    let (_dir, txn, (pid, epoch)) = started().await;
    txn.add_partitions("a", pid, epoch, &parts(&[0]), false)
        .await
        .unwrap();
    assert_eq!(txn.end_txn("a", pid, epoch, true, false).await, Ok(None));
    assert!(txn.wait_completed("a", 5000).await);
    assert_eq!(
        txn.add_partitions("a", pid, epoch, &parts(&[0]), true)
            .await,
        Err(ResponseError::InvalidTxnState)
    );
    txn.add_partitions("a", pid, epoch, &parts(&[0]), false)
        .await
        .unwrap();
    // A transaction aborted at its timeout had its epoch bumped: an implicit add at the
    // new epoch starts the next one.
    let d = time_out(&txn, "a").await;
    assert_eq!(
        (d.state, d.producer_epoch),
        (TxnState::CompleteAbort, epoch + 1)
    );
    txn.add_partitions("a", pid, epoch + 1, &parts(&[1]), true)
        .await
        .unwrap();
}

/// EndTxn v5 on an exhausted epoch: the markers go out with the old producer id, the
/// answer and the stored state move to a new producer id at epoch 0, and a retry with
/// the old id and epoch is answered the same, also after a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_epoch_moves_to_a_new_producer_id_at_end_txn_v5() {
    let (dir, txn, (pid, _)) = started().await;
    txn.lock().get_mut("a").unwrap().record.producer_epoch = EPOCH_EXHAUSTED;
    txn.add_partitions("a", pid, EPOCH_EXHAUSTED, &parts(&[2]), true)
        .await
        .unwrap();
    let Ok(Some((next, 0))) = txn.end_txn("a", pid, EPOCH_EXHAUSTED, true, true).await else {
        panic!("no new producer id");
    };
    assert_ne!(next, pid);
    let d = txn.describe("a").unwrap();
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.state),
        (next, 0, TxnState::CompleteCommit)
    );
    assert_eq!(
        txn.end_txn("a", pid, EPOCH_EXHAUSTED, true, true).await,
        Ok(Some((next, 0)))
    );
    let reloaded = open_in(dir.path());
    assert_eq!(
        reloaded
            .end_txn("a", pid, EPOCH_EXHAUSTED, true, true)
            .await,
        Ok(Some((next, 0)))
    );
    reloaded
        .add_partitions("a", next, 0, &parts(&[0]), true)
        .await
        .unwrap();
}

/// While a decided transaction's markers go out, every EndTxn v5 gets
/// CONCURRENT_TRANSACTIONS (Kafka's pending state), also one whose epoch is the bumped
/// one: the client retries instead of treating it as fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_v5_while_markers_go_out_is_concurrent() {
    let (_dir, txn, (pid, epoch)) = started().await;
    txn.add_partitions("a", pid, epoch, &parts(&[0]), true)
        .await
        .unwrap();
    {
        let mut txns = txn.lock();
        let e = txns.get_mut("a").unwrap();
        e.record.state = TxnState::PrepareCommit;
        e.record.producer_epoch = epoch + 1;
        e.completing = true;
    }
    for (epoch, commit) in [(epoch, true), (epoch + 1, false), (epoch + 1, true)] {
        assert_eq!(
            txn.end_txn("a", pid, epoch, commit, true).await,
            Err(ResponseError::ConcurrentTransactions)
        );
    }
}

/// A transaction open past its timeout at epoch i16::MAX - 1 (an ordinary epoch under
/// transaction version 2) is still fenced: aborted at i16::MAX; the next InitProducerId
/// moves to a new producer id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_fences_even_the_last_ordinary_epoch() {
    let (_dir, txn, (pid, _)) = started().await;
    txn.lock().get_mut("a").unwrap().record.producer_epoch = EPOCH_EXHAUSTED;
    txn.add_partitions("a", pid, EPOCH_EXHAUSTED, &parts(&[0]), true)
        .await
        .unwrap();
    let d = time_out(&txn, "a").await;
    assert_eq!(
        (d.producer_id, d.producer_epoch, d.state),
        (pid, i16::MAX, TxnState::CompleteAbort)
    );
    assert_eq!(
        txn.add_partitions("a", pid, EPOCH_EXHAUSTED, &parts(&[1]), true)
            .await,
        Err(ResponseError::ProducerFenced)
    );
    let (next, epoch) = txn.init_producer_id("a", 10_000, None).await.unwrap();
    assert_ne!(next, pid);
    assert_eq!(epoch, 0);
}
