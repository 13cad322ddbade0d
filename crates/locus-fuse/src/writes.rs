//! The write path of the mount: files are written once, start to end, through a
//! `FileWriter`; writes the kernel sends ahead of the end wait their turn, and `close`
//! (`flush`) or `fsync` completes the file and answers its outcome.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use fuser::{Errno, FileHandle, ReplyEmpty};
use locus_client::{FileWriter, PutOptions};
use parking_lot::Mutex;

use crate::{Handle, LocusFs, MAX_PENDING, errno};

/// A file being written through a handle.
pub(crate) struct Writing {
    pub(crate) ino: u64,
    pub(crate) path: String,
    pub(crate) file: Option<FileWriter>,
    /// Writes that arrived ahead of the end, by offset.
    pending: BTreeMap<u64, Vec<u8>>,
    pending_bytes: usize,
    /// How the write ended (`flush`, `fsync` or a failure): later calls answer it.
    outcome: Option<std::result::Result<(), Errno>>,
    /// The process (thread group) that opened the file: only its `close` ends the write.
    opener: u32,
}

impl LocusFs {
    /// Starts writing `path` (inode `ino`), waiting until the master accepted it.
    pub(crate) fn start_write(
        &self,
        ino: u64,
        path: &str,
        overwrite: bool,
        pid: u32,
    ) -> std::result::Result<Arc<Mutex<Writing>>, Errno> {
        let opts = PutOptions { overwrite, write_type: self.opts.write_type, ..Default::default() };
        let mut file = {
            let _g = self.rt.enter();
            FileWriter::create(self.client.clone(), path.to_string(), opts)
        };
        self.run(file.ready()).map_err(|e| errno(&e, true))?;
        let w = Arc::new(Mutex::new(Writing {
            ino,
            path: path.to_string(),
            file: Some(file),
            pending: BTreeMap::new(),
            pending_bytes: 0,
            outcome: None,
            opener: process_of(pid),
        }));
        self.writing.lock().insert(ino, w.clone());
        Ok(w)
    }

    /// Completes the write (once): later calls answer how it ended.
    pub(crate) fn finish(&self, w: &Arc<Mutex<Writing>>) -> std::result::Result<(), Errno> {
        let mut g = w.lock();
        if let Some(o) = g.outcome {
            return o;
        }
        let outcome = if g.pending.is_empty() {
            let mut file = g.file.take().expect("an unfinished write has its file");
            self.run(file.finish()).map(|_| ()).map_err(|e| errno(&e, true))
        } else {
            // A hole that no write filled: nothing of it is kept.
            if let Some(mut file) = g.file.take() {
                self.rt.block_on(file.abort());
            }
            Err(Errno::EIO)
        };
        g.outcome = Some(outcome);
        let ino = g.ino;
        drop(g);
        self.writing.lock().remove(&ino);
        self.opened.lock().remove(&ino);
        outcome
    }

    pub(crate) fn write_at(
        &self,
        w: &Arc<Mutex<Writing>>,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<u32, Errno> {
        let mut g = w.lock();
        if let Some(o) = g.outcome {
            // Written to after its close or fsync: the file is complete.
            return Err(o.err().unwrap_or(Errno::EPERM));
        }
        let end = g.file.as_ref().map_or(0, FileWriter::written);
        if offset < end {
            return Err(Errno::EPERM); // rewriting what was written: files are written once
        }
        if offset > end {
            if g.pending_bytes + data.len() > MAX_PENDING {
                return Err(Errno::EPERM); // a sparse write, not a reordering
            }
            g.pending_bytes += data.len();
            g.pending.insert(offset, data.to_vec());
            return Ok(data.len() as u32);
        }
        let file = g.file.as_mut().expect("an unfinished write has its file");
        let r = self.run(file.write(Bytes::copy_from_slice(data)));
        if let Err(e) = r {
            let n = errno(&e, true);
            g.outcome = Some(Err(n));
            return Err(n);
        }
        // Writes that waited for this one.
        loop {
            let at = g.file.as_ref().map_or(0, FileWriter::written);
            let Some(chunk) = g.pending.remove(&at) else { break };
            g.pending_bytes -= chunk.len();
            let file = g.file.as_mut().expect("an unfinished write has its file");
            if let Err(e) = self.run(file.write(Bytes::from(chunk))) {
                let n = errno(&e, true);
                g.outcome = Some(Err(n));
                return Err(n);
            }
        }
        Ok(data.len() as u32)
    }

    /// Answers `flush` and `fsync`: the file written through `fh` (if any) completed.
    /// A `flush` from another process than the opener is that process closing the copy
    /// of the descriptor it inherited (a child of the writer, at its `exec` or as
    /// `close_fds` does): the writer still holds the file and goes on writing, so that
    /// close ends nothing. `by` is the caller's pid for a `flush`, `None` for `fsync`.
    pub(crate) fn complete(&self, fh: FileHandle, by: Option<u32>, reply: ReplyEmpty) {
        let w = match self.handles.lock().get(&fh.0) {
            Some(Handle::Write(w)) => w.clone(),
            _ => return reply.ok(),
        };
        if let Some(pid) = by {
            let opener = w.lock().opener;
            if process_of(pid) != opener {
                return reply.ok();
            }
        }
        match self.finish(&w) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// The thread group (process) of the thread `pid` the kernel names in a request; the
/// thread itself when /proc does not say (it has exited, or another pid namespace).
fn process_of(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(pid)
}
