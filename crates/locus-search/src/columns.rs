//! The index's fast columns (`key`, `size`, `mtime`), opened once per segment and kept
//! while the segment lives, and [`ColumnRange`], a range of sizes or times read from
//! them.
//!
//! Opening a column reads its header and, for the block-wise codec tantivy picks for
//! sizes and key ordinals, every block's parameters: at 10M objects about a millisecond
//! per column and search, more than a selective search spends on its matches. A
//! tantivy `RangeQuery` opens its column for every search; [`ColumnRange`] takes it from
//! the cache.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Bound, RangeInclusive};
use std::sync::{Arc, Mutex};

use tantivy::columnar::{Column, StrColumn};
use tantivy::index::SegmentId;
use tantivy::query::{ConstScorer, EmptyScorer, EnableScoring, Explanation, Query, Scorer, Weight};
use tantivy::{DocId, DocSet, Score, Searcher, SeekDangerResult, SegmentReader, TERMINATED, TantivyError};

use locus_common::Result;

use crate::index::ix_err;

/// One segment's columns (`None`: the segment has no such column, as an empty one).
pub struct SegColumns {
    pub id: SegmentId,
    pub key: Option<StrColumn>,
    pub size: Option<Column<u64>>,
    pub mtime: Option<Column<i64>>,
}

impl SegColumns {
    fn open(r: &SegmentReader) -> tantivy::Result<SegColumns> {
        let ff = r.fast_fields();
        Ok(SegColumns {
            id: r.segment_id(),
            key: ff.str("key")?,
            size: ff.u64("size").ok(),
            mtime: ff.i64("mtime").ok(),
        })
    }
}

/// The columns of one searcher's segments.
pub struct Columns {
    segs: Vec<Arc<SegColumns>>,
}

impl fmt::Debug for Columns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Columns({} segments)", self.segs.len())
    }
}

impl Columns {
    /// The columns of the segment `r` reads: cached, or (a segment the cache was not
    /// made for) opened here.
    pub fn get(&self, r: &SegmentReader) -> tantivy::Result<Arc<SegColumns>> {
        let id = r.segment_id();
        match self.segs.iter().find(|s| s.id == id) {
            Some(s) => Ok(s.clone()),
            None => SegColumns::open(r).map(Arc::new),
        }
    }
}

/// The columns of the segments of the last searcher asked for, reused by the segments a
/// later searcher shares with it.
#[derive(Default)]
pub struct ColumnCache {
    last: Mutex<Option<(u64, Arc<Columns>)>>,
}

impl ColumnCache {
    pub fn columns(&self, s: &Searcher) -> Result<Arc<Columns>> {
        let generation = s.generation().generation_id();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, c)) = &*last
            && *g == generation
        {
            return Ok(c.clone());
        }
        let old: HashMap<SegmentId, Arc<SegColumns>> =
            last.take().map(|(_, c)| c.segs.iter().map(|s| (s.id, s.clone())).collect()).unwrap_or_default();
        let segs = s
            .segment_readers()
            .iter()
            .map(|r| match old.get(&r.segment_id()) {
                Some(c) => Ok(c.clone()),
                None => SegColumns::open(r).map(Arc::new).map_err(ix_err),
            })
            .collect::<Result<Vec<_>>>()?;
        let c = Arc::new(Columns { segs });
        *last = Some((generation, c.clone()));
        Ok(c)
    }
}

/// A range of one of the numeric columns.
#[derive(Clone, Debug)]
pub enum NumRange {
    Size(RangeInclusive<u64>),
    Mtime(RangeInclusive<i64>),
}

/// `lo..hi` as an inclusive range of whole numbers (`None`: empty).
pub fn inclusive<T: Copy + Ord + Whole>(lo: Bound<T>, hi: Bound<T>) -> Option<RangeInclusive<T>> {
    let lo = match lo {
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.succ()?,
        Bound::Unbounded => T::MIN,
    };
    let hi = match hi {
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.pred()?,
        Bound::Unbounded => T::MAX,
    };
    (lo <= hi).then_some(lo..=hi)
}

/// Whole numbers with a least and a greatest value.
pub trait Whole: Sized {
    const MIN: Self;
    const MAX: Self;
    fn succ(self) -> Option<Self>;
    fn pred(self) -> Option<Self>;
}

