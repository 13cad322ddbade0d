//! The Locus worker: serves blocks over the data path (TCP) and short-circuit leases
//! (Unix socket), fills its cache from the UFS on a miss (concurrent misses on one block
//! cost one UFS read), writes files through to the UFS, and keeps the master informed
//! with registration, heartbeats and block commits.
//!
//! Depends on `locus-common`, `locus-proto`, `locus-ufs` and `locus-blockstore`; it must
//! never depend on `locus-master` or `locus-client`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use locus_blockstore::{BlockStore, Change, Lease};
use locus_common::config::{ReadType, TierAlias, TierConfig, WorkerConfig, WriteType};
use locus_common::job::Job;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, master_client::MasterClient};
use locus_proto::{from_status, read_frame, to_error_info, write_frame};
use locus_ufs::Ufs;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tonic::transport::Channel;

/// Largest block the data path accepts.
const MAX_BLOCK: u64 = 1 << 40;
/// A fill publishes its progress to waiting readers every this many bytes.
const FILL_NOTIFY: u64 = 1 << 20;

#[derive(Default)]
struct Counters {
    short_circuit: AtomicU64,
    local_worker: AtomicU64,
    remote_worker: AtomicU64,
    ufs: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    /// Bad copies found in transfers (the store counts those found on disk).
    corrupt: AtomicU64,
}

struct Inner {
    cfg: WorkerConfig,
    store: BlockStore,
    master: MasterClient<Channel>,
    id: AtomicU64,
    data_address: String,
    uds_path: Option<PathBuf>,
    counters: Counters,
    pin_epoch: AtomicU64,
    ufs: Mutex<HashMap<u64, Ufs>>,
    /// Blocks being filled from the UFS. Readers that arrive during a fill stream what
    /// the leader has written so far, then follow it as it grows.
    inflight: Mutex<HashMap<u64, watch::Receiver<FillState>>>,
}

/// Progress of one block fill, as the leader publishes it.
#[derive(Clone, Default)]
struct FillState {
    /// The block's temporary file, once created (its bytes `..filled` are final).
    path: Option<PathBuf>,
    /// Where that file goes when the block is committed.
    final_path: Option<PathBuf>,
    filled: u64,
    /// Set when the fill ends: whether the block was cached.
    done: Option<bool>,
    /// A lease on the cached block, held for the readers that follow the fill's file
    /// (they read it without a lease of their own) until the last of them is done: the
    /// block is neither evicted nor its file reused under them.
    lease: Option<Arc<Lease>>,
}

/// A block fill a reader joined ([`Inner::fill_or_join`]): its progress, and when this
/// reader started it, the task running it.
enum Fill {
    Leader(watch::Receiver<FillState>, tokio::task::JoinHandle<Result<()>>),
    Waiter(watch::Receiver<FillState>),
}

/// Where a block read ends in its block, or why the request is bad.
fn read_end(r: &pb::ReadBlockRequest) -> Result<u64> {
    match r.offset.checked_add(r.length) {
        Some(end) if r.block_length > 0 && r.block_length <= MAX_BLOCK && end <= r.block_length => Ok(end),
        _ => Err(Error::invalid(format!(
            "bad read range {}+{} of a block of {} bytes",
            r.offset, r.length, r.block_length
        ))),
    }
}

/// Wait until a fill has more than `pos` bytes of its block: how many it has then, or
/// why it never will.
async fn fill_past(rx: &mut watch::Receiver<FillState>, block_id: u64, pos: u64) -> Result<u64> {
    let got = rx.wait_for(|s| s.filled > pos || s.done.is_some()).await.map(|s| (s.filled, s.done));
    // A leader gone without a verdict failed.
    let (filled, done) = got.unwrap_or_else(|_| (rx.borrow().filled, Some(false)));
    if filled <= pos {
        return Err(Error::unavailable(match done {
            Some(true) => format!("block {block_id} is shorter than the read"),
            _ => format!("the fill of block {block_id} failed"),
        }));
    }
    Ok(filled)
}

/// What keeps a block in place for a co-located reader between its requests (held for
/// its `Drop`).
#[allow(dead_code)]
enum Held {
    Lease(Lease),
    /// A fill the reader followed: its receiver keeps the lease the fill took at commit.
    Fill(watch::Receiver<FillState>),
}

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    cfg: WorkerConfig,
    master_address: String,
}

impl WorkerBuilder {
    pub fn new(cfg: WorkerConfig, master_address: impl Into<String>) -> Self {
        WorkerBuilder { cfg, master_address: master_address.into() }
    }

    /// Open the block store, bind the data listener and the Unix socket, and start.
    /// Registration with the master is retried in the background until it succeeds.
    pub async fn start(self) -> Result<Worker> {
        let mut cfg = self.cfg;
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| Error::io(format!("create {}", cfg.data_dir.display()), e))?;
        let listener = TcpListener::bind(&cfg.data_address)
            .await
            .map_err(|e| Error::io(format!("bind worker data address {}", cfg.data_address), e))?;
        let local = listener.local_addr().map_err(|e| Error::io("local addr", e))?;
        if cfg.tiers.is_empty() {
            cfg.tiers.push(default_mem_tier(&cfg.data_dir));
        }
        let store =
            BlockStore::open(&cfg.tiers, cfg.high_watermark, cfg.low_watermark)?.with_file_pool(cfg.file_pool_ttl);
        let uds_path = match &cfg.uds_path {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => Some(cfg.data_dir.join("worker.sock")),
        };
        let uds = match &uds_path {
            Some(p) => {
                let _ = std::fs::remove_file(p);
                Some(UnixListener::bind(p).map_err(|e| Error::io(format!("bind {}", p.display()), e))?)
            }
            None => None,
        };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.master_address))
            .map_err(|e| Error::invalid(format!("bad master address {}: {e}", self.master_address)))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .connect_lazy();
        let saved_id = std::fs::read_to_string(cfg.data_dir.join("worker_id")).ok().and_then(|s| s.trim().parse().ok());
        let inner = Arc::new(Inner {
            data_address: local.to_string(),
            cfg,
            store,
            master: MasterClient::new(channel),
            id: AtomicU64::new(saved_id.unwrap_or(0)),
            uds_path,
            counters: Counters::default(),
            pin_epoch: AtomicU64::new(u64::MAX),
            ufs: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(serve_tcp(inner.clone(), listener, stop_rx.clone())));
        if let Some(uds) = uds {
            tasks.push(tokio::spawn(serve_uds(inner.clone(), uds, stop_rx.clone())));
        }
        let hb_inner = inner.clone();
        let heartbeat = Job::spawn_periodic("worker.heartbeat", inner.cfg.heartbeat_interval, move || {
            let i = hb_inner.clone();
            async move { i.heartbeat().await }
        });
        Ok(Worker { inner, local, stop: stop_tx, tasks, heartbeat: Some(heartbeat) })
    }
}

