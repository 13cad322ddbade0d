//! The caller's side: the partials of every block of every file merged into results.

use std::collections::{BTreeMap, HashMap};

use locus_common::Result;
use serde::Serialize;

use crate::num::{Neumaier, determinant, entropy_bits};
use crate::pb;
use crate::scan::{ColAcc, Records};
use crate::spec::Resolved;

/// The blocks (by index) whose `in_quotes` assumption the quote counts of the blocks
/// before them contradict: they must be computed again with the flag flipped.
pub fn misaligned(partials: &[pb::ComputePartial], assumed_in_quotes: &[bool], quoting: bool) -> Vec<usize> {
    if !quoting {
        return Vec::new();
    }
    let mut odd = false;
    let mut v = Vec::new();
    for (i, p) in partials.iter().enumerate() {
        if i > 0 && assumed_in_quotes.get(i).copied().unwrap_or(false) != odd {
            v.push(i);
        }
        odd ^= p.quotes % 2 == 1;
    }
    v
}

/// Whether block `i` starts inside a quoted field, by the quote counts before it.
pub fn starts_in_quotes(partials: &[pb::ComputePartial], i: usize) -> bool {
    partials[..i].iter().map(|p| p.quotes).sum::<u64>() % 2 == 1
}

/// Scan again, through `rescan(block, in_quotes)`, every block of one file that its
/// partials prove started inside a quoted field (each is scanned first as if not). Its
/// own quote count does not change, so one pass settles it. Returns how many were.
pub async fn realign<F, Fut>(partials: &mut [pb::ComputePartial], quoting: bool, mut rescan: F) -> Result<u64>
where
    F: FnMut(usize, bool) -> Fut,
    Fut: std::future::Future<Output = Result<pb::ComputePartial>>,
{
    let assumed = vec![false; partials.len()];
    let mut n = 0;
    for b in misaligned(partials, &assumed, quoting) {
        let in_quotes = starts_in_quotes(partials, b);
        partials[b] = rescan(b, in_quotes).await?;
        n += 1;
    }
    Ok(n)
}

/// Every block of every file through `scan(file, block, in_quotes)`, `parallelism` at a
/// time, each first as if it did not start inside quotes; then, file by file in order,
/// the blocks [`realign`] finds misaligned scanned again (with `in_quotes` true), and the
/// partials added to `merger`. `files`: each file's name (for errors) and its blocks'
/// start offsets. Returns how many blocks were scanned again. The one driver of the
/// client's `compute` and of the Rust host pull (`locus bench compute-host`).
pub async fn scan_and_merge<F, Fut>(
    merger: &mut Merger,
    files: &[(&str, Vec<u64>)],
    quoting: bool,
    parallelism: usize,
    scan: F,
) -> Result<u64>
where
    F: Fn(usize, usize, bool) -> Fut,
    Fut: std::future::Future<Output = Result<pb::ComputePartial>>,
{
    use futures::StreamExt;
    let mut parts: Vec<Vec<Option<pb::ComputePartial>>> = files.iter().map(|(_, s)| vec![None; s.len()]).collect();
    let tasks = files.iter().enumerate().flat_map(|(f, (_, s))| (0..s.len()).map(move |b| (f, b)));
    let scan = &scan;
    let mut results = futures::stream::iter(
        tasks.map(|(f, b)| async move { Ok::<_, locus_common::Error>(((f, b), scan(f, b, false).await?)) }),
    )
    .buffer_unordered(parallelism.max(1));
    while let Some(r) = results.next().await {
        let ((f, b), p) = r?;
        parts[f][b] = Some(p);
    }
    drop(results);
    let mut rerun = 0;
    for (f, (name, starts)) in files.iter().enumerate() {
        let mut ps: Vec<pb::ComputePartial> = parts[f].iter_mut().map(|p| p.take().unwrap_or_default()).collect();
        rerun += realign(&mut ps, quoting, |b, in_quotes| scan(f, b, in_quotes)).await?;
        merger.add_file(&ps, starts).map_err(|e| e.context(name))?;
    }
    Ok(rerun)
}

/// Merges partial results, file by file, and finishes them.
pub struct Merger {
    r: Resolved,
    names: Vec<String>,
    text_name: Option<String>,
    cols: Vec<ColAcc>,
    gram: Vec<Neumaier>,
    byte_counts: Vec<u64>,
    text_digits: [u64; 10],
    text_values: HashMap<String, u64>,
    rows: u64,
    lines: u64,
    bytes: u64,
    files: u64,
    blocks: u64,
}

