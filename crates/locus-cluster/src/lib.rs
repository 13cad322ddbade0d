//! The embedded cluster: [`LocalCluster`] runs a master, N workers and (optionally) the S3
//! gateway in one process. `locus local start` runs it on fixed ports; the tests and the
//! benchmarks (`locus-bench`) run it as a MiniCluster on port 0.
//!
//! It depends on the server crates (master, worker, gateway) and the client, and must
//! not depend on the CLI (`locus`) or on the benchmarks (`locus-bench`): they build on it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytesize::ByteSize;
use locus_client::Client;
use locus_client::Tls;
use locus_common::config::{ClientConfig, Config, SecurityConfig, TierAlias, TierConfig};
use locus_common::security::{Secret, load_or_create_secret};
use locus_common::{Error, Result};
use locus_master::{Master, MasterAddrs, MasterBuilder};
use locus_worker::{FragmentFactory, Worker, WorkerBuilder};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod ports;
pub use ports::free_address;

/// A master (or a replicated group of masters) and its workers in this process.
pub struct LocalCluster {
    cfg: Config,
    /// The cluster secret (master and workers); clients get its client token.
    secret: Secret,
    /// TLS of every TCP port and connection (`security.tls_*`; none by default).
    tls: Tls,
    data_dir: PathBuf,
    root_ufs: Option<String>,
    /// Each master, with its own configuration (addresses, metadata dir): one, or the
    /// members of a group ([`LocalCluster::start_group`]).
    masters: Vec<MasterSlot>,
    workers: Vec<Option<Worker>>,
    gateway: Option<RunningGateway>,
    /// How workers run SQL fragments (none: they refuse them; callers run them).
    fragments: Option<FragmentFactory>,
    /// Per-worker changes to the shared worker configuration, applied at each start of
    /// that worker ([`LocalCluster::configure_worker`]).
    overrides: std::collections::HashMap<usize, WorkerOverride>,
}

/// A change to one worker's configuration.
type WorkerOverride = Box<dyn Fn(&mut locus_common::config::WorkerConfig) + Send + Sync>;

struct RunningGateway {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<()>>,
}

struct MasterSlot {
    cfg: locus_common::config::MasterConfig,
    running: Option<RunningMaster>,
}

struct RunningMaster {
    master: Master,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<()>>,
}

fn absolute(p: &Path) -> PathBuf {
    let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    p.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect()
}

/// The tmpfs directory holding the default MEM tiers of a cluster with this data dir
/// (kept across restarts, so MEM blocks survive a process restart; remove it with the
/// data dir).
pub fn default_mem_dir(data_dir: &Path) -> PathBuf {
    let tag: String =
        absolute(data_dir).to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    PathBuf::from("/dev/shm").join(format!("locus{tag}"))
}

/// The file in a data dir that lists the tier directories its workers used (outside it,
/// such as the MEM tiers in /dev/shm), so [`clean`] finds them.
const TIER_RECORD: &str = "tier-dirs";

/// Add `tiers`' directories to the data dir's record.
fn record_tier_dirs(data_dir: &Path, tiers: &[TierConfig]) -> Result<()> {
    let file = data_dir.join(TIER_RECORD);
    let mut known: Vec<String> = std::fs::read_to_string(&file).unwrap_or_default().lines().map(String::from).collect();
    let before = known.len();
    for t in tiers {
        let d = t.dir.display().to_string();
        if !known.contains(&d) {
            known.push(d);
        }
    }
    if known.len() != before {
        std::fs::write(&file, known.join("\n") + "\n")
            .map_err(|e| Error::io(format!("write {}", file.display()), e))?;
    }
    Ok(())
}

