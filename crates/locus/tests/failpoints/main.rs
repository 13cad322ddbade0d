//! Fault injection through named fault points (built with `--features failpoints`):
//! in-process clusters here, and in `retries` also the real `locus` binary, killed at a
//! fault point.
#![cfg(feature = "failpoints")]
#![allow(clippy::unwrap_used)] // a test that cannot go on fails

#[path = "../common/mod.rs"]
mod common;
mod group;
mod retries;

use std::time::Duration;

use bytesize::ByteSize;
use locus_client::ReadOptions;
use locus_cluster::LocalCluster;
use locus_common::config::{ClientConfig, Config, Locality, TierAlias, TierConfig};
use locus_common::fail;

/// Fault points are global to the process: the tests here take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// A one-worker cluster with the directory `<dir>/lake` mounted at `/m` (file://), its
/// sync interval `sync_ms`; the client, and the lake's path.
async fn cluster_with_lake(
    dir: &std::path::Path,
    sync_ms: u64,
) -> (LocalCluster, std::sync::Arc<locus_client::Client>, std::path::PathBuf) {
    let cfg = config(&dir.join("mem"), ByteSize::mib(64));
    let c = LocalCluster::start(cfg, &dir.join("data"), 1, None).await.unwrap();
    let cl = std::sync::Arc::new(c.client(ClientConfig::default()).unwrap());
    let ufs = dir.join("lake");
    std::fs::create_dir_all(&ufs).unwrap();
    let mount = locus_proto::pb::MountRequest {
        path: "/m".into(),
        uri: format!("file://{}", ufs.display()),
        sync_interval_ms: sync_ms,
        ..Default::default()
    };
    cl.mount(mount).await.unwrap();
    (c, cl, ufs)
}

/// A one-worker cluster (a 16 MiB MEM tier) whose UFS holds `name`: 1 MiB of the bytes
/// `i % modulus`. Returns the cluster and the bytes.
async fn cluster_with_file(dir: &std::path::Path, name: &str, modulus: u32) -> (LocalCluster, Vec<u8>) {
    let cfg = config(&dir.join("mem"), ByteSize::mib(16));
    let c = LocalCluster::start(cfg, &dir.join("data"), 1, None).await.unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % modulus) as u8).collect();
    std::fs::write(c.data_dir().join("ufs").join(name), &data).unwrap();
    (c, data)
}

/// The whole of file `p`, read through `cl`.
async fn read_whole(cl: &locus_client::Client, p: &str) -> Vec<u8> {
    let fi = cl.status(p, true).await.unwrap();
    let mut out = Vec::new();
    cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
    out
}

/// The names in directory `p`.
async fn names(cl: &locus_client::Client, p: &str) -> locus_common::Result<Vec<String>> {
    let mut v = Vec::new();
    cl.list_each(p, false, |fi| v.push(fi.name.clone())).await.map(|()| v)
}

