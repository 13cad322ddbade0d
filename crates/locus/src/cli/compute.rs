//! `locus fs compute OP PATH...`: the seed study's operators, run on the workers that
//! hold the blocks; only partial results come back.

use anyhow::Result;
use clap::Args;
use std::sync::Arc;

use futures::StreamExt;
use locus_client::{Client, ComputeJob};
use locus_common::Error;
use locus_compute::Request;
use locus_compute::normalize::{Method, Scale, normalize_csv};
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
    /// Blocks computed at once (default: four per live worker, at least 8).
    #[arg(long, default_value_t = 0)]
    pub parallelism: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// normalize: also write the normalized file(s) here, through the write pipeline: the
    /// records with the --columns replaced by their normalized values (a directory when
    /// several files are read; each keeps its name).
    #[arg(long)]
    pub out: Option<String>,
    /// normalize --out: zscore ((x - mean) / population std) or minmax ((x - min) / (max - min)).
    #[arg(long, default_value = "zscore")]
    pub method: String,
}

fn one_byte(s: &str, what: &str) -> Result<u32> {
    match s.as_bytes() {
        [b] if b.is_ascii() => Ok(u32::from(*b)),
        _ => Err(Error::invalid(format!("--{what} must be one ASCII character, not {s:?}")).into()),
    }
}

pub async fn run(c: &Arc<Client>, a: &ComputeArgs) -> Result<()> {
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
                ..Default::default()
            },
        },
        parallelism: a.parallelism,
    };
    let method = match &a.out {
        Some(_) if !job.request.ops.contains(&pb::ComputeOp::Normalize) => {
            return Err(Error::invalid("--out writes the normalized file: give the normalize operator").into());
        }
        Some(_) => Some(
            Method::parse(&a.method)
                .ok_or_else(|| Error::invalid(format!("unknown --method {:?} (zscore or minmax)", a.method)))?,
        ),
        None => None,
    };
    let files = c.expand_paths(&a.paths).await?;
    let written = files.clone();
    let bar = super::byte_bar(files.iter().map(|f| f.length).sum());
    let out = c.compute_files(files, &job, |n| bar.inc(n)).await?;
    bar.finish_and_clear();
    if let (Some(dest), Some(method)) = (&a.out, method) {
        write_normalized(c, &written, &job.request, &out.results, method, dest).await?;
    }
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

/// `--out`: each file's records with the chosen columns normalized by the merged
/// statistics `r`, written to `dest` (or `dest/NAME` for several files). The bytes stream
/// from the read through a blocking thread that rewrites them into the write; a failure
/// anywhere fails the write, so no partial file is left.
async fn write_normalized(
    c: &Arc<Client>,
    files: &[pb::FileInfo],
    req: &Request,
    r: &locus_compute::Results,
    method: Method,
    dest: &str,
) -> Result<()> {
    let header = match (req.csv.header, files.iter().find(|f| f.length > 0)) {
        (true, Some(f)) => Some(c.csv_header(f, &req.csv).await?),
        _ => None,
    };
    let plan = req.plan(header.as_deref())?;
    let stats = r.normalize.as_ref().ok_or_else(|| Error::internal("normalize gave no statistics"))?;
    let mut scales = Vec::new();
    for (col, name) in plan.spec.columns.iter().zip(&plan.names) {
        let s = &stats[name];
        let f = |k: &str| s.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let (a, b) = match method {
            Method::ZScore => (f("mean"), f("std_pop")),
            Method::MinMax => (f("min"), f("max") - f("min")),
        };
        scales.push(Scale { column: *col as usize, a, b });
    }
    for fi in files {
        let target =
            if files.len() == 1 { dest.to_string() } else { format!("{}/{}", dest.trim_end_matches('/'), fi.name) };
        let (in_tx, in_rx) = std::sync::mpsc::sync_channel::<std::io::Result<bytes::Bytes>>(8);
        let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Piece>(8);
        let (fmt, sc, name) = (req.csv, scales.clone(), fi.path.clone());
        let transform = tokio::task::spawn_blocking(move || {
            let w = ChannelWriter { tx: out_tx.clone() };
            let res = normalize_csv(ChannelReader { rx: in_rx, cur: bytes::Bytes::new() }, w, &fmt, &sc, &name);
            let _ = out_tx.blocking_send(match &res {
                Ok(_) => Piece::Done,
                Err(e) => Piece::Failed(e.to_string()),
            });
            res
        });
        let mut input = c.read_stream(fi.clone(), 0, fi.length, Default::default());
        let feed = async move {
            while let Some(b) = input.next().await {
                let item = b.map_err(std::io::Error::other);
                let stop = item.is_err();
                if in_tx.send(item).is_err() || stop {
                    break;
                }
            }
        };
        let mut reader = tokio_util::io::StreamReader::new(pieces(out_rx));
        let opts = locus_client::PutOptions { overwrite: true, ..Default::default() };
        let put = c.put_with(&target, &mut reader, &opts, |_| Ok(pb::ObjectMeta::default()));
        let (_, put, t) = tokio::join!(feed, put, transform);
        let records = t.map_err(|e| Error::internal(format!("normalize: {e}")))?;
        // Bad data is the user's error; else the write's own failure says more.
        let records = match records {
            Err(e) if e.kind() == locus_common::ErrorKind::InvalidArgument => return Err(e.into()),
            r => {
                put?;
                r?
            }
        };
        eprintln!("wrote {target}: {records} record(s), {:?} normalized", method);
    }
    Ok(())
}

/// What the rewriting thread hands the write.
enum Piece {
    Bytes(bytes::Bytes),
    Done,
    Failed(String),
}

/// The write's input: the pieces, ending cleanly only on `Done` (a thread that died or
/// failed fails the write).
fn pieces(
    rx: tokio::sync::mpsc::Receiver<Piece>,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin {
    Box::pin(futures::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Piece::Bytes(b)) => Some((Ok(b), Some(rx))),
            Some(Piece::Done) => None,
            Some(Piece::Failed(e)) => Some((Err(std::io::Error::other(e)), None)),
            None => Some((Err(std::io::Error::other("the normalizing thread ended early")), None)),
        }
    }))
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    cur: bytes::Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(b) => self.cur = b?,
                Err(_) => return Ok(0), // the read is complete
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Piece>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Piece::Bytes(bytes::Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::other("the write stopped"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