fn default_mem_tier(data_dir: &Path) -> TierConfig {
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let tag: String = abs.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    TierConfig {
        alias: TierAlias::MEM,
        dir: PathBuf::from("/dev/shm").join(format!("locus{tag}")),
        quota: bytesize::ByteSize::gib(1),
    }
}

/// A running worker.
pub struct Worker {
    inner: Arc<Inner>,
    local: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    heartbeat: Option<Job>,
}

impl Worker {
    /// The id the master gave this worker (0 until registered).
    pub fn id(&self) -> u64 {
        self.inner.id.load(Relaxed)
    }
    pub fn data_address(&self) -> SocketAddr {
        self.local
    }
    pub fn uds_path(&self) -> Option<&Path> {
        self.inner.uds_path.as_deref()
    }
    pub fn store(&self) -> &BlockStore {
        &self.inner.store
    }
    /// Wait until the master has registered this worker.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let id = self.id();
            if id != 0 && self.inner.pin_epoch.load(Relaxed) != u64::MAX {
                return Ok(id);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::unavailable("worker did not register with the master in time"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop serving and heartbeating. Blocks on disk tiers stay for the next start.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(h) = self.heartbeat.take() {
            h.stop().await;
        }
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Some(p) = &self.inner.uds_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

impl Inner {
    fn master(&self) -> MasterClient<Channel> {
        self.master.clone()
    }

    fn tier_usage(&self) -> Vec<pb::TierUsage> {
        self.store
            .usage()
            .into_iter()
            .map(|u| pb::TierUsage {
                alias: u.alias.as_str().into(),
                capacity: u.capacity,
                used: u.used,
                blocks: u.blocks,
                pooled: u.pooled,
            })
            .collect()
    }

    /// Register with the master and send the full block report. Blocks written under
    /// another cluster (a master whose namespace is gone: their ids name other data now)
    /// are dropped first, when the master says so, before anything can read or write them.
    async fn register(&self) -> Result<()> {
        for _ in 0..2 {
            let cluster_id = self.store.cluster_id();
            let blocks = self
                .store
                .report()
                .into_iter()
                .map(|(id, t, len)| pb::BlockReport { block_id: id, tier: t.as_str().into(), length: len })
                .collect();
            self.store.drain_changes(); // the full report covers them
            let req = pb::RegisterWorkerRequest {
                worker_id: self.id.load(Relaxed),
                address: Some(pb::WorkerAddress {
                    worker_id: 0,
                    host: self.cfg.host.clone(),
                    data_address: self.data_address.clone(),
                    uds_path: self.uds_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                }),
                tiers: self.tier_usage(),
                blocks,
                cluster_id,
            };
            let resp = self.master().register_worker(req).await.map_err(from_status)?.into_inner();
            if resp.cluster_id == 0 {
                return Err(Error::internal("the master named no cluster id"));
            }
            let dropped = self.store.adopt_cluster(resp.cluster_id)?;
            if resp.worker_id == 0 {
                tracing::warn!(dropped, cluster = resp.cluster_id, "dropped the blocks of another cluster");
                continue; // the next full report covers the removals
            }
            self.id.store(resp.worker_id, Relaxed);
            let _ = std::fs::write(self.cfg.data_dir.join("worker_id"), resp.worker_id.to_string());
            return Ok(());
        }
        Err(Error::unavailable("the master refused this worker's block report twice"))
    }

    async fn heartbeat(&self) -> Result<()> {
        if self.id.load(Relaxed) == 0 || self.pin_epoch.load(Relaxed) == u64::MAX {
            self.register().await?;
            self.pin_epoch.store(0, Relaxed);
        }
        self.commit_changes().await?;
        self.store.trim_file_pool();
        let c = &self.counters;
        let req = pb::HeartbeatRequest {
            worker_id: self.id.load(Relaxed),
            tiers: self.tier_usage(),
            counters: Some(pb::ReadCounters {
                short_circuit: c.short_circuit.load(Relaxed),
                local_worker: c.local_worker.load(Relaxed),
                remote_worker: c.remote_worker.load(Relaxed),
                ufs: c.ufs.load(Relaxed),
                cache_hits: c.cache_hits.load(Relaxed),
                cache_misses: c.cache_misses.load(Relaxed),
                evictions: self.store.evictions(),
                corrupt_blocks: self.store.corrupt_blocks() + c.corrupt.load(Relaxed),
            }),
            pin_epoch: self.pin_epoch.load(Relaxed),
        };
        let resp = self.master().worker_heartbeat(req).await.map_err(from_status)?.into_inner();
        if resp.reregister {
            self.register().await?;
            return Ok(());
        }
        if resp.pins_changed {
            self.store.set_pinned_versions(resp.pinned_versions.into_iter().collect(), resp.pin_epoch);
            self.pin_epoch.store(resp.pin_epoch, Relaxed);
        }
        for b in resp.remove_blocks {
            self.store.remove(b)?;
        }
        self.commit_changes().await
    }

    /// Send block additions and removals to the master.
    async fn commit_changes(&self) -> Result<()> {
        let changes = self.store.drain_changes();
        if changes.is_empty() || self.id.load(Relaxed) == 0 {
            return Ok(());
        }
        let mut req = pb::CommitBlocksRequest { worker_id: self.id.load(Relaxed), ..Default::default() };
        for c in changes {
            match c {
                Change::Stored { block_id, tier, len } => {
                    req.added.push(pb::BlockReport { block_id, tier: tier.as_str().into(), length: len })
                }
                Change::Removed { block_id } => req.removed.push(block_id),
            }
        }
        if let Err(s) = self.master().commit_blocks(req).await {
            // The master lost track of us: the next heartbeat re-registers with a full report.
            self.pin_epoch.store(u64::MAX, Relaxed);
            return Err(from_status(s));
        }
        Ok(())
    }

    /// The UFS of the read's mount, after checking that the file still has the
    /// fingerprint the client's metadata carries: a file changed behind Locus's back is
    /// refused (before any byte is sent), never served as a mix of versions.
    async fn checked_ufs(&self, r: &pb::ReadBlockRequest) -> Result<Ufs> {
        let ufs = self.ufs(r.mount_id).await?;
        if !r.fingerprint.is_empty() {
            let now = ufs.stat(&r.ufs_path).await?.map(|s| s.fingerprint()).unwrap_or_default();
            if now != r.fingerprint {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!(
                        "{} changed in the UFS since its metadata was loaded ({} -> {}); it is re-read after the mount's sync interval",
                        r.ufs_path,
                        r.fingerprint,
                        if now.is_empty() { "deleted" } else { now.as_str() }
                    ),
                ));
            }
        }
        Ok(ufs)
    }

    async fn ufs(&self, mount_id: u64) -> Result<Ufs> {
        if let Some(u) = self.ufs.lock().get(&mount_id) {
            return Ok(u.clone());
        }
        let info = self.master().get_mount(pb::GetMountRequest { mount_id }).await.map_err(from_status)?.into_inner();
        let opts = info.options.into_iter().collect();
        let ufs = Ufs::new(&info.uri, &opts, Duration::from_secs(60))?;
        self.ufs.lock().insert(mount_id, ufs.clone());
        Ok(ufs)
    }

    fn count_served(&self, local: bool, n: u64) {
        if local {
            self.counters.local_worker.fetch_add(n, Relaxed);
        } else {
            self.counters.remote_worker.fetch_add(n, Relaxed);
        }
    }

    /// Serve one read request on a data connection.
    /// `hdr` becomes true once a response header went out: after that an error can only
    /// close the connection (the client sees a short read).
    async fn handle_read(
        self: &Arc<Self>,
        sock: &mut TcpStream,
        r: pb::ReadBlockRequest,
        hdr: &mut bool,
    ) -> Result<()> {
        read_end(&r)?;
        let read_type = ReadType::parse(&r.read_type).unwrap_or_default();
        let promote = read_type == ReadType::CACHE_PROMOTE;
        let mut first = true;
        loop {
            if let Some(lease) = self.store.lease(r.block_id, promote)? {
                if first {
                    self.counters.cache_hits.fetch_add(1, Relaxed);
                }
                return self.send_cached(sock, &r, lease, hdr).await;
            }
            if first {
                self.counters.cache_misses.fetch_add(1, Relaxed);
                first = false;
            }
            if r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT {
                // Only worker copies exist: the reader must try another holder.
                return Err(Error::unavailable(format!(
                    "block {} is not here (it may have failed its checksum), and the file is not persisted",
                    r.block_id
                )));
            }
            if read_type == ReadType::NO_CACHE {
                return self.send_from_ufs(sock, &r, hdr).await;
            }
            let fill = match self.fill_or_join(&r) {
                Ok(f) => f,
                // A full cache still serves the read, uncached.
                Err(e) if e.kind() == ErrorKind::ResourceExhausted && !r.load_only => {
                    tracing::warn!(block = r.block_id, error = %e, "cannot cache block; serving it uncached");
                    return self.send_from_ufs(sock, &r, hdr).await;
                }
                Err(e) => return Err(e),
            };
            match fill {
                Fill::Leader(mut rx, task) => {
                    let joined = !r.load_only && self.join_fill(sock, &r, &mut rx, hdr).await?;
                    let res = task.await.unwrap_or_else(|e| Err(Error::internal(format!("block fill task: {e}"))));
                    if joined {
                        // The reader has its bytes, whatever became of the rest of the block.
                        return Ok(());
                    }
                    res?;
                    if r.load_only {
                        return write_frame(sock, &pb::DataResponse { cached: true, ..Default::default() }).await;
                    }
                    // cached meanwhile (the fill ended before this reader joined)
                }
                Fill::Waiter(mut rx) => {
                    if !r.load_only && self.join_fill(sock, &r, &mut rx, hdr).await? {
                        return Ok(());
                    }
                    let _ = rx.wait_for(|v| v.done.is_some()).await;
                }
            }
        }
    }

    /// Become the filler of a missing block (the fill runs on a task of its own, so no
    /// reader, this one included, can hold it back: every reader follows the block file
    /// as it grows), or join the fill in progress. Fails when the block cannot be cached
    /// (`ResourceExhausted`: no room).
    fn fill_or_join(self: &Arc<Self>, r: &pb::ReadBlockRequest) -> Result<Fill> {
        let tx = {
            let mut inflight = self.inflight.lock();
            if let Some(rx) = inflight.get(&r.block_id) {
                return Ok(Fill::Waiter(rx.clone()));
            }
            let (tx, rx) = watch::channel(FillState::default());
            inflight.insert(r.block_id, rx);
            tx
        };
        // Reserve the space first.
        let temp = match self.store.create(r.block_id, r.block_length) {
            Ok(t) => t,
            Err(e) => {
                self.inflight.lock().remove(&r.block_id);
                tx.send_modify(|s| s.done = Some(false));
                return Err(e);
            }
        };
        let rx = tx.subscribe();
        let (me, req) = (self.clone(), r.clone());
        let task = tokio::spawn(async move {
            let res = me.fill(&req, temp, &tx).await;
            me.inflight.lock().remove(&req.block_id);
            tx.send_modify(|s| s.done = Some(res.is_ok()));
            // The master learns of the block before any reader is told it is
            // cached, so `load` (or a read) followed by `stat` shows it.
            let _ = me.commit_changes().await;
            res
        });
        Ok(Fill::Leader(rx, task))
    }

    /// A co-located client's read, over the Unix socket: no bytes go through the socket.
    /// A cached block is leased, as for a short-circuit read; a miss joins or starts the
    /// block's fill, and the reader gets the fill's file and frames telling how far it
    /// has grown, and reads the file itself (one copy less than the data path, and no
    /// socket). Returns what keeps the block in place until the reader's next request
    /// or until it hangs up.
    async fn follow_read(self: &Arc<Self>, sock: &mut UnixStream, r: pb::ReadBlockRequest) -> Result<Held> {
        let end = read_end(&r)?;
        let read_type = ReadType::parse(&r.read_type).unwrap_or_default();
        let mut first = true;
        loop {
            if let Some(lease) = self.store.lease(r.block_id, read_type == ReadType::CACHE_PROMOTE)? {
                if lease.len < end {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("cached block {} is shorter than requested", r.block_id),
                    ));
                }
                if first {
                    self.counters.cache_hits.fetch_add(1, Relaxed);
                }
                self.counters.short_circuit.fetch_add(r.length, Relaxed);
                let path = lease.path.display().to_string();
                let resp = pb::DataResponse {
                    filled: lease.len,
                    block_path: path.clone(),
                    path,
                    length: lease.len,
                    cached: true,
                    ..Default::default()
                };
                write_frame(sock, &resp).await?;
                return Ok(Held::Lease(lease));
            }
            if first {
                self.counters.cache_misses.fetch_add(1, Relaxed);
                first = false;
            }
            if read_type == ReadType::NO_CACHE || r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT {
                // Bytes that are not to be cached, or only other workers have: the data path.
                return Err(Error::not_found(format!("block {} is not cached here", r.block_id)));
            }
            let mut rx = match self.fill_or_join(&r)? {
                Fill::Leader(rx, _) | Fill::Waiter(rx) => rx,
            };
            let st = match rx.wait_for(|s| s.path.is_some() || s.done.is_some()).await {
                Ok(s) => s.clone(),
                Err(_) => FillState { done: Some(false), ..Default::default() },
            };
            let (Some(path), Some(block_path)) = (st.path, st.final_path) else {
                if st.done == Some(true) {
                    continue; // cached before it had a file to follow: lease it
                }
                return Err(Error::unavailable(format!("the fill of block {} failed", r.block_id)));
            };
            let head = pb::DataResponse {
                path: path.display().to_string(),
                block_path: block_path.display().to_string(),
                length: r.block_length,
                filled: st.filled,
                ..Default::default()
            };
            write_frame(sock, &head).await?;
            let mut told = st.filled;
            while told < end {
                let filled = fill_past(&mut rx, r.block_id, told).await?;
                write_frame(sock, &pb::DataResponse { filled, ..Default::default() }).await?;
                told = filled;
            }
            self.counters.short_circuit.fetch_add(r.length, Relaxed);
            // The fill's lease (taken at its commit) lives as long as this receiver.
            return Ok(Held::Fill(rx));
        }
    }

    /// Serve a read from a fill in progress: what the leader has written so far at once,
    /// the rest as it arrives (so a reader never waits for a whole block to land). Returns
    /// false, having sent nothing, when the fill has no file to follow (not created yet
    /// and then failed, or already committed): the caller then takes the cached copy.
    async fn join_fill(
        &self,
        sock: &mut TcpStream,
        r: &pb::ReadBlockRequest,
        rx: &mut watch::Receiver<FillState>,
        hdr: &mut bool,
    ) -> Result<bool> {
        let path = match rx.wait_for(|s| s.path.is_some() || s.done.is_some()).await {
            Ok(s) => s.path.clone(),
            Err(_) => None,
        };
        // The open descriptor stays valid across the commit's rename.
        let Some(file) = path.and_then(|p| std::fs::File::open(p).ok()) else { return Ok(false) };
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await?;
        *hdr = true;
        let (mut pos, end) = (r.offset, r.offset + r.length);
        while pos < end {
            let filled = fill_past(rx, r.block_id, pos).await?;
            let n = sendfile(sock, &file, pos, filled.min(end) - pos).await.map_err(|e| Error::io("send block", e))?;
            pos += n;
            self.count_served(r.client_local, n);
        }
        Ok(true)
    }

    async fn send_cached(
        &self,
        sock: &mut TcpStream,
        r: &pb::ReadBlockRequest,
        lease: Lease,
        hdr: &mut bool,
    ) -> Result<()> {
        if r.load_only {
            return write_frame(sock, &pb::DataResponse { cached: true, ..Default::default() }).await;
        }
        if r.offset + r.length > lease.len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("cached block {} is shorter than requested", r.block_id),
            ));
        }
        let file = std::fs::File::open(&lease.path).map_err(|e| Error::io("open block", e))?;
        let crc = if r.offset == 0 && r.length == lease.len { self.store.crc(r.block_id) } else { None };
        let head = pb::DataResponse {
            length: r.length,
            cached: true,
            has_crc: crc.is_some(),
            crc32c: crc.unwrap_or(0),
            ..Default::default()
        };
        write_frame(sock, &head).await?;
        *hdr = true;
        if r.length == 0 {
            return Ok(());
        }
        // Zero-copy from the block file to the socket. The lease keeps the file in place.
        let (mut off, mut left) = (r.offset, r.length);
        while left > 0 {
            let n = sendfile(sock, &file, off, left.min(self.cfg.chunk_size.as_u64()))
                .await
                .map_err(|e| Error::io("send block", e))?;
            off += n;
            left -= n;
            self.count_served(r.client_local, n);
        }
        drop(lease);
        Ok(())
    }

    /// NO_CACHE miss: stream the range from the UFS without keeping it.
    async fn send_from_ufs(&self, sock: &mut TcpStream, r: &pb::ReadBlockRequest, hdr: &mut bool) -> Result<()> {
        let ufs = self.checked_ufs(r).await?;
        let mut s = Box::pin(ufs.read_range(&r.ufs_path, r.file_offset + r.offset, r.length, 8 << 20, 4).await?);
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await?;
        *hdr = true;
        let mut sent = 0;
        while let Some(b) = s.next().await {
            let b = b?;
            self.counters.ufs.fetch_add(b.len() as u64, Relaxed);
            sock.write_all(&b).await.map_err(|e| Error::io("send block", e))?;
            self.count_served(r.client_local, b.len() as u64);
            sent += b.len() as u64;
        }
        if sent != r.length {
            return Err(Error::new(ErrorKind::Ufs, format!("UFS returned {sent} of {} bytes (changed?)", r.length)));
        }
        Ok(())
    }

    /// Cache miss: read the whole block from the UFS into `temp`, publishing progress so
    /// that readers stream it as it arrives (`join_fill`).
    async fn fill(
        &self,
        r: &pb::ReadBlockRequest,
        temp: locus_blockstore::TempBlock,
        progress: &watch::Sender<FillState>,
    ) -> Result<()> {
        let ufs = self.checked_ufs(r).await?;
        let mut stream = Box::pin(ufs.read_range(&r.ufs_path, r.file_offset, r.block_length, 8 << 20, 4).await?);
        let mut file = temp.open()?;
        progress.send_modify(|s| {
            s.path = Some(temp.path.clone());
            s.final_path = Some(temp.final_path.clone());
        });
        let mut pos = 0u64;
        let mut crc = 0u32;
        while let Some(b) = stream.next().await {
            let b: Bytes = b?;
            std::io::Write::write_all(&mut file, &b).map_err(|e| Error::io("write block file", e))?;
            crc = crc32c::crc32c_append(crc, &b);
            self.counters.ufs.fetch_add(b.len() as u64, Relaxed);
            pos += b.len() as u64;
            // Readers are woken per FILL_NOTIFY bytes, not per network chunk (tens of KiB):
            // fewer wake-ups and larger sendfile calls.
            if pos - progress.borrow().filled >= FILL_NOTIFY {
                progress.send_modify(|st| st.filled = pos);
            }
        }
        progress.send_if_modified(|st| std::mem::replace(&mut st.filled, pos) != pos);
        if pos != r.block_length {
            return Err(Error::new(
                ErrorKind::Ufs,
                format!("UFS returned {pos} of {} bytes for block {} (file changed?)", r.block_length, r.block_id),
            ));
        }
        locus_common::fail::fail_point!("worker.fill.before_commit", |_| Err(Error::internal("failpoint")));
        let lease = temp.commit_leased(pos, Some(crc))?;
        progress.send_modify(|s| s.lease = Some(Arc::new(lease)));
        Ok(())
    }

    /// Take a write: chunk frames follow the request, a zero-length frame ends them. The
    /// bytes go to this worker's cache (as blocks of the new version) and/or the UFS, as
    /// the write type says, and down the replication pipeline: each chunk is forwarded to
    /// the next worker while it is stored here. The answer comes once every worker of the
    /// pipeline holds the blocks and has reported them to the master.
    async fn handle_write(&self, sock: &mut TcpStream, w: pb::WriteFileRequest) -> Result<()> {
        let wt = if w.write_type.is_empty() { WriteType::THROUGH } else { WriteType::parse_or_err(&w.write_type)? };
        let mut blocks = if wt.caches() {
            if w.version == 0 || w.block_size == 0 {
                return Err(Error::invalid("a cached write needs a file version and a block size"));
            }
            if wt.needs_durable_copies() {
                self.store.pin_written(w.version, w.pin_epoch);
            }
            Some(BlockWriter {
                store: self.store.clone(),
                version: w.version,
                block_size: w.block_size,
                index: 0,
                cur: None,
                crc: 0,
            })
        } else {
            None
        };
        let mut ufs_writer = match wt.writes_ufs() {
            true => Some(self.ufs(w.mount_id).await?.writer(&w.ufs_path, &w.content_type, &w.user_metadata).await?),
            false => None,
        };
        // The rest of the pipeline, fed by a task so that forwarding overlaps local writes.
        let mut down = None;
        if wt.caches() && !w.pipeline.is_empty() {
            let next = w.pipeline[0].clone();
            let req = pb::WriteFileRequest {
                pipeline: w.pipeline[1..].to_vec(),
                write_type: if wt.writes_ufs() { WriteType::MUST_CACHE.as_str().into() } else { w.write_type.clone() },
                ..w.clone()
            };
            match forward_write(next, req).await {
                Ok(d) => down = Some(d),
                Err(e) => {
                    if let Some(u) = ufs_writer.take() {
                        u.abort().await;
                    }
                    return Err(e);
                }
            }
        }
        write_frame(sock, &pb::DataResponse::default()).await?; // ready
        sock.flush().await.map_err(|e| Error::io("send", e))?;
        let mut spilled = false;
        let res: Result<u64> = async {
            let mut total = 0u64;
            loop {
                let mut lenb = [0u8; 4];
                sock.read_exact(&mut lenb).await.map_err(|e| Error::io("read write chunk", e))?;
                let len = u32::from_be_bytes(lenb) as usize;
                if len == 0 {
                    break;
                }
                if len > 64 << 20 {
                    return Err(Error::invalid("write chunk larger than 64 MiB"));
                }
                // Read into unzeroed memory, woken per RECV_LOWAT rather than per segment.
                // (Never more than the chunk's unread rest: the writer may be waiting.)
                let mut buf = bytes::BytesMut::with_capacity(len);
                let mut lowat = 1;
                while buf.len() < len {
                    let want = (len - buf.len()) as u64;
                    locus_proto::expect_bytes(sock, &mut lowat, want);
                    let n = (&mut *sock)
                        .take(want)
                        .read_buf(&mut buf)
                        .await
                        .map_err(|e| Error::io("read write chunk", e))?;
                    if n == 0 {
                        return Err(Error::io("read write chunk", std::io::ErrorKind::UnexpectedEof.into()));
                    }
                }
                locus_proto::expect_bytes(sock, &mut lowat, 0);
                let mut buf = buf.freeze();
                let before = total;
                total += len as u64;
                if let Some((tx, _)) = &down {
                    // A broken pipeline shows in its task's result below.
                    let _ = tx.send(buf.clone()).await;
                }
                if let Some(b) = &mut blocks {
                    match b.write(&buf) {
                        Ok(()) => {}
                        // A write that outgrows the cache goes on through to the UFS
                        // (MUST_CACHE has no UFS to go to: it fails).
                        Err(e) if e.kind() == ErrorKind::ResourceExhausted && wt != WriteType::MUST_CACHE => {
                            let b = blocks.take().unwrap();
                            let stored = b.stored();
                            if ufs_writer.is_none() {
                                tracing::info!(path = %w.ufs_path, at = stored, "cache full: the write goes on through to the UFS");
                                let mut u = self.ufs(w.mount_id).await?.writer(&w.ufs_path, &w.content_type, &w.user_metadata).await?;
                                let r = self.replay(&b, &mut u).await;
                                if let Err(e) = r {
                                    u.abort().await;
                                    return Err(e);
                                }
                                ufs_writer = Some(u);
                                spilled = true;
                                if let Some((_, task)) = down.take() {
                                    task.abort(); // the replicas drop their partial copies
                                }
                                // The replay sent this chunk's first bytes already.
                                buf = buf.slice((stored - before) as usize..);
                            }
                            // (CACHE_THROUGH streams every byte to the UFS anyway: it
                            // just stops caching.)
                        }
                        Err(e) => return Err(e),
                    }
                }
                if let Some(u) = &mut ufs_writer {
                    u.write(buf).await?;
                }
            }
            if let Some(b) = blocks.take() {
                b.finish()?;
            }
            Ok(total)
        }
        .await;
        let total = match res {
            Ok(t) => t,
            Err(e) => {
                if let Some(u) = ufs_writer.take() {
                    u.abort().await;
                }
                return Err(e);
            }
        };
        let mut replicas = u32::from(wt.caches());
        if let Some((tx, task)) = down.take() {
            drop(tx);
            let r = task.await.map_err(|e| Error::internal(format!("pipeline task: {e}")))?;
            match r {
                Ok(r) => replicas += r.replicas,
                Err(e) => {
                    if let Some(u) = ufs_writer.take() {
                        u.abort().await;
                    }
                    return Err(e);
                }
            }
        }
        let mut resp = pb::DataResponse { length: total, replicas, ..Default::default() };
        if spilled {
            resp.write_type = WriteType::CACHE_THROUGH.as_str().into();
        }
        if let Some(u) = ufs_writer {
            let st = u.close().await?;
            if st.length != total {
                return Err(Error::new(ErrorKind::Ufs, format!("UFS holds {} bytes after writing {total}", st.length)));
            }
            resp.etag = st.etag;
            resp.mtime_ms = st.mtime_ms;
        }
        locus_common::fail::fail_point!("worker.write.before_ack", |_| Err(Error::internal("failpoint")));
        // The master learns of the blocks before the writer is told they are stored.
        if wt.caches() {
            self.commit_changes().await?;
        }
        write_frame(sock, &resp).await
    }

    /// Send what a write stored in blocks so far to the UFS writer taking over.
    async fn replay(&self, b: &BlockWriter, u: &mut locus_ufs::UfsWriter) -> Result<()> {
        for i in 0..b.index {
            let id = locus_common::block_id(b.version, i);
            let mut src = self.open_block(id, b.block_size, &[]).await?;
            while let Some(chunk) = src.next().await? {
                u.write(chunk).await?;
            }
        }
        if let Some((t, _, n)) = &b.cur {
            let mut f = std::fs::File::open(&t.path).map_err(|e| Error::io("open block file", e))?;
            let mut left = *n;
            while left > 0 {
                let mut buf = vec![0u8; left.min(4 << 20) as usize];
                std::io::Read::read_exact(&mut f, &mut buf).map_err(|e| Error::io("read block file", e))?;
                left -= buf.len() as u64;
                u.write(Bytes::from(buf)).await?;
            }
        }
        Ok(())
    }

    /// A block's bytes: from this worker's store, else from the first of `sources` (data
    /// addresses of other holders) that serves it.
    async fn open_block(&self, block_id: u64, length: u64, sources: &[String]) -> Result<BlockSource> {
        if let Some(lease) = self.store.lease(block_id, false)? {
            if lease.len != length {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("block {block_id} has {} bytes, not {length}", lease.len),
                ));
            }
            let file = std::fs::File::open(&lease.path).map_err(|e| Error::io("open block", e))?;
            return Ok(BlockSource::Local { file, left: length, _lease: lease });
        }
        let mut last = Error::unavailable(format!("no live copy of block {block_id}"));
        for addr in sources.iter().filter(|a| **a != self.data_address) {
            let req = pb::ReadBlockRequest {
                block_id,
                offset: 0,
                length,
                block_length: length,
                read_type: "NO_CACHE".into(),
                // Never filled from the UFS: these bytes are not there (yet).
                fingerprint: locus_common::UNPERSISTED_FINGERPRINT.into(),
                ..Default::default()
            };
            let r = async {
                let s =
                    TcpStream::connect(addr).await.map_err(|e| Error::io(format!("connect to worker {addr}"), e))?;
                let _ = s.set_nodelay(true);
                let mut s = tokio::io::BufReader::with_capacity(1 << 20, s);
                write_frame(&mut s, &pb::DataRequest { req: Some(pb::data_request::Req::Read(req)) }).await?;
                s.flush().await.map_err(|e| Error::io("send", e))?;
                let r: pb::DataResponse =
                    read_frame(&mut s).await?.ok_or_else(|| Error::unavailable(format!("worker {addr} closed")))?;
                if let Some(e) = r.error {
                    return Err(locus_proto::from_error_info(e));
                }
                Ok(BlockSource::Peer { sock: s, left: length, crc: r.has_crc.then_some(r.crc32c) })
            }
            .await;
            match r {
                Ok(src) => return Ok(src),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Write a file's cached blocks to the UFS (the master's persist scheduler asks).
    async fn handle_persist(&self, sock: &mut TcpStream, p: pb::PersistRequest) -> Result<()> {
        let ufs = self.ufs(p.mount_id).await?;
        let addrs: HashMap<u64, String> = p.workers.iter().map(|w| (w.worker_id, w.data_address.clone())).collect();
        let mut writer = ufs.writer(&p.ufs_path, &p.content_type, &p.user_metadata).await?;
        let res: Result<u64> = async {
            let mut total = 0;
            if p.from_ufs {
                // The object stays whole in the UFS until the new one replaces it at close.
                let mut s = Box::pin(ufs.read_range(&p.ufs_path, 0, p.length, 8 << 20, 2).await?);
                while let Some(chunk) = s.next().await {
                    let chunk = chunk?;
                    total += chunk.len() as u64;
                    writer.write(chunk).await?;
                }
            }
            for b in &p.blocks {
                let sources: Vec<String> =
                    b.locations.iter().filter_map(|l| addrs.get(&l.worker_id).cloned()).collect();
                let mut src = self.open_block(b.block_id, b.length, &sources).await?;
                while let Some(chunk) = src.next().await? {
                    total += chunk.len() as u64;
                    writer.write(chunk).await?;
                }
            }
            locus_common::fail::fail_point!("worker.persist.before_commit", |_| Err(Error::internal("failpoint")));
            Ok(total)
        }
        .await;
        let total = match res {
            Ok(t) => t,
            Err(e) => {
                writer.abort().await;
                return Err(e);
            }
        };
        let st = writer.close().await?;
        if st.length != total {
            return Err(Error::new(ErrorKind::Ufs, format!("UFS holds {} bytes after persisting {total}", st.length)));
        }
        write_frame(
            sock,
            &pb::DataResponse { length: st.length, etag: st.etag, mtime_ms: st.mtime_ms, ..Default::default() },
        )
        .await
    }

    /// Copy a block from another worker into this one's store (re-replication).
    async fn handle_replicate(&self, sock: &mut TcpStream, r: pb::ReplicateRequest) -> Result<()> {
        if !self.store.contains(r.block_id) {
            let mut src = self.open_block(r.block_id, r.length, &r.sources).await?;
            let temp = self.store.create(r.block_id, r.length)?;
            let mut f = temp.open()?;
            let (mut n, mut crc) = (0u64, 0u32);
            while let Some(chunk) = src.next().await? {
                std::io::Write::write_all(&mut f, &chunk).map_err(|e| Error::io("write block file", e))?;
                crc = crc32c::crc32c_append(crc, &chunk);
                n += chunk.len() as u64;
            }
            if let Some(want) = src.crc() {
                if want != crc {
                    self.counters.corrupt.fetch_add(1, Relaxed);
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("block {} arrived with crc32c {crc:08x}, not {want:08x}", r.block_id),
                    ));
                }
            }
            temp.commit(n, Some(crc))?;
            self.commit_changes().await?;
        }
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await
    }
}

