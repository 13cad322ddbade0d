//! The read path: a block served from the cache (sendfile), from a fill of the UFS in
//! progress (concurrent misses on one block cost one UFS read: readers follow the fill's
//! file as it grows), or straight from the UFS; and the co-located reader's reads and
//! short-circuit leases over the Unix socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures::StreamExt;
use locus_blockstore::{Lease, TempBlock};
use locus_common::config::ReadType;
use locus_common::metrics::{ReadReason, ReadSource};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::tls::DataStream;
use locus_proto::{pb, write_frame};
use locus_ufs::Ufs;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::block::write_block_file;
use crate::{DropOffRuntime, Inner};

/// Largest block the data path accepts.
const MAX_BLOCK: u64 = 1 << 40;
/// A fill publishes its progress to waiting readers every this many bytes.
const FILL_NOTIFY: u64 = 1 << 20;

/// Progress of one block fill, as the leader publishes it.
#[derive(Clone, Default)]
pub(crate) struct FillState {
    /// The block's temporary file, once created (its bytes `..filled` are final).
    path: Option<PathBuf>,
    /// Where that file goes when the block is committed.
    final_path: Option<PathBuf>,
    filled: u64,
    /// Set when the fill ends: whether the block was cached.
    done: Option<bool>,
    /// A lease on the cached block, held for the readers that follow the fill's file
    /// (they read it without a lease of their own) until the last of them is done: the
    /// block is neither evicted nor its file reused under them. (Its last holder, a
    /// receiver, drops it where it is: over the Unix socket off the runtime, as a
    /// [`Held`]; on the data path at the end of a read, inline, which costs one unlink
    /// only when the block was removed while the read followed it.)
    lease: Option<Arc<Lease>>,
}

/// A block fill a reader joined ([`Inner::fill_or_join`]): its progress, and when this
/// reader started it, the task running it.
enum Fill {
    Leader(watch::Receiver<FillState>, tokio::task::JoinHandle<Result<()>>),
    Waiter(watch::Receiver<FillState>),
}

/// A whole block's bytes for a reader inside the worker ([`Inner::open_for_scan`]).
pub(crate) enum ScanSource {
    /// Cached: its file, kept in place by the lease.
    Cached { file: Arc<std::fs::File>, len: u64, _lease: DropOffRuntime<Lease> },
    /// Being filled from the UFS: the fill's file, valid up to the fill's progress.
    Filling { file: Arc<std::fs::File>, rx: watch::Receiver<FillState>, block_id: u64 },
    /// Not cacheable: the UFS's bytes as they come.
    Ufs(std::pin::Pin<Box<dyn futures::Stream<Item = Result<Bytes>> + Send>>),
}

impl ScanSource {
    /// For a file source: how many bytes of the block can be read past `pos`, waiting
    /// for a fill to get there.
    pub(crate) async fn readable_past(&mut self, pos: u64) -> Result<u64> {
        match self {
            ScanSource::Cached { len, .. } => Ok(*len),
            ScanSource::Filling { rx, block_id, .. } => fill_past(rx, *block_id, pos).await,
            ScanSource::Ufs(_) => Err(Error::internal("a UFS source is a stream")),
        }
    }

    /// Wait until a fill this scan followed has ended and the master has heard of the
    /// block, so the caller's answer comes after the cache it filled is on record.
    /// (The bytes scanned are final whatever the fill's verdict.)
    pub(crate) async fn settled(&mut self) {
        if let ScanSource::Filling { rx, .. } = self {
            let _ = rx.wait_for(|s| s.done.is_some()).await;
        }
    }
}

/// Where a block read ends in its block, or why the request is bad.
fn read_end(r: &pb::ReadBlockRequest) -> Result<u64> {
    match r.offset.checked_add(r.length) {
        Some(end) if r.block_length > 0 && r.block_length <= MAX_BLOCK && end <= r.block_length => Ok(end),
        _ => Err(Error::invalid(format!(
            "bad read range {}+{} of a block of {} bytes",
            r.offset, r.length, r.block_length
        ))),
    }
}

