//! Configuration: plain serde data with documented defaults.
//!
//! Sources override in this order: built-in defaults, then the TOML file
//! (`--config FILE` or `LOCUS_CONFIG`), then `LOCUS_*` environment variables, then
//! command-line flags. Environment keys use `__` between levels, for example
//! `LOCUS_WORKER__DATA_DIR=/srv/locus` or `LOCUS_CLIENT__READ_TYPE=NO_CACHE`.
//! `LOCUS_MASTER` is a shorthand for `master_address`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Default master RPC address. Clients and workers find the master here unless told otherwise.
pub const DEFAULT_MASTER_ADDRESS: &str = "127.0.0.1:19998";
/// Default address of the master's web status page and `/metrics`.
pub const DEFAULT_WEB_ADDRESS: &str = "127.0.0.1:19999";
/// Default worker data-path address (block reads and writes over TCP).
pub const DEFAULT_WORKER_DATA_ADDRESS: &str = "127.0.0.1:29999";
/// Default S3 gateway address (the port Alluxio's S3 proxy uses).
pub const DEFAULT_GATEWAY_ADDRESS: &str = "127.0.0.1:39999";

/// The whole configuration of every Locus role.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Master RPC address used by workers and clients. Default `127.0.0.1:19998`.
    pub master_address: String,
    pub master: MasterConfig,
    pub worker: WorkerConfig,
    pub client: ClientConfig,
    pub gateway: GatewayConfig,
    pub security: SecurityConfig,
    /// Log as JSON lines instead of text. Default `false`.
    pub log_json: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            master_address: DEFAULT_MASTER_ADDRESS.into(),
            master: MasterConfig::default(),
            worker: WorkerConfig::default(),
            client: ClientConfig::default(),
            gateway: GatewayConfig::default(),
            security: SecurityConfig::default(),
            log_json: false,
        }
    }
}

/// Master settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// Address the master's gRPC service binds. Default `127.0.0.1:19998`.
    pub rpc_address: String,
    /// Address of the web status page and Prometheus `/metrics`. Default `127.0.0.1:19999`.
    pub web_address: String,
    /// Directory of the metadata store (redb). Default `./locus-data/master`.
    pub meta_dir: PathBuf,
    /// Block size of new files. Default 64 MiB.
    pub block_size: ByteSize,
    /// A worker whose last heartbeat is older than this is lost. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub worker_timeout: Duration,
    /// Metadata sync interval for mounts that do not set one. Default `60s`. Within it, a
    /// directory's listing and a file's status are served from the namespace, and a path
    /// the UFS said is missing is not asked again; a path never looked up is asked at once.
    /// `0s` asks the UFS every time.
    #[serde(with = "humantime_serde")]
    pub default_sync_interval: Duration,
    /// Time limit of one UFS metadata operation (stat, list, mount check). Default `20s`.
    #[serde(with = "humantime_serde")]
    pub ufs_timeout: Duration,
    /// Size of redb's page cache. Bounds master memory whatever the file count. Default 64 MiB.
    pub meta_cache_size: ByteSize,
    /// Memory of the search index's writer, split over its two threads: what a burst of
    /// changes or an inventory import holds until its next commit (a smaller budget
    /// flushes more, smaller segments). At least 32 MiB. Default 192 MiB.
    pub search_index_memory: ByteSize,
    /// Write type of writes that set none and whose mount sets none (the cluster
    /// default). Default `ASYNC_THROUGH`.
    pub write_type: WriteType,
    /// UFS operations of the persist queue run at once (on unrelated paths). Default 4.
    pub persist_concurrency: usize,
    /// Copies of each block the master keeps of a persisted file (extra copies made by a
    /// durable write are released after the persist). Default 1.
    pub replication_min: u32,
    /// A write not completed this long after it was created is abandoned and its blocks
    /// are dropped. Default `1h`.
    #[serde(with = "humantime_serde")]
    pub abandoned_write_timeout: Duration,
    /// How long a file written ASYNC_THROUGH under a `_temporary` path component (by any
    /// client: the S3 gateway, the Hadoop connector, the CLI) waits before its background
    /// persist starts. Hadoop's and Spark's file output committers stage task output
    /// there and commit it by renames. A rename moves a waiting persist to the new path
    /// (and, out of `_temporary`, ends its wait), and a delete drops it, so committed
    /// output is written to the UFS once, at its final path, and staged output deleted
    /// in time never reaches the UFS. Output left behind is persisted after the wait.
    /// Staged files stay pinned in worker memory meanwhile; writes that find the cache
    /// full of them go through to the UFS. Default `5m`; `0s` persists at once.
    #[serde(with = "humantime_serde")]
    pub staged_persist_wait: Duration,
    /// Where the other masters of a replicated group reach this one (it listens there).
    /// Set, the master's changes go through a replicated log (openraft, `raft.redb` beside
    /// the metadata store) before they apply. Default empty: no log, no group.
    pub raft_address: String,
    /// The raft addresses of the group's founding members, this one among them
    /// (comma-separated on the command line). The one whose address sorts first founds
    /// the group: its metadata store (new, or a single master's being upgraded) becomes
    /// the group's state, and it adds the others, which start empty. Read only while the
    /// group has its founder alone; `locus admin masters add|remove` changes members
    /// after. Default empty: a group of this member alone.
    pub peers: Vec<String>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: DEFAULT_MASTER_ADDRESS.into(),
            web_address: DEFAULT_WEB_ADDRESS.into(),
            meta_dir: PathBuf::from("./locus-data/master"),
            block_size: ByteSize::mib(64),
            worker_timeout: Duration::from_secs(10),
            default_sync_interval: Duration::from_secs(60),
            ufs_timeout: Duration::from_secs(20),
            meta_cache_size: ByteSize::mib(64),
            search_index_memory: ByteSize::mib(192),
            write_type: WriteType::AsyncThrough,
            persist_concurrency: 4,
            replication_min: 1,
            abandoned_write_timeout: Duration::from_secs(3600),
            staged_persist_wait: Duration::from_secs(300),
            raft_address: String::new(),
            peers: Vec::new(),
        }
    }
}

