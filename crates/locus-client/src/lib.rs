//! The one Locus client core: metadata from the master, bytes from workers. Reads go
//! short-circuit (a lease over the worker's Unix socket, then pread of the block file)
//! when a worker holding the block shares this host, else over the data path; a read
//! that loses its worker continues from another replica or from the UFS through another
//! worker. All front ends (CLI, S3 gateway, FUSE, Python) use this crate.
//!
//! It also runs near-data compute from the caller's side: plans it per block, sends each
//! block's work to the worker that holds it, and merges the partial results.
//!
//! Depends only on `locus-common`, `locus-proto` and `locus-compute` (pure computation);
//! never on the master, worker or UFS crates.

use std::collections::{BTreeMap, HashMap, HashSet};

use locus_common::config::{ClientConfig, Config};
use locus_common::metrics::ReadReason;
use locus_common::security::{Identity, Secret};
use locus_common::{Error, Result};
use locus_proto::auth::AuthedMasterClient;
use locus_proto::from_status;
use parking_lot::Mutex;

mod compute;
mod file;
mod master;
mod read;
mod workers;
mod write;
mod write_local;

pub use compute::{ComputeJob, ComputeOutcome, FragmentPiece};
pub use file::{FileMap, FileReader, FileWriter, MAP_BLOCKS_MAX};
/// TLS of a client's connections (re-exported for the front ends).
pub use locus_proto::tls::Tls;
pub use read::{ReadOptions, ReadSink};
pub use workers::fill_worker;
use workers::{DataConn, WorkerCache};
pub use write::PutOptions;

/// A connection to a Locus cluster.
pub struct Client {
    cfg: ClientConfig,
    /// The masters as given (`host:port`, comma-separated for a group), for messages.
    master_address: String,
    /// A client of each master of the group (one without a group), and which led last.
    masters: locus_proto::masters::Masters,
    /// What it proves to workers: its token, as a client (the master gets the token
    /// itself, as a bearer header).
    identity: Identity,
    /// TLS of its connections to the master and to workers' data paths.
    tls: Tls,
    workers: Mutex<WorkerCache>,
    conns: Mutex<HashMap<String, Vec<DataConn>>>,
    /// This client's block reads and bytes by why they were (or were not) short-circuit.
    reasons: Mutex<BTreeMap<ReadReason, (u64, u64)>>,
    /// Blocks this client asked its host's worker to copy (`client.passive_cache`), so a
    /// block read often from elsewhere is asked for once (bounded: cleared when full).
    passive: Mutex<HashSet<u64>>,
}

/// When a master call that failed may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Sending it twice does what sending it once does (reads, pins, persist requests...).
    Idempotent,
    /// Only if it surely never reached the master (mounts).
    IfNotSent,
    /// A change the master carries out once however often it is sent: each try carries
    /// the same request id ([`locus_proto::REQUEST_ID_KEY`]), and a resend of a change
    /// made is answered with its first result (creates, completes, mkdirs, deletes,
    /// renames). Sent again as an idempotent call is.
    Once,
}

/// A status's message with the errors under it, for deciding what a transport failure
/// was and for telling the user.
fn status_text(s: &tonic::Status) -> String {
    let mut text = s.message().to_string();
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        text.push_str(": ");
        text.push_str(&e.to_string());
        src = e.source();
    }
    text
}

/// Whether a transport failure happened while connecting, before the request went out.
fn never_sent(s: &tonic::Status) -> bool {
    let t = status_text(s).to_ascii_lowercase();
    ["tcp connect error", "error trying to connect", "connection refused"].iter().any(|w| t.contains(w))
}

/// The peer answered bytes that are no HTTP/2 (an HTTP/1 server such as the gateway):
/// h2 itself found the frames malformed, which a master never sends.
fn speaks_no_http2(s: &tonic::Status) -> bool {
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        if let Some(h) = e.downcast_ref::<h2::Error>() {
            return h.is_library()
                && matches!(h.reason(), Some(h2::Reason::FRAME_SIZE_ERROR | h2::Reason::PROTOCOL_ERROR));
        }
        src = e.source();
    }
    false
}

/// A TLS handshake with the master that failed for good (its certificate refused, or a
/// master that serves no TLS): the connector's error, found under the status.
fn tls_failure(s: &tonic::Status) -> Option<Error> {
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        if let Some(le) = e.downcast_ref::<Error>()
            && le.kind() == locus_common::ErrorKind::Unauthenticated
        {
            return Some(Error::new(le.kind(), le.to_string()).set_retryable(false));
        }
        src = e.source();
    }
    None
}

