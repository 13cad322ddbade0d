//! The mount table: its state ([`MountTable`], mirrored from the `mounts` table), the
//! RPCs that mount and unmount UFSes, and finding the mount of a path.

use std::collections::BTreeMap;

use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};
use locus_ufs::Ufs;
use parking_lot::RwLock;
use redb::ReadableTable;

use crate::store::*;
use crate::*;

#[derive(Clone)]
pub(crate) struct MountEntry {
    pub(crate) info: pb::MountInfo,
    pub(crate) ufs: Ufs,
}

/// The mounts in memory, longest path first (so the first that holds a path is its
/// mount); the `mounts` table holds them durably. Only this type touches the list.
#[derive(Default)]
pub(crate) struct MountTable {
    mounts: RwLock<Vec<MountEntry>>,
}

impl MountTable {
    /// Replaces the whole table (at start).
    fn set(&self, mut v: Vec<MountEntry>) {
        v.sort_by_key(|m| std::cmp::Reverse(m.info.path.len()));
        *self.mounts.write() = v;
    }

    fn add(&self, e: MountEntry) {
        let mut v = self.mounts.write();
        v.push(e);
        v.sort_by_key(|m| std::cmp::Reverse(m.info.path.len()));
    }

    fn remove(&self, id: u64) {
        self.mounts.write().retain(|e| e.info.id != id);
    }

    /// Every mount, longest path first.
    pub(crate) fn all(&self) -> Vec<MountEntry> {
        self.mounts.read().clone()
    }

    /// Every mount's description, longest path first (no UFS handle is cloned).
    pub(crate) fn infos(&self) -> Vec<pb::MountInfo> {
        self.mounts.read().iter().map(|m| m.info.clone()).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.mounts.read().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.mounts.read().is_empty()
    }

    pub(crate) fn by_id(&self, id: u64) -> Option<MountEntry> {
        self.mounts.read().iter().find(|m| m.info.id == id).cloned()
    }

    pub(crate) fn at(&self, path: &str) -> Option<MountEntry> {
        self.mounts.read().iter().find(|m| m.info.path == path).cloned()
    }

    /// The mount holding `path` and the path relative to its UFS root.
    pub(crate) fn of(&self, path: &str) -> Option<(MountEntry, String)> {
        let v = self.mounts.read();
        v.iter().find_map(|m| lpath::strip_prefix(path, &m.info.path).map(|rel| (m.clone(), rel.to_string())))
    }

    /// Whether a mount point lies at or below `path`, other than `except`.
    pub(crate) fn any_under(&self, path: &str, except: Option<&str>) -> bool {
        let v = self.mounts.read();
        v.iter().any(|m| Some(m.info.path.as_str()) != except && lpath::strip_prefix(&m.info.path, path).is_some())
    }
}

impl Master {
    pub(crate) fn load_mounts(&self) -> Result<()> {
        let r = self.ns().read()?;
        let t = r.open_table(MOUNTS).map_err(db_err)?;
        let mut v = Vec::new();
        for e in t.iter().map_err(db_err)? {
            let (_, val) = e.map_err(db_err)?;
            let info: pb::MountInfo = decode(val.value())?;
            let opts: BTreeMap<String, String> = info.options.clone().into_iter().collect();
            let ufs = Ufs::new(&info.uri, &opts, self.inner.cfg.ufs_timeout)?;
            v.push(MountEntry { info, ufs });
        }
        self.inner.mounts.set(v);
        Ok(())
    }

    /// Give the top-level directories (S3 buckets) that have no time, made before mounts and
    /// imported prefixes were given one, the time of this start: S3 clients show it as the
    /// bucket's creation date, and 1970 is no answer. Run once at start; a no-op after.
    pub(crate) async fn date_undated_buckets(&self) -> Result<()> {
        // Looked for in a read transaction: a start with nothing to date writes nothing.
        let undated: Vec<u64> = {
            let r = self.ns().read()?;
            let (ch, inodes) = (r.open_table(CHILDREN).map_err(db_err)?, r.open_table(INODES).map_err(db_err)?);
            let mut v = Vec::new();
            for e in ch.range((ROOT_ID, "")..(ROOT_ID + 1, "")).map_err(db_err)? {
                let id = e.map_err(db_err)?.1.value();
                if get_inode(&inodes, id)?.is_some_and(|rec| rec.is_dir && rec.mtime_ms <= 0) {
                    v.push(id);
                }
            }
            v
        };
        if undated.is_empty() {
            return Ok(());
        }
        let n = undated.len();
        self.propose(Op::DateBuckets(pb::DateBuckets { inode_ids: undated })).await?;
        tracing::info!(count = n, "dated top-level directories that had no time");
        Ok(())
    }

    /// The mount holding `path` and the path relative to the mount's UFS root.
    pub(crate) fn mount_for(&self, path: &str) -> Result<(MountEntry, String)> {
        self.inner.mounts.of(path).ok_or_else(|| Error::invalid(format!("path {path} is outside every mount")))
    }

    pub(crate) fn is_mount_point(&self, path: &str) -> bool {
        self.inner.mounts.at(path).is_some()
    }

    pub async fn mount(&self, req: pb::MountRequest) -> Result<pb::MountInfo> {
        self.mount_call(req, &CallId::NONE).await
    }

