//! An authenticated cluster: every port refuses callers without the cluster's
//! credentials, a client token never grants the services' calls (UFS credentials,
//! worker registration), and the files holding secrets and data are this user's only.
//! With TLS on, the master RPC and the data path carry everything over TLS, and a plain
//! caller, a caller trusting another CA, or a TLS caller of a plain cluster gets a clear
//! error at once. The web port needs the client token (Bearer or Basic).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use locus_client::{Client, PutOptions, Tls};
use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, Locality, SecurityConfig, WriteType};
use locus_common::security::{Identity, Role, Secret, Verifier};
use locus_proto::pb;
use locus_proto::pb::master_client::MasterClient;

use crate::common;

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
    let worker = Verifier::new(&secret).identity(Role::Worker);
    let mut as_service = locus_proto::auth::master_client_as(channel(&c.master_address()).await, worker.clone());
    let root = as_service.get_mount(pb::GetMountRequest { mount_id: 1 }).await.unwrap().into_inner();
    assert_eq!(root.path, "/");

    // No credential is taken as such: the secret itself as a bearer is refused.
    let call = |auth: String| {
        let mut r = tonic::Request::new(pb::GetMountRequest { mount_id: 1 });
        r.metadata_mut().insert("authorization", auth.parse().unwrap());
        r
    };
    let s = bare.get_mount(call(format!("Bearer {}", secret.expose()))).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    // A listener posing as the master hands a worker a nonce of its own and captures the
    // proof: the master never made that nonce and refuses it.
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD_NO_PAD, b);
    let own = vec![7u8; 56];
    let captured = format!("Locus-Proof worker {} {}", b64(&own), b64(&worker.prove(&own)));
    let s = bare.get_mount(call(captured)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    // The master's own nonce grants nothing without the key: a proof made with the
    // client token for the worker's role, or for another nonce, is refused.
    let n = bare.challenge(pb::Empty {}).await.unwrap().into_inner().nonce;
    let forged = Identity::member(&token, Role::Worker).prove(&n);
    let s = bare.get_mount(call(format!("Locus-Proof worker {} {}", b64(&n), b64(&forged)))).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    let other = bare.challenge(pb::Empty {}).await.unwrap().into_inner().nonce;
    let s = bare
        .get_mount(call(format!("Locus-Proof worker {} {}", b64(&other), b64(&worker.prove(&n)))))
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    // The honest proof for that nonce is taken.
    let r = bare.get_mount(call(format!("Locus-Proof worker {} {}", b64(&n), b64(&worker.prove(&n))))).await.unwrap();
    assert_eq!(r.into_inner().path, "/");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_data_path_and_the_socket_refuse_callers_without_credentials() {
    use locus_proto::{authenticate, exchange, read_frame, write_frame};
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let w = c.worker(0).unwrap();
    let hello = || pb::DataRequest::from(pb::data_request::Req::Hello(pb::Empty {}));

    // TCP: a request with no auth frame, or a wrong token, gets an Unauthenticated
    // answer and the connection is closed.
    let other = Verifier::new(&Secret::generate());
    for who in [None, Some(Identity::client(&Secret::generate())), Some(other.identity(Role::Worker))] {
        let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
        if let Some(who) = &who {
            authenticate(&mut s, who).await.unwrap();
        }
        write_frame(&mut s, &hello()).await.unwrap();
        let r: pb::DataResponse = read_frame(&mut s).await.unwrap().unwrap();
        assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::Unauthenticated);
        assert!(read_frame::<_, pb::DataResponse>(&mut s).await.map(|f| f.is_none()).unwrap_or(true), "closed");
    }
    // The short-circuit socket: no lease without the token.
    let uds = w.uds_path().unwrap().to_path_buf();
    let mut s = tokio::net::UnixStream::connect(&uds).await.unwrap();
    let lease = pb::DataRequest::from(pb::data_request::Req::Lease(pb::LeaseRequest {
        block_id: 1,
        length: 1,
        promote: false,
        client_host: String::new(),
    }));
    write_frame(&mut s, &lease).await.unwrap();
    let r: pb::DataResponse = read_frame(&mut s).await.unwrap().unwrap();
    assert_eq!(r.error.unwrap().kind(), pb::ErrorKind::Unauthenticated);

    // With the client token both answer.
    let me = Identity::client(&c.client_token());
    let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
    authenticate(&mut s, &me).await.unwrap();
    assert_eq!(exchange(&mut s, hello()).await.unwrap().worker_id, w.id());
    let mut s = tokio::net::UnixStream::connect(&uds).await.unwrap();
    authenticate(&mut s, &me).await.unwrap();
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

    common::put_as(&cl, "/through.txt", b"persisted", WriteType::Through).await.unwrap();
    let data = c.data_dir();
    // The data dir and the default UFS are this user's only, and so is what is persisted.
    assert_eq!(mode(data), 0o700);
    assert_eq!(mode(&data.join("ufs")), 0o700);
    assert_eq!(mode(&data.join("ufs/through.txt")), 0o600);
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

/// A cluster serving TLS with `tls_files`' certificate (its own processes trusting the CA).
async fn start_tls(dir: &Path, workers: usize) -> (LocalCluster, std::path::PathBuf) {
    let (ca, cert, key) = common::tls_files(&dir.join("tls"));
    let mut cfg = common::config(dir, 64 << 20, false);
    cfg.security.tls_cert_file = Some(cert);
    cfg.security.tls_key_file = Some(key);
    cfg.security.tls_ca_file = Some(ca.clone());
    (LocalCluster::start(cfg, &dir.join("data"), workers, None).await.unwrap(), ca)
}

fn tls_trusting(ca: &Path) -> Tls {
    let cfg = SecurityConfig { tls_ca_file: Some(ca.to_path_buf()), ..Default::default() };
    Tls::load(&cfg).unwrap()
}

/// Within 10 s, or the test fails (a mismatch must be an error, never a hang).
async fn quick<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("answered within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_serves_everything_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (c, ca) = start_tls(dir.path(), 2).await;
    assert!(c.tls().serves() && c.tls().connects());
    // Through the data path only (no short-circuit): writes down a 2-worker pipeline, and
    // an ASYNC_THROUGH file the master has a worker persist (master → worker over TLS).
    let remote = ClientConfig { locality: Locality::Remote, ..Default::default() };
    let cl = Client::with_tls(&c.master_address(), remote, c.client_token(), tls_trusting(&ca)).unwrap();
    let data = common::random(3 * common::BLOCK as usize + 12345);
    let fi = common::put_as(&cl, "/tls/a", &data, WriteType::AsyncThrough).await.unwrap();
    assert_eq!(fi.length, data.len() as u64);
    assert_eq!(common::read_all(&cl, "/tls/a").await, data);
    common::wait_persisted(&cl, "/tls/a").await;
    assert_eq!(std::fs::read(common::ufs_dir(&c).join("tls/a")).unwrap(), data);
    // A block read from the UFS through a worker (a fill), and the cached copy after it.
    std::fs::write(common::ufs_dir(&c).join("tls/u"), &data[..1000]).unwrap();
    assert_eq!(common::read_all(&cl, "/tls/u").await, &data[..1000]);
    assert_eq!(common::read_all(&cl, "/tls/u").await, &data[..1000]);
    // A cached write down a pipeline of both workers (worker → worker over TLS).
    let opts = PutOptions { write_type: Some(WriteType::MustCache), durable_replicas: Some(2), ..Default::default() };
    cl.put_with("/tls/m", &mut &data[..], &opts, |_| Ok(pb::ObjectMeta::default())).await.unwrap();
    let fi = cl.status("/tls/m", true).await.unwrap();
    assert!(fi.blocks.iter().all(|b| b.locations.len() == 2), "two copies of each block: {:?}", fi.blocks);
    assert_eq!(common::read_all(&cl, "/tls/m").await, data);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_and_untrusted_callers_of_a_tls_cluster_are_refused_clearly() {
    use locus_proto::authenticate;
    let dir = tempfile::tempdir().unwrap();
    let (c, _ca) = start_tls(dir.path(), 1).await;
    let w = c.worker(0).unwrap().data_address().to_string();

    // Plain TCP, with the right token: refused, saying TLS is needed.
    let plain = Client::new(&c.master_address(), ClientConfig::default(), c.client_token()).unwrap();
    let e = quick(plain.status("/", false)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("TLS only") && e.to_string().contains("tls_ca_file"), "{e}");
    let mut s = tokio::net::TcpStream::connect(&w).await.unwrap();
    let e = quick(authenticate(&mut s, &Identity::client(&c.client_token()))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("TLS only"), "{e}");

    // TLS trusting another CA: the handshake fails (not retried), saying why.
    let (other_ca, _, _) = common::tls_files(&dir.path().join("other"));
    let other = tls_trusting(&other_ca);
    let t = std::time::Instant::now();
    let cl = Client::with_tls(&c.master_address(), ClientConfig::default(), c.client_token(), other.clone()).unwrap();
    let e = quick(cl.status("/", false)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("TLS handshake") && e.to_string().contains("certificate"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
    let e = quick(other.connect(&w, "worker")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(!e.is_retryable());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_client_of_a_plain_cluster_is_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let (ca, _, _) = common::tls_files(&dir.path().join("tls"));
    let tls = tls_trusting(&ca);
    let t = std::time::Instant::now();
    let cl = Client::with_tls(&c.master_address(), ClientConfig::default(), c.client_token(), tls.clone()).unwrap();
    let e = quick(cl.status("/", false)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("does not serve TLS"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "not retried: {:?}", t.elapsed());
    let w = c.worker(0).unwrap().data_address().to_string();
    let e = quick(tls.connect(&w, "worker")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("does not serve TLS"), "{e}");
    // The plain cluster still serves plain clients.
    assert!(c.client(ClientConfig::default()).unwrap().status("/", false).await.unwrap().is_dir);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_web_port_needs_the_client_token() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path()).await;
    let web = c.web_address();
    let token = c.client_token();
    let basic = |user: &str, pw: &str| {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}")))
    };
    let wrong = Secret::generate().client_token();
    for path in ["/", "/metrics", "/api/report"] {
        for auth in [None, Some(format!("Bearer {}", wrong.expose())), Some(basic("admin", wrong.expose()))] {
            let (status, head, body) = common::http_get(&web, path, auth.as_deref()).await;
            assert_eq!(status, 401, "{path} {auth:?}: {head}");
            assert!(head.contains("www-authenticate: basic realm=\"locus\""), "{head}");
            assert!(!body.contains("locus_workers_live") && !body.contains("workers\":"), "{body}");
        }
        for auth in [format!("Bearer {}", token.expose()), basic("anyone", token.expose()), basic("", token.expose())] {
            let (status, head, body) = common::http_get(&web, path, Some(&auth)).await;
            assert_eq!(status, 200, "{path} {auth}: {head}");
            let want = match path {
                "/metrics" => "locus_workers_live",
                "/api/report" => "\"workers\"",
                _ => "<h1>Locus</h1>",
            };
            assert!(body.contains(want), "{path}: {body}");
        }
    }
    c.shutdown().await;
}
