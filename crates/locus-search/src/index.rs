//! The search index: every object's searchable attributes in tantivy (under
//! `<meta_dir>/search`), one document per object path, and the two ways a search reads
//! it in key order.
//!
//! | field | tantivy type | what |
//! |---|---|---|
//! | `key` | raw string, indexed, fast | the object's Locus path |
//! | `size` | u64, indexed, fast | `content-length` |
//! | `mtime` | i64, indexed, fast | `last-modified` (ms) |
//! | `ctype`, `etag` | raw string, indexed | `content-type`, `etag` |
//! | `meta`, `tag` | raw strings, indexed | `name \0 value` per user-metadata field (name in lower case) and tag |
//! | `ns` | u64, indexed | 1 when the namespace holds the object (imports leave it alone); absent otherwise |
//! | `entry` | stored bytes | the `CatalogEntry` (protobuf): what a hit returns and a clause is checked against |
//!
//! Key order, as S3 lists:
//! - [`KeyOrder`], a collector, keeps the smallest key ordinals of a query's matches per
//!   segment and names them through the key field's term dictionary: a page of a
//!   selective query costs its matches, not the catalog.
//! - [`KeyScan`] walks the key term dictionaries of every segment in step, from a start
//!   key: a page of an unselective query (or a listing) costs the page.

use std::collections::{BinaryHeap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use locus_common::{Error, Result};
use locus_proto::pb;
use prost::Message;
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::query::{InvertedIndexRangeQuery, Query};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, STORED, Schema, TextFieldIndexing, TextOptions, Value as _,
};
use tantivy::{
    DocAddress, DocId, DocSet, InvertedIndexReader, Searcher, SegmentReader, TERMINATED, TantivyDocument, Term,
};

use crate::columns::Columns;

pub fn ix_err(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("search index: {e}"))
}

/// The index's fields.
#[derive(Clone, Copy, Debug)]
pub struct Fields {
    pub key: Field,
    pub size: Field,
    pub mtime: Field,
    pub ctype: Field,
    pub etag: Field,
    pub meta: Field,
    pub tag: Field,
    pub ns: Field,
    pub entry: Field,
}

pub fn schema() -> Schema {
    // No field records norms: nothing is scored, and a norm costs a byte per document
    // and field in the writer's memory, on disk and in every merge.
    let raw = TextFieldIndexing::default()
        .set_tokenizer("raw")
        .set_index_option(IndexRecordOption::Basic)
        .set_fieldnorms(false);
    let string = TextOptions::default().set_indexing_options(raw.clone());
    let key = string.clone().set_fast("raw");
    let number = NumericOptions::default().set_indexed().set_fast();
    let mut b = Schema::builder();
    b.add_text_field("key", key);
    b.add_u64_field("size", number.clone());
    b.add_i64_field("mtime", number);
    b.add_text_field("ctype", string.clone());
    b.add_text_field("etag", string.clone());
    b.add_text_field("meta", string.clone());
    b.add_text_field("tag", string);
    b.add_u64_field("ns", NumericOptions::default().set_indexed());
    b.add_bytes_field("entry", STORED);
    b.build()
}

impl Fields {
    pub fn of(s: &Schema) -> Result<Fields> {
        let g = |n: &str| s.get_field(n).map_err(ix_err);
        Ok(Fields {
            key: g("key")?,
            size: g("size")?,
            mtime: g("mtime")?,
            ctype: g("ctype")?,
            etag: g("etag")?,
            meta: g("meta")?,
            tag: g("tag")?,
            ns: g("ns")?,
            entry: g("entry")?,
        })
    }

    pub fn key_term(&self, path: &str) -> Term {
        Term::from_field_text(self.key, path)
    }

    /// The document of `path`. Builds the metadata and tag terms and the stored entry in
    /// this thread's scratch buffers (an import builds millions of documents).
    pub fn doc(&self, path: &str, e: &pb::CatalogEntry) -> TantivyDocument {
        thread_local! {
            static SCRATCH: std::cell::RefCell<(String, Vec<u8>)> = const { std::cell::RefCell::new((String::new(), Vec::new())) };
        }
        SCRATCH.with_borrow_mut(|(term, stored)| {
            stored.clear();
            e.encode(stored).expect("a Vec grows");
            let terms: usize = e.user.iter().chain(&e.tags).map(|(n, v)| n.len() + v.len() + 8).sum();
            let mut d = TantivyDocument::with_capacity(
                path.len() + e.content_type.len() + e.etag.len() + terms + stored.len() + 64,
            );
            d.add_text(self.key, path);
            d.add_u64(self.size, e.size);
            d.add_i64(self.mtime, e.mtime_ms);
            d.add_text(self.ctype, &e.content_type);
            d.add_text(self.etag, &e.etag);
            for (n, v) in &e.user {
                pair_into(term, n, v);
                if n.bytes().any(|b| b.is_ascii_uppercase()) {
                    term[..n.len()].make_ascii_lowercase();
                }
                d.add_text(self.meta, &*term);
            }
            for (n, v) in &e.tags {
                pair_into(term, n, v);
                d.add_text(self.tag, &*term);
            }
            // Only the namespace's documents carry `ns` (an import's leave the term out).
            if e.inode != 0 {
                d.add_u64(self.ns, 1);
            }
            d.add_bytes(self.entry, stored);
            d
        })
    }
}

