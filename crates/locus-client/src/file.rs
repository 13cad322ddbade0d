//! Open files for the front ends that read and write a file piece by piece from their
//! own threads (the Hadoop connector, the Python client, the FUSE mount): a
//! [`FileReader`] reads any range of a file as it was when opened, starting the fill of
//! the blocks ahead once each; a [`FileWriter`] feeds a new file's bytes to one put
//! running on the client's runtime. Both are async; a blocking front end runs them with
//! its runtime's `block_on`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::{Client, PutOptions, ReadOptions};

/// A file open for reading: its blocks as of the open, the blocks whose fill this
/// reader started (read-ahead, once per block) and where they landed, and a
/// short-circuit lease on each of the blocks it read most recently.
pub struct FileReader {
    client: Arc<Client>,
    fi: Arc<pb::FileInfo>,
    read_ahead: usize,
    fetched: Mutex<HashSet<usize>>,
    /// Block index → the worker its read-ahead filled it on (the open's locations
    /// predate the fill).
    landed: Arc<Mutex<HashMap<usize, u64>>>,
    /// The blocks this reader read short-circuit most recently (up to [`LEASES_HELD`],
    /// the most recent last), each held until it is the oldest of too many.
    leased: Mutex<VecDeque<Arc<Leased>>>,
    /// Blocks no co-located worker would lease: read through the client's read path.
    unleased: Mutex<HashSet<usize>>,
}

/// Blocks a reader keeps leased at most: random reads over a file of up to this many
/// blocks (1 GiB of 64 MiB blocks) pay one lease per block, not one per read, and an
/// open file keeps no more than this many blocks from eviction.
const LEASES_HELD: usize = 16;

/// A block leased from a co-located worker for the reads that follow: its file stays in
/// place, and open here, until the connection that took the lease closes (when the
/// reader moves to another block or is dropped). A read then costs one `pread` straight
/// into the caller's buffer, where the client's read path pays a connection, a lease and
/// an open per call.
struct Leased {
    block: usize,
    file: std::fs::File,
    length: u64,
    /// Bytes read under the lease: told to the worker when it ends (it counts them as
    /// short-circuit; the grant counted none).
    read: std::sync::atomic::AtomicU64,
    /// A plain socket, not a Tokio one: it may be dropped on any thread, or in a forked
    /// child whose runtime never ran.
    conn: std::os::unix::net::UnixStream,
}

impl Drop for Leased {
    fn drop(&mut self) {
        use std::io::Write;
        let bytes_read = self.read.load(std::sync::atomic::Ordering::Relaxed);
        let end = pb::DataRequest::from(pb::data_request::Req::LeaseEnd(pb::LeaseEnd { bytes_read }));
        // A few bytes into an idle socket's buffer: never blocks. A worker that is gone
        // has nothing left to count.
        let _ = (&self.conn).write_all(&locus_proto::frame(&end));
    }
}

impl FileReader {
    /// Opens `path` (one master call: its status with its blocks). A directory is
    /// `NotFound` for a reader, as in HDFS; the front end names it in its own terms.
    pub async fn open(client: Arc<Client>, path: &str) -> Result<FileReader> {
        let fi = client.status(path, true).await?;
        if fi.is_dir {
            return Err(Error::new(ErrorKind::IsADirectory, format!("{path} is a directory")));
        }
        Ok(FileReader::from_info(client, fi))
    }

    /// A reader of a file whose status (with its blocks) the caller holds already.
    pub fn from_info(client: Arc<Client>, fi: pb::FileInfo) -> FileReader {
        let read_ahead = client.cfg.read_ahead_blocks;
        FileReader {
            client,
            fi: Arc::new(fi),
            read_ahead,
            fetched: Mutex::new(HashSet::new()),
            landed: Arc::default(),
            leased: Mutex::new(VecDeque::new()),
            unleased: Mutex::new(HashSet::new()),
        }
    }

    /// The file's status as of the open.
    pub fn info(&self) -> &pb::FileInfo {
        &self.fi
    }

