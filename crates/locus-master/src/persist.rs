//! The persist queue: every UFS change Locus still owes (persists of written files, and
//! the mkdirs, deletes and renames queued behind them) is journaled in redb before the
//! change is acknowledged, and a scheduler job carries the queue out.
//!
//! Order: an operation runs only when no earlier operation on an overlapping path (the
//! same path, an ancestor or a descendant, in the same mount) is still pending, so
//! create → rename → delete of one path reach the UFS in that order, while unrelated
//! paths proceed in parallel (`master.persist_concurrency`). A synchronous UFS change
//! (a mkdir, delete or rename with nothing queued on its paths) registers itself while
//! it runs, so nothing queued later on those paths overtakes it. Failed operations are
//! retried with exponential backoff; a master restart reloads the queue and resumes.
//! A persist may carry an initial wait (`not_before_ms`, the S3 gateway's multipart
//! parts): it starts when the wait ends or as soon as a later operation on its path is
//! queued, and a file deleted by then is dropped without a UFS write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use locus_common::job::Job;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};
use locus_ufs::UfsStatus;
use redb::ReadableTable;

pub(crate) use crate::persist_tracker::*;
use crate::store::*;
use crate::{Master, MountEntry, now_ms};

/// Operations looked at per scheduling round (later ones wait for the next round). Those
/// given up, waiting out a backoff or an initial wait are not counted: they must not keep
/// unrelated operations behind them from starting.
const WINDOW: usize = 512;
/// Longest wait between retries of a failing operation.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
impl Master {
    /// For a rename of `src` to `dst` (paths under mount `mount_id`'s root) while queued
    /// changes overlap them: claim the persists, not running, of files at or below `src`
    /// (files written ASYNC_THROUGH and renamed before their persist, as an output
    /// committer does) so the rename can queue them again at their new paths, behind its
    /// own UFS rename. The bytes then reach the UFS once, at the path they end up at,
    /// instead of being written and then moved (a copy, over S3). Changes queued before
    /// the first of them stay ahead of them; `None` when a change on those paths that
    /// cannot move comes after one (it must find the bytes where they were), or when there
    /// is nothing to claim: the rename then simply queues behind the rest.
    pub(crate) fn claim_persists(&self, mount_id: u64, src: &str, dst: &str) -> Option<Claim> {
        let paths = [src.to_string(), dst.to_string()];
        let mut t = self.inner.persist.lock();
        let mut seqs = Vec::new();
        for (seq, p) in &t.pending {
            if p.mount_id != mount_id || !any_overlap(&p.paths, &paths) {
                continue;
            }
            if p.kind == pb::PersistOpKind::Persist && !t.running.contains(seq) && is_under(&p.paths[0], src) {
                seqs.push(*seq);
            } else if !seqs.is_empty() {
                return None;
            }
        }
        if seqs.is_empty() {
            return None;
        }
        t.running.extend(seqs.iter().copied());
        Some(Claim { master: self.clone(), seqs })
    }

    /// A mark to take before reading the UFS, for [`Master::held_ufs_paths`].
    pub(crate) fn ufs_mark(&self) -> u64 {
        self.inner.persist.lock().marks
    }

    /// The UFS paths of mount `mount_id` where what a reader of the UFS that started at
    /// `mark` saw may not be what the namespace says. At, above or below any of them, a
    /// sync must neither import what the UFS showed (an older version of a path deleted
    /// since) nor drop what it missed (a directory renamed behind a waiting persist):
    /// - queued changes: the UFS does not show them until they are made;
    /// - synchronous changes in progress: their namespace side is still to commit;
    /// - changes finished since `mark`: the reader may have seen the UFS before them, and
    ///   the namespace holds them already (a listing taken before a delete ran, committed
    ///   after it, brought the deleted entry back).
    ///
    /// See [`held_by`].
    pub(crate) fn held_ufs_paths(&self, mount_id: u64, mark: u64) -> Vec<String> {
        held_in(&self.inner.persist.lock(), mount_id, mark)
    }

