//! This master's member of its group: the openraft node over its log and its namespace,
//! its `Raft` port, the proposer (which packs the commands proposed meanwhile into one
//! entry: one append, one fsync, in the order they were submitted, several entries in
//! flight), read barriers, and membership: founding, adding and removing members.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use locus_common::security::{Secret, Verifier};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use locus_proto::tls::Tls;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot, watch};

use super::log::LogStore;
use super::net::{self, Peers};
use super::state::{self, StateMachine};
use super::{Locus, MasterNode};
use crate::namespace::{Effects, Namespace};

/// A command's answer: its result and what it leaves to do, once applied.
type Reply = oneshot::Sender<Result<(pb::CommandResult, Effects)>>;

/// Most commands one entry takes.
const MAX_BATCH: usize = 1024;

/// Most entries proposed and not yet applied.
const IN_FLIGHT: usize = 2;

/// How often what was applied is made durable.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// How long a start waits to lead a group of its own and apply its log.
const START_WAIT: Duration = Duration::from_secs(60);

/// What a member needs besides its namespace: where it is reached, its founding peers,
/// and the cluster's secret and TLS (its raft port's, and its connections to peers').
pub(crate) struct Setup {
    pub node: MasterNode,
    pub peers: Vec<String>,
    pub secret: Secret,
    pub tls: Tls,
}

/// This master's member of its group.
pub(crate) struct Group {
    raft: Raft<Locus>,
    id: u64,
    tx: mpsc::UnboundedSender<(pb::Command, Reply)>,
    ns: Arc<Namespace>,
    verifier: Verifier,
    tls: Tls,
    /// The term this master took over in (`Master::take_over` done), 0 while it leads none.
    ready: AtomicU64,
    /// When it took over (ms since the epoch).
    elected_ms: std::sync::atomic::AtomicI64,
    /// Read barriers: one at a time, shared by the calls that arrived before it began.
    barrier: tokio::sync::Mutex<()>,
    barriers_begun: AtomicU64,
    last_barrier: parking_lot::Mutex<(u64, Option<(ErrorKind, String)>)>,
    /// Ends the flusher, the founder's task and the raft port.
    stop: watch::Sender<bool>,
}

fn fatal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("the master's replicated log: {what}: {e}"))
}

/// The leader's heartbeat interval (ms).
const HEARTBEAT_MS: u64 = 50;
/// A follower's election timeout is drawn from `ELECTION_MS`. openraft 0.9 adds its
/// leader lease (the range's end) to it while the follower's vote is of a committed
/// leader, so a member elects 450 to 600 ms after the leader's last heartbeat: the
/// failover goal is 1 s. Nine heartbeats fit in the shortest wait, so a leader's pause
/// (a debug build's CPU shared by three masters) does not start an election.
const ELECTION_MS: std::ops::Range<u64> = 150..300;
/// How long a leader takes calls without a quorum's acknowledgement (openraft's
/// `millis_since_quorum_ack`): past it, it may be cut off while the others elect
/// another, so its callers go to the other members. The followers refuse every other
/// candidate for as long after the heartbeat they acknowledged (openraft's leader lease
/// is `election_timeout_max`). Reads wait for a read barrier besides.
const LEASE_MS: u64 = ELECTION_MS.end;

/// Whether these metrics are of a leader a quorum acknowledged within [`LEASE_MS`].
fn acknowledged(m: &RaftMetrics<u64, MasterNode>) -> bool {
    m.state == ServerState::Leader && m.millis_since_quorum_ack.is_some_and(|ms| ms < LEASE_MS)
}

/// The error of a call a member that does not lead cannot take. The service names the
/// leader to the caller (`x-locus-leader`).
pub(crate) fn not_leader() -> Error {
    Error::unavailable("this master does not lead its group")
}

