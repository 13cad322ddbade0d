//! The master's metadata in redb. Every table lives on disk; redb's page cache (sized by
//! `master.meta_cache_size`) bounds memory whatever the number of files.
//!
//! | table | key | value |
//! |---|---|---|
//! | `inodes` | inode id | `InodeRecord` (protobuf) |
//! | `children` | (parent id, name) | child id |
//! | `mounts` | mount id | `MountInfo` (protobuf) |
//! | `versions` | file version | inode id (finds the file of a block) |
//! | `block_locations` | (block id, worker id) | [`StoredTier`] (one byte) |
//! | `worker_blocks` | (worker id, block id) | () |
//! | `workers` | worker id | `WorkerAddress` (protobuf) |
//! | `pinned` | file version | () |
//! | `counters` | name | u64 (id allocators, pin epoch) |
//! | `persist_queue` | seq | `PersistOp` (protobuf): UFS changes still to make, in order |
//! | `pending_writes` | file version | creation time (ms) of a write not completed yet |
//! | `replicated` | file version | () for files with replication bounds (`setReplication`) |
//! | `retry_cache` | request id | `RetryEntry` (protobuf): the first result of a command sent again (`apply.rs`) |
//! | `retry_by_time` | (time ms, request id) | (): the retry cache in age order, to trim it |
//! | `raft_state` | `applied`, `membership` | `RaftLogId`, `RaftStoredMembership`: the log's last entry applied here (`raft/state.rs`; a member of a group only) |
//! | `catalog_journal` | seq | `CatalogChange` (protobuf): changes the search index has still to take (`journal`; created by the indexer) |
//!
//! A file version is in `versions` from `CreateFile` on (mapped to inode 0 until the
//! write completes), so that workers may report its blocks while it is written.
//! `pinned` holds the versions whose blocks must not be evicted: files pinned by users,
//! and files whose bytes are not persisted yet.

use std::path::Path;

use locus_common::config::{TierAlias, WriteType};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use prost::Message;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

pub const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
pub const CHILDREN: TableDefinition<(u64, &str), u64> = TableDefinition::new("children");
pub const MOUNTS: TableDefinition<u64, &[u8]> = TableDefinition::new("mounts");
pub const VERSIONS: TableDefinition<u64, u64> = TableDefinition::new("versions");
pub const LOCATIONS: TableDefinition<(u64, u64), StoredTier> = TableDefinition::new("block_locations");
/// The locations of older builds, with the tier as its name: dropped at open. Locations
/// are soft state; each worker's registration reports its blocks again.
const OLD_LOCATIONS: TableDefinition<(u64, u64), &str> = TableDefinition::new("locations");
pub const WORKER_BLOCKS: TableDefinition<(u64, u64), ()> = TableDefinition::new("worker_blocks");
pub const WORKERS: TableDefinition<u64, &[u8]> = TableDefinition::new("workers");
pub const PINNED: TableDefinition<u64, ()> = TableDefinition::new("pinned");
pub const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
pub const PERSIST_QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("persist_queue");
pub const PENDING_WRITES: TableDefinition<u64, i64> = TableDefinition::new("pending_writes");
pub const REPLICATED: TableDefinition<u64, ()> = TableDefinition::new("replicated");
pub const RETRY_CACHE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("retry_cache");
pub const RETRY_BY_TIME: TableDefinition<(i64, &[u8]), ()> = TableDefinition::new("retry_by_time");

pub const ROOT_ID: u64 = 1;

/// The tier a block is held in, as `block_locations` stores it: one byte, `None` for a
/// tier this build does not know (a worker's report may name none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredTier(pub Option<TierAlias>);

impl StoredTier {
    fn code(self) -> u8 {
        match self.0 {
            None => 0,
            Some(TierAlias::Mem) => 1,
            Some(TierAlias::Ssd) => 2,
            Some(TierAlias::Hdd) => 3,
        }
    }
}

impl From<pb::Tier> for StoredTier {
    fn from(t: pb::Tier) -> StoredTier {
        StoredTier(t.typed())
    }
}

impl redb::Value for StoredTier {
    type SelfType<'a> = StoredTier;
    type AsBytes<'a> = [u8; 1];

    fn fixed_width() -> Option<usize> {
        Some(1)
    }

    fn from_bytes<'a>(data: &'a [u8]) -> StoredTier
    where
        Self: 'a,
    {
        StoredTier(match data.first() {
            Some(1) => Some(TierAlias::Mem),
            Some(2) => Some(TierAlias::Ssd),
            Some(3) => Some(TierAlias::Hdd),
            _ => None,
        })
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a StoredTier) -> [u8; 1]
    where
        Self: 'b,
    {
        [value.code()]
    }

    fn type_name() -> redb::TypeName {
        redb::TypeName::new("locus::StoredTier")
    }
}