/// Storage tier of a worker directory, fastest first.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum TierAlias {
    /// Memory (a tmpfs directory such as /dev/shm). Config spelling `MEM`.
    Mem,
    /// Solid-state disk. Config spelling `SSD`.
    Ssd,
    /// Hard disk. Config spelling `HDD`.
    Hdd,
}

impl TierAlias {
    pub fn as_str(self) -> &'static str {
        match self {
            TierAlias::Mem => "MEM",
            TierAlias::Ssd => "SSD",
            TierAlias::Hdd => "HDD",
        }
    }
    pub fn parse(s: &str) -> Option<TierAlias> {
        match s.to_ascii_uppercase().as_str() {
            "MEM" => Some(TierAlias::Mem),
            "SSD" => Some(TierAlias::Ssd),
            "HDD" => Some(TierAlias::Hdd),
            _ => None,
        }
    }
}

/// One tier directory with its quota.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub alias: TierAlias,
    /// Directory holding the block files. For MEM this should be on tmpfs (e.g. /dev/shm).
    pub dir: PathBuf,
    /// Bytes of blocks this tier may hold.
    pub quota: ByteSize,
}

/// Worker settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Address of the data path (TCP). Default `127.0.0.1:29999`; port 0 picks one.
    pub data_address: String,
    /// Host name the worker reports. Default: this machine's host name.
    pub host: String,
    /// Directory for the worker's identity file and default SSD tier. Default `./locus-data/worker`.
    pub data_dir: PathBuf,
    /// Unix socket for short-circuit leases. Default `<data_dir>/worker.sock`; empty disables.
    pub uds_path: Option<PathBuf>,
    /// Tiers, fastest first. Default: one MEM tier of 1 GiB under `/dev/shm/locus-<port>`
    /// (chosen at start when the list is empty).
    pub tiers: Vec<TierConfig>,
    /// Eviction starts when a tier is fuller than this fraction of its quota. Default 0.95.
    pub high_watermark: f64,
    /// Eviction frees space down to this fraction of the quota. Default 0.85.
    pub low_watermark: f64,
    /// Interval between heartbeats to the master. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Size of data-path chunks. Default 4 MiB.
    pub chunk_size: ByteSize,
    /// How long the MEM tier keeps the file of a dropped block (evicted, freed, stale) to
    /// write a new block into. Its tmpfs pages are still allocated, so the next fill or
    /// write only copies bytes: no page allocation and zeroing, and on a VM that hands
    /// freed memory back to its host, no host fault. Pooled files count against the
    /// tier's quota (they go first when blocks need the room). `0s` turns the pool off.
    /// Default `30s`.
    #[serde(with = "humantime_serde")]
    pub file_pool_ttl: Duration,
    /// How long the blocks of a file version that was overwritten or deleted stay
    /// readable (by their ids) after the master retires them, so that a read that
    /// resolved the file's blocks before the change (an S3 GET under way, `fs cat`)
    /// finishes the version it started; longer while a reader leases one. They still
    /// count as used, but are the first to go when a write or a fill needs room. `0s`
    /// drops them at once. Default `60s`.
    #[serde(with = "humantime_serde")]
    pub stale_block_grace: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            data_address: DEFAULT_WORKER_DATA_ADDRESS.into(),
            host: default_host(),
            data_dir: PathBuf::from("./locus-data/worker"),
            uds_path: None,
            tiers: Vec::new(),
            high_watermark: 0.95,
            low_watermark: 0.85,
            heartbeat_interval: Duration::from_secs(1),
            chunk_size: ByteSize::mib(4),
            file_pool_ttl: Duration::from_secs(30),
            stale_block_grace: Duration::from_secs(60),
        }
    }
}

