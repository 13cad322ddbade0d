//! The `Master` gRPC service: decodes requests, calls [`Master`], maps errors with
//! `locus_proto::to_status` (the one place for that mapping).

use locus_common::Result;
use locus_proto::auth::{ServerAuth, method_layer};
use locus_proto::pb::{self, master_server::MasterServer};
use locus_proto::tls::DataStream;
use locus_proto::to_status;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::Master;
use crate::calls::{CallId, CallKind};

type R<T> = std::result::Result<Response<T>, Status>;

impl Master {
    /// A handler's answer. A call this master could not carry out because it does not
    /// lead its group (any more) names the leader, for the client to follow.
    fn ok<T>(&self, r: Result<T>) -> R<T> {
        r.map(Response::new).map_err(|e| match self.leader_elsewhere() {
            Some(leader) if e.kind() == locus_common::ErrorKind::Unavailable => {
                locus_proto::not_leader_status(&leader, true)
            }
            _ => to_status(e),
        })
    }
}

/// The calls a member that does not lead its group answers itself: the challenge that
/// comes before any call, and who the group's members are.
const ANY_MEMBER: &[&str] = &["Challenge", "GetMasters"];

/// The workers' calls, which a master elected takes while it takes over: the workers
/// register again, and it serves once they have.
const WORKER_CALLS: &[&str] = &["RegisterWorker", "WorkerHeartbeat", "CommitBlocks"];

/// Whether a worker's call is its copy for a member that may not lead it.
fn mirrored<T>(r: &Request<T>) -> bool {
    r.metadata().contains_key(locus_proto::MIRROR_KEY)
}

/// The master's interceptor: the caller's credential and role ([`ServerAuth`]), then,
/// in a group, whether this master leads it (else the call is refused naming the leader).
#[derive(Clone)]
struct Gate {
    auth: ServerAuth,
    master: Master,
}

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let req = self.auth.call(req)?;
        let method = req.extensions().get::<locus_proto::auth::RpcMethod>().map(|m| m.0.as_str()).unwrap_or_default();
        let worker_call = WORKER_CALLS.contains(&method);
        match self.master.leader_elsewhere() {
            // A worker's mirrored reports are for every member (`Master::register_mirror`).
            Some(_) if worker_call && req.metadata().contains_key(locus_proto::MIRROR_KEY) => Ok(req),
            Some(_) if worker_call && self.master.taking_over() => Ok(req),
            Some(leader) if !ANY_MEMBER.contains(&method) => Err(locus_proto::not_leader_status(&leader, false)),
            _ => Ok(req),
        }
    }
}

/// The id of change call `r` of `kind`, with the request id its client sent
/// ([`crate::calls`]).
fn call_id<T: prost::Message>(r: &Request<T>, kind: CallKind) -> std::result::Result<CallId, Status> {
    let header = r.metadata().get(locus_proto::REQUEST_ID_KEY).map(|v| v.to_str().unwrap_or("?"));
    CallId::parse(kind, header, &r.get_ref().encode_to_vec()).map_err(to_status)
}

/// Runs a change call's handler on a task of its own: a client that gives up (its
/// timeout, a broken connection) does not stop it half-way, its change committed and
/// what the change leaves to do (persists to schedule, blocks to remove) not done. Its
/// resend finds the result in the retry cache once it is made ([`Master::once`]).
async fn detached<T: Send + 'static>(f: impl std::future::Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    tokio::spawn(f).await.map_err(|e| locus_common::Error::internal(format!("a change call's task: {e}")))?
}

/// [`ok`] for a change call with a request id. Fault point
/// `master.after_apply_before_reply` loses the reply of a change made: as a connection
/// broken mid-call (`return`), or with the master killed by SIGKILL (`return(kill)`).
fn reply<T>(m: &Master, r: Result<T>) -> R<T> {
    if r.is_ok() {
        locus_common::fail::fail_point!("master.after_apply_before_reply", |a: Option<String>| {
            if a.as_deref() == Some("kill") {
                // SAFETY: a signal to this process, which it does not survive.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            Err(Status::unknown("the reply was lost (fault point master.after_apply_before_reply)"))
        });
    }
    m.ok(r)
}

/// The connections `listener` accepts, each told apart (TLS or plain) and its handshake
/// done on its own task, so a slow handshake holds up no other connection; and the task
/// accepting them, to abort once the server is done.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: locus_proto::tls::Tls,
    port: &'static str,
) -> (tokio_stream::wrappers::ReceiverStream<std::io::Result<DataStream>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<DataStream>>(64);
    let accept = tokio::spawn(async move {
        loop {
            let (sock, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => { tracing::warn!(error = %e, port, "accept"); continue }
                },
                _ = tx.closed() => return,
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                // No Nagle (`accept` sets it): a reply that spans two segments would
                // otherwise wait out the client's delayed ACK (40 ms per listing page).
                if let Ok(s) = tls.accept(sock, peer, port).await {
                    let _ = tx.send(Ok(s)).await;
                }
            });
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), accept)
}

