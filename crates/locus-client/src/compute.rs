//! Near-data compute from the caller's side: the paths expanded to files, the work
//! planned per block, each block's partial computed by the worker that holds it (or,
//! for a block no worker holds, by the worker placement picks, which fills it as it
//! computes), and the partials merged here ([`locus_compute::Merger`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use futures::Stream;
use locus_common::{Error, ErrorKind, Result};
use locus_compute::merge::scan_and_merge;
use locus_compute::{Request, Results};
use locus_proto::{exchange, pb, read_response, send_request};
use prost::Message;

use crate::Client;

/// What to compute ([`Client::compute`]).
#[derive(Clone, Debug, Default)]
pub struct ComputeJob {
    pub request: Request,
    /// Blocks computed at once (0: four per live worker, at least 8: enough fills from the UFS in
    /// flight to keep a link busy while each block is committed to the cache).
    pub parallelism: usize,
}

/// The results and what they cost.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ComputeOutcome {
    #[serde(flatten)]
    pub results: Results,
    /// Bytes of partial results that came back from workers.
    pub bytes_returned: u64,
    pub seconds: f64,
    /// Blocks computed again because they started inside a quoted field.
    pub blocks_rerun: u64,
}

/// A piece of a SQL plan fragment's answer ([`Client::run_fragment`]).
#[derive(Debug)]
pub enum FragmentPiece {
    /// The next bytes of the result's Arrow IPC stream.
    Ipc(Vec<u8>),
    /// The end: bytes of Locus files the fragment's scans read on the worker.
    Done { scanned: u64 },
}

