//! The data plane's framing and its one request/answer exchange: length-prefixed control
//! frames, the chunk frames of a write, and the typed `DataRequest` → `DataResponse` round
//! trip every client of a worker's data path (the client, a worker forwarding to a replica
//! or reading from a peer) goes through.

use locus_common::security::{Identity, Role, Verifier, unauthenticated};
use locus_common::{Error, Result};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pb;

/// Largest control frame accepted on the data plane. Block bytes are not framed.
pub const MAX_FRAME: usize = 1 << 20;
/// Largest answer a caller accepts from a worker: a compute's partial result may carry
/// a column's distinct values.
pub const MAX_ANSWER: usize = 256 << 20;

/// Write one length-prefixed message.
pub async fn write_frame<W: AsyncWrite + Unpin, M: Message>(w: &mut W, m: &M) -> Result<()> {
    w.write_all(&frame(m)).await.map_err(|e| Error::io("write frame", e))
}

/// One length-prefixed message's bytes (for a caller that writes them itself).
pub fn frame<M: Message>(m: &M) -> Vec<u8> {
    let len = m.encoded_len();
    let mut buf = Vec::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    m.encode(&mut buf).expect("a Vec grows to fit");
    buf
}

/// Read one length-prefixed message. `Ok(None)` on a clean end of stream before a frame.
pub async fn read_frame<R: AsyncRead + Unpin, M: Message + Default>(r: &mut R) -> Result<Option<M>> {
    read_frame_max(r, MAX_FRAME).await
}

/// [`read_frame`] of a message of up to `max` bytes.
async fn read_frame_max<R: AsyncRead + Unpin, M: Message + Default>(r: &mut R, max: usize) -> Result<Option<M>> {
    let mut lenb = [0u8; 4];
    match r.read_exact(&mut lenb).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io("read frame", e)),
    }
    let len = u32::from_be_bytes(lenb) as usize;
    if len > max {
        return Err(Error::invalid(format!("frame of {len} bytes exceeds the {max}-byte limit")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await.map_err(|e| Error::io("read frame body", e))?;
    M::decode(buf.as_slice()).map(Some).map_err(|e| Error::invalid(format!("garbled frame: {e}")))
}

impl From<pb::data_request::Req> for pb::DataRequest {
    fn from(req: pb::data_request::Req) -> Self {
        pb::DataRequest { req: Some(req), term: 0 }
    }
}

impl pb::DataRequest {
    /// A master's order to a worker (persist, replicate), sent as the group's leader in
    /// `term` (0 without a group): the worker refuses it once it has heard of a later term.
    pub fn order(req: pb::data_request::Req, term: u64) -> Self {
        pb::DataRequest { req: Some(req), term }
    }
}

impl pb::DataResponse {
    /// The answer that reports `e` (and nothing else).
    pub fn error(e: &Error) -> Self {
        pb::DataResponse { error: Some(crate::to_error_info(e)), ..Default::default() }
    }

    /// The answer itself, or the error it carries.
    pub fn into_result(self) -> Result<Self> {
        match self.error {
            Some(e) => Err(crate::from_error_info(e)),
            None => Ok(self),
        }
    }
}

/// Send one request: its frame, flushed (a buffered stream sends it now).
pub async fn send_request<S: AsyncWrite + Unpin>(s: &mut S, req: impl Into<pb::DataRequest>) -> Result<()> {
    write_frame(s, &req.into()).await?;
    s.flush().await.map_err(|e| Error::io("send request", e))
}

/// Read one answer: the error it carries becomes the `Err`, and a stream that ends
/// before it is `Unavailable` (the worker went away).
pub async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Result<pb::DataResponse> {
    read_frame_max::<_, pb::DataResponse>(s, MAX_ANSWER)
        .await?
        .ok_or_else(|| Error::unavailable("the worker closed the connection before answering"))?
        .into_result()
}

/// Prove `who` on a new data-path connection. The caller speaks first (the listener
/// tells TLS from plain by the first byte): an opening auth frame naming the role, then
/// the listener's challenge comes back, and the answer to it is written, not flushed (it
/// leaves with the first request). The credential itself is never sent. A listener
/// that refuses at once (a TLS-only worker called in plain) is answered with its error.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, who: &Identity) -> Result<()> {
    let role = pb::PeerRole::from(who.role()).into();
    send_request(s, pb::data_request::Req::Auth(pb::AuthRequest { role, proof: Vec::new() })).await?;
    let challenge = read_frame_max::<_, pb::DataResponse>(s, MAX_AUTH_FRAME)
        .await?
        .ok_or_else(|| Error::unavailable("the worker closed the connection before its challenge"))?
        .into_result()?
        .challenge;
    if challenge.len() != NONCE_LEN {
        return Err(Error::unavailable(
            "the data-path listener sent no challenge (not a Locus worker of this version)",
        ));
    }
    let auth = pb::AuthRequest { role, proof: who.prove(&challenge) };
    write_frame(s, &pb::DataRequest::from(pb::data_request::Req::Auth(auth))).await
}

/// Bytes of a listener's challenge nonce.
const NONCE_LEN: usize = 32;
/// Largest frame of the authentication exchange (an error answer's text included):
/// nothing larger is read, or allocated, before a caller has proved itself.
const MAX_AUTH_FRAME: usize = 4096;
/// How long a new connection has to prove itself.
const AUTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A worker's check of a new connection: its opening auth frame gets a fresh challenge,
/// and its next frame must answer it for the role it claims. A connection that opens
/// otherwise or answers wrongly gets an `Unauthenticated` error frame (the caller's
/// answer) and must be closed; the refusal is logged with `peer`.
pub async fn accept_auth<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, v: &Verifier, peer: &str) -> Result<Role> {
    match tokio::time::timeout(AUTH_TIMEOUT, accept_auth_now(s, v, peer)).await {
        Ok(r) => r,
        Err(_) => Err(Error::unavailable("a data-path connection did not authenticate in time")),
    }
}

