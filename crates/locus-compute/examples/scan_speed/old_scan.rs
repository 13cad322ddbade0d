//! One block's bytes to its partial result.
//!
//! A block of a text file rarely starts or ends at a record boundary. Its records are
//! those that *start* in it, as in Hadoop's line-aligned splits; but instead of reading
//! past its end into the next block (a read from another worker, or a fill of a block
//! that is not cached), the scanner returns the bytes at its edges raw: `head`, up to and
//! including the first record terminator, and `tail`, after the last one. The caller
//! joins the tail of each block with the head of the next into the one record they
//! share and computes it with the same code ([`Records`]). Each record is counted once,
//! wherever the block edges fall; a few hundred bytes per 64 MiB block cross the network.
//!
//! A terminator inside a quoted field ends no record. Whether a block starts inside
//! quotes depends on every byte before it, so the scanner is told (`in_quotes`); the
//! caller first assumes not, and runs again the rare block whose start the quote counts
//! of the blocks before it (`quotes`) prove to be inside a quoted field.

use std::collections::HashMap;

use csv_core::{ReadRecordResult, ReaderBuilder, Terminator};
use locus_common::{Error, Result};

use locus_compute::num::{Moments, Neumaier};
use locus_compute::pb;
use locus_compute::spec::Resolved;

/// Rows per columnar batch.
const BATCH: usize = 4096;

/// Per numeric column, over the records seen.
#[derive(Clone, Debug)]
pub struct ColAcc {
    pub sum: Neumaier,
    pub min: f64,
    pub max: f64,
    pub mom: Moments,
    pub modsum: Neumaier,
}

impl Default for ColAcc {
    fn default() -> Self {
        ColAcc {
            sum: Neumaier::default(),
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            mom: Moments::default(),
            modsum: Neumaier::default(),
        }
    }
}

impl ColAcc {
    pub fn to_pb(&self) -> pb::ColumnPartial {
        pb::ColumnPartial {
            count: self.mom.n,
            sum: Some(self.sum.to_pb()),
            min: self.min,
            max: self.max,
            mean: self.mom.mean,
            m2: self.mom.m2,
            modsum: Some(self.modsum.to_pb()),
        }
    }

    pub fn merge_pb(&mut self, p: &pb::ColumnPartial) {
        self.sum.merge(&Neumaier::from_pb(p.sum.as_ref()));
        self.modsum.merge(&Neumaier::from_pb(p.modsum.as_ref()));
        if p.count > 0 {
            self.min = self.min.min(p.min);
            self.max = self.max.max(p.max);
        }
        self.mom.merge(&Moments { n: p.count, mean: p.mean, m2: p.m2 });
    }
}

/// Record-level accumulation: parses records (RFC 4180, `\n` or `\r\n` ends) and feeds
/// the chosen columns to the operators in columnar batches.
pub struct Records {
    r: Resolved,
    rdr: csv_core::Reader,
    out: Vec<u8>,
    out_len: usize,
    ends: Vec<usize>,
    ends_len: usize,
    /// File offset where the record being parsed began.
    pub rec_start: u64,
    /// The next record is the header (skipped).
    pub header_pending: bool,
    pub header_seen: bool,
    pub rows: u64,
    batch: Vec<Vec<f64>>,
    nb: usize,
    pub cols: Vec<ColAcc>,
    pub gram: Vec<Neumaier>,
    gram_batch: Vec<f64>,
    pub text_digits: [u64; 10],
    pub text_values: HashMap<Vec<u8>, u64>,
}

