//! One block's bytes to its partial result.
//!
//! One file of about 1000 lines (a sixth of it tests) because it is one loop: the record
//! splitter (a fast path for records without quotes, `csv_core` otherwise), the
//! per-record fields and the batch kernels share the scanner's state and run together
//! per piece; apart, each would expose that state to the others.
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

use crate::num::{Moments, Neumaier, py_mod};
use crate::pb;
use crate::spec::Resolved;

/// Rows per columnar batch.
const BATCH: usize = 4096;

/// Per numeric column, over the records seen.
#[derive(Clone, Debug)]
pub(crate) struct ColAcc {
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
    pub(crate) fn to_pb(&self) -> pb::ColumnPartial {
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

    pub(crate) fn merge_pb(&mut self, p: &pb::ColumnPartial) {
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
pub(crate) struct Records {
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
    pub text_values: HashMap<Vec<u8>, u64, FxBuild>,
    /// The text values of up to 7 bytes, as a number (bytes, length in the top byte),
    /// until [`Records::flush`] moves them to `text_values`.
    text_short: HashMap<u64, u64, FxBuild>,
    /// The reader is between records (none begun): the fast path may run.
    at_boundary: bool,
    /// Whether the fast path for records without quotes runs (off: every record goes
    /// through `csv_core`, the reference the tests compare against).
    fast: bool,
    /// Field ends of the record the fast path is at (relative to its start).
    fends: Vec<usize>,
}

impl Records {
    pub(crate) fn new(r: &Resolved, start: u64, header_pending: bool) -> Records {
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
            text_values: HashMap::default(),
            text_short: HashMap::default(),
            at_boundary: true,
            fast: true,
            fends: Vec::with_capacity(64),
            r: r.clone(),
        }
    }

    /// Every record through `csv_core` (the reference for the fast path's tests).
    #[cfg(test)]
    pub(crate) fn slow_only(&mut self) {
        self.fast = false;
    }

    /// Parse `data` (whose first byte is at file offset `base`); with `eof`, the data
    /// ends the file and a last record without a terminator counts too.
    pub(crate) fn feed(&mut self, data: &[u8], base: u64, eof: bool) -> Result<()> {
        let mut i = 0;
        loop {
            if self.at_boundary && self.fast {
                // Whole records without quotes, straight from `data`; the rest (a record
                // with a quote, or one `data` ends inside) through `csv_core`.
                i = self.fast_records(data, i, base)?;
                if i == data.len() {
                    // Between records: the reader's final transition would find no record.
                    return Ok(());
                }
            }
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
            self.at_boundary = false;
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
                    let (out, ends) = (std::mem::take(&mut self.out), std::mem::take(&mut self.ends));
                    let res = self.record(&out[..self.out_len], &ends[..self.ends_len], 0, at);
                    (self.out, self.ends) = (out, ends);
                    res?;
                    self.out_len = 0;
                    self.ends_len = 0;
                    self.rec_start = base + i as u64;
                    self.at_boundary = true;
                }
                ReadRecordResult::End => return Ok(()),
            }
        }
    }

    /// Ready for more records after a `feed` with `eof`.
    pub(crate) fn next_segment(&mut self) {
        self.rdr.reset();
        self.out_len = 0;
        self.ends_len = 0;
        self.at_boundary = true;
    }

