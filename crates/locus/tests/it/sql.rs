//! MiniCluster tests of SQL next to the data (issue 24, `locus_sql::remote`): a query's
//! scans and partial aggregates run on the workers that hold the blocks, cold and warm,
//! with results equal to numbers computed here; the same query on workers without SQL
//! runs in the caller; a join with a one-row side (normalize's statistics) is folded into
//! constants, and a small table is broadcast as a join's build side, so the scan under
//! the other side still runs on the workers; a
//! fragment that names a worker's own files is refused; a caller that hangs up stops the
//! worker's scan.
#![cfg(feature = "sql")]

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use locus_client::{Client, FragmentPiece};
use locus_cluster::LocalCluster;
use locus_common::config::{ClientConfig, WriteType};
use locus_proto::pb;

use crate::common;
use common::{config, put_as, wait_persisted};

async fn start(dir: &std::path::Path, workers: usize, sql: bool) -> LocalCluster {
    let cfg = config(dir, 64 << 20, false);
    // Workers that run SQL fragments, as the `locus` binary's do.
    let fragments = sql.then(|| locus_sql::remote::factory(ClientConfig::default()));
    LocalCluster::start_with(cfg, &dir.join("data"), workers, None, fragments).await.unwrap()
}

/// A sensor log of `rows` rows (ts, sensor, c0, c1) and its numbers.
fn sensor_log(rows: usize) -> (Vec<u8>, Vec<(usize, f64, f64)>) {
    let mut s = String::from("ts,sensor,c0,c1\n");
    let mut v = Vec::with_capacity(rows);
    let mut x = 11u64;
    for i in 0..rows {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let c0 = ((x >> 33) % 2_000_000) as f64 / 1000.0 - 1000.0;
        let c1 = ((x >> 13) % 1000) as f64;
        s += &format!("{},s{},{},{}\n", 1_700_000_000 + i, i % 7, c0, c1);
        v.push((i % 7, c0, c1));
    }
    (s.into_bytes(), v)
}

/// `data` at `path`, persisted and then freed: only in the UFS.
async fn put_cold(cl: &Client, path: &str, data: &[u8]) {
    put_as(cl, path, data, WriteType::CacheThrough).await.unwrap();
    wait_persisted(cl, path).await;
    cl.free(path, false).await.unwrap();
}

const QUERY: &str = "SELECT sensor, count(*) AS n, sum(c0) AS s, min(c1) AS lo, max(c1) AS hi \
                     FROM 'locus:///logs/a.csv' WHERE c1 >= 100 GROUP BY sensor ORDER BY sensor";

/// The query's answer computed here: per sensor, (count, sum c0, min c1, max c1).
fn expected(v: &[(usize, f64, f64)]) -> Vec<(String, i64, f64, f64, f64)> {
    let mut out: Vec<(String, i64, f64, f64, f64)> =
        (0..7).map(|s| (format!("s{s}"), 0, 0.0, f64::INFINITY, f64::NEG_INFINITY)).collect();
    for &(s, c0, c1) in v.iter().filter(|r| r.2 >= 100.0) {
        let o = &mut out[s];
        o.1 += 1;
        o.2 += c0;
        o.3 = o.3.min(c1);
        o.4 = o.4.max(c1);
    }
    out
}

fn rows(batches: &[RecordBatch]) -> Vec<(String, i64, f64, f64, f64)> {
    let mut out = Vec::new();
    for b in batches {
        let sensor = b.column(0);
        let sensor = datafusion::arrow::compute::cast(sensor, &datafusion::arrow::datatypes::DataType::Utf8).unwrap();
        let sensor = sensor.as_string::<i32>();
        let n = b.column(1).as_primitive::<Int64Type>();
        let f = |i: usize| {
            let c = datafusion::arrow::compute::cast(b.column(i), &datafusion::arrow::datatypes::DataType::Float64)
                .unwrap();
            c.as_primitive::<Float64Type>().clone()
        };
        let (s, lo, hi) = (f(2), f(3), f(4));
        for r in 0..b.num_rows() {
            assert!(!sensor.is_null(r));
            out.push((sensor.value(r).to_string(), n.value(r), s.value(r), lo.value(r), hi.value(r)));
        }
    }
    out
}