impl Records {
    pub fn new(r: &Resolved, start: u64, header_pending: bool) -> Records {
        let mut b = ReaderBuilder::new();
        b.delimiter(r.delimiter).quote(r.quote).quoting(r.quoting).terminator(Terminator::CRLF);
        let k = r.columns.len();
        let numeric = r.numeric();
        Records {
            rdr: b.build(),
            out: vec![0; 1 << 12],
            out_len: 0,
            ends: vec![0; 64],
            ends_len: 0,
            rec_start: start,
            header_pending,
            header_seen: false,
            rows: 0,
            batch: if numeric { vec![vec![0.0; BATCH]; k] } else { Vec::new() },
            nb: 0,
            cols: vec![ColAcc::default(); k],
            gram: vec![Neumaier::default(); if r.gram { k * (k + 1) / 2 } else { 0 }],
            gram_batch: vec![0.0; if r.gram { k * (k + 1) / 2 } else { 0 }],
            text_digits: [0; 10],
            text_values: HashMap::new(),
            r: r.clone(),
        }
    }

    /// Parse `data` (whose first byte is at file offset `base`); with `eof`, the data
    /// ends the file and a last record without a terminator counts too.
    pub fn feed(&mut self, data: &[u8], base: u64, eof: bool) -> Result<()> {
        let mut i = 0;
        loop {
            let input = &data[i..];
            let done = input.is_empty();
            if done && !eof {
                return Ok(());
            }
            let (res, nin, nout, nend) =
                self.rdr.read_record(input, &mut self.out[self.out_len..], &mut self.ends[self.ends_len..]);
            i += nin;
            self.out_len += nout;
            self.ends_len += nend;
            match res {
                ReadRecordResult::InputEmpty => {}
                ReadRecordResult::OutputFull => {
                    let n = self.out.len() * 2;
                    self.out.resize(n, 0);
                }
                ReadRecordResult::OutputEndsFull => {
                    let n = self.ends.len() * 2;
                    self.ends.resize(n, 0);
                }
                ReadRecordResult::Record => {
                    let at = self.rec_start;
                    self.record(at)?;
                    self.out_len = 0;
                    self.ends_len = 0;
                    self.rec_start = base + i as u64;
                }
                ReadRecordResult::End => return Ok(()),
            }
        }
    }

    /// Ready for more records after a `feed` with `eof`.
    pub fn next_segment(&mut self) {
        self.rdr.reset();
        self.out_len = 0;
        self.ends_len = 0;
    }

    fn record(&mut self, at: u64) -> Result<()> {
        // A blank line is no record.
        if self.ends_len == 1 && self.ends[0] == 0 {
            return Ok(());
        }
        if self.header_pending {
            self.header_pending = false;
            self.header_seen = true;
            return Ok(());
        }
        self.rows += 1;
        if !self.batch.is_empty() {
            for (k, &c) in self.r.columns.iter().enumerate() {
                let Some(f) = field(&self.out, &self.ends[..self.ends_len], c) else {
                    return Err(missing(c, self.ends_len, at));
                };
                let v = parse_number(f).ok_or_else(|| not_a_number(c, f, at))?;
                self.batch[k][self.nb] = v;
            }
            self.nb += 1;
            if self.nb == BATCH {
                self.flush();
            }
        }
        if let Some(c) = self.r.text_column {
            let Some(f) = field(&self.out, &self.ends[..self.ends_len], c) else {
                return Err(missing(c, self.ends_len, at));
            };
            let f = f.strip_suffix(b"\r").unwrap_or(f);
            if self.r.digits {
                for &b in f {
                    if b.is_ascii_digit() {
                        self.text_digits[(b - b'0') as usize] += 1;
                    }
                }
            }
            if self.r.entropy {
                match self.text_values.get_mut(f) {
                    Some(n) => *n += 1,
                    None => {
                        self.text_values.insert(f.to_vec(), 1);
                    }
                }
            }
        }
        Ok(())
    }

