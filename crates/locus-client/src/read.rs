//! The read path: a file's bytes block by block, short-circuit (a lease, then pread of
//! the block file), following a co-located worker's fill through its Unix socket, or
//! over the data path, with read-ahead and fall-back to other sources; and the sinks the
//! bytes go to ([`ReadSink`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use locus_common::config::{Locality, ReadType};
use locus_common::metrics::ReadReason;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::{exchange, pb, read_response, send_request};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::Client;

/// Per-read options.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Overrides the client's default read type.
    pub read_type: Option<ReadType>,
    /// Overrides `client.read_ahead_blocks` for this read (a reader that fetches its own
    /// read-ahead with [`Client::load_block`] sets 0).
    pub read_ahead_blocks: Option<usize>,
}

/// Bytes per chunk of a [`Client::read_stream`].
const STREAM_CHUNK: usize = 1 << 20;

/// A read-ahead fill in flight: the block's index, and what its fill returned.
type BlockLoad<'a> = Pin<Box<dyn Future<Output = (usize, Option<u64>)> + Send + 'a>>;

/// Blocks a client remembers asking its host's worker to copy (`client.passive_cache`).
const PASSIVE_ASKED_MAX: usize = 1 << 16;

/// Bytes a short-circuit read copies from the block file at a time (fits the CPU cache).
const SHORT_CIRCUIT_BUF: usize = 256 << 10;

impl Client {
    /// Copy `len` bytes from `offset` of the file to `out`. `fi` must carry its blocks
    /// (`status(path, true)`). Returns the bytes copied.
    pub async fn read_to<W: AsyncWrite + Unpin + Send>(
        &self,
        fi: &pb::FileInfo,
        offset: u64,
        len: u64,
        opts: ReadOptions,
        out: &mut W,
    ) -> Result<u64> {
        self.read_into(fi, offset, len, opts, out).await
    }

    /// [`read_to`](Client::read_to) into any [`ReadSink`].
    pub async fn read_into<S: ReadSink>(
        &self,
        fi: &pb::FileInfo,
        offset: u64,
        len: u64,
        opts: ReadOptions,
        out: &mut S,
    ) -> Result<u64> {
        if fi.is_dir {
            return Err(Error::new(ErrorKind::IsADirectory, format!("{} is a directory", fi.path)));
        }
        let end = offset.saturating_add(len).min(fi.length);
        let read_type = opts.read_type.unwrap_or(self.cfg.read_type);
        // Bytes only in worker caches cannot be filled from the UFS.
        let caching = read_type != ReadType::NoCache && persisted(fi);
        let mut pos = offset;
        // Read-ahead: up to `client.read_ahead_blocks` blocks beyond the one being read are filled by
        // workers in the background, so the UFS stream never idles between blocks. A block
        // that is still filling when the reader gets to it is streamed from the filling
        // worker as it arrives (the worker joins the reader to the fill); one that has
        // landed is read from the cache (short-circuit when co-located).
        let mut loads: FuturesUnordered<BlockLoad<'_>> = FuturesUnordered::new();
        let mut scheduled: HashSet<usize> = HashSet::new();
        let mut loaded: HashMap<usize, Option<u64>> = HashMap::new();
        let read_ahead = opts.read_ahead_blocks.unwrap_or(self.cfg.read_ahead_blocks);
        while pos < end {
            let k = fi
                .blocks
                .iter()
                .position(|b| b.offset <= pos && pos < b.offset + b.length)
                .ok_or_else(|| Error::internal(format!("no block covers offset {pos} of {}", fi.path)))?;
            for j in k + 1..=k + read_ahead {
                match fi.blocks.get(j) {
                    Some(nb) if caching && nb.locations.is_empty() && nb.offset < end && scheduled.insert(j) => {
                        loads.push(Box::pin(async move { (j, self.load_block(fi, nb).await.ok()) }));
                    }
                    _ => {}
                }
            }
            // Collect the read-aheads that have landed, without waiting for the others.
            while let Some(Some((j, w))) = loads.next().now_or_never() {
                loaded.insert(j, w);
            }
            let mut b = fi.blocks[k].clone();
            if let Some(Some(w)) = loaded.get(&k) {
                b.locations.push(pb::BlockLocation { worker_id: *w, tier: pb::Tier::Unspecified.into() });
            }
            let n = (b.offset + b.length).min(end) - pos;
            let cur = self.read_block(fi, &b, pos - b.offset, n, opts, out);
            tokio::pin!(cur);
            let r = loop {
                tokio::select! {
                    r = &mut cur => break r,
                    Some((j, w)) = loads.next(), if !loads.is_empty() => { loaded.insert(j, w); }
                }
            };
            r?;
            pos += n;
        }
        out.finish().await.map_err(output_err)?;
        Ok(end.saturating_sub(offset))
    }

