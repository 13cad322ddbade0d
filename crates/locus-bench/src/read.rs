//! `locus bench read`: read throughput of one large file, every path side by side in
//! one run: direct UFS (MinIO through OpenDAL), Locus first read (cold cache), Locus
//! second read short-circuit, Locus second read forced remote, `cat` of a tmpfs copy,
//! `locus fs cat` into a pipe beside `cat` of the tmpfs copy into a pipe (the CLI as a
//! shell user runs it), and one loopback TCP stream carrying the same bytes (`iperf3 -P 1 -n SIZE`), every path
//! once per run, interleaved. Prints medians and ratios.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use futures::StreamExt;
use locus_client::ReadOptions;
use locus_common::config::{ClientConfig, Locality, TierAlias, TierConfig};
use locus_common::{Error, Result};
use locus_proto::pb;
use locus_ufs::Ufs;
use serde::Serialize;
use tokio::io::AsyncWrite;

use locus_cluster::LocalCluster;

use crate::{ClientRuntime, MinioTarget, loopback_config, machine, median, with_cluster};

/// What `locus bench read` needs.
#[derive(Clone, Debug)]
pub struct ReadBench {
    pub minio: MinioTarget,
    pub size: u64,
    pub runs: usize,
    pub block_size: u64,
    pub work_dir: PathBuf,
}

/// An output that copies every byte into a buffer, as a reader's `read()` would: a sink
/// that dropped bytes unseen could skip touching memory. The buffer is
/// 128 KiB, the size `cat` reads with, so every path feeds the same consumer.
struct CopySink {
    buf: Vec<u8>,
    pos: usize,
    total: u64,
}

impl CopySink {
    fn new() -> Self {
        CopySink { buf: vec![0u8; 128 << 10], pos: 0, total: 0 }
    }
}

impl AsyncWrite for CopySink {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let mut rest = data;
        while !rest.is_empty() {
            if self.pos == self.buf.len() {
                self.pos = 0;
            }
            let n = rest.len().min(self.buf.len() - self.pos);
            let p = self.pos;
            self.buf[p..p + n].copy_from_slice(&rest[..n]);
            self.pos += n;
            rest = &rest[n..];
        }
        self.total += data.len() as u64;
        Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[derive(Serialize)]
pub struct Row {
    pub name: String,
    pub seconds: Vec<f64>,
    pub median_s: f64,
    pub median_mib_s: f64,
    /// CPU time of the whole machine (every process and the kernel) per run, where measured.
    pub machine_cpu_s: Vec<f64>,
}

fn row(name: &str, size: u64, seconds: Vec<f64>) -> Row {
    let m = median(&seconds);
    Row {
        name: name.into(),
        median_mib_s: size as f64 / (1 << 20) as f64 / m,
        median_s: m,
        seconds,
        machine_cpu_s: Vec::new(),
    }
}

/// A [`row`] with the machine's CPU time of each run.
fn cpu_row(name: &str, size: u64, runs: Vec<(f64, f64)>) -> Row {
    let (seconds, cpu): (Vec<f64>, Vec<f64>) = runs.into_iter().unzip();
    Row { machine_cpu_s: cpu, ..row(name, size, seconds) }
}

/// CPU seconds the whole machine has spent so far (every process and the kernel: user,
/// nice, system, irq and softirq time from /proc/stat; not idle, I/O wait or steal). The
/// difference across a timed read tells how much CPU the read took of what the machine has.
fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy / hz
}

