//! Whole-block copies: persisting a file's blocks to the UFS, and re-replicating a block
//! from a peer; both (and a write that spills to the UFS) read blocks through
//! [`BlockSource`], from this worker's store or from another worker.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures::StreamExt;
use locus_blockstore::Lease;
use locus_common::security::Role;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::tls::DataStream;
use locus_proto::{exchange, pb, write_frame};
use tokio::io::AsyncReadExt;

use crate::{DropOffRuntime, Inner};

impl Inner {
    /// Write a file's cached blocks to the UFS (the master's persist scheduler asks, as
    /// leader in `term`). Refused when a later term is known, before the UFS is touched
    /// and again before its object is replaced: a deposed leader's persist, still under
    /// way when the new leader was heard of, leaves the UFS as it was.
    pub(crate) async fn handle_persist(&self, sock: &mut DataStream, p: pb::PersistRequest, term: u64) -> Result<()> {
        self.fence.admit(term).await?;
        let ufs = self.ufs_at(p.mount_id, &p.ufs_path, crate::guard::Access::Write).await?;
        let addrs: HashMap<u64, String> = p.workers.iter().map(|w| (w.worker_id, w.data_address.clone())).collect();
        let mut writer = ufs.writer(&p.ufs_path, &p.content_type, &p.user_metadata).await?;
        let res: Result<u64> = async {
            let mut total = 0;
            if p.from_ufs {
                // The object stays whole in the UFS until the new one replaces it at close.
                let mut s = Box::pin(
                    ufs.read_range(&p.ufs_path, 0, p.length, crate::UFS_PIECE, crate::UFS_COPY_READS_IN_FLIGHT).await?,
                );
                while let Some(chunk) = s.next().await {
                    let chunk = chunk?;
                    total += chunk.len() as u64;
                    writer.write(chunk).await?;
                }
            }
            for b in &p.blocks {
                let sources: Vec<String> =
                    b.locations.iter().filter_map(|l| addrs.get(&l.worker_id).cloned()).collect();
                let mut src = self.open_block(b.block_id, b.length, &sources).await?;
                while let Some(chunk) = src.next().await? {
                    total += chunk.len() as u64;
                    writer.write(chunk).await?;
                }
            }
            locus_common::fail::fail_point!("worker.persist.before_commit", |_| Err(Error::internal("failpoint")));
            locus_common::delay_point("worker.persist.before_close").await;
            self.fence.check(term)?;
            Ok(total)
        }
        .await;
        let total = match res {
            Ok(t) => t,
            Err(e) => {
                writer.abort().await;
                return Err(e);
            }
        };
        let st = writer.close().await?;
        if st.length != total {
            return Err(Error::new(ErrorKind::Ufs, format!("UFS holds {} bytes after persisting {total}", st.length)));
        }
        write_frame(
            sock,
            &pb::DataResponse { length: st.length, etag: st.etag, mtime_ms: st.mtime_ms, ..Default::default() },
        )
        .await
    }

