//! The worker RPCs: registration with a full block report, heartbeats, block commits (the
//! registry they feed is `registry.rs`).

use std::collections::HashMap;

use locus_common::metrics::ReadSource;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};
use redb::{ReadableTable, WriteTransaction};

use crate::registry::WorkerState;
use crate::store::*;
use crate::*;

impl Master {
    pub(crate) fn live_workers(&self) -> HashMap<u64, ()> {
        self.inner.workers.live()
    }

    /// Wait (up to the worker timeout) until `done` holds for every live worker: checked
    /// at each heartbeat or registration, and when a worker that has not done it would
    /// time out (it no longer counts then).
    pub(crate) async fn await_workers(&self, done: impl Fn(u64, &WorkerState) -> bool) {
        self.inner.workers.wait_until(done).await;
    }

    /// This cluster's id (random, made with the namespace).
    pub fn cluster_id(&self) -> u64 {
        self.ns().cluster_id()
    }

    /// Register a worker and take its full block report. Returns its id, or 0 (nothing
    /// registered) when its blocks were written under another cluster: their ids name
    /// other data in this namespace, so none of them may be recorded; the worker drops
    /// them and registers again.
    pub async fn register_worker(&self, req: pb::RegisterWorkerRequest) -> Result<u64> {
        let addr = req.address.ok_or_else(|| Error::invalid("register without an address"))?;
        if req.cluster_id != 0 && req.cluster_id != self.cluster_id() {
            tracing::warn!(
                host = %addr.host, data = %addr.data_address, blocks = req.blocks.len(),
                "a worker holds blocks of another cluster; it must drop them before it registers"
            );
            return Ok(0);
        }
        let (worker_id, blocks) = (req.worker_id, req.blocks);
        let nblocks = blocks.len();
        let c = pb::RegisterWorker { worker_id, address: Some(addr.clone()) };
        let id = self.propose(Op::RegisterWorker(c)).await?.id;
        let addr = pb::WorkerAddress { worker_id: id, ..addr };
        // Its full block report replaces what this master knew of its blocks (soft state).
        let stale = self.commit_soft(move |_, w, _| replace_blocks(w, id, &blocks, false)).await?;
        self.inner.workers.register(addr.clone(), req.tiers, stale);
        tracing::info!(worker = id, host = %addr.host, data = %addr.data_address, blocks = nblocks, "worker registered");
        Ok(id)
    }

    /// A worker's registration copied to this member of its group (`MIRROR_KEY`; the
    /// member may not lead): its full block report replaces what this member knew of its
    /// blocks, so that, elected, the member knows every worker and every block location
    /// at once. The worker has its id from the leader already; a member the log has not
    /// brought that registration to yet refuses (the worker sends its report again).
    pub(crate) async fn register_mirror(&self, req: pb::RegisterWorkerRequest) -> Result<u64> {
        let addr = req.address.ok_or_else(|| Error::invalid("register without an address"))?;
        let id = req.worker_id;
        let known = id != 0 && req.cluster_id == self.cluster_id() && {
            let r = self.ns().read()?;
            r.open_table(WORKERS).map_err(db_err)?.get(id).map_err(db_err)?.is_some()
        };
        if !known {
            let msg = format!("worker {id} is not registered with this member of the group yet");
            return Err(Error::new(ErrorKind::FailedPrecondition, msg));
        }
        let blocks = req.blocks;
        self.commit_soft(move |_, w, _| replace_blocks(w, id, &blocks, true)).await?;
        self.inner.workers.register(pb::WorkerAddress { worker_id: id, ..addr }, req.tiers, Vec::new());
        Ok(id)
    }