/// How a read uses the cache.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReadType {
    /// Cache blocks on the worker that serves them (default).
    #[default]
    Cache,
    /// Like CACHE, and move blocks found on a lower tier up to the top tier.
    CachePromote,
    /// Do not cache what is not cached already.
    NoCache,
}

impl ReadType {
    pub fn parse(s: &str) -> Option<ReadType> {
        match s.to_ascii_uppercase().as_str() {
            "CACHE" => Some(ReadType::Cache),
            "CACHE_PROMOTE" => Some(ReadType::CachePromote),
            "NO_CACHE" => Some(ReadType::NoCache),
            _ => None,
        }
    }
    /// The user-facing spelling (`CACHE`, `CACHE_PROMOTE`, `NO_CACHE`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReadType::Cache => "CACHE",
            ReadType::CachePromote => "CACHE_PROMOTE",
            ReadType::NoCache => "NO_CACHE",
        }
    }
}

/// Where a write's bytes go before it is acknowledged.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WriteType {
    /// Worker memory only; never persisted unless asked (`locus fs persist`). The blocks
    /// are never evicted.
    MustCache,
    /// Worker memory and the UFS; acknowledged once the UFS write completes.
    CacheThrough,
    /// The UFS only.
    Through,
    /// Fast durable writes (default): acknowledged once `client.replication.durable`
    /// workers hold the blocks in memory, then persisted to the UFS in the background.
    /// The blocks are never evicted before their persist is confirmed.
    #[default]
    AsyncThrough,
}

