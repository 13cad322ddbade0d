//! Files and blocks: creating and completing writes, persist, pins, replication bounds,
//! object metadata, freeing cached copies, and the `FileInfo` and block locations clients get.

use locus_common::config::WriteType;
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};

use crate::apply::written;
use crate::store::*;
use crate::*;

impl Master {
    /// The status of `rec` at `path`, without its blocks (see [`Master::get_status`]).
    pub(crate) fn file_info(&self, path: &str, rec: &pb::InodeRecord) -> Result<pb::FileInfo> {
        let (m, rel) = self.mount_for(path)?;
        Ok(pb::FileInfo {
            id: rec.id,
            path: path.to_string(),
            name: rec.name.clone(),
            is_dir: rec.is_dir,
            length: rec.length,
            block_size: rec.block_size,
            fingerprint: rec.fingerprint.clone(),
            mtime_ms: rec.mtime_ms,
            pinned: rec.pinned,
            version: rec.version,
            mount_id: m.info.id,
            ufs_path: rel,
            blocks: Vec::new(),
            mount_point: m.info.path.clone(),
            meta: rec.meta.clone(),
            persist_state: rec.persist_state,
            replication_min: if rec.replication_min == 0 {
                self.inner.cfg.replication_min
            } else {
                rec.replication_min
            },
            replication_max: rec.replication_max,
            ..Default::default()
        })
    }

    /// The blocks of a file with their live locations, as of `r`, the snapshot `rec` was
    /// read in. (Locations read in a later one may be gone with the version: an overwrite
    /// or a delete committed in between drops them, while the worker still keeps the
    /// blocks, retired, for the readers under way.)
    pub(crate) fn block_infos(&self, r: &redb::ReadTransaction, rec: &pb::InodeRecord) -> Result<Vec<pb::BlockInfo>> {
        let live = self.live_workers();
        let loc = r.open_table(LOCATIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for i in 0..crate::namespace::block_count(rec.length, rec.block_size) {
            let b = locus_common::block_id(rec.version, i);
            let offset = i * rec.block_size;
            let mut locations = Vec::new();
            for e in loc.range((b, 0)..=(b, u64::MAX)).map_err(db_err)? {
                let (k, v) = e.map_err(db_err)?;
                let wk = k.value().1;
                if live.contains_key(&wk) {
                    let tier = v.value().0.map_or(pb::Tier::Unspecified, pb::Tier::from);
                    locations.push(pb::BlockLocation { worker_id: wk, tier: tier.into() });
                }
            }
            out.push(pb::BlockInfo {
                block_id: b,
                offset,
                length: rec.block_size.min(rec.length - offset),
                locations,
                ticket: Vec::new(),
            });
        }
        Ok(out)
    }

    /// Check that `path` may be written and open a write: returns where its bytes go,
    /// the write type that applies (the request's, else the mount's, else the cluster
    /// default), and the new file version whose blocks the write creates.
    /// With `complete_empty`, the file is created empty and complete in one step (one
    /// durable change; THROUGH types write the empty object first). For call `id`.
    pub(crate) async fn create_file(
        &self,
        path: &str,
        overwrite: bool,
        write_type: Option<WriteType>,
        complete_empty: bool,
        id: &CallId,
    ) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        if path == "/" {
            return Err(Error::invalid("cannot write to /"));
        }
        let first = |first| {
            let (m, rel) = self.writable(&path)?;
            let wt = write_type.or(m.info.write_type().typed()).unwrap_or(self.inner.cfg.write_type);
            match complete_empty {
                true => self.file_info(&path, &written(first)?),
                false => Ok(self.opened(path.clone(), m, rel, wt, first)),
            }
        };
        self.once(id, first, self.create_file_now(&path, overwrite, write_type, complete_empty, id)).await
    }