impl Merger {
    /// `names` names the numeric columns, `text_name` the text column, for the output.
    pub fn new(r: &Resolved, names: Vec<String>, text_name: Option<String>) -> Merger {
        let k = r.columns.len();
        Merger {
            cols: vec![ColAcc::default(); k],
            gram: vec![Neumaier::default(); if r.gram { k * (k + 1) / 2 } else { 0 }],
            byte_counts: vec![0; 256],
            text_digits: [0; 10],
            text_values: HashMap::new(),
            rows: 0,
            lines: 0,
            bytes: 0,
            files: 0,
            blocks: 0,
            r: r.clone(),
            names,
            text_name,
        }
    }

    /// Add one file: the partials of its blocks in order, with the file offset each
    /// block starts at. The records across block edges are computed here.
    pub fn add_file(&mut self, partials: &[pb::ComputePartial], starts: &[u64]) -> Result<()> {
        self.files += 1;
        let Some(first) = partials.first() else { return Ok(()) };
        if let Some(p) = partials.iter().find(|p| !p.error.is_empty()) {
            return Err(locus_common::Error::invalid(p.error.clone()));
        }
        let header_pending = self.r.header && !first.header_seen;
        let mut edge = Records::new(&self.r, 0, header_pending);
        let mut carry: Vec<u8> = Vec::new();
        let mut carry_at = 0u64;
        for (i, p) in partials.iter().enumerate() {
            self.blocks += 1;
            self.bytes += p.bytes_scanned;
            self.rows += p.rows;
            for (a, c) in self.byte_counts.iter_mut().zip(&p.byte_counts) {
                *a += c;
            }
            for (acc, c) in self.cols.iter_mut().zip(&p.columns) {
                acc.merge_pb(c);
            }
            for (acc, g) in self.gram.iter_mut().zip(&p.gram) {
                acc.merge(&Neumaier::from_pb(Some(g)));
            }
            for (a, c) in self.text_digits.iter_mut().zip(&p.text_digits) {
                *a += c;
            }
            for (k, v) in &p.text_values {
                *self.text_values.entry(k.clone()).or_insert(0) += v;
            }
            if self.r.parses_records() {
                if carry.is_empty() {
                    carry_at = starts.get(i).copied().unwrap_or(0);
                }
                carry.extend_from_slice(&p.head);
                if !p.no_terminator {
                    // The head ended the record that crossed into this block.
                    edge.rec_start = carry_at;
                    edge.feed(&carry, carry_at, true)?;
                    edge.next_segment();
                    carry.clear();
                    carry.extend_from_slice(&p.tail);
                    let end = starts.get(i).copied().unwrap_or(0) + p.bytes_scanned;
                    carry_at = end - p.tail.len() as u64;
                }
            }
        }
        if !carry.is_empty() {
            edge.rec_start = carry_at;
            edge.feed(&carry, carry_at, true)?;
        }
        edge.flush();
        self.rows += edge.rows;
        for (acc, c) in self.cols.iter_mut().zip(&edge.cols) {
            acc.merge_pb(&c.to_pb());
        }
        for (acc, g) in self.gram.iter_mut().zip(&edge.gram) {
            acc.merge(g);
        }
        for (a, c) in self.text_digits.iter_mut().zip(&edge.text_digits) {
            *a += c;
        }
        for (k, v) in &edge.text_values {
            *self.text_values.entry(String::from_utf8_lossy(k).into_owned()).or_insert(0) += v;
        }
        let newlines: u64 = partials.iter().filter_map(|p| p.byte_counts.get(b'\n' as usize)).sum();
        let size: u64 = partials.iter().map(|p| p.bytes_scanned).sum();
        let unterminated = size > 0 && !partials.last().is_some_and(|p| p.ends_with_newline);
        self.lines += newlines + unterminated as u64;
        Ok(())
    }

