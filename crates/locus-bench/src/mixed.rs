//! `locus bench mixed`: the latency of small reads of cached files while other clients
//! write enough to keep the cache evicting. One worker has a small MEM tier over a small
//! SSD tier (in the scratch directory), both far smaller than what the writers write, so
//! every new block demotes an older one from MEM to SSD and evicts one from SSD. Readers
//! read whole small files, already cached, back to back; each read is timed. The same
//! reads run twice, first alone (the floor), then during the writes; the p50 and p99 of
//! both are printed side by side with their ratio, one line per figure.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use bytesize::ByteSize;
use locus_client::{Client, PutOptions, ReadOptions};
use locus_cluster::LocalCluster;
use locus_common::config::{ClientConfig, TierAlias, TierConfig, WriteType};
use locus_common::{Error, Result};
use locus_proto::pb;
use serde::Serialize;

use crate::{ClientRuntime, loopback_config, machine, percentile, with_cluster};

/// What `locus bench mixed` needs (its flags).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct MixedBench {
    /// Concurrent readers.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Cached files the readers read (round robin, one whole file per read).
    #[arg(long, default_value_t = 32)]
    pub files: usize,
    /// Size of each read file, so of each read.
    #[arg(long, default_value = "64KiB")]
    pub read_size: ByteSize,
    /// Concurrent writers during the second phase.
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Size of each written file (CACHE_THROUGH, to the local UFS); each writer keeps its
    /// latest files until it has twice the cache, then deletes its oldest.
    #[arg(long, default_value = "8MiB")]
    pub write_size: ByteSize,
    /// MEM tier quota (the top tier, in /dev/shm).
    #[arg(long, default_value = "32MiB")]
    pub mem: ByteSize,
    /// SSD tier quota (in the scratch directory, under the system's temp dir).
    #[arg(long, default_value = "64MiB")]
    pub ssd: ByteSize,
    /// Block size of every file.
    #[arg(long, default_value = "1MiB")]
    pub block_size: ByteSize,
    /// Seconds each phase lasts (reads alone, then reads during writes).
    #[arg(long, default_value_t = 6.0)]
    pub seconds: f64,
    /// The cluster's data dir (set by the CLI to a fresh scratch directory).
    #[arg(skip)]
    #[serde(skip)]
    pub work_dir: std::path::PathBuf,
}

/// One figure, measured alone and during the writes.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub alone: f64,
    pub with_writes: f64,
    /// with_writes / alone.
    pub ratio: f64,
}

/// What one phase measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    /// Read latencies, milliseconds.
    #[serde(skip)]
    pub latencies_ms: Vec<f64>,
    pub reads: usize,
    pub seconds: f64,
    pub bytes_written: u64,
    /// Blocks the worker demoted or dropped during the phase.
    pub evictions: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MixedResult {
    pub figures: Vec<Figure>,
    pub alone: Phase,
    pub with_writes: Phase,
    /// Blocks of the read files no longer cached after the writes (a read of them went
    /// to the UFS: the floor no longer holds).
    pub read_blocks_evicted: usize,
}

impl MixedBench {
    pub async fn run(&self) -> Result<MixedResult> {
        if self.readers == 0 || self.files == 0 || self.seconds <= 0.0 {
            return Err(Error::invalid("--readers, --files and --seconds must be positive"));
        }
        let mut cfg = loopback_config();
        cfg.master.block_size = self.block_size;
        // LocalCluster puts each worker's tiers in <dir>/w<i>.
        cfg.worker.tiers = vec![
            TierConfig { alias: TierAlias::Mem, dir: locus_cluster::default_mem_dir(&self.work_dir), quota: self.mem },
            TierConfig { alias: TierAlias::Ssd, dir: self.work_dir.join("ssd"), quota: self.ssd },
        ];
        with_cluster(cfg, &self.work_dir, false, async |c| self.measure(c).await).await
    }

