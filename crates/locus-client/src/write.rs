//! The write path: a new file's bytes through a worker (and down its replication
//! pipeline) to the cache and/or the UFS, then completed at the master.

use std::collections::HashMap;

use futures::FutureExt;
use locus_common::config::WriteType;
use locus_common::{Error, Result};
use locus_proto::{end_chunks, exchange, pb, read_response, write_chunk};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt};

use crate::{Client, Retry};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Bytes per write frame sent to a worker.
const WRITE_CHUNK: usize = 4 << 20;
/// The first chunk's size: chunks grow to [`WRITE_CHUNK`] as the input fills them, so a
/// small object does not pay for zeroing a large buffer.
const FIRST_CHUNK: usize = 64 << 10;

/// Per-write options.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    /// Replace an existing file.
    pub overwrite: bool,
    /// Stored with the object in an S3 UFS (and in the namespace, via the sealed meta).
    pub content_type: String,
    pub user_metadata: HashMap<String, String>,
    /// Overrides the client's (and the mount's, and the cluster's) write type.
    pub write_type: Option<WriteType>,
    /// Overrides `client.replication.durable` (0 = min(2, live workers)).
    pub durable_replicas: Option<u32>,
    /// ASYNC_THROUGH: start the background persist only this much later, unless the path
    /// changes first (a file deleted by then is never written to the UFS). The S3
    /// gateway sets it for multipart parts, which CompleteMultipartUpload copies into the
    /// object and deletes. It never delays the acknowledgement.
    pub persist_wait: Option<std::time::Duration>,
    /// The size of the input, when known: a cached write that cannot fit in the workers'
    /// cache at all then fails (MUST_CACHE) or goes through to the UFS before any other
    /// file is evicted for it.
    pub expected_length: Option<u64>,
}

impl Client {
    /// Write a new file from `input`, through a worker to the UFS.
    pub async fn put<R: AsyncRead + Unpin>(&self, path: &str, input: &mut R, overwrite: bool) -> Result<pb::FileInfo> {
        let opts = PutOptions { overwrite, ..Default::default() };
        self.put_with(path, input, &opts, |_| Ok(pb::ObjectMeta::default())).await
    }

    /// Write a new file from `input`. Once `input` is exhausted, `seal` checks it (for
    /// example against a checksum the writer sent) and returns the object metadata to
    /// record; if `seal` fails, the write is abandoned and the UFS keeps its old object.
    pub async fn put_with<R: AsyncRead + Unpin>(
        &self,
        path: &str,
        input: &mut R,
        opts: &PutOptions,
        seal: impl FnOnce(&mut R) -> Result<pb::ObjectMeta>,
    ) -> Result<pb::FileInfo> {
        let write_type = pb::WriteType::from_opt(opts.write_type.or(self.cfg.write_type)).into();
        let r =
            pb::CreateFileRequest { path: path.into(), overwrite: opts.overwrite, write_type, complete_empty: false };
        let target = self.rpc(Retry::Once, r, |mut m, r| async move { m.create_file(r).await }).await?;
        let wt = target
            .write_type()
            .typed()
            .ok_or_else(|| Error::internal(format!("the master named no write type for {path}")))?;
        let copies = self.copies(wt, opts);
        // The first bytes choose the way: a file that ends within them goes over the data
        // path (one round trip on a pooled connection is quicker for a small file than the
        // short-circuit write's steps), a longer one short-circuit where it can.
        let mut head = Vec::new();
        (&mut *input).take(SHORT_CIRCUIT_MIN + 1).read_to_end(&mut head).await.map_err(input_err)?;
        let small = head.len() as u64 <= SHORT_CIRCUIT_MIN;
        let mut input = Input { head, at: 0, rest: input };
        let mut seal = Some(seal);
        let local = match small {
            true => None,
            false => self.put_local(path, &target, opts, &mut input, &mut seal).await?,
        };
        let (r, meta, wanted) = match local {
            Some((r, meta)) => (r, meta, 1),
            None => {
                let seal = seal.take().expect("put_local seals only a write it took");
                self.put_data_path(path, &target, copies, opts, &mut input, seal).await?
            }
        };
        // The write type that applied: the worker names it when it changed.
        let applied = if r.write_type() == pb::WriteType::Unspecified { target.write_type } else { r.write_type };
        // A cached write acknowledged by fewer workers than it asked for says so (the
        // master counts it, the CLI warns); a write through to the UFS needs no copies.
        let (copies_wanted, copies_made) = match applied_caches(&target, &r) {
            true => (wanted, r.replicas),
            false => (0, 0),
        };
        let req = pb::CompleteFileRequest {
            copies_wanted,
            copies_made,
            path: target.path,
            length: r.length,
            etag: r.etag,
            mtime_ms: r.mtime_ms,
            meta: Some(meta),
            version: target.version,
            write_type: applied,
            persist_wait_ms: opts.persist_wait.map(|d| d.as_millis() as u64).unwrap_or(0),
        };
        self.rpc(Retry::Once, req, |mut m, r| async move { m.complete_file(r).await }).await
    }

    /// Worker copies a write of type `wt` needs (0: min(2, live workers)).
    pub(crate) fn copies(&self, wt: WriteType, opts: &PutOptions) -> u32 {
        if wt.needs_durable_copies() { opts.durable_replicas.unwrap_or(self.cfg.replication.durable) } else { 1 }
    }

