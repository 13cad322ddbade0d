//! The write path: a file's bytes into this worker's cache (as blocks of the new version)
//! and/or the UFS, forwarded down the replication pipeline as they arrive.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use locus_blockstore::BlockStore;
use locus_common::config::WriteType;
use locus_common::security::{Identity, Role};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::tls::{DataStream, Tls};
use locus_proto::{
    discard_chunks, end_chunks, exchange, expect_bytes, pb, read_chunk, read_frame, read_response, write_chunk,
    write_frame,
};
use tokio::io::AsyncWriteExt;
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
        let mut sink = Sink::open(self, &w).await?;
        let ready = async {
            write_frame(sock, &pb::DataResponse::default()).await?;
            sock.flush().await.map_err(|e| Error::io("send", e))
        };
        if let Err(e) = ready.await {
            sink.abort().await;
            return Err(e);
        }
        let mut lowat = 1;
        let res = async {
            while let Some(chunk) = read_chunk(sock, |s, left| expect_bytes(s, &mut lowat, left)).await? {
                sink.write(chunk).await?;
            }
            sink.finish_blocks().await
        }
        .await;
        if let Err(e) = res {
            sink.abort().await;
            return self.give_up_write(sock, &w, e).await;
        }
        let caches = sink.wt.caches();
        let resp = sink.close().await?;
        locus_common::fail::fail_point!("worker.write.before_ack", |_| Err(Error::internal("failpoint")));
        // The master learns of the blocks before the writer is told they are stored.
        if caches {
            self.commit_changes().await?;
        }
        write_frame(sock, &resp).await
    }

    /// A writer of `w`'s object in its mount's UFS.
    async fn ufs_writer(&self, w: &pb::WriteFileRequest) -> Result<locus_ufs::UfsWriter> {
        self.ufs_at(w.mount_id, &w.ufs_path, Access::Write)
            .await?
            .writer(&w.ufs_path, &w.content_type, &w.user_metadata)
            .await
    }

    /// Open the write `w` to the next worker of its pipeline, which passes it on to the
    /// rest. A replica of a write that goes to the UFS only caches (the UFS takes it once).
    async fn forward(&self, w: &pb::WriteFileRequest, wt: WriteType) -> Result<Forward> {
        let next = w.pipeline[0].clone();
        let req = pb::WriteFileRequest {
            pipeline: w.pipeline[1..].to_vec(),
            write_type: if wt.writes_ufs() { pb::WriteType::MustCache.into() } else { w.write_type },
            ..w.clone()
        };
        let addr = self.member_address(next.worker_id).await.map_err(|e| replica_err(next.worker_id, e))?;
        let r = forward_write(next.worker_id, &addr, req, &self.verifier.identity(Role::Worker), &self.tls).await;
        if r.is_err() {
            self.forget_member(next.worker_id);
        }
        r
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
                self.abandon_blocks(&w).await;
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
                Some(pb::DataRequest { req: Some(pb::data_request::Req::BlockWritten(b)), .. }) => b,
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
            self.counters.written_short_circuit.fetch_add(n, Relaxed);
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
        let mut u = self.ufs_writer(w).await?;
        let done = BlockWriter::new(self.store.clone(), w, blocks);
        let res = async {
            self.replay(&done, &mut u).await?;
            write_frame(sock, &pb::DataResponse { spill: true, ..Default::default() }).await?;
            let mut total = stored;
            while let Some(chunk) = read_chunk(sock, |_, _| {}).await? {
                total += chunk.len() as u64;
                self.counters.written_data_path.fetch_add(chunk.len() as u64, Relaxed);
                u.write(chunk).await?;
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

    /// A write failed while its chunks stream in (and its sink let go of what it stored):
    /// answer with the error now, and read (and discard) the rest of its chunks, so the writer
    /// gets the answer rather than a reset connection, and the connection stays usable.
    /// (The writer stops sending when it sees the early answer.)
    async fn give_up_write(&self, sock: &mut DataStream, w: &pb::WriteFileRequest, e: Error) -> Result<()> {
        tracing::info!(path = %w.ufs_path, error = %e, "write failed");
        if e.kind() == ErrorKind::Io || e.kind() == ErrorKind::InvalidArgument {
            return Err(e); // the connection itself broke, or is out of step: close it
        }
        write_frame(sock, &pb::DataResponse::error(&e)).await?;
        sock.flush().await.map_err(|e| Error::io("send", e))?;
        discard_chunks(sock).await;
        Ok(())
    }

    /// Drop the blocks a failed cached write stored here (and its write pin).
    async fn abandon_blocks(&self, w: &pb::WriteFileRequest) {
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

/// Where the bytes of one data-path write go: blocks of the new version here, the UFS,
/// the next worker of the pipeline (each as the write type asks). A write that fails at
/// any step ends in [`Sink::abort`], which lets go of all three.
struct Sink<'a> {
    worker: &'a Inner,
    w: &'a pb::WriteFileRequest,
    wt: WriteType,
    /// Blocks are stored here (false for a write that spilled before its first byte).
    caches: bool,
    blocks: Option<BlockWriter>,
    ufs: Option<locus_ufs::UfsWriter>,
    down: Option<Forward>,
    /// The cache could not hold the write, so it went (or goes on) through to the UFS.
    spilled: bool,
    total: u64,
}

impl<'a> Sink<'a> {
    /// The sinks `w` asks for, opened. A write that declares a size the cache cannot hold
    /// at all fails (MUST_CACHE) or goes through to the UFS (the others) before anything
    /// is evicted for it.
    async fn open(worker: &'a Inner, w: &'a pb::WriteFileRequest) -> Result<Sink<'a>> {
        let wt = w.write_type().typed().unwrap_or(WriteType::Through);
        let mut s =
            Sink { worker, w, wt, caches: wt.caches(), blocks: None, ufs: None, down: None, spilled: false, total: 0 };
        if s.caches && w.expected_length > 0 {
            let (store, need) = (worker.store.clone(), w.expected_length);
            if let Err(e) = crate::blocking(move || store.check_room(need)).await? {
                if wt == WriteType::MustCache {
                    return Err(e.context(format!("MUST_CACHE write of {} ({need} bytes)", w.ufs_path)));
                }
                tracing::info!(path = %w.ufs_path, bytes = need, "cache too small: the write goes through to the UFS");
                (s.caches, s.spilled) = (false, true);
            }
        }
        if s.caches {
            if w.version == 0 || w.block_size == 0 {
                return Err(Error::invalid("a cached write needs a file version and a block size"));
            }
            if wt.needs_durable_copies() {
                worker.store.pin_written(w.version, w.pin_epoch);
            }
            s.blocks = Some(BlockWriter::new(worker.store.clone(), w, 0));
        }
        if let Err(e) = s.connect().await {
            s.abort().await;
            return Err(e);
        }
        Ok(s)
    }

    /// The UFS writer and the pipeline's next hop, where the write goes there.
    async fn connect(&mut self) -> Result<()> {
        if self.wt.writes_ufs() || self.spilled {
            self.ufs = Some(self.worker.ufs_writer(self.w).await?);
        }
        if self.caches && !self.w.pipeline.is_empty() {
            self.down = Some(self.worker.forward(self.w, self.wt).await?);
        }
        Ok(())
    }

    /// One chunk of the write, to every sink. A write that outgrows the cache goes on
    /// through to the UFS ([`Sink::spill`]); MUST_CACHE has no UFS to go to: it fails.
    async fn write(&mut self, mut chunk: Bytes) -> Result<()> {
        let before = self.total;
        self.total += chunk.len() as u64;
        self.worker.counters.written_data_path.fetch_add(chunk.len() as u64, Relaxed);
        if let Some((tx, _)) = &self.down {
            // A broken pipeline shows in its task's result at close.
            let _ = tx.send(chunk.clone()).await;
        }
        if let Some(mut b) = self.blocks.take() {
            // Blocks are created, written and committed on a blocking thread.
            let c = chunk.clone();
            let (b, res) = crate::blocking(move || {
                let r = b.write(&c);
                (b, r)
            })
            .await?;
            match res {
                Ok(()) => self.blocks = Some(b),
                Err(e) if e.kind() == ErrorKind::ResourceExhausted && self.wt != WriteType::MustCache => {
                    // CACHE_THROUGH streams every byte to the UFS anyway: it just stops caching.
                    if self.ufs.is_none() {
                        let stored = b.stored();
                        self.spill(&b).await?;
                        // The replay sent this chunk's first bytes already.
                        chunk = chunk.slice((stored - before) as usize..);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(u) = &mut self.ufs {
            u.write(chunk).await?;
        }
        Ok(())
    }

    /// The cache is full mid-write: a UFS writer takes over, first with what the blocks
    /// hold so far; the replicas drop their partial copies.
    async fn spill(&mut self, b: &BlockWriter) -> Result<()> {
        tracing::info!(path = %self.w.ufs_path, at = b.stored(), "cache full: the write goes on through to the UFS");
        let mut u = self.worker.ufs_writer(self.w).await?;
        if let Err(e) = self.worker.replay(b, &mut u).await {
            u.abort().await;
            return Err(e);
        }
        self.ufs = Some(u);
        self.spilled = true;
        if let Some((_, task)) = self.down.take() {
            task.abort();
        }
        Ok(())
    }

    /// The last chunk is in: commit the last block.
    async fn finish_blocks(&mut self) -> Result<()> {
        if let Some(b) = self.blocks.take() {
            crate::blocking(move || b.finish()).await??;
        }
        Ok(())
    }

    /// The pipeline's answer and the UFS object's close: the write's answer.
    async fn close(mut self) -> Result<pb::DataResponse> {
        match self.try_close().await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.abort().await;
                Err(e)
            }
        }
    }

    async fn try_close(&mut self) -> Result<pb::DataResponse> {
        let mut replicas = u32::from(self.caches);
        if let Some((tx, task)) = self.down.take() {
            drop(tx);
            let r = task.await.map_err(|e| Error::internal(format!("pipeline task: {e}")))??;
            replicas += r.replicas;
        }
        let mut resp = pb::DataResponse { length: self.total, replicas, ..Default::default() };
        if self.spilled {
            resp.set_write_type(pb::WriteType::CacheThrough);
        }
        if let Some(u) = self.ufs.take() {
            let st = u.close().await?;
            if st.length != self.total {
                return Err(Error::new(
                    ErrorKind::Ufs,
                    format!("UFS holds {} bytes after writing {}", st.length, self.total),
                ));
            }
            (resp.etag, resp.mtime_ms) = (st.etag, st.mtime_ms);
        }
        Ok(resp)
    }

    /// Let go of everything the write made: the UFS object is never made, the replicas
    /// drop their partial copies, and the blocks stored here (with the write pin) go.
    async fn abort(mut self) {
        if let Some(u) = self.ufs.take() {
            u.abort().await;
        }
        if let Some((_, task)) = self.down.take() {
            task.abort();
        }
        drop(self.blocks.take());
        if self.caches {
            self.worker.abandon_blocks(self.w).await;
        }
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
    /// The blocks of `w`'s version from block `index` on.
    fn new(store: BlockStore, w: &pb::WriteFileRequest, index: u64) -> Self {
        BlockWriter { store, version: w.version, block_size: w.block_size, index, cur: None, crc: 0 }
    }

    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let (_, f, n) = match &mut self.cur {
                Some(cur) => cur,
                None => {
                    // Nothing is evicted for a block that cannot fit whatever goes.
                    self.store.check_room(self.block_size)?;
                    let t = self.store.create(locus_common::block_id(self.version, self.index), self.block_size)?;
                    let f = t.open()?;
                    self.cur.insert((t, f, 0))
                }
            };
            let k = data.len().min((self.block_size - *n) as usize);
            std::io::Write::write_all(f, &data[..k]).map_err(|e| Error::io("write block file", e))?;
            self.crc = crc32c::crc32c_append(self.crc, &data[..k]);
            *n += k as u64;
            data = &data[k..];
            if *n == self.block_size
                && let Some((t, _, n)) = self.cur.take()
            {
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

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
