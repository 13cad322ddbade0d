//! The search language: Zenko's `?search=` syntax (a SQL-like WHERE clause), parsed into
//! a typed expression and evaluated against one object.
//!
//! ```text
//! expr  := term (OR term)*
//! term  := factor (AND factor)*
//! factor:= '(' expr ')' | ATTR op VALUE | ATTR LIKE VALUE
//! op    := = | != | <> | < | > | <= | >=
//! ```
//! - Attributes: `key`, `content-length` (also `size`), `last-modified`, `content-type`,
//!   `etag`, `x-amz-meta-NAME`, `tags.NAME`, and Locus's own `locus.cached`,
//!   `locus.tier`, `locus.persist-state`, `locus.pinned`, `locus.mount`. An attribute may
//!   be written in backticks.
//! - Values: a word (hyphens need no quotes, as in Zenko: `x-amz-meta-food = ice-cream`),
//!   or a string in single or double quotes (a doubled quote or a backslash escapes one).
//! - `LIKE` takes a regular expression, unanchored (`^`/`$` anchor it), written as the
//!   pattern itself or as `/pattern/flags` with the flags `i`, `m`, `s` and `x`.
//! - Comparisons are typed by attribute: `content-length` and `locus.cached` are numbers,
//!   `last-modified` is a time (ISO 8601, a date alone meaning midnight UTC),
//!   `locus.pinned` a boolean, `locus.persist-state` one of the persist states; other
//!   attributes are strings, compared as numbers when both sides are numbers.
//! - An object without the attribute matches only `!=` and `<>` (as Zenko's MongoDB
//!   back end does).

use std::fmt;

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use locus_common::{Error, Result};
use locus_proto::pb;
use regex::{Regex, RegexBuilder};

/// An attribute a search can test.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attr {
    Key,
    Size,
    Modified,
    ContentType,
    Etag,
    /// User metadata (`x-amz-meta-NAME`), the name in lower case.
    Meta(String),
    /// An object tag (`tags.NAME`), case-sensitive.
    Tag(String),
    /// Fraction of the object's bytes in the cache, 0 to 1.
    Cached,
    /// The fastest tier holding a block of the object (`MEM`, `SSD`, `HDD`), or `NONE`.
    Tier,
    PersistState,
    Pinned,
    /// The Locus path of the mount holding the object.
    Mount,
}

/// The attribute names a search accepts, for messages.
pub const ATTRIBUTES: &str = "key, content-length, last-modified, content-type, etag, x-amz-meta-NAME, tags.NAME, \
     locus.cached, locus.tier, locus.persist-state, locus.pinned, locus.mount";

impl Attr {
    fn parse(name: &str) -> Option<Attr> {
        let lower = name.to_ascii_lowercase();
        Some(match lower.as_str() {
            "key" => Attr::Key,
            "content-length" | "size" => Attr::Size,
            "last-modified" => Attr::Modified,
            "content-type" => Attr::ContentType,
            "etag" => Attr::Etag,
            "locus.cached" => Attr::Cached,
            "locus.tier" => Attr::Tier,
            "locus.persist-state" => Attr::PersistState,
            "locus.pinned" => Attr::Pinned,
            "locus.mount" => Attr::Mount,
            _ => {
                if let Some(n) = lower.strip_prefix("x-amz-meta-").filter(|n| !n.is_empty()) {
                    Attr::Meta(n.to_string())
                } else if name.len() > 5 && lower.starts_with("tags.") {
                    Attr::Tag(name[5..].to_string())
                } else {
                    return None;
                }
            }
        })
    }

    /// Whether the attribute is Locus's own (read from the namespace, not the catalog).
    pub fn is_locus(&self) -> bool {
        matches!(self, Attr::Cached | Attr::Tier | Attr::PersistState | Attr::Pinned | Attr::Mount)
    }

