//! S3 Select's SQL dialect as text: an expression (`SELECT s.name FROM S3Object[*] s
//! WHERE s.age > 40`) becomes DataFusion SQL over the table `s3object` ([`translate`]),
//! with S3 Select's functions, casts, timestamps, positional and header columns, and
//! the path into JSON records ([`normalize_from`]); errors carry S3 Select's codes.
//!
//! Text to text, on `sqlparser` (the version DataFusion parses the result with): this
//! crate must not depend on DataFusion, the client or anything that does I/O, so that
//! its fuzz target builds in minutes. `locus-sql` runs what it makes.

use locus_common::Error;
use sqlparser::ast::{self, Expr, Ident, ObjectName, ObjectNamePart, visit_expressions_mut};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

mod functions;

pub use functions::ion_timestamp;

/// The S3 Select error classes (the gateway maps each to its S3 error code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectErrorCode {
    /// The expression does not parse (`ParseUnexpectedToken`).
    Syntax,
    /// A positional column past the record's fields (`InvalidColumnIndex`).
    ColumnIndex,
    /// A column name the header does not have (`ParseInvalidPathComponent`... S3 answers
    /// `InvalidColumnIndex` for CSV too).
    UnknownColumn,
    /// The object's CSV cannot be parsed (`CSVParsingError`).
    CsvParsing,
    /// The object's JSON cannot be parsed (`JSONParsingError`).
    JsonParsing,
    /// A CAST of a value failed (`CastFailed`).
    Cast,
    /// Valid SQL this engine or S3 Select does not support (`UnsupportedSyntax`).
    Unsupported,
    /// A request field with a value S3 Select does not allow (`InvalidRequestParameter`).
    BadRequest,
    /// A `ScanRange` on input it cannot split (`UnsupportedScanRangeInput`).
    UnsupportedScanRange,
    /// The object is not in its stated compression format (`InvalidCompressionFormat`).
    Compression,
    /// Not an S3 Select problem: the Locus error's kind decides.
    Other,
}

/// A failed select: its class and the error.
#[derive(Debug)]
pub struct SelectError {
    pub code: SelectErrorCode,
    pub error: Error,
}

impl SelectError {
    pub fn new(code: SelectErrorCode, msg: impl Into<String>) -> Self {
        SelectError { code, error: Error::invalid(msg.into()) }
    }
}

impl From<Error> for SelectError {
    fn from(error: Error) -> Self {
        SelectError { code: SelectErrorCode::Other, error }
    }
}

pub type SelectResult<T> = std::result::Result<T, SelectError>;

/// A step of the path after `S3Object[*]` into JSON records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `.name` or `."Name"`.
    Key(String),
    /// `[*]`: every element of an array.
    All,
    /// `[n]`: one element.
    Index(usize),
}

