//! The state machine: the namespace in `meta.redb`. The log's entries change it through
//! [`Namespace::apply`], with the id of the last entry applied and the membership in
//! table `raft_state` of the same transaction; and its snapshots, one file each in the
//! snapshot directory: a [`pb::SnapshotHeader`], then every row of the replicated tables
//! ([`crate::store::replicated_tables`]) as a [`pb::SnapshotRecord`], each
//! length-delimited.
//!
//! Not yet: the search index's files in the snapshot, and a snapshot read as a stream
//! rather than whole into memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use parking_lot::Mutex;
use prost::Message;
use redb::{Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use super::*;
use crate::namespace::{Effects, Namespace};
use crate::store::{Tables, db_err, replicated_tables, run_group};

const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
const APPLIED: &str = "applied";
const MEMBERSHIP: &str = "membership";

/// What applying one entry gave: each of its commands' result and effects (for the
/// leader to carry out), or its error.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub results: Vec<Result<(pb::CommandResult, Effects)>>,
}

/// A snapshot's rows, by table: (key, value) as redb stores them.
type Rows = HashMap<String, Vec<(Vec<u8>, Vec<u8>)>>;

/// The current snapshot: its meta and its file.
type Current = Arc<Mutex<Option<(SnapshotMeta, PathBuf)>>>;

pub(crate) struct StateMachine {
    ns: Arc<Namespace>,
    dir: PathBuf,
    current: Current,
    /// Set by each apply: something applied is not on disk yet ([`flush`]).
    dirty: Arc<AtomicBool>,
}

pub(crate) struct SnapshotBuilder {
    ns: Arc<Namespace>,
    dir: PathBuf,
    current: Current,
}

impl StateMachine {
    /// The state machine over `ns`, its snapshots in `dir` (made if missing; a
    /// snapshot half received is dropped).
    pub(crate) fn open(ns: Arc<Namespace>, dir: PathBuf) -> Result<StateMachine> {
        locus_common::security::create_private_dir(&dir)?;
        let w = ns.store().db().begin_write().map_err(db_err)?;
        w.open_table(STATE).map_err(db_err)?;
        w.commit().map_err(db_err)?;
        let mut best: Option<(SnapshotMeta, PathBuf)> = None;
        for e in std::fs::read_dir(&dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))? {
            let p = e.map_err(|e| Error::io(format!("list {}", dir.display()), e))?.path();
            if p.extension().is_some_and(|x| x == "snap") {
                // A snapshot is derived from the namespace and the log: one that cannot be
                // read is dropped (a new one is made when needed), never a reason not to start.
                let meta = match read_meta(&p) {
                    Ok(meta) => meta,
                    Err(e) => {
                        tracing::warn!(file = %p.display(), error = %e, "dropping an unreadable raft snapshot");
                        let _ = std::fs::remove_file(&p);
                        continue;
                    }
                };
                if best.as_ref().is_none_or(|(b, _)| b.last_log_id < meta.last_log_id) {
                    best = Some((meta, p));
                }
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
        Ok(StateMachine { ns, dir, current: Arc::new(Mutex::new(best)), dirty: Arc::default() })
    }

    /// Whether entries were applied and not flushed since (shared: the group's flusher
    /// clears it).
    pub(crate) fn dirty(&self) -> Arc<AtomicBool> {
        self.dirty.clone()
    }

    /// The namespace it applies entries to.
    #[cfg(test)]
    pub(crate) fn namespace(&self) -> &Namespace {
        &self.ns
    }
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::internal(format!("raft state machine task: {e}")))?
}

/// The id of the last entry applied and the membership, as of `r`.
fn applied_state(r: &ReadTransaction) -> Result<(Option<LogId>, StoredMembership)> {
    let t = r.open_table(STATE).map_err(db_err)?;
    let get = |k| -> Result<Option<Vec<u8>>> { Ok(t.get(k).map_err(db_err)?.map(|v| v.value().to_vec())) };
    let bad = |e: prost::DecodeError| Error::new(ErrorKind::Corrupt, format!("raft state: {e}"));
    let applied = get(APPLIED)?.map(|v| pb::RaftLogId::decode(v.as_slice())).transpose().map_err(bad)?;
    let m = get(MEMBERSHIP)?.map(|v| pb::RaftStoredMembership::decode(v.as_slice())).transpose().map_err(bad)?;
    Ok((applied.as_ref().map(log_id_from_pb), m.as_ref().map(stored_membership_from_pb).unwrap_or_default()))
}