async fn accept_auth_now<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, v: &Verifier, peer: &str) -> Result<Role> {
    let role = match read_frame_max::<_, pb::DataRequest>(s, MAX_AUTH_FRAME).await? {
        None => return Err(Error::unavailable("connection closed before it authenticated")),
        Some(pb::DataRequest { req: Some(pb::data_request::Req::Auth(a)), .. }) if a.proof.is_empty() => {
            let nonce: [u8; NONCE_LEN] = rand::random();
            write_frame(s, &pb::DataResponse { challenge: nonce.to_vec(), ..Default::default() }).await?;
            s.flush().await.map_err(|e| Error::io("send challenge", e))?;
            match read_frame_max::<_, pb::DataRequest>(s, MAX_AUTH_FRAME).await? {
                Some(pb::DataRequest { req: Some(pb::data_request::Req::Auth(a)), .. }) => {
                    a.role().typed().filter(|r| v.check(*r, &nonce, &a.proof))
                }
                _ => None,
            }
        }
        Some(_) => None,
    };
    match role {
        Some(r) => Ok(r),
        None => {
            tracing::warn!(peer, "refused a data-path connection: missing or wrong cluster credentials");
            let e = unauthenticated("data path");
            let _ = write_frame(s, &pb::DataResponse::error(&e)).await;
            let _ = s.flush().await;
            Err(e)
        }
    }
}

/// One request and its answer ([`send_request`], then [`read_response`]).
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: impl Into<pb::DataRequest>,
) -> Result<pb::DataResponse> {
    send_request(s, req).await?;
    read_response(s).await
}

/// Send one chunk of a write's bytes (a length-prefixed frame; never empty: an empty
/// frame ends the write, see [`end_chunks`]).
pub async fn write_chunk<W: AsyncWrite + Unpin>(w: &mut W, chunk: &[u8]) -> std::io::Result<()> {
    debug_assert!(!chunk.is_empty());
    w.write_all(&(chunk.len() as u32).to_be_bytes()).await?;
    w.write_all(chunk).await
}

/// End a write's chunks (the zero-length frame) and flush.
pub async fn end_chunks<W: AsyncWrite + Unpin>(w: &mut W) -> std::io::Result<()> {
    w.write_all(&0u32.to_be_bytes()).await?;
    w.flush().await
}

/// The largest chunk of a write a reader takes.
pub const MAX_CHUNK: usize = 64 << 20;