    async fn read_block<S: ReadSink>(
        &self,
        fi: &pb::FileInfo,
        b: &pb::BlockInfo,
        off: u64,
        len: u64,
        opts: ReadOptions,
        out: &mut S,
    ) -> Result<()> {
        let read_type = opts.read_type.unwrap_or(self.cfg.read_type);
        let mut done = 0u64;
        let mut failed: HashSet<u64> = HashSet::new();
        let mut last_err = None;
        for _attempt in 0..5 {
            let mut workers = self.workers(!failed.is_empty()).await?;
            if failed.is_empty() && b.locations.iter().any(|l| !workers.iter().any(|w| w.worker_id == l.worker_id)) {
                // The master names a worker this client's list lacks (it joined or came back).
                workers = self.workers(true).await?;
            }
            let holders = self.holders(b, &workers, &failed).await;
            let mut refused = false;
            if self.cfg.short_circuit
                && let Some((w, true)) = holders.first()
            {
                match self.short_circuit(w, b.block_id, off + done, len - done, read_type, out, &mut done).await {
                    Ok(()) => {
                        self.count_read(ReadReason::ShortCircuit, len);
                        return Ok(());
                    }
                    Err(e) if e.is_retryable() || e.kind() == ErrorKind::NotFound => {
                        tracing::debug!(worker = w.worker_id, error = %e, "short-circuit read failed; using the data path");
                        // The worker's own answer (the block gone from its cache), not
                        // a failure on this side (a socket or a block file it cannot open).
                        refused = e.kind() == ErrorKind::NotFound;
                    }
                    Err(e) => return Err(e),
                }
            }
            let w = match holders.into_iter().next() {
                Some((w, _)) => w,
                None => self.fill_source(fi, b, &failed).await.map_err(|e| last_err.take().unwrap_or(e))?,
            };
            let local = self.is_local(&w).await;
            let holder = b.locations.iter().any(|l| l.worker_id == w.worker_id);
            let reason = match () {
                _ if refused => ReadReason::LeaseRefused,
                _ if !holder => self.why_not_local(&workers, ReadReason::NotCached).await,
                _ => self.why_not_local(&workers, ReadReason::CachedElsewhere).await,
            };
            let req = pb::ReadBlockRequest {
                offset: off + done,
                length: len - done,
                read_type: pb::ReadType::from(read_type).into(),
                // Attribution only: a worker whose socket this client cannot reach but
                // that names this client's host still serves it from the same host
                // (unless the client is told to treat every worker as remote).
                client_local: local || (self.cfg.locality == Locality::Auto && w.host == self.cfg.host),
                client_host: self.cfg.host.clone(),
                reason: pb::ReadReason::from(reason).into(),
                ..whole_block(fi, b)
            };
            if local && self.cfg.short_circuit {
                match self.follow_read(&w, req.clone(), out, &mut done).await {
                    Ok(cached) => {
                        // A fill the client followed: its bytes came from the UFS.
                        self.count_read(if cached { ReadReason::ShortCircuit } else { reason }, len);
                        return Ok(());
                    }
                    Err(e)
                        if e.is_retryable()
                            || matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ResourceExhausted) =>
                    {
                        tracing::debug!(worker = w.worker_id, error = %e, done, "read through the worker's socket failed; using the data path");
                    }
                    Err(e) => return Err(e),
                }
            }
            let req = pb::ReadBlockRequest { offset: off + done, length: len - done, ..req };
            match self.remote_read(&w.data_address, req, out, &mut done).await {
                Ok(()) => {
                    self.count_read(reason, len);
                    if reason == ReadReason::CachedElsewhere {
                        self.copy_here(fi, b, read_type, &workers).await;
                    }
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(worker = w.worker_id, error = %e, done, "worker failed mid-read; trying another source");
                    failed.insert(w.worker_id);
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| Error::unavailable("no worker could serve the block")))
    }

