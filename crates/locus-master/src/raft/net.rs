//! The network between the members of a master group: the `Raft` gRPC service each
//! member serves on its raft address ([`serve`]), and the side openraft sends through
//! ([`Peers`]).
//!
//! Both ends prove the cluster secret. A caller proves the master's role on every call
//! (`ProvingChannel` to [`Port::Raft`], checked against `locus_proto::roles::raft_rpc`);
//! before its first call on a connection, a sender asks the member to prove itself for
//! a nonce of the sender's, bound to the address dialled ([`Verifier::member_proof`]),
//! so a port that only claims to be a member never receives an entry or a snapshot.

use std::time::Duration;

use locus_common::security::{Role, Verifier};
use locus_common::{Error, Result};
use locus_proto::auth::{Port, ProvingChannel, ServerAuth, method_layer};
use locus_proto::pb::raft_client::RaftClient;
use locus_proto::pb::raft_server::RaftServer;
use locus_proto::pb::{self, raft_append_response::Outcome};
use locus_proto::tls::Tls;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, SnapshotMismatch, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{Raft, SnapshotSegmentId};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::*;

/// A member's id: from its raft address, so every member names every other alike with
/// nothing to agree on first.
pub(crate) fn node_id(raft_address: &str) -> u64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(raft_address.as_bytes());
    u64::from_be_bytes(d[..8].try_into().unwrap_or_default()).max(1)
}

/// Where openraft's messages to the other members go.
pub(crate) struct Peers {
    /// This member's raft address.
    pub(crate) own: String,
    pub(crate) verifier: Verifier,
    pub(crate) tls: Tls,
}

impl RaftNetworkFactory<Locus> for Peers {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &MasterNode) -> Peer {
        Peer {
            own: self.own.clone(),
            target,
            address: node.raft_address.clone(),
            verifier: self.verifier.clone(),
            tls: self.tls.clone(),
            client: None,
        }
    }
}

/// One other member, as openraft sends to it.
pub(crate) struct Peer {
    own: String,
    target: u64,
    address: String,
    verifier: Verifier,
    tls: Tls,
    /// The client once the member proved itself; dropped after any failure, so the next
    /// connection proves itself again.
    client: Option<RaftClient<ProvingChannel>>,
}

type RpcResult<T, E = RaftError<u64>> = std::result::Result<T, RPCError<u64, MasterNode, E>>;

fn unreachable<E: std::error::Error>(e: &dyn std::fmt::Display) -> RPCError<u64, MasterNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
}

fn network<E: std::error::Error>(e: &dyn std::fmt::Display) -> RPCError<u64, MasterNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(e.to_string())))
}

impl Peer {
    /// A client of the member, proven to be the member at its address.
    async fn client<E: std::error::Error>(&mut self) -> RpcResult<RaftClient<ProvingChannel>, E> {
        if cut_off(&self.own, &self.address) {
            return Err(unreachable(&"cut off (fault point raft.cut)"));
        }
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let (c, id, _, _) = describe(&self.address, &self.verifier, &self.tls).await.map_err(|e| unreachable(&e))?;
        if id != self.target {
            return Err(unreachable(&format!("{} is member {id}, not {}", self.address, self.target)));
        }
        self.client = Some(c.clone());
        Ok(c)
    }

    /// A failed call: the next connects and proves itself again.
    fn failed<E: std::error::Error>(&mut self, s: Status) -> RPCError<u64, MasterNode, E> {
        self.client = None;
        if s.code() == tonic::Code::Unavailable { unreachable(&s) } else { network(&s) }
    }
}

/// Fault point `raft.cut` (`return(ADDRESS)`): the member at raft address ADDRESS
/// neither sends to the others nor hears from them, as behind a network partition (the
/// members of one process share the point). Never without the `failpoints` feature.
fn cut_off(from: &str, to: &str) -> bool {
    #[allow(clippy::redundant_closure_call)]
    let cut: Option<String> = (|| {
        locus_common::fail::fail_point!("raft.cut", |a: Option<String>| a);
        None
    })();
    cut.is_some_and(|c| c == from || c == to)
}

