//! A search expression as a tantivy query: one method per kind of clause. A clause that
//! the index cannot express exactly becomes a superset (or every object), and the
//! candidates it yields are checked against the expression itself.

use std::ops::Bound;
use std::sync::Arc;

use tantivy::query::{BooleanQuery, EmptyQuery, InvertedIndexRangeQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{Searcher, Term};

use crate::columns::{ColumnRange, Columns, NumRange, inclusive};
use crate::index::{Fields, successor};
use crate::query::{Attr, Expr, Op, Value};
use crate::ranges::{
    Span, TERM_OPEN_COST, TERM_RANGE_MAX, estimated_matches, meet, numeric_range, size_span, time_span,
};

/// A query, and whether it matches exactly what the clause does (else a superset).
/// `None` matches every object.
pub type Translated = (Option<Box<dyn Query>>, bool);

/// Translates the clauses of one search, over one index snapshot.
pub struct Translator<'a> {
    /// The keys' common prefix in the index (the bucket's, or the directory's).
    pub base: &'a str,
    pub s: &'a Searcher,
    pub f: &'a Fields,
    pub cols: &'a Arc<Columns>,
}

impl Translator<'_> {
    pub fn query(&self, e: &Expr) -> Translated {
        match e {
            Expr::And(v) => self.and(v),
            Expr::Or(v) => self.or(v),
            Expr::Like { attr, prefix: Some(p), .. } => self.like_prefix(attr, p),
            Expr::Like { attr, .. } => self.has(attr),
            Expr::Cmp { attr, op, value } => self.cmp(attr, *op, value),
        }
    }

    /// Comparisons of one number (size, mtime) meet in one range, read once.
    fn and(&self, v: &[Expr]) -> Translated {
        let (mut size, mut mtime) = (None::<Option<Span<u64>>>, None::<Span<i64>>);
        let mut rest = Vec::new();
        for c in v {
            match c {
                Expr::Cmp { attr: Attr::Size, op, value: Value::Number(n) } if op.is_range() => {
                    let b = size_span(*op, *n);
                    size = Some(match size {
                        None => b,
                        Some(a) => a.zip(b).map(|(a, b)| meet(a, b)),
                    });
                }
                Expr::Cmp { attr: Attr::Modified, op, value: Value::Time(t) } if op.is_range() => {
                    let b = time_span(*op, *t);
                    mtime = Some(mtime.map_or(b, |a| meet(a, b)));
                }
                _ => rest.push(c),
            }
        }
        let mut parts: Vec<Translated> = rest.into_iter().map(|c| self.query(c)).collect();
        // Beside other clauses, a range is checked on their matches (one column read each)
        // unless its terms are far fewer than those matches: each term is a posting list
        // to open (thousands for `content-length > 1000000`).
        let lead = if size.is_some() || mtime.is_some() {
            parts.iter().filter_map(|p| p.0.as_deref()).map(|q| estimated_matches(self.s, q)).min()
        } else {
            None
        };
        let terms = lead.map_or(TERM_RANGE_MAX, |n| (n / TERM_OPEN_COST).min(TERM_RANGE_MAX));
        parts.extend(size.map(|sp| (Some(self.sizes(sp, terms)), true)));
        parts.extend(mtime.map(|sp| (Some(self.times(sp, terms)), true)));
        let exact = parts.iter().all(|p| p.1);
        let qs: Vec<(Occur, Box<dyn Query>)> =
            parts.into_iter().filter_map(|p| p.0).map(|q| (Occur::Must, q)).collect();
        if qs.is_empty() { (None, exact) } else { (Some(Box::new(BooleanQuery::new(qs))), exact) }
    }

    fn or(&self, v: &[Expr]) -> Translated {
        let mut qs = Vec::new();
        let mut exact = true;
        for c in v {
            let (q, x) = self.query(c);
            let Some(q) = q else { return (None, false) };
            qs.push((Occur::Should, q));
            exact &= x;
        }
        if qs.is_empty() {
            return (Some(Box::new(EmptyQuery)), exact);
        }
        (Some(Box::new(BooleanQuery::new(qs))), exact)
    }

    /// A LIKE with a literal prefix: the prefix's terms (a superset: the rest of the
    /// pattern is checked on the candidates).
    fn like_prefix(&self, attr: &Attr, p: &str) -> Translated {
        if matches!(attr, Attr::Key) {
            // The prefix's terms (a range of the key column would read every document).
            let lo = format!("{}{p}", self.base);
            let hi = successor(&lo).map_or(Bound::Unbounded, Bound::Excluded);
            let t = |s: String| Term::from_field_text(self.f.key, &s);
            return (Some(Box::new(InvertedIndexRangeQuery::new(Bound::Included(t(lo)), hi.map(t)))), false);
        }
        match self.text_attr(attr) {
            Some((field, name, end)) => {
                let hi = successor(p).map_or(end, |s| Bound::Excluded(format!("{name}{s}")));
                (Some(texts(field, Bound::Included(format!("{name}{p}")), hi)), false)
            }
            None => (None, false),
        }
    }

    fn cmp(&self, attr: &Attr, op: Op, value: &Value) -> Translated {
        if op == Op::Ne {
            return (None, false);
        }
        match (attr, value) {
            // `=` compares text exactly, numbers or not.
            (Attr::Key, Value::Text(s, _)) if op == Op::Eq => {
                (Some(term(self.f.key, &format!("{}{s}", self.base))), true)
            }
            (_, Value::Text(s, _)) if op == Op::Eq && self.text_attr(attr).is_some() => {
                let (field, name, _) = self.text_attr(attr).expect("a text attribute");
                (Some(term(field, &format!("{name}{s}"))), true)
            }
            (Attr::Key, Value::Text(s, None)) => {
                let p = format!("{}{s}", self.base);
                let base = || Bound::Included(self.base.to_string());
                (Some(text_cmp(self.f.key, op, p, Bound::Unbounded, base)), true)
            }
            (Attr::Size, Value::Number(n)) => (Some(self.size_cmp(op, *n)), true),
            (Attr::Modified, Value::Time(ms)) => (Some(self.times(time_span(op, *ms), TERM_RANGE_MAX)), true),
            (_, Value::Text(s, None)) => match self.text_attr(attr) {
                Some((field, name, end)) => {
                    let v = format!("{name}{s}");
                    (Some(text_cmp(field, op, v, end, || Bound::Included(name.clone()))), true)
                }
                None => (None, false),
            },
            _ => self.has(attr),
        }
    }

    /// Sizes are whole numbers: `n` is compared against the integers around it.
    fn size_cmp(&self, op: Op, n: f64) -> Box<dyn Query> {
        match op {
            Op::Eq if n.fract() == 0.0 && n >= 0.0 => {
                Box::new(TermQuery::new(Term::from_field_u64(self.f.size, n as u64), IndexRecordOption::Basic))
            }
            Op::Eq => Box::new(EmptyQuery),
            _ => self.sizes(size_span(op, n), TERM_RANGE_MAX),
        }
    }

    /// The terms of a text attribute: its field, the prefix naming it (user metadata and
    /// tags) and the end of its terms.
    fn text_attr(&self, a: &Attr) -> Option<(Field, String, Bound<String>)> {
        let f = self.f;
        Some(match a {
            Attr::ContentType => (f.ctype, String::new(), Bound::Unbounded),
            Attr::Etag => (f.etag, String::new(), Bound::Unbounded),
            Attr::Meta(n) => (f.meta, format!("{n}\0"), Bound::Excluded(format!("{n}\u{1}"))),
            Attr::Tag(n) => (f.tag, format!("{n}\0"), Bound::Excluded(format!("{n}\u{1}"))),
            _ => return None,
        })
    }

    /// Every object that has the attribute (or every object).
    fn has(&self, a: &Attr) -> Translated {
        match self.text_attr(a) {
            Some((field, p, end)) if !p.is_empty() => (Some(texts(field, Bound::Included(p), end)), false),
            _ => (None, false),
        }
    }

    /// A range of sizes or times (`None`: no size at all), read through its terms when it
    /// holds at most `terms` distinct values (see [`numeric_range`]).
    fn column(&self, r: Option<NumRange>) -> Box<dyn Query> {
        match r {
            Some(range) => Box::new(ColumnRange { range, cols: self.cols.clone() }),
            None => Box::new(EmptyQuery),
        }
    }

    fn sizes(&self, sp: Option<Span<u64>>, terms: u64) -> Box<dyn Query> {
        let t = |v: u64| Term::from_field_u64(self.f.size, v);
        sp.map_or(Box::new(EmptyQuery), |(lo, hi)| {
            numeric_range(self.s, self.f.size, lo.map(t), hi.map(t), terms, || {
                self.column(inclusive(lo, hi).map(NumRange::Size))
            })
        })
    }

    fn times(&self, (lo, hi): Span<i64>, terms: u64) -> Box<dyn Query> {
        let t = |v: i64| Term::from_field_i64(self.f.mtime, v);
        numeric_range(self.s, self.f.mtime, lo.map(t), hi.map(t), terms, || {
            self.column(inclusive(lo, hi).map(NumRange::Mtime))
        })
    }
}

fn term(field: Field, s: &str) -> Box<dyn Query> {
    Box::new(TermQuery::new(Term::from_field_text(field, s), IndexRecordOption::Basic))
}

fn texts(field: Field, lo: Bound<String>, hi: Bound<String>) -> Box<dyn Query> {
    let t = |s: String| Term::from_field_text(field, &s);
    Box::new(RangeQuery::new(lo.map(t), hi.map(t)))
}

/// `field op v` over text terms: from `start()` (the attribute's first term) to `end`
/// (past its last). `op` is never `Ne`.
fn text_cmp(field: Field, op: Op, v: String, end: Bound<String>, start: impl Fn() -> Bound<String>) -> Box<dyn Query> {
    match op {
        Op::Eq | Op::Ne => term(field, &v),
        Op::Gt => texts(field, Bound::Excluded(v), end),
        Op::Ge => texts(field, Bound::Included(v), end),
        Op::Lt => texts(field, start(), Bound::Excluded(v)),
        Op::Le => texts(field, start(), Bound::Included(v)),
    }
}
