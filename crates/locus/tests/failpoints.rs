//! Fault injection through named fault points (built with `--features failpoints`).
#![cfg(feature = "failpoints")]

use std::time::Duration;

use bytesize::ByteSize;
use locus::LocalCluster;
use locus_client::ReadOptions;
use locus_common::config::{ClientConfig, Config, Locality, TierAlias, TierConfig};
use locus_common::fail;

/// A fill that fails just before its block is committed leaves no block behind (no
/// partial file, nothing reported to the master); the next read fills it properly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_failing_before_commit_leaves_no_partial_block() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.master.rpc_address = "127.0.0.1:0".into();
    cfg.master.web_address = "127.0.0.1:0".into();
    cfg.master.block_size = ByteSize::mib(1);
    cfg.worker.data_address = "127.0.0.1:0".into();
    cfg.worker.heartbeat_interval = Duration::from_millis(100);
    let mem = dir.path().join("mem");
    cfg.worker.tiers = vec![TierConfig { alias: TierAlias::MEM, dir: mem.clone(), quota: ByteSize::mib(16) }];
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