    /// The results, as `locus fs compute --json` prints them.
    pub fn finish(&self) -> Results {
        let r = &self.r;
        let named = |f: &dyn Fn(&ColAcc) -> serde_json::Value| -> BTreeMap<String, serde_json::Value> {
            self.names.iter().cloned().zip(self.cols.iter().map(f)).collect()
        };
        let num = |x: f64| if x.is_finite() { serde_json::json!(x) } else { serde_json::Value::Null };
        let mut out = Results {
            files: self.files,
            blocks: self.blocks,
            bytes_scanned: self.bytes,
            rows: self.rows,
            ..Default::default()
        };
        if r.count {
            out.count = Some(serde_json::json!({ "lines": self.lines, "rows": self.rows }));
        }
        if r.stats {
            out.stats = Some(named(&|c| {
                let n = c.mom.n;
                serde_json::json!({
                    "count": n,
                    "sum": c.sum.value(),
                    "mean": if n > 0 { num(c.sum.value() / n as f64) } else { serde_json::Value::Null },
                    "min": if n > 0 { num(c.min) } else { serde_json::Value::Null },
                    "max": if n > 0 { num(c.max) } else { serde_json::Value::Null },
                })
            }));
        }
        if r.modsum {
            out.modsum = Some(serde_json::json!({
                "k": r.k, "m": r.m,
                "sums": named(&|c| serde_json::json!(c.modsum.value())),
            }));
        }
        if r.stddev {
            out.stddev = Some(named(&|c| {
                serde_json::json!({
                    "population": c.mom.var_pop().map(f64::sqrt),
                    "sample": c.mom.var_sample().map(f64::sqrt),
                })
            }));
        }
        if r.normalize {
            out.normalize = Some(named(&|c| {
                let n = c.mom.n as f64;
                let sum = c.sum.value();
                let std = c.mom.var_pop().map(f64::sqrt).unwrap_or(0.0);
                let mean = if n > 0.0 { sum / n } else { 0.0 };
                let range = c.max - c.min;
                serde_json::json!({
                    // sum((x - mean) / std) and sum((x - min) / (max - min)); a constant
                    // column has neither (null).
                    "zscore_sum": (std > 0.0).then(|| (sum - n * mean) / std),
                    "minmax_sum": (range > 0.0 && range.is_finite()).then(|| (sum - n * c.min) / range),
                    // What they are made of (`--out` writes the normalized values).
                    "mean": mean,
                    "std_pop": std,
                    "min": (n > 0.0).then_some(c.min),
                    "max": (n > 0.0).then_some(c.max),
                })
            }));
        }
        if r.gram {
            let k = self.cols.len();
            let mut m = vec![0.0; k * k];
            let mut g = 0;
            for i in 0..k {
                for j in i..k {
                    let v = self.gram[g].value();
                    m[i * k + j] = v;
                    m[j * k + i] = v;
                    g += 1;
                }
            }
            let rows: Vec<Vec<f64>> = m.chunks(k.max(1)).map(|c| c.to_vec()).collect();
            out.gram = Some(serde_json::json!({
                "columns": self.names,
                "matrix": if k > 0 { rows } else { Vec::new() },
                "determinant": determinant(k, &m),
            }));
        }
        let digits = |c: &[u64]| -> BTreeMap<String, u64> { (0..10).map(|d| (d.to_string(), c[d])).collect() };
        if r.digits {
            out.digits = Some(match &self.text_name {
                Some(n) => serde_json::json!({ "column": n, "counts": digits(&self.text_digits) }),
                None => serde_json::json!({ "bytes": digits(&self.byte_counts[b'0' as usize..=b'9' as usize]) }),
            });
        }
        if r.entropy {
            out.entropy = Some(match &self.text_name {
                Some(n) => serde_json::json!({
                    "column": n,
                    "bits": entropy_bits(self.text_values.values()),
                    "distinct": self.text_values.len(),
                }),
                None => serde_json::json!({ "bits": entropy_bits(self.byte_counts.iter()) }),
            });
        }
        out
    }
}

