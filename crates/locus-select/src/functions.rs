//! S3 Select's functions and timestamps in DataFusion's terms: `UTCNOW`, `DATE_ADD`,
//! `DATE_DIFF`, `TO_STRING` and `TO_TIMESTAMP` rewritten onto DataFusion's built-in
//! functions (never a UDF: the rewritten expressions also run in the workers' plan
//! fragments, which know only the built-ins), and timestamps in every ISO 8601 form of
//! Amazon Ion that S3 Select takes (`2007T` to `2007-02-23T12:14:33.079-08:00`), as
//! text or as backquoted literals.

use sqlparser::ast::{self, Expr};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

use crate::{SelectError, SelectErrorCode, SelectResult};

/// S3 Select's functions that DataFusion lacks or names otherwise, rewritten onto
/// DataFusion's: `UTCNOW()`, `DATE_ADD(part, n, t)`, `DATE_DIFF(part, t1, t2)`,
/// `TO_STRING(t, 'yyyy-MM-dd')`. (Runs before column names are resolved: the date part
/// is a bare word, not a column.)
pub(crate) fn s3_function(e: &mut Expr) -> SelectResult<()> {
    if let Expr::Identifier(i) = e
        && i.quote_style == Some('`')
    {
        // A backquoted timestamp literal: `2010-01-01T`.
        let sql = timestamp_literal(&i.value)?;
        return replace(e, "a timestamp literal", &sql);
    }
    let Expr::Function(f) = e else { return Ok(()) };
    let name = f.name.to_string().to_ascii_lowercase();
    if !matches!(name.as_str(), "utcnow" | "date_add" | "date_diff" | "to_string" | "to_timestamp") {
        return Ok(());
    }
    let args: Vec<String> = match &f.args {
        ast::FunctionArguments::List(l) => l.args.iter().map(|a| a.to_string()).collect(),
        _ => Vec::new(),
    };
    let sql = match (name.as_str(), args.as_slice()) {
        ("utcnow", []) => "now()".to_string(),
        ("to_timestamp", [t]) => match t.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
            Some(text) => timestamp_literal(&text.replace("''", "'"))?,
            None => timestamp_of_text(t),
        },
        ("date_add", [part, n, t]) => {
            let part = date_part(part)?;
            format!("({t} + CAST(CONCAT(CAST({n} AS VARCHAR), ' {part}') AS INTERVAL))")
        }
        ("date_diff", [part, a, b]) => match date_part(part)? {
            "year" => format!("CAST(date_part('year', {b}) - date_part('year', {a}) AS BIGINT)"),
            "month" => format!(
                "CAST((date_part('year', {b}) - date_part('year', {a})) * 12 + date_part('month', {b}) - date_part('month', {a}) AS BIGINT)"
            ),
            p => {
                let secs = match p {
                    "day" => 86400,
                    "hour" => 3600,
                    "minute" => 60,
                    _ => 1,
                };
                format!("CAST(trunc((date_part('epoch', {b}) - date_part('epoch', {a})) / {secs}) AS BIGINT)")
            }
        },
        ("to_string", [t, fmt]) => {
            let Some(fmt) = fmt.strip_prefix('\'').and_then(|f| f.strip_suffix('\'')) else {
                return Err(SelectError::new(SelectErrorCode::Unsupported, "TO_STRING takes a literal format"));
            };
            format!("to_char({t}, '{}')", java_to_chrono(&fmt.replace("''", "'")).replace('\'', "''"))
        }
        _ => {
            return Err(SelectError::new(
                SelectErrorCode::Syntax,
                format!("{} takes other arguments than {}", name.to_uppercase(), args.len()),
            ));
        }
    };
    replace(e, &name, &sql)
}

/// Put the expression `sql` in place of `e` (`what`: for the error).
fn replace(e: &mut Expr, what: &str, sql: &str) -> SelectResult<()> {
    *e = Parser::new(&GenericDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|x| SelectError::new(SelectErrorCode::Syntax, format!("{what}: {x}")))?;
    Ok(())
}

/// The forms of an Ion timestamp without a time (`2007T`, `2007-02T`, `2007-02-23T`,
/// `2007-02-23`) and with minutes only (`2007-02-23T12:14Z`), as RFC 3339 with seconds,
/// in the order they are tried: a DataFusion regular expression and its replacement.
const COMPLETIONS: [(&str, &str); 4] = [
    ("^([0-9]{4})T$", "${1}-01-01T00:00:00Z"),
    ("^([0-9]{4}-[0-9]{2})T$", "${1}-01T00:00:00Z"),
    ("^([0-9]{4}-[0-9]{2}-[0-9]{2})T?$", "${1}T00:00:00Z"),
    ("^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2})(Z|[+-][0-9]{2}:[0-9]{2})$", "${1}:00${2}"),
];

/// `TO_TIMESTAMP(t)` of text that is not a literal: completed to RFC 3339 and read by
/// DataFusion's `to_timestamp` (which fails on text that is not a timestamp, as S3
/// Select's cast does); the instant, in UTC.
fn timestamp_of_text(t: &str) -> String {
    let mut sql = format!("CAST({t} AS VARCHAR)");
    for (re, with) in COMPLETIONS {
        sql = format!("regexp_replace({sql}, '{re}', '{with}')");
    }
    format!("(to_timestamp({sql}) AT TIME ZONE '+00:00')")
}