/// Wait until a fill has more than `pos` bytes of its block: how many it has then, or
/// why it never will.
async fn fill_past(rx: &mut watch::Receiver<FillState>, block_id: u64, pos: u64) -> Result<u64> {
    let got = rx.wait_for(|s| s.filled > pos || s.done.is_some()).await.map(|s| (s.filled, s.done));
    // A leader gone without a verdict failed.
    let (filled, done) = got.unwrap_or_else(|_| (rx.borrow().filled, Some(false)));
    if filled <= pos {
        return Err(Error::unavailable(match done {
            Some(true) => format!("block {block_id} is shorter than the read"),
            _ => format!("the fill of block {block_id} failed"),
        }));
    }
    Ok(filled)
}

/// What keeps a block in place for a co-located reader between its requests (held for
/// its `Drop`).
#[allow(dead_code)]
pub(crate) enum Held {
    Lease(Lease),
    /// A fill the reader followed: its receiver keeps the lease the fill took at commit.
    Fill(watch::Receiver<FillState>),
}

impl Inner {
    /// The UFS of the read's mount, after checking that the file still has the
    /// fingerprint the client's metadata carries: a file changed behind Locus's back is
    /// refused (before any byte is sent), never served as a mix of versions.
    async fn checked_ufs(&self, r: &pb::ReadBlockRequest) -> Result<Ufs> {
        let ufs = self.ufs_at(r.mount_id, &r.ufs_path, crate::guard::Access::Read).await?;
        Self::check_unchanged(&ufs, r).await?;
        Ok(ufs)
    }