    /// Start a UFS change of `paths` in mount `mount_id`: whether it must be queued (queued
    /// changes overlap its paths), else it is made now, synchronously. Either way its
    /// paths are held ([`Master::held_ufs_paths`]) until the guard is dropped, which the
    /// caller does once the change is over: made and committed, or committed and handed
    /// to the scheduler ([`Master::track`]). A queued change is not in the scheduler's
    /// view until then, and the change it queued behind may finish before that: without
    /// the hold, a sync whose commit fell between the two (in the same transaction as the
    /// delete, or the next) saw nothing held and imported the deleted file back from the
    /// UFS.
    pub(crate) fn begin_ufs_op(&self, mount_id: u64, paths: &[&str]) -> (SyncGuard, bool) {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let mut t = self.inner.persist.lock();
        let queued = t.pending.values().any(|p| p.mount_id == mount_id && any_overlap(&p.paths, &paths));
        t.next_token += 1;
        let token = t.next_token;
        t.sync_ops.insert(token, (mount_id, paths));
        (SyncGuard { master: self.clone(), token }, queued)
    }

    /// Wait until no queued change overlaps `path` (before a synchronous UFS write). A
    /// persist still in its initial wait on an overlapping path starts now: the write that
    /// follows it must not wait out its wait.
    pub(crate) async fn wait_ufs_quiet(&self, mount_id: u64, path: &str) -> Result<()> {
        let paths = [path.to_string()];
        let deadline = Instant::now() + self.inner.cfg.ufs_timeout * 3;
        let quiet = locus_common::wait::until(self.inner.persist.settled(), deadline, || {
            let mut t = self.inner.persist.lock();
            let mut busy = false;
            for p in t.pending.values_mut() {
                if p.mount_id != mount_id || !any_overlap(&p.paths, &paths) {
                    continue;
                }
                if p.failed_ms.is_some() {
                    // It will not drain by itself: say so now.
                    let e = format!(
                        "a queued UFS change to {} was given up ({}); locus fs persist --retry or --drop it first",
                        p.path,
                        p.last_error.as_ref().map(|e| e.1.as_str()).unwrap_or("failed")
                    );
                    return (Some(Err(Error::new(ErrorKind::FailedPrecondition, e))), None);
                }
                busy = true;
                if p.not_before.take().is_some() {
                    self.inner.persist.wake();
                }
            }
            ((!busy).then_some(Ok(())), None)
        })
        .await;
        quiet.unwrap_or_else(|| {
            Err(Error::unavailable(format!(
                "queued UFS changes to {path} did not drain in time (is the UFS reachable?); retry, or write ASYNC_THROUGH"
            )))
        })
    }

    /// A queue record for `path` (`rel` under mount `m`); the caller sets the kind.
    pub(crate) fn op_for(&self, m: &MountEntry, rel: &str, path: &str) -> pb::PersistOp {
        crate::apply::op_at(m.info.id, rel, path)
    }

    /// Hand committed operations to the scheduler.
    pub(crate) fn track(&self, ops: Vec<pb::PersistOp>) {
        if ops.is_empty() {
            return;
        }
        let mut t = self.inner.persist.lock();
        for op in ops {
            let p = pending_of(&op);
            crate::persist_failures::rerun_given_up(&mut t, p.mount_id, &p.paths, op.seq);
            t.pending.insert(op.seq, p);
        }
        drop(t);
        self.inner.persist.wake();
    }

    /// Reload the queue after a restart.
    pub(crate) fn load_persist_queue(&self) -> Result<()> {
        let r = self.ns().read()?;
        let q = r.open_table(PERSIST_QUEUE).map_err(db_err)?;
        let mut t = self.inner.persist.lock();
        for e in q.iter().map_err(db_err)? {
            let (k, v) = e.map_err(db_err)?;
            let op: pb::PersistOp = decode(v.value())?;
            t.pending.insert(k.value(), pending_of(&op));
        }
        if !t.pending.is_empty() {
            tracing::info!(ops = t.pending.len(), "persist queue resumes");
        }
        Ok(())
    }

    pub(crate) fn persist_backlog(&self) -> Backlog {
        let t = self.inner.persist.lock();
        let persists = t.pending.values().filter(|p| p.kind == pb::PersistOpKind::Persist);
        let oldest = t.pending.values().map(|p| p.enqueued_ms).min();
        Backlog {
            files: persists.clone().count() as u64,
            bytes: persists.map(|p| p.length).sum(),
            oldest_age_ms: oldest.map(|o| (now_ms() - o).max(0) as u64).unwrap_or(0),
            ops: t.pending.len() as u64,
        }
    }