macro_rules! whole {
    ($($t:ty),*) => {$(
        impl Whole for $t {
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            fn succ(self) -> Option<Self> { self.checked_add(1) }
            fn pred(self) -> Option<Self> { self.checked_sub(1) }
        }
    )*};
}
whole!(u64, i64);

/// The documents whose size (or time) lies in a range, read from the cached columns:
/// alone, a scan of the column in growing batches; in an intersection, a lookup per
/// candidate.
#[derive(Clone, Debug)]
pub struct ColumnRange {
    pub range: NumRange,
    pub cols: Arc<Columns>,
}

impl Query for ColumnRange {
    fn weight(&self, _: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(self.clone()))
    }
}

/// Values a [`Docs`] ranges over.
trait Val: PartialOrd + Copy + fmt::Debug + Send + Sync + 'static {}
impl<T: PartialOrd + Copy + fmt::Debug + Send + Sync + 'static> Val for T {}

/// A scorer over `docs` (`None`: no column, no match): from the segment's start, or with
/// `target`, positioned there by one lookup (no scan from the segment's start).
fn scorer<T: Val>(docs: Option<Docs<T>>, target: Option<DocId>, boost: Score) -> (SeekDangerResult, Box<dyn Scorer>) {
    let Some(mut d) = docs else { return (SeekDangerResult::SeekLowerBound(TERMINATED), Box::new(EmptyScorer)) };
    let found = match target {
        Some(t) => d.seek_danger(t),
        None => {
            d.fetch();
            SeekDangerResult::Found
        }
    };
    (found, Box::new(ConstScorer::new(d, boost)))
}

impl ColumnRange {
    /// The scorer of segment `r`.
    fn make(
        &self,
        r: &SegmentReader,
        target: Option<DocId>,
        boost: Score,
    ) -> tantivy::Result<(SeekDangerResult, Box<dyn Scorer>)> {
        let seg = self.cols.get(r)?;
        Ok(match &self.range {
            NumRange::Size(v) => scorer(seg.size.clone().map(|c| Docs::new(v.clone(), c)), target, boost),
            NumRange::Mtime(v) => scorer(seg.mtime.clone().map(|c| Docs::new(v.clone(), c)), target, boost),
        })
    }
}

impl Weight for ColumnRange {
    fn scorer(&self, r: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        Ok(self.make(r, None, boost)?.1)
    }

    fn scorer_danger(
        &self,
        r: &SegmentReader,
        target: DocId,
        boost: Score,
    ) -> tantivy::Result<(SeekDangerResult, Box<dyn Scorer>)> {
        self.make(r, Some(target), boost)
    }

    fn explain(&self, _: &SegmentReader, _: DocId) -> tantivy::Result<Explanation> {
        Err(TantivyError::InvalidArgument("a column range explains nothing".into()))
    }
}

/// Documents read in batches that double from this many up to `HORIZON_MAX` (a seek far
/// ahead starts small again).
const HORIZON_MIN: u32 = 128;
const HORIZON_MAX: u32 = 100_000;

/// The matches of a range in one column, a batch at a time. `docs[pos..]` are all the
/// matches in the documents from `docs[pos]` up to `next` (after the last batch).
struct Docs<T> {
    range: RangeInclusive<T>,
    col: Column<T>,
    docs: Vec<DocId>,
    pos: usize,
    next: DocId,
    horizon: u32,
}

impl<T: Val> Docs<T> {
    fn new(range: RangeInclusive<T>, col: Column<T>) -> Docs<T> {
        // A range outside the column's values matches nothing (no scan).
        let none = *range.start() > col.max_value() || *range.end() < col.min_value();
        let next = if none { col.num_docs() } else { 0 };
        Docs { range, col, docs: Vec::new(), pos: 0, next, horizon: HORIZON_MIN }
    }

    /// The next batch holding a match, from `self.next` on (none: past the end).
    fn fetch(&mut self) {
        self.docs.clear();
        self.pos = 0;
        let n = self.col.num_docs();
        while self.docs.is_empty() && self.next < n {
            let end = self.next.saturating_add(self.horizon).min(n);
            self.col.get_docids_for_value_range(self.range.clone(), self.next..end, &mut self.docs);
            self.next = end;
            self.horizon = (self.horizon * 2).min(HORIZON_MAX);
        }
    }
}