/// Splits a write into blocks of the new version in the store.
struct BlockWriter {
    store: BlockStore,
    version: u64,
    block_size: u64,
    index: u64,
    cur: Option<(locus_blockstore::TempBlock, std::fs::File, u64)>,
    crc: u32,
}

impl BlockWriter {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.cur.is_none() {
                let t = self.store.create(locus_common::block_id(self.version, self.index), self.block_size)?;
                let f = t.open()?;
                self.cur = Some((t, f, 0));
            }
            let (_, f, n) = self.cur.as_mut().unwrap();
            let k = data.len().min((self.block_size - *n) as usize);
            std::io::Write::write_all(f, &data[..k]).map_err(|e| Error::io("write block file", e))?;
            self.crc = crc32c::crc32c_append(self.crc, &data[..k]);
            *n += k as u64;
            data = &data[k..];
            if *n == self.block_size {
                let (t, _, n) = self.cur.take().unwrap();
                t.commit(n, Some(std::mem::take(&mut self.crc)))?;
                self.index += 1;
            }
        }
        Ok(())
    }

    /// Bytes stored so far (committed blocks and the one in progress).
    fn stored(&self) -> u64 {
        self.index * self.block_size + self.cur.as_ref().map(|c| c.2).unwrap_or(0)
    }

    fn finish(mut self) -> Result<()> {
        match self.cur.take() {
            Some((t, _, n)) if n > 0 => t.commit(n, Some(self.crc)),
            _ => Ok(()),
        }
    }
}

