//! Namespace operations with a UFS side: mkdir, delete and rename. They share one path,
//! [`Master::ufs_change`]: the UFS change is made now, or, while changes queued earlier
//! overlap its paths, journaled behind them in the same transaction as the namespace
//! change.

use std::future::Future;

use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};

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
    /// its queue record `op`, behind the queued changes. `change` makes the command, given
    /// its UFS side.
    ///
    /// A rename (`paths` = [source, destination], `renamed_to` its destination path)
    /// queued that way takes along the persists still queued for what it moves, queued
    /// again at their new paths behind the rename (see [`Master::claim_persists`]).
    #[allow(clippy::too_many_arguments)]
    async fn ufs_change(
        &self,
        id: &CallId,
        mount_id: u64,
        paths: &[&str],
        renamed_to: Option<&str>,
        ufs: impl Future<Output = Result<()>>,
        op: pb::PersistOp,
        change: impl FnOnce(pb::UfsSide) -> Op,
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
        let mut side = pb::UfsSide { queued, op: Some(op), ..Default::default() };
        if let (Some(c), Some(dst)) = (&claim, renamed_to) {
            side.claimed = c.seqs.clone();
            (side.src_ufs_path, side.dst, side.dst_ufs_path) = (paths[0].into(), dst.into(), paths[1].into());
        }
        let (_, fx) = self.propose_only(id, change(side)).await?;
        locus_common::delay_point("master.ufs_change.committed").await;
        if let Some(c) = claim {
            c.requeued();
        }
        self.carry_out(fx);
        drop(guard);
        Ok(())
    }

    /// Makes `path` and its missing ancestors, as the parent of something to create: a
    /// file in the way is `NotADirectory` (as `mkdir -p a/b` answers when `a` is a file).
    pub(crate) async fn ensure_parent(&self, path: &str) -> Result<()> {
        self.create_directory(path, true, &CallId::NONE).await.map_err(|e| {
            if e.kind() == ErrorKind::AlreadyExists {
                Error::new(ErrorKind::NotADirectory, format!("{path} is not a directory"))
            } else {
                e
            }
        })
    }

    /// Make directory `path` (and, `recursive`, its missing ancestors) for call `id`.
    pub(crate) async fn create_directory(&self, path: &str, recursive: bool, id: &CallId) -> Result<()> {
        self.once(id, |_| Ok(()), async {
            let mut tries = 0;
            loop {
                match self.create_directory_once(path, recursive, id).await {
                    // A parent went while it was made (the S3 gateway removes directories
                    // its deletes leave empty): make it again.
                    Err(e) if e.kind() == ErrorKind::NotFound && recursive && tries < 10 => tries += 1,
                    r => return r,
                }
            }
        })
        .await
    }

    async fn create_directory_once(&self, path: &str, recursive: bool, id: &CallId) -> Result<()> {
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
        let c = pb::Mkdir { parent_id: parent.id, parent_path, name, staging, ufs: None };
        self.ufs_change(id, m.info.id, &[&rel], None, ufs, op, |side| Op::Mkdir(pb::Mkdir { ufs: Some(side), ..c }))
            .await
    }

    /// Delete `path` (a directory with what is below it, `recursive`) for call `id`.
    pub(crate) async fn delete(&self, path: &str, recursive: bool, id: &CallId) -> Result<()> {
        self.once(id, |_| Ok(()), self.delete_now(path, recursive, id)).await
    }

    async fn delete_now(&self, path: &str, recursive: bool, id: &CallId) -> Result<()> {
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
        let c = pb::Delete { parent_path, name, only_empty, ufs: None };
        self.ufs_change(id, m.info.id, &[&rel], None, ufs, op, |side| Op::Delete(pb::Delete { ufs: Some(side), ..c }))
            .await
    }

    /// Move `src` to `dst` for call `id`.
    pub(crate) async fn rename(&self, src: &str, dst: &str, id: &CallId) -> Result<()> {
        self.once(id, |_| Ok(()), self.rename_now(src, dst, id)).await
    }

    async fn rename_now(&self, src: &str, dst: &str, id: &CallId) -> Result<()> {
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
        let c = pb::Rename {
            src_parent_path: sparent_path,
            src_name: sname,
            dst_parent_id: dparent.id,
            dst_name: dname,
            inode_id: rec.id,
            src: src.clone(),
            dst: dst.clone(),
            ufs: None,
        };
        let paths = [srel.as_str(), drel.as_str()];
        let rename = |side| Op::Rename(pb::Rename { ufs: Some(side), ..c });
        self.ufs_change(id, sm.info.id, &paths, Some(&dst), ufs, op, rename).await
    }
}