impl WriteType {
    pub fn parse(s: &str) -> Option<WriteType> {
        match s.to_ascii_uppercase().as_str() {
            "MUST_CACHE" => Some(WriteType::MustCache),
            "CACHE_THROUGH" => Some(WriteType::CacheThrough),
            "THROUGH" => Some(WriteType::Through),
            "ASYNC_THROUGH" => Some(WriteType::AsyncThrough),
            _ => None,
        }
    }
    /// Parse, with an error that names the choices.
    pub fn parse_or_err(s: &str) -> Result<WriteType> {
        Self::parse(s).ok_or_else(|| {
            Error::invalid(format!("unknown write type {s:?} (MUST_CACHE, CACHE_THROUGH, THROUGH, ASYNC_THROUGH)"))
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            WriteType::MustCache => "MUST_CACHE",
            WriteType::CacheThrough => "CACHE_THROUGH",
            WriteType::Through => "THROUGH",
            WriteType::AsyncThrough => "ASYNC_THROUGH",
        }
    }
    /// The written blocks go to worker caches.
    pub fn caches(self) -> bool {
        self != WriteType::Through
    }
    /// The UFS write completes before the write is acknowledged.
    pub fn writes_ufs(self) -> bool {
        matches!(self, WriteType::Through | WriteType::CacheThrough)
    }
    /// Worker copies are the only copies until a persist: they are pinned, and the
    /// write waits for `replication.durable` of them.
    pub fn needs_durable_copies(self) -> bool {
        matches!(self, WriteType::MustCache | WriteType::AsyncThrough)
    }
}

/// How writes replicate blocks across workers before they are acknowledged.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationConfig {
    /// Workers that must hold each block in memory before an `ASYNC_THROUGH` or
    /// `MUST_CACHE` write is acknowledged; the copies are made by a pipeline through the
    /// workers. Default 0, meaning min(2, live workers).
    pub durable: u32,
    /// How long a write waits for `durable` live workers. Default `10s`; then it fails
    /// with an error naming both counts (unless `allow_fewer`).
    #[serde(with = "humantime_serde")]
    pub wait: Duration,
    /// After `wait`, go on with the live workers there are instead of failing. Default `false`.
    pub allow_fewer: bool,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig { durable: 0, wait: Duration::from_secs(10), allow_fewer: false }
    }
}

/// Which workers a client treats as co-located.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Locality {
    /// A worker whose Unix socket this client can reach is local (default).
    #[default]
    Auto,
    /// Treat every worker as remote: no short-circuit, no local preference.
    Remote,
}

/// Where a read fills a block that no worker caches.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FillPlacement {
    /// On the worker of the reader's host when there is one (its later reads there are
    /// short-circuit), else the one the block's location names.
    Local,
    /// On the worker the block's location names to schedulers (its fill worker, a round
    /// robin over the live workers, as `getFileBlockLocations` gives it), wherever the
    /// reader is: a task a scheduler ran elsewhere (a schema inference, a task at
    /// locality ANY) does not move the block away from where the scheduler, which keeps
    /// the locations it listed, will send the next tasks.
    Named,
}

/// Client settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Read type of reads that do not set one. Default `CACHE`.
    pub read_type: ReadType,
    /// Read blocks of co-located workers straight from their block files (under a lease). Default `true`.
    pub short_circuit: bool,
    /// Where a read fills a block no worker caches (`local` or `named`). Default: the
    /// front end's, `named` for the Hadoop connector (schedulers place tasks by the
    /// locations it gives), `local` for the rest.
    pub fill: Option<FillPlacement>,
    /// Which workers count as local. Default `auto`.
    pub locality: Locality,
    /// The host name this client reports with its reads, so that they are counted by host
    /// (`locus report --by-host`, `locus doctor --reads`) and a read that is not
    /// short-circuit can tell "no worker here" from "a worker here whose socket is not
    /// visible". Default: this machine's host name. Short-circuit itself never compares
    /// host names: a worker is local when its socket answers.
    pub host: String,
    /// Time limit of one master RPC. Default `30s`.
    #[serde(with = "humantime_serde")]
    pub rpc_timeout: Duration,
    /// How long a call keeps trying a master it cannot reach (a restart) before it fails
    /// as unavailable, with backoff from 50 ms to 1 s. Calls the master may already have
    /// applied (creates, deletes, renames) are sent again only when the connection was
    /// never made. Default `30s`; `0s` fails at once.
    #[serde(with = "humantime_serde")]
    pub master_retry: Duration,
    /// Write type of writes that set none. Default: none, so the mount's or the
    /// cluster's (`master.write_type`) applies.
    pub write_type: Option<WriteType>,
    /// Durable replication of writes (`client.replication.durable`, ...).
    pub replication: ReplicationConfig,
    /// Blocks past the one being read that workers start filling from the UFS in the
    /// background. Default `2`. A reader streams a block still being filled as it
    /// arrives, so more read-ahead only helps when one block's fill cannot keep the UFS
    /// link busy; on a bandwidth-bound link it takes bandwidth from the block being read.
    pub read_ahead_blocks: usize,
    /// Passive caching, as Alluxio's `alluxio.user.file.passive.cache.enabled`: a block
    /// this client reads from a worker on another host, while its own host has a worker,
    /// is also filled into that worker (from the UFS, in the background), so the next
    /// read of it here is short-circuit. Only for persisted files and CACHE reads; a
    /// block is then cached twice. Default `true`.
    pub passive_cache: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            read_type: ReadType::Cache,
            short_circuit: true,
            fill: None,
            locality: Locality::Auto,
            host: default_host(),
            rpc_timeout: Duration::from_secs(30),
            master_retry: Duration::from_secs(30),
            write_type: None,
            replication: ReplicationConfig::default(),
            read_ahead_blocks: 2,
            passive_cache: true,
        }
    }
}