/// Where [`Inner::open_block`] reads a block from.
enum BlockSource {
    Local { file: std::fs::File, left: u64, _lease: Lease },
    Peer { sock: tokio::io::BufReader<TcpStream>, left: u64, crc: Option<u32> },
}

impl BlockSource {
    /// The checksum the holder recorded for the block, when it sent one.
    fn crc(&self) -> Option<u32> {
        match self {
            BlockSource::Local { .. } => None,
            BlockSource::Peer { crc, .. } => *crc,
        }
    }

    /// The next chunk (at most 4 MiB), or `None` at the end of the block.
    async fn next(&mut self) -> Result<Option<Bytes>> {
        const CHUNK: u64 = 4 << 20;
        match self {
            BlockSource::Local { file, left, .. } => {
                if *left == 0 {
                    return Ok(None);
                }
                let mut buf = vec![0u8; CHUNK.min(*left) as usize];
                std::io::Read::read_exact(file, &mut buf).map_err(|e| Error::io("read block file", e))?;
                *left -= buf.len() as u64;
                Ok(Some(Bytes::from(buf)))
            }
            BlockSource::Peer { sock, left, .. } => {
                if *left == 0 {
                    return Ok(None);
                }
                let mut buf = vec![0u8; CHUNK.min(*left) as usize];
                sock.read_exact(&mut buf).await.map_err(|e| Error::unavailable(format!("peer stream broke: {e}")))?;
                *left -= buf.len() as u64;
                Ok(Some(Bytes::from(buf)))
            }
        }
    }
}

