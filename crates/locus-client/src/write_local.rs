//! The short-circuit write: a cached write with one copy, to a worker on this host, goes
//! into that worker's block files directly (files over 1 MiB: `put_with` sends smaller
//! ones over the data path). The worker names each new block's file over
//! its Unix socket, this client writes the block into it (on a blocking thread, while the
//! next piece of the input is read) and answers with the block's length and crc32c; no
//! byte crosses a socket. A write the worker refuses before it starts (another write
//! type, a size the cache cannot hold, a file this user cannot open) goes over the data
//! path instead; one the cache cannot hold part-way through sends the rest as chunk
//! frames, which the worker streams on to the UFS.

use std::collections::HashSet;
use std::io::Write;

use locus_common::{Error, ErrorKind, Result};
use locus_proto::{end_chunks, exchange, pb, read_response, write_chunk};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use crate::Client;
use crate::write::Input;

/// Bytes read from the input and written to a block file at a time.
const LOCAL_CHUNK: usize = 8 << 20;

/// A block file being written: the file, the bytes in it and their crc32c.
struct Block {
    file: std::fs::File,
    len: u64,
    crc: u32,
}

/// The block file's write in flight: the block and the buffer come back with its result.
type InFlight = JoinHandle<(Block, Vec<u8>, std::io::Result<()>)>;

impl Client {
    /// Write the input short-circuit when the write allows it (see the module's doc): the
    /// worker's answer and the sealed metadata, or `None` (the input untouched, `seal`
    /// kept) when the write goes over the data path instead.
    pub(crate) async fn put_local<R: AsyncRead + Unpin, F: FnOnce(&mut R) -> Result<pb::ObjectMeta>>(
        &self,
        path: &str,
        target: &pb::FileInfo,
        opts: &crate::PutOptions,
        input: &mut Input<'_, R>,
        seal: &mut Option<F>,
    ) -> Result<Option<(pb::DataResponse, pb::ObjectMeta)>> {
        let Some(wt) = target.write_type().typed() else { return Ok(None) };
        let copies = self.copies(wt, opts);
        if !self.cfg.short_circuit || !wt.caches() || wt.writes_ufs() || copies > 1 {
            return Ok(None);
        }
        let (ws, _) = self.write_pipeline(path, copies, &HashSet::new()).await?;
        let [w] = ws.as_slice() else { return Ok(None) };
        if !self.is_local(w).await {
            return Ok(None);
        }
        let Ok(mut s) = self.uds_connect(&w.uds_path).await else { return Ok(None) };
        let req = crate::write::write_request(target, opts, Vec::new());
        let first = match exchange(&mut s, pb::data_request::Req::Write(req)).await {
            Ok(r) => r,
            // FailedPrecondition: this write may not go short-circuit (the worker says why).
            // InvalidArgument: a worker older than the short-circuit write refuses the
            // request on its Unix socket (a rolling upgrade); a request the data path would
            // refuse too gets its error there.
            Err(e) if matches!(e.kind(), ErrorKind::FailedPrecondition | ErrorKind::InvalidArgument) => {
                tracing::debug!(error = %e, "short-circuit write refused; using the data path");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let block = match open_block(first.path.clone()).await {
            Ok(b) => b,
            Err(e) => {
                // This user may not write the worker's files: let the worker drop the write
                // (it answers once it has), then send it over the data path.
                tracing::debug!(error = %e, "short-circuit write refused; using the data path");
                let _ = s.shutdown().await;
                let _ = read_response(&mut s).await;
                return Ok(None);
            }
        };
        let seal = seal.take().expect("sealed once");
        write_blocks(&mut s, target.block_size, block, input, seal).await.map(Some)
    }
}

async fn open_block(path: String) -> Result<Block> {
    let file = tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| Error::io(format!("open block file {path}"), e))
    })
    .await
    .map_err(|e| Error::internal(format!("blocking task: {e}")))??;
    Ok(Block { file, len: 0, crc: 0 })
}

/// Fills `buf` (emptied first) with up to `want` bytes of `input`, as far as it goes; 0
/// at the end of the input. The bytes land in the vector's spare capacity: nothing is
/// zeroed first.
async fn fill<R: AsyncRead + Unpin>(input: &mut R, buf: &mut Vec<u8>, want: usize) -> Result<usize> {
    use bytes::BufMut;
    buf.clear();
    buf.reserve(want);
    while buf.len() < want {
        let left = want - buf.len();
        let k = input.read_buf(&mut (&mut *buf).limit(left)).await.map_err(crate::write::input_err)?;
        if k == 0 {
            break;
        }
    }
    Ok(buf.len())
}