    /// Run the operators over the batch of rows gathered so far.
    pub fn flush(&mut self) {
        let n = self.nb;
        if n == 0 {
            return;
        }
        for (k, acc) in self.cols.iter_mut().enumerate() {
            let xs = &self.batch[k][..n];
            // Within a batch plain sums (a few thousand terms), across batches compensated.
            let mut s = 0.0;
            let (mut lo, mut hi) = (acc.min, acc.max);
            for &x in xs {
                s += x;
                lo = lo.min(x);
                hi = hi.max(x);
            }
            acc.sum.add(s);
            acc.min = lo;
            acc.max = hi;
            acc.mom.merge(&Moments::of(xs));
            if self.r.modsum {
                let (kf, m) = (self.r.k, self.r.m);
                let mut s = 0.0;
                for &x in xs {
                    s += py_mod(x * kf, m);
                }
                acc.modsum.add(s);
            }
        }
        if self.r.gram {
            let k = self.cols.len();
            self.gram_batch.iter_mut().for_each(|g| *g = 0.0);
            for row in 0..n {
                let mut g = 0;
                for i in 0..k {
                    let xi = self.batch[i][row];
                    for j in i..k {
                        self.gram_batch[g] += xi * self.batch[j][row];
                        g += 1;
                    }
                }
            }
            for (acc, &s) in self.gram.iter_mut().zip(&self.gram_batch) {
                acc.add(s);
            }
        }
        self.nb = 0;
    }
}

/// Field `j` of the record parsed into `out`, whose fields end at `ends`.
fn field<'a>(out: &'a [u8], ends: &[usize], j: usize) -> Option<&'a [u8]> {
    let e = *ends.get(j)?;
    let s = if j == 0 { 0 } else { ends[j - 1] };
    Some(&out[s..e])
}

fn missing(c: usize, fields: usize, at: u64) -> Error {
    Error::invalid(format!("the record at byte {at} has {fields} fields: there is no column _{}", c + 1))
}

fn not_a_number(c: usize, f: &[u8], at: u64) -> Error {
    let text: String = String::from_utf8_lossy(f).chars().take(40).collect();
    Error::invalid(format!("column _{} of the record at byte {at} is not a number: {text:?}", c + 1))
}