    /// The write over the data path: the bytes, in chunk frames, through the first worker of
    /// the pipeline (and on down it); the worker's answer and the sealed metadata.
    async fn put_data_path<R: AsyncRead + Unpin>(
        &self,
        path: &str,
        target: &pb::FileInfo,
        copies: u32,
        opts: &PutOptions,
        input: &mut Input<'_, R>,
        seal: impl FnOnce(&mut R) -> Result<pb::ObjectMeta>,
    ) -> Result<(pb::DataResponse, pb::ObjectMeta, u32)> {
        // Open the pipeline. A worker that died a moment ago (the master still lists it)
        // fails the opening before any byte is read from `input`: leave it out and choose
        // again, for up to `client.replication.wait`.
        let mut dead = HashSet::new();
        let deadline = Instant::now() + self.cfg.replication.wait;
        let (w, mut c, want) = loop {
            let (mut pipeline, asked) = self.write_pipeline(path, copies, &dead).await?;
            let all = pipeline.clone();
            let w = pipeline.remove(0);
            let req = write_request(target, opts, pipeline);
            let opened = async {
                let mut c = self.conn(&w.data_address).await?;
                exchange(&mut c, pb::data_request::Req::Write(req)).await?;
                Ok::<_, Error>(c)
            }
            .await;
            let e = match opened {
                Ok(c) => break (w, c, asked as u32),
                Err(e) if e.is_retryable() && Instant::now() < deadline => e,
                Err(e) => return Err(e),
            };
            let mut found = false;
            for x in &all {
                if !self.answers(x).await {
                    dead.insert(x.worker_id);
                    found = true;
                }
            }
            tracing::warn!(error = %e, dead = ?dead, "a write's pipeline failed to open; choosing workers again");
            if !found {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        // Any error before the closing frame drops the connection, which the worker takes
        // as an abort.
        let mut buf = vec![0u8; FIRST_CHUNK.min(WRITE_CHUNK)];
        let mut filled = false;
        loop {
            if filled && buf.len() < WRITE_CHUNK {
                buf.resize((buf.len() * 4).min(WRITE_CHUNK), 0);
            }
            let mut n = 0;
            while n < buf.len() {
                let k = input.read(&mut buf[n..]).await.map_err(input_err)?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            if n == 0 {
                break;
            }
            filled = n == buf.len();
            // The worker answers before the last chunk only to give the write up (out of
            // space, say): stop sending and return its error.
            if c.fill_buf().now_or_never().is_some_and(|r| r.is_ok_and(|b| !b.is_empty())) {
                return Err(early_answer(&mut c).await);
            }
            if let Err(e) = write_chunk(&mut c, &buf[..n]).await {
                // Its answer, if it gave one, says why better than the broken connection.
                return Err(
                    match tokio::time::timeout(std::time::Duration::from_secs(2), read_response(&mut c)).await {
                        Ok(Err(we)) if we.kind() != locus_common::ErrorKind::Unavailable => we,
                        _ => Error::io("send", e),
                    },
                );
            }
        }
        let meta = seal(input.rest)?;
        end_chunks(&mut c).await.map_err(|e| Error::io("send", e))?;
        let r = read_response(&mut c).await?;
        self.put_conn(&w.data_address, c);
        Ok((r, meta, want))
    }
}

/// Whether a write of `target` answered by `r` ended up cached (its copies count): a
/// cached write type that did not spill through to the UFS.
fn applied_caches(target: &pb::FileInfo, r: &pb::DataResponse) -> bool {
    let spilled = r.write_type() == pb::WriteType::CacheThrough && target.write_type() != pb::WriteType::CacheThrough;
    target.write_type().typed().is_some_and(|w| w.caches()) && !spilled
}

/// The request that opens a write of `target` at a worker, `pipeline` the further workers.
pub(crate) fn write_request(
    target: &pb::FileInfo,
    opts: &PutOptions,
    pipeline: Vec<pb::WorkerAddress>,
) -> pb::WriteFileRequest {
    pb::WriteFileRequest {
        mount_id: target.mount_id,
        ufs_path: target.ufs_path.clone(),
        content_type: opts.content_type.clone(),
        user_metadata: opts.user_metadata.clone(),
        write_type: target.write_type,
        version: target.version,
        block_size: target.block_size,
        pipeline,
        pin_epoch: target.pin_epoch,
        expected_length: opts.expected_length.unwrap_or(0),
        grant: target.write_grant.clone(),
    }
}

/// A file of at most this many bytes is written over the data path even when it could go
/// short-circuit.
const SHORT_CIRCUIT_MIN: u64 = 1 << 20;

/// A write's input once its first bytes were read (to choose the way): those bytes, then
/// the rest; `seal` gets the rest.
pub(crate) struct Input<'a, R> {
    head: Vec<u8>,
    at: usize,
    pub(crate) rest: &'a mut R,
}

impl<R: AsyncRead + Unpin> AsyncRead for Input<'_, R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            buf.put_slice(&self.head[self.at..self.at + n]);
            self.at += n;
            if self.at == self.head.len() {
                self.head = Vec::new();
                self.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut *self.rest).poll_read(cx, buf)
    }
}

/// The error a worker answered with before the write's last chunk.
async fn early_answer<S: tokio::io::AsyncRead + Unpin>(c: &mut S) -> Error {
    match read_response(c).await {
        Err(e) => e,
        Ok(_) => Error::internal("the worker acknowledged a write before its last chunk"),
    }
}

/// A failed read of a write's input keeps the error the input gave, when it is ours (a
/// front end's stream carries a Locus error inside the `io::Error`).
pub(crate) fn input_err(e: std::io::Error) -> Error {
    match e.downcast::<Error>() {
        Ok(ours) => ours,
        Err(e) => Error::io("read input", e).set_retryable(false),
    }
}
