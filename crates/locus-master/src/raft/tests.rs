//! The log store and the state machine against openraft's own storage suite, and a
//! snapshot carrying the namespace from one store to another.

#![allow(clippy::unwrap_used)] // a test that cannot go on fails

use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{EntryPayload, RaftSnapshotBuilder};

use super::log::LogStore;
use super::state::StateMachine;
use super::*;
use crate::namespace::Namespace;
use crate::store::Store;

/// A fresh log store and state machine in a directory of their own.
struct Fresh;

impl StoreBuilder<Locus, LogStore, StateMachine, tempfile::TempDir> for Fresh {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let (log, sm) = open(dir.path());
        Ok((dir, log, sm))
    }
}

fn open(dir: &std::path::Path) -> (LogStore, StateMachine) {
    let log = LogStore::open(&dir.join("meta")).unwrap();
    let store = Store::open(&dir.join("meta"), 1 << 20).unwrap();
    let sm = StateMachine::open(Arc::new(Namespace::new(store, 1 << 20)), dir.join("snapshots")).unwrap();
    (log, sm)
}

#[test]
fn the_log_and_the_state_machine_pass_openrafts_storage_suite() {
    Suite::test_all(Fresh).unwrap();
}

fn entry(term: u64, index: u64, payload: EntryPayload<Locus>) -> Entry {
    Entry { log_id: LogId::new(openraft::CommittedLeaderId::new(term, 1), index), payload }
}

fn mkdir(name: &str) -> pb::Command {
    let c = pb::Mkdir {
        parent_id: crate::store::ROOT_ID,
        parent_path: "/".into(),
        name: name.into(),
        ..Default::default()
    };
    pb::Command { now_ms: 7, op: Some(pb::command::Op::Mkdir(c)), ..Default::default() }
}

/// Entries applied on one member reach another by a snapshot: the same namespace, the
/// same applied id and membership; a command that fails gets its error alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_carries_the_namespace_to_another_member() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ((_, mut sm_a), (_, mut sm_b)) = (open(a.path()), open(b.path()));
    let nodes: std::collections::BTreeMap<u64, MasterNode> =
        [(1, MasterNode { raft_address: "m1:19997".into(), rpc_address: "m1:19998".into() })].into();
    let membership = Membership::new(vec![[1].into()], nodes);
    let bad = pb::Command::default(); // no operation: refused
    let batch = pb::CommandBatch { cmds: vec![mkdir("x"), mkdir("y"), bad] };
    let applied = sm_a
        .apply([
            entry(1, 1, EntryPayload::Membership(membership.clone())),
            entry(1, 2, EntryPayload::Normal(batch)),
            entry(1, 3, EntryPayload::Blank),
        ])
        .await
        .unwrap();
    assert_eq!(applied.len(), 3);
    assert_eq!(applied[1].results.len(), 3);
    assert!(applied[1].results[0].is_ok() && applied[1].results[1].is_ok());
    assert!(applied[1].results[2].is_err());

    let snap = sm_a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(snap.meta.last_log_id.unwrap().index, 3);
    let mut rx = sm_b.begin_receiving_snapshot().await.unwrap();
    *rx = *snap.snapshot;
    sm_b.install_snapshot(&snap.meta, rx).await.unwrap();
    let (applied_b, membership_b) = sm_b.applied_state().await.unwrap();
    assert_eq!(applied_b, snap.meta.last_log_id);
    assert_eq!(membership_b.membership(), &membership);
    let ns = |sm: &StateMachine| {
        let r = sm.namespace().read().unwrap();
        ["/x", "/y", "/z"].map(|p| crate::namespace::inode_by_path(&r, p).unwrap().map(|i| i.id))
    };
    assert_eq!(ns(&sm_a), ns(&sm_b));
    assert!(ns(&sm_b)[0].is_some() && ns(&sm_b)[2].is_none());
    // The cluster's identity goes along.
    let cluster = |sm: &StateMachine| {
        let r = sm.namespace().read().unwrap();
        let t = r.open_table(crate::store::COUNTERS).unwrap();
        t.get(crate::store::CLUSTER_ID).unwrap().unwrap().value()
    };
    assert_eq!(cluster(&sm_a), cluster(&sm_b));
    // Reopened, the state machine finds its snapshot by the file's header.
    drop(sm_b);
    let (_, mut again) = open(b.path());
    assert_eq!(again.get_current_snapshot().await.unwrap().unwrap().meta, snap.meta);
}

/// The log keeps what it is given across a reopen: entries, vote, purge point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = LogStore::open(dir.path()).unwrap();
        log.save_vote(&Vote::new_committed(3, 1)).await.unwrap();
        let entries: Vec<Entry> =
            (1..=5).map(|i| entry(3, i, EntryPayload::Normal(pb::CommandBatch { cmds: vec![mkdir("a")] }))).collect();
        openraft::storage::RaftLogStorageExt::blocking_append(&mut log, entries).await.unwrap();
        log.purge(LogId::new(openraft::CommittedLeaderId::new(3, 1), 2)).await.unwrap();
    }
    let mut log = LogStore::open(dir.path()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new_committed(3, 1)));
    let st = log.get_log_state().await.unwrap();
    assert_eq!((st.last_purged_log_id.unwrap().index, st.last_log_id.unwrap().index), (2, 5));
    let got = openraft::RaftLogReader::try_get_log_entries(&mut log, 0..10).await.unwrap();
    assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), [3, 4, 5]);
    assert!(matches!(&got[0].payload, EntryPayload::Normal(b) if b.cmds == [mkdir("a")]));
}
