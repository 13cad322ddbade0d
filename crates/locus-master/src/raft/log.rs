//! The replicated log, in `raft.redb` beside `meta.redb`: its fsyncs never wait on the
//! namespace's writer (docs/design/ha-plan.md, section 1). Every redb call runs on a
//! blocking thread.
//!
//! | table | key | value |
//! |---|---|---|
//! | `raft_log` | index | `RaftEntry` (protobuf) |
//! | `raft_meta` | `vote`, `committed`, `purged` | `RaftVote`, `RaftLogId`, `RaftLogId` |

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use locus_common::{Error, Result};
use locus_proto::pb;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError};
use prost::Message;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::*;
use crate::store::db_err;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// The log store; clones share the database (the log reader is one).
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// Opens (or makes) `dir/raft.redb`, readable by this user only.
    pub(crate) fn open(dir: &Path) -> Result<LogStore> {
        use std::os::unix::fs::PermissionsExt;
        locus_common::security::create_private_dir(dir)?;
        let file = dir.join("raft.redb");
        let db = Database::create(&file).map_err(|e| db_err(format!("open {}: {e}", file.display())))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 600 {}", file.display()), e))?;
        let w = db.begin_write().map_err(db_err)?;
        w.open_table(LOG).map_err(db_err)?;
        w.open_table(META).map_err(db_err)?;
        w.commit().map_err(db_err)?;
        Ok(LogStore { db: Arc::new(db) })
    }

    /// Runs `f` on a blocking thread.
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Database) -> Result<T> + Send + 'static) -> Result<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(|e| Error::internal(format!("raft log task: {e}")))?
    }

    /// Drops the entries in `drop`, writes `rows` (by index), and sets (or with `None`
    /// removes) `meta`, in one transaction committed with `durability`.
    async fn write(
        &self,
        rows: Vec<(u64, Vec<u8>)>,
        drop: Option<(Bound<u64>, Bound<u64>)>,
        meta: Option<(&'static str, Option<Vec<u8>>)>,
        durability: Durability,
    ) -> Result<()> {
        self.blocking(move |db| {
            let mut w = db.begin_write().map_err(db_err)?;
            w.set_durability(durability).map_err(db_err)?;
            {
                let mut log = w.open_table(LOG).map_err(db_err)?;
                if let Some(drop) = drop {
                    log.retain_in::<u64, _>(drop, |_, _| false).map_err(db_err)?;
                }
                for (i, v) in &rows {
                    log.insert(*i, v.as_slice()).map_err(db_err)?;
                }
                let mut t = w.open_table(META).map_err(db_err)?;
                match &meta {
                    Some((k, Some(v))) => {
                        t.insert(*k, v.as_slice()).map_err(db_err)?;
                    }
                    Some((k, None)) => {
                        t.remove(*k).map_err(db_err)?;
                    }
                    None => {}
                }
            }
            w.commit().map_err(db_err)
        })
        .await
    }

    async fn meta<M: Message + Default + 'static>(&self, key: &'static str) -> Result<Option<M>> {
        self.blocking(move |db| {
            let r = db.begin_read().map_err(db_err)?;
            let t = r.open_table(META).map_err(db_err)?;
            let Some(v) = t.get(key).map_err(db_err)? else { return Ok(None) };
            M::decode(v.value()).map(Some).map_err(|e| Error::internal(format!("raft log {key}: {e}")))
        })
        .await
    }
}

fn decode(v: &[u8]) -> Result<Entry> {
    let p = pb::RaftEntry::decode(v).map_err(|e| Error::internal(format!("raft log entry: {e}")))?;
    entry_from_pb(p)
}

impl RaftLogReader<Locus> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> std::result::Result<Vec<Entry>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        self.blocking(move |db| {
            let r = db.begin_read().map_err(db_err)?;
            let t = r.open_table(LOG).map_err(db_err)?;
            let mut out = Vec::new();
            for e in t.range::<u64>(bounds).map_err(db_err)? {
                let (_, v) = e.map_err(db_err)?;
                out.push(decode(v.value())?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| storage_err(StorageIOError::read_logs, e))
    }
}

impl RaftLogStorage<Locus> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> std::result::Result<LogState<Locus>, StorageError> {
        let purged = self.meta::<pb::RaftLogId>("purged").await;
        let last = self
            .blocking(|db| {
                let r = db.begin_read().map_err(db_err)?;
                let t = r.open_table(LOG).map_err(db_err)?;
                let last = t.last().map_err(db_err)?;
                last.map(|(_, v)| decode(v.value()).map(|e| e.log_id)).transpose()
            })
            .await;
        let err = |e| storage_err(StorageIOError::read_logs, e);
        let purged = purged.map_err(err)?.as_ref().map(log_id_from_pb);
        let last = last.map_err(err)?;
        Ok(LogState { last_purged_log_id: purged, last_log_id: last.or(purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> std::result::Result<(), StorageError> {
        let v = vote_to_pb(vote).encode_to_vec();
        self.write(vec![], None, Some(("vote", Some(v))), Durability::Immediate)
            .await
            .map_err(|e| storage_err(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> std::result::Result<Option<Vote>, StorageError> {
        let v = self.meta::<pb::RaftVote>("vote").await.map_err(|e| storage_err(StorageIOError::read_vote, e))?;
        Ok(v.as_ref().map(vote_from_pb))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> std::result::Result<(), StorageError> {
        // Not fsynced: openraft only needs it to apply sooner after a restart, and the
        // next append's commit makes it durable.
        let c = committed.as_ref().map(|c| log_id_to_pb(c).encode_to_vec());
        self.write(vec![], None, Some(("committed", c)), Durability::None)
            .await
            .map_err(|e| storage_err(StorageIOError::write_logs, e))
    }

    async fn read_committed(&mut self) -> std::result::Result<Option<LogId>, StorageError> {
        let c = self.meta::<pb::RaftLogId>("committed").await.map_err(|e| storage_err(StorageIOError::read_logs, e))?;
        Ok(c.as_ref().map(log_id_from_pb))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<Locus>) -> std::result::Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let rows = entries.into_iter().map(|e| (e.log_id.index, entry_to_pb(&e).encode_to_vec())).collect();
        match self.write(rows, None, None, Durability::Immediate).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(storage_err(StorageIOError::write_logs, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> std::result::Result<(), StorageError> {
        let drop = (Bound::Included(log_id.index), Bound::Unbounded);
        self.write(vec![], Some(drop), None, Durability::Immediate)
            .await
            .map_err(|e| storage_err(StorageIOError::write_logs, e))
    }

    async fn purge(&mut self, log_id: LogId) -> std::result::Result<(), StorageError> {
        let p = log_id_to_pb(&log_id).encode_to_vec();
        let drop = (Bound::Unbounded, Bound::Included(log_id.index));
        self.write(vec![], Some(drop), Some(("purged", Some(p))), Durability::Immediate)
            .await
            .map_err(|e| storage_err(StorageIOError::write_logs, e))
    }
}
