//! What to compute: operator names, the columns they apply to, and the CSV format.

use locus_common::{Error, Result};

use crate::pb::{self, ComputeOp};

/// Every operator, in the order results are printed.
pub const ALL_OPS: [ComputeOp; 8] = [
    ComputeOp::Count,
    ComputeOp::Stats,
    ComputeOp::Modsum,
    ComputeOp::Stddev,
    ComputeOp::Normalize,
    ComputeOp::Gram,
    ComputeOp::Digits,
    ComputeOp::Entropy,
];

/// The name of an operator on the command line and in JSON output.
pub fn op_name(op: ComputeOp) -> &'static str {
    match op {
        ComputeOp::Unspecified => "unspecified",
        ComputeOp::Count => "count",
        ComputeOp::Stats => "stats",
        ComputeOp::Modsum => "modsum",
        ComputeOp::Stddev => "stddev",
        ComputeOp::Normalize => "normalize",
        ComputeOp::Gram => "gram",
        ComputeOp::Digits => "digits",
        ComputeOp::Entropy => "entropy",
    }
}

/// Operators from a comma-separated list of names (`all` for every one).
pub fn parse_ops(s: &str) -> Result<Vec<ComputeOp>> {
    let mut ops = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.eq_ignore_ascii_case("all") {
            ops.extend(ALL_OPS);
            continue;
        }
        let op = ALL_OPS.iter().copied().find(|o| op_name(*o).eq_ignore_ascii_case(name)).ok_or_else(|| {
            let known: Vec<_> = ALL_OPS.iter().map(|o| op_name(*o)).collect();
            Error::invalid(format!("unknown operator '{name}' (known: {}, all)", known.join(", ")))
        })?;
        ops.push(op);
    }
    if ops.is_empty() {
        return Err(Error::invalid("no operator given"));
    }
    ops.sort_by_key(|o| ALL_OPS.iter().position(|a| a == o));
    ops.dedup();
    Ok(ops)
}

/// Whether any of `ops` works on numeric columns.
pub fn needs_numeric(ops: &[ComputeOp]) -> bool {
    ops.iter().any(|o| {
        matches!(o, ComputeOp::Stats | ComputeOp::Modsum | ComputeOp::Stddev | ComputeOp::Normalize | ComputeOp::Gram)
    })
}

/// Field indices (0-based) for a comma-separated column list: header names, ranges of
/// names that end in numbers (`c0..c7`), or 1-based positions (`_3`, as S3 Select).
pub fn resolve_columns(list: &str, header: Option<&[String]>) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if let Some((a, b)) = item.split_once("..") {
            let (pa, na) = split_number(a).ok_or_else(|| bad_range(item))?;
            let (pb, nb) = split_number(b.trim()).ok_or_else(|| bad_range(item))?;
            if pa != pb || na > nb {
                return Err(bad_range(item));
            }
            for n in na..=nb {
                out.push(one_column(&format!("{pa}{n}"), header)?);
            }
        } else {
            out.push(one_column(item, header)?);
        }
    }
    Ok(out)
}

fn bad_range(item: &str) -> Error {
    Error::invalid(format!("bad column range '{item}': write NAME0..NAME7 (same prefix, ascending)"))
}

fn split_number(s: &str) -> Option<(&str, u64)> {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let (p, n) = s.split_at(s.len() - digits);
    Some((p, n.parse().ok()?))
}

fn one_column(name: &str, header: Option<&[String]>) -> Result<usize> {
    if let Some(h) = header
        && let Some(i) = h.iter().position(|c| c == name)
    {
        return Ok(i);
    }
    if let Some(n) = name.strip_prefix('_').and_then(|n| n.parse::<usize>().ok())
        && n >= 1
    {
        return Ok(n - 1);
    }
    Err(Error::invalid(match header {
        Some(h) => format!("no column '{name}' (the header has: {}; or use _1, _2, ...)", h.join(", ")),
        None => format!("no column '{name}': the file has no header, so name columns _1, _2, ..."),
    }))
}

