//! Metadata search: a Zenko-style WHERE clause over every object under a directory, in
//! key order, page by page, answered from the catalog (see [`catalog`]).
//!
//! A search picks one *driver*, the cheapest source of candidate paths, and checks
//! every candidate against the whole clause:
//! - the catalog itself in key order, over the directory or the range a `key` condition
//!   allows (`key = ...`, `key > ...`, `key LIKE "^literal..."`);
//! - one indexed value (an equality on any indexed attribute): paths already in key
//!   order, however many match;
//! - a range of indexed values (`content-length`, `last-modified`, or a LIKE with a
//!   literal prefix on text), collected and sorted when small enough;
//! - for an OR, the union of its branches' drivers, merged in key order.
//!
//! For an AND, each indexed condition's matches are counted up to a small cap and the
//! fewest win. A search that must scan stops after a budget of entries and answers a
//! truncated page that resumes where it stopped, as S3 may.
//!
//! One file of about 800 lines because it is one planner: choosing a driver, estimating
//! it, producing its candidates in key order and paging them share the search's scope
//! (base, bounds, start) and the driver type; the language is in [`query`] and the
//! tables in [`catalog`].

pub mod catalog;
pub mod query;
#[cfg(test)]
mod tests;

use std::ops::Bound;
use std::time::{Duration, Instant};

use locus_common::config::TierAlias;
use locus_common::path::{self as lpath, normalize};
use locus_common::{Error, Result};
use locus_proto::pb;
use redb::ReadTransaction;

use crate::store::{INODES, LOCATIONS, db_err, decode, get_inode};
use crate::*;
use catalog::{CATALOG, CATALOG_INDEX, IndexAttr, num_key, successor, text_key, time_key};
use query::{Attr, Expr, LocusAttrs, Object, Op, Value};

/// Most matches counted when comparing drivers.
const ESTIMATE_CAP: usize = 2_000;
/// Most paths a range driver collects and sorts.
const COLLECT_CAP: usize = 500_000;
/// Entries one page examines before it answers truncated.
const SCAN_BUDGET: u64 = 5_000_000;
/// Time one page may take before it answers truncated.
const TIME_BUDGET: Duration = Duration::from_secs(5);
/// Most keys one page holds.
const MAX_PAGE: usize = 10_000;

/// `ms` as ISO 8601 with milliseconds, UTC.
pub fn iso_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

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

/// Where candidates come from.
#[derive(Clone, Debug)]
enum Driver {
    /// The catalog in key order over a path range.
    Keys(Bound<String>, Bound<String>),
    /// One indexed value: its paths, in key order.
    Value(Vec<u8>),
    /// A range of indexed values of one attribute (the index-key prefix naming it): paths
    /// in value order (collected, then sorted).
    Range(Vec<u8>, Bound<Vec<u8>>, Bound<Vec<u8>>),
    /// The union of several drivers.
    Union(Vec<Driver>),
}

