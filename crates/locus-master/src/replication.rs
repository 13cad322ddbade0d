//! Replication management: a periodic check that restores the copies a file needs.
//!
//! A block of a file not yet persisted needs `max(2, replication_min)` live copies (as
//! many as there are live workers, if fewer); a block of a persisted file needs its
//! `replication_min` only when one was set with `setReplication` (the UFS holds it
//! otherwise). When a worker is lost (missed heartbeats), the blocks it held fall short
//! and are copied worker-to-worker from a surviving copy. A file not yet persisted with
//! a block that has no live copy left is LOST; if the block comes back (its worker
//! re-registers), the file goes back to TO_BE_PERSISTED and its persist is queued again.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures::StreamExt;
use locus_common::Result;
use locus_common::job::Job;
use locus_proto::pb::{self, command::Op};
use redb::ReadableTable;

use crate::store::*;
use crate::{Master, is_persisted};

/// Block copies made at once.
const CONCURRENCY: usize = 4;

/// A copy to make.
struct Task {
    block_id: u64,
    length: u64,
    sources: Vec<String>,
    target: pb::WorkerAddress,
}

impl Master {
    /// Find blocks short of copies (and LOST files that are whole again); returns the
    /// copies to make.
    async fn replication_plan(&self) -> Result<Vec<Task>> {
        let live: Vec<pb::WorkerAddress> = self.workers();
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let by_id: HashMap<u64, &pb::WorkerAddress> = live.iter().map(|w| (w.worker_id, w)).collect();
        let mut tasks = Vec::new();
        let mut lost = Vec::new();
        let mut found = Vec::new();
        let mut excess = Vec::new();
        {
            let r = self.ns().read()?;
            let versions = r.open_table(VERSIONS).map_err(db_err)?;
            let inodes = r.open_table(INODES).map_err(db_err)?;
            let loc = r.open_table(LOCATIONS).map_err(db_err)?;
            // Files not persisted are pinned; files with replication bounds are listed.
            let mut candidates = std::collections::BTreeSet::new();
            for t in [PINNED, REPLICATED] {
                for e in r.open_table(t).map_err(db_err)?.iter().map_err(db_err)? {
                    candidates.insert(e.map_err(db_err)?.0.value());
                }
            }
            for v in candidates {
                let Some(id) = versions.get(v).map_err(db_err)?.map(|x| x.value()) else { continue };
                if id == 0 {
                    continue; // still being written
                }
                let Some(rec) = get_inode(&inodes, id)? else { continue };
                if rec.version != v {
                    continue;
                }
                let persisted = is_persisted(&rec);
                let min = if rec.replication_min == 0 { self.inner.cfg.replication_min } else { rec.replication_min };
                let want = if persisted { min } else { min.max(2) } as usize;
                let want = want.min(live.len());
                let mut whole = true;
                for i in 0..crate::namespace::block_count(rec.length, rec.block_size) {
                    let b = locus_common::block_id(rec.version, i);
                    let holders: Vec<u64> =
                        second_keys(&loc, b)?.into_iter().filter(|w| by_id.contains_key(w)).collect();
                    if holders.is_empty() {
                        whole = false;
                        continue;
                    }
                    let max = rec.replication_max as usize;
                    if persisted && max > 0 && holders.len() > max {
                        excess.extend(holders[max..].iter().map(|w| (*w, b)));
                    }
                    if holders.len() >= want {
                        continue;
                    }
                    let length = rec.block_size.min(rec.length - i * rec.block_size);
                    let sources: Vec<String> = holders.iter().map(|w| by_id[w].data_address.clone()).collect();
                    let mut others: Vec<&pb::WorkerAddress> =
                        live.iter().filter(|w| !holders.contains(&w.worker_id)).collect();
                    others.sort_by_key(|w| {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        (b, w.worker_id).hash(&mut h);
                        h.finish()
                    });
                    for t in others.into_iter().take(want - holders.len()) {
                        tasks.push(Task { block_id: b, length, sources: sources.clone(), target: t.clone() });
                    }
                }
                if !persisted && !whole && rec.persist_state() != pb::PersistState::Lost {
                    lost.push(rec.id);
                } else if whole && rec.persist_state() == pb::PersistState::Lost {
                    found.push(rec.id);
                }
            }
        }
        if !lost.is_empty() || !found.is_empty() {
            self.set_lost(lost, found).await?;
        }
        if !excess.is_empty() {
            // Cached copies are soft state: no fsync (see `Store::mutate_soft`).
            self.commit_soft(move |_, w, fx| {
                let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
                let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
                for (wk, b) in &excess {
                    loc.remove((*b, *wk)).map_err(db_err)?;
                    wb.remove((*wk, *b)).map_err(db_err)?;
                }
                fx.dropped = excess;
                Ok(())
            })
            .await?;
        }
        Ok(tasks)
    }

    /// Mark files LOST, or (when their blocks are back) queue their persist again.
    async fn set_lost(&self, lost: Vec<u64>, found: Vec<u64>) -> Result<()> {
        let r = self.propose(Op::SetLost(pb::SetLost { lost, found })).await?;
        let (lost, back) = (r.records.into_iter().map(|rec| (rec.id, rec.name)), r.paths);
        for (id, name) in lost {
            tracing::error!(inode = id, name = %name, "every copy of a block of a file not persisted is gone: LOST");
        }
        for path in back {
            tracing::info!(path, "the blocks of a LOST file are back");
        }
        Ok(())
    }

    /// One round: plan, then copy blocks (a few at a time).
    async fn replicate_round(&self, inflight: &mut HashSet<u64>) -> Result<()> {
        // The leader's job: a member that does not lead orders no copies.
        if !self.leads() {
            return Ok(());
        }
        let tasks: Vec<Task> =
            self.replication_plan().await?.into_iter().filter(|t| inflight.insert(t.block_id)).collect();
        if tasks.is_empty() {
            return Ok(());
        }
        tracing::info!(blocks = tasks.len(), "re-replicating blocks short of copies");
        let results: Vec<(u64, Result<()>)> = futures::stream::iter(tasks)
            .map(|t| async move {
                let req = pb::ReplicateRequest { block_id: t.block_id, length: t.length, sources: t.sources };
                let r =
                    self.call_worker(&t.target.data_address, pb::data_request::Req::Replicate(req)).await.map(|_| ());
                (t.block_id, r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut first_err = None;
        for (b, r) in results {
            inflight.remove(&b);
            if let Err(e) = r {
                tracing::warn!(block = b, error = %e, "block copy failed; retried next round");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Start the replication check (once a second).
pub(crate) fn start(master: Master) -> Job {
    let inflight = std::sync::Arc::new(tokio::sync::Mutex::new(HashSet::new()));
    Job::spawn_periodic("master.replication", Duration::from_secs(1), move || {
        let m = master.clone();
        let inflight = inflight.clone();
        async move { m.replicate_round(&mut *inflight.lock().await).await }
    })
}