impl<T: Val> DocSet for Docs<T> {
    fn advance(&mut self) -> DocId {
        self.pos += 1;
        if self.pos >= self.docs.len() {
            self.fetch();
        }
        self.doc()
    }

    fn seek(&mut self, target: DocId) -> DocId {
        let d = self.doc();
        if d >= target {
            return d;
        }
        if self.docs.last().is_some_and(|&l| l >= target) {
            // Within the batch, which holds every match up to its last.
            self.pos += self.docs[self.pos..].partition_point(|&x| x < target);
            return self.doc();
        }
        // Past the batch: every match before `next` was in it, so read on from the
        // later of `next` and `target` (a jump ahead starts with a small batch).
        if target > self.next {
            self.next = target;
            self.horizon = HORIZON_MIN;
        }
        self.fetch();
        self.doc()
    }

    fn seek_danger(&mut self, target: DocId) -> SeekDangerResult {
        if target >= self.col.num_docs() {
            return SeekDangerResult::SeekLowerBound(TERMINATED);
        }
        if self.col.values_for_doc(target).any(|v| self.range.contains(&v)) {
            // Positioned on `target`; the scan resumes after it.
            self.docs.clear();
            self.docs.push(target);
            self.pos = 0;
            self.next = target + 1;
            self.horizon = HORIZON_MIN;
            SeekDangerResult::Found
        } else {
            SeekDangerResult::SeekLowerBound(target + 1)
        }
    }

    fn doc(&self) -> DocId {
        self.docs.get(self.pos).copied().unwrap_or(TERMINATED)
    }

    fn size_hint(&self) -> u32 {
        // Unknown without a scan: tantivy's own guess for a column range.
        self.col.num_docs() / 10
    }

