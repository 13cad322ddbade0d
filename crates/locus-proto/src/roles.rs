//! Who may send what: the one table per port of the roles allowed to send each request
//! (README, "Security", and ARCHITECTURE.md, "Roles", say the same in words). A request
//! not in a table is refused. Each port enforces its table in one place: the worker's
//! dispatch ([`data_request`]), the master's RPC interceptor ([`master_rpc`], by the
//! method's name), the raft port's ([`raft_rpc`]) and the web port's middleware ([`WEB`]).

use locus_common::security::Role::{self, Client, Master, Worker};

use crate::pb::data_request::Req;

/// Every role.
const ANY: &[Role] = &[Client, Worker, Master];
/// Namespace and data calls: clients, and workers acting as clients (a SQL fragment's
/// reads, a peer's copy of a block).
const USERS: &[Role] = &[Client, Worker];
const WORKER: &[Role] = &[Worker];
const MASTER: &[Role] = &[Master];

/// The roles that may send `req` on a worker's data path: over TCP, or over the Unix
/// socket when `uds`. `None` when that port does not serve the request at all (the
/// caller answers with its own error for that).
pub fn data_request(req: &Req, uds: bool) -> Option<&'static [Role]> {
    match (req, uds) {
        (Req::Hello(_), _) => Some(ANY),
        // Reads of blocks, and writes of files the master granted (the grant is checked
        // with the request): clients, and workers forwarding a write down its pipeline or
        // reading a peer's copy.
        (Req::Read(_) | Req::Write(_), _) => Some(USERS),
        // Near-data compute and SQL fragments: what a client may read anyway.
        (Req::Compute(_) | Req::Fragment(_), false) => Some(USERS),
        // The master's orders: persist cached blocks to the UFS, copy a block from peers.
        (Req::Persist(_) | Req::Replicate(_), false) => Some(MASTER),
        // Short-circuit leases and writes: co-located callers on the Unix socket.
        (Req::Lease(_) | Req::LeaseEnd(_) | Req::BlockWritten(_), true) => Some(USERS),
        _ => None,
    }
}

/// The roles that may call master RPC `method` (its name, as `GetMount`). Every caller
/// that holds the cluster secret is a worker to the master.
pub fn master_rpc(method: &str) -> &'static [Role] {
    match method {
        // Asked before a caller can prove anything (it proves nothing and grants nothing).
        "Challenge" => ANY,
        "GetStatus"
        | "ListStatus"
        | "CreateDirectory"
        | "Delete"
        | "Rename"
        | "CreateFile"
        | "CompleteFile"
        | "SetObjectMeta"
        | "SetPinned"
        | "Persist"
        | "SetReplication"
        | "Free"
        | "Mount"
        | "Unmount"
        | "GetMountTable"
        | "GetWorkers"
        | "GetReport"
        | "ResolvePersistFailures"
        | "Search"
        | "ImportCatalog"
        | "GetReads"
        | "CheckUfs"
        | "GetMasters" => USERS,
        // A mount's UFS credentials, and speaking for a worker.
        "GetMount" | "RegisterWorker" | "WorkerHeartbeat" | "CommitBlocks" => WORKER,
        // Who the masters are: for the holder of the cluster secret, as the master's role
        // (`locus admin masters` on a master's host).
        "AddMaster" | "RemoveMaster" => MASTER,
        _ => &[],
    }
}

/// The roles that may call raft RPC `method` on a master group's raft port: the masters
/// (the cluster secret, proving the master's role) and no one else.
pub fn raft_rpc(method: &str) -> &'static [Role] {
    match method {
        "Challenge" => ANY,
        "Describe" | "AppendEntries" | "Vote" | "InstallSnapshot" => MASTER,
        _ => &[],
    }
}

/// The roles the web port (status page, `/metrics`, `/api/report`) serves.
pub const WEB: &[Role] = USERS;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn every_master_rpc_has_a_row() {
        // The service's methods, from the generated server: a new RPC without a row would
        // be refused to everyone, and this names it.
        let proto = include_str!("../proto/locus.proto");
        let svc = &proto[proto.find("service Master {").unwrap()..];
        let svc = &svc[..svc.find('}').unwrap()];
        let methods: Vec<&str> =
            svc.lines().filter_map(|l| l.trim().strip_prefix("rpc ")).map(|l| l.split('(').next().unwrap()).collect();
        assert!(methods.len() > 20, "{methods:?}");
        for m in methods {
            assert!(!master_rpc(m).is_empty(), "master RPC {m} has no row in roles::master_rpc");
        }
        assert!(master_rpc("NoSuchCall").is_empty());
        for m in ["GetMount", "RegisterWorker", "WorkerHeartbeat", "CommitBlocks", "AddMaster", "RemoveMaster"] {
            assert!(!master_rpc(m).contains(&Client), "{m}");
        }
        assert_eq!(master_rpc("AddMaster"), MASTER, "a worker adds no master either");
    }

    #[test]
    fn only_masters_speak_raft() {
        let proto = include_str!("../proto/command.proto");
        let svc = &proto[proto.find("service Raft {").unwrap()..];
        let svc = &svc[..svc.find('}').unwrap()];
        let methods: Vec<&str> =
            svc.lines().filter_map(|l| l.trim().strip_prefix("rpc ")).map(|l| l.split('(').next().unwrap()).collect();
        assert_eq!(methods.len(), 5, "{methods:?}");
        for m in methods.into_iter().filter(|m| *m != "Challenge") {
            assert_eq!(raft_rpc(m), MASTER, "{m}");
        }
        assert!(raft_rpc("GetStatus").is_empty(), "the master's calls are not the raft port's");
    }

    #[test]
    fn clients_never_send_the_masters_orders() {
        let persist = Req::Persist(pb::PersistRequest::default());
        let replicate = Req::Replicate(pb::ReplicateRequest::default());
        for r in [&persist, &replicate] {
            assert_eq!(data_request(r, false), Some(MASTER));
            assert_eq!(data_request(r, true), None, "not on the socket");
        }
        assert_eq!(data_request(&Req::Lease(pb::LeaseRequest::default()), false), None);
        assert_eq!(data_request(&Req::Auth(pb::AuthRequest::default()), false), None);
        assert!(data_request(&Req::Hello(pb::Empty {}), true).unwrap().contains(&Master));
    }
}
