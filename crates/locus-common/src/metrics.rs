//! Metric names and label values, shared by the processes that export them.

/// Bytes delivered to readers, labelled by `source`.
pub const BYTES_READ: &str = "locus_bytes_read_total";
/// Block cache hits and misses, labelled by `result` (`hit`, `miss`).
pub const CACHE_REQUESTS: &str = "locus_cache_requests_total";
/// Blocks evicted from a tier (demotions are counted under the tier they left).
pub const EVICTIONS: &str = "locus_evictions_total";

/// Where a read byte came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
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
