//! The master group's replicated log (docs/design/ha-plan.md, stage 3), on openraft 0.9:
//! its type configuration ([`Locus`]), and openraft's records as the protobufs they are
//! kept as (`proto/command.proto`), so that nothing here needs serde.
//!
//! `log.rs` keeps the log in `raft.redb`; `state.rs` applies its entries to the
//! namespace through [`crate::namespace::Namespace::apply`], and makes and installs
//! snapshots of it; `group.rs` runs this master's member and proposes the master's
//! commands; `net.rs` is the network between members. Neither reaches the [`crate::Master`]: what a command leaves to do
//! travels back in its [`Applied`] result, for the leader to carry out.

mod group;
mod log;
mod net;
mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use locus_common::{Error, ErrorKind};
use locus_proto::pb;
use openraft::{AnyError, CommittedLeaderId, EntryPayload, StorageIOError};

pub(crate) use group::{Group, Setup, not_leader};
pub(crate) use state::Applied;

openraft::declare_raft_types!(
    /// The master group's types: an entry carries a batch of namespace commands, and
    /// applying it gives each command's result.
    pub(crate) Locus:
        D = pb::CommandBatch,
        R = Applied,
        NodeId = u64,
        Node = MasterNode,
        SnapshotData = tokio::fs::File,
);

pub(crate) type LogId = openraft::LogId<u64>;
pub(crate) type Vote = openraft::Vote<u64>;
pub(crate) type Membership = openraft::Membership<u64, MasterNode>;
pub(crate) type StoredMembership = openraft::StoredMembership<u64, MasterNode>;
pub(crate) type Entry = openraft::Entry<Locus>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<u64, MasterNode>;
pub(crate) type StorageError = openraft::StorageError<u64>;

/// A member of the master group: where the other members reach it (`--raft-address`),
/// and where clients do (its RPC address, which a follower names to them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MasterNode {
    pub raft_address: String,
    pub rpc_address: String,
}

pub(crate) fn log_id_to_pb(id: &LogId) -> pb::RaftLogId {
    pb::RaftLogId { term: id.leader_id.term, node: id.leader_id.node_id, index: id.index }
}

pub(crate) fn log_id_from_pb(p: &pb::RaftLogId) -> LogId {
    LogId::new(CommittedLeaderId::new(p.term, p.node), p.index)
}

pub(crate) fn vote_to_pb(v: &Vote) -> pb::RaftVote {
    pb::RaftVote { term: v.leader_id.term, node: v.leader_id.node_id, committed: v.committed }
}

pub(crate) fn vote_from_pb(p: &pb::RaftVote) -> Vote {
    if p.committed { Vote::new_committed(p.term, p.node) } else { Vote::new(p.term, p.node) }
}

pub(crate) fn membership_to_pb(m: &Membership) -> pb::RaftMembership {
    pb::RaftMembership {
        configs: m.get_joint_config().iter().map(|s| pb::RaftNodeSet { ids: s.iter().copied().collect() }).collect(),
        nodes: m
            .nodes()
            .map(|(id, n)| {
                let node = pb::RaftNode { raft_address: n.raft_address.clone(), rpc_address: n.rpc_address.clone() };
                (*id, node)
            })
            .collect(),
    }
}

pub(crate) fn membership_from_pb(p: &pb::RaftMembership) -> Membership {
    let configs = p.configs.iter().map(|s| s.ids.iter().copied().collect()).collect();
    let nodes: BTreeMap<u64, MasterNode> = p
        .nodes
        .iter()
        .map(|(id, n)| (*id, MasterNode { raft_address: n.raft_address.clone(), rpc_address: n.rpc_address.clone() }))
        .collect();
    Membership::new(configs, nodes)
}

pub(crate) fn stored_membership_to_pb(m: &StoredMembership) -> pb::RaftStoredMembership {
    pb::RaftStoredMembership {
        log_id: m.log_id().as_ref().map(log_id_to_pb),
        membership: Some(membership_to_pb(m.membership())),
    }
}

pub(crate) fn stored_membership_from_pb(p: &pb::RaftStoredMembership) -> StoredMembership {
    let m = p.membership.as_ref().map(membership_from_pb).unwrap_or_else(|| Membership::new(vec![], ()));
    StoredMembership::new(p.log_id.as_ref().map(log_id_from_pb), m)
}

pub(crate) fn snapshot_meta_to_pb(m: &SnapshotMeta) -> pb::SnapshotHeader {
    pb::SnapshotHeader {
        last_log_id: m.last_log_id.as_ref().map(log_id_to_pb),
        last_membership: Some(stored_membership_to_pb(&m.last_membership)),
        snapshot_id: m.snapshot_id.clone(),
    }
}

pub(crate) fn snapshot_meta_from_pb(h: pb::SnapshotHeader) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: h.last_log_id.as_ref().map(log_id_from_pb),
        last_membership: h.last_membership.as_ref().map(stored_membership_from_pb).unwrap_or_default(),
        snapshot_id: h.snapshot_id,
    }
}

pub(crate) fn entry_to_pb(e: &Entry) -> pb::RaftEntry {
    use pb::raft_entry::Payload;
    let payload = match &e.payload {
        EntryPayload::Blank => Payload::Blank(pb::Empty {}),
        EntryPayload::Normal(b) => Payload::Normal(b.clone()),
        EntryPayload::Membership(m) => Payload::Membership(membership_to_pb(m)),
    };
    pb::RaftEntry { log_id: Some(log_id_to_pb(&e.log_id)), payload: Some(payload) }
}

pub(crate) fn entry_from_pb(p: pb::RaftEntry) -> Result<Entry, Error> {
    use pb::raft_entry::Payload;
    let log_id = p
        .log_id
        .as_ref()
        .map(log_id_from_pb)
        .ok_or_else(|| Error::new(ErrorKind::Corrupt, "a raft log entry without an id"))?;
    let payload = match p.payload {
        None | Some(Payload::Blank(_)) => EntryPayload::Blank,
        Some(Payload::Normal(b)) => EntryPayload::Normal(b),
        Some(Payload::Membership(m)) => EntryPayload::Membership(membership_from_pb(&m)),
    };
    Ok(Entry { log_id, payload })
}

/// A Locus error as openraft's storage error; `io` names what was being done
/// (`StorageIOError::read_logs` and the like).
pub(crate) fn storage_err(io: fn(AnyError) -> StorageIOError<u64>, e: Error) -> StorageError {
    io(AnyError::new(&e)).into()
}
