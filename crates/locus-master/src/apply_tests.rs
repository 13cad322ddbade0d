//! The commands of `apply.rs` replayed: one command stream applied to two fresh stores
//! leaves their replicated tables equal, byte for byte, failures included.

use locus_proto::pb::{self, command::Op};
use redb::{ReadableTable, TableDefinition, TableHandle};

use crate::namespace::{Effects, Namespace};
use crate::store::*;

const NOW: i64 = 1_700_000_000_000;

fn fresh(dir: &std::path::Path) -> Namespace {
    Namespace::new(Store::open(dir, 1 << 20).unwrap(), 1 << 20)
}

/// Apply `op` at time `now` as the committer does: committed when it succeeds, rolled back
/// (no trace) when it fails.
fn run(ns: &Namespace, now: i64, op: &Op) -> locus_common::Result<pb::CommandResult> {
    run_as(ns, b"", now, op)
}

/// [`run`] as a call with request id `id` (empty: none).
fn run_as(ns: &Namespace, id: &[u8], now: i64, op: &Op) -> locus_common::Result<pb::CommandResult> {
    let cmd = pb::Command { request_id: id.to_vec(), now_ms: now, op: Some(op.clone()) };
    let w = ns.store().write().unwrap();
    let r = ns.apply(&w, &cmd, &mut Effects::default());
    if r.is_ok() {
        w.commit().unwrap();
    }
    r
}

/// Every entry of a table of protobuf records (or of ids), as text.
fn rows<K, V>(r: &redb::ReadTransaction, t: TableDefinition<K, V>) -> Vec<String>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::fmt::Debug,
    for<'a> V::SelfType<'a>: std::fmt::Debug,
{
    let name = t.name().to_string();
    let t = r.open_table(t).unwrap();
    t.iter().unwrap().map(|e| e.unwrap()).map(|(k, v)| format!("{name}: {:?} = {:?}", k.value(), v.value())).collect()
}

/// The replicated tables (the cluster id, made at random by each store, left out).
fn replicated(ns: &Namespace) -> Vec<String> {
    let r = ns.read().unwrap();
    let mut out = rows(&r, INODES);
    out.extend(rows(&r, CHILDREN));
    out.extend(rows(&r, MOUNTS));
    out.extend(rows(&r, VERSIONS));
    out.extend(rows(&r, WORKERS));
    out.extend(rows(&r, PINNED));
    out.extend(rows(&r, COUNTERS).into_iter().filter(|s| !s.contains(CLUSTER_ID)));
    out.extend(rows(&r, PERSIST_QUEUE));
    out.extend(rows(&r, PENDING_WRITES));
    out.extend(rows(&r, REPLICATED));
    out.extend(rows(&r, RETRY_CACHE));
    out.extend(rows(&r, RETRY_BY_TIME));
    out
}

fn entry(name: &str, length: u64, etag: &str) -> pb::UfsEntry {
    pb::UfsEntry { name: name.into(), length, etag: etag.into(), mtime_ms: 5, ..Default::default() }
}

fn side(queued: bool, kind: pb::PersistOpKind, ufs_path: &str) -> pb::UfsSide {
    let op = pb::PersistOp { kind: kind.into(), mount_id: 1, ufs_path: ufs_path.into(), ..Default::default() };
    pb::UfsSide { queued, op: Some(op), ..Default::default() }
}

