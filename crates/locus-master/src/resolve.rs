//! Path resolution: looking paths up, loading them lazily from their UFS, re-syncing
//! them once their mount's sync interval has passed, and directory listings.

use futures::StreamExt;
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, Result};
use locus_proto::pb::{self, command::Op};

use crate::apply::ufs_entry;
use crate::namespace::inode_by_path;
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
        let stat = st.as_ref().map(|st| pb::UfsEntry { name: name.into(), ..ufs_entry(st) });
        let c = pb::SyncFile {
            parent_path: parent_path.into(),
            name: name.into(),
            stat,
            inode_id: rec.id,
            version: rec.version,
        };
        let synced =
            self.propose_unheld(m.info.id, mark, |held| (!held_by(held, &rel)).then_some(Op::SyncFile(c))).await?;
        match synced {
            Some(r) => Ok(r.record),
            // A change of the path was made or queued while the UFS was asked: the
            // namespace has it right.
            None => self.ns().inode_by_path(path),
        }
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
        let c = pb::LoadEntry { parent_id: parent, stat: Some(pb::UfsEntry { name: comp.into(), ..ufs_entry(&st) }) };
        let loaded =
            self.propose_unheld(m.info.id, mark, |held| (!held_by(held, &rel)).then_some(Op::LoadEntry(c))).await?;
        match loaded {
            Some(r) => Ok(Some(r.id).filter(|id| *id != 0)),
            // A change of the path was made or queued since the stat (a delete that the
            // stat came before, say): the namespace has it right.
            None => get_child(&self.ns().read()?.open_table(CHILDREN).map_err(db_err)?, parent, comp),
        }
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
                let page = std::mem::take(&mut batch);
                self.propose_unheld(mount_id, mark, |held| {
                    let entries: Vec<_> =
                        page.iter().filter(|st| !held_by(held, &child_rel(&rel, &st.path))).map(ufs_entry).collect();
                    let c = pb::MergeListing { dir_id: dir.id, entries, start_ms: start };
                    (!c.entries.is_empty()).then_some(Op::MergeListing(c))
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
        self.propose_unheld(mount_id, mark, |held| {
            // Mount points, and names UFS changes hold, stay whatever the listing said.
            gone.retain(|name| {
                !self.is_mount_point(&lpath::join(path, name)) && !held_by(held, &child_rel(&rel, name))
            });
            Some(Op::FinishListing(pb::FinishListing { dir_id: dir.id, gone, start_ms: start }))
        })
        .await?;
        Ok(())
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