/// How many leading bytes of a file [`header_fields`] looks at.
pub const HEADER_BYTES: u64 = 1 << 16;

/// The header's fields: the first record of `buf`, the file's first bytes (`whole`: all
/// of it). `name` names the file in errors.
pub fn header_fields(buf: &[u8], whole: bool, csv: &pb::CsvFormat, name: &str) -> Result<Vec<String>> {
    let byte = |v: u32, d: u8| if v == 0 || v > 127 { d } else { v as u8 };
    let mut b = csv_core::ReaderBuilder::new();
    b.delimiter(byte(csv.delimiter, b',')).quote(byte(csv.quote, b'"')).quoting(!csv.no_quoting).terminator(match csv
        .terminator
    {
        0 => csv_core::Terminator::CRLF,
        t => csv_core::Terminator::Any(byte(t, b'\n')),
    });
    let mut rdr = b.build();
    let (mut out, mut ends) = (vec![0u8; 1 << 17], vec![0usize; 4096]);
    let (res, _, nout, nend) = rdr.read_record(buf, &mut out, &mut ends);
    let (nout, nend) = match res {
        csv_core::ReadRecordResult::Record => (nout, nend),
        csv_core::ReadRecordResult::InputEmpty if whole => {
            let (r2, _, o2, e2) = rdr.read_record(&[], &mut out[nout..], &mut ends[nend..]);
            if r2 != csv_core::ReadRecordResult::Record {
                return Err(Error::invalid(format!("{name} is empty: it has no header")));
            }
            (nout + o2, nend + e2)
        }
        _ => return Err(Error::invalid(format!("the header of {name} is longer than 64 KiB"))),
    };
    let mut names = Vec::with_capacity(nend);
    let mut s = 0;
    for &e in &ends[..nend] {
        names.push(String::from_utf8_lossy(&out[s..e.min(nout)]).trim().to_string());
        s = e;
    }
    Ok(names)
}

/// A compute as a caller asks for it: operators, column lists as the user wrote them
/// (see [`resolve_columns`]), the factors of modsum and the CSV format.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub ops: Vec<ComputeOp>,
    pub columns: String,
    pub text_column: Option<String>,
    pub k: f64,
    pub m: f64,
    pub csv: pb::CsvFormat,
}

/// A [`Request`] resolved against the files' header: the spec each block gets, the same
/// made ready to run, and the names the results use for the columns.
#[derive(Clone, Debug)]
pub struct Plan {
    pub spec: pb::ComputeSpec,
    pub resolved: Resolved,
    pub names: Vec<String>,
    pub text_name: Option<String>,
}

impl Request {
    /// The plan, given the header's fields (`None`: no header).
    pub fn plan(&self, header: Option<&[String]>) -> Result<Plan> {
        let columns = if self.columns.trim().is_empty() { Vec::new() } else { resolve_columns(&self.columns, header)? };
        let text = match &self.text_column {
            Some(c) => {
                Some(*resolve_columns(c, header)?.first().ok_or_else(|| Error::invalid("an empty --text-column"))?)
            }
            None => None,
        };
        let spec = pb::ComputeSpec {
            ops: self.ops.iter().map(|&o| o as i32).collect(),
            columns: columns.iter().map(|&c| c as u32).collect(),
            k: self.k,
            m: self.m,
            has_text_column: text.is_some(),
            text_column: text.unwrap_or(0) as u32,
            csv: Some(self.csv),
        };
        let resolved = Resolved::new(&spec)?;
        let name = |c: usize| header.and_then(|h| h.get(c).cloned()).unwrap_or_else(|| format!("_{}", c + 1));
        Ok(Plan { names: columns.iter().map(|&c| name(c)).collect(), text_name: text.map(name), spec, resolved })
    }
}

impl Plan {
    /// A merger for this plan's results.
    pub fn merger(&self) -> crate::Merger {
        crate::Merger::new(&self.resolved, self.names.clone(), self.text_name.clone())
    }
}