/// Wait (up to `tries` × 50 ms) until `p` is gone from the UFS.
async fn wait_gone(p: &std::path::Path, tries: u32) {
    for _ in 0..tries {
        if !p.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fill that fails just before its block is committed leaves no block behind (no
/// partial file, nothing reported to the master); the next read fills it properly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_failing_before_commit_leaves_no_partial_block() {
    let _turn = SERIAL.lock().await;
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
    let _turn = SERIAL.lock().await;
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

/// A namespace change whose UFS side is still queued is what every later read sees: a
/// metadata sync neither drops a directory renamed behind a queued persist (a task
/// commit's, in Spark's staging directory, which stays in Locus, or elsewhere), nor brings
/// back a key deleted while an older version is still in the UFS (read-after-delete). The persist queue is held by a fault point, so the UFS stays
/// behind for as long as the test looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn syncs_never_undo_changes_whose_ufs_side_is_queued() {
    use locus_client::PutOptions;
    use locus_common::ErrorKind;
    use locus_common::config::WriteType;
    use locus_proto::pb;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let ufs = dir.path().join("lake");
    std::fs::create_dir_all(&ufs).unwrap();
    let mount = pb::MountRequest {
        path: "/m".into(),
        uri: format!("file://{}", ufs.display()),
        sync_interval_ms: 50,
        ..Default::default()
    };
    cl.mount(mount).await.unwrap();
    let put = |p: &'static str, data: &'static [u8], wt: WriteType| {
        let cl = &cl;
        async move {
            let opts = PutOptions { overwrite: true, write_type: Some(wt), ..Default::default() };
            cl.put_with(p, &mut &data[..], &opts, |_| Ok(Default::default())).await
        }
    };
    // The old version of a key is in the UFS, and a directory. An attempt directory is
    // made in Locus only (a committer's staging directory).
    put("/m/k", b"OLD VERSION 1", WriteType::Through).await.unwrap();
    cl.mkdir("/m/out/_temporary/attempt_0", true).await.unwrap();
    cl.mkdir("/m/d0", true).await.unwrap();
    assert!(ufs.join("out").is_dir() && !ufs.join("out/_temporary").exists() && ufs.join("d0").is_dir());

    fail::cfg("master.persist.before_ufs", "return").unwrap();
    // Then a task writes its output (the persist is queued and held), and commits it by
    // renaming the attempt directory (queued behind the persist).
    put("/m/out/_temporary/attempt_0/part-0", b"part zero", WriteType::AsyncThrough).await.unwrap();
    cl.rename("/m/out/_temporary/attempt_0", "/m/out/_temporary/task_0").await.unwrap();
    put("/m/d0/f", b"in d0", WriteType::AsyncThrough).await.unwrap();
    cl.rename("/m/d0", "/m/d1").await.unwrap();
    // A newer version of the key, then its delete: both queued behind the held queue.
    put("/m/k", b"NEWER VERSION 2", WriteType::AsyncThrough).await.unwrap();
    cl.delete("/m/k", false).await.unwrap();
    assert_eq!(std::fs::read(ufs.join("k")).unwrap(), b"OLD VERSION 1", "the UFS is behind");
    assert!(ufs.join("d0").is_dir() && !ufs.join("d1").exists(), "the UFS is behind");

    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(120)).await; // every sync is due
        let e = cl.status("/m/k", false).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "round {round}: the deleted key came back: {e}");
        let mut names = Vec::new();
        cl.list_each("/m", false, |fi| names.push(fi.name.clone())).await.unwrap();
        assert_eq!(names, ["d1", "out"], "round {round}: the renamed directory was dropped");
        assert_eq!(read_whole(&cl, "/m/d1/f").await, b"in d0");
        let mut names = Vec::new();
        cl.list_each("/m/out/_temporary", false, |fi| names.push(fi.name.clone())).await.unwrap();
        assert_eq!(names, ["task_0"], "round {round}: the renamed directory was dropped");
        let fi = cl.status("/m/out/_temporary/task_0/part-0", true).await.unwrap();
        let mut out = Vec::new();
        cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
        assert_eq!(out, b"part zero");
    }

    // Once the queue runs, the UFS catches up and says the same: the key is gone, the
    // directory is renamed with its file. The staged output stays in Locus (its persist
    // sits out the staging wait of `_temporary` files, master.staged_persist_wait).
    fail::remove("master.persist.before_ufs");
    for _ in 0..400 {
        if !ufs.join("k").exists() && ufs.join("d1/f").is_file() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!ufs.join("k").exists());
    assert!(!ufs.join("d0").exists() && std::fs::read(ufs.join("d1/f")).unwrap() == b"in d0");
    assert!(!ufs.join("out/_temporary").exists());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(cl.status("/m/k", false).await.unwrap_err().kind(), ErrorKind::NotFound);
    let mut names = Vec::new();
    cl.list_each("/m/out/_temporary", false, |fi| names.push(fi.name.clone())).await.unwrap();
    assert_eq!(names, ["task_0"]);
    let fi = cl.status("/m/out/_temporary/task_0/part-0", false).await.unwrap();
    assert_eq!(fi.persist_state(), pb::PersistState::ToBePersisted);
    c.shutdown().await;
}

