//! Authentication and authorization of master RPCs. No credential crosses the wire: a
//! caller first asks the master for a challenge (`Challenge`, the one call that needs
//! none: a nonce the master made and can recognise), then sends on each call its role,
//! the nonce and HMAC(key of its role, nonce) ([`ProvingChannel`]; the header is marked
//! sensitive, so never logged). A listener that is not the master learns a proof for its
//! own nonce only, which the master does not take. The server side ([`ServerAuth`])
//! checks the nonce and the proof, and refuses, and logs, a call whose role may not make
//! it ([`crate::roles::master_rpc`], or [`crate::roles::raft_rpc`] on a raft port, by the
//! method name [`method_layer`] records). The
//! data path's counterpart is [`crate::authenticate`] / [`crate::accept_auth`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use http::HeaderValue;
use locus_common::security::{Identity, RPC_NONCE_TTL, Role, Secret, Verifier, unauthenticated};
use locus_common::{Error, ErrorKind, Result};
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::pb::master_client::MasterClient;
use crate::pb::raft_client::RaftClient;
use crate::tls::ConnInfo;
use crate::{pb, to_status};

const HEADER: &str = "authorization";
/// The scheme of a call's proof: `Locus-Proof <role> <nonce> <proof>` (base64).
const SCHEME: &str = "Locus-Proof ";

/// A port whose calls are proven: where its challenge comes from, and which table of
/// roles its calls are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The master's RPC port ([`crate::roles::master_rpc`]).
    Master,
    /// A master group member's raft port ([`crate::roles::raft_rpc`]).
    Raft,
}

impl Port {
    fn roles(self, method: &str) -> &'static [Role] {
        match self {
            Port::Master => crate::roles::master_rpc(method),
            Port::Raft => crate::roles::raft_rpc(method),
        }
    }
}

/// A channel to the master whose calls carry a proof of the caller's identity for a
/// challenge the master made, fetched when none is held or the one held is half spent.
#[derive(Clone)]
pub struct ProvingChannel {
    inner: Channel,
    port: Port,
    identity: Arc<Identity>,
    session: Arc<parking_lot::Mutex<Option<(HeaderValue, Instant)>>>,
}

impl ProvingChannel {
    pub fn new(inner: Channel, identity: Identity) -> ProvingChannel {
        ProvingChannel::to(Port::Master, inner, identity)
    }

    /// A channel to `port`, whose challenge it asks for.
    pub fn to(port: Port, inner: Channel, identity: Identity) -> ProvingChannel {
        ProvingChannel { inner, port, identity: Arc::new(identity), session: Default::default() }
    }

    /// The header for the next call: the one held, or one for a new challenge.
    async fn header(&self) -> std::result::Result<HeaderValue, Status> {
        if let Some((h, until)) = self.session.lock().clone()
            && Instant::now() < until
        {
            return Ok(h);
        }
        let c = match self.port {
            Port::Master => MasterClient::new(self.inner.clone()).challenge(pb::Empty {}).await?,
            Port::Raft => RaftClient::new(self.inner.clone()).challenge(pb::Empty {}).await?,
        }
        .into_inner();
        let proof = self.identity.prove(&c.nonce);
        let text = format!("{SCHEME}{} {} {}", self.identity.role(), B64.encode(&c.nonce), B64.encode(proof));
        let mut h = HeaderValue::from_str(&text).map_err(|_| Status::internal("an unprintable proof header"))?;
        h.set_sensitive(true);
        // Renewed at half its life: a call never goes out with a proof about to expire.
        let until = Instant::now() + Duration::from_secs(c.valid_secs.max(2) / 2);
        *self.session.lock() = Some((h.clone(), until));
        Ok(h)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Request<tonic::body::Body>> for ProvingChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        tower::Service::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        let this = self.clone();
        // The channel polled ready serves this call (tower's rule); a clone takes its place.
        let mut ready = std::mem::replace(&mut self.inner, this.inner.clone());
        Box::pin(async move {
            // Without a challenge (the master down, or refusing this connection) the call
            // goes out unproven: the master's own answer, or the transport's error, is
            // then what the caller sees, as for any other call.
            if let Ok(h) = this.header().await {
                req.headers_mut().insert(HEADER, h);
            }
            let resp = tower::Service::call(&mut ready, req).await.map_err(Into::<BoxError>::into)?;
            // A proof refused (the master restarted with another configuration, so its
            // challenges changed): the next call asks for a new challenge.
            if resp.headers().get("grpc-status").is_some_and(|v| v == "16") {
                *this.session.lock() = None;
            }
            Ok(resp)
        })
    }
}

/// A master client whose calls prove the caller's identity.
pub type AuthedMasterClient = MasterClient<ProvingChannel>;

/// A master client over `channel` for the holder of `token`: the client token makes a
/// client, the cluster secret a worker ([`master_client_as`] for the master's own role).
pub fn master_client(channel: Channel, token: &Secret) -> Result<AuthedMasterClient> {
    Ok(MasterClient::new(ProvingChannel::new(channel, Identity::client(token))))
}

/// A master client over `channel` proving `identity`.
pub fn master_client_as(channel: Channel, identity: Identity) -> AuthedMasterClient {
    MasterClient::new(ProvingChannel::new(channel, identity))
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
    port: Port,
    /// The master serves TLS: a call over a plain connection is refused.
    tls_only: bool,
}

impl ServerAuth {
    /// Checks calls against `verifier`; with `tls_only`, refuses calls that did not come
    /// over TLS (see [`crate::tls`]).
    pub fn new(verifier: Verifier, tls_only: bool) -> ServerAuth {
        ServerAuth::of(Port::Master, verifier, tls_only)
    }

    /// [`ServerAuth::new`] for the calls of `port`.
    pub fn of(port: Port, verifier: Verifier, tls_only: bool) -> ServerAuth {
        ServerAuth { verifier: Arc::new(verifier), port, tls_only }
    }
}

impl ServerAuth {
    /// The role a call's proof header proves: a nonce this master made, not expired, and
    /// the HMAC of it under the key of the role it names.
    fn proven(&self, header: &str) -> Option<Role> {
        let mut parts = header.strip_prefix(SCHEME)?.split(' ');
        let claimed = parts.next()?;
        let role = Role::ALL.into_iter().find(|r| r.as_str() == claimed)?;
        let nonce = B64.decode(parts.next()?).ok()?;
        let proof = B64.decode(parts.next()?).ok()?;
        (parts.next().is_none() && self.verifier.fresh(&nonce) && self.verifier.check(role, &nonce, &proof))
            .then_some(role)
    }
}

/// The master's answer to `Challenge`.
pub fn challenge(v: &Verifier) -> pb::ChallengeResponse {
    pb::ChallengeResponse { nonce: v.nonce(), valid_secs: RPC_NONCE_TTL.as_secs() }
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
        let method = req.extensions().get::<RpcMethod>().map(|m| m.0.clone()).unwrap_or_default();
        if method == "Challenge" {
            return Ok(req); // what every caller asks first, with nothing to prove yet
        }
        let role = req.metadata().get(HEADER).and_then(|v| v.to_str().ok()).and_then(|v| self.proven(v));
        let Some(role) = role else {
            tracing::warn!(peer = peer(&req), "refused a master RPC: missing or wrong cluster credentials");
            return Err(to_status(unauthenticated("master rpc")));
        };
        if !self.port.roles(&method).contains(&role) {
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
