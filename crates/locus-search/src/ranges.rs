//! Ranges of the numeric attributes (`content-length`, `last-modified`): the values a
//! comparison allows, where two ranges meet, and how the index reads a range (through
//! its terms or through its column, by how many distinct values it holds and what it
//! is intersected with).

use std::ops::Bound;

use tantivy::query::{InvertedIndexRangeQuery, Query};
use tantivy::schema::Field;
use tantivy::{Searcher, Term};

use crate::query::Op;

/// A range of numbers.
pub type Span<T> = (Bound<T>, Bound<T>);

/// The sizes a comparison with `n` allows (sizes are whole numbers; `None`: none).
pub fn size_span(op: Op, n: f64) -> Option<Span<u64>> {
    let (fl, ce) = (n.floor().max(0.0) as u64, n.ceil().max(0.0) as u64);
    Some(match op {
        Op::Gt if n < 0.0 => (Bound::Included(0), Bound::Unbounded),
        Op::Gt => (Bound::Excluded(fl), Bound::Unbounded),
        Op::Ge => (Bound::Included(ce), Bound::Unbounded),
        Op::Lt if n <= 0.0 => return None,
        Op::Lt => (Bound::Included(0), Bound::Excluded(ce)),
        Op::Le if n < 0.0 => return None,
        Op::Le => (Bound::Included(0), Bound::Included(fl)),
        Op::Eq | Op::Ne => (Bound::Unbounded, Bound::Unbounded),
    })
}

/// The times a comparison with `t` allows.
pub fn time_span(op: Op, t: i64) -> Span<i64> {
    match op {
        Op::Gt => (Bound::Excluded(t), Bound::Unbounded),
        Op::Ge => (Bound::Included(t), Bound::Unbounded),
        Op::Lt => (Bound::Unbounded, Bound::Excluded(t)),
        Op::Le => (Bound::Unbounded, Bound::Included(t)),
        Op::Eq => (Bound::Included(t), Bound::Included(t)),
        Op::Ne => (Bound::Unbounded, Bound::Unbounded),
    }
}

/// Where two ranges overlap (possibly nowhere: the bounds then cross, which the index
/// reads as empty).
pub fn meet<T: Ord + Clone>(a: Span<T>, b: Span<T>) -> Span<T> {
    use Bound::*;
    let lo = match (a.0, b.0) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.max(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.max(y)),
        (Included(x), Excluded(y)) | (Excluded(y), Included(x)) => {
            if y >= x {
                Excluded(y)
            } else {
                Included(x)
            }
        }
    };
    let hi = match (a.1, b.1) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.min(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.min(y)),
        (Included(x), Excluded(y)) | (Excluded(y), Included(x)) => {
            if y <= x {
                Excluded(y)
            } else {
                Included(x)
            }
        }
    };
    (lo, hi)
}

/// Distinct values at most in a numeric range read through the field's terms, when the
/// range is the whole clause.
pub const TERM_RANGE_MAX: u64 = 20_000;

/// In an AND with other clauses, the column is read only for the other clauses' matches
/// (tantivy leads an intersection with its cheapest part and seeks the rest). Opening a
/// term's postings costs about as much as this many column reads, so a range is read
/// through its terms only when it has fewer than the others' matches over this.
pub const TERM_OPEN_COST: u64 = 20;

/// About how many documents `q` matches (tantivy's size hints, summed over segments;
/// unknown: `u64::MAX`).
pub fn estimated_matches(s: &Searcher, q: &dyn Query) -> u64 {
    let Ok(w) = q.weight(tantivy::query::EnableScoring::disabled_from_searcher(s)) else { return u64::MAX };
    let mut n = 0u64;
    for seg in s.segment_readers() {
        match w.scorer(seg, 1.0) {
            Ok(sc) => n += u64::from(sc.size_hint()),
            Err(_) => return u64::MAX,
        }
    }
    n
}

/// A range of a numeric field: through its terms when the range holds at most `terms`
/// distinct values (a 30-minute window), else through its column (alone, a pass over
/// every document; in an intersection, a read per candidate: `column`, a
/// [`crate::columns::ColumnRange`]).
pub fn numeric_range(
    s: &Searcher,
    field: Field,
    lo: Bound<Term>,
    hi: Bound<Term>,
    terms: u64,
    column: impl FnOnce() -> Box<dyn Query>,
) -> Box<dyn Query> {
    if values_in(s, field, &lo, &hi, terms) <= terms {
        Box::new(InvertedIndexRangeQuery::new(lo, hi))
    } else {
        column()
    }
}

/// How many distinct values of `field` lie in a range, summed over the segments
/// (stops counting past `max`).
fn values_in(s: &Searcher, field: Field, lo: &Bound<Term>, hi: &Bound<Term>, max: u64) -> u64 {
    let mut n = 0u64;
    for seg in s.segment_readers() {
        let Ok(inv) = seg.inverted_index(field) else { return u64::MAX };
        let all = inv.terms().num_terms() as u64;
        // The ordinal of the first term past a bound (`all` when none is).
        let first = |b: Bound<&[u8]>| -> u64 {
            let sb = inv.terms().range();
            let sb = match b {
                Bound::Included(t) => sb.ge(t),
                Bound::Excluded(t) => sb.gt(t),
                Bound::Unbounded => sb,
            };
            match sb.into_stream() {
                Ok(mut st) => {
                    if st.advance() {
                        st.term_ord()
                    } else {
                        all
                    }
                }
                Err(_) => 0,
            }
        };
        let a = first(lo.as_ref().map(Term::serialized_value_bytes));
        let z = match hi {
            Bound::Included(t) => first(Bound::Excluded(t.serialized_value_bytes())),
            Bound::Excluded(t) => first(Bound::Included(t.serialized_value_bytes())),
            Bound::Unbounded => all,
        };
        n += z.saturating_sub(a);
        if n > max {
            break;
        }
    }
    n
}