fn replica_err(worker: u64, e: Error) -> Error {
    let retryable = e.is_retryable();
    Error::new(e.kind(), format!("replica worker {worker}: {e}")).set_retryable(retryable)
}

type Forward = (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<Result<pb::DataResponse>>);

/// Open the write to the next worker of a pipeline; chunks sent to the returned channel
/// go to it, and the task's result is its answer once the channel closes.
async fn forward_write(next: pb::WorkerAddress, req: pb::WriteFileRequest) -> Result<Forward> {
    let id = next.worker_id;
    let ctx = move |e: Error| replica_err(id, e);
    let s = TcpStream::connect(&next.data_address)
        .await
        .map_err(|e| Error::io(format!("connect to replica worker {}", next.data_address), e))?;
    let _ = s.set_nodelay(true);
    let mut s = tokio::io::BufWriter::with_capacity(1 << 20, s);
    write_frame(&mut s, &pb::DataRequest { req: Some(pb::data_request::Req::Write(req)) }).await.map_err(ctx)?;
    s.flush().await.map_err(|e| Error::io("send", e))?;
    let r: pb::DataResponse =
        read_frame(&mut s).await.map_err(ctx)?.ok_or_else(|| Error::unavailable("replica worker closed"))?;
    if let Some(e) = r.error {
        return Err(ctx(locus_proto::from_error_info(e)));
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let task = tokio::spawn(async move {
        let mut broken = None;
        while let Some(b) = rx.recv().await {
            if broken.is_some() {
                continue; // drain, so the sender never blocks on a dead pipeline
            }
            let r = async {
                s.write_all(&(b.len() as u32).to_be_bytes()).await?;
                s.write_all(&b).await
            }
            .await;
            if let Err(e) = r {
                broken = Some(e);
            }
        }
        if let Some(e) = broken {
            return Err(Error::unavailable(format!("replica worker {} went away mid-write: {e}", next.worker_id)));
        }
        s.write_all(&0u32.to_be_bytes()).await.map_err(|e| Error::io("send", e))?;
        s.flush().await.map_err(|e| Error::io("send", e))?;
        let r: pb::DataResponse = read_frame(&mut s).await.map_err(ctx)?.ok_or_else(|| {
            Error::unavailable(format!("replica worker {} closed before acknowledging", next.worker_id))
        })?;
        match r.error {
            Some(e) => Err(ctx(locus_proto::from_error_info(e))),
            None => Ok(r),
        }
    });
    Ok((tx, task))
}

/// `sendfile(2)` up to `len` bytes of `file` at `off` to the socket; returns the bytes sent.
async fn sendfile(sock: &TcpStream, file: &std::fs::File, off: u64, len: u64) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    loop {
        sock.writable().await?;
        let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
            let mut o = off as libc::off_t;
            // SAFETY: both descriptors are open for the duration of the call.
            let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut o, len as usize) };
            if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as u64) }
        });
        match r {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn serve_tcp(inner: Arc<Inner>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (sock, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(e) => { tracing::warn!(error = %e, "accept"); continue } },
            _ = stop.changed() => return,
        };
        let _ = sock.set_nodelay(true);
        let inner = inner.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut s = sock;
            // A stopping worker drops its connections mid-stream, as a crash would.
            tokio::select! {
                _ = serve_conn(inner, &mut s) => {}
                _ = stop.changed() => {}
            }
        });
    }
}