    /// Operations that may start now, in queue order, marked running.
    fn runnable(&self) -> Vec<u64> {
        // Persists are the leader's to run (a member that does not lead runs none).
        if !self.leads() {
            return Vec::new();
        }
        let limit = self.inner.cfg.persist_concurrency.max(1);
        let now = Instant::now();
        let mut t = self.inner.persist.lock();
        let mut earlier: Vec<(u64, &[String], Option<u64>)> =
            t.sync_ops.values().map(|(m, ps)| (*m, ps.as_slice(), None)).collect();
        let mut start = Vec::new();
        let mut ended = Vec::new();
        let mut looked = 0;
        for (seq, p) in t.pending.iter() {
            if t.running.len() + start.len() >= limit || looked >= WINDOW {
                break;
            }
            let mut blocked = false;
            for (m, ps, waiting) in &earlier {
                if *m == p.mount_id && any_overlap(ps, &p.paths) {
                    blocked = true;
                    // A later operation on the path of a waiting persist ends its wait: the
                    // order must hold, and a file deleted meanwhile is then dropped unwritten.
                    ended.extend(*waiting);
                }
            }
            if p.not_before.is_some_and(|at| at > now) {
                // Waiting: not counted against the window, but it holds back its paths.
                earlier.push((p.mount_id, &p.paths, Some(*seq)));
                continue;
            }
            let due = t.retry.get(seq).is_none_or(|(at, _)| *at <= now);
            if p.failed_ms.is_some() || !due {
                // Given up or backing off: it holds back its paths only.
                earlier.push((p.mount_id, &p.paths, None));
                continue;
            }
            looked += 1;
            if !blocked && !t.running.contains(seq) {
                start.push(*seq);
            }
            earlier.push((p.mount_id, &p.paths, None));
        }
        for seq in ended {
            if let Some(p) = t.pending.get_mut(&seq) {
                p.not_before = None;
            }
        }
        t.running.extend(start.iter().copied());
        start
    }

    fn finish(&self, seq: u64, r: &Result<()>) {
        self.finish_op(seq, r);
        self.inner.persist.settle();
    }

    fn finish_op(&self, seq: u64, r: &Result<()>) {
        let mut t = self.inner.persist.lock();
        t.running.remove(&seq);
        match r {
            Ok(()) => {
                if let Some(p) = t.pending.remove(&seq) {
                    t.note_finished(p.mount_id, p.paths);
                }
                t.retry.remove(&seq);
            }
            Err(e) => {
                let Some(p) = t.pending.get(&seq) else {
                    t.retry.remove(&seq);
                    return;
                };
                let (failures, path, given_up) = (p.failures, p.path.clone(), p.failed_ms.is_some());
                if given_up {
                    t.retry.remove(&seq);
                    tracing::error!(seq, path, failures, error = %e, "persist queue operation given up (locus fs persist --retry or --drop)");
                    return;
                }
                let wait = (Duration::from_millis(100) * 2u32.pow(failures.min(10))).min(MAX_BACKOFF);
                t.retry.insert(seq, (Instant::now() + wait, failures));
                tracing::warn!(seq, path, failures, retry_in = ?wait, error = %e, "persist queue operation failed");
            }
        }
    }

