//! Keeping the master informed: registration with the full block report, heartbeats
//! (usage, counters, pins, removals) and block commits.

use std::sync::atomic::Ordering::Relaxed;

use locus_blockstore::Change;
use locus_common::config::TierAlias;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::{from_status, pb};

use crate::Inner;

impl Inner {
    fn tier_usage(&self) -> Vec<pb::TierUsage> {
        self.store
            .usage()
            .into_iter()
            .map(|u| pb::TierUsage {
                alias: pb::Tier::from(u.alias).into(),
                capacity: u.capacity,
                used: u.used,
                blocks: u.blocks,
                pooled: u.pooled,
                ..Default::default()
            })
            .collect()
    }

    /// [`Inner::tier_usage`] with the free space of each tier's file system (statvfs, on
    /// a blocking thread: a tier may sit on a slow or hung mount).
    async fn tier_usage_with_space(&self) -> Vec<pb::TierUsage> {
        let dirs: Vec<_> = self.cfg.tiers.iter().map(|t| (t.alias, t.dir.clone())).collect();
        let free = crate::blocking(move || {
            dirs.into_iter().filter_map(|(a, d)| fs_available(&d).map(|f| (a, f))).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut v = self.tier_usage();
        for t in &mut v {
            if let Some((_, f)) = free.iter().find(|(a, _)| pb::Tier::from(*a) == t.alias()) {
                t.fs_available = *f;
                t.fs_known = true;
            }
        }
        v
    }

    /// Register with the master and send the full block report. Blocks written under
    /// another cluster (a master whose namespace is gone: their ids name other data now)
    /// are dropped first, when the master says so, before anything can read or write them.
    ///
    /// One at a time with the block commits ([`Inner::commit_changes`]), as they are
    /// the same account: a report the master took after a commit of later changes (or
    /// after another, newer report) would replace what it knew with older blocks.
    async fn register(&self) -> Result<()> {
        let _one_at_a_time = self.committing.lock().await;
        self.register_committing().await
    }

    /// [`Inner::register`], the commit lock held by the caller.
    async fn register_committing(&self) -> Result<()> {
        for _ in 0..2 {
            // The report takes the changes it covers in the same step: a block stored
            // after it is a change for the next commit. (The report, then the drain: a
            // block stored in between was in neither, and the master never learned of it.)
            let mut req = self.registration(self.store.report_and_drain()).await?;
            let cluster_id = req.cluster_id;
            locus_common::delay_point("worker.register.reported").await;
            let resp = self.call(|mut m| {
                let req = req.clone();
                async move { m.register_worker(req).await }
            });
            let resp = resp.await.map_err(from_status)?;
            if resp.cluster_id == 0 {
                return Err(Error::internal("the master named no cluster id"));
            }
            if resp.cluster_id != cluster_id {
                // Another cluster's group counts its own terms.
                let fence = self.fence.clone();
                crate::blocking(move || fence.forget()).await??;
            }
            self.admit_answer(resp.term).await?;
            let dropped = self.store_blocking(move |s| s.adopt_cluster(resp.cluster_id)).await?;
            if resp.worker_id == 0 {
                tracing::warn!(dropped, cluster = resp.cluster_id, "dropped the blocks of another cluster");
                continue; // the next full report covers the removals
            }
            self.id.store(resp.worker_id, Relaxed);
            let id_file = self.cfg.data_dir.join("worker_id");
            let _ = crate::blocking(move || std::fs::write(id_file, resp.worker_id.to_string())).await;
            self.registrations.fetch_add(1, Relaxed);
            (req.worker_id, req.cluster_id) = (resp.worker_id, resp.cluster_id);
            self.mirror_registration(&self.masters.current().1, req).await;
            return Ok(());
        }
        Err(Error::unavailable("the master refused this worker's block report twice"))
    }

    /// The registration of this worker with the block report `blocks` (its current id,
    /// address, tiers and cluster).
    pub(crate) async fn registration(&self, blocks: Vec<(u64, TierAlias, u64)>) -> Result<pb::RegisterWorkerRequest> {
        let cluster_id = self.store_blocking(|s| Ok(s.cluster_id())).await?;
        let blocks = blocks
            .into_iter()
            .map(|(id, t, len)| pb::BlockReport { block_id: id, tier: pb::Tier::from(t).into(), length: len })
            .collect();
        Ok(pb::RegisterWorkerRequest {
            worker_id: self.id.load(Relaxed),
            address: Some(pb::WorkerAddress {
                worker_id: 0,
                host: self.cfg.host.clone(),
                data_address: self.data_address.clone(),
                uds_path: self.uds_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            }),
            tiers: self.tier_usage(),
            blocks,
            cluster_id,
        })
    }

    /// Takes the term of an answer from the master calls go to; one from a deposed
    /// leader is refused, and calls go to the next master.
    async fn admit_answer(&self, term: u64) -> Result<()> {
        let r = self.fence.admit(term).await;
        if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::FailedPrecondition) {
            self.masters.follow(self.masters.current().0, "");
        }
        r
    }

    /// The pin epoch this worker holds (`u64::MAX`: it must register again); a waiter for
    /// its registration checks again.
    fn set_pin_epoch(&self, epoch: u64) {
        self.pin_epoch.store(epoch, Relaxed);
        self.registered.notify_waiters();
    }

    pub(crate) async fn heartbeat(&self) -> Result<()> {
        if self.id.load(Relaxed) == 0 || self.pin_epoch.load(Relaxed) == u64::MAX {
            self.register().await?;
            self.set_pin_epoch(0);
        }
        self.commit_changes().await?;
        self.store_blocking(|s| {
            s.expire_retired();
            Ok(s.trim_file_pool())
        })
        .await?;
        let req = self.beat().await;
        // The mirror job sends the other members this same heartbeat.
        *self.last_beat.lock() = Some(req.clone());
        let resp = self.call(|mut m| {
            let req = req.clone();
            async move { m.worker_heartbeat(req).await }
        });
        let resp = resp.await.map_err(from_status)?;
        // A deposed leader's removals and pins are not acted on.
        self.admit_answer(resp.term).await?;
        if resp.reregister {
            self.register().await?;
            return Ok(());
        }
        if resp.pins_changed {
            self.store.set_pinned_versions(resp.pinned_versions.into_iter().collect(), resp.pin_epoch);
            self.set_pin_epoch(resp.pin_epoch);
        }
        let (removed, retired, grace) = (resp.remove_blocks, resp.retire_blocks, self.cfg.stale_block_grace);
        self.store_blocking(move |s| {
            removed.into_iter().try_for_each(|b| s.remove(b).map(drop))?;
            retired.into_iter().try_for_each(|b| s.retire(b, grace).map(drop))
        })
        .await?;
        if !self.in_step(&self.masters.current().1) {
            // Calls moved to a member that lacks some of this worker's blocks.
            return self.register().await;
        }
        self.commit_changes().await
    }

    /// This worker's heartbeat: usage, counters, jobs, the reads by host.
    async fn beat(&self) -> pb::HeartbeatRequest {
        let c = &self.counters;
        pb::HeartbeatRequest {
            worker_id: self.id.load(Relaxed),
            tiers: self.tier_usage_with_space().await,
            counters: Some(pb::ReadCounters {
                short_circuit: c.short_circuit.load(Relaxed),
                local_worker: c.local_worker.load(Relaxed),
                remote_worker: c.remote_worker.load(Relaxed),
                ufs: c.ufs.load(Relaxed),
                cache_hits: c.cache_hits.load(Relaxed),
                cache_misses: c.cache_misses.load(Relaxed),
                evictions: self.store.evictions(),
                corrupt_blocks: self.store.corrupt_blocks() + c.corrupt.load(Relaxed),
                compute_scanned: c.compute_scanned.load(Relaxed),
                compute_returned: c.compute_returned.load(Relaxed),
                written_short_circuit: c.written_short_circuit.load(Relaxed),
                written_data_path: c.written_data_path.load(Relaxed),
            }),
            pin_epoch: self.pin_epoch.load(Relaxed),
            jobs: self.jobs.lock().iter().map(|j| j.status().into()).collect(),
            host_reads: c.host_reads(),
            clock_ms: locus_common::now_ms(),
            open_files_limit: locus_common::open_files_limit(),
            boot_id: self.boot_id,
        }
    }

    /// Send block additions and removals to the master. Returns once every change made
    /// before the call is known to the master (or its commit failed): commits are sent
    /// one at a time, so a call whose changes an earlier call took waits for that one.
    pub(crate) async fn commit_changes(&self) -> Result<()> {
        let _one_at_a_time = self.committing.lock().await;
        let changes = self.store.drain_changes();
        if changes.is_empty() || self.id.load(Relaxed) == 0 {
            return Ok(());
        }
        locus_common::delay_point("worker.commit_changes.drained").await;
        let mut req = pb::CommitBlocksRequest { worker_id: self.id.load(Relaxed), ..Default::default() };
        for c in changes {
            match c {
                Change::Stored { block_id, tier, len } => {
                    req.added.push(pb::BlockReport { block_id, tier: pb::Tier::from(tier).into(), length: len })
                }
                Change::Removed { block_id } => req.removed.push(block_id),
            }
        }
        let committed = self.call(|mut m| {
            let req = req.clone();
            async move { m.commit_blocks(req).await }
        });
        let s = match committed.await {
            Ok(_) => {
                self.mirror_commit(&req).await;
                return Ok(());
            }
            Err(s) => s,
        };
        // The master lost track of us: the next heartbeat re-registers with a full report.
        self.set_pin_epoch(u64::MAX);
        let e = from_status(s);
        if e.kind() == ErrorKind::FailedPrecondition {
            // A master that restarted and has not heard from this worker yet: register
            // now (a write waiting on this commit goes on); the full block report
            // carries the blocks this commit named.
            self.register_committing().await?;
            self.set_pin_epoch(0);
            return Ok(());
        }
        Err(e)
    }
}

/// Bytes free to unprivileged users on the file system holding `dir`.
fn fs_available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data, for which all zeroes is a valid value; `c` is a
    // NUL-terminated path and `st` the struct for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}
