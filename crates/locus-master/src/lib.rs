//! The Locus master: the namespace (inodes, the mount table, file → blocks,
//! block → workers) in redb, the worker registry with heartbeats, lazy loading and
//! sync of UFS metadata with fingerprints, and the cluster report and metrics.
//!
//! The master is never on the data path: clients get block locations here and move
//! bytes with workers directly. It depends on `locus-common`, `locus-proto` and
//! `locus-ufs`, and must never depend on `locus-worker` or `locus-client`.

mod persist;
mod replication;
mod service;
pub mod store;
mod web;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use locus_common::config::{MasterConfig, WriteType};
use locus_common::metrics::{BYTES_READ, CACHE_REQUESTS, EVICTIONS};
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use locus_ufs::{Ufs, UfsStatus};
use parking_lot::{Mutex, RwLock};
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use prost::Message;
use redb::{ReadableTable, WriteTransaction};
use store::*;
use tokio::net::TcpListener;

pub use web::render_metrics;

/// Entries returned by one `ListStatus` page when the caller sets no limit.
pub const DEFAULT_LIST_PAGE: u32 = 1000;

/// Persist states as `stat` shows them. A record stores "" for PERSISTED.
pub const NOT_PERSISTED: &str = "NOT_PERSISTED";
pub const TO_BE_PERSISTED: &str = "TO_BE_PERSISTED";
pub const PERSISTED: &str = "PERSISTED";
pub const LOST: &str = "LOST";
pub use locus_common::UNPERSISTED_FINGERPRINT;

/// Whether the UFS holds what the namespace says (so a UFS sync may refresh the entry).
fn is_persisted(rec: &pb::InodeRecord) -> bool {
    rec.persist_state.is_empty() || rec.persist_state == PERSISTED
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[derive(Clone)]
struct MountEntry {
    info: pb::MountInfo,
    ufs: Ufs,
}

struct WorkerState {
    address: pb::WorkerAddress,
    last_heartbeat: Instant,
    tiers: Vec<pb::TierUsage>,
    counters: pb::ReadCounters,
    pending_remove: Vec<u64>,
    /// Heartbeats received; a worker has acted on a response once the next one arrives.
    beats: u64,
    /// The pin epoch the worker last reported.
    pin_epoch: u64,
}

struct Metrics {
    registry: Registry,
    bytes_read: IntCounterVec,
    cache_requests: IntCounterVec,
    evictions: IntCounter,
    workers_live: IntGauge,
    tier_capacity: IntGaugeVec,
    tier_used: IntGaugeVec,
    tier_pooled: IntGaugeVec,
    hit_ratio: Gauge,
    files_loaded: IntCounter,
    corrupt_blocks: IntCounter,
    /// Persist-queue operations carried out, by kind and result (`done`, or `skipped`: a
    /// persist whose file was deleted or overwritten before its turn, no UFS write).
    persist_ops: IntCounterVec,
    /// Bytes of the files the persist queue has persisted (a retried persist counts once).
    persisted_bytes: IntCounter,
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let bytes_read =
            IntCounterVec::new(Opts::new(BYTES_READ, "Bytes delivered to readers, by source"), &["source"]).unwrap();
        let cache_requests =
            IntCounterVec::new(Opts::new(CACHE_REQUESTS, "Block reads by cache result"), &["result"]).unwrap();
        let evictions = IntCounter::new(EVICTIONS, "Blocks evicted from a tier").unwrap();
        let workers_live = IntGauge::new("locus_workers_live", "Workers with a recent heartbeat").unwrap();
        let tier_capacity =
            IntGaugeVec::new(Opts::new("locus_tier_capacity_bytes", "Cache capacity per tier"), &["tier"]).unwrap();
        let tier_used =
            IntGaugeVec::new(Opts::new("locus_tier_used_bytes", "Cache usage per tier"), &["tier"]).unwrap();
        let hit_ratio = Gauge::new("locus_cache_hit_ratio", "Block cache hits over all block reads").unwrap();
        let files_loaded =
            IntCounter::new("locus_ufs_entries_loaded_total", "UFS entries loaded into the namespace").unwrap();
        registry.register(Box::new(bytes_read.clone())).unwrap();
        registry.register(Box::new(cache_requests.clone())).unwrap();
        registry.register(Box::new(evictions.clone())).unwrap();
        registry.register(Box::new(workers_live.clone())).unwrap();
        registry.register(Box::new(tier_capacity.clone())).unwrap();
        registry.register(Box::new(tier_used.clone())).unwrap();
        let tier_pooled = IntGaugeVec::new(
            Opts::new("locus_tier_pooled_bytes", "Free cache space held in pooled block files per tier"),
            &["tier"],
        )
        .unwrap();
        registry.register(Box::new(tier_pooled.clone())).unwrap();
        registry.register(Box::new(hit_ratio.clone())).unwrap();
        registry.register(Box::new(files_loaded.clone())).unwrap();
        let corrupt_blocks = IntCounter::new(
            "locus_block_corruptions_total",
            "Bad block copies found by their crc32c (on a disk tier or in a transfer) and dropped",
        )
        .unwrap();
        registry.register(Box::new(corrupt_blocks.clone())).unwrap();
        let persist_ops = IntCounterVec::new(
            Opts::new("locus_persist_ops_total", "Persist-queue operations carried out, by kind and result"),
            &["kind", "result"],
        )
        .unwrap();
        let persisted_bytes = IntCounter::new(
            "locus_persisted_bytes_total",
            "Bytes of the files persisted to UFSes by the persist queue",
        )
        .unwrap();
        registry.register(Box::new(persist_ops.clone())).unwrap();
        registry.register(Box::new(persisted_bytes.clone())).unwrap();
        Metrics {
            registry,
            bytes_read,
            cache_requests,
            evictions,
            workers_live,
            tier_capacity,
            tier_used,
            tier_pooled,
            hit_ratio,
            files_loaded,
            corrupt_blocks,
            persist_ops,
            persisted_bytes,
        }
    }
}

