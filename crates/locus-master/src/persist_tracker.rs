//! What the persist queue holds right now, in memory: the pending operations as the
//! scheduler sees them (their records stay in redb), the ones running or backing off,
//! the synchronous UFS changes in progress, and the UFS changes finished lately, so
//! that a reader of the UFS can tell which paths are held ([`Master::held_ufs_paths`]):
//! never imported from, nor dropped by, what the UFS shows. The queue itself, its
//! journal and its scheduler are `persist.rs`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use locus_common::ErrorKind;
use locus_proto::pb;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use crate::{Master, now_ms};

/// Finished UFS changes remembered for readers of the UFS still in flight
/// ([`Master::held_ufs_paths`]); a reader older than all of them holds every path.
const FINISHED_KEPT: usize = 1 << 16;

/// A queued operation as the scheduler sees it (the full record stays in redb).
pub(crate) struct Pending {
    /// The end of an initial wait (a PERSIST with `not_before_ms`): the operation starts
    /// then, or as soon as a later operation on an overlapping path is queued.
    pub(crate) not_before: Option<Instant>,
    pub(crate) mount_id: u64,
    pub(crate) paths: Vec<String>,
    pub(crate) kind: pb::PersistOpKind,
    pub(crate) length: u64,
    pub(crate) enqueued_ms: i64,
    /// The Locus path when queued (the source of a rename).
    pub(crate) path: String,
    /// Failed attempts so far and the last one's error.
    pub(crate) failures: u32,
    pub(crate) last_error: Option<(ErrorKind, String)>,
    /// Given up (see `persist_failures`): not run again until retried, and it holds back
    /// the operations on overlapping paths queued after it (their order must hold).
    pub(crate) failed_ms: Option<i64>,
}

/// The persist queue's state in memory: the [`Tracker`], a signal for the scheduler
/// (work to do) and one for waiters (a UFS change finished, failed or was dropped:
/// [`Master::wait_ufs_quiet`]).
#[derive(Default)]
pub(crate) struct PersistState {
    tracker: Mutex<Tracker>,
    wake: Notify,
    settled: Notify,
}

impl PersistState {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock()
    }

    /// Tells the scheduler there is work.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves when the scheduler is told there is work.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Tells waiters that a UFS change finished, failed or was dropped.
    pub(crate) fn settle(&self) {
        self.settled.notify_waiters();
    }

    /// The signal [`PersistState::settle`] gives.
    pub(crate) fn settled(&self) -> &Notify {
        &self.settled
    }
}

#[derive(Default)]
pub(crate) struct Tracker {
    pub(crate) pending: BTreeMap<u64, Pending>,
    pub(crate) running: HashSet<u64>,
    /// seq → (not before, failures so far)
    pub(crate) retry: HashMap<u64, (Instant, u32)>,
    /// UFS changes in progress: synchronous ones, and queued ones until their queue
    /// record is committed and tracked: token → (mount, paths).
    pub(crate) sync_ops: HashMap<u64, (u64, Vec<String>)>,
    pub(crate) next_token: u64,
    /// UFS changes finished (queued ones done, synchronous ones over), oldest first:
    /// (mark, mount, paths); `marks` counts them all. See [`Master::held_ufs_paths`].
    pub(crate) finished: VecDeque<(u64, u64, Vec<String>)>,
    pub(crate) marks: u64,
}

impl Tracker {
    pub(crate) fn note_finished(&mut self, mount_id: u64, paths: Vec<String>) {
        self.marks += 1;
        self.finished.push_back((self.marks, mount_id, paths));
        if self.finished.len() > FINISHED_KEPT {
            self.finished.pop_front();
        }
    }
}

/// Whether two paths under one mount's root ("" is the root) overlap: equal, or one
/// inside the other.
pub(crate) fn overlaps(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| x.strip_prefix(y).is_some_and(|r| r.starts_with('/'));
    a.is_empty() || b.is_empty() || a == b || inside(a, b) || inside(b, a)
}

pub(crate) fn any_overlap(a: &[String], b: &[String]) -> bool {
    a.iter().any(|x| b.iter().any(|y| overlaps(x, y)))
}

/// The persist backlog as `locus report` shows it.
pub(crate) struct Backlog {
    pub files: u64,
    pub bytes: u64,
    pub oldest_age_ms: u64,
    pub ops: u64,
}

/// Held while a UFS change is under way (made now, or being queued); see
/// [`Master::begin_ufs_op`].
pub(crate) struct SyncGuard {
    pub(crate) master: Master,
    pub(crate) token: u64,
}

impl Drop for SyncGuard {
    fn drop(&mut self) {
        let mut t = self.master.inner.persist.lock();
        if let Some((mount_id, paths)) = t.sync_ops.remove(&self.token) {
            t.note_finished(mount_id, paths);
        }
        drop(t);
        self.master.inner.persist.wake();
    }
}

/// Queued persists a rename has claimed (the scheduler does not start them) to queue them
/// again at their new paths; see [`Master::claim_persists`]. Dropped without
/// [`Claim::requeued`], it hands them back to the scheduler.
pub(crate) struct Claim {
    pub(crate) master: Master,
    pub seqs: Vec<u64>,
}

impl Claim {
    /// The claimed operations were replaced by new queue entries (committed): forget them.
    pub fn requeued(mut self) {
        let mut t = self.master.inner.persist.lock();
        for seq in std::mem::take(&mut self.seqs) {
            t.pending.remove(&seq);
            t.running.remove(&seq);
            t.retry.remove(&seq);
        }
        drop(t);
        self.master.inner.persist.settle();
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.seqs.is_empty() {
            return;
        }
        let mut t = self.master.inner.persist.lock();
        for seq in &self.seqs {
            t.running.remove(seq);
        }
        drop(t);
        self.master.inner.persist.wake();
    }
}

/// Whether mount-relative `path` is `dir` or below it.
/// Whether UFS path `rel` is held by queued changes to `queued` (at, above or below it).
pub(crate) fn held_by(queued: &[String], rel: &str) -> bool {
    queued.iter().any(|q| overlaps(q, rel))
}

pub(crate) fn is_under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The scheduler's view of a queued operation.
pub(crate) fn pending_of(op: &pb::PersistOp) -> Pending {
    let mut paths = vec![op.ufs_path.clone()];
    if op.kind() == pb::PersistOpKind::Rename {
        paths.push(op.dst_ufs_path.clone());
    }
    let wait = op.not_before_ms.saturating_sub(now_ms());
    Pending {
        not_before: (wait > 0).then(|| Instant::now() + Duration::from_millis(wait as u64)),
        mount_id: op.mount_id,
        paths,
        kind: op.kind(),
        length: op.length,
        enqueued_ms: op.enqueued_ms,
        path: op.path.clone(),
        failures: op.failures,
        last_error: (!op.last_error.is_empty()).then(|| (ErrorKind::from(op.last_error_kind()), op.last_error.clone())),
        failed_ms: (op.failed_ms > 0).then_some(op.failed_ms),
    }
}