/// The S3 Select expression as DataFusion SQL over the table `s3object`. `columns`: the
/// CSV columns, and whether they are named by a header.
pub fn translate(expr: &str, columns: Option<(&[String], bool)>) -> SelectResult<String> {
    let (text, _) = normalize_from(expr)?;
    let text = trim_spaces_by_default(&text);
    shallow_brackets(&text)?;
    let mut stmts = Parser::parse_sql(&GenericDialect {}, &text)
        .map_err(|e| SelectError::new(SelectErrorCode::Syntax, format!("{e}")))?;
    if stmts.len() != 1 {
        return Err(SelectError::new(SelectErrorCode::Syntax, "the expression must be one SELECT"));
    }
    let ast::Statement::Query(q) = &mut stmts[0] else {
        return Err(SelectError::new(SelectErrorCode::Unsupported, "only SELECT is supported"));
    };
    let alias = table_alias(q)?;
    let mut err = None;
    let _ = visit_expressions_mut(&mut stmts, |e| {
        s3_cast_type(e);
        if err.is_none()
            && let Err(x) = functions::s3_function(e)
        {
            err = Some(x);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    let _ = visit_expressions_mut(&mut stmts, |e| {
        if err.is_none()
            && let Err(x) = rewrite_column(e, alias.as_deref(), columns)
        {
            err = Some(x);
        }
        if columns.is_some() {
            numeric_text(e);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    if let Some(e) = err {
        return Err(e);
    }
    if let ast::Statement::Query(q) = &mut stmts[0]
        && let ast::SetExpr::Select(sel) = q.body.as_mut()
    {
        name_unnamed(&mut sel.projection);
    }
    Ok(stmts[0].to_string())
}

/// `S3Object[*]` (any case, optional `[*]`) becomes the plain table name `s3object`; a
/// path after it into JSON records (`S3Object[*].a."B"[*][0]`) is taken out and returned.
pub fn normalize_from(expr: &str) -> SelectResult<(String, Vec<Step>)> {
    let lower = expr.to_ascii_lowercase();
    let mut out = String::with_capacity(expr.len());
    let mut path = Vec::new();
    let mut i = 0;
    while let Some(p) = lower[i..].find("s3object") {
        let at = i + p;
        out.push_str(&expr[i..at]);
        out.push_str("s3object");
        let mut j = at + "s3object".len();
        if let Some(after) = star(&expr[j..]) {
            j = expr.len() - after.len();
            // The path: `.name`, `."name"`, `[*]`, `[n]`.
            loop {
                let rest = &expr[j..];
                if let Some(after) = star(rest) {
                    path.push(Step::All);
                    j = expr.len() - after.len();
                } else if let Some(after) = rest.strip_prefix('[') {
                    let Some(close) = after.find(']') else { break };
                    let Ok(n) = after[..close].trim().parse::<usize>() else { break };
                    path.push(Step::Index(n));
                    j = expr.len() - after.len() + close + 1;
                } else if let Some(after) = rest.strip_prefix(".\"") {
                    let close = after.find('"').ok_or_else(|| {
                        SelectError::new(SelectErrorCode::Syntax, "an unclosed quoted name in the FROM path")
                    })?;
                    path.push(Step::Key(after[..close].to_string()));
                    j = expr.len() - after.len() + close + 1;
                } else if let Some(after) = rest.strip_prefix('.') {
                    let n = after.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(after.len());
                    if n == 0 {
                        break;
                    }
                    path.push(Step::Key(after[..n].to_string()));
                    j = expr.len() - after.len() + n;
                } else {
                    break;
                }
            }
        }
        i = j;
    }
    out.push_str(&expr[i..]);
    Ok((out, path))
}

/// How deep square brackets may nest in an expression: S3 Select's paths index one level
/// at a time (`s.a[0][1]`), and sqlparser's time doubles with each level of brackets
/// around a compound name (`[t.SELECT [t.SELECT ...`: 16 levels took half a second,
/// the fuzzer's 14 with more around them 11 s).
const MAX_BRACKET_DEPTH: usize = 8;

/// Refuses an expression whose square brackets, outside quotes, nest deeper than
/// [`MAX_BRACKET_DEPTH`] (an unclosed one counts as open to the end).
fn shallow_brackets(text: &str) -> SelectResult<()> {
    let (mut depth, mut quote) = (0usize, None::<char>);
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => {
                depth += 1;
                if depth > MAX_BRACKET_DEPTH {
                    return Err(SelectError::new(
                        SelectErrorCode::Syntax,
                        format!("square brackets nest more than {MAX_BRACKET_DEPTH} deep"),
                    ));
                }
            }
            (None, ']') => depth = depth.saturating_sub(1),
            (None, _) => {}
        }
    }
    Ok(())
}

/// `TRIM(LEADING FROM x)` (and BOTH, TRAILING) with the characters left out, as S3
/// Select allows, becomes `TRIM(LEADING ' ' FROM x)`: the SQL parser wants them named.
/// Text inside quotes is left alone.
fn trim_spaces_by_default(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let (mut quote, mut rest) = (None::<char>, text);
    while let Some(c) = rest.chars().next() {
        if let Some(q) = quote {
            quote = (c != q).then_some(q);
        } else if c == '\'' || c == '"' {
            quote = Some(c);
        } else if rest.len() >= 4 && rest.is_char_boundary(4) && rest[..4].eq_ignore_ascii_case("trim") {
            let before_ok = !out.ends_with(|p: char| p.is_alphanumeric() || p == '_');
            if let Some(n) = before_ok.then(|| trim_where_then_from(&rest[4..])).flatten() {
                out.push_str(&rest[..4 + n]);
                out.push_str(" ' '");
                rest = &rest[4 + n..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// For the text after `TRIM`: when it is `(` BOTH|LEADING|TRAILING `FROM`, the length
/// up to the end of that keyword (where the characters go).
fn trim_where_then_from(after: &str) -> Option<usize> {
    let s = after.trim_start().strip_prefix('(')?;
    let s_trim = s.trim_start();
    let word = s_trim.split(|c: char| !c.is_ascii_alphabetic()).next()?;
    if !["both", "leading", "trailing"].iter().any(|w| word.eq_ignore_ascii_case(w)) {
        return None;
    }
    let tail = &s_trim[word.len()..];
    let next = tail.trim_start();
    let from = next.get(..4)?;
    let ends = next[4..].chars().next().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
    (from.eq_ignore_ascii_case("from") && ends && tail.len() > next.len()).then(|| after.len() - tail.len())
}

/// `rest` after a leading `[*]` (spaces allowed inside), if it has one.
fn star(rest: &str) -> Option<&str> {
    let after = rest.trim_start().strip_prefix('[')?.trim_start().strip_prefix('*')?.trim_start().strip_prefix(']')?;
    Some(after)
}

/// The alias the query gives `s3object` (`FROM s3object s` or `AS s`), if any; the one
/// table must be `s3object`.
fn table_alias(q: &ast::Query) -> SelectResult<Option<String>> {
    let ast::SetExpr::Select(sel) = q.body.as_ref() else {
        return Err(SelectError::new(SelectErrorCode::Unsupported, "only a plain SELECT is supported"));
    };
    if sel.from.len() != 1 || !sel.from[0].joins.is_empty() {
        return Err(SelectError::new(SelectErrorCode::Unsupported, "select FROM S3Object, one table, no joins"));
    }
    match &sel.from[0].relation {
        ast::TableFactor::Table { name, alias, .. } => {
            if !is_s3object(name) {
                return Err(SelectError::new(
                    SelectErrorCode::Syntax,
                    format!("the table must be S3Object, not {name}"),
                ));
            }
            Ok(alias.as_ref().map(|a| a.name.value.to_ascii_lowercase()))
        }
        _ => Err(SelectError::new(SelectErrorCode::Unsupported, "select FROM S3Object")),
    }
}

/// S3 Select's CAST types in DataFusion's terms: `INT`/`INTEGER` is 64-bit (DataFusion's
/// is 32), `FLOAT`/`REAL` is a double (DataFusion's is single precision).
fn s3_cast_type(e: &mut Expr) {
    if let Expr::Cast { data_type, .. } = e {
        match data_type {
            ast::DataType::Int(_) | ast::DataType::Integer(_) => *data_type = ast::DataType::BigInt(None),
            ast::DataType::Float(_) | ast::DataType::Real => {
                *data_type = ast::DataType::Double(ast::ExactNumberInfo::None)
            }
            _ => {}
        }
    }
}

/// S3 Select names a projected expression that is not a column `_1`, `_2`, ... by its
/// position (what JSON output shows as the key), not by its text.
fn name_unnamed(projection: &mut [ast::SelectItem]) {
    for (i, item) in projection.iter_mut().enumerate() {
        if let ast::SelectItem::UnnamedExpr(e) = item
            && !matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
        {
            *item = ast::SelectItem::ExprWithAlias { expr: e.clone(), alias: Ident::new(format!("_{}", i + 1)) };
        }
    }
}

fn is_s3object(name: &ObjectName) -> bool {
    matches!(name.0.as_slice(), [ObjectNamePart::Identifier(i)] if i.value.eq_ignore_ascii_case("s3object"))
}

/// CSV fields are text; S3 Select compares one with a number as a number (`s.age > 40`,
/// `BETWEEN 1 AND 9`, `s.n * 2`, `SUM(s.n)`), where DataFusion would compare text or
/// fail. Such a column (already resolved to its quoted name) becomes
/// `TRY_CAST(col AS DOUBLE)`: a field that is not a number is NULL there.
fn numeric_text(e: &mut Expr) {
    fn is_col(e: &Expr) -> bool {
        matches!(e, Expr::Identifier(i) if i.quote_style.is_some())
    }
    fn is_num(e: &Expr) -> bool {
        match e {
            Expr::Value(v) => matches!(v.value, ast::Value::Number(..)),
            Expr::UnaryOp { op: ast::UnaryOperator::Minus | ast::UnaryOperator::Plus, expr } => is_num(expr),
            Expr::Nested(x) => is_num(x),
            _ => false,
        }
    }
    fn num(e: &mut Expr) {
        let col = std::mem::replace(e, Expr::value(ast::Value::Null));
        *e = Expr::Cast {
            kind: ast::CastKind::TryCast,
            expr: Box::new(col),
            data_type: ast::DataType::Double(ast::ExactNumberInfo::None),
            array: false,
            format: None,
        };
    }
    use ast::BinaryOperator as B;
    match e {
        Expr::BinaryOp {
            left,
            op:
                B::Gt
                | B::Lt
                | B::GtEq
                | B::LtEq
                | B::Eq
                | B::NotEq
                | B::Plus
                | B::Minus
                | B::Multiply
                | B::Divide
                | B::Modulo,
            right,
        } => {
            if is_col(left) && is_num(right) {
                num(left);
            } else if is_col(right) && is_num(left) {
                num(right);
            }
        }
        Expr::Between { expr, low, high, .. } if is_col(expr) && is_num(low) && is_num(high) => num(expr),
        Expr::Function(f) if matches!(f.name.to_string().to_ascii_lowercase().as_str(), "sum" | "avg") => {
            if let ast::FunctionArguments::List(l) = &mut f.args
                && let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(x))] = l.args.as_mut_slice()
                && is_col(x)
            {
                num(x);
            }
        }
        _ => {}
    }
}

/// A column reference in S3 Select terms to the registered column's quoted name.
fn rewrite_column(e: &mut Expr, alias: Option<&str>, columns: Option<(&[String], bool)>) -> SelectResult<()> {
    let ident = match e {
        Expr::Identifier(i) => i.clone(),
        Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
            let q = parts[0].value.to_ascii_lowercase();
            if Some(q.as_str()) != alias && q != "s3object" {
                return Err(SelectError::new(
                    SelectErrorCode::Syntax,
                    format!("unknown table or alias '{}'", parts[0].value),
                ));
            }
            parts[1].clone()
        }
        _ => return Ok(()),
    };
    let Some((names, named)) = columns else {
        // JSON and Parquet: the names are the data's own.
        *e = Expr::Identifier(Ident::with_quote('"', ident.value));
        return Ok(());
    };
    let resolved =
        if let Some(n) = positional(&ident) {
            match names.get(n - 1) {
                Some(name) => name.clone(),
                None => {
                    return Err(SelectError::new(
                        SelectErrorCode::ColumnIndex,
                        format!("column {} is past the record's {} columns", ident.value, names.len()),
                    ));
                }
            }
        } else if !named {
            return Err(SelectError::new(
                SelectErrorCode::UnknownColumn,
                format!("no column '{}': without FileHeaderInfo USE, name columns _1, _2, ...", ident.value),
            ));
        } else if ident.quote_style.is_some() {
            names.iter().find(|n| **n == ident.value).cloned().ok_or_else(|| {
                SelectError::new(SelectErrorCode::UnknownColumn, format!("no column \"{}\"", ident.value))
            })?
        } else {
            names.iter().find(|n| n.eq_ignore_ascii_case(&ident.value)).cloned().ok_or_else(|| {
                SelectError::new(SelectErrorCode::UnknownColumn, format!("no column '{}'", ident.value))
            })?
        };
    *e = Expr::Identifier(Ident::with_quote('"', resolved));
    Ok(())
}

fn positional(i: &Ident) -> Option<usize> {
    if i.quote_style.is_some() {
        return None;
    }
    i.value.strip_prefix('_')?.parse::<usize>().ok().filter(|n| *n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The fuzzer's input that took sqlparser 11 s (brackets around compound names, 14
    /// deep) is refused at once; paths that index level by level still translate.
    #[test]
    fn deeply_nested_brackets_are_refused_before_parsing() {
        let slow = "SELECT e.CLECe.CT [te.SELECT [te.SELECT [te.CT[te.kqe.T [te.SELECT [te.CT[te.kqeT \
                    [te.SELECe.CT [te.SELECT [te.SELECT [te.CT[te.kqe.T [te.SELECT [te.CT[te.kqe. 5:kqe. 5:";
        let t = std::time::Instant::now();
        let e = translate(slow, None).unwrap_err();
        assert!(t.elapsed() < std::time::Duration::from_millis(100), "{:?}", t.elapsed());
        assert_eq!(e.code, SelectErrorCode::Syntax);
        assert!(e.error.to_string().contains("square brackets nest more than 8 deep"), "{e:?}");
        let deep = format!("SELECT {}1{} FROM S3Object", "[".repeat(9), "]".repeat(9));
        assert!(translate(&deep, None).is_err());
        // Brackets in quotes are text; closed ones do not add up.
        let quoted = format!("SELECT '{}' FROM S3Object", "[".repeat(20));
        assert!(translate(&quoted, None).is_ok());
        let paths = format!("SELECT {} FROM S3Object[*] s", vec!["s.a[0][1][2]"; 20].join(", "));
        assert!(translate(&paths, None).is_ok(), "{:?}", translate(&paths, None));
    }

    #[test]
    fn the_dialect_becomes_datafusion_sql() {
        let h = cols(&["Name", "age", "city"]);
        let t = |e: &str| translate(e, Some((&h, true))).unwrap();
        assert_eq!(t("SELECT * FROM S3Object[*]"), "SELECT * FROM s3object");
        assert_eq!(
            t("select s.name, s._2 from s3object s where s.AGE > 3"),
            r#"SELECT "Name", "age" FROM s3object s WHERE TRY_CAST("age" AS DOUBLE) > 3"#
        );
        assert!(t("SELECT count(*) FROM S3Object [ * ] LIMIT 2").contains("LIMIT 2"));
        let (sql, path) = normalize_from("SELECT a.x FROM S3Object[*].rows[*].\"In\"[2] a").unwrap();
        assert_eq!(sql, "SELECT a.x FROM s3object a");
        assert_eq!(path, vec![Step::Key("rows".into()), Step::All, Step::Key("In".into()), Step::Index(2)]);
        let e = translate("SELECT s._9 FROM S3Object s", Some((&h, true))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::ColumnIndex);
        let e = translate("SELECT s.nope FROM S3Object s", Some((&h, true))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::UnknownColumn);
        let e = translate("SELEKT * FROM S3Object", Some((&h, true))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::Syntax);
        let e = translate("SELECT s.name FROM S3Object", Some((&h, false))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::Syntax, "alias s is unknown");
        let e = translate("SELECT name FROM S3Object", Some((&h, false))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::UnknownColumn);
        assert_eq!(
            t("SELECT s.name FROM S3Object s WHERE s.age > 40 AND s._3 = 'x' AND age BETWEEN -1 AND 9"),
            r#"SELECT "Name" FROM s3object s WHERE TRY_CAST("age" AS DOUBLE) > 40 AND "city" = 'x' AND TRY_CAST("age" AS DOUBLE) BETWEEN -1 AND 9"#
        );
        assert_eq!(
            t("SELECT sum(age), max(age) FROM S3Object"),
            r#"SELECT sum(TRY_CAST("age" AS DOUBLE)) AS _1, max("age") AS _2 FROM s3object"#
        );
        assert_eq!(
            t("SELECT count(*), CAST(s.age AS INT), CAST(age AS FLOAT), s.city FROM S3Object s"),
            r#"SELECT count(*) AS _1, CAST("age" AS BIGINT) AS _2, CAST("age" AS DOUBLE) AS _3, "city" FROM s3object s"#
        );
    }
}
