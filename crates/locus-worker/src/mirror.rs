//! Mirroring to a master group: the worker's registration, heartbeats and block commits
//! go to the leader, and a copy of each (`MIRROR_KEY`) to every other member, which
//! records the worker and its blocks and gives no orders. An elected member then knows
//! every worker and block location at once: no re-registration storm after a failover.
//!
//! Each member is in step with this worker or not. A member is in step once it took a
//! full report, and stays so while it takes every commit after it (sent under the same
//! lock as the leader's, so in the same order). A member that misses one (gone, slow,
//! refused) is out of step until the mirror job has sent it a full report again; calls
//! that move to an out-of-step leader register with it first.

use std::time::Duration;

use futures::future::join_all;
use locus_proto::auth::AuthedMasterClient;
use locus_proto::pb;

use crate::Inner;

/// How long a mirrored heartbeat or commit may take: a member that is slow or gone
/// costs a write this once, then is out of step.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a mirrored full report may take (sent once the member answered a
/// heartbeat).
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// `msg` as a mirrored call's request.
fn mirrored<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(locus_proto::MIRROR_KEY, tonic::metadata::MetadataValue::from_static("1"));
    r
}

impl Inner {
    /// Whether the master at `addr` took every change of this worker's blocks.
    pub(crate) fn in_step(&self, addr: &str) -> bool {
        self.in_step.lock().get(addr).copied().unwrap_or(false)
    }

    fn set_in_step(&self, addr: &str, yes: bool) {
        self.in_step.lock().insert(addr.to_string(), yes);
    }

    /// After a full report to the leader at `leader` (`req`, with the id it gave): only
    /// it is in step; the same report goes to the other members. The caller holds the
    /// commit lock.
    pub(crate) async fn mirror_registration(&self, leader: &str, req: pb::RegisterWorkerRequest) {
        self.in_step.lock().clear();
        self.set_in_step(leader, true);
        let sent = self.masters.others().into_iter().map(|(addr, mut m)| {
            let req = mirrored(req.clone());
            async move {
                // Short: the commit lock is held (a member that misses it gets the report
                // from the mirror job, once it answers).
                let r = tokio::time::timeout(MIRROR_TIMEOUT, m.register_worker(req)).await;
                (r, addr)
            }
        });
        for (r, addr) in join_all(sent).await {
            let ok = matches!(r, Ok(Ok(_)));
            if !ok {
                tracing::debug!(master = %addr, "a member of the group did not take this worker's report yet");
            }
            self.set_in_step(&addr, ok);
        }
    }

    /// After the leader took `req`: the same commit to every member in step; one that
    /// does not take it is out of step. The caller holds the commit lock.
    pub(crate) async fn mirror_commit(&self, req: &pb::CommitBlocksRequest) {
        let sent = self.masters.others().into_iter().filter(|(a, _)| self.in_step(a)).map(|(addr, mut m)| {
            let req = mirrored(req.clone());
            async move {
                let r = tokio::time::timeout(MIRROR_TIMEOUT, m.commit_blocks(req)).await;
                (r, addr)
            }
        });
        for (r, addr) in join_all(sent).await {
            if !matches!(r, Ok(Ok(_))) {
                self.set_in_step(&addr, false);
            }
        }
    }

    /// The mirror job's round: a heartbeat to every other member (so that it counts this
    /// worker live), and a full report to each that answers but is out of step.
    pub(crate) async fn mirror_round(&self, beat: pb::HeartbeatRequest) {
        if beat.worker_id == 0 {
            return;
        }
        let sent = self.masters.others().into_iter().map(|(addr, mut m)| {
            let req = mirrored(beat.clone());
            async move {
                let r = tokio::time::timeout(MIRROR_TIMEOUT, m.worker_heartbeat(req)).await;
                (r, addr, m)
            }
        });
        for (r, addr, m) in join_all(sent).await {
            match r {
                Ok(Ok(a)) if !a.get_ref().reregister && self.in_step(&addr) => {}
                // It answers, but lacks some of this worker's blocks.
                Ok(Ok(_)) => self.report_to(&addr, m).await,
                _ => self.set_in_step(&addr, false),
            }
        }
    }

    /// A full report to the member at `addr`, under the commit lock (no commit passes it).
    async fn report_to(&self, addr: &str, mut m: AuthedMasterClient) {
        let _one_at_a_time = self.committing.lock().await;
        let req = match self.registration(self.store.report()).await {
            Ok(r) => r,
            Err(e) => return tracing::debug!(error = %e, "cannot make a block report"),
        };
        let r = tokio::time::timeout(REPORT_TIMEOUT, m.register_worker(mirrored(req))).await;
        self.set_in_step(addr, matches!(r, Ok(Ok(_))));
    }
}
