//! Fencing a deposed master: the highest term of the master group this worker has been
//! told (by a heartbeat answer, a registration or an order), kept in `master_term` in its
//! data dir so that a restart keeps it. An order (persist, replicate) or a heartbeat
//! answer of an older term comes from a leader that has been replaced: it is refused, so
//! a paused or partitioned old leader cannot drop blocks or overwrite what the new leader
//! persisted since. Without a group every term is 0 and nothing is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use locus_common::{Error, ErrorKind, Result};
use parking_lot::Mutex;

/// The file in the data dir that holds the highest term seen.
const FILE: &str = "master_term";

pub(crate) struct Fence {
    highest: AtomicU64,
    /// Orders and answers refused.
    refused: AtomicU64,
    file: PathBuf,
    /// Held (on a blocking thread) while a higher term is written, so that two raises
    /// never leave the lower one on disk.
    writing: Mutex<()>,
}

impl Fence {
    /// The fence kept in `data_dir` (term 0 when none was kept). Blocking.
    pub(crate) fn load(data_dir: &Path) -> Result<Fence> {
        let file = data_dir.join(FILE);
        let highest = match std::fs::read_to_string(&file) {
            Ok(s) => s.trim().parse().map_err(|_| {
                Error::invalid(format!(
                    "{} does not hold a master term ({s:?}): remove it, and the worker learns the term again",
                    file.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Error::io(format!("read {}", file.display()), e)),
        };
        Ok(Fence { highest: AtomicU64::new(highest), refused: AtomicU64::new(0), file, writing: Mutex::new(()) })
    }

    /// The highest term this worker has been told.
    pub(crate) fn highest(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }

    /// How many orders and answers were refused.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes word from a master that leads in `term`: refuses it when a later term is
    /// known; a later term than any known is kept (on disk first) before the word is
    /// acted on.
    pub(crate) async fn admit(self: &Arc<Self>, term: u64) -> Result<()> {
        if term > self.highest() {
            let me = self.clone();
            crate::blocking(move || me.raise(term)).await??;
        }
        self.check(term)
    }

    /// Whether word of `term` still stands: no later term has been heard of since.
    pub(crate) fn check(&self, term: u64) -> Result<()> {
        let highest = self.highest();
        if term >= highest {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        let msg = if term == 0 {
            format!(
                "refused: the master runs without a group, but this worker was told of its group's term {highest}: \
                 if the group is gone for good, stop the worker and remove {}",
                self.file.display()
            )
        } else {
            format!(
                "refused: sent as leader in term {term}, but the master group has reached term {highest} (the sender was deposed)"
            )
        };
        Err(Error::new(ErrorKind::FailedPrecondition, msg))
    }

    /// Forgets every term: the worker joins another cluster (whose group counts its own
    /// terms). Blocking.
    pub(crate) fn forget(&self) -> Result<()> {
        let _one = self.writing.lock();
        match std::fs::remove_file(&self.file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", self.file.display()), e)),
        }
        self.highest.store(0, Ordering::Release);
        Ok(())
    }

    /// Keeps `term` as the highest when it is. Blocking: writes the file durably (a
    /// temporary, fsynced, renamed over it) before the term is taken as known.
    fn raise(&self, term: u64) -> Result<()> {
        let _one = self.writing.lock();
        if term <= self.highest() {
            return Ok(());
        }
        let tmp = self.file.with_extension("tmp");
        let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
            f.write_all(term.to_string().as_bytes()).map_err(|e| io("write", e))?;
            f.sync_all().map_err(|e| io("sync", e))?;
        }
        std::fs::rename(&tmp, &self.file).map_err(|e| io("rename", e))?;
        if let Some(dir) = self.file.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync the dir of", e))?;
        }
        self.highest.store(term, Ordering::Release);
        tracing::info!(term, "a master leads in a new term");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_older_terms_and_keeps_the_highest_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let f = Arc::new(Fence::load(dir.path()).unwrap());
        assert_eq!(f.highest(), 0);
        f.admit(0).await.unwrap(); // no group: term 0 always stands
        f.admit(3).await.unwrap();
        f.admit(3).await.unwrap();
        let e = f.admit(2).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FailedPrecondition);
        assert!(e.message().contains("term 2") && e.message().contains("term 3"), "{e}");
        f.admit(5).await.unwrap();
        assert!(f.check(3).is_err() && f.check(5).is_ok());
        assert_eq!(f.refused(), 2);
        // A restarted worker still knows term 5.
        let f = Fence::load(dir.path()).unwrap();
        assert_eq!(f.highest(), 5);
        assert!(f.check(4).is_err());
        // A master without a group is told how to go back to one.
        assert!(f.check(0).unwrap_err().message().contains("remove"));
        // Another cluster's terms start again.
        f.forget().unwrap();
        assert_eq!(Fence::load(dir.path()).unwrap().highest(), 0);
        assert!(f.check(1).is_ok());
    }

    #[test]
    fn a_garbled_file_is_named_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "nonsense").unwrap();
        let e = Fence::load(dir.path()).err().unwrap();
        assert!(e.message().contains("remove it"), "{e}");
    }
}
