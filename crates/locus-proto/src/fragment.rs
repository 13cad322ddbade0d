//! The hook through which a worker runs SQL plan fragments (`pb::SqlFragmentRequest`).
//! It lives here, below both sides: `locus-sql` implements it and the worker calls it,
//! so neither links the other (the gateway's S3 Select links `locus-sql`, not the worker).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use locus_common::Result;
use locus_common::security::Secret;

use crate::tls::Tls;

/// Runs SQL plan fragments sent to a worker.
pub trait FragmentRunner: Send + Sync + 'static {
    /// Start partition `partition` of the encoded plan `plan`: its result as pieces of an
    /// Arrow IPC stream, and the count of bytes its scans read (final once the stream
    /// ends). Dropping the stream stops the work.
    fn run(&self, plan: &[u8], partition: u32) -> Result<(FragmentStream, Arc<AtomicU64>)>;
}

/// A fragment's result: pieces of an Arrow IPC stream.
pub type FragmentStream = futures::stream::BoxStream<'static, Result<Vec<u8>>>;

/// Makes a worker's [`FragmentRunner`] from the master's address, the cluster secret
/// (its reads of Locus files present the client token derived from it) and TLS.
pub type FragmentFactory = Arc<dyn Fn(&str, &Secret, &Tls) -> Result<Arc<dyn FragmentRunner>> + Send + Sync>;