    /// Copies `min(buf.len(), length - pos)` bytes at `pos` into `buf` (fewer only on an
    /// error); 0 at or past the end.
    pub async fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<usize> {
        let fi = &self.fi;
        if pos >= fi.length || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(fi.length - pos) as usize;
        let mut done = 0;
        while done < len {
            let at = pos + done as u64;
            let k = fi.blocks.iter().position(|b| b.offset <= at && at < b.offset + b.length);
            let Some(k) = k else { return Err(Error::internal(format!("no block covers offset {at} of {}", fi.path))) };
            self.read_ahead_from(k);
            let b = &fi.blocks[k];
            let n = ((b.offset + b.length - at) as usize).min(len - done);
            let piece = &mut buf[done..done + n];
            if !self.read_leased(k, at - b.offset, piece).await {
                let mut out = std::io::Cursor::new(&mut *piece);
                let opts = ReadOptions { read_ahead_blocks: Some(0), ..Default::default() };
                let got = self.client.read_to(fi, at, n as u64, opts, &mut out).await?;
                if got != n as u64 {
                    return Err(Error::internal(format!("read {got} of {n} bytes at {at} of {}", fi.path)));
                }
            }
            done += n;
        }
        Ok(len)
    }

    /// Read-ahead: the fill of the blocks after block `k`, started once per block by this
    /// reader and left running when the read returns (a fill belongs to the worker, not
    /// to the request that started it).
    fn read_ahead_from(&self, k: usize) {
        let fi = &self.fi;
        for j in k + 1..=k + self.read_ahead {
            match fi.blocks.get(j) {
                Some(b) if b.locations.is_empty() && self.fetched.lock().insert(j) => {
                    let (client, fi, landed) = (self.client.clone(), fi.clone(), self.landed.clone());
                    let b = b.clone();
                    tokio::spawn(async move {
                        match client.load_block(&fi, &b).await {
                            Ok(w) => {
                                landed.lock().insert(j, w);
                            }
                            Err(e) => tracing::debug!(error = %e, block = b.block_id, "read-ahead failed"),
                        }
                    });
                }
                _ => {}
            }
        }
    }

    /// Reads `buf.len()` bytes at `off` of block `k` from the block's file, under a lease
    /// this reader holds (taking one from a co-located holder first). False where there
    /// is none to take; the caller then uses the client's read path.
    async fn read_leased(&self, k: usize, off: u64, buf: &mut [u8]) -> bool {
        use std::os::unix::fs::FileExt;
        let held = self.leased.lock().iter().find(|l| l.block == k).cloned();
        let lease = match held {
            Some(l) => l,
            None => match self.take_lease(k).await {
                Some(l) => l,
                None => return false,
            },
        };
        if off + buf.len() as u64 <= lease.length && lease.file.read_exact_at(buf, off).is_ok() {
            lease.read.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.client.count_read(locus_common::metrics::ReadReason::ShortCircuit, buf.len() as u64);
            return true;
        }
        // A short or failed read of a leased file: let it go, and read another way.
        self.leased.lock().retain(|l| !Arc::ptr_eq(l, &lease));
        self.unleased.lock().insert(k);
        false
    }

    async fn take_lease(&self, k: usize) -> Option<Arc<Leased>> {
        let l = self.lease_block(k).await?;
        // The oldest lease beyond the limit is let go once its last read ends.
        let mut held = self.leased.lock();
        held.push_back(l.clone());
        if held.len() > LEASES_HELD {
            held.pop_front();
        }
        Some(l)
    }

