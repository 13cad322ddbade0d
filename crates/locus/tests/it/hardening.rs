//! MiniCluster tests of the hardening of issue 23: names the UFS cannot hold, persists
//! that keep failing, cached writes bigger than the cache, and reads that finish the
//! version they started while the file is overwritten or deleted.

use std::path::Path;
use std::time::Duration;

use locus_client::{Client, PutOptions};
use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, WriteType};
use locus_proto::pb;

use crate::common;
use common::{BLOCK, put_as, random, ufs_dir, wait_persisted};

async fn start(dir: &Path, workers: usize, mem_quota: u64) -> LocalCluster {
    common::start(dir, workers, mem_quota, false).await
}

async fn put_opts(c: &Client, path: &str, data: &[u8], opts: PutOptions) -> locus_common::Result<pb::FileInfo> {
    c.put_with(path, &mut &data[..], &PutOptions { overwrite: true, ..opts }, |_| Ok(pb::ObjectMeta::default())).await
}

/// Poll the report until `f` holds.
async fn wait_report(c: &Client, what: &str, f: impl Fn(&pb::Report) -> bool) -> pb::Report {
    for _ in 0..200 {
        let r = c.report().await.unwrap();
        if f(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}: {:?}", c.report().await.unwrap());
}

fn kind<T: std::fmt::Debug>(r: locus_common::Result<T>) -> ErrorKind {
    r.expect_err("refused").kind()
}

/// Issue 23 item 3: every name a `file://` UFS cannot store as it is, refused when it is
/// created (create, mkdir, rename destination), and nothing written under another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_the_ufs_cannot_hold_are_refused_when_created() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let ufs = ufs_dir(&c);
    cl.mkdir("/d", true).await.unwrap();
    put_as(&cl, "/x", b"the real x", WriteType::AsyncThrough).await.unwrap();

    let long300 = format!("/d/{}", "n".repeat(300));
    let long250 = format!("/d/{}", "m".repeat(250)); // fits a directory, not a file's temporary name
    for (path, want) in [
        (long300.as_str(), ErrorKind::NameTooLong),
        (long250.as_str(), ErrorKind::NameTooLong),
        ("/x ", ErrorKind::InvalidArgument),
        ("/ ", ErrorKind::InvalidArgument),
        ("/d/ ", ErrorKind::InvalidArgument),
        ("/d /f", ErrorKind::InvalidArgument),
        ("/\u{3000}lead", ErrorKind::InvalidArgument),
    ] {
        for wt in [WriteType::AsyncThrough, WriteType::Through, WriteType::MustCache] {
            let e = put_as(&cl, path, b"bytes", wt).await.expect_err(path);
            assert_eq!(e.kind(), want, "{path:?} {wt:?}: {e}");
        }
        // An empty file (one CreateFile call) too.
        assert_eq!(kind(cl.touch(path, None).await), want, "{path:?}");
    }
    assert_eq!(kind(cl.mkdir(&format!("/d/{}", "q".repeat(256)), true).await), ErrorKind::NameTooLong);
    assert_eq!(kind(cl.mkdir("/d/sub /deeper", true).await), ErrorKind::InvalidArgument);
    assert_eq!(kind(cl.mkdir("/ ", false).await), ErrorKind::InvalidArgument);
    // A 250-byte directory name fits (no temporary name for a directory).
    cl.mkdir(&long250, false).await.unwrap();
    cl.delete(&long250, false).await.unwrap();
    // Rename destinations.
    put_as(&cl, "/d/ok", b"ok", WriteType::AsyncThrough).await.unwrap();
    assert_eq!(kind(cl.rename("/d/ok", "/d/ok ").await), ErrorKind::InvalidArgument);
    assert_eq!(kind(cl.rename("/d/ok", &long300).await), ErrorKind::NameTooLong);
    assert_eq!(kind(cl.rename("/d", "/dir ").await), ErrorKind::InvalidArgument);
    // Whitespace inside a name, and trailing dots, are kept by the UFS: accepted.
    for p in ["/d/a b", "/d/ lead", "/d/dots.", "/d/x..y"] {
        put_as(&cl, p, p.as_bytes(), WriteType::AsyncThrough).await.unwrap();
    }
    for p in ["/x", "/d/ok", "/d/a b", "/d/ lead", "/d/dots.", "/d/x..y"] {
        wait_persisted(&cl, p).await;
    }
    // Each file's bytes under its own name, and "/x" is still the real x.
    assert_eq!(std::fs::read(ufs.join("x")).unwrap(), b"the real x");
    assert_eq!(std::fs::read(ufs.join("d/ lead")).unwrap(), b"/d/ lead");
    assert_eq!(std::fs::read(ufs.join("d/dots.")).unwrap(), b"/d/dots.");
    let mut names: Vec<String> =
        std::fs::read_dir(ufs.join("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [" lead", "a b", "dots.", "ok", "x..y"]);
    // Nothing is queued, nothing failed.
    let r = wait_report(&cl, "an empty queue", |r| r.persist_queue_ops == 0).await;
    assert_eq!(r.persist_failed_ops, 0);
    c.shutdown().await;
}

/// Issue 23 item 3: a persist that cannot succeed (a directory in the UFS where the file
/// goes) is given up at once without holding back other paths, reported with its error
/// (report, metrics), survives a master restart, and is retried or dropped on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_persist_is_given_up_reported_and_retried_or_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 1, 64 << 20).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let ufs = ufs_dir(&c);
    cl.mkdir("/blk", true).await.unwrap();
    // Behind Locus's back (its listing of /blk is loaded, so creates trust it): non-empty
    // directories at the paths two files will be persisted to.
    for n in ["f1", "f2"] {
        std::fs::create_dir_all(ufs.join("blk").join(n)).unwrap();
        std::fs::write(ufs.join("blk").join(n).join("inner"), b"in the way").unwrap();
    }
    let f1 = random(3 * BLOCK as usize / 2);
    put_as(&cl, "/blk/f1", &f1, WriteType::AsyncThrough).await.unwrap();
    put_as(&cl, "/blk/f2", b"f2", WriteType::AsyncThrough).await.unwrap();
    // Later files in the same directory and elsewhere are persisted all the same.
    for p in ["/blk/after", "/elsewhere"] {
        put_as(&cl, p, p.as_bytes(), WriteType::AsyncThrough).await.unwrap();
        wait_persisted(&cl, p).await;
    }
    let r = wait_report(&cl, "two given-up persists", |r| r.persist_failed_ops == 2).await;
    let mut failed: Vec<_> = r.persist_failed.iter().map(|f| (f.path.clone(), f.kind(), f.failures)).collect();
    failed.sort();
    assert_eq!(
        failed,
        [
            ("/blk/f1".to_string(), pb::PersistOpKind::Persist, 1),
            ("/blk/f2".to_string(), pb::PersistOpKind::Persist, 1)
        ]
    );
    for f in &r.persist_failed {
        assert_eq!(f.last_error_kind(), pb::ErrorKind::IsADirectory, "{f:?}");
        assert!(!f.last_error.is_empty() && f.failed_ms > 0, "{f:?}");
    }
    let failed = locus_proto::report::ClusterReport::new(&r, &[]).persist_failed;
    assert_eq!(failed.ops, 2);
    assert_eq!(failed.operations[0].error_kind, "is_a_directory");
    let metrics = locus_master::render_metrics(c.master());
    assert!(metrics.contains("locus_persist_failed_paths 2"), "{metrics}");
    assert_eq!(cl.status("/blk/f1", false).await.unwrap().persist_state(), pb::PersistState::ToBePersisted);

    // Given up means given up: a master restart keeps them so, and does not run them.
    c.stop_master().await;
    c.start_master().await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let r = cl.report().await.unwrap();
    assert_eq!(r.persist_failed_ops, 2, "{r:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cl.report().await.unwrap().persist_failed[0].failures, 1);

    // Nothing given up at that path: NotFound.
    assert_eq!(
        kind(cl.resolve_persist_failures("/elsewhere", pb::PersistFailureAction::Retry).await),
        ErrorKind::NotFound
    );
    // Fixed in the UFS, then retried: persisted, the bytes where they belong.
    std::fs::remove_dir_all(ufs.join("blk/f1")).unwrap();
    assert_eq!(cl.resolve_persist_failures("/blk/f1", pb::PersistFailureAction::Retry).await.unwrap(), 1);
    wait_persisted(&cl, "/blk/f1").await;
    assert_eq!(std::fs::read(ufs.join("blk/f1")).unwrap(), f1);
    // Dropped: off the queue; the file stays in Locus, not persisted, readable.
    assert_eq!(cl.resolve_persist_failures("/blk", pb::PersistFailureAction::Drop).await.unwrap(), 1);
    let fi = cl.status("/blk/f2", true).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::NotPersisted);
    let mut out = Vec::new();
    cl.read_to(&fi, 0, fi.length, Default::default(), &mut out).await.unwrap();
    assert_eq!(out, b"f2");
    let r = wait_report(&cl, "an empty queue", |r| r.persist_queue_ops == 0).await;
    assert_eq!(r.persist_failed_ops, 0);
    assert!(locus_master::render_metrics(c.master()).contains("locus_persist_failed_paths 0"));
    c.shutdown().await;
}

fn mem_used(c: &LocalCluster) -> u64 {
    c.worker(0).unwrap().store().usage().iter().map(|t| t.used).sum()
}

/// Issue 23 item 4: a MUST_CACHE write bigger than the cache fails as out of space
/// (naming the quota), evicts nothing when its size is declared, and frees its blocks at
/// once when it is not; the space is there for the next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_write_bigger_than_the_cache_fails_and_gives_its_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 8 * BLOCK).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let kept = random(3 * BLOCK as usize);
    put_as(&cl, "/kept", &kept, WriteType::CacheThrough).await.unwrap();
    let before = mem_used(&c);
    assert_eq!(before, 3 * BLOCK);
    let big = random(12 * BLOCK as usize);

    // Declared size: refused before anything is evicted.
    let declared = PutOptions {
        write_type: Some(WriteType::MustCache),
        expected_length: Some(big.len() as u64),
        ..Default::default()
    };
    let e = put_opts(&cl, "/big", &big, declared.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("MEM quota 8388608"), "{e}");
    assert_eq!(mem_used(&c), before);
    let fi = cl.status("/kept", true).await.unwrap();
    assert!(fi.blocks.iter().all(|b| !b.locations.is_empty()), "the cached file was evicted: {fi:?}");
    assert_eq!(kind(cl.status("/big", false).await), ErrorKind::NotFound);

    // Undeclared: it fails as out of space (not a reset connection) once the cache is
    // full, and its blocks go at once.
    let undeclared = PutOptions { write_type: Some(WriteType::MustCache), ..Default::default() };
    let e = put_opts(&cl, "/big", &big, undeclared.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "{e}");
    assert!(e.to_string().contains("quota"), "{e}");
    assert!(mem_used(&c) <= before, "{} > {before}", mem_used(&c));
    // Nothing is held for it either: the whole quota less what is cached can be had.
    let store = c.worker(0).unwrap().store();
    store.check_room(8 * BLOCK - mem_used(&c)).unwrap();
    // The master hears of the dropped blocks too: the cluster report's usage follows.
    wait_report(&cl, "the report's usage back", |r| {
        r.workers.iter().flat_map(|w| &w.tiers).map(|t| t.used).sum::<u64>() <= before
    })
    .await;

    // The space is there: a write that fits succeeds, declared or not.
    let fits = random(6 * BLOCK as usize);
    put_opts(&cl, "/fits", &fits, PutOptions { expected_length: Some(fits.len() as u64), ..declared }).await.unwrap();
    cl.delete("/fits", false).await.unwrap();
    // (the worker drops the deleted file's blocks at its next heartbeat)
    for _ in 0..100 {
        if mem_used(&c) < 6 * BLOCK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    put_opts(&cl, "/fits2", &fits[..4 * BLOCK as usize], undeclared).await.unwrap();

    // An ASYNC_THROUGH write that declares a size the cache cannot hold goes straight
    // through to the UFS, evicting nothing.
    put_as(&cl, "/kept", &kept, WriteType::CacheThrough).await.unwrap();
    let used = mem_used(&c);
    let opts = PutOptions {
        write_type: Some(WriteType::AsyncThrough),
        expected_length: Some(big.len() as u64),
        ..Default::default()
    };
    let fi = put_opts(&cl, "/through", &big, opts).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::Persisted);
    assert_eq!(std::fs::read(ufs_dir(&c).join("through")).unwrap(), big);
    assert_eq!(mem_used(&c), used);
    c.shutdown().await;
}

