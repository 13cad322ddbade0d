//! Metadata search: a Zenko-style WHERE clause over every object under a directory, in
//! key order, page by page, answered from the search index ([`index`], kept current by
//! [`indexer`] from the journal [`crate::journal`] holds).
//!
//! A clause is translated into a tantivy query that matches at least what the clause
//! matches: equalities and ranges of `key`, `content-length`, `last-modified` and the
//! text attributes exactly; a `LIKE` with a literal prefix as the range of that prefix;
//! a condition on user metadata or a tag the index cannot answer (a regular expression,
//! a numeric comparison of text) as "has that field"; `!=` and Locus's own attributes
//! not at all. Each candidate's stored entry is then checked against the whole clause,
//! so the query only prunes. Candidates come in key order:
//! - from the query, a batch of its first matches by key at a time ([`KeyOrder`]), the
//!   batch growing while the clause rejects candidates;
//! - with no query, from a walk of the key dictionary over the scope ([`KeyScan`]), or,
//!   for a key LIKE whose matches start with one of a few literals, over each literal's
//!   range in turn;
//! - merged with both, the changes since the last commit ([`indexer::Overlay`]): the
//!   committed candidates they hide are dropped and their entries in scope come in
//!   order, so a search sees every acknowledged change without waiting for a commit.
//!
//! A count with an exact query is the index's count. A search that must check many
//! candidates stops after a budget of entries and answers a truncated page that resumes
//! where it stopped, as S3 may.

pub mod indexer;
use locus_search::inventory;
use locus_search::{columns, ranges, translate};
pub use locus_search::{index, query};
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use locus_common::config::TierAlias;
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, Result};
use locus_proto::pb;
use redb::ReadTransaction;
use tantivy::DocAddress;
use tantivy::query::{AllQuery, Query};

use crate::store::{INODES, LOCATIONS, StoredTier, db_err, get_inode};
use crate::*;
use columns::Columns;
use index::{Fields, KeyCount, KeyOrder, KeyRange, KeyScan, entry_at, ix_err, listing_at, successor};
use indexer::Overlay;
use query::{Attr, Expr, LocusAttrs, Object};
use ranges::meet;
use translate::Translator;

/// Most candidates one batch of a query's matches holds.
const BATCH_MAX: usize = 1 << 20;
/// Entries one page examines before it answers truncated.
const SCAN_BUDGET: u64 = 5_000_000;
/// Time one page may take before it answers truncated.
const TIME_BUDGET: Duration = Duration::from_secs(5);
/// Most keys one page holds.
const MAX_PAGE: usize = 10_000;

/// A candidate: the catalog entry and, when looked up, Locus's own attributes.
struct Candidate<'a> {
    key: &'a str,
    e: &'a pb::CatalogEntry,
    locus: Option<LocusAttrs>,
}

impl Object for Candidate<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn size(&self) -> u64 {
        self.e.size
    }
    fn mtime_ms(&self) -> i64 {
        self.e.mtime_ms
    }
    fn content_type(&self) -> &str {
        &self.e.content_type
    }
    fn etag(&self) -> &str {
        &self.e.etag
    }
    fn meta(&self, name: &str) -> Option<&str> {
        self.e.user.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn tag(&self, name: &str) -> Option<&str> {
        self.e.tags.get(name).map(String::as_str)
    }
    fn locus(&self) -> Option<&LocusAttrs> {
        self.locus.as_ref()
    }
}

/// The page of a search (keys relative to the searched directory).
#[derive(Default)]
pub(crate) struct Page {
    pub hits: Vec<(String, pb::CatalogEntry, LocusAttrs)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    pub next_after: String,
    pub count: u64,
    pub scanned: u64,
}

/// What a search reads: the index as of its last commit, the changes since, and the
/// namespace.
pub(crate) struct Snapshot {
    pub searcher: tantivy::Searcher,
    pub ov: Arc<Overlay>,
    pub f: Fields,
    pub r: ReadTransaction,
    /// The searcher's fast columns.
    pub cols: Arc<Columns>,
}

impl Snapshot {
    /// The catalog as of now (see [`indexer::Catalog::view`]), with the namespace.
    pub(crate) fn of(c: &indexer::Catalog, store: &crate::store::Store, commit: bool) -> Result<Snapshot> {
        let (searcher, ov) = c.view(store, commit)?;
        let cols = c.columns.columns(&searcher)?;
        Ok(Snapshot { searcher, ov, f: c.f, r: store.read()?, cols })
    }
}

