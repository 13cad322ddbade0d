//! The write path: a file's bytes into this worker's cache (as blocks of the new version)
//! and/or the UFS, forwarded down the replication pipeline as they arrive.

use bytes::Bytes;
use locus_blockstore::BlockStore;
use locus_common::config::WriteType;
use locus_common::security::{Identity, Role};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::tls::{DataStream, Tls};
use locus_proto::{end_chunks, exchange, pb, read_frame, read_response, write_chunk, write_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::block::BlockSource;
use crate::guard::Access;
use crate::{DropOffRuntime, Inner};

impl Inner {
    /// Take a write: chunk frames follow the request, a zero-length frame ends them. The
    /// bytes go to this worker's cache (as blocks of the new version) and/or the UFS, as
    /// the write type says, and down the replication pipeline: each chunk is forwarded to
    /// the next worker while it is stored here. The answer comes once every worker of the
    /// pipeline holds the blocks and has reported them to the master.
    pub(crate) async fn handle_write(&self, sock: &mut DataStream, w: pb::WriteFileRequest) -> Result<()> {
        let wt = w.write_type().typed().unwrap_or(WriteType::Through);
        // A write that declared a size the cache cannot hold at all fails (MUST_CACHE) or
        // goes through to the UFS (the others) before anything is evicted for it.
        let mut spilled = false;
        let mut caches = wt.caches();
        if caches && w.expected_length > 0 {
            let (store, need) = (self.store.clone(), w.expected_length);
            if let Err(e) = crate::blocking(move || store.check_room(need)).await? {
                if wt == WriteType::MustCache {
                    return Err(e.context(format!("MUST_CACHE write of {} ({need} bytes)", w.ufs_path)));
                }
                tracing::info!(path = %w.ufs_path, bytes = need, "cache too small: the write goes through to the UFS");
                caches = false;
                spilled = true;
            }
        }
        let mut blocks = if caches {
            if w.version == 0 || w.block_size == 0 {
                return Err(Error::invalid("a cached write needs a file version and a block size"));
            }
            if wt.needs_durable_copies() {
                self.store.pin_written(w.version, w.pin_epoch);
            }
            Some(BlockWriter {
                store: self.store.clone(),
                version: w.version,
                block_size: w.block_size,
                index: 0,
                cur: None,
                crc: 0,
            })
        } else {
            None
        };
        let mut ufs_writer = match wt.writes_ufs() || spilled {
            true => Some(
                self.ufs_at(w.mount_id, &w.ufs_path, Access::Write)
                    .await?
                    .writer(&w.ufs_path, &w.content_type, &w.user_metadata)
                    .await?,
            ),
            false => None,
        };
        // The rest of the pipeline, fed by a task so that forwarding overlaps local writes.
        let mut down = None;
        if caches && !w.pipeline.is_empty() {
            let next = w.pipeline[0].clone();
            let req = pb::WriteFileRequest {
                pipeline: w.pipeline[1..].to_vec(),
                write_type: if wt.writes_ufs() { pb::WriteType::MustCache.into() } else { w.write_type },
                ..w.clone()
            };
            let forwarded = async {
                let addr = self.member_address(next.worker_id).await.map_err(|e| replica_err(next.worker_id, e))?;
                let r =
                    forward_write(next.worker_id, &addr, req, &self.verifier.identity(Role::Worker), &self.tls).await;
                if r.is_err() {
                    self.forget_member(next.worker_id);
                }
                r
            };
            match forwarded.await {
                Ok(d) => down = Some(d),
                Err(e) => {
                    if let Some(u) = ufs_writer.take() {
                        u.abort().await;
                    }
                    return Err(e);
                }
            }
        }
        write_frame(sock, &pb::DataResponse::default()).await?; // ready
        sock.flush().await.map_err(|e| Error::io("send", e))?;
        let res: Result<u64> = async {
            let mut total = 0u64;
            loop {
                let mut lenb = [0u8; 4];
                sock.read_exact(&mut lenb).await.map_err(|e| Error::io("read write chunk", e))?;
                let len = u32::from_be_bytes(lenb) as usize;
                if len == 0 {
                    break;
                }
                if len > 64 << 20 {
                    return Err(Error::invalid("write chunk larger than 64 MiB"));
                }
                // Read into unzeroed memory, woken per RECV_LOWAT rather than per segment.
                // (Never more than the chunk's unread rest: the writer may be waiting.)
                let mut buf = bytes::BytesMut::with_capacity(len);
                let mut lowat = 1;
                while buf.len() < len {
                    let want = (len - buf.len()) as u64;
                    locus_proto::expect_bytes(sock, &mut lowat, want);
                    let n = (&mut *sock)
                        .take(want)
                        .read_buf(&mut buf)
                        .await
                        .map_err(|e| Error::io("read write chunk", e))?;
                    if n == 0 {
                        return Err(Error::io("read write chunk", std::io::ErrorKind::UnexpectedEof.into()));
                    }
                }
                locus_proto::expect_bytes(sock, &mut lowat, 0);
                let mut buf = buf.freeze();
                let before = total;
                total += len as u64;
                self.counters.written_data_path.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
                if let Some((tx, _)) = &down {
                    // A broken pipeline shows in its task's result below.
                    let _ = tx.send(buf.clone()).await;
                }
                if let Some(mut b) = blocks.take() {
                    // Blocks are created, written and committed on a blocking thread.
                    let chunk = buf.clone();
                    let (b, res) = crate::blocking(move || {
                        let r = b.write(&chunk);
                        (b, r)
                    })
                    .await?;
                    match res {
                        Ok(()) => blocks = Some(b),
                        // A write that outgrows the cache goes on through to the UFS
                        // (MUST_CACHE has no UFS to go to: it fails).
                        Err(e) if e.kind() == ErrorKind::ResourceExhausted && wt != WriteType::MustCache => {
                            let stored = b.stored();
                            if ufs_writer.is_none() {
                                tracing::info!(path = %w.ufs_path, at = stored, "cache full: the write goes on through to the UFS");
                                let mut u = self.ufs_at(w.mount_id, &w.ufs_path, Access::Write).await?.writer(&w.ufs_path, &w.content_type, &w.user_metadata).await?;
                                let r = self.replay(&b, &mut u).await;
                                if let Err(e) = r {
                                    u.abort().await;
                                    return Err(e);
                                }
                                ufs_writer = Some(u);
                                spilled = true;
                                if let Some((_, task)) = down.take() {
                                    task.abort(); // the replicas drop their partial copies
                                }
                                // The replay sent this chunk's first bytes already.
                                buf = buf.slice((stored - before) as usize..);
                            }
                            // (CACHE_THROUGH streams every byte to the UFS anyway: it
                            // just stops caching.)
                        }
                        Err(e) => return Err(e),
                    }
                }
                if let Some(u) = &mut ufs_writer {
                    u.write(buf).await?;
                }
            }
            if let Some(b) = blocks.take() {
                crate::blocking(move || b.finish()).await??;
            }
            Ok(total)
        }
        .await;
        let total = match res {
            Ok(t) => t,
            Err(e) => {
                if let Some(u) = ufs_writer.take() {
                    u.abort().await;
                }
                if let Some((_, task)) = down.take() {
                    task.abort(); // the replicas drop their partial copies
                }
                return self.give_up_write(sock, &w, caches, e).await;
            }
        };
        let mut replicas = u32::from(caches);
        if let Some((tx, task)) = down.take() {
            drop(tx);
            let r = task.await.map_err(|e| Error::internal(format!("pipeline task: {e}")));
            match r.and_then(|r| r) {
                Ok(r) => replicas += r.replicas,
                Err(e) => {
                    if let Some(u) = ufs_writer.take() {
                        u.abort().await;
                    }
                    self.abandon_blocks(&w, caches).await;
                    return Err(e);
                }
            }
        }
        let mut resp = pb::DataResponse { length: total, replicas, ..Default::default() };
        if spilled {
            resp.set_write_type(pb::WriteType::CacheThrough);
        }
        if let Some(u) = ufs_writer {
            let st = match u.close().await {
                Ok(st) => st,
                Err(e) => {
                    self.abandon_blocks(&w, caches).await;
                    return Err(e);
                }
            };
            if st.length != total {
                return Err(Error::new(ErrorKind::Ufs, format!("UFS holds {} bytes after writing {total}", st.length)));
            }
            resp.etag = st.etag;
            resp.mtime_ms = st.mtime_ms;
        }
        locus_common::fail::fail_point!("worker.write.before_ack", |_| Err(Error::internal("failpoint")));
        // The master learns of the blocks before the writer is told they are stored.
        if wt.caches() {
            self.commit_changes().await?;
        }
        write_frame(sock, &resp).await
    }

    /// Take a write from a co-located client over the Unix socket (short-circuit): no
    /// bytes cross the socket. This worker creates each block's file and names it; the
    /// client writes the block into it and answers with a `BlockWritten` (its length and
    /// crc32c); the block is then committed and the next named. Only a cached write with
    /// no replica pipeline and no UFS stream comes this way (MUST_CACHE, and ASYNC_THROUGH
    /// on one copy); any other is refused with `FailedPrecondition` before anything is
    /// stored, and the client sends it over the data path instead. When the cache cannot
    /// take the next block, a write that may go through (not MUST_CACHE) spills: the
    /// blocks so far are replayed to the UFS and the client sends the rest as chunk frames.
    /// A client that hangs up mid-write leaves nothing: its blocks are dropped.
    pub(crate) async fn handle_local_write(&self, sock: &mut UnixStream, w: pb::WriteFileRequest) -> Result<()> {
        let wt = w.write_type().typed().unwrap_or(WriteType::Through);
        if !wt.caches() || wt.writes_ufs() || !w.pipeline.is_empty() {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                "a short-circuit write is a cached write with no replica pipeline and no UFS stream: use the data path",
            ));
        }
        if w.version == 0 || w.block_size == 0 {
            return Err(Error::invalid("a cached write needs a file version and a block size"));
        }
        if w.expected_length > 0 {
            let (store, need) = (self.store.clone(), w.expected_length);
            if let Err(e) = crate::blocking(move || store.check_room(need)).await? {
                if wt == WriteType::MustCache {
                    return Err(e.context(format!("MUST_CACHE write of {} ({need} bytes)", w.ufs_path)));
                }
                // The data path sends it through to the UFS from its first byte.
                return Err(Error::new(ErrorKind::FailedPrecondition, format!("{e}: use the data path")));
            }
        }
        if wt.needs_durable_copies() {
            self.store.pin_written(w.version, w.pin_epoch);
        }
        let res = self.take_local_blocks(sock, &w, wt).await;
        match res {
            Ok(resp) => write_frame(sock, &resp).await,
            Err(e) => {
                self.abandon_blocks(&w, true).await;
                tracing::info!(path = %w.ufs_path, error = %e, "short-circuit write failed");
                Err(e)
            }
        }
    }

    /// The blocks of a short-circuit write, named, written by the client and committed in
    /// turn; its answer once the last is in (and the master knows of them).
    async fn take_local_blocks(
        &self,
        sock: &mut UnixStream,
        w: &pb::WriteFileRequest,
        wt: WriteType,
    ) -> Result<pb::DataResponse> {
        let (version, block_size) = (w.version, w.block_size);
        let mut index = 0u64;
        let mut total = 0u64;
        loop {
            let (store, id) = (self.store.clone(), locus_common::block_id(version, index));
            let created = crate::blocking(move || {
                // Nothing is evicted for a block that cannot fit whatever goes.
                store.check_room(block_size)?;
                let t = store.create(id, block_size)?;
                t.open()?;
                Ok::<_, Error>(t)
            })
            .await?;
            let t = match created {
                Ok(t) => DropOffRuntime::new(t),
                Err(e) if e.kind() == ErrorKind::ResourceExhausted && wt != WriteType::MustCache => {
                    tracing::info!(path = %w.ufs_path, at = total, "cache full: the write goes on through to the UFS");
                    return self.spill_local(sock, w, index, total).await;
                }
                Err(e) => return Err(e),
            };
            let named = pb::DataResponse { path: t.path.display().to_string(), ..Default::default() };
            write_frame(sock, &named).await?;
            let done = match read_frame::<_, pb::DataRequest>(sock).await? {
                Some(pb::DataRequest { req: Some(pb::data_request::Req::BlockWritten(b)) }) => b,
                Some(_) => return Err(Error::invalid("a short-circuit write takes BlockWritten frames only")),
                None => return Err(Error::unavailable("the client hung up mid-write")),
            };
            if done.length > block_size || (done.length < block_size && !done.last) {
                return Err(Error::invalid(format!(
                    "block {index} of a short-circuit write: {} bytes written of a {block_size}-byte block, and more to come",
                    done.length
                )));
            }
            let t = t.into_inner();
            let path = t.path.clone();
            let (n, crc) = (done.length, done.crc32c);
            crate::blocking(move || {
                // The file holds at least what the client says it wrote.
                let have = std::fs::metadata(&path).map_err(|e| Error::io("stat a written block", e))?.len();
                if have < n {
                    return Err(Error::invalid(format!("block file holds {have} bytes, the client wrote {n}")));
                }
                if n == 0 {
                    drop(t); // an empty last block: the file ended on the block before
                    return Ok(());
                }
                t.commit(n, Some(crc))
            })
            .await??;
            total += n;
            index += 1;
            self.counters.written_short_circuit.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            if done.last {
                break;
            }
        }
        locus_common::fail::fail_point!("worker.write.before_ack", |_| Err(Error::internal("failpoint")));
        self.commit_changes().await?;
        Ok(pb::DataResponse { length: total, replicas: 1, ..Default::default() })
    }

    /// A short-circuit write the cache cannot hold goes on through to the UFS: the blocks
    /// stored so far first, then the rest, which the client sends as chunk frames.
    async fn spill_local(
        &self,
        sock: &mut UnixStream,
        w: &pb::WriteFileRequest,
        blocks: u64,
        stored: u64,
    ) -> Result<pb::DataResponse> {
        let mut u = self
            .ufs_at(w.mount_id, &w.ufs_path, Access::Write)
            .await?
            .writer(&w.ufs_path, &w.content_type, &w.user_metadata)
            .await?;
        let done = BlockWriter {
            store: self.store.clone(),
            version: w.version,
            block_size: w.block_size,
            index: blocks,
            cur: None,
            crc: 0,
        };
        let res = async {
            self.replay(&done, &mut u).await?;
            write_frame(sock, &pb::DataResponse { spill: true, ..Default::default() }).await?;
            let mut total = stored;
            loop {
                let mut lenb = [0u8; 4];
                sock.read_exact(&mut lenb).await.map_err(|e| Error::io("read write chunk", e))?;
                let len = u32::from_be_bytes(lenb) as usize;
                if len == 0 {
                    break;
                }
                if len > 64 << 20 {
                    return Err(Error::invalid("write chunk larger than 64 MiB"));
                }
                let mut buf = bytes::BytesMut::zeroed(len);
                sock.read_exact(&mut buf).await.map_err(|e| Error::io("read write chunk", e))?;
                total += len as u64;
                self.counters.written_data_path.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
                u.write(buf.freeze()).await?;
            }
            Ok(total)
        }
        .await;
        let total = match res {
            Ok(t) => t,
            Err(e) => {
                u.abort().await;
                return Err(e);
            }
        };
        let st = u.close().await?;
        if st.length != total {
            return Err(Error::new(ErrorKind::Ufs, format!("UFS holds {} bytes after writing {total}", st.length)));
        }
        self.commit_changes().await?;
        let mut resp =
            pb::DataResponse { length: total, replicas: 1, etag: st.etag, mtime_ms: st.mtime_ms, ..Default::default() };
        resp.set_write_type(pb::WriteType::CacheThrough);
        Ok(resp)
    }

    /// A write failed while its chunks stream in: drop what it stored here at once, answer
    /// with the error now, and read (and discard) the rest of its chunks, so the writer
    /// gets the answer rather than a reset connection, and the connection stays usable.
    /// (The writer stops sending when it sees the early answer.)
    async fn give_up_write(
        &self,
        sock: &mut DataStream,
        w: &pb::WriteFileRequest,
        caches: bool,
        e: Error,
    ) -> Result<()> {
        self.abandon_blocks(w, caches).await;
        tracing::info!(path = %w.ufs_path, error = %e, "write failed");
        if e.kind() == ErrorKind::Io || e.kind() == ErrorKind::InvalidArgument {
            return Err(e); // the connection itself broke, or is out of step: close it
        }
        write_frame(sock, &pb::DataResponse::error(&e)).await?;
        sock.flush().await.map_err(|e| Error::io("send", e))?;
        let mut scratch = vec![0u8; 256 << 10];
        loop {
            let mut lenb = [0u8; 4];
            if sock.read_exact(&mut lenb).await.is_err() {
                return Ok(()); // the writer went: nothing more to read
            }
            let mut left = u32::from_be_bytes(lenb) as usize;
            if left == 0 {
                return Ok(());
            }
            while left > 0 {
                let k = left.min(scratch.len());
                match sock.read(&mut scratch[..k]).await {
                    Ok(0) | Err(_) => return Ok(()),
                    Ok(n) => left -= n,
                }
            }
        }
    }

    /// Drop the blocks a failed cached write stored here (and its write pin).
    async fn abandon_blocks(&self, w: &pb::WriteFileRequest, caches: bool) {
        if !caches {
            return;
        }
        let (store, version) = (self.store.clone(), w.version);
        let freed = crate::blocking(move || store.abandon_write(version)).await.unwrap_or(0);
        if freed > 0 {
            tracing::info!(path = %w.ufs_path, blocks = freed, "dropped the blocks of a failed write");
            if let Err(e) = self.commit_changes().await {
                tracing::warn!(error = %e, "reporting dropped blocks");
            }
        }
    }

    /// Send what a write stored in blocks so far to the UFS writer taking over.
    async fn replay(&self, b: &BlockWriter, u: &mut locus_ufs::UfsWriter) -> Result<()> {
        for i in 0..b.index {
            let id = locus_common::block_id(b.version, i);
            let mut src = self.open_block(id, b.block_size, &[]).await?;
            while let Some(chunk) = src.next().await? {
                u.write(chunk).await?;
            }
        }
        if let Some((t, _, n)) = &b.cur {
            let mut src = BlockSource::local(t.path.clone(), *n, None).await?;
            while let Some(chunk) = src.next().await? {
                u.write(chunk).await?;
            }
        }
        Ok(())
    }
}

