//! The inodes the kernel holds and their paths. An inode number is the master's inode
//! id plus 2 (the root is 1); a file being created, which has no id until it is
//! complete, gets a provisional number from the top half of the range.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use locus_proto::pb;
use parking_lot::Mutex;

/// The root's inode number (FUSE's).
pub(crate) const ROOT: u64 = 1;
/// Provisional numbers start here.
const PROVISIONAL: u64 = 1 << 62;

/// The inode number of a file or directory.
pub(crate) fn ino_of(fi: &pb::FileInfo) -> u64 {
    if fi.path == "/" { ROOT } else { fi.id + 2 }
}

/// Inode number → (path, the kernel's lookup count).
pub(crate) struct Inodes {
    paths: Mutex<HashMap<u64, (String, u64)>>,
    next_provisional: AtomicU64,
}

impl Default for Inodes {
    fn default() -> Self {
        Inodes {
            paths: Mutex::new(HashMap::from([(ROOT, ("/".to_string(), 1))])),
            next_provisional: AtomicU64::new(PROVISIONAL),
        }
    }
}

impl Inodes {
    /// The path of inode `ino`, if the kernel was told of it.
    pub(crate) fn path(&self, ino: u64) -> Option<String> {
        self.paths.lock().get(&ino).map(|(p, _)| p.clone())
    }

    /// An inode named `path` (for `..`), if known.
    pub(crate) fn known(&self, path: &str) -> Option<u64> {
        self.paths.lock().iter().find(|(_, (p, _))| p.as_str() == path).map(|(i, _)| *i)
    }

    /// Inode `ino` is `path`, and the kernel holds one more reference to it (a lookup,
    /// mkdir or create answered it).
    pub(crate) fn remember(&self, ino: u64, path: &str) {
        let mut g = self.paths.lock();
        let e = g.entry(ino).or_insert_with(|| (path.to_string(), 0));
        e.0 = path.to_string();
        e.1 += 1;
    }

    /// A provisional inode for a file being created at `path`.
    pub(crate) fn provisional(&self, path: &str) -> u64 {
        let ino = self.next_provisional.fetch_add(1, Ordering::Relaxed);
        self.remember(ino, path);
        ino
    }

    /// The kernel dropped `nlookup` references to inode `ino`; at none it is forgotten
    /// (the root stays).
    pub(crate) fn forget(&self, ino: u64, nlookup: u64) {
        let mut g = self.paths.lock();
        if let Some(e) = g.get_mut(&ino) {
            e.1 = e.1.saturating_sub(nlookup);
            if e.1 == 0 && ino != ROOT {
                g.remove(&ino);
            }
        }
    }

    /// `from` (and everything under it) is now at `to`.
    pub(crate) fn renamed(&self, from: &str, to: &str) {
        let under = format!("{}/", from.trim_end_matches('/'));
        for (p, _) in self.paths.lock().values_mut() {
            if p == from {
                *p = to.to_string();
            } else if let Some(rest) = p.strip_prefix(&under) {
                *p = format!("{}/{rest}", to.trim_end_matches('/'));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_move_the_subtree_only() {
        let t = Inodes::default();
        t.remember(10, "/a");
        t.remember(11, "/a/b");
        t.remember(12, "/ab");
        t.renamed("/a", "/z");
        assert_eq!(t.path(10).as_deref(), Some("/z"));
        assert_eq!(t.path(11).as_deref(), Some("/z/b"));
        assert_eq!(t.path(12).as_deref(), Some("/ab"));
        t.forget(ROOT, 1);
        assert_eq!(t.path(ROOT).as_deref(), Some("/"));
        // Forgotten once per lookup.
        t.remember(10, "/z");
        t.forget(10, 1);
        assert_eq!(t.path(10).as_deref(), Some("/z"));
        t.forget(10, 1);
        assert_eq!(t.path(10), None);
        let p = t.provisional("/new");
        assert!(p >= PROVISIONAL && t.path(p).as_deref() == Some("/new"));
    }
}