/// One search, resolved against the namespace's layout.
pub(crate) struct Search {
    expr: Expr,
    /// Full path every key starts with (`/bucket/`, or `/` at the root).
    base: String,
    /// `base` + the key prefix.
    lo: String,
    /// First path past every key with the prefix.
    hi: Option<String>,
    /// Start strictly after this path (or at it, when `Included`).
    start: Bound<String>,
    limit: usize,
    delimiter: Option<String>,
    count_only: bool,
    /// Hits carry only what a listing shows (see `SearchRequest.listing`).
    listing: bool,
    /// Mount points, longest first (for `locus.mount`).
    mounts: Vec<String>,
}

/// Where candidates come from, in key order.
enum Candidates<'s> {
    /// Every key in scope (or in the ranges of its literal prefixes), range by range.
    Scan { cur: KeyScan<'s>, rest: VecDeque<KeyRange> },
    /// A query's matches, a batch at a time (batches grow while the clause rejects them).
    Query { q: Box<dyn Query>, buf: VecDeque<(String, DocAddress)>, after: Bound<String>, batch: usize, done: bool },
}

/// A candidate's entry: in the index, or changed since its last commit.
enum Src<'o> {
    Doc(DocAddress),
    Changed(&'o pb::CatalogEntry),
}

/// The candidates of the last commit that the overlay does not hide, merged in key
/// order with the overlay's entries in scope.
struct Merged<'s> {
    committed: Candidates<'s>,
    /// The next committed candidate, when read ahead.
    peek: Option<(String, DocAddress)>,
    exhausted: bool,
    changed: std::iter::Peekable<std::vec::IntoIter<(&'s String, &'s pb::CatalogEntry)>>,
}

impl Search {
    pub(crate) fn new(req: &pb::SearchRequest, mounts: Vec<String>) -> Result<Search> {
        // No clause: every object (the SQL table's scan).
        let expr = if req.r#where.trim().is_empty() { Expr::And(Vec::new()) } else { Expr::parse(&req.r#where)? };
        let dir = normalize(if req.path.is_empty() { "/" } else { &req.path })?;
        let base = if dir == "/" { "/".to_string() } else { format!("{dir}/") };
        let lo = format!("{base}{}", req.prefix);
        let hi = successor(&lo).filter(|_| !lo.is_empty());
        let delimiter = Some(req.delimiter.clone()).filter(|d| !d.is_empty());
        let mut start = Bound::Excluded(format!("{base}{}", req.after));
        if req.after.is_empty() {
            start = Bound::Included(lo.clone());
        } else if let Some(d) = &delimiter
            && let Some(i) = req.after.strip_prefix(req.prefix.as_str()).and_then(|r| r.find(d.as_str()))
        {
            // After a common prefix: skip everything the group stands for.
            let group = &req.after[..req.prefix.len() + i + d.len()];
            if req.after == group {
                start = match successor(&format!("{base}{group}")) {
                    Some(s) => Bound::Included(s),
                    None => Bound::Excluded(format!("{base}{group}")),
                };
            }
        }
        if let Bound::Excluded(s) | Bound::Included(s) = &start
            && s.as_str() < lo.as_str()
        {
            start = Bound::Included(lo.clone());
        }
        let limit = if req.limit == 0 { 1000 } else { (req.limit as usize).min(MAX_PAGE) };
        Ok(Search {
            expr,
            base,
            lo,
            hi,
            start,
            limit,
            delimiter,
            count_only: req.count_only,
            listing: req.listing,
            mounts,
        })
    }

    /// The keys in scope from `from` on.
    fn scope(&self, from: &Bound<String>) -> KeyRange {
        let lo = match from {
            Bound::Unbounded => Bound::Included(self.lo.clone()),
            b => b.clone(),
        };
        (lo, self.hi.clone().map_or(Bound::Unbounded, Bound::Excluded))
    }