/// The seconds a timed read reports, with the machine's CPU time across it.
async fn with_machine_cpu(read: impl std::future::Future<Output = Result<f64>>) -> Result<(f64, f64)> {
    let c = machine_cpu_seconds();
    let secs = read.await?;
    Ok((secs, machine_cpu_seconds() - c))
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// Seconds for one loopback TCP stream (`iperf3 -P 1`, Debian's package) to carry `bytes`
/// (`-n`, the file's size, so it compares with a read of the file); with `file`, the
/// sender reads its data from that file (`-F`) instead of one cached buffer.
fn iperf3_single_stream(file: Option<&std::path::Path>, bytes: u64) -> Result<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::io("pick a port for iperf3", e))?
        .port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| Error::io("run iperf3 (apt-get install -y iperf3)", e))?;
    // The client starts once the server listens (at most 5 s). Not probed by connecting:
    // the one-shot server would take the probe for its test.
    let listen = format!(":{port:04X} 00000000:0000 0A");
    for _ in 0..100 {
        if std::fs::read_to_string("/proc/net/tcp").is_ok_and(|t| t.contains(&listen)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut cmd = Command::new("iperf3");
    cmd.args(["-c", "127.0.0.1", "-p", &port.to_string(), "-P", "1", "-J", "-n", &bytes.to_string()]);
    if let Some(f) = file {
        cmd.arg("-F").arg(f);
    }
    let out = cmd.output();
    if !out.as_ref().is_ok_and(|o| o.status.success()) {
        // A one-shot server that never got its test would wait for good.
        let _ = server.kill();
    }
    let _ = server.wait();
    let out = out.map_err(|e| Error::io("run iperf3", e))?;
    let j: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| Error::internal(format!("iperf3 output: {e}")))?;
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .ok_or_else(|| Error::internal(format!("iperf3 gave no result: {}", String::from_utf8_lossy(&out.stdout))))?;
    Ok(bytes as f64 * 8.0 / bps)
}

async fn drain(ufs: &Ufs, key: &str, size: u64) -> Result<u64> {
    let mut s = Box::pin(ufs.read_range(key, 0, size, 8 << 20, 4).await?);
    let mut sink = CopySink::new();
    while let Some(b) = s.next().await {
        let b = b?;
        tokio::io::AsyncWriteExt::write_all(&mut sink, &b).await.map_err(|e| Error::io("count", e))?;
    }
    Ok(sink.total)
}

impl ReadBench {
    pub async fn run(&self) -> Result<(Vec<Row>, BTreeMap<String, f64>)> {
        let key = format!("bench-{}.bin", self.size);
        let opts = self.minio.mount_options();
        let ufs = Ufs::new(&format!("s3://{}", self.minio.bucket), &opts, Duration::from_secs(120))?;
        ufs.check().await?;
        // The test file: random bytes, written once, and a tmpfs copy for `cat`.
        let shm = PathBuf::from(format!("/dev/shm/locus-bench-{}", std::process::id()));
        std::fs::create_dir_all(&shm).map_err(|e| Error::io("create tmpfs dir", e))?;
        let tmpfs_copy = shm.join(&key);
        {
            use rand::RngCore;
            let mut w = ufs.writer(&key, "", &Default::default()).await?;
            let mut f = std::fs::File::create(&tmpfs_copy).map_err(|e| Error::io("create tmpfs copy", e))?;
            let mut rng = rand::rng();
            let mut left = self.size;
            while left > 0 {
                let mut chunk = vec![0u8; left.min(16 << 20) as usize];
                rng.fill_bytes(&mut chunk);
                std::io::Write::write_all(&mut f, &chunk).map_err(|e| Error::io("write tmpfs copy", e))?;
                left -= chunk.len() as u64;
                w.write(chunk.into()).await?;
            }
            w.close().await?;
        }
        let mut cfg = loopback_config();
        cfg.master.block_size = ByteSize::b(self.block_size);
        cfg.worker.tiers = vec![TierConfig {
            alias: TierAlias::Mem,
            dir: shm.join("mem"),
            quota: ByteSize::b(self.size * 2 + (256 << 20)),
        }];
        let result =
            with_cluster(cfg, &self.work_dir, false, async |c| self.measure(c, &ufs, &key, &opts, &tmpfs_copy).await)
                .await;
        let _ = ufs.delete(&key, false).await;
        let _ = std::fs::remove_dir_all(&shm);
        result
    }