impl Client {
    /// Run partition `partition` of the SQL plan fragment `plan` (DataFusion's physical
    /// plan protobuf) on the worker at `addr`: its answer, piece by piece, ending with
    /// [`FragmentPiece::Done`]. Dropping the stream hangs up, which stops the worker.
    pub async fn run_fragment(
        &self,
        addr: &str,
        plan: Vec<u8>,
        partition: u32,
    ) -> Result<impl Stream<Item = Result<FragmentPiece>> + Send + 'static> {
        let mut c = self.conn(addr).await?;
        let req = pb::SqlFragmentRequest { plan, partition };
        send_request(&mut c, pb::data_request::Req::Fragment(req)).await?;
        Ok(futures::stream::try_unfold(Some(c), |c| async move {
            let Some(mut c) = c else { return Ok(None) };
            let r = read_response(&mut c).await?;
            Ok(Some(if r.done {
                (FragmentPiece::Done { scanned: r.scanned }, None)
            } else {
                (FragmentPiece::Ipc(r.ipc), Some(c))
            }))
        }))
    }

    /// The files that `paths` name: a file, every file under a directory, or the files a
    /// glob (`*`, `?`, `[...]` in the last components) matches; `locus://` is allowed in
    /// front. In path order, without repeats.
    pub async fn expand_paths(&self, paths: &[String]) -> Result<Vec<pb::FileInfo>> {
        let mut out: Vec<pb::FileInfo> = Vec::new();
        let mut seen = HashSet::new();
        for p in paths {
            let p = p.strip_prefix("locus://").unwrap_or(p);
            let mut found = Vec::new();
            // A name with glob characters that exists is itself, not a pattern.
            let literal = match self.status(p, false).await {
                Ok(st) => Some(st),
                Err(e) if e.kind() == ErrorKind::NotFound || e.kind() == ErrorKind::InvalidArgument => None,
                Err(e) => return Err(e),
            };
            if literal.is_none() && p.contains(['*', '?', '[']) {
                let pat = glob::Pattern::new(p).map_err(|e| Error::invalid(format!("bad glob '{p}': {e}")))?;
                // List from the deepest directory without wildcards.
                let fixed: Vec<&str> = p.split('/').take_while(|c| !c.contains(['*', '?', '['])).collect();
                let base = if fixed.len() <= 1 { "/".to_string() } else { fixed.join("/") };
                let deep = p.split('/').count() > fixed.len() + 1;
                let opts = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
                self.list_each(&base, deep, |e| {
                    if !e.is_dir && pat.matches_with(&e.path, opts) {
                        found.push(e.path.clone());
                    }
                })
                .await?;
                if found.is_empty() {
                    return Err(Error::not_found(format!("no file matches {p}")));
                }
            } else {
                let st = match literal {
                    Some(st) => st,
                    None => self.status(p, false).await?,
                };
                if st.is_dir {
                    self.list_each(p, true, |e| {
                        if !e.is_dir {
                            found.push(e.path.clone());
                        }
                    })
                    .await?;
                } else {
                    found.push(st.path.clone());
                }
            }
            found.sort();
            for f in found {
                if seen.insert(f.clone()) {
                    out.push(self.status(&f, true).await?);
                }
            }
        }
        Ok(out)
    }

    /// The header of a delimited text file: its first record's fields.
    pub async fn csv_header(&self, fi: &pb::FileInfo, csv: &pb::CsvFormat) -> Result<Vec<String>> {
        let want = fi.length.min(locus_compute::spec::HEADER_BYTES);
        let mut buf = Vec::new();
        self.read_to(fi, 0, want, Default::default(), &mut buf).await?;
        locus_compute::header_fields(&buf, want == fi.length, csv, &fi.path)
    }

    /// Run `job` over the files `paths` name ([`Client::expand_paths`]).
    pub async fn compute(&self, paths: &[String], job: &ComputeJob) -> Result<ComputeOutcome> {
        let files = self.expand_paths(paths).await?;
        self.compute_files(files, job, |_| {}).await
    }

    /// Run `job` over `files` (with their blocks), on the workers that hold the blocks.
    /// `progress` gets the bytes of each block as it completes.
    pub async fn compute_files(
        &self,
        files: Vec<pb::FileInfo>,
        job: &ComputeJob,
        progress: impl Fn(u64) + Send + Sync,
    ) -> Result<ComputeOutcome> {
        let t = Instant::now();
        let req = &job.request;
        let header = match (req.csv.header, files.iter().find(|f| f.length > 0)) {
            (true, Some(f)) => Some(self.csv_header(f, &req.csv).await?),
            _ => None,
        };
        let plan = req.plan(header.as_deref())?;
        let spec = &plan.spec;
        let mut merger = plan.merger();
        let parallelism = match job.parallelism {
            0 => (self.workers(false).await?.len() * 4).max(8),
            n => n,
        };
        let returned = Arc::new(AtomicU64::new(0));
        // Every block of every file, computed concurrently; merged file by file, in order.
        let names: Vec<(&str, Vec<u64>)> =
            files.iter().map(|fi| (fi.path.as_str(), fi.blocks.iter().map(|b| b.offset).collect())).collect();
        let blocks_rerun =
            scan_and_merge(&mut merger, &names, plan.resolved.quoting, parallelism, |f, b, in_quotes| {
                let (fi, returned, progress) = (&files[f], &returned, &progress);
                async move {
                    let p = self.compute_block(fi, b, spec, in_quotes, returned).await?;
                    if !in_quotes {
                        progress(fi.blocks[b].length); // the first scan of a block, not a rescan
                    }
                    Ok(p)
                }
            })
            .await?;
        Ok(ComputeOutcome {
            results: merger.finish(),
            bytes_returned: returned.load(Relaxed),
            seconds: t.elapsed().as_secs_f64(),
            blocks_rerun,
        })
    }

    /// One block's partial: from a worker holding it (this host's first), else from the
    /// worker placement picks for it; another worker if that one fails.
    async fn compute_block(
        &self,
        fi: &pb::FileInfo,
        index: usize,
        spec: &pb::ComputeSpec,
        in_quotes: bool,
        returned: &AtomicU64,
    ) -> Result<pb::ComputePartial> {
        let b = &fi.blocks[index];
        let mut failed: HashSet<u64> = HashSet::new();
        let mut last_err = None;
        for _ in 0..4 {
            let workers = self.workers(!failed.is_empty()).await?;
            let live: Vec<&pb::WorkerAddress> = workers.iter().filter(|w| !failed.contains(&w.worker_id)).collect();
            let mut holders = Vec::new();
            for w in live.iter().filter(|w| b.locations.iter().any(|l| l.worker_id == w.worker_id)) {
                holders.push(((!self.is_local(w).await) as u8, (*w).clone()));
            }
            holders.sort_by_key(|h| (h.0, h.1.worker_id));
            let w = match holders.into_iter().next() {
                Some((_, w)) => w,
                None if live.is_empty() => {
                    return Err(last_err.unwrap_or_else(|| Error::unavailable("no live workers")));
                }
                // Spread the uncached blocks over every worker: each fills its share,
                // where a reader would fill it.
                None => crate::fill_worker(b.block_id, live.iter().copied()).expect("not empty").clone(),
            };
            let req = pb::ComputeBlockRequest {
                block: Some(crate::read::whole_block(fi, b)),
                spec: Some(spec.clone()),
                in_quotes,
                file_start: index == 0,
            };
            let mut c = self.conn(&w.data_address).await?;
            match exchange(&mut c, pb::data_request::Req::Compute(req)).await {
                Ok(r) => {
                    self.put_conn(&w.data_address, c);
                    returned.fetch_add(r.encoded_len() as u64, Relaxed);
                    return r.partial.ok_or_else(|| Error::internal("a compute answer without a result"));
                }
                Err(e) if e.kind() == ErrorKind::Unavailable || e.kind() == ErrorKind::Io => {
                    tracing::debug!(worker = w.worker_id, error = %e, "compute failed on this worker; trying another");
                    failed.insert(w.worker_id);
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| Error::unavailable("no worker could compute the block")))
    }
}
