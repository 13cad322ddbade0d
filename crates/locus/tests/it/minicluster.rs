//! In-process MiniCluster tests: one master and 2–3 workers on port 0, driven through
//! the real client core.
//!
//! One file over 800 lines on purpose: it is one suite, each test a scenario of the whole
//! cluster sharing the fixtures at the top (config, start, wait helpers); splitting it
//! would scatter those fixtures or make each file a separately linked test binary.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytesize::ByteSize;
use futures::StreamExt;
use locus_client::{Client, PutOptions, ReadOptions};
use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, FillPlacement, Locality, ReadType, TierAlias, TierConfig, WriteType};
use locus_common::metrics::ReadReason;
use locus_proto::pb;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWrite;

use crate::common;
use common::{BLOCK, config, put_as, random, read_all, start, ufs_dir, wait_persisted, wait_queue_empty};

fn sha(b: &[u8]) -> Vec<u8> {
    Sha256::digest(b).to_vec()
}

fn client(c: &LocalCluster, locality: Locality) -> Client {
    c.client(ClientConfig { locality, ..Default::default() }).unwrap()
}

async fn totals(c: &Client) -> pb::ReadCounters {
    c.report().await.unwrap().totals.unwrap()
}

/// Poll the cluster report until `f` holds (counters arrive with heartbeats).
async fn wait_for(c: &Client, what: &str, f: impl Fn(&pb::ReadCounters) -> bool) -> pb::ReadCounters {
    for _ in 0..100 {
        let t = totals(c).await;
        if f(&t) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}: {:?}", totals(c).await);
}

/// Let counters settle: two equal reports 300 ms apart.
async fn settled(c: &Client) -> pb::ReadCounters {
    let mut last = totals(c).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = totals(c).await;
        if t == last {
            return t;
        }
        last = t;
    }
}

fn cached_fraction(fi: &pb::FileInfo) -> f64 {
    let cached: u64 = fi.blocks.iter().filter(|b| !b.locations.is_empty()).map(|b| b.length).sum();
    cached as f64 / fi.length.max(1) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_through_cache_counts_every_byte_by_source() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 3, 64 << 20, false).await;
    let data = random(3 * BLOCK as usize + 12345);
    std::fs::write(ufs_dir(&c).join("f.bin"), &data).unwrap();
    let local = client(&c, Locality::Auto);

    // First read: a miss on every block; the co-located worker fills each block from the
    // UFS, and the client reads the block file itself as it grows (told how far over the
    // worker's Unix socket), or leases one that read-ahead has landed: short_circuit.
    assert_eq!(sha(&read_all(&local, "/f.bin").await), sha(&data));
    let n = data.len() as u64;
    let t1 = wait_for(&local, "ufs bytes", |t| t.ufs == n && t.short_circuit == n).await;
    assert_eq!(t1.local_worker, 0, "{t1:?}");
    // One miss per block, plus one per reader that joined a read-ahead fill in progress
    // (still one UFS read per block: ufs == n above).
    assert!((4..=7).contains(&t1.cache_misses), "{t1:?}");
    assert_eq!(t1.remote_worker, 0);
    let fi = local.status("/f.bin", true).await.unwrap();
    assert_eq!(cached_fraction(&fi), 1.0);

    // Second read: short-circuit, no UFS bytes.
    assert_eq!(sha(&read_all(&local, "/f.bin").await), sha(&data));
    let t2 = wait_for(&local, "short-circuit bytes", |t| t.short_circuit == t1.short_circuit + n).await;
    assert_eq!(t2.ufs, t1.ufs, "second read must not touch the UFS");

    // A remote client reads over the network data path.
    let remote = client(&c, Locality::Remote);
    assert_eq!(sha(&read_all(&remote, "/f.bin").await), sha(&data));
    let t3 = wait_for(&local, "remote bytes", |t| t.remote_worker == data.len() as u64).await;
    assert_eq!(t3.ufs, t1.ufs);

    // A range in the middle, across a block boundary.
    let fi = remote.status("/f.bin", true).await.unwrap();
    let mut out = Vec::new();
    remote.read_to(&fi, BLOCK - 10, 20, ReadOptions::default(), &mut out).await.unwrap();
    assert_eq!(out, &data[BLOCK as usize - 10..BLOCK as usize + 10]);

    // The S3 gateway's stream, which takes over the buffers a short-circuit read fills
    // instead of copying them: the whole file, and a range across a block boundary.
    let local = std::sync::Arc::new(local);
    let fi = local.status("/f.bin", true).await.unwrap();
    for (off, len) in [(0, n), (BLOCK - 10, BLOCK + 20)] {
        let parts: Vec<bytes::Bytes> =
            local.read_stream(fi.clone(), off, len, ReadOptions::default()).map(|b| b.unwrap()).collect().await;
        assert_eq!(parts.concat(), &data[off as usize..(off + len) as usize]);
    }

    // The Prometheus text carries the same counts.
    let m = locus_master::render_metrics(c.master());
    assert!(m.contains(&format!("locus_bytes_read_total{{source=\"short_circuit\"}} {}", t2.short_circuit)), "{m}");

    // Freed blocks' files stay in the MEM tier's pool (reported as pooled, not used), and
    // another file's blocks are written over them: its bytes, and only its bytes, come back
    // (its last block is shorter than the file it reuses).
    local.free("/f.bin", false).await.unwrap();
    let pooled = |r: &pb::Report| r.workers.iter().flat_map(|w| &w.tiers).map(|t| t.pooled).sum::<u64>();
    let mut r = local.report().await.unwrap();
    for _ in 0..100 {
        if pooled(&r) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = local.report().await.unwrap();
    }
    assert!(pooled(&r) >= 3 * BLOCK, "{:?}", r.workers);
    let other = random(2 * BLOCK as usize + 777);
    std::fs::write(ufs_dir(&c).join("g.bin"), &other).unwrap();
    assert_eq!(sha(&read_all(&local, "/g.bin").await), sha(&other));
    assert_eq!(sha(&read_all(&local, "/g.bin").await), sha(&other), "and from the cache");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_cost_one_ufs_read() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let data = random(2 * BLOCK as usize);
    std::fs::write(ufs_dir(&c).join("hot.bin"), &data).unwrap();
    let cl = std::sync::Arc::new(client(&c, Locality::Remote));
    let fi = cl.status("/hot.bin", true).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (cl, fi) = (cl.clone(), fi.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
            out
        }));
    }
    for t in tasks {
        assert_eq!(sha(&t.await.unwrap()), sha(&data));
    }
    let t = settled(&cl).await;
    assert_eq!(t.ufs, data.len() as u64, "8 concurrent readers, one UFS read per block");
    assert_eq!(t.remote_worker, 8 * data.len() as u64);
    c.shutdown().await;
}

