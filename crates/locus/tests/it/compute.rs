//! MiniCluster tests of near-data compute (issue 24): the operators over multi-block
//! files on two workers, cold (only in the UFS) and warm, against values computed here
//! from the generated numbers; records across every block edge; bad input.

use std::time::Duration;

use locus_client::{Client, ComputeJob};
use locus_common::ErrorKind;
use locus_common::config::{ClientConfig, WriteType};
use locus_proto::pb::{self, ComputeOp};

use crate::common;
use common::{BLOCK, put_as, start, wait_persisted};

/// A sensor log: `rows` rows of ts, sensor, c0..c3, and the numbers in it.
fn sensor_log(rows: usize, seed: u64) -> (Vec<u8>, Vec<[f64; 4]>) {
    let mut s = String::from("ts,sensor,c0,c1,c2,c3\n");
    let mut vals = Vec::with_capacity(rows);
    let mut x = seed;
    for i in 0..rows {
        let mut v = [0.0; 4];
        for c in &mut v {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *c = ((x >> 33) % 2_000_000) as f64 / 1000.0 - 1000.0;
        }
        s += &format!("{},s{},{},{},{},{}\n", 1_700_000_000 + i, i % 7, v[0], v[1], v[2], v[3]);
        vals.push(v);
    }
    (s.into_bytes(), vals)
}