/// What a sync read from the UFS before a change was made never undoes the change when
/// it lands after it: a listing taken before a bucket's delete ran (a synchronous delete,
/// or one queued behind a persist that the queue then carried out) does not bring the
/// bucket back, nor does a lookup that found a file in the UFS before its delete. (A
/// DeleteBucket acknowledged, then the bucket listed again until the next sync.) Fault
/// points hold the listing and the lookup between their UFS call and their commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_that_read_the_ufs_before_a_delete_never_brings_it_back() {
    use locus_client::PutOptions;
    use locus_common::ErrorKind;
    use locus_common::config::WriteType;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    const SYNC: Duration = Duration::from_millis(5000); // no sync falls due while the test looks
    let (c, cl, ufs) = cluster_with_lake(dir.path(), SYNC.as_millis() as u64).await;
    let names = |p: &'static str| {
        let cl = cl.clone();
        async move { names(&cl, p).await }
    };
    cl.mkdir("/m/b1", false).await.unwrap();
    cl.mkdir("/m/b2", false).await.unwrap();
    assert_eq!(names("/m").await.unwrap(), ["b1", "b2"]);
    tokio::time::sleep(SYNC + Duration::from_millis(100)).await; // the listing of /m is due

    // b2's delete is queued behind the persist of its object, held by a fault point.
    fail::cfg("master.persist.before_ufs", "return").unwrap();
    let opts = PutOptions { write_type: Some(WriteType::AsyncThrough), ..Default::default() };
    cl.put_with("/m/b2/x", &mut &b"object"[..], &opts, |_| Ok(Default::default())).await.unwrap();
    cl.delete("/m/b2", true).await.unwrap();
    assert!(ufs.join("b2").is_dir(), "the UFS is behind");
    // A listing reads the UFS (b1, b2) and is held before its commit...
    fail::cfg("master.load_children.listed", "1*return(3000)").unwrap();
    let listing = tokio::spawn(names("/m"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...while b1 is deleted at once and the queue carries out b2's delete.
    cl.delete("/m/b1", true).await.unwrap();
    fail::remove("master.persist.before_ufs");
    wait_gone(&ufs.join("b2"), 50).await;
    assert!(!ufs.join("b1").exists() && !ufs.join("b2").exists(), "both deletes reached the UFS");
    // The held listing commits now: it saw both, and brings back neither.
    let seen = listing.await.unwrap().unwrap();
    fail::remove("master.load_children.listed");
    assert!(seen.is_empty() || seen == ["b2"] || seen == ["b1", "b2"], "{seen:?}");
    assert_eq!(names("/m").await.unwrap(), Vec::<String>::new(), "a deleted directory is listed again");
    for p in ["/m/b1", "/m/b2"] {
        assert_eq!(cl.status(p, false).await.unwrap_err().kind(), ErrorKind::NotFound, "{p} came back");
    }

    // A lookup finds a file in the UFS and is held before its commit; the file is
    // deleted meanwhile (through a lookup of its own).
    std::fs::write(ufs.join("g.txt"), b"behind Locus's back").unwrap();
    fail::cfg("master.resolve.after_ufs", "1*return(1500)").unwrap();
    let lookup = tokio::spawn({
        let cl = cl.clone();
        async move { cl.status("/m/g.txt", false).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cl.delete("/m/g.txt", false).await.unwrap();
    assert!(!ufs.join("g.txt").exists());
    let r = lookup.await.unwrap(); // concurrent with the delete: either answer is fine
    fail::remove("master.resolve.after_ufs");
    assert!(r.is_ok() || r.as_ref().unwrap_err().kind() == ErrorKind::NotFound, "{r:?}");
    let e = cl.status("/m/g.txt", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "the deleted file came back: {e}");
    assert_eq!(names("/m").await.unwrap(), Vec::<String>::new());
    c.shutdown().await;
}

/// Issue 23 (the file:// consistency load's stale reads after a DELETE): a delete queued
/// behind a persist of its path is held ([`held_ufs_paths`]) from before its namespace
/// change commits until the persist queue tracks it. Before, the persist it queued behind
/// could finish in between (here: skipped, its file deleted), and a lookup or a listing
/// whose commit fell in that window saw nothing held on the path: it imported the older
/// version still in the UFS, without its ETag, and a HEAD or LIST after the acknowledged
/// DELETE found the key. The window is held open by a fault point between the delete's
/// commit and its hand-over to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_being_queued_holds_its_path_until_the_queue_has_it() {
    use locus_client::PutOptions;
    use locus_common::ErrorKind;
    use locus_common::config::WriteType;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Every lookup and listing reads the UFS (the sync interval is 1 ms).
    let (c, cl, ufs) = cluster_with_lake(dir.path(), 1).await;
    let names = |p: &'static str| {
        let cl = cl.clone();
        async move { names(&cl, p).await }
    };
    let put = |data: &'static [u8]| {
        let cl = cl.clone();
        async move {
            let opts = PutOptions { write_type: Some(WriteType::AsyncThrough), overwrite: true, ..Default::default() };
            cl.put_with("/m/k", &mut &data[..], &opts, |_| Ok(Default::default())).await.unwrap();
        }
    };
    let backlog = || {
        let cl = cl.clone();
        async move { cl.report().await.unwrap().persist_queue_ops }
    };
    // The UFS holds the first version.
    put(b"first version").await;
    for _ in 0..100 {
        if backlog().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read(ufs.join("k")).unwrap(), b"first version");
    // The second version's persist runs slowly (1.5 s before it looks at its file).
    fail::cfg("master.persist.running", "1*return(1500)").unwrap();
    put(b"the second version").await;
    // The delete queues behind that persist, commits, and stops before the queue has it.
    fail::cfg("master.ufs_change.committed", "1*return(5000)").unwrap();
    let delete = tokio::spawn({
        let cl = cl.clone();
        async move { cl.delete("/m/k", false).await }
    });
    let mut gone = false;
    for _ in 0..100 {
        if cl.status("/m/k", false).await.is_err_and(|e| e.kind() == ErrorKind::NotFound) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the delete did not commit");
    // The persist it queued behind goes on: its file is gone, so it is skipped, and the
    // queue is empty (the delete is not in it yet).
    for _ in 0..100 {
        if backlog().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(backlog().await, 0);
    assert!(!delete.is_finished(), "the fault point holds the delete");
    assert_eq!(std::fs::read(ufs.join("k")).unwrap(), b"first version", "the UFS is behind");
    // In that window, neither a listing nor a lookup brings the first version back.
    let e = cl.status("/m/k", false).await.expect_err("a lookup imported the deleted file");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(names("/m").await.unwrap(), Vec::<String>::new(), "a listing imported the deleted file");
    delete.await.unwrap().unwrap();
    fail::remove("master.ufs_change.committed");
    fail::remove("master.persist.running");
    wait_gone(&ufs.join("k"), 100).await;
    assert!(!ufs.join("k").exists(), "the queued delete reached the UFS");
    assert_eq!(cl.status("/m/k", false).await.unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(names("/m").await.unwrap(), Vec::<String>::new());
    c.shutdown().await;
}

/// The file:// consistency load's stale reads after a DELETE (a GET or a LIST right after
/// the acknowledged DELETE of a key returned the object it deleted, ETag and all): two
/// deletes of one persisted key at once are both made in the UFS at once (nothing is
/// queued on the key), and the `fs` service looks at the file before it unlinks it, so
/// the delete that lost the race found the file gone at its unlink and answered
/// NotFound. That answer was the delete's own: no namespace change, and the S3 gateway
/// (a key already gone is a delete done) acknowledged the DELETE while the key was still
/// in the namespace, until the other delete committed. A UFS path found gone by its
/// delete is deleted: the delete goes on to its namespace change. Fault points hold the
/// winner between its UFS delete and its commit, and make the loser's UFS delete answer
/// as the race does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_that_loses_the_ufs_race_to_another_still_deletes_the_key() {
    use locus_client::PutOptions;
    use locus_common::ErrorKind;
    use locus_common::config::WriteType;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (c, cl, ufs) = cluster_with_lake(dir.path(), 60_000).await;
    let opts = PutOptions { write_type: Some(WriteType::Through), ..Default::default() };
    cl.put_with("/m/d/k", &mut &b"the object"[..], &opts, |_| Ok(Default::default())).await.unwrap();
    assert!(ufs.join("d/k").is_file());
    // The first delete removes the file from the UFS and is held before its commit.
    fail::cfg("master.ufs_change.made", "1*return(3000)").unwrap();
    let winner = tokio::spawn({
        let cl = cl.clone();
        async move { cl.delete("/m/d/k", false).await }
    });
    wait_gone(&ufs.join("d/k"), 100).await;
    assert!(!ufs.join("d/k").exists(), "the first delete did not reach the UFS");
    // The second finds the key in the namespace, and its UFS delete loses the race.
    fail::cfg("ufs.remove.raced", "1*return").unwrap();
    let r = cl.delete("/m/d/k", false).await;
    fail::remove("ufs.remove.raced");
    // Answered (a NotFound is a delete done for the S3 gateway): the key is gone for
    // every read from now on, while the first delete is still held.
    assert!(r.is_ok() || r.as_ref().unwrap_err().kind() == ErrorKind::NotFound, "{r:?}");
    assert!(!winner.is_finished(), "the fault point holds the first delete");
    let st = cl.status("/m/d/k", false).await.map(|fi| fi.path);
    assert!(st.as_ref().is_err_and(|e| e.kind() == ErrorKind::NotFound), "the key outlived its delete ({r:?}): {st:?}");
    assert_eq!(names(&cl, "/m/d").await.unwrap(), Vec::<String>::new(), "a listing still shows the key");
    assert!(r.is_ok(), "the delete answered {r:?}");
    winner.await.unwrap().unwrap();
    fail::remove("master.ufs_change.made");
    assert_eq!(cl.status("/m/d/k", false).await.unwrap_err().kind(), ErrorKind::NotFound);
    c.shutdown().await;
}

/// Issue 23 (GETs of a just-written object that failed before their first byte, and
/// persists failing "no live copy" at their first attempt): a write is acknowledged only
/// once the master knows its blocks, even when a heartbeat took the blocks' changes from
/// the store and is still sending them. The worker sends its block commits one at a
/// time; before, the write's own commit found nothing left to send and acknowledged at
/// once. The heartbeat's commit is held by a fault point after it took the changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_is_acknowledged_once_the_master_knows_its_blocks() {
    use locus_client::PutOptions;
    use locus_common::config::WriteType;
    use tokio::io::AsyncWriteExt;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let data: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 253) as u8).collect();
    // The first 5 MiB arrive (4 blocks stored: a heartbeat takes their changes and is held
    // 2 s sending them), then the rest, and the write ends.
    fail::cfg("worker.commit_changes.drained", "1*return(2000)").unwrap();
    let (mut tx, mut rx) = tokio::io::duplex(1 << 20);
    let feed = {
        let data = data.clone();
        tokio::spawn(async move {
            tx.write_all(&data[..5 << 20]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(600)).await;
            tx.write_all(&data[5 << 20..]).await.unwrap();
            tx.shutdown().await.unwrap();
        })
    };
    let opts = PutOptions { write_type: Some(WriteType::AsyncThrough), ..Default::default() };
    cl.put_with("/f", &mut rx, &opts, |_| Ok(Default::default())).await.unwrap();
    feed.await.unwrap();
    let fi = cl.status("/f", true).await.unwrap();
    fail::remove("worker.commit_changes.drained");
    let missing: Vec<u64> = fi.blocks.iter().filter(|b| b.locations.is_empty()).map(|b| b.block_id).collect();
    assert!(missing.is_empty(), "acknowledged before the master knew blocks {missing:?}");
    let mut out = Vec::new();
    cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
    assert!(out == data);
    c.shutdown().await;
}