fn rpc_err(addr: &str, s: tonic::Status) -> Error {
    let ours = s.metadata().get("x-locus-kind").is_some();
    if s.code() == tonic::Code::Unavailable && !ours {
        return Error::unavailable(format!(
            "cannot reach the master at {addr} (is it running? set --master or LOCUS_MASTER)"
        ));
    }
    // The connection broke with the call in flight (the master died or restarted): the
    // master is unavailable, and whether the change was made is unknown.
    if !ours && matches!(s.code(), tonic::Code::Unknown | tonic::Code::Cancelled) {
        return Error::unavailable(format!(
            "the master at {addr} went away during the call ({}): it may or may not have been carried out; \
             check once the master is back",
            status_text(&s)
        ));
    }
    let e = from_status(s);
    if e.kind() == locus_common::ErrorKind::Unauthenticated && !e.message().contains("TLS") {
        return e.context(format!(
            "the master at {addr} refused this client's token (use the client.token of that cluster: \
             security.token_file or LOCUS_SECURITY__TOKEN_FILE)"
        ));
    }
    e
}

/// How a library front end (the Hadoop connector, the Python client) finds its cluster:
/// the configuration file if one is named, then the `LOCUS_*` variables, then each of
/// these that is set.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// The master's RPC `host:port`.
    pub master: Option<String>,
    /// A configuration file (TOML).
    pub config_file: Option<String>,
    /// The file holding the cluster's client token (`security.token_file`).
    pub token_file: Option<String>,
    /// The CA certificate of a cluster that serves TLS (`security.tls_ca_file`).
    pub ca_file: Option<String>,
}

impl ConnectOptions {
    /// The configuration these options select.
    pub fn config(&self) -> Result<Config> {
        use figment::providers::Serialized;
        let file = self.config_file.as_deref().filter(|f| !f.is_empty()).map(std::path::Path::new);
        let mut flags = figment::Figment::new();
        for (key, v) in [
            ("master_address", &self.master),
            ("security.token_file", &self.token_file),
            ("security.tls_ca_file", &self.ca_file),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                flags = flags.merge(Serialized::default(key, v));
            }
        }
        Config::load(file, flags)
    }
}

/// The runtime of a library front end (the Hadoop connector, the Python client) whose
/// host calls the client from threads of its own: 2 worker threads named `name`, each
/// call `block_on`'d from the calling thread.
pub fn embedded_runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the client's runtime", e))
}

impl Client {
    /// A client of the configured master, presenting the configured client token (over
    /// TLS when `security.tls_ca_file` is set). Call it inside a Tokio runtime.
    pub fn from_config(cfg: &Config) -> Result<Client> {
        let token = locus_common::security::client_credential(&cfg.security)?;
        let tls = Tls::load(&cfg.security)?;
        Client::with_tls(&cfg.master_address, cfg.client.clone(), token, tls)
    }

    /// The client's configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// A client of the master at `master_address` (`host:port`), presenting `token` (the
    /// cluster's client token; see `locus_common::security::client_credential`).
    /// Connects lazily.
    pub fn new(master_address: &str, cfg: ClientConfig, token: Secret) -> Result<Client> {
        Client::with_tls(master_address, cfg, token, Tls::none())
    }

    /// [`Client::new`] connecting to the master and to workers with `tls` (see
    /// `locus_proto::tls`; plain TCP when it has no CA).
    pub fn with_tls(master_address: &str, cfg: ClientConfig, token: Secret, tls: Tls) -> Result<Client> {
        Client::with_identity(master_address, cfg, Identity::client(&token), tls)
    }

    /// [`Client::with_tls`] proving `identity` to the masters (`locus admin masters`
    /// proves the master's role with the cluster secret). `master_address` lists the
    /// masters of a group comma-separated; calls find the leader among them.
    pub fn with_identity(master_address: &str, cfg: ClientConfig, identity: Identity, tls: Tls) -> Result<Client> {
        let masters =
            locus_proto::masters::Masters::new(master_address, identity.clone(), tls.clone(), cfg.rpc_timeout)?;
        if masters.is_empty() {
            return Err(Error::invalid("no master address: set --master or LOCUS_MASTER (host:port, or a,b,c)"));
        }
        Ok(Client {
            cfg,
            master_address: master_address.to_string(),
            masters,
            identity,
            tls,
            workers: Mutex::new(WorkerCache::default()),
            conns: Mutex::new(HashMap::new()),
            reasons: Mutex::new(BTreeMap::new()),
            passive: Mutex::new(HashSet::new()),
        })
    }

    /// The block reads this client made, and their bytes, by why they were or were not
    /// short-circuit ([`ReadReason::ShortCircuit`] for those that were), since it was
    /// made. The workers count the same by host for the cluster (`locus doctor --reads`).
    pub fn read_reasons(&self) -> BTreeMap<ReadReason, (u64, u64)> {
        self.reasons.lock().clone()
    }

    pub(crate) fn count_read(&self, reason: ReadReason, bytes: u64) {
        let mut m = self.reasons.lock();
        let e = m.entry(reason).or_default();
        e.0 += 1;
        e.1 += bytes;
    }