/// An output that signals after its first write and then writes slowly.
struct SlowSink {
    out: Vec<u8>,
    first: Option<tokio::sync::oneshot::Sender<()>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl AsyncWrite for SlowSink {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if let Some(s) = self.sleep.as_mut()
            && s.as_mut().poll(cx).is_pending()
        {
            return Poll::Pending;
        }
        self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(5))));
        if let Some(tx) = self.first.take() {
            let _ = tx.send(());
        }
        let n = buf.len().min(64 << 10);
        self.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_survives_its_worker_dying_midway() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 2, 64 << 20, false).await;
    let data = random(4 * BLOCK as usize);
    std::fs::write(ufs_dir(&c).join("f.bin"), &data).unwrap();
    let cl = client(&c, Locality::Remote);
    assert_eq!(sha(&read_all(&cl, "/f.bin").await), sha(&data)); // cache it somewhere
    let fi = cl.status("/f.bin", true).await.unwrap();
    let holder = fi.blocks[0].locations[0].worker_id;
    let idx = (0..2).find(|i| c.worker(*i).unwrap().id() == holder).unwrap();

    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut sink = SlowSink { out: Vec::new(), first: Some(tx), sleep: None };
    let reader = async {
        cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut sink).await.unwrap();
    };
    let killer = async {
        rx.await.unwrap();
        c.stop_worker(idx).await;
    };
    tokio::join!(reader, killer);
    assert_eq!(sink.out.len(), data.len());
    assert_eq!(sha(&sink.out), sha(&data), "bytes after fail-over must match");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eviction_under_quota_spares_pinned_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 4 * BLOCK, false).await;
    let cl = client(&c, Locality::Auto);
    let pinned = random(BLOCK as usize);
    std::fs::write(ufs_dir(&c).join("pinned.bin"), &pinned).unwrap();
    read_all(&cl, "/pinned.bin").await;
    assert_eq!(cl.set_pinned("/pinned.bin", true, false).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await; // pins reach the worker by heartbeat
    for i in 0..8 {
        let d = random(BLOCK as usize);
        std::fs::write(ufs_dir(&c).join(format!("f{i}.bin")), &d).unwrap();
        assert_eq!(sha(&read_all(&cl, &format!("/f{i}.bin")).await), sha(&d));
    }
    wait_for(&cl, "evictions", |t| t.evictions > 0).await;
    let t = settled(&cl).await;
    assert!(t.evictions >= 5, "9 blocks through a 4-block tier: {t:?}");
    let usage = c.worker(0).unwrap().store().usage();
    assert!(usage[0].used <= 4 * BLOCK, "{usage:?}");
    let fi = cl.status("/pinned.bin", true).await.unwrap();
    assert_eq!(cached_fraction(&fi), 1.0, "pinned block was evicted");

    // Everything pinned, and a pinned file bigger than the free space: loading it is
    // refused cleanly.
    let d = random(5 * BLOCK as usize);
    std::fs::write(ufs_dir(&c).join("big.bin"), &d).unwrap();
    cl.set_pinned("/", true, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fi = cl.status("/big.bin", true).await.unwrap();
    let e = cl.load(&fi, |_| {}).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
    // a plain read still works, uncached
    assert_eq!(sha(&read_all(&cl, "/big.bin").await), sha(&d));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demotion_to_ssd_and_promotion_back() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 2 * BLOCK, true).await;
    let cl = client(&c, Locality::Auto);
    let mut files = Vec::new();
    for i in 0..4 {
        let d = random(BLOCK as usize);
        std::fs::write(ufs_dir(&c).join(format!("f{i}")), &d).unwrap();
        read_all(&cl, &format!("/f{i}")).await;
        files.push(d);
    }
    // The master learns of a move with the worker's next commit: poll, do not guess.
    let tier_of_f0 = async |want: pb::Tier| {
        let mut last = None;
        for _ in 0..100 {
            let fi = cl.status("/f0", true).await.unwrap();
            last = fi.blocks[0].locations.first().map(|l| l.tier());
            if last == Some(want) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        last
    };
    assert_eq!(tier_of_f0(pb::Tier::Ssd).await, Some(pb::Tier::Ssd), "oldest block demoted, not dropped");
    let before = settled(&cl).await;
    let promote = c.client(ClientConfig { read_type: ReadType::CachePromote, ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&promote, "/f0").await), sha(&files[0]));
    assert_eq!(tier_of_f0(pb::Tier::Mem).await, Some(pb::Tier::Mem), "promoted back");
    assert_eq!(settled(&cl).await.ufs, before.ufs);
    c.shutdown().await;
}

/// Mounts `<dir>/other`, holding one file (`name`, `bytes`), at `/m` (file://) with a sync
/// interval of `sync_ms`; returns the directory.
async fn mount_lake(cl: &Client, dir: &Path, (name, bytes): (&str, &[u8]), sync_ms: u64) -> std::path::PathBuf {
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join(name), bytes).unwrap();
    cl.mount(pb::MountRequest {
        path: "/m".into(),
        uri: format!("file://{}", other.display()),
        sync_interval_ms: sync_ms,
        ..Default::default()
    })
    .await
    .unwrap();
    other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changed_ufs_file_is_reread_after_the_sync_interval() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20, false).await;
    let cl = client(&c, Locality::Auto);
    let other = mount_lake(&cl, dir.path(), ("x.txt", b"version one"), 300).await;
    assert_eq!(read_all(&cl, "/m/x.txt").await, b"version one");
    std::fs::write(other.join("x.txt"), b"version two, longer").unwrap();
    // within the interval the cached copy is served
    assert_eq!(read_all(&cl, "/m/x.txt").await, b"version one");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(read_all(&cl, "/m/x.txt").await, b"version two, longer");
    // listing notices deletions
    std::fs::write(other.join("y.txt"), b"y").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (names, _) = cl.list_page("/m", "", false, 0).await.unwrap();
    assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["x.txt", "y.txt"]);
    std::fs::remove_file(other.join("y.txt")).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (names, _) = cl.list_page("/m", "", false, 0).await.unwrap();
    assert_eq!(names.len(), 1);
    c.shutdown().await;
}

/// A name the namespace lacks is asked of the UFS, so a file put there behind Locus's
/// back is found by name at once, even in a directory listed already; but a name the UFS
/// said is missing is not asked again within the sync interval (a job's commit looks the
/// same missing names up several times while its persists run in the UFS), and nothing
/// under a committer's staging directory is (it exists in Locus only).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_name_is_asked_of_the_ufs_once_per_sync_interval() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20, false).await;
    let cl = client(&c, Locality::Auto);
    let other = mount_lake(&cl, dir.path(), ("a.txt", b"a"), 1500).await;
    let (names, _) = cl.list_page("/m", "", false, 0).await.unwrap();
    assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a.txt"]);
    std::fs::write(other.join("late.txt"), b"late").unwrap();
    assert_eq!(read_all(&cl, "/m/late.txt").await, b"late", "found by name at once");

    let not_found = |p: &'static str| {
        let cl = &cl;
        async move { cl.status(p, false).await.unwrap_err().kind() == locus_common::ErrorKind::NotFound }
    };
    assert!(not_found("/m/_SUCCESS").await);
    std::fs::write(other.join("_SUCCESS"), b"").unwrap();
    assert!(not_found("/m/_SUCCESS").await, "the UFS is not asked again within the interval");
    cl.mkdir("/m/_temporary/0", true).await.unwrap();
    std::fs::create_dir_all(other.join("_temporary/0")).unwrap();
    std::fs::write(other.join("_temporary/0/part-0"), b"x").unwrap();
    assert!(not_found("/m/_temporary/0/part-0").await, "staging directories are Locus's own");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(cl.status("/m/_SUCCESS", false).await.unwrap().length, 0, "asked again once the interval is over");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_and_worker_restarts_recover_namespace_mounts_and_disk_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 64 << 20, false);
    cfg.worker.tiers =
        vec![TierConfig { alias: TierAlias::Ssd, dir: dir.path().join("ssd"), quota: ByteSize::mib(64) }];
    let mut c = LocalCluster::start(cfg, &dir.path().join("data"), 2, None).await.unwrap();
    let cl = client(&c, Locality::Auto);
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    cl.mount(pb::MountRequest { path: "/m2".into(), uri: format!("file://{}", other.display()), ..Default::default() })
        .await
        .unwrap();
    let data = random(3 * BLOCK as usize);
    cl.put("/m2/dir/f.bin", &mut data.as_slice(), false).await.unwrap();
    wait_persisted(&cl, "/m2/dir/f.bin").await;
    assert_eq!(std::fs::read(other.join("dir/f.bin")).unwrap(), data, "the write is persisted to the UFS");
    assert_eq!(sha(&read_all(&cl, "/m2/dir/f.bin").await), sha(&data));

    // Master restart: mounts and namespace come back; workers re-register their blocks.
    c.stop_master().await;
    c.start_master().await.unwrap();
    let cl = client(&c, Locality::Auto);
    let mounts = cl.mount_table().await.unwrap();
    assert!(mounts.iter().any(|m| m.path == "/m2"), "{mounts:?}");
    let (entries, _) = cl.list_page("/m2/dir", "", false, 0).await.unwrap();
    assert_eq!(entries.len(), 1);
    for _ in 0..50 {
        if cached_fraction(&cl.status("/m2/dir/f.bin", true).await.unwrap()) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cached_fraction(&cl.status("/m2/dir/f.bin", true).await.unwrap()), 1.0);

    // Worker restart: its blocks on disk tiers are found again and reported.
    let before = settled(&cl).await;
    let fi = cl.status("/m2/dir/f.bin", true).await.unwrap();
    let holder = fi.blocks[0].locations[0].worker_id;
    let idx = (0..2).find(|i| c.worker(*i).unwrap().id() == holder).unwrap();
    c.stop_worker(idx).await;
    c.start_worker(idx).await.unwrap();
    c.worker(idx).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    assert_eq!(c.worker(idx).unwrap().id(), holder, "a restarted worker keeps its id");
    let fi = cl.status("/m2/dir/f.bin", true).await.unwrap();
    assert_eq!(cached_fraction(&fi), 1.0, "blocks reported again after the worker restart");
    assert!(fi.blocks.iter().all(|b| b.locations.iter().all(|l| l.tier() == pb::Tier::Ssd)));
    assert_eq!(sha(&read_all(&cl, "/m2/dir/f.bin").await), sha(&data));
    let after = settled(&cl).await;
    assert_eq!(after.ufs, before.ufs, "no UFS re-read after restarts");
    c.shutdown().await;
}