/// Remove what a `local start` over `data_dir` keeps: the tier directories it recorded
/// (and its default MEM tiers, found by the data dir's name even when the data dir is
/// gone), the metadata, worker state and credentials; the default UFS (`<data_dir>/ufs`)
/// only with `ufs`. Refuses while a cluster runs on it. Returns what it removed.
pub fn clean(data_dir: &Path, ufs: bool) -> Result<Vec<PathBuf>> {
    let data_dir = absolute(data_dir);
    if std::os::unix::net::UnixStream::connect(data_dir.join("worker0").join("worker.sock")).is_ok() {
        return Err(Error::new(
            locus_common::ErrorKind::FailedPrecondition,
            format!("a cluster is running on {} (stop it first)", data_dir.display()),
        ));
    }
    let mut dirs: Vec<PathBuf> =
        std::fs::read_to_string(data_dir.join(TIER_RECORD)).unwrap_or_default().lines().map(PathBuf::from).collect();
    dirs.push(default_mem_dir(&data_dir));
    let mut removed = Vec::new();
    for d in dirs {
        if d.exists() {
            std::fs::remove_dir_all(&d).map_err(|e| Error::io(format!("remove {}", d.display()), e))?;
            removed.push(d);
        }
    }
    if let Ok(entries) = std::fs::read_dir(&data_dir) {
        for e in entries.flatten() {
            let p = e.path();
            if !ufs && e.file_name() == "ufs" {
                continue;
            }
            let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|e| Error::io(format!("remove {}", p.display()), e))?;
            removed.push(p);
        }
        if std::fs::read_dir(&data_dir).map(|mut d| d.next().is_none()).unwrap_or(false) {
            let _ = std::fs::remove_dir(&data_dir);
        }
    }
    Ok(removed)
}

/// `host:port` with the port moved up by `i` (port 0 stays 0).
fn offset_port(addr: &str, i: usize) -> String {
    match addr.rsplit_once(':').and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h, p))) {
        Some((h, 0)) => format!("{h}:0"),
        Some((h, p)) => format!("{h}:{}", p as usize + i),
        None => addr.to_string(),
    }
}

impl LocalCluster {
    /// Start a master (gRPC on `cfg.master.rpc_address`, web on `cfg.master.web_address`)
    /// and `workers` workers under `data_dir`. `root_ufs` is mounted at `/` when the
    /// namespace is new; `None` means `file://<data_dir>/ufs`; `Some("")` leaves `/`
    /// unmounted.
    pub async fn start(cfg: Config, data_dir: &Path, workers: usize, root_ufs: Option<String>) -> Result<LocalCluster> {
        Self::start_with(cfg, data_dir, workers, root_ufs, None).await
    }

    /// [`LocalCluster::start`], with workers that run SQL fragments through `fragments`.
    pub async fn start_with(
        cfg: Config,
        data_dir: &Path,
        workers: usize,
        root_ufs: Option<String>,
        fragments: Option<FragmentFactory>,
    ) -> Result<LocalCluster> {
        Self::start_all(cfg, data_dir, 1, workers, root_ufs, fragments).await
    }

    /// [`LocalCluster::start`] with a replicated group of `masters` masters, each on
    /// ports of its own on 127.0.0.1 with its metadata in `master<i>`; returns once the
    /// group has them all as voters and one leads. Clients and workers get the list.
    pub async fn start_group(
        cfg: Config,
        data_dir: &Path,
        masters: usize,
        workers: usize,
        root_ufs: Option<String>,
    ) -> Result<LocalCluster> {
        Self::start_all(cfg, data_dir, masters, workers, root_ufs, None).await
    }