/// Records the last entry applied (and, when one of them changed it, the membership).
fn set_applied(w: &WriteTransaction, last: Option<&LogId>, m: Option<&StoredMembership>) -> Result<()> {
    let mut t = w.open_table(STATE).map_err(db_err)?;
    if let Some(last) = last {
        t.insert(APPLIED, log_id_to_pb(last).encode_to_vec().as_slice()).map_err(db_err)?;
    }
    if let Some(m) = m {
        t.insert(MEMBERSHIP, stored_membership_to_pb(m).encode_to_vec().as_slice()).map_err(db_err)?;
    }
    Ok(())
}

/// Makes every change applied so far durable. Entries are applied without an fsync
/// (the log's own is what makes a change durable: after a crash, openraft applies again
/// the entries after the last applied id on disk); this runs each second, before a
/// snapshot is read (so that no entry a snapshot holds, and the log may purge, is lost
/// from the namespace), and when the member stops.
pub(crate) fn flush(ns: &Namespace) -> Result<()> {
    let mut w = ns.store().db().begin_write().map_err(db_err)?;
    w.set_durability(Durability::Immediate).map_err(db_err)?;
    w.commit().map_err(db_err)
}

/// Applies `entries` in one transaction: one [`Applied`] each.
fn apply_entries(ns: &Namespace, entries: &[Entry]) -> Result<Vec<Applied>> {
    let cmds: Vec<(usize, &pb::Command)> = entries
        .iter()
        .enumerate()
        .flat_map(|(i, e)| match &e.payload {
            EntryPayload::Normal(b) => b.cmds.iter().map(|c| (i, c)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let membership = entries.iter().rev().find_map(|e| match &e.payload {
        EntryPayload::Membership(m) => Some(StoredMembership::new(Some(e.log_id), m.clone())),
        _ => None,
    });
    let last = entries.last().map(|e| e.log_id);
    let results = run_group(
        &ns.store().db(),
        cmds.len(),
        Durability::None,
        |w, k| {
            let mut fx = Effects::default();
            ns.apply(w, cmds[k].1, &mut fx).map(|r| (r, fx))
        },
        |w| set_applied(w, last.as_ref(), membership.as_ref()),
    )?;
    let mut out: Vec<Applied> = entries.iter().map(|_| Applied::default()).collect();
    for ((i, _), r) in cmds.iter().zip(results) {
        out[*i].results.push(r);
    }
    Ok(out)
}

/// Writes each row of the replicated tables of `r` to `out`.
struct Dump<'a> {
    r: &'a ReadTransaction,
    out: &'a mut Vec<u8>,
}

impl Tables for Dump<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        t: TableDefinition<'static, K, V>,
    ) -> Result<()> {
        use redb::TableHandle;
        let name = t.name().to_string();
        for e in self.r.open_table(t).map_err(db_err)?.iter().map_err(db_err)? {
            let (k, v) = e.map_err(db_err)?;
            let rec = pb::SnapshotRecord {
                table: name.clone(),
                key: K::as_bytes(&k.value()).as_ref().to_vec(),
                value: V::as_bytes(&v.value()).as_ref().to_vec(),
            };
            rec.encode_length_delimited(self.out).map_err(|e| Error::internal(format!("snapshot row: {e}")))?;
        }
        Ok(())
    }
}

/// Replaces the replicated tables in `w` with a snapshot's rows (by table).
struct Load<'a> {
    w: &'a WriteTransaction,
    rows: Rows,
}