/// A client of the member at raft address `address`, once it proved it holds the
/// cluster secret for a nonce of ours and that address; and its id and addresses.
pub(crate) async fn describe(
    address: &str,
    verifier: &Verifier,
    tls: &Tls,
) -> Result<(RaftClient<ProvingChannel>, u64, MasterNode, bool)> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| Error::invalid(format!("bad raft address {address:?}: {e}")))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10));
    let ch = tls.master_channel(address, endpoint);
    let identity = verifier.identity(Role::Master);
    let mut c = RaftClient::new(ProvingChannel::to(Port::Raft, ch, identity)).max_decoding_message_size(64 << 20);
    let nonce: [u8; 32] = rand::random();
    let r = c.describe(pb::RaftDescribeRequest { nonce: nonce.to_vec() }).await;
    let r = r.map_err(|s| Error::unavailable(format!("master group member {address}: {}", s.message())))?.into_inner();
    let node = r.node.unwrap_or_default();
    if !verifier.check_member(address, &nonce, &r.proof) || node.raft_address != address || r.id != node_id(address) {
        tracing::warn!(address, "a raft peer failed to prove it is a member of this cluster");
        return Err(Error::new(
            locus_common::ErrorKind::Unauthenticated,
            format!(
                "{address} did not prove it is a master of this cluster (the same cluster secret, --raft-address {address})"
            ),
        ));
    }
    Ok((c, r.id, MasterNode { raft_address: node.raft_address, rpc_address: node.rpc_address }, r.initialized))
}

fn timed<T>(msg: T, option: &RPCOption) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(option.hard_ttl());
    r
}

impl RaftNetwork<Locus> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Locus>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        let mut c = self.client().await?;
        let req = pb::RaftAppendRequest {
            vote: Some(vote_to_pb(&rpc.vote)),
            prev_log_id: rpc.prev_log_id.as_ref().map(log_id_to_pb),
            entries: rpc.entries.iter().map(entry_to_pb).collect(),
            leader_commit: rpc.leader_commit.as_ref().map(log_id_to_pb),
        };
        let r = c.append_entries(timed(req, &option)).await.map_err(|s| self.failed(s))?.into_inner();
        Ok(match r.outcome {
            Some(Outcome::Success(_)) => AppendEntriesResponse::Success,
            Some(Outcome::Partial(p)) => AppendEntriesResponse::PartialSuccess(p.matching.as_ref().map(log_id_from_pb)),
            Some(Outcome::Conflict(_)) => AppendEntriesResponse::Conflict,
            Some(Outcome::HigherVote(v)) => AppendEntriesResponse::HigherVote(vote_from_pb(&v)),
            None => return Err(network(&"an append-entries answer without an outcome")),
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<Locus>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> {
        let mut c = self.client().await?;
        let (id, offset) = (rpc.meta.snapshot_id.clone(), rpc.offset);
        let req = pb::RaftSnapshotChunk {
            vote: Some(vote_to_pb(&rpc.vote)),
            meta: Some(snapshot_meta_to_pb(&rpc.meta)),
            offset: rpc.offset,
            data: rpc.data,
            done: rpc.done,
        };
        let r = c.install_snapshot(timed(req, &option)).await.map_err(|s| self.failed(s))?.into_inner();
        if let Some(expect) = r.expected_offset {
            let mismatch = SnapshotMismatch {
                expect: SnapshotSegmentId { id: id.clone(), offset: expect },
                got: SnapshotSegmentId { id, offset },
            };
            let e = RaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch));
            return Err(RPCError::RemoteError(RemoteError::new(self.target, e)));
        }
        Ok(InstallSnapshotResponse { vote: r.vote.as_ref().map(vote_from_pb).unwrap_or_default() })
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> RpcResult<VoteResponse<u64>> {
        let mut c = self.client().await?;
        let req = pb::RaftVoteRequest {
            vote: Some(vote_to_pb(&rpc.vote)),
            last_log_id: rpc.last_log_id.as_ref().map(log_id_to_pb),
        };
        let r = c.vote(timed(req, &option)).await.map_err(|s| self.failed(s))?.into_inner();
        Ok(VoteResponse {
            vote: r.vote.as_ref().map(vote_from_pb).unwrap_or_default(),
            vote_granted: r.vote_granted,
            last_log_id: r.last_log_id.as_ref().map(log_id_from_pb),
        })
    }
}

/// The `Raft` service of this member.
struct Service {
    raft: Raft<Locus>,
    id: u64,
    node: MasterNode,
    verifier: Verifier,
}

