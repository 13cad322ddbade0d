//! The master as a member of a replicated group (docs/design/ha-plan.md): a master from
//! before groups becomes the group's first member with its namespace intact, and every
//! change made through the log is there after a restart.

use locus_common::config::{ClientConfig, WriteType};

use crate::common;

/// The entries in a member's log (`raft.redb`), read while the master is stopped.
fn log_entries(meta_dir: &std::path::Path) -> u64 {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let db = redb::Database::open(meta_dir.join("raft.redb")).unwrap();
    let r = db.begin_read().unwrap();
    r.open_table(redb::TableDefinition::<u64, &[u8]>::new("raft_log")).unwrap().len().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_without_a_log_becomes_the_first_member_intact() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(dir.path(), 64 << 20, false);
    cfg.master.raft_address.clear();
    let mut c = locus_cluster::LocalCluster::start(cfg, &dir.path().join("data"), 1, None).await.unwrap();
    let meta = c.data_dir().join("master");
    let cl = c.client(ClientConfig::default()).unwrap();
    let a = common::random(3 << 20);
    common::put_as(&cl, "/before", &a, WriteType::CacheThrough).await.unwrap();
    cl.mkdir("/d", false).await.unwrap();
    c.stop_master().await;
    assert!(!meta.join("raft.redb").exists());

    c.configure_master(|m| m.raft_address = "127.0.0.1:0".into());
    c.start_master().await.unwrap();
    assert_eq!(common::read_all(&cl, "/before").await, a);
    let b = common::random(1 << 20);
    common::put_as(&cl, "/after", &b, WriteType::CacheThrough).await.unwrap();
    cl.rename("/d", "/e").await.unwrap();
    cl.delete("/before", false).await.unwrap();
    c.stop_master().await;
    let n = log_entries(&meta);
    assert!(n >= 5, "the changes went through the log: {n} entries");

    c.start_master().await.unwrap();
    assert_eq!(common::read_all(&cl, "/after").await, b);
    assert!(cl.status("/e", false).await.unwrap().is_dir);
    for gone in ["/before", "/d"] {
        let e = cl.status(gone, false).await.unwrap_err();
        assert_eq!(e.kind(), locus_common::ErrorKind::NotFound, "{gone}");
    }
    cl.mkdir("/e/f", false).await.unwrap();
    c.shutdown().await;
}

// ---- Three masters in process (stage 4) ----

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use locus_client::Client;
use locus_cluster::LocalCluster;
use locus_common::security::{Identity, Role, Secret};
use locus_proto::pb;

async fn group(dir: &std::path::Path, workers: usize) -> LocalCluster {
    let mut cfg = common::config(dir, 64 << 20, false);
    cfg.master.raft_address.clear();
    LocalCluster::start_group(cfg, &dir.join("data"), 3, workers, None).await.unwrap()
}

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap()
}

/// A client of the group that proves the master's role (what `locus admin masters` is).
fn admin(c: &LocalCluster) -> Client {
    let secret = locus_common::security::read_secret_file(&c.security().secret_file).unwrap();
    let id = Identity::member(&secret, Role::Master);
    Client::with_identity(&c.master_address(), ClientConfig::default(), id, c.tls().clone()).unwrap()
}