/// Splits a write into blocks of the new version in the store. Blocking: its methods
/// create, write and commit block files (the write path runs them on a blocking thread).
struct BlockWriter {
    store: BlockStore,
    version: u64,
    block_size: u64,
    index: u64,
    cur: Option<(locus_blockstore::TempBlock, std::fs::File, u64)>,
    crc: u32,
}

impl BlockWriter {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.cur.is_none() {
                // Nothing is evicted for a block that cannot fit whatever goes.
                self.store.check_room(self.block_size)?;
                let t = self.store.create(locus_common::block_id(self.version, self.index), self.block_size)?;
                let f = t.open()?;
                self.cur = Some((t, f, 0));
            }
            let (_, f, n) = self.cur.as_mut().unwrap();
            let k = data.len().min((self.block_size - *n) as usize);
            std::io::Write::write_all(f, &data[..k]).map_err(|e| Error::io("write block file", e))?;
            self.crc = crc32c::crc32c_append(self.crc, &data[..k]);
            *n += k as u64;
            data = &data[k..];
            if *n == self.block_size {
                let (t, _, n) = self.cur.take().unwrap();
                t.commit(n, Some(std::mem::take(&mut self.crc)))?;
                self.index += 1;
            }
        }
        Ok(())
    }

    /// Bytes stored so far (committed blocks and the one in progress).
    fn stored(&self) -> u64 {
        self.index * self.block_size + self.cur.as_ref().map(|c| c.2).unwrap_or(0)
    }

    fn finish(mut self) -> Result<()> {
        match self.cur.take() {
            Some((t, _, n)) if n > 0 => t.commit(n, Some(self.crc)),
            _ => Ok(()),
        }
    }
}

