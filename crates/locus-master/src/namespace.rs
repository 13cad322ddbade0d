//! The namespace records: the inode-table edits every change shares, and the one path by
//! which a change commits and then carries out its effects.

use locus_common::Result;
use locus_proto::pb;
use redb::{ReadableTable, WriteTransaction};

use crate::store::*;
use crate::*;

impl Master {
    pub(crate) fn block_count(len: u64, bs: u64) -> u64 {
        len.div_ceil(bs.max(1))
    }

    /// Insert a new entry; a file gets `version`, or a new one when `None`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_inode(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        is_dir: bool,
        length: u64,
        fingerprint: String,
        mtime_ms: i64,
        now: i64,
        version: Option<u64>,
    ) -> Result<pb::InodeRecord> {
        let id = next_id(w, "inode", ROOT_ID + 1)?;
        let version = match version {
            _ if is_dir => 0,
            Some(v) => v,
            None => next_id(w, "version", 1)?,
        };
        let rec = pb::InodeRecord {
            id,
            parent,
            name: name.into(),
            is_dir,
            length,
            block_size: if is_dir { 0 } else { self.inner.cfg.block_size.as_u64() },
            fingerprint,
            mtime_ms,
            pinned: false,
            version,
            synced_ms: now,
            children_loaded: false,
            meta: None,
            ..Default::default()
        };
        put_inode(w, &rec)?;
        w.open_table(CHILDREN).map_err(db_err)?.insert((parent, name), id).map_err(db_err)?;
        if !is_dir {
            w.open_table(VERSIONS).map_err(db_err)?.insert(version, id).map_err(db_err)?;
        }
        Ok(rec)
    }

    /// Forget every cached block of a file version; `dropped` collects (worker, block)
    /// pairs whose workers must delete the block.
    pub(crate) fn drop_version(
        &self,
        w: &WriteTransaction,
        rec: &pb::InodeRecord,
        dropped: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        if rec.is_dir {
            return Ok(());
        }
        let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
        let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
        for i in 0..Self::block_count(rec.length, rec.block_size) {
            let b = locus_common::block_id(rec.version, i);
            for wk in second_keys(&loc, b)? {
                loc.remove((b, wk)).map_err(db_err)?;
                wb.remove((wk, b)).map_err(db_err)?;
                dropped.push((wk, b));
            }
        }
        w.open_table(VERSIONS).map_err(db_err)?.remove(rec.version).map_err(db_err)?;
        w.open_table(REPLICATED).map_err(db_err)?.remove(rec.version).map_err(db_err)?;
        if w.open_table(PINNED).map_err(db_err)?.remove(rec.version).map_err(db_err)?.is_some() {
            self.bump_pin_epoch(w)?;
        }
        Ok(())
    }

    pub(crate) fn bump_pin_epoch(&self, w: &WriteTransaction) -> Result<()> {
        next_id(w, "pin_epoch", 1).map(|_| ())
    }

    /// Remove `name` under `parent` and everything below it from the namespace.
    pub(crate) fn remove_subtree(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        dropped: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let Some(id) = get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent, name)? else {
            return Ok(());
        };
        w.open_table(CHILDREN).map_err(db_err)?.remove((parent, name)).map_err(db_err)?;
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let rec = get_inode(&w.open_table(INODES).map_err(db_err)?, id)?;
            if let Some(rec) = rec {
                if rec.is_dir {
                    let mut ch = w.open_table(CHILDREN).map_err(db_err)?;
                    let kids: Vec<(String, u64)> = ch
                        .range((id, "")..(id + 1, ""))
                        .map_err(db_err)?
                        .map(|e| e.map(|(k, v)| (k.value().1.to_string(), v.value())))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(db_err)?;
                    for (n, c) in kids {
                        ch.remove((id, n.as_str())).map_err(db_err)?;
                        stack.push(c);
                    }
                } else {
                    self.drop_version(w, &rec, dropped)?;
                }
                w.open_table(INODES).map_err(db_err)?.remove(id).map_err(db_err)?;
            }
        }
        Ok(())
    }

    /// Tell workers (through their next heartbeat) to delete these blocks.
    pub(crate) fn queue_removals(&self, dropped: Vec<(u64, u64)>) {
        if dropped.is_empty() {
            return;
        }
        let mut ws = self.inner.workers.lock();
        for (wk, b) in dropped {
            if let Some(s) = ws.get_mut(&wk) {
                s.pending_remove.push(b);
            }
        }
    }

    pub(crate) fn read_inode_by_path(&self, path: &str) -> Result<Option<pb::InodeRecord>> {
        let r = self.inner.store.read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let Some(id) = lookup(&ch, path)? else {
            return Ok(None);
        };
        get_inode(&r.open_table(INODES).map_err(db_err)?, id)
    }
}
