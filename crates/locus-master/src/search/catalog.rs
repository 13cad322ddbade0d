//! The catalog: every object's searchable attributes, keyed by its Locus path, and the
//! secondary indexes that answer a selective search without a scan. Both are redb
//! tables in the master's database, so a catalog change commits in the same transaction
//! as the namespace change it mirrors: a search sees exactly what reads see.
//!
//! | table | key | value |
//! |---|---|---|
//! | `catalog` | path | `CatalogEntry` (protobuf) |
//! | `catalog_index` | (attribute and value, path) | () |
//!
//! An index key starts with one byte naming the attribute, then the value encoded so
//! that byte order is value order: `content-length` as a big-endian u64,
//! `last-modified` as a big-endian i64 with its sign bit flipped, text as its bytes
//! (user metadata and tags as `name \0 value`, the metadata name in lower case). The
//! entries of one value are therefore in path order: an equality is a stream of paths in
//! key order, which pages without sorting however many objects match.

use std::collections::HashSet;

use locus_common::Result;
use locus_proto::pb;
use prost::Message;
use redb::{ReadableTable, TableDefinition, WriteTransaction};

use crate::store::{INODES, ROOT_ID, db_err, decode, get_inode};

pub const CATALOG: TableDefinition<&str, &[u8]> = TableDefinition::new("catalog");
pub const CATALOG_INDEX: TableDefinition<(&[u8], &str), ()> = TableDefinition::new("catalog_index");

/// The attribute byte that starts an index key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum IndexAttr {
    Size = 1,
    Modified = 2,
    ContentType = 3,
    Etag = 4,
    Meta = 5,
    Tag = 6,
}

/// Index key of a number attribute.
pub fn num_key(a: IndexAttr, v: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(a as u8);
    k.extend_from_slice(&v.to_be_bytes());
    k
}

/// Index key of `last-modified`.
pub fn time_key(ms: i64) -> Vec<u8> {
    num_key(IndexAttr::Modified, (ms as u64) ^ (1 << 63))
}

/// Index key of a text attribute (`name` for user metadata and tags).
pub fn text_key(a: IndexAttr, name: Option<&str>, v: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + name.map_or(0, str::len) + v.len());
    k.push(a as u8);
    if let Some(n) = name {
        k.extend_from_slice(n.as_bytes());
        k.push(0);
    }
    k.extend_from_slice(v.as_bytes());
    k
}

/// Every index key of an entry.
pub fn index_keys(e: &pb::CatalogEntry) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(4 + e.user.len() + e.tags.len());
    out.push(num_key(IndexAttr::Size, e.size));
    out.push(time_key(e.mtime_ms));
    out.push(text_key(IndexAttr::ContentType, None, &e.content_type));
    out.push(text_key(IndexAttr::Etag, None, &e.etag));
    for (n, v) in &e.user {
        out.push(text_key(IndexAttr::Meta, Some(&n.to_ascii_lowercase()), v));
    }
    for (n, v) in &e.tags {
        out.push(text_key(IndexAttr::Tag, Some(n), v));
    }
    out
}