    /// A lease on block `k` from a co-located holder (held reused), or `None`.
    async fn lease_block(&self, k: usize) -> Option<Arc<Leased>> {
        if let Some(l) = self.leased.lock().iter().find(|l| l.block == k) {
            return Some(l.clone());
        }
        let c = &self.client;
        if !c.cfg.short_circuit || self.unleased.lock().contains(&k) {
            return None;
        }
        let b = &self.fi.blocks[k];
        let landed = self.landed.lock().get(&k).copied();
        let holders: Vec<u64> = b.locations.iter().map(|l| l.worker_id).chain(landed).collect();
        if holders.is_empty() {
            // Not cached as of the open: the read path fills it (a later read may lease
            // it once its read-ahead has landed).
            return None;
        }
        for w in c.workers(false).await.ok()?.iter().filter(|w| holders.contains(&w.worker_id)) {
            if !c.is_local(w).await {
                continue;
            }
            // Length 0: the reads are counted when the lease ends (`Leased`'s drop).
            let Ok((conn, r)) = c.lease(w, b.block_id, 0, c.cfg.read_type).await else { continue };
            // Opened inline, as the client's own short-circuit read does: the worker has
            // just leased this file, so the open is a lookup in the kernel's caches.
            let (Ok(file), Ok(conn)) = (std::fs::File::open(&r.path), conn.into_std()) else { continue };
            return Some(Arc::new(Leased { block: k, file, length: r.length, read: Default::default(), conn }));
        }
        self.unleased.lock().insert(k);
        None
    }
}

impl FileReader {
    /// The whole file as one read-only mapping of its block files, each leased from a
    /// co-located worker for as long as the mapping lives: reads of it are loads from
    /// the page cache, with no copy and no call (PyArrow's buffers point into it).
    /// `None` when a block has no co-located holder (not cached, another host, no
    /// short-circuit), the file is empty or has more than [`MAP_BLOCKS_MAX`] blocks, or
    /// a block does not start on a page boundary.
    pub async fn map(&self) -> Result<Option<FileMap>> {
        let fi = &self.fi;
        let page = page_size();
        if fi.length == 0 || fi.blocks.len() > MAP_BLOCKS_MAX || fi.blocks.iter().any(|b| b.offset % page != 0) {
            return Ok(None);
        }
        let mut leases = Vec::with_capacity(fi.blocks.len());
        for k in 0..fi.blocks.len() {
            match self.lease_block(k).await {
                Some(l) if l.length >= fi.blocks[k].length => leases.push(l),
                _ => return Ok(None),
            }
        }
        let reserved = fi.length.div_ceil(page) * page;
        // SAFETY: a fresh anonymous reservation (no access) that nothing else refers to;
        // each block's file is then mapped read-only over its part with MAP_FIXED, which
        // replaces only pages of this reservation. The leases keep the files in place
        // (the worker neither removes nor rewrites a leased block's file) and the
        // mapping holds them until it is unmapped in `FileMap`'s drop.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                reserved as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(Error::io("reserve a file's mapping", std::io::Error::last_os_error()));
            }
            let map =
                FileMap { base: base.cast(), len: fi.length as usize, reserved: reserved as usize, _leases: leases };
            for (b, l) in fi.blocks.iter().zip(&map._leases) {
                use std::os::fd::AsRawFd;
                let at = map.base.add(b.offset as usize).cast();
                let len = (b.length.div_ceil(page) * page) as usize;
                let got =
                    libc::mmap(at, len, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_FIXED, l.file.as_raw_fd(), 0);
                if got == libc::MAP_FAILED {
                    return Err(Error::io("map a block's file", std::io::Error::last_os_error()));
                }
                l.read.fetch_add(b.length, std::sync::atomic::Ordering::Relaxed);
            }
            self.client.count_read(locus_common::metrics::ReadReason::ShortCircuit, fi.length);
            Ok(Some(map))
        }
    }
}

/// Blocks a [`FileMap`] leases at most (16 GiB of 64 MiB blocks): each lease is a
/// connection to the worker, and keeps its block from eviction while the map lives.
pub const MAP_BLOCKS_MAX: usize = 256;

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// A file mapped from its leased block files ([`FileReader::map`]).
pub struct FileMap {
    base: *mut u8,
    len: usize,
    reserved: usize,
    /// Held for as long as the mapping: the files stay in place.
    _leases: Vec<Arc<Leased>>,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for FileMap {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes from `base` are mapped read-only for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation `map` made (the blocks' mappings lie
        // within it); no borrow of `bytes` outlives `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.reserved);
        }
    }
}

