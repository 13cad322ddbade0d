//! Block scanner throughput on the seed study's sensor log (bench/seed_csd.py), beside
//! its floor, counting the line ends alone (what `wc -l` does):
//!
//! ```text
//! cargo run --release -p locus-compute --example scan_speed [MiB] [reps]
//! ```
//!
//! The data (`ts,sensor,c0..c7`, channels ~ N(50, 10) with 4 decimals) is made in memory,
//! cut into 64 MiB blocks and fed to one scanner per block in 4 MiB pieces, as a worker
//! does; the plan is `locus fs compute all --columns c0..c7 --text-column sensor --k 3
//! --m 7` (and `count` alone). Prints MB/s (10^6 bytes per second) on one core, best of
//! `reps`. (The commit that brought the fast path measured the scanner before it, 80-117
//! MB/s for `all`, 2.3-2.6x slower, in the same runs.)
#![allow(clippy::unwrap_used)] // a measuring tool: a failure ends the run

use std::time::Instant;

use locus_compute::pb::{self, ComputeOp};
use locus_compute::{BlockScanner, Request, Resolved, parse_ops};

const BLOCK: usize = 64 << 20;
const PIECE: usize = 4 << 20;

/// xorshift64*: enough for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

fn sensor_log(size: usize) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(size + 256);
    out.extend_from_slice(b"ts,sensor,c0,c1,c2,c3,c4,c5,c6,c7\n");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ts = 1_700_000_000u64;
    while out.len() < size {
        write!(out, "{ts},s{:03}", rng.next() % 256).unwrap();
        for _ in 0..8 {
            // `%.4f`, without the float formatting's cost.
            let v = ((50.0 + 10.0 * rng.normal()) * 1e4).round() as i64;
            let sign = if v < 0 { "-" } else { "" };
            write!(out, ",{sign}{}.{:04}", v.abs() / 10_000, v.abs() % 10_000).unwrap();
        }
        out.push(b'\n');
        ts += 1;
    }
    out
}

fn plan(ops: &str) -> Resolved {
    let header: Vec<String> = "ts,sensor,c0,c1,c2,c3,c4,c5,c6,c7".split(',').map(String::from).collect();
    let ops = parse_ops(ops).unwrap();
    let all = ops.contains(&ComputeOp::Gram);
    let req = Request {
        ops,
        columns: if all { "c0..c7".into() } else { String::new() },
        text_column: all.then(|| "sensor".into()),
        k: 3.0,
        m: 7.0,
        csv: pb::CsvFormat { header: true, ..Default::default() },
    };
    req.plan(Some(&header)).unwrap().resolved
}

fn scan_new(r: &Resolved, data: &[u8]) -> Vec<pb::ComputePartial> {
    data.chunks(BLOCK)
        .enumerate()
        .map(|(i, b)| {
            let mut s = BlockScanner::new(r, (i * BLOCK) as u64, false, i == 0);
            for p in b.chunks(PIECE) {
                s.feed(p);
            }
            s.finish()
        })
        .collect()
}

fn best(reps: usize, data: &[u8], f: impl Fn() -> Vec<pb::ComputePartial>) -> (f64, Vec<pb::ComputePartial>) {
    let mut best = f64::INFINITY;
    let mut out = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        out = f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (data.len() as f64 / best / 1e6, out)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(256);
    let reps: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(3);
    let t = Instant::now();
    let data = sensor_log(mib << 20);
    eprintln!("{} MiB of sensor log in {:.1} s", data.len() >> 20, t.elapsed().as_secs_f64());
    let floor = {
        let t = Instant::now();
        let mut n = 0usize;
        for _ in 0..reps {
            n = std::hint::black_box(data.iter().filter(|&&b| b == b'\n').count());
        }
        data.len() as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e6 + (n == 0) as u8 as f64
    };
    for ops in ["all", "count"] {
        let r = plan(ops);
        let (mbs, parts) = best(reps, &data, || scan_new(&r, &data));
        assert!(parts.iter().all(|p| p.error.is_empty()));
        println!("{ops:>5}: {mbs:7.1} MB/s   (floor, line ends alone: {floor:.1} MB/s; {:.2}x of it)", mbs / floor);
    }
}
