//! The master group under faults: a leader cut off from the others (fault point
//! `raft.cut`) acknowledges nothing, its callers find the new leader, and the order it
//! gave before the cut is refused by the worker that has heard of the new term.

use std::time::Duration;

use bytesize::ByteSize;
use locus_client::Client;
use locus_cluster::LocalCluster;
use locus_common::config::{ClientConfig, WriteType};
use locus_common::fail;

use crate::{SERIAL, common, config};

/// Waits up to `secs` for `f` to hold.
async fn eventually(secs: u64, what: &str, f: impl Fn() -> bool) {
    for _ in 0..secs * 20 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {secs} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_the_group_acts_on_nothing() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    cfg.master.raft_address.clear();
    let c = LocalCluster::start_group(cfg, &dir.path().join("data"), 3, 1, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let w = || c.worker(0).unwrap();
    let old = c.leader_index().unwrap();
    let t1 = c.master().members().unwrap().term;
    eventually(10, "the worker hears the term", || w().master_term() == t1).await;

    // The leader orders a persist; the worker holds it just before the UFS object is
    // replaced.
    fail::cfg("worker.persist.before_close", "return(6000)").unwrap();
    // Over the UFS writer's 16 MiB chunk, so that its temporary file shows before the
    // hold.
    let data = common::random(20 << 20);
    common::put_as(&cl, "/p", &data, WriteType::AsyncThrough).await.unwrap();
    let ufs = c.data_dir().join("ufs");
    let tmp = ufs.join(locus_common::path::UFS_TEMP_DIR);
    let writing = || {
        std::fs::read_dir(&tmp).is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("p.")))
    };
    eventually(10, "the persist is under way", writing).await;

    // The leader is cut off; the other two elect another.
    let cut = c.master_config(old).raft_address.clone();
    fail::cfg("raft.cut", &format!("return({cut})")).unwrap();
    c.wait_for_leader(Duration::from_secs(30), |m| m.term > t1).await.unwrap();
    assert_ne!(c.leader_index(), Some(old));

    // The old leader acknowledges nothing: a client that knows only it gets an error,
    // and what it asked for is not done.
    let short = ClientConfig { master_retry: Duration::from_secs(2), ..Default::default() };
    let alone = Client::with_tls(&c.master_config(old).rpc_address, short, c.client_token(), c.tls().clone()).unwrap();
    alone.mkdir("/minority", false).await.unwrap_err();
    // The group goes on without it, and the worker hears the new term.
    cl.mkdir("/majority", false).await.unwrap();
    eventually(10, "the worker hears the new term", || w().master_term() > t1).await;

    // The old leader's persist wakes to the new term: refused, the object not replaced
    // by it. (The new leader persists the file itself.)
    eventually(15, "the old order is refused", || w().refused_from_deposed() >= 1).await;
    fail::remove("worker.persist.before_close");
    eventually(20, "the new leader persists the file", || std::fs::read(ufs.join("p")).is_ok_and(|b| b == data)).await;

    // Healed, the old leader follows; what it did not acknowledge is not there.
    fail::remove("raft.cut");
    c.wait_for_group(Duration::from_secs(30)).await.unwrap();
    assert!(!c.master_at(old).unwrap().is_leader());
    let e = cl.status("/minority", false).await.unwrap_err();
    assert_eq!(e.kind(), locus_common::ErrorKind::NotFound, "{e}");
    assert!(cl.status("/majority", false).await.unwrap().is_dir);
    assert_eq!(common::read_all(&cl, "/p").await, data);
    c.shutdown().await;
}