fn secret(c: &LocalCluster) -> Secret {
    locus_common::security::read_secret_file(&c.security().secret_file).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_names_the_leader_and_clients_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = group(dir.path(), 1).await;
    let l = c.leader_index().unwrap();
    let f = (l + 1) % 3;
    let follower = c.master_config(f).rpc_address.clone();
    let leader = c.master_config(l).rpc_address.clone();

    // A call to a follower is refused, naming the leader; it was not carried out.
    let mut raw = locus_proto::auth::master_client(channel(&follower).await, &c.client_token()).unwrap();
    let s = raw.create_directory(pb::PathRequest { path: "/x".into(), recursive: false }).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
    assert_eq!(locus_proto::leader_hint(&s).as_deref(), Some(leader.as_str()));
    assert!(locus_proto::from_status(s).is_retryable());
    // Who the members are, any member says (once the membership reached it).
    let mut m = raw.get_masters(pb::Empty {}).await.unwrap().into_inner();
    for _ in 0..100 {
        if m.masters.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        m = raw.get_masters(pb::Empty {}).await.unwrap().into_inner();
    }
    assert_eq!(m.masters.iter().filter(|m| m.voter).count(), 3, "{m:?}");
    assert_eq!(m.masters.iter().filter(|m| m.leader).count(), 1, "{m:?}");

    // A client given the follower alone, and one given all three, work.
    let one = Client::with_tls(&follower, ClientConfig::default(), c.client_token(), c.tls().clone()).unwrap();
    let all = c.client(ClientConfig::default()).unwrap();
    let a = common::random(300 << 10);
    common::put_as(&one, "/a", &a, WriteType::CacheThrough).await.unwrap();
    assert_eq!(common::read_all(&all, "/a").await, a);
    all.mkdir("/x", false).await.unwrap();
    assert!(one.status("/x", false).await.unwrap().is_dir);

    // The report says who leads, in which term, and how far each member is behind.
    let mut g = all.report().await.unwrap().group.expect("a group in the report");
    for _ in 0..100 {
        if g.masters.iter().all(|m| m.lag == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        g = all.report().await.unwrap().group.unwrap();
    }
    assert!(g.term >= 1 && g.elected_ms > 0 && g.applied_index > 0, "{g:?}");
    assert_eq!(g.masters.iter().filter(|m| m.leader).count(), 1, "{g:?}");
    assert!(g.masters.iter().find(|m| m.leader).is_some_and(|m| m.rpc_address == leader), "{g:?}");
    assert!(g.masters.iter().all(|m| m.voter && m.lag == 0 && m.matched_index == g.last_log_index), "{g:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_stopped_under_32_writers_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = group(dir.path(), 1).await;
    let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..32 {
        let (cl, stop) = (cl.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut acked, mut errors) = (Vec::new(), Vec::new());
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (path, data) = (format!("/w{w}/{n}"), common::random(4096 + n));
                match common::put_as(&cl, &path, &data, WriteType::AsyncThrough).await {
                    Ok(_) => acked.push((path, data)),
                    Err(e) => errors.push(format!("{path}: {e}")),
                }
            }
            (acked, errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old = c.leader_index().unwrap();
    c.stop_master_at(old).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut acked, mut errors) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, e) = t.await.unwrap();
        acked.extend(a);
        errors.extend(e);
    }
    assert!(errors.is_empty(), "{} writes failed, the first: {:?}", errors.len(), errors.first());
    let new = c.leader_index().expect("a new leader");
    assert_ne!(new, old);
    assert!(acked.len() > 64, "only {} writes were acknowledged", acked.len());
    for (path, data) in &acked {
        assert_eq!(&common::read_all(&cl, path).await, data, "{path}");
    }
    // The old leader, started again, finds the group gone on without it and follows.
    c.start_master_at(old).await.unwrap();
    c.wait_for_group(Duration::from_secs(30)).await.unwrap();
    assert_eq!(c.leader_index(), Some(new));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_follower_rejoins_by_snapshot_and_carries_the_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = group(dir.path(), 1).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let a = common::random(200 << 10);
    for i in 0..10 {
        common::put_as(&cl, &format!("/a/{i}"), &a, WriteType::CacheThrough).await.unwrap();
    }
    let l = c.leader_index().unwrap();
    let (f1, f2) = ((l + 1) % 3, (l + 2) % 3);
    c.stop_master_at(f1).await;
    std::fs::remove_dir_all(&c.master_config(f1).meta_dir).unwrap();
    c.start_master_at(f1).await.unwrap();
    // With f2 down, a change needs f1's acknowledgement: f1 is a member again.
    c.stop_master_at(f2).await;
    let b = common::random(100 << 10);
    common::put_as(&cl, "/b", &b, WriteType::CacheThrough).await.unwrap();
    // The old leader goes; f2 lacks /b, so only f1 can be elected, and serves it all.
    c.stop_master_at(l).await;
    c.start_master_at(f2).await.unwrap();
    c.wait_for_leader(Duration::from_secs(30), |_| true).await.unwrap();
    assert_eq!(c.leader_index(), Some(f1));
    assert_eq!(common::read_all(&cl, "/b").await, b);
    for i in 0..10 {
        assert_eq!(common::read_all(&cl, &format!("/a/{i}")).await, a, "/a/{i}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_master_is_replaced_with_admin_masters_remove_and_add() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = group(dir.path(), 1).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let a = common::random(100 << 10);
    common::put_as(&cl, "/a", &a, WriteType::CacheThrough).await.unwrap();
    let l = c.leader_index().unwrap();
    let dead = (l + 1) % 3;
    c.stop_master_at(dead).await;
    let adm = admin(&c);
    let m = adm.remove_master(&c.master_config(dead).raft_address).await.unwrap();
    assert_eq!(m.masters.len(), 2, "{m:?}");
    let new = c.new_master_slot().unwrap();
    c.start_master_at(new).await.unwrap();
    let m = adm.add_master(&c.master_config(new).raft_address).await.unwrap();
    let voters: Vec<&str> = m.masters.iter().filter(|m| m.voter).map(|m| m.raft_address.as_str()).collect();
    assert_eq!(voters.len(), 3, "{m:?}");
    assert!(voters.contains(&c.master_config(new).raft_address.as_str()));
    // Without the old leader, the other founder and the new master are the quorum.
    c.stop_master_at(l).await;
    c.wait_for_leader(Duration::from_secs(30), |_| true).await.unwrap();
    assert_eq!(common::read_all(&cl, "/a").await, a);
    cl.mkdir("/after", false).await.unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attacker_with_the_client_token_cannot_touch_the_group() {
    use base64::Engine;
    use locus_proto::pb::raft_client::RaftClient;
    let dir = tempfile::tempdir().unwrap();
    let c = group(dir.path(), 0).await;
    let token = c.client_token();
    let l = c.leader_index().unwrap();
    // Membership changes need the master's role: the client token, or a worker, is refused.
    let cl = c.client(ClientConfig::default()).unwrap();
    let e = cl.add_master("127.0.0.1:1").await.unwrap_err();
    assert_eq!(e.kind(), locus_common::ErrorKind::PermissionDenied, "{e}");
    let worker = Identity::member(&secret(&c), Role::Worker);
    let as_worker =
        Client::with_identity(&c.master_address(), ClientConfig::default(), worker.clone(), c.tls().clone());
    let e = as_worker.unwrap().remove_master(&c.master_config(l).raft_address).await.unwrap_err();
    assert_eq!(e.kind(), locus_common::ErrorKind::PermissionDenied, "{e}");
    // The raft port takes the master's role only.
    let raft = &c.master_config(l).raft_address;
    for id in [Identity::client(&token), worker] {
        let ch = locus_proto::auth::ProvingChannel::to(locus_proto::auth::Port::Raft, channel(raft).await, id);
        let mut rc = RaftClient::new(ch);
        let s = rc.describe(pb::RaftDescribeRequest { nonce: vec![7; 32] }).await.unwrap_err();
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
        let s = rc.vote(pb::RaftVoteRequest {
            vote: Some(pb::RaftVote { term: 99, node: 1, committed: false }),
            last_log_id: None,
        });
        assert_eq!(s.await.unwrap_err().code(), tonic::Code::PermissionDenied);
    }
    // With no proof at all: refused, and the term is untouched.
    let mut bare = RaftClient::new(channel(raft).await);
    let s = bare.append_entries(pb::RaftAppendRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    assert_eq!(c.leader_index(), Some(l));
    // A proof made for one master's challenge is worthless at another master.
    let (a, b) = (&c.master_config(l).rpc_address, &c.master_config((l + 1) % 3).rpc_address);
    let mut at_a = pb::master_client::MasterClient::new(channel(a).await);
    let nonce = at_a.challenge(pb::Empty {}).await.unwrap().into_inner().nonce;
    let proof = Identity::client(&token).prove(&nonce);
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    let header = format!("Locus-Proof client {} {}", b64.encode(&nonce), b64.encode(&proof));
    let mut r = tonic::Request::new(pb::Empty {});
    r.metadata_mut().insert("authorization", header.parse().unwrap());
    let mut at_b = pb::master_client::MasterClient::new(channel(b).await);
    let s = at_b.get_masters(r).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    let mut r = tonic::Request::new(pb::Empty {});
    r.metadata_mut().insert("authorization", header.parse().unwrap());
    at_a.get_masters(r).await.expect("the same proof where its challenge was made");
    c.shutdown().await;
}

/// Waits up to 10 s for `f` to hold.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 10 s");
}

/// `req` sent to worker 0's data path as a master leading in `term` would send it.
async fn order(c: &LocalCluster, req: pb::data_request::Req, term: u64) -> locus_common::Result<pb::DataResponse> {
    let w = c.worker(0).unwrap();
    let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
    let id = locus_common::security::Verifier::new(&secret(c)).identity(Role::Master);
    locus_proto::authenticate(&mut s, &id).await?;
    locus_proto::exchange(&mut s, pb::DataRequest::order(req, term)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposed_leaders_orders_are_refused_by_the_workers() {
    use locus_common::ErrorKind;
    use pb::data_request::Req;
    let dir = tempfile::tempdir().unwrap();
    let mut c = group(dir.path(), 1).await;
    let old = c.leader_index().unwrap();
    let t1 = c.master().members().unwrap().term;
    // The worker hears the leader's term in its answers.
    eventually("the worker hears the first term", || c.worker(0).unwrap().master_term() == t1).await;
    c.stop_master_at(old).await;
    c.wait_for_leader(Duration::from_secs(30), |_| true).await.unwrap();
    let leader_term = || c.master().members().unwrap().term;
    eventually("the worker hears the new term", || c.worker(0).unwrap().master_term() == leader_term()).await;
    let t2 = c.worker(0).unwrap().master_term();
    assert!(t2 > t1, "{t2} after {t1}");

    // The old leader's orders are refused before anything is done.
    let ufs = c.data_dir().join("ufs");
    let persist = |p: &str| Req::Persist(pb::PersistRequest { mount_id: 1, ufs_path: p.into(), ..Default::default() });
    let e = order(&c, persist("stale.txt"), t1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
    assert!(e.message().contains("deposed"), "{e}");
    assert!(!ufs.join("stale.txt").exists());
    let copy = pb::ReplicateRequest { block_id: 5 << 24, length: 1, sources: vec!["127.0.0.1:1".into()] };
    let e = order(&c, Req::Replicate(copy), t1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
    // The leader's own are carried out.
    order(&c, persist("current.txt"), t2).await.unwrap();
    assert_eq!(std::fs::read(ufs.join("current.txt")).unwrap(), b"");
    assert_eq!(c.worker(0).unwrap().refused_from_deposed(), 2);

    // A restarted worker still knows the term it was told.
    c.stop_worker(0).await;
    c.start_worker(0).await.unwrap();
    assert!(c.worker(0).unwrap().master_term() >= t2);
    let e = order(&c, persist("stale.txt"), t1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
    assert!(!ufs.join("stale.txt").exists());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_member_knows_the_blocks_so_a_new_leader_serves_them_without_a_new_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = group(dir.path(), 1).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let l = c.leader_index().unwrap();
    let followers = [(l + 1) % 3, (l + 2) % 3];
    // The followers take the worker's mirrored report once the log brought them its
    // registration.
    let live = |i: usize| c.master_at(i).unwrap().report().workers.iter().filter(|w| w.live).count();
    eventually("the followers count the worker live", || followers.iter().all(|&f| live(f) == 1)).await;

    let files: Vec<Vec<u8>> = (0..8).map(|i| common::random((100 << 10) + i)).collect();
    for (i, data) in files.iter().enumerate() {
        common::put_as(&cl, &format!("/m/{i}"), data, WriteType::MustCache).await.unwrap();
    }
    // Every member knows where each block is, once the writes are acknowledged.
    let id = c.worker(0).unwrap().id();
    let on_leader = c.master_at(l).unwrap().located_blocks(id).unwrap();
    assert!(on_leader.len() >= files.len(), "{on_leader:?}");
    for &f in &followers {
        assert_eq!(c.master_at(f).unwrap().located_blocks(id).unwrap(), on_leader, "member {f}");
    }

    // The leader goes: the new one serves the cached files at once, and the worker does
    // not send it a full report.
    let reports = c.worker(0).unwrap().registrations();
    c.stop_master_at(l).await;
    c.wait_for_leader(Duration::from_secs(30), |_| true).await.unwrap();
    for (i, data) in files.iter().enumerate() {
        assert_eq!(&common::read_all(&cl, &format!("/m/{i}")).await, data, "/m/{i}");
    }
    common::put_as(&cl, "/m/after", b"after", WriteType::MustCache).await.unwrap();
    assert_eq!(c.worker(0).unwrap().registrations(), reports);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attacker_with_the_client_token_cannot_mirror_reports_or_raise_the_term() {
    use pb::data_request::Req;
    let dir = tempfile::tempdir().unwrap();
    let c = group(dir.path(), 1).await;
    let l = c.leader_index().unwrap();
    let f = (l + 1) % 3;
    let id = c.worker(0).unwrap().id();
    let term = c.worker(0).unwrap().master_term();
    // A mirrored report is a worker's call: the client token is refused at any member,
    // and the member records nothing of it.
    let mut raw =
        locus_proto::auth::master_client(channel(&c.master_config(f).rpc_address).await, &c.client_token()).unwrap();
    fn mirrored<T>(msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert(locus_proto::MIRROR_KEY, "1".parse().unwrap());
        r
    }
    let fake = pb::RegisterWorkerRequest {
        worker_id: id,
        address: Some(pb::WorkerAddress {
            host: "evil".into(),
            data_address: "127.0.0.1:1".into(),
            ..Default::default()
        }),
        blocks: vec![pb::BlockReport { block_id: 99 << 24, length: 1, ..Default::default() }],
        cluster_id: c.master().cluster_id(),
        ..Default::default()
    };
    let s = raw.register_worker(mirrored(fake)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let commit = pb::CommitBlocksRequest {
        worker_id: id,
        added: vec![pb::BlockReport { block_id: 98 << 24, length: 1, ..Default::default() }],
        ..Default::default()
    };
    let s = raw.commit_blocks(mirrored(commit)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let beat = pb::HeartbeatRequest { worker_id: id, ..Default::default() };
    let s = raw.worker_heartbeat(mirrored(beat)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let known = c.master_at(f).unwrap().located_blocks(id).unwrap();
    assert!(!known.contains(&(99 << 24)) && !known.contains(&(98 << 24)), "{known:?}");

    // A term far ahead, on an order or on a client's own request, does not move the
    // worker's fence (which would make it refuse the real leader).
    let w = c.worker(0).unwrap();
    let token = Identity::client(&c.client_token());
    for req in [
        Req::Persist(pb::PersistRequest { mount_id: 1, ufs_path: "evil.txt".into(), ..Default::default() }),
        Req::Replicate(pb::ReplicateRequest { block_id: 5 << 24, length: 1, sources: vec!["127.0.0.1:1".into()] }),
        Req::Hello(pb::Empty {}),
    ] {
        let mut s = tokio::net::TcpStream::connect(w.data_address()).await.unwrap();
        locus_proto::authenticate(&mut s, &token).await.unwrap();
        let _ = locus_proto::exchange(&mut s, pb::DataRequest::order(req, u64::MAX)).await;
    }
    assert_eq!(w.master_term(), term);
    assert!(!c.data_dir().join("ufs/evil.txt").exists());
    // The leader's orders are still taken.
    order(&c, Req::Persist(pb::PersistRequest { mount_id: 1, ufs_path: "ok.txt".into(), ..Default::default() }), term)
        .await
        .unwrap();
    c.shutdown().await;
}