/// A day of a namespace's life: a mount, writes of each type, an overwrite, pins,
/// replication bounds, tags, persists landing, given up, retried and dropped, an
/// abandoned write reaped, a worker, a directory made and listed, a file imported,
/// changed in the UFS, gone from a listing, one renamed and deleted, one lost and back,
/// commands that fail, and the mount going again.
fn stream() -> Vec<Op> {
    let options = [("a", "1"), ("b", "2"), ("c", "3")].map(|(k, v)| (k.to_string(), v.to_string())).into();
    let mount = pb::MountInfo { path: "/m".into(), uri: "file:///tmp/x".into(), options, ..Default::default() };
    let complete = |version: u64, name: &str, wt: pb::WriteType, len: u64| {
        Op::CompleteFile(pb::CompleteFile {
            req: Some(pb::CompleteFileRequest {
                path: format!("/m/{name}"),
                length: len,
                version,
                write_type: wt.into(),
                persist_wait_ms: 5,
                ..Default::default()
            }),
            path: format!("/m/{name}"),
            // The mount's directory is the first entry made after the root.
            parent_id: ROOT_ID + 1,
            name: name.into(),
            mount_id: 1,
            ufs_path: name.into(),
            block_size: 1 << 20,
        })
    };
    let tags = pb::ObjectMeta {
        tags: [("k", "v"), ("a", "1"), ("z", "2"), ("m", "3")].map(|(k, v)| (k.to_string(), v.to_string())).into(),
        ..Default::default()
    };
    vec![
        Op::AddMount(pb::AddMount { info: Some(mount) }),
        Op::DateBuckets(pb::DateBuckets { inode_ids: vec![ROOT_ID + 1] }),
        Op::OpenWrite(pb::OpenWrite { pin: true }),
        Op::OpenWrite(pb::OpenWrite { pin: false }),
        Op::OpenWrite(pb::OpenWrite { pin: true }),
        complete(1, "a", pb::WriteType::AsyncThrough, 3 << 20),
        complete(2, "b", pb::WriteType::Through, 10),
        complete(0, "c", pb::WriteType::MustCache, 7),
        // Fails: version 1 is no longer pending.
        complete(1, "a", pb::WriteType::AsyncThrough, 1),
        complete(0, "b", pb::WriteType::CacheThrough, 20),
        Op::SetPinned(pb::SetPinned { inode_ids: vec![3, 4, 99], pinned: true }),
        Op::SetPinned(pb::SetPinned { inode_ids: vec![4], pinned: false }),
        Op::SetReplication(pb::SetReplication { inode_ids: vec![3, 4], min: 2, max: 3 }),
        Op::SetObjectMeta(pb::SetObjectMeta {
            inode_id: 4,
            meta: Some(tags),
            tags_only: true,
            stores_metadata: true,
            path: "/m/b".into(),
            mount_id: 1,
            ufs_path: "b".into(),
        }),
        // Fails: no such entry.
        Op::QueuePersist(pb::QueuePersist { inode_id: 99, path: "/m/z".into(), mount_id: 1, ufs_path: "z".into() }),
        Op::QueuePersist(pb::QueuePersist { inode_id: 5, path: "/m/c".into(), mount_id: 1, ufs_path: "c".into() }),
        Op::Persisted(pb::Persisted {
            seq: 1,
            inode_id: 3,
            version: 1,
            fingerprint: "f1".into(),
            stores_metadata: true,
            mount_id: 1,
            ufs_path: "a".into(),
            path: "/m/a".into(),
            ..Default::default()
        }),
        Op::GiveUpOp(pb::GiveUpOp { seq: 2, failures: 5, kind: pb::ErrorKind::Ufs.into(), message: "no".into() }),
        Op::GiveUpOp(pb::GiveUpOp { seq: 3, failures: 5, kind: pb::ErrorKind::Ufs.into(), message: "no".into() }),
        Op::ResolveFailures(pb::ResolveFailures { seqs: vec![3], retry: true }),
        Op::ResolveFailures(pb::ResolveFailures { seqs: vec![2], retry: false }),
        Op::MetaRewritten(pb::MetaRewritten { seq: 2, inode_id: 4, version: 5, fingerprint: "f2".into() }),
        Op::OpDone(pb::OpDone { seq: 9, mkdir_inode: 0 }),
        Op::RemoveOp(pb::RemoveOp { seq: 4 }),
        Op::RegisterWorker(pb::RegisterWorker {
            worker_id: 0,
            address: Some(pb::WorkerAddress { host: "h".into(), data_address: "h:1".into(), ..Default::default() }),
        }),
        // Directory d (inode 6), its UFS side queued (persist seq 4).
        Op::Mkdir(pb::Mkdir {
            parent_id: ROOT_ID + 1,
            parent_path: "/m".into(),
            name: "d".into(),
            staging: false,
            ufs: Some(side(true, pb::PersistOpKind::Mkdir, "d")),
        }),
        // x (inode 7) imported, then y (inode 8) by a listing that refreshes x too.
        Op::LoadEntry(pb::LoadEntry { parent_id: 6, stat: Some(entry("x", 3, "e")) }),
        Op::MergeListing(pb::MergeListing {
            dir_id: 6,
            entries: vec![entry("x", 3, "e"), entry("y", 5, "f")],
            start_ms: NOW,
        }),
        // x changed in the UFS: a new version.
        Op::SyncFile(pb::SyncFile {
            parent_path: "/m/d".into(),
            name: "x".into(),
            stat: Some(entry("x", 4, "e2")),
            inode_id: 7,
            version: 6,
        }),
        Op::Rename(pb::Rename {
            src_parent_path: "/m/d".into(),
            src_name: "y".into(),
            dst_parent_id: ROOT_ID + 1,
            dst_name: "y2".into(),
            inode_id: 8,
            src: "/m/d/y".into(),
            dst: "/m/y2".into(),
            ufs: Some(side(false, pb::PersistOpKind::Rename, "d/y")),
        }),
        // A later listing of d without x: x goes.
        Op::FinishListing(pb::FinishListing { dir_id: 6, gone: vec!["x".into()], start_ms: NOW + 1000 }),
        Op::SetLost(pb::SetLost { lost: vec![5], found: vec![] }),
        Op::SetLost(pb::SetLost { lost: vec![], found: vec![5] }),
        Op::Delete(pb::Delete {
            parent_path: "/m".into(),
            name: "y2".into(),
            only_empty: false,
            ufs: Some(side(true, pb::PersistOpKind::Delete, "y2")),
        }),
        Op::ReapWrites(pb::ReapWrites { versions: vec![3, 1] }),
        Op::RemoveMount(pb::RemoveMount { mount_id: 1, parent_path: "/".into(), name: "m".into() }),
    ]
}