/// What `locus fs compute` reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Results {
    pub files: u64,
    pub blocks: u64,
    pub bytes_scanned: u64,
    pub rows: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modsum: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stddev: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gram: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digits: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::BlockScanner;
    use crate::spec::resolve_columns;
    use pb::ComputeOp;

    /// A sensor log with quoted text fields that hold delimiters, quotes and line ends.
    fn sample(rows: usize, crlf: bool) -> (Vec<u8>, Vec<[f64; 3]>, Vec<String>) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut s = format!("ts,sensor,c0,c1,c2,note{nl}");
        let (mut vals, mut notes) = (Vec::new(), Vec::new());
        for i in 0..rows {
            let v = [i as f64 * 1.5 - 7.0, ((i * 37) % 11) as f64 / 4.0, 1e6 + (i % 5) as f64];
            let note = match i % 4 {
                0 => "plain".to_string(),
                1 => "two\nlines".to_string(),
                2 => "say \"hi\", then\r\nbye".to_string(),
                _ => String::new(),
            };
            let quoted = format!("\"{}\"", note.replace('"', "\"\""));
            s += &format!("{},s{},{},{},{},{}{nl}", 1000 + i, i % 3, v[0], v[1], v[2], quoted);
            vals.push(v);
            notes.push(note);
        }
        (s.into_bytes(), vals, notes)
    }

    fn spec(ops: &[ComputeOp], header: &[String], text: Option<&str>) -> Resolved {
        let cols = resolve_columns("c0..c2", Some(header)).unwrap();
        let text_column = text.map(|t| resolve_columns(t, Some(header)).unwrap()[0] as u32);
        Resolved::new(&pb::ComputeSpec {
            ops: ops.iter().map(|&o| o as i32).collect(),
            columns: cols.iter().map(|&c| c as u32).collect(),
            k: 3.0,
            m: 7.0,
            has_text_column: text_column.is_some(),
            text_column: text_column.unwrap_or(0),
            csv: Some(pb::CsvFormat { header: true, ..Default::default() }),
        })
        .unwrap()
    }

    /// What a caller does: every block scanned (in pieces of `piece` bytes), the blocks
    /// that started inside quotes scanned again, then merged.
    fn run(r: &Resolved, data: &[u8], block: usize, piece: usize) -> Results {
        let starts: Vec<u64> = (0..data.len()).step_by(block).map(|s| s as u64).collect();
        let scan = |i: usize, in_quotes: bool| {
            let s = starts[i] as usize;
            let b = &data[s..(s + block).min(data.len())];
            let mut sc = BlockScanner::new(r, s as u64, in_quotes, i == 0);
            for p in b.chunks(piece) {
                sc.feed(p);
            }
            sc.finish()
        };
        let mut assumed = vec![false; starts.len()];
        let mut parts: Vec<_> = (0..starts.len()).map(|i| scan(i, false)).collect();
        for i in misaligned(&parts, &assumed, r.quoting) {
            assumed[i] = starts_in_quotes(&parts, i);
            parts[i] = scan(i, assumed[i]);
        }
        assert!(misaligned(&parts, &assumed, r.quoting).is_empty());
        let mut m = Merger::new(r, vec!["c0".into(), "c1".into(), "c2".into()], Some("note".into()));
        m.add_file(&parts, &starts).unwrap();
        m.finish()
    }

    fn close(a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
    }

    #[test]
    fn every_record_counts_once_wherever_the_blocks_end() {
        for crlf in [false, true] {
            let (data, vals, notes) = sample(9, crlf);
            let header: Vec<String> =
                ["ts", "sensor", "c0", "c1", "c2", "note"].iter().map(|s| s.to_string()).collect();
            let r =
                spec(&[ComputeOp::Count, ComputeOp::Stats, ComputeOp::Gram, ComputeOp::Entropy], &header, Some("note"));
            let want_sum: Vec<f64> = (0..3).map(|c| vals.iter().map(|v| v[c]).sum()).collect();
            let want_g01: f64 = vals.iter().map(|v| v[0] * v[1]).sum();
            let lines = data.iter().filter(|&&b| b == b'\n').count() as u64;
            let distinct = notes.iter().collect::<std::collections::HashSet<_>>().len();
            for block in 1..=data.len() {
                for piece in [1, 7, block] {
                    let res = run(&r, &data, block, piece);
                    let ctx = format!("crlf {crlf} block {block} piece {piece}");
                    assert_eq!(res.rows, vals.len() as u64, "{ctx}");
                    assert_eq!(res.count.as_ref().unwrap()["lines"], lines, "{ctx}");
                    let stats = res.stats.as_ref().unwrap();
                    for (c, name) in ["c0", "c1", "c2"].iter().enumerate() {
                        let got = stats[*name]["sum"].as_f64().unwrap();
                        assert!(close(got, want_sum[c]), "{ctx}: {name} {got} != {}", want_sum[c]);
                    }
                    let g = &res.gram.as_ref().unwrap()["matrix"];
                    assert!(close(g[0][1].as_f64().unwrap(), want_g01), "{ctx}");
                    assert_eq!(res.entropy.as_ref().unwrap()["distinct"], distinct, "{ctx}");
                }
            }
        }
    }

    #[test]
    fn a_bad_number_names_its_record() {
        let data = b"a,b\n1,2\n3,x";
        let r = Resolved::new(&pb::ComputeSpec {
            ops: vec![ComputeOp::Stats as i32],
            columns: vec![1],
            csv: Some(pb::CsvFormat { header: true, ..Default::default() }),
            ..Default::default()
        })
        .unwrap();
        let mut sc = BlockScanner::new(&r, 0, false, true);
        sc.feed(data);
        let p = sc.finish();
        // The last record has no terminator: the block leaves it to the caller.
        assert_eq!((p.rows, &p.tail[..]), (1, &b"3,x"[..]), "{p:?}");
        let mut m = Merger::new(&r, vec!["b".into()], None);
        let e = m.add_file(&[p], &[0]).unwrap_err();
        assert!(e.to_string().contains("record at byte 8 is not a number: \"x\""), "{e}");
        let mut sc = BlockScanner::new(&r, 0, false, true);
        sc.feed(b"a,b\n1,2\n3,x\n4,5\n");
        let e = sc.finish().error;
        assert!(e.contains("column _2 of the record at byte 8"), "{e}");
        let mut sc = BlockScanner::new(&r, 0, false, true);
        sc.feed(b"a,b\n1,2\n3\n4,5\n");
        let p = sc.finish();
        assert!(p.error.contains("has 1 fields: there is no column _2"), "{}", p.error);
        let mut m = Merger::new(&r, vec!["b".into()], None);
        assert_eq!(m.add_file(&[p], &[0]).unwrap_err().kind(), locus_common::ErrorKind::InvalidArgument);
    }
}
