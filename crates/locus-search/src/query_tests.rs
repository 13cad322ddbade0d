//! Unit tests of the search language (`query.rs`): parsing, errors, evaluation, literal prefixes.

use super::*;

fn literal_prefix(pat: &str) -> Option<String> {
    common_prefix(&prefix_literals(pat)?)
}

fn prefixes_of(pat: &str) -> Vec<String> {
    prefix_literals(pat).map(prefix_set).unwrap_or_default()
}
use std::collections::BTreeMap;

#[derive(Default)]
struct O {
    key: String,
    size: u64,
    mtime: i64,
    ct: String,
    etag: String,
    meta: BTreeMap<String, String>,
    tags: BTreeMap<String, String>,
    locus: Option<LocusAttrs>,
}
impl Object for O {
    fn key(&self) -> &str {
        &self.key
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn mtime_ms(&self) -> i64 {
        self.mtime
    }
    fn content_type(&self) -> &str {
        &self.ct
    }
    fn etag(&self) -> &str {
        &self.etag
    }
    fn meta(&self, n: &str) -> Option<&str> {
        self.meta.get(n).map(|s| s.as_str())
    }
    fn tag(&self, n: &str) -> Option<&str> {
        self.tags.get(n).map(|s| s.as_str())
    }
    fn locus(&self) -> Option<&LocusAttrs> {
        self.locus.as_ref()
    }
}

fn obj() -> O {
    O {
        key: "logs/2026-01-15/a.gz".into(),
        size: 2048,
        mtime: parse_time("2026-01-15T10:00:00Z").unwrap(),
        ct: "application/gzip".into(),
        etag: "abc".into(),
        meta: [("color".to_string(), "blue".to_string()), ("n".into(), "20".into())].into(),
        tags: [("type".to_string(), "ice-cream-cone".to_string())].into(),
        locus: Some(LocusAttrs {
            cached: 0.5,
            tier: "MEM".into(),
            persist_state: pb::PersistState::ToBePersisted,
            pinned: true,
            mount: "/".into(),
        }),
    }
}

fn m(q: &str) -> bool {
    Expr::parse(q).unwrap_or_else(|e| panic!("{q}: {e}")).matches(&obj())
}

#[test]
fn zenko_examples() {
    assert!(m("x-amz-meta-color=blue"));
    assert!(m("x-amz-meta-color = \"blue\""));
    assert!(m("X-Amz-Meta-Color='blue'"));
    assert!(!m("x-amz-meta-color != blue"));
    assert!(m("x-amz-meta-color <> red"));
    assert!(m("tags.type = ice-cream-cone"));
    assert!(m("key LIKE \"2026-01.*\""));
    assert!(m("key LIKE \"/LOGS/i\""));
    assert!(!m("key LIKE \"/LOGS/\""));
    assert!(m("key = 'logs/2026-01-15/a.gz'"));
    assert!(m("size > 0"));
    assert!(m("`content-length` >= 2048 AND `content-length` <= 2048"));
    assert!(m("content-length > 1000 AND (content-type = text/plain OR etag = \"abc\")"));
    assert!(!m("content-length > 1000 AND content-type = text/plain OR etag = zzz"));
    assert!(m("last-modified > 2026-01-15 and last-modified < 2026-01-16T00:00:00Z"));
    assert!(m("last-modified = 2026-01-15T11:00:00+01:00"));
    // Missing attributes match only !=.
    assert!(!m("x-amz-meta-shape = round"));
    assert!(m("x-amz-meta-shape != round"));
    assert!(!m("tags.nope LIKE \".*\""));
    // Numbers compare as numbers when both sides are numbers.
    assert!(m("x-amz-meta-n > 5"));
    assert!(m("x-amz-meta-n < 100"));
    assert!(m("x-amz-meta-color > b"));
}

#[test]
fn locus_attributes() {
    assert!(m("locus.cached >= 0.5 AND locus.cached < 1"));
    assert!(m("locus.tier = MEM"));
    assert!(m("locus.persist-state = to_be_persisted"));
    assert!(m("locus.persist-state != PERSISTED"));
    assert!(m("locus.pinned = true"));
    assert!(m("locus.mount = /"));
    assert!(Expr::parse("locus.pinned = true").unwrap().needs_locus());
    assert!(!Expr::parse("key = a OR size > 1").unwrap().needs_locus());
}

#[test]
fn errors_point_at_the_problem() {
    for (q, want) in [
        ("", "empty"),
        ("colour = blue", "unknown attribute `colour`"),
        ("key = ", "needs a value"),
        ("key blue", "expected an operator"),
        ("(key = a", "never closed"),
        ("key = a)", "unexpected `)`"),
        ("key = 'a", "no closing"),
        ("content-length > big", "is a number"),
        ("last-modified > yesterday", "is a time"),
        ("key LIKE \"(\"", "not a valid regular expression"),
        ("content-length LIKE \"1.*\"", "LIKE applies to text"),
        ("NOT key = a", "NOT is not supported"),
        ("key = a AND", "ends where a condition"),
        ("locus.persist-state = maybe", "not a persist state"),
        ("key LIKE \"/a/q\"", "unknown regular expression flag"),
        ("x-amz-meta- = 1", "unknown attribute"),
    ] {
        let e = Expr::parse(q).unwrap_err();
        assert_eq!(e.kind(), locus_common::ErrorKind::InvalidArgument, "{q}");
        assert!(e.to_string().contains(want), "{q}: {e}");
    }
    let e = Expr::parse("key = a AND colour = b").unwrap_err().to_string();
    assert!(e.contains("character 13"), "{e}");
}

#[test]
fn literal_prefixes() {
    use prefixes_of as prefixes;
    assert_eq!(literal_prefix("^logs/2026-.*\\.gz$").as_deref(), Some("logs/2026-"));
    assert_eq!(literal_prefix("^logs/2026-0[1-3]/").as_deref(), Some("logs/2026-0"));
    assert_eq!(literal_prefix("^abc?").as_deref(), Some("ab"));
    assert_eq!(literal_prefix("^(ab|ac)d").as_deref(), Some("a"));
    assert_eq!(literal_prefix("logs/"), None);
    assert_eq!(literal_prefix("^.*x"), None);
    assert_eq!(literal_prefix("(?m)^logs"), None);
    assert_eq!(prefixes("^logs/2025-03-1[0-2]/h"), ["logs/2025-03-10/h", "logs/2025-03-11/h", "logs/2025-03-12/h"]);
    assert_eq!(prefixes("^(ab|abc|b)x"), ["abcx", "abx", "bx"]);
    assert_eq!(prefixes("^(a|ab)"), ["a"]);
    assert!(prefixes("logs/").is_empty());
    assert!(prefixes("^(a|.*)").is_empty());
    assert!(matches!(Expr::parse("key LIKE \"^a/b\"").unwrap(), Expr::Like { prefix: Some(p), .. } if p == "a/b"));
    assert!(matches!(Expr::parse("key LIKE \"/^a/b/i\"").unwrap(), Expr::Like { prefix: None, .. }));
}