    /// Carry out one queued operation and take it off the queue.
    async fn run_op(&self, seq: u64) -> Result<()> {
        let op: pb::PersistOp = {
            let r = self.ns().read()?;
            let q = r.open_table(PERSIST_QUEUE).map_err(db_err)?;
            match q.get(seq).map_err(db_err)? {
                Some(v) => decode(v.value())?,
                None => return Ok(()),
            }
        };
        let mount = self.inner.mounts.by_id(op.mount_id);
        let Some(m) = mount else {
            tracing::info!(path = %op.path, "mount is gone; dropping its queued UFS change");
            return self.propose(Op::RemoveOp(pb::RemoveOp { seq })).await.map(drop);
        };
        locus_common::fail::fail_point!("master.persist.before_ufs", |_| Err(Error::unavailable("failpoint")));
        locus_common::delay_point("master.persist.running").await;
        let count = |result: &str| self.inner.metrics.persist_ops.with_label_values(&[op.kind().name(), result]).inc();
        let result = match op.kind() {
            pb::PersistOpKind::Persist => {
                let written = self.persist_file(&op, &m).await?;
                if written.is_some() {
                    self.settle_markers(&m, &op.ufs_path).await;
                }
                count(if written.is_some() { "done" } else { "skipped" });
                self.inner.metrics.persisted_bytes.inc_by(written.unwrap_or(0));
                return Ok(());
            }
            pb::PersistOpKind::Meta => {
                let rewritten = self.rewrite_meta(&op, &m).await?;
                count(if rewritten { "done" } else { "skipped" });
                return Ok(());
            }
            pb::PersistOpKind::Mkdir => {
                m.ufs.create_dir(&op.ufs_path).await?;
                self.settle_markers(&m, &op.ufs_path).await;
                "done"
            }
            pb::PersistOpKind::Delete => {
                m.ufs.delete(&op.ufs_path, op.is_dir).await?;
                "done"
            }
            pb::PersistOpKind::Rename => match m.ufs.rename(&op.ufs_path, &op.dst_ufs_path).await {
                // What was to move never reached the UFS (not persisted, or its persist
                // moved with the rename).
                Err(e) if e.kind() == ErrorKind::NotFound => "skipped",
                r => {
                    r?;
                    self.settle_markers(&m, &op.dst_ufs_path).await;
                    "done"
                }
            },
            pb::PersistOpKind::Unspecified => {
                tracing::warn!(seq, "queued operation of no known kind; dropping it");
                "skipped"
            }
        };
        let mkdir_inode = if op.kind() == pb::PersistOpKind::Mkdir { op.inode_id } else { 0 };
        self.propose(Op::OpDone(pb::OpDone { seq, mkdir_inode })).await?;
        count(result);
        Ok(())
    }

    /// Write a file's cached blocks to the UFS through a worker holding them, then mark
    /// it persisted, unpin it and release the copies beyond its minimum replication.
    /// Returns the bytes written, or `None` when the file was deleted or overwritten first.
    async fn persist_file(&self, op: &pb::PersistOp, m: &MountEntry) -> Result<Option<u64>> {
        // The file and its blocks' locations from one snapshot (an overwrite committed
        // between two reads would leave the version read with no copies).
        let (rec, blocks) = {
            let r = self.ns().read()?;
            let rec = get_inode(&r.open_table(INODES).map_err(db_err)?, op.inode_id)?
                .filter(|r| r.version == op.version && r.persist_state() == pb::PersistState::ToBePersisted);
            let blocks = match &rec {
                Some(rec) if rec.length > 0 => self.block_infos(&r, rec)?,
                _ => Vec::new(),
            };
            (rec, blocks)
        };
        let Some(rec) = rec else {
            // Overwritten or deleted since: a later queue entry covers what is there now.
            let seq = op.seq;
            return self.propose(Op::RemoveOp(pb::RemoveOp { seq })).await.map(|_| None);
        };
        let meta = rec.meta.clone().unwrap_or_default();
        let user_metadata = locus_proto::ufs_user_metadata(&meta);
        let st = if rec.length == 0 {
            let wr = m.ufs.writer(&op.ufs_path, &meta.content_type, &user_metadata).await?;
            wr.close().await?
        } else {
            if let Some(b) = blocks.iter().find(|b| b.locations.is_empty()) {
                return Err(Error::unavailable(format!("no live copy of block {} of {}", b.block_id, op.path)));
            }
            let mut held: HashMap<u64, usize> = HashMap::new();
            for l in blocks.iter().flat_map(|b| &b.locations) {
                *held.entry(l.worker_id).or_default() += 1;
            }
            let workers = self.workers();
            let best = workers
                .iter()
                .filter(|w| held.contains_key(&w.worker_id))
                .max_by_key(|w| (held[&w.worker_id], std::cmp::Reverse(w.worker_id)))
                .cloned()
                .ok_or_else(|| Error::unavailable(format!("no live worker holds {}", op.path)))?;
            let req = pb::PersistRequest {
                mount_id: m.info.id,
                ufs_path: op.ufs_path.clone(),
                blocks,
                workers,
                content_type: meta.content_type.clone(),
                user_metadata,
                ..Default::default()
            };
            let r = self.call_worker(&best.data_address, pb::data_request::Req::Persist(req)).await?;
            UfsStatus { path: String::new(), is_dir: false, length: r.length, etag: r.etag, mtime_ms: r.mtime_ms }
        };
        if st.length != rec.length {
            return Err(Error::new(
                ErrorKind::Ufs,
                format!("persist of {} left {} bytes in the UFS, not {}", op.path, st.length, rec.length),
            ));
        }
        let c = pb::Persisted {
            seq: op.seq,
            inode_id: rec.id,
            version: rec.version,
            meta_sent: rec.meta.clone(),
            fingerprint: st.fingerprint(),
            stores_metadata: m.ufs.stores_metadata(),
            mount_id: m.info.id,
            ufs_path: op.ufs_path.clone(),
            path: op.path.clone(),
        };
        if let Some(cur) = self.propose(Op::Persisted(c)).await?.record
            && let Err(e) = self.trim_copies(cur).await
        {
            // The persist stands; the replication job releases the copies later.
            tracing::warn!(path = %op.path, error = %e, "could not release the copies of a persisted file");
        }
        tracing::debug!(path = %op.path, bytes = st.length, "persisted");
        Ok(Some(st.length))
    }

