//! The one Locus client core: metadata from the master, bytes from workers. Reads go
//! short-circuit (a lease over the worker's Unix socket, then pread of the block file)
//! when a worker holding the block shares this host, else over the data path; a read
//! that loses its worker continues from another replica or from the UFS through another
//! worker. All front ends (CLI, S3 gateway, FUSE, Python) use this crate.
//!
//! Depends only on `locus-common` and `locus-proto`; never on the master, worker or UFS
//! crates.

use std::collections::HashMap;
use std::time::Duration;

use locus_common::config::ClientConfig;
use locus_common::security::Secret;
use locus_common::{Error, Result};
use locus_proto::auth::AuthedMasterClient;
use locus_proto::from_status;
use parking_lot::Mutex;

mod master;
mod read;
mod workers;
mod write;

pub use read::{ReadOptions, ReadSink};
use workers::{DataConn, WorkerCache};
pub use write::PutOptions;

/// A connection to a Locus cluster.
pub struct Client {
    cfg: ClientConfig,
    master_address: String,
    master: AuthedMasterClient,
    /// The credential this client presents to the master and to workers.
    token: Secret,
    workers: Mutex<WorkerCache>,
    conns: Mutex<HashMap<String, Vec<DataConn>>>,
}

/// When a master call that failed may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Sending it twice does what sending it once does (reads, pins, persist requests...).
    Idempotent,
    /// Only if it surely never reached the master (creates, deletes, renames, mounts).
    IfNotSent,
}

/// Whether a transport failure happened while connecting, before the request went out.
fn never_sent(s: &tonic::Status) -> bool {
    let mut text = s.message().to_ascii_lowercase();
    let mut src = std::error::Error::source(s);
    while let Some(e) = src {
        text.push_str(&e.to_string().to_ascii_lowercase());
        src = e.source();
    }
    text.contains("connect")
}

fn rpc_err(addr: &str, s: tonic::Status) -> Error {
    if s.code() == tonic::Code::Unavailable && s.metadata().get("x-locus-kind").is_none() {
        return Error::unavailable(format!(
            "cannot reach the master at {addr} (is it running? set --master or LOCUS_MASTER)"
        ));
    }
    let e = from_status(s);
    if e.kind() == locus_common::ErrorKind::Unauthenticated {
        return e.context(format!(
            "the master at {addr} refused this client's token (use the client.token of that cluster: \
             security.token_file or LOCUS_SECURITY__TOKEN_FILE)"
        ));
    }
    e
}

impl Client {
    /// A client of the master at `master_address` (`host:port`), presenting `token` (the
    /// cluster's client token; see `locus_common::security::client_credential`).
    /// Connects lazily.
    pub fn new(master_address: &str, cfg: ClientConfig, token: Secret) -> Result<Client> {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{master_address}"))
            .map_err(|e| Error::invalid(format!("bad master address {master_address:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .timeout(cfg.rpc_timeout)
            .connect_lazy();
        Ok(Client {
            cfg,
            master_address: master_address.to_string(),
            master: locus_proto::auth::master_client(ch, &token)?.max_decoding_message_size(64 << 20),
            token,
            workers: Mutex::new(WorkerCache::default()),
            conns: Mutex::new(HashMap::new()),
        })
    }

    fn m(&self) -> AuthedMasterClient {
        self.master.clone()
    }

    /// One master RPC, sent again with backoff while the master cannot be reached (a
    /// restart), for up to `client.master_retry`; then a clear `Unavailable` error.
    /// `retry` says when a call may be sent again: any idempotent call after any
    /// transport failure; the others only when the connection was never made (so the
    /// master never saw them).
    pub(crate) async fn rpc<Req, T, F, Fut>(&self, retry: Retry, req: Req, f: F) -> Result<T>
    where
        Req: Clone,
        F: Fn(AuthedMasterClient, Req) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(50);
        loop {
            let s = match f(self.m(), req.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            let unreachable = s.metadata().get("x-locus-kind").is_none()
                && matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled);
            let again = unreachable && (retry == Retry::Idempotent || never_sent(&s));
            if !again {
                return Err(self.err(s));
            }
            if started.elapsed() + wait > self.cfg.master_retry {
                return Err(Error::unavailable(format!(
                    "cannot reach the master at {} (tried for {:?}, client.master_retry; is it running? set \
                     --master or LOCUS_MASTER)",
                    self.master_address,
                    started.elapsed()
                )));
            }
            tracing::debug!(status = %s.message(), "master unreachable; trying again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    fn err(&self, s: tonic::Status) -> Error {
        rpc_err(&self.master_address, s)
    }
}
