//! The Locus master: the namespace (inodes, the mount table, file → blocks,
//! block → workers) in redb, the worker registry with heartbeats, lazy loading and
//! sync of UFS metadata with fingerprints, and the cluster report and metrics.
//!
//! The master is never on the data path: clients get block locations here and move
//! bytes with workers directly. It depends on `locus-common`, `locus-proto` and
//! `locus-ufs`, and must never depend on `locus-worker` or `locus-client`.
//!
//! Modules: `resolve` (path resolution, lazy loading and sync from the UFS, listings),
//! `ops` (mkdir, delete, rename), `files` (writes, persist, pins, blocks), `mounts`,
//! `workers` (registry and heartbeats), `metrics` (metrics and the report), `namespace`
//! (the commit path and shared record edits), `store` (redb and its group committer),
//! `persist` (the persist queue), `replication`, `search` (the metadata catalog and
//! its search, and the inventory records an import sends), `raft` (the replicated log of
//! a master group and its raft port), `leading` (who takes calls in a group, the
//! take-over of an elected master, membership), and the `service` and `web` front ends.
//! Durable changes run on the store's committer thread, never on the async runtime.

mod absent;
mod apply;
#[cfg(test)]
mod apply_tests;
mod calls;
mod files;
mod journal;
mod leading;
mod markers;
mod metrics;
mod mounts;
mod namespace;
mod ops;
mod persist;
mod persist_failures;
mod persist_tracker;
mod raft;
mod reads;
mod registry;
mod replication;
mod resolve;
mod search;
mod service;
pub mod store;
mod web;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;

use locus_common::config::MasterConfig;
use locus_common::security::{Secret, Verifier};
use locus_common::{Error, Result};
use locus_proto::pb;
use locus_proto::tls::Tls;
use parking_lot::Mutex;
use store::Store;
use tokio::net::TcpListener;

use calls::CallId;
use locus_common::now_ms;
use metrics::Metrics;
use mounts::MountEntry;
use registry::Registry;

pub use web::render_metrics;

/// Entries returned by one `ListStatus` page when the caller sets no limit.
pub const DEFAULT_LIST_PAGE: u32 = 1000;

pub use locus_common::UNPERSISTED_FINGERPRINT;

/// Whether the UFS holds what the namespace says (so a UFS sync may refresh the entry).
fn is_persisted(rec: &pb::InodeRecord) -> bool {
    rec.persist_state().is_persisted()
}

pub(crate) struct Inner {
    cfg: MasterConfig,
    /// What no mount may hold: the metadata dir and the credential files.
    protected: Vec<std::path::PathBuf>,
    /// The namespace's state (`namespace`).
    ns: Arc<namespace::Namespace>,
    /// This master's member of its replicated group (`raft`), when it has one
    /// (`master.raft_address`): the namespace's changes go through its log.
    group: Option<raft::Group>,
    /// The search index (`search`), kept current from the namespace's journal.
    catalog: search::indexer::Catalog,
    /// The mount table (`mounts`).
    mounts: mounts::MountTable,
    /// The registered workers (`registry`).
    workers: Registry,
    /// Client reads by host, source and reason, from the workers' heartbeats.
    reads: Mutex<reads::ReadLog>,
    metrics: Metrics,
    /// The persist queue's pending operations (mirrored from redb) and their run state.
    persist: persist_tracker::PersistState,
    /// The background jobs (persist, replication), for reports.
    jobs: Mutex<Vec<locus_common::job::JobWatch>>,
    /// Checks callers' credentials; holds the cluster secret the master presents to workers.
    verifier: Verifier,
    /// TLS of the RPC port and of the master's connections to workers.
    tls: Tls,
    /// UFS paths lookups found missing (`absent`).
    absent: absent::AbsentPaths,
}

/// Builds a [`Master`].
pub struct MasterBuilder {
    cfg: MasterConfig,
    root_ufs: Option<String>,
    secret: Secret,
    tls: Tls,
    protected: Vec<std::path::PathBuf>,
}

impl MasterBuilder {
    /// A master whose callers must present `secret` (workers) or its client token
    /// (clients); see `locus_common::security`.
    pub fn new(cfg: MasterConfig, secret: Secret) -> Self {
        MasterBuilder { cfg, root_ufs: None, secret, tls: Tls::none(), protected: Vec::new() }
    }

