//! Directory markers on object-store UFSes (see `locus_ufs::Ufs::drop_markers`). A mkdir
//! writes a marker (`dir/`) so the empty directory exists in the UFS; once something
//! lands below a directory (a persisted file, a through write, a subdirectory's marker,
//! a rename's destination) its marker, and those of its ancestors, are no longer needed
//! and go, so the user's bucket holds only the user's objects. A directory flagged as an
//! object (a gateway PUT of `dir/`, which carries object metadata) keeps its marker: that
//! one is the user's key. The UFS side writes a marker again where a delete or a rename
//! leaves a directory empty.

use locus_common::path as lpath;

use crate::mounts::MountEntry;
use crate::store::*;
use crate::*;

impl Master {
    /// `rel` (relative to mount `m`) now exists in the UFS: remove the markers of its
    /// ancestors below the mount's root. Failures are logged, not returned: a marker
    /// left behind is untidy, not wrong.
    pub(crate) async fn settle_markers(&self, m: &MountEntry, rel: &str) {
        if !m.ufs.uses_markers() {
            return;
        }
        let dirs = match self.unflagged_ancestors(m, rel) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(path = rel, error = %e, "cannot read the ancestors of a persisted path");
                return;
            }
        };
        if let Err(e) = m.ufs.drop_markers(&dirs).await {
            tracing::warn!(path = rel, error = %e, "cannot remove directory markers above a persisted path");
        }
    }

    /// The ancestors of `rel` (nearest first, relative to the mount) that are not flagged
    /// as objects in the namespace.
    fn unflagged_ancestors(&self, m: &MountEntry, rel: &str) -> Result<Vec<String>> {
        let r = self.ns().read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let inodes = r.open_table(INODES).map_err(db_err)?;
        let mut out = Vec::new();
        let mut cur = rel.trim_matches('/');
        while let Some((parent, _)) = cur.rsplit_once('/') {
            cur = parent;
            let flagged = match lookup(&ch, &lpath::join(&m.info.path, parent))? {
                Some(id) => get_inode(&inodes, id)?.is_some_and(|d| d.meta.is_some()),
                None => false,
            };
            if !flagged {
                out.push(parent.to_string());
            }
        }
        Ok(out)
    }
}