    fn kind(&self) -> ValueKind {
        match self {
            Attr::Size | Attr::Cached => ValueKind::Number,
            Attr::Modified => ValueKind::Time,
            Attr::Pinned => ValueKind::Bool,
            Attr::PersistState => ValueKind::State,
            _ => ValueKind::Text,
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Key => f.write_str("key"),
            Attr::Size => f.write_str("content-length"),
            Attr::Modified => f.write_str("last-modified"),
            Attr::ContentType => f.write_str("content-type"),
            Attr::Etag => f.write_str("etag"),
            Attr::Meta(n) => write!(f, "x-amz-meta-{n}"),
            Attr::Tag(n) => write!(f, "tags.{n}"),
            Attr::Cached => f.write_str("locus.cached"),
            Attr::Tier => f.write_str("locus.tier"),
            Attr::PersistState => f.write_str("locus.persist-state"),
            Attr::Pinned => f.write_str("locus.pinned"),
            Attr::Mount => f.write_str("locus.mount"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ValueKind {
    Number,
    Time,
    Bool,
    State,
    Text,
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    /// `<`, `<=`, `>` or `>=`.
    pub fn is_range(self) -> bool {
        matches!(self, Op::Lt | Op::Le | Op::Gt | Op::Ge)
    }

    fn holds(self, o: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Op::Eq => o == Equal,
            Op::Ne => o != Equal,
            Op::Lt => o == Less,
            Op::Le => o != Greater,
            Op::Gt => o == Greater,
            Op::Ge => o != Less,
        }
    }
}

/// A typed literal.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A number (`content-length`, `locus.cached`).
    Number(f64),
    /// Milliseconds since the epoch (`last-modified`).
    Time(i64),
    Bool(bool),
    State(pb::PersistState),
    /// Text, and its value as a number when it is one.
    Text(String, Option<f64>),
}

/// A parsed search.
#[derive(Clone, Debug)]
pub enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Cmp {
        attr: Attr,
        op: Op,
        value: Value,
    },
    /// `prefix`: what every match starts with; `prefixes`: the few literals one of which
    /// every match starts with, when the pattern has such (else empty).
    Like {
        attr: Attr,
        re: Regex,
        prefix: Option<String>,
        prefixes: Vec<String>,
    },
}

/// What an expression is evaluated against.
pub trait Object {
    fn key(&self) -> &str;
    fn size(&self) -> u64;
    fn mtime_ms(&self) -> i64;
    fn content_type(&self) -> &str;
    fn etag(&self) -> &str;
    fn meta(&self, name: &str) -> Option<&str>;
    fn tag(&self, name: &str) -> Option<&str>;
    /// Locus's own attributes (`None` where they were not looked up).
    fn locus(&self) -> Option<&LocusAttrs>;
}

/// Locus's own attributes of an object, read from the namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocusAttrs {
    pub cached: f64,
    pub tier: String,
    pub persist_state: pb::PersistState,
    pub pinned: bool,
    pub mount: String,
}

impl Expr {
    /// Parse a search; the error says what is wrong and where.
    pub fn parse(s: &str) -> Result<Expr> {
        let toks = lex(s)?;
        if toks.is_empty() {
            return Err(Error::invalid("the search is empty"));
        }
        let mut p = Parser { toks, i: 0, src: s };
        let e = p.or()?;
        if let Some(t) = p.toks.get(p.i) {
            return Err(p.err_at(t.at, format!("unexpected {}", t.tok)));
        }
        Ok(e)
    }

    /// Whether evaluating this needs Locus's own attributes.
    pub fn needs_locus(&self) -> bool {
        match self {
            Expr::And(v) | Expr::Or(v) => v.iter().any(Expr::needs_locus),
            Expr::Cmp { attr, .. } | Expr::Like { attr, .. } => attr.is_locus(),
        }
    }

    /// Whether this looks at nothing but the key.
    pub fn only_key(&self) -> bool {
        match self {
            Expr::And(v) | Expr::Or(v) => v.iter().all(Expr::only_key),
            Expr::Cmp { attr, .. } | Expr::Like { attr, .. } => *attr == Attr::Key,
        }
    }