pub fn db_err(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("metadata store: {e}"))
}

type AnyBox = Box<dyn std::any::Any + Send>;
type Op = Box<dyn Fn(&WriteTransaction) -> Result<AnyBox> + Send>;
type Reply = tokio::sync::oneshot::Sender<Result<AnyBox>>;

/// The metadata store. Namespace changes made through [`Store::mutate`] are group
/// committed: changes that arrive while a commit is in progress share the next one (a
/// single fsync), so throughput grows with concurrency while each change is still
/// durable before its caller hears back.
pub struct Store {
    db: std::sync::Arc<Database>,
    ops: Option<std::sync::mpsc::Sender<(Op, Reply)>>,
    committer: Option<std::thread::JoinHandle<()>>,
    /// This namespace's cluster id (random, never 0), made with the store; a member of a
    /// group takes its group's with the first snapshot it installs ([`Store::reload_cluster_id`]).
    cluster_id: std::sync::atomic::AtomicU64,
}

impl Store {
    /// This namespace's cluster id.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reads the cluster id again (after a snapshot replaced the tables).
    pub fn reload_cluster_id(&self) -> Result<()> {
        let r = self.db.begin_read().map_err(db_err)?;
        let id = get_counter(&r.open_table(COUNTERS).map_err(db_err)?, CLUSTER_ID)?;
        self.cluster_id.store(id, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.ops.take();
        if let Some(t) = self.committer.take() {
            // The committer may drop the last user itself (a change that captured it
            // outlived its caller); it then ends on its own once the channel is closed.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join(); // the database closes once its last user is gone
            }
        }
    }
}

/// Most changes one commit takes.
const MAX_GROUP: usize = 1024;

fn run_committer(db: std::sync::Arc<Database>, rx: std::sync::mpsc::Receiver<(Op, Reply)>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        match run_group(&db, batch.len(), Durability::Immediate, |w, i| (batch[i].0)(w), |_| Ok(())) {
            Ok(results) => {
                for ((_, reply), r) in batch.drain(..).zip(results) {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(db_err(&msg)));
                }
            }
        }
    }
}

/// Runs changes `0..n` (`op(w, i)`) in one transaction of `db`, then `finish`, and
/// commits it with `durability`: each change's result. A change that fails is answered
/// with its error and the rest run again without it, so it leaves no trace. The outer
/// error is the transaction's own (begin, `finish`, commit), which every change shares.
pub(crate) fn run_group<T>(
    db: &Database,
    n: usize,
    durability: Durability,
    op: impl Fn(&WriteTransaction, usize) -> Result<T>,
    finish: impl Fn(&WriteTransaction) -> Result<()>,
) -> Result<Vec<Result<T>>> {
    let mut failed: Vec<Option<Error>> = (0..n).map(|_| None).collect();
    'again: loop {
        let mut w = db.begin_write().map_err(db_err)?;
        w.set_durability(durability).map_err(db_err)?;
        let mut done = Vec::with_capacity(n);
        for (i, f) in failed.iter_mut().enumerate() {
            if f.is_some() {
                continue;
            }
            match op(&w, i) {
                Ok(v) => done.push(v),
                Err(e) => {
                    drop(w); // abort
                    *f = Some(e);
                    continue 'again;
                }
            }
        }
        finish(&w)?;
        w.commit().map_err(db_err)?;
        // `done` holds the changes that did not fail, in order.
        let mut done = done.into_iter();
        let out = failed.into_iter().map(|f| match f {
            Some(e) => Err(e),
            None => done.next().ok_or_else(|| Error::internal("a change of a group did not run")),
        });
        return Ok(out.collect());
    }
}

/// Takes each replicated table of the metadata store in turn: what every member of a
/// master group holds alike (soft state, such as block locations, stays out).
pub(crate) trait Tables {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        t: TableDefinition<'static, K, V>,
    ) -> Result<()>;
}

/// Hands every replicated table to `v`.
pub(crate) fn replicated_tables(v: &mut impl Tables) -> Result<()> {
    v.table(INODES)?;
    v.table(CHILDREN)?;
    v.table(MOUNTS)?;
    v.table(VERSIONS)?;
    v.table(WORKERS)?;
    v.table(PINNED)?;
    v.table(COUNTERS)?;
    v.table(PERSIST_QUEUE)?;
    v.table(PENDING_WRITES)?;
    v.table(REPLICATED)?;
    v.table(RETRY_CACHE)?;
    v.table(RETRY_BY_TIME)
}