    /// The key ranges, in order, a LIKE with literal prefixes confines a clause to (alone,
    /// or in an AND): one per prefix when the pattern has a few, else their common one.
    fn prefix_ranges(&self, e: &Expr) -> Option<Vec<KeyRange>> {
        let range = |p: &str| {
            let lo = format!("{}{p}", self.base);
            let hi = successor(&lo).map_or(Bound::Unbounded, Bound::Excluded);
            (Bound::Included(lo), hi)
        };
        match e {
            Expr::Like { attr: Attr::Key, prefixes, .. } if prefixes.len() > 1 => {
                Some(prefixes.iter().map(|p| range(p)).collect())
            }
            Expr::Like { attr: Attr::Key, prefix: Some(p), .. } => Some(vec![range(p)]),
            Expr::And(v) => v.iter().find_map(|c| self.prefix_ranges(c)),
            _ => None,
        }
    }

    fn candidates<'s>(&self, snap: &'s Snapshot, q: Option<Box<dyn Query>>, exact: bool) -> Result<Candidates<'s>> {
        let scope = self.scope(&self.start);
        // A clause on the key alone under literal prefixes: walking the prefixes' keys is
        // cheaper than collecting the query's matches batch by batch.
        let (q, mut ranges) = match (q, self.expr.only_key().then(|| self.prefix_ranges(&self.expr)).flatten()) {
            (Some(_), Some(rs)) => (None, rs.into_iter().map(|r| meet(scope.clone(), r)).collect()),
            (q, _) => (q, VecDeque::from([scope])),
        };
        Ok(match q {
            None => {
                let cur = key_scan(snap, &ranges.pop_front().expect("a range"))?;
                Candidates::Scan { cur, rest: ranges }
            }
            Some(q) => Candidates::Query {
                q,
                buf: VecDeque::new(),
                after: self.start.clone(),
                batch: if exact { self.limit + 1 } else { (self.limit + 1).max(1000) },
                done: false,
            },
        })
    }

    fn next_candidate<'s>(&self, snap: &'s Snapshot, c: &mut Candidates<'s>) -> Result<Option<(String, DocAddress)>> {
        match c {
            Candidates::Scan { cur, rest } => loop {
                if let Some(d) = cur.next_doc()? {
                    return Ok(Some(d));
                }
                let Some(r) = rest.pop_front() else { return Ok(None) };
                *cur = key_scan(snap, &r)?;
            },
            Candidates::Query { q, buf, after, batch, done } => {
                if buf.is_empty() && !*done {
                    let top = KeyOrder { limit: *batch, range: self.scope(after), cols: snap.cols.clone() };
                    let got = snap.searcher.search(&**q, &top).map_err(ix_err)?;
                    *done = got.len() < *batch;
                    if let Some((k, _)) = got.last() {
                        *after = Bound::Excluded(k.clone());
                    }
                    *batch = (*batch * 4).min(BATCH_MAX);
                    buf.extend(got);
                }
                Ok(buf.pop_front())
            }
        }
    }

    fn next_merged<'s>(&self, snap: &'s Snapshot, m: &mut Merged<'s>) -> Result<Option<(String, Src<'s>)>> {
        while m.peek.is_none() && !m.exhausted {
            match self.next_candidate(snap, &mut m.committed)? {
                Some((p, _)) if snap.ov.hides(&p) => {}
                Some(c) => m.peek = Some(c),
                None => m.exhausted = true,
            }
        }
        let changed_first = match (&m.peek, m.changed.peek()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some((p, _)), Some((c, _))) => c.as_str() < p.as_str(),
        };
        Ok(if changed_first {
            m.changed.next().map(|(p, e)| (p.clone(), Src::Changed(e)))
        } else {
            m.peek.take().map(|(p, a)| (p, Src::Doc(a)))
        })
    }

    /// Puts a matching object on `page`: its common prefix when the delimiter groups it
    /// (once per group), else the object itself, with the entry and Locus attributes
    /// `hit` makes. `false` when the page is already full: it is then truncated.
    fn add(
        &self,
        page: &mut Page,
        key: &str,
        hit: impl FnOnce() -> Result<(pb::CatalogEntry, LocusAttrs)>,
    ) -> Result<bool> {
        let from = self.lo.len() - self.base.len();
        let group =
            self.delimiter.as_ref().and_then(|d| key[from..].find(d.as_str()).map(|i| &key[..from + i + d.len()]));
        if group.is_some() && page.prefixes.last().map(String::as_str) == group {
            return Ok(true);
        }
        if page.prefixes.len() + page.hits.len() == self.limit {
            page.truncated = true;
            return Ok(false);
        }
        page.next_after = group.unwrap_or(key).to_string();
        match group {
            Some(g) => page.prefixes.push(g.to_string()),
            None => {
                let (entry, locus) = hit()?;
                page.hits.push((key.to_string(), entry, locus));
            }
        }
        Ok(true)
    }

    /// Run the search against `snap`.
    pub(crate) fn run(&self, snap: &Snapshot) -> Result<Page> {
        let (q, exact) =
            Translator { base: &self.base, s: &snap.searcher, f: &snap.f, cols: &snap.cols }.query(&self.expr);
        if self.count_only && exact && snap.ov.is_empty() {
            // The index's count: no candidate needs reading.
            let q: Box<dyn Query> = q.unwrap_or_else(|| Box::new(AllQuery));
            let count = KeyCount { range: self.scope(&self.start), cols: snap.cols.clone() };
            return Ok(Page { count: snap.searcher.search(&*q, &count).map_err(ix_err)?, ..Page::default() });
        }
        let mut page = Page::default();
        let ns = NsTables::open(&snap.r)?;
        let needs_locus = self.expr.needs_locus();
        // The query's matches are the clause's: none needs checking against its entry.
        let trusted = exact && !needs_locus;
        let only_key = self.expr.only_key();
        let no_entry = pb::CatalogEntry::default();
        let began = Instant::now();
        let mut last_key = String::new();
        let changed: Vec<_> = snap.ov.entries(&self.scope(&self.start)).collect();
        let mut cands = Merged {
            committed: self.candidates(snap, q, exact)?,
            peek: None,
            exhausted: false,
            changed: changed.into_iter().peekable(),
        };
        while let Some((path, src)) = self.next_merged(snap, &mut cands)? {
            page.scanned += 1;
            let key = &path[self.base.len()..];
            if !self.count_only
                && page.scanned.is_multiple_of(4096)
                && (page.scanned >= SCAN_BUDGET || began.elapsed() >= TIME_BUDGET)
            {
                page.truncated = true;
                page.next_after = last_key;
                return Ok(page);
            }
            last_key = key.to_string();
            if only_key && !self.expr.matches(&Candidate { key, e: &no_entry, locus: None }) {
                continue; // (without reading the entry)
            }
            let check = !(trusted && matches!(src, Src::Doc(_)));
            if !check && self.count_only {
                page.count += 1;
                continue;
            }
            let entry = match src {
                Src::Doc(addr) if !check && self.listing => listing_at(&snap.searcher, &snap.f, addr)?,
                Src::Doc(addr) => entry_at(&snap.searcher, &snap.f, addr)?,
                Src::Changed(e) => e.clone(),
            };
            let locus = if needs_locus { Some(locus_attrs(&ns, &path, &entry, &self.mounts)?) } else { None };
            let cand = Candidate { key, e: &entry, locus };
            if check && !self.expr.matches(&cand) {
                continue;
            }
            if self.count_only {
                page.count += 1;
                continue;
            }
            let Candidate { locus, .. } = cand;
            let added = self.add(&mut page, key, || {
                let locus = match locus {
                    Some(l) => l,
                    None if self.listing => LocusAttrs::default(),
                    None => locus_attrs(&ns, &path, &entry, &self.mounts)?,
                };
                let mut entry = entry;
                if self.listing {
                    entry.user.clear();
                    entry.tags.clear();
                }
                Ok((entry, locus))
            })?;
            if !added {
                break;
            }
        }
        if !page.truncated {
            page.next_after.clear();
        }
        Ok(page)
    }
}