fn assert_same(got: &[(String, i64, f64, f64, f64)], want: &[(String, i64, f64, f64, f64)]) {
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((&g.0, g.1, g.3, g.4), (&w.0, w.1, w.3, w.4));
        assert!((g.2 - w.2).abs() <= 1e-9 * w.2.abs().max(1.0), "sum {} vs {}", g.2, w.2);
    }
}

async fn totals(c: &Client) -> pb::ReadCounters {
    c.report().await.unwrap().totals.unwrap()
}

/// Wait until the heartbeats have brought the workers' compute counters past `scanned`.
async fn scanned_past(c: &Client, scanned: u64) -> pb::ReadCounters {
    for _ in 0..100 {
        let t = totals(c).await;
        if t.compute_scanned >= scanned {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    totals(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_run_on_the_workers_cold_and_warm_and_match_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, true).await;
    let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
    let (data, vals) = sensor_log(150_000); // about 5 blocks of 1 MiB
    put_cold(&cl, "/logs/a.csv", &data).await;
    let want = expected(&vals);
    // The plan: per block, the scan, filter and partial aggregate on a worker.
    let (ctx, read) = locus_sql::query::session_counted(cl.clone(), false).unwrap();
    let traffic = locus_sql::query::Traffic::scanning(read);
    let plan = locus_sql::query::plan(&ctx, cl.clone(), QUERY, &traffic).await.unwrap();
    let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
    let blocks = cl.status("/logs/a.csv", true).await.unwrap().blocks.len();
    assert!(shown.contains(&format!("RemoteExec: partitions={blocks} on workers")), "{shown}");
    assert!(shown.contains("AggregateExec: mode=Partial"), "{shown}");
    let before = totals(&cl).await;
    for round in ["cold", "warm"] {
        let (batches, traffic) = locus_sql::query::run_sql_counted(cl.clone(), QUERY).await.unwrap();
        assert_same(&rows(&batches), &want);
        let (scanned, returned) = traffic.get();
        assert!(returned > 0 && returned * 100 < scanned, "{round}: {returned} returned");
        // Every byte scanned once; besides, the planner reads the file's head for its
        // schema, and a range reads on to its last record's end.
        let len = data.len() as u64;
        assert!(scanned >= len && scanned < len + (512 << 10), "{round}: {scanned} of {len}");
    }
    // The scans ran on the workers: their counters have both runs, and what came back
    // (partial aggregates) is a sliver of it.
    let t = scanned_past(&cl, before.compute_scanned + 2 * data.len() as u64).await;
    let scanned = t.compute_scanned - before.compute_scanned;
    let returned = t.compute_returned - before.compute_returned;
    assert!(scanned >= 2 * data.len() as u64, "workers scanned {scanned}");
    assert!(returned > 0 && returned * 100 <= scanned, "returned {returned} of {scanned}");
    // The cold run cached the blocks where it scanned them.
    let fi = cl.status("/logs/a.csv", true).await.unwrap();
    assert!(fi.blocks.iter().all(|b| !b.locations.is_empty()), "{fi:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_without_sql_leave_the_query_to_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, false).await;
    let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
    let (data, vals) = sensor_log(40_000);
    put_as(&cl, "/logs/a.csv", &data, WriteType::MustCache).await.unwrap();
    let (batches, traffic) = locus_sql::query::run_sql_counted(cl.clone(), QUERY).await.unwrap();
    assert_same(&rows(&batches), &expected(&vals));
    assert_eq!(traffic.get().1, 0, "no worker sent results");
    assert!(traffic.get().0 >= data.len() as u64);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(totals(&cl).await.compute_scanned, 0);
    c.shutdown().await;
}

fn f64s(b: &RecordBatch, i: usize) -> Vec<f64> {
    let c = datafusion::arrow::compute::cast(b.column(i), &datafusion::arrow::datatypes::DataType::Float64).unwrap();
    c.as_primitive::<Float64Type>().values().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_with_a_one_row_or_small_side_scan_on_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 2, true).await;
    let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
    let (data, vals) = sensor_log(150_000);
    put_cold(&cl, "/logs/a.csv", &data).await;
    // A small table, as Parquet (its statistics tell the planner it is small).
    let ids: Vec<String> = (0..7).filter(|s| s % 3 != 0).map(|s| format!("s{s}")).collect();
    let names: Vec<String> = (0..7).filter(|s| s % 3 != 0).map(|s| format!("name{s}")).collect();
    let dims = RecordBatch::try_from_iter([
        ("sensor", Arc::new(datafusion::arrow::array::StringArray::from(ids)) as datafusion::arrow::array::ArrayRef),
        ("name", Arc::new(datafusion::arrow::array::StringArray::from(names))),
    ])
    .unwrap();
    let mut pq = Vec::new();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(&mut pq, dims.schema(), None).unwrap();
    w.write(&dims).unwrap();
    w.close().unwrap();
    put_as(&cl, "/dims/s.parquet", &pq, WriteType::MustCache).await.unwrap();
    let blocks = cl.status("/logs/a.csv", true).await.unwrap().blocks.len();
    let n = vals.len() as f64;
    // Normalize's plain definition: the statistics (one row), crossed with every row.
    let normalize = "WITH a AS (SELECT avg(c0) m, stddev_pop(c0) s, min(c1) l, max(c1) h FROM 'locus:///logs/a.csv') \
                     SELECT sum((c0 - m) / s) AS z, sum(CAST(c1 - l AS DOUBLE) / (h - l)) AS mm, count(*) AS n \
                     FROM 'locus:///logs/a.csv' CROSS JOIN a";
    let mean = vals.iter().map(|v| v.1).sum::<f64>() / n;
    let sd = (vals.iter().map(|v| (v.1 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let (lo, hi) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v.2), h.max(v.2)));
    let z: f64 = vals.iter().map(|v| (v.1 - mean) / sd).sum();
    let mm: f64 = vals.iter().map(|v| (v.2 - lo) / (hi - lo)).sum();
    // A small table joined on the sensor (inner): per name, the rows and their sum of c0.
    let join = "SELECT d.name, count(*) AS n, sum(t.c0) AS s FROM 'locus:///logs/a.csv' t \
                JOIN 'locus:///dims/s.parquet' d ON t.sensor = d.sensor GROUP BY d.name ORDER BY d.name";
    let mut per: Vec<(String, f64, f64)> =
        (0..7).filter(|s| s % 3 != 0).map(|s| (format!("name{s}"), 0.0, 0.0)).collect();
    for v in &vals {
        if let Some(p) = per.iter_mut().find(|p| p.0 == format!("name{}", v.0)) {
            p.1 += 1.0;
            p.2 += v.1;
        }
    }
    // Normalize's one-row side becomes constants (no join is left); the small table is
    // the hash join's build side, sent with each fragment.
    for sql in [normalize, join] {
        let (ctx, read) = locus_sql::query::session_counted(cl.clone(), false).unwrap();
        let traffic = locus_sql::query::Traffic::scanning(read);
        let plan = locus_sql::query::plan(&ctx, cl.clone(), sql, &traffic).await.unwrap();
        let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        // The partial aggregate is a fragment, one per block of the log, with the join (if
        // any is left) under it: none is in the caller's part of the plan.
        let remote = shown.lines().find(|l| {
            l.contains(&format!("RemoteExec: partitions={blocks} on workers"))
                && l.contains("fragment=AggregateExec: mode=Partial")
        });
        assert!(remote.is_some(), "{shown}");
        assert!(!shown.contains("Join"), "{shown}");
        for round in ["cold", "warm"] {
            let (batches, traffic) = locus_sql::query::run_sql_counted(cl.clone(), sql).await.unwrap();
            let (scanned, returned) = traffic.get();
            assert!(returned > 0 && returned * 100 < scanned, "{round}: {returned} returned of {scanned}");
            if sql == normalize {
                let b = &batches[0];
                let (gz, gmm) = (f64s(b, 0)[0], f64s(b, 1)[0]);
                assert_eq!(b.column(2).as_primitive::<Int64Type>().value(0), vals.len() as i64);
                assert!((gz - z).abs() <= 1e-6, "z {gz} vs {z}");
                assert!((gmm - mm).abs() <= 1e-9 * mm.abs(), "minmax {gmm} vs {mm}");
            } else {
                let mut got = Vec::new();
                for b in &batches {
                    let name =
                        datafusion::arrow::compute::cast(b.column(0), &datafusion::arrow::datatypes::DataType::Utf8)
                            .unwrap();
                    let (cnt, sum) = (f64s(b, 1), f64s(b, 2));
                    for r in 0..b.num_rows() {
                        got.push((name.as_string::<i32>().value(r).to_string(), cnt[r], sum[r]));
                    }
                }
                assert_eq!(got.len(), per.len(), "{got:?}");
                for (g, w) in got.iter().zip(&per) {
                    assert_eq!((&g.0, g.1), (&w.0, w.1));
                    assert!((g.2 - w.2).abs() <= 1e-9 * w.2.abs().max(1.0), "{g:?} vs {w:?}");
                }
            }
        }
    }
    c.shutdown().await;
}

/// The fragment of `sql` (planned here, in a session with the local file system) that
/// reads `table`.
async fn local_fragment(sql: &str, table: &str, path: &std::path::Path) -> Vec<u8> {
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_csv(table, path.to_str().unwrap(), Default::default()).await.unwrap();
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    datafusion_proto::bytes::physical_plan_to_bytes(plan).unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fragment_that_names_a_workers_own_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, true).await;
    let cl = c.client(ClientConfig::default()).unwrap();
    let secret = dir.path().join("local.csv");
    std::fs::write(&secret, "k,v\nsecret,42\n").unwrap();
    let plan = local_fragment("SELECT * FROM t", "t", &secret).await;
    let w = c.worker(0).unwrap().data_address().to_string();
    let mut s = cl.run_fragment(&w, plan, 0).await.unwrap().boxed();
    let mut err = None;
    while let Some(p) = s.next().await {
        match p {
            Ok(FragmentPiece::Ipc(b)) => assert!(!String::from_utf8_lossy(&b).contains("secret"), "leaked"),
            Ok(FragmentPiece::Done { .. }) => panic!("a fragment over file:// ran"),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let e = err.expect("an error");
    assert!(e.to_string().contains("locus:// files only"), "{e}");
    // The worker still serves.
    let (batches, _) = {
        let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
        put_as(&cl, "/x.csv", b"a,b\n1,2\n", WriteType::MustCache).await.unwrap();
        locus_sql::query::run_sql_counted(cl, "SELECT a + b AS s FROM 'locus:///x.csv'").await.unwrap()
    };
    assert_eq!(batches[0].column(0).as_primitive::<Int64Type>().value(0), 3);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_that_hangs_up_stops_the_workers_scan() {
    let dir = tempfile::tempdir().unwrap();
    let c = start(dir.path(), 1, true).await;
    let cl = Arc::new(c.client(ClientConfig::default()).unwrap());
    let (data, _) = sensor_log(600_000); // about 20 MiB: seconds of scanning in a debug build
    put_cold(&cl, "/logs/a.csv", &data).await;
    // The whole-file aggregate as one fragment, sent by hand; the caller reads the
    // schema piece and hangs up.
    let (ctx, _) = locus_sql::query::session_counted(cl.clone(), true).unwrap();
    let plan = ctx
        .sql("SELECT sensor, sum(c0), sum(c1) FROM 'locus:///logs/a.csv' GROUP BY sensor")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let plan = datafusion_proto::bytes::physical_plan_to_bytes(plan).unwrap().to_vec();
    let w = c.worker(0).unwrap().data_address().to_string();
    let mut s = cl.run_fragment(&w, plan, 0).await.unwrap().boxed();
    assert!(matches!(s.next().await, Some(Ok(FragmentPiece::Ipc(_)))));
    drop(s);
    // The fill the scan started may finish its block; the scan itself stops, so the
    // worker's cache holds well under the file.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cached = |fi: &pb::FileInfo| fi.blocks.iter().filter(|b| !b.locations.is_empty()).count();
    let a = cached(&cl.status("/logs/a.csv", true).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fi = cl.status("/logs/a.csv", true).await.unwrap();
    let b = cached(&fi);
    assert_eq!(a, b, "the scan went on after the caller left");
    assert!(b < fi.blocks.len(), "{b} of {} blocks cached: the scan did not stop", fi.blocks.len());
    c.shutdown().await;
}