/// The term of a user-metadata field or a tag, `name \0 value`, into `buf`.
fn pair_into(buf: &mut String, name: &str, v: &str) {
    buf.clear();
    buf.push_str(name);
    buf.push('\0');
    buf.push_str(v);
}

/// The entry stored with a document.
pub fn entry_at(s: &Searcher, f: &Fields, a: DocAddress) -> Result<pb::CatalogEntry> {
    stored(s, f, a, |b| pb::CatalogEntry::decode(b))
}

/// What a listing shows of the entry stored with a document: its maps (user metadata,
/// tags) left empty, not decoded.
pub fn listing_at(s: &Searcher, f: &Fields, a: DocAddress) -> Result<pb::CatalogEntry> {
    let l = stored(s, f, a, |b| pb::CatalogListing::decode(b))?;
    Ok(pb::CatalogEntry {
        size: l.size,
        mtime_ms: l.mtime_ms,
        content_type: l.content_type,
        etag: l.etag,
        inode: l.inode,
        ..Default::default()
    })
}

fn stored<T>(
    s: &Searcher,
    f: &Fields,
    a: DocAddress,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, prost::DecodeError>,
) -> Result<T> {
    let d: TantivyDocument = s.doc(a).map_err(ix_err)?;
    let b = d.get_first(f.entry).and_then(|v| v.as_bytes()).ok_or_else(|| ix_err("a document without its entry"))?;
    decode(b).map_err(|e| ix_err(format!("entry: {e}")))
}

/// The first live document of a term of a segment.
fn live_doc(inv: &InvertedIndexReader, seg: &SegmentReader, ti: &tantivy::postings::TermInfo) -> Result<Option<DocId>> {
    let mut p = inv.read_postings_from_terminfo(ti, IndexRecordOption::Basic).map_err(ix_err)?;
    while p.doc() != TERMINATED {
        if seg.alive_bitset().is_none_or(|a| a.is_alive(p.doc())) {
            return Ok(Some(p.doc()));
        }
        p.advance();
    }
    Ok(None)
}

/// The document of `path`, if the index holds one.
pub fn find(s: &Searcher, f: &Fields, path: &str) -> Result<Option<DocAddress>> {
    let term = f.key_term(path);
    for (ord, seg) in s.segment_readers().iter().enumerate() {
        let inv = seg.inverted_index(f.key).map_err(ix_err)?;
        if let Some(ti) = inv.get_term_info(&term).map_err(ix_err)?
            && let Some(d) = live_doc(&inv, seg, &ti)?
        {
            return Ok(Some(DocAddress::new(ord as u32, d)));
        }
    }
    Ok(None)
}

/// The entry of `path`, if the index holds one.
pub fn lookup(s: &Searcher, f: &Fields, path: &str) -> Result<Option<pb::CatalogEntry>> {
    match find(s, f, path)? {
        Some(a) => entry_at(s, f, a).map(Some),
        None => Ok(None),
    }
}

/// The key ordinals of a segment's key column within a key range.
fn ord_bounds(col: &tantivy::columnar::StrColumn, r: &KeyRange) -> tantivy::Result<(Bound<u64>, Bound<u64>)> {
    fn b(x: &Bound<String>) -> Bound<&[u8]> {
        x.as_ref().map(|s| s.as_bytes())
    }
    Ok(col.dictionary().term_bounds_to_ord(b(&r.0), b(&r.1))?)
}

/// A range of keys (the scope of a search).
pub type KeyRange = (Bound<String>, Bound<String>);

/// A collector of a query's first `limit` matches in key order within a key range, with
/// their documents. (The range is checked on each match's key ordinal: as a query it
/// would cost a pass over every document.)
pub struct KeyOrder {
    pub limit: usize,
    pub range: KeyRange,
    pub cols: Arc<Columns>,
}

pub struct KeyOrderSeg {
    seg: u32,
    ords: (Bound<u64>, Bound<u64>),
    col: Option<tantivy::columnar::StrColumn>,
    heap: BinaryHeap<(u64, DocId)>,
    limit: usize,
}