/// A protobuf record kept in a table. Records written before the protocol's enums were
/// typed carry their state as a name in a legacy field; `upgrade` moves it into the typed
/// field as the record is read (it is written back typed at its next change).
pub trait Stored: Message + Default {
    fn upgrade(&mut self) {}
}

#[allow(deprecated)] // the legacy fields are read here, and only here
impl Stored for pb::InodeRecord {
    fn upgrade(&mut self) {
        if !self.legacy_persist_state.is_empty() {
            let s = pb::PersistState::parse(&std::mem::take(&mut self.legacy_persist_state));
            self.set_persist_state(s.unwrap_or(pb::PersistState::Persisted));
        }
        if !self.legacy_lost_from.is_empty() {
            let s = pb::PersistState::parse(&std::mem::take(&mut self.legacy_lost_from));
            self.set_lost_from(s.unwrap_or(pb::PersistState::Persisted));
        }
    }
}

#[allow(deprecated)]
impl Stored for pb::PersistOp {
    fn upgrade(&mut self) {
        if !self.legacy_kind.is_empty() {
            let k = pb::PersistOpKind::parse(&std::mem::take(&mut self.legacy_kind));
            self.set_kind(k.unwrap_or(pb::PersistOpKind::Unspecified));
        }
    }
}

#[allow(deprecated)]
impl Stored for pb::MountInfo {
    fn upgrade(&mut self) {
        if !self.legacy_write_type.is_empty() {
            let w = WriteType::parse(&std::mem::take(&mut self.legacy_write_type));
            self.set_write_type(pb::WriteType::from_opt(w));
        }
    }
}

impl Stored for pb::WorkerAddress {}
impl Stored for pb::CatalogEntry {}
impl Stored for pb::CatalogChange {}

/// Decode a stored protobuf record.
pub fn decode<M: Stored>(b: &[u8]) -> Result<M> {
    let mut m = M::decode(b).map_err(|e| Error::new(ErrorKind::Corrupt, format!("metadata record: {e}")))?;
    m.upgrade();
    Ok(m)
}