fn job(ops: &[ComputeOp], columns: &str) -> ComputeJob {
    ComputeJob {
        request: locus_compute::Request {
            ops: ops.to_vec(),
            columns: columns.into(),
            k: 3.0,
            m: 7.0,
            csv: pb::CsvFormat { header: true, ..Default::default() },
            ..Default::default()
        },
        ..Default::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn py_mod(x: f64, m: f64) -> f64 {
    let r = x % m;
    if r != 0.0 && ((r < 0.0) != (m < 0.0)) { r + m } else { r }
}

async fn cached_blocks(c: &Client, path: &str) -> usize {
    c.status(path, true).await.unwrap().blocks.iter().filter(|b| !b.locations.is_empty()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_on_two_workers_cold_and_warm_match_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let (data, vals) = sensor_log(120_000, 7); // about 4.5 blocks of 1 MiB
    put_as(&cl, "/logs/a.csv", &data, WriteType::CacheThrough).await.unwrap();
    wait_persisted(&cl, "/logs/a.csv").await;
    let blocks = cl.status("/logs/a.csv", true).await.unwrap().blocks.len();
    assert!(blocks >= 4, "{blocks} blocks");
    // Cold: only in the UFS. The compute fills the cache as it goes.
    cl.free("/logs/a.csv", false).await.unwrap();
    for _ in 0..100 {
        if cached_blocks(&cl, "/logs/a.csv").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cached_blocks(&cl, "/logs/a.csv").await, 0);
    let all = job(
        &[
            ComputeOp::Count,
            ComputeOp::Stats,
            ComputeOp::Modsum,
            ComputeOp::Stddev,
            ComputeOp::Normalize,
            ComputeOp::Gram,
        ],
        "c0..c3",
    );
    let cold = cl.compute(&["/logs/a.csv".into()], &all).await.unwrap();
    assert_eq!(cached_blocks(&cl, "/logs/a.csv").await, blocks, "the cold run cached every block");
    let warm = cl.compute(&["/logs/".into()], &all).await.unwrap();
    let n = vals.len() as f64;
    for out in [&cold, &warm] {
        let r = &out.results;
        assert_eq!(r.rows, vals.len() as u64);
        assert_eq!(r.count.as_ref().unwrap()["lines"], vals.len() as u64 + 1);
        assert_eq!(r.bytes_scanned, data.len() as u64);
        assert!(out.bytes_returned * 1000 <= r.bytes_scanned, "returned {} of {}", out.bytes_returned, r.bytes_scanned);
        for (c, name) in ["c0", "c1", "c2", "c3"].iter().enumerate() {
            let xs: Vec<f64> = vals.iter().map(|v| v[c]).collect();
            let sum: f64 = xs.iter().sum();
            let mean = sum / n;
            let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
            let min = xs.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let st = &r.stats.as_ref().unwrap()[*name];
            assert!(close(st["sum"].as_f64().unwrap(), sum), "{name} sum {} vs {sum}", st["sum"]);
            assert_eq!(st["min"].as_f64().unwrap(), min);
            assert_eq!(st["max"].as_f64().unwrap(), max);
            let sd = &r.stddev.as_ref().unwrap()[*name];
            assert!(close(sd["population"].as_f64().unwrap(), var.sqrt()), "{name} {sd}");
            assert!(close(sd["sample"].as_f64().unwrap(), (var * n / (n - 1.0)).sqrt()), "{name} {sd}");
            let ms: f64 = xs.iter().map(|x| py_mod(x * 3.0, 7.0)).sum();
            let got = r.modsum.as_ref().unwrap()["sums"][*name].as_f64().unwrap();
            assert!(close(got, ms), "{name} modsum {got} vs {ms}");
            let mm: f64 = xs.iter().map(|x| (x - min) / (max - min)).sum();
            let got = r.normalize.as_ref().unwrap()[*name]["minmax_sum"].as_f64().unwrap();
            assert!(close(got, mm), "{name} minmax {got} vs {mm}");
        }
        let g = &r.gram.as_ref().unwrap()["matrix"];
        for i in 0..4 {
            for j in 0..4 {
                let want: f64 = vals.iter().map(|v| v[i] * v[j]).sum();
                assert!(close(g[i][j].as_f64().unwrap(), want), "gram[{i}][{j}]");
            }
        }
    }
    // The workers counted what they scanned and what they sent back.
    let mut seen = None;
    for _ in 0..100 {
        let t = cl.report().await.unwrap().totals.unwrap();
        if t.compute_scanned >= 2 * data.len() as u64 {
            seen = Some(t);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = seen.expect("the report counts the scanned bytes");
    assert!(t.compute_returned > 0 && t.compute_returned * 1000 <= t.compute_scanned, "{t:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_across_every_block_edge_count_once_quoted_line_ends_included() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, 64 << 20, false).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    // Rows whose quoted note holds line ends and quotes; the file crosses several blocks
    // with the edges landing at every kind of place in a record.
    let mut s = String::from("id,note,v\n");
    let mut sum = 0.0;
    let mut i = 0u64;
    while s.len() < 3 * BLOCK as usize + 5000 {
        let note = match i % 3 {
            0 => "a \"quoted\"\nline, and more\n".repeat(1 + (i % 5) as usize),
            1 => "plain".into(),
            _ => String::new(),
        };
        s += &format!("{i},\"{}\",{}\n", note.replace('"', "\"\""), i as f64 * 0.5);
        sum += i as f64 * 0.5;
        i += 1;
    }
    put_as(&cl, "/q.csv", s.as_bytes(), WriteType::MustCache).await.unwrap();
    let mut j = job(&[ComputeOp::Count, ComputeOp::Stats, ComputeOp::Entropy], "v");
    j.request.text_column = Some("note".into());
    let out = cl.compute(&["/q.csv".into()], &j).await.unwrap();
    let r = &out.results;
    assert_eq!(r.rows, i);
    assert!(close(r.stats.as_ref().unwrap()["v"]["sum"].as_f64().unwrap(), sum));
    assert_eq!(r.entropy.as_ref().unwrap()["distinct"], 7, "{:?}", r.entropy);
    assert_eq!(r.count.as_ref().unwrap()["lines"], s.bytes().filter(|&b| b == b'\n').count() as u64);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_a_clear_error_and_the_workers_stay_up() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, 64 << 20, false).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    put_as(&cl, "/bad.csv", b"a,b\n1,2\n3,oops\n5,6\n", WriteType::MustCache).await.unwrap();
    put_as(&cl, "/short.csv", b"a,b\n1,2\n3\n", WriteType::MustCache).await.unwrap();
    let e = cl.compute(&["/bad.csv".into()], &job(&[ComputeOp::Stats], "b")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("is not a number: \"oops\""), "{e}");
    let e = cl.compute(&["/short.csv".into()], &job(&[ComputeOp::Stats], "b")).await.unwrap_err();
    assert!(e.to_string().contains("there is no column _2"), "{e}");
    let e = cl.compute(&["/bad.csv".into()], &job(&[ComputeOp::Stats], "zz")).await.unwrap_err();
    assert!(e.to_string().contains("no column 'zz'"), "{e}");
    let e = cl.compute(&["/nothing/*.csv".into()], &job(&[ComputeOp::Count], "")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let e = cl.compute(&["/bad.csv".into()], &job(&[ComputeOp::Stats], "")).await.unwrap_err();
    assert!(e.to_string().contains("need numeric columns"), "{e}");
    // The worker still serves.
    let out = cl.compute(&["/*.csv".into()], &job(&[ComputeOp::Count], "")).await.unwrap();
    assert_eq!((out.results.files, out.results.rows), (2, 5));
    c.shutdown().await;
}