impl Collector for KeyOrder {
    type Fruit = Vec<(String, DocAddress)>;
    type Child = KeyOrderSeg;

    fn for_segment(&self, seg: u32, r: &SegmentReader) -> tantivy::Result<KeyOrderSeg> {
        let col = self.cols.get(r)?.key.clone();
        let ords = match &col {
            Some(c) => ord_bounds(c, &self.range)?,
            None => (Bound::Unbounded, Bound::Unbounded),
        };
        Ok(KeyOrderSeg { seg, ords, col, heap: BinaryHeap::new(), limit: self.limit })
    }

    fn requires_scoring(&self) -> bool {
        false
    }

    fn merge_fruits(&self, segs: Vec<Vec<(String, DocAddress)>>) -> tantivy::Result<Self::Fruit> {
        let mut all: Vec<(String, DocAddress)> = segs.into_iter().flatten().collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all.dedup_by(|b, a| a.0 == b.0);
        all.truncate(self.limit);
        Ok(all)
    }
}

impl SegmentCollector for KeyOrderSeg {
    type Fruit = Vec<(String, DocAddress)>;

    #[inline]
    fn collect(&mut self, doc: DocId, _: tantivy::Score) {
        let Some(col) = &self.col else { return };
        let Some(o) = col.ords().first(doc) else { return };
        if !std::ops::RangeBounds::contains(&self.ords, &o) {
            return;
        }
        if self.heap.len() < self.limit {
            self.heap.push((o, doc));
        } else if self.heap.peek().is_some_and(|top| (o, doc) < *top) {
            self.heap.pop();
            self.heap.push((o, doc));
        }
    }

    fn harvest(self) -> Self::Fruit {
        let Some(col) = &self.col else { return Vec::new() };
        let found = self.heap.into_sorted_vec();
        let mut out = Vec::with_capacity(found.len());
        // One walk of the key column's dictionary names them all.
        let ords: Vec<u64> = found.iter().map(|(o, _)| *o).collect();
        let mut names = Vec::with_capacity(ords.len());
        let _ = col.dictionary().sorted_ords_to_term_cb(&ords, |b| names.push(String::from_utf8_lossy(b).into_owned()));
        out.extend(names.into_iter().zip(found).map(|(k, (_, d))| (k, DocAddress::new(self.seg, d))));
        out
    }
}

/// A collector of how many of a query's matches lie within a key range.
pub struct KeyCount {
    pub range: KeyRange,
    pub cols: Arc<Columns>,
}

pub struct KeyCountSeg {
    ords: (Bound<u64>, Bound<u64>),
    col: Option<tantivy::columnar::StrColumn>,
    n: u64,
}

impl Collector for KeyCount {
    type Fruit = u64;
    type Child = KeyCountSeg;

    fn for_segment(&self, _: u32, r: &SegmentReader) -> tantivy::Result<KeyCountSeg> {
        let col = self.cols.get(r)?.key.clone();
        let ords = match &col {
            Some(c) => ord_bounds(c, &self.range)?,
            None => (Bound::Unbounded, Bound::Unbounded),
        };
        Ok(KeyCountSeg { ords, col, n: 0 })
    }

    fn requires_scoring(&self) -> bool {
        false
    }

    fn merge_fruits(&self, segs: Vec<u64>) -> tantivy::Result<u64> {
        Ok(segs.into_iter().sum())
    }
}

impl SegmentCollector for KeyCountSeg {
    type Fruit = u64;

    fn collect(&mut self, doc: DocId, _: tantivy::Score) {
        if let Some(col) = &self.col
            && let Some(o) = col.ords().first(doc)
            && std::ops::RangeBounds::contains(&self.ords, &o)
        {
            self.n += 1;
        }
    }

    fn harvest(self) -> u64 {
        self.n
    }
}

/// Keys taken from a segment's dictionary at once.
const SCAN_CHUNK: usize = 256;

/// One segment's place in a [`KeyScan`].
struct SegCursor {
    ord: u32,
    inv: Arc<InvertedIndexReader>,
    buf: VecDeque<(String, DocId)>,
    /// Where the next chunk starts.
    from: Bound<Vec<u8>>,
    done: bool,
}

/// Every live document from a start key up to an end key, in key order: the key
/// dictionaries of all segments walked in step, a chunk at a time.
pub struct KeyScan<'s> {
    searcher: &'s Searcher,
    segs: Vec<SegCursor>,
    hi: Bound<Vec<u8>>,
}