    async fn measure(&self, cluster: &LocalCluster) -> Result<MixedResult> {
        let worker = cluster.worker(0).ok_or_else(|| Error::internal("no worker"))?;
        let rt = ClientRuntime::new(2)?;
        let client = {
            let _g = rt.get().enter();
            Arc::new(cluster.client(ClientConfig::default())?)
        };
        let files = self.write_read_set(&client).await?;
        let mut phases = Vec::new();
        for writes in [false, true] {
            let before = worker.store().evictions();
            let mut p = self.phase(rt.get(), &client, &files, writes).await?;
            p.evictions = worker.store().evictions() - before;
            eprintln!(
                "{}: {} reads in {:.1}s, {} written, {} evictions",
                if writes { "reads during writes" } else { "reads alone" },
                p.reads,
                p.seconds,
                ByteSize::b(p.bytes_written).display().iec(),
                p.evictions
            );
            phases.push(p);
        }
        let mut read_blocks_evicted = 0;
        for fi in files.iter() {
            let now = client.status(&fi.path, true).await?;
            read_blocks_evicted += now.blocks.iter().filter(|b| b.locations.is_empty()).count();
        }
        let with_writes = phases.pop().expect("two phases");
        let alone = phases.pop().expect("two phases");
        let figures = figures(&alone, &with_writes);
        Ok(MixedResult { figures, alone, with_writes, read_blocks_evicted })
    }

    /// Write the files the readers read, read each once and wait until all are cached.
    async fn write_read_set(&self, c: &Client) -> Result<Arc<Vec<pb::FileInfo>>> {
        let data = pattern(self.read_size.as_u64());
        let mut files = Vec::with_capacity(self.files);
        for i in 0..self.files {
            let path = format!("/mixed/read/f{i:05}");
            put(c, &path, &data).await?;
            let fi = c.status(&path, true).await?;
            c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut tokio::io::sink()).await?;
            files.push(path);
        }
        for _ in 0..200 {
            let mut infos = Vec::with_capacity(files.len());
            for p in &files {
                infos.push(c.status(p, true).await?);
            }
            if infos.iter().all(|fi| fi.blocks.iter().all(|b| !b.locations.is_empty())) {
                return Ok(Arc::new(infos));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::internal("the read files were not cached"))
    }