/// Store `b` replays the stream after `a` has, later by the clock: a change that read the
/// clock, not its command, would leave them different.
#[test]
fn one_command_stream_leaves_two_stores_equal() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (fresh(d1.path()), fresh(d2.path()));
    let ops = stream();
    let mut seen = vec![replicated(&a)];
    let mut answers = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        answers.push(run(&a, NOW + i as i64, op).map_err(|e| (e.kind(), e.to_string())));
        seen.push(replicated(&a));
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(replicated(&b), seen[0]);
    for (i, op) in ops.iter().enumerate() {
        let got = run(&b, NOW + i as i64, op).map_err(|e| (e.kind(), e.to_string()));
        assert_eq!(got, answers[i], "command {i} answered differently");
        assert_eq!(replicated(&b), seen[i + 1], "the stores differ after command {i}");
    }
    let failed = answers.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 2, "the stream's two bad commands fail, and only they: {answers:#?}");
    // The stream did change the store, step by step (a no-op apply would pass the rest).
    let changed = seen.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changed, ops.len() - 4, "commands that changed the store");
    let mid = &seen[12];
    assert!(mid.iter().any(|s| s.starts_with("pinned: 1 ")), "the pinned write's version is pinned: {mid:#?}");
    let end = seen.last().unwrap();
    assert!(!end.iter().any(|s| s.starts_with("mounts:")), "the mount is gone: {end:#?}");
    assert!(end.iter().any(|s| s.starts_with("persist_queue: 3 ")), "the retried op stays queued: {end:#?}");
    let after = |name: &str| {
        let i = ops.iter().position(|op| format!("{op:?}").starts_with(name)).unwrap();
        &seen[i + 1]
    };
    assert!(after("RegisterWorker").iter().any(|s| s.starts_with("workers: 1 ")));
    assert!(after("Mkdir").iter().any(|s| s.starts_with("persist_queue: 4 ")), "the queued mkdir");
    assert!(after("MergeListing").iter().any(|s| s.starts_with("children: (6, \"y\") = 8")));
    assert!(after("Rename").iter().any(|s| s.starts_with("children: (2, \"y2\") = 8")));
    assert!(!after("FinishListing").iter().any(|s| s.starts_with("children: (6, \"x\")")), "x is gone");
    assert!(!after("Delete").iter().any(|s| s.contains("\"y2\"")), "y2 is deleted");
    assert!(after("Delete").iter().any(|s| s.starts_with("persist_queue: 6 ")), "its UFS delete is queued");
    assert!(!after("SetLost").iter().any(|s| s.starts_with("persist_queue: 5 ")), "lost: nothing queued");
}

/// The time a change records is its command's.
#[test]
fn a_change_records_its_commands_time() {
    let d = tempfile::tempdir().unwrap();
    let ns = fresh(d.path());
    for (i, op) in stream().iter().take(6).enumerate() {
        let _ = run(&ns, NOW + i as i64, op);
    }
    let r = ns.read().unwrap();
    let inodes = r.open_table(INODES).unwrap();
    let dir = get_inode(&inodes, ROOT_ID + 1).unwrap().unwrap();
    assert_eq!(dir.mtime_ms, NOW + 1, "dated by DateBuckets, command 1");
    let a = get_inode(&inodes, ROOT_ID + 2).unwrap().unwrap();
    assert_eq!((a.mtime_ms, a.synced_ms), (NOW + 5, NOW + 5), "completed by command 5");
    let q = r.open_table(PERSIST_QUEUE).unwrap();
    let op: pb::PersistOp = decode(q.get(1).unwrap().unwrap().value()).unwrap();
    assert_eq!((op.enqueued_ms, op.not_before_ms), (NOW + 5, NOW + 10), "queued at 5, waiting 5 ms");
}