    /// Whether `o` matches.
    pub fn matches(&self, o: &dyn Object) -> bool {
        match self {
            Expr::And(v) => v.iter().all(|e| e.matches(o)),
            Expr::Or(v) => v.iter().any(|e| e.matches(o)),
            Expr::Like { attr, re, .. } => text_of(attr, o).is_some_and(|t| re.is_match(&t)),
            Expr::Cmp { attr, op, value } => match compare(attr, value, o, matches!(op, Op::Eq | Op::Ne)) {
                Some(ord) => op.holds(ord),
                None => *op == Op::Ne,
            },
        }
    }
}

fn text_of<'a>(attr: &Attr, o: &'a dyn Object) -> Option<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow::*;
    Some(match attr {
        Attr::Key => Borrowed(o.key()),
        Attr::ContentType => Borrowed(o.content_type()),
        Attr::Etag => Borrowed(o.etag()),
        Attr::Meta(n) => Borrowed(o.meta(n)?),
        Attr::Tag(n) => Borrowed(o.tag(n)?),
        Attr::Tier => Borrowed(o.locus()?.tier.as_str()),
        Attr::Mount => Borrowed(o.locus()?.mount.as_str()),
        Attr::PersistState => Borrowed(o.locus()?.persist_state.name()),
        Attr::Size => Owned(o.size().to_string()),
        Attr::Cached => Owned(o.locus()?.cached.to_string()),
        Attr::Pinned => Owned(o.locus()?.pinned.to_string()),
        Attr::Modified => Owned(crate::iso_ms(o.mtime_ms())),
    })
}

/// The object's attribute against a literal; `None` when the object lacks it. Text
/// compares as numbers when both sides are numbers, unless `exact_text` (`=`, `!=`).
fn compare(attr: &Attr, value: &Value, o: &dyn Object, exact_text: bool) -> Option<std::cmp::Ordering> {
    Some(match (attr, value) {
        (Attr::Size, Value::Number(n)) => (o.size() as f64).total_cmp(n),
        (Attr::Cached, Value::Number(n)) => o.locus()?.cached.total_cmp(n),
        (Attr::Modified, Value::Time(t)) => o.mtime_ms().cmp(t),
        (Attr::Pinned, Value::Bool(b)) => o.locus()?.pinned.cmp(b),
        (Attr::PersistState, Value::State(s)) => {
            let have = o.locus()?.persist_state;
            if have == *s {
                std::cmp::Ordering::Equal
            } else {
                (have as i32).cmp(&(*s as i32)).then(std::cmp::Ordering::Less)
            }
        }
        (_, Value::Text(s, num)) => {
            let have = text_of(attr, o)?;
            match (num.as_ref().filter(|_| !exact_text), have.parse::<f64>().ok().filter(|_| looks_numeric(&have))) {
                (Some(n), Some(h)) => h.total_cmp(n),
                _ => have.as_ref().cmp(s.as_str()),
            }
        }
        _ => return None,
    })
}

fn looks_numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'))
}

// ------------------------------------------------------------------ lexing

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LParen,
    RParen,
    Op(Op),
    /// A bare word (attribute, keyword or unquoted value).
    Word(String),
    /// A quoted string or a backticked name.
    Quoted(String),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::LParen => f.write_str("`(`"),
            Tok::RParen => f.write_str("`)`"),
            Tok::Op(o) => write!(f, "`{}`", op_text(*o)),
            Tok::Word(w) => write!(f, "`{w}`"),
            Tok::Quoted(q) => write!(f, "\"{q}\""),
        }
    }
}

fn op_text(o: Op) -> &'static str {
    match o {
        Op::Eq => "=",
        Op::Ne => "!=",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Gt => ">",
        Op::Ge => ">=",
    }
}

struct Spanned {
    tok: Tok,
    /// Character position (0-based) in the search.
    at: usize,
}