    /// The records from `data[i..]` on that hold no quote and end in `data`, parsed
    /// without `csv_core` (between records, the reader's state is the same after them).
    /// Returns where they stop: `data.len()`, or the start of the record `csv_core` is to
    /// read (one with a quote, or one `data` ends inside).
    ///
    /// What `csv_core` does with such records: the record terminators (`\r`, `\n`) before
    /// a record are skipped; its fields are the bytes between delimiters, up to the first
    /// terminator, which is consumed; after a `\r`, a `\n` is a terminator skipped before
    /// the next record.
    fn fast_records(&mut self, data: &[u8], mut i: usize, base: u64) -> Result<usize> {
        let d = self.r.delimiter;
        // Without quoting, a quote byte is an ordinary one: look for the delimiter twice.
        let q = if self.r.quoting { self.r.quote } else { d };
        let mut sp = Specials::new(data, i, d, q);
        let mut fends = std::mem::take(&mut self.fends);
        let res = loop {
            while i < data.len() && (data[i] == b'\n' || data[i] == b'\r') {
                i += 1;
            }
            if i == data.len() {
                break Ok(i);
            }
            let s = i;
            fends.clear();
            let end = loop {
                let Some(p) = sp.next_from(i) else { break None };
                let b = data[p];
                i = p + 1;
                if b == d {
                    fends.push(p - s);
                } else if b == b'\n' || b == b'\r' {
                    fends.push(p - s);
                    break Some(p);
                } else {
                    break None; // a quote
                }
            };
            let Some(e) = end else { break Ok(s) };
            let at = self.rec_start;
            if let Err(e) = self.record(&data[s..e], &fends, 1, at) {
                break Err(e);
            }
            self.rec_start = base + i as u64;
        };
        self.fends = fends;
        res
    }