    /// Readers (and, with `writes`, writers) on the clients' runtime for `self.seconds`.
    async fn phase(
        &self,
        rt: &tokio::runtime::Runtime,
        c: &Arc<Client>,
        files: &Arc<Vec<pb::FileInfo>>,
        writes: bool,
    ) -> Result<Phase> {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        if writes {
            // Each writer's live files add up to twice the cache, so none is served from it
            // for long and every block written evicts another.
            let cache = self.mem.as_u64() + self.ssd.as_u64();
            let per_writer = self.write_size.as_u64().max(1) * self.writers.max(1) as u64;
            let keep = (2 * cache).div_ceil(per_writer).max(1) as usize;
            let data = pattern(self.write_size.as_u64());
            for w in 0..self.writers {
                let (c, stop, written, data) = (c.clone(), stop.clone(), written.clone(), data.clone());
                writers.push(rt.spawn(async move {
                    let path = |k: usize| format!("/mixed/write{w}/f{k:08}");
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        put(&c, &path(k), &data).await?;
                        written.fetch_add(data.len() as u64, Ordering::Relaxed);
                        if k >= keep {
                            c.delete(&path(k - keep), false).await?;
                        }
                        k += 1;
                    }
                    Ok::<_, Error>(())
                }));
            }
        }
        let start = Instant::now();
        let mut readers = Vec::new();
        for r in 0..self.readers {
            let (c, stop, files, n) = (c.clone(), stop.clone(), files.clone(), self.readers);
            readers.push(rt.spawn(async move {
                let mut lat = Vec::new();
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let fi = &files[i % files.len()];
                    let t = Instant::now();
                    let got = c.read_to(fi, 0, fi.length, ReadOptions::default(), &mut tokio::io::sink()).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    if got != fi.length {
                        return Err(Error::internal(format!("read {got} of {} bytes of {}", fi.length, fi.path)));
                    }
                    i += n;
                }
                Ok::<_, Error>(lat)
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(self.seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let mut latencies_ms = Vec::new();
        for t in readers {
            latencies_ms.extend(t.await.map_err(|e| Error::internal(format!("reader task: {e}")))??);
        }
        let seconds = start.elapsed().as_secs_f64();
        for t in writers {
            t.await.map_err(|e| Error::internal(format!("writer task: {e}")))??;
        }
        if latencies_ms.is_empty() {
            return Err(Error::internal("no read finished"));
        }
        let bytes_written = written.load(Ordering::Relaxed);
        Ok(Phase { reads: latencies_ms.len(), latencies_ms, seconds, bytes_written, evictions: 0 })
    }
}

/// Write `data` to `path` as CACHE_THROUGH: cached and in the UFS, so evictable.
async fn put(c: &Client, path: &str, data: &Bytes) -> Result<()> {
    let opts = PutOptions { overwrite: true, write_type: Some(WriteType::CacheThrough), ..Default::default() };
    c.put_with(path, &mut &data[..], &opts, |_| Ok(pb::ObjectMeta::default())).await?;
    Ok(())
}

/// `len` bytes of a fixed pattern.
fn pattern(len: u64) -> Bytes {
    Bytes::from((0..len).map(|i| (i * 2654435761 % 251) as u8).collect::<Vec<u8>>())
}

fn figures(alone: &Phase, mixed: &Phase) -> Vec<Figure> {
    let fig = |name: &str, unit: &str, a: f64, b: f64| Figure {
        name: name.into(),
        unit: unit.into(),
        alone: a,
        with_writes: b,
        ratio: b / a,
    };
    let (la, lm) = (&alone.latencies_ms, &mixed.latencies_ms);
    vec![
        fig("read p50", "ms", percentile(la, 0.5), percentile(lm, 0.5)),
        fig("read p99", "ms", percentile(la, 0.99), percentile(lm, 0.99)),
        fig("read max", "ms", percentile(la, 1.0), percentile(lm, 1.0)),
        fig("reads", "/s", la.len() as f64 / alone.seconds, lm.len() as f64 / mixed.seconds),
    ]
}

/// The result as text: a header line, then one line per figure (alone, during writes,
/// ratio), then the writers' rate and the evictions.
pub fn text(b: &MixedBench, r: &MixedResult) -> String {
    let mib = |n: u64| n as f64 / (1 << 20) as f64;
    let mut s = format!(
        "locus bench mixed: {} readers of {} cached files of {}; {} writers of {} files (CACHE_THROUGH); \
         MEM {} over SSD {}; blocks of {}; {:.1}s per phase. {}\n",
        b.readers,
        b.files,
        b.read_size.display().iec(),
        b.writers,
        b.write_size.display().iec(),
        b.mem.display().iec(),
        b.ssd.display().iec(),
        b.block_size.display().iec(),
        b.seconds,
        machine()
    );
    s.push_str(&format!("{:<16} {:>12} {:>14} {:>8}\n", "figure", "alone", "during writes", "ratio"));
    for f in &r.figures {
        let name = format!("{} ({})", f.name, f.unit);
        s.push_str(&format!("{name:<16} {:>12.3} {:>14.3} {:>8.2}\n", f.alone, f.with_writes, f.ratio));
    }
    let w = &r.with_writes;
    s.push_str(&format!("written (MiB/s)  {:>12} {:>14.1}\n", "-", mib(w.bytes_written) / w.seconds));
    s.push_str(&format!("evictions        {:>12} {:>14}\n", r.alone.evictions, w.evictions));
    s.push_str(&format!("read blocks evicted by the writes: {}\n", r.read_blocks_evicted));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_put_the_two_phases_side_by_side() {
        let alone = Phase { latencies_ms: vec![1.0, 2.0, 3.0], reads: 3, seconds: 1.0, ..Default::default() };
        let mixed = Phase { latencies_ms: vec![2.0, 4.0, 6.0, 8.0], reads: 4, seconds: 2.0, ..Default::default() };
        let f = figures(&alone, &mixed);
        assert_eq!(f[0].name, "read p50");
        assert_eq!((f[0].alone, f[0].with_writes, f[0].ratio), (2.0, 6.0, 3.0));
        assert_eq!((f[2].alone, f[2].with_writes), (3.0, 8.0));
        assert_eq!((f[3].alone, f[3].with_writes), (3.0, 2.0));
    }
}