/// A walk of the index's keys in `r`.
fn key_scan<'s>(snap: &'s Snapshot, r: &KeyRange) -> Result<KeyScan<'s>> {
    KeyScan::new(&snap.searcher, &snap.f, r.0.as_ref().map(String::as_str), r.1.as_ref().map(String::as_str))
}

/// The namespace tables Locus's own attributes are read from, opened once per search.
struct NsTables {
    inodes: redb::ReadOnlyTable<u64, &'static [u8]>,
    locations: redb::ReadOnlyTable<(u64, u64), StoredTier>,
}

impl NsTables {
    fn open(r: &ReadTransaction) -> Result<NsTables> {
        Ok(NsTables {
            inodes: r.open_table(INODES).map_err(db_err)?,
            locations: r.open_table(LOCATIONS).map_err(db_err)?,
        })
    }
}

/// Locus's own attributes of a catalog entry (`mounts`: longest first).
fn locus_attrs(ns: &NsTables, path: &str, e: &pb::CatalogEntry, mounts: &[String]) -> Result<LocusAttrs> {
    let mount = mounts.iter().find(|m| lpath::strip_prefix(path, m).is_some()).cloned().unwrap_or_else(|| "/".into());
    let mut a = LocusAttrs { tier: "NONE".into(), mount, ..Default::default() };
    let rec = if e.inode == 0 { None } else { get_inode(&ns.inodes, e.inode)? };
    let Some(rec) = rec else {
        return Ok(a);
    };
    a.persist_state = rec.persist_state();
    a.pinned = rec.pinned;
    let loc = &ns.locations;
    let (mut cached, mut best) = (0u64, None::<TierAlias>);
    for i in 0..crate::namespace::block_count(rec.length, rec.block_size) {
        let b = locus_common::block_id(rec.version, i);
        let mut held = false;
        for l in loc.range((b, 0)..=(b, u64::MAX)).map_err(db_err)? {
            let (_, v) = l.map_err(db_err)?;
            held = true;
            if let Some(t) = v.value().0 {
                best = Some(best.map_or(t, |b| b.min(t)));
            }
        }
        if held {
            cached += rec.block_size.min(rec.length - i * rec.block_size);
        }
    }
    a.cached = if rec.length == 0 { 1.0 } else { cached as f64 / rec.length as f64 };
    if let Some(t) = best {
        a.tier = t.as_str().into();
    }
    Ok(a)
}