fn lex(s: &str) -> Result<Vec<Spanned>> {
    let cs: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        let at = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = match c {
            '(' => {
                i += 1;
                Tok::LParen
            }
            ')' => {
                i += 1;
                Tok::RParen
            }
            '=' => {
                i += if cs.get(i + 1) == Some(&'=') { 2 } else { 1 };
                Tok::Op(Op::Eq)
            }
            '!' => {
                if cs.get(i + 1) != Some(&'=') {
                    return Err(err_at(s, at, "`!` must be followed by `=` (NOT is not supported)"));
                }
                i += 2;
                Tok::Op(Op::Ne)
            }
            '<' => match cs.get(i + 1) {
                Some('=') => {
                    i += 2;
                    Tok::Op(Op::Le)
                }
                Some('>') => {
                    i += 2;
                    Tok::Op(Op::Ne)
                }
                _ => {
                    i += 1;
                    Tok::Op(Op::Lt)
                }
            },
            '>' => {
                if cs.get(i + 1) == Some(&'=') {
                    i += 2;
                    Tok::Op(Op::Ge)
                } else {
                    i += 1;
                    Tok::Op(Op::Gt)
                }
            }
            '\'' | '"' | '`' => {
                let q = c;
                let mut v = String::new();
                i += 1;
                loop {
                    match cs.get(i) {
                        None => return Err(err_at(s, at, format!("the string opened here has no closing {q}"))),
                        Some('\\') if q != '`' && matches!(cs.get(i + 1), Some(&n) if n == q || n == '\\') => {
                            v.push(cs[i + 1]);
                            i += 2;
                        }
                        Some(&x) if x == q => {
                            if cs.get(i + 1) == Some(&q) {
                                v.push(q);
                                i += 2;
                            } else {
                                i += 1;
                                break;
                            }
                        }
                        Some(&x) => {
                            v.push(x);
                            i += 1;
                        }
                    }
                }
                Tok::Quoted(v)
            }
            _ => {
                let start = i;
                while i < cs.len() && !cs[i].is_whitespace() && !matches!(cs[i], '(' | ')' | '=' | '!' | '<' | '>') {
                    if matches!(cs[i], '\'' | '"' | '`') {
                        return Err(err_at(s, i, "a quote inside a word: quote the whole value"));
                    }
                    i += 1;
                }
                Tok::Word(cs[start..i].iter().collect())
            }
        };
        out.push(Spanned { tok, at });
    }
    Ok(out)
}

fn err_at(src: &str, at: usize, msg: impl fmt::Display) -> Error {
    let near: String = src.chars().skip(at).take(24).collect();
    Error::invalid(format!("invalid search at character {}: {msg} (near `{near}`)", at + 1))
}

// ------------------------------------------------------------------ parsing

struct Parser<'a> {
    toks: Vec<Spanned>,
    i: usize,
    src: &'a str,
}

fn is_kw(t: &Tok, kw: &str) -> bool {
    matches!(t, Tok::Word(w) if w.eq_ignore_ascii_case(kw))
}