/// Copy the files of one directory into another (a tier's blocks and records).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A worker whose tier holds blocks written under another master (its namespace wiped,
/// or another cluster's) must never serve them for this namespace's files of the same
/// block ids: the master refuses its report, the worker drops them and registers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocks_of_another_cluster_are_dropped_never_served() {
    let dir = tempfile::tempdir().unwrap();
    // Cluster A writes a file and goes away; its worker's tier keeps the blocks.
    let a = start(&dir.path().join("a"), 1, 64 << 20, false).await;
    let old = random(2 * BLOCK as usize);
    let ca = client(&a, Locality::Auto);
    put_as(&ca, "/f.bin", &old, WriteType::MustCache).await.unwrap();
    let fa = ca.status("/f.bin", true).await.unwrap();
    a.shutdown().await;
    // Cluster B, a fresh namespace, writes other bytes under the same block ids.
    let mut b = start(&dir.path().join("b"), 2, 64 << 20, false).await;
    let cl = client(&b, Locality::Auto);
    let new = random(2 * BLOCK as usize);
    put_as(&cl, "/g.bin", &new, WriteType::CacheThrough).await.unwrap();
    let fb = cl.status("/g.bin", true).await.unwrap();
    assert_eq!(
        fa.blocks.iter().map(|x| x.block_id).collect::<Vec<_>>(),
        fb.blocks.iter().map(|x| x.block_id).collect::<Vec<_>>(),
        "the test needs colliding block ids"
    );
    let holders: Vec<u64> = fb.blocks.iter().flat_map(|x| x.locations.iter().map(|l| l.worker_id)).collect();
    let idx = (0..2).find(|i| !holders.contains(&b.worker(*i).unwrap().id())).expect("a worker without the file");
    // That worker comes back holding A's blocks (and A's cluster record).
    b.stop_worker(idx).await;
    let tier = dir.path().join("b").join("mem").join(format!("w{idx}"));
    copy_dir(&dir.path().join("a").join("mem").join("w0"), &tier);
    b.start_worker(idx).await.unwrap();
    b.worker(idx).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    let me = b.worker(idx).unwrap().id();
    let fi = cl.status("/g.bin", true).await.unwrap();
    assert!(
        fi.blocks.iter().all(|x| x.locations.iter().all(|l| l.worker_id != me)),
        "the master recorded another cluster's blocks: {fi:?}"
    );
    for x in &fa.blocks {
        assert!(!tier.join("blocks").join(x.block_id.to_string()).exists(), "block {} kept", x.block_id);
    }
    // With the file's own holder gone, the bytes come from the UFS: the new ones.
    b.stop_worker(1 - idx).await;
    assert_eq!(sha(&read_all(&client(&b, Locality::Remote), "/g.bin").await), sha(&new));
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_clear_errors_and_servers_stay_up() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    // No root mount: paths must fall under an explicit mount.
    let c = LocalCluster::start(config(dir.path(), 64 << 20, false), &dir.path().join("data"), 1, Some(String::new()))
        .await
        .unwrap();
    let cl = client(&c, Locality::Auto);
    let e = cl.status("/nowhere/x", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("outside every mount"), "{e}");

    let inside = dir.path().join("inside");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::write(dir.path().join("secret"), b"outside the mount").unwrap();
    cl.mount(pb::MountRequest {
        path: "/in".into(),
        uri: format!("file://{}", inside.display()),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = cl.status("/in/../secret", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = cl.put("/in/../escaped", &mut &b"x"[..], false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(!dir.path().join("escaped").exists());

    // Mounts of unreachable or missing stores fail without hurting the master.
    let e = cl
        .mount(pb::MountRequest {
            path: "/s3".into(),
            uri: "s3://bucket/p".into(),
            options: [("endpoint".to_string(), "http://127.0.0.1:1".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Ufs), "{e:?}");
    let e = cl
        .mount(pb::MountRequest { path: "/gone".into(), uri: "file:///no/such/dir/here".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Ufs), "{e:?}");
    let e = cl
        .mount(pb::MountRequest { path: "/bad".into(), uri: "ftp://x".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    // Garbled bytes on the master's RPC port and the worker's data port.
    for addr in [c.master_address(), c.worker(0).unwrap().data_address().to_string()] {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // the server may hang up early: that is its right
        let _ = s.write_all(&random(4096)).await;
        let _ = s.write_all(&[0xff; 16]).await;
        drop(s);
    }
    let mut s = tokio::net::TcpStream::connect(c.worker(0).unwrap().data_address()).await.unwrap();
    locus_proto::authenticate(&mut s, &locus_common::security::Identity::client(&c.client_token())).await.unwrap();
    s.write_all(&5u32.to_be_bytes()).await.unwrap();
    s.write_all(b"\xff\xff\xff\xff\xff").await.unwrap();
    let r: pb::DataResponse = locus_proto::read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::InvalidArgument, "a garbled frame gets an error answer");
    drop(s);
    // still serving
    std::fs::write(inside.join("ok.txt"), b"fine").unwrap();
    assert_eq!(read_all(&cl, "/in/ok.txt").await, b"fine");
    assert_eq!(c.client(ClientConfig::default()).unwrap().report().await.unwrap().workers.len(), 1);
    // A read range beyond its block is refused with an error frame; the worker stays up.
    let mut s = tokio::net::TcpStream::connect(c.worker(0).unwrap().data_address()).await.unwrap();
    locus_proto::authenticate(&mut s, &locus_common::security::Identity::client(&c.client_token())).await.unwrap();
    let req = pb::ReadBlockRequest {
        block_id: 1,
        offset: 10,
        length: 10,
        block_length: 5,
        fingerprint: locus_common::UNPERSISTED_FINGERPRINT.into(),
        ..Default::default()
    };
    locus_proto::write_frame(&mut s, &pb::DataRequest::from(pb::data_request::Req::Read(req))).await.unwrap();
    let r: pb::DataResponse = locus_proto::read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::InvalidArgument);
    assert_eq!(read_all(&cl, "/in/ok.txt").await, b"fine");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_write_type_puts_bytes_where_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = client(&c, Locality::Remote);
    let ufs = ufs_dir(&c);
    let data = random(2 * BLOCK as usize + 1000);
    let copies = |fi: &pb::FileInfo| fi.blocks.iter().map(|b| b.locations.len()).collect::<Vec<_>>();

    // THROUGH: in the UFS at the ack, nothing cached
    put_as(&cl, "/through.bin", &data, WriteType::Through).await.unwrap();
    assert_eq!(std::fs::read(ufs.join("through.bin")).unwrap(), data);
    let fi = cl.status("/through.bin", true).await.unwrap();
    assert_eq!((fi.persist_state().name(), copies(&fi)), ("PERSISTED", vec![0, 0, 0]));

    // CACHE_THROUGH: in the UFS and in one worker's cache at the ack
    put_as(&cl, "/ct.bin", &data, WriteType::CacheThrough).await.unwrap();
    assert_eq!(std::fs::read(ufs.join("ct.bin")).unwrap(), data);
    let fi = cl.status("/ct.bin", true).await.unwrap();
    assert_eq!((fi.persist_state().name(), copies(&fi)), ("PERSISTED", vec![1, 1, 1]));
    let before = totals(&cl).await.ufs;
    assert_eq!(sha(&read_all(&cl, "/ct.bin").await), sha(&data));
    assert_eq!(settled(&cl).await.ufs, before, "a CACHE_THROUGH file reads from the cache");

    // MUST_CACHE: on min(2, live) workers, never in the UFS until asked
    let fi = put_as(&cl, "/mc.bin", &data, WriteType::MustCache).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::NotPersisted);
    let fi = cl.status("/mc.bin", true).await.unwrap();
    assert_eq!(copies(&fi), vec![2, 2, 2], "both workers hold every block at the ack");
    assert_eq!(sha(&read_all(&cl, "/mc.bin").await), sha(&data));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ufs.join("mc.bin").exists(), "MUST_CACHE stays out of the UFS");
    assert_eq!(cl.free("/mc.bin", false).await.unwrap_err().kind(), ErrorKind::FailedPrecondition);
    cl.persist("/mc.bin").await.unwrap();
    let fi = wait_persisted(&cl, "/mc.bin").await;
    assert_eq!(std::fs::read(ufs.join("mc.bin")).unwrap(), data, "persist on demand");
    assert_eq!(copies(&fi), vec![1, 1, 1], "extra copies go once persisted");

    // ASYNC_THROUGH (the default): acknowledged from memory, persisted in the background
    let fi = cl.put("/async.bin", &mut data.as_slice(), false).await.unwrap();
    assert!(matches!(fi.persist_state().name(), "TO_BE_PERSISTED" | "PERSISTED"), "{}", fi.persist_state().name());
    let fi = wait_persisted(&cl, "/async.bin").await;
    assert_eq!(std::fs::read(ufs.join("async.bin")).unwrap(), data);
    assert_eq!(copies(&fi), vec![1, 1, 1]);
    assert!(
        fi.fingerprint.starts_with(&format!("{}:", data.len())),
        "UFS fingerprint after persist: {}",
        fi.fingerprint
    );
    assert_eq!(sha(&read_all(&cl, "/async.bin").await), sha(&data));

    // empty files in one call
    let fi = cl.touch("/empty-through", Some(WriteType::Through)).await.unwrap();
    assert_eq!((fi.length, fi.persist_state().name()), (0, "PERSISTED"));
    assert_eq!(std::fs::read(ufs.join("empty-through")).unwrap(), b"");
    assert_eq!(
        cl.touch("/empty-mc", Some(WriteType::MustCache)).await.unwrap().persist_state(),
        pb::PersistState::NotPersisted
    );
    assert_eq!(cl.touch("/empty-mc", None).await.unwrap_err().kind(), ErrorKind::AlreadyExists);
    wait_persisted(&cl, "/async.bin").await;

    // the report shows an empty backlog once everything is persisted
    let r = cl.report().await.unwrap();
    assert_eq!((r.persist_backlog_files, r.persist_backlog_bytes), (0, 0));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_replication_waits_for_workers_then_fails_or_goes_on_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let mut cfg = ClientConfig { locality: Locality::Remote, ..Default::default() };
    cfg.replication.durable = 3;
    cfg.replication.wait = Duration::from_millis(300);
    let strict = c.client(cfg.clone()).unwrap();
    let data = random(1000);
    let e = put_as(&strict, "/three.bin", &data, WriteType::AsyncThrough).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("needs 3 worker copies but 2 of the 2 workers the master lists answer"), "{e}");
    cfg.replication.allow_fewer = true;
    let lenient = c.client(cfg).unwrap();
    put_as(&lenient, "/three.bin", &data, WriteType::AsyncThrough).await.unwrap();
    assert_eq!(read_all(&lenient, "/three.bin").await, data);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_beyond_the_cache_fail_clearly_for_must_cache_and_go_through_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 4 * BLOCK, false).await;
    let cl = client(&c, Locality::Remote);
    let first = random(2 * BLOCK as usize);
    put_as(&cl, "/first.bin", &first, WriteType::MustCache).await.unwrap();
    let big = random(4 * BLOCK as usize);
    let e = put_as(&cl, "/big.bin", &big, WriteType::MustCache).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("full"), "{e}");
    assert!(cl.status("/big.bin", false).await.is_err(), "a failed write leaves no file");
    assert_eq!(sha(&read_all(&cl, "/first.bin").await), sha(&first), "earlier data is not lost");
    // ASYNC_THROUGH outgrowing the cache goes on through to the UFS instead of failing
    let fi = put_as(&cl, "/big.bin", &big, WriteType::AsyncThrough).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::Persisted, "persisted at the ack");
    assert_eq!(sha(&std::fs::read(ufs_dir(&c).join("big.bin")).unwrap()), sha(&big));
    assert_eq!(sha(&read_all(&cl, "/big.bin").await), sha(&big));
    assert_eq!(sha(&read_all(&cl, "/first.bin").await), sha(&first));
    c.shutdown().await;
}