/// The e2e consistency load's GETs cut off before their first byte ("block N of PATH has
/// no live copy, and the file is not persisted"): a status with blocks read the file's
/// inode in one snapshot of the namespace and its blocks' locations in another, so an
/// overwrite that committed in between (dropping the old version's locations) left a
/// FileInfo of the old version, still to be persisted, whose blocks named no copy at all,
/// though the worker still held them (retired, for the readers under way). The inode and
/// its locations now come from one snapshot. A fault point holds the status between its
/// lookup and its blocks while the file is overwritten; persists are held, so neither
/// version is in the UFS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_status_with_blocks_names_copies_of_the_version_it_returns() {
    use locus_client::PutOptions;
    use locus_common::config::WriteType;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let cl = std::sync::Arc::new(c.client(ClientConfig::default()).unwrap());
    let put = |data: Vec<u8>| {
        let cl = cl.clone();
        async move {
            let opts = PutOptions { write_type: Some(WriteType::AsyncThrough), overwrite: true, ..Default::default() };
            cl.put_with("/k", &mut data.as_slice(), &opts, |_| Ok(Default::default())).await.unwrap();
        }
    };
    let v1: Vec<u8> = (0..(2u32 << 20) + 7).map(|i| (i % 251) as u8).collect();
    let v2: Vec<u8> = (0..(3u32 << 20) + 11).map(|i| (i % 241) as u8).collect();
    fail::cfg("master.persist.before_ufs", "return").unwrap();
    put(v1.clone()).await;
    fail::cfg("master.get_status.resolved", "1*return(1500)").unwrap();
    let status = tokio::spawn({
        let cl = cl.clone();
        async move { cl.status("/k", true).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    put(v2.clone()).await; // while the status is held between its lookup and its blocks
    let fi = status.await.unwrap().unwrap();
    fail::remove("master.get_status.resolved");
    assert_eq!(fi.persist_state(), locus_proto::pb::PersistState::ToBePersisted);
    let missing: Vec<u64> = fi.blocks.iter().filter(|b| b.locations.is_empty()).map(|b| b.block_id).collect();
    assert!(missing.is_empty(), "version {} of {} bytes with no copy of blocks {missing:?}", fi.version, fi.length);
    let mut out = Vec::new();
    cl.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
    assert!(out == v1 || out == v2, "{} bytes read, of neither version", out.len());
    assert_eq!(out.len() as u64, fi.length);
    fail::remove("master.persist.before_ufs");
    c.shutdown().await;
}

/// A block stored while the worker registers (after a master restart) reaches the
/// master: the full block report and the drain of the block changes it covers are one
/// step. Before, a block stored between the two was in neither the report nor any later
/// commit (its change was drained with the ones the report covered), and the master never
/// learned of the copy. A fault point holds the registration after its report while the
/// worker stores a block (as a fill does, its own commit still waiting for the one before
/// it: commits go one at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_stored_while_the_worker_registers_reaches_the_master() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(64));
    let mut c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let data: Vec<u8> = (0..(1u32 << 20) - 3).map(|i| (i % 239) as u8).collect();
    std::fs::write(c.data_dir().join("ufs/f.bin"), &data).unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let block = cl.status("/f.bin", true).await.unwrap().blocks[0].block_id;
    // The master restarts: the worker registers again, and is held 1.5 s after its report.
    let held = Arc::new(AtomicBool::new(false));
    let h = held.clone();
    fail::cfg_callback("worker.register.reported", move || {
        if !h.swap(true, SeqCst) {
            std::thread::sleep(Duration::from_millis(1500));
        }
    })
    .unwrap();
    c.stop_master().await;
    c.start_master().await.unwrap();
    for _ in 0..400 {
        if held.load(SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(held.load(SeqCst), "the worker did not register again");
    // Meanwhile the worker stores a block of f.bin.
    let worker = c.worker(0).unwrap();
    tokio::task::block_in_place(|| {
        let t = worker.store().create(block, data.len() as u64).unwrap();
        t.open().unwrap().write_all(&data).unwrap();
        t.commit(data.len() as u64, None).unwrap();
    });
    let mut known = false;
    for _ in 0..60 {
        let fi = cl.status("/f.bin", true).await.unwrap();
        if fi.blocks[0].locations.iter().any(|l| l.worker_id == worker.id()) {
            known = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fail::remove("worker.register.reported");
    assert!(known, "the master never learned of the block the worker stored while it registered");
    assert!(read_whole(&cl, "/f.bin").await == data);
    c.shutdown().await;
}

/// A lease the local worker refuses (the block evicted or moved under the reader, made
/// to happen by `worker.lease.refuse`): the read goes on over the data path, and both the
/// client and the worker's count by host say why it was not short-circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_lease_is_read_over_the_data_path_and_told() {
    use locus_common::metrics::ReadReason;
    use locus_proto::pb;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (c, data) = cluster_with_file(dir.path(), "f.bin", 253).await;
    let cl = c.client(ClientConfig { host: "reader".into(), ..Default::default() }).unwrap();
    let read = || read_whole(&cl, "/f.bin");
    assert_eq!(read().await, data); // cached now, on the local worker
    // The fill's commit reaches the master just after the reader's last byte.
    for _ in 0..100 {
        if !cl.status("/f.bin", true).await.unwrap().blocks[0].locations.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fail::cfg("worker.lease.refuse", "return").unwrap();
    assert_eq!(read().await, data);
    fail::remove("worker.lease.refuse");
    let n = data.len() as u64;
    assert_eq!(cl.read_reasons().get(&ReadReason::LeaseRefused), Some(&(1, n)));
    assert_eq!(cl.read_reasons().get(&ReadReason::ShortCircuit), None);
    for _ in 0..100 {
        let r = cl.reads(Duration::ZERO, "reader").await.unwrap();
        let refused: u64 = r
            .rows
            .iter()
            .filter(|r| r.reason() == pb::ReadReason::LeaseRefused && r.source() == pb::ReadSource::LocalWorker)
            .map(|r| r.bytes)
            .sum();
        if refused == n {
            c.shutdown().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the worker did not count the refused lease: {:?}", cl.reads(Duration::ZERO, "reader").await.unwrap());
}

/// A cold read over the data path whose fill commits before the reader follows the
/// fill's file (made to happen by `worker.fill.follow`) is served from the cached copy,
/// and counted by host as what it was: bytes from the UFS, not a cache hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_that_commits_before_its_reader_follows_counts_as_from_the_ufs() {
    use locus_common::metrics::ReadReason;
    use locus_proto::pb;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (c, data) = cluster_with_file(dir.path(), "g.bin", 251).await;
    let cl = c.client(ClientConfig { host: "late".into(), short_circuit: false, ..Default::default() }).unwrap();
    fail::cfg("worker.fill.follow", "1*return(1000)").unwrap();
    let out = read_whole(&cl, "/g.bin").await;
    fail::remove("worker.fill.follow");
    assert!(out == data);
    let n = data.len() as u64;
    assert_eq!(cl.read_reasons().get(&ReadReason::Disabled), Some(&(1, n)));
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = cl.reads(Duration::ZERO, "late").await.unwrap().rows;
        if !rows.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got: Vec<_> = rows.iter().map(|r| (r.source(), r.reason(), r.bytes)).collect();
    assert_eq!(got, vec![(pb::ReadSource::Ufs, pb::ReadReason::Disabled, n)]);
    c.shutdown().await;
}

/// A co-located cached write whose worker refuses the short-circuit request as a worker
/// older than it did (`worker.uds.write.old`, a rolling upgrade) goes over the data path,
/// whole and acknowledged, and is counted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_circuit_write_an_older_worker_refuses_goes_over_the_data_path() {
    use locus_client::PutOptions;
    use locus_proto::pb;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(config(&dir.path().join("mem"), ByteSize::mib(64)), &dir.path().join("data"), 1, None)
        .await
        .unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) + 5).map(|i| (i % 249) as u8).collect();
    let opts = PutOptions {
        overwrite: true,
        write_type: Some(locus_common::config::WriteType::MustCache),
        ..Default::default()
    };
    fail::cfg("worker.uds.write.old", "return").unwrap();
    let put = cl.put_with("/old.bin", &mut &data[..], &opts, |_| Ok(pb::ObjectMeta::default())).await;
    fail::remove("worker.uds.write.old");
    assert_eq!(put.unwrap().length, data.len() as u64);
    assert!(read_whole(&cl, "/old.bin").await == data);
    let n = data.len() as u64;
    for _ in 0..100 {
        let t = cl.report().await.unwrap().totals.unwrap();
        if t.written_data_path == n {
            assert_eq!(t.written_short_circuit, 0, "{t:?}");
            c.shutdown().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the write was not counted on the data path: {:?}", cl.report().await.unwrap().totals);
}

/// A rename queued behind other UFS changes moves what the UFS holds at its source when
/// it runs, whatever has moved on in the namespace since: a task commit's rename of an
/// attempt directory holding a file already in the UFS (written through, or its staging
/// wait ran out), queued behind the persist of another, then the job commit's renames of
/// both files out of it. Judged by the namespace at run time, the attempt directory held
/// nothing persisted any more, its UFS rename was skipped, the file's own rename then
/// found nothing to move, and the committed file, persisted by its record, was not in
/// the UFS. The queue is held by a fault point while the renames are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_rename_moves_what_the_ufs_holds_when_it_runs() {
    use locus_client::PutOptions;
    use locus_common::config::WriteType;
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (c, cl, ufs) = cluster_with_lake(dir.path(), 60_000).await;
    let put = |p: String, data: &'static [u8], wt: WriteType| {
        let cl = cl.clone();
        async move {
            let opts = PutOptions { write_type: Some(wt), ..Default::default() };
            cl.put_with(&p, &mut &data[..], &opts, |_| Ok(Default::default())).await
        }
    };
    let (s, d) = ("/m/out/_temporary/0/_temporary/attempt_1", "/m/out/_temporary/0/task_1");
    cl.mkdir(s, true).await.unwrap();
    put(format!("{s}/f1"), b"first file", WriteType::Through).await.unwrap();
    assert!(ufs.join("out/_temporary/0/_temporary/attempt_1/f1").is_file());
    fail::cfg("master.persist.before_ufs", "return").unwrap();
    put(format!("{s}/f2"), b"second file", WriteType::AsyncThrough).await.unwrap();
    cl.rename(s, d).await.unwrap();
    cl.rename(&format!("{d}/f1"), "/m/out/f1").await.unwrap();
    cl.rename(&format!("{d}/f2"), "/m/out/f2").await.unwrap();
    fail::remove("master.persist.before_ufs");
    common::wait_queue_empty(&cl, Duration::from_secs(20)).await;
    assert_eq!(
        std::fs::read(ufs.join("out/f1")).ok().as_deref(),
        Some(&b"first file"[..]),
        "the committed file is in the UFS"
    );
    assert_eq!(std::fs::read(ufs.join("out/f2")).unwrap(), b"second file");
    c.shutdown().await;
}

/// A cold compute caches the blocks it scans, and its answer comes after the master
/// knows they are cached: a `stat` right after it shows every block with a copy. The
/// fill's commit to the master is held 500 ms by a fault point; before, the compute
/// answered as soon as it had scanned the fill's bytes, and the `stat` raced the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cold_compute_answers_after_the_master_knows_what_it_cached() {
    use locus_proto::pb::{self, ComputeOp};
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("mem"), ByteSize::mib(16));
    let c = LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let mut csv = String::from("a,b\n");
    for i in 0..300_000u32 {
        csv += &format!("{i},{}\n", i % 7);
    }
    std::fs::write(c.data_dir().join("ufs").join("s.csv"), &csv).unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let blocks = cl.status("/s.csv", true).await.unwrap().blocks.len();
    assert!(blocks >= 2, "{blocks} blocks");
    let job = locus_client::ComputeJob {
        request: locus_compute::Request {
            ops: vec![ComputeOp::Count],
            csv: pb::CsvFormat { header: true, ..Default::default() },
            ..Default::default()
        },
        ..Default::default()
    };
    fail::cfg("worker.commit_changes.drained", "return(500)").unwrap();
    let out = cl.compute(&["/s.csv".into()], &job).await;
    let fi = cl.status("/s.csv", true).await;
    fail::remove("worker.commit_changes.drained");
    assert_eq!(out.unwrap().results.rows, 300_000);
    let uncached: Vec<u64> = fi.unwrap().blocks.iter().filter(|b| b.locations.is_empty()).map(|b| b.block_id).collect();
    assert!(uncached.is_empty(), "answered before the master knew it cached blocks {uncached:?}");
    c.shutdown().await;
}