/// A refusal of openraft's (this member is shutting down, its storage failed): the
/// sender sees a member it cannot reach, and tries again later.
fn refused(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("this master group member cannot take it: {e}"))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for Service {
    async fn challenge(&self, _: Request<pb::Empty>) -> std::result::Result<Response<pb::ChallengeResponse>, Status> {
        Ok(Response::new(locus_proto::auth::challenge(&self.verifier)))
    }

    async fn describe(
        &self,
        r: Request<pb::RaftDescribeRequest>,
    ) -> std::result::Result<Response<pb::RaftDescribeResponse>, Status> {
        let nonce = r.into_inner().nonce;
        if nonce.len() < 16 {
            return Err(Status::invalid_argument("a describe nonce has at least 16 bytes"));
        }
        let proof = self.verifier.member_proof(&self.node.raft_address, &nonce);
        let node =
            pb::RaftNode { raft_address: self.node.raft_address.clone(), rpc_address: self.node.rpc_address.clone() };
        let initialized = self.raft.is_initialized().await.map_err(refused)?;
        Ok(Response::new(pb::RaftDescribeResponse { id: self.id, node: Some(node), proof, initialized }))
    }

    async fn append_entries(
        &self,
        r: Request<pb::RaftAppendRequest>,
    ) -> std::result::Result<Response<pb::RaftAppendResponse>, Status> {
        let r = r.into_inner();
        let entries = r.entries.into_iter().map(entry_from_pb).collect::<Result<Vec<_>>>().map_err(to_status)?;
        let req = AppendEntriesRequest {
            vote: r.vote.as_ref().map(vote_from_pb).unwrap_or_default(),
            prev_log_id: r.prev_log_id.as_ref().map(log_id_from_pb),
            entries,
            leader_commit: r.leader_commit.as_ref().map(log_id_from_pb),
        };
        let outcome = match self.raft.append_entries(req).await.map_err(refused)? {
            AppendEntriesResponse::Success => Outcome::Success(pb::Empty {}),
            AppendEntriesResponse::PartialSuccess(m) => {
                Outcome::Partial(pb::RaftAppendPartial { matching: m.as_ref().map(log_id_to_pb) })
            }
            AppendEntriesResponse::Conflict => Outcome::Conflict(pb::Empty {}),
            AppendEntriesResponse::HigherVote(v) => Outcome::HigherVote(vote_to_pb(&v)),
        };
        Ok(Response::new(pb::RaftAppendResponse { outcome: Some(outcome) }))
    }

    async fn vote(
        &self,
        r: Request<pb::RaftVoteRequest>,
    ) -> std::result::Result<Response<pb::RaftVoteResponse>, Status> {
        let r = r.into_inner();
        let req = VoteRequest {
            vote: r.vote.as_ref().map(vote_from_pb).unwrap_or_default(),
            last_log_id: r.last_log_id.as_ref().map(log_id_from_pb),
        };
        let v = self.raft.vote(req).await.map_err(refused)?;
        Ok(Response::new(pb::RaftVoteResponse {
            vote: Some(vote_to_pb(&v.vote)),
            vote_granted: v.vote_granted,
            last_log_id: v.last_log_id.as_ref().map(log_id_to_pb),
        }))
    }

    async fn install_snapshot(
        &self,
        r: Request<pb::RaftSnapshotChunk>,
    ) -> std::result::Result<Response<pb::RaftSnapshotResponse>, Status> {
        let r = r.into_inner();
        let meta = r.meta.ok_or_else(|| Status::invalid_argument("a snapshot piece without its header"))?;
        let req = InstallSnapshotRequest {
            vote: r.vote.as_ref().map(vote_from_pb).unwrap_or_default(),
            meta: snapshot_meta_from_pb(meta),
            offset: r.offset,
            data: r.data,
            done: r.done,
        };
        match self.raft.install_snapshot(req).await {
            Ok(v) => {
                Ok(Response::new(pb::RaftSnapshotResponse { vote: Some(vote_to_pb(&v.vote)), expected_offset: None }))
            }
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) => {
                Ok(Response::new(pb::RaftSnapshotResponse { vote: None, expected_offset: Some(m.expect.offset) }))
            }
            Err(e) => Err(refused(e)),
        }
    }
}

fn to_status(e: Error) -> Status {
    locus_proto::to_status(e)
}

/// Serves this member's `Raft` service on `listener` until `stop`, with the TLS of the
/// master's RPC port, checking callers with `verifier`: one of its own, so a proof made
/// for this port is taken nowhere else.
pub(crate) async fn serve(
    raft: Raft<Locus>,
    id: u64,
    node: MasterNode,
    verifier: Verifier,
    tls: Tls,
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let auth = ServerAuth::of(Port::Raft, verifier.clone(), tls.serves());
    let (incoming, accept) = crate::service::incoming(listener, tls, "master raft");
    let svc = Service { raft, id, node, verifier };
    let res = tonic::transport::Server::builder()
        .layer(method_layer::<tonic::body::Body>())
        .add_service(InterceptedService::new(RaftServer::new(svc).max_decoding_message_size(64 << 20), auth))
        .serve_with_incoming_shutdown(incoming, stop)
        .await
        .map_err(|e| Error::internal(format!("master raft server: {e}")));
    accept.abort();
    res
}
