//! `locus fs compute OP PATH...`: the seed study's operators, run on the workers that
//! hold the blocks; only partial results come back.

use anyhow::Result;
use clap::Args;
use locus_client::{Client, ComputeJob};
use locus_common::Error;
use locus_compute::Request;
use locus_proto::pb;

use super::human;

#[derive(Args)]
pub struct ComputeArgs {
    /// Operators, comma-separated: count, stats (sum, mean, min, max), modsum (sum of
    /// (x * k) mod m), stddev (population and sample), normalize (sums of z-score and
    /// min-max normalized values), gram (AᵀA and its determinant), digits (frequency of
    /// 0-9), entropy (Shannon, bits); or all.
    pub ops: String,
    /// Files, directories (every file below) or globs (`/logs/*.csv`; `locus://` allowed).
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// Numeric columns: header names, ranges such as c0..c7, or 1-based positions _1, _2.
    #[arg(long, default_value = "")]
    pub columns: String,
    /// A column whose text digits and entropy count (default: the file's raw bytes).
    #[arg(long)]
    pub text_column: Option<String>,
    /// The factor k of modsum.
    #[arg(long, default_value_t = 1.0)]
    pub k: f64,
    /// The modulus m of modsum.
    #[arg(long, default_value_t = 10.0)]
    pub m: f64,
    /// Field delimiter (one ASCII character).
    #[arg(long, default_value = ",")]
    pub delimiter: String,
    /// Quote character (one ASCII character).
    #[arg(long, default_value = "\"")]
    pub quote: String,
    /// Quotes are plain characters (no RFC 4180 quoting).
    #[arg(long)]
    pub no_quoting: bool,
    /// The first line is data, not a header naming the columns.
    #[arg(long)]
    pub no_header: bool,
    /// Blocks computed at once (default: two per live worker).
    #[arg(long, default_value_t = 0)]
    pub parallelism: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn one_byte(s: &str, what: &str) -> Result<u32> {
    match s.as_bytes() {
        [b] if b.is_ascii() => Ok(u32::from(*b)),
        _ => Err(Error::invalid(format!("--{what} must be one ASCII character, not {s:?}")).into()),
    }
}

pub async fn run(c: &Client, a: &ComputeArgs) -> Result<()> {
    let job = ComputeJob {
        request: Request {
            ops: locus_compute::parse_ops(&a.ops)?,
            columns: a.columns.clone(),
            text_column: a.text_column.clone(),
            k: a.k,
            m: a.m,
            csv: pb::CsvFormat {
                delimiter: one_byte(&a.delimiter, "delimiter")?,
                quote: one_byte(&a.quote, "quote")?,
                no_quoting: a.no_quoting,
                header: !a.no_header,
            },
        },
        parallelism: a.parallelism,
    };
    let files = c.expand_paths(&a.paths).await?;
    let bar = indicatif::ProgressBar::new(files.iter().map(|f| f.length).sum());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap(),
    );
    let out = c.compute_files(files, &job, |n| bar.inc(n)).await?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let r = &out.results;
    println!(
        "{} file(s), {} block(s), {} scanned on workers, {} returned, {} row(s), {:.3} s",
        r.files,
        r.blocks,
        human(r.bytes_scanned),
        human(out.bytes_returned),
        r.rows,
        out.seconds
    );
    let v = serde_json::to_value(r)?;
    for op in locus_compute::spec::ALL_OPS {
        let name = locus_compute::spec::op_name(op);
        if let Some(x) = v.get(name) {
            println!("{name}: {}", serde_json::to_string(x)?);
        }
    }
    Ok(())
}