/// Every durable change of the namespace is a command: nothing but the commit path in
/// namespace.rs hands the store's committer a transaction of its own making.
#[test]
fn no_durable_change_bypasses_the_commands() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.clone()];
    let mut offenders = Vec::new();
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let name = p.strip_prefix(&src).unwrap().display().to_string();
        // (Tests set up their stores as they need.)
        if ["namespace.rs", "store.rs"].contains(&name.as_str()) || name.ends_with("tests.rs") || !name.ends_with(".rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, line) in text.lines().enumerate() {
            if [".mutate(", ".submit("].iter().any(|s| line.contains(s)) {
                offenders.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "durable changes outside the commands: {offenders:#?}");
}

/// A sync that found a file gone from the UFS leaves it when it was written since the
/// check read it (a MUST_CACHE overwrite between the stat and the commit): its only
/// bytes are in the cache.
#[test]
fn a_sync_leaves_a_file_written_since_it_looked() {
    let d = tempfile::tempdir().unwrap();
    let ns = fresh(d.path());
    let ops = stream();
    for (i, op) in ops.iter().take(7).enumerate() {
        run(&ns, NOW + i as i64, op).unwrap(); // the mount, a, b (inode 4, version 2)
    }
    let gone = |version| {
        let c = pb::SyncFile { parent_path: "/m".into(), name: "b".into(), stat: None, inode_id: 4, version };
        Op::SyncFile(c)
    };
    // b overwritten MUST_CACHE (version 4) after a check that read version 2.
    let overwrite = Op::CompleteFile(pb::CompleteFile {
        req: Some(pb::CompleteFileRequest {
            length: 3,
            write_type: pb::WriteType::MustCache.into(),
            ..Default::default()
        }),
        path: "/m/b".into(),
        parent_id: ROOT_ID + 1,
        name: "b".into(),
        mount_id: 1,
        ufs_path: "b".into(),
        block_size: 1 << 20,
    });
    run(&ns, NOW + 10, &overwrite).unwrap();
    let r = run(&ns, NOW + 11, &gone(2)).unwrap();
    assert_eq!(r.record.map(|r| r.version), Some(4), "the new version stays");
    assert!(ns.inode_by_path("/m/b").unwrap().is_some());
    // Not persisted, it stays even for a check of this version; persisted, it goes.
    run(&ns, NOW + 12, &gone(4)).unwrap();
    let mut rec = ns.inode_by_path("/m/b").unwrap().unwrap();
    assert_eq!(rec.persist_state(), pb::PersistState::NotPersisted);
    rec.set_persist_state(pb::PersistState::Persisted);
    {
        let w = ns.store().write().unwrap();
        crate::namespace::put_inode(&w, &rec).unwrap();
        w.commit().unwrap();
    }
    run(&ns, NOW + 13, &gone(4)).unwrap();
    assert!(ns.inode_by_path("/m/b").unwrap().is_none(), "gone from the UFS and from the namespace");
}

/// A command sent again with its request id (a caller that did not hear back) changes
/// nothing and answers what the first one did; another id is another change. Results
/// older than the cache keeps are trimmed by later commands.
#[test]
fn a_resent_command_answers_its_first_result() {
    let d = tempfile::tempdir().unwrap();
    let ns = fresh(d.path());
    let sent = |id: &[u8], now: i64, op: &Op| run_as(&ns, id, now, op).unwrap();
    let open = Op::OpenWrite(pb::OpenWrite { pin: true });
    let first = sent(b"call-1", NOW, &open);
    assert_eq!(first.id, 1);
    let before = replicated(&ns);
    let again = sent(b"call-1", NOW + 5, &open);
    assert_eq!(again, first, "the resend answers the first result");
    assert_eq!(replicated(&ns), before, "and changes nothing");
    assert_eq!(sent(b"call-2", NOW + 6, &open).id, 2, "another call is another write");
    assert_eq!(run(&ns, NOW + 7, &open).unwrap().id, 3, "a command with no id is never cached");
    // Past the time the cache keeps results, a later command trims them: the old id
    // is new again.
    let later = NOW + crate::apply::RETRY_KEEP_MS + 10;
    sent(b"call-3", later, &open);
    let r = ns.read().unwrap();
    let cached: Vec<Vec<u8>> =
        r.open_table(RETRY_CACHE).unwrap().iter().unwrap().map(|e| e.unwrap().0.value().to_vec()).collect();
    assert_eq!(cached, vec![b"call-3".to_vec()], "the expired results are gone");
    assert_eq!(r.open_table(RETRY_BY_TIME).unwrap().iter().unwrap().count(), 1);
    drop(r);
    assert_eq!(sent(b"call-1", later + 1, &open).id, 5, "an expired id applies again");
}
