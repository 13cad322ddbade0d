//! Leadership in a master group: a master takes calls, and runs its persists,
//! replication and reaping, only while it leads its group and has taken over (its
//! in-memory state rebuilt from the namespace it was sent); reads wait for a read
//! barrier; and the group's members change through the leader (`locus admin masters`).
//! A master without a group always leads.

use std::time::Duration;

use locus_common::Result;
use locus_common::job::Job;
use locus_proto::pb;
use openraft::ServerState;

use crate::Master;

/// How often the watch on leadership looks, besides each change openraft reports.
const LOOK_EVERY: Duration = Duration::from_millis(500);

impl Master {
    /// Whether this master takes calls and runs the group's jobs now.
    pub(crate) fn leads(&self) -> bool {
        self.inner.group.as_ref().is_none_or(|g| g.leads())
    }

    /// The leader's RPC address when this master does not lead ("" when it knows none,
    /// as mid-election); `None` when it leads.
    pub(crate) fn leader_elsewhere(&self) -> Option<String> {
        let g = self.inner.group.as_ref()?;
        (!g.leads()).then(|| g.leader_rpc_address())
    }

    /// The term this master was elected in, as its answers to workers carry it (taking
    /// over, it answers their registrations): 0 without a group, and when it does not
    /// lead (the worker refuses the answer and goes to another master).
    pub(crate) fn term(&self) -> u64 {
        self.inner.group.as_ref().and_then(|g| g.elected_term()).unwrap_or(0)
    }

    /// The term an order to a worker (persist, replicate) is sent in: 0 without a group;
    /// in one, the term this master leads in, once a read barrier shows that it still
    /// leads (a deposed or paused leader learns here that it no longer does). The worker
    /// refuses the order when it has heard of a later term meanwhile.
    pub(crate) async fn order_term(&self) -> Result<u64> {
        let Some(g) = &self.inner.group else { return Ok(0) };
        let term = g.leading_term().ok_or_else(crate::raft::not_leader)?;
        g.read_barrier().await?;
        match g.leading_term() {
            Some(t) if t == term => Ok(term),
            _ => Err(crate::raft::not_leader()),
        }
    }

    /// Waits until a read made now sees every change acknowledged before it
    /// (linearizable), and fails when this master has been deposed meanwhile.
    pub(crate) async fn read_barrier(&self) -> Result<()> {
        match &self.inner.group {
            Some(g) => g.read_barrier().await,
            None => Ok(()),
        }
    }

    /// Takes over as leader if this master leads its group now: rebuilds what it keeps in
    /// memory from the namespace (mounts, the persist queue; the UFS paths found missing
    /// are forgotten), then takes calls. The workers and their blocks it knows already:
    /// they mirror their reports to every member (`Master::register_mirror`). Returns
    /// whether it leads.
    pub(crate) async fn take_over_now(&self) -> Result<bool> {
        match self.take_over(false).await {
            // A member restarted as the leader of its last term learns here that the
            // group went on without it: it follows, and takes over when elected.
            Err(e) if self.inner.group.is_some() && e.kind() == locus_common::ErrorKind::Unavailable => {
                tracing::info!(error = %e, "this master does not lead its group now");
                Ok(false)
            }
            r => r,
        }
    }

    /// [`Master::take_over_now`]; with `wait_workers`, calls wait (for up to
    /// `master.worker_timeout`) until every worker the namespace records is registered
    /// here with its block report (at once for those that mirrored their reports), so
    /// the new leader places writes and finds copies as the old one did.
    async fn take_over(&self, wait_workers: bool) -> Result<bool> {
        let term = match &self.inner.group {
            None => None,
            Some(g) => {
                let m = g.metrics().borrow().clone();
                if m.state != ServerState::Leader {
                    return Ok(false);
                }
                // Every change of earlier terms is applied here first.
                g.read_barrier_unready().await?;
                Some(m.current_term)
            }
        };
        self.inner.workers.clear_orders();
        self.load_mounts()?;
        {
            let mut t = self.inner.persist.lock();
            t.pending.clear();
            t.retry.clear();
        }
        self.load_persist_queue()?;
        self.inner.absent.forget();
        if wait_workers {
            self.await_recorded_workers().await?;
        }
        if let (Some(g), Some(term)) = (&self.inner.group, term) {
            g.ready_in(term);
            tracing::info!(term, "this master leads its group");
        }
        self.date_undated_buckets().await?;
        Ok(true)
    }

    /// Waits until every worker the namespace records is registered, or for
    /// `master.worker_timeout` (a worker that is gone does not hold the take-over up).
    async fn await_recorded_workers(&self) -> Result<()> {
        let known: Vec<u64> = {
            use redb::ReadableTable;
            let r = self.ns().read()?;
            let t = r.open_table(crate::store::WORKERS).map_err(crate::store::db_err)?;
            let mut v = Vec::new();
            for e in t.iter().map_err(crate::store::db_err)? {
                v.push(e.map_err(crate::store::db_err)?.0.value());
            }
            v
        };
        let deadline = std::time::Instant::now() + self.inner.cfg.worker_timeout;
        while std::time::Instant::now() < deadline {
            let live = self.inner.workers.live();
            if known.iter().all(|id| live.contains_key(id)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Whether this master was elected and is taking over: the workers' calls come in
    /// (they register again), no other.
    pub(crate) fn taking_over(&self) -> bool {
        self.inner.group.as_ref().is_some_and(|g| g.elected_term().is_some() && !g.leads())
    }

    /// Adds the master at raft address `address` to this master's group.
    pub(crate) async fn add_master(&self, address: &str) -> Result<pb::MasterGroupStatus> {
        self.group()?.add_member(address).await?;
        self.masters()
    }

    /// Removes the master at raft address `address` from this master's group.
    pub(crate) async fn remove_master(&self, address: &str) -> Result<pb::MasterGroupStatus> {
        self.group()?.remove_member(address).await?;
        self.masters()
    }

    /// The group's members as this master knows them.
    pub(crate) fn masters(&self) -> Result<pb::MasterGroupStatus> {
        Ok(self.group()?.status())
    }

    fn group(&self) -> Result<&crate::raft::Group> {
        self.inner.group.as_ref().ok_or_else(|| {
            locus_common::Error::new(
                locus_common::ErrorKind::FailedPrecondition,
                "this master runs without a group: start it with --raft-address to add masters",
            )
        })
    }
}

/// Watches this master's leadership: when it is elected, it takes over.
pub(crate) fn start(master: Master) -> Job {
    Job::spawn_loop("master.leading", move |mut stop, _status| async move {
        let Some(mut metrics) = master.inner.group.as_ref().map(|g| g.metrics()) else { return };
        loop {
            // A leader takes over once a term (a lapse of its quorum's acknowledgement
            // within the term does not make it take over again).
            let elected = {
                let m = metrics.borrow_and_update();
                (m.state == ServerState::Leader).then_some(m.current_term)
            };
            if let (Some(term), Some(g)) = (elected, &master.inner.group)
                && !g.took_over_in(term)
                && let Err(e) = master.take_over(true).await
            {
                tracing::warn!(error = %e, "cannot take over as the group's leader yet");
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = metrics.changed() => {}
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    })
}
