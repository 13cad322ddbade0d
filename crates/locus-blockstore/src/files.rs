//! File work: where a tier keeps its files, the checksums beside them, and carrying out
//! the file work that decisions made under the state lock leave behind ([`Work`]), with
//! the lock released. Every function here blocks on the file system.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::Inner;
use crate::evict::Move;

pub(crate) fn block_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("blocks").join(id.to_string())
}

pub(crate) fn crc_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("blocks").join(format!("{id}.crc"))
}

/// The file in a tier directory naming the cluster (master namespace) its blocks belong to.
pub(crate) const CLUSTER_FILE: &str = "cluster_id";

pub(crate) fn read_cluster(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join(CLUSTER_FILE)).ok().and_then(|v| v.trim().parse().ok())
}

pub(crate) fn read_crc(p: &Path) -> Option<u32> {
    std::fs::read(p).ok().and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok()).map(u32::from_be_bytes)
}

pub(crate) fn ctime(p: &Path) -> Option<(i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.ctime(), m.ctime_nsec()))
}

/// crc32c of a whole file.
pub fn file_crc(p: &Path) -> std::io::Result<(u32, u64)> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut crc, mut n) = (0u32, 0u64);
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok((crc, n));
        }
        crc = crc32c::crc32c_append(crc, &buf[..k]);
        n += k as u64;
    }
}

/// Put a copy of `from` at `to`, leaving `from` in place (a reader may lease it while it
/// is copied): a hard link on one file system, else a copy under a temporary name
/// renamed into place (tiers may sit on different file systems).
pub(crate) fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(to)?;
            copy_file(from, to)
        }
        Err(_) => {
            let tmp = to.with_extension("moving");
            std::fs::copy(from, &tmp)?;
            std::fs::rename(&tmp, to)
        }
    }
}

/// The files of a dropped block: removed, or kept in the tier's pool.
#[derive(Debug)]
pub(crate) struct FileOp {
    pub block_id: u64,
    pub tier: usize,
    /// Its bytes, counted in the tier's `freeing` until done.
    pub len: u64,
    pub file: PathBuf,
    pub crc: PathBuf,
    /// Where the file goes in the pool, if it is kept.
    pub pool: Option<PathBuf>,
}

/// File work decided under the state lock, to be done after it is released
/// ([`Inner::run`]).
#[derive(Debug, Default)]
#[must_use = "the file work must be run"]
pub(crate) struct Work {
    pub files: Vec<FileOp>,
    /// Pooled files released: path, tier, length (counted in `freeing` until removed).
    pub release: Vec<(PathBuf, usize, u64)>,
    /// Block moves, in the order they must run (the deepest tier's first).
    pub moves: Vec<Move>,
}

impl Work {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.release.is_empty() && self.moves.is_empty()
    }
}

impl Inner {
    /// Carry out `work` (call it without the state lock): remove or pool dropped files,
    /// then run the moves, then whatever that left, settling the accounting as each
    /// piece is done. Blocks on the file system. Returns the pooled bytes released.
    pub(crate) fn run(&self, mut work: Work) -> u64 {
        let mut released = 0;
        while !work.is_empty() {
            let files = std::mem::take(&mut work.files);
            let release = std::mem::take(&mut work.release);
            let pooled: Vec<bool> = files
                .iter()
                .map(|f| {
                    let kept = f.pool.as_ref().is_some_and(|to| std::fs::rename(&f.file, to).is_ok());
                    if !kept {
                        let _ = std::fs::remove_file(&f.file);
                    }
                    let _ = std::fs::remove_file(&f.crc);
                    kept
                })
                .collect();
            for (p, _, len) in &release {
                let _ = std::fs::remove_file(p);
                released += len;
            }
            if !files.is_empty() || !release.is_empty() {
                let mut s = self.state.lock();
                for (f, kept) in files.into_iter().zip(pooled) {
                    s.tiers[f.tier].freeing -= f.len;
                    if let Some(n) = s.dropping.get_mut(&f.block_id) {
                        *n -= 1;
                        if *n == 0 {
                            s.dropping.remove(&f.block_id);
                        }
                    }
                    if kept {
                        let t = &mut s.tiers[f.tier];
                        t.pool.push((f.pool.expect("kept in the pool"), f.len, Instant::now()));
                        t.pooled += f.len;
                        s.fit_pool(f.tier, &mut work);
                    }
                }
                for (_, tier, len) in release {
                    s.tiers[tier].freeing -= len;
                }
                drop(s);
                self.settled.notify_all();
            }
            for m in std::mem::take(&mut work.moves) {
                self.run_move(m, &mut work);
            }
        }
        released
    }
}
