//! The data-path server: the TCP and Unix-socket accept loops and the dispatch of each
//! connection's requests, once the caller's role may send them (`guard.rs`), to the
//! read, write, persist, replication and compute handlers.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use locus_common::metrics::{ReadReason, ReadSource};
use locus_common::security::Role;
use locus_common::{Error, ErrorKind};
use locus_proto::tls::{DataStream, refuse_plain};
use locus_proto::{accept_auth, pb, read_frame, write_frame};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::watch;

use crate::read::Held;
use crate::{DropOffRuntime, Inner};

pub(crate) async fn serve_tcp(inner: Arc<Inner>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(e) => { tracing::warn!(error = %e, "accept"); continue } },
            _ = stop.changed() => return,
        };
        let inner = inner.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            // A stopping worker drops its connections mid-stream, as a crash would.
            tokio::select! {
                _ = async {
                    // TLS or plain by the first byte; a plain caller of a TLS worker is
                    // told so and refused (`locus_proto::tls`).
                    let Ok(mut s) = inner.tls.accept(sock, peer, "data path").await else { return };
                    if inner.tls.serves() && !s.is_tls() {
                        return refuse_plain(s, peer).await;
                    }
                    let peer = peer.to_string();
                    if let Ok(role) = accept_auth(&mut s, &inner.verifier, &peer).await {
                        serve_conn(inner.clone(), &mut s, role, &peer).await
                    }
                } => {}
                _ = stop.changed() => {}
            }
        });
    }
}

async fn serve_conn(inner: Arc<Inner>, s: &mut DataStream, role: Role, peer: &str) {
    loop {
        let req: pb::DataRequest = match read_frame(s).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => return send_error(s, &e).await,
        };
        if let Some(r) = &req.req
            && let Err(e) = inner.authorize(role, r, false, peer)
        {
            // A refused request ends the connection: nothing of what may follow it
            // (a write's chunks) is read as a request.
            return send_error(s, &e).await;
        }
        let mut hdr = false;
        let res = match req.req {
            Some(pb::data_request::Req::Read(r)) => inner.handle_read(s, r, &mut hdr).await,
            Some(pb::data_request::Req::Write(w)) => inner.handle_write(s, w).await,
            Some(pb::data_request::Req::Persist(p)) => inner.handle_persist(s, p, req.term).await,
            Some(pb::data_request::Req::Replicate(r)) => inner.handle_replicate(s, r, req.term).await,
            Some(pb::data_request::Req::Compute(c)) => inner.handle_compute(s, c).await,
            Some(pb::data_request::Req::Fragment(f)) => inner.handle_fragment(s, f).await,
            Some(pb::data_request::Req::Hello(_)) => write_frame(s, &inner.hello()).await,
            Some(
                pb::data_request::Req::Lease(_)
                | pb::data_request::Req::LeaseEnd(_)
                | pb::data_request::Req::BlockWritten(_),
            ) => Err(Error::invalid("leases and short-circuit writes are over the Unix socket only")),
            Some(pb::data_request::Req::Auth(_)) => Err(Error::invalid("a connection authenticates once, first")),
            None => Err(Error::invalid("empty data request")),
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, "data request failed");
            if hdr {
                // Bytes were already streamed: close, the client sees a short read and retries.
                let _ = s.flush().await;
                return;
            }
            send_error(s, &e).await;
            if e.kind() == ErrorKind::InvalidArgument {
                return;
            }
            continue;
        }
        if s.flush().await.is_err() {
            return;
        }
    }
}

pub(crate) async fn serve_uds(inner: Arc<Inner>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (mut sock, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(e) => { tracing::warn!(error = %e, "uds accept"); continue } },
            _ = stop.changed() => return,
        };
        let inner = inner.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = async {
                    if let Ok(role) = accept_auth(&mut sock, &inner.verifier, "unix socket").await {
                        serve_lease_conn(inner.clone(), &mut sock, role).await
                    }
                } => {}
                _ = stop.changed() => {}
            }
        });
    }
}

async fn serve_lease_conn(inner: Arc<Inner>, sock: &mut UnixStream, role: Role) {
    // What a reply hands out lives as long as the client keeps it: until its next
    // request or until it closes the connection (which also covers a client crash). It
    // is dropped off the runtime: the last lease of a removed block deletes its file.
    let mut held: Option<DropOffRuntime<Held>> = None;
    // The host of the client holding a lease for many reads, counted when it ends.
    let mut lease_host = String::new();
    loop {
        let req: pb::DataRequest = match read_frame(sock).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => return send_error(sock, &e).await,
        };
        drop(held.take());
        if let Some(r) = &req.req
            && let Err(e) = inner.authorize(role, r, true, "unix socket")
        {
            return send_error(sock, &e).await;
        }
        let resp = match req.req {
            Some(pb::data_request::Req::Read(r)) => match inner.follow_read(sock, r).await {
                Ok(h) => {
                    held = Some(DropOffRuntime::new(h));
                    continue;
                }
                Err(e) => pb::DataResponse::error(&e),
            },
            Some(pb::data_request::Req::Lease(l)) => match inner.grant_lease(&l).await {
                Ok((r, lease)) => {
                    held = Some(DropOffRuntime::new(lease));
                    lease_host = l.client_host;
                    r
                }
                Err(e) => pb::DataResponse::error(&e),
            },
            Some(pb::data_request::Req::Hello(_)) => inner.hello(),
            // A write takes the connection over; it is closed after the answer.
            // `worker.uds.write.old`: answer as a worker older than the short-circuit write
            // did (the client's fallback in a rolling upgrade is tested with it).
            Some(pb::data_request::Req::Write(_)) if uds_write_as_old() => {
                pb::DataResponse::error(&Error::invalid("only reads and leases on the Unix socket"))
            }
            Some(pb::data_request::Req::Write(w)) => {
                if let Err(e) = inner.handle_local_write(sock, w).await {
                    send_error(sock, &e).await;
                }
                return;
            }
            Some(pb::data_request::Req::LeaseEnd(e)) => {
                // The reads of a lease held for many (its grant counted none of them).
                inner.counters.short_circuit.fetch_add(e.bytes_read, std::sync::atomic::Ordering::Relaxed);
                inner.counters.count_host(
                    &lease_host,
                    ReadSource::ShortCircuit,
                    ReadReason::ShortCircuit,
                    e.bytes_read,
                );
                return;
            }
            _ => pb::DataResponse::error(&Error::invalid(
                "only reads, leases, short-circuit writes and hello on the Unix socket",
            )),
        };
        if write_frame(sock, &resp).await.is_err() {
            return;
        }
    }
}

/// Fault point `worker.uds.write.old` (see its use); false without the `failpoints` feature.
fn uds_write_as_old() -> bool {
    locus_common::fail::fail_point!("worker.uds.write.old", |_| true);
    false
}

/// Answer a request that failed before its handler could (best effort: the connection
/// is closed or reused by the caller either way).
async fn send_error<S: AsyncWrite + Unpin>(s: &mut S, e: &Error) {
    let _ = write_frame(s, &pb::DataResponse::error(e)).await;
    let _ = s.flush().await;
}

impl Inner {
    /// The answer to a hello: who this worker is.
    fn hello(&self) -> pb::DataResponse {
        pb::DataResponse { worker_id: self.id.load(Relaxed), ..Default::default() }
    }
}