pub(crate) struct Inner {
    cfg: MasterConfig,
    store: Store,
    mounts: RwLock<Vec<MountEntry>>,
    workers: Mutex<HashMap<u64, WorkerState>>,
    metrics: Metrics,
    /// The persist queue's pending operations (mirrored from redb) and their run state.
    persist: Mutex<persist::Tracker>,
    persist_wake: tokio::sync::Notify,
}

/// Builds a [`Master`].
pub struct MasterBuilder {
    cfg: MasterConfig,
    root_ufs: Option<String>,
}

impl MasterBuilder {
    pub fn new(cfg: MasterConfig) -> Self {
        MasterBuilder { cfg, root_ufs: None }
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
        let store = Store::open(&self.cfg.meta_dir, self.cfg.meta_cache_size.as_u64() as usize)?;
        let inner = Arc::new(Inner {
            cfg: self.cfg,
            store,
            mounts: RwLock::new(Vec::new()),
            workers: Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
            persist: Mutex::new(persist::Tracker::default()),
            persist_wake: tokio::sync::Notify::new(),
        });
        let m = Master { inner };
        m.load_mounts()?;
        m.load_persist_queue()?;
        if m.inner.mounts.read().is_empty() {
            if let Some(uri) = self.root_ufs {
                if let Some(dir) = uri.strip_prefix("file://") {
                    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {dir}"), e))?;
                }
                m.mount(pb::MountRequest { path: "/".into(), uri, ..Default::default() }).await?;
            }
        }
        Ok(m)
    }
}