    /// Whether the file still has the fingerprint the client's metadata carries. Asked
    /// before a UFS read and again after its last byte arrived and before that byte is
    /// handed on: a file replaced while it was read (the bytes are then a mix of two
    /// versions) is refused, never served.
    async fn check_unchanged(ufs: &Ufs, r: &pb::ReadBlockRequest) -> Result<()> {
        if !r.fingerprint.is_empty() {
            let now = ufs.stat(&r.ufs_path).await?.map(|s| s.fingerprint()).unwrap_or_default();
            if now != r.fingerprint {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!(
                        "{} changed in the UFS since its metadata was loaded ({} -> {}); it is re-read after the mount's sync interval",
                        r.ufs_path,
                        r.fingerprint,
                        if now.is_empty() { "deleted" } else { now.as_str() }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn count_served(&self, local: bool, n: u64) {
        if local {
            self.counters.local_worker.fetch_add(n, Relaxed);
        } else {
            self.counters.remote_worker.fetch_add(n, Relaxed);
        }
    }

    /// Count a data-path read by its client's host, once it is served: from this
    /// worker's cache (`cached`) or from the UFS. The reason is the client's.
    fn count_by_host(&self, r: &pb::ReadBlockRequest, cached: bool, bytes: u64) {
        let source = match (cached, r.client_local) {
            (false, _) => ReadSource::Ufs,
            (true, true) => ReadSource::LocalWorker,
            (true, false) => ReadSource::RemoteWorker,
        };
        self.counters.count_host(&r.client_host, source, ReadReason::from(r.reason()), bytes);
    }

    /// Lease a cached block (see [`locus_blockstore::BlockStore::lease`]). A MEM-tier block
    /// is leased inline ([`lease_now`](locus_blockstore::BlockStore::lease_now): the state
    /// mutex only, no file work); anything else (a promotion, a disk tier's checksum check,
    /// a miss) goes to a blocking thread. With this lease and the client's open both on
    /// blocking threads, every short-circuit block waited for two hand-offs: measured
    /// (2-core VM loaded by other builds, one-block 4 KiB reads, `fs wc --repeat`),
    /// 0.51 ms per read with both hops, 0.25 ms with neither.
    async fn lease(&self, id: u64, promote: bool) -> Result<Option<Lease>> {
        match self.store.lease_now(id, promote) {
            Some(lease) => Ok(Some(lease)),
            None => self.store_blocking(move |s| s.lease(id, promote)).await,
        }
    }

    /// A short-circuit lease over the Unix socket: the cached block's file and length for
    /// the client to read itself, and the lease that keeps it in place meanwhile.
    pub(crate) async fn grant_lease(&self, l: &pb::LeaseRequest) -> Result<(pb::DataResponse, Held)> {
        let (id, promote) = (l.block_id, l.promote);
        locus_common::fail::fail_point!("worker.lease.refuse", |_| Err(Error::not_found(format!(
            "block {id}: lease refused (fault point worker.lease.refuse)"
        ))));
        let lease = self
            .lease(id, promote)
            .await?
            .ok_or_else(|| Error::not_found(format!("block {} is not cached here", l.block_id)))?;
        self.counters.cache_hits.fetch_add(1, Relaxed);
        self.counters.short_circuit.fetch_add(l.length.min(lease.len), Relaxed);
        if l.length > 0 {
            // A lease held for many reads (length 0) is counted when it ends (`LeaseEnd`).
            let n = l.length.min(lease.len);
            self.counters.count_host(&l.client_host, ReadSource::ShortCircuit, ReadReason::ShortCircuit, n);
        }
        let r = pb::DataResponse { path: lease.path.display().to_string(), length: lease.len, ..Default::default() };
        Ok((r, Held::Lease(lease)))
    }

    /// Why a co-located reader's bytes came from a fill: the block was not cached, or
    /// (as the client says) its lease was refused, the block gone meanwhile.
    fn fill_reason(r: &pb::ReadBlockRequest) -> ReadReason {
        match ReadReason::from(r.reason()) {
            ReadReason::LeaseRefused => ReadReason::LeaseRefused,
            _ => ReadReason::NotCached,
        }
    }

    /// Serve one read request on a data connection.
    /// `hdr` becomes true once a response header went out: after that an error can only
    /// close the connection (the client sees a short read).
    pub(crate) async fn handle_read(
        self: &Arc<Self>,
        sock: &mut DataStream,
        r: pb::ReadBlockRequest,
        hdr: &mut bool,
    ) -> Result<()> {
        read_end(&r)?;
        let read_type = ReadType::from(r.read_type());
        let promote = read_type == ReadType::CachePromote;
        let (mut first, mut raced) = (true, false);
        let id = r.block_id;
        loop {
            if let Some(lease) = self.lease(id, promote).await? {
                if first {
                    self.counters.cache_hits.fetch_add(1, Relaxed);
                }
                // A block this read missed and a fill then cached came from the UFS.
                return self.send_cached(sock, &r, lease, hdr, first).await;
            }
            if first {
                self.counters.cache_misses.fetch_add(1, Relaxed);
                first = false;
            }
            if r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT {
                // Only worker copies exist: the reader must try another holder.
                return Err(Error::unavailable(format!(
                    "block {} is not here (it may have failed its checksum), and the file is not persisted",
                    r.block_id
                )));
            }
            // The UFS is next: refuse a path out of the mount's root before any fill starts.
            locus_common::path::check_ufs_rel(&r.ufs_path)?;
            if read_type == ReadType::NoCache {
                return self.send_from_ufs(sock, &r, hdr).await;
            }
            let fill = match self.fill_or_join(&r).await {
                Ok(f) => f,
                // A full cache still serves the read, uncached.
                Err(e) if e.kind() == ErrorKind::ResourceExhausted && !r.load_only => {
                    tracing::warn!(block = r.block_id, error = %e, "cannot cache block; serving it uncached");
                    return self.send_from_ufs(sock, &r, hdr).await;
                }
                // Cached by a fill that ended after the lease above missed: lease it.
                Err(e) if e.kind() == ErrorKind::AlreadyExists && !raced => {
                    raced = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match fill {
                Fill::Leader(mut rx, task) => {
                    let joined = !r.load_only && self.join_fill(sock, &r, &mut rx, hdr).await?;
                    let res = task.await.unwrap_or_else(|e| Err(Error::internal(format!("block fill task: {e}"))));
                    if joined {
                        // The reader has its bytes, whatever became of the rest of the block.
                        return Ok(());
                    }
                    res?;
                    if r.load_only {
                        return write_frame(sock, &pb::DataResponse { cached: true, ..Default::default() }).await;
                    }
                    // cached meanwhile (the fill ended before this reader joined)
                }
                Fill::Waiter(mut rx) => {
                    if !r.load_only && self.join_fill(sock, &r, &mut rx, hdr).await? {
                        return Ok(());
                    }
                    let _ = rx.wait_for(|v| v.done.is_some()).await;
                }
            }
        }
    }

    /// Become the filler of a missing block (the fill runs on a task of its own, so no
    /// reader, this one included, can hold it back: every reader follows the block file
    /// as it grows), or join the fill in progress. Fails when the block cannot be cached
    /// (`ResourceExhausted`: no room).
    async fn fill_or_join(self: &Arc<Self>, r: &pb::ReadBlockRequest) -> Result<Fill> {
        let tx = {
            let mut inflight = self.inflight.lock();
            if let Some(rx) = inflight.get(&r.block_id) {
                return Ok(Fill::Waiter(rx.clone()));
            }
            let (tx, rx) = watch::channel(FillState::default());
            inflight.insert(r.block_id, rx);
            tx
        };
        let rx = tx.subscribe();
        let (me, req) = (self.clone(), r.clone());
        // The task reserves the space first (on a blocking thread: it may evict), and
        // tells whether it could; it ends the fill whatever becomes of this reader.
        let (created_tx, created) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let (id, len) = (req.block_id, req.block_length);
            let res = match me.store_blocking(move |s| s.create(id, len).map(DropOffRuntime::new)).await {
                Ok(temp) => {
                    let _ = created_tx.send(None);
                    me.fill(&req, temp, &tx).await
                }
                Err(e) => {
                    let _ = created_tx.send(Some(e));
                    Err(Error::internal(format!("block {id} had no room to be filled")))
                }
            };
            me.inflight.lock().remove(&req.block_id);
            // The master learns of the block before any reader is told the fill ended,
            // so `load`, a read or a compute followed by `stat` shows it cached.
            let _ = me.commit_changes().await;
            tx.send_modify(|s| s.done = Some(res.is_ok()));
            res
        });
        match created.await {
            Ok(None) => Ok(Fill::Leader(rx, task)),
            Ok(Some(e)) => Err(e),
            Err(_) => Err(Error::internal("the block fill task ended before it started")),
        }
    }

    /// A co-located client's read, over the Unix socket: no bytes go through the socket.
    /// A cached block is leased, as for a short-circuit read; a miss joins or starts the
    /// block's fill, and the reader gets the fill's file and frames telling how far it
    /// has grown, and reads the file itself (one copy less than the data path, and no
    /// socket). Returns what keeps the block in place until the reader's next request
    /// or until it hangs up.
    pub(crate) async fn follow_read(self: &Arc<Self>, sock: &mut UnixStream, r: pb::ReadBlockRequest) -> Result<Held> {
        let end = read_end(&r)?;
        locus_common::fail::fail_point!("worker.lease.refuse", |_| Err(Error::not_found(format!(
            "block {}: lease refused (fault point worker.lease.refuse)",
            r.block_id
        ))));
        let read_type = ReadType::from(r.read_type());
        let (mut first, mut raced) = (true, false);
        let (id, promote) = (r.block_id, read_type == ReadType::CachePromote);
        loop {
            if let Some(lease) = self.lease(id, promote).await? {
                if lease.len < end {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("cached block {} is shorter than requested", r.block_id),
                    ));
                }
                if first {
                    self.counters.cache_hits.fetch_add(1, Relaxed);
                }
                self.counters.short_circuit.fetch_add(r.length, Relaxed);
                // A block this read missed and a fill then cached (one that committed
                // before the reader could follow its file) came from the UFS.
                let (source, why) = if first {
                    (ReadSource::ShortCircuit, ReadReason::ShortCircuit)
                } else {
                    (ReadSource::Ufs, Self::fill_reason(&r))
                };
                self.counters.count_host(&r.client_host, source, why, r.length);
                let path = lease.path.display().to_string();
                let resp = pb::DataResponse {
                    filled: lease.len,
                    block_path: path.clone(),
                    path,
                    length: lease.len,
                    cached: true,
                    ..Default::default()
                };
                write_frame(sock, &resp).await?;
                return Ok(Held::Lease(lease));
            }
            if first {
                self.counters.cache_misses.fetch_add(1, Relaxed);
                first = false;
            }
            if read_type == ReadType::NoCache || r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT {
                // Bytes that are not to be cached, or only other workers have: the data path.
                return Err(Error::not_found(format!("block {} is not cached here", r.block_id)));
            }
            let mut rx = match self.fill_or_join(&r).await {
                Ok(Fill::Leader(rx, _) | Fill::Waiter(rx)) => rx,
                // Cached by a fill that ended after the lease above missed: lease it.
                Err(e) if e.kind() == ErrorKind::AlreadyExists && !raced => {
                    raced = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let st = match rx.wait_for(|s| s.path.is_some() || s.done.is_some()).await {
                Ok(s) => s.clone(),
                Err(_) => FillState { done: Some(false), ..Default::default() },
            };
            let (Some(path), Some(block_path)) = (st.path, st.final_path) else {
                if st.done == Some(true) {
                    continue; // cached before it had a file to follow: lease it
                }
                return Err(Error::unavailable(format!("the fill of block {} failed", r.block_id)));
            };
            let head = pb::DataResponse {
                path: path.display().to_string(),
                block_path: block_path.display().to_string(),
                length: r.block_length,
                filled: st.filled,
                ..Default::default()
            };
            write_frame(sock, &head).await?;
            let mut told = st.filled;
            while told < end {
                let filled = fill_past(&mut rx, r.block_id, told).await?;
                write_frame(sock, &pb::DataResponse { filled, ..Default::default() }).await?;
                told = filled;
            }
            self.counters.short_circuit.fetch_add(r.length, Relaxed);
            // By host, each byte once, by where it came from: the UFS. (A client whose
            // lease was refused, the block gone meanwhile, says so.)
            self.counters.count_host(&r.client_host, ReadSource::Ufs, Self::fill_reason(&r), r.length);
            // The fill's lease (taken at its commit) lives as long as this receiver.
            return Ok(Held::Fill(rx));
        }
    }

    /// Where the bytes of a whole block come from for a reader inside the worker (the
    /// near-data compute): the cached block's file, leased; on a miss the file of the
    /// fill this call starts or joins, readable as far as the fill has got; or, when
    /// the block cannot be cached (no room), the UFS itself.
    pub(crate) async fn open_for_scan(self: &Arc<Self>, r: &pb::ReadBlockRequest) -> Result<ScanSource> {
        read_end(r)?;
        let (mut first, mut raced, mut renamed) = (true, false, 0);
        loop {
            if let Some(lease) = self.lease(r.block_id, false).await? {
                if first {
                    self.counters.cache_hits.fetch_add(1, Relaxed);
                }
                let lease = DropOffRuntime::new(lease);
                let path = lease.path.clone();
                let file = crate::blocking(move || std::fs::File::open(path))
                    .await?
                    .map_err(|e| Error::io("open block", e))?;
                return Ok(ScanSource::Cached { file: Arc::new(file), len: lease.len, _lease: lease });
            }
            if first {
                self.counters.cache_misses.fetch_add(1, Relaxed);
                first = false;
            }
            if r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT {
                return Err(Error::unavailable(format!(
                    "block {} is not here, and the file is not persisted",
                    r.block_id
                )));
            }
            let mut rx = match self.fill_or_join(r).await {
                Ok(Fill::Leader(rx, _) | Fill::Waiter(rx)) => rx,
                Err(e) if e.kind() == ErrorKind::AlreadyExists && !raced => {
                    raced = true;
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::ResourceExhausted => {
                    tracing::warn!(block = r.block_id, error = %e, "cannot cache block; computing from the UFS");
                    let ufs = self.checked_ufs(r).await?;
                    let s = ufs
                        .read_range(
                            &r.ufs_path,
                            r.file_offset,
                            r.block_length,
                            crate::UFS_PIECE,
                            crate::UFS_READS_IN_FLIGHT,
                        )
                        .await?;
                    return Ok(ScanSource::Ufs(Box::pin(s)));
                }
                Err(e) => return Err(e),
            };
            let st = match rx.wait_for(|s| s.path.is_some() || s.done.is_some()).await {
                Ok(s) => s.clone(),
                Err(_) => FillState { done: Some(false), ..Default::default() },
            };
            let Some(path) = st.path else {
                if st.done == Some(true) {
                    continue; // cached before it had a file to follow: lease it
                }
                return Err(Error::unavailable(format!("the fill of block {} failed", r.block_id)));
            };
            // The open descriptor stays valid across the commit's rename; a fill that
            // committed before the open has renamed the file: the block is cached, lease it.
            match crate::blocking(move || std::fs::File::open(path)).await? {
                Ok(file) => return Ok(ScanSource::Filling { file: Arc::new(file), rx, block_id: r.block_id }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && renamed < 3 => renamed += 1,
                Err(e) => return Err(Error::io("open block", e)),
            }
        }
    }

    /// Serve a read from a fill in progress: what the leader has written so far at once,
    /// the rest as it arrives (so a reader never waits for a whole block to land). Returns
    /// false, having sent nothing, when the fill has no file to follow (not created yet
    /// and then failed, or already committed): the caller then takes the cached copy.
    async fn join_fill(
        &self,
        sock: &mut DataStream,
        r: &pb::ReadBlockRequest,
        rx: &mut watch::Receiver<FillState>,
        hdr: &mut bool,
    ) -> Result<bool> {
        // (The failpoint tests let the fill commit before this reader follows it.)
        locus_common::delay_point("worker.fill.follow").await;
        let path = match rx.wait_for(|s| s.path.is_some() || s.done.is_some()).await {
            Ok(s) => s.path.clone(),
            Err(_) => None,
        };
        // The open descriptor stays valid across the commit's rename.
        let Some(path) = path else { return Ok(false) };
        let Ok(Ok(file)) = crate::blocking(move || std::fs::File::open(path)).await else { return Ok(false) };
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await?;
        *hdr = true;
        let (mut pos, end) = (r.offset, r.offset + r.length);
        while pos < end {
            let filled = fill_past(rx, r.block_id, pos).await?;
            let n = sendfile(sock, &file, pos, filled.min(end) - pos).await.map_err(|e| Error::io("send block", e))?;
            pos += n;
            self.count_served(r.client_local, n);
        }
        self.count_by_host(r, false, r.length);
        Ok(true)
    }

    async fn send_cached(
        &self,
        sock: &mut DataStream,
        r: &pb::ReadBlockRequest,
        lease: Lease,
        hdr: &mut bool,
        hit: bool,
    ) -> Result<()> {
        // The last lease of a block removed meanwhile deletes its file as it drops.
        let lease = DropOffRuntime::new(lease);
        if r.load_only {
            return write_frame(sock, &pb::DataResponse { cached: true, ..Default::default() }).await;
        }
        if r.offset + r.length > lease.len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("cached block {} is shorter than requested", r.block_id),
            ));
        }
        let path = lease.path.clone();
        let file = crate::blocking(move || std::fs::File::open(path)).await?.map_err(|e| Error::io("open block", e))?;
        let crc = if r.offset == 0 && r.length == lease.len { self.store.crc(r.block_id) } else { None };
        let head = pb::DataResponse {
            length: r.length,
            cached: true,
            has_crc: crc.is_some(),
            crc32c: crc.unwrap_or(0),
            ..Default::default()
        };
        write_frame(sock, &head).await?;
        *hdr = true;
        if r.length == 0 {
            return Ok(());
        }
        // Zero-copy from the block file to the socket. The lease keeps the file in place.
        // (`sendfile` runs inline, on a non-blocking socket: it reads a cached block's
        // pages from the page cache, tmpfs for the MEM tier, and sends at most one chunk
        // per call; a hop to a blocking thread per chunk would cost more than it saves.)
        let (mut off, mut left) = (r.offset, r.length);
        while left > 0 {
            let n = sendfile(sock, &file, off, left.min(self.cfg.chunk_size.as_u64()))
                .await
                .map_err(|e| Error::io("send block", e))?;
            off += n;
            left -= n;
            self.count_served(r.client_local, n);
        }
        self.count_by_host(r, hit, r.length);
        drop(lease);
        Ok(())
    }

    /// NO_CACHE miss: stream the range from the UFS without keeping it.
    async fn send_from_ufs(&self, sock: &mut DataStream, r: &pb::ReadBlockRequest, hdr: &mut bool) -> Result<()> {
        let ufs = self.checked_ufs(r).await?;
        let mut s = Box::pin(
            ufs.read_range(
                &r.ufs_path,
                r.file_offset + r.offset,
                r.length,
                crate::UFS_PIECE,
                crate::UFS_READS_IN_FLIGHT,
            )
            .await?,
        );
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await?;
        *hdr = true;
        let mut sent = 0;
        // Each piece goes out when the next one has arrived; the last only once the file
        // is known not to have changed while it was read.
        let mut held: Option<Bytes> = None;
        loop {
            let next = s.next().await.transpose()?;
            if next.is_none() {
                Self::check_unchanged(&ufs, r).await?;
            }
            if let Some(b) = held.take() {
                sock.write_all(&b).await.map_err(|e| Error::io("send block", e))?;
                self.count_served(r.client_local, b.len() as u64);
                sent += b.len() as u64;
            }
            let Some(b) = next else { break };
            self.counters.ufs.fetch_add(b.len() as u64, Relaxed);
            held = Some(b);
        }
        if sent != r.length {
            return Err(Error::new(ErrorKind::Ufs, format!("UFS returned {sent} of {} bytes (changed?)", r.length)));
        }
        self.count_by_host(r, false, sent);
        Ok(())
    }

    /// Cache miss: read the whole block from the UFS into `temp`, publishing progress so
    /// that readers stream it as it arrives (`join_fill`).
    async fn fill(
        &self,
        r: &pb::ReadBlockRequest,
        temp: DropOffRuntime<TempBlock>,
        progress: &watch::Sender<FillState>,
    ) -> Result<()> {
        let ufs = self.checked_ufs(r).await?;
        let mut stream = Box::pin(
            ufs.read_range(&r.ufs_path, r.file_offset, r.block_length, crate::UFS_PIECE, crate::UFS_READS_IN_FLIGHT)
                .await?,
        );
        let (temp, mut file) = crate::blocking(move || temp.open().map(|f| (temp, f))).await??;
        progress.send_modify(|s| {
            s.path = Some(temp.path.clone());
            s.final_path = Some(temp.final_path.clone());
        });
        let mut pos = 0u64;
        let mut crc = 0u32;
        // Network chunks (tens of KiB) are written out, on a blocking thread, per
        // FILL_NOTIFY bytes, and readers are woken then: fewer hops and wake-ups, and
        // larger sendfile calls.
        let mut pending = Vec::new();
        let mut stream_ended = false;
        while !stream_ended {
            match stream.next().await {
                Some(b) => {
                    let b: Bytes = b?;
                    crc = crc32c::crc32c_append(crc, &b);
                    self.counters.ufs.fetch_add(b.len() as u64, Relaxed);
                    pos += b.len() as u64;
                    pending.push(b);
                    if pos - progress.borrow().filled < FILL_NOTIFY {
                        continue;
                    }
                }
                None => {
                    stream_ended = true;
                    // Before the last bytes reach a reader: the file was not replaced
                    // while it was read (a mix of two versions is never served).
                    Self::check_unchanged(&ufs, r).await?;
                }
            }
            if !pending.is_empty() {
                file = write_block_file(file, std::mem::take(&mut pending)).await?;
            }
            progress.send_if_modified(|st| std::mem::replace(&mut st.filled, pos) != pos);
        }
        if pos != r.block_length {
            return Err(Error::new(
                ErrorKind::Ufs,
                format!("UFS returned {pos} of {} bytes for block {} (file changed?)", r.block_length, r.block_id),
            ));
        }
        locus_common::fail::fail_point!("worker.fill.before_commit", |_| Err(Error::internal("failpoint")));
        let temp = temp.into_inner();
        let lease = crate::blocking(move || temp.commit_leased(pos, Some(crc))).await??;
        progress.send_modify(|s| s.lease = Some(Arc::new(lease)));
        Ok(())
    }
}

/// Up to `len` bytes of `file` at `off` to the socket; returns the bytes sent. Plain TCP:
/// `sendfile(2)`, zero-copy. Under TLS the bytes must be encrypted here: at most 1 MiB is
/// read with `pread` (inline, as `sendfile` reads: a cached block's pages, tmpfs for the
/// MEM tier) and written through the TLS stream.
async fn sendfile(sock: &mut DataStream, file: &std::fs::File, off: u64, len: u64) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let Some(tcp) = sock.plain() else {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let n = file.read_at(&mut buf, off)?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        sock.write_all(&buf[..n]).await?;
        return Ok(n as u64);
    };
    loop {
        tcp.writable().await?;
        let r = tcp.try_io(tokio::io::Interest::WRITABLE, || {
            let mut o = off as libc::off_t;
            // SAFETY: both descriptors are open for the duration of the call.
            let n = unsafe { libc::sendfile(tcp.as_raw_fd(), file.as_raw_fd(), &mut o, len as usize) };
            if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as u64) }
        });
        match r {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
