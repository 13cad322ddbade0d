//! The master's metadata in redb. Every table lives on disk; redb's page cache (sized by
//! `master.meta_cache_size`) bounds memory whatever the number of files.
//!
//! | table | key | value |
//! |---|---|---|
//! | `inodes` | inode id | `InodeRecord` (protobuf) |
//! | `children` | (parent id, name) | child id |
//! | `mounts` | mount id | `MountInfo` (protobuf) |
//! | `versions` | file version | inode id (finds the file of a block) |
//! | `locations` | (block id, worker id) | tier |
//! | `worker_blocks` | (worker id, block id) | () |
//! | `workers` | worker id | `WorkerAddress` (protobuf) |
//! | `pinned` | file version | () |
//! | `counters` | name | u64 (id allocators, pin epoch) |
//! | `persist_queue` | seq | `PersistOp` (protobuf): UFS changes still to make, in order |
//! | `pending_writes` | file version | creation time (ms) of a write not completed yet |
//! | `replicated` | file version | () for files with replication bounds (`setReplication`) |
//!
//! A file version is in `versions` from `CreateFile` on (mapped to inode 0 until the
//! write completes), so that workers may report its blocks while it is written.
//! `pinned` holds the versions whose blocks must not be evicted: files pinned by users,
//! and files whose bytes are not persisted yet.

use std::path::Path;

use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use prost::Message;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

pub const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
pub const CHILDREN: TableDefinition<(u64, &str), u64> = TableDefinition::new("children");
pub const MOUNTS: TableDefinition<u64, &[u8]> = TableDefinition::new("mounts");
pub const VERSIONS: TableDefinition<u64, u64> = TableDefinition::new("versions");
pub const LOCATIONS: TableDefinition<(u64, u64), &str> = TableDefinition::new("locations");
pub const WORKER_BLOCKS: TableDefinition<(u64, u64), ()> = TableDefinition::new("worker_blocks");
pub const WORKERS: TableDefinition<u64, &[u8]> = TableDefinition::new("workers");
pub const PINNED: TableDefinition<u64, ()> = TableDefinition::new("pinned");
pub const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
pub const PERSIST_QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("persist_queue");
pub const PENDING_WRITES: TableDefinition<u64, i64> = TableDefinition::new("pending_writes");
pub const REPLICATED: TableDefinition<u64, ()> = TableDefinition::new("replicated");

pub const ROOT_ID: u64 = 1;

pub fn db_err(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("metadata store: {e}"))
}

pub struct Store {
    db: Database,
}

/// Decode a stored protobuf record.
pub fn decode<M: Message + Default>(b: &[u8]) -> Result<M> {
    M::decode(b).map_err(|e| Error::new(ErrorKind::Corrupt, format!("metadata record: {e}")))
}

impl Store {
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(dir.join("meta.redb"))
            .map_err(|e| db_err(format!("open {}: {e}", dir.display())))?;
        let s = Store { db };
        let w = s.write()?;
        {
            // Create every table so that readers never meet a missing one.
            let mut inodes = w.open_table(INODES).map_err(db_err)?;
            w.open_table(CHILDREN).map_err(db_err)?;
            w.open_table(MOUNTS).map_err(db_err)?;
            w.open_table(VERSIONS).map_err(db_err)?;
            w.open_table(LOCATIONS).map_err(db_err)?;
            w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            w.open_table(WORKERS).map_err(db_err)?;
            w.open_table(PINNED).map_err(db_err)?;
            w.open_table(COUNTERS).map_err(db_err)?;
            w.open_table(PERSIST_QUEUE).map_err(db_err)?;
            w.open_table(PENDING_WRITES).map_err(db_err)?;
            w.open_table(REPLICATED).map_err(db_err)?;
            if inodes.get(ROOT_ID).map_err(db_err)?.is_none() {
                let root = pb::InodeRecord { id: ROOT_ID, is_dir: true, ..Default::default() };
                inodes.insert(ROOT_ID, root.encode_to_vec().as_slice()).map_err(db_err)?;
            }
        }
        w.commit().map_err(db_err)?;
        Ok(s)
    }

    /// A durable write transaction: committed changes survive a crash.
    pub fn write(&self) -> Result<WriteTransaction> {
        self.db.begin_write().map_err(db_err)
    }

    /// A write transaction for soft state (block locations): fast, made durable by the
    /// next durable commit, and rebuilt from block reports after a crash anyway.
    pub fn write_soft(&self) -> Result<WriteTransaction> {
        let mut w = self.db.begin_write().map_err(db_err)?;
        w.set_durability(Durability::None).map_err(db_err)?;
        Ok(w)
    }

    pub fn read(&self) -> Result<redb::ReadTransaction> {
        self.db.begin_read().map_err(db_err)
    }
}

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

pub fn put_inode(w: &WriteTransaction, r: &pb::InodeRecord) -> Result<()> {
    let mut t = w.open_table(INODES).map_err(db_err)?;
    t.insert(r.id, r.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(())
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
/// block in `locations`, the blocks of a worker in `worker_blocks`.
pub fn second_keys<V: redb::Value + 'static>(t: &impl ReadableTable<(u64, u64), V>, first: u64) -> Result<Vec<u64>> {
    t.range((first, 0)..=(first, u64::MAX))
        .map_err(db_err)?
        .map(|e| e.map(|(k, _)| k.value().1).map_err(db_err))
        .collect()
}
