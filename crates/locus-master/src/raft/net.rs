//! The network between the members of a master group. A group has one member for now
//! (docs/design/ha-plan.md, stage 3), which never sends: every call says the peer is
//! unreachable. Stage 4 puts tonic's `Raft` service here.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};

use super::{Locus, MasterNode};

/// The network of a group of one.
pub(crate) struct NoPeers;

type RpcResult<T, E = RaftError<u64>> = Result<T, RPCError<u64, MasterNode, E>>;

fn unreachable<E: std::error::Error>() -> RPCError<u64, MasterNode, E> {
    let e = std::io::Error::other("this master group has no other member yet");
    RPCError::Unreachable(Unreachable::new(&e))
}

impl RaftNetworkFactory<Locus> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: u64, _node: &MasterNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<Locus> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<Locus>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<Locus>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> {
        Err(unreachable())
    }

    async fn vote(&mut self, _rpc: VoteRequest<u64>, _option: RPCOption) -> RpcResult<VoteResponse<u64>> {
        Err(unreachable())
    }
}