    /// The live holders of block `b` this client has not seen fail, co-located first, each
    /// with whether it is co-located.
    async fn holders(
        &self,
        b: &pb::BlockInfo,
        workers: &[pb::WorkerAddress],
        failed: &HashSet<u64>,
    ) -> Vec<(pb::WorkerAddress, bool)> {
        let by_id: HashMap<u64, &pb::WorkerAddress> = workers.iter().map(|w| (w.worker_id, w)).collect();
        let mut holders = Vec::new();
        for l in &b.locations {
            if let Some(w) = by_id.get(&l.worker_id)
                && !failed.contains(&w.worker_id)
            {
                holders.push(((*w).clone(), self.is_local(w).await));
            }
        }
        holders.sort_by_key(|(w, local)| (!local, w.worker_id));
        holders
    }

    /// The worker to fill block `b` from the UFS when no holder is left: none for a file
    /// that is not persisted (its workers' copies are all there is).
    async fn fill_source(
        &self,
        fi: &pb::FileInfo,
        b: &pb::BlockInfo,
        failed: &HashSet<u64>,
    ) -> Result<pb::WorkerAddress> {
        if !persisted(fi) {
            return Err(Error::unavailable(format!(
                "block {} of {} has no live copy, and the file is not persisted ({})",
                b.block_id,
                fi.path,
                fi.persist_state().name()
            )));
        }
        self.pick_worker(b.block_id, failed).await
    }

