//! `locus fs ...`: the file system commands (like `alluxio fs`), each one client call or a
//! few, on a client configured by the command's read flags.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use locus_client::{Client, PutOptions, ReadOptions};
use locus_common::config::{Locality, ReadType, WriteType};
use locus_common::{Error, ErrorKind};
use locus_proto::pb;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::admin::{MountArgs, mount, unmount};
use super::compute::ComputeArgs;
use super::search::{IndexArgs, SearchArgs};
use super::{Global, byte_bar, human, runtime};

#[derive(Args)]
pub struct FsArgs {
    /// Read type: CACHE (default), CACHE_PROMOTE or NO_CACHE.
    #[arg(long, global = true)]
    pub read_type: Option<String>,
    /// Never read short-circuit; co-located workers are read over the data path.
    #[arg(long, global = true)]
    pub no_short_circuit: bool,
    /// Treat every worker as remote (forced remote reads).
    #[arg(long, global = true)]
    pub remote: bool,
    #[command(subcommand)]
    pub cmd: FsCmd,
}

#[derive(Subcommand)]
pub enum FsCmd {
    /// List a directory.
    Ls {
        /// List the whole tree below PATH.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// The directory (or file) to list.
        path: String,
    },
    /// Size, fingerprint, blocks with workers and tiers, cached fraction.
    Stat {
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// The file or directory.
        path: String,
    },
    /// Print a file.
    Cat {
        /// The file to print.
        path: String,
    },
    /// Count the lines and bytes of a file (like `wc -l -c`), reading it through the
    /// cache: short-circuit when a worker shares this host. Prints `LINES BYTES PATH`.
    Wc {
        /// Read the file this many times, each after a fresh lookup of its blocks, and
        /// report the time of each read (how benchmarks time first and repeated access).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Print {"path", "lines", "bytes", "seconds": [one per read]} instead.
        #[arg(long)]
        json: bool,
        /// The file to count.
        path: String,
    },
    /// Print the first bytes of a file.
    Head {
        /// Bytes to print.
        #[arg(short = 'c', long, default_value_t = 1024)]
        bytes: u64,
        /// The file.
        path: String,
    },
    /// Copy a file to the local file system.
    Get {
        /// The Locus file.
        path: String,
        /// The local file to write (refused if it exists, unless --overwrite).
        local: PathBuf,
        /// Replace LOCAL if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Copy a local file (or - for stdin) into Locus.
    Put {
        /// The local file, or - for standard input.
        local: String,
        /// The Locus path to write (refused if it exists, unless --overwrite).
        path: String,
        /// Replace PATH if it exists.
        #[arg(long)]
        overwrite: bool,
        /// MUST_CACHE, CACHE_THROUGH, THROUGH or ASYNC_THROUGH (default: the client's,
        /// else the mount's, else the cluster's: ASYNC_THROUGH).
        #[arg(long)]
        write_type: Option<String>,
        /// Workers that must hold the blocks before the write is acknowledged
        /// (ASYNC_THROUGH, MUST_CACHE). Default client.replication.durable: min(2, live).
        #[arg(long)]
        durable: Option<u32>,
    },
    /// Write a MUST_CACHE file to the UFS, and wait until it is persisted. With --retry or
    /// --drop: act on the persist-queue operations that were given up after failing
    /// (`locus report` lists them with their last error).
    Persist {
        /// The file to persist; with --retry or --drop, a file or a directory (the given-up
        /// operations at or below it).
        path: String,
        /// Run the given-up operations at or below PATH again, their attempts counted anew
        /// (after fixing what made them fail, such as something in the way in the UFS).
        #[arg(long, conflicts_with = "drop")]
        retry: bool,
        /// Take the given-up operations at or below PATH off the queue. A file whose
        /// persist is dropped stays in Locus as NOT_PERSISTED, pinned (its cached copies
        /// are its only ones) until it is deleted or persisted again.
        #[arg(long)]
        drop: bool,
        /// Return once the persist is queued.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this long.
        #[arg(long, default_value = "10m")]
        timeout: String,
    },
    /// Set how many copies of each block Locus keeps (min) and allows (max, 0 = any).
    #[command(name = "setReplication", alias = "set-replication")]
    SetReplication {
        /// Copies each block keeps (re-replicated when short; at most the live workers).
        #[arg(long, default_value_t = 1)]
        min: u32,
        /// Copies each block may have at most (extra ones are dropped); 0 = no limit.
        #[arg(long, default_value_t = 0)]
        max: u32,
        /// Every file below PATH.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Create a directory.
    Mkdir {
        /// Create missing parents, and succeed if it exists.
        #[arg(short = 'p', long)]
        parents: bool,
        /// The directory.
        path: String,
    },
    /// Remove a file or, with -R, a directory tree (from the UFS too).
    Rm {
        /// Remove a directory and everything below it.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Rename.
    Mv {
        /// The path to move.
        src: String,
        /// The new path.
        dst: String,
    },
    /// Cache a file (or a tree with -R) on the workers, with a progress bar.
    Load {
        /// Every file below a directory.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Drop cached blocks (of persisted, unpinned files: a tree's others are skipped).
    Free {
        /// Every file below a directory.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Keep a file's blocks from eviction.
    Pin {
        /// Every file below a directory.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Undo pin.
    Unpin {
        /// Every file below a directory.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// The file or directory.
        path: String,
    },
    /// Run operators (count, stats, modsum, stddev, normalize, gram, digits, entropy) over
    /// CSV files on the workers that hold their blocks; only partial results come back.
    Compute(ComputeArgs),
    /// Find objects by their metadata across every mount: a clause in Zenko's syntax
    /// (what `GET /bucket?search=` takes), or SQL over the catalog with --sql.
    Search(SearchArgs),
    /// The search catalog: import inventories.
    Index(IndexArgs),
    /// Mount a UFS (s3://bucket/prefix or file:///dir) at a path; with no arguments, list mounts.
    Mount(MountArgs),
    /// Remove a mount (the UFS is untouched).
    Unmount {
        /// The mount point.
        path: String,
    },
}

pub fn run(g: &Global, fs: &FsArgs) -> Result<()> {
    let read_type = match &fs.read_type {
        Some(rt) => Some(ReadType::parse(rt).ok_or_else(|| Error::invalid(format!("unknown read type {rt:?}")))?),
        None => None,
    };
    let cfg = g.load_config([
        ("client.read_type", read_type.map(|rt| json!(rt))),
        ("client.short_circuit", fs.no_short_circuit.then_some(json!(false))),
        ("client.locality", fs.remote.then(|| json!(Locality::Remote))),
    ])?;
    runtime()?.block_on(async move {
        let c = std::sync::Arc::new(super::client(&cfg)?);
        run_fs(&c, &fs.cmd).await
    })
}

fn entry_json(e: &pb::FileInfo) -> serde_json::Value {
    json!({
        "path": e.path, "name": e.name, "is_dir": e.is_dir, "length": e.length,
        "mtime_ms": e.mtime_ms, "fingerprint": e.fingerprint, "pinned": e.pinned,
        "persist_state": e.persist_state().name(),
    })
}

fn stat_json(fi: &pb::FileInfo, workers: &HashMap<u64, String>) -> serde_json::Value {
    json!({
        "path": fi.path, "name": fi.name, "is_dir": fi.is_dir, "length": fi.length,
        "block_size": fi.block_size, "fingerprint": fi.fingerprint, "mtime_ms": fi.mtime_ms,
        "pinned": fi.pinned, "mount_point": fi.mount_point, "ufs_path": fi.ufs_path,
        "persist_state": fi.persist_state().name(), "replication_min": fi.replication_min, "replication_max": fi.replication_max,
        "cached_fraction": fi.cached_fraction(),
        "blocks": fi.blocks.iter().map(|b| json!({
            "id": b.block_id, "offset": b.offset, "length": b.length,
            "locations": b.locations.iter().map(|l| json!({"worker_id": l.worker_id, "host": workers.get(&l.worker_id).cloned().unwrap_or_default(), "tier": l.tier().name()})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

async fn run_fs(c: &std::sync::Arc<Client>, cmd: &FsCmd) -> Result<()> {
    let opts = ReadOptions::default();
    match cmd {
        FsCmd::Ls { recursive, json, path } => ls(c, path, *recursive, *json).await?,
        FsCmd::Stat { json, path } => stat(c, path, *json).await?,
        FsCmd::Compute(a) => super::compute::run(c, a).await?,
        FsCmd::Search(a) => super::search::search(c, a).await?,
        FsCmd::Index(a) => super::search::index(c, a).await?,
        FsCmd::Cat { path } => {
            let fi = c.status(path, true).await?;
            c.read_into(&fi, 0, fi.length, opts, &mut StdoutSink::new()?).await.or_else(quiet_pipe)?;
        }
        FsCmd::Wc { repeat, json, path } => wc(c, path, *repeat, *json).await?,
        FsCmd::Head { bytes, path } => {
            let fi = c.status(path, true).await?;
            c.read_into(&fi, 0, *bytes, opts, &mut StdoutSink::new()?).await.or_else(quiet_pipe)?;
        }
        FsCmd::Get { path, local, overwrite } => get(c, path, local, *overwrite).await?,
        FsCmd::Put { local, path, overwrite, write_type, durable } => {
            let popts = PutOptions {
                overwrite: *overwrite,
                write_type: write_type.as_deref().map(WriteType::parse_or_err).transpose()?,
                durable_replicas: *durable,
                ..Default::default()
            };
            put(c, local, path, popts).await?
        }
        FsCmd::Persist { path, retry, drop, no_wait, timeout } => {
            if *retry || *drop {
                let action = if *retry { pb::PersistFailureAction::Retry } else { pb::PersistFailureAction::Drop };
                let n = c.resolve_persist_failures(path, action).await?;
                println!(
                    "{} {n} given-up persist queue operation(s) at or below {path}",
                    if *retry { "retrying" } else { "dropped" }
                );
                return Ok(());
            }
            let limit: Duration = humantime::parse_duration(timeout)
                .map_err(|e| Error::invalid(format!("bad --timeout {timeout:?}: {e}")))?;
            let mut fi = c.persist(path).await?;
            if !*no_wait {
                fi = wait_persisted(c, path, fi, limit, timeout).await?;
            }
            println!("{path}: {}", fi.persist_state().name());
        }
        FsCmd::SetReplication { min, max, recursive, path } => {
            let live = c.workers(true).await?.len();
            if *min as usize > live {
                eprintln!(
                    "locus: warning: --min {min} but {live} worker(s) are live: blocks keep {live} cop{} until more join",
                    if live == 1 { "y" } else { "ies" }
                );
            }
            let n = c.set_replication(path, *min, *max, *recursive).await?;
            println!(
                "set replication of {n} file(s) to min {min}, max {}",
                if *max == 0 { "any".into() } else { max.to_string() }
            );
        }
        FsCmd::Mkdir { parents, path } => c.mkdir(path, *parents).await?,
        FsCmd::Rm { recursive, path } => c.delete(path, *recursive).await?,
        FsCmd::Mv { src, dst } => c.rename(src, dst).await?,
        FsCmd::Load { recursive, path } => load(c, path, *recursive).await?,
        FsCmd::Free { recursive, path } => {
            let (n, skipped) = c.free_counted(path, *recursive).await?;
            if skipped > 0 {
                println!("freed {n} block(s); skipped {skipped} pinned or not yet persisted file(s)");
            } else {
                println!("freed {n} block(s)");
            }
        }
        FsCmd::Pin { recursive, path } => {
            let n = c.set_pinned(path, true, *recursive).await?;
            println!("pinned {n} file(s)");
        }
        FsCmd::Unpin { recursive, path } => {
            let n = c.set_pinned(path, false, *recursive).await?;
            println!("unpinned {n} file(s)");
        }
        FsCmd::Mount(a) => mount(c, a).await?,
        FsCmd::Unmount { path } => unmount(c, path).await?,
    }
    Ok(())
}

/// `fs ls`: one line (or JSON object) per entry, as the listing streams in.
async fn ls(c: &Client, path: &str, recursive: bool, as_json: bool) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let mut werr = None;
    c.list_each(path, recursive, |e| {
        let r = if as_json {
            writeln!(out, "{}", entry_json(e))
        } else {
            let size = if e.is_dir { "-".into() } else { e.length.to_string() };
            writeln!(out, "{size:>12}  {}  {}", if e.is_dir { "d" } else { "-" }, e.path)
        };
        if let Err(e) = r {
            werr.get_or_insert(e);
        }
    })
    .await?;
    match werr {
        Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `fs stat`: the file, and where each of its blocks is cached.
async fn stat(c: &Client, path: &str, as_json: bool) -> Result<()> {
    let fi = c.status(path, true).await?;
    let r = c.report().await?;
    let hosts: HashMap<u64, String> =
        r.workers.iter().filter_map(|w| w.address.as_ref()).map(|a| (a.worker_id, a.host.clone())).collect();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&stat_json(&fi, &hosts))?);
        return Ok(());
    }
    println!("path         {}", fi.path);
    println!("type         {}", if fi.is_dir { "directory" } else { "file" });
    println!("size         {} ({})", fi.length, human(fi.length));
    println!("fingerprint  {}", fi.fingerprint);
    println!("mount        {} (ufs path {:?})", fi.mount_point, fi.ufs_path);
    println!("pinned       {}", fi.pinned);
    if fi.is_dir {
        return Ok(());
    }
    println!("persisted    {}", fi.persist_state().name());
    println!("cached       {:.1}%", fi.cached_fraction() * 100.0);
    for b in &fi.blocks {
        let host = |id: u64| hosts.get(&id).cloned().unwrap_or_default();
        let locs: Vec<String> = b
            .locations
            .iter()
            .map(|l| format!("worker {} ({}) {}", l.worker_id, host(l.worker_id), l.tier().name()))
            .collect();
        let at = if locs.is_empty() { "not cached".into() } else { locs.join(", ") };
        println!("  block {} @{} len {}: {at}", b.block_id, b.offset, b.length);
    }
    Ok(())
}

/// `fs wc`: lines and bytes, read `repeat` times (each timed).
async fn wc(c: &Client, path: &str, repeat: usize, as_json: bool) -> Result<()> {
    let mut seconds = Vec::new();
    let mut counted = LineCounter::default();
    for _ in 0..repeat.max(1) {
        let start = std::time::Instant::now();
        let fi = c.status(path, true).await?;
        counted = LineCounter::default();
        c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut counted).await?;
        seconds.push(start.elapsed().as_secs_f64());
    }
    if as_json {
        println!("{}", json!({"path": path, "lines": counted.lines, "bytes": counted.bytes, "seconds": seconds}));
    } else {
        println!("{} {} {path}", counted.lines, counted.bytes);
    }
    Ok(())
}

/// `fs get`: a file to a local one, never over an existing one unless `overwrite`.
async fn get(c: &Client, path: &str, local: &std::path::Path, overwrite: bool) -> Result<()> {
    let fi = c.status(path, true).await?;
    let mut o = tokio::fs::OpenOptions::new();
    o.write(true);
    if overwrite {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    let f = match o.open(local).await {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let e = format!("{} exists (use --overwrite to replace it)", local.display());
            return Err(Error::new(ErrorKind::AlreadyExists, e).into());
        }
        r => r.with_context(|| format!("create {}", local.display()))?,
    };
    let mut w = tokio::io::BufWriter::with_capacity(4 << 20, f);
    c.read_to(&fi, 0, fi.length, ReadOptions::default(), &mut w).await?;
    w.shutdown().await?;
    Ok(())
}

/// `fs put`: a local file (or standard input, `-`) to `path`.
async fn put(c: &Client, local: &str, path: &str, popts: PutOptions) -> Result<()> {
    let overwrite = popts.overwrite;
    let exists = |e: locus_common::Error| {
        if e.kind() == ErrorKind::AlreadyExists && !overwrite { e.context("use --overwrite to replace it") } else { e }
    };
    let fi = if local == "-" {
        c.put_with(path, &mut tokio::io::stdin(), &popts, |_| Ok(pb::ObjectMeta::default())).await.map_err(exists)?
    } else {
        let mut f = tokio::fs::File::open(local).await.map_err(|e| Error::io(format!("open {local}"), e))?;
        // A regular file declares its size (a write that cannot fit fails first).
        let popts = match f.metadata().await {
            Ok(m) if m.is_file() => PutOptions { expected_length: Some(m.len()), ..popts },
            _ => popts,
        };
        c.put_with(path, &mut f, &popts, |_| Ok(pb::ObjectMeta::default())).await.map_err(exists)?
    };
    println!("wrote {} ({} bytes, {})", fi.path, fi.length, fi.persist_state().name());
    if fi.copies_made < fi.copies_wanted {
        eprintln!(
            "locus: warning: {} is held by {} worker(s), not the {} asked for (a worker was lost, or \
             client.replication.allow_fewer): it is less durable until persisted",
            fi.path, fi.copies_made, fi.copies_wanted
        );
    }
    Ok(())
}

/// `fs persist` without `--no-wait`: the file's state until it is persisted, fails (the
/// persist given up, or the file lost first), or `limit` passes.
async fn wait_persisted(
    c: &Client,
    path: &str,
    mut fi: pb::FileInfo,
    limit: Duration,
    timeout: &str,
) -> Result<pb::FileInfo> {
    let start = std::time::Instant::now();
    let mut checked = start;
    while !fi.persist_state().is_persisted() {
        if fi.persist_state() == pb::PersistState::Lost {
            return Err(Error::new(ErrorKind::Corrupt, format!("{path} was lost before it was persisted")).into());
        }
        if checked.elapsed() > Duration::from_secs(1) {
            checked = std::time::Instant::now();
            let r = c.report().await?;
            if let Some(f) = r.persist_failed.iter().find(|f| f.path == fi.path) {
                let e = format!(
                    "the persist of {path} was given up after {} attempt(s): {} (locus fs persist --retry or --drop)",
                    f.failures, f.last_error
                );
                return Err(Error::new(ErrorKind::from(f.last_error_kind()), e).into());
            }
        }
        if start.elapsed() > limit {
            let e = format!("{path} is still {} after {timeout}", fi.persist_state().name());
            return Err(Error::unavailable(e).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        fi = c.status(path, false).await?;
    }
    Ok(fi)
}

/// `fs load`: every file at or under `path` into the cache, with a progress bar.
async fn load(c: &Client, path: &str, recursive: bool) -> Result<()> {
    if !recursive && c.status(path, false).await?.is_dir {
        return Err(Error::invalid(format!("{path} is a directory (use -R)")).into());
    }
    let infos = c.expand_paths(std::slice::from_ref(&path.to_string())).await?;
    let total: u64 = infos.iter().map(|f| f.length).sum();
    let bar = byte_bar(total);
    let start = std::time::Instant::now();
    for fi in &infos {
        bar.set_message(fi.name.clone());
        c.load(fi, |n| bar.inc(n)).await?;
    }
    bar.finish_and_clear();
    // The bar is drawn on a terminal only; the summary line always.
    println!("loaded {} file(s), {} in {:.1} s", infos.len(), human(total), start.elapsed().as_secs_f64());
    Ok(())
}

/// Standard output for `fs cat` and `fs head`: each piece is written straight to fd 1 from
/// the reading thread (`block_in_place`), as `cat` does. Through `tokio::io::stdout` every
/// piece went to a blocking-pool thread and back, which halved the speed into a pipe; and
/// std's `Stdout` is line-buffered, which copies each piece's tail and writes it again, so
/// the sink writes to its own handle on fd 1. A pipe is grown to 1 MiB (from Linux's
/// 64 KiB) when the system allows, so a 256 KiB piece wakes the reader once, not four times.
struct StdoutSink(std::fs::File);

impl StdoutSink {
    fn new() -> Result<StdoutSink, Error> {
        use std::os::fd::{AsFd, AsRawFd};
        let fd = std::io::stdout().as_fd().try_clone_to_owned().map_err(|e| Error::io("standard output", e))?;
        // SAFETY: fcntl on a descriptor this process owns; F_SETPIPE_SZ only sizes a pipe's
        // buffer, and fails (ignored) on anything that is not a pipe or over the limit.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
        Ok(StdoutSink(std::fs::File::from(fd)))
    }
}

impl locus_client::ReadSink for StdoutSink {
    async fn put(&mut self, buf: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        tokio::task::block_in_place(|| self.0.write_all(buf))
    }
    async fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reader of our output that went away (`fs cat ... | head`) ends the command quietly,
/// as it does for other Unix tools.
fn quiet_pipe(e: Error) -> Result<u64, Error> {
    let broken = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe);
    if broken { Ok(0) } else { Err(e) }
}

/// An output that counts lines and bytes instead of storing them (`fs wc`).
#[derive(Default)]
struct LineCounter {
    lines: u64,
    bytes: u64,
}

impl tokio::io::AsyncWrite for LineCounter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        // Pieces come in 256 KiB (short-circuit and data path alike), still in the CPU
        // cache: one SIMD pass each.
        self.lines += bytecount::count(buf, b'\n') as u64;
        self.bytes += buf.len() as u64;
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