    async fn start_all(
        mut cfg: Config,
        data_dir: &Path,
        masters: usize,
        workers: usize,
        root_ufs: Option<String>,
        fragments: Option<FragmentFactory>,
    ) -> Result<LocalCluster> {
        let data_dir = absolute(data_dir);
        // 0700 when made here: it holds the credentials, the metadata and the default UFS.
        locus_common::security::create_private_dir(&data_dir)?;
        let root_ufs = match root_ufs {
            None => Some(format!("file://{}", data_dir.join("ufs").display())),
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s),
        };
        cfg.master.meta_dir = data_dir.join("master");
        // The credentials live in the data dir unless configured elsewhere, each on its
        // own (a token file named for the clients must not leave the secret in the
        // working directory).
        let d = SecurityConfig::default();
        if cfg.security.secret_file == d.secret_file {
            cfg.security.secret_file = data_dir.join("cluster.secret");
        }
        if cfg.security.token_file == d.token_file {
            cfg.security.token_file = data_dir.join("client.token");
        }
        let security = cfg.security.clone();
        let (secret, tls) = tokio::task::spawn_blocking(move || {
            Ok::<_, Error>((load_or_create_secret(&security)?, Tls::load(&security)?))
        })
        .await
        .map_err(|e| Error::internal(format!("load the cluster secret: {e}")))??;
        let mut c = LocalCluster {
            cfg,
            secret,
            tls,
            data_dir,
            root_ufs,
            masters: Vec::new(),
            workers: Vec::new(),
            gateway: None,
            fragments,
            overrides: Default::default(),
        };
        c.masters = c.master_slots(masters)?;
        c.start_master().await?;
        if masters > 1 {
            c.wait_for_group(Duration::from_secs(60)).await?;
        }
        for _ in 0..workers {
            c.workers.push(None);
        }
        for i in 0..workers {
            c.start_worker(i).await?;
        }
        for w in c.workers.iter().flatten() {
            w.wait_registered(Duration::from_secs(20)).await?;
        }
        Ok(c)
    }

    /// The masters' configurations: the one configured, or `n` members of a group.
    fn master_slots(&self, n: usize) -> Result<Vec<MasterSlot>> {
        if n <= 1 {
            return Ok(vec![MasterSlot { cfg: self.cfg.master.clone(), running: None }]);
        }
        let free = ports::free_address;
        let mut slots = Vec::new();
        for i in 0..n {
            let mut m = self.cfg.master.clone();
            m.meta_dir = self.data_dir.join(format!("master{i}"));
            (m.rpc_address, m.web_address, m.raft_address) = (free()?, free()?, free()?);
            slots.push(MasterSlot { cfg: m, running: None });
        }
        let peers: Vec<String> = slots.iter().map(|s| s.cfg.raft_address.clone()).collect();
        for s in &mut slots {
            s.cfg.peers = peers.clone();
        }
        Ok(slots)
    }

    /// Starts every master not running.
    pub async fn start_master(&mut self) -> Result<()> {
        for i in 0..self.masters.len() {
            if self.masters[i].running.is_none() {
                self.start_master_at(i).await?;
            }
        }
        Ok(())
    }

    /// Starts master `i` (of a group; 0 for the one master).
    pub async fn start_master_at(&mut self, i: usize) -> Result<()> {
        let cfg = &self.masters[i].cfg;
        let rpc = TcpListener::bind(&cfg.rpc_address)
            .await
            .map_err(|e| Error::io(format!("bind master rpc {}", cfg.rpc_address), e))?;
        let web = TcpListener::bind(&cfg.web_address)
            .await
            .map_err(|e| Error::io(format!("bind master web {}", cfg.web_address), e))?;
        let local = |l: &TcpListener| l.local_addr().map_err(|e| Error::io("a bound listener's address", e));
        let addrs = MasterAddrs { rpc: local(&rpc)?, web: local(&web)? };
        // Restarts reuse the ports chosen the first time, so workers find the master again.
        let cfg = &mut self.masters[i].cfg;
        cfg.rpc_address = addrs.rpc.to_string();
        cfg.web_address = addrs.web.to_string();
        let cfg = cfg.clone();
        if self.masters.len() == 1 {
            self.cfg.master.rpc_address = cfg.rpc_address.clone();
            self.cfg.master.web_address = cfg.web_address.clone();
        }
        self.cfg.master_address = self.masters.iter().map(|m| m.cfg.rpc_address.as_str()).collect::<Vec<_>>().join(",");
        let master = MasterBuilder::new(cfg, self.secret.clone())
            .protect([self.cfg.security.secret_file.clone(), self.cfg.security.token_file.clone()])
            .tls(self.tls.clone())
            .root_ufs(self.root_ufs.clone())
            .build()
            .await?;
        let (stop, rx) = oneshot::channel();
        let m2 = master.clone();
        let task = tokio::spawn(async move {
            m2.serve(rpc, web, async move {
                let _ = rx.await;
            })
            .await
        });
        self.masters[i].running = Some(RunningMaster { master, stop, task });
        Ok(())
    }

    /// Waits until the group has every master as a voter and one of them leads.
    pub async fn wait_for_group(&self, limit: Duration) -> Result<()> {
        let n = self.masters.len();
        self.wait_for_leader(limit, |m| m.masters.iter().filter(|m| m.voter).count() == n).await
    }

    /// Waits until a master leads and its view of the group's members passes `ok`.
    pub async fn wait_for_leader(
        &self,
        limit: Duration,
        ok: impl Fn(&locus_proto::pb::MasterGroupStatus) -> bool,
    ) -> Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(l) = self.leader()
                && l.members().is_ok_and(|m| ok(&m))
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::unavailable(format!("the master group did not form in {limit:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The index of the master that leads its group now, if one does.
    pub fn leader_index(&self) -> Option<usize> {
        self.masters.iter().position(|s| s.running.as_ref().is_some_and(|r| r.master.is_leader()))
    }

    fn leader(&self) -> Option<&Master> {
        self.leader_index().and_then(|i| self.masters[i].running.as_ref()).map(|r| &r.master)
    }

    /// How many masters the cluster has (running or not).
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// Stop every master (their metadata stays on disk for [`LocalCluster::start_master`]).
    pub async fn stop_master(&mut self) {
        for i in 0..self.masters.len() {
            self.stop_master_at(i).await;
        }
    }

    /// Stop master `i`.
    pub async fn stop_master_at(&mut self, i: usize) {
        if let Some(m) = self.masters[i].running.take() {
            let _ = m.stop.send(());
            let _ = m.task.await;
            // Work still in flight (a change on the committer thread, a request being
            // answered) holds the master a moment longer; once this is its last handle,
            // dropping it closes the metadata store, so a restart can open it at once.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while m.master.handles() > 1 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Master `i`, when it runs.
    pub fn master_at(&self, i: usize) -> Option<&Master> {
        self.masters.get(i).and_then(|s| s.running.as_ref()).map(|r| &r.master)
    }

    /// A new master for a group (not started, not yet a member: `locus admin masters add`
    /// adds it), on ports of its own, naming the group's members as its peers. Returns
    /// its index.
    pub fn new_master_slot(&mut self) -> Result<usize> {
        let i = self.masters.len();
        let mut slot = self.master_slots(2)?.remove(0);
        slot.cfg.meta_dir = self.data_dir.join(format!("master{i}"));
        let mut peers: Vec<String> = self.masters.iter().map(|m| m.cfg.raft_address.clone()).collect();
        peers.push(slot.cfg.raft_address.clone());
        slot.cfg.peers = peers;
        self.masters.push(slot);
        Ok(i)
    }

    /// The configuration of master `i`.
    pub fn master_config(&self, i: usize) -> &locus_common::config::MasterConfig {
        &self.masters[i].cfg
    }

    fn worker_config(&self, i: usize) -> locus_common::config::WorkerConfig {
        let mut w = self.cfg.worker.clone();
        w.data_dir = self.data_dir.join(format!("worker{i}"));
        w.data_address = offset_port(&w.data_address, i);
        if w.uds_path.as_ref().is_none_or(|p| !p.as_os_str().is_empty()) {
            w.uds_path = Some(w.data_dir.join("worker.sock"));
        }
        if w.tiers.is_empty() {
            w.tiers.push(TierConfig {
                alias: TierAlias::Mem,
                dir: default_mem_dir(&self.data_dir).join(format!("w{i}")),
                quota: ByteSize::gib(1),
            });
        } else {
            for t in &mut w.tiers {
                t.dir = t.dir.join(format!("w{i}"));
            }
        }
        if let Some(f) = self.overrides.get(&i) {
            f(&mut w);
        }
        w
    }

    /// Change the master's configuration from its next start on.
    pub fn configure_master(&mut self, f: impl Fn(&mut locus_common::config::MasterConfig)) {
        f(&mut self.cfg.master);
        for m in &mut self.masters {
            f(&mut m.cfg);
        }
    }

    /// Change worker `i`'s configuration from its next start on (a test's other host:
    /// another `host` name, no short-circuit socket).
    pub fn configure_worker(
        &mut self,
        i: usize,
        f: impl Fn(&mut locus_common::config::WorkerConfig) + Send + Sync + 'static,
    ) {
        self.overrides.insert(i, Box::new(f));
    }

    /// The tiers of worker `i` (directory and quota), as it runs them.
    pub fn worker_tiers(&self, i: usize) -> Vec<TierConfig> {
        self.worker_config(i).tiers
    }

    pub async fn start_worker(&mut self, i: usize) -> Result<()> {
        record_tier_dirs(&self.data_dir, &self.worker_config(i).tiers)?;
        let w = WorkerBuilder::new(self.worker_config(i), self.master_address(), self.secret.clone())
            .protect([self.cfg.security.secret_file.clone(), self.cfg.security.token_file.clone()])
            .tls(self.tls.clone())
            .fragments(self.fragments.clone())
            .start()
            .await?;
        self.workers[i] = Some(w);
        Ok(())
    }

    /// Stop worker `i` (its disk tiers stay for [`LocalCluster::start_worker`]).
    pub async fn stop_worker(&mut self, i: usize) {
        if let Some(w) = self.workers[i].take() {
            w.shutdown().await;
        }
    }

    pub fn worker(&self, i: usize) -> Option<&Worker> {
        self.workers.get(i).and_then(|w| w.as_ref())
    }

    pub fn master(&self) -> &Master {
        // The leader of a group; else the first running.
        self.leader()
            .or_else(|| self.masters.iter().find_map(|s| s.running.as_ref()).map(|r| &r.master))
            .expect("master running")
    }

    pub fn master_address(&self) -> String {
        self.cfg.master_address.clone()
    }

    pub fn web_address(&self) -> String {
        self.cfg.master.web_address.clone()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A client of this cluster (with its client token).
    pub fn client(&self, cfg: ClientConfig) -> Result<Client> {
        Client::with_tls(&self.master_address(), cfg, self.secret.client_token(), self.tls.clone())
    }

    /// The TLS its servers and clients use (`security.tls_*`).
    pub fn tls(&self) -> &Tls {
        &self.tls
    }

    /// The client token of this cluster (what [`LocalCluster::client`] presents).
    pub fn client_token(&self) -> Secret {
        self.secret.client_token()
    }

    /// Where the cluster secret and the client token are.
    pub fn security(&self) -> &SecurityConfig {
        &self.cfg.security
    }

    /// Start the S3 gateway on `cfg.gateway.address` (port 0 picks one). Returns where
    /// it listens.
    pub async fn start_gateway(&mut self) -> Result<SocketAddr> {
        let client = Arc::new(self.client(self.cfg.client.clone())?);
        let gw = locus_s3::GatewayBuilder::new(client, self.cfg.gateway.clone()).build()?;
        let listener = gw.bind().await?;
        let addr = listener.local_addr().map_err(|e| Error::io("gateway address", e))?;
        let (stop, rx) = oneshot::channel();
        let task = tokio::spawn(gw.serve(listener, async move {
            let _ = rx.await;
        }));
        self.gateway = Some(RunningGateway { addr, stop, task });
        Ok(addr)
    }

    /// Where the S3 gateway listens, if it runs.
    pub fn gateway_address(&self) -> Option<SocketAddr> {
        self.gateway.as_ref().map(|g| g.addr)
    }

    /// Stop everything.
    pub async fn shutdown(mut self) {
        if let Some(g) = self.gateway.take() {
            let _ = g.stop.send(());
            let _ = g.task.await;
        }
        for i in 0..self.workers.len() {
            self.stop_worker(i).await;
        }
        self.stop_master().await;
    }
}
