//! Authentication of master RPCs: the client side adds the caller's credential to every
//! call (`authorization: Bearer ...`, marked sensitive so it is never logged), the
//! server side checks it and records the caller's [`Role`] in the request, where the
//! services' own calls ([`require_service`]) look for it. The data path's counterpart is
//! [`crate::authenticate`] / [`crate::accept_auth`].

use std::sync::Arc;

use locus_common::security::{Role, Secret, Verifier, unauthenticated};
use locus_common::{Error, ErrorKind, Result};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::pb::master_client::MasterClient;
use crate::tls::ConnInfo;
use crate::to_status;

const HEADER: &str = "authorization";

/// Adds a credential to each outgoing master RPC.
#[derive(Clone)]
pub struct ClientAuth {
    header: MetadataValue<Ascii>,
}

impl ClientAuth {
    pub fn new(token: &Secret) -> Result<ClientAuth> {
        let mut header: MetadataValue<Ascii> = format!("Bearer {}", token.expose())
            .parse()
            .map_err(|_| Error::invalid("a cluster credential must be printable ASCII"))?;
        header.set_sensitive(true);
        Ok(ClientAuth { header })
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        req.metadata_mut().insert(HEADER, self.header.clone());
        Ok(req)
    }
}

/// A master client whose calls carry a credential.
pub type AuthedMasterClient = MasterClient<InterceptedService<Channel, ClientAuth>>;

/// A master client over `channel` presenting `token`.
pub fn master_client(channel: Channel, token: &Secret) -> Result<AuthedMasterClient> {
    Ok(MasterClient::with_interceptor(channel, ClientAuth::new(token)?))
}

/// Checks each incoming master RPC: refuses (and logs) a call without a valid
/// credential, and records the caller's [`Role`] for [`require_service`].
#[derive(Clone)]
pub struct ServerAuth {
    verifier: Arc<Verifier>,
    /// The master serves TLS: a call over a plain connection is refused.
    tls_only: bool,
}

impl ServerAuth {
    /// Checks calls against `verifier`; with `tls_only`, refuses calls that did not come
    /// over TLS (see [`crate::tls`]).
    pub fn new(verifier: Verifier, tls_only: bool) -> ServerAuth {
        ServerAuth { verifier: Arc::new(verifier), tls_only }
    }
}

/// The peer of a call, for logs.
fn peer<T>(req: &Request<T>) -> String {
    req.extensions()
        .get::<ConnInfo>()
        .and_then(|c| c.peer)
        .or_else(|| req.remote_addr())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

impl Interceptor for ServerAuth {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if self.tls_only && !req.extensions().get::<ConnInfo>().is_some_and(|c| c.tls) {
            tracing::warn!(peer = peer(&req), "refused a plain-TCP master RPC: this master serves TLS only");
            return Err(to_status(Error::new(
                ErrorKind::Unauthenticated,
                "this master serves TLS only: set security.tls_ca_file (the CA of its certificate) on the caller",
            )));
        }
        let role = req
            .metadata()
            .get(HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|t| self.verifier.role(t));
        match role {
            Some(r) => {
                req.extensions_mut().insert(r);
                Ok(req)
            }
            None => {
                tracing::warn!(peer = peer(&req), "refused a master RPC: missing or wrong cluster credentials");
                Err(to_status(unauthenticated("master rpc")))
            }
        }
    }
}

/// Only services (master, workers) may make this call: it hands out what clients must
/// never see (a mount's UFS credentials) or speaks for a worker.
#[allow(clippy::result_large_err)]
pub fn require_service<T>(req: &Request<T>, call: &str) -> std::result::Result<(), Status> {
    match req.extensions().get::<Role>() {
        Some(Role::Service) => Ok(()),
        _ => {
            tracing::warn!(peer = peer(req), call, "refused a service-only master RPC from a client");
            Err(to_status(Error::new(
                ErrorKind::PermissionDenied,
                format!("{call} is for the cluster's own services (a client token does not grant it)"),
            )))
        }
    }
}
