//! The Locus worker: serves blocks over the data path (TCP) and short-circuit leases
//! (Unix socket), fills its cache from the UFS on a miss (concurrent misses on one block
//! cost one UFS read), writes files through to the UFS, and keeps the master informed
//! with registration, heartbeats and block commits. It runs the near-data operators on
//! the blocks it holds (`locus-compute`) and sends back only their partial results, and
//! SQL plan fragments through a [`FragmentRunner`] the binary gives it (the SQL engine
//! lives in `locus-sql`, which this crate must not depend on).
//!
//! Depends on `locus-common`, `locus-proto`, `locus-ufs`, `locus-blockstore` and
//! `locus-compute`; it must
//! never depend on `locus-master` or `locus-client`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use locus_blockstore::BlockStore;
use locus_common::config::{TierAlias, TierConfig, WorkerConfig};
use locus_common::job::Job;
use locus_common::metrics::{HostKey, OTHER_HOSTS, ReadReason, ReadSource};
use locus_common::security::{Role, Secret, Verifier};
use locus_common::{Error, Result};
use locus_proto::auth::AuthedMasterClient;
use locus_proto::masters::Masters;
use locus_proto::pb;
use locus_proto::tls::Tls;
use parking_lot::Mutex;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

mod block;
mod compute;
mod fence;
mod guard;
mod heartbeat;
mod mirror;
mod read;
mod server;
mod write;

use read::FillState;
use server::{serve_tcp, serve_uds};

/// What this worker served, by source, as the heartbeat reports it.
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
    /// Near-data compute: block bytes scanned, and partial-result bytes sent back.
    compute_scanned: AtomicU64,
    compute_returned: AtomicU64,
    /// Client writes: bytes co-located clients wrote into block files themselves, and
    /// bytes received in chunk frames.
    written_short_circuit: AtomicU64,
    written_data_path: AtomicU64,
    /// Client reads by the client's host, the bytes' source and why they were not
    /// short-circuit (cumulative, sent whole with each heartbeat).
    by_host: Mutex<HashMap<HostKey, (u64, u64)>>,
}

/// A worker reads a UFS object in ranged requests of this size, this many in flight: a
/// fill or a straight read keeps the reader fed; a persist that copies an object onto
/// itself (`from_ufs`) shares the UFS with its own write.
const UFS_PIECE: usize = 8 << 20;
const UFS_READS_IN_FLIGHT: usize = 4;
const UFS_COPY_READS_IN_FLIGHT: usize = 2;

/// Distinct (host, source, reason) rows a worker keeps; reads of hosts past it are
/// counted under [`OTHER_HOSTS`], so a caller naming random hosts cannot grow the map.
const MAX_HOST_ROWS: usize = 4096;
/// The longest host name counted as itself (a DNS name's limit).
const MAX_HOST_NAME: usize = 253;

impl Counters {
    /// Count one client read of `bytes` from `source` for `host`, which the client gave
    /// `reason` for (an empty host, a service's own read, is not counted by host).
    fn count_host(&self, host: &str, source: ReadSource, reason: ReadReason, bytes: u64) {
        if host.is_empty() {
            return;
        }
        // A name no host has (longer than DNS allows) is counted under OTHER_HOSTS too.
        let host = if host.len() > MAX_HOST_NAME { OTHER_HOSTS } else { host };
        let mut m = self.by_host.lock();
        let key = (host.to_string(), source, reason);
        let key = if m.len() >= MAX_HOST_ROWS && !m.contains_key(&key) {
            (OTHER_HOSTS.to_string(), source, reason)
        } else {
            key
        };
        let e = m.entry(key).or_default();
        e.0 += 1;
        e.1 += bytes;
    }

    /// The rows as the heartbeat sends them.
    fn host_reads(&self) -> Vec<pb::HostReads> {
        self.by_host.lock().iter().map(|(k, t)| pb::HostReads::row(k, *t)).collect()
    }
}

/// The state every handler shares: the block store, the master, the mounts' UFSes and
/// the fills in progress.
/// How long a call to a group of masters looks for its leader.
const FOLLOW_FOR: Duration = Duration::from_secs(15);