/// A bucket (a top-level directory) made before mounts and imported prefixes had a time
/// showed 1970 as its creation date; the next master start dates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undated_bucket_gets_a_creation_date_at_the_next_start() {
    use locus_master::store::{CHILDREN, INODES, get_inode, lookup, write_inode};
    use redb::ReadableDatabase;
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 1, 64 << 20).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    cl.mkdir("/old", false).await.unwrap();
    cl.mkdir("/old/sub", false).await.unwrap();
    c.stop_master().await;
    // As an older master left it: no time on the bucket nor on the directory under it.
    let db = redb::Database::open(c.data_dir().join("master/meta.redb")).unwrap();
    let ids: Vec<u64> = {
        let r = db.begin_read().unwrap();
        let ch = r.open_table(CHILDREN).unwrap();
        ["/old", "/old/sub"].iter().map(|p| lookup(&ch, p).unwrap().unwrap()).collect()
    };
    let w = db.begin_write().unwrap();
    for &id in &ids {
        let mut rec = get_inode(&w.open_table(INODES).unwrap(), id).unwrap().unwrap();
        rec.mtime_ms = 0;
        write_inode(&w, &rec).unwrap();
    }
    w.commit().unwrap();
    drop(db);
    let before = locus_common::now_ms();
    c.start_master().await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let t = cl.status("/old", false).await.unwrap().mtime_ms;
    assert!(t >= before, "the bucket's time {t} is not this start's ({before})");
    // Only buckets: a deeper directory keeps what it had.
    assert_eq!(cl.status("/old/sub", false).await.unwrap().mtime_ms, 0);
    c.shutdown().await;
}

