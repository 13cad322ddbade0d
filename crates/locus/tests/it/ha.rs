//! The master as a member of a replicated group (docs/design/ha-plan.md): a master from
//! before groups becomes the group's first member with its namespace intact, and every
//! change made through the log is there after a restart.

use locus_common::config::{ClientConfig, WriteType};

use crate::common;

/// The entries in a member's log (`raft.redb`), read while the master is stopped.
fn log_entries(meta_dir: &std::path::Path) -> u64 {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let db = redb::Database::open(meta_dir.join("raft.redb")).unwrap();
    let r = db.begin_read().unwrap();
    r.open_table(redb::TableDefinition::<u64, &[u8]>::new("raft_log")).unwrap().len().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_without_a_log_becomes_the_first_member_intact() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(dir.path(), 64 << 20, false);
    cfg.master.raft_address.clear();
    let mut c = locus_cluster::LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let meta = c.data_dir().join("master");
    let cl = c.client(ClientConfig::default()).unwrap();
    let a = common::random(3 << 20);
    common::put_as(&cl, "/before", &a, WriteType::CacheThrough).await.unwrap();
    cl.mkdir("/d", false).await.unwrap();
    c.stop_master().await;
    assert!(!meta.join("raft.redb").exists());

    c.configure_master(|m| m.raft_address = "127.0.0.1:0".into());
    c.start_master().await.unwrap();
    assert_eq!(common::read_all(&cl, "/before").await, a);
    let b = common::random(1 << 20);
    common::put_as(&cl, "/after", &b, WriteType::CacheThrough).await.unwrap();
    cl.rename("/d", "/e").await.unwrap();
    cl.delete("/before", false).await.unwrap();
    c.stop_master().await;
    let n = log_entries(&meta);
    assert!(n >= 5, "the changes went through the log: {n} entries");

    c.start_master().await.unwrap();
    assert_eq!(common::read_all(&cl, "/after").await, b);
    assert!(cl.status("/e", false).await.unwrap().is_dir);
    for gone in ["/before", "/d"] {
        let e = cl.status(gone, false).await.unwrap_err();
        assert_eq!(e.kind(), locus_common::ErrorKind::NotFound, "{gone}");
    }
    cl.mkdir("/e/f", false).await.unwrap();
    c.shutdown().await;
}