/// An input that gives `data`, then fails (a writer that gives up mid-write).
struct FailsAfter(Vec<u8>, usize);

impl tokio::io::AsyncRead for FailsAfter {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let at = self.1;
        if at == self.0.len() {
            return Poll::Ready(Err(std::io::Error::other("the writer gave up")));
        }
        let n = buf.remaining().min(self.0.len() - at);
        buf.put_slice(&self.0[at..at + n]);
        self.1 += n;
        Poll::Ready(Ok(()))
    }
}

/// A co-located client's cached write with one copy goes short-circuit (the client
/// writes the block files itself; no byte crosses a socket) at every length around the
/// block boundaries; one the cache cannot hold fails (MUST_CACHE) or goes on through to
/// the UFS part-way (ASYNC_THROUGH: the rest is sent over the socket); a writer that
/// gives up, or a remote client, leaves the counts and the cache as they should.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn co_located_cached_writes_go_short_circuit() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20, false).await;
    let cl = client(&c, Locality::Auto);
    let b = BLOCK as usize;
    let (mut sc, mut dp) = (0u64, 0u64);
    // Files of at most 1 MiB go over the data path (quicker for them), longer ones
    // short-circuit, block by block.
    for (i, n) in [0, 1, b, b + 1, 2 * b, 2 * b + 1, 3 * b - 1, 3 * b + 7].into_iter().enumerate() {
        let data = random(n);
        let wt = if i % 2 == 0 { WriteType::MustCache } else { WriteType::AsyncThrough };
        let fi = put_as(&cl, &format!("/sc{i}"), &data, wt).await.unwrap();
        assert_eq!(fi.length, n as u64, "{wt:?} of {n} bytes");
        assert_eq!(sha(&read_all(&cl, &format!("/sc{i}")).await), sha(&data), "{wt:?} of {n} bytes");
        if wt == WriteType::AsyncThrough {
            wait_persisted(&cl, &format!("/sc{i}")).await;
            assert_eq!(sha(&std::fs::read(ufs_dir(&c).join(format!("sc{i}"))).unwrap()), sha(&data));
        }
        if n > 1 << 20 { sc += n as u64 } else { dp += n as u64 }
    }
    let t = wait_for(&cl, "short-circuit writes", |t| t.written_short_circuit == sc).await;
    assert_eq!(t.written_data_path, dp, "{t:?}");

    // A remote client's write goes over the data path.
    let remote = client(&c, Locality::Remote);
    put_as(&remote, "/remote.bin", &random(b + 3), WriteType::MustCache).await.unwrap();
    wait_for(&cl, "data-path writes", |t| t.written_data_path == dp + (b + 3) as u64).await;
    c.shutdown().await;

    // Beyond the cache: MUST_CACHE fails and leaves nothing; ASYNC_THROUGH goes on
    // through to the UFS with what was cached so far.
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 4 * BLOCK, false).await;
    let cl = client(&c, Locality::Auto);
    let first = random(2 * b);
    put_as(&cl, "/first.bin", &first, WriteType::MustCache).await.unwrap();
    let big = random(4 * b + 5);
    let e = put_as(&cl, "/big.bin", &big, WriteType::MustCache).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
    assert!(cl.status("/big.bin", false).await.is_err(), "a failed write leaves no file");
    let before = settled(&cl).await;
    let fi = put_as(&cl, "/big.bin", &big, WriteType::AsyncThrough).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::Persisted, "went through: persisted at the ack");
    assert_eq!(sha(&std::fs::read(ufs_dir(&c).join("big.bin")).unwrap()), sha(&big));
    assert_eq!(sha(&read_all(&cl, "/big.bin").await), sha(&big));
    assert_eq!(sha(&read_all(&cl, "/first.bin").await), sha(&first), "earlier data is not lost");
    let after = settled(&cl).await;
    let (sc_big, dp_big) = (
        after.written_short_circuit - before.written_short_circuit,
        after.written_data_path - before.written_data_path,
    );
    assert_eq!(sc_big + dp_big, big.len() as u64, "{before:?} {after:?}");
    assert!(sc_big > 0 && sc_big % BLOCK == 0 && dp_big > 0, "{sc_big} short-circuit, {dp_big} over the socket");
    cl.delete("/big.bin", false).await.unwrap();

    // A writer that gives up mid-write: no file, and its blocks are gone from the cache
    // (what is left holds a new 2-block file beside the first).
    let opts = PutOptions { write_type: Some(WriteType::MustCache), ..Default::default() };
    let mut input = FailsAfter(random(b + b / 2), 0);
    let e = cl.put_with("/gave-up.bin", &mut input, &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap_err();
    assert!(e.to_string().contains("gave up"), "{e}");
    assert!(cl.status("/gave-up.bin", false).await.is_err());
    let again = random(2 * b);
    put_as(&cl, "/again.bin", &again, WriteType::MustCache).await.unwrap();
    assert_eq!(sha(&read_all(&cl, "/again.bin").await), sha(&again));
    assert_eq!(c.worker(0).unwrap().store().usage()[0].used, 4 * BLOCK);
    c.shutdown().await;
}