/// A [`pb::ComputeSpec`] made ready to run: defaults filled in.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub count: bool,
    pub stats: bool,
    pub modsum: bool,
    pub stddev: bool,
    pub normalize: bool,
    pub gram: bool,
    pub digits: bool,
    pub entropy: bool,
    pub columns: Vec<usize>,
    pub k: f64,
    pub m: f64,
    pub text_column: Option<usize>,
    pub delimiter: u8,
    pub quote: u8,
    pub quoting: bool,
    pub header: bool,
}

impl Resolved {
    pub fn new(spec: &pb::ComputeSpec) -> Result<Resolved> {
        let ops: Vec<ComputeOp> = spec.ops().collect();
        let has = |o: ComputeOp| ops.contains(&o);
        let csv = spec.csv.unwrap_or_default();
        let byte = |v: u32, d: u8, what: &str| -> Result<u8> {
            match v {
                0 => Ok(d),
                1..=127 if v != u32::from(b'\n') && v != u32::from(b'\r') => Ok(v as u8),
                _ => Err(Error::invalid(format!("the {what} must be one ASCII character other than a line end"))),
            }
        };
        let r = Resolved {
            count: has(ComputeOp::Count),
            stats: has(ComputeOp::Stats),
            modsum: has(ComputeOp::Modsum),
            stddev: has(ComputeOp::Stddev),
            normalize: has(ComputeOp::Normalize),
            gram: has(ComputeOp::Gram),
            digits: has(ComputeOp::Digits),
            entropy: has(ComputeOp::Entropy),
            columns: spec.columns.iter().map(|&c| c as usize).collect(),
            k: spec.k,
            m: spec.m,
            text_column: spec.has_text_column.then_some(spec.text_column as usize),
            delimiter: byte(csv.delimiter, b',', "delimiter")?,
            quote: byte(csv.quote, b'"', "quote character")?,
            quoting: !csv.no_quoting,
            header: csv.header,
        };
        if ops.is_empty() {
            return Err(Error::invalid("no operator given"));
        }
        if needs_numeric(&ops) && r.columns.is_empty() {
            return Err(Error::invalid("these operators need numeric columns (--columns)"));
        }
        if r.modsum && (r.m == 0.0 || !r.m.is_finite() || !r.k.is_finite()) {
            return Err(Error::invalid("modsum needs a finite factor k and a non-zero modulus m"));
        }
        if r.delimiter == r.quote && r.quoting {
            return Err(Error::invalid("the delimiter and the quote character must differ"));
        }
        Ok(r)
    }

    /// Whether any numeric column is read at all.
    pub fn numeric(&self) -> bool {
        (self.stats || self.modsum || self.stddev || self.normalize || self.gram) && !self.columns.is_empty()
    }

    /// Whether records need parsing at all (else only the raw bytes are counted).
    pub fn parses_records(&self) -> bool {
        self.count || self.numeric() || self.text_column.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_by_name() {
        assert_eq!(parse_ops("gram, stats,stats").unwrap(), vec![ComputeOp::Stats, ComputeOp::Gram]);
        assert_eq!(parse_ops("all").unwrap().len(), 8);
        assert!(parse_ops("median").unwrap_err().to_string().contains("unknown operator 'median'"));
        assert!(parse_ops("").is_err());
    }

    #[test]
    fn columns_by_name_range_and_position() {
        let h: Vec<String> = ["ts", "sensor", "c0", "c1", "c2", "c3"].iter().map(|s| s.to_string()).collect();
        assert_eq!(resolve_columns("c0,c3", Some(&h)).unwrap(), vec![2, 5]);
        assert_eq!(resolve_columns("c1..c3", Some(&h)).unwrap(), vec![3, 4, 5]);
        assert_eq!(resolve_columns("_1,_3", None).unwrap(), vec![0, 2]);
        assert!(resolve_columns("c9", Some(&h)).unwrap_err().to_string().contains("no column 'c9'"));
        assert!(resolve_columns("c3..c1", Some(&h)).is_err());
        assert!(resolve_columns("c0", None).unwrap_err().to_string().contains("no header"));
        assert!(resolve_columns("_0", None).is_err());
    }
}