    /// [`Master::mount`] for a client's call `id`: its resend (the first try committed, its
    /// answer lost in a failover) answers the mount the first try added, not "already a
    /// mount point".
    pub(crate) async fn mount_call(&self, req: pb::MountRequest, id: &CallId) -> Result<pb::MountInfo> {
        let first = |r: pb::CommandResult| {
            r.mount.map(redacted).ok_or_else(|| Error::internal("a mount command's result holds no mount"))
        };
        self.once(id, first, self.add_mount(req, id)).await
    }

    async fn add_mount(&self, req: pb::MountRequest, id: &CallId) -> Result<pb::MountInfo> {
        let path = normalize(&req.path)?;
        let opts: BTreeMap<String, String> = req.options.clone().into_iter().collect();
        locus_ufs::check_mount_target(&req.uri, &opts, &self.inner.protected)?;
        let ufs = Ufs::new(&req.uri, &opts, self.inner.cfg.ufs_timeout)?;
        if pb::WriteType::try_from(req.write_type).is_err() {
            return Err(Error::invalid(format!("unknown write type {}", req.write_type)));
        }
        if self.is_mount_point(&path) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} is already a mount point")));
        }
        if path != "/" {
            let (parent_path, _) = lpath::parent_and_name(&path)?;
            let parent = self.must_resolve(parent_path).await?;
            if !parent.is_dir {
                return Err(Error::new(ErrorKind::NotADirectory, format!("{parent_path} is not a directory")));
            }
            match self.resolve(&path).await {
                Ok(Some(_)) => {
                    return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} exists; mount on a new path")));
                }
                // absent, or outside every mount (no root mount): free to mount
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
                Err(e) => return Err(e),
            }
        }
        tokio::time::timeout(self.inner.cfg.ufs_timeout, ufs.check()).await.map_err(|_| {
            Error::unavailable(format!("{} did not answer within {:?}", req.uri, self.inner.cfg.ufs_timeout))
        })??;
        let sync = if req.sync_interval_ms == 0 {
            self.inner.cfg.default_sync_interval.as_millis() as u64
        } else {
            req.sync_interval_ms
        };
        let info = pb::MountInfo {
            id: 0,
            path: path.clone(),
            uri: req.uri,
            options: opts.clone(),
            readonly: req.readonly,
            sync_interval_ms: sync,
            write_type: req.write_type,
            ..Default::default()
        };
        let added = self.propose_call(id, Op::AddMount(pb::AddMount { info: Some(info) })).await?;
        let info = added.mount.ok_or_else(|| Error::internal("a mount command returned no mount"))?;
        self.inner.mounts.add(MountEntry { info: info.clone(), ufs });
        tracing::info!(path = %info.path, uri = %info.uri, "mounted");
        Ok(redacted(info))
    }

    pub async fn unmount(&self, path: &str) -> Result<()> {
        self.unmount_call(path, &CallId::NONE).await
    }

    /// [`Master::unmount`] for a client's call `id`: its resend answers what the first
    /// try did, not "not a mount point".
    pub(crate) async fn unmount_call(&self, path: &str, id: &CallId) -> Result<()> {
        self.once(id, |_| Ok(()), self.remove_mount(path, id)).await
    }

    async fn remove_mount(&self, path: &str, id: &CallId) -> Result<()> {
        let path = normalize(path)?;
        if path == "/" {
            return Err(Error::invalid("cannot unmount the root mount"));
        }
        let m = self.inner.mounts.at(&path).ok_or_else(|| Error::not_found(format!("{path} is not a mount point")))?;
        if self.inner.mounts.any_under(&path, Some(&path)) {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} has mounts below it")));
        }
        let (parent_path, name) = lpath::parent_and_name(&path)?;
        let mount_id = m.info.id;
        let c = pb::RemoveMount { mount_id, parent_path: parent_path.to_string(), name: name.to_string() };
        let (_, fx) = self.propose_only(id, Op::RemoveMount(c)).await?;
        self.inner.mounts.remove(mount_id);
        self.carry_out(fx);
        Ok(())
    }

    /// The mount table; with `secrets` false, credentials are redacted.
    pub fn mount_table(&self, secrets: bool) -> Vec<pb::MountInfo> {
        let mut v = self.inner.mounts.infos();
        if !secrets {
            v = v.into_iter().map(redacted).collect();
        }
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    pub fn get_mount(&self, id: u64) -> Result<pb::MountInfo> {
        self.inner
            .mounts
            .by_id(id)
            .map(|m| m.info)
            .ok_or_else(|| Error::not_found(format!("mount {id} does not exist")))
    }
}

/// A mount as clients may see it: option values that are credentials become `***`.
/// Only the services (`GetMount`, for workers) get the real values.
pub(crate) fn redacted(mut info: pb::MountInfo) -> pb::MountInfo {
    for (k, val) in info.options.iter_mut() {
        let k = k.to_ascii_lowercase();
        if ["secret", "token", "password", "credential", "session"].iter().any(|w| k.contains(w)) {
            *val = "***".into();
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_for_clients() {
        let mut info = pb::MountInfo { path: "/s3".into(), uri: "s3://b/".into(), ..Default::default() };
        for (k, v) in [
            ("secret_access_key", "S1"),
            ("session_token", "S2"),
            ("Password", "S3"),
            ("access_key_id", "AKIA"),
            ("endpoint", "http://127.0.0.1:9000"),
        ] {
            info.options.insert(k.into(), v.into());
        }
        let r = redacted(info);
        for k in ["secret_access_key", "session_token", "Password"] {
            assert_eq!(r.options[k], "***", "{k}");
        }
        assert_eq!(r.options["access_key_id"], "AKIA");
        assert_eq!(r.options["endpoint"], "http://127.0.0.1:9000");
    }
}