impl Store {
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<Store> {
        // The namespace (and the mounts' UFS credentials) are for this user only.
        use std::os::unix::fs::PermissionsExt;
        locus_common::security::create_private_dir(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("chmod 700 {}", dir.display()), e))?;
        let file = dir.join("meta.redb");
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&file)
            .map_err(|e| db_err(format!("open {}: {e}", dir.display())))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 600 {}", file.display()), e))?;
        let db = std::sync::Arc::new(db);
        let (tx, rx) = std::sync::mpsc::channel();
        let d2 = db.clone();
        let committer = std::thread::Builder::new()
            .name("locus-meta-commit".into())
            .spawn(move || run_committer(d2, rx))
            .map_err(|e| Error::io("start the metadata committer", e))?;
        let mut s = Store { db, ops: Some(tx), committer: Some(committer), cluster_id: Default::default() };
        let w = s.write()?;
        {
            // Create every table so that readers never meet a missing one.
            let mut inodes = w.open_table(INODES).map_err(db_err)?;
            w.open_table(CHILDREN).map_err(db_err)?;
            w.open_table(MOUNTS).map_err(db_err)?;
            w.open_table(VERSIONS).map_err(db_err)?;
            w.delete_table(OLD_LOCATIONS).map_err(db_err)?;
            w.open_table(LOCATIONS).map_err(db_err)?;
            w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            w.open_table(WORKERS).map_err(db_err)?;
            w.open_table(PINNED).map_err(db_err)?;
            w.open_table(COUNTERS).map_err(db_err)?;
            w.open_table(PERSIST_QUEUE).map_err(db_err)?;
            w.open_table(PENDING_WRITES).map_err(db_err)?;
            w.open_table(REPLICATED).map_err(db_err)?;
            w.open_table(RETRY_CACHE).map_err(db_err)?;
            w.open_table(RETRY_BY_TIME).map_err(db_err)?;
            // The cluster's identity, made once with the namespace: a worker holding blocks
            // of another namespace (whose ids mean other data here) is told to drop them.
            let mut counters = w.open_table(COUNTERS).map_err(db_err)?;
            let mut id = get_counter(&counters, CLUSTER_ID)?;
            if id == 0 {
                id = rand::random::<u64>().max(1);
                counters.insert(CLUSTER_ID, id).map_err(db_err)?;
            }
            *s.cluster_id.get_mut() = id;
            if inodes.get(ROOT_ID).map_err(db_err)?.is_none() {
                let root = pb::InodeRecord { id: ROOT_ID, is_dir: true, ..Default::default() };
                inodes.insert(ROOT_ID, root.encode_to_vec().as_slice()).map_err(db_err)?;
            }
        }
        w.commit().map_err(db_err)?;
        Ok(s)
    }

    /// The database, for the replicated log's state machine (`raft/state.rs`), which
    /// commits applied entries itself.
    pub(crate) fn db(&self) -> std::sync::Arc<Database> {
        self.db.clone()
    }

    /// Apply `f` in a group-committed durable transaction and return its result once
    /// the change is on disk. `f` may run more than once (when another change of its
    /// group fails), so it must not consume what it captures.
    pub async fn mutate<T: Send + 'static>(
        &self,
        f: impl Fn(&WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.submit(f)?.await
    }

    /// [`Store::mutate`] in two steps: the change takes its place in the commit order now
    /// (changes commit in the order they are submitted), and the future returned answers
    /// once it is on disk.
    pub fn submit<T, F>(&self, f: F) -> Result<impl std::future::Future<Output = Result<T>> + use<T, F>>
    where
        T: Send + 'static,
        F: Fn(&WriteTransaction) -> Result<T> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op: Op = Box::new(move |w| f(w).map(|v| Box::new(v) as AnyBox));
        self.ops
            .as_ref()
            .ok_or_else(|| Error::internal("metadata store is closed"))?
            .send((op, tx))
            .map_err(|_| Error::internal("metadata committer is gone"))?;
        Ok(async move {
            let v = rx.await.map_err(|_| Error::internal("metadata committer is gone"))??;
            Ok(*v.downcast::<T>().map_err(|_| Error::internal("metadata committer returned the wrong type"))?)
        })
    }

    /// A durable write transaction, for [`Store::open`] and `journal::create` only: every later change goes
    /// through [`Store::mutate`] or [`Store::mutate_soft`], off the async runtime.
    pub(crate) fn write(&self) -> Result<WriteTransaction> {
        self.db.begin_write().map_err(db_err)
    }

    /// Apply `f` to soft state (block locations) in a transaction without an fsync: made
    /// durable by the next durable commit, and rebuilt from block reports after a crash
    /// anyway. It runs on a blocking thread, since it still waits for redb's write lock,
    /// which a durable commit holds through its fsync.
    pub async fn mutate_soft<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = db.begin_write().map_err(db_err)?;
            w.set_durability(Durability::None).map_err(db_err)?;
            let v = f(&w)?;
            w.commit().map_err(db_err)?;
            Ok(v)
        })
        .await
        .map_err(|e| Error::internal(format!("metadata write: {e}")))?
    }

    /// [`Store::mutate_soft`] for a caller already on a blocking thread (the indexer).
    pub fn write_soft_blocking<T>(&self, f: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
        let mut w = self.db.begin_write().map_err(db_err)?;
        w.set_durability(Durability::None).map_err(db_err)?;
        let v = f(&w)?;
        w.commit().map_err(db_err)?;
        Ok(v)
    }

    pub fn read(&self) -> Result<redb::ReadTransaction> {
        self.db.begin_read().map_err(db_err)
    }
}

/// The counter holding the cluster id (random, never 0), made when the store is created.
pub const CLUSTER_ID: &str = "cluster_id";

/// Allocate the next value of a named counter (starting at `start`).
pub fn next_id(w: &WriteTransaction, name: &str, start: u64) -> Result<u64> {
    let mut t = w.open_table(COUNTERS).map_err(db_err)?;
    let cur = t.get(name).map_err(db_err)?.map(|v| v.value()).unwrap_or(start);
    t.insert(name, cur + 1).map_err(db_err)?;
    Ok(cur)
}