    /// One record: its bytes (fields unquoted) and where each field ends in them, `gap`
    /// bytes (a delimiter, or none) between a field's end and the next one's start.
    #[inline]
    fn record(&mut self, out: &[u8], ends: &[usize], gap: usize, at: u64) -> Result<()> {
        // A blank line is no record.
        if ends.len() == 1 && ends[0] == 0 {
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
                let Some(f) = field(out, ends, c, gap) else {
                    return Err(missing(c, ends.len(), at));
                };
                let v = match parse_decimal(f) {
                    Some(v) => v,
                    None => parse_number(f).ok_or_else(|| not_a_number(c, f, at))?,
                };
                self.batch[k][self.nb] = v;
            }
            self.nb += 1;
            if self.nb == BATCH {
                self.flush_batch();
            }
        }
        if let Some(c) = self.r.text_column {
            let Some(f) = field(out, ends, c, gap) else {
                return Err(missing(c, ends.len(), at));
            };
            let f = f.strip_suffix(b"\r").unwrap_or(f);
            if self.r.digits {
                for &b in f {
                    if b.is_ascii_digit() {
                        self.text_digits[(b - b'0') as usize] += 1;
                    }
                }
            }
            if self.r.entropy && f.len() < 8 {
                let mut w = [0u8; 8];
                w[..f.len()].copy_from_slice(f);
                w[7] = f.len() as u8;
                *self.text_short.entry(u64::from_le_bytes(w)).or_insert(0) += 1;
            } else if self.r.entropy {
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

    /// Run the operators over the rows gathered so far; all the text values in
    /// `text_values`.
    pub(crate) fn flush(&mut self) {
        self.flush_batch();
        for (k, v) in self.text_short.drain() {
            let w = k.to_le_bytes();
            *self.text_values.entry(w[..w[7] as usize].to_vec()).or_insert(0) += v;
        }
    }

    /// Run the operators over the batch of rows gathered so far.
    fn flush_batch(&mut self) {
        let n = self.nb;
        if n == 0 {
            return;
        }
        let modsum = self.r.modsum.then_some((self.r.k, self.r.m));
        // Four columns at a time: their sums are independent chains the CPU overlaps (each
        // column's terms are still added in row order, as one column at a time would).
        let mut k = 0;
        while k + 4 <= self.cols.len() {
            let xs: [&[f64]; 4] = std::array::from_fn(|j| &self.batch[k + j][..n]);
            flush_columns(xs, &mut self.cols[k..k + 4], modsum);
            k += 4;
        }
        while k < self.cols.len() {
            flush_columns([&self.batch[k][..n]], &mut self.cols[k..k + 1], modsum);
            k += 1;
        }
        if self.r.gram {
            let k = self.cols.len();
            // Entry (i, j) is the dot product of the columns, its terms added in row order;
            // four entries at a time (independent chains).
            let mut g = 0;
            for i in 0..k {
                let xi = &self.batch[i][..n];
                let mut j = i;
                while j + 4 <= k {
                    let xj: [&[f64]; 4] = std::array::from_fn(|t| &self.batch[j + t][..n]);
                    self.gram_batch[g..g + 4].copy_from_slice(&dots(xi, xj));
                    g += 4;
                    j += 4;
                }
                while j < k {
                    self.gram_batch[g] = dots(xi, [&self.batch[j][..n]])[0];
                    g += 1;
                    j += 1;
                }
            }
            for (acc, &s) in self.gram.iter_mut().zip(&self.gram_batch) {
                acc.add(s);
            }
        }
        self.nb = 0;
    }
}

/// The dot products of `xi` with each of `xj` (as long), each summed in order from 0.
#[inline]
fn dots<const W: usize>(xi: &[f64], xj: [&[f64]; W]) -> [f64; W] {
    let n = xi.len();
    let xj: [&[f64]; W] = std::array::from_fn(|t| &xj[t][..n]);
    let mut acc = [0.0; W];
    for row in 0..n {
        let x = xi[row];
        for t in 0..W {
            acc[t] += x * xj[t][row];
        }
    }
    acc
}

/// A batch of `W` columns into their accumulators: sum, min and max, the batch's moments
/// merged (as [`Moments::of`] computes them), and the modular sum (`(k, m)`).
#[inline]
// Rows outer, the W columns inner: each step adds one value of every column, which the
// compiler keeps in vector registers (an iterator over one column at a time would not).
#[allow(clippy::needless_range_loop)]
fn flush_columns<const W: usize>(xs: [&[f64]; W], accs: &mut [ColAcc], modsum: Option<(f64, f64)>) {
    let n = xs[0].len();
    let nf = n as f64;
    // Within a batch plain sums (a few thousand terms), across batches compensated.
    let mut s = [0.0; W];
    // `Iterator::sum`'s start, as `Moments::of` adds.
    let mut ms = [-0.0; W];
    let mut lo: [f64; W] = std::array::from_fn(|j| accs[j].min);
    let mut hi: [f64; W] = std::array::from_fn(|j| accs[j].max);
    for row in 0..n {
        for j in 0..W {
            let x = xs[j][row];
            s[j] += x;
            ms[j] += x;
            lo[j] = lo[j].min(x);
            hi[j] = hi[j].max(x);
        }
    }
    let mean: [f64; W] = std::array::from_fn(|j| ms[j] / nf);
    let (mut m2, mut c) = ([0.0; W], [0.0; W]);
    for row in 0..n {
        for j in 0..W {
            let d = xs[j][row] - mean[j];
            m2[j] += d * d;
            c[j] += d;
        }
    }
    let mut mods = [0.0; W];
    if let Some((kf, m)) = modsum {
        for row in 0..n {
            for j in 0..W {
                mods[j] += py_mod(xs[j][row] * kf, m);
            }
        }
    }
    for (j, acc) in accs.iter_mut().enumerate() {
        acc.sum.add(s[j]);
        acc.min = lo[j];
        acc.max = hi[j];
        if n > 0 {
            // The corrected two-pass formula, as `Moments::of`.
            let mom = Moments { n: n as u64, mean: mean[j] + c[j] / nf, m2: (m2[j] - c[j] * c[j] / nf).max(0.0) };
            acc.mom.merge(&mom);
        }
        if modsum.is_some() {
            acc.modsum.add(mods[j]);
        }
    }
}

/// Field `j` of the record parsed into `out`, whose fields end at `ends`.
/// `gap`: 0 when the fields are back to back (`csv_core`'s output), 1 when a delimiter
/// separates them (a record's raw bytes).
#[inline]
fn field<'a>(out: &'a [u8], ends: &[usize], j: usize, gap: usize) -> Option<&'a [u8]> {
    let e = *ends.get(j)?;
    let s = if j == 0 { 0 } else { ends[j - 1] + gap };
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
pub(crate) fn parse_number(f: &[u8]) -> Option<f64> {
    let t = f.trim_ascii();
    if t.is_empty() {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse::<f64>().ok()
}

/// Powers of ten that are exact doubles.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// The common plain decimal (`-?DIGITS(.DIGITS)?`, as the sensor logs write numbers) the
/// fast way, the same double as [`parse_number`]; `None` for anything else (blanks, a
/// `+`, an exponent, too many digits, not a number), which [`parse_number`] then reads.
///
/// Clinger's fast path: with the digits as an integer `m` below 2^53 and `f` decimals
/// (`f` <= 22), `m` and `10^f` are exact doubles and one correctly rounded division gives
/// the correctly rounded value of `m / 10^f`.
#[inline]
pub(crate) fn parse_decimal(f: &[u8]) -> Option<f64> {
    let (neg, digits) = match f.first()? {
        b'-' => (true, &f[1..]),
        _ => (false, f),
    };
    let mut m: u64 = 0;
    let mut i = 0;
    while i < digits.len() {
        let c = digits[i].wrapping_sub(b'0');
        if c > 9 {
            break;
        }
        m = m.wrapping_mul(10).wrapping_add(c as u64);
        i += 1;
    }
    let int_digits = i;
    if int_digits == 0 {
        return None;
    }
    let mut frac = 0;
    if i < digits.len() {
        if digits[i] != b'.' {
            return None;
        }
        i += 1;
        let s = i;
        while i < digits.len() {
            let c = digits[i].wrapping_sub(b'0');
            if c > 9 {
                return None;
            }
            m = m.wrapping_mul(10).wrapping_add(c as u64);
            i += 1;
        }
        frac = i - s;
        if frac == 0 {
            return None;
        }
    }
    // At most 19 digits: `m` has not wrapped.
    if int_digits + frac > 19 || m >= 1 << 53 {
        return None;
    }
    let v = m as f64 / POW10[frac];
    Some(if neg { -v } else { v })
}

/// The positions of the bytes that matter to a record without quotes (the delimiter, the
/// record terminators `\r` and `\n`, the quote), found 64 bytes at a time.
struct Specials<'a> {
    data: &'a [u8],
    d: u8,
    q: u8,
    /// The window `mask` covers: bit `j` for byte `win + j`.
    win: usize,
    mask: u64,
}

impl<'a> Specials<'a> {
    fn new(data: &'a [u8], at: usize, d: u8, q: u8) -> Specials<'a> {
        let mut s = Specials { data, d, q, win: at, mask: 0 };
        s.mask = s.window(at);
        s
    }

    /// The first special byte at or after `i` (at or after the last one returned).
    #[inline]
    fn next_from(&mut self, i: usize) -> Option<usize> {
        if i >= self.win + 64 {
            if i >= self.data.len() {
                return None;
            }
            self.win = i;
            self.mask = self.window(i);
        }
        let mut m = self.mask & (!0u64 << (i - self.win));
        loop {
            if m != 0 {
                return Some(self.win + m.trailing_zeros() as usize);
            }
            if self.win + 64 >= self.data.len() {
                return None;
            }
            self.win += 64;
            self.mask = self.window(self.win);
            m = self.mask;
        }
    }

    /// The mask of the 64 bytes from `at` (fewer at the end of the data).
    #[inline]
    fn window(&self, at: usize) -> u64 {
        let rest = &self.data[at.min(self.data.len())..];
        if rest.len() >= 64 {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: SSE2 is part of x86_64; the 64 bytes read are in `rest`.
                return unsafe { specials_sse2(rest.as_ptr(), self.d, self.q) };
            }
        }
        let mut m = 0u64;
        for (j, &b) in rest.iter().take(64).enumerate() {
            let hit = b == self.d || b == b'\n' || b == b'\r' || b == self.q;
            m |= (hit as u64) << j;
        }
        m
    }
}

/// The special bytes among the 64 at `p` (which must be readable), as bits.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn specials_sse2(p: *const u8, d: u8, q: u8) -> u64 {
    use std::arch::x86_64::*;
    unsafe {
        let (vd, vq) = (_mm_set1_epi8(d as i8), _mm_set1_epi8(q as i8));
        let (vn, vr) = (_mm_set1_epi8(b'\n' as i8), _mm_set1_epi8(b'\r' as i8));
        let mut m = 0u64;
        for k in 0..4 {
            let x = _mm_loadu_si128(p.add(16 * k) as *const __m128i);
            let a = _mm_or_si128(_mm_cmpeq_epi8(x, vd), _mm_cmpeq_epi8(x, vq));
            let b = _mm_or_si128(_mm_cmpeq_epi8(x, vn), _mm_cmpeq_epi8(x, vr));
            m |= (_mm_movemask_epi8(_mm_or_si128(a, b)) as u16 as u64) << (16 * k);
        }
        m
    }
}

