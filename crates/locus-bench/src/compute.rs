//! `locus bench compute-host`: the near-data operators run on the host, the plain way a
//! client without Locus would: every object under a prefix pulled from the S3 store with
//! OpenDAL ([`Ufs`]) and fed through the same [`BlockScanner`] and [`Merger`] the workers
//! and the caller of `locus fs compute` use, in this one process, no cluster. Each object
//! is cut into ranges of `block_size` bytes, read and scanned `parallelism` at a time, and
//! merged as a file's blocks are (the records across range edges joined by the merger).
//!
//! With `read_only`, the same ranges are read the same way and thrown away: the plain
//! read of the objects that a cold `locus fs compute` is measured against.
//!
//! The output has the shape of `locus fs compute --json` (the results, flattened), plus
//! `bytes_read`: the object bytes that crossed the client's link.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use locus_common::{Error, Result};
use locus_compute::merge::scan_and_merge;
use locus_compute::{BlockScanner, Request, Results, pb};
use locus_ufs::Ufs;
use serde::Serialize;

use crate::MinioTarget;

/// Bytes handed to the scanner at once (as the worker does).
const PIECE: usize = 4 << 20;

/// What `compute-host` runs.
#[derive(Clone, Debug)]
pub struct HostCompute {
    pub minio: MinioTarget,
    /// Every object directly under this prefix (a "directory" of the bucket).
    pub prefix: String,
    /// Operators (`locus_compute::parse_ops`); ignored with `read_only`.
    pub ops: String,
    pub columns: String,
    pub text_column: Option<String>,
    pub k: f64,
    pub m: f64,
    /// The files have no header.
    pub no_header: bool,
    /// Ranges read and scanned at once.
    pub parallelism: usize,
    /// The size of a range (as a Locus block).
    pub block_size: u64,
    /// Read the ranges, compute nothing.
    pub read_only: bool,
}

/// The results (as `locus fs compute --json` prints them) and what they cost.
#[derive(Clone, Debug, Serialize)]
pub struct HostOutcome {
    #[serde(flatten)]
    pub results: Option<Results>,
    /// Object bytes read from the store.
    pub bytes_read: u64,
    pub objects: u64,
    pub seconds: f64,
    pub read_only: bool,
    /// Ranges scanned again because they started inside a quoted field.
    pub blocks_rerun: u64,
}

struct Object {
    key: String,
    length: u64,
}