impl Master {
    /// Mount points, longest first (the mount table's own order).
    fn mount_points(&self) -> Vec<String> {
        self.inner.mounts.infos().into_iter().map(|m| m.path).collect()
    }

    /// Search the catalog (see the module doc).
    pub async fn search(&self, req: pb::SearchRequest) -> Result<pb::SearchResponse> {
        let s = Search::new(&req, self.mount_points())?;
        let me = self.clone();
        let page = tokio::task::spawn_blocking(move || {
            let snap = Snapshot::of(&me.inner.catalog, me.ns().store(), s.count_only)?;
            s.run(&snap).map(|p| (p, s.base))
        })
        .await
        .map_err(|e| Error::internal(format!("search task: {e}")))??;
        let (page, base) = page;
        let hits =
            page.hits.into_iter().map(|(key, e, locus)| self.hit(&base, key, e, locus)).collect::<Result<Vec<_>>>()?;
        Ok(pb::SearchResponse {
            hits,
            prefixes: page.prefixes,
            truncated: page.truncated,
            next_after: page.next_after,
            count: page.count,
            scanned: page.scanned,
        })
    }

    fn hit(&self, base: &str, key: String, e: pb::CatalogEntry, locus: LocusAttrs) -> Result<pb::SearchHit> {
        let path = format!("{base}{key}");
        let (m, rel) = self.mount_for(&path)?;
        let meta = pb::ObjectMeta {
            content_type: e.content_type.clone(),
            etag: e.etag.clone(),
            user: e.user.into_iter().collect(),
            tags: e.tags.into_iter().collect(),
            ..Default::default()
        };
        let name = lpath::split_parent(&path).map(|(_, n)| n.to_string()).unwrap_or_default();
        let info = pb::FileInfo {
            id: e.inode,
            path: path.clone(),
            name,
            length: e.size,
            mtime_ms: e.mtime_ms,
            fingerprint: locus_ufs::fingerprint(e.size, &e.etag, e.mtime_ms),
            mount_id: m.info.id,
            ufs_path: rel,
            mount_point: m.info.path.clone(),
            meta: Some(meta),
            pinned: locus.pinned,
            persist_state: locus.persist_state.into(),
            ..Default::default()
        };
        Ok(pb::SearchHit { key, info: Some(info), cached: locus.cached, tier: locus.tier })
    }

    /// Index entries from an inventory (see [`indexer::Catalog::import`]): encoded
    /// entries, or inventory records parsed here ([`inventory`]), on a blocking thread
    /// and before the catalog's lock (two requests in flight parse side by side).
    pub async fn import_catalog(&self, req: pb::ImportCatalogRequest) -> Result<pb::CountResponse> {
        let me = self.clone();
        let (written, skipped) = tokio::task::spawn_blocking(move || {
            let entries = inventory::entries(req.objects)?;
            me.inner.catalog.import(entries, req.commit)
        })
        .await
        .map_err(|e| Error::internal(format!("import task: {e}")))??;
        Ok(pb::CountResponse { count: written, skipped })
    }
}