impl Group {
    /// Starts this master's member over `ns`, its log in `dir` (and its snapshots in
    /// `dir/snapshots`), and its raft port. The founder (the first of its peers in sort
    /// order) starts a new group of itself, its namespace as it is (a new one, or a
    /// single master's), and adds the other peers in the background; a group of one
    /// waits until it leads and has applied its log. The others wait to be sent the log.
    pub(crate) async fn start(ns: Arc<Namespace>, dir: &Path, setup: Setup) -> Result<Group> {
        let Setup { node, peers, secret, tls } = setup;
        let id = net::node_id(&node.raft_address);
        let listener = tokio::net::TcpListener::bind(&node.raft_address)
            .await
            .map_err(|e| Error::io(format!("bind the raft address {}", node.raft_address), e))?;
        let (d1, d2) = (dir.to_path_buf(), dir.join("snapshots"));
        let ns2 = ns.clone();
        let open =
            move || -> Result<(LogStore, StateMachine)> { Ok((LogStore::open(&d1)?, StateMachine::open(ns2, d2)?)) };
        let (log, sm) = tokio::task::spawn_blocking(open).await.map_err(|e| fatal("open", e))??;
        let dirty = sm.dirty();
        let config = openraft::Config {
            cluster_name: "locus".into(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_MS.start,
            election_timeout_max: ELECTION_MS.end,
            install_snapshot_timeout: 10_000,
            max_payload_entries: 64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(50_000),
            ..Default::default()
        }
        .validate()
        .map_err(|e| fatal("config", e))?;
        let verifier = Verifier::new(&secret);
        let network = Peers { own: node.raft_address.clone(), verifier: verifier.clone(), tls: tls.clone() };
        let raft = Raft::new(id, Arc::new(config), network, log, sm).await.map_err(|e| fatal("start", e))?;
        let (stop, stopped) = watch::channel(false);
        let mut s = stopped.clone();
        let port_verifier = Verifier::issuing(&secret, &format!("raft {}", node.raft_address));
        let serve = net::serve(raft.clone(), id, node.clone(), port_verifier, tls.clone(), listener, async move {
            let _ = s.wait_for(|v| *v).await;
        });
        tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "the master's raft port stopped");
            }
        });
        let mut founders: Vec<&str> = peers.iter().map(String::as_str).chain([node.raft_address.as_str()]).collect();
        founders.sort_unstable();
        founders.dedup();
        let founder = founders[0] == node.raft_address;
        let (tx, rx) = mpsc::unbounded_channel();
        let group = Group {
            raft: raft.clone(),
            id,
            tx,
            ns: ns.clone(),
            verifier,
            tls,
            ready: AtomicU64::new(0),
            elected_ms: Default::default(),
            barrier: Default::default(),
            barriers_begun: AtomicU64::new(0),
            last_barrier: parking_lot::Mutex::new((0, None)),
            stop,
        };
        let others: Vec<String> = founders[1..].iter().map(|s| s.to_string()).collect();
        if let Err(e) = group.found(founder, &node, &others).await {
            // Its tasks hold both databases open: a start that failed closes them.
            group.shutdown().await;
            return Err(e);
        }
        tokio::spawn(propose(raft.clone(), rx));
        tokio::spawn(flusher(ns, dirty, stopped.clone()));
        if founder && !others.is_empty() {
            tokio::spawn(add_founding_peers(group.handle(), others, dir.to_path_buf(), stopped));
        }
        Ok(group)
    }

    /// A founder's group begins with itself, unless a peer is in a group already (a new
    /// master joining one, to be added with `locus admin masters add`); a group of one
    /// (new, or restarted) waits to lead and apply its log.
    async fn found(&self, founder: bool, node: &MasterNode, others: &[String]) -> Result<()> {
        let initialized = self.raft.is_initialized().await.map_err(|e| fatal("start", e))?;
        let mut joins = false;
        if founder && !initialized {
            for p in others {
                if let Ok((_, _, _, true)) = net::describe(p, &self.verifier, &self.tls).await {
                    tracing::info!(peer = %p, "a peer is in a group already: this master waits to be added to it");
                    joins = true;
                    break;
                }
            }
        }
        let founds = founder && !initialized && !joins;
        if founds {
            let me = BTreeMap::from([(self.id, node.clone())]);
            self.raft.initialize(me).await.map_err(|e| fatal("initialize", e))?;
        }
        // (Right after `initialize` the metrics may not show the membership yet.)
        if !founds && self.voters() != BTreeSet::from([self.id]) {
            return Ok(());
        }
        let wait = self.raft.wait(Some(START_WAIT));
        wait.state(ServerState::Leader, "lead").await.map_err(|e| fatal("become leader", e))?;
        let last = self.raft.metrics().borrow().last_log_index;
        self.raft.wait(Some(START_WAIT)).applied_index_at_least(last, "apply").await.map_err(|e| fatal("apply", e))?;
        Ok(())
    }

    fn handle(&self) -> Handle {
        Handle { raft: self.raft.clone(), verifier: self.verifier.clone(), tls: self.tls.clone() }
    }

    /// The voters of the group's membership as this member knows it.
    pub(crate) fn voters(&self) -> BTreeSet<u64> {
        self.raft.metrics().borrow().membership_config.membership().voter_ids().collect()
    }

    /// openraft's view of this member: its state, term, log and the group's members.
    pub(crate) fn metrics(&self) -> watch::Receiver<RaftMetrics<u64, MasterNode>> {
        self.raft.metrics()
    }

    /// Whether this member leads and its master took over in this term: only then does
    /// the master take calls.
    pub(crate) fn leads(&self) -> bool {
        self.leading_term().is_some()
    }

    /// The term this member was elected leader in (taken over or not), while a quorum
    /// acknowledges it ([`acknowledged`]); `None` otherwise.
    pub(crate) fn elected_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        acknowledged(&m).then_some(m.current_term)
    }

    /// The term this member leads in, once its master took over in it and while a
    /// quorum acknowledges it; `None` otherwise.
    pub(crate) fn leading_term(&self) -> Option<u64> {
        let term = self.ready.load(Ordering::Acquire);
        let m = self.raft.metrics();
        let m = m.borrow();
        (acknowledged(&m) && m.current_term == term).then_some(term)
    }

    /// Whether the master took over as leader in `term`.
    pub(crate) fn took_over_in(&self, term: u64) -> bool {
        self.ready.load(Ordering::Acquire) == term
    }

    /// Records that the master took over as leader in `term`.
    pub(crate) fn ready_in(&self, term: u64) {
        self.elected_ms.store(locus_common::now_ms(), Ordering::Release);
        self.ready.store(term, Ordering::Release);
    }

    /// The group as this member sees it: each member's place in the log against this
    /// one's (only a leader knows the others').
    pub(crate) fn status(&self) -> pb::MasterGroupStatus {
        let m = self.raft.metrics().borrow().clone();
        let last = m.last_log_index.unwrap_or_default();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let matched = |id: &u64| -> u64 {
            if *id == m.id {
                return last;
            }
            let r = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten());
            r.map(|l| l.index).unwrap_or_default()
        };
        let masters = membership
            .nodes()
            .map(|(id, n)| pb::MasterStatus {
                id: *id,
                raft_address: n.raft_address.clone(),
                rpc_address: n.rpc_address.clone(),
                voter: voters.contains(id),
                leader: m.current_leader == Some(*id),
                matched_index: matched(id),
                lag: last.saturating_sub(matched(id)),
            })
            .collect();
        pb::MasterGroupStatus {
            term: m.current_term,
            last_log_index: last,
            applied_index: m.last_applied.map(|l| l.index).unwrap_or_default(),
            elected_ms: self.elected_ms.load(Ordering::Acquire),
            masters,
        }
    }

    /// The RPC address of the leader, as this member knows it: "" mid-election, and when
    /// this member thinks it leads but no quorum acknowledges it (cut off, its callers
    /// look for the leader among the others).
    pub(crate) fn leader_rpc_address(&self) -> String {
        let m = self.raft.metrics();
        let m = m.borrow();
        let Some(l) = m.current_leader.filter(|l| *l != m.id) else { return String::new() };
        m.membership_config.membership().get_node(&l).map(|n| n.rpc_address.clone()).unwrap_or_default()
    }

    /// Returns once every change acknowledged before the call is applied here, and this
    /// member still led when the call began (a quorum answered its heartbeat since): what
    /// a linearizable read waits for. Calls that arrive while one barrier runs share the
    /// next.
    pub(crate) async fn read_barrier(&self) -> Result<()> {
        if !self.leads() {
            return Err(not_leader());
        }
        self.read_barrier_unready().await
    }

    /// [`Group::read_barrier`] for a leader that has not taken over yet.
    pub(crate) async fn read_barrier_unready(&self) -> Result<()> {
        if self.voters().len() <= 1 {
            let leads = self.raft.metrics().borrow().state == ServerState::Leader;
            return if leads { Ok(()) } else { Err(not_leader()) };
        }
        let arrived = self.barriers_begun.load(Ordering::Acquire);
        let _one = self.barrier.lock().await;
        {
            let last = self.last_barrier.lock();
            if last.0 > arrived {
                return match &last.1 {
                    None => Ok(()),
                    Some((kind, msg)) => Err(Error::new(*kind, msg.clone())),
                };
            }
        }
        let n = self.barriers_begun.fetch_add(1, Ordering::AcqRel) + 1;
        let r = match self.raft.ensure_linearizable().await {
            Ok(_) => None,
            Err(RaftError::APIError(_)) => Some(not_leader()),
            Err(e) => Some(fatal("read barrier", e)),
        };
        *self.last_barrier.lock() = (n, r.as_ref().map(|e| (e.kind(), e.message().to_string())));
        match r {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Adds the master at raft address `address` to the group (`locus admin masters
    /// add`): as a learner until it has the log, then as a voter.
    pub(crate) async fn add_member(&self, address: &str) -> Result<()> {
        self.handle().add_member(address).await
    }

    /// Removes the member at raft address `address` from the group.
    pub(crate) async fn remove_member(&self, address: &str) -> Result<()> {
        let id = net::node_id(address);
        if !self.voters().contains(&id) {
            return Err(Error::not_found(format!("{address} is no master of this group")));
        }
        let r = self.raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await;
        r.map(drop).map_err(write_err)
    }

    /// Puts `cmd` in the log's order now; the future answers once it is applied.
    pub(crate) fn submit(
        &self,
        cmd: pb::Command,
    ) -> Result<impl std::future::Future<Output = Result<(pb::CommandResult, Effects)>> + use<>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((cmd, reply)).map_err(|_| Error::unavailable("the master's replicated log has stopped"))?;
        Ok(async move {
            // (It may yet be made: the entry may be in the log, applied at the next start.)
            let stopped =
                || Error::unavailable("the master's replicated log stopped: the change may or may not be made");
            rx.await.map_err(|_| stopped())?
        })
    }

    /// Stops the member (its log and state machine close, its raft port stops),
    /// everything applied on disk.
    pub(crate) async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        let _ = self.stop.send(true);
        let ns = self.ns.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || state::flush(&ns)).await {
            tracing::warn!(error = %e, "cannot flush the namespace at shutdown; the log applies it again at the next start");
        }
    }
}