    /// Passive caching (`client.passive_cache`): block `b`, just read from a worker on
    /// another host, is filled into this host's worker too, from the UFS, by a load
    /// that runs on after this read returns. Asked once per block by this client.
    async fn copy_here(
        &self,
        fi: &pb::FileInfo,
        b: &pb::BlockInfo,
        read_type: ReadType,
        workers: &[pb::WorkerAddress],
    ) {
        if !self.cfg.passive_cache || read_type == ReadType::NoCache || !persisted(fi) {
            return;
        }
        {
            let mut asked = self.passive.lock();
            if asked.len() >= PASSIVE_ASKED_MAX {
                asked.clear();
            }
            if !asked.insert(b.block_id) {
                return;
            }
        }
        let Some(w) = self.local_worker(workers).await else { return };
        let mut s = match self.uds_connect(&w.uds_path).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(worker = w.worker_id, error = %e, "passive cache: no connection to this host's worker");
                return;
            }
        };
        let req = pb::ReadBlockRequest { client_local: true, load_only: true, ..whole_block(fi, b) };
        let (block, worker) = (b.block_id, w.worker_id);
        // The request is sent before this read returns: a process that exits right after
        // its read (`locus fs cat`) has asked all the same, and the worker's fill runs on
        // whether or not anyone waits for its answer. (Sent from the task below, it was
        // lost whenever the runtime shut down before the task first ran.)
        if let Err(e) = send_request(&mut s, pb::data_request::Req::Read(req)).await {
            tracing::debug!(block, worker, error = %e, "passive cache: the copy was not asked for");
            return;
        }
        tokio::spawn(async move {
            // One frame answers a load: cached, or why the fill stopped (a full cache).
            if let Err(e) = read_response(&mut s).await {
                tracing::debug!(block, worker, error = %e, "passive cache: the copy was not made");
            }
        });
    }

    /// Why a read that a worker serves over the data path is not short-circuit, given
    /// `otherwise`, the reason when a worker of this host answers on its socket (the
    /// block was in no cache, or cached on another host only). Short-circuit is decided
    /// by the socket alone; the host names here only tell "no worker on this host" from
    /// "a worker here whose socket this client cannot reach".
    async fn why_not_local(&self, workers: &[pb::WorkerAddress], otherwise: ReadReason) -> ReadReason {
        if !self.cfg.short_circuit || self.cfg.locality == Locality::Remote {
            return ReadReason::Disabled;
        }
        if self.local_worker(workers).await.is_some() {
            return otherwise;
        }
        if workers.iter().any(|w| w.host == self.cfg.host) {
            ReadReason::SocketNotVisible
        } else {
            ReadReason::NoLocalWorker
        }
    }

    #[allow(clippy::too_many_arguments)] // a block's range, where it goes, and how far it got
    async fn short_circuit<S: ReadSink>(
        &self,
        w: &pb::WorkerAddress,
        block_id: u64,
        off: u64,
        len: u64,
        read_type: ReadType,
        out: &mut S,
        done: &mut u64,
    ) -> Result<()> {
        let (s, r) = self.lease(w, block_id, len, read_type).await?;
        if off + len > r.length {
            return Err(Error::new(ErrorKind::Corrupt, "leased block is shorter than the read"));
        }
        copy_leased(&r.path, off, len, out, done).await?;
        drop(s); // releases the lease
        Ok(())
    }

    /// A short-circuit lease on block `block_id` from co-located worker `w`: the worker
    /// keeps the block's file (the answer's `path`, `length` bytes) in place for as long
    /// as the returned connection stays open and asks nothing else.
    pub(crate) async fn lease(
        &self,
        w: &pb::WorkerAddress,
        block_id: u64,
        len: u64,
        read_type: ReadType,
    ) -> Result<(tokio::net::UnixStream, pb::DataResponse)> {
        let mut s = self.uds_connect(&w.uds_path).await?;
        let promote = read_type == ReadType::CachePromote;
        let r = exchange(
            &mut s,
            pb::data_request::Req::Lease(pb::LeaseRequest {
                block_id,
                length: len,
                promote,
                client_host: self.cfg.host.clone(),
            }),
        )
        .await?;
        Ok((s, r))
    }

    /// A read through the co-located worker's Unix socket: the worker leases the block,
    /// or fills it from the UFS, and this client reads the block's file itself, as it
    /// grows, while the worker tells how far it has (no bytes through a socket).
    /// Returns whether the block was cached (a lease) rather than filled.
    async fn follow_read<S: ReadSink>(
        &self,
        w: &pb::WorkerAddress,
        req: pb::ReadBlockRequest,
        out: &mut S,
        done: &mut u64,
    ) -> Result<bool> {
        let mut s = self.uds_connect(&w.uds_path).await?;
        let (mut pos, end) = (req.offset, req.offset + req.length);
        let mut cached = false;
        send_request(&mut s, pb::data_request::Req::Read(req)).await?;
        let mut file = None;
        let mut buf = vec![0u8; SHORT_CIRCUIT_BUF];
        while pos < end {
            let r = read_response(&mut s).await?;
            let (f, path) = match &file {
                Some(open) => open,
                None => {
                    cached = r.cached;
                    // The fill's file, or the block's once committed (the worker holds it).
                    let (path, block_path) = (r.path.clone(), r.block_path.clone());
                    let f =
                        open_blocking(move || std::fs::File::open(path).or_else(|_| std::fs::File::open(block_path)))
                            .await?
                            .map_err(|e| Error::unavailable(format!("open block file {}: {e}", r.block_path)))?;
                    file.insert((f, r.block_path))
                }
            };
            let upto = r.filled.min(end);
            if upto > pos {
                copy_file(f, path, pos, upto - pos, out, done, &mut buf).await?;
                pos = upto;
            }
        }
        drop(s); // lets the block go
        Ok(cached)
    }

    async fn remote_read<S: ReadSink>(
        &self,
        addr: &str,
        req: pb::ReadBlockRequest,
        out: &mut S,
        done: &mut u64,
    ) -> Result<()> {
        let mut c = self.conn(addr).await?;
        let r = exchange(&mut c, pb::data_request::Req::Read(req)).await?;
        let mut left = r.length;
        let mut cur = 1u64;
        while left > 0 {
            if c.buffer().is_empty() {
                locus_proto::expect_bytes(c.get_ref().get_ref(), &mut cur, left);
            }
            let buf = c.fill_buf().await.map_err(|e| Error::io("read block data", e))?;
            if buf.is_empty() {
                return Err(Error::unavailable(format!("worker {addr} closed the stream with {left} bytes to go")));
            }
            let n = buf.len().min(left as usize);
            out.put(&buf[..n]).await.map_err(output_err)?;
            c.consume(n);
            left -= n as u64;
            *done += n as u64;
        }
        locus_proto::expect_bytes(c.get_ref().get_ref(), &mut cur, 0);
        self.put_conn(addr, c);
        Ok(())
    }

    /// Cache every block of the file on a worker. `progress` gets the bytes of each
    /// block as it completes.
    pub async fn load(&self, fi: &pb::FileInfo, mut progress: impl FnMut(u64)) -> Result<()> {
        for b in &fi.blocks {
            if b.locations.is_empty() {
                self.load_block(fi, b).await?;
            }
            progress(b.length);
        }
        Ok(())
    }

    /// Have a worker fill block `b` of `fi` from the UFS into its cache (a no-op where it is
    /// cached). Returns the worker that holds it.
    pub async fn load_block(&self, fi: &pb::FileInfo, b: &pb::BlockInfo) -> Result<u64> {
        let mut failed = HashSet::new();
        loop {
            let w = self.pick_worker(b.block_id, &failed).await?;
            let req =
                pb::ReadBlockRequest { client_local: self.is_local(&w).await, load_only: true, ..whole_block(fi, b) };
            let mut c = self.conn(&w.data_address).await?;
            // One frame answers a load: cached, or the error that stopped the fill.
            match exchange(&mut c, pb::data_request::Req::Read(req)).await {
                Ok(_) => {
                    self.put_conn(&w.data_address, c);
                    return Ok(w.worker_id);
                }
                Err(e) if e.kind() == ErrorKind::Unavailable && failed.len() < 3 => {
                    failed.insert(w.worker_id);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stream `len` bytes from `offset` of the file as chunks of at most 1 MiB, read
    /// ahead by a background task (so the caller never holds the file in memory).
    pub fn read_stream(
        self: &std::sync::Arc<Self>,
        fi: pb::FileInfo,
        offset: u64,
        len: u64,
        opts: ReadOptions,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<bytes::Bytes>> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes>>(8);
        let client = self.clone();
        tokio::spawn(async move {
            let mut w = ChannelSink { tx: tx.clone() };
            if let Err(e) = client.read_into(&fi, offset, len, opts, &mut w).await {
                // Its reader sees the stream end early (an S3 GET's body is cut off): the
                // cause is only here.
                if !tx.is_closed() {
                    tracing::warn!(path = %fi.path, version = fi.version, offset, len, error = %e, "read stream failed");
                }
                // The reader may be gone already (it hung up): nothing left to tell.
                let _ = tx.send(Err(e)).await;
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// A request for the whole of block `b` of `fi`, to be cached (CACHE) where it misses.
pub(crate) fn whole_block(fi: &pb::FileInfo, b: &pb::BlockInfo) -> pb::ReadBlockRequest {
    pb::ReadBlockRequest {
        block_id: b.block_id,
        offset: 0,
        length: b.length,
        block_length: b.length,
        file_offset: b.offset,
        mount_id: fi.mount_id,
        ufs_path: fi.ufs_path.clone(),
        read_type: pb::ReadType::Cache.into(),
        client_local: false,
        load_only: false,
        fingerprint: fi.fingerprint.clone(),
        ticket: b.ticket.clone(),
        // Loads and near-data scans send no bytes to the client: not counted by host.
        client_host: String::new(),
        reason: pb::ReadReason::Unspecified.into(),
    }
}

/// Whether the UFS holds the file's bytes.
fn persisted(fi: &pb::FileInfo) -> bool {
    fi.persist_state().is_persisted()
}

/// Copies `len` bytes at `off` of the leased block file at `path` to `out`, counting them in
/// `done` as they are written (so a fall-back to another source resumes at the right byte).
///
/// The file is `pread` into a buffer small enough to stay in the CPU cache until it is
/// copied out. Measured with `locus bench read` (1 GiB on tmpfs, 2-core VM), this runs at
/// 0.80-1.04x the speed of `cat` (the kernel copies through its direct map), where copying
/// from an mmap of the file reached 0.68-0.71x (a fault, a TLB entry and an unmap per 4 KiB
/// page, with or without MADV_POPULATE_READ ahead). Reading the next piece on another
/// thread while this one is consumed was slower still (`fs wc` 1.10-1.29x of `wc -l`,
/// against 0.97-1.01x): the hand-offs and the cross-core cache traffic cost more than the
/// overlap gains.
async fn copy_leased<S: ReadSink>(path: &str, off: u64, len: u64, out: &mut S, done: &mut u64) -> Result<()> {
    // Opened inline, a deliberate exception to opening files on a blocking thread: the
    // worker has just leased this file (a MEM-tier block on tmpfs, or a disk-tier block
    // whose file the lease has just checked), so the open is a lookup in the kernel's
    // caches, not a wait on a disk. The hop it saves, with the worker's own (see its
    // `Inner::lease`), cost 0.26 ms per block on a loaded 2-core VM (one-block reads:
    // 0.51 ms with both hops, 0.25 ms with neither).
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("open {path}"), e))?;
    copy_file(&file, path, off, len, out, done, &mut vec![0u8; SHORT_CIRCUIT_BUF]).await
}

/// Open a block file on a blocking thread (an open may wait on the disk; the preads that
/// follow stay inline, see [`copy_file`]).
async fn open_blocking(
    open: impl FnOnce() -> std::io::Result<std::fs::File> + Send + 'static,
) -> Result<std::io::Result<std::fs::File>> {
    tokio::task::spawn_blocking(open).await.map_err(|e| Error::internal(format!("open task: {e}")))
}

/// [`copy_leased`] of an open block file, through `buf` (or, for a sink that
/// [`takes_buffers`](ReadSink::takes_buffers), into buffers it then owns).
///
/// The preads run inline on the runtime, on purpose: the file is a block the worker
/// holds in place, read from tmpfs or the page cache in pieces of `SHORT_CIRCUIT_BUF`,
/// so each is a bounded memory copy, and a hop to a blocking thread per piece was
/// measured slower (see [`copy_leased`]).
#[allow(clippy::too_many_arguments)]
async fn copy_file<S: ReadSink>(
    file: &std::fs::File,
    path: &str,
    off: u64,
    len: u64,
    out: &mut S,
    done: &mut u64,
    buf: &mut [u8],
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let (mut pos, end) = (off, off + len);
    while pos < end {
        let n = buf.len().min((end - pos) as usize);
        let read_err = |e| Error::io(format!("read {path}"), e);
        if out.takes_buffers() {
            out.put_owned(pread_owned(file, pos, n).map_err(read_err)?).await.map_err(output_err)?;
        } else {
            file.read_exact_at(&mut buf[..n], pos).map_err(read_err)?;
            out.put(&buf[..n]).await.map_err(output_err)?;
        }
        pos += n as u64;
        *done += n as u64;
    }
    Ok(())
}

/// `n` bytes at `pos` of `file`, read straight into a new buffer (no zeroing first, no
/// copy after).
fn pread_owned(file: &std::fs::File, pos: u64, n: usize) -> std::io::Result<bytes::Bytes> {
    use std::os::fd::AsRawFd;
    let mut b = bytes::BytesMut::with_capacity(n);
    while b.len() < n {
        let (have, want) = (b.len(), n - b.len());
        let spare = b.spare_capacity_mut();
        // SAFETY: pread writes at most `want` bytes into the spare capacity (at least `want`
        // long), and only the bytes it reports written are then marked initialized.
        let r = unsafe {
            libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), want, (pos + have as u64) as libc::off_t)
        };
        match r {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            r => unsafe { b.set_len(b.len() + r as usize) },
        }
    }
    Ok(b.freeze())
}

/// Where a read's bytes go ([`Client::read_to`] and its parts). Every `AsyncWrite` is one,
/// its bytes copied in; the stream of [`Client::read_stream`] (the S3 gateway's response
/// bodies) takes over the buffers the block file is read into, one copy of every byte
/// fewer.
pub trait ReadSink: Send {
    /// Copy `buf` out.
    fn put<'a>(&'a mut self, buf: &'a [u8]) -> impl Future<Output = std::io::Result<()>> + Send + 'a;
    /// Whether [`put_owned`](ReadSink::put_owned) saves a copy.
    fn takes_buffers(&self) -> bool {
        false
    }
    /// Hand over a whole buffer.
    fn put_owned(&mut self, buf: bytes::Bytes) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        async move { self.put(&buf).await }
    }
    /// Flush what was put.
    fn finish(&mut self) -> impl Future<Output = std::io::Result<()>> + Send + '_;
}

impl<W: AsyncWrite + Unpin + Send> ReadSink for W {
    fn put<'a>(&'a mut self, buf: &'a [u8]) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        self.write_all(buf)
    }
    fn finish(&mut self) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        AsyncWriteExt::flush(self)
    }
}

/// A failed write to the reader's output (a closed pipe, a full disk) is the reader's
/// problem, not a worker's: it is never retried elsewhere.
fn output_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, "cannot write the output").with_source(e).set_retryable(false)
}