impl Parser<'_> {
    fn err_at(&self, at: usize, msg: impl fmt::Display) -> Error {
        err_at(self.src, at, msg)
    }

    fn end_at(&self) -> usize {
        self.src.chars().count()
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.tok)
    }

    fn or(&mut self) -> Result<Expr> {
        let mut v = vec![self.and()?];
        while self.peek().is_some_and(|t| is_kw(t, "or")) {
            self.i += 1;
            v.push(self.and()?);
        }
        Ok(if v.len() == 1 { v.swap_remove(0) } else { Expr::Or(v) })
    }

    fn and(&mut self) -> Result<Expr> {
        let mut v = vec![self.factor()?];
        while self.peek().is_some_and(|t| is_kw(t, "and")) {
            self.i += 1;
            v.push(self.factor()?);
        }
        Ok(if v.len() == 1 { v.swap_remove(0) } else { Expr::And(v) })
    }

    fn factor(&mut self) -> Result<Expr> {
        let Some(t) = self.toks.get(self.i) else {
            return Err(self.err_at(self.end_at(), "the search ends where a condition should start"));
        };
        let at = t.at;
        match &t.tok {
            Tok::LParen => {
                self.i += 1;
                let e = self.or()?;
                match self.toks.get(self.i) {
                    Some(Spanned { tok: Tok::RParen, .. }) => {
                        self.i += 1;
                        Ok(e)
                    }
                    Some(t) => Err(self.err_at(t.at, format!("expected `)`, found {}", t.tok))),
                    None => Err(self.err_at(at, "this `(` is never closed")),
                }
            }
            Tok::Word(w) if ["not", "in", "between", "is"].iter().any(|k| w.eq_ignore_ascii_case(k)) => {
                Err(self.err_at(at, format!("{} is not supported", w.to_uppercase())))
            }
            Tok::Word(name) | Tok::Quoted(name) => {
                let attr = Attr::parse(name)
                    .ok_or_else(|| self.err_at(at, format!("unknown attribute `{name}` (known: {ATTRIBUTES})")))?;
                self.i += 1;
                self.condition(attr, at)
            }
            other => Err(self.err_at(at, format!("expected an attribute, found {other}"))),
        }
    }

    fn condition(&mut self, attr: Attr, attr_at: usize) -> Result<Expr> {
        let Some(t) = self.toks.get(self.i) else {
            return Err(self.err_at(self.end_at(), format!("`{attr}` needs an operator and a value")));
        };
        let (op_at, like, op) = match &t.tok {
            Tok::Op(o) => (t.at, false, *o),
            w if is_kw(w, "like") => (t.at, true, Op::Eq),
            other => {
                return Err(self.err_at(t.at, format!("expected an operator after `{attr}`, found {other}")));
            }
        };
        self.i += 1;
        let Some(v) = self.toks.get(self.i) else {
            return Err(self.err_at(self.end_at(), format!("`{attr}` needs a value")));
        };
        let (raw, quoted) = match &v.tok {
            Tok::Word(w) => (w.clone(), false),
            Tok::Quoted(q) => (q.clone(), true),
            other => return Err(self.err_at(v.at, format!("expected a value, found {other}"))),
        };
        let v_at = v.at;
        self.i += 1;
        if like {
            return self.like(attr, &raw, attr_at, v_at);
        }
        let _ = (op_at, quoted);
        let value = match attr.kind() {
            ValueKind::Number => Value::Number(
                raw.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite())
                    .ok_or_else(|| self.err_at(v_at, format!("`{attr}` is a number; `{raw}` is not")))?,
            ),
            ValueKind::Time => Value::Time(
                parse_time(&raw)
                    .ok_or_else(|| self.err_at(v_at, format!("`{attr}` is a time (ISO 8601); `{raw}` is not")))?,
            ),
            ValueKind::Bool => Value::Bool(match raw.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(self.err_at(v_at, format!("`{attr}` is true or false; `{raw}` is not"))),
            }),
            ValueKind::State => {
                let up = raw.to_ascii_uppercase().replace('-', "_");
                let s = pb::PersistState::parse(&up).filter(|_| !up.is_empty()).ok_or_else(|| {
                    self.err_at(
                        v_at,
                        format!("`{raw}` is not a persist state (PERSISTED, TO_BE_PERSISTED, NOT_PERSISTED, LOST)"),
                    )
                })?;
                if !matches!(op, Op::Eq | Op::Ne) {
                    return Err(self.err_at(op_at, "a persist state compares only with = and !="));
                }
                Value::State(s)
            }
            ValueKind::Text => {
                let raw = if attr == Attr::Etag { raw.trim_matches('"').to_string() } else { raw };
                let num = raw.parse::<f64>().ok().filter(|_| looks_numeric(&raw));
                Value::Text(raw, num)
            }
        };
        Ok(Expr::Cmp { attr, op, value })
    }

    fn like(&self, attr: Attr, raw: &str, attr_at: usize, v_at: usize) -> Result<Expr> {
        if !matches!(attr.kind(), ValueKind::Text | ValueKind::State) {
            return Err(self.err_at(attr_at, format!("LIKE applies to text attributes; `{attr}` is not text")));
        }
        let (pat, flags) = match raw.strip_prefix('/').and_then(|r| r.rfind('/').map(|j| (&r[..j], &r[j + 1..]))) {
            Some((p, f)) if raw.len() >= 2 => (p, f),
            _ => (raw, ""),
        };
        let mut b = RegexBuilder::new(pat);
        for f in flags.chars() {
            match f {
                'i' => b.case_insensitive(true),
                'm' => b.multi_line(true),
                's' => b.dot_matches_new_line(true),
                'x' => b.ignore_whitespace(true),
                _ => return Err(self.err_at(v_at, format!("unknown regular expression flag `{f}` (i, m, s, x)"))),
            };
        }
        let re = b.size_limit(1 << 20).build().map_err(|e| {
            let first = e.to_string().lines().last().unwrap_or_default().trim().to_string();
            self.err_at(v_at, format!("not a valid regular expression: {first}"))
        })?;
        let literal = !flags.contains('i') && !flags.contains('x');
        // (The pattern's literals are extracted once for both.)
        let lits = if literal { prefix_literals(pat) } else { None };
        let prefix = lits.as_deref().and_then(common_prefix);
        let prefixes = lits.map(prefix_set).unwrap_or_default();
        Ok(Expr::Like { attr, re, prefix, prefixes })
    }
}