/// What the founder's task and membership changes need of the member.
struct Handle {
    raft: Raft<Locus>,
    verifier: Verifier,
    tls: Tls,
}

impl Handle {
    async fn add_member(&self, address: &str) -> Result<()> {
        let described = net::describe(address, &self.verifier, &self.tls).await;
        let (_, id, node, _) = described.map_err(|e| {
            let why = format!(
                "cannot add {address}: {e} (start that master first, with --raft-address {address} and --peers \
                 naming this group)"
            );
            Error::new(ErrorKind::FailedPrecondition, why)
        })?;
        self.purge_once().await?;
        self.raft.add_learner(id, node, true).await.map_err(write_err)?;
        let r = self.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await;
        r.map(drop).map_err(write_err)
    }

    /// Before the first member is added: the log's first entries do not hold what the
    /// namespace held before the group began (a single master's metadata, the new
    /// namespace's root), so a new member must begin from a snapshot. One is made, and
    /// the log before it purged, once.
    async fn purge_once(&self) -> Result<()> {
        if self.raft.metrics().borrow().purged.is_some() {
            return Ok(());
        }
        let applied = self.raft.metrics().borrow().last_applied;
        let Some(applied) = applied else { return Ok(()) };
        self.raft.trigger().snapshot().await.map_err(|e| fatal("snapshot", e))?;
        let wait = self.raft.wait(Some(START_WAIT));
        let made = |m: &RaftMetrics<u64, MasterNode>| m.snapshot.is_some_and(|s| s.index >= applied.index);
        wait.metrics(made, "snapshot before the first member joins").await.map_err(|e| fatal("snapshot", e))?;
        let snap = self.raft.metrics().borrow().snapshot;
        let Some(snap) = snap else { return Err(fatal("snapshot", "none was made")) };
        self.raft.trigger().purge_log(snap.index).await.map_err(|e| fatal("purge", e))?;
        let wait = self.raft.wait(Some(START_WAIT));
        wait.purged(Some(snap), "purge before the first member joins").await.map_err(|e| fatal("purge", e))?;
        Ok(())
    }
}