async fn serve_conn(inner: Arc<Inner>, s: &mut TcpStream) {
    loop {
        let req: pb::DataRequest = match read_frame(s).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                let _ =
                    write_frame(s, &pb::DataResponse { error: Some(to_error_info(&e)), ..Default::default() }).await;
                let _ = s.flush().await;
                return;
            }
        };
        let mut hdr = false;
        let res = match req.req {
            Some(pb::data_request::Req::Read(r)) => inner.handle_read(s, r, &mut hdr).await,
            Some(pb::data_request::Req::Write(w)) => inner.handle_write(s, w).await,
            Some(pb::data_request::Req::Persist(p)) => inner.handle_persist(s, p).await,
            Some(pb::data_request::Req::Replicate(r)) => inner.handle_replicate(s, r).await,
            Some(pb::data_request::Req::Hello(_)) => {
                write_frame(s, &pb::DataResponse { worker_id: inner.id.load(Relaxed), ..Default::default() }).await
            }
            Some(pb::data_request::Req::Lease(_)) => {
                Err(Error::invalid("leases are granted over the Unix socket only"))
            }
            None => Err(Error::invalid("empty data request")),
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, "data request failed");
            if hdr {
                // Bytes were already streamed: close, the client sees a short read and retries.
                let _ = s.flush().await;
                return;
            }
            let _ = write_frame(s, &pb::DataResponse { error: Some(to_error_info(&e)), ..Default::default() }).await;
            let _ = s.flush().await;
            if e.kind() == ErrorKind::InvalidArgument {
                return;
            }
            continue;
        }
        if s.flush().await.is_err() {
            return;
        }
    }
}