    fn cost(&self) -> u64 {
        // Driving it scans the column: about as dear as its documents (tantivy's figure),
        // so an intersection leads with anything more selective.
        (self.col.num_docs() as f64 * 0.8) as u64
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tantivy::collector::DocSetCollector;
    use tantivy::query::{BooleanQuery, Occur, TermQuery};
    use tantivy::schema::{FAST, INDEXED, IndexRecordOption, STRING, Schema};
    use tantivy::{Index, TantivyDocument, Term};

    use super::*;

    /// Documents `0..n` of one segment (and a few more segments), each with a size, a
    /// time and a tag ("t" on about one in `every`).
    fn index(rng: &mut StdRng, n: usize, every: u32) -> (Index, Vec<(u64, i64, bool)>) {
        let mut b = Schema::builder();
        let size = b.add_u64_field("size", INDEXED | FAST);
        let mtime = b.add_i64_field("mtime", INDEXED | FAST);
        let key = b.add_text_field("key", STRING | FAST);
        let tag = b.add_text_field("tag", STRING);
        let idx = Index::create_in_ram(b.build());
        let mut w = idx.writer_with_num_threads(1, 50_000_000).unwrap();
        let mut docs = Vec::new();
        for i in 0..n {
            let d =
                (rng.random_range(0..1_000_000u64), rng.random_range(-500_000..500_000i64), rng.random_ratio(1, every));
            let mut doc = TantivyDocument::default();
            doc.add_u64(size, d.0);
            doc.add_i64(mtime, d.1);
            doc.add_text(key, format!("k{i:08}"));
            if d.2 {
                doc.add_text(tag, "t");
            }
            w.add_document(doc).unwrap();
            docs.push(d);
            if i % (n / 3) == n / 3 - 1 {
                w.commit().unwrap();
            }
        }
        w.commit().unwrap();
        (idx, docs)
    }

    #[test]
    fn column_ranges_match_a_brute_force_evaluation() {
        let mut rng = StdRng::seed_from_u64(11);
        let (idx, docs) = index(&mut rng, 300_000, 500);
        let searcher = idx.reader().unwrap().searcher();
        assert!(searcher.segment_readers().len() >= 3);
        let cols = ColumnCache::default().columns(&searcher).unwrap();
        let tag = Term::from_field_text(idx.schema().get_field("tag").unwrap(), "t");
        // Every document's (segment, doc) in the order `docs` holds them.
        let mut addrs = Vec::new();
        for (ord, seg) in searcher.segment_readers().iter().enumerate() {
            let key = seg.fast_fields().str("key").unwrap().unwrap();
            for d in 0..seg.max_doc() {
                let mut k = Vec::new();
                key.ord_to_bytes(key.ords().first(d).unwrap(), &mut k).unwrap();
                let i: usize = std::str::from_utf8(&k[1..]).unwrap().parse().unwrap();
                addrs.push((i, tantivy::DocAddress::new(ord as u32, d)));
            }
        }
        addrs.sort();
        for round in 0..40 {
            let (a, b) = (rng.random_range(0..1_100_000u64), rng.random_range(0..1_100_000u64));
            let (lo, hi) = if round % 5 == 0 { (a.min(b), a.min(b) + 200) } else { (a.min(b), a.max(b)) };
            let (range, want): (NumRange, Vec<bool>) = if round % 2 == 0 {
                (NumRange::Size(lo..=hi), docs.iter().map(|d| (lo..=hi).contains(&d.0)).collect())
            } else {
                let (lo, hi) = (lo as i64 - 550_000, hi as i64 - 550_000);
                (NumRange::Mtime(lo..=hi), docs.iter().map(|d| (lo..=hi).contains(&d.1)).collect())
            };
            let q = ColumnRange { range, cols: cols.clone() };
            let expect = |with_tag: bool| -> Vec<tantivy::DocAddress> {
                let mut v: Vec<_> =
                    addrs.iter().filter(|(i, _)| want[*i] && (!with_tag || docs[*i].2)).map(|(_, a)| *a).collect();
                v.sort();
                v
            };
            let mut got: Vec<_> = searcher.search(&q, &DocSetCollector).unwrap().into_iter().collect();
            got.sort();
            assert_eq!(got, expect(false), "round {round}: the range alone");
            if round < 2 {
                // Segments the cache was not made for: their columns opened on the spot.
                let cold = ColumnRange { range: q.range.clone(), cols: Arc::new(Columns { segs: Vec::new() }) };
                let mut got: Vec<_> = searcher.search(&cold, &DocSetCollector).unwrap().into_iter().collect();
                got.sort();
                assert_eq!(got, expect(false), "round {round}: columns not cached");
            }
            let and = BooleanQuery::new(vec![
                (Occur::Must, Box::new(TermQuery::new(tag.clone(), IndexRecordOption::Basic)) as Box<dyn Query>),
                (Occur::Must, Box::new(q.clone())),
            ]);
            let mut got: Vec<_> = searcher.search(&and, &DocSetCollector).unwrap().into_iter().collect();
            got.sort();
            assert_eq!(got, expect(true), "round {round}: the range beside a sparse term");
            // Seeks to random increasing targets, against the next match.
            let seg = &searcher.segment_readers()[0];
            let w = q.weight(EnableScoring::disabled_from_searcher(&searcher)).unwrap();
            let mut sc = w.scorer(seg, 1.0).unwrap();
            let matches: Vec<DocId> = expect(false).iter().filter(|a| a.segment_ord == 0).map(|a| a.doc_id).collect();
            let mut target = 0;
            while target < seg.max_doc() {
                target += rng.random_range(1..3_000);
                let next = matches.iter().copied().find(|&d| d >= target).unwrap_or(TERMINATED);
                let at = sc.seek(target);
                assert_eq!(at, next, "round {round}: seek to {target}");
                if rng.random_bool(0.3) && at != TERMINATED {
                    let after = matches.iter().copied().find(|&d| d > at).unwrap_or(TERMINATED);
                    assert_eq!(sc.advance(), after, "round {round}: advance after {at}");
                    target = target.max(after.min(seg.max_doc()));
                }
            }
        }
    }

    #[test]
    fn inclusive_bounds() {
        assert_eq!(inclusive(Bound::Excluded(5u64), Bound::Excluded(7)), Some(6..=6));
        assert_eq!(inclusive(Bound::Excluded(5u64), Bound::Excluded(6)), None);
        assert_eq!(inclusive(Bound::Excluded(u64::MAX), Bound::Unbounded), None);
        assert_eq!(inclusive(Bound::Unbounded, Bound::Excluded(0u64)), None);
        assert_eq!(inclusive(Bound::Unbounded, Bound::Included(-3i64)), Some(i64::MIN..=-3));
    }
}