    async fn measure(
        &self,
        cluster: &LocalCluster,
        ufs: &Ufs,
        key: &str,
        opts: &BTreeMap<String, String>,
        tmpfs_copy: &std::path::Path,
    ) -> Result<(Vec<Row>, BTreeMap<String, f64>)> {
        let local = cluster.client(ClientConfig::default())?;
        // The timed Locus reads run on a runtime of their own (see ClientRuntime).
        let client_rt = ClientRuntime::new(1)?;
        let client_rt = client_rt.get();
        let reader = |locality| -> Result<Arc<locus_client::Client>> {
            let _rt = client_rt.enter();
            Ok(Arc::new(cluster.client(ClientConfig { locality, ..Default::default() })?))
        };
        let (local_reader, remote_reader) = (reader(Locality::Auto)?, reader(Locality::Remote)?);
        local
            .mount(pb::MountRequest {
                path: "/bench".into(),
                uri: format!("s3://{}", self.minio.bucket),
                options: opts.clone().into_iter().collect(),
                ..Default::default()
            })
            .await?;
        let path = format!("/bench/{key}");
        let size = self.size;
        let mut direct = Vec::new();
        let mut first = Vec::new();
        let mut short = Vec::new();
        let mut remote_t = Vec::new();
        let mut cat = Vec::new();
        let (mut cli_pipe, mut cat_pipe) = (Vec::new(), Vec::new());
        // `locus fs cat` is this very binary's CLI, run as a shell user would, into a pipe.
        let exe = std::env::current_exe().map_err(|e| Error::io("find the locus binary", e))?;
        let cli_cat = format!(
            "'{}' --master {} --token-file '{}' fs cat '{path}' | cat > /dev/null",
            exe.display(),
            cluster.master_address(),
            cluster.security().token_file.display()
        );
        let pipe_floor = format!("cat '{}' | cat > /dev/null", tmpfs_copy.display());
        // iperf3 runs in the same loop, with the file's size, so the network yardstick is a
        // median of as many samples taken under the same noise as the reads it judges.
        let (mut iperf, mut iperf_file) = (Some(Vec::new()), Some(Vec::new()));
        // Interleave the paths run by run, so background noise hits all of them alike.
        for run in 0..self.runs {
            eprintln!("run {}/{}", run + 1, self.runs);
            direct.push(
                with_machine_cpu(async {
                    let t = Instant::now();
                    let n = drain(ufs, key, size).await?;
                    if n != size {
                        return Err(Error::internal("short direct read"));
                    }
                    Ok(t.elapsed().as_secs_f64())
                })
                .await?,
            );
            local.free(&path, false).await?;
            wait_uncached(&local, &path).await?;
            first.push(with_machine_cpu(timed_read(client_rt, &local_reader, &path, size)).await?);
            wait_cached(&local, &path).await?;
            short.push(with_machine_cpu(timed_read(client_rt, &local_reader, &path, size)).await?);
            remote_t.push(with_machine_cpu(timed_read(client_rt, &remote_reader, &path, size)).await?);
            let (st, secs) = timed(|| {
                Command::new("sh").arg("-c").arg(format!("cat '{}' > /dev/null", tmpfs_copy.display())).status()
            });
            st.map_err(|e| Error::io("cat", e))?;
            cat.push(secs);
            for (cmd, samples) in [(&cli_cat, &mut cli_pipe), (&pipe_floor, &mut cat_pipe)] {
                let (st, secs) = timed(|| Command::new("sh").arg("-c").arg(cmd).status());
                let st = st.map_err(|e| Error::io("sh", e))?;
                if !st.success() {
                    return Err(Error::internal(format!("`{cmd}` failed: {st}")));
                }
                samples.push(secs);
            }
            for (samples, file) in [(&mut iperf, None), (&mut iperf_file, Some(tmpfs_copy))] {
                if let Some(v) = samples {
                    match iperf3_single_stream(file, size) {
                        Ok(secs) => v.push(secs),
                        Err(e) => {
                            eprintln!("iperf3 left out: {e}");
                            *samples = None;
                        }
                    }
                }
            }
        }
        let mut ratios = BTreeMap::new();
        let mut rows = vec![
            cpu_row("direct UFS read (MinIO via OpenDAL)", size, direct),
            cpu_row("Locus first read (cold)", size, first),
            cpu_row("Locus second read, short-circuit", size, short),
            cpu_row("Locus second read, forced remote", size, remote_t),
            row("cat of a tmpfs copy", size, cat),
            row("locus fs cat, piped into cat (the CLI)", size, cli_pipe),
            row("cat of the tmpfs copy, piped into cat", size, cat_pipe),
        ];
        ratios.insert("fs cat pipe / cat pipe (goal >= 0.80)".into(), rows[5].median_mib_s / rows[6].median_mib_s);
        ratios.insert("short_circuit / tmpfs cat (goal >= 0.80)".into(), rows[2].median_mib_s / rows[4].median_mib_s);
        ratios.insert("first read time / direct time (goal <= 1.05)".into(), rows[1].median_s / rows[0].median_s);
        ratios.insert("second read speed-up over direct".into(), rows[0].median_s / rows[2].median_s);
        // On loopback the UFS costs only CPU: how much more of it a cold read through the
        // cache takes than a direct read, and how busy the direct read keeps the machine.
        let cpu = |r: &Row| median(&r.machine_cpu_s);
        ratios.insert("first read machine CPU / direct machine CPU".into(), cpu(&rows[1]) / cpu(&rows[0]));
        ratios.insert("cores busy during the direct read".into(), cpu(&rows[0]) / rows[0].median_s);
        if let Some(v) = iperf {
            let it = row("iperf3 -P 1 loopback, same bytes", size, v);
            let r = it.median_mib_s;
            rows.push(it);
            ratios.insert("forced remote / iperf3 (goal >= 0.80)".into(), rows[3].median_mib_s / r);
        }
        if let Some(v) = iperf_file {
            let it = row("iperf3 -P 1 -F <tmpfs copy> loopback (file-sourced stream)", size, v);
            let r = it.median_mib_s;
            rows.push(it);
            ratios.insert("forced remote / iperf3 -F (file-sourced stream)".into(), rows[3].median_mib_s / r);
        }
        Ok((rows, ratios))
    }
}

