//! This master's member of its group: the openraft node over its log and its namespace,
//! and the proposer, which packs the commands proposed meanwhile into one entry (one
//! append, one fsync) in the order they were submitted, with several entries in flight.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use locus_common::{Error, Result};
use locus_proto::pb;
use openraft::{Raft, ServerState, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};

use super::log::LogStore;
use super::net::NoPeers;
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

/// How long a start waits to lead its group and apply its log.
const START_WAIT: Duration = Duration::from_secs(60);

/// This master's member of its group.
pub(crate) struct Group {
    raft: Raft<Locus>,
    tx: mpsc::UnboundedSender<(pb::Command, Reply)>,
    ns: Arc<Namespace>,
    /// Ends the flusher.
    stop: tokio::sync::watch::Sender<bool>,
}

fn fatal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("the master's replicated log: {what}: {e}"))
}

impl Group {
    /// Starts this master's member over `ns`, its log in `dir` (and its snapshots in
    /// `dir/snapshots`), and waits until it leads and has applied its whole log. A
    /// namespace that has no log yet (a master from before groups) is the first member's
    /// state as it is.
    pub(crate) async fn start(ns: Arc<Namespace>, dir: &Path, node: MasterNode) -> Result<Group> {
        let (d1, d2) = (dir.to_path_buf(), dir.join("snapshots"));
        let ns2 = ns.clone();
        let open =
            move || -> Result<(LogStore, StateMachine)> { Ok((LogStore::open(&d1)?, StateMachine::open(ns2, d2)?)) };
        let (log, sm) = tokio::task::spawn_blocking(open).await.map_err(|e| fatal("open", e))??;
        let dirty = sm.dirty();
        let config = openraft::Config {
            cluster_name: "locus".into(),
            heartbeat_interval: 100,
            election_timeout_min: 500,
            election_timeout_max: 1000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(50_000),
            ..Default::default()
        }
        .validate()
        .map_err(|e| fatal("config", e))?;
        let raft = Raft::new(1, Arc::new(config), NoPeers, log, sm).await.map_err(|e| fatal("start", e))?;
        if let Err(e) = lead(&raft, node).await {
            // Its tasks hold both databases open: a start that failed closes them.
            let _ = raft.shutdown().await;
            return Err(e);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(propose(raft.clone(), rx));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(flusher(ns.clone(), dirty, stopped));
        Ok(Group { raft, tx, ns, stop })
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

    /// Stops the member (its log and state machine close), everything applied on disk.
    pub(crate) async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        let _ = self.stop.send(true);
        let ns = self.ns.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || state::flush(&ns)).await {
            tracing::warn!(error = %e, "cannot flush the namespace at shutdown; the log applies it again at the next start");
        }
    }
}

/// Initializes a new member's group (of itself), and waits until it leads and has
/// applied its whole log.
async fn lead(raft: &Raft<Locus>, node: MasterNode) -> Result<()> {
    if !raft.is_initialized().await.map_err(|e| fatal("start", e))? {
        raft.initialize(BTreeMap::from([(1, node)])).await.map_err(|e| fatal("initialize", e))?;
    }
    let wait = raft.wait(Some(START_WAIT));
    wait.state(ServerState::Leader, "lead").await.map_err(|e| fatal("become leader", e))?;
    let last = raft.metrics().borrow().last_log_index;
    raft.wait(Some(START_WAIT)).applied_index_at_least(last, "apply").await.map_err(|e| fatal("apply", e))?;
    Ok(())
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
                Ok(Err(e)) => fail(replies, &e),
                Err(e) => fail(replies, &e),
            }
        });
    }
}

/// Each second, makes what was applied since durable ([`state::flush`]), until `stop`.
async fn flusher(ns: Arc<Namespace>, dirty: Arc<AtomicBool>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
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
