//! `locus bench ...`: the benchmarks of `locus-bench`, each on a cluster of its own in a
//! fresh scratch directory, their results printed (and written with `--out`).

use std::path::PathBuf;

use anyhow::Result;
use bytesize::ByteSize;
use clap::Subcommand;
use locus_bench::compute::HostCompute;
use locus_bench::gateway::GatewayBench;
use locus_bench::meta::MetaBench;
use locus_bench::mixed::MixedBench;
use locus_bench::read::ReadBench;
use locus_bench::{MinioTarget, remove_scratch, scratch_dir};
use locus_common::Error;
use serde_json::json;

use super::runtime;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Master metadata throughput through the RPC path: creates (durable), opens and
    /// listings per second. Starts its own Locus; needs nothing else.
    Meta {
        /// Files created per run.
        #[arg(long, default_value_t = 20_000)]
        files: usize,
        /// Operations in flight.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Run the master as a one-member replicated group: every change through the
        /// log (docs/design/ha-plan.md, stage 3).
        #[arg(long)]
        group: bool,
        /// With 2 or more: one master first, then a replicated group of this many masters
        /// in this process, and the group's rate over the one master's.
        #[arg(long, default_value_t = 1)]
        masters: usize,
        /// Write the Markdown table here as well (and the raw runs next to it as JSON).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The S3 gateway against MinIO, side by side: GET of a cached object (1 and 4
    /// streams), PUT, and 4 KiB GET latency. Starts its own Locus; needs a running MinIO.
    Gateway {
        #[command(flatten)]
        minio: MinioTarget,
        /// Object size.
        #[arg(long, default_value = "1GiB")]
        size: String,
        /// Runs per throughput measure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// 4 KiB GETs per server.
        #[arg(long, default_value_t = 500)]
        small_gets: usize,
        /// Write the Markdown table here as well (and the raw runs next to it as JSON).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Read one large file: direct UFS, Locus first read, short-circuit, forced remote,
    /// tmpfs `cat`, and an iperf3 loopback stream. Needs a running S3 store (MinIO).
    Read {
        #[command(flatten)]
        minio: MinioTarget,
        /// File size.
        #[arg(long, default_value = "1GiB")]
        size: String,
        /// Runs per path (at least 5 for the published medians).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Block size.
        #[arg(long, default_value = "64MiB")]
        block_size: String,
        /// Write the Markdown table here as well.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Small-read latency during eviction: p50/p99 of concurrent reads of cached files
    /// while other clients write enough to demote and evict continuously across a small
    /// MEM tier over a small SSD tier, against the same reads with no writes (the floor),
    /// side by side with the ratio. Starts its own Locus; needs nothing else.
    Mixed {
        #[command(flatten)]
        bench: MixedBench,
        /// Print the result as one JSON object instead.
        #[arg(long)]
        json: bool,
    },
    /// The near-data operators on the host, no cluster: every object under a prefix
    /// read from an S3 store (OpenDAL) and fed through `locus fs compute`'s scanner and
    /// merge in this process (`bench/run seed-csd`'s "host pull in Rust"). Prints the
    /// results as `locus fs compute --json` does, plus the object bytes read. With
    /// `--read-only`, only reads the same ranges (the plain read).
    ComputeHost {
        #[command(flatten)]
        minio: MinioTarget,
        /// Operators, as `locus fs compute` takes them (count, stats, ..., or all).
        #[arg(default_value = "all")]
        ops: String,
        /// Every object directly under this prefix of the bucket.
        #[arg(long)]
        prefix: String,
        /// Numeric columns: header names, ranges such as c0..c7, or positions _1, _2.
        #[arg(long, default_value = "")]
        columns: String,
        /// A column whose text digits and entropy count (default: the raw bytes).
        #[arg(long)]
        text_column: Option<String>,
        #[arg(long, default_value_t = 1.0)]
        k: f64,
        #[arg(long, default_value_t = 10.0)]
        m: f64,
        /// The first line is data, not a header.
        #[arg(long)]
        no_header: bool,
        /// Ranges read and scanned at once.
        #[arg(long, default_value_t = 2)]
        parallelism: usize,
        /// The size of a range (as a Locus block).
        #[arg(long, default_value = "64MiB")]
        block_size: String,
        /// Read the objects, compute nothing.
        #[arg(long)]
        read_only: bool,
    },
    /// The floor of `locus fs index import`: the same manifests parsed the same way and
    /// indexed into the same search index (schema, writer threads and memory) in a
    /// scratch directory, in this process: no master, no RPC. Prints one JSON object
    /// (objects, seconds, objects_per_s). Needs nothing else.
    IndexFloor(super::inventory::Manifests),
}

pub fn run(cmd: &BenchCmd) -> Result<()> {
    locus_common::init_logging(false);
    match cmd {
        BenchCmd::Read { minio, size, runs, block_size, out } => {
            let (size, block_size) = (size_flag("size", size)?, size_flag("block-size", block_size)?);
            with_scratch(|work_dir| {
                let b = ReadBench { minio: minio.clone(), size, runs: *runs, block_size, work_dir };
                let (rows, ratios) = runtime()?.block_on(b.run())?;
                emit(&locus_bench::read::markdown(&b, &rows, &ratios), out, json!({"rows": rows, "ratios": ratios}))
            })
        }
        BenchCmd::Gateway { minio, size, runs, small_gets, out } => {
            let size = size_flag("size", size)?;
            with_scratch(|work_dir| {
                let b = GatewayBench { minio: minio.clone(), size, runs: *runs, small_gets: *small_gets, work_dir };
                let rows = runtime()?.block_on(b.run())?;
                emit(&locus_bench::gateway::markdown(&b, &rows), out, json!({"rows": rows}))
            })
        }
        BenchCmd::Meta { files, concurrency, runs, group, masters, out } => with_scratch(|work_dir| {
            let (files, concurrency, runs, group, masters) = (*files, *concurrency, *runs, *group, *masters);
            let b = MetaBench { files, concurrency, runs, work_dir, group, masters };
            let rows = runtime()?.block_on(b.run())?;
            emit(&locus_bench::meta::markdown(&b, &rows), out, json!({"rows": rows}))
        }),
        BenchCmd::ComputeHost {
            minio,
            ops,
            prefix,
            columns,
            text_column,
            k,
            m,
            no_header,
            parallelism,
            block_size,
            read_only,
        } => {
            let b = HostCompute {
                minio: minio.clone(),
                prefix: prefix.clone(),
                ops: ops.clone(),
                columns: columns.clone(),
                text_column: text_column.clone(),
                k: *k,
                m: *m,
                no_header: *no_header,
                parallelism: *parallelism,
                block_size: size_flag("block-size", block_size)?,
                read_only: *read_only,
            };
            let out = runtime()?.block_on(b.run())?;
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        BenchCmd::IndexFloor(m) => with_scratch(|work_dir| {
            let t = std::time::Instant::now();
            let n = super::inventory::index_floor(m, &work_dir.join("index"))?;
            let secs = t.elapsed().as_secs_f64();
            let r = json!({"objects": n, "seconds": secs, "objects_per_s": n as f64 / secs.max(1e-9)});
            println!("{r}");
            Ok(())
        }),
        BenchCmd::Mixed { bench, json: as_json } => with_scratch(|work_dir| {
            let b = MixedBench { work_dir, ..bench.clone() };
            let r = runtime()?.block_on(b.run())?;
            if *as_json {
                println!("{}", serde_json::to_string_pretty(&json!({"bench": b, "result": r}))?);
            } else {
                print!("{}", locus_bench::mixed::text(&b, &r));
            }
            Ok(())
        }),
    }
}

/// A size flag's bytes (`1GiB`).
fn size_flag(name: &str, v: &str) -> Result<u64> {
    let s: ByteSize = v.parse().map_err(|e| Error::invalid(format!("bad --{name}: {e}")))?;
    Ok(s.as_u64())
}

/// Run a benchmark in a fresh scratch directory, removed afterwards whatever happens.
fn with_scratch(f: impl FnOnce(PathBuf) -> Result<()>) -> Result<()> {
    let work = scratch_dir()?;
    let res = f(work.clone());
    remove_scratch(&work);
    res
}

/// Print a benchmark's Markdown table; with `out`, also write it there and the raw runs
/// beside it as JSON.
fn emit(md: &str, out: &Option<PathBuf>, raw: serde_json::Value) -> Result<()> {
    println!("{md}");
    if let Some(p) = out {
        std::fs::write(p, md)?;
        std::fs::write(p.with_extension("json"), serde_json::to_string_pretty(&raw)?)?;
    }
    Ok(())
}