impl Tables for Load<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        t: TableDefinition<'static, K, V>,
    ) -> Result<()> {
        use redb::TableHandle;
        let rows = self.rows.remove(t.name()).unwrap_or_default();
        let mut table = self.w.open_table(t).map_err(db_err)?;
        table.retain(|_, _| false).map_err(db_err)?;
        for (k, v) in &rows {
            table.insert(K::from_bytes(k), V::from_bytes(v)).map_err(db_err)?;
        }
        Ok(())
    }
}

/// A snapshot file's meta and rows (by table).
type SnapshotRows = (SnapshotMeta, Rows);

fn parse_snapshot(bytes: &[u8], what: &str) -> Result<SnapshotRows> {
    let bad = |e: prost::DecodeError| Error::new(ErrorKind::Corrupt, format!("snapshot {what}: {e}"));
    let mut buf = bytes;
    let meta = snapshot_meta_from_pb(pb::SnapshotHeader::decode_length_delimited(&mut buf).map_err(bad)?);
    let mut rows = Rows::new();
    while !buf.is_empty() {
        let r = pb::SnapshotRecord::decode_length_delimited(&mut buf).map_err(bad)?;
        rows.entry(r.table).or_default().push((r.key, r.value));
    }
    Ok((meta, rows))
}

/// The meta of snapshot file `p`, from its header alone (the rows may be large).
fn read_meta(p: &Path) -> Result<SnapshotMeta> {
    use std::io::Read;
    let io = |e| Error::io(format!("read {}", p.display()), e);
    let bad = |e: prost::DecodeError| Error::new(ErrorKind::Corrupt, format!("snapshot {}: {e}", p.display()));
    let mut f = std::fs::File::open(p).map_err(io)?;
    // The header's length is a varint of at most 10 bytes.
    let mut start = Vec::with_capacity(10);
    (&mut f).take(10).read_to_end(&mut start).map_err(io)?;
    let len = prost::decode_length_delimiter(start.as_slice()).map_err(bad)?;
    let mut header = start.split_off(prost::length_delimiter_len(len));
    let rest = len.saturating_sub(header.len());
    header.truncate(len);
    f.take(rest as u64).read_to_end(&mut header).map_err(io)?;
    Ok(snapshot_meta_from_pb(pb::SnapshotHeader::decode(header.as_slice()).map_err(bad)?))
}

/// Writes `bytes`, the snapshot `meta` describes, as a file of `dir` (whole, or not at
/// all; named here, never by the sender's id), makes it the current snapshot unless a
/// newer one is, and removes every other snapshot file, and snapshots half received.
/// Returns the file open for reading (it stays readable if a newer one replaces it).
fn keep_snapshot(dir: &Path, current: &Current, meta: &SnapshotMeta, bytes: &[u8]) -> Result<std::fs::File> {
    use std::io::Write;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (term, index) = meta.last_log_id.map_or((0, 0), |l| (l.leader_id.term, l.index));
    let name = format!("{term}-{index}-{}", stamp.as_nanos());
    let (path, tmp) = (dir.join(format!("{name}.snap")), dir.join(format!("{name}.tmp")));
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(format!("rename {}", tmp.display()), e))?;
    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    let read = std::fs::File::open(&path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let mut cur = current.lock();
    if cur.as_ref().is_none_or(|(m, _)| m.last_log_id <= meta.last_log_id) {
        *cur = Some((meta.clone(), path));
    }
    let keep = cur.as_ref().map(|(_, p)| p.clone());
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?.flatten() {
        let p = e.path();
        let old = p.extension().is_some_and(|x| x == "snap" || x == "part") && Some(&p) != keep.as_ref();
        if old {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(read)
}

async fn open_snapshot(meta: SnapshotMeta, path: &Path) -> Result<Snapshot<Locus>> {
    let f = tokio::fs::File::open(path).await.map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    Ok(Snapshot { meta, snapshot: Box::new(f) })
}

impl RaftSnapshotBuilder<Locus> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> std::result::Result<Snapshot<Locus>, StorageError> {
        let (ns, dir, current) = (self.ns.clone(), self.dir.clone(), self.current.clone());
        let built = blocking(move || {
            // Read, then flush: what the read sees is durable before the log may purge it
            // (entries applied meanwhile are not in this snapshot).
            let r = ns.read()?;
            flush(&ns)?;
            let (last, membership) = applied_state(&r)?;
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let id = match &last {
                Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, stamp.as_nanos()),
                None => format!("0-0-{}", stamp.as_nanos()),
            };
            let meta = SnapshotMeta { last_log_id: last, last_membership: membership, snapshot_id: id };
            let mut out = snapshot_meta_to_pb(&meta).encode_length_delimited_to_vec();
            replicated_tables(&mut Dump { r: &r, out: &mut out })?;
            let f = keep_snapshot(&dir, &current, &meta, &out)?;
            Ok((meta, f))
        })
        .await;
        let (meta, f) = built.map_err(|e| storage_err(|e| StorageIOError::write_snapshot(None, e), e))?;
        Ok(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(f)) })
    }
}