/// The page of a search (keys relative to the searched directory).
pub(crate) struct Page {
    pub hits: Vec<(String, pb::CatalogEntry, LocusAttrs)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    pub next_after: String,
    pub count: u64,
    pub scanned: u64,
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
    /// Mount points, longest first (for `locus.mount`).
    mounts: Vec<String>,
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
        Ok(Search { expr, base, lo, hi, start, limit, delimiter, count_only: req.count_only, mounts })
    }

    fn in_scope(&self, path: &str) -> bool {
        let after_start = match &self.start {
            Bound::Included(s) => path >= s.as_str(),
            Bound::Excluded(s) => path > s.as_str(),
            Bound::Unbounded => true,
        };
        after_start && path.starts_with(&self.lo)
    }

    /// The scope as a key range.
    fn scope(&self) -> Driver {
        Driver::Keys(self.start.clone(), self.hi.clone().map_or(Bound::Unbounded, Bound::Excluded))
    }

    /// The driver a condition allows on its own.
    fn driver_of(&self, e: &Expr) -> Option<Driver> {
        match e {
            Expr::And(_) | Expr::Or(_) => None,
            Expr::Like { attr: Attr::Key, prefix: Some(p), .. } => {
                let lo = format!("{}{p}", self.base);
                Some(Driver::Keys(
                    Bound::Included(lo.clone()),
                    successor(&lo).map_or(Bound::Unbounded, Bound::Excluded),
                ))
            }
            Expr::Like { attr, prefix: Some(p), .. } => {
                let (a, name) = text_attr(attr)?;
                let lo = text_key(a, name, p);
                let hi = text_key(a, name, &successor(p)?);
                Some(Driver::Range(text_key(a, name, ""), Bound::Included(lo), Bound::Excluded(hi)))
            }
            Expr::Like { .. } => None,
            Expr::Cmp { attr: Attr::Key, op, value: Value::Text(s, _) } => {
                let p = format!("{}{s}", self.base);
                Some(match op {
                    Op::Eq => Driver::Keys(Bound::Included(p.clone()), Bound::Included(p)),
                    Op::Gt => Driver::Keys(Bound::Excluded(p), Bound::Unbounded),
                    Op::Ge => Driver::Keys(Bound::Included(p), Bound::Unbounded),
                    Op::Lt => Driver::Keys(Bound::Unbounded, Bound::Excluded(p)),
                    Op::Le => Driver::Keys(Bound::Unbounded, Bound::Included(p)),
                    Op::Ne => return None,
                })
            }
            Expr::Cmp { attr: Attr::Size, op, value: Value::Number(n) } => {
                // Sizes are whole numbers: compare against the integers around `n`.
                let (fl, ce) = (n.floor().max(0.0) as u64, n.ceil().max(0.0) as u64);
                let k = |v: u64| num_key(IndexAttr::Size, v);
                let end = Bound::Included(k(u64::MAX));
                let begin = Bound::Included(k(0));
                let range = |lo, hi| Driver::Range(vec![IndexAttr::Size as u8], lo, hi);
                Some(match op {
                    Op::Eq if fl == ce && *n >= 0.0 => Driver::Value(k(fl)),
                    Op::Eq => return Some(Driver::Union(Vec::new())),
                    Op::Gt if *n < 0.0 => range(begin, end),
                    Op::Gt => range(Bound::Excluded(k(fl)), end),
                    Op::Ge => range(Bound::Included(k(ce)), end),
                    Op::Lt if *n <= 0.0 => Driver::Union(Vec::new()),
                    Op::Lt => range(begin, Bound::Excluded(k(ce))),
                    Op::Le if *n < 0.0 => Driver::Union(Vec::new()),
                    Op::Le => range(begin, Bound::Included(k(fl))),
                    Op::Ne => return None,
                })
            }
            Expr::Cmp { attr: Attr::Modified, op, value: Value::Time(t) } => {
                let begin = Bound::Included(time_key(i64::MIN));
                let end = Bound::Included(time_key(i64::MAX));
                let range = |lo, hi| Driver::Range(vec![IndexAttr::Modified as u8], lo, hi);
                Some(match op {
                    Op::Eq => Driver::Value(time_key(*t)),
                    Op::Gt => range(Bound::Excluded(time_key(*t)), end),
                    Op::Ge => range(Bound::Included(time_key(*t)), end),
                    Op::Lt => range(begin, Bound::Excluded(time_key(*t))),
                    Op::Le => range(begin, Bound::Included(time_key(*t))),
                    Op::Ne => return None,
                })
            }
            Expr::Cmp { attr, op: Op::Eq, value: Value::Text(s, _) } => {
                let (a, name) = text_attr(attr)?;
                Some(Driver::Value(text_key(a, name, s)))
            }
            Expr::Cmp { .. } => None,
        }
    }

    /// The cheapest driver for `e`, with its estimated candidates (capped); `None` when
    /// only a scan of the scope can answer it.
    fn plan(&self, r: &ReadTransaction, e: &Expr) -> Result<Option<(Driver, usize)>> {
        match e {
            Expr::And(v) => {
                // Ranges of one attribute meet in one range (`a >= x AND a < y`).
                let mut ranges: Vec<Driver> = Vec::new();
                let mut others = Vec::new();
                for c in v {
                    match self.driver_of(c) {
                        Some(Driver::Range(attr, lo, hi)) => {
                            match ranges.iter_mut().find(|d| matches!(d, Driver::Range(a, ..) if *a == attr)) {
                                Some(Driver::Range(_, l, h)) => {
                                    *l = tighter(std::mem::replace(l, Bound::Unbounded), lo, false);
                                    *h = tighter(std::mem::replace(h, Bound::Unbounded), hi, true);
                                }
                                _ => ranges.push(Driver::Range(attr, lo, hi)),
                            }
                        }
                        _ => others.push(c),
                    }
                }
                let mut best: Option<(Driver, usize)> = None;
                let mut consider = |d: Driver, n: usize| {
                    let rank = |d: &Driver, n: usize| (n, matches!(d, Driver::Range(..)));
                    if best.as_ref().is_none_or(|(bd, bn)| rank(&d, n) < rank(bd, *bn)) {
                        best = Some((d, n));
                    }
                };
                for d in ranges {
                    let n = self.estimate(r, &d)?;
                    consider(d, n);
                }
                for c in others {
                    if let Some((d, n)) = self.plan(r, c)? {
                        consider(d, n);
                    }
                }
                Ok(best)
            }
            Expr::Or(v) => {
                let mut ds = Vec::new();
                let mut total = 0;
                for c in v {
                    let Some((d, n)) = self.plan(r, c)? else { return Ok(None) };
                    ds.push(d);
                    total += n;
                }
                Ok(Some((Driver::Union(ds), total)))
            }
            _ => match self.driver_of(e) {
                None => Ok(None),
                Some(d) => {
                    let n = self.estimate(r, &d)?;
                    Ok(Some((d, n)))
                }
            },
        }
    }

    /// Whether a driver's value ranges hold more paths than a search collects and sorts
    /// (then the scope is scanned instead).
    fn too_big(&self, r: &ReadTransaction, d: &Driver) -> Result<bool> {
        Ok(match d {
            Driver::Range(_, lo, hi) => self.count_range(r, lo, hi, COLLECT_CAP)? > COLLECT_CAP,
            Driver::Union(v) => {
                for d in v {
                    if self.too_big(r, d)? {
                        return Ok(true);
                    }
                }
                false
            }
            _ => false,
        })
    }

    /// Paths in scope within a value range, counted up to `cap` + 1.
    fn count_range(&self, r: &ReadTransaction, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>, cap: usize) -> Result<usize> {
        if values_cross(lo, hi) {
            return Ok(0);
        }
        let t = r.open_table(CATALOG_INDEX).map_err(db_err)?;
        let mut n = 0;
        for e in t.range::<(&[u8], &str)>(value_bounds(lo, hi)).map_err(db_err)? {
            let (k, _) = e.map_err(db_err)?;
            if k.value().1.starts_with(&self.lo) {
                n += 1;
                if n > cap {
                    break;
                }
            }
        }
        Ok(n)
    }

    /// Candidates of `d` in scope, counted up to [`ESTIMATE_CAP`].
    fn estimate(&self, r: &ReadTransaction, d: &Driver) -> Result<usize> {
        Ok(match d {
            Driver::Keys(lo, hi) => self.key_range(r, lo, hi)?.map_or(0, |it| it.take(ESTIMATE_CAP).count()),
            Driver::Value(v) => {
                let t = r.open_table(CATALOG_INDEX).map_err(db_err)?;
                let lo = self.lo.as_str();
                let from: (&[u8], &str) = (v.as_slice(), lo);
                match &self.hi {
                    Some(hi) => t.range(from..(v.as_slice(), hi.as_str())).map_err(db_err)?.take(ESTIMATE_CAP).count(),
                    None => {
                        t.range(from..).map_err(db_err)?.take_while(|e| same_value(e, v)).take(ESTIMATE_CAP).count()
                    }
                }
            }
            Driver::Range(_, lo, hi) => self.count_range(r, lo, hi, ESTIMATE_CAP)?.min(ESTIMATE_CAP),
            Driver::Union(v) => {
                let mut n = 0;
                for d in v {
                    n += self.estimate(r, d)?;
                }
                n
            }
        })
    }

    /// The catalog over a key range narrowed to the scope; `None` when that is empty.
    fn key_range(
        &self,
        r: &ReadTransaction,
        lo: &Bound<String>,
        hi: &Bound<String>,
    ) -> Result<Option<redb::Range<'static, &'static str, &'static [u8]>>> {
        let (lo, hi) = self.clamp(lo, hi);
        let range = (as_str_bound(&lo), as_str_bound(&hi));
        if bounds_empty(&range) {
            return Ok(None);
        }
        Ok(Some(r.open_table(CATALOG).map_err(db_err)?.range::<&str>(range).map_err(db_err)?))
    }

    /// A key range narrowed to the scope.
    fn clamp(&self, lo: &Bound<String>, hi: &Bound<String>) -> (Bound<String>, Bound<String>) {
        let lo = max_lo(lo.clone(), self.start.clone());
        let hi = match (&self.hi, hi) {
            (None, h) => h.clone(),
            (Some(s), Bound::Unbounded) => Bound::Excluded(s.clone()),
            (Some(s), Bound::Included(h) | Bound::Excluded(h)) if s.as_str() <= h.as_str() => {
                Bound::Excluded(s.clone())
            }
            (_, h) => h.clone(),
        };
        (lo, hi)
    }

    /// The candidate paths of `d` in scope, in key order, with their entries when read.
    fn candidates<'r>(
        &'r self,
        r: &'r ReadTransaction,
        d: &Driver,
    ) -> Result<Box<dyn Iterator<Item = Result<Cand>> + 'r>> {
        Ok(match d {
            Driver::Keys(lo, hi) => {
                let Some(it) = self.key_range(r, lo, hi)? else {
                    return Ok(Box::new(std::iter::empty()));
                };
                Box::new(it.map(|e| {
                    let (k, v) = e.map_err(db_err)?;
                    Ok(Cand { path: k.value().to_string(), entry: Some(decode(v.value())?) })
                }))
            }
            Driver::Value(v) => {
                let t = r.open_table(CATALOG_INDEX).map_err(db_err)?;
                let start = match &self.start {
                    Bound::Included(s) | Bound::Excluded(s) => s.clone(),
                    Bound::Unbounded => self.lo.clone(),
                };
                let it = t.range::<(&[u8], &str)>((v.as_slice(), start.as_str())..).map_err(db_err)?;
                let v = v.clone();
                let hi = self.hi.clone();
                Box::new(
                    it.map(|e| e.map_err(db_err))
                        .take_while(move |e| match e {
                            Ok((k, _)) => {
                                let (kv, p) = k.value();
                                kv == v.as_slice() && hi.as_deref().is_none_or(|h| p < h)
                            }
                            Err(_) => true,
                        })
                        .map(|e| e.map(|(k, _)| Cand { path: k.value().1.to_string(), entry: None }))
                        .filter(move |c| c.as_ref().map_or(true, |c| self.in_scope(&c.path))),
                )
            }
            Driver::Range(_, lo, hi) if values_cross(lo, hi) => Box::new(std::iter::empty()),
            Driver::Range(_, lo, hi) => {
                let t = r.open_table(CATALOG_INDEX).map_err(db_err)?;
                let mut paths = Vec::new();
                for e in t.range::<(&[u8], &str)>(value_bounds(lo, hi)).map_err(db_err)? {
                    let (k, _) = e.map_err(db_err)?;
                    let p = k.value().1;
                    if self.in_scope(p) {
                        paths.push(p.to_string());
                    }
                }
                paths.sort_unstable();
                paths.dedup();
                Box::new(paths.into_iter().map(|path| Ok(Cand { path, entry: None })))
            }
            Driver::Union(v) => {
                let mut its = Vec::new();
                for d in v {
                    its.push(self.candidates(r, d)?.peekable());
                }
                Box::new(Merge { its, last: None })
            }
        })
    }

    /// Run the search as of snapshot `r`.
    pub(crate) fn run(&self, r: &ReadTransaction) -> Result<Page> {
        let driver = match self.plan(r, &self.expr)? {
            Some((d, _)) if !self.too_big(r, &d)? => d,
            _ => self.scope(),
        };
        let cat = r.open_table(CATALOG).map_err(db_err)?;
        let ns = NsTables::open(r)?;
        let needs_locus = self.expr.needs_locus();
        let began = Instant::now();
        let mut page = Page {
            hits: Vec::new(),
            prefixes: Vec::new(),
            truncated: false,
            next_after: String::new(),
            count: 0,
            scanned: 0,
        };
        let mut emitted = 0usize;
        let mut last_group: Option<String> = None;
        let mut last_key = String::new();
        for c in self.candidates(r, &driver)? {
            let c = c?;
            let entry = match c.entry {
                Some(e) => e,
                None => match catalog::get(&cat, &c.path)? {
                    Some(e) => e,
                    None => continue,
                },
            };
            page.scanned += 1;
            let key = &c.path[self.base.len()..];
            if !self.count_only
                && (page.scanned % 4096 == 0)
                && (page.scanned >= SCAN_BUDGET || began.elapsed() >= TIME_BUDGET)
            {
                page.truncated = true;
                page.next_after = last_key;
                return Ok(page);
            }
            last_key = key.to_string();
            let locus = if needs_locus { Some(locus_attrs(&ns, &c.path, &entry, &self.mounts)?) } else { None };
            let cand = Candidate { key, e: &entry, locus };
            if !self.expr.matches(&cand) {
                continue;
            }
            if self.count_only {
                page.count += 1;
                continue;
            }
            if let Some(d) = &self.delimiter
                && let Some(i) = key[self.lo.len() - self.base.len()..].find(d.as_str())
            {
                let group = &key[..self.lo.len() - self.base.len() + i + d.len()];
                if last_group.as_deref() == Some(group) {
                    continue;
                }
                if emitted == self.limit {
                    page.truncated = true;
                    break;
                }
                last_group = Some(group.to_string());
                page.prefixes.push(group.to_string());
                page.next_after = group.to_string();
                emitted += 1;
                continue;
            }
            if emitted == self.limit {
                page.truncated = true;
                break;
            }
            let locus = match cand.locus {
                Some(l) => l,
                None => locus_attrs(&ns, &c.path, &entry, &self.mounts)?,
            };
            page.next_after = key.to_string();
            page.hits.push((key.to_string(), entry, locus));
            emitted += 1;
        }
        if !page.truncated {
            page.next_after.clear();
        }
        Ok(page)
    }
}