    /// A worker's heartbeat: its usage and counters; the answer carries the blocks to
    /// remove and the pins. A `mirror` copy (to a member that may not lead) is answered
    /// with no orders.
    pub fn heartbeat(&self, req: pb::HeartbeatRequest, mirror: bool) -> Result<pb::HeartbeatResponse> {
        let mut resp = pb::HeartbeatResponse { term: self.term(), mirror, ..Default::default() };
        // Made before the registry's lock is taken (up to 4,096 rows).
        let rows = crate::reads::rows_of(&req.host_reads);
        let known = self.inner.workers.beat(req.worker_id, |s| {
            s.pin_epoch = req.pin_epoch;
            s.tiers = req.tiers;
            s.jobs = req.jobs;
            if let Some(c) = req.counters {
                let m = &self.inner.metrics;
                let old = s.counters;
                // A restarted worker starts its counters from zero again.
                let d = |new: u64, old: u64| if new >= old { new - old } else { new };
                for s in ReadSource::ALL {
                    m.bytes_read.with_label_values(&[s.as_str()]).inc_by(d(c.bytes(s), old.bytes(s)));
                }
                m.cache_requests.with_label_values(&["hit"]).inc_by(d(c.cache_hits, old.cache_hits));
                m.cache_requests.with_label_values(&["miss"]).inc_by(d(c.cache_misses, old.cache_misses));
                m.evictions.inc_by(d(c.evictions, old.evictions));
                m.corrupt_blocks.inc_by(d(c.corrupt_blocks, old.corrupt_blocks));
                m.compute_bytes.with_label_values(&["scanned"]).inc_by(d(c.compute_scanned, old.compute_scanned));
                m.compute_bytes.with_label_values(&["returned"]).inc_by(d(c.compute_returned, old.compute_returned));
                m.bytes_written
                    .with_label_values(&["short_circuit"])
                    .inc_by(d(c.written_short_circuit, old.written_short_circuit));
                m.bytes_written.with_label_values(&["data_path"]).inc_by(d(c.written_data_path, old.written_data_path));
                s.counters = c;
            }
            s.host_reads = Some(self.inner.reads.lock().record(s.host_reads.take(), req.boot_id, rows));
            if req.clock_ms != 0 {
                s.clock_skew_ms = req.clock_ms - locus_common::now_ms();
            }
            s.open_files_limit = req.open_files_limit;
            if !mirror {
                resp.remove_blocks = std::mem::take(&mut s.pending_remove);
                resp.retire_blocks = std::mem::take(&mut s.pending_retire);
            }
        });
        if known.is_none() {
            resp.reregister = true;
            return Ok(resp);
        }
        if mirror {
            return Ok(resp);
        }
        let r = self.ns().read()?;
        let epoch = get_counter(&r.open_table(COUNTERS).map_err(db_err)?, "pin_epoch")?;
        if epoch != req.pin_epoch {
            resp.pins_changed = true;
            resp.pin_epoch = epoch;
            for e in r.open_table(PINNED).map_err(db_err)?.iter().map_err(db_err)? {
                resp.pinned_versions.push(e.map_err(db_err)?.0.value());
            }
        }
        Ok(resp)
    }

    /// A worker's block changes since its last commit. A `mirror` copy (to a member that
    /// may not lead) records blocks of versions the namespace does not hold yet as well:
    /// the log may not have brought them to this member yet.
    pub async fn commit_blocks(&self, req: pb::CommitBlocksRequest, mirror: bool) -> Result<()> {
        if !self.inner.workers.is_registered(req.worker_id) {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!("worker {} is not registered", req.worker_id),
            ));
        }
        // Block locations are soft state: no fsync (see `Store::mutate_soft`).
        self.commit_soft(move |_, w, fx| {
            let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
            let versions = w.open_table(VERSIONS).map_err(db_err)?;
            for b in &req.added {
                let (v, _) = locus_common::split_block_id(b.block_id);
                if mirror || versions.get(v).map_err(db_err)?.is_some() {
                    wb.insert((req.worker_id, b.block_id), ()).map_err(db_err)?;
                    loc.insert((b.block_id, req.worker_id), StoredTier::from(b.tier())).map_err(db_err)?;
                } else {
                    // The file changed or went meanwhile (a reader of the old version may
                    // have filled it: it is kept for a while).
                    fx.retired.push((req.worker_id, b.block_id));
                }
            }
            for b in &req.removed {
                wb.remove((req.worker_id, *b)).map_err(db_err)?;
                loc.remove((*b, req.worker_id)).map_err(db_err)?;
            }
            Ok(())
        })
        .await
    }

    /// The blocks of worker `id` this master knows the location of (in a group, every
    /// member knows them: `register_mirror`).
    pub fn located_blocks(&self, id: u64) -> Result<Vec<u64>> {
        let r = self.ns().read()?;
        second_keys(&r.open_table(WORKER_BLOCKS).map_err(db_err)?, id)
    }

    pub fn workers(&self) -> Vec<pb::WorkerAddress> {
        self.inner.workers.live_addresses()
    }
}

/// Replaces what this master knows of worker `id`'s blocks with its full report `blocks`.
/// Returns the blocks of versions the namespace does not hold (not recorded), or, with
/// `keep_unknown` (a member the log may not have brought them to yet), records them too.
fn replace_blocks(w: &WriteTransaction, id: u64, blocks: &[pb::BlockReport], keep_unknown: bool) -> Result<Vec<u64>> {
    let mut stale = Vec::new();
    let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
    let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
    for b in second_keys(&wb, id)? {
        wb.remove((id, b)).map_err(db_err)?;
        loc.remove((b, id)).map_err(db_err)?;
    }
    let versions = w.open_table(VERSIONS).map_err(db_err)?;
    for b in blocks {
        let (v, _) = locus_common::split_block_id(b.block_id);
        if keep_unknown || versions.get(v).map_err(db_err)?.is_some() {
            wb.insert((id, b.block_id), ()).map_err(db_err)?;
            loc.insert((b.block_id, id), StoredTier::from(b.tier())).map_err(db_err)?;
        } else {
            stale.push(b.block_id);
        }
    }
    Ok(stale)
}