    /// Release the cached copies of a file just persisted beyond its minimum replication
    /// (they were for durability until then), the live workers' kept first. Soft state,
    /// by this master's view of which workers live: a step of its own after the command.
    async fn trim_copies(&self, persisted: pb::InodeRecord) -> Result<()> {
        let (default_min, live) = (self.inner.cfg.replication_min, self.live_workers());
        self.commit_soft(move |_, w, fx| {
            // As the file is now: bounds set since the persist count, another version has
            // its own copies.
            let Some(cur) = load_inode(w, persisted.id)?.filter(|c| c.version == persisted.version) else {
                return Ok(());
            };
            let keep = if cur.replication_min == 0 { default_min } else { cur.replication_min };
            let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
            let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
            for i in 0..crate::namespace::block_count(cur.length, cur.block_size) {
                let b = locus_common::block_id(cur.version, i);
                let mut holders = second_keys(&loc, b)?;
                holders.sort_by_key(|wk| (!live.contains_key(wk), *wk));
                for wk in holders.into_iter().skip(keep.max(1) as usize) {
                    loc.remove((b, wk)).map_err(db_err)?;
                    wb.remove((wk, b)).map_err(db_err)?;
                    fx.dropped.push((wk, b));
                }
            }
            Ok(())
        })
        .await
    }

    /// Store a persisted file's new metadata (tags, after PutObjectTagging) with its UFS
    /// object: a worker rewrites the object from itself with the new metadata.
    /// Returns whether the object was rewritten (not when the file changed or went first).
    async fn rewrite_meta(&self, op: &pb::PersistOp, m: &MountEntry) -> Result<bool> {
        let rec = {
            let r = self.ns().read()?;
            get_inode(&r.open_table(INODES).map_err(db_err)?, op.inode_id)?
        };
        let seq = op.seq;
        let Some(rec) = rec.filter(|r| r.version == op.version && crate::is_persisted(r)) else {
            return self.propose(Op::RemoveOp(pb::RemoveOp { seq })).await.map(|_| false);
        };
        let meta = rec.meta.clone().unwrap_or_default();
        let worker = self.workers().into_iter().next().ok_or_else(|| Error::unavailable("no live workers"))?;
        let req = pb::PersistRequest {
            mount_id: m.info.id,
            ufs_path: op.ufs_path.clone(),
            content_type: meta.content_type.clone(),
            user_metadata: locus_proto::ufs_user_metadata(&meta),
            from_ufs: true,
            length: rec.length,
            ..Default::default()
        };
        let r = self.call_worker(&worker.data_address, pb::data_request::Req::Persist(req)).await?;
        let st = UfsStatus { path: String::new(), is_dir: false, length: r.length, etag: r.etag, mtime_ms: r.mtime_ms };
        let c = pb::MetaRewritten { seq, inode_id: rec.id, version: rec.version, fingerprint: st.fingerprint() };
        self.propose(Op::MetaRewritten(c)).await.map(|_| true)
    }

