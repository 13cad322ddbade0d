//! Authentication and authorization of master RPCs: the client side adds the caller's
//! credential to every call (`authorization: Bearer ...`, marked sensitive so it is
//! never logged; it goes only to the configured master), the server side checks it and
//! refuses, and logs, a call whose role may not make it ([`crate::roles::master_rpc`],
//! by the method name [`method_layer`] records). The data path's counterpart is
//! [`crate::authenticate`] / [`crate::accept_auth`] and the worker's dispatch.

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

/// The name of the master RPC a request calls (`GetMount`), taken from its HTTP path by
/// [`method_layer`] before the credential is checked.
#[derive(Clone, Debug)]
pub struct RpcMethod(pub String);

/// A layer for the master's RPC server that records each request's [`RpcMethod`], so
/// [`ServerAuth`] can check the caller's role against the method's row.
pub fn method_layer<B>() -> tower::util::MapRequestLayer<fn(http::Request<B>) -> http::Request<B>> {
    fn record<B>(mut req: http::Request<B>) -> http::Request<B> {
        let name = req.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        req.extensions_mut().insert(RpcMethod(name));
        req
    }
    tower::util::MapRequestLayer::new(record::<B> as fn(http::Request<B>) -> http::Request<B>)
}

/// Checks each incoming master RPC: refuses (and logs) a call without a valid
/// credential, or from a role the method's row does not name.
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
        let Some(role) = role else {
            tracing::warn!(peer = peer(&req), "refused a master RPC: missing or wrong cluster credentials");
            return Err(to_status(unauthenticated("master rpc")));
        };
        let method = req.extensions().get::<RpcMethod>().map(|m| m.0.clone()).unwrap_or_default();
        if !crate::roles::master_rpc(&method).contains(&role) {
            tracing::warn!(peer = peer(&req), method, %role, "refused a master RPC its caller's role may not make");
            let why = match role {
                Role::Client => " (a client token does not grant it)",
                _ => "",
            };
            return Err(to_status(Error::new(
                ErrorKind::PermissionDenied,
                format!("{method} may not be called by a {role}{why}"),
            )));
        }
        req.extensions_mut().insert(role);
        Ok(req)
    }
}