/// The literals one of which every match of an anchored pattern starts with, as text
/// (`^a/(b|c)/` → `a/b/`, `a/c/`), when finitely many (`None` for an unanchored pattern).
fn prefix_literals(pat: &str) -> Option<Vec<Vec<u8>>> {
    use regex_syntax::hir::Look;
    use regex_syntax::hir::literal::{ExtractKind, Extractor};
    let hir = regex_syntax::Parser::new().parse(pat).ok()?;
    // Only a pattern anchored at the start of the text (not of a line) has a prefix.
    if !hir.properties().look_set_prefix().contains(Look::Start) {
        return None;
    }
    let seq = Extractor::new().kind(ExtractKind::Prefix).extract(&hir);
    Some(seq.literals()?.iter().map(|l| l.as_bytes().to_vec()).collect())
}

/// At most this many prefixes are scanned one by one (else their common prefix).
const PREFIXES_MAX: usize = 64;

/// The prefixes of [`prefix_literals`], sorted, none a prefix of another (each stands for
/// a key range; empty when there are more than [`PREFIXES_MAX`] or one is empty).
fn prefix_set(mut lits: Vec<Vec<u8>>) -> Vec<String> {
    lits.sort();
    let mut out: Vec<String> = Vec::new();
    for l in lits {
        let Ok(s) = String::from_utf8(l) else { return Vec::new() };
        if s.is_empty() {
            return Vec::new();
        }
        if out.last().is_some_and(|p| s.starts_with(p.as_str())) {
            continue; // (sorted: a prefix comes right before what it covers)
        }
        out.push(s);
    }
    if out.len() > PREFIXES_MAX { Vec::new() } else { out }
}

/// The longest text every literal starts with (`^logs/2026-.*` → `logs/2026-`), so a
/// search can seek to it in key order (`None` when empty).
fn common_prefix(lits: &[Vec<u8>]) -> Option<String> {
    // The longest prefix common to every alternative.
    let first = lits.first()?;
    let mut n = first.len();
    for l in &lits[1..] {
        n = n.min(first.iter().zip(l).take_while(|(a, b)| a == b).count());
    }
    let mut p = &first[..n];
    while std::str::from_utf8(p).is_err() {
        p = &p[..p.len() - 1];
    }
    let s = std::str::from_utf8(p).ok()?;
    (!s.is_empty()).then(|| s.to_string())
}

/// An ISO 8601 time as milliseconds since the epoch: `2026-01-15`, `2026-01-15T10:00:00`,
/// with seconds' fractions and a `Z` or `+hh:mm` offset (none meaning UTC).
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    for f in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc().timestamp_millis());
        }
    }
    if let Ok(t) = DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%z") {
        return Some(t.timestamp_millis());
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .map(|d| d.and_time(chrono::NaiveTime::MIN).and_utc().timestamp_millis())
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