/// FxHash (rustc's): a multiply per word, for the text column's short values.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

pub(crate) type FxBuild = std::hash::BuildHasherDefault<FxHasher>;

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut add = |w: u64| self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        let mut c = bytes.chunks_exact(8);
        for w in &mut c {
            add(u64::from_le_bytes(std::array::from_fn(|i| w[i])));
        }
        let r = c.remainder();
        if !r.is_empty() {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(r);
            add(u64::from_le_bytes(w) ^ ((r.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write(&[i]);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
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
        let q = self.r.quote as usize;
        if let Some(c) = &mut self.byte_counts {
            let before = c[q];
            count_bytes(c, chunk);
            if self.r.quoting {
                self.quotes += c[q] - before;
            }
        } else if self.r.quoting {
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

    /// Every record through `csv_core` (the reference for the fast path's tests).
    #[cfg(test)]
    pub(crate) fn slow_only(mut self) -> Self {
        self.recs.slow_only();
        self
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
        // Eight bytes per load, taken apart by shifts.
        let mut it = piece.chunks_exact(8);
        for q in &mut it {
            let w = u64::from_le_bytes(std::array::from_fn(|i| q[i]));
            t[0][(w & 0xff) as usize] += 1;
            t[1][((w >> 8) & 0xff) as usize] += 1;
            t[2][((w >> 16) & 0xff) as usize] += 1;
            t[3][((w >> 24) & 0xff) as usize] += 1;
            t[0][((w >> 32) & 0xff) as usize] += 1;
            t[1][((w >> 40) & 0xff) as usize] += 1;
            t[2][((w >> 48) & 0xff) as usize] += 1;
            t[3][(w >> 56) as usize] += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::ComputeOp;
    use proptest::prelude::*;

    fn same_number(f: &[u8]) {
        let want = parse_number(f);
        if let Some(got) = parse_decimal(f) {
            let want = want.unwrap_or_else(|| panic!("{:?} is no number, the fast path read {got}", f.escape_ascii()));
            assert_eq!(got.to_bits(), want.to_bits(), "{}: {got:e} != {want:e}", f.escape_ascii());
        }
    }

    #[test]
    fn fast_decimals_are_the_parsed_ones() {
        for f in [
            "49.1234",
            "-49.1234",
            "0",
            "-0",
            "-0.0",
            "0.0000",
            "007.50",
            "1700000123",
            "s042",
            "",
            "-",
            ".",
            "1.",
            ".5",
            "-.5",
            "+1.5",
            " 1.5",
            "1.5 ",
            "1e5",
            "1.5E-3",
            "nan",
            "inf",
            "-inf",
            "1..2",
            "1.2.3",
            "--1",
            "9007199254740991",
            "9007199254740992",
            "9007199254740993",
            "0.9007199254740993",
            "123456789012345678",
            "1234567890123456789",
            "12345678901234567890",
            "0.1234567890123456789",
            "0.00000000000000000001",
            "0.0000000000000000000000001",
            "179769313486231570000000000000000000000",
            "0.3",
            "0.1",
            "2.675",
            "1.0000000000000002",
            "\u{661}",
            "4\u{661}",
        ] {
            same_number(f.as_bytes());
        }
        assert_eq!(parse_decimal(b"49.1234"), Some(49.1234));
        assert_eq!(parse_decimal(b"-0").map(f64::to_bits), Some((-0.0f64).to_bits()));
        assert_eq!(parse_decimal(b"1e5"), None);
    }

    proptest! {
        #[test]
        fn fast_decimals_match_random(int in 0u64..u64::MAX, digits in 0usize..21, frac in 0u64..u64::MAX,
                                      fdigits in 0usize..24, neg: bool, dot: bool) {
            let i = int.to_string();
            let mut f = frac.to_string();
            f.truncate(fdigits);
            let mut t = String::new();
            if neg { t.push('-'); }
            t.push_str(&i[..digits.min(i.len())]);
            if dot { t.push('.'); t.push_str(&f); }
            same_number(t.as_bytes());
        }

        #[test]
        fn fast_records_are_csv_cores(rows in prop::collection::vec(row(), 0..40), crlf: bool,
                                      header: bool, piece in 1usize..64, start in 0usize..8, quoting: bool) {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut data = String::new();
            if header { data.push_str("ts,sensor,a,b,c"); data.push_str(nl); }
            for r in &rows { data.push_str(r); data.push_str(nl); }
            let data = data.as_bytes();
            let start = start.min(data.len());
            let block = &data[start..];
            let ops = [ComputeOp::Count, ComputeOp::Stats, ComputeOp::Modsum, ComputeOp::Stddev,
                       ComputeOp::Gram, ComputeOp::Digits, ComputeOp::Entropy];
            let r = Resolved::new(&pb::ComputeSpec {
                ops: ops.iter().map(|&o| o as i32).collect(),
                columns: vec![2, 3, 4],
                k: 3.0,
                m: 7.0,
                has_text_column: true,
                text_column: 1,
                csv: Some(pb::CsvFormat { header, no_quoting: !quoting, ..Default::default() }),
            }).unwrap();
            let scan = |slow: bool| {
                let mut sc = BlockScanner::new(&r, start as u64, false, start == 0);
                if slow { sc = sc.slow_only(); }
                for p in block.chunks(piece) { sc.feed(p); }
                sc.finish()
            };
            let (mut fast, mut slow) = (scan(false), scan(true));
            prop_assert_eq!(&fast.text_values, &slow.text_values);
            fast.text_values.clear();
            slow.text_values.clear();
            prop_assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
            // The edges and what the caller makes of them, through the fast path too.
            let (mut a, mut b) = (Records::new(&r, 0, header), Records::new(&r, 0, header));
            b.slow_only();
            for rec in [&mut a, &mut b] {
                let res = rec.feed(data, 0, true);
                rec.flush();
                let e = res.err().map(|e| e.to_string());
                let mut tv: Vec<_> = rec.text_values.iter().map(|(k, v)| (k.clone(), *v)).collect();
                tv.sort();
                let cols: Vec<_> = rec.cols.iter().map(|c| format!("{:?}", c.to_pb())).collect();
                let gram: Vec<_> = rec.gram.iter().map(|g| format!("{g:?}")).collect();
                rec.text_values = [(format!("{e:?} {} {cols:?} {gram:?} {tv:?} {:?}", rec.rows, rec.text_digits).into_bytes(), 0)]
                    .into_iter().collect();
            }
            prop_assert_eq!(&a.text_values, &b.text_values);
        }
    }

    /// A record: numbers of every shape, text with quotes, blanks and bad numbers.
    fn row() -> impl Strategy<Value = String> {
        let num = prop_oneof![
            4 => (-200.0f64..200.0).prop_map(|x| format!("{x:.4}")),
            1 => any::<f64>().prop_map(|x| format!("{x}")),
            1 => any::<f64>().prop_map(|x| format!("{x:e}")),
            1 => (-1_000_000i64..1_000_000).prop_map(|x| x.to_string()),
            1 => prop::sample::select(vec!["", " 1.5", "+2", "1.", ".5", "1e3", "x", "\"3.25\"", "\"1\"\"2\"", "\"\"",
                                           "12345678901234567890.5", "-0", "\"4\n5\"", "\"6\r\n\""])
                .prop_map(String::from),
        ];
        let text = prop_oneof![
            4 => (0u32..300).prop_map(|i| format!("s{i:03}")),
            1 => prop::sample::select(vec!["", "a longer sensor name", "\"q,uo\"\"ted\"", "\"two\nlines\"", "x\r", "12ab34"])
                .prop_map(String::from),
        ];
        prop_oneof![
            8 => (0u64..10_000, text, num.clone(), num.clone(), num)
                .prop_map(|(t, s, a, b, c)| format!("{t},{s},{a},{b},{c}")),
            1 => prop::sample::select(vec!["", "1,2", "1,s,2,3,4,5", "\"", ",,,,", "\r"]).prop_map(String::from),
        ]
    }
}