/// A timestamp literal (`TO_TIMESTAMP('...')` or backquoted) as DataFusion SQL: checked
/// here, so a bad one fails before any byte is read; it keeps its UTC offset, so
/// `EXTRACT(HOUR FROM ...)` gives the hour as written.
fn timestamp_literal(text: &str) -> SelectResult<String> {
    let (rfc3339, offset) = ion_timestamp(text).ok_or_else(|| {
        SelectError::new(
            SelectErrorCode::Cast,
            format!("{text:?} is not a timestamp (forms: 2007T to 2007-02-23T12:14:33.079-08:00)"),
        )
    })?;
    Ok(format!("((to_timestamp('{rfc3339}') AT TIME ZONE '+00:00') AT TIME ZONE '{offset}')"))
}

/// An Ion timestamp's text as RFC 3339 (with seconds) and its UTC offset (`+07:08`);
/// `None` if it is not one or names no real date or time.
pub fn ion_timestamp(text: &str) -> Option<(String, String)> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let date_only = text.strip_suffix('T').unwrap_or(text);
    let full = match date_only.split('-').collect::<Vec<_>>().as_slice() {
        [y] if y.len() == 4 && digits(y) && text.ends_with('T') => format!("{y}-01-01T00:00:00Z"),
        [y, m] if y.len() == 4 && m.len() == 2 && digits(y) && digits(m) && text.ends_with('T') => {
            format!("{y}-{m}-01T00:00:00Z")
        }
        [y, m, d] if [y.len(), m.len(), d.len()] == [4, 2, 2] && [y, m, d].iter().all(|p| digits(p)) => {
            format!("{y}-{m}-{d}T00:00:00Z")
        }
        _ => {
            // With a time: hh:mm or hh:mm:ss[.fff], then Z or an offset.
            let (date, time) = text.split_once('T')?;
            let tz_at = time.find(['Z', 'z', '+', '-'])?;
            let (hms, tz) = time.split_at(tz_at);
            let hms = if hms.len() == 5 { format!("{hms}:00") } else { hms.to_string() };
            format!("{date}T{hms}{tz}")
        }
    };
    let t = chrono::DateTime::parse_from_rfc3339(&full).ok()?;
    Some((full, t.offset().to_string()))
}

/// A date part of DATE_ADD/DATE_DIFF (a bare word).
fn date_part(p: &str) -> SelectResult<&'static str> {
    Ok(match p.to_ascii_lowercase().as_str() {
        "year" => "year",
        "month" => "month",
        "day" => "day",
        "hour" => "hour",
        "minute" => "minute",
        "second" => "second",
        _ => return Err(SelectError::new(SelectErrorCode::Syntax, format!("unknown date part {p}"))),
    })
}

/// A TO_STRING pattern (letters as in Java's DateTimeFormatter, `'text'` quoted) as a
/// chrono format.
fn java_to_chrono(f: &str) -> String {
    let mut out = String::new();
    let cs: Vec<char> = f.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c == '\'' {
            let end = cs[i + 1..].iter().position(|x| *x == '\'').map_or(cs.len(), |p| i + 1 + p);
            cs[i + 1..end].iter().for_each(|x| out.push_str(&x.to_string().replace('%', "%%")));
            i = end + 1;
            continue;
        }
        let n = cs[i..].iter().take_while(|x| **x == c).count();
        let spec = match (c, n) {
            ('y', 2) => "%y",
            ('y', _) => "%Y",
            ('M', 1) => "%-m",
            ('M', 2) => "%m",
            ('M', 3) => "%b",
            ('M', _) => "%B",
            ('d', 1) => "%-d",
            ('d', _) => "%d",
            ('H', 1) => "%-H",
            ('H', _) => "%H",
            ('h', 1) => "%-I",
            ('h', _) => "%I",
            ('m', 1) => "%-M",
            ('m', _) => "%M",
            ('s', 1) => "%-S",
            ('s', _) => "%S",
            ('S', 1..=3) => "%3f",
            ('S', 4..=6) => "%6f",
            ('S', _) => "%9f",
            ('n', _) => "%f",
            ('a', _) => "%p",
            ('X' | 'x', 1 | 2) => "%z",
            ('X' | 'x', _) => "%:z",
            _ => {
                cs[i..i + n].iter().for_each(|x| out.push_str(&x.to_string().replace('%', "%%")));
                i += n;
                continue;
            }
        };
        out.push_str(spec);
        i += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ion_form_reads_as_rfc_3339_with_its_offset() {
        let t = |s: &str| ion_timestamp(s).map(|(a, b)| format!("{a} {b}"));
        assert_eq!(t("2007T").as_deref(), Some("2007-01-01T00:00:00Z +00:00"));
        assert_eq!(t("2007-02T").as_deref(), Some("2007-02-01T00:00:00Z +00:00"));
        assert_eq!(t("2007-02-23T").as_deref(), Some("2007-02-23T00:00:00Z +00:00"));
        assert_eq!(t("2007-02-23").as_deref(), Some("2007-02-23T00:00:00Z +00:00"));
        assert_eq!(t("2007-02-23T12:14Z").as_deref(), Some("2007-02-23T12:14:00Z +00:00"));
        assert_eq!(t("2017-01-02T03:04:05+07:08").as_deref(), Some("2017-01-02T03:04:05+07:08 +07:08"));
        assert_eq!(t("2007-02-23T12:14:33.079-08:00").as_deref(), Some("2007-02-23T12:14:33.079-08:00 -08:00"));
        for bad in
            ["2007", "2007-13T", "2007-02-30", "07-02-23T", "2007-02-23T25:00Z", "2007-02-23T12:14", "", "T", "x"]
        {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }
}