/// Create, rename and delete reach the UFS in order; a master restart mid-backlog
/// resumes the queue and the deleted file never appears in the UFS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_changes_behind_a_backlog_reach_the_ufs_in_order_across_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = client(&c, Locality::Remote);
    let ufs = ufs_dir(&c);
    let data = random(BLOCK as usize);
    cl.mkdir("/q", false).await.unwrap();
    for i in 0..20 {
        cl.put(&format!("/q/f{i}"), &mut data.as_slice(), false).await.unwrap();
    }
    cl.rename("/q/f0", "/q/g0").await.unwrap();
    cl.delete("/q/f1", false).await.unwrap();
    cl.put("/q/tmp", &mut data.as_slice(), false).await.unwrap();
    cl.rename("/q/tmp", "/q/tmp2").await.unwrap();
    cl.delete("/q/tmp2", false).await.unwrap();
    // the master goes away with (most likely) work queued, and comes back
    c.stop_master().await;
    c.start_master().await.unwrap();
    let cl = client(&c, Locality::Remote);
    for i in 2..20 {
        wait_persisted(&cl, &format!("/q/f{i}")).await;
    }
    wait_persisted(&cl, "/q/g0").await;
    wait_queue_empty(&cl, Duration::from_secs(10)).await;
    let names = ufs_files(&ufs.join("q"));
    let mut want: Vec<String> = (2..20).map(|i| format!("f{i}")).chain(["g0".to_string()]).collect();
    want.sort();
    assert_eq!(names, want, "renamed and deleted files end as they should in the UFS");
    for n in &want {
        assert_eq!(std::fs::read(ufs.join("q").join(n)).unwrap(), data);
    }
    c.shutdown().await;
}

/// An initial persist wait (what the gateway gives multipart parts): the write is
/// acknowledged at once, the persist waits, a delete in the meantime means the bytes never
/// reach the UFS, and a later change of the path ends the wait (order holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_persist_wait_skips_files_deleted_in_time_and_ends_on_a_later_change() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = client(&c, Locality::Remote);
    let ufs = ufs_dir(&c);
    let data = random(BLOCK as usize + 17);
    let opts = PutOptions {
        overwrite: true,
        write_type: Some(WriteType::AsyncThrough),
        persist_wait: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    cl.mkdir("/up", false).await.unwrap();
    for name in ["p1", "p2", "keep"] {
        cl.put_with(&format!("/up/{name}"), &mut data.as_slice(), &opts, |_| Ok(pb::ObjectMeta::default()))
            .await
            .unwrap();
    }
    // An unrelated file is persisted meanwhile: waiting operations hold back nothing else.
    cl.put("/other", &mut data.as_slice(), false).await.unwrap();
    wait_persisted(&cl, "/other").await;
    for name in ["p1", "p2", "keep"] {
        let fi = cl.status(&format!("/up/{name}"), false).await.unwrap();
        assert_eq!(fi.persist_state(), pb::PersistState::ToBePersisted, "{name} waits");
        assert!(!ufs.join("up").join(name).exists(), "{name} is not in the UFS yet");
        assert_eq!(read_all(&cl, &format!("/up/{name}")).await, data, "{name} reads from the cache");
    }
    assert_eq!(cl.report().await.unwrap().persist_backlog_files, 3);
    // Deleted while waiting: never written. Renamed: the wait ends, persisted in order.
    cl.delete("/up/p1", false).await.unwrap();
    cl.delete("/up/p2", false).await.unwrap();
    cl.rename("/up/keep", "/up/kept").await.unwrap();
    wait_persisted(&cl, "/up/kept").await;
    wait_queue_empty(&cl, Duration::from_secs(10)).await; // the waits ended with the later changes
    assert_eq!(ufs_files(&ufs.join("up")), vec!["kept"]);
    assert_eq!(std::fs::read(ufs.join("up/kept")).unwrap(), data);
    // The metrics tell the skipped persists from the written ones, and count the bytes.
    let m = locus_master::render_metrics(c.master());
    assert!(m.contains("locus_persist_ops_total{kind=\"PERSIST\",result=\"skipped\"} 2"), "{m}");
    assert!(m.contains("locus_persist_ops_total{kind=\"PERSIST\",result=\"done\"} 2"), "{m}");
    assert!(m.contains(&format!("locus_persisted_bytes_total {}", 2 * data.len())), "{m}");
    // A synchronous UFS write over a waiting persist ends the wait instead of sitting it
    // out (60 s here, then failing).
    cl.put_with("/up/sync", &mut data.as_slice(), &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap();
    let through = PutOptions { overwrite: true, write_type: Some(WriteType::Through), ..Default::default() };
    let newer = random(1000);
    tokio::time::timeout(
        Duration::from_secs(30),
        cl.put_with("/up/sync", &mut newer.as_slice(), &through, |_| Ok(pb::ObjectMeta::default())),
    )
    .await
    .expect("the THROUGH write did not wait out the persist wait")
    .unwrap();
    assert_eq!(std::fs::read(ufs.join("up/sync")).unwrap(), newer);
    c.shutdown().await;
}

/// Every file below `dir` in a `file://` UFS, relative to it, sorted (directories left out).
fn ufs_files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// An output committer's commit through the native namespace (what Spark does through
/// the Hadoop connector): task output written ASYNC_THROUGH under `_temporary/` waits
/// (`master.staged_persist_wait`), renames carry the waiting persists along (the attempt →
/// task rename keeps the wait, the rename out of `_temporary` ends it), and each file is
/// written to the UFS once, at its final path; nothing is ever written under `_temporary`:
/// neither its directories (made in Locus only) nor renames within it (nothing to move).
/// A renamed file whose old version was in the UFS ends with the new bytes at the new path.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_output_is_persisted_once_at_its_final_path() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = client(&c, Locality::Remote);
    let ufs = ufs_dir(&c);
    let (a, b) = (random(BLOCK as usize + 5), random(3000));
    let attempt = "/out/_temporary/0/_temporary/attempt_1";
    let task = "/out/_temporary/0/task_1";
    cl.mkdir(attempt, true).await.unwrap();
    put_as(&cl, &format!("{attempt}/part-0"), &a, WriteType::AsyncThrough).await.unwrap();
    put_as(&cl, &format!("{attempt}/part-1"), &b, WriteType::AsyncThrough).await.unwrap();
    assert!(ufs.join("out").is_dir() && !ufs.join("out/_temporary").exists(), "staging directories stay in Locus");
    // Unrelated work goes on meanwhile.
    put_as(&cl, "/other", &b, WriteType::AsyncThrough).await.unwrap();
    wait_persisted(&cl, "/other").await;
    cl.rename(attempt, task).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in ["part-0", "part-1"] {
        let fi = cl.status(&format!("{task}/{p}"), false).await.unwrap();
        assert_eq!(
            fi.persist_state(),
            pb::PersistState::ToBePersisted,
            "{p} still waits after the rename within _temporary"
        );
    }
    assert_eq!(ufs_files(&ufs.join("out")), Vec::<String>::new(), "nothing staged reaches the UFS");
    assert_eq!(read_all(&cl, &format!("{task}/part-0")).await, a);
    for p in ["part-0", "part-1"] {
        cl.rename(&format!("{task}/{p}"), &format!("/out/{p}")).await.unwrap();
    }
    wait_persisted(&cl, "/out/part-0").await;
    wait_persisted(&cl, "/out/part-1").await;
    cl.delete("/out/_temporary", true).await.unwrap();
    put_as(&cl, "/out/_SUCCESS", b"", WriteType::AsyncThrough).await.unwrap();
    wait_queue_empty(&cl, Duration::from_secs(10)).await;
    assert_eq!(ufs_files(&ufs.join("out")), vec!["_SUCCESS", "part-0", "part-1"]);
    assert_eq!(std::fs::read(ufs.join("out/part-0")).unwrap(), a);
    assert_eq!(std::fs::read(ufs.join("out/part-1")).unwrap(), b);
    let m = locus_master::render_metrics(c.master());
    let want = format!("locus_persisted_bytes_total {}", a.len() + 2 * b.len());
    assert!(m.contains(&want), "each file written once ({want}): {m}");
    assert!(m.contains("locus_persist_ops_total{kind=\"PERSIST\",result=\"done\"} 4"), "{m}");
    // The UFS renames: none had anything to move (the attempt directory, the files).
    assert!(!m.contains("locus_persist_ops_total{kind=\"RENAME\",result=\"done\"}"), "{m}");
    assert!(m.contains("locus_persist_ops_total{kind=\"RENAME\",result=\"skipped\"} 3"), "{m}");

    // The same commit at full speed: the file renames come while the directory's UFS
    // rename may still be queued ahead (it stays ahead; the persists still move).
    let (attempt, task) = ("/out2/_temporary/0/_temporary/attempt_2", "/out2/_temporary/0/task_2");
    cl.mkdir(attempt, true).await.unwrap();
    put_as(&cl, &format!("{attempt}/part-0"), &b, WriteType::AsyncThrough).await.unwrap();
    cl.rename(attempt, task).await.unwrap();
    cl.rename(&format!("{task}/part-0"), "/out2/part-0").await.unwrap();
    cl.delete("/out2/_temporary", true).await.unwrap();
    wait_persisted(&cl, "/out2/part-0").await;
    wait_queue_empty(&cl, Duration::from_secs(10)).await;
    assert_eq!(ufs_files(&ufs.join("out2")), vec!["part-0"]);
    assert_eq!(std::fs::read(ufs.join("out2/part-0")).unwrap(), b);
    let m = locus_master::render_metrics(c.master());
    assert!(!m.contains("locus_persist_ops_total{kind=\"RENAME\",result=\"done\"}"), "{m}");
    assert!(m.contains("locus_persist_ops_total{kind=\"RENAME\",result=\"skipped\"} 5"), "{m}");

    // The UFS holds an older version at the source: the queued UFS rename moves it first,
    // and the new bytes land over it.
    let (old, new) = (random(2000), random(5000));
    cl.mkdir("/x/_temporary", true).await.unwrap();
    put_as(&cl, "/x/_temporary/f", &old, WriteType::Through).await.unwrap();
    put_as(&cl, "/x/_temporary/f", &new, WriteType::AsyncThrough).await.unwrap();
    assert_eq!(std::fs::read(ufs.join("x/_temporary/f")).unwrap(), old);
    cl.rename("/x/_temporary/f", "/x/f").await.unwrap();
    wait_persisted(&cl, "/x/f").await;
    wait_queue_empty(&cl, Duration::from_secs(10)).await;
    assert_eq!(ufs_files(&ufs.join("x")), vec!["f"]);
    assert_eq!(std::fs::read(ufs.join("x/f")).unwrap(), new);
    assert_eq!(read_all(&cl, "/x/f").await, new);
    let m = locus_master::render_metrics(c.master());
    assert!(m.contains("locus_persist_ops_total{kind=\"RENAME\",result=\"done\"} 1"), "the older version moved: {m}");
    c.shutdown().await;
}