    async fn create_file_now(
        &self,
        path: &str,
        overwrite: bool,
        write_type: Option<WriteType>,
        complete_empty: bool,
        id: &CallId,
    ) -> Result<pb::FileInfo> {
        let path = path.to_string();
        // A name the UFS cannot hold as it is is refused now, not by a persist later.
        let (m, rel) = self.mount_for(&path)?;
        m.ufs.check_name(&rel, false)?;
        if let Some(rec) = self.resolve_with(&path, true).await? {
            if rec.is_dir {
                return Err(Error::new(ErrorKind::IsADirectory, format!("{path} is a directory")));
            }
            if !overwrite {
                return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} exists")));
            }
        }
        let (parent_path, _) = lpath::parent_and_name(&path)?;
        self.ensure_parent(parent_path).await?;
        let (m, rel) = self.writable(&path)?;
        let wt = write_type.or(m.info.write_type().typed()).unwrap_or(self.inner.cfg.write_type);
        if wt.writes_ufs() {
            // A synchronous UFS write must not race queued changes to the same path.
            self.wait_ufs_quiet(m.info.id, &rel).await?;
        }
        if complete_empty {
            let mut req = pb::CompleteFileRequest {
                path: path.clone(),
                write_type: pb::WriteType::from(wt).into(),
                ..Default::default()
            };
            if wt.writes_ufs() {
                let st = m.ufs.writer(&rel, "", &Default::default()).await?.close().await?;
                req.etag = st.etag;
                req.mtime_ms = st.mtime_ms;
            }
            // (Under a parent made again if a concurrent delete took it, as any write.)
            return self.complete_file(req, id).await;
        }
        // Pinned from the start when the write's copies are its only ones.
        let open = pb::OpenWrite { pin: wt.needs_durable_copies() };
        let r = self.propose_call(id, Op::OpenWrite(open)).await?;
        Ok(self.opened(path, m, rel, wt, r))
    }

    /// What a write opened by `r` (an `OpenWrite`'s result) at `path` is told.
    fn opened(&self, path: String, m: MountEntry, rel: String, wt: WriteType, r: pb::CommandResult) -> pb::FileInfo {
        pb::FileInfo {
            path,
            mount_id: m.info.id,
            // The worker takes the write only with it: this mount (writable), this path.
            write_grant: self.inner.verifier.grant(m.info.id, &rel, r.id),
            ufs_path: rel,
            block_size: self.ns().block_size(),
            mount_point: m.info.path.clone(),
            version: r.id,
            write_type: pb::WriteType::from(wt).into(),
            pin_epoch: r.pin_epoch,
            ..Default::default()
        }
    }

    /// Record a written file: its bytes are in the UFS (THROUGH, CACHE_THROUGH), or in
    /// worker caches (MUST_CACHE), or both until the persist queued here lands
    /// (ASYNC_THROUGH). Replaces an older version of the file.
    ///
    /// The parent directory may have gone while the bytes streamed (the S3 gateway
    /// removes a directory its deletes leave empty, and a write not yet complete does not
    /// count): it is made again, as the write's create made it. For call `id`.
    pub(crate) async fn complete_file(&self, req: pb::CompleteFileRequest, id: &CallId) -> Result<pb::FileInfo> {
        let path = normalize(&req.path)?;
        let copies =
            |fi: pb::FileInfo| pb::FileInfo { copies_wanted: req.copies_wanted, copies_made: req.copies_made, ..fi };
        let first = |first| self.file_info(&path, &written(first)?);
        self.once(id, first, self.complete_file_now(&req, &path, id)).await.map(copies)
    }

    async fn complete_file_now(&self, req: &pb::CompleteFileRequest, path: &str, id: &CallId) -> Result<pb::FileInfo> {
        let (req, path) = (req.clone(), path.to_string());
        let (parent_path, _) = lpath::split_parent(&path).ok_or_else(|| Error::invalid("bad path"))?;
        let (m, rel) = self.writable(&path)?;
        let wt = req.write_type().typed().unwrap_or(WriteType::Through);
        let (wanted, made) = (req.copies_wanted, req.copies_made);
        if made < wanted {
            self.inner.metrics.writes_short.inc();
            tracing::warn!(path = %path, copies_made = made, copies_wanted = wanted, "a write was acknowledged with fewer worker copies than it asked for");
        }
        let mut tries = 0;
        loop {
            // The parent (or an ancestor) may go again between any two of these steps.
            let r = match self.ensure_parent(parent_path).await {
                Ok(_) => match self.must_resolve(parent_path).await {
                    Ok(parent) => {
                        let (req, path, m, rel) = (req.clone(), path.clone(), m.clone(), rel.clone());
                        self.commit_complete(req, path, parent.id, wt, m, rel, id).await
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match r {
                Err(e) if e.kind() == ErrorKind::NotFound && tries < 10 => tries += 1,
                r => return r,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn commit_complete(
        &self,
        mut req: pb::CompleteFileRequest,
        path: String,
        parent_id: u64,
        wt: WriteType,
        m: MountEntry,
        rel: String,
        id: &CallId,
    ) -> Result<pb::FileInfo> {
        let name = lpath::split_parent(&path).map(|(_, n)| n.to_string()).unwrap_or_default();
        req.write_type = pb::WriteType::from(wt).into();
        // The writer's wait, else the staging wait of a committer's `_temporary` file.
        if req.persist_wait_ms == 0 && wt == WriteType::AsyncThrough && lpath::is_staged(&path) {
            req.persist_wait_ms = self.inner.cfg.staged_persist_wait.as_millis() as u64;
        }
        let c = pb::CompleteFile {
            req: Some(req),
            path: path.clone(),
            parent_id,
            name,
            mount_id: m.info.id,
            ufs_path: rel.clone(),
            block_size: self.ns().block_size(),
        };
        let rec = self.propose_call(id, Op::CompleteFile(c)).await.and_then(written)?;
        if matches!(wt, WriteType::Through | WriteType::CacheThrough) {
            self.settle_markers(&m, &rel).await;
        }
        self.file_info(&path, &rec)
    }

    /// Queue the persist of a file written MUST_CACHE (a no-op for one persisted or
    /// queued already).
    pub async fn persist(&self, path: &str) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        if rec.is_dir {
            return Err(Error::invalid(format!("{path} is a directory")));
        }
        let (m, rel) = self.writable(&path)?;
        match rec.persist_state() {
            pb::PersistState::NotPersisted => {}
            pb::PersistState::Lost => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{path} was lost: every copy of a block went before it was persisted"),
                ));
            }
            _ => return self.file_info(&path, &rec),
        }
        let c = pb::QueuePersist { inode_id: rec.id, path: path.clone(), mount_id: m.info.id, ufs_path: rel };
        let rec = self.propose(Op::QueuePersist(c)).await.and_then(written)?;
        self.file_info(&path, &rec)
    }

    /// Set the replication bounds of files at or below `path`. Returns the files changed.
    pub async fn set_replication(&self, path: &str, min: u32, max: u32, recursive: bool) -> Result<u64> {
        if max != 0 && min > max {
            return Err(Error::invalid(format!("replication min {min} exceeds max {max}")));
        }
        let path = normalize(path)?;
        let ids = self.file_ids(&path, recursive).await?;
        let n = ids.len() as u64;
        self.propose(Op::SetReplication(pb::SetReplication { inode_ids: ids, min, max })).await?;
        Ok(n)
    }

    /// Replace the object metadata of a file or directory (or only its tags).
    pub async fn set_object_meta(&self, path: &str, meta: pb::ObjectMeta, tags_only: bool) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        let (m, rel) = self.writable(&path)?;
        let c = pb::SetObjectMeta {
            inode_id: rec.id,
            meta: Some(meta),
            tags_only,
            stores_metadata: m.ufs.stores_metadata(),
            path: path.clone(),
            mount_id: m.info.id,
            ufs_path: rel,
        };
        let rec = self.propose(Op::SetObjectMeta(c)).await.and_then(written)?;
        self.file_info(&path, &rec)
    }

    /// The inode ids of the files at or below `path`.
    pub(crate) async fn file_ids(&self, path: &str, recursive: bool) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        self.for_each_file(path, recursive, &mut |r| {
            ids.push(r.id);
            Ok(())
        })
        .await?;
        Ok(ids)
    }

    /// Files at or below `path` (one level at a time, page by page).
    pub(crate) async fn for_each_file(
        &self,
        path: &str,
        recursive: bool,
        f: &mut impl FnMut(&pb::InodeRecord) -> Result<()>,
    ) -> Result<u64> {
        let rec = self.must_resolve(path).await?;
        if !rec.is_dir {
            f(&rec)?;
            return Ok(1);
        }
        if !recursive {
            return Err(Error::invalid(format!("{path} is a directory (use -R)")));
        }
        let mut n = 0;
        let mut dirs = vec![path.to_string()];
        while let Some(d) = dirs.pop() {
            let mut after = String::new();
            loop {
                let (page, more) = self.list_status(&d, &after, false, DEFAULT_LIST_PAGE).await?;
                for e in &page {
                    if e.is_dir {
                        dirs.push(e.path.clone());
                    } else if let Some(r) = self.ns().inode_by_path(&e.path)? {
                        f(&r)?;
                        n += 1;
                    }
                }
                match (more, page.last()) {
                    (true, Some(l)) => after = l.name.clone(),
                    _ => break,
                }
            }
        }
        Ok(n)
    }

    pub async fn set_pinned(&self, path: &str, pinned: bool, recursive: bool) -> Result<u64> {
        let path = normalize(path)?;
        let ids = self.file_ids(&path, recursive).await?;
        let n = ids.len() as u64;
        let epoch = self.propose(Op::SetPinned(pb::SetPinned { inode_ids: ids, pinned })).await?.pin_epoch;
        // Return once every live worker knows the new pins, so loads right after a pin
        // cannot evict the pinned blocks.
        self.await_workers(|_, s| s.pin_epoch >= epoch).await;
        Ok(n)
    }

    /// Drop the cached blocks of files at or below `path`. Returns the blocks freed.
    /// Drop the cached blocks of the file at `path`, or of every file below it with
    /// `recursive`. Returns the blocks dropped and the files skipped: a tree's pinned files
    /// and files not persisted (their cached blocks are their only copy) are left alone and
    /// counted; the same file named alone is an error saying why.
    pub async fn free(&self, path: &str, recursive: bool) -> Result<(u64, u64)> {
        let path = normalize(path)?;
        let mut recs = Vec::new();
        let mut skipped = 0u64;
        self.for_each_file(&path, recursive, &mut |r| {
            let why = if r.pinned {
                Some("is pinned (unpin it first)")
            } else if !is_persisted(r) {
                Some("is not persisted: its cached blocks are its only copy (locus fs persist)")
            } else {
                None
            };
            match why {
                // Without -R the one file named (a directory is refused before).
                Some(why) if !recursive => {
                    return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} {why}")));
                }
                Some(_) => skipped += 1,
                None => recs.push(r.clone()),
            }
            Ok(())
        })
        .await?;
        // Cached copies are soft state: no fsync (see `Store::mutate_soft`).
        let dropped = self
            .commit_soft(move |me, w, fx| {
                for r in &recs {
                    // The version stays valid: only its cached copies go, at once.
                    me.ns().drop_copies(w, r, false, fx)?;
                }
                Ok(fx.dropped.clone())
            })
            .await?;
        let n = dropped.len() as u64;
        // Counted from after the removals were queued: the heartbeat after the one that
        // takes them shows they are done.
        let targets = self.inner.workers.beats_ahead(dropped.iter().map(|(wk, _)| *wk), 2);
        // Return once the workers have deleted the blocks: a read right after `free`
        // must fill the cache again, not hit blocks about to go.
        self.await_workers(|id, s| targets.get(&id).is_none_or(|b| s.beats >= *b)).await;
        Ok((n, skipped))
    }
}