    /// One master RPC, sent again with backoff while the master cannot be reached (a
    /// restart), for up to `client.master_retry`; then a clear `Unavailable` error.
    /// `retry` says when a call may be sent again: any idempotent call, or one sent with
    /// a request id, after any transport failure; the others only when the connection
    /// was never made (so the master never saw them).
    pub(crate) async fn rpc<Req, T, F, Fut>(&self, retry: Retry, req: Req, f: F) -> Result<T>
    where
        Req: Clone,
        F: Fn(AuthedMasterClient, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let n = self.masters.len();
        let mut pause = locus_proto::masters::Pause::new(n);
        // Connections accepted and then dropped without an answer, in a row: a master
        // restarting refuses connections (or drops the calls in flight once); a port that
        // keeps doing it is not a master.
        let mut dropped = 0;
        // Failed tries in a row: the client waits after each round of the masters.
        let mut failed = 0;
        // A proof refused once is asked for again (a restarted master's challenges differ).
        let mut reproved = false;
        let id = (retry == Retry::Once)
            .then(|| tonic::metadata::MetadataValue::try_from(locus_proto::new_request_id()).ok())
            .flatten();
        loop {
            let mut r = tonic::Request::new(req.clone());
            if let Some(id) = &id {
                r.metadata_mut().insert(locus_proto::REQUEST_ID_KEY, id.clone());
            }
            let (i, addr, m) = self.masters.current();
            let addr = &addr;
            let s = match f(m, r).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            if let Some(leader) = locus_proto::leader_hint(&s) {
                // A member that does not lead: to the leader it names, or the next one. A
                // call it refused was not carried out; one under way as it lost the lead
                // (not retryable) may have been, and goes again only with a request id.
                self.masters.follow(i, &leader);
                let refused = from_status(s.clone()).is_retryable();
                if !refused && retry == Retry::IfNotSent {
                    return Err(self.err(addr, s));
                }
                dropped = 0;
            } else {
                let ours = s.metadata().get("x-locus-kind").is_some();
                if ours && s.code() == tonic::Code::Unauthenticated && !reproved {
                    reproved = true;
                    continue;
                }
                if let Some(e) = tls_failure(&s) {
                    return Err(e.context(format!("master {addr}")));
                }
                // An HTTP server that is no gRPC one (the gateway, the status page): no
                // grpc-status, or a body that is no gRPC message under an HTTP error status.
                let foreign = s.message().contains("grpc-status header missing")
                    || s.message().contains("while receiving response with status")
                    || s.code() == tonic::Code::Unimplemented
                    || speaks_no_http2(&s);
                if !ours && foreign {
                    return Err(self.not_a_master(addr, &s));
                }
                let unreachable = !ours
                    && (matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled)
                        || broken_connection(&s));
                let refused = unreachable && never_sent(&s);
                dropped = if unreachable && !refused { dropped + 1 } else { 0 };
                if dropped >= 3 * n {
                    return Err(self.not_a_master(addr, &s));
                }
                // In a group, a member's own `Unavailable` is often a lead being lost (its log
                // stopped under the call): a call that may go twice tries the next master.
                let losing = n > 1 && ours && s.code() == tonic::Code::Unavailable;
                let again = refused || ((unreachable || losing) && retry != Retry::IfNotSent);
                if !again {
                    return Err(self.err(addr, s));
                }
                self.masters.follow(i, "");
            }
            failed += 1;
            if failed % n != 0 {
                continue;
            }
            let wait = pause.take();
            if started.elapsed() + wait > self.cfg.master_retry {
                let what = if n == 1 { "the master at" } else { "a leading master among" };
                return Err(Error::unavailable(format!(
                    "cannot reach {what} {} ({}; tried for {:.1} s, client.master_retry; is it running? \
                     set --master or LOCUS_MASTER)",
                    self.master_address,
                    status_text(&s),
                    started.elapsed().as_secs_f64()
                )));
            }
            tracing::debug!(status = %s.message(), "no master answered; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// The error for a `--master` that answers, but not as a Locus master.
    fn not_a_master(&self, addr: &str, s: &tonic::Status) -> Error {
        Error::invalid(format!(
            "{addr} is not a Locus master ({}): --master and LOCUS_MASTER take the master's RPC host:port \
             (default 127.0.0.1:19998), not the gateway's, a worker's or the status page's",
            status_text(s)
        ))
    }

    fn err(&self, addr: &str, s: tonic::Status) -> Error {
        rpc_err(addr, s)
    }
}

/// Whether a call failed because its HTTP/2 connection broke under it (a master stopping
/// resets the streams it has not answered): the master may or may not have carried it out.
fn broken_connection(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Internal && s.message().starts_with("h2 protocol error")
}