    /// Copy a block from another worker into this one's store (re-replication, the
    /// master's order as leader in `term`).
    pub(crate) async fn handle_replicate(
        &self,
        sock: &mut DataStream,
        r: pb::ReplicateRequest,
        term: u64,
    ) -> Result<()> {
        self.fence.admit(term).await?;
        if !self.store.contains(r.block_id) {
            let mut src = self.open_block(r.block_id, r.length, &r.sources).await?;
            let (id, len) = (r.block_id, r.length);
            let (temp, mut f) = self
                .store_blocking(move |s| {
                    let t = s.create(id, len)?;
                    let f = t.open()?;
                    Ok((DropOffRuntime::new(t), f))
                })
                .await?;
            let (mut n, mut crc) = (0u64, 0u32);
            while let Some(chunk) = src.next().await? {
                crc = crc32c::crc32c_append(crc, &chunk);
                n += chunk.len() as u64;
                f = write_block_file(f, vec![chunk]).await?;
            }
            if let Some(want) = src.crc()
                && want != crc
            {
                self.counters.corrupt.fetch_add(1, Relaxed);
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("block {} arrived with crc32c {crc:08x}, not {want:08x}", r.block_id),
                ));
            }
            let temp = temp.into_inner();
            crate::blocking(move || temp.commit(n, Some(crc))).await??;
            self.commit_changes().await?;
        }
        write_frame(sock, &pb::DataResponse { length: r.length, ..Default::default() }).await
    }

    /// A block's bytes: from this worker's store, else from the first of `sources` (data
    /// addresses of other holders) that serves it.
    pub(crate) async fn open_block(&self, block_id: u64, length: u64, sources: &[String]) -> Result<BlockSource> {
        if let Some(lease) = self.store_blocking(move |s| s.lease(block_id, false)).await? {
            let lease = DropOffRuntime::new(lease);
            if lease.len != length {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("block {block_id} has {} bytes, not {length}", lease.len),
                ));
            }
            return BlockSource::local(lease.path.clone(), length, Some(lease)).await;
        }
        let mut last = Error::unavailable(format!("no live copy of block {block_id}"));
        for addr in sources.iter().filter(|a| **a != self.data_address) {
            let req = pb::ReadBlockRequest {
                block_id,
                offset: 0,
                length,
                block_length: length,
                read_type: pb::ReadType::NoCache.into(),
                // Never filled from the UFS: these bytes are not there (yet).
                fingerprint: locus_common::UNPERSISTED_FINGERPRINT.into(),
                ..Default::default()
            };
            let r = async {
                let s = self.tls.connect(addr, "worker").await?;
                let mut s = tokio::io::BufReader::with_capacity(1 << 20, s);
                locus_proto::authenticate(&mut s, &self.verifier.identity(Role::Worker)).await?;
                let r = exchange(&mut s, pb::data_request::Req::Read(req)).await?;
                Ok(BlockSource::Peer { sock: s, left: length, crc: r.has_crc.then_some(r.crc32c) })
            }
            .await;
            match r {
                Ok(src) => return Ok(src),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Append `chunks` to a block file being written, on a blocking thread; hands the file back.
pub(crate) async fn write_block_file(mut f: File, chunks: Vec<Bytes>) -> Result<File> {
    crate::blocking(move || {
        chunks.iter().try_for_each(|c| f.write_all(c)).map_err(|e| Error::io("write block file", e))?;
        Ok(f)
    })
    .await?
}

/// Where [`Inner::open_block`] reads a block from.
pub(crate) enum BlockSource {
    /// A file here: a leased block, or (when a write spills to the UFS) the block being
    /// written, read from `pos`.
    Local {
        file: Arc<File>,
        pos: u64,
        left: u64,
        /// Held by every chunk handed out too (see [`MappedChunk`]).
        lease: Option<Arc<DropOffRuntime<Lease>>>,
    },
    Peer {
        sock: tokio::io::BufReader<DataStream>,
        left: u64,
        crc: Option<u32>,
    },
}

impl BlockSource {
    /// The first `len` bytes of the file at `path` (opened on a blocking thread).
    pub(crate) async fn local(path: PathBuf, len: u64, lease: Option<DropOffRuntime<Lease>>) -> Result<BlockSource> {
        let file = crate::blocking(move || File::open(path).map_err(|e| Error::io("open block file", e))).await??;
        Ok(BlockSource::Local { file: Arc::new(file), pos: 0, left: len, lease: lease.map(Arc::new) })
    }

    /// The checksum the holder recorded for the block, when it sent one.
    fn crc(&self) -> Option<u32> {
        match self {
            BlockSource::Local { .. } => None,
            BlockSource::Peer { crc, .. } => *crc,
        }
    }

    /// The next chunk (at most 4 MiB), or `None` at the end of the block.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>> {
        const CHUNK: u64 = 4 << 20;
        match self {
            BlockSource::Local { file, pos, left, lease } => {
                if *left == 0 {
                    return Ok(None);
                }
                let (f, at, n, lease) = (file.clone(), *pos, CHUNK.min(*left), lease.clone());
                let chunk = crate::blocking(move || MappedChunk::map(&f, at, n as usize, lease)).await??;
                *pos += n;
                *left -= n;
                Ok(Some(Bytes::from_owner(chunk)))
            }
            BlockSource::Peer { sock, left, .. } => {
                if *left == 0 {
                    return Ok(None);
                }
                let mut buf = vec![0u8; CHUNK.min(*left) as usize];
                sock.read_exact(&mut buf).await.map_err(|e| Error::unavailable(format!("peer stream broke: {e}")))?;
                *left -= buf.len() as u64;
                Ok(Some(Bytes::from(buf)))
            }
        }
    }
}

/// A piece of a block file, mapped read-only: the bytes a persist hands to the UFS writer
/// without copying them out of the file first (nor zeroing a buffer for them). It keeps
/// the block's lease for as long as any `Bytes` of it lives (the UFS writer may hold them
/// past the block's end), so the block is not evicted and its file not reused for
/// another block meanwhile. Unleased (a spilling write's own block being written), the
/// mapped range is bytes already written, which that write never rewrites.
struct MappedChunk {
    ptr: *mut libc::c_void,
    len: usize,
    _lease: Option<Arc<DropOffRuntime<Lease>>>,
}

// SAFETY: the mapping is read-only and owned by this value alone (unmapped once, in drop).
unsafe impl Send for MappedChunk {}
unsafe impl Sync for MappedChunk {}

impl MappedChunk {
    /// Maps `len` bytes of `file` from `at` (a multiple of the page size), populated now.
    /// Blocking (the page tables are filled, and a disk tier's pages read, in the call).
    fn map(file: &File, at: u64, len: usize, lease: Option<Arc<DropOffRuntime<Lease>>>) -> Result<MappedChunk> {
        use std::os::fd::AsRawFd;
        let have = file.metadata().map_err(|e| Error::io("stat block file", e))?.len();
        if at + len as u64 > have {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("block file holds {have} bytes, not {}", at + len as u64),
            ));
        }
        // SAFETY: a new shared read-only mapping of a range the file holds (checked above);
        // no Rust reference exists into it until `as_ref`, which lives no longer than self.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                at as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io("map block file", std::io::Error::last_os_error()));
        }
        Ok(MappedChunk { ptr, len, _lease: lease })
    }
}

impl AsRef<[u8]> for MappedChunk {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for MappedChunk {
    fn drop(&mut self) {
        // SAFETY: mapped in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr, self.len.max(1)) };
    }
}
