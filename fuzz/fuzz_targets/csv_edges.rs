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

/// Whether every quote opens a field, closes one or is doubled inside one.
fn quotes_well_placed(d: &[u8]) -> bool {
    let edge = |b: Option<&u8>| matches!(b, None | Some(b',' | b'\n' | b'\r' | b'"'));
    (0..d.len()).filter(|&i| d[i] == b'"').all(|i| edge(i.checked_sub(1).map(|j| &d[j])) || edge(d.get(i + 1)))
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
