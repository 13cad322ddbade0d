//! Fixtures the cluster test suites share (each `tests/*.rs` is its own binary and uses
//! some of them): a config on port 0 with fast heartbeats and 1 MiB blocks, starting a
//! `LocalCluster`, writing and reading whole files through the client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use locus_client::{Client, PutOptions, ReadOptions};
use locus_cluster::LocalCluster;
use locus_common::config::{Config, TierAlias, TierConfig, WriteType};
use locus_proto::pb;
use rand::RngCore;

pub const BLOCK: u64 = 1 << 20;

/// Every port 0, fast heartbeats, 1 MiB blocks, a MEM tier of `mem_quota` under `dir`
/// (and a 64 MiB SSD tier with `ssd`).
pub fn config(dir: &Path, mem_quota: u64, ssd: bool) -> Config {
    let mut c = Config::default();
    c.master.rpc_address = "127.0.0.1:0".into();
    c.master.web_address = "127.0.0.1:0".into();
    c.master.block_size = ByteSize::b(BLOCK);
    c.master.worker_timeout = Duration::from_secs(2);
    c.master.default_sync_interval = Duration::from_secs(3600);
    c.worker.data_address = "127.0.0.1:0".into();
    c.worker.heartbeat_interval = Duration::from_millis(100);
    c.worker.high_watermark = 0.9;
    c.worker.low_watermark = 0.6;
    c.worker.tiers = vec![TierConfig { alias: TierAlias::Mem, dir: dir.join("mem"), quota: ByteSize::b(mem_quota) }];
    // `LOCUS_TEST_RAFT=1` runs every master as a one-member replicated group.
    if std::env::var_os("LOCUS_TEST_RAFT").is_some() {
        c.master.raft_address = "127.0.0.1:0".into();
    }
    if ssd {
        c.worker.tiers.push(TierConfig { alias: TierAlias::Ssd, dir: dir.join("ssd"), quota: ByteSize::mib(64) });
    }
    c
}

/// A cluster of `workers` with [`config`], its data dir `dir/data`.
pub async fn start(dir: &Path, workers: usize, mem_quota: u64, ssd: bool) -> LocalCluster {
    LocalCluster::start(config(dir, mem_quota, ssd), &dir.join("data"), workers, None).await.unwrap()
}

/// The default UFS of a cluster (`file://<data-dir>/ufs`).
pub fn ufs_dir(c: &LocalCluster) -> PathBuf {
    c.data_dir().join("ufs")
}

pub fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rng().fill_bytes(&mut v);
    v
}

/// Write `data` to `path` (replacing it) with write type `wt`.
pub async fn put_as(c: &Client, path: &str, data: &[u8], wt: WriteType) -> locus_common::Result<pb::FileInfo> {
    let opts = PutOptions { overwrite: true, write_type: Some(wt), ..Default::default() };
    c.put_with(path, &mut &data[..], &opts, |_| Ok(pb::ObjectMeta::default())).await
}

/// The whole file.
pub async fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let fi = c.status(path, true).await.unwrap();
    let mut out = Vec::new();
    c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut out).await.unwrap();
    out
}

/// Poll `stat` until the file is persisted (the persist queue runs in the background).
pub async fn wait_persisted(c: &Client, path: &str) -> pb::FileInfo {
    for _ in 0..200 {
        let fi = c.status(path, true).await.unwrap();
        if fi.persist_state() == pb::PersistState::Persisted {
            return fi;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} was not persisted in 10 s");
}

/// Poll the report until the persist queue is empty, for `within` at most.
pub async fn wait_queue_empty(c: &Client, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if c.report().await.unwrap().persist_queue_ops == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the persist queue did not drain: {:?}", c.report().await.unwrap());
}

/// Test TLS material written under `dir`: a CA, and a server certificate it signed for
/// `localhost` and `127.0.0.1`. Returns (ca.pem, cert.pem, key.pem).
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "locus test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut server = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    server.distinguished_name.push(DnType::CommonName, "locus test server");
    let key = KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &issuer).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// A raw HTTP/1.1 GET of `path` at `addr` with an optional `Authorization` value:
/// (status, headers in lower case, body).
pub async fn http_get(addr: &str, path: &str, auth: Option<&str>) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}