/// A field as a number, as Python's `float()` reads it (surrounding blanks allowed).
pub fn parse_number(f: &[u8]) -> Option<f64> {
    let t = f.trim_ascii();
    if t.is_empty() {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse::<f64>().ok()
}

enum Phase {
    /// Looking for the block's first record terminator.
    Head,
    /// Parsing the records that start in the block.
    Body,
}

/// Computes one block's [`pb::ComputePartial`] from its bytes, fed in order.
pub struct BlockScanner {
    r: Resolved,
    phase: Phase,
    in_quotes: bool,
    head: Vec<u8>,
    /// Raw bytes of the record in progress (the tail, at the end).
    carry: Vec<u8>,
    pos: u64,
    start: u64,
    recs: Records,
    byte_counts: Option<Box<[u64; 256]>>,
    quotes: u64,
    last: Option<u8>,
    /// The first bad record: the records after it are not computed (the caller reports
    /// it, unless the block turns out to have started inside quotes and is run again).
    error: Option<String>,
}

impl BlockScanner {
    /// A block that starts at file offset `start`; `in_quotes` when that is inside a quoted
    /// field; `file_start` for the file's first block (it starts at a record).
    pub fn new(r: &Resolved, start: u64, in_quotes: bool, file_start: bool) -> BlockScanner {
        let bytes = r.digits || (r.entropy && r.text_column.is_none()) || r.count;
        BlockScanner {
            phase: if file_start { Phase::Body } else { Phase::Head },
            in_quotes,
            head: Vec::new(),
            carry: Vec::new(),
            pos: start,
            start,
            recs: Records::new(r, start, file_start && r.header),
            byte_counts: bytes.then(|| Box::new([0u64; 256])),
            quotes: 0,
            last: None,
            error: None,
            r: r.clone(),
        }
    }

    /// The next bytes of the block. A bad record does not fail this (see `error`).
    pub fn feed(&mut self, chunk: &[u8]) {
        if let Err(e) = self.try_feed(chunk) {
            self.error = Some(e.message().to_string());
        }
    }

    fn try_feed(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        if let Some(c) = &mut self.byte_counts {
            count_bytes(c, chunk);
        }
        if self.r.quoting {
            self.quotes += chunk.iter().filter(|&&b| b == self.r.quote).count() as u64;
        }
        self.last = chunk.last().copied();
        let base = self.pos;
        self.pos += chunk.len() as u64;
        if !self.r.parses_records() || self.error.is_some() {
            // Only the raw bytes count (or the records stopped at a bad one): no edges.
            return Ok(());
        }
        let mut rest = chunk;
        let mut rest_base = base;
        if let Phase::Head = self.phase {
            match self.first_terminator(chunk) {
                Some(i) => {
                    self.head.extend_from_slice(&chunk[..=i]);
                    self.phase = Phase::Body;
                    rest = &chunk[i + 1..];
                    rest_base = base + i as u64 + 1;
                    self.recs.rec_start = rest_base;
                }
                None => {
                    self.head.extend_from_slice(chunk);
                    return Ok(());
                }
            }
        }
        self.recs.feed(rest, rest_base, false)?;
        let rs = self.recs.rec_start;
        if rs >= rest_base {
            self.carry.clear();
            self.carry.extend_from_slice(&rest[(rs - rest_base) as usize..]);
        } else {
            self.carry.extend_from_slice(rest);
        }
        Ok(())
    }

    /// Index of the first byte in `chunk` that ends a record, given the quote state.
    fn first_terminator(&mut self, chunk: &[u8]) -> Option<usize> {
        if !self.r.quoting {
            return memchr(b'\n', chunk);
        }
        let q = self.r.quote;
        for (i, &b) in chunk.iter().enumerate() {
            if b == q {
                self.in_quotes = !self.in_quotes;
            } else if b == b'\n' && !self.in_quotes {
                return Some(i);
            }
        }
        None
    }

    /// The block's partial result.
    pub fn finish(mut self) -> pb::ComputePartial {
        self.recs.flush();
        let no_terminator = matches!(self.phase, Phase::Head);
        let r = &self.recs;
        pb::ComputePartial {
            bytes_scanned: self.pos - self.start,
            rows: r.rows,
            head: std::mem::take(&mut self.head),
            tail: if no_terminator { Vec::new() } else { std::mem::take(&mut self.carry) },
            no_terminator,
            header_seen: r.header_seen,
            byte_counts: self.byte_counts.map(|c| c.to_vec()).unwrap_or_default(),
            ends_with_newline: self.last == Some(b'\n'),
            columns: r.cols.iter().map(ColAcc::to_pb).collect(),
            gram: r.gram.iter().map(|g| g.to_pb()).collect(),
            text_digits: if self.r.text_column.is_some() && self.r.digits {
                r.text_digits.to_vec()
            } else {
                Vec::new()
            },
            text_values: r.text_values.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), *v)).fold(
                HashMap::new(),
                |mut m, (k, v)| {
                    *m.entry(k).or_insert(0) += v;
                    m
                },
            ),
            quotes: self.quotes,
            error: self.error.unwrap_or_default(),
        }
    }
}

/// A histogram of bytes, four tables at a time (no store waits on the one before).
fn count_bytes(c: &mut [u64; 256], data: &[u8]) {
    let mut t = [[0u32; 256]; 4];
    for piece in data.chunks(1 << 30) {
        let mut it = piece.chunks_exact(4);
        for q in &mut it {
            t[0][q[0] as usize] += 1;
            t[1][q[1] as usize] += 1;
            t[2][q[2] as usize] += 1;
            t[3][q[3] as usize] += 1;
        }
        for &b in it.remainder() {
            t[0][b as usize] += 1;
        }
        for (i, v) in c.iter_mut().enumerate() {
            *v += (t[0][i] + t[1][i] + t[2][i] + t[3][i]) as u64;
        }
        t = [[0u32; 256]; 4];
    }
}

fn memchr(b: u8, s: &[u8]) -> Option<usize> {
    s.iter().position(|&x| x == b)
}

/// `py_mod` as it was (with `%`, libm's `fmod`).
fn py_mod(x: f64, m: f64) -> f64 {
    let r = x % m;
    if r != 0.0 && ((r < 0.0) != (m < 0.0)) { r + m } else { r }
}