/// Poll `stat` until `f` holds for the file.
async fn wait_stat(c: &Client, path: &str, what: &str, f: impl Fn(&pb::FileInfo) -> bool) -> pb::FileInfo {
    for _ in 0..300 {
        let fi = c.status(path, true).await.unwrap();
        if f(&fi) {
            return fi;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path}: {what} did not happen in 15 s: {:?}", c.status(path, true).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_workers_copies_are_restored_and_lost_files_come_back_with_their_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 3, 64 << 20, false).await;
    let cl = client(&c, Locality::Remote);
    let data = random(3 * BLOCK as usize);
    let copies = |fi: &pb::FileInfo| fi.blocks.iter().map(|b| b.locations.len()).min().unwrap_or(0);

    // A file only in worker memory, on two workers: one goes, its copies are remade.
    put_as(&cl, "/mc.bin", &data, WriteType::MustCache).await.unwrap();
    let fi = cl.status("/mc.bin", true).await.unwrap();
    assert_eq!(copies(&fi), 2);
    let victim = fi.blocks[0].locations[0].worker_id;
    let idx = (0..3).find(|i| c.worker(*i).unwrap().id() == victim).unwrap();
    c.stop_worker(idx).await;
    let fi = wait_stat(&cl, "/mc.bin", "re-replication", |fi| {
        copies(fi) == 2 && fi.blocks.iter().all(|b| b.locations.iter().all(|l| l.worker_id != victim))
    })
    .await;
    assert_eq!(fi.persist_state(), pb::PersistState::NotPersisted);
    assert_eq!(sha(&read_all(&cl, "/mc.bin").await), sha(&data));
    c.start_worker(idx).await.unwrap();
    c.worker(idx).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();

    // setReplication: a minimum adds copies of a persisted file, a maximum removes them.
    put_as(&cl, "/ct.bin", &data, WriteType::CacheThrough).await.unwrap();
    assert_eq!(cl.set_replication("/ct.bin", 3, 0, false).await.unwrap(), 1);
    wait_stat(&cl, "/ct.bin", "min 3", |fi| copies(fi) == 3).await;
    cl.set_replication("/ct.bin", 1, 1, false).await.unwrap();
    wait_stat(&cl, "/ct.bin", "max 1", |fi| fi.blocks.iter().all(|b| b.locations.len() == 1)).await;

    // One copy only, and its worker goes: LOST; it comes back: whole again.
    let opts = PutOptions { write_type: Some(WriteType::MustCache), durable_replicas: Some(1), ..Default::default() };
    cl.put_with("/one.bin", &mut data.as_slice(), &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap();
    let fi = cl.status("/one.bin", true).await.unwrap();
    assert_eq!(copies(&fi), 1);
    let holder = fi.blocks[0].locations[0].worker_id;
    let idx = (0..3).find(|i| c.worker(*i).unwrap().id() == holder).unwrap();
    c.stop_worker(idx).await;
    let fi = wait_stat(&cl, "/one.bin", "LOST", |fi| fi.persist_state() == pb::PersistState::Lost).await;
    let mut sink = Vec::new();
    let err = cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut sink).await.unwrap_err();
    assert!(err.to_string().contains("not persisted"), "{err}");
    assert_eq!(cl.persist("/one.bin").await.unwrap_err().kind(), ErrorKind::Corrupt);
    c.start_worker(idx).await.unwrap();
    wait_stat(&cl, "/one.bin", "its return", |fi| fi.persist_state() == pb::PersistState::NotPersisted).await;
    assert_eq!(sha(&read_all(&cl, "/one.bin").await), sha(&data));
    cl.persist("/one.bin").await.unwrap();
    wait_persisted(&cl, "/one.bin").await;
    assert_eq!(std::fs::read(ufs_dir(&c).join("one.bin")).unwrap(), data);
    c.shutdown().await;
}

/// Flip a byte of every copy of `block` held under the SSD tiers of `workers`.
fn corrupt(dir: &Path, workers: &[usize], block: u64) -> usize {
    let mut n = 0;
    for i in workers {
        let p = dir.join("ssd").join(format!("w{i}")).join("blocks").join(block.to_string());
        if let Ok(mut b) = std::fs::read(&p) {
            let mid = b.len() / 2;
            b[mid] ^= 0x5a;
            std::fs::write(&p, &b).unwrap();
            n += 1;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_block_is_detected_repaired_and_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 64 << 20, false);
    cfg.worker.tiers =
        vec![TierConfig { alias: TierAlias::Ssd, dir: dir.path().join("ssd"), quota: ByteSize::mib(64) }];
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 2, None).await.unwrap();
    let cl = client(&c, Locality::Remote);
    let data = random(2 * BLOCK as usize);

    // A persisted file with one cached copy: the bad copy goes, the read refills from the UFS.
    put_as(&cl, "/p.bin", &data, WriteType::CacheThrough).await.unwrap();
    let b0 = cl.status("/p.bin", true).await.unwrap().blocks[0].block_id;
    assert_eq!(corrupt(dir.path(), &[0, 1], b0), 1);
    let before = totals(&cl).await;
    assert_eq!(sha(&read_all(&cl, "/p.bin").await), sha(&data), "the bad copy is never served");
    // The corruption and the refill's UFS bytes may reach the master in two heartbeats.
    let after = wait_for(&cl, "the corruption and the refill to be counted", |t| {
        t.corrupt_blocks > before.corrupt_blocks && t.ufs >= before.ufs + BLOCK
    })
    .await;
    assert!(after.ufs >= before.ufs + BLOCK, "repaired from the UFS");

    // A file only in worker memory, on both workers: the other copy serves, and the
    // lost copy is made again from it.
    put_as(&cl, "/mc.bin", &data, WriteType::MustCache).await.unwrap();
    let b0 = cl.status("/mc.bin", true).await.unwrap().blocks[0].block_id;
    // corrupt the copy the reader goes to first (the lowest worker id holding it)
    let holder = cl.status("/mc.bin", true).await.unwrap().blocks[0].locations.iter().map(|l| l.worker_id).min();
    let idx = (0..2).find(|i| Some(c.worker(*i).unwrap().id()) == holder).unwrap();
    assert_eq!(corrupt(dir.path(), &[idx], b0), 1);
    assert_eq!(sha(&read_all(&cl, "/mc.bin").await), sha(&data));
    wait_for(&cl, "the second corruption to be counted", |t| t.corrupt_blocks > after.corrupt_blocks).await;
    wait_stat(&cl, "/mc.bin", "the copy to be remade", |fi| fi.blocks[0].locations.len() == 2).await;
    assert_eq!(sha(&read_all(&cl, "/mc.bin").await), sha(&data));
    c.shutdown().await;
}

/// Every background job is listed in the report with its state, runs and backlog: the
/// master's (persist with the queued operations as its backlog, replication) and each
/// worker's (heartbeat), as `locus report` and the status page show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_lists_every_background_job() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = client(&c, Locality::Auto);
    let opts = PutOptions {
        overwrite: true,
        write_type: Some(WriteType::AsyncThrough),
        persist_wait: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    cl.put_with("/held", &mut &b"held back"[..], &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap();
    let mut rep = cl.report().await.unwrap();
    for _ in 0..100 {
        let persist = rep.jobs.iter().find(|j| j.name == "master.persist");
        let beats = rep.workers.iter().all(|w| w.jobs.iter().any(|j| j.name == "worker.heartbeat" && j.runs > 1));
        if persist.is_some_and(|j| j.backlog == 1) && beats {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        rep = cl.report().await.unwrap();
    }
    let names: Vec<&str> = rep.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["master.persist", "master.replication", "master.indexer"]);
    assert!(rep.jobs[2].runs > 0 && rep.jobs[2].failures == 0, "{:?}", rep.jobs[2]);
    let persist = &rep.jobs[0];
    assert_eq!(persist.backlog, 1, "the held persist is the backlog: {persist:?}");
    assert_ne!(persist.state(), pb::JobState::Stopped);
    assert!(rep.jobs[1].runs > 0 && rep.jobs[1].last_run_ms > 0, "{:?}", rep.jobs[1]);
    assert_eq!(rep.workers.len(), 2);
    for w in &rep.workers {
        let hb = w.jobs.iter().find(|j| j.name == "worker.heartbeat").expect("a heartbeat job");
        assert!(hb.runs > 1 && hb.failures == 0 && hb.last_run_ms > 0, "{hb:?}");
    }
    let jobs = locus_proto::report::ClusterReport::new(&rep, &[]).jobs;
    assert_eq!(jobs.len(), 5, "{jobs:?}");
    assert_eq!(jobs[0].on, "master");
    assert_eq!(jobs[2].on, "master");
    assert!(jobs[3].on.starts_with("worker "));
    c.shutdown().await;
}

/// A `FileReader` (what the Python client, the FUSE mount and the Hadoop connector read
/// through) reads a cached block short-circuit under one lease however many reads it
/// makes of it, moving the lease along with its reads: every byte matches, and the worker
/// granted one lease per block, not one per read. A reader on the data path instead
/// (short-circuit off) reads the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_reader_holds_one_lease_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20, false).await;
    let data = random(2 * BLOCK as usize + 777);
    let local = std::sync::Arc::new(client(&c, Locality::Auto));
    put_as(&local, "/r.bin", &data, WriteType::MustCache).await.unwrap();
    let len = data.len();
    let read_in_pieces = |r: locus_client::FileReader| async move {
        let mut got = vec![0u8; len];
        let mut pos = 0;
        while pos < got.len() {
            // 1000-byte pieces: some straddle a block boundary, and are read whole.
            let end = (pos + 1000).min(got.len());
            let n = r.read_at(pos as u64, &mut got[pos..end]).await.unwrap();
            assert_eq!(n, end - pos, "a short read at {pos}");
            pos = end;
        }
        got
    };
    let before = settled(&local).await;
    let got = read_in_pieces(locus_client::FileReader::open(local.clone(), "/r.bin").await.unwrap()).await;
    assert_eq!(sha(&got), sha(&data));
    let after = settled(&local).await;
    assert_eq!(after.cache_hits - before.cache_hits, 3, "one lease per block, not per read: {after:?}");
    // Counted when each lease ends (the reader was dropped): every byte read, once.
    assert_eq!(after.short_circuit - before.short_circuit, data.len() as u64, "{after:?}");

    // Random reads hopping between blocks keep every block's lease: one per block still.
    let r = locus_client::FileReader::open(local.clone(), "/r.bin").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut touched = std::collections::BTreeSet::new();
    for i in 0..300u64 {
        let pos = (i * 7_919 * 4096 + i) % (data.len() as u64 - 4096);
        assert_eq!(r.read_at(pos, &mut buf).await.unwrap(), 4096);
        assert_eq!(buf, data[pos as usize..pos as usize + 4096], "at {pos}");
        touched.extend([pos / BLOCK, (pos + 4095) / BLOCK]);
    }
    assert!(touched.len() >= 2, "the reads hop between blocks");
    let after = {
        let before = after;
        let now = settled(&local).await;
        let leases = now.cache_hits - before.cache_hits;
        assert_eq!(leases, touched.len() as u64, "random reads: one lease per block: {now:?}");
        now
    };

    let remote = std::sync::Arc::new(c.client(ClientConfig { short_circuit: false, ..Default::default() }).unwrap());
    let got = read_in_pieces(locus_client::FileReader::open(remote, "/r.bin").await.unwrap()).await;
    assert_eq!(sha(&got), sha(&data));
    let last = settled(&local).await;
    assert_eq!(last.short_circuit, after.short_circuit, "no lease with short-circuit off");
    assert!(last.local_worker + last.remote_worker > after.local_worker + after.remote_worker);
}

/// The master's rows for client host `host` once they satisfy `f` (workers send them
/// with their heartbeats).
async fn host_rows(
    c: &Client,
    host: &str,
    f: impl Fn(&std::collections::HashMap<(pb::ReadSource, pb::ReadReason), u64>) -> bool,
) -> std::collections::HashMap<(pb::ReadSource, pb::ReadReason), u64> {
    let mut last = Default::default();
    for _ in 0..100 {
        let r = c.reads(Duration::ZERO, host).await.unwrap();
        assert!(r.rows.iter().all(|row| row.host == host), "rows of other hosts: {:?}", r.rows);
        last = r.rows.iter().map(|row| ((row.source(), row.reason()), row.bytes)).collect();
        if f(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for the reads of {host}: {last:?}");
}

/// The bytes a client's own account gives `reason`.
fn told(c: &Client, reason: ReadReason) -> u64 {
    c.read_reasons().get(&reason).map(|t| t.1).unwrap_or(0)
}

/// Two workers: worker 0 local to the test's clients, worker 1 on "host-b" (another host
/// name, and no socket visible from here).
async fn with_host_b(dir: &Path) -> LocalCluster {
    let mut c = LocalCluster::start(config(dir, 64 << 20, false), &dir.join("data"), 2, None).await.unwrap();
    c.stop_worker(1).await;
    c.configure_worker(1, |w| {
        w.host = "host-b".into();
        w.uds_path = Some("".into());
    });
    c.start_worker(1).await.unwrap();
    c.worker(1).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    c
}

/// The workers holding block 0 of `path`, once `f` holds of them.
async fn holders_of(c: &Client, path: &str, f: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let mut at = Vec::new();
    for _ in 0..200 {
        let fi = c.status(path, true).await.unwrap();
        at = fi.blocks[0].locations.iter().map(|l| l.worker_id).collect();
        at.sort();
        if f(&at) {
            return at;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for the holders of {path}: {at:?}");
}

/// Passive caching: a block read from a worker on another host is copied into this
/// host's worker, so the next read is short-circuit; with `client.passive_cache` off it
/// stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_read_from_another_host_is_copied_here_once_read() {
    use ReadReason::*;
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_host_b(dir.path()).await;
    let (p, q) = (random(BLOCK as usize), random(BLOCK as usize));
    std::fs::write(ufs_dir(&c).join("p.bin"), &p).unwrap();
    std::fs::write(ufs_dir(&c).join("q.bin"), &q).unwrap();
    // Both files cached on host-b only (read while the local worker is down).
    c.stop_worker(0).await;
    let away = c.client(ClientConfig { host: "away".into(), ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&away, "/p.bin").await), sha(&p));
    assert_eq!(sha(&read_all(&away, "/q.bin").await), sha(&q));
    c.start_worker(0).await.unwrap();
    c.worker(0).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    let (w0, w1) = (c.worker(0).unwrap().id(), c.worker(1).unwrap().id());
    let n = BLOCK;

    // Off: read twice from here, both times from host-b, and it stays there.
    let off = c.client(ClientConfig { host: "off".into(), passive_cache: false, ..Default::default() }).unwrap();
    for _ in 0..2 {
        assert_eq!(sha(&read_all(&off, "/q.bin").await), sha(&q));
    }
    assert_eq!(told(&off, CachedElsewhere), 2 * n);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(holders_of(&off, "/q.bin", |_| true).await, vec![w1], "no copy without passive caching");

    // On (the default): the first read comes from host-b, and leaves a copy here.
    let here = c.client(ClientConfig { host: "here".into(), ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&here, "/p.bin").await), sha(&p));
    assert_eq!(told(&here, CachedElsewhere), n);
    let mut both = vec![w0, w1];
    both.sort();
    assert_eq!(holders_of(&here, "/p.bin", |at| at.len() == 2).await, both);
    // The next reads, by this client or another on this host, are short-circuit.
    assert_eq!(sha(&read_all(&here, "/p.bin").await), sha(&p));
    assert_eq!(told(&here, ShortCircuit), n);
    assert_eq!(told(&here, CachedElsewhere), n, "asked once, read remotely once");
    let next = c.client(ClientConfig { host: "here".into(), ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&next, "/p.bin").await), sha(&p));
    assert_eq!(told(&next, ShortCircuit), n);
    c.shutdown().await;
}

/// Passive caching from a process that exits as soon as its read returns (`locus fs
/// cat`): the copy is still made. The reader runs on a runtime of its own, one thread,
/// dropped right after the read, so a request left to a spawned task is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_that_exits_right_after_its_read_still_leaves_a_copy_here() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_host_b(dir.path()).await;
    let p = random(BLOCK as usize);
    std::fs::write(ufs_dir(&c).join("p.bin"), &p).unwrap();
    c.stop_worker(0).await;
    let away = c.client(ClientConfig { host: "away".into(), ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&away, "/p.bin").await), sha(&p));
    c.start_worker(0).await.unwrap();
    c.worker(0).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    let (w0, w1) = (c.worker(0).unwrap().id(), c.worker(1).unwrap().id());

    let (addr, token, tls) = (c.master_address(), c.client_token(), c.tls().clone());
    let got = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(async {
            let cfg = ClientConfig { host: "here".into(), ..Default::default() };
            let here = Client::with_tls(&addr, cfg, token, tls).unwrap();
            let got = read_all(&here, "/p.bin").await;
            assert_eq!(told(&here, ReadReason::CachedElsewhere), BLOCK);
            got
        });
        drop(rt); // the process exits
        got
    })
    .join()
    .unwrap();
    assert_eq!(sha(&got), sha(&p));
    let mut both = vec![w0, w1];
    both.sort();
    assert_eq!(holders_of(&away, "/p.bin", |at| at.len() == 2).await, both);
    c.shutdown().await;
}