struct Inner {
    cfg: WorkerConfig,
    store: BlockStore,
    /// A client of each master of the group (one without a group), and which led last.
    masters: Masters,
    /// Checks callers of the data path; holds the secret this worker presents.
    verifier: Verifier,
    /// TLS of the data port and of this worker's connections to the master and workers.
    tls: Tls,
    id: AtomicU64,
    data_address: String,
    uds_path: Option<PathBuf>,
    counters: Counters,
    pin_epoch: AtomicU64,
    /// Signalled when `pin_epoch` is set (`Worker::wait_registered`).
    registered: tokio::sync::Notify,
    /// The mounts' UFSes, as the master described them (`guard.rs`).
    ufs: Mutex<HashMap<u64, guard::MountUfs>>,
    /// The members the master registered, for dialing peers by id (`guard.rs`).
    members: Mutex<guard::Members>,
    /// What no mount may hold: the credential files, the data dir, the tiers.
    protected: Vec<PathBuf>,
    /// Blocks being filled from the UFS. Readers that arrive during a fill stream what
    /// the leader has written so far, then follow it as it grows.
    inflight: Mutex<HashMap<u64, watch::Receiver<FillState>>>,
    /// The worker's background jobs, reported with every heartbeat.
    jobs: Mutex<Vec<locus_common::job::JobWatch>>,
    /// Held while block changes are taken from the store and sent to the master
    /// ([`Inner::commit_changes`]), or the full block report is (registration): a caller
    /// that finds nothing left to send has to wait for the commit in flight that took its
    /// changes, or it would answer (acknowledge a write, say) before the master knows its
    /// blocks; and the master takes reports and commits in the order they were made.
    committing: tokio::sync::Mutex<()>,
    /// Runs SQL plan fragments, when the binary has SQL.
    fragments: Option<Arc<dyn FragmentRunner>>,
    /// This run of the worker (its cumulative counters start at zero with each), so the
    /// master tells a restart from a count that merely grew.
    boot_id: u64,
    /// The highest term of the master group heard of: older orders are refused.
    fence: Arc<fence::Fence>,
    /// Which masters of the group took every change of this worker's blocks
    /// (`mirror.rs`), by address.
    in_step: Mutex<HashMap<String, bool>>,
    /// Full block reports the leader took (registrations).
    registrations: AtomicU64,
    /// The heartbeat job's last heartbeat, which the mirror job copies to the other
    /// members (usage is read from the tiers once per interval).
    last_beat: Mutex<Option<pb::HeartbeatRequest>>,
}

pub use locus_proto::fragment::{FragmentFactory, FragmentRunner, FragmentStream};

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    cfg: WorkerConfig,
    master_address: String,
    secret: Secret,
    tls: Tls,
    fragments: Option<FragmentFactory>,
    protected: Vec<PathBuf>,
}

impl WorkerBuilder {
    /// A worker of the master at `master_address`, presenting the cluster `secret` to it
    /// and to other workers, and accepting callers that present it or its client token.
    pub fn new(cfg: WorkerConfig, master_address: impl Into<String>, secret: Secret) -> Self {
        WorkerBuilder {
            cfg,
            master_address: master_address.into(),
            secret,
            tls: Tls::none(),
            fragments: None,
            protected: Vec::new(),
        }
    }

    /// Files no mount this worker serves may hold (the credential files): with its data
    /// dir and tiers, a `file://` mount whose root contains one is refused
    /// (`locus_ufs::check_mount_target`).
    pub fn protect(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.protected.extend(paths);
        self
    }

    /// Run SQL plan fragments with the runner `f` makes. Default none: such a request is
    /// refused (FailedPrecondition), and the caller runs the fragment itself.
    pub fn fragments(mut self, f: Option<FragmentFactory>) -> Self {
        self.fragments = f;
        self
    }