/// Seconds to stat and read the whole file with `c`, on the client's own runtime.
async fn timed_read(rt: &tokio::runtime::Runtime, c: &Arc<locus_client::Client>, path: &str, size: u64) -> Result<f64> {
    let (c, path) = (c.clone(), path.to_string());
    rt.spawn(async move {
        let t = Instant::now();
        let fi = c.status(&path, true).await?;
        let mut sink = CopySink::new();
        let n = c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut sink).await?;
        if n != size || sink.total != size {
            return Err(Error::internal(format!("read {n} bytes, expected {size}")));
        }
        Ok(t.elapsed().as_secs_f64())
    })
    .await
    .map_err(|e| Error::internal(format!("client task: {e}")))?
}

async fn wait_uncached(c: &locus_client::Client, path: &str) -> Result<()> {
    for _ in 0..200 {
        if c.status(path, true).await?.blocks.iter().all(|b| b.locations.is_empty()) {
            // the worker drops the blocks on its next heartbeat
            tokio::time::sleep(Duration::from_millis(1500)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(Error::internal("blocks were not freed"))
}

async fn wait_cached(c: &locus_client::Client, path: &str) -> Result<()> {
    for _ in 0..200 {
        if c.status(path, true).await?.blocks.iter().all(|b| !b.locations.is_empty()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(Error::internal("blocks were not cached after a read"))
}

/// Render the result as a Markdown table with the machine facts.
pub fn markdown(b: &ReadBench, rows: &[Row], ratios: &BTreeMap<String, f64>) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "File {} ({} blocks of {}), {} runs per path, medians. {} UFS: {}.\n\n",
        ByteSize::b(b.size).display().iec(),
        b.size.div_ceil(b.block_size),
        ByteSize::b(b.block_size).display().iec(),
        b.runs,
        machine(),
        b.minio.network
    ));
    s.push_str("| path | median s | median MiB/s | machine CPU s (median) | runs (s) |\n|---|---|---|---|---|\n");
    for r in rows {
        let runs: Vec<String> = r.seconds.iter().map(|x| format!("{x:.3}")).collect();
        let cpu = if r.machine_cpu_s.is_empty() { "-".to_string() } else { format!("{:.2}", median(&r.machine_cpu_s)) };
        s.push_str(&format!(
            "| {} | {:.3} | {:.0} | {cpu} | {} |\n",
            r.name,
            r.median_s,
            r.median_mib_s,
            runs.join(" ")
        ));
    }
    s.push_str("\n| ratio | value |\n|---|---|\n");
    for (k, v) in ratios {
        s.push_str(&format!("| {k} | {v:.2} |\n"));
    }
    s
}