/// The founder adds its founding peers, each as soon as it answers, and then leaves a
/// mark (`founded` in `dir`): from then on `locus admin masters` alone changes members,
/// and a restart with the same `--peers` does not add back one removed since.
async fn add_founding_peers(h: Handle, peers: Vec<String>, dir: std::path::PathBuf, mut stop: watch::Receiver<bool>) {
    let mark = dir.join("founded");
    if mark.exists() {
        return;
    }
    let mut wait = Duration::from_millis(100);
    for p in peers {
        loop {
            let voters = h.raft.metrics().borrow().membership_config.membership().voter_ids().collect::<BTreeSet<_>>();
            if voters.contains(&net::node_id(&p)) {
                break;
            }
            match h.add_member(&p).await {
                Ok(()) => {
                    tracing::info!(peer = %p, "added a founding member to the master group");
                    break;
                }
                Err(e) => tracing::info!(peer = %p, error = %e, "cannot add a founding member yet; trying again"),
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }
    if let Err(e) = std::fs::write(&mark, b"") {
        tracing::warn!(error = %e, "cannot mark the master group founded");
    }
}

/// openraft's answer to a membership change as a Locus error.
fn write_err(e: RaftError<u64, ClientWriteError<u64, MasterNode>>) -> Error {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => not_leader(),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Error::new(locus_common::ErrorKind::FailedPrecondition, format!("cannot change the masters: {e}"))
        }
        e => fatal("change the masters", e),
    }
}

