//! Normalization written out (`locus fs compute normalize --out`): every record of a
//! delimited text file copied with its chosen columns replaced by `(x - a) / b`: the
//! z-score (`a` the mean, `b` the population standard deviation) or min-max (`a` the
//! minimum, `b` the range) of the column, from the merged statistics. A constant column
//! (`b` 0) becomes 0, as scikit-learn's scalers make it. Other fields, the header and the
//! quoting of fields that need it are kept.

use std::io::{Read, Write};

use locus_common::{Error, Result};
use locus_proto::pb;

/// Which normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `(x - mean) / std_pop`.
    ZScore,
    /// `(x - min) / (max - min)`.
    MinMax,
}

impl Method {
    pub fn parse(s: &str) -> Option<Method> {
        match s {
            "zscore" | "z-score" => Some(Method::ZScore),
            "minmax" | "min-max" => Some(Method::MinMax),
            _ => None,
        }
    }
}

/// One column to normalize: its 0-based field index and `(a, b)` of `(x - a) / b`.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub column: usize,
    pub a: f64,
    pub b: f64,
}

/// Copy `input` to `output` with `scales` applied; `name` names the file in errors.
/// Returns the data records written. A field of a chosen column that is not a number is
/// an InvalidArgument error naming the record; an empty field stays empty.
pub fn normalize_csv(
    input: impl Read,
    output: impl Write,
    csv_fmt: &pb::CsvFormat,
    scales: &[Scale],
    name: &str,
) -> Result<u64> {
    let delimiter = if csv_fmt.delimiter == 0 { b',' } else { csv_fmt.delimiter as u8 };
    let quote = if csv_fmt.quote == 0 { b'"' } else { csv_fmt.quote as u8 };
    let mut r = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .quote(quote)
        .quoting(!csv_fmt.no_quoting)
        .has_headers(false)
        .flexible(true)
        .from_reader(input);
    let mut w = csv::WriterBuilder::new()
        .delimiter(delimiter)
        .quote(quote)
        .quote_style(if csv_fmt.no_quoting { csv::QuoteStyle::Never } else { csv::QuoteStyle::Necessary })
        .flexible(true)
        .from_writer(output);
    let write_err = |e: csv::Error| match e.into_kind() {
        csv::ErrorKind::Io(e) => Error::io(format!("write the normalized {name}"), e),
        k => Error::internal(format!("write the normalized {name}: {k:?}")),
    };
    let mut rec = csv::ByteRecord::new();
    let mut out = csv::ByteRecord::new();
    let (mut n, mut line) = (0u64, 0u64);
    let mut first = true;
    let mut num = String::new();
    loop {
        let more = r
            .read_byte_record(&mut rec)
            .map_err(|e| Error::invalid(format!("{name}: malformed CSV near record {}: {e}", line + 1)))?;
        if !more {
            break;
        }
        line += 1;
        if first && csv_fmt.header {
            first = false;
            w.write_byte_record(&rec).map_err(write_err)?;
            continue;
        }
        first = false;
        out.clear();
        for (i, f) in rec.iter().enumerate() {
            match scales.iter().find(|s| s.column == i) {
                Some(s) if !f.is_empty() => {
                    let x: f64 = std::str::from_utf8(f).ok().and_then(|t| t.trim().parse().ok()).ok_or_else(|| {
                        Error::invalid(format!(
                            "{name}: record {line}, field {}: {:?} is not a number",
                            i + 1,
                            String::from_utf8_lossy(f)
                        ))
                    })?;
                    let v = if s.b == 0.0 || !s.b.is_finite() { 0.0 } else { (x - s.a) / s.b };
                    num.clear();
                    use std::fmt::Write as _;
                    let _ = write!(num, "{v}");
                    out.push_field(num.as_bytes());
                }
                _ => out.push_field(f),
            }
        }
        for s in scales {
            if s.column >= rec.len() {
                return Err(Error::invalid(format!(
                    "{name}: record {line} has {} fields, no column {}",
                    rec.len(),
                    s.column + 1
                )));
            }
        }
        w.write_byte_record(&out).map_err(write_err)?;
        n += 1;
    }
    w.flush().map_err(|e| Error::io(format!("write the normalized {name}"), e))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &str, header: bool, scales: &[Scale]) -> Result<String> {
        let mut out = Vec::new();
        let fmt = pb::CsvFormat { header, ..Default::default() };
        normalize_csv(input.as_bytes(), &mut out, &fmt, scales, "t.csv")?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn columns_are_scaled_and_the_rest_kept() {
        let got =
            run("id,x,name\n1,10,\"a, b\"\n2,20,c\n3,,d\n", true, &[Scale { column: 1, a: 10.0, b: 5.0 }]).unwrap();
        assert_eq!(got, "id,x,name\n1,0,\"a, b\"\n2,2,c\n3,,d\n");
    }

    #[test]
    fn a_constant_column_becomes_zero_and_bad_fields_are_named() {
        assert_eq!(run("5\n5\n", false, &[Scale { column: 0, a: 5.0, b: 0.0 }]).unwrap(), "0\n0\n");
        let e = run("h\n1\nx\n", true, &[Scale { column: 0, a: 0.0, b: 1.0 }]).unwrap_err();
        assert_eq!(e.kind(), locus_common::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("record 3") && e.to_string().contains("\"x\""), "{e}");
        let e = run("1,2\n3\n", false, &[Scale { column: 1, a: 0.0, b: 1.0 }]).unwrap_err();
        assert!(e.to_string().contains("no column 2"), "{e}");
    }
}