impl RaftStateMachine<Locus> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> std::result::Result<(Option<LogId>, StoredMembership), StorageError> {
        let ns = self.ns.clone();
        blocking(move || applied_state(&ns.read()?))
            .await
            .map_err(|e| storage_err(StorageIOError::read_state_machine, e))
    }

    async fn apply<I>(&mut self, entries: I) -> std::result::Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let ns = self.ns.clone();
        let applied = blocking(move || apply_entries(&ns, &entries)).await;
        // (Set once committed: a flush that ran before the commit leaves it to the next.)
        self.dirty.store(true, Ordering::Release);
        applied.map_err(|e| storage_err(StorageIOError::write_state_machine, e))
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { ns: self.ns.clone(), dir: self.dir.clone(), current: self.current.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> std::result::Result<Box<tokio::fs::File>, StorageError> {
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let p = self.dir.join(format!("{}.part", stamp.as_nanos()));
        let f = tokio::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&p).await;
        let f = f.map_err(|e| {
            storage_err(|e| StorageIOError::write_snapshot(None, e), Error::io("receive a snapshot", e))
        })?;
        Ok(Box::new(f))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        mut snapshot: Box<tokio::fs::File>,
    ) -> std::result::Result<(), StorageError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let err = |e| storage_err(|e| StorageIOError::write_snapshot(None, e), e);
        let mut bytes = Vec::new();
        let read = async {
            snapshot.seek(std::io::SeekFrom::Start(0)).await?;
            snapshot.read_to_end(&mut bytes).await
        };
        read.await.map_err(|e| err(Error::io("read a received snapshot", e)))?;
        let (ns, dir, current, meta) = (self.ns.clone(), self.dir.clone(), self.current.clone(), meta.clone());
        blocking(move || {
            let (_, rows) = parse_snapshot(&bytes, &meta.snapshot_id)?;
            let mut w = ns.store().db().begin_write().map_err(db_err)?;
            w.set_durability(Durability::Immediate).map_err(db_err)?;
            replicated_tables(&mut Load { w: &w, rows })?;
            set_applied(&w, meta.last_log_id.as_ref(), Some(&meta.last_membership))?;
            if meta.last_log_id.is_none() {
                w.open_table(STATE).map_err(db_err)?.remove(APPLIED).map_err(db_err)?;
            }
            w.commit().map_err(db_err)?;
            ns.store().reload_cluster_id()?;
            keep_snapshot(&dir, &current, &meta, &bytes).map(drop)
        })
        .await
        .map_err(err)
    }

    async fn get_current_snapshot(&mut self) -> std::result::Result<Option<Snapshot<Locus>>, StorageError> {
        // A newer snapshot may replace the file between the look and the open: look again.
        let mut tries = 0;
        loop {
            let Some((meta, path)) = self.current.lock().clone() else { return Ok(None) };
            match open_snapshot(meta, &path).await {
                Ok(s) => return Ok(Some(s)),
                Err(e) if e.kind() == ErrorKind::NotFound && tries < 3 => tries += 1,
                Err(e) => return Err(storage_err(|e| StorageIOError::read_snapshot(None, e), e)),
            }
        }
    }
}
