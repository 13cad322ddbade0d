//! The CSV record splitter at block edges: a file cut into blocks of any size, each
//! scanned in pieces of any size as a worker scans it (the blocks that start inside
//! quotes scanned again), then merged, counts the records the whole file scanned as one
//! block counts, when its quotes are where RFC 4180 puts them (a block learns whether it
//! starts inside quotes from the count of quotes before it; a quote inside an unquoted
//! field, `x"y`, is a plain byte to the parser but still counts there). Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use locus_compute::merge::{misaligned, starts_in_quotes};
use locus_compute::{BlockScanner, Merger, Resolved, pb};

fn run(r: &Resolved, data: &[u8], block: usize, piece: usize) -> Option<u64> {
    let starts: Vec<u64> = (0..data.len()).step_by(block).map(|s| s as u64).collect();
    let scan = |i: usize, in_quotes: bool| {
        let s = starts[i] as usize;
        let mut sc = BlockScanner::new(r, s as u64, in_quotes, i == 0);
        for p in data[s..(s + block).min(data.len())].chunks(piece) {
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
    let mut m = Merger::new(r, vec!["a".into(), "b".into()], None);
    m.add_file(&parts, &starts).ok()?;
    Some(m.finish().rows)
}

/// Whether the quoting is RFC 4180's: a field is quoted whole (a doubled quote inside
/// it is one quote) or holds no quote, and every quoted field is closed.
fn quotes_well_placed(d: &[u8]) -> bool {
    let sep = |b: u8| matches!(b, b',' | b'\n' | b'\r');
    let mut i = 0;
    loop {
        if d.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match (d.get(i), d.get(i + 1)) {
                    (None, _) => return false,
                    (Some(b'"'), Some(b'"')) => i += 2,
                    (Some(b'"'), _) => break,
                    _ => i += 1,
                }
            }
            i += 1;
            match d.get(i) {
                None => return true,
                Some(&b) if !sep(b) => return false,
                _ => {}
            }
        } else {
            while let Some(&b) = d.get(i).filter(|b| !sep(**b)) {
                if b == b'"' {
                    return false;
                }
                i += 1;
            }
            if i >= d.len() {
                return true;
            }
        }
        i += 1;
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, block, piece, rest @ ..] = data else { return };
    let ops = [pb::ComputeOp::Count, pb::ComputeOp::Stats];
    let Ok(r) = Resolved::new(&pb::ComputeSpec {
        ops: ops.iter().map(|&o| o as i32).collect(),
        columns: vec![0, 1],
        csv: Some(pb::CsvFormat { header: flags & 1 == 1, no_quoting: flags & 2 == 2, ..Default::default() }),
        ..Default::default()
    }) else {
        return;
    };
    if rest.is_empty() {
        return;
    }
    let whole = run(&r, rest, rest.len(), rest.len());
    let cut = run(&r, rest, 1 + *block as usize % 64, 1 + *piece as usize % 16);
    let comparable = flags & 2 == 2 || quotes_well_placed(rest);
    if let (Some(w), Some(c), true) = (whole, cut, comparable) {
        assert_eq!(w, c, "records counted whole and in blocks differ");
    }
});