/// A candidate path, with its entry when the driver read it.
struct Cand {
    path: String,
    entry: Option<pb::CatalogEntry>,
}

/// A union of candidate streams, in key order, without repeats.
struct Merge<'r> {
    its: Vec<std::iter::Peekable<Box<dyn Iterator<Item = Result<Cand>> + 'r>>>,
    last: Option<String>,
}

impl Iterator for Merge<'_> {
    type Item = Result<Cand>;
    fn next(&mut self) -> Option<Result<Cand>> {
        loop {
            let mut best: Option<(usize, String)> = None;
            for i in 0..self.its.len() {
                match self.its[i].peek() {
                    None => {}
                    Some(Err(_)) => return self.its[i].next(),
                    Some(Ok(c)) => {
                        if best.as_ref().is_none_or(|(_, p)| c.path < *p) {
                            best = Some((i, c.path.clone()));
                        }
                    }
                }
            }
            let best = best.map(|(i, _)| i);
            let c = self.its[best?].next()?;
            if let Ok(c) = &c {
                if self.last.as_deref() == Some(c.path.as_str()) {
                    continue;
                }
                self.last = Some(c.path.clone());
            }
            return Some(c);
        }
    }
}

/// The index attribute (and name) of a text attribute.
fn text_attr(a: &Attr) -> Option<(IndexAttr, Option<&str>)> {
    Some(match a {
        Attr::ContentType => (IndexAttr::ContentType, None),
        Attr::Etag => (IndexAttr::Etag, None),
        Attr::Meta(n) => (IndexAttr::Meta, Some(n.as_str())),
        Attr::Tag(n) => (IndexAttr::Tag, Some(n.as_str())),
        _ => return None,
    })
}