/// Packs the commands waiting into one entry each time, and hands each its result. At
/// most [`IN_FLIGHT`] entries are on their way at once: the commands that arrive
/// meanwhile wait to share the next one (each entry costs the log an fsync).
async fn propose(raft: Raft<Locus>, mut rx: mpsc::UnboundedReceiver<(pb::Command, Reply)>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let (cmds, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let answer = match raft.client_write_ff(pb::CommandBatch { cmds }).await {
            Ok(answer) => answer,
            Err(e) => {
                fail(replies, &e);
                continue;
            }
        };
        tokio::spawn(async move {
            let _slot = slot;
            match answer.await {
                Ok(Ok(done)) => {
                    for (reply, r) in replies.into_iter().zip(done.data.results) {
                        let _ = reply.send(r);
                    }
                }
                Ok(Err(ClientWriteError::ForwardToLeader(_))) => {
                    for reply in replies {
                        let _ = reply.send(Err(not_leader()));
                    }
                }
                Ok(Err(e)) => fail(replies, &e),
                Err(e) => fail(replies, &e),
            }
        });
    }
}

/// Each second, makes what was applied since durable ([`state::flush`]), until `stop`.
async fn flusher(ns: Arc<Namespace>, dirty: Arc<AtomicBool>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        if dirty.swap(false, Ordering::AcqRel) {
            let ns = ns.clone();
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || state::flush(&ns)).await {
                tracing::warn!(error = %e, "cannot flush the namespace; the log applies it again at the next start");
            }
        }
    }
}

fn fail(replies: Vec<Reply>, e: &dyn std::fmt::Display) {
    for reply in replies {
        let msg = format!("the master's replicated log: {e}: the change may or may not be made");
        let _ = reply.send(Err(Error::unavailable(msg)));
    }
}
