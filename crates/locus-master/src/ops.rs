//! Namespace operations with a UFS side: mkdir, delete and rename. They share one path,
//! [`Master::ufs_change`]: the UFS change is made now, or, while changes queued earlier
//! overlap its paths, journaled behind them in the same transaction as the namespace
//! change.

use std::future::Future;

use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use redb::{ReadableTable, WriteTransaction};

use crate::namespace::{Effects, put_inode};
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

    /// Make a namespace change whose UFS side is `ufs`, on `paths` (relative to the root
    /// of mount `mount_id`). With no queued change on those paths, `ufs` runs first
    /// (registered, so nothing queued meanwhile overtakes it), then the namespace change
    /// commits. Otherwise `ufs` does not run: the namespace change commits together with
    /// the queue record `change` returns (`None`: nothing to do in the UFS), behind the
    /// queued changes. `change` applies the namespace side inside the transaction, told
    /// whether the UFS side is queued.
    ///
    /// A rename (`paths` = [source, destination], `renamed_to` its destination path)
    /// queued that way takes along the persists still queued for what it moves, queued
    /// again at their new paths behind the rename (see [`Master::claim_persists`]).
    async fn ufs_change(
        &self,
        mount_id: u64,
        paths: &[&str],
        renamed_to: Option<&str>,
        ufs: impl Future<Output = Result<()>>,
        change: impl Fn(&Master, &WriteTransaction, bool, &mut Effects) -> Result<Option<pb::PersistOp>> + Send + 'static,
    ) -> Result<()> {
        // Held from here until the change is made or queued, tracked, and over.
        let (guard, queued) = self.begin_ufs_op(mount_id, paths);
        let claim = match (renamed_to, paths) {
            (Some(_), [src_rel, dst_rel]) if queued => self.claim_persists(mount_id, src_rel, dst_rel),
            _ => None,
        };
        if !queued {
            ufs.await?;
            locus_common::delay_point("master.ufs_change.made").await;
        }
        // What the claimed persists need to be queued again at their new paths.
        let requeue = claim
            .as_ref()
            .zip(renamed_to)
            .map(|(c, dst)| (c.seqs.clone(), paths[0].to_string(), dst.to_string(), paths[1].to_string()));
        let ((), fx) = self
            .mutate(move |me, w, fx| {
                let op = change(me, w, queued, fx)?;
                if queued {
                    if let Some(op) = op {
                        fx.ops.push(me.enqueue(w, op)?);
                    }
                    if let Some((seqs, srel, dst, drel)) = &requeue {
                        fx.ops.extend(me.requeue_claimed(w, seqs, srel, (dst, drel))?);
                    }
                }
                Ok(())
            })
            .await?;
        locus_common::delay_point("master.ufs_change.committed").await;
        if let Some(c) = claim {
            c.requeued();
        }
        self.apply(fx);
        drop(guard);
        Ok(())
    }

    /// Makes `path` and its missing ancestors, as the parent of something to create: a
    /// file in the way is `NotADirectory` (as `mkdir -p a/b` answers when `a` is a file).
    pub(crate) async fn ensure_parent(&self, path: &str) -> Result<()> {
        self.create_directory(path, true).await.map_err(|e| {
            if e.kind() == ErrorKind::AlreadyExists {
                Error::new(ErrorKind::NotADirectory, format!("{path} is not a directory"))
            } else {
                e
            }
        })
    }

    pub async fn create_directory(&self, path: &str, recursive: bool) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.create_directory_once(path, recursive).await {
                // A parent went while it was made (the S3 gateway removes directories its
                // deletes leave empty): make it again.
                Err(e) if e.kind() == ErrorKind::NotFound && recursive && tries < 10 => tries += 1,
                r => return r,
            }
        }
    }

    async fn create_directory_once(&self, path: &str, recursive: bool) -> Result<()> {
        let path = normalize(path)?;
        // A name the UFS cannot hold as it is is refused now (its ancestors' too).
        let (m, rel) = self.mount_for(&path)?;
        m.ufs.check_name(&rel, true)?;
        if let Some(rec) = self.resolve(&path).await? {
            if rec.is_dir && recursive {
                return Ok(());
            }
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} exists")));
        }
        let (parent_path, name) = lpath::parent_and_name(&path)?;
        if self.resolve(parent_path).await?.is_none() {
            if !recursive {
                return Err(Error::not_found(format!("parent {parent_path} does not exist")));
            }
            Box::pin(self.ensure_parent(parent_path)).await?;
        }
        let parent = self.must_resolve(parent_path).await?;
        if !parent.is_dir {
            return Err(Error::new(ErrorKind::NotADirectory, format!("{parent_path} is not a directory")));
        }
        let (m, rel) = self.writable(&path)?;
        let op = pb::PersistOp { kind: pb::PersistOpKind::Mkdir.into(), ..self.op_for(&m, &rel, &path) };
        let (parent_path, name) = (parent_path.to_string(), name.to_string());
        // A committer's staging directory stays in Locus (not persisted): it exists in the
        // UFS only once a file in it is persisted there, as an object store's prefixes do.
        // Its marker, and the markers its renames and its delete would move and remove,
        // were UFS requests in the job's commit while its persists run.
        let staging = lpath::in_staging(&path);
        // Made now (nothing queued on the path): the new marker keeps the ancestors.
        let ufs = async {
            if !staging {
                m.ufs.create_dir(&rel).await?;
                self.settle_markers(&m, &rel).await;
            }
            Ok(())
        };
        self.ufs_change(m.info.id, &[&rel], None, ufs, move |me, w, queued, _| {
            if !load_inode(w, parent.id)?.is_some_and(|p| p.is_dir) {
                return Err(Error::not_found(format!("{parent_path} was deleted")));
            }
            if get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent.id, &name)?.is_some() {
                return Ok(None);
            }
            let now = now_ms();
            let mut rec = me.ns().new_inode(w, parent.id, &name, true, 0, String::new(), now, now, None)?;
            rec.children_loaded = true;
            if staging {
                rec.set_persist_state(pb::PersistState::NotPersisted);
                put_inode(w, &rec)?;
                return Ok(None);
            }
            if queued {
                rec.set_persist_state(pb::PersistState::ToBePersisted);
            }
            put_inode(w, &rec)?;
            Ok(Some(pb::PersistOp { inode_id: rec.id, ..op.clone() }))
        })
        .await
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
                    ErrorKind::DirectoryNotEmpty,
                    format!("{path} is a non-empty directory (use -R)"),
                ));
            }
        }
        if rec.is_dir && self.inner.mounts.any_under(&path, None) {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} contains a mount point")));
        }
        let (m, rel) = self.writable(&path)?;
        let op = pb::PersistOp {
            kind: pb::PersistOpKind::Delete.into(),
            is_dir: rec.is_dir,
            ..self.op_for(&m, &rel, &path)
        };
        let (parent_path, name) = lpath::parent_and_name(&path)?;
        let (parent_path, name) = (parent_path.to_string(), name.to_string());
        // The UFS delete happens even for bytes never persisted: an older version may be
        // there, and must not come back at the next sync. A directory that was empty when
        // looked at may have filled up since (a write into it, as the S3 gateway removes
        // directories its deletes leave empty): a delete that is not recursive removes it
        // from the UFS only if it is still empty there, and from the namespace only if it
        // still has no entries when the change commits.
        let only_empty = rec.is_dir && !recursive;
        let ufs = async {
            if only_empty { m.ufs.delete_empty_dir(&rel).await } else { m.ufs.delete(&rel, rec.is_dir).await }
        };
        self.ufs_change(m.info.id, &[&rel], None, ufs, move |me, w, _, fx| {
            // (the lookups' tables close before the removal opens them again)
            let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, &parent_path)?;
            if let Some(parent) = parent {
                if only_empty {
                    let ch = w.open_table(CHILDREN).map_err(db_err)?;
                    if let Some(id) = get_child(&ch, parent, &name)?
                        && ch.range((id, "")..(id + 1, "")).map_err(db_err)?.next().is_some()
                    {
                        return Err(Error::new(
                            ErrorKind::DirectoryNotEmpty,
                            format!("{parent_path}/{name} is a non-empty directory (use -R)"),
                        ));
                    }
                }
                me.ns().remove_subtree(w, parent, &name, fx)?;
            }
            Ok(Some(op.clone()))
        })
        .await
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
        // A destination the UFS cannot hold as it is is refused before anything moves.
        let (dm, drel) = self.mount_for(&dst)?;
        dm.ufs.check_name(&drel, rec.is_dir)?;
        if self.resolve_with(&dst, true).await?.is_some() {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{dst} exists")));
        }
        let (dparent_path, dname) = lpath::parent_and_name(&dst)?;
        let dparent = self.must_resolve(dparent_path).await?;
        if !dparent.is_dir {
            return Err(Error::new(ErrorKind::NotADirectory, format!("{dparent_path} is not a directory")));
        }
        let (sm, srel) = self.writable(&src)?;
        let (dm, drel) = self.writable(&dst)?;
        if sm.info.id != dm.info.id {
            return Err(Error::invalid("rename across mounts is not supported"));
        }
        let persisted = is_persisted(&rec);
        let ufs = async {
            // (Judged now, not at the lookup: a persist may have landed since.)
            if self.ns().rename_stays_in_locus(&src, rec.id)? {
                return Ok(());
            }
            match sm.ufs.rename(&srel, &drel).await {
                // Bytes not persisted yet have nothing to move in the UFS.
                Err(e) if e.kind() == ErrorKind::NotFound && !persisted => Ok(()),
                Ok(()) => {
                    self.settle_markers(&sm, &drel).await;
                    Ok(())
                }
                r => r,
            }
        };
        let op = pb::PersistOp {
            kind: pb::PersistOpKind::Rename.into(),
            inode_id: rec.id,
            dst_ufs_path: drel.clone(),
            ..self.op_for(&sm, &srel, &src)
        };
        let (sparent_path, sname) = lpath::parent_and_name(&src)?;
        let (sparent_path, sname, dname) = (sparent_path.to_string(), sname.to_string(), dname.to_string());
        let (src_path, dst_path) = (src.clone(), dst.clone());
        self.ufs_change(sm.info.id, &[&srel, &drel], Some(&dst), ufs, move |_, w, _, _| {
            {
                let mut ch = w.open_table(CHILDREN).map_err(db_err)?;
                let sparent = lookup(&ch, &sparent_path)?.ok_or_else(|| Error::not_found(sparent_path.clone()))?;
                ch.remove((sparent, sname.as_str())).map_err(db_err)?;
                ch.insert((dparent.id, dname.as_str()), rec.id).map_err(db_err)?;
            }
            crate::journal::rename(w, &src_path, &dst_path)?;
            // The entry as it is now (a persist may have committed since the lookup: the
            // lookup's copy would undo it).
            let mut r = load_inode(w, rec.id)?.ok_or_else(|| Error::not_found(format!("{src_path} was deleted")))?;
            r.parent = dparent.id;
            r.name = dname.clone();
            put_inode(w, &r)?;
            Ok(Some(op.clone()))
        })
        .await
    }
}
