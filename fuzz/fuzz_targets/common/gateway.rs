//! The fuzz targets' S3 gateway: the real one, in this process, on a runtime of its own,
//! with a master that is not there (what would reach it fails as unavailable), and the
//! default key pair.
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use locus_common::config::{ClientConfig, GatewayConfig};
use locus_common::security::Secret;

/// The gateway's address, started once on a runtime of its own.
pub fn gateway() -> &'static str {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let cfg = ClientConfig { master_retry: Duration::ZERO, ..Default::default() };
                let client = Arc::new(locus_client::Client::new("127.0.0.1:1", cfg, Secret::generate()).unwrap());
                let gcfg = GatewayConfig { address: "127.0.0.1:0".into(), ..Default::default() };
                let gw = locus_s3::GatewayBuilder::new(client, gcfg).build().unwrap();
                let listener = gw.bind().await.unwrap();
                tx.send(listener.local_addr().unwrap().to_string()).unwrap();
                gw.serve(listener, std::future::pending()).await.unwrap();
            });
        });
        rx.recv().unwrap()
    })
}

/// Sends `request` on a new connection and reads until the gateway closes it: an answer
/// or a closed connection, never a hang (8 s).
pub fn exchange(request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(gateway()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    // The gateway may answer and close before it has read everything.
    let _ = s.write_all(request);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        assert!(
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            "the gateway hung"
        );
    }
    out
}