/// Wait until worker 0 no longer holds `block` as a live block (the master's removal or
/// retirement has reached it).
async fn wait_not_live(c: &LocalCluster, block: u64) {
    let store = c.worker(0).unwrap().store();
    for _ in 0..200 {
        if !store.contains(block) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("block {block} is still live on the worker");
}

/// Issue 23: a read that resolved a file's blocks finishes the version it started when
/// the file is overwritten or deleted under it (S3: a GET that has started returns the
/// whole object version it started with). The old version's blocks are retired on the
/// worker, not dropped: readable by id for `worker.stale_block_grace`, then gone, their
/// space back. Deterministic: the first block is read, the file changed, the worker has
/// acted on the change, then the rest is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_under_way_finishes_the_version_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(dir.path(), 64 * BLOCK, false);
    cfg.worker.stale_block_grace = Duration::from_secs(2);
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let len = 3 * BLOCK as usize + 1000;
    for change in ["overwrite", "delete"] {
        for wt in [WriteType::AsyncThrough, WriteType::MustCache] {
            let path = format!("/{change}-{}", wt.as_str());
            let old = random(len);
            put_as(&cl, &path, &old, wt).await.unwrap();
            if wt == WriteType::AsyncThrough {
                wait_persisted(&cl, &path).await;
            }
            let fi = cl.status(&path, true).await.unwrap();
            let mut got = Vec::new();
            cl.read_to(&fi, 0, BLOCK, Default::default(), &mut got).await.unwrap();
            if change == "overwrite" {
                put_as(&cl, &path, &random(len), wt).await.unwrap();
            } else {
                cl.delete(&path, false).await.unwrap();
            }
            wait_not_live(&c, fi.blocks[1].block_id).await;
            cl.read_to(&fi, BLOCK, fi.length - BLOCK, Default::default(), &mut got).await.unwrap();
            assert!(got == old, "{path}: the read did not return the version it started with");
        }
    }
    // After the grace period the retired blocks go and their space comes back: what is
    // left is the two overwritten files' new versions.
    let want = 2 * len as u64;
    for _ in 0..200 {
        if mem_used(&c) <= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mem_used(&c), want, "the retired blocks' space is back");
    c.shutdown().await;

    // With no grace period the read fails rather than mixing versions: the UFS holds the
    // new version, whose fingerprint is not the one the reader's metadata carries.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(dir.path(), 64 * BLOCK, false);
    cfg.worker.stale_block_grace = Duration::ZERO;
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    put_as(&cl, "/f", &random(len), WriteType::CacheThrough).await.unwrap();
    let fi = cl.status("/f", true).await.unwrap();
    let mut got = Vec::new();
    cl.read_to(&fi, 0, BLOCK, Default::default(), &mut got).await.unwrap();
    put_as(&cl, "/f", &random(len), WriteType::CacheThrough).await.unwrap();
    wait_not_live(&c, fi.blocks[1].block_id).await;
    let e = cl.read_to(&fi, BLOCK, fi.length - BLOCK, Default::default(), &mut got).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
    c.shutdown().await;
}