/// Whether a value range holds nothing (its bounds cross; redb refuses such a range).
fn values_cross(lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    use Bound::*;
    match (lo, hi) {
        (Included(a), Included(b)) => a > b,
        (Included(a) | Excluded(a), Included(b) | Excluded(b)) => a >= b,
        _ => false,
    }
}

/// The tighter of two lower bounds (`upper`: of two upper bounds).
fn tighter(a: Bound<Vec<u8>>, b: Bound<Vec<u8>>, upper: bool) -> Bound<Vec<u8>> {
    use Bound::*;
    match (&a, &b) {
        (Unbounded, _) => b,
        (_, Unbounded) => a,
        (Included(x) | Excluded(x), Included(y) | Excluded(y)) => {
            let pick_a = if x == y { matches!(a, Excluded(_)) } else { (x > y) != upper };
            if pick_a { a } else { b }
        }
    }
}

fn same_value(
    e: &std::result::Result<(redb::AccessGuard<'_, (&[u8], &str)>, redb::AccessGuard<'_, ()>), redb::StorageError>,
    v: &[u8],
) -> bool {
    match e {
        Ok((k, _)) => k.value().0 == v,
        Err(_) => true,
    }
}

fn max_lo(a: Bound<String>, b: Bound<String>) -> Bound<String> {
    use Bound::*;
    match (&a, &b) {
        (Unbounded, _) => b,
        (_, Unbounded) => a,
        (Included(x) | Excluded(x), Included(y) | Excluded(y)) => {
            if x > y || (x == y && matches!(a, Excluded(_))) {
                a
            } else {
                b
            }
        }
    }
}