/// The master. Cheap to clone.
#[derive(Clone)]
pub struct Master {
    inner: Arc<Inner>,
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
        res
    }

    fn load_mounts(&self) -> Result<()> {
        let r = self.inner.store.read()?;
        let t = r.open_table(MOUNTS).map_err(db_err)?;
        let mut v = Vec::new();
        for e in t.iter().map_err(db_err)? {
            let (_, val) = e.map_err(db_err)?;
            let info: pb::MountInfo = decode(val.value())?;
            let opts: BTreeMap<String, String> = info.options.clone().into_iter().collect();
            let ufs = Ufs::new(&info.uri, &opts, self.inner.cfg.ufs_timeout)?;
            v.push(MountEntry { info, ufs });
        }
        v.sort_by_key(|m| std::cmp::Reverse(m.info.path.len()));
        *self.inner.mounts.write() = v;
        Ok(())
    }

    /// The mount holding `path` and the path relative to the mount's UFS root.
    fn mount_for(&self, path: &str) -> Result<(MountEntry, String)> {
        let mounts = self.inner.mounts.read();
        for m in mounts.iter() {
            if let Some(rel) = lpath::strip_prefix(path, &m.info.path) {
                return Ok((m.clone(), rel.to_string()));
            }
        }
        Err(Error::invalid(format!("path {path} is outside every mount")))
    }

    fn is_mount_point(&self, path: &str) -> bool {
        self.inner.mounts.read().iter().any(|m| m.info.path == path)
    }

    fn sync_due(rec: &pb::InodeRecord, m: &MountEntry) -> bool {
        now_ms() - rec.synced_ms >= m.info.sync_interval_ms as i64
    }

    fn block_count(len: u64, bs: u64) -> u64 {
        len.div_ceil(bs.max(1))
    }

    // ------------------------------------------------------------------ namespace

    /// Insert or refresh `name` under `parent` from a UFS status. Returns the child id.
    /// Inside `w`; returns the blocks to drop when a file's fingerprint changed.
    fn upsert_from_ufs(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        st: &UfsStatus,
        now: i64,
        dropped: &mut Vec<(u64, u64)>,
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
                self.remove_subtree(w, parent, name, dropped)?;
                return self.upsert_from_ufs(w, parent, name, st, now, dropped);
            }
            if !rec.is_dir && rec.fingerprint != fp {
                self.drop_version(w, &rec, dropped)?;
                rec.version = next_id(w, "version", 1)?;
                w.open_table(VERSIONS).map_err(db_err)?.insert(rec.version, rec.id).map_err(db_err)?;
                if rec.pinned {
                    w.open_table(PINNED).map_err(db_err)?.insert(rec.version, ()).map_err(db_err)?;
                    self.bump_pin_epoch(w)?;
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
        let rec = self.new_inode(w, parent, name, st.is_dir, st.length, fp, st.mtime_ms, now, None)?;
        self.inner.metrics.files_loaded.inc();
        Ok(rec.id)
    }

    /// Insert a new entry; a file gets `version`, or a new one when `None`.
    #[allow(clippy::too_many_arguments)]
    fn new_inode(
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
    fn drop_version(&self, w: &WriteTransaction, rec: &pb::InodeRecord, dropped: &mut Vec<(u64, u64)>) -> Result<()> {
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

    fn bump_pin_epoch(&self, w: &WriteTransaction) -> Result<()> {
        next_id(w, "pin_epoch", 1).map(|_| ())
    }

    /// Remove `name` under `parent` and everything below it from the namespace.
    fn remove_subtree(
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
    fn queue_removals(&self, dropped: Vec<(u64, u64)>) {
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

    fn read_inode_by_path(&self, path: &str) -> Result<Option<pb::InodeRecord>> {
        let r = self.inner.store.read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let Some(id) = lookup(&ch, path)? else {
            return Ok(None);
        };
        get_inode(&r.open_table(INODES).map_err(db_err)?, id)
    }

    /// Resolve a normalised path, loading it lazily from its UFS and re-checking a file
    /// against the UFS once its mount's sync interval has passed.
    async fn resolve(&self, path: &str) -> Result<Option<pb::InodeRecord>> {
        self.resolve_with(path, false).await
    }

    /// [`Master::resolve`]; with `trust_listing`, a name missing from a directory whose
    /// listing is loaded and fresh (within the sync interval) does not exist, with no UFS
    /// call. Writers use it: a create costs no UFS round trip, and works while the UFS
    /// is away. Readers still look a missing name up in the UFS, so files put there
    /// behind Locus's back are found by path at once.
    async fn resolve_with(&self, path: &str, trust_listing: bool) -> Result<Option<pb::InodeRecord>> {
        if let Some(rec) = self.read_inode_by_path(path)? {
            if rec.is_dir || path == "/" || !is_persisted(&rec) {
                return Ok(Some(rec));
            }
            let (m, rel) = self.mount_for(path)?;
            if !Self::sync_due(&rec, &m) {
                return Ok(Some(rec));
            }
            let st = m.ufs.stat(&rel).await?;
            let (parent_path, name) = lpath::split_parent(path).unwrap();
            let w = self.inner.store.write()?;
            let mut dropped = Vec::new();
            let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, parent_path)?;
            let result = match (st, parent) {
                (Some(st), Some(parent)) => {
                    let id = self.upsert_from_ufs(&w, parent, name, &st, now_ms(), &mut dropped)?;
                    get_inode(&w.open_table(INODES).map_err(db_err)?, id)?
                }
                (None, Some(parent)) => {
                    tracing::info!(path, "file vanished from the UFS; dropping it");
                    self.remove_subtree(&w, parent, name, &mut dropped)?;
                    None
                }
                _ => None,
            };
            w.commit().map_err(db_err)?;
            self.queue_removals(dropped);
            return Ok(result);
        }
        // Walk down, loading missing components from the UFS.
        let mut parent = ROOT_ID;
        let mut cur = String::from("/");
        for comp in lpath::components(path) {
            cur = lpath::join(&cur, comp);
            let existing = {
                let r = self.inner.store.read()?;
                let id = get_child(&r.open_table(CHILDREN).map_err(db_err)?, parent, comp)?;
                match id {
                    Some(id) => Some(id),
                    None => {
                        let prec = get_inode(&r.open_table(INODES).map_err(db_err)?, parent)?
                            .ok_or_else(|| Error::internal("missing parent"))?;
                        if !prec.is_dir {
                            return Ok(None);
                        }
                        if trust_listing && prec.children_loaded {
                            let (m, _) = self.mount_for(&cur)?;
                            if !Self::sync_due(&prec, &m) {
                                return Ok(None);
                            }
                        }
                        None
                    }
                }
            };
            if let Some(id) = existing {
                parent = id;
                continue;
            }
            let (m, rel) = self.mount_for(&cur)?;
            let Some(st) = m.ufs.stat(&rel).await? else {
                return Ok(None);
            };
            let w = self.inner.store.write()?;
            let mut dropped = Vec::new();
            parent = self.upsert_from_ufs(&w, parent, comp, &st, now_ms(), &mut dropped)?;
            w.commit().map_err(db_err)?;
            self.queue_removals(dropped);
        }
        let r = self.inner.store.read()?;
        get_inode(&r.open_table(INODES).map_err(db_err)?, parent)
    }

    async fn must_resolve(&self, path: &str) -> Result<pb::InodeRecord> {
        self.resolve(path).await?.ok_or_else(|| Error::not_found(format!("{path} does not exist")))
    }

    fn live_workers(&self) -> HashMap<u64, ()> {
        let timeout = self.inner.cfg.worker_timeout;
        self.inner
            .workers
            .lock()
            .iter()
            .filter(|(_, s)| s.last_heartbeat.elapsed() < timeout)
            .map(|(id, _)| (*id, ()))
            .collect()
    }

    fn file_info(&self, path: &str, rec: &pb::InodeRecord, with_blocks: bool) -> Result<pb::FileInfo> {
        let (m, rel) = self.mount_for(path)?;
        let mut fi = pb::FileInfo {
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
            persist_state: if is_persisted(rec) { PERSISTED.into() } else { rec.persist_state.clone() },
            replication_min: if rec.replication_min == 0 {
                self.inner.cfg.replication_min
            } else {
                rec.replication_min
            },
            replication_max: rec.replication_max,
            ..Default::default()
        };
        if with_blocks && !rec.is_dir {
            fi.blocks = self.block_infos(rec)?;
        }
        Ok(fi)
    }

    /// The blocks of a file with their live locations.
    fn block_infos(&self, rec: &pb::InodeRecord) -> Result<Vec<pb::BlockInfo>> {
        let live = self.live_workers();
        let r = self.inner.store.read()?;
        let loc = r.open_table(LOCATIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for i in 0..Self::block_count(rec.length, rec.block_size) {
            let b = locus_common::block_id(rec.version, i);
            let offset = i * rec.block_size;
            let mut locations = Vec::new();
            for e in loc.range((b, 0)..=(b, u64::MAX)).map_err(db_err)? {
                let (k, v) = e.map_err(db_err)?;
                let wk = k.value().1;
                if live.contains_key(&wk) {
                    locations.push(pb::BlockLocation { worker_id: wk, tier: v.value().to_string() });
                }
            }
            out.push(pb::BlockInfo { block_id: b, offset, length: rec.block_size.min(rec.length - offset), locations });
        }
        Ok(out)
    }

    pub async fn get_status(&self, path: &str, with_blocks: bool) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        self.file_info(&path, &rec, with_blocks)
    }

    /// Merge the UFS listing of directory `path` into the namespace, page by page.
    async fn load_children(&self, path: &str, dir: &pb::InodeRecord) -> Result<()> {
        let (m, rel) = self.mount_for(path)?;
        let start = now_ms();
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
                let w = self.inner.store.write()?;
                let mut dropped = Vec::new();
                for st in batch.drain(..) {
                    self.upsert_from_ufs(&w, dir.id, &st.path.clone(), &st, start, &mut dropped)?;
                }
                w.commit().map_err(db_err)?;
                self.queue_removals(dropped);
            }
            if done {
                break;
            }
        }
        // Entries not seen in this listing are gone from the UFS (mount points excepted).
        let w = self.inner.store.write()?;
        let mut dropped = Vec::new();
        let stale: Vec<String> = {
            let ch = w.open_table(CHILDREN).map_err(db_err)?;
            let inodes = w.open_table(INODES).map_err(db_err)?;
            let mut v = Vec::new();
            for e in ch.range((dir.id, "")..(dir.id + 1, "")).map_err(db_err)? {
                let (k, id) = e.map_err(db_err)?;
                let name = k.value().1.to_string();
                if let Some(r) = get_inode(&inodes, id.value())? {
                    if r.synced_ms < start && is_persisted(&r) && !self.is_mount_point(&lpath::join(path, &name)) {
                        v.push(name);
                    }
                }
            }
            v
        };
        for name in stale {
            self.remove_subtree(&w, dir.id, &name, &mut dropped)?;
        }
        let mut d = get_inode(&w.open_table(INODES).map_err(db_err)?, dir.id)?.unwrap_or_else(|| dir.clone());
        d.children_loaded = true;
        d.synced_ms = start;
        put_inode(&w, &d)?;
        w.commit().map_err(db_err)?;
        self.queue_removals(dropped);
        Ok(())
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
            return Ok((vec![self.file_info(&path, &rec, false)?], false));
        }
        if let Ok((m, _)) = self.mount_for(&path) {
            // A listing that starts mid-directory (a later page, or S3's start-after) still
            // needs the directory loaded; a due sync waits for a listing from the start.
            if !rec.children_loaded || (start_after.is_empty() && Self::sync_due(&rec, &m)) {
                self.load_children(&path, &rec).await?;
            }
        }
        let limit = if limit == 0 { DEFAULT_LIST_PAGE } else { limit.min(10_000) } as usize;
        let r = self.inner.store.read()?;
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
                out.push(self.file_info(&lpath::join(&path, name), &c, false)?);
            }
        }
        Ok((out, truncated))
    }

    fn writable(&self, path: &str) -> Result<(MountEntry, String)> {
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

    /// Check that `path` may be written and open a write: returns where its bytes go,
    /// the write type that applies (the request's, else the mount's, else the cluster
    /// default), and the new file version whose blocks the write creates.
    /// With `complete_empty`, the file is created empty and complete in one step (one
    /// durable change; THROUGH types write the empty object first).
    pub async fn create_file(
        &self,
        path: &str,
        overwrite: bool,
        write_type: &str,
        complete_empty: bool,
    ) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        if path == "/" {
            return Err(Error::invalid("cannot write to /"));
        }
        if let Some(rec) = self.resolve_with(&path, true).await? {
            if rec.is_dir {
                return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} is a directory")));
            }
            if !overwrite {
                return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} exists")));
            }
        }
        let (parent_path, _) = lpath::split_parent(&path).unwrap();
        self.create_directory(parent_path, true).await?;
        let (m, rel) = self.writable(&path)?;
        let wt = if !write_type.is_empty() {
            WriteType::parse_or_err(write_type)?
        } else if !m.info.write_type.is_empty() {
            WriteType::parse_or_err(&m.info.write_type)?
        } else {
            self.inner.cfg.write_type
        };
        if wt.writes_ufs() {
            // A synchronous UFS write must not race queued changes to the same path.
            self.wait_ufs_quiet(m.info.id, &rel).await?;
        }
        if complete_empty {
            let mut req =
                pb::CompleteFileRequest { path: path.clone(), write_type: wt.as_str().into(), ..Default::default() };
            if wt.writes_ufs() {
                let st = m.ufs.writer(&rel, "", &Default::default()).await?.close().await?;
                req.etag = st.etag;
                req.mtime_ms = st.mtime_ms;
            }
            let parent = self.must_resolve(parent_path).await?;
            return self.commit_complete(req, path.clone(), parent.id, wt, m, rel).await;
        }
        let me = self.clone();
        let (version, pin_epoch) = self
            .inner
            .store
            .mutate(move |w| {
                let version = next_id(w, "version", 1)?;
                w.open_table(VERSIONS).map_err(db_err)?.insert(version, 0).map_err(db_err)?;
                w.open_table(PENDING_WRITES).map_err(db_err)?.insert(version, now_ms()).map_err(db_err)?;
                if wt.needs_durable_copies() {
                    // Pinned from the start: the copies the write makes are the only ones.
                    w.open_table(PINNED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
                    me.bump_pin_epoch(w)?;
                }
                let pin_epoch = get_counter(&w.open_table(COUNTERS).map_err(db_err)?, "pin_epoch")?;
                Ok((version, pin_epoch))
            })
            .await?;
        Ok(pb::FileInfo {
            path: path.clone(),
            mount_id: m.info.id,
            ufs_path: rel,
            block_size: self.inner.cfg.block_size.as_u64(),
            mount_point: m.info.path.clone(),
            version,
            write_type: wt.as_str().into(),
            pin_epoch,
            ..Default::default()
        })
    }

    /// Record a written file: its bytes are in the UFS (THROUGH, CACHE_THROUGH), or in
    /// worker caches (MUST_CACHE), or both until the persist queued here lands
    /// (ASYNC_THROUGH). Replaces an older version of the file.
    pub async fn complete_file(&self, req: pb::CompleteFileRequest) -> Result<pb::FileInfo> {
        let path = normalize(&req.path)?;
        let (parent_path, _) = lpath::split_parent(&path).ok_or_else(|| Error::invalid("bad path"))?;
        let parent = self.must_resolve(parent_path).await?;
        let (m, rel) = self.writable(&path)?;
        let wt = if req.write_type.is_empty() { WriteType::THROUGH } else { WriteType::parse_or_err(&req.write_type)? };
        self.commit_complete(req, path, parent.id, wt, m, rel).await
    }

    async fn commit_complete(
        &self,
        req: pb::CompleteFileRequest,
        path: String,
        parent_id: u64,
        wt: WriteType,
        m: MountEntry,
        rel: String,
    ) -> Result<pb::FileInfo> {
        let now = now_ms();
        let me = self.clone();
        let name = lpath::split_parent(&path).map(|(_, n)| n.to_string()).unwrap_or_default();
        let p2 = path.clone();
        let (rec, dropped, ops) =
            self.inner.store.mutate(move |w| me.complete_in(w, &req, &p2, parent_id, &name, wt, &m, &rel, now)).await?;
        self.queue_removals(dropped);
        self.track(ops);
        self.file_info(&path, &rec, false)
    }

    /// The change [`Master::complete_file`] commits.
    #[allow(clippy::too_many_arguments)]
    fn complete_in(
        &self,
        w: &WriteTransaction,
        req: &pb::CompleteFileRequest,
        path: &str,
        parent_id: u64,
        name: &str,
        wt: WriteType,
        m: &MountEntry,
        rel: &str,
        now: i64,
    ) -> Result<(pb::InodeRecord, Vec<(u64, u64)>, Vec<pb::PersistOp>)> {
        let version = if req.version == 0 {
            next_id(w, "version", 1)?
        } else {
            if w.open_table(PENDING_WRITES).map_err(db_err)?.remove(req.version).map_err(db_err)?.is_none() {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("the write of {path} is unknown or was abandoned (see master.abandoned_write_timeout)"),
                ));
            }
            req.version
        };
        let mut dropped = Vec::new();
        let mut ops = Vec::new();
        let existing = get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent_id, name)?;
        let mut rec = match existing {
            Some(id) => {
                let old = load_inode(w, id)?.ok_or_else(|| Error::internal("dangling child"))?;
                if old.is_dir {
                    return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} is a directory")));
                }
                self.drop_version(w, &old, &mut dropped)?;
                old
            }
            None => self.new_inode(w, parent_id, name, false, 0, String::new(), now, now, Some(version))?,
        };
        rec.version = version;
        w.open_table(VERSIONS).map_err(db_err)?.insert(version, rec.id).map_err(db_err)?;
        rec.length = req.length;
        rec.block_size = self.inner.cfg.block_size.as_u64();
        rec.mtime_ms = if req.mtime_ms > 0 { req.mtime_ms } else { now };
        rec.meta = req.meta.clone().filter(|m| *m != pb::ObjectMeta::default());
        rec.synced_ms = now;
        match wt {
            WriteType::THROUGH | WriteType::CACHE_THROUGH => {
                let st = UfsStatus {
                    path: name.into(),
                    is_dir: false,
                    length: req.length,
                    etag: req.etag.clone(),
                    mtime_ms: req.mtime_ms,
                };
                rec.fingerprint = st.fingerprint();
                rec.persist_state = String::new();
                // Pinned at create for an ASYNC_THROUGH write that went through instead.
                if w.open_table(PINNED).map_err(db_err)?.remove(version).map_err(db_err)?.is_some() {
                    self.bump_pin_epoch(w)?;
                }
            }
            WriteType::ASYNC_THROUGH => {
                rec.fingerprint = UNPERSISTED_FINGERPRINT.into();
                rec.persist_state = TO_BE_PERSISTED.into();
                let mut op = self.persist_op(&rec, m, rel, path);
                // The writer's wait, else the staging wait of a committer's `_temporary` file.
                let wait_ms = match req.persist_wait_ms {
                    0 if lpath::is_staged(path) => self.inner.cfg.staged_persist_wait.as_millis() as u64,
                    ms => ms,
                };
                if wait_ms > 0 {
                    op.not_before_ms = now + wait_ms.min(i64::MAX as u64 / 2) as i64;
                }
                ops.push(self.enqueue(w, op)?);
            }
            WriteType::MUST_CACHE => {
                rec.fingerprint = UNPERSISTED_FINGERPRINT.into();
                rec.persist_state = NOT_PERSISTED.into();
            }
        }
        if rec.pinned {
            w.open_table(PINNED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
            self.bump_pin_epoch(w)?;
        }
        if rec.replication_min != 0 || rec.replication_max != 0 {
            w.open_table(REPLICATED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
        }
        put_inode(w, &rec)?;
        Ok((rec, dropped, ops))
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
        match rec.persist_state.as_str() {
            NOT_PERSISTED => {}
            LOST => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{path} was lost: every copy of a block went before it was persisted"),
                ));
            }
            _ => return self.file_info(&path, &rec, false),
        }
        let w = self.inner.store.write()?;
        let mut rec = get_inode(&w.open_table(INODES).map_err(db_err)?, rec.id)?
            .ok_or_else(|| Error::not_found(format!("{path} does not exist")))?;
        rec.persist_state = TO_BE_PERSISTED.into();
        let op = self.enqueue(&w, self.persist_op(&rec, &m, &rel, &path))?;
        put_inode(&w, &rec)?;
        w.commit().map_err(db_err)?;
        self.track(vec![op]);
        self.file_info(&path, &rec, false)
    }

    /// Set the replication bounds of files at or below `path`. Returns the files changed.
    pub async fn set_replication(&self, path: &str, min: u32, max: u32, recursive: bool) -> Result<u64> {
        if max != 0 && min > max {
            return Err(Error::invalid(format!("replication min {min} exceeds max {max}")));
        }
        let path = normalize(path)?;
        let ids = self.file_ids(&path, recursive).await?;
        let w = self.inner.store.write()?;
        for id in &ids {
            if let Some(mut r) = load_inode(&w, *id)? {
                r.replication_min = min;
                r.replication_max = max;
                put_inode(&w, &r)?;
                let mut t = w.open_table(REPLICATED).map_err(db_err)?;
                if min != 0 || max != 0 {
                    t.insert(r.version, ()).map_err(db_err)?;
                } else {
                    t.remove(r.version).map_err(db_err)?;
                }
            }
        }
        w.commit().map_err(db_err)?;
        Ok(ids.len() as u64)
    }

    /// Replace the object metadata of a file or directory (or only its tags).
    pub async fn set_object_meta(&self, path: &str, meta: pb::ObjectMeta, tags_only: bool) -> Result<pb::FileInfo> {
        let path = normalize(path)?;
        let rec = self.must_resolve(&path).await?;
        self.writable(&path)?;
        let w = self.inner.store.write()?;
        let mut rec = get_inode(&w.open_table(INODES).map_err(db_err)?, rec.id)?
            .ok_or_else(|| Error::not_found(format!("{path} does not exist")))?;
        if tags_only {
            rec.meta.get_or_insert_with(Default::default).tags = meta.tags;
        } else {
            rec.meta = Some(meta);
        }
        if rec.meta.as_ref().is_some_and(|m| *m == pb::ObjectMeta::default()) {
            rec.meta = None;
        }
        // A persisted object in a store that keeps metadata gets it too (a file still
        // to be persisted takes it with its persist).
        let mut ops = Vec::new();
        let (m, rel) = self.mount_for(&path)?;
        if !rec.is_dir && is_persisted(&rec) && m.ufs.stores_metadata() {
            let op = pb::PersistOp {
                kind: "META".into(),
                inode_id: rec.id,
                version: rec.version,
                ..self.op_for(&m, &rel, &path)
            };
            ops.push(self.enqueue(&w, op)?);
        }
        put_inode(&w, &rec)?;
        w.commit().map_err(db_err)?;
        self.track(ops);
        self.file_info(&path, &rec, false)
    }

    /// The inode ids of the files at or below `path`.
    async fn file_ids(&self, path: &str, recursive: bool) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        self.for_each_file(path, recursive, &mut |r| {
            ids.push(r.id);
            Ok(())
        })
        .await?;
        Ok(ids)
    }

    /// Files at or below `path` (one level at a time, page by page).
    async fn for_each_file(
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
                    } else if let Some(r) = self.read_inode_by_path(&e.path)? {
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
        let w = self.inner.store.write()?;
        for id in &ids {
            let Some(mut r) = load_inode(&w, *id)? else {
                continue;
            };
            r.pinned = pinned;
            put_inode(&w, &r)?;
            let mut p = w.open_table(PINNED).map_err(db_err)?;
            if pinned {
                p.insert(r.version, ()).map_err(db_err)?;
            } else if is_persisted(&r) {
                // Bytes not persisted yet stay pinned whatever the user says.
                p.remove(r.version).map_err(db_err)?;
            }
        }
        self.bump_pin_epoch(&w)?;
        let epoch = get_counter(&w.open_table(COUNTERS).map_err(db_err)?, "pin_epoch")?;
        w.commit().map_err(db_err)?;
        // Return once every live worker knows the new pins, so loads right after a pin
        // cannot evict the pinned blocks.
        self.await_workers(|_, s| s.pin_epoch >= epoch).await;
        Ok(ids.len() as u64)
    }

    /// Wait (up to the worker timeout) until `done` holds for every live worker.
    async fn await_workers(&self, done: impl Fn(u64, &WorkerState) -> bool) {
        let deadline = Instant::now() + self.inner.cfg.worker_timeout;
        while Instant::now() < deadline {
            let all = {
                let timeout = self.inner.cfg.worker_timeout;
                let ws = self.inner.workers.lock();
                ws.iter().filter(|(_, s)| s.last_heartbeat.elapsed() < timeout).all(|(id, s)| done(*id, s))
            };
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drop the cached blocks of files at or below `path`. Returns the blocks freed.
    pub async fn free(&self, path: &str, recursive: bool) -> Result<u64> {
        let path = normalize(path)?;
        let mut recs = Vec::new();
        self.for_each_file(&path, recursive, &mut |r| {
            if r.pinned {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("{} is pinned (unpin it first)", r.name),
                ));
            }
            if !is_persisted(r) {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("{} is not persisted: its cached blocks are its only copy (locus fs persist)", r.name),
                ));
            }
            recs.push(r.clone());
            Ok(())
        })
        .await?;
        let w = self.inner.store.write_soft()?;
        let mut dropped = Vec::new();
        for r in &recs {
            self.drop_version(&w, r, &mut dropped)?;
            // the version stays valid: only its cached copies go
            w.open_table(VERSIONS).map_err(db_err)?.insert(r.version, r.id).map_err(db_err)?;
            if r.replication_min != 0 || r.replication_max != 0 {
                w.open_table(REPLICATED).map_err(db_err)?.insert(r.version, ()).map_err(db_err)?;
            }
        }
        w.commit().map_err(db_err)?;
        let n = dropped.len() as u64;
        let targets: HashMap<u64, u64> = {
            let ws = self.inner.workers.lock();
            dropped.iter().filter_map(|(wk, _)| ws.get(wk).map(|s| (*wk, s.beats + 2))).collect()
        };
        self.queue_removals(dropped);
        // Return once the workers have deleted the blocks: a read right after `free`
        // must fill the cache again, not hit blocks about to go.
        self.await_workers(|id, s| targets.get(&id).is_none_or(|b| s.beats >= *b)).await;
        Ok(n)
    }

    // ------------------------------------------------------------------ mounts

    pub async fn mount(&self, req: pb::MountRequest) -> Result<pb::MountInfo> {
        let path = normalize(&req.path)?;
        let opts: BTreeMap<String, String> = req.options.clone().into_iter().collect();
        let ufs = Ufs::new(&req.uri, &opts, self.inner.cfg.ufs_timeout)?;
        if !req.write_type.is_empty() {
            WriteType::parse_or_err(&req.write_type)?;
        }
        if self.inner.mounts.read().iter().any(|m| m.info.path == path) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("{path} is already a mount point")));
        }
        if path != "/" {
            let (parent_path, _) = lpath::split_parent(&path).unwrap();
            let parent = self.must_resolve(parent_path).await?;
            if !parent.is_dir {
                return Err(Error::new(ErrorKind::FailedPrecondition, format!("{parent_path} is not a directory")));
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
        let w = self.inner.store.write()?;
        let id = next_id(&w, "mount", 1)?;
        let info = pb::MountInfo {
            id,
            path: path.clone(),
            uri: req.uri,
            options: req.options,
            readonly: req.readonly,
            sync_interval_ms: sync,
            write_type: req.write_type.to_ascii_uppercase(),
        };
        w.open_table(MOUNTS).map_err(db_err)?.insert(id, info.encode_to_vec().as_slice()).map_err(db_err)?;
        if let Some((parent_path, name)) = lpath::split_parent(&path) {
            let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, parent_path)?
                .ok_or_else(|| Error::not_found(parent_path.to_string()))?;
            self.new_inode(&w, parent, name, true, 0, String::new(), 0, 0, None)?;
        }
        w.commit().map_err(db_err)?;
        let mut mounts = self.inner.mounts.write();
        mounts.push(MountEntry { info: info.clone(), ufs });
        mounts.sort_by_key(|m| std::cmp::Reverse(m.info.path.len()));
        tracing::info!(path = %info.path, uri = %info.uri, "mounted");
        Ok(info)
    }

    pub async fn unmount(&self, path: &str) -> Result<()> {
        let path = normalize(path)?;
        if path == "/" {
            return Err(Error::invalid("cannot unmount the root mount"));
        }
        let m = self
            .inner
            .mounts
            .read()
            .iter()
            .find(|m| m.info.path == path)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("{path} is not a mount point")))?;
        if self
            .inner
            .mounts
            .read()
            .iter()
            .any(|o| o.info.path != path && lpath::strip_prefix(&o.info.path, &path).is_some())
        {
            return Err(Error::new(ErrorKind::FailedPrecondition, format!("{path} has mounts below it")));
        }
        let (parent_path, name) = lpath::split_parent(&path).unwrap();
        let w = self.inner.store.write()?;
        let mut dropped = Vec::new();
        let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, parent_path)?;
        if let Some(parent) = parent {
            self.remove_subtree(&w, parent, name, &mut dropped)?;
        }
        w.open_table(MOUNTS).map_err(db_err)?.remove(m.info.id).map_err(db_err)?;
        w.commit().map_err(db_err)?;
        self.inner.mounts.write().retain(|e| e.info.id != m.info.id);
        self.queue_removals(dropped);
        Ok(())
    }

    /// The mount table; with `secrets` false, credentials are redacted.
    pub fn mount_table(&self, secrets: bool) -> Vec<pb::MountInfo> {
        let mut v: Vec<pb::MountInfo> = self.inner.mounts.read().iter().map(|m| m.info.clone()).collect();
        if !secrets {
            for m in &mut v {
                for (k, val) in m.options.iter_mut() {
                    if k.contains("secret") || k.contains("token") {
                        *val = "***".into();
                    }
                }
            }
        }
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    pub fn get_mount(&self, id: u64) -> Result<pb::MountInfo> {
        self.inner
            .mounts
            .read()
            .iter()
            .find(|m| m.info.id == id)
            .map(|m| m.info.clone())
            .ok_or_else(|| Error::not_found(format!("mount {id} does not exist")))
    }

    // ------------------------------------------------------------------ workers

    /// This cluster's id (random, made with the namespace).
    pub fn cluster_id(&self) -> u64 {
        self.inner.store.cluster_id
    }

    /// Register a worker and take its full block report. Returns its id, or 0 (nothing
    /// registered) when its blocks were written under another cluster: their ids name
    /// other data in this namespace, so none of them may be recorded; the worker drops
    /// them and registers again.
    pub fn register_worker(&self, req: pb::RegisterWorkerRequest) -> Result<u64> {
        let addr = req.address.ok_or_else(|| Error::invalid("register without an address"))?;
        if req.cluster_id != 0 && req.cluster_id != self.cluster_id() {
            tracing::warn!(
                host = %addr.host, data = %addr.data_address, blocks = req.blocks.len(),
                "a worker holds blocks of another cluster; it must drop them before it registers"
            );
            return Ok(0);
        }
        let w = self.inner.store.write()?;
        let known =
            req.worker_id != 0 && w.open_table(WORKERS).map_err(db_err)?.get(req.worker_id).map_err(db_err)?.is_some();
        let id = if known { req.worker_id } else { next_id(&w, "worker", 1)? };
        let addr = pb::WorkerAddress { worker_id: id, ..addr };
        w.open_table(WORKERS).map_err(db_err)?.insert(id, addr.encode_to_vec().as_slice()).map_err(db_err)?;
        // Reconcile the full block report: it replaces what we knew of this worker.
        let mut stale = Vec::new();
        {
            let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
            for b in second_keys(&wb, id)? {
                wb.remove((id, b)).map_err(db_err)?;
                loc.remove((b, id)).map_err(db_err)?;
            }
            let versions = w.open_table(VERSIONS).map_err(db_err)?;
            for b in &req.blocks {
                let (v, _) = locus_common::split_block_id(b.block_id);
                if versions.get(v).map_err(db_err)?.is_some() {
                    wb.insert((id, b.block_id), ()).map_err(db_err)?;
                    loc.insert((b.block_id, id), b.tier.as_str()).map_err(db_err)?;
                } else {
                    stale.push(b.block_id);
                }
            }
        }
        w.commit().map_err(db_err)?;
        let mut ws = self.inner.workers.lock();
        let counters = ws.get(&id).map(|s| s.counters).unwrap_or_default();
        ws.insert(
            id,
            WorkerState {
                address: addr.clone(),
                last_heartbeat: Instant::now(),
                tiers: req.tiers,
                counters,
                pending_remove: stale,
                beats: 0,
                pin_epoch: 0,
            },
        );
        tracing::info!(worker = id, host = %addr.host, data = %addr.data_address, blocks = req.blocks.len(), "worker registered");
        Ok(id)
    }

    pub fn heartbeat(&self, req: pb::HeartbeatRequest) -> Result<pb::HeartbeatResponse> {
        let mut resp = pb::HeartbeatResponse::default();
        {
            let mut ws = self.inner.workers.lock();
            let Some(s) = ws.get_mut(&req.worker_id) else {
                resp.reregister = true;
                return Ok(resp);
            };
            s.last_heartbeat = Instant::now();
            s.beats += 1;
            s.pin_epoch = req.pin_epoch;
            s.tiers = req.tiers;
            if let Some(c) = req.counters {
                let m = &self.inner.metrics;
                let old = s.counters;
                // A restarted worker starts its counters from zero again.
                let d = |new: u64, old: u64| if new >= old { new - old } else { new };
                m.bytes_read.with_label_values(&["short_circuit"]).inc_by(d(c.short_circuit, old.short_circuit));
                m.bytes_read.with_label_values(&["local_worker"]).inc_by(d(c.local_worker, old.local_worker));
                m.bytes_read.with_label_values(&["remote_worker"]).inc_by(d(c.remote_worker, old.remote_worker));
                m.bytes_read.with_label_values(&["ufs"]).inc_by(d(c.ufs, old.ufs));
                m.cache_requests.with_label_values(&["hit"]).inc_by(d(c.cache_hits, old.cache_hits));
                m.cache_requests.with_label_values(&["miss"]).inc_by(d(c.cache_misses, old.cache_misses));
                m.evictions.inc_by(d(c.evictions, old.evictions));
                m.corrupt_blocks.inc_by(d(c.corrupt_blocks, old.corrupt_blocks));
                s.counters = c;
            }
            resp.remove_blocks = std::mem::take(&mut s.pending_remove);
        }
        let r = self.inner.store.read()?;
        let epoch = get_counter(&r.open_table(COUNTERS).map_err(db_err)?, "pin_epoch")?;
        if epoch != req.pin_epoch {
            resp.pins_changed = true;
            resp.pin_epoch = epoch;
            for e in r.open_table(PINNED).map_err(db_err)?.iter().map_err(db_err)? {
                resp.pinned_versions.push(e.map_err(db_err)?.0.value());
            }
        }
        Ok(resp)
    }

    pub fn commit_blocks(&self, req: pb::CommitBlocksRequest) -> Result<()> {
        if !self.inner.workers.lock().contains_key(&req.worker_id) {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!("worker {} is not registered", req.worker_id),
            ));
        }
        let w = self.inner.store.write_soft()?;
        let mut stale = Vec::new();
        {
            let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
            let versions = w.open_table(VERSIONS).map_err(db_err)?;
            for b in &req.added {
                let (v, _) = locus_common::split_block_id(b.block_id);
                if versions.get(v).map_err(db_err)?.is_some() {
                    wb.insert((req.worker_id, b.block_id), ()).map_err(db_err)?;
                    loc.insert((b.block_id, req.worker_id), b.tier.as_str()).map_err(db_err)?;
                } else {
                    stale.push((req.worker_id, b.block_id)); // the file changed or went meanwhile
                }
            }
            for b in &req.removed {
                wb.remove((req.worker_id, *b)).map_err(db_err)?;
                loc.remove((*b, req.worker_id)).map_err(db_err)?;
            }
        }
        w.commit().map_err(db_err)?;
        self.queue_removals(stale);
        Ok(())
    }

    pub fn workers(&self) -> Vec<pb::WorkerAddress> {
        let live = self.live_workers();
        let mut v: Vec<pb::WorkerAddress> = self
            .inner
            .workers
            .lock()
            .iter()
            .filter(|(id, _)| live.contains_key(id))
            .map(|(_, s)| s.address.clone())
            .collect();
        v.sort_by_key(|w| w.worker_id);
        v
    }

    pub fn report(&self) -> pb::Report {
        let timeout = self.inner.cfg.worker_timeout;
        let ws = self.inner.workers.lock();
        let mut rep = pb::Report { mounts: self.inner.mounts.read().len() as u64, ..Default::default() };
        for s in ws.values() {
            rep.workers.push(pb::WorkerReport {
                address: Some(s.address.clone()),
                live: s.last_heartbeat.elapsed() < timeout,
                last_heartbeat_ms_ago: s.last_heartbeat.elapsed().as_millis() as u64,
                tiers: s.tiers.clone(),
                counters: Some(s.counters),
            });
        }
        rep.workers.sort_by_key(|w| w.address.as_ref().map(|a| a.worker_id));
        // Cluster totals come from the master's monotonic counters, which survive
        // worker restarts.
        let m = &self.inner.metrics;
        let b = |s: &str| m.bytes_read.with_label_values(&[s]).get();
        rep.totals = Some(pb::ReadCounters {
            short_circuit: b("short_circuit"),
            local_worker: b("local_worker"),
            remote_worker: b("remote_worker"),
            ufs: b("ufs"),
            cache_hits: m.cache_requests.with_label_values(&["hit"]).get(),
            cache_misses: m.cache_requests.with_label_values(&["miss"]).get(),
            evictions: m.evictions.get(),
            corrupt_blocks: m.corrupt_blocks.get(),
        });
        drop(ws);
        let b = self.persist_backlog();
        rep.persist_backlog_files = b.files;
        rep.persist_backlog_bytes = b.bytes;
        rep.persist_oldest_age_ms = b.oldest_age_ms;
        rep.persist_queue_ops = b.ops;
        rep
    }

    fn update_gauges(&self) {
        let rep = self.report();
        let m = &self.inner.metrics;
        m.workers_live.set(rep.workers.iter().filter(|w| w.live).count() as i64);
        let mut cap: BTreeMap<String, u64> = BTreeMap::new();
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        let mut pooled: BTreeMap<String, u64> = BTreeMap::new();
        for w in rep.workers.iter().filter(|w| w.live) {
            for t in &w.tiers {
                *cap.entry(t.alias.clone()).or_default() += t.capacity;
                *used.entry(t.alias.clone()).or_default() += t.used;
                *pooled.entry(t.alias.clone()).or_default() += t.pooled;
            }
        }
        for (t, v) in pooled {
            m.tier_pooled.with_label_values(&[t.as_str()]).set(v as i64);
        }
        for (t, v) in cap {
            m.tier_capacity.with_label_values(&[t.as_str()]).set(v as i64);
        }
        for (t, v) in used {
            m.tier_used.with_label_values(&[t.as_str()]).set(v as i64);
        }
        let hits = m.cache_requests.with_label_values(&["hit"]).get();
        let misses = m.cache_requests.with_label_values(&["miss"]).get();
        m.hit_ratio.set(if hits + misses == 0 { 0.0 } else { hits as f64 / (hits + misses) as f64 });
    }
}
