//! Directory markers. An object store has no directories: a key prefix exists while some
//! object has it. A directory with nothing in it is kept by a marker, an empty object
//! named `dir/`. Locus writes one only where it is needed: at a mkdir (the directory is
//! empty then), again when a delete or a rename leaves a directory empty, and removes
//! those of a path's ancestors once something lands under them ([`Ufs::drop_markers`],
//! called by the master after a persist, a mkdir or a rename). A local directory needs
//! none of this: there, these calls make or remove real directories or do nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use locus_common::Result;

use crate::{Ufs, ufs_err};

/// Directories (relative paths) whose marker this process removed and has not written
/// since: a persist under them then costs no DELETE. Bounded; forgetting is harmless (the
/// next drop deletes a key that is not there).
#[derive(Clone, Debug, Default)]
pub(crate) struct Unmarked(Arc<Mutex<HashSet<String>>>);

const UNMARKED_MAX: usize = 4096;

impl Unmarked {
    fn forget(&self, dir: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(dir);
    }
    fn contains(&self, dir: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains(dir)
    }
    fn insert(&self, dir: &str) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() >= UNMARKED_MAX {
            s.clear();
        }
        s.insert(dir.to_string());
    }
}

impl Ufs {
    /// Whether directories here live only as key prefixes and markers (S3).
    pub fn uses_markers(&self) -> bool {
        self.uri.starts_with("s3://")
    }

    /// Make directory `path` (on S3, its marker object `path/`).
    pub async fn create_dir(&self, path: &str) -> Result<()> {
        self.unmarked.forget(path.trim_end_matches('/'));
        self.op.create_dir(&Self::dir_path(path)).await.map_err(|e| ufs_err(format!("mkdir {path}"), e))
    }

    /// Something now exists in the UFS below each of `dirs` (relative directory paths):
    /// their markers are no longer needed to keep them, and go. The caller leaves out
    /// markers that are objects in their own right (a user's `dir/` key).
    pub async fn drop_markers(&self, dirs: &[String]) -> Result<()> {
        if !self.uses_markers() {
            return Ok(());
        }
        for dir in dirs.iter().map(|d| d.trim_end_matches('/')).filter(|d| !d.is_empty()) {
            if self.unmarked.contains(dir) {
                continue;
            }
            let key = Self::dir_path(dir);
            // (A DELETE of a key that is not there succeeds.)
            self.op.delete(&key).await.map_err(|e| ufs_err(format!("rm marker {key}"), e))?;
            self.unmarked.insert(dir);
        }
        Ok(())
    }

    /// `path` left the UFS: if its parent directory (not the root) now holds nothing, it
    /// gets a marker so that it still exists.
    pub(crate) async fn keep_parent(&self, path: &str) -> Result<()> {
        let Some((parent, _)) = path.trim_end_matches('/').rsplit_once('/') else {
            return Ok(());
        };
        if !self.uses_markers() || parent.is_empty() {
            return Ok(());
        }
        let dir = Self::dir_path(parent);
        let mut l = self.op.lister_with(&dir).await.map_err(|e| ufs_err(format!("list {dir}"), e))?;
        while let Some(e) = l.try_next().await.map_err(|e| ufs_err(format!("list {dir}"), e))? {
            if e.path().trim_start_matches('/') != dir.trim_start_matches('/') {
                return Ok(()); // something is in it
            }
        }
        self.create_dir(parent).await
    }
}