/// Read the next chunk of a write ([`write_chunk`]); `None` at the zero-length frame that
/// ends them. `due(r, left)` is told before each read how many bytes of the chunk are
/// still to come, and 0 once it is in (the data path sets its socket's low-water mark
/// with it, [`expect_bytes`]). The chunk is read into unzeroed memory, and never past its
/// end: the writer may be waiting for an answer after it.
pub async fn read_chunk<R: AsyncRead + Unpin>(r: &mut R, mut due: impl FnMut(&R, u64)) -> Result<Option<bytes::Bytes>> {
    let eof = || Error::io("read write chunk", std::io::ErrorKind::UnexpectedEof.into());
    let mut lenb = [0u8; 4];
    r.read_exact(&mut lenb).await.map_err(|e| Error::io("read write chunk", e))?;
    let len = u32::from_be_bytes(lenb) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > MAX_CHUNK {
        return Err(Error::invalid(format!("write chunk of {len} bytes: at most {MAX_CHUNK}")));
    }
    let mut buf = bytes::BytesMut::with_capacity(len);
    while buf.len() < len {
        let left = (len - buf.len()) as u64;
        due(r, left);
        let n = (&mut *r).take(left).read_buf(&mut buf).await.map_err(|e| Error::io("read write chunk", e))?;
        if n == 0 {
            return Err(eof());
        }
    }
    due(r, 0);
    Ok(Some(buf.freeze()))
}

/// Read and drop a write's remaining chunks, up to the frame that ends them or the
/// writer's hang-up (a worker that answered a write early with its error keeps the
/// connection in step this way). Whether the end frame was reached.
pub async fn discard_chunks<R: AsyncRead + Unpin>(r: &mut R) -> bool {
    let mut scratch = vec![0u8; 256 << 10];
    loop {
        let mut lenb = [0u8; 4];
        if r.read_exact(&mut lenb).await.is_err() {
            return false;
        }
        let mut left = u32::from_be_bytes(lenb) as usize;
        if left == 0 {
            return true;
        }
        while left > 0 {
            let k = left.min(scratch.len());
            match r.read(&mut scratch[..k]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => left -= n,
            }
        }
    }
}

/// While a block's bytes (or a write's chunk) stream in over the data path, the socket
/// wakes its reader only once this much has arrived (SO_RCVLOWAT, [`expect_bytes`];
/// lowered to what is left near the end, and back to 1 for the next answer). Woken for
/// every 64 KiB segment
/// of loopback TCP, a reader that keeps up with the worker sleeps and is woken 13-33
/// thousand times per GiB, and on a VM each wake-up of an idle vCPU is dear: forced-remote
/// reads of a cached GiB took 0.22-0.60 s, bimodal, with the worker's CPU time rising with
/// the wake-ups it sent. At 512 KiB: 0.14-0.25 s, about 3 thousand wake-ups, and half the
/// client's CPU time (`locus fs wc --remote` against `local start`, this 2-core VM).
pub const RECV_LOWAT: u64 = 512 << 10;

