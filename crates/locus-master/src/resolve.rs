//! Path resolution: looking paths up, loading them lazily from their UFS, re-syncing
//! them once their mount's sync interval has passed, and directory listings.

use futures::StreamExt;
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, Result};
use locus_proto::pb;
use locus_ufs::UfsStatus;
use redb::{ReadableTable, WriteTransaction};

use crate::namespace::{Effects, inode_by_path, put_inode};
use crate::persist::held_by;
use crate::store::*;
use crate::*;

/// The UFS path of `name` in the directory at UFS path `dir` ("" is the mount's root).
fn child_rel(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") }
}

impl Master {
    pub(crate) fn sync_due(rec: &pb::InodeRecord, m: &MountEntry) -> bool {
        now_ms() - rec.synced_ms >= m.info.sync_interval_ms as i64
    }

    /// Insert or refresh `name` under `parent` from a UFS status. Returns the child id.
    /// Inside `w`; a file whose fingerprint changed drops its cached blocks (`fx`).
    pub(crate) fn upsert_from_ufs(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        st: &UfsStatus,
        now: i64,
        fx: &mut Effects,
    ) -> Result<u64> {
        let existing = {
            let ch = w.open_table(CHILDREN).map_err(db_err)?;
            get_child(&ch, parent, name)?
        };
        let fp = st.fingerprint();
        if let Some(id) = existing {
            let mut rec = {
                let t = w.open_table(INODES).map_err(db_err)?;
                get_inode(&t, id)?.ok_or_else(|| Error::internal("dangling child"))?
            };
            if !is_persisted(&rec) {
                // Locus holds newer bytes than the UFS until the persist lands.
                return Ok(id);
            }
            if rec.is_dir != st.is_dir {
                // A file became a directory or back: replace the entry.
                self.ns().remove_subtree(w, parent, name, fx)?;
                return self.upsert_from_ufs(w, parent, name, st, now, fx);
            }
            if !rec.is_dir && rec.fingerprint != fp {
                self.ns().drop_version(w, &rec, fx)?;
                rec.version = next_id(w, "version", 1)?;
                w.open_table(VERSIONS).map_err(db_err)?.insert(rec.version, rec.id).map_err(db_err)?;
                if rec.pinned {
                    w.open_table(PINNED).map_err(db_err)?.insert(rec.version, ()).map_err(db_err)?;
                    self.ns().bump_pin_epoch(w)?;
                }
                rec.length = st.length;
                rec.fingerprint = fp;
                rec.mtime_ms = st.mtime_ms;
                // The object changed behind Locus: what was known about it is stale.
                rec.meta = None;
            }
            rec.synced_ms = now;
            put_inode(w, &rec)?;
            return Ok(id);
        }
        // An S3 prefix has no time of its own: a directory gets the time Locus first saw it
        // (what S3 clients show as a bucket's creation date).
        let mtime = if st.is_dir && st.mtime_ms <= 0 { now } else { st.mtime_ms };
        let rec = self.ns().new_inode(w, parent, name, st.is_dir, st.length, fp, mtime, now, None)?;
        fx.loaded += 1;
        Ok(rec.id)
    }

    /// Resolve a normalised path, loading it lazily from its UFS and re-checking a file
    /// against the UFS once its mount's sync interval has passed.
    pub(crate) async fn resolve(&self, path: &str) -> Result<Option<pb::InodeRecord>> {
        self.resolve_with(path, false).await
    }

    /// [`Master::resolve`]; with `trust_listing`, a name missing from a directory whose
    /// listing is loaded and fresh (within the sync interval) does not exist, with no UFS
    /// call. Writers use it: a create costs no UFS round trip, and works while the UFS
    /// is away. Readers still look a missing name up in the UFS, so files put there
    /// behind Locus's back are found by path at once; but not twice within the sync
    /// interval ([`absent`](crate::absent)), and not under a directory that exists in
    /// Locus only (a committer's staging directory), where nothing else writes.
    pub(crate) async fn resolve_with(&self, path: &str, trust_listing: bool) -> Result<Option<pb::InodeRecord>> {
        if let Some(rec) = self.ns().inode_by_path(path)? {
            return self.recheck(path, rec).await;
        }
        // Walk down, loading missing components from the UFS.
        let mut parent = ROOT_ID;
        let mut cur = String::from("/");
        for comp in lpath::components(path) {
            cur = lpath::join(&cur, comp);
            parent = match self.lookup_step(parent, comp, &cur, trust_listing)? {
                Step::Found(id) => id,
                Step::Missing => return Ok(None),
                Step::AskUfs => match self.load_from_ufs(parent, comp, &cur).await? {
                    Some(id) => id,
                    None => return Ok(None),
                },
            };
        }
        let r = self.ns().read()?;
        get_inode(&r.open_table(INODES).map_err(db_err)?, parent)
    }