impl Drop for BlockWriter {
    /// An abandoned write's unfinished block deletes its file as it drops: off the runtime.
    fn drop(&mut self) {
        if let Some(cur) = self.cur.take() {
            drop(DropOffRuntime::new(cur));
        }
    }
}

fn replica_err(worker: u64, e: Error) -> Error {
    let retryable = e.is_retryable();
    Error::new(e.kind(), format!("replica worker {worker}: {e}")).set_retryable(retryable)
}

type Forward = (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<Result<pb::DataResponse>>);

/// Open the write to the next worker of a pipeline; chunks sent to the returned channel
/// go to it, and the task's result is its answer once the channel closes.
async fn forward_write(id: u64, addr: &str, req: pb::WriteFileRequest, who: &Identity, tls: &Tls) -> Result<Forward> {
    let ctx = move |e: Error| replica_err(id, e);
    let s = tls.connect(addr, "replica worker").await?;
    let mut s = tokio::io::BufWriter::with_capacity(1 << 20, s);
    locus_proto::authenticate(&mut s, who).await.map_err(ctx)?;
    exchange(&mut s, pb::data_request::Req::Write(req)).await.map_err(ctx)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let task = tokio::spawn(async move {
        let mut broken = None;
        while let Some(b) = rx.recv().await {
            if broken.is_some() {
                continue; // drain, so the sender never blocks on a dead pipeline
            }
            if let Err(e) = write_chunk(&mut s, &b).await {
                broken = Some(e);
            }
        }
        if let Some(e) = broken {
            return Err(Error::unavailable(format!("replica worker {id} went away mid-write: {e}")));
        }
        end_chunks(&mut s).await.map_err(|e| Error::io("send", e))?;
        read_response(&mut s).await.map_err(ctx)
    });
    Ok((tx, task))
}
