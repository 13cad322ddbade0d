//! Namespace operations with a UFS side: mkdir, delete and rename, which share one
//! "apply it to the UFS now, or queue it behind the changes pending on its paths" path.

use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;

use crate::store::*;
use crate::*;

impl Master {
    pub(crate) fn writable(&self, path: &str) -> Result<(MountEntry, String)> {
        let (m, rel) = self.mount_for(path)?;
        if m.info.readonly {
            return Err(Error::new(ErrorKind::PermissionDenied, format!("mount {} is read-only", m.info.path)));
        }
        Ok((m, rel))
    }

    pub async fn create_directory(&self, path: &str, recursive: bool) -> Result<()> {
        let path = normalize(path)?;
        if let Some(rec) = self.resolve(&path).await? {
            if rec.is_dir && recursive {
                return Ok(());
            }
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} exists")));
        }
        let (parent_path, name) = lpath::split_parent(&path).unwrap();
        if self.resolve(parent_path).await?.is_none() {
            if !recursive {
                return Err(Error::not_found(format!("parent {parent_path} does not exist")));
            }
            Box::pin(self.create_directory(parent_path, true)).await?;
        }
        let parent = self.must_resolve(parent_path).await?;
        if !parent.is_dir {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{parent_path} is not a directory")));
        }
        let (m, rel) = self.writable(&path)?;
        // Behind queued changes to an overlapping path, the mkdir queues too (in order).
        let guard = self.begin_ufs_op(m.info.id, &[&rel]);
        if guard.is_some() {
            m.ufs.create_dir(&rel).await?;
        }
        let w = self.inner.store.write()?;
        let mut ops = Vec::new();
        if get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent.id, name)?.is_none() {
            let mut rec = self.new_inode(&w, parent.id, name, true, 0, String::new(), now_ms(), now_ms(), None)?;
            rec.children_loaded = true;
            if guard.is_none() {
                rec.persist_state = TO_BE_PERSISTED.into();
                let op = pb::PersistOp { kind: "MKDIR".into(), inode_id: rec.id, ..self.op_for(&m, &rel, &path) };
                ops.push(self.enqueue(&w, op)?);
            }
            put_inode(&w, &rec)?;
        }
        w.commit().map_err(db_err)?;
        self.track(ops);
        Ok(())
    }

    pub async fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        let path = normalize(path)?;
        if path == "/" || self.is_mount_point(&path) {
            return Err(Error::invalid(format!("cannot delete {path}: it is a mount point (unmount it instead)")));
        }
        let rec = self.must_resolve(&path).await?;
        if rec.is_dir && !recursive {
            let (entries, _) = self.list_status(&path, "", false, 1).await?;
            if !entries.is_empty() {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("{path} is a non-empty directory (use -R)"),
                ));
            }
        }
        if rec.is_dir && self.inner.mounts.read().iter().any(|m| lpath::strip_prefix(&m.info.path, &path).is_some()) {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} contains a mount point")));
        }
        let (m, rel) = self.writable(&path)?;
        // The UFS delete happens even for bytes never persisted: an older version may be
        // there, and must not come back at the next sync.
        let guard = self.begin_ufs_op(m.info.id, &[&rel]);
        if guard.is_some() {
            m.ufs.delete(&rel, rec.is_dir).await?;
        }
        let (parent_path, name) = lpath::split_parent(&path).unwrap();
        let w = self.inner.store.write()?;
        let mut dropped = Vec::new();
        let mut ops = Vec::new();
        let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, parent_path)?;
        if let Some(parent) = parent {
            self.remove_subtree(&w, parent, name, &mut dropped)?;
        }
        if guard.is_none() {
            let op = pb::PersistOp { kind: "DELETE".into(), is_dir: rec.is_dir, ..self.op_for(&m, &rel, &path) };
            ops.push(self.enqueue(&w, op)?);
        }
        w.commit().map_err(db_err)?;
        self.queue_removals(dropped);
        self.track(ops);
        Ok(())
    }

    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        let src = normalize(src)?;
        let dst = normalize(dst)?;
        if src == "/" || self.is_mount_point(&src) {
            return Err(Error::invalid(format!("cannot rename mount point {src}")));
        }
        if lpath::strip_prefix(&dst, &src).is_some() {
            return Err(Error::invalid(format!("cannot move {src} into itself")));
        }
        let rec = self.must_resolve(&src).await?;
        if self.resolve_with(&dst, true).await?.is_some() {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{dst} exists")));
        }
        let (dparent_path, dname) = lpath::split_parent(&dst).unwrap();
        let dparent = self.must_resolve(dparent_path).await?;
        if !dparent.is_dir {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{dparent_path} is not a directory")));
        }
        let (sm, srel) = self.writable(&src)?;
        let (dm, drel) = self.writable(&dst)?;
        if sm.info.id != dm.info.id {
            return Err(Error::invalid("rename across mounts is not supported"));
        }
        let guard = self.begin_ufs_op(sm.info.id, &[&srel, &drel]);
        // Persists still queued for what moves are moved with it (then run after the UFS rename).
        let claim = if guard.is_none() { self.claim_persists(sm.info.id, &srel, &drel) } else { None };
        if guard.is_some() {
            match sm.ufs.rename(&srel, &drel).await {
                // Bytes not persisted yet have nothing to move in the UFS.
                Err(e) if e.kind() == ErrorKind::NotFound && !is_persisted(&rec) => {}
                r => r?,
            }
        }
        let (sparent_path, sname) = lpath::split_parent(&src).unwrap();
        let w = self.inner.store.write()?;
        let mut ops = Vec::new();
        if guard.is_none() {
            let op =
                pb::PersistOp { kind: "RENAME".into(), dst_ufs_path: drel.clone(), ..self.op_for(&sm, &srel, &src) };
            ops.push(self.enqueue(&w, op)?);
            if let Some(c) = &claim {
                ops.extend(self.requeue_claimed(&w, c, &srel, (&dst, &drel))?);
            }
        }
        {
            let mut ch = w.open_table(CHILDREN).map_err(db_err)?;
            let sparent = lookup(&ch, sparent_path)?.ok_or_else(|| Error::not_found(sparent_path.to_string()))?;
            ch.remove((sparent, sname)).map_err(db_err)?;
            ch.insert((dparent.id, dname), rec.id).map_err(db_err)?;
        }
        let mut r = rec.clone();
        r.parent = dparent.id;
        r.name = dname.to_string();
        put_inode(&w, &r)?;
        w.commit().map_err(db_err)?;
        if let Some(c) = claim {
            c.requeued();
        }
        self.track(ops);
        Ok(())
    }
}
