//! The catalog journal, beside the store: every namespace change that alters what a
//! search sees is journaled as a [`pb::CatalogChange`] in the same redb transaction as
//! the change itself, so it is as durable as the change. The namespace's commit path
//! writes it ([`crate::namespace::put_inode`], deletes, renames); the store knows nothing
//! of it. The indexer ([`crate::search::indexer`]) applies it to the search index in
//! order and trims it.
//!
//! | table | key | value |
//! |---|---|---|
//! | `catalog_journal` | seq (from the `catalog_seq` counter) | `CatalogChange` (protobuf) |

use locus_common::Result;
use locus_proto::pb;
use prost::Message;
use redb::{ReadableTable, TableDefinition, WriteTransaction};

use crate::store::{INODES, ROOT_ID, Store, db_err, get_counter, get_inode, next_id};

pub const CATALOG_JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("catalog_journal");
/// The counter holding the next journal seq (the first is 1).
pub const CATALOG_SEQ: &str = "catalog_seq";
/// The tables of the catalog before it moved into the search index (read once, to move
/// their entries, then deleted).
pub const LEGACY_CATALOG: TableDefinition<&str, &[u8]> = TableDefinition::new("catalog");
pub const LEGACY_CATALOG_INDEX: TableDefinition<(&[u8], &str), ()> = TableDefinition::new("catalog_index");

/// Creates the journal's table, so that its readers never meet a missing one.
pub fn create(store: &Store) -> Result<()> {
    let w = store.write()?;
    w.open_table(CATALOG_JOURNAL).map_err(db_err)?;
    w.commit().map_err(db_err)
}

/// The seq of the last change journaled (0: none yet).
pub fn head(t: &impl ReadableTable<&'static str, u64>) -> Result<u64> {
    Ok(get_counter(t, CATALOG_SEQ)?.saturating_sub(1))
}

pub(crate) fn append(w: &WriteTransaction, c: pb::CatalogChange) -> Result<()> {
    let seq = next_id(w, CATALOG_SEQ, 1)?;
    w.open_table(CATALOG_JOURNAL).map_err(db_err)?.insert(seq, c.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(())
}

/// The catalog entry of a namespace file.
pub fn entry_of(rec: &pb::InodeRecord) -> pb::CatalogEntry {
    let meta = rec.meta.as_ref();
    pb::CatalogEntry {
        size: rec.length,
        mtime_ms: rec.mtime_ms,
        content_type: meta.map(|m| m.content_type.clone()).unwrap_or_default(),
        etag: locus_proto::etag_of(meta, rec.is_dir, rec.length, &rec.fingerprint),
        user: meta.map(|m| m.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default(),
        tags: meta.map(|m| m.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default(),
        inode: rec.id,
    }
}

/// The path of a namespace entry, walking its parents (`None` if one is missing).
pub fn path_of(inodes: &impl ReadableTable<u64, &'static [u8]>, rec: &pb::InodeRecord) -> Result<Option<String>> {
    let mut names = vec![rec.name.clone()];
    let mut parent = rec.parent;
    while parent != ROOT_ID {
        let Some(p) = get_inode(inodes, parent)? else { return Ok(None) };
        names.push(p.name.clone());
        parent = p.parent;
    }
    names.reverse();
    Ok(Some(format!("/{}", names.join("/"))))
}

/// Mirror a namespace record just written (by [`crate::namespace::put_inode`], with the record
/// it replaced): a file's entry is journaled when what a search sees of it changed; a
/// directory has none.
pub fn on_put(w: &WriteTransaction, old: Option<&pb::InodeRecord>, rec: &pb::InodeRecord) -> Result<()> {
    if rec.is_dir || rec.parent == 0 {
        return Ok(());
    }
    let entry = entry_of(rec);
    if let Some(o) = old
        && o.parent == rec.parent
        && o.name == rec.name
        && !o.is_dir
        && o.meta.is_some() == rec.meta.is_some()
        && entry_of(o) == entry
    {
        return Ok(());
    }
    let Some(path) = path_of(&w.open_table(INODES).map_err(db_err)?, rec)? else {
        return Ok(());
    };
    append(
        w,
        pb::CatalogChange {
            kind: pb::CatalogChangeKind::CatalogPut.into(),
            path,
            entry: Some(entry),
            keep_imported: rec.meta.is_none(),
            ..Default::default()
        },
    )
}

/// Forget `path` and everything below it (a delete, an unmount, an entry gone from the UFS).
pub fn remove_subtree(w: &WriteTransaction, path: &str) -> Result<()> {
    append(
        w,
        pb::CatalogChange {
            kind: pb::CatalogChangeKind::CatalogDeleteTree.into(),
            path: path.to_string(),
            ..Default::default()
        },
    )
}

/// Move the entries of `src` and below it to `dst` (a rename).
pub fn rename(w: &WriteTransaction, src: &str, dst: &str) -> Result<()> {
    append(
        w,
        pb::CatalogChange {
            kind: pb::CatalogChangeKind::CatalogRename.into(),
            path: src.to_string(),
            dst: dst.to_string(),
            ..Default::default()
        },
    )
}
