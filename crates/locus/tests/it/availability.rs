//! Riding through failures instead of failing every request: clients wait out a master
//! restart (calls sent again with backoff for `client.master_retry`), writes go around a
//! worker that died before the master noticed, and a write is never acknowledged with
//! fewer copies than it asked for without saying so.

use std::path::Path;
use std::time::{Duration, Instant};

use locus_client::Client;
use locus_cluster::LocalCluster;
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, Config, WriteType};
use locus_proto::pb;

use crate::common;
use common::read_all;

fn config(dir: &Path) -> Config {
    let mut c = common::config(dir, 256 << 20, false);
    // Long enough that the writes below run while the master still lists a dead worker.
    c.master.worker_timeout = Duration::from_secs(30);
    c
}

async fn put(c: &Client, path: &str, data: &[u8]) -> locus_common::Result<pb::FileInfo> {
    common::put_as(c, path, data, WriteType::AsyncThrough).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_wait_out_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(config(dir.path()), &dir.path().join("data"), 2, None).await.unwrap();
    let cfg = ClientConfig { master_retry: Duration::from_secs(30), ..Default::default() };
    let cl = std::sync::Arc::new(c.client(cfg).unwrap());
    put(&cl, "/before", b"written before the restart").await.unwrap();

    c.stop_master().await;
    // A client told not to wait fails at once, clearly.
    let impatient = c.client(ClientConfig { master_retry: Duration::ZERO, ..Default::default() }).unwrap();
    let t = Instant::now();
    let e = impatient.status("/before", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("cannot reach the master"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));

    // Reads, listings, creates, writes and deletes sent while the master is down wait.
    let calls = {
        let cl = cl.clone();
        tokio::spawn(async move {
            let st = cl.status("/before", false).await.map(|f| f.length);
            let ls = cl.list_page("/", "", false, 0).await.map(|(e, _)| e.len());
            let mk = cl.mkdir("/made-during", false).await;
            let wr = put(&cl, "/during", b"written while the master restarted").await.map(|f| f.length);
            let rm = cl.delete("/before", false).await;
            (st, ls, mk, wr, rm)
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!calls.is_finished(), "calls must wait for the master, not fail");
    c.start_master().await.unwrap();
    let (st, ls, mk, wr, rm) = tokio::time::timeout(Duration::from_secs(60), calls).await.unwrap().unwrap();
    assert_eq!(st.unwrap(), 26);
    assert!(ls.unwrap() >= 1);
    mk.unwrap();
    assert_eq!(wr.unwrap(), 34);
    rm.unwrap();
    assert_eq!(read_all(&cl, "/during").await, b"written while the master restarted");
    assert_eq!(cl.status("/before", false).await.unwrap_err().kind(), ErrorKind::NotFound);
    assert!(cl.status("/made-during", false).await.unwrap().is_dir);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_go_around_a_worker_that_just_died() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(config(dir.path()), &dir.path().join("data"), 3, None).await.unwrap();
    let cl = c.client(ClientConfig::default()).unwrap();
    let gone = c.worker(1).unwrap().id();
    c.stop_worker(1).await;
    // The master still lists it (worker_timeout 30 s): every write must still succeed, with
    // its two durable copies on live workers.
    assert!(cl.workers(true).await.unwrap().iter().any(|w| w.worker_id == gone));
    let t = Instant::now();
    for i in 0..12 {
        let data = vec![i as u8; (1 << 20) + 7];
        let path = format!("/w{i}");
        put(&cl, &path, &data).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let fi = cl.status(&path, true).await.unwrap();
        for b in &fi.blocks {
            assert_eq!(b.locations.len(), 2, "{path}: {:?}", b.locations);
            assert!(b.locations.iter().all(|l| l.worker_id != gone), "{path} placed on the dead worker");
        }
        assert_eq!(read_all(&cl, &path).await, data);
    }
    assert!(t.elapsed() < Duration::from_secs(25), "writes took {:?}", t.elapsed());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_is_never_acknowledged_short_without_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = LocalCluster::start(config(dir.path()), &dir.path().join("data"), 2, None).await.unwrap();
    let gone = c.worker(1).unwrap().id();
    c.stop_worker(1).await;
    let client = |c: &LocalCluster, allow_fewer: bool| {
        let mut cfg = ClientConfig::default();
        cfg.replication.wait = Duration::from_secs(2);
        cfg.replication.allow_fewer = allow_fewer;
        c.client(cfg).unwrap()
    };
    // The master still lists two live workers, so the write asks for two copies. The
    // worker found dead does not count: the write waits for it, then fails.
    let strict = client(&c, false);
    assert!(strict.workers(true).await.unwrap().iter().any(|w| w.worker_id == gone));
    let e = put(&strict, "/strict", &[1; 1000]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("2 worker copies"), "{e}");
    assert!(!locus_master::render_metrics(c.master()).contains("locus_writes_short_total 1"));
    // Allowed to go on with fewer, it does, and says so: the answer and the metric.
    let fi = put(&client(&c, true), "/short", &[2; 1000]).await.unwrap();
    assert_eq!((fi.copies_wanted, fi.copies_made), (2, 1), "{fi:?}");
    assert!(locus_master::render_metrics(c.master()).contains("locus_writes_short_total 1"));
    // A write with every copy it asked for is not counted.
    c.start_worker(1).await.unwrap();
    c.worker(1).unwrap().wait_registered(Duration::from_secs(10)).await.unwrap();
    let fi = put(&client(&c, false), "/whole", &[3; 1000]).await.unwrap();
    assert_eq!((fi.copies_wanted, fi.copies_made), (2, 2), "{fi:?}");
    assert!(locus_master::render_metrics(c.master()).contains("locus_writes_short_total 1"));
    c.shutdown().await;
}