/// A new file being written: its chunks go, in order, to the put that
/// [`create`](FileWriter::create) started on the current runtime. Nothing is visible
/// until [`finish`](FileWriter::finish) returns; [`abort`](FileWriter::abort) (or a
/// drop without `finish`) leaves no file.
pub struct FileWriter {
    rt: tokio::runtime::Handle,
    /// Fires when the put first reads its input: the master created the file and the
    /// workers' pipeline is open.
    started: Option<tokio::sync::oneshot::Receiver<()>>,
    tx: Option<mpsc::Sender<std::io::Result<Bytes>>>,
    task: Option<tokio::task::JoinHandle<Result<pb::FileInfo>>>,
    written: u64,
}

impl FileWriter {
    /// Starts writing `path` (on the current Tokio runtime).
    pub fn create(client: Arc<Client>, path: String, opts: PutOptions) -> FileWriter {
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let stream = tokio_util::io::StreamReader::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            let mut input = FirstRead { inner: stream, started: Some(started_tx) };
            client.put_with(&path, &mut input, &opts, |_| Ok(pb::ObjectMeta::default())).await
        });
        FileWriter {
            rt: tokio::runtime::Handle::current(),
            started: Some(started),
            tx: Some(tx),
            task: Some(task),
            written: 0,
        }
    }

    /// Waits until the file is open for writing (the master created it and the
    /// pipeline to the workers is up), so that a refusal (a read-only mount, a file that
    /// exists, a path through a file) is known before any byte is written.
    pub async fn ready(&mut self) -> Result<()> {
        let Some(started) = self.started.take() else { return Ok(()) };
        let Some(task) = self.task.as_mut() else { return Ok(()) };
        let ended = tokio::select! {
            r = started => match r {
                Ok(()) => return Ok(()),
                // The put dropped its input unread: it ended, and its result says why.
                Err(_) => task.await,
            },
            r = &mut *task => r,
        };
        self.tx = None;
        self.task = None;
        match ended {
            Ok(Ok(_)) => Err(Error::internal("the write ended before its input")),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(Error::internal(format!("the write task failed: {e}"))),
        }
    }

    /// Bytes handed to [`write`](FileWriter::write) so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `chunk`. Fails with the put's own error when the put ended early.
    pub async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let n = chunk.len() as u64;
        let sent = match &self.tx {
            Some(tx) => tx.send(Ok(chunk)).await.is_ok(),
            None => return Err(Error::new(ErrorKind::FailedPrecondition, "the file is closed")),
        };
        if sent {
            self.written += n;
            return Ok(());
        }
        // The put ended early: its error says why.
        self.finish().await.and(Err(Error::internal("the write ended before its input")))
    }

    /// Ends the input and waits for the write to be acknowledged (per its write type).
    pub async fn finish(&mut self) -> Result<Option<pb::FileInfo>> {
        self.tx = None;
        match self.task.take() {
            Some(t) => match t.await {
                Ok(r) => r.map(Some),
                Err(e) => Err(Error::internal(format!("the write task failed: {e}"))),
            },
            None => Ok(None),
        }
    }

    /// Abandons the write: the worker drops what it received and nothing is acknowledged.
    pub async fn abort(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Err(std::io::Error::other("the writer aborted"))).await;
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

/// An input that tells, once, when it is first read.
struct FirstRead<R> {
    inner: R,
    started: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for FirstRead<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Some(tx) = self.started.take() {
            let _ = tx.send(());
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        // Dropped without `finish`: end the input with an error, so the put is abandoned
        // rather than completed with what it got (a plain drop of the sender would read
        // as the end of the file).
        if let Some(tx) = self.tx.take() {
            self.rt.spawn(async move {
                let _ = tx.send(Err(std::io::Error::other("the writer was dropped"))).await;
            });
        }
    }
}