/// Tell a data-path socket that `left` more bytes of the stream it reads are due (0: the
/// stream is done): its SO_RCVLOWAT becomes `RECV_LOWAT`, or `left` when less is due (a
/// reader must never wait for bytes that will not come), or 1 once done. `cur` is the
/// socket's current value (1 for a fresh socket); nothing is set when it stays.
/// Best effort: a socket that refuses it wakes its reader as before. Nothing under TLS
/// (what is due is plaintext; the socket holds records, and the TLS layer may already
/// hold part of it: a mark could wait for bytes that never come).
pub fn expect_bytes(s: &crate::tls::DataStream, cur: &mut u64, left: u64) {
    use std::os::fd::AsRawFd;
    let Some(s) = s.plain() else { return };
    let want = RECV_LOWAT.min(left).max(1);
    if want == *cur {
        return;
    }
    *cur = want;
    let v = want as libc::c_int;
    // SAFETY: a valid socket and an int option.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locus_common::ErrorKind;

    #[tokio::test]
    async fn frames_round_trip_and_reject_garbage() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let m = pb::DataResponse { length: 42, path: "p".into(), ..Default::default() };
        write_frame(&mut a, &m).await.unwrap();
        let got: pb::DataResponse = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(got, m);
        // a huge length prefix is refused without allocating
        a.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let e = read_frame::<_, pb::DataRequest>(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        // garbage bytes fail to decode
        a.write_all(&3u32.to_be_bytes()).await.unwrap();
        a.write_all(&[0xff, 0xff, 0xff]).await.unwrap();
        let e = read_frame::<_, pb::DataRequest>(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        drop(a);
        assert!(read_frame::<_, pb::DataRequest>(&mut b).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn chunks_round_trip_and_stop_at_their_end() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let big = vec![7u8; 200_000];
        let writer = tokio::spawn(async move {
            write_chunk(&mut a, b"abc").await.unwrap();
            write_chunk(&mut a, &big).await.unwrap();
            end_chunks(&mut a).await.unwrap();
            write_frame(&mut a, &pb::DataResponse { length: 9, ..Default::default() }).await.unwrap();
            a
        });
        let mut dues = Vec::new();
        let c1 = read_chunk(&mut b, |_, left| dues.push(left)).await.unwrap().unwrap();
        assert_eq!(&c1[..], b"abc");
        assert_eq!(dues.first(), Some(&3));
        assert_eq!(dues.last(), Some(&0));
        let c2 = read_chunk(&mut b, |_, _| {}).await.unwrap().unwrap();
        assert_eq!(c2.len(), 200_000);
        assert!(c2.iter().all(|&x| x == 7));
        assert!(read_chunk(&mut b, |_, _| {}).await.unwrap().is_none());
        // Nothing past the end frame was taken: the next frame is intact.
        let next: pb::DataResponse = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(next.length, 9);
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn a_chunk_too_large_or_cut_short_is_an_error() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&((MAX_CHUNK + 1) as u32).to_be_bytes()).await.unwrap();
        let e = read_chunk(&mut b, |_, _| {}).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&10u32.to_be_bytes()).await.unwrap();
        a.write_all(b"12345").await.unwrap();
        drop(a);
        let e = read_chunk(&mut b, |_, _| {}).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "a writer gone mid-chunk: {e}");
    }

    #[tokio::test]
    async fn discarded_chunks_leave_the_stream_in_step() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(async move {
            write_chunk(&mut a, &vec![1u8; 600_000]).await.unwrap();
            write_chunk(&mut a, b"x").await.unwrap();
            end_chunks(&mut a).await.unwrap();
            write_frame(&mut a, &pb::DataResponse { length: 5, ..Default::default() }).await.unwrap();
            a
        });
        assert!(discard_chunks(&mut b).await);
        let next: pb::DataResponse = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(next.length, 5);
        drop(writer.await.unwrap());
        // A writer that hangs up mid-chunk: not in step.
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&100u32.to_be_bytes()).await.unwrap();
        drop(a);
        assert!(!discard_chunks(&mut b).await);
    }

    /// A worker's side of one exchange: read the request, answer with `resp`.
    async fn answer(s: &mut tokio::io::DuplexStream, resp: pb::DataResponse) -> pb::DataRequest {
        let req: pb::DataRequest = read_frame(s).await.unwrap().unwrap();
        write_frame(s, &resp).await.unwrap();
        req
    }

    #[tokio::test]
    async fn exchange_round_trips_and_maps_errors() {
        let (mut client, mut worker) = tokio::io::duplex(1 << 16);
        let read = pb::ReadBlockRequest { block_id: 7, length: 3, ..Default::default() };
        let ok = pb::DataResponse { length: 3, cached: true, ..Default::default() };
        let (got, req) = tokio::join!(
            exchange(&mut client, pb::data_request::Req::Read(read.clone())),
            answer(&mut worker, ok.clone())
        );
        assert_eq!(got.unwrap(), ok);
        assert_eq!(req.req, Some(pb::data_request::Req::Read(read)));

        // An error answer comes back as the error, kind and retryability intact.
        let hello = pb::data_request::Req::Hello(pb::Empty {});
        for e in [Error::not_found("block 7 is not cached here"), Error::unavailable("gone")] {
            let (got, _) =
                tokio::join!(exchange(&mut client, hello.clone()), answer(&mut worker, pb::DataResponse::error(&e)));
            let got = got.unwrap_err();
            assert_eq!(got.kind(), e.kind());
            assert_eq!(got.is_retryable(), e.is_retryable());
            assert!(got.to_string().contains("gone") || got.to_string().contains("not cached"), "{got}");
        }

        // A worker that hangs up without answering is unavailable (worth a retry elsewhere).
        let (got, _) = tokio::join!(exchange(&mut client, hello), async {
            let _: pb::DataRequest = read_frame(&mut worker).await.unwrap().unwrap();
            drop(worker);
        });
        let got = got.unwrap_err();
        assert_eq!(got.kind(), ErrorKind::Unavailable);
        assert!(got.is_retryable());
    }

    #[tokio::test]
    async fn only_a_valid_proof_opens_a_connection() {
        use locus_common::security::Secret;
        let secret = Secret::generate();
        let v = Verifier::new(&secret);
        for who in [v.identity(Role::Worker), v.identity(Role::Master), Identity::client(&secret.client_token())] {
            let (mut c, mut w) = tokio::io::duplex(1 << 16);
            let (a, b) = tokio::join!(authenticate(&mut c, &who), accept_auth(&mut w, &v, "test"));
            a.unwrap();
            assert_eq!(b.ok(), Some(who.role()));
        }
        // Another cluster's member, a client claiming a member's role, or a first frame
        // that is no answer: refused with an error frame.
        let other = Verifier::new(&Secret::generate());
        let bad =
            [Some(other.identity(Role::Worker)), Some(Identity::member(&secret.client_token(), Role::Master)), None];
        for who in bad {
            let (mut c, mut w) = tokio::io::duplex(1 << 16);
            let caller = async {
                if let Some(who) = &who {
                    authenticate(&mut c, who).await.unwrap();
                }
                write_frame(&mut c, &pb::DataRequest::from(pb::data_request::Req::Hello(pb::Empty {}))).await.unwrap();
                c.flush().await.unwrap();
                read_response(&mut c).await
            };
            let (got, e) = tokio::join!(caller, accept_auth(&mut w, &v, "test"));
            assert_eq!(e.unwrap_err().kind(), ErrorKind::Unauthenticated);
            assert_eq!(got.unwrap_err().kind(), ErrorKind::Unauthenticated);
        }
        // What crosses the wire holds neither credential.
        let (mut c, mut w) = tokio::io::duplex(1 << 16);
        let who = Identity::client(&secret.client_token());
        let (a, _) = tokio::join!(authenticate(&mut c, &who), async {
            write_frame(&mut w, &pb::DataResponse { challenge: vec![9; NONCE_LEN], ..Default::default() }).await
        });
        // (The opening frame is read back below with the answer.)
        a.unwrap();
        c.flush().await.unwrap();
        drop(c);
        let mut sent = Vec::new();
        w.read_to_end(&mut sent).await.unwrap();
        let sent = String::from_utf8_lossy(&sent);
        assert!(!sent.contains(secret.client_token().expose()) && !sent.contains(secret.expose()));
    }

    #[tokio::test]
    async fn an_unproven_caller_gets_neither_memory_nor_time() {
        use locus_common::security::Secret;
        let v = Verifier::new(&Secret::generate());
        // A first frame past the auth limit is refused before its body is read.
        let (mut c, mut w) = tokio::io::duplex(1 << 16);
        c.write_all(&((MAX_AUTH_FRAME + 1) as u32).to_be_bytes()).await.unwrap();
        let e = accept_auth(&mut w, &v, "test").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // A caller that opens and then says nothing is dropped after AUTH_TIMEOUT.
        let (_c, mut w) = tokio::io::duplex(1 << 16);
        let t = std::time::Instant::now();
        let e = accept_auth(&mut w, &v, "test").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(t.elapsed() >= AUTH_TIMEOUT && t.elapsed() < AUTH_TIMEOUT * 2, "{:?}", t.elapsed());
    }

    #[tokio::test]
    async fn write_chunks_are_length_prefixed_and_end_with_an_empty_frame() {
        let mut v = Vec::new();
        write_chunk(&mut v, b"abc").await.unwrap();
        end_chunks(&mut v).await.unwrap();
        assert_eq!(v, [0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0]);
    }
}