/// The catalog entry of a namespace file.
pub fn entry_of(rec: &pb::InodeRecord) -> pb::CatalogEntry {
    let meta = rec.meta.as_ref();
    pb::CatalogEntry {
        size: rec.length,
        mtime_ms: rec.mtime_ms,
        content_type: meta.map(|m| m.content_type.clone()).unwrap_or_default(),
        etag: locus_proto::etag_of(meta, rec.is_dir, rec.length, &rec.fingerprint),
        user: meta.map(|m| m.user.clone()).unwrap_or_default(),
        tags: meta.map(|m| m.tags.clone()).unwrap_or_default(),
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

pub fn get(t: &impl ReadableTable<&'static str, &'static [u8]>, path: &str) -> Result<Option<pb::CatalogEntry>> {
    match t.get(path).map_err(db_err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}

/// Write `new` as the entry of `path` and bring the index in line with it.
fn put(w: &WriteTransaction, path: &str, old: Option<&pb::CatalogEntry>, new: &pb::CatalogEntry) -> Result<()> {
    if old == Some(new) {
        return Ok(());
    }
    let new_keys = index_keys(new);
    let mut idx = w.open_table(CATALOG_INDEX).map_err(db_err)?;
    if let Some(old) = old {
        let keep: HashSet<&Vec<u8>> = new_keys.iter().collect();
        for k in index_keys(old) {
            if !keep.contains(&k) {
                idx.remove((k.as_slice(), path)).map_err(db_err)?;
            }
        }
    }
    for k in &new_keys {
        idx.insert((k.as_slice(), path), ()).map_err(db_err)?;
    }
    w.open_table(CATALOG).map_err(db_err)?.insert(path, new.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(())
}

fn remove(w: &WriteTransaction, path: &str, old: &pb::CatalogEntry) -> Result<()> {
    let mut idx = w.open_table(CATALOG_INDEX).map_err(db_err)?;
    for k in index_keys(old) {
        idx.remove((k.as_slice(), path)).map_err(db_err)?;
    }
    drop(idx);
    w.open_table(CATALOG).map_err(db_err)?.remove(path).map_err(db_err)?;
    Ok(())
}

/// Mirror a namespace record just written (called by `store::put_inode`): a file's
/// entry is upserted; a directory has none. Attributes an import gave an object the
/// namespace knows only from a UFS listing (user metadata, tags, content type) are kept
/// while the object is the same (size and ETag).
pub fn on_put(w: &WriteTransaction, rec: &pb::InodeRecord) -> Result<()> {
    if rec.is_dir || rec.parent == 0 {
        return Ok(());
    }
    let Some(path) = path_of(&w.open_table(INODES).map_err(db_err)?, rec)? else {
        return Ok(());
    };
    let old = get(&w.open_table(CATALOG).map_err(db_err)?, &path)?;
    let mut new = entry_of(rec);
    if let Some(o) = &old
        && rec.meta.is_none()
        && o.size == new.size
        && o.etag == new.etag
    {
        new.content_type.clone_from(&o.content_type);
        new.user.clone_from(&o.user);
        new.tags.clone_from(&o.tags);
    }
    put(w, &path, old.as_ref(), &new)
}

/// The smallest string above every string that starts with `p` followed by anything
/// (`p` with its last character bumped), or `None` when there is none.
pub fn successor(p: &str) -> Option<String> {
    let mut cs: Vec<char> = p.chars().collect();
    while let Some(c) = cs.pop() {
        if let Some(n) = char::from_u32(c as u32 + 1).or_else(|| char::from_u32(0xE000).filter(|_| c as u32 == 0xD7FF))
        {
            cs.push(n);
            return Some(cs.into_iter().collect());
        }
    }
    None
}

/// The entries at `path` and below it (`path/...`).
fn subtree(w: &WriteTransaction, path: &str) -> Result<Vec<(String, pb::CatalogEntry)>> {
    let t = w.open_table(CATALOG).map_err(db_err)?;
    let mut out = Vec::new();
    if let Some(e) = get(&t, path)? {
        out.push((path.to_string(), e));
    }
    let lo = if path == "/" { "/".to_string() } else { format!("{path}/") };
    let hi = successor(&lo).unwrap_or_default();
    for e in t.range(lo.as_str()..hi.as_str()).map_err(db_err)? {
        let (k, v) = e.map_err(db_err)?;
        out.push((k.value().to_string(), decode(v.value())?));
    }
    Ok(out)
}

/// Forget `path` and everything below it (a delete, an unmount, an entry gone from the UFS).
pub fn remove_subtree(w: &WriteTransaction, path: &str) -> Result<()> {
    for (p, e) in subtree(w, path)? {
        remove(w, &p, &e)?;
    }
    Ok(())
}

/// Move the entries of `src` and below it to `dst` (a rename).
pub fn rename(w: &WriteTransaction, src: &str, dst: &str) -> Result<()> {
    for (p, e) in subtree(w, src)? {
        remove(w, &p, &e)?;
        let to = format!("{dst}{}", &p[src.len()..]);
        let old = get(&w.open_table(CATALOG).map_err(db_err)?, &to)?;
        put(w, &to, old.as_ref(), &e)?;
    }
    Ok(())
}

/// The inode of `path` in the namespace, if it has one, for an import's check.
fn in_namespace(old: Option<&pb::CatalogEntry>) -> bool {
    old.is_some_and(|o| o.inode != 0)
}

/// Upsert imported entries (sorted by path first, so each table is written in order);
/// entries of paths the namespace holds are left alone. Returns (written, skipped).
pub fn import(w: &WriteTransaction, entries: &[(String, pb::CatalogEntry)]) -> Result<(u64, u64)> {
    // In path order; of entries with the same path, the last one.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0).then(b.cmp(&a)));
    order.dedup_by(|b, a| entries[*a].0 == entries[*b].0);
    let mut cat = w.open_table(CATALOG).map_err(db_err)?;
    let mut removed: Vec<(Vec<u8>, String)> = Vec::new();
    let mut added: Vec<(Vec<u8>, String)> = Vec::new();
    let (mut written, mut skipped) = (0, 0);
    for i in order {
        let path = &entries[i].0;
        let e = pb::CatalogEntry { inode: 0, ..entries[i].1.clone() };
        let old: Option<pb::CatalogEntry> = match cat.get(path.as_str()).map_err(db_err)? {
            Some(v) => Some(decode(v.value())?),
            None => None,
        };
        if in_namespace(old.as_ref()) {
            skipped += 1;
            continue;
        }
        if old.as_ref() == Some(&e) {
            written += 1;
            continue;
        }
        let new_keys = index_keys(&e);
        if let Some(o) = &old {
            let keep: HashSet<&Vec<u8>> = new_keys.iter().collect();
            removed.extend(index_keys(o).into_iter().filter(|k| !keep.contains(k)).map(|k| (k, path.clone())));
        }
        cat.insert(path.as_str(), e.encode_to_vec().as_slice()).map_err(db_err)?;
        added.extend(new_keys.into_iter().map(|k| (k, path.clone())));
        written += 1;
    }
    drop(cat);
    let mut idx = w.open_table(CATALOG_INDEX).map_err(db_err)?;
    for (k, p) in &removed {
        idx.remove((k.as_slice(), p.as_str())).map_err(db_err)?;
    }
    added.sort_unstable();
    for (k, p) in &added {
        idx.insert((k.as_slice(), p.as_str()), ()).map_err(db_err)?;
    }
    Ok((written, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_as_values() {
        assert!(num_key(IndexAttr::Size, 9) < num_key(IndexAttr::Size, 10));
        assert!(num_key(IndexAttr::Size, u64::MAX) < time_key(i64::MIN));
        assert!(time_key(-5) < time_key(0));
        assert!(time_key(0) < time_key(1_700_000_000_000));
        assert!(text_key(IndexAttr::Meta, Some("a"), "z") < text_key(IndexAttr::Meta, Some("ab"), ""));
    }

    #[test]
    fn successors() {
        assert_eq!(successor("/a/").as_deref(), Some("/a0"));
        assert_eq!(successor("ab").as_deref(), Some("ac"));
        assert_eq!(successor("").as_deref(), None);
        assert!(successor("a\u{10FFFF}").unwrap() == "b");
    }
}
