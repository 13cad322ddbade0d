//! Near-data compute: one block's partial result ([`locus_compute::BlockScanner`]),
//! computed from the cached block or, on a miss, behind the fill that caches it (the
//! cold run is the read, not the read and a second pass). Only the partial goes back.
//! SQL plan fragments ([`crate::FragmentRunner`]): their result batches go back as they
//! come, and a caller that hangs up stops them.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use futures::{FutureExt, StreamExt};
use locus_common::{Error, Result};
use locus_compute::{BlockScanner, Resolved};
use locus_proto::tls::DataStream;
use locus_proto::{pb, write_frame};
use prost::Message;

use crate::Inner;
use crate::read::ScanSource;

/// Bytes scanned per hop to a blocking thread.
const PIECE: u64 = 4 << 20;

impl Inner {
    pub(crate) async fn handle_compute(
        self: &Arc<Self>,
        sock: &mut DataStream,
        req: pb::ComputeBlockRequest,
    ) -> Result<()> {
        let spec = req.spec.as_ref().ok_or_else(|| Error::invalid("a compute request without a spec"))?;
        let spec = Resolved::new(spec)?;
        let r = req.block.ok_or_else(|| Error::invalid("a compute request without a block"))?;
        if r.offset != 0 || r.length != r.block_length {
            return Err(Error::invalid("a compute request covers a whole block"));
        }
        let mut scanner = BlockScanner::new(&spec, r.file_offset, req.in_quotes, req.file_start);
        let mut source = self.open_for_scan(&r).await?;
        let mut pos = 0u64;
        match &mut source {
            ScanSource::Ufs(stream) => {
                let mut pending: Vec<bytes::Bytes> = Vec::new();
                let mut size = 0u64;
                let mut ended = false;
                while !ended {
                    match stream.next().await {
                        Some(b) => {
                            let b = b?;
                            self.counters.ufs.fetch_add(b.len() as u64, Relaxed);
                            size += b.len() as u64;
                            pending.push(b);
                            if size < PIECE {
                                continue;
                            }
                        }
                        None => ended = true,
                    }
                    let bufs = std::mem::take(&mut pending);
                    pos += size;
                    size = 0;
                    scanner = crate::blocking(move || {
                        for b in &bufs {
                            scanner.feed(b);
                        }
                        Ok::<_, Error>(scanner)
                    })
                    .await??;
                    abandoned(sock)?;
                }
            }
            _ => {
                while pos < r.block_length {
                    let avail = source.readable_past(pos).await?.min(r.block_length);
                    let n = avail.saturating_sub(pos).min(PIECE);
                    if n == 0 {
                        return Err(Error::new(
                            locus_common::ErrorKind::Corrupt,
                            format!("cached block {} is shorter than the file says", r.block_id),
                        ));
                    }
                    let file = match &source {
                        ScanSource::Cached { file, .. } | ScanSource::Filling { file, .. } => file.clone(),
                        ScanSource::Ufs(_) => unreachable!("matched above"),
                    };
                    let at = pos;
                    scanner = crate::blocking(move || {
                        let mut buf = vec![0u8; n as usize];
                        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, at)
                            .map_err(|e| Error::io("read block", e))?;
                        scanner.feed(&buf);
                        Ok::<_, Error>(scanner)
                    })
                    .await??;
                    pos += n;
                    abandoned(sock)?;
                }
            }
        }
        source.settled().await;
        drop(source);
        if pos != r.block_length {
            return Err(Error::new(
                locus_common::ErrorKind::Ufs,
                format!("block {} has {pos} of {} bytes (the UFS file changed?)", r.block_id, r.block_length),
            ));
        }
        let partial = crate::blocking(move || scanner.finish()).await?;
        let resp = pb::DataResponse { partial: Some(partial), ..Default::default() };
        self.counters.compute_scanned.fetch_add(pos, Relaxed);
        self.counters.compute_returned.fetch_add(resp.encoded_len() as u64, Relaxed);
        write_frame(sock, &resp).await
    }
}

impl Inner {
    pub(crate) async fn handle_fragment(
        self: &Arc<Self>,
        sock: &mut DataStream,
        req: pb::SqlFragmentRequest,
    ) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let runner = self.fragments.clone().ok_or_else(|| {
            Error::new(
                locus_common::ErrorKind::FailedPrecondition,
                "this worker runs no SQL (built without the `sql` feature)",
            )
        })?;
        let (mut stream, scanned) = runner.run(&req.plan, req.partition)?;
        let mut returned = 0u64;
        let sent = async {
            loop {
                let next = tokio::select! {
                    n = stream.next() => n,
                    _ = hung_up(sock) => return Err(Error::unavailable("the caller hung up; SQL fragment abandoned")),
                };
                match next {
                    Some(Ok(ipc)) => {
                        returned += ipc.len() as u64;
                        write_frame(sock, &pb::DataResponse { ipc, ..Default::default() }).await?;
                        sock.flush().await.map_err(|e| Error::io("send SQL results", e))?;
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Ok(()),
                }
            }
        }
        .await;
        drop(stream); // stops the scan, if it is not done
        let scanned = scanned.load(Relaxed);
        self.counters.compute_scanned.fetch_add(scanned, Relaxed);
        sent?;
        self.counters.compute_returned.fetch_add(returned, Relaxed);
        write_frame(sock, &pb::DataResponse { done: true, scanned, ..Default::default() }).await
    }
}

/// Resolves when the caller hangs up while it waits for a fragment's results: it sends
/// nothing meanwhile, so anything readable is its end of stream (over TLS, the close
/// message that comes first).
async fn hung_up(sock: &DataStream) {
    let mut b = [0u8; 1];
    let _ = sock.tcp().peek(&mut b).await;
}

/// Whether the caller hung up (a compute it abandoned stops here, between pieces): the
/// caller sends nothing while it waits, so anything readable is its end of stream (over
/// TLS, the close message that comes first).
fn abandoned(sock: &DataStream) -> Result<()> {
    let mut b = [0u8; 1];
    match sock.tcp().peek(&mut b).now_or_never() {
        Some(Ok(0)) | Some(Err(_)) => Err(Error::unavailable("the caller hung up; compute abandoned")),
        Some(Ok(_)) if sock.is_tls() => Err(Error::unavailable("the caller hung up; compute abandoned")),
        _ => Ok(()),
    }
}