/// S3 gateway settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address the gateway listens on. Default `127.0.0.1:39999`.
    pub address: String,
    /// Access key clients sign requests with. Default `locusadmin` (change it: like
    /// MinIO's `minioadmin`, the default pair is public). Empty disables signed access.
    pub access_key_id: String,
    /// Secret key of `access_key_id`. Default `locusadmin`.
    pub secret_access_key: String,
    /// Allow unsigned requests. Default `false`: every request must carry a valid
    /// AWS Signature V4.
    pub anonymous: bool,
    /// Base domains for virtual-hosted-style requests (`bucket.DOMAIN`). Path-style
    /// requests always work. Default `["localhost"]`.
    pub domains: Vec<String>,
    /// Region reported by GetBucketLocation. Default `us-east-1`.
    pub region: String,
    /// Largest object a single PutObject (or one part) may carry. Default 5 GiB, as S3.
    pub max_object_size: ByteSize,
    /// How long a multipart part written ASYNC_THROUGH waits before its background
    /// persist starts. CompleteMultipartUpload copies the parts into the object and
    /// deletes them, which ends the wait: a part of an upload completed in time never
    /// reaches the UFS (only the object does). Parts of an upload left open are
    /// persisted after it. Default `5m`; `0s` persists parts at once.
    #[serde(with = "humantime_serde")]
    pub part_persist_wait: Duration,
    /// A connection must send each request's head (request line and headers) within
    /// this time of opening, or of going idle after the last answer; else it is closed.
    /// It bounds both a connection that sends no request and a slow head. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A request body that sends nothing for this long fails (408-style: the connection
    /// is closed and the upload aborted). Default `60s`.
    #[serde(with = "humantime_serde")]
    pub body_idle_timeout: Duration,
    /// Connections served at once; further clients wait in the listen backlog until one
    /// closes. Default 1024.
    pub max_connections: usize,
    /// Connections served at once from one client address; one more is answered 503
    /// SlowDown and closed, so one address cannot take the gateway's slots. Default 64.
    pub max_connections_per_client: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            address: DEFAULT_GATEWAY_ADDRESS.into(),
            access_key_id: "locusadmin".into(),
            secret_access_key: "locusadmin".into(),
            anonymous: false,
            domains: vec!["localhost".into()],
            region: "us-east-1".into(),
            max_object_size: ByteSize::gib(5),
            part_persist_wait: Duration::from_secs(300),
            header_read_timeout: Duration::from_secs(5),
            body_idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_client: 64,
        }
    }
}