fn as_str_bound(b: &Bound<String>) -> Bound<&str> {
    match b {
        Bound::Included(s) => Bound::Included(s.as_str()),
        Bound::Excluded(s) => Bound::Excluded(s.as_str()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Whether a range holds nothing (redb refuses a range whose start is past its end).
fn bounds_empty(r: &(Bound<&str>, Bound<&str>)) -> bool {
    use Bound::*;
    match r {
        (Included(a), Included(b)) => a > b,
        (Included(a) | Excluded(a), Included(b) | Excluded(b)) => a >= b,
        _ => false,
    }
}

fn value_bounds<'a>(
    lo: &'a Bound<Vec<u8>>,
    hi: &'a Bound<Vec<u8>>,
) -> (Bound<(&'a [u8], &'a str)>, Bound<(&'a [u8], &'a str)>) {
    // (value, "") is the first key of a value; the first key past every path of a value
    // is the next value's: so an excluded lower value starts at its successor.
    let lo = match lo {
        Bound::Included(v) => Bound::Included((v.as_slice(), "")),
        Bound::Excluded(v) => Bound::Excluded((v.as_slice(), "\u{10FFFF}\u{10FFFF}\u{10FFFF}\u{10FFFF}")),
        Bound::Unbounded => Bound::Unbounded,
    };
    let hi = match hi {
        Bound::Included(v) => Bound::Included((v.as_slice(), "\u{10FFFF}\u{10FFFF}\u{10FFFF}\u{10FFFF}")),
        Bound::Excluded(v) => Bound::Excluded((v.as_slice(), "")),
        Bound::Unbounded => Bound::Unbounded,
    };
    (lo, hi)
}

/// The namespace tables Locus's own attributes are read from, opened once per search.
struct NsTables {
    inodes: redb::ReadOnlyTable<u64, &'static [u8]>,
    locations: redb::ReadOnlyTable<(u64, u64), &'static str>,
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
    for i in 0..Master::block_count(rec.length, rec.block_size) {
        let b = locus_common::block_id(rec.version, i);
        let mut held = false;
        for l in loc.range((b, 0)..=(b, u64::MAX)).map_err(db_err)? {
            let (_, v) = l.map_err(db_err)?;
            held = true;
            if let Some(t) = TierAlias::parse(v.value()) {
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
    /// Mount points, longest first.
    fn mount_points(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.mounts.read().iter().map(|m| m.info.path.clone()).collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.len()));
        v
    }

    /// Search the catalog (see the module doc).
    pub async fn search(&self, req: pb::SearchRequest) -> Result<pb::SearchResponse> {
        let s = Search::new(&req, self.mount_points())?;
        let me = self.clone();
        let page = tokio::task::spawn_blocking(move || {
            let r = me.inner.store.read()?;
            s.run(&r).map(|p| (p, s.base))
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
            user: e.user.clone(),
            tags: e.tags.clone(),
            ..Default::default()
        };
        let name = lpath::split_parent(&path).map(|(_, n)| n.to_string()).unwrap_or_default();
        let info = pb::FileInfo {
            id: e.inode,
            path: path.clone(),
            name,
            length: e.size,
            mtime_ms: e.mtime_ms,
            fingerprint: format!("{}:{}", e.size, e.etag),
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

    /// Index entries from an inventory (see [`catalog::import`]).
    pub async fn import_catalog(&self, req: pb::ImportCatalogRequest) -> Result<pb::CountResponse> {
        let mut entries = Vec::with_capacity(req.entries.len());
        for i in req.entries {
            let path = normalize(&i.path)?;
            if path == "/" {
                return Err(Error::invalid("an imported object needs a path below /"));
            }
            entries.push((path, i.entry.unwrap_or_default()));
        }
        let (written, skipped) = self.inner.store.mutate(move |w| catalog::import(w, &entries)).await?;
        Ok(pb::CountResponse { count: written, skipped })
    }
}