pub(crate) async fn serve(
    master: Master,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let tls = master.inner.tls.clone();
    // Every call must carry the cluster secret or the client token, come from a role the
    // method's row in `locus_proto::roles` names, and come over TLS when the master serves
    // TLS (`ServerAuth`; `method_layer` tells it the method).
    let auth = ServerAuth::new(master.inner.verifier.clone(), tls.serves());
    let gate = Gate { auth, master: master.clone() };
    let (incoming, accept) = incoming(listener, tls, "master rpc");
    let res = tonic::transport::Server::builder()
        .layer(method_layer::<tonic::body::Body>())
        .add_service(InterceptedService::new(MasterServer::new(master).max_decoding_message_size(16 << 20), gate))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| locus_common::Error::internal(format!("master rpc server: {e}")));
    accept.abort();
    res
}

#[tonic::async_trait]
impl pb::master_server::Master for Master {
    async fn get_status(&self, r: Request<pb::GetStatusRequest>) -> R<pb::FileInfo> {
        let r = r.into_inner();
        self.ok(self.read_barrier().await)?;
        self.ok(Master::get_status(self, &r.path, r.with_blocks).await)
    }
    async fn list_status(&self, r: Request<pb::ListStatusRequest>) -> R<pb::ListStatusResponse> {
        let r = r.into_inner();
        self.ok(self.read_barrier().await)?;
        self.ok(Master::list_status(self, &r.path, &r.start_after, r.inclusive, r.limit)
            .await
            .map(|(entries, truncated)| pb::ListStatusResponse { entries, truncated }))
    }
    async fn create_directory(&self, r: Request<pb::PathRequest>) -> R<pb::Empty> {
        let (id, r, m) = (call_id(&r, CallKind::CreateDirectory)?, r.into_inner(), self.clone());
        reply(
            self,
            detached(async move { m.create_directory(&r.path, r.recursive, &id).await }).await.map(|_| pb::Empty {}),
        )
    }
    async fn delete(&self, r: Request<pb::PathRequest>) -> R<pb::Empty> {
        let (id, r, m) = (call_id(&r, CallKind::Delete)?, r.into_inner(), self.clone());
        reply(self, detached(async move { m.delete(&r.path, r.recursive, &id).await }).await.map(|_| pb::Empty {}))
    }
    async fn rename(&self, r: Request<pb::RenameRequest>) -> R<pb::Empty> {
        let (id, r, m) = (call_id(&r, CallKind::Rename)?, r.into_inner(), self.clone());
        reply(self, detached(async move { m.rename(&r.src, &r.dst, &id).await }).await.map(|_| pb::Empty {}))
    }
    async fn create_file(&self, r: Request<pb::CreateFileRequest>) -> R<pb::FileInfo> {
        let (id, r, m) = (call_id(&r, CallKind::CreateFile)?, r.into_inner(), self.clone());
        let wt = r.write_type().typed();
        reply(self, detached(async move { m.create_file(&r.path, r.overwrite, wt, r.complete_empty, &id).await }).await)
    }
    async fn complete_file(&self, r: Request<pb::CompleteFileRequest>) -> R<pb::FileInfo> {
        let (id, r, m) = (call_id(&r, CallKind::CompleteFile)?, r.into_inner(), self.clone());
        reply(self, detached(async move { m.complete_file(r, &id).await }).await)
    }
    async fn set_object_meta(&self, r: Request<pb::SetObjectMetaRequest>) -> R<pb::FileInfo> {
        let r = r.into_inner();
        self.ok(Master::set_object_meta(self, &r.path, r.meta.unwrap_or_default(), r.tags_only).await)
    }
    async fn set_pinned(&self, r: Request<pb::SetPinnedRequest>) -> R<pb::CountResponse> {
        let r = r.into_inner();
        self.ok(Master::set_pinned(self, &r.path, r.pinned, r.recursive)
            .await
            .map(|count| pb::CountResponse { count, ..Default::default() }))
    }
    async fn persist(&self, r: Request<pb::PathRequest>) -> R<pb::FileInfo> {
        self.ok(Master::persist(self, &r.into_inner().path).await)
    }
    async fn set_replication(&self, r: Request<pb::SetReplicationRequest>) -> R<pb::CountResponse> {
        let r = r.into_inner();
        self.ok(Master::set_replication(self, &r.path, r.min, r.max, r.recursive)
            .await
            .map(|count| pb::CountResponse { count, ..Default::default() }))
    }
    async fn free(&self, r: Request<pb::PathRequest>) -> R<pb::CountResponse> {
        let r = r.into_inner();
        self.ok(Master::free(self, &r.path, r.recursive)
            .await
            .map(|(count, skipped)| pb::CountResponse { count, skipped }))
    }
    async fn mount(&self, r: Request<pb::MountRequest>) -> R<pb::MountInfo> {
        let (id, r, m) = (call_id(&r, CallKind::Mount)?, r.into_inner(), self.clone());
        reply(self, detached(async move { m.mount_call(r, &id).await }).await)
    }
    async fn unmount(&self, r: Request<pb::PathRequest>) -> R<pb::Empty> {
        let (id, r, m) = (call_id(&r, CallKind::Unmount)?, r.into_inner(), self.clone());
        reply(self, detached(async move { m.unmount_call(&r.path, &id).await }).await.map(|_| pb::Empty {}))
    }
    async fn get_mount_table(&self, _: Request<pb::Empty>) -> R<pb::MountTable> {
        self.ok(Ok(pb::MountTable { mounts: self.mount_table(false) }))
    }
    async fn get_mount(&self, r: Request<pb::GetMountRequest>) -> R<pb::MountInfo> {
        // With the UFS credentials: for workers only (`locus_proto::roles`).
        self.ok(Master::get_mount(self, r.into_inner().mount_id))
    }
    async fn challenge(&self, _: Request<pb::Empty>) -> R<pb::ChallengeResponse> {
        Ok(Response::new(locus_proto::auth::challenge(&self.inner.verifier)))
    }