    /// A file the namespace holds, checked against the UFS once its mount's sync interval
    /// has passed: updated if the object changed, dropped if it vanished.
    async fn recheck(&self, path: &str, rec: pb::InodeRecord) -> Result<Option<pb::InodeRecord>> {
        if rec.is_dir || path == "/" || !is_persisted(&rec) {
            return Ok(Some(rec));
        }
        let (m, rel) = self.mount_for(path)?;
        let mark = self.ufs_mark();
        if !Self::sync_due(&rec, &m) || held_by(&self.held_ufs_paths(m.info.id, mark), &rel) {
            // Within the interval, or the UFS is behind queued changes of this path.
            return Ok(Some(rec));
        }
        let st = m.ufs.stat(&rel).await?;
        locus_common::delay_point("master.resolve.after_ufs").await;
        if st.is_none() {
            tracing::info!(path, "file vanished from the UFS; dropping it");
        }
        let (parent_path, name) = lpath::parent_and_name(path)?;
        let (parent_path, name, now) = (parent_path.to_string(), name.to_string(), now_ms());
        let mount_id = m.info.id;
        self.commit(move |me, w, fx| {
            let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, &parent_path)?;
            if held_by(&me.held_ufs_paths(mount_id, mark), &rel) {
                // A change of the path was made or queued while the UFS was asked.
                let Some(parent) = parent else { return Ok(None) };
                let id = get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent, &name)?;
                return id.map(|id| load_inode(w, id)).transpose().map(Option::flatten);
            }
            match (&st, parent) {
                (Some(st), Some(parent)) => {
                    let id = me.upsert_from_ufs(w, parent, &name, st, now, fx)?;
                    load_inode(w, id)
                }
                (None, Some(parent)) => {
                    me.ns().remove_subtree(w, parent, &name, fx)?;
                    Ok(None)
                }
                _ => Ok(None),
            }
        })
        .await
    }

    /// One step of the walk down to a path: `comp` under directory `parent` (`cur` is the
    /// path so far), as the namespace knows it.
    fn lookup_step(&self, parent: u64, comp: &str, cur: &str, trust_listing: bool) -> Result<Step> {
        let r = self.ns().read()?;
        if let Some(id) = get_child(&r.open_table(CHILDREN).map_err(db_err)?, parent, comp)? {
            return Ok(Step::Found(id));
        }
        let prec = get_inode(&r.open_table(INODES).map_err(db_err)?, parent)?
            .ok_or_else(|| Error::internal("missing parent"))?;
        if !prec.is_dir {
            return Ok(Step::Missing);
        }
        if !is_persisted(&prec) && lpath::in_staging(cur) {
            // Under a staging directory made in Locus only (one renamed out of staging
            // keeps its state, but not this trust).
            return Ok(Step::Missing);
        }
        if trust_listing && prec.children_loaded {
            let (m, _) = self.mount_for(cur)?;
            if !Self::sync_due(&prec, &m) {
                return Ok(Step::Missing);
            }
        }
        Ok(Step::AskUfs)
    }

    /// `comp` under directory `parent`, missing from the namespace, looked up in the UFS
    /// and imported if it is there: its inode id.
    async fn load_from_ufs(&self, parent: u64, comp: &str, cur: &str) -> Result<Option<u64>> {
        let (m, rel) = self.mount_for(cur)?;
        let mark = self.ufs_mark();
        if held_by(&self.held_ufs_paths(m.info.id, mark), &rel) {
            // Not in the namespace, and the UFS is behind queued changes of the path (a
            // delete of it, say): what the UFS holds there is not to be imported.
            return Ok(None);
        }
        let interval = m.info.sync_interval_ms;
        if self.inner.absent.is_absent(m.info.id, &rel, interval, now_ms()) {
            return Ok(None);
        }
        let asked = now_ms();
        let Some(st) = m.ufs.stat(&rel).await? else {
            self.inner.absent.note(m.info.id, &rel, asked, interval);
            return Ok(None);
        };
        locus_common::delay_point("master.resolve.after_ufs").await;
        let (name, now, mount_id) = (comp.to_string(), now_ms(), m.info.id);
        self.commit(move |me, w, fx| {
            if held_by(&me.held_ufs_paths(mount_id, mark), &rel) {
                // A change of the path was made or queued since the stat (a delete that
                // the stat came before, say): the namespace has it right.
                return get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent, &name);
            }
            me.upsert_from_ufs(w, parent, &name, &st, now, fx).map(Some)
        })
        .await
    }

    pub(crate) async fn must_resolve(&self, path: &str) -> Result<pb::InodeRecord> {
        self.resolve(path).await?.ok_or_else(|| Error::not_found(format!("{path} does not exist")))
    }

    /// The status of `path`; with `with_blocks`, a file's blocks with their live locations.
    ///
    /// The file and its blocks' locations are read in one snapshot of the namespace. Read
    /// in two, an overwrite or a delete committed in between had dropped the locations of
    /// the version the first read returned: its blocks named no copy (though the worker
    /// still held them, retired, for the readers under way), and a read of a file not
    /// persisted yet failed ("no live copy"): the S3 gateway's GETs cut off before their
    /// first byte under concurrent overwrites.
    pub async fn get_status(&self, path: &str, with_blocks: bool) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        if !with_blocks || rec.is_dir {
            return self.file_info(&path, &rec);
        }
        locus_common::delay_point("master.get_status.resolved").await;
        // The lookup may have loaded or synced the file (a commit): the file as the snapshot
        // has it now, newer than the lookup's if it changed since (the status is still under
        // way: either answer is right), or gone if it was deleted meanwhile.
        let r = self.ns().read()?;
        let rec = inode_by_path(&r, &path)?.ok_or_else(|| Error::not_found(format!("{path} does not exist")))?;
        let mut fi = self.file_info(&path, &rec)?;
        if !rec.is_dir {
            fi.blocks = self.block_infos(&r, &rec)?;
            // Each block's ticket: a worker fills it from the UFS only from this origin.
            let tickets: Vec<_> = fi.blocks.iter().map(|b| self.inner.verifier.ticket(&fi.origin(b))).collect();
            for (b, t) in fi.blocks.iter_mut().zip(tickets) {
                b.ticket = t;
            }
        }
        Ok(fi)
    }

    /// Merge the UFS listing of directory `path` into the namespace, page by page.
    /// Names that UFS changes hold (queued, in progress or made since the listing began:
    /// see [`Master::held_ufs_paths`]) keep what the namespace says of them: the listing
    /// neither imports nor drops them.
    pub(crate) async fn load_children(&self, path: &str, dir: &pb::InodeRecord) -> Result<()> {
        let (m, rel) = self.mount_for(path)?;
        let start = now_ms();
        let mount_id = m.info.id;
        let mark = self.ufs_mark();
        let mut stream = Box::pin(m.ufs.list(&rel).await?);
        let mut batch = Vec::with_capacity(1000);
        loop {
            let next = stream.next().await;
            let done = next.is_none();
            if let Some(e) = next {
                let e = e?;
                if e.path != lpath::UFS_TEMP_DIR {
                    batch.push(e);
                }
            }
            if batch.len() >= 1000 || (done && !batch.is_empty()) {
                locus_common::delay_point("master.load_children.listed").await;
                let (page, dir_id, rel) = (std::mem::take(&mut batch), dir.id, rel.clone());
                self.commit(move |me, w, fx| {
                    let queued = me.held_ufs_paths(mount_id, mark);
                    for st in &page {
                        if !held_by(&queued, &child_rel(&rel, &st.path)) {
                            me.upsert_from_ufs(w, dir_id, &st.path, st, start, fx)?;
                        }
                    }
                    Ok(())
                })
                .await?;
            }
            if done {
                break;
            }
        }
        // Entries not seen in this listing are gone from the UFS (mount points excepted),
        // if a stat agrees: a listing taken while the directory changes may miss an entry
        // that was there all along (a persisted file dropped from the namespace, then
        // imported again without its metadata, was seen under load).
        let unseen = self.unseen_children(path, dir, start, mark, &m, &rel)?;
        let mut gone = Vec::new();
        for name in unseen {
            if m.ufs.stat(&child_rel(&rel, &name)).await?.is_none() {
                gone.push(name);
            }
        }
        let (path, dir) = (path.to_string(), dir.clone());
        self.commit(move |me, w, fx| {
            let queued = me.held_ufs_paths(mount_id, mark);
            let stale: Vec<String> = {
                let ch = w.open_table(CHILDREN).map_err(db_err)?;
                let inodes = w.open_table(INODES).map_err(db_err)?;
                let mut v = Vec::new();
                for e in ch.range((dir.id, "")..(dir.id + 1, "")).map_err(db_err)? {
                    let (k, id) = e.map_err(db_err)?;
                    let name = k.value().1.to_string();
                    if let Some(r) = get_inode(&inodes, id.value())?
                        && r.synced_ms < start
                        && is_persisted(&r)
                        && !me.is_mount_point(&lpath::join(&path, &name))
                        && !held_by(&queued, &child_rel(&rel, &name))
                        && gone.contains(&name)
                    {
                        v.push(name);
                    }
                }
                v
            };
            for name in stale {
                me.ns().remove_subtree(w, dir.id, &name, fx)?;
            }
            let mut d = load_inode(w, dir.id)?.unwrap_or_else(|| dir.clone());
            d.children_loaded = true;
            d.synced_ms = start;
            put_inode(w, &d)
        })
        .await
    }

    /// Entries of directory `dir` a listing that began at `start` (`mark`) may drop: not
    /// synced since, persisted, no mount point, not held by a UFS change.
    fn unseen_children(
        &self,
        path: &str,
        dir: &pb::InodeRecord,
        start: i64,
        mark: u64,
        m: &MountEntry,
        rel: &str,
    ) -> Result<Vec<String>> {
        let queued = self.held_ufs_paths(m.info.id, mark);
        let r = self.ns().read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let inodes = r.open_table(INODES).map_err(db_err)?;
        let mut v = Vec::new();
        for e in ch.range((dir.id, "")..(dir.id + 1, "")).map_err(db_err)? {
            let (k, id) = e.map_err(db_err)?;
            let name = k.value().1.to_string();
            if let Some(c) = get_inode(&inodes, id.value())?
                && c.synced_ms < start
                && is_persisted(&c)
                && !self.is_mount_point(&lpath::join(path, &name))
                && !held_by(&queued, &child_rel(rel, &name))
            {
                v.push(name);
            }
        }
        Ok(v)
    }

    /// One page of a directory listing, in name order after `start_after` (or from it,
    /// when `inclusive`).
    pub async fn list_status(
        &self,
        path: &str,
        start_after: &str,
        inclusive: bool,
        limit: u32,
    ) -> Result<(Vec<pb::FileInfo>, bool)> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        if !rec.is_dir {
            return Ok((vec![self.file_info(&path, &rec)?], false));
        }
        if let Ok((m, _)) = self.mount_for(&path) {
            // A listing that starts mid-directory (a later page, or S3's start-after) still
            // needs the directory loaded; a due sync waits for a listing from the start.
            if !rec.children_loaded || (start_after.is_empty() && Self::sync_due(&rec, &m)) {
                self.load_children(&path, &rec).await?;
            }
        }
        let limit = if limit == 0 { DEFAULT_LIST_PAGE } else { limit.min(10_000) } as usize;
        let r = self.ns().read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let inodes = r.open_table(INODES).map_err(db_err)?;
        let mut out = Vec::new();
        let mut truncated = false;
        for e in ch.range((rec.id, start_after)..(rec.id + 1, "")).map_err(db_err)? {
            let (k, id) = e.map_err(db_err)?;
            let name = k.value().1;
            if name == start_after && !inclusive {
                continue;
            }
            if out.len() == limit {
                truncated = true;
                break;
            }
            if let Some(c) = get_inode(&inodes, id.value())? {
                out.push(self.file_info(&lpath::join(&path, name), &c)?);
            }
        }
        Ok((out, truncated))
    }
}

/// Where one step of a walk down a path stands in the namespace.
enum Step {
    /// The component is there: its inode id.
    Found(u64),
    /// It is not, and the UFS need not be asked.
    Missing,
    /// It is not, and the UFS may hold it.
    AskUfs,
}