impl HostCompute {
    pub async fn run(&self) -> Result<HostOutcome> {
        let ufs =
            Ufs::new(&format!("s3://{}", self.minio.bucket), &self.minio.mount_options(), Duration::from_secs(300))?;
        let t = Instant::now();
        let prefix = self.prefix.trim_matches('/').to_string();
        let mut objects: Vec<Object> = ufs
            .list(&prefix)
            .await?
            .try_filter_map(|s| {
                let prefix = prefix.clone();
                async move {
                    Ok((!s.is_dir).then(|| Object {
                        key: if prefix.is_empty() { s.path.clone() } else { format!("{prefix}/{}", s.path) },
                        length: s.length,
                    }))
                }
            })
            .try_collect()
            .await?;
        if objects.is_empty() {
            return Err(Error::not_found(format!("no objects under s3://{}/{prefix}", self.minio.bucket)));
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        let bytes_read = Arc::new(AtomicU64::new(0));
        let block = self.block_size.max(1);
        let ranges: Vec<(usize, usize)> = objects
            .iter()
            .enumerate()
            .flat_map(|(o, ob)| (0..ob.length.div_ceil(block).max(1) as usize).map(move |b| (o, b)))
            .collect();
        let parallelism = self.parallelism.max(1);
        if self.read_only {
            let mut s = futures::stream::iter(ranges.iter().map(|&(o, b)| {
                let (ufs, ob, n) = (&ufs, &objects[o], bytes_read.clone());
                async move {
                    let (off, len) = range(ob.length, block, b);
                    let mut s = Box::pin(ufs.read_range(&ob.key, off, len, 8 << 20, 2).await?);
                    while let Some(c) = s.next().await {
                        n.fetch_add(c?.len() as u64, Relaxed);
                    }
                    Ok::<_, Error>(())
                }
            }))
            .buffer_unordered(parallelism);
            while let Some(r) = s.next().await {
                r?;
            }
            return Ok(HostOutcome {
                results: None,
                bytes_read: bytes_read.load(Relaxed),
                objects: objects.len() as u64,
                seconds: t.elapsed().as_secs_f64(),
                read_only: true,
                blocks_rerun: 0,
            });
        }

        // The plan, as the caller of `locus fs compute` makes it: the header of the
        // first non-empty object names the columns.
        let req = Request {
            ops: locus_compute::parse_ops(&self.ops)?,
            columns: self.columns.clone(),
            text_column: self.text_column.clone(),
            k: self.k,
            m: self.m,
            csv: pb::CsvFormat { header: !self.no_header, ..Default::default() },
        };
        let header = match (req.csv.header, objects.iter().find(|o| o.length > 0)) {
            (true, Some(o)) => Some(header_of(&ufs, o, &req.csv).await?),
            _ => None,
        };
        let plan = req.plan(header.as_deref())?;
        let resolved = Arc::new(plan.resolved.clone());
        let mut merger = plan.merger();

        let scan = |o: usize, b: usize, in_quotes: bool| {
            let (ufs, ob, r, n) = (&ufs, &objects[o], resolved.clone(), bytes_read.clone());
            async move {
                let (off, len) = range(ob.length, block, b);
                let mut sc = BlockScanner::new(&r, off, in_quotes, b == 0);
                let mut s = Box::pin(ufs.read_range(&ob.key, off, len, 8 << 20, 2).await?);
                let mut buf: Vec<u8> = Vec::with_capacity(PIECE);
                loop {
                    let next = s.next().await.transpose()?;
                    if let Some(c) = &next {
                        n.fetch_add(c.len() as u64, Relaxed);
                        buf.extend_from_slice(c);
                    }
                    if buf.len() >= PIECE || (next.is_none() && !buf.is_empty()) {
                        // The scan is CPU work: off the runtime's threads, as on a worker.
                        let piece = std::mem::replace(&mut buf, Vec::with_capacity(PIECE));
                        sc = tokio::task::spawn_blocking(move || {
                            sc.feed(&piece);
                            sc
                        })
                        .await
                        .map_err(|e| Error::internal(format!("scan task: {e}")))?;
                    }
                    if next.is_none() {
                        break;
                    }
                }
                Ok::<_, Error>(sc.finish())
            }
        };
        let files: Vec<(&str, Vec<u64>)> = objects
            .iter()
            .map(|ob| (ob.key.as_str(), (0..ob.length.div_ceil(block).max(1)).map(|b| b * block).collect()))
            .collect();
        let blocks_rerun = scan_and_merge(&mut merger, &files, resolved.quoting, parallelism, scan).await?;
        Ok(HostOutcome {
            results: Some(merger.finish()),
            bytes_read: bytes_read.load(Relaxed),
            objects: objects.len() as u64,
            seconds: t.elapsed().as_secs_f64(),
            read_only: false,
            blocks_rerun,
        })
    }
}

/// Range `b` of an object of `length` bytes cut into `block`-byte ranges: (offset, length).
fn range(length: u64, block: u64, b: usize) -> (u64, u64) {
    let off = b as u64 * block;
    (off, block.min(length.saturating_sub(off)))
}

/// The first record's fields (the header), from the first bytes of an object.
async fn header_of(ufs: &Ufs, o: &Object, csv: &pb::CsvFormat) -> Result<Vec<String>> {
    let want = o.length.min(locus_compute::spec::HEADER_BYTES);
    let mut s = Box::pin(ufs.read_range(&o.key, 0, want, want as usize, 1).await?);
    let mut buf = Vec::new();
    while let Some(c) = s.next().await {
        buf.extend_from_slice(&c?);
    }
    locus_compute::header_fields(&buf, want == o.length, csv, &o.key)
}

#[cfg(test)]
mod tests {
    use super::range;

    #[test]
    fn ranges_cover_an_object_once() {
        let (len, block): (u64, u64) = (10 * 64 + 7, 64);
        let n = len.div_ceil(block) as usize;
        let mut next = 0;
        for b in 0..n {
            let (off, l) = range(len, block, b);
            assert_eq!(off, next);
            assert!(l > 0 && l <= block);
            next = off + l;
        }
        assert_eq!(next, len);
        assert_eq!(range(0, 64, 0), (0, 0));
    }
}