/// The sending end of a [`Client::read_stream`].
struct ChannelSink {
    tx: tokio::sync::mpsc::Sender<Result<bytes::Bytes>>,
}

impl ReadSink for ChannelSink {
    async fn put(&mut self, buf: &[u8]) -> std::io::Result<()> {
        for c in buf.chunks(STREAM_CHUNK) {
            self.put_owned(bytes::Bytes::copy_from_slice(c)).await?;
        }
        Ok(())
    }
    fn takes_buffers(&self) -> bool {
        true
    }
    async fn put_owned(&mut self, buf: bytes::Bytes) -> std::io::Result<()> {
        self.tx.send(Ok(buf)).await.map_err(|_| std::io::ErrorKind::BrokenPipe.into())
    }
    fn finish(&mut self) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pread_owned_reads_the_range_and_fails_past_the_end() {
        let path = std::env::temp_dir().join(format!("locus-pread-{}", std::process::id()));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        assert_eq!(pread_owned(&f, 0, data.len()).unwrap(), &data[..]);
        assert_eq!(pread_owned(&f, 12_345, 70_000).unwrap(), &data[12_345..82_345]);
        let e = pread_owned(&f, 299_990, 20).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&path).unwrap();
    }

    /// Any `AsyncWrite` is a sink that copies; the gateway's stream takes buffers.
    #[tokio::test]
    async fn sinks_copy_or_take_buffers() {
        let mut v: Vec<u8> = Vec::new();
        assert!(!ReadSink::takes_buffers(&v));
        v.put(b"ab").await.unwrap();
        v.put_owned(bytes::Bytes::from_static(b"cd")).await.unwrap();
        assert_eq!(v, b"abcd");

        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let mut s = ChannelSink { tx };
        assert!(s.takes_buffers());
        let b = bytes::Bytes::from(vec![7u8; 10]);
        s.put_owned(b.clone()).await.unwrap();
        let got = rx.recv().await.unwrap().unwrap();
        assert_eq!(got.as_ptr(), b.as_ptr(), "handed over, not copied");
        s.put(&vec![1u8; STREAM_CHUNK + 5]).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().unwrap().len(), STREAM_CHUNK);
        assert_eq!(rx.recv().await.unwrap().unwrap().len(), 5);
        drop(rx);
        assert_eq!(s.put(b"x").await.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
    }
}
