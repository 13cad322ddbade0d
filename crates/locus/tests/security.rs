//! An authenticated cluster: every port refuses callers without the cluster's
//! credentials, a client token never grants the services' calls (UFS credentials,
//! worker registration), and the files holding secrets and data are this user's only.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use locus_client::{Client, PutOptions};
use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, WriteType};
use locus_common::security::Secret;
use locus_proto::pb;
use locus_proto::pb::master_client::MasterClient;

mod common;

async fn start(dir: &Path) -> LocalCluster {
    common::start(dir, 1, 64 << 20, false).await
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_master_refuses_calls_without_valid_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let good = c.client(ClientConfig::default()).unwrap();
    assert!(good.status("/", false).await.unwrap().is_dir);

    // Another cluster's token, and no token at all, are refused.
    let wrong = Client::new(&c.master_address(), ClientConfig::default(), Secret::generate()).unwrap();
    let e = wrong.status("/", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("token"), "the error says what to fix: {e}");
    let mut bare = MasterClient::new(channel(&c.master_address()).await);
    let s = bare.get_workers(pb::Empty {}).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);
    let s = bare.get_mount(pb::GetMountRequest { mount_id: 1 }).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);

    // A client token grants namespace calls but never the services' own: a mount's UFS
    // credentials, or speaking for a worker.
    let token = c.client_token();
    let mut as_client = locus_proto::auth::master_client(channel(&c.master_address()).await, &token).unwrap();
    assert!(!as_client.get_workers(pb::Empty {}).await.unwrap().into_inner().workers.is_empty());
    let s = as_client.get_mount(pb::GetMountRequest { mount_id: 1 }).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let s = as_client.register_worker(pb::RegisterWorkerRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let s = as_client.worker_heartbeat(pb::HeartbeatRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let s = as_client.commit_blocks(pb::CommitBlocksRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");

    // The cluster secret (a worker's) gets the mount with its options.
    let secret = Secret::new(&std::fs::read_to_string(&c.security().secret_file).unwrap()).unwrap();
    let mut as_service = locus_proto::auth::master_client(channel(&c.master_address()).await, &secret).unwrap();
    let root = as_service.get_mount(pb::GetMountRequest { mount_id: 1 }).await.unwrap().into_inner();
    assert_eq!(root.path, "/");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_data_path_and_the_socket_refuse_callers_without_credentials() {
    use locus_proto::{authenticate, exchange, read_frame, write_frame};
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let w = c.worker(0).unwrap();
    let hello = || pb::DataRequest { req: Some(pb::data_request::Req::Hello(pb::Empty {})) };

    // TCP: a request with no auth frame, or a wrong token, gets an Unauthenticated
    // answer and the connection is closed.
    for token in [None, Some(Secret::generate())] {
        let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
        if let Some(t) = &token {
            authenticate(&mut s, t).await.unwrap();
        }
        write_frame(&mut s, &hello()).await.unwrap();
        let r: pb::DataResponse = read_frame(&mut s).await.unwrap().unwrap();
        assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::Unauthenticated);
        assert!(read_frame::<_, pb::DataResponse>(&mut s).await.map(|f| f.is_none()).unwrap_or(true), "closed");
    }
    // The short-circuit socket: no lease without the token.
    let uds = w.uds_path().unwrap().to_path_buf();
    let mut s = tokio::net::UnixStream::connect(&uds).await.unwrap();
    let lease = pb::DataRequest {
        req: Some(pb::data_request::Req::Lease(pb::LeaseRequest { block_id: 1, length: 1, promote: false })),
    };
    write_frame(&mut s, &lease).await.unwrap();
    let r: pb::DataResponse = read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::Unauthenticated);

    // With the client token both answer.
    let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
    authenticate(&mut s, &c.client_token()).await.unwrap();
    assert_eq!(exchange(&mut s, hello()).await.unwrap().worker_id, w.id());
    let mut s = tokio::net::UnixStream::connect(&uds).await.unwrap();
    authenticate(&mut s, &c.client_token()).await.unwrap();
    assert_eq!(exchange(&mut s, hello()).await.unwrap().worker_id, w.id());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_metadata_and_blocks_are_private_files() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let opts = PutOptions { write_type: Some(WriteType::MustCache), ..Default::default() };
    let data = vec![7u8; 3 << 20];
    cl.put_with("/f", &mut data.as_slice(), &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap();

    let data = c.data_dir();
    assert_eq!(mode(&c.security().secret_file), 0o600);
    assert_eq!(mode(&c.security().token_file), 0o600);
    assert_eq!(mode(&data.join("master")), 0o700);
    assert_eq!(mode(&data.join("master/meta.redb")), 0o600);
    assert_eq!(mode(&data.join("worker0")), 0o700);
    let tier = dir.path().join("mem/w0");
    assert_eq!(mode(&tier), 0o700);
    let blocks: Vec<_> = std::fs::read_dir(tier.join("blocks")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!blocks.is_empty(), "the write cached blocks");
    for b in blocks.iter().filter(|p| p.extension().is_none()) {
        assert_eq!(mode(b), 0o600, "{}", b.display());
    }
    // The token a client holds is not the secret the services hold.
    let token = std::fs::read_to_string(&c.security().token_file).unwrap();
    let secret = std::fs::read_to_string(&c.security().secret_file).unwrap();
    assert_ne!(token.trim(), secret.trim());
    assert_eq!(token.trim(), c.client_token().expose());
    c.shutdown().await;
}