    /// Files no mount may hold (the credential files): with the metadata dir, a
    /// `file://` mount whose root contains one of them is refused
    /// (`locus_ufs::check_mount_target`).
    pub fn protect(mut self, paths: impl IntoIterator<Item = std::path::PathBuf>) -> Self {
        self.protected.extend(paths);
        self
    }
    /// TLS of the RPC port (see `locus_proto::tls`) and of this master's connections to
    /// workers. Default none.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }
    /// UFS mounted at `/` when the namespace is new. `None` leaves `/` without a mount,
    /// so every path must fall under an explicit mount.
    pub fn root_ufs(mut self, uri: Option<String>) -> Self {
        self.root_ufs = uri;
        self
    }
    /// Open the metadata store (recovering mounts and namespace) and mount the root UFS
    /// on first start.
    pub async fn build(self) -> Result<Master> {
        let (dir, cache) = (self.cfg.meta_dir.clone(), self.cfg.meta_cache_size.as_u64() as usize);
        let heap = self.cfg.search_index_memory.as_u64() as usize;
        let (store, catalog) = tokio::task::spawn_blocking(move || -> Result<_> {
            let store = Store::open(&dir, cache)?;
            let catalog = search::indexer::Catalog::open(&dir.join("search"), &store, heap)?;
            Ok((store, catalog))
        })
        .await
        .map_err(|e| Error::internal(format!("open the metadata store: {e}")))??;
        let mut protected = self.protected;
        protected.push(self.cfg.meta_dir.clone());
        let workers = Registry::new(self.cfg.worker_timeout);
        let ns = Arc::new(namespace::Namespace::new(store, self.cfg.block_size.as_u64()));
        let group = match self.cfg.raft_address.as_str() {
            "" => None,
            addr => {
                let node = raft::MasterNode { raft_address: addr.into(), rpc_address: self.cfg.rpc_address.clone() };
                let (peers, secret, tls) = (self.cfg.peers.clone(), self.secret.clone(), self.tls.clone());
                let setup = raft::Setup { node, peers, secret, tls };
                Some(raft::Group::start(ns.clone(), &self.cfg.meta_dir, setup).await?)
            }
        };
        let issuer = match self.cfg.raft_address.as_str() {
            "" => format!("rpc {}", self.cfg.rpc_address),
            a => format!("rpc {a}"),
        };
        let inner = Arc::new(Inner {
            protected,
            ns,
            group,
            cfg: self.cfg,
            catalog,
            mounts: Default::default(),
            workers,
            reads: Mutex::new(reads::ReadLog::default()),
            metrics: Metrics::new()?,
            persist: Default::default(),
            jobs: Mutex::new(Vec::new()),
            // Its nonces are its own: a proof made for another master of the group is not taken.
            verifier: Verifier::issuing(&self.secret, &issuer),
            tls: self.tls,
            absent: absent::AbsentPaths::default(),
        });
        let m = Master { inner };
        m.load_mounts()?;
        if !m.take_over_now().await? {
            // A member that does not lead: it takes over when it is elected.
            return Ok(m);
        }
        let no_mounts = m.inner.mounts.is_empty();
        if no_mounts && let Some(uri) = self.root_ufs {
            if let Some(dir) = uri.strip_prefix("file://") {
                // Made 0700: other local users read nothing of what is persisted there.
                locus_common::security::create_private_dir(std::path::Path::new(dir))?;
            }
            m.mount(pb::MountRequest { path: "/".into(), uri, ..Default::default() }).await?;
        }
        Ok(m)
    }
}

/// The master. Cheap to clone.
#[derive(Clone)]
pub struct Master {
    inner: Arc<Inner>,
}

impl Master {
    /// How many handles of this master exist (this one included). Work still in flight
    /// after `serve` returned (a change on the committer thread, a request finishing)
    /// holds one; the metadata store closes when the last goes.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Whether this master takes calls: it leads its group and has taken over (always,
    /// without a group).
    pub fn is_leader(&self) -> bool {
        self.leads()
    }

    /// Its group's members as it knows them (an error without a group).
    pub fn members(&self) -> Result<pb::MasterGroupStatus> {
        self.masters()
    }
}

/// Addresses a running master listens on.
#[derive(Clone, Copy, Debug)]
pub struct MasterAddrs {
    pub rpc: SocketAddr,
    pub web: SocketAddr,
}

impl Master {
    /// Serve gRPC and the web page on the given listeners until `shutdown` resolves.
    pub async fn serve(
        &self,
        rpc: TcpListener,
        web: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut rx2 = rx.clone();
        let web_task = tokio::spawn(web::serve(self.clone(), web, async move {
            let _ = rx2.changed().await;
        }));
        let persist_job = persist::start(self.clone());
        let replication_job = replication::start(self.clone());
        let indexer_job = search::indexer::start(self.clone());
        let leading_job = leading::start(self.clone());
        *self.inner.jobs.lock() = vec![persist_job.watch(), replication_job.watch(), indexer_job.watch()];
        let mut rx3 = rx;
        let res = service::serve(self.clone(), rpc, async move {
            tokio::select! {
                _ = shutdown => {},
                _ = rx3.changed() => {},
            }
        })
        .await;
        let _ = tx.send(true);
        let _ = web_task.await;
        persist_job.stop().await;
        replication_job.stop().await;
        indexer_job.stop().await;
        leading_job.stop().await;
        if let Some(g) = &self.inner.group {
            g.shutdown().await;
        }
        res
    }
}