fn start_write(mut b: Block, buf: Vec<u8>, n: usize) -> InFlight {
    tokio::task::spawn_blocking(move || {
        let r = b.file.write_all(&buf[..n]);
        if r.is_ok() {
            b.crc = crc32c::crc32c_append(b.crc, &buf[..n]);
            b.len += n as u64;
        }
        (b, buf, r)
    })
}

async fn finish_write(f: InFlight) -> Result<(Block, Vec<u8>)> {
    let (b, buf, r) = f.await.map_err(|e| Error::internal(format!("blocking task: {e}")))?;
    r.map_err(|e| Error::io("write block file", e))?;
    Ok((b, buf))
}

/// The blocks of the file: each filled from the input (one piece written while the next
/// is read), then reported; the worker's answer names the next file, or asks for the
/// rest as chunk frames (`spill`), or, after the last, acknowledges the write. A full
/// block is reported only once the input's next piece is read, so that a file ending on
/// a block boundary asks for no further block.
async fn write_blocks<R: AsyncRead + Unpin>(
    s: &mut UnixStream,
    block_size: u64,
    first: Block,
    input: &mut Input<'_, R>,
    seal: impl FnOnce(&mut R) -> Result<pb::ObjectMeta>,
) -> Result<(pb::DataResponse, pb::ObjectMeta)> {
    let piece = |queued: u64| ((block_size - queued) as usize).min(LOCAL_CHUNK);
    let mut block = Some(first);
    // At most two buffers: the one being filled and the one being written.
    let mut spare: Option<Vec<u8>> = None;
    // The first piece of the next block, read before the last block was reported.
    let mut ahead: Option<(Vec<u8>, usize)> = None;
    loop {
        // This block's bytes handed to its file so far (the last piece maybe in flight).
        let mut queued = 0u64;
        let mut flight: Option<InFlight> = None;
        let mut ended = false;
        while queued < block_size {
            let want = piece(queued);
            let (buf, n) = match ahead.take() {
                Some(p) => p,
                None => {
                    let mut buf = spare.take().unwrap_or_else(|| Vec::with_capacity(LOCAL_CHUNK));
                    let n = fill(input, &mut buf, want).await?;
                    (buf, n)
                }
            };
            // The block comes back with the write in flight, and its buffer is free again.
            let b = match flight.take() {
                Some(f) => {
                    let (b, back) = finish_write(f).await?;
                    spare = Some(back);
                    b
                }
                None => block.take().expect("the block is here when no write is in flight"),
            };
            if n > 0 {
                flight = Some(start_write(b, buf, n));
                queued += n as u64;
            } else {
                block = Some(b);
                spare.get_or_insert(buf);
            }
            if n < want {
                ended = true;
                break;
            }
        }
        if let Some(f) = flight.take() {
            let (b, back) = finish_write(f).await?;
            block = Some(b);
            spare.get_or_insert(back);
        }
        if !ended {
            let mut buf = spare.take().unwrap_or_else(|| Vec::with_capacity(LOCAL_CHUNK));
            let n = fill(input, &mut buf, piece(0)).await?;
            if n == 0 {
                ended = true;
                spare = Some(buf);
            } else {
                ahead = Some((buf, n));
            }
        }
        let b = block.take().expect("the block is back once its writes are done");
        let done = pb::BlockWritten { length: b.len, crc32c: b.crc, last: ended };
        drop(b.file); // closed before the worker commits (and renames) it
        if ended {
            let meta = seal(input.rest)?;
            let r = exchange(s, pb::data_request::Req::BlockWritten(done)).await?;
            return Ok((r, meta));
        }
        let next = exchange(s, pb::data_request::Req::BlockWritten(done)).await?;
        if next.spill {
            let (buf, n) = ahead.take().expect("read ahead when the block was full");
            return spill(s, input, buf, n, seal).await;
        }
        block = Some(open_block(next.path).await?);
    }
}

/// The rest of the input, as chunk frames the worker streams on to the UFS: the first `n`
/// bytes of `buf` (read already), then what follows.
async fn spill<R: AsyncRead + Unpin>(
    s: &mut UnixStream,
    input: &mut Input<'_, R>,
    mut buf: Vec<u8>,
    mut n: usize,
    seal: impl FnOnce(&mut R) -> Result<pb::ObjectMeta>,
) -> Result<(pb::DataResponse, pb::ObjectMeta)> {
    while n > 0 {
        write_chunk(s, &buf[..n]).await.map_err(|e| Error::io("send", e))?;
        n = fill(input, &mut buf, LOCAL_CHUNK).await?;
    }
    let meta = seal(input.rest)?;
    end_chunks(s).await.map_err(|e| Error::io("send", e))?;
    Ok((read_response(s).await?, meta))
}
