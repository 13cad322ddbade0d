//! The data-path write's sinks, driven directly on real workers (no master: each serves
//! its mount from a `file://` directory it is handed, and knows its peers by id): a write
//! that outgrows the cache spills whole to the UFS, a failed write leaves nothing behind,
//! a pipeline that breaks takes the write down with it.

use std::time::Duration;

use bytes::Bytes;
use locus_common::config::{TierAlias, TierConfig, WorkerConfig};
use locus_common::security::{Secret, Verifier};
use locus_common::{ErrorKind, block_id};
use locus_proto::pb;

use super::Sink;
use crate::{Worker, WorkerBuilder};

const BLOCK: u64 = 256 << 10;
const MOUNT: u64 = 1;

struct Rig {
    _dir: tempfile::TempDir,
    ufs_root: std::path::PathBuf,
    secret: Secret,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let ufs_root = dir.path().join("ufs");
        std::fs::create_dir_all(&ufs_root).unwrap();
        Rig { _dir: dir, ufs_root, secret: Secret::generate() }
    }

    /// A worker with an SSD tier of `quota` bytes, serving the mount from `ufs_root`. Its
    /// master's address takes no connections.
    async fn worker(&self, name: &str, quota: u64) -> Worker {
        let data_dir = self._dir.path().join(name);
        let cfg = WorkerConfig {
            data_address: "127.0.0.1:0".into(),
            data_dir: data_dir.clone(),
            uds_path: Some(std::path::PathBuf::new()),
            tiers: vec![TierConfig {
                alias: TierAlias::Ssd,
                dir: data_dir.join("ssd"),
                quota: bytesize::ByteSize(quota),
            }],
            heartbeat_interval: Duration::from_secs(3600),
            ..Default::default()
        };
        let w = WorkerBuilder::new(cfg, "127.0.0.1:1", self.secret.clone()).start().await.unwrap();
        let uri = format!("file://{}", self.ufs_root.display());
        w.inner.serve_mount(MOUNT, locus_ufs::Ufs::new(&uri, &Default::default(), Duration::from_secs(10)).unwrap());
        w
    }

    fn request(&self, wt: pb::WriteType, version: u64) -> pb::WriteFileRequest {
        let mut r = pb::WriteFileRequest {
            mount_id: MOUNT,
            ufs_path: "f.bin".into(),
            version,
            block_size: BLOCK,
            grant: Verifier::new(&self.secret).grant(MOUNT, "f.bin", version),
            ..Default::default()
        };
        r.set_write_type(wt);
        r
    }

    fn in_ufs(&self) -> Option<Vec<u8>> {
        std::fs::read(self.ufs_root.join("f.bin")).ok()
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Sends `bytes` through a sink in 100 KiB chunks (not block-aligned) and closes it.
async fn write_all(s: &mut Sink<'_>, bytes: &[u8]) -> locus_common::Result<()> {
    for c in bytes.chunks(100 << 10) {
        s.write(Bytes::copy_from_slice(c)).await?;
    }
    s.finish_blocks().await
}

fn blocks_of(w: &Worker, version: u64, n: u64) -> usize {
    (0..n).filter(|&i| w.store().contains(block_id(version, i))).count()
}

#[tokio::test]
async fn a_write_that_outgrows_the_cache_spills_whole_to_the_ufs() {
    let rig = Rig::new();
    let w = rig.worker("a", 1 << 20).await;
    let req = rig.request(pb::WriteType::AsyncThrough, 7);
    let bytes = data(3 << 20);
    let mut s = Sink::open(&w.inner, &req).await.unwrap();
    write_all(&mut s, &bytes).await.unwrap();
    let resp = s.close().await.unwrap();
    assert_eq!(resp.length, bytes.len() as u64);
    assert_eq!(resp.write_type(), pb::WriteType::CacheThrough, "the answer says the write went through");
    assert_eq!(rig.in_ufs().as_deref(), Some(&bytes[..]), "the UFS holds every byte, in order");
}

#[tokio::test]
async fn a_declared_size_the_cache_cannot_hold_goes_through_from_the_first_byte() {
    let rig = Rig::new();
    let w = rig.worker("a", 1 << 20).await;
    let mut req = rig.request(pb::WriteType::AsyncThrough, 7);
    let bytes = data(2 << 20);
    req.expected_length = bytes.len() as u64;
    let mut s = Sink::open(&w.inner, &req).await.unwrap();
    write_all(&mut s, &bytes).await.unwrap();
    let resp = s.close().await.unwrap();
    assert_eq!((resp.replicas, resp.write_type()), (0, pb::WriteType::CacheThrough));
    assert_eq!(blocks_of(&w, 7, 8), 0, "nothing was cached");
    assert_eq!(rig.in_ufs().as_deref(), Some(&bytes[..]));
    // MUST_CACHE has nowhere else to go: refused before a byte.
    let mut req = rig.request(pb::WriteType::MustCache, 8);
    req.expected_length = 2 << 20;
    let e = Sink::open(&w.inner, &req).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
}

#[tokio::test]
async fn an_aborted_write_leaves_nothing_behind() {
    let rig = Rig::new();
    let w = rig.worker("a", 64 << 20).await;
    let req = rig.request(pb::WriteType::CacheThrough, 7);
    let mut s = Sink::open(&w.inner, &req).await.unwrap();
    for c in data(700 << 10).chunks(100 << 10) {
        s.write(Bytes::copy_from_slice(c)).await.unwrap();
    }
    assert_eq!(blocks_of(&w, 7, 3), 2, "two whole blocks were stored before the abort");
    s.abort().await;
    assert_eq!(blocks_of(&w, 7, 3), 0, "the abort dropped the stored blocks");
    assert_eq!(rig.in_ufs(), None, "the UFS object was never made");
    let leftovers: Vec<_> = walk(&rig.ufs_root);
    assert!(leftovers.is_empty(), "the UFS holds {leftovers:?}");
}

#[tokio::test]
async fn a_pipeline_that_breaks_mid_write_takes_the_write_down_with_it() {
    let rig = Rig::new();
    let a = rig.worker("a", 64 << 20).await;
    // The replica's cache holds one block of the four: its copy fails part-way.
    let b = rig.worker("b", BLOCK + (BLOCK / 2)).await;
    a.inner.know_member(2, &b.data_address().to_string());
    let mut req = rig.request(pb::WriteType::CacheThrough, 7);
    req.pipeline = vec![pb::WorkerAddress { worker_id: 2, ..Default::default() }];
    let mut s = Sink::open(&a.inner, &req).await.unwrap();
    write_all(&mut s, &data(4 * BLOCK as usize)).await.unwrap();
    let e = s.close().await.expect_err("the replica's failure fails the write");
    assert!(e.to_string().contains("replica worker 2"), "{e}");
    assert_eq!(blocks_of(&a, 7, 4), 0, "the first worker dropped its copy");
    assert_eq!(rig.in_ufs(), None, "the UFS object was never made");
    // A pipeline naming a worker no one knows fails at the start, with nothing made.
    req.pipeline = vec![pb::WorkerAddress { worker_id: 9, ..Default::default() }];
    req.version = 8;
    let e = Sink::open(&a.inner, &req).await.err().unwrap();
    assert!(e.to_string().contains("replica worker 9"), "{e}");
    assert!(walk(&rig.ufs_root).is_empty());
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
