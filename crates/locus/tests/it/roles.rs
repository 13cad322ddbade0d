//! Roles on the data path, as an attacker holding the client token (or a member's key
//! used for the wrong role) would try them: every request is refused to every role its
//! row in `locus_proto::roles` does not name; a worker takes a write only with the
//! master's grant for that mount, path and version; a read-only mount is read-only at the
//! worker too; UFS paths outside a mount are refused by the worker itself; a worker
//! caches a block only from the origin the master bound to its id; and a worker dials
//! only the members the master registered, never an address a request names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::security::{Identity, Role, Secret, Verifier};
use locus_proto::pb::data_request::Req;
use locus_proto::{authenticate, end_chunks, exchange, pb, read_response, write_chunk};
use tokio::io::AsyncWriteExt;

use crate::common;

/// Every warning logged in this test binary (the clusters run in-process), to check that
/// refusals are logged.
fn logs() -> &'static Arc<capture::Buf> {
    static LOGS: std::sync::OnceLock<Arc<capture::Buf>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(capture::Buf::default());
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_ansi(false)
            .with_writer(move || capture::Writer(w.clone()))
            .try_init();
        buf
    })
}

mod capture {
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    pub struct Buf(pub Mutex<String>);

    pub struct Writer(pub Arc<Buf>);

