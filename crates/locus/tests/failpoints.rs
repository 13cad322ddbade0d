//! Fault injection through named fault points (built with `--features failpoints`).
#![cfg(feature = "failpoints")]

use std::time::Duration;

use bytesize::ByteSize;
use locus_client::ReadOptions;
use locus_cluster::LocalCluster;
use locus_common::config::{ClientConfig, Config, Locality, TierAlias, TierConfig};
use locus_common::fail;

/// A fixture config: ports 0, fast heartbeats, 1 MiB blocks, one MEM tier at `mem`.
fn config(mem: &std::path::Path, quota: ByteSize) -> Config {
    let mut cfg = Config::default();
    cfg.master.rpc_address = "127.0.0.1:0".into();
    cfg.master.web_address = "127.0.0.1:0".into();
    cfg.master.block_size = ByteSize::mib(1);
    cfg.worker.data_address = "127.0.0.1:0".into();
    cfg.worker.heartbeat_interval = Duration::from_millis(100);
    cfg.worker.tiers = vec![TierConfig { alias: TierAlias::Mem, dir: mem.to_path_buf(), quota }];
    cfg
}

/// A fill that fails just before its block is committed leaves no block behind (no
/// partial file, nothing reported to the master); the next read fills it properly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_failing_before_commit_leaves_no_partial_block() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("mem");
    let cfg = config(&mem, ByteSize::mib(16));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(c.data_dir().join("ufs/f.bin"), &data).unwrap();
    let cl = c.client(ClientConfig { locality: Locality::Remote, ..Default::default() }).unwrap();
    let fi = cl.status("/f.bin", true).await.unwrap();

    fail::cfg("worker.fill.before_commit", "1*return").unwrap();
    let e = cl.load(&fi, |_| {}).await.unwrap_err();
    assert!(e.to_string().contains("failpoint"), "{e}");
    // the failed block left nothing: no block file, no temporary file, no location
    let files = |sub: &str| std::fs::read_dir(mem.join("w0").join(sub)).unwrap().count();
    assert_eq!(files("tmp"), 0);
    let fi = cl.status("/f.bin", true).await.unwrap();
    assert!(fi.blocks[0].locations.is_empty());
    assert_eq!(files("blocks"), 0);

    // the fault was one-shot: reading now fills every block and returns the right bytes
    let mut out = Vec::new();
    cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
    assert_eq!(out, data);
    fail::remove("worker.fill.before_commit");
    c.shutdown().await;
}

/// Named fault points on the write and persist paths: a worker failing just before it
/// acknowledges a write leaves no file; persists that fail are retried until they land.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_acks_leave_no_file_and_failed_persists_are_retried() {
    use locus_client::PutOptions;
    use locus_common::config::WriteType;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 2, None).await.unwrap();
    let cl = c.client(ClientConfig { locality: Locality::Remote, ..Default::default() }).unwrap();
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 253) as u8).collect();
    let opts = PutOptions { write_type: Some(WriteType::AsyncThrough), ..Default::default() };
    let put = |p: &'static str| {
        let (cl, data, opts) = (&cl, &data, &opts);
        async move { cl.put_with(p, &mut data.as_slice(), opts, |_| Ok(Default::default())).await }
    };

    fail::cfg("worker.write.before_ack", "1*return").unwrap();
    let e = put("/a.bin").await.unwrap_err();
    assert!(e.to_string().contains("failpoint"), "{e}");
    assert!(cl.status("/a.bin", false).await.is_err(), "an unacknowledged write leaves no file");
    fail::remove("worker.write.before_ack");

    // The first three persist attempts fail (in the master, then in the worker); the
    // queue retries with backoff and the file lands.
    fail::cfg("master.persist.before_ufs", "2*return").unwrap();
    fail::cfg("worker.persist.before_commit", "1*return").unwrap();
    put("/b.bin").await.unwrap();
    let mut state = locus_proto::pb::PersistState::NotPersisted;
    for _ in 0..200 {
        state = cl.status("/b.bin", false).await.unwrap().persist_state();
        if state.is_persisted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, locus_proto::pb::PersistState::Persisted);
    assert_eq!(std::fs::read(c.data_dir().join("ufs/b.bin")).unwrap(), data);
    assert!(!c.data_dir().join("ufs/a.bin").exists());
    fail::remove("master.persist.before_ufs");
    fail::remove("worker.persist.before_commit");
    c.shutdown().await;
}
