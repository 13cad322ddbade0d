//! The benchmarks behind `locus bench`: each starts its own [`LocalCluster`] in this
//! process and prints its figures side by side, measured in one run: `read` (one large
//! file through every read path), `gateway` (the S3 gateway against MinIO), `meta`
//! (master metadata throughput) and `mixed` (small-read latency while writes force
//! eviction across tiers). This module holds what they share: the MinIO they compare
//! with, a cluster config on free ports, the scratch directory, statistics and the
//! machine facts printed with the results.
//!
//! Kept apart from the shipped libraries (as foyer keeps foyer-bench): nothing but the
//! `locus` binary may depend on it, and it must not depend on the CLI (`locus`).

pub mod compute;
pub mod gateway;
pub mod meta;
pub mod mixed;
pub mod read;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use locus_cluster::LocalCluster;
use locus_common::config::Config;
use locus_common::{Error, Result};
use locus_ufs::Ufs;

/// The MinIO a benchmark reads from or compares with (its bucket must exist).
#[derive(Clone, Debug, clap::Args)]
pub struct MinioTarget {
    /// MinIO endpoint.
    #[arg(long, default_value = "http://127.0.0.1:9000")]
    pub endpoint: String,
    /// Bucket for the test data (must exist).
    #[arg(long, default_value = "bench")]
    pub bucket: String,
    #[arg(long, default_value = "minioadmin")]
    pub access_key: String,
    #[arg(long, default_value = "minioadmin")]
    pub secret_key: String,
    /// How MinIO is reached, printed with the results (`bench/read --profile` sets it).
    #[arg(long, default_value = "MinIO on loopback (no shaping)")]
    pub network: String,
}

impl MinioTarget {
    /// The options of an `s3://` mount (or UFS) of this MinIO.
    pub fn mount_options(&self) -> BTreeMap<String, String> {
        s3_options(&self.endpoint, &self.access_key, &self.secret_key)
    }
}

fn s3_options(endpoint: &str, key: &str, secret: &str) -> BTreeMap<String, String> {
    [
        ("endpoint".to_string(), endpoint.to_string()),
        ("access_key_id".to_string(), key.to_string()),
        ("secret_access_key".to_string(), secret.to_string()),
    ]
    .into()
}

/// An S3 client (OpenDAL, through [`Ufs`]) of `bucket` at `endpoint`.
fn s3_client(endpoint: &str, bucket: &str, key: &str, secret: &str, timeout: Duration) -> Result<Ufs> {
    Ufs::new(&format!("s3://{bucket}"), &s3_options(endpoint, key, secret), timeout)
}

/// A cluster config whose master, worker and gateway all listen on free loopback ports.
pub fn loopback_config() -> Config {
    let mut cfg = Config::default();
    cfg.master.rpc_address = "127.0.0.1:0".into();
    cfg.master.web_address = "127.0.0.1:0".into();
    cfg.worker.data_address = "127.0.0.1:0".into();
    cfg.gateway.address = "127.0.0.1:0".into();
    cfg
}

/// A benchmark's scratch directory (its cluster's data dir), made fresh for this process.
pub fn scratch_dir() -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("locus-bench-{}", std::process::id()));
    std::fs::create_dir_all(&p).map_err(|e| Error::io(format!("create {}", p.display()), e))?;
    Ok(p)
}

/// Remove a benchmark's scratch directory and the tmpfs MEM tier of its cluster.
pub fn remove_scratch(work: &Path) {
    // A few tries: a thread of the benchmark may still be adding files (the search
    // index's merges run on after `locus bench index-floor`'s last commit), and a file
    // made between `remove_dir_all`'s listing and its removal of the directory leaves the
    // directory behind.
    for _ in 0..10 {
        if std::fs::remove_dir_all(work).is_ok() || !work.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(locus_cluster::default_mem_dir(work));
}

/// The median of `v` (not empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

/// The `p` quantile (0..=1) of `v` (not empty), nearest rank.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() as f64 - 1.0) * p).round() as usize]
}

/// "Machine: N cores, kernel K.", printed with every result.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("Machine: {cores} cores, kernel {}.", kernel.trim())
}

/// Start a one-worker cluster on `cfg` over `work`, run `f` on it, and stop it whatever
/// `f` returns.
async fn with_cluster<T>(
    cfg: Config,
    work: &Path,
    gateway: bool,
    f: impl AsyncFnOnce(&LocalCluster) -> Result<T>,
) -> Result<T> {
    let mut cluster = LocalCluster::start(cfg, work, 1, None).await?;
    let started = if gateway { cluster.start_gateway().await.map(|_| ()) } else { Ok(()) };
    let res = match started {
        Ok(()) => f(&cluster).await,
        Err(e) => Err(e),
    };
    cluster.shutdown().await;
    res
}

/// The clients' own runtime, as a client process would have: sharing the cluster's
/// runtime threads, a read could be scheduled on the thread the worker's send of the same
/// stream needs. Shut down without blocking when the benchmark ends (a runtime must not
/// be dropped inside another).
struct ClientRuntime(Option<tokio::runtime::Runtime>);

impl ClientRuntime {
    fn new(threads: usize) -> Result<ClientRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("bench-client")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the client runtime", e))?;
        Ok(ClientRuntime(Some(rt)))
    }

    fn get(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("runtime")
    }
}

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