/// Every reason a read is not short-circuit is told by the client and counted by the
/// workers under the client's host: a worker on "another host" (its own host name, no
/// socket this client can reach) beside a local one, each reason made to happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_reason_a_read_is_not_short_circuit_is_told_and_counted_by_host() {
    use ReadReason::*;
    use pb::ReadSource as S;
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_host_b(dir.path()).await;
    let (a, b) = (random(BLOCK as usize), random(BLOCK as usize));
    std::fs::write(ufs_dir(&c).join("a.bin"), &a).unwrap();
    std::fs::write(ufs_dir(&c).join("b.bin"), &b).unwrap();
    let n = BLOCK;

    // Host "here" reads a.bin cold (the local worker fills it: from the UFS), then warm.
    // (Passive caching off: b.bin below must stay cached on host-b only.)
    let here = c.client(ClientConfig { host: "here".into(), passive_cache: false, ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&here, "/a.bin").await), sha(&a));
    assert_eq!(told(&here, NotCached), n);
    assert_eq!(sha(&read_all(&here, "/a.bin").await), sha(&a));
    assert_eq!(told(&here, ShortCircuit), n);
    host_rows(&here, "here", |m| {
        m.get(&(S::Ufs, pb::ReadReason::NotCached)) == Some(&n)
            && m.get(&(S::ShortCircuit, pb::ReadReason::ShortCircuit)) == Some(&n)
    })
    .await;

    // Short-circuit off in the configuration: the local worker serves it over TCP.
    let off = c.client(ClientConfig { host: "off".into(), short_circuit: false, ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&off, "/a.bin").await), sha(&a));
    assert_eq!(told(&off, Disabled), n);
    host_rows(&off, "off", |m| m.get(&(S::LocalWorker, pb::ReadReason::Disabled)) == Some(&n)).await;

    // b.bin cached only on host-b (read while the local worker was down), then read
    // from here: cached elsewhere.
    c.stop_worker(0).await;
    let lonely = c.client(ClientConfig { host: "lonely".into(), ..Default::default() }).unwrap();
    // No worker answers a socket here and none is named "lonely": no local worker.
    assert_eq!(sha(&read_all(&lonely, "/b.bin").await), sha(&b));
    assert_eq!(told(&lonely, NoLocalWorker), n);
    host_rows(&lonely, "lonely", |m| m.get(&(S::Ufs, pb::ReadReason::NoLocalWorker)) == Some(&n)).await;
    // A client on host-b, whose worker has no socket it can reach: socket not visible.
    let on_b = c.client(ClientConfig { host: "host-b".into(), ..Default::default() }).unwrap();
    assert_eq!(sha(&read_all(&on_b, "/b.bin").await), sha(&b));
    assert_eq!(told(&on_b, SocketNotVisible), n);
    // (Its worker names its host: the bytes count as the local worker's.)
    host_rows(&on_b, "host-b", |m| m.get(&(S::LocalWorker, pb::ReadReason::SocketNotVisible)) == Some(&n)).await;
    c.start_worker(0).await.unwrap();
    c.worker(0).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    let fi = here.status("/b.bin", true).await.unwrap();
    let w1 = c.worker(1).unwrap().id();
    let at: Vec<u64> = fi.blocks[0].locations.iter().map(|l| l.worker_id).collect();
    assert_eq!(at, vec![w1], "b.bin is cached on host-b only");
    assert_eq!(sha(&read_all(&here, "/b.bin").await), sha(&b));
    assert_eq!(told(&here, CachedElsewhere), n);
    host_rows(&here, "here", |m| m.get(&(S::RemoteWorker, pb::ReadReason::CachedElsewhere)) == Some(&n)).await;

    // The report's totals by host hold the same, and a window of the last minute too.
    let rep = here.report().await.unwrap();
    let hosts: std::collections::BTreeSet<&str> = rep.by_host.iter().map(|r| r.host.as_str()).collect();
    assert_eq!(hosts, ["here", "host-b", "lonely", "off"].into());
    let by_host = locus_proto::report::by_host(&rep.by_host);
    let here_h = by_host.iter().find(|h| h.host == "here").unwrap();
    assert_eq!(here_h.bytes, 3 * n);
    assert_eq!(here_h.from_source(locus_common::metrics::ReadSource::ShortCircuit), n);
    assert_eq!(here_h.for_reason(locus_common::metrics::ReadReason::CachedElsewhere).map(|c| c.bytes), Some(n));
    // Scheduling: block_hosts names the caching host, and for an uncached block the
    // worker a read would fill it on.
    let hosts = here.block_hosts(&fi, 0, fi.length).await.unwrap();
    assert_eq!(hosts, vec![(0, n, vec!["host-b".to_string()])]);
    std::fs::write(ufs_dir(&c).join("cold.bin"), b"cold").unwrap();
    let cold = here.status("/cold.bin", true).await.unwrap();
    let named = here.block_hosts(&cold, 0, cold.length).await.unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].2.len(), 1, "an uncached block names the one worker it would be filled on: {named:?}");
    // A reader with `client.fill = named` (the Hadoop connector's) fills it there, even
    // where a worker shares its host.
    let sched = c
        .client(ClientConfig { host: "sched".into(), fill: Some(FillPlacement::Named), ..Default::default() })
        .unwrap();
    assert_eq!(read_all(&sched, "/cold.bin").await, b"cold");
    let workers = sched.workers(true).await.unwrap();
    let mut landed = Vec::new();
    for _ in 0..100 {
        let fi = sched.status("/cold.bin", true).await.unwrap();
        landed = fi.blocks[0]
            .locations
            .iter()
            .filter_map(|l| workers.iter().find(|w| w.worker_id == l.worker_id))
            .map(|w| w.host.clone())
            .collect();
        if !landed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(landed, named[0].2, "the block landed where block_hosts named it");
    c.shutdown().await;
}