async fn serve_uds(inner: Arc<Inner>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (mut sock, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(e) => { tracing::warn!(error = %e, "uds accept"); continue } },
            _ = stop.changed() => return,
        };
        let inner = inner.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = serve_lease_conn(inner, &mut sock) => {}
                _ = stop.changed() => {}
            }
        });
    }
}

async fn serve_lease_conn(inner: Arc<Inner>, sock: &mut UnixStream) {
    // What a reply hands out lives as long as the client keeps it: until its next
    // request or until it closes the connection (which also covers a client crash).
    let mut held: Option<Held> = None;
    loop {
        let req: pb::DataRequest = match read_frame(sock).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                let _ =
                    write_frame(sock, &pb::DataResponse { error: Some(to_error_info(&e)), ..Default::default() }).await;
                return;
            }
        };
        drop(held.take());
        let resp = match req.req {
            Some(pb::data_request::Req::Read(r)) => match inner.follow_read(sock, r).await {
                Ok(h) => {
                    held = Some(h);
                    continue;
                }
                Err(e) => pb::DataResponse { error: Some(to_error_info(&e)), ..Default::default() },
            },
            Some(pb::data_request::Req::Lease(l)) => match inner.store.lease(l.block_id, l.promote) {
                Ok(Some(lease)) => {
                    inner.counters.cache_hits.fetch_add(1, Relaxed);
                    inner.counters.short_circuit.fetch_add(l.length.min(lease.len), Relaxed);
                    let r = pb::DataResponse {
                        path: lease.path.display().to_string(),
                        length: lease.len,
                        ..Default::default()
                    };
                    held = Some(Held::Lease(lease));
                    r
                }
                Ok(None) => pb::DataResponse {
                    error: Some(to_error_info(&Error::not_found(format!("block {} is not cached here", l.block_id)))),
                    ..Default::default()
                },
                Err(e) => pb::DataResponse { error: Some(to_error_info(&e)), ..Default::default() },
            },
            Some(pb::data_request::Req::Hello(_)) => {
                pb::DataResponse { worker_id: inner.id.load(Relaxed), ..Default::default() }
            }
            _ => pb::DataResponse {
                error: Some(to_error_info(&Error::invalid("only reads, leases and hello on the Unix socket"))),
                ..Default::default()
            },
        };
        if write_frame(sock, &resp).await.is_err() {
            return;
        }
    }
}
