//! Metric names and label values, shared by the processes that export them.

/// Bytes delivered to readers, labelled by `source`.
pub const BYTES_READ: &str = "locus_bytes_read_total";
/// Block cache hits and misses, labelled by `result` (`hit`, `miss`).
pub const CACHE_REQUESTS: &str = "locus_cache_requests_total";
/// Blocks evicted from a tier (demotions are counted under the tier they left).
pub const EVICTIONS: &str = "locus_evictions_total";

/// The host name reads are counted under when a worker or the master already keeps as
/// many rows by host as it will (a bound on their memory).
pub const OTHER_HOSTS: &str = "(other hosts)";

/// A client host, where its bytes came from, and why they were not short-circuit: the
/// key reads are counted by host under (workers, the master).
pub type HostKey = (String, ReadSource, ReadReason);

/// Where a read byte came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadSource {
    /// The client read a block file of a worker on its host (short-circuit, under a lease).
    ShortCircuit,
    /// A worker on the client's host served the bytes over the data path.
    LocalWorker,
    /// A worker on another host served the bytes over the data path.
    RemoteWorker,
    /// The bytes were read from the under file system.
    Ufs,
}

impl ReadSource {
    pub const ALL: [ReadSource; 4] =
        [ReadSource::ShortCircuit, ReadSource::LocalWorker, ReadSource::RemoteWorker, ReadSource::Ufs];
    pub fn as_str(self) -> &'static str {
        match self {
            ReadSource::ShortCircuit => "short_circuit",
            ReadSource::LocalWorker => "local_worker",
            ReadSource::RemoteWorker => "remote_worker",
            ReadSource::Ufs => "ufs",
        }
    }
}

impl ReadSource {
    /// As a label in tables (`short-circuit`, `local worker`, ...).
    pub fn label(self) -> &'static str {
        match self {
            ReadSource::ShortCircuit => "short-circuit",
            ReadSource::LocalWorker => "local worker",
            ReadSource::RemoteWorker => "remote worker",
            ReadSource::Ufs => "UFS",
        }
    }
}

/// Why a client's read of a block was not short-circuit. The client decides it (it knows
/// which workers' sockets answer it and where the block is cached) and names it with the
/// read; the worker counts the read under it; `locus doctor --reads` explains each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadReason {
    /// It was short-circuit: the client read a cached block's file itself.
    ShortCircuit,
    /// No worker runs on the client's host (none answers on its socket, none names the host).
    NoLocalWorker,
    /// A worker names the client's host, but its Unix socket does not answer the client
    /// (a container without the worker's directory mounted, another mount namespace, a
    /// permission).
    SocketNotVisible,
    /// The block was in no cache: it came from the UFS.
    NotCached,
    /// The block was cached on another host only.
    CachedElsewhere,
    /// The worker on the client's host holds the block but refused the lease (it was
    /// evicted or moved meanwhile).
    LeaseRefused,
    /// Short-circuit is off in the client's configuration (`client.short_circuit = false`
    /// or `client.locality = "remote"`).
    Disabled,
    /// The client did not say (an older client).
    Unknown,
}

impl ReadReason {
    pub const ALL: [ReadReason; 8] = [
        ReadReason::ShortCircuit,
        ReadReason::NoLocalWorker,
        ReadReason::SocketNotVisible,
        ReadReason::NotCached,
        ReadReason::CachedElsewhere,
        ReadReason::LeaseRefused,
        ReadReason::Disabled,
        ReadReason::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReadReason::ShortCircuit => "short_circuit",
            ReadReason::NoLocalWorker => "no_local_worker",
            ReadReason::SocketNotVisible => "socket_not_visible",
            ReadReason::NotCached => "not_cached",
            ReadReason::CachedElsewhere => "cached_elsewhere",
            ReadReason::LeaseRefused => "lease_refused",
            ReadReason::Disabled => "disabled",
            ReadReason::Unknown => "unknown",
        }
    }

    /// What it means, in plain words.
    pub fn explain(self) -> &'static str {
        match self {
            ReadReason::ShortCircuit => "read short-circuit from a cached block file",
            ReadReason::NoLocalWorker => "no Locus worker runs on the reading host",
            ReadReason::SocketNotVisible => {
                "a worker runs on the reading host, but its short-circuit socket did not answer the reader"
            }
            ReadReason::NotCached => "the block was in no cache and came from the UFS",
            ReadReason::CachedElsewhere => "the block was cached only on another host",
            ReadReason::LeaseRefused => "the worker on the reading host holds the block but refused the lease",
            ReadReason::Disabled => "short-circuit is disabled in the reader's configuration",
            ReadReason::Unknown => "the reader did not say (an older client)",
        }
    }

    /// What to do about it.
    pub fn fix(self) -> &'static str {
        match self {
            ReadReason::ShortCircuit => "nothing",
            ReadReason::NoLocalWorker => {
                "start a worker on that host (`locus worker`), or run the readers (Spark executors) on the worker hosts"
            }
            ReadReason::SocketNotVisible => {
                "make the worker's socket (worker.uds_path, <data-dir>/worker.sock) visible to the reader: mount the worker's data directory into its container, at the same path, and let its user open it"
            }
            ReadReason::NotCached => {
                "expected on a first read; load the data ahead (`locus fs load -R PATH`) or give the tiers room for the working set"
            }
            ReadReason::CachedElsewhere => {
                "schedule readers by the block locations (Spark: keep spark.locality.wait above 0; the locus:// connector names the caching hosts), or load the data on the reading host"
            }
            ReadReason::LeaseRefused => {
                "the block was evicted or moved under the reader: give the worker's tiers more room than the working set (`locus doctor` shows free space)"
            }
            ReadReason::Disabled => "set client.short_circuit = true and client.locality = \"auto\" (the defaults)",
            ReadReason::Unknown => "upgrade the reading client",
        }
    }
}