    /// TLS of the data port (see `locus_proto::tls`) and of this worker's connections to
    /// the master and to other workers. Default none.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// Open the block store, bind the data listener and the Unix socket, and start.
    /// Registration with the master is retried in the background until it succeeds.
    pub async fn start(self) -> Result<Worker> {
        let data_dir = self.cfg.data_dir.clone();
        blocking(move || locus_common::security::create_private_dir(&data_dir)).await??;
        let listener = TcpListener::bind(&self.cfg.data_address)
            .await
            .map_err(|e| Error::io(format!("bind worker data address {}", self.cfg.data_address), e))?;
        let local = listener.local_addr().map_err(|e| Error::io("local addr", e))?;
        let uds_path = match &self.cfg.uds_path {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => Some(self.cfg.data_dir.join("worker.sock")),
        };
        // The tiers are scanned, a stale socket file removed and the saved id read off the
        // runtime.
        let (cfg, store, saved_id, fence) = {
            let (mut cfg, uds_path) = (self.cfg, uds_path.clone());
            blocking(move || {
                if cfg.tiers.is_empty() {
                    cfg.tiers.push(default_mem_tier(&cfg.data_dir));
                }
                let store = BlockStore::open(&cfg.tiers, cfg.high_watermark, cfg.low_watermark)?
                    .with_file_pool(cfg.file_pool_ttl);
                if let Some(p) = &uds_path {
                    let _ = std::fs::remove_file(p);
                }
                let saved_id: Option<u64> =
                    std::fs::read_to_string(cfg.data_dir.join("worker_id")).ok().and_then(|s| s.trim().parse().ok());
                let fence = fence::Fence::load(&cfg.data_dir)?;
                Ok::<_, Error>((cfg, store, saved_id, fence))
            })
            .await??
        };
        let uds = match &uds_path {
            Some(p) => Some(UnixListener::bind(p).map_err(|e| Error::io(format!("bind {}", p.display()), e))?),
            None => None,
        };
        let identity = Verifier::new(&self.secret).identity(Role::Worker);
        let masters = Masters::new(&self.master_address, identity, self.tls.clone(), Duration::from_secs(30))?;
        if masters.is_empty() {
            return Err(Error::invalid("a worker needs its master's address (host:port, or a,b,c for a group)"));
        }
        let fragments = match &self.fragments {
            Some(f) => Some(f(&self.master_address, &self.secret, &self.tls)?),
            None => None,
        };
        let mut protected = self.protected;
        protected.push(cfg.data_dir.clone());
        protected.extend(cfg.tiers.iter().map(|t| t.dir.clone()));
        let inner = Arc::new(Inner {
            fragments,
            data_address: local.to_string(),
            cfg,
            store,
            masters,
            verifier: Verifier::new(&self.secret),
            tls: self.tls,
            id: AtomicU64::new(saved_id.unwrap_or(0)),
            uds_path,
            counters: Counters::default(),
            pin_epoch: AtomicU64::new(u64::MAX),
            registered: tokio::sync::Notify::new(),
            ufs: Mutex::new(HashMap::new()),
            members: Mutex::new(guard::Members::default()),
            protected,
            inflight: Mutex::new(HashMap::new()),
            jobs: Mutex::new(Vec::new()),
            committing: tokio::sync::Mutex::new(()),
            boot_id: (locus_common::now_ms() as u64) << 20 ^ std::process::id() as u64 ^ local.port() as u64,
            fence: Arc::new(fence),
            in_step: Mutex::new(HashMap::new()),
            registrations: AtomicU64::new(0),
            last_beat: Mutex::new(None),
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
        inner.jobs.lock().push(heartbeat.watch());
        // The other members of a group get a copy of what the leader is told.
        let mirror = (inner.masters.len() > 1).then(|| {
            let m_inner = inner.clone();
            Job::spawn_periodic("worker.mirror", inner.cfg.heartbeat_interval, move || {
                let i = m_inner.clone();
                async move {
                    let beat = i.last_beat.lock().clone();
                    if let Some(beat) = beat {
                        i.mirror_round(beat).await;
                    }
                    Ok(())
                }
            })
        });
        Ok(Worker { inner, local, stop: stop_tx, tasks, heartbeat: Some(heartbeat), mirror })
    }
}

fn default_mem_tier(data_dir: &Path) -> TierConfig {
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let tag: String = abs.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    TierConfig {
        alias: TierAlias::Mem,
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
    mirror: Option<Job>,
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
    /// The highest term of the master group this worker has been told (0 without a
    /// group): orders of older terms are refused.
    pub fn master_term(&self) -> u64 {
        self.inner.fence.highest()
    }
    /// How many times a leader took this worker's full block report (registrations).
    pub fn registrations(&self) -> u64 {
        self.inner.registrations.load(Relaxed)
    }
    /// How many orders and heartbeat answers this worker refused as a deposed master's.
    pub fn refused_from_deposed(&self) -> u64 {
        self.inner.fence.refused()
    }
    /// Wait until the master has registered this worker.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<u64> {
        let i = &self.inner;
        let registered = || {
            let id = i.id.load(Relaxed);
            ((id != 0 && i.pin_epoch.load(Relaxed) != u64::MAX).then_some(id), None)
        };
        locus_common::wait::until(&i.registered, std::time::Instant::now() + timeout, registered)
            .await
            .ok_or_else(|| Error::unavailable("worker did not register with the master in time"))
    }

    /// Stop serving and heartbeating. Blocks on disk tiers stay for the next start.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for h in [self.heartbeat.take(), self.mirror.take()].into_iter().flatten() {
            h.stop().await;
        }
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Some(p) = self.inner.uds_path.clone() {
            let _ = blocking(move || std::fs::remove_file(p)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
        for h in [self.heartbeat.take(), self.mirror.take()].into_iter().flatten() {
            h.abort();
        }
    }
}

/// Run blocking work (file I/O, fsyncs, the block store's blocking methods) on Tokio's
/// blocking threads, so that it never holds up the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::internal(format!("blocking task: {e}")))
}

/// Holds a value whose drop may do file work (the last [`locus_blockstore::Lease`] of a
/// removed block, or an uncommitted [`locus_blockstore::TempBlock`], deletes its file),
/// and drops it on a blocking thread.
pub(crate) struct DropOffRuntime<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> DropOffRuntime<T> {
    pub(crate) fn new(v: T) -> Self {
        DropOffRuntime(Some(v))
    }