pub fn get_counter(t: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<u64> {
    Ok(t.get(name).map_err(db_err)?.map(|v| v.value()).unwrap_or(0))
}

pub fn get_inode(t: &impl ReadableTable<u64, &'static [u8]>, id: u64) -> Result<Option<pb::InodeRecord>> {
    match t.get(id).map_err(db_err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}

/// An entry read inside a write transaction (the table is closed again on return, so the
/// caller may write it back).
pub fn load_inode(w: &WriteTransaction, id: u64) -> Result<Option<pb::InodeRecord>> {
    get_inode(&w.open_table(INODES).map_err(db_err)?, id)
}

/// Writes `r` and returns the record it replaced. Only the namespace's commit path calls
/// it ([`crate::namespace::put_inode`]), which journals the change for search.
pub fn write_inode(w: &WriteTransaction, r: &pb::InodeRecord) -> Result<Option<pb::InodeRecord>> {
    let mut t = w.open_table(INODES).map_err(db_err)?;
    let old = t.insert(r.id, r.encode_to_vec().as_slice()).map_err(db_err)?;
    old.map(|v| decode(v.value())).transpose()
}

pub fn get_child(t: &impl ReadableTable<(u64, &'static str), u64>, parent: u64, name: &str) -> Result<Option<u64>> {
    Ok(t.get((parent, name)).map_err(db_err)?.map(|v| v.value()))
}

/// Inode id of a normalised path, walking `children` from the root.
pub fn lookup(t: &impl ReadableTable<(u64, &'static str), u64>, path: &str) -> Result<Option<u64>> {
    let mut id = ROOT_ID;
    for c in locus_common::path::components(path) {
        match get_child(t, id, c)? {
            Some(child) => id = child,
            None => return Ok(None),
        }
    }
    Ok(Some(id))
}

/// The second halves of the keys `(first, *)` of a pair-keyed table: the workers of a
/// block in `block_locations`, the blocks of a worker in `worker_blocks`.
pub fn second_keys<V: redb::Value + 'static>(t: &impl ReadableTable<(u64, u64), V>, first: u64) -> Result<Vec<u64>> {
    t.range((first, 0)..=(first, u64::MAX))
        .map_err(db_err)?
        .map(|e| e.map(|(k, _)| k.value().1).map_err(db_err))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tier of a block location is one typed byte; a store of an older build, whose
    /// locations named the tier, opens with that table dropped (workers report again).
    #[test]
    fn locations_store_the_tier_typed_and_old_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::create(dir.path().join("meta.redb")).unwrap();
            let w = db.begin_write().unwrap();
            w.open_table(OLD_LOCATIONS).unwrap().insert((1, 2), "SSD").unwrap();
            w.commit().unwrap();
        }
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let w = store.write().unwrap();
        assert!(!w.delete_table(OLD_LOCATIONS).unwrap(), "the old table is gone");
        {
            let mut t = w.open_table(LOCATIONS).unwrap();
            assert!(t.get((1, 2)).unwrap().is_none(), "nothing of the old table carried over");
            for (i, tier) in
                [pb::Tier::Mem, pb::Tier::Ssd, pb::Tier::Hdd, pb::Tier::Unspecified].into_iter().enumerate()
            {
                t.insert((9, i as u64), StoredTier::from(tier)).unwrap();
            }
            let back: Vec<Option<TierAlias>> =
                t.range((9, 0)..=(9, 9)).unwrap().map(|e| e.unwrap().1.value().0).collect();
            assert_eq!(back, [Some(TierAlias::Mem), Some(TierAlias::Ssd), Some(TierAlias::Hdd), None]);
        }
        w.commit().unwrap();
    }

    /// Records stored before the typed protocol (states and kinds as names in the old
    /// field numbers) read back typed.
    #[test]
    #[allow(deprecated)]
    fn records_stored_with_names_read_back_typed() {
        let old = pb::InodeRecord {
            id: 7,
            legacy_persist_state: "LOST".into(),
            legacy_lost_from: "TO_BE_PERSISTED".into(),
            ..Default::default()
        };
        let rec: pb::InodeRecord = decode(&old.encode_to_vec()).unwrap();
        assert_eq!(rec.persist_state(), pb::PersistState::Lost);
        assert_eq!(rec.lost_from(), pb::PersistState::ToBePersisted);
        assert!(rec.legacy_persist_state.is_empty());
        let old = pb::InodeRecord { id: 8, ..Default::default() };
        assert_eq!(
            decode::<pb::InodeRecord>(&old.encode_to_vec()).unwrap().persist_state(),
            pb::PersistState::Persisted
        );

        let op = pb::PersistOp { seq: 3, legacy_kind: "RENAME".into(), ..Default::default() };
        assert_eq!(decode::<pb::PersistOp>(&op.encode_to_vec()).unwrap().kind(), pb::PersistOpKind::Rename);
        let op = pb::PersistOp { seq: 4, legacy_kind: "META".into(), ..Default::default() };
        assert_eq!(decode::<pb::PersistOp>(&op.encode_to_vec()).unwrap().kind(), pb::PersistOpKind::Meta);

        let m = pb::MountInfo { id: 2, legacy_write_type: "MUST_CACHE".into(), ..Default::default() };
        assert_eq!(decode::<pb::MountInfo>(&m.encode_to_vec()).unwrap().write_type(), pb::WriteType::MustCache);
    }
}
