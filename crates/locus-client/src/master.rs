//! The master's RPCs: metadata, the namespace and its mounts, pins, replication, the
//! report, metadata search, and creating empty files (no worker involved).

use std::time::Duration;

use locus_common::Result;
use locus_common::config::WriteType;
use locus_proto::pb;

use crate::{Client, Retry};

impl Client {
    pub async fn status(&self, path: &str, with_blocks: bool) -> Result<pb::FileInfo> {
        let r = pb::GetStatusRequest { path: path.into(), with_blocks };
        self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.get_status(r).await }).await
    }

    /// One page of a listing: entries after `start_after` (or from it, when `inclusive`)
    /// in name order.
    pub async fn list_page(
        &self,
        path: &str,
        start_after: &str,
        inclusive: bool,
        limit: u32,
    ) -> Result<(Vec<pb::FileInfo>, bool)> {
        let r = pb::ListStatusRequest { path: path.into(), start_after: start_after.into(), limit, inclusive };
        let r = self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.list_status(r).await }).await?;
        Ok((r.entries, r.truncated))
    }

    /// Visit every entry of a listing, page by page (optionally recursing into directories).
    pub async fn list_each(&self, path: &str, recursive: bool, mut f: impl FnMut(&pb::FileInfo)) -> Result<()> {
        let mut dirs = vec![path.to_string()];
        while let Some(d) = dirs.pop() {
            let mut after = String::new();
            let mut subdirs = Vec::new();
            loop {
                let (page, more) = self.list_page(&d, &after, false, 0).await?;
                for e in &page {
                    f(e);
                    if recursive && e.is_dir && e.path != d {
                        subdirs.push(e.path.clone());
                    }
                }
                match (more, page.last()) {
                    (true, Some(l)) => after = l.name.clone(),
                    _ => break,
                }
            }
            subdirs.reverse();
            dirs.extend(subdirs);
        }
        Ok(())
    }

    pub async fn mkdir(&self, path: &str, recursive: bool) -> Result<()> {
        let r = pb::PathRequest { path: path.into(), recursive };
        // `mkdir -p` is idempotent: sent again, it makes nothing twice.
        let retry = if recursive { Retry::Idempotent } else { Retry::Once };
        self.rpc(retry, r, |mut m, r| async move { m.create_directory(r).await }).await?;
        Ok(())
    }

    pub async fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        let r = pb::PathRequest { path: path.into(), recursive };
        self.rpc(Retry::Once, r, |mut m, r| async move { m.delete(r).await }).await?;
        Ok(())
    }

    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        let r = pb::RenameRequest { src: src.into(), dst: dst.into() };
        self.rpc(Retry::Once, r, |mut m, r| async move { m.rename(r).await }).await?;
        Ok(())
    }

    pub async fn mount(&self, req: pb::MountRequest) -> Result<pb::MountInfo> {
        self.rpc(Retry::Once, req, |mut m, r| async move { m.mount(r).await }).await
    }

    pub async fn unmount(&self, path: &str) -> Result<()> {
        let r = pb::PathRequest { path: path.into(), recursive: false };
        self.rpc(Retry::Once, r, |mut m, r| async move { m.unmount(r).await }).await?;
        Ok(())
    }

    pub async fn mount_table(&self) -> Result<Vec<pb::MountInfo>> {
        let t = self.rpc(Retry::Idempotent, pb::Empty {}, |mut m, r| async move { m.get_mount_table(r).await }).await?;
        Ok(t.mounts)
    }

    pub async fn set_pinned(&self, path: &str, pinned: bool, recursive: bool) -> Result<u64> {
        let r = pb::SetPinnedRequest { path: path.into(), pinned, recursive };
        Ok(self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.set_pinned(r).await }).await?.count)
    }

    /// Queue the persist of a MUST_CACHE file; returns its status (see `persist_state`).
    pub async fn persist(&self, path: &str) -> Result<pb::FileInfo> {
        let r = pb::PathRequest { path: path.into(), recursive: false };
        self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.persist(r).await }).await
    }

    /// Retry or drop the persist-queue operations given up at or below `path` (`locus
    /// report` lists them). Returns how many; `NotFound` when there are none.
    pub async fn resolve_persist_failures(&self, path: &str, action: pb::PersistFailureAction) -> Result<u64> {
        let r = pb::PersistFailuresRequest { path: path.into(), action: action.into() };
        Ok(self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.resolve_persist_failures(r).await }).await?.count)
    }

    pub async fn set_replication(&self, path: &str, min: u32, max: u32, recursive: bool) -> Result<u64> {
        let r = pb::SetReplicationRequest { path: path.into(), min, max, recursive };
        Ok(self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.set_replication(r).await }).await?.count)
    }

    pub async fn free(&self, path: &str, recursive: bool) -> Result<u64> {
        Ok(self.free_counted(path, recursive).await?.0)
    }

    /// [`free`](Client::free), also returning how many files were skipped (pinned, or not
    /// persisted) in a tree.
    pub async fn free_counted(&self, path: &str, recursive: bool) -> Result<(u64, u64)> {
        let r = pb::PathRequest { path: path.into(), recursive };
        let c = self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.free(r).await }).await?;
        Ok((c.count, c.skipped))
    }

    /// Replace the object metadata of a file or directory (`tags_only`: just its tags).
    /// Default metadata clears it.
    pub async fn set_object_meta(&self, path: &str, meta: pb::ObjectMeta, tags_only: bool) -> Result<pb::FileInfo> {
        let r = pb::SetObjectMetaRequest { path: path.into(), meta: Some(meta), tags_only };
        self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.set_object_meta(r).await }).await
    }

    /// One page of a metadata search (Zenko's `?search=` syntax; see `SearchRequest`).
    pub async fn search(&self, req: pb::SearchRequest) -> Result<pb::SearchResponse> {
        self.rpc(Retry::Idempotent, req, |mut m, r| async move { m.search(r).await }).await
    }

    /// Index objects from an inventory (encoded entries, or inventory records for the
    /// master to parse; `None`: nothing more): upserts by path, so a retried or repeated
    /// request changes nothing more. Returns (indexed, skipped as already in the
    /// namespace). With `commit`, answers once everything imported so far is searchable
    /// and on disk (an import's last request sets it).
    pub async fn import_catalog(
        &self,
        objects: Option<pb::import_catalog_request::Objects>,
        commit: bool,
    ) -> Result<(u64, u64)> {
        // Each attempt sends the same shared bytes.
        let r = pb::ImportCatalogRequest { objects, commit };
        let r = self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.import_catalog(r).await }).await?;
        Ok((r.count, r.skipped))
    }

    pub async fn report(&self) -> Result<pb::Report> {
        self.rpc(Retry::Idempotent, pb::Empty {}, |mut m, r| async move { m.get_report(r).await }).await
    }

    /// Client reads by host, source and reason over the last `since` (zero: all the
    /// master keeps), of host `host` only unless it is empty.
    pub async fn reads(&self, since: Duration, host: &str) -> Result<pb::ReadsResponse> {
        let r = pb::ReadsRequest { since_ms: since.as_millis() as u64, host: host.into() };
        self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.get_reads(r).await }).await
    }

    /// Whether each mount's UFS answers the master.
    pub async fn check_ufs(&self) -> Result<Vec<pb::UfsCheck>> {
        Ok(self.rpc(Retry::Idempotent, pb::Empty {}, |mut m, r| async move { m.check_ufs(r).await }).await?.mounts)
    }

    /// The master group's members, as the master asked knows them.
    pub async fn masters(&self) -> Result<pb::MasterGroupStatus> {
        self.rpc(Retry::Idempotent, pb::Empty {}, |mut m, r| async move { m.get_masters(r).await }).await
    }

    /// Adds the master at raft address `raft_address` to the group (a client proving the
    /// master's role: [`Client::with_identity`]). Adding a member twice adds it once.
    pub async fn add_master(&self, raft_address: &str) -> Result<pb::MasterGroupStatus> {
        let r = pb::MasterAddressRequest { raft_address: raft_address.into() };
        self.rpc(Retry::Idempotent, r, |mut m, r| async move { m.add_master(r).await }).await
    }

    /// Removes the master at raft address `raft_address` from the group.
    pub async fn remove_master(&self, raft_address: &str) -> Result<pb::MasterGroupStatus> {
        let r = pb::MasterAddressRequest { raft_address: raft_address.into() };
        self.rpc(Retry::IfNotSent, r, |mut m, r| async move { m.remove_master(r).await }).await
    }

    /// Create an empty file: one master call, no worker involved.
    pub async fn touch(&self, path: &str, write_type: Option<WriteType>) -> Result<pb::FileInfo> {
        let wt = pb::WriteType::from_opt(write_type.or(self.cfg.write_type)).into();
        let r = pb::CreateFileRequest { path: path.into(), overwrite: false, write_type: wt, complete_empty: true };
        self.rpc(Retry::Once, r, |mut m, r| async move { m.create_file(r).await }).await
    }

    /// Create an empty file the way a data write does: CreateFile, then CompleteFile.
    pub async fn create_and_complete_empty(&self, path: &str, write_type: Option<WriteType>) -> Result<pb::FileInfo> {
        let wt = pb::WriteType::from_opt(write_type.or(self.cfg.write_type)).into();
        let r = pb::CreateFileRequest { path: path.into(), overwrite: false, write_type: wt, complete_empty: false };
        let target = self.rpc(Retry::Once, r, |mut m, r| async move { m.create_file(r).await }).await?;
        let req = pb::CompleteFileRequest {
            path: target.path,
            version: target.version,
            write_type: target.write_type,
            ..Default::default()
        };
        self.rpc(Retry::Once, req, |mut m, r| async move { m.complete_file(r).await }).await
    }
}