    pub(crate) fn into_inner(mut self) -> T {
        self.0.take().expect("taken only here")
    }
}

impl<T: Send + 'static> std::ops::Deref for DropOffRuntime<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only by into_inner")
    }
}

impl<T: Send + 'static> Drop for DropOffRuntime<T> {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || drop(v))),
                Err(_) => drop(v),
            }
        }
    }
}

impl Inner {
    /// Run `f` on the block store on a blocking thread: for its blocking methods
    /// (`create`, `lease`, `remove`, `adopt_cluster`, `trim_file_pool`, `cluster_id`; a
    /// new block's `open` and `commit` run on [`blocking`] too, as does `BlockStore::open`
    /// at start).
    async fn store_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&BlockStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.store.clone();
        blocking(move || f(&store)).await?
    }

    /// One call to the master, to the leader of its group: a member that does not lead
    /// names the leader, and one that cannot be reached (or is losing the lead) is passed
    /// over for the next, for up to [`FOLLOW_FOR`] (an election and a take-over). Every
    /// call a worker makes may be made twice.
    async fn call<T, F, Fut>(&self, f: F) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(AuthedMasterClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let (mut tries, mut reproved) = (0, false);
        let mut pause = locus_proto::masters::Pause::new(self.masters.len());
        loop {
            let ((i, _, m), n) = (self.masters.current(), self.masters.len());
            let s = match f(m).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            // A proof refused once is asked for again (a restarted master's challenges differ).
            if s.code() == tonic::Code::Unauthenticated && !reproved {
                reproved = true;
                continue;
            }
            let hint = locus_proto::leader_hint(&s);
            let away = matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled);
            if !(hint.is_some() || away) || started.elapsed() > FOLLOW_FOR || (n == 1 && hint.is_none()) {
                return Err(s);
            }
            self.masters.follow(i, hint.as_deref().unwrap_or_default());
            tries += 1;
            if tries % n == 0 {
                tokio::time::sleep(pause.take()).await;
            }
        }
    }
}