    async fn get_workers(&self, _: Request<pb::Empty>) -> R<pb::WorkerList> {
        self.ok(Ok(pb::WorkerList { workers: self.workers() }))
    }
    async fn get_report(&self, _: Request<pb::Empty>) -> R<pb::Report> {
        self.ok(Ok(self.report()))
    }
    async fn register_worker(&self, r: Request<pb::RegisterWorkerRequest>) -> R<pb::RegisterWorkerResponse> {
        let registered = if mirrored(&r) {
            self.register_mirror(r.into_inner()).await
        } else {
            Master::register_worker(self, r.into_inner()).await
        };
        self.ok(registered.map(|worker_id| pb::RegisterWorkerResponse {
            worker_id,
            cluster_id: self.cluster_id(),
            term: self.term(),
        }))
    }
    async fn worker_heartbeat(&self, r: Request<pb::HeartbeatRequest>) -> R<pb::HeartbeatResponse> {
        let mirror = mirrored(&r);
        self.ok(self.heartbeat(r.into_inner(), mirror))
    }
    async fn commit_blocks(&self, r: Request<pb::CommitBlocksRequest>) -> R<pb::Empty> {
        let mirror = mirrored(&r);
        self.ok(Master::commit_blocks(self, r.into_inner(), mirror).await.map(|_| pb::Empty {}))
    }
    async fn resolve_persist_failures(&self, r: Request<pb::PersistFailuresRequest>) -> R<pb::CountResponse> {
        let r = r.into_inner();
        self.ok(Master::resolve_persist_failures(self, &r.path, r.action())
            .await
            .map(|count| pb::CountResponse { count, ..Default::default() }))
    }
    async fn search(&self, r: Request<pb::SearchRequest>) -> R<pb::SearchResponse> {
        self.ok(self.read_barrier().await)?;
        self.ok(Master::search(self, r.into_inner()).await)
    }
    async fn import_catalog(&self, r: Request<pb::ImportCatalogRequest>) -> R<pb::CountResponse> {
        self.ok(Master::import_catalog(self, r.into_inner()).await)
    }
    async fn get_reads(&self, r: Request<pb::ReadsRequest>) -> R<pb::ReadsResponse> {
        self.ok(Ok(self.reads(r.get_ref())))
    }
    async fn get_masters(&self, _: Request<pb::Empty>) -> R<pb::MasterGroupStatus> {
        self.ok(self.masters())
    }
    async fn add_master(&self, r: Request<pb::MasterAddressRequest>) -> R<pb::MasterGroupStatus> {
        self.ok(Master::add_master(self, &r.into_inner().raft_address).await)
    }
    async fn remove_master(&self, r: Request<pb::MasterAddressRequest>) -> R<pb::MasterGroupStatus> {
        self.ok(Master::remove_master(self, &r.into_inner().raft_address).await)
    }
    async fn check_ufs(&self, _: Request<pb::Empty>) -> R<pb::UfsCheckResponse> {
        self.ok(Ok(Master::check_ufs(self).await))
    }
}