/// Where the cluster's credentials live (see `locus_common::security`). Every master
/// RPC, worker data-path request and short-circuit lease must present one of them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// The cluster secret, held by the master and the workers (mode 0600). A master
    /// makes it when it is missing; a worker waits for it. Default
    /// `./locus-data/cluster.secret` (`local start`: `<data-dir>/cluster.secret`).
    pub secret_file: PathBuf,
    /// The client token, held by clients (the CLI, the gateway, the Hadoop connector).
    /// The master writes it when it makes the secret; a client that finds no token
    /// file but can read `secret_file` derives it. Default `./locus-data/client.token`
    /// (`local start`: `<data-dir>/client.token`).
    pub token_file: PathBuf,
    /// TLS certificate chain (PEM) the master and workers serve their TCP ports with
    /// (master RPC, worker data path), with `tls_key_file`. Set on a server, it accepts
    /// TLS connections only. Default none: plain TCP (the defaults bind loopback).
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert_file`. Default none.
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) trusted for the servers' certificates. When set, this
    /// process connects to the master and to workers over TLS (clients, and the master
    /// and workers calling each other). Default none: plain TCP.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            secret_file: PathBuf::from("./locus-data/cluster.secret"),
            token_file: PathBuf::from("./locus-data/client.token"),
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
        }
    }
}

fn default_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Top-level names that `LOCUS_*` variables may set.
const ENV_KEYS: &[&str] = &["master_address", "master", "worker", "client", "gateway", "security", "log_json"];

impl Config {
    /// Defaults, then `file` (if any), then `LOCUS_*` environment variables.
    /// Merge flag values on top with [`Figment::merge`] before calling [`Config::extract`].
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut f = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            f = f.merge(Toml::file_exact(file));
        }
        // Only variables naming a configuration section or field are configuration;
        // others that share the prefix (LOCUS_CONFIG, a script's LOCUS_TOOLS_DIR) are not.
        f.merge(Env::prefixed("LOCUS_").filter_map(|k| {
            let k = k.as_str().to_ascii_lowercase();
            if k == "master" {
                return Some("master_address".into());
            }
            let top = k.split("__").next().unwrap_or("");
            ENV_KEYS.contains(&top).then(|| k.replace("__", ".").into())
        }))
    }

    /// Extract a validated configuration.
    pub fn extract(f: &Figment) -> Result<Config> {
        let c: Config = f.extract().map_err(|e| Error::invalid(format!("bad configuration: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Defaults, then `file`, then the environment, then `flags` (a [`Figment`] of the
    /// command line's values; `Figment::new()` for none).
    pub fn load(file: Option<&Path>, flags: Figment) -> Result<Config> {
        if let Some(p) = file
            && !p.exists()
        {
            return Err(Error::not_found(format!("config file {} does not exist", p.display())));
        }
        Self::extract(&Self::figment(file).merge(flags))
    }

    pub fn validate(&self) -> Result<()> {
        let w = &self.worker;
        if !(0.0 < w.low_watermark && w.low_watermark <= w.high_watermark && w.high_watermark <= 1.0) {
            return Err(Error::invalid("worker watermarks must satisfy 0 < low <= high <= 1"));
        }
        if self.master.block_size.as_u64() < 4096 {
            return Err(Error::invalid("master.block_size must be at least 4 KiB"));
        }
        if self.master.search_index_memory < ByteSize::mib(32) {
            return Err(Error::invalid("master.search_index_memory must be at least 32 MiB"));
        }
        let g = &self.gateway;
        if g.access_key_id.is_empty() != g.secret_access_key.is_empty() {
            return Err(Error::invalid("gateway.access_key_id and gateway.secret_access_key are set together"));
        }
        if g.max_connections == 0 || g.max_connections_per_client == 0 {
            return Err(Error::invalid(
                "gateway.max_connections and gateway.max_connections_per_client must be at least 1",
            ));
        }
        if g.header_read_timeout.is_zero() || g.body_idle_timeout.is_zero() {
            return Err(Error::invalid("gateway.header_read_timeout and gateway.body_idle_timeout must be above 0s"));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &w.tiers {
            if !seen.insert(t.alias) {
                return Err(Error::invalid(format!("tier {} configured twice", t.alias.as_str())));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment's Jail hands its closures figment::Error
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
        assert_eq!(Config::default().master.block_size, ByteSize::mib(64));
    }

    /// One fixture that sets every field, so a field missing from the file format fails here.
    #[test]
    fn file_env_and_flags_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("locus.toml");
        std::fs::write(
            &file,
            r#"
master_address = "10.0.0.1:1"
log_json = true
[master]
rpc_address = "0.0.0.0:1"
web_address = "0.0.0.0:2"
meta_dir = "/m"
block_size = "1 MiB"
worker_timeout = "3s"
default_sync_interval = "5m"
ufs_timeout = "7s"
meta_cache_size = "8 MiB"
write_type = "CACHE_THROUGH"
persist_concurrency = 2
replication_min = 2
abandoned_write_timeout = "10m"
staged_persist_wait = "43s"
[worker]
data_address = "0.0.0.0:3"
host = "h1"
data_dir = "/w"
uds_path = "/w/s.sock"
high_watermark = 0.9
low_watermark = 0.5
heartbeat_interval = "2s"
chunk_size = "1 MiB"
file_pool_ttl = "11s"
stale_block_grace = "12s"
[[worker.tiers]]
alias = "MEM"
dir = "/dev/shm/x"
quota = "1 GiB"
[[worker.tiers]]
alias = "SSD"
dir = "/ssd"
quota = "10 GiB"
[client]
read_type = "NO_CACHE"
short_circuit = false
locality = "remote"
rpc_timeout = "9s"
read_ahead_blocks = 3
write_type = "MUST_CACHE"
[client.replication]
durable = 3
wait = "4s"
allow_fewer = true
[gateway]
address = "0.0.0.0:4"
access_key_id = "ak"
secret_access_key = "sk"
anonymous = true
domains = ["s3.example"]
region = "eu-west-1"
max_object_size = "1 GiB"
part_persist_wait = "42s"
"#,
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("LOCUS_MASTER", "10.0.0.2:2");
            jail.set_env("LOCUS_WORKER__HOST", "h2");
            let f = Config::figment(Some(&file)).merge(Serialized::default("client.read_type", "CACHE_PROMOTE"));
            let c = Config::extract(&f).unwrap();
            assert_eq!(c.master_address, "10.0.0.2:2", "env beats file");
            assert_eq!(c.worker.host, "h2");
            assert_eq!(c.client.read_type, ReadType::CachePromote, "flags beat env and file");
            assert!(c.log_json);
            assert_eq!(c.master.block_size, ByteSize::mib(1));
            assert_eq!(c.master.default_sync_interval, Duration::from_secs(300));
            assert_eq!(c.worker.tiers.len(), 2);
            assert_eq!(c.worker.tiers[1].alias, TierAlias::Ssd);
            assert_eq!(c.worker.uds_path.as_deref(), Some(Path::new("/w/s.sock")));
            assert_eq!(c.worker.file_pool_ttl, Duration::from_secs(11));
            assert_eq!(c.worker.stale_block_grace, Duration::from_secs(12));
            assert_eq!(c.client.locality, Locality::Remote);
            assert!(!c.client.short_circuit);
            assert_eq!(c.gateway.domains, vec!["s3.example".to_string()]);
            assert_eq!(c.gateway.max_object_size, ByteSize::gib(1));
            assert_eq!(c.gateway.part_persist_wait, Duration::from_secs(42));
            assert_eq!(c.master.staged_persist_wait, Duration::from_secs(43));
            assert!(c.gateway.anonymous);
            assert_eq!(c.master.write_type, WriteType::CacheThrough);
            assert_eq!(c.master.persist_concurrency, 2);
            assert_eq!(c.master.replication_min, 2);
            assert_eq!(c.master.abandoned_write_timeout, Duration::from_secs(600));
            assert_eq!(c.client.write_type, Some(WriteType::MustCache));
            assert_eq!(c.client.replication.durable, 3);
            assert_eq!(c.client.read_ahead_blocks, 3);
            assert_eq!(c.client.replication.wait, Duration::from_secs(4));
            assert!(c.client.replication.allow_fewer);
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_rejected() {
        let mut c = Config::default();
        c.worker.low_watermark = 0.99;
        assert!(c.validate().is_err());
        figment::Jail::expect_with(|jail| {
            jail.set_env("LOCUS_TOOLS_DIR", "/somewhere");
            assert!(
                Config::load(None, Figment::new()).is_ok(),
                "a LOCUS_ variable that names no section is not config"
            );
            jail.set_env("LOCUS_WORKER__NO_SUCH_FIELD", "1");
            assert!(Config::load(None, Figment::new()).is_err());
            Ok(())
        });
    }
}