    /// Drop writes created but never completed within `master.abandoned_write_timeout`.
    async fn reap_abandoned_writes(&self) -> Result<()> {
        if !self.leads() {
            return Ok(());
        }
        let cutoff = now_ms() - self.inner.cfg.abandoned_write_timeout.as_millis() as i64;
        let stale: Vec<u64> = {
            let r = self.ns().read()?;
            let t = r.open_table(PENDING_WRITES).map_err(db_err)?;
            let mut v = Vec::new();
            for e in t.iter().map_err(db_err)? {
                let (k, created) = e.map_err(db_err)?;
                if created.value() < cutoff {
                    v.push(k.value());
                }
            }
            v
        };
        if stale.is_empty() {
            return Ok(());
        }
        let n = stale.len();
        self.propose(Op::ReapWrites(pb::ReapWrites { versions: stale })).await?;
        tracing::info!(writes = n, "dropped abandoned writes");
        Ok(())
    }
}

impl Master {
    /// One order to a worker's data path (as the master: a proof made with the cluster
    /// secret), answered by one frame; sent in the term this master leads in
    /// ([`Master::order_term`]). `addr` is always one this master registered.
    pub(crate) async fn call_worker(&self, addr: &str, req: pb::data_request::Req) -> Result<pb::DataResponse> {
        let term = self.order_term().await?;
        let mut s = self.inner.tls.connect(addr, "worker").await?;
        locus_proto::authenticate(&mut s, &self.inner.verifier.identity(locus_common::security::Role::Master)).await?;
        locus_proto::exchange(&mut s, pb::DataRequest::order(req, term))
            .await
            .map_err(|e| e.context(format!("worker {addr}")))
    }
}

/// [`Master::held_ufs_paths`], from the tracker `t` its caller holds.
pub(crate) fn held_in(t: &Tracker, mount_id: u64, mark: u64) -> Vec<String> {
    if t.finished.front().is_some_and(|(first, _, _)| mark.saturating_add(1) < *first) {
        return vec![String::new()]; // older than what is remembered: hold everything
    }
    let pending = t.pending.values().map(|p| (p.mount_id, &p.paths));
    let sync = t.sync_ops.values().map(|(m, ps)| (*m, ps));
    let done = t.finished.iter().filter(|(at, _, _)| *at > mark).map(|(_, m, ps)| (*m, ps));
    pending.chain(sync).chain(done).filter(|(m, _)| *m == mount_id).flat_map(|(_, ps)| ps.iter().cloned()).collect()
}

/// Start the scheduler job.
pub(crate) fn start(master: Master) -> Job {
    Job::spawn_loop("master.persist", move |mut stop, status| async move {
        let mut running = FuturesUnordered::new();
        let mut last_reap = Instant::now();
        loop {
            for seq in master.runnable() {
                let m = master.clone();
                running.push(async move {
                    let r = m.run_op(seq).await;
                    if let Err(e) = &r {
                        m.record_failure(seq, e).await;
                    }
                    (seq, r)
                });
            }
            status.set_running(!running.is_empty());
            status.set_backlog(master.inner.persist.lock().pending.len() as u64);
            tokio::select! {
                _ = stop.changed() => break,
                Some((seq, r)) = running.next(), if !running.is_empty() => {
                    master.finish(seq, &r);
                    status.record(&r);
                }
                _ = master.inner.persist.woken() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            if last_reap.elapsed() > Duration::from_secs(30) {
                last_reap = Instant::now();
                if let Err(e) = master.reap_abandoned_writes().await {
                    tracing::warn!(error = %e, "reaping abandoned writes");
                }
            }
        }
        // Operations cut short stay queued; the next start runs them again.
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_paths() {
        assert!(overlaps("a/b", "a/b"));
        assert!(overlaps("a", "a/b/c"));
        assert!(overlaps("a/b/c", "a"));
        assert!(overlaps("", "x"));
        assert!(!overlaps("a/b", "a/bc"));
        assert!(!overlaps("a/b", "a/c"));
        assert!(any_overlap(&["x".into(), "a/b".into()], &["a".into()]));
    }
}
