//! Persist-queue operations that keep failing. An operation is given up when its error
//! says retrying cannot help (a name the UFS refuses, a directory where the file should
//! go, a permission) or after [`MAX_ATTEMPTS`] failed attempts with backoff. A given-up
//! operation stays in the queue (journaled with its failures and last error, so it
//! survives restarts) and holds back only the later operations on overlapping paths,
//! whose order must hold; unrelated paths go on. It is listed by `locus report` (and
//! `/api/report`, the status page, `locus_persist_failed_paths` in `/metrics`) and waits
//! for `locus fs persist --retry PATH` (run it again) or `--drop PATH` (take it off the
//! queue: a file stays in Locus, `NOT_PERSISTED` and pinned, its cached bytes its only
//! copy). A later change queued on its path runs it once more first: a persist whose file
//! was deleted or overwritten since then simply goes.

use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::{self, command::Op};

use crate::{Master, now_ms};

/// Failed attempts after which an operation is given up (with the backoff capped at 10 s,
/// about 4.5 minutes of failures: a UFS outage shorter than that is ridden out).
pub(crate) const MAX_ATTEMPTS: u32 = 30;

/// Failures that retrying cannot mend: the operation is given up at the first.
fn permanent(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NameTooLong
            | ErrorKind::InvalidArgument
            | ErrorKind::FailedPrecondition
            | ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
            | ErrorKind::PermissionDenied
    )
}

/// Reported given-up operations at most (the count covers them all).
const LISTED: usize = 100;

impl Master {
    /// Count a failed attempt of operation `seq`; give it up (on disk first) when it
    /// cannot succeed or has failed too often.
    pub(crate) async fn record_failure(&self, seq: u64, e: &Error) {
        let (failures, give_up) = {
            let mut t = self.inner.persist.lock();
            let Some(p) = t.pending.get_mut(&seq) else { return };
            p.failures += 1;
            p.last_error = Some((e.kind(), e.to_string()));
            (p.failures, permanent(e.kind()) || p.failures >= MAX_ATTEMPTS)
        };
        if !give_up {
            return;
        }
        let now = now_ms();
        let c = pb::GiveUpOp { seq, failures, kind: pb::ErrorKind::from(e.kind()).into(), message: e.to_string() };
        let r = self.propose_at(now, Op::GiveUpOp(c)).await;
        if let Err(err) = r {
            // Not given up then: it is retried with backoff, and given up after its next failure.
            tracing::warn!(seq, error = %err, "could not record a persist failure");
            return;
        }
        if let Some(p) = self.inner.persist.lock().pending.get_mut(&seq) {
            p.failed_ms = Some(now);
        }
    }

    /// The given-up operations: how many, and the oldest [`LISTED`] of them.
    pub(crate) fn failed_persists(&self) -> (u64, Vec<pb::FailedPersist>) {
        let t = self.inner.persist.lock();
        let failed = t.pending.iter().filter(|(_, p)| p.failed_ms.is_some());
        let n = failed.clone().count() as u64;
        let list = failed
            .take(LISTED)
            .map(|(seq, p)| {
                let (kind, err) = p.last_error.clone().unwrap_or((ErrorKind::Internal, String::new()));
                pb::FailedPersist {
                    seq: *seq,
                    kind: p.kind.into(),
                    path: p.path.clone(),
                    ufs_path: p.paths[0].clone(),
                    failures: p.failures,
                    last_error: err,
                    failed_ms: p.failed_ms.unwrap_or(0),
                    last_error_kind: pb::ErrorKind::from(kind).into(),
                }
            })
            .collect();
        (n, list)
    }

    /// Retry or drop the given-up operations at or below `path`. Returns how many.
    pub async fn resolve_persist_failures(&self, path: &str, action: pb::PersistFailureAction) -> Result<u64> {
        let path = normalize(path)?;
        let retry = match action {
            pb::PersistFailureAction::Retry => true,
            pb::PersistFailureAction::Drop => false,
            pb::PersistFailureAction::Unspecified => return Err(Error::invalid("say whether to retry or drop")),
        };
        let seqs: Vec<u64> = {
            let t = self.inner.persist.lock();
            t.pending
                .iter()
                .filter(|(_, p)| p.failed_ms.is_some() && lpath::strip_prefix(&p.path, &path).is_some())
                .map(|(s, _)| *s)
                .collect()
        };
        if seqs.is_empty() {
            return Err(Error::not_found(format!(
                "no given-up persist queue operations at or below {path} (see locus report)"
            )));
        }
        self.propose(Op::ResolveFailures(pb::ResolveFailures { seqs: seqs.clone(), retry })).await?;
        let mut t = self.inner.persist.lock();
        for seq in &seqs {
            t.retry.remove(seq);
            if retry {
                if let Some(p) = t.pending.get_mut(seq) {
                    p.failed_ms = None;
                    p.failures = 0;
                    p.last_error = None;
                }
            } else {
                t.pending.remove(seq);
            }
        }
        drop(t);
        self.inner.persist.wake();
        self.inner.persist.settle();
        tracing::info!(path, ops = seqs.len(), retry, "given-up persist queue operations resolved");
        Ok(seqs.len() as u64)
    }
}

/// A change queued (as `seq`) on the paths of given-up operations runs them once more (a
/// persist of a file deleted or overwritten since goes without a UFS write; one that fails
/// again is given up again at once). Called with the tracker locked.
pub(crate) fn rerun_given_up(t: &mut crate::persist::Tracker, mount_id: u64, paths: &[String], seq: u64) {
    let mut rerun = Vec::new();
    for (s, p) in t.pending.range_mut(..seq) {
        if p.failed_ms.is_some() && p.mount_id == mount_id && crate::persist::any_overlap(&p.paths, paths) {
            p.failed_ms = None;
            p.failures = p.failures.max(MAX_ATTEMPTS - 1);
            rerun.push(*s);
        }
    }
    for s in rerun {
        t.retry.remove(&s);
    }
}