impl<'s> KeyScan<'s> {
    pub fn new(searcher: &'s Searcher, f: &Fields, lo: Bound<&str>, hi: Bound<&str>) -> Result<KeyScan<'s>> {
        let own = |b: Bound<&str>| b.map(|s| s.as_bytes().to_vec());
        let mut segs = Vec::new();
        for (ord, seg) in searcher.segment_readers().iter().enumerate() {
            let inv = seg.inverted_index(f.key).map_err(ix_err)?;
            segs.push(SegCursor { ord: ord as u32, inv, buf: VecDeque::new(), from: own(lo), done: false });
        }
        Ok(KeyScan { searcher, segs, hi: own(hi) })
    }

    fn refill(&self, c: &mut SegCursor) -> Result<()> {
        let seg = self.searcher.segment_reader(c.ord);
        while c.buf.is_empty() && !c.done {
            let mut b = c.inv.terms().range();
            b = match &c.from {
                Bound::Included(k) => b.ge(k),
                Bound::Excluded(k) => b.gt(k),
                Bound::Unbounded => b,
            };
            b = match &self.hi {
                Bound::Included(k) => b.le(k),
                Bound::Excluded(k) => b.lt(k),
                Bound::Unbounded => b,
            };
            let mut st = b.into_stream().map_err(ix_err)?;
            let mut n = 0;
            let mut last = None;
            while n < SCAN_CHUNK && st.advance() {
                n += 1;
                last = Some(st.key().to_vec());
                if let Some(d) = live_doc(&c.inv, seg, st.value())? {
                    c.buf.push_back((String::from_utf8_lossy(st.key()).into_owned(), d));
                }
            }
            match last {
                Some(k) if n == SCAN_CHUNK => c.from = Bound::Excluded(k),
                _ => c.done = true,
            }
        }
        Ok(())
    }

    /// The next key and its document.
    pub fn next_doc(&mut self) -> Result<Option<(String, DocAddress)>> {
        let mut segs = std::mem::take(&mut self.segs);
        let r = (|| {
            for c in segs.iter_mut() {
                self.refill(c)?;
            }
            let best = segs
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.buf.front().map(|(k, _)| (i, k)))
                .min_by(|a, b| a.1.cmp(b.1))
                .map(|(i, _)| i);
            let Some(i) = best else { return Ok(None) };
            let (k, d) = segs[i].buf.pop_front().expect("a head");
            let ord = segs[i].ord;
            // The same key live in another segment (not expected: a put deletes first).
            for c in segs.iter_mut() {
                if c.buf.front().is_some_and(|(k2, _)| *k2 == k) {
                    c.buf.pop_front();
                }
            }
            Ok(Some((k, DocAddress::new(ord, d))))
        })();
        self.segs = segs;
        r
    }
}

/// Every key term of every segment (deleted documents' too), for the indexer's filters.
pub fn all_keys(s: &Searcher, f: &Fields, mut cb: impl FnMut(&[u8])) -> Result<()> {
    for seg in s.segment_readers() {
        let inv = seg.inverted_index(f.key).map_err(ix_err)?;
        let mut st = inv.terms().stream().map_err(ix_err)?;
        while st.advance() {
            cb(st.key());
        }
    }
    Ok(())
}

/// The keys of the documents the namespace holds (deleted documents' too).
pub fn namespace_keys(s: &Searcher, f: &Fields, mut cb: impl FnMut(&[u8])) -> Result<()> {
    let term = Term::from_field_u64(f.ns, 1);
    for seg in s.segment_readers() {
        let inv = seg.inverted_index(f.ns).map_err(ix_err)?;
        let Some(mut p) = inv.read_postings(&term, IndexRecordOption::Basic).map_err(ix_err)? else { continue };
        let Some(col) = seg.fast_fields().str("key").map_err(ix_err)? else { continue };
        let mut ords = Vec::new();
        while p.doc() != TERMINATED {
            ords.extend(col.ords().first(p.doc()));
            p.advance();
        }
        ords.sort_unstable();
        ords.dedup();
        col.dictionary().sorted_ords_to_term_cb(&ords, &mut cb).map_err(ix_err)?;
    }
    Ok(())
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

/// Documents whose key is in `[lo, hi)` (`hi` `None`: no end), through the key's terms
/// (a range of the key column would read every document at each commit).
pub fn key_range(f: &Fields, lo: &str, hi: Option<&str>) -> Box<dyn Query> {
    Box::new(InvertedIndexRangeQuery::new(
        Bound::Included(f.key_term(lo)),
        hi.map_or(Bound::Unbounded, |h| Bound::Excluded(f.key_term(h))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successors() {
        assert_eq!(successor("/a/").as_deref(), Some("/a0"));
        assert_eq!(successor("ab").as_deref(), Some("ac"));
        assert_eq!(successor("").as_deref(), None);
        assert!(successor("a\u{10FFFF}").unwrap() == "b");
    }
}