    impl std::io::Write for Writer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.0.lock().unwrap().push_str(&String::from_utf8_lossy(b));
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

fn secret(c: &LocalCluster) -> Secret {
    Secret::new(&std::fs::read_to_string(&c.security().secret_file).unwrap()).unwrap()
}

/// The identity of each role, as this cluster's members and clients hold them.
fn identity(c: &LocalCluster, role: Role) -> Identity {
    match role {
        Role::Client => Identity::client(&c.client_token()),
        r => Verifier::new(&secret(c)).identity(r),
    }
}

/// Every kind of data request, with contents that would do harm if taken.
fn requests(mount_id: u64) -> Vec<Req> {
    let read = pb::ReadBlockRequest { block_id: 1 << 24, length: 1, block_length: 1, ..Default::default() };
    vec![
        Req::Read(read.clone()),
        Req::Write(pb::WriteFileRequest {
            mount_id,
            ufs_path: "evil.txt".into(),
            write_type: pb::WriteType::Through.into(),
            ..Default::default()
        }),
        Req::Persist(pb::PersistRequest { mount_id, ufs_path: "evil.txt".into(), ..Default::default() }),
        Req::Replicate(pb::ReplicateRequest { block_id: 1 << 24, length: 1, sources: vec!["127.0.0.1:1".into()] }),
        Req::Compute(pb::ComputeBlockRequest { block: Some(read), ..Default::default() }),
        Req::Fragment(pb::SqlFragmentRequest { plan: vec![1, 2, 3], partition: 0 }),
        Req::Lease(pb::LeaseRequest { block_id: 1 << 24, length: 1, ..Default::default() }),
        Req::LeaseEnd(pb::LeaseEnd { bytes_read: 1 }),
        Req::BlockWritten(pb::BlockWritten { length: 1, crc32c: 0, last: true }),
        Req::Hello(pb::Empty {}),
    ]
}

/// Send `req` as `who` over a new TCP connection (or the Unix socket) and return the
/// answer. A master's order goes in the term the worker knows (in a group, an older one
/// is refused before anything else is looked at).
async fn send_as(c: &LocalCluster, who: &Identity, req: Req, uds: bool) -> locus_common::Result<pb::DataResponse> {
    let w = c.worker(0).unwrap();
    let req = pb::DataRequest::order(req, w.master_term());
    if uds {
        let mut s = tokio::net::UnixStream::connect(w.uds_path().unwrap()).await.unwrap();
        authenticate(&mut s, who).await?;
        exchange(&mut s, req).await
    } else {
        let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
        authenticate(&mut s, who).await?;
        exchange(&mut s, req).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_data_request_is_refused_to_every_role_its_row_does_not_name() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let mut refused = 0;
    for uds in [false, true] {
        for req in requests(1) {
            let Some(allowed) = locus_proto::roles::data_request(&req, uds) else { continue };
            for role in Role::ALL.into_iter().filter(|r| !allowed.contains(r)) {
                let e = send_as(&c, &identity(&c, role), req.clone(), uds).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{role} {req:?} uds={uds}: {e}");
                assert!(e.to_string().contains(role.as_str()), "the refusal names the role: {e}");
                let kind = format!("{req:?}").split('(').next().unwrap().to_ascii_lowercase();
                let seen = logs().0.lock().unwrap().lines().any(|l| {
                    l.contains("refused a data-path request")
                        && l.contains(&format!("role={role}"))
                        && l.replace('-', "").contains(&format!("request=\"{kind}\""))
                });
                assert!(seen, "the refusal of {kind} from a {role} is logged");
                refused += 1;
            }
        }
    }
    // What an attacker with the client token wants most: the master's orders.
    for req in [&requests(1)[2], &requests(1)[3]] {
        let e = send_as(&c, &identity(&c, Role::Client), req.clone(), false).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        // A worker's key does not give them either: only the master sends them.
        let e = send_as(&c, &identity(&c, Role::Worker), req.clone(), false).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    }
    assert!(refused >= 12, "{refused} refusals checked");
    // The client token does not prove a member's role.
    let forged = Identity::member(&c.client_token(), Role::Master);
    let e = send_as(&c, &forged, requests(1)[2].clone(), false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    // Nothing reached the UFS, and the worker still serves.
    assert!(!common::ufs_dir(&c).join("evil.txt").exists());
    let r = send_as(&c, &identity(&c, Role::Client), Req::Hello(pb::Empty {}), false).await.unwrap();
    assert_eq!(r.worker_id, c.worker(0).unwrap().id());
    c.shutdown().await;
}

/// A write's request for `target` (a CreateFile answer) with `pipeline`.
fn write_req(target: &pb::FileInfo, wt: pb::WriteType, pipeline: Vec<pb::WorkerAddress>) -> pb::WriteFileRequest {
    pb::WriteFileRequest {
        mount_id: target.mount_id,
        ufs_path: target.ufs_path.clone(),
        write_type: wt.into(),
        version: target.version,
        block_size: target.block_size,
        pipeline,
        pin_epoch: target.pin_epoch,
        grant: target.write_grant.clone(),
        ..Default::default()
    }
}

/// Send a whole write of `data` to worker `i` as `who`.
async fn write_as(
    c: &LocalCluster,
    i: usize,
    who: &Identity,
    req: pb::WriteFileRequest,
    data: &[u8],
) -> locus_common::Result<pb::DataResponse> {
    let mut s = tokio::net::TcpStream::connect(c.worker(i).unwrap().data_address()).await.unwrap();
    authenticate(&mut s, who).await?;
    exchange(&mut s, Req::Write(req)).await?;
    write_chunk(&mut s, data).await.unwrap();
    end_chunks(&mut s).await.unwrap();
    s.flush().await.unwrap();
    read_response(&mut s).await
}

/// A raw master client holding the client token, as any client may.
async fn master_as_client(c: &LocalCluster) -> locus_proto::auth::AuthedMasterClient {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.master_address()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    locus_proto::auth::master_client(ch, &c.client_token()).unwrap()
}

/// CreateFile at the master with the client token, as any client may.
async fn create(c: &LocalCluster, path: &str) -> locus_common::Result<pb::FileInfo> {
    let mut m = master_as_client(c).await;
    let r = pb::CreateFileRequest { path: path.into(), overwrite: true, ..Default::default() };
    m.create_file(r).await.map(|r| r.into_inner()).map_err(locus_proto::from_status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_takes_a_write_only_with_the_masters_grant_for_that_path() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let ufs = common::ufs_dir(&c);
    let client = identity(&c, Role::Client);
    let target = create(&c, "/granted.txt").await.unwrap();
    assert_eq!(target.write_grant.len(), 32, "CreateFile hands out the grant");

    // No grant, a grant for another path, version or mount: refused before any byte lands.
    let mut tries = Vec::new();
    let mut r = write_req(&target, pb::WriteType::Through, vec![]);
    r.grant.clear();
    tries.push(r);
    let mut r = write_req(&target, pb::WriteType::Through, vec![]);
    r.ufs_path = "stolen.txt".into();
    tries.push(r);
    let mut r = write_req(&target, pb::WriteType::Through, vec![]);
    r.version += 1;
    tries.push(r);
    let mut r = write_req(&target, pb::WriteType::Through, vec![]);
    r.mount_id += 1;
    tries.push(r);
    for r in tries {
        let e = write_as(&c, 0, &client, r.clone(), b"attack").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{r:?}: {e}");
        assert!(e.to_string().contains("grant"), "{e}");
    }
    assert!(!ufs.join("stolen.txt").exists());
    assert!(!ufs.join("granted.txt").exists());

    // The grant as given: the write is taken.
    write_as(&c, 0, &client, write_req(&target, pb::WriteType::Through, vec![]), b"mine").await.unwrap();
    assert_eq!(std::fs::read(ufs.join("granted.txt")).unwrap(), b"mine");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_mount_and_the_mount_root_hold_at_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    std::fs::write(lake.join("x.csv"), b"original").unwrap();
    std::fs::write(dir.path().join("outside.txt"), b"outside").unwrap();
    let cl = c.client(Default::default()).unwrap();
    let ro = cl
        .mount(pb::MountRequest {
            path: "/ro".into(),
            uri: format!("file://{}", lake.display()),
            readonly: true,
            ..Default::default()
        })
        .await
        .unwrap();
    // The master hands out no grant on a read-only mount.
    let e = create(&c, "/ro/x.csv").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");

    // Even a grant made with the cluster secret does not get a write into it at the
    // worker: not THROUGH, not a persist sent as the master.
    let v = Verifier::new(&secret(&c));
    let worker = identity(&c, Role::Worker);
    let req = pb::WriteFileRequest {
        mount_id: ro.id,
        ufs_path: "x.csv".into(),
        write_type: pb::WriteType::Through.into(),
        version: 77,
        grant: v.grant(ro.id, "x.csv", 77),
        ..Default::default()
    };
    let e = write_as(&c, 0, &worker, req, b"overwritten").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("read-only"), "{e}");
    let persist = pb::PersistRequest { mount_id: ro.id, ufs_path: "x.csv".into(), ..Default::default() };
    let e = send_as(&c, &identity(&c, Role::Master), Req::Persist(persist), false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert_eq!(std::fs::read(lake.join("x.csv")).unwrap(), b"original");

    // Paths out of a mount's root, granted or not, are refused by the worker itself.
    for bad in ["../outside.txt", "a/../../outside.txt", "/etc/passwd", "", "a//b"] {
        let req = pb::WriteFileRequest {
            mount_id: 1,
            ufs_path: bad.into(),
            write_type: pb::WriteType::Through.into(),
            version: 78,
            grant: v.grant(1, bad, 78),
            ..Default::default()
        };
        let e = write_as(&c, 0, &worker, req, b"escaped").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
        let mut read = pb::ReadBlockRequest {
            block_id: 99 << 24,
            length: 7,
            block_length: 7,
            mount_id: 1,
            ufs_path: bad.into(),
            ..Default::default()
        };
        read.ticket = v.ticket(&read.origin());
        let e = send_as(&c, &identity(&c, Role::Client), Req::Read(read), false).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
    }
    assert_eq!(std::fs::read(dir.path().join("outside.txt")).unwrap(), b"outside");
    c.shutdown().await;
}

/// A listener that counts the connections it gets (an attacker's, waiting for a proof).
async fn trap() -> (String, Arc<AtomicU64>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let n = Arc::new(AtomicU64::new(0));
    let n2 = n.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            n2.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_dials_only_the_members_the_master_registered() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 2, 64 << 20, false).await;
    let client = identity(&c, Role::Client);
    let (w0, w1) = (c.worker(0).unwrap(), c.worker(1).unwrap());
    let (trap_addr, caught) = trap().await;

    // The next hop names a real member but the attacker's address: the worker dials the
    // member where the master registered it, and the copy lands there.
    let target = create(&c, "/piped.bin").await.unwrap();
    let hop = pb::WorkerAddress { worker_id: w1.id(), data_address: trap_addr.clone(), ..Default::default() };
    let data = common::random(1000);
    let r = write_as(&c, 0, &client, write_req(&target, pb::WriteType::MustCache, vec![hop]), &data).await.unwrap();
    assert_eq!(r.replicas, 2, "both members hold the write");
    let block = locus_common::block_id(target.version, 0);
    assert!(w0.store().contains(block) && w1.store().contains(block));

    // A next hop that is no member: refused, and nothing dialed.
    let target = create(&c, "/piped2.bin").await.unwrap();
    let hop = pb::WorkerAddress { worker_id: 9999, data_address: trap_addr, ..Default::default() };
    let e = write_as(&c, 0, &client, write_req(&target, pb::WriteType::MustCache, vec![hop]), &data).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("not a live member"), "{e}");
    // A pipeline that names a member twice, or the worker itself, would have workers
    // dial each other without end: refused before anything is dialed.
    let me = pb::WorkerAddress { worker_id: w0.id(), ..Default::default() };
    let w1a = pb::WorkerAddress { worker_id: w1.id(), ..Default::default() };
    for pipeline in [vec![me], vec![w1a.clone(), w1a]] {
        let target = create(&c, "/loop.bin").await.unwrap();
        let req = write_req(&target, pb::WriteType::MustCache, pipeline);
        let e = write_as(&c, 0, &client, req, &data).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(caught.load(Ordering::SeqCst), 0, "the attacker's listener was never dialed");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cannot_mount_the_clusters_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let cl = c.client(Default::default()).unwrap();
    // A mount of the data dir (the cluster secret, the metadata) or of anything above
    // it would read the secret as a file: refused, and nothing is mounted.
    let data = c.data_dir().to_path_buf();
    for root in [data.clone(), dir.path().to_path_buf(), "/".into(), data.join("master")] {
        let req = pb::MountRequest {
            path: "/steal".into(),
            uri: format!("file://{}", root.display()),
            readonly: true,
            ..Default::default()
        };
        let e = cl.mount(req).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{}: {e}", root.display());
    }
    // An S3 endpoint on a link-local address (an instance metadata service) is no UFS.
    let req = pb::MountRequest {
        path: "/meta".into(),
        uri: "s3://latest".into(),
        options: [("endpoint".to_string(), "http://169.254.169.254".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(cl.mount(req).await.unwrap_err().kind(), ErrorKind::PermissionDenied);
    assert!(cl.status("/steal", false).await.is_err() && cl.status("/meta", false).await.is_err());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cannot_cache_other_bytes_under_a_files_block_id() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let cl = c.client(Default::default()).unwrap();
    let ufs = common::ufs_dir(&c);
    std::fs::write(ufs.join("victim.txt"), b"the victim's own bytes").unwrap();
    std::fs::write(ufs.join("evil.txt"), b"bytes the attacker chose").unwrap();
    let victim = cl.status("/victim.txt", true).await.unwrap();
    let evil = cl.status("/evil.txt", true).await.unwrap();
    let (vb, eb) = (&victim.blocks[0], &evil.blocks[0]);
    assert!(!vb.ticket.is_empty(), "the master signs each block it hands out");
    let load = |fi: &pb::FileInfo, b: &pb::BlockInfo| pb::ReadBlockRequest {
        block_id: b.block_id,
        length: b.length,
        block_length: b.length,
        file_offset: b.offset,
        mount_id: fi.mount_id,
        ufs_path: fi.ufs_path.clone(),
        fingerprint: fi.fingerprint.clone(),
        load_only: true,
        ticket: b.ticket.clone(),
        ..Default::default()
    };
    let honest = load(&victim, vb);
    // The victim's block id with the attacker's file (and its genuine ticket), with no
    // ticket, with a range or fingerprint of the attacker's choosing, or a ticket made
    // with the client token: all refused, as a read and as a near-data scan.
    let forged = [
        pb::ReadBlockRequest { block_id: vb.block_id, ..load(&evil, eb) },
        pb::ReadBlockRequest { ticket: Vec::new(), ..honest.clone() },
        pb::ReadBlockRequest { file_offset: 4, ..honest.clone() },
        pb::ReadBlockRequest { fingerprint: String::new(), ..honest.clone() },
        pb::ReadBlockRequest { ticket: Verifier::new(&c.client_token()).ticket(&honest.origin()), ..honest.clone() },
    ];
    let client = identity(&c, Role::Client);
    for (i, r) in forged.into_iter().enumerate() {
        for req in [
            Req::Read(r.clone()),
            Req::Compute(pb::ComputeBlockRequest { block: Some(r.clone()), ..Default::default() }),
        ] {
            let e = send_as(&c, &client, req, false).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "forgery {i}: {e}");
        }
        let e = send_as(&c, &client, Req::Read(r), true).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "forgery {i} on the Unix socket: {e}");
    }
    assert!(logs().0.lock().unwrap().contains("refused a read whose block origin the master did not sign"));
    let store = c.worker(0).unwrap().store();
    assert!(!store.contains(vb.block_id), "nothing was cached under the victim's block id");
    // The master's ticket fills the block, and readers get the victim's bytes.
    let r = send_as(&c, &client, Req::Read(honest), false).await.unwrap();
    assert!(r.cached, "{r:?}");
    assert!(store.contains(vb.block_id));
    assert_eq!(common::read_all(&cl, "/victim.txt").await, b"the victim's own bytes");
    c.shutdown().await;
}

/// Request `r` sent with request id `id`, as the client sends a change call.
fn with_id<T>(id: &str, r: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(r);
    r.metadata_mut().insert(locus_proto::REQUEST_ID_KEY, id.parse().unwrap());
    r
}

/// A request id is no key to another call's result. A resend of the same request gets
/// the first result; the same id with another path gets its own version and grant (the
/// first call's would let two files share a version); the same id on another kind of
/// call is a call of its own; and an id that is none is refused, saying what it must be.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_id_answers_only_a_resend_of_its_own_request() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let mut m = master_as_client(&c).await;
    let create = |p: &str| pb::CreateFileRequest { path: p.into(), overwrite: true, ..Default::default() };
    let id = locus_proto::new_request_id();
    let a = m.create_file(with_id(&id, create("/a"))).await.unwrap().into_inner();
    let again = m.create_file(with_id(&id, create("/a"))).await.unwrap().into_inner();
    assert_eq!((again.version, &again.write_grant), (a.version, &a.write_grant));
    let b = m.create_file(with_id(&id, create("/b"))).await.unwrap().into_inner();
    assert_ne!(b.version, a.version);
    assert_eq!(b.path, "/b");
    let gone = pb::PathRequest { path: "/nothing".into(), ..Default::default() };
    let e = m.delete(with_id(&id, gone)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let long = "0".repeat(64);
    for bad in ["", "not-an-id", "../../../etc/passwd", &"0".repeat(31), &long, &format!("+{}", "0".repeat(31))] {
        let e = m.create_file(with_id(bad, create("/c"))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(e.message().contains("x-locus-request-id must be 32 hex digits"), "{e:?}");
    }
    let e = locus_client::Client::status(&c.client(Default::default()).unwrap(), "/c", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "a refused call made nothing");
    c.shutdown().await;
}

/// Mount and unmount are answered from the retry cache too: the resend of a mount whose
/// first try committed (its answer lost in a failover) gets that mount, not "already a
/// mount point", and a resent unmount succeeds, not "not a mount point". The same id on
/// another request (a client trying to have another call's answer) is a call of its own,
/// and another call (a new id, or none) is checked as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resent_mount_or_unmount_answers_its_first_result() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    let mut m = master_as_client(&c).await;
    let req = pb::MountRequest { path: "/m".into(), uri: format!("file://{}", lake.display()), ..Default::default() };
    let id = locus_proto::new_request_id();
    let a = m.mount(with_id(&id, req.clone())).await.unwrap().into_inner();
    let again = m.mount(with_id(&id, req.clone())).await.unwrap().into_inner();
    assert_eq!((again.id, &again.path, &again.uri), (a.id, &a.path, &a.uri));
    // The id is no key to another call's result: with another path it mounts that path.
    let b = m.mount(with_id(&id, pb::MountRequest { path: "/m2".into(), ..req.clone() })).await.unwrap().into_inner();
    assert_eq!(b.path, "/m2");
    assert_ne!(b.id, a.id);
    for r in [with_id(&locus_proto::new_request_id(), req.clone()), tonic::Request::new(req)] {
        assert_eq!(m.mount(r).await.unwrap_err().code(), tonic::Code::AlreadyExists);
    }
    let un = pb::PathRequest { path: "/m".into(), ..Default::default() };
    let id = locus_proto::new_request_id();
    m.unmount(with_id(&id, un.clone())).await.unwrap();
    m.unmount(with_id(&id, un.clone())).await.unwrap();
    assert_eq!(m.unmount(tonic::Request::new(un)).await.unwrap_err().code(), tonic::Code::NotFound);
    let cl = c.client(Default::default()).unwrap();
    assert!(cl.mount_table().await.unwrap().iter().any(|x| x.path == "/m2"));
    // The same id on another path unmounts that path, not answering the first call's "done".
    m.unmount(with_id(&id, pb::PathRequest { path: "/m2".into(), ..Default::default() })).await.unwrap();
    let table = cl.mount_table().await.unwrap();
    assert!(table.iter().all(|x| x.path != "/m" && x.path != "/m2"), "{table:?}");
    c.shutdown().await;
}
