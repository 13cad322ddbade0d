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

    fn err(&self, s: tonic::Status) -> Error {
        rpc_err(&self.master_address, s)
    }
}
