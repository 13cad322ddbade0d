//! The request stream of a gateway connection as hyper reads it, followed message by
//! message: each request head is judged ([`crate::early::check_head`]) before hyper sees
//! it, on every request of a keep-alive connection, not only the first. hyper answers a
//! head it cannot parse (a malformed `Content-Length`) with a bare 400; here such a head
//! is swapped for a request of the connection's own ([`Framed::token`]), which the
//! service answers with S3's XML error, and the connection ends after it (where the
//! refused request's body ends is unknown).
//!
//! To find where each head starts, bodies are skipped by their framing: `Content-Length`
//! bytes are passed on as they are read, straight into hyper's buffer; a chunked body is
//! followed chunk by chunk. Anything this cannot follow (an unknown transfer coding, a
//! malformed chunk, a head past hyper's own limit) is passed on untouched from there on,
//! for hyper to judge as before.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::early::{PARSE_LIMIT, Refusal, check_head};

/// Longest chunk-size or trailer line followed; a longer one is hyper's to judge.
const MAX_LINE: usize = 4096;

/// Where the stream is.
#[derive(Debug, PartialEq)]
enum State {
    Head,
    /// Body bytes still to come.
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    Trailer,
    /// Not followed any more: everything goes to hyper as it comes.
    Passthrough,
    /// A refused head was replaced: nothing more is read. Reads wait for ever (hyper
    /// drops a connection whose reading ends before its answer is written; it closes this
    /// one after answering the stand-in, which asks for that).
    Closed,
}

/// The refusal a connection's service answers in place of the head it replaced, and the
/// path of the request that stands in for that head (random: a client cannot aim a
/// request of its own at it).
#[derive(Clone)]
pub(crate) struct Refused {
    slot: Arc<Mutex<Option<Refusal>>>,
    token: Arc<str>,
}

impl Refused {
    pub(crate) fn new() -> Refused {
        let token = format!("/.locus-refused-{:032x}", rand::random::<u128>());
        Refused { slot: Arc::default(), token: token.into() }
    }

    /// The refusal to answer, once, if `path` is the stand-in's.
    pub(crate) fn take(&self, path: &str) -> Option<Refusal> {
        if path == &*self.token { self.slot.lock().take() } else { None }
    }
}

/// A connection's reads, followed message by message (see the module's doc).
pub(crate) struct Framed<S> {
    inner: S,
    /// Read and not yet judged.
    raw: Vec<u8>,
    /// Judged, for hyper.
    out: Vec<u8>,
    out_at: usize,
    state: State,
    eof: bool,
    refused: Refused,
}

impl<S> Framed<S> {
    /// `read` is what was read of the connection already (its first head, perhaps more).
    pub(crate) fn new(read: Vec<u8>, inner: S, refused: Refused) -> Self {
        Framed { inner, raw: read, out: Vec::new(), out_at: 0, state: State::Head, eof: false, refused }
    }

    /// Moves `n` judged bytes of `raw` to `out`.
    fn pass(&mut self, n: usize) {
        self.out.extend(self.raw.drain(..n));
    }

    /// `n` bytes of the body (or chunk) under way went to hyper.
    fn body_read(&mut self, n: u64) {
        self.state = match self.state {
            State::Body(r) if r == n => State::Head,
            State::Body(r) => State::Body(r - n),
            State::ChunkData(r) if r == n => State::ChunkEnd,
            State::ChunkData(r) => State::ChunkData(r - n),
            _ => unreachable!("a body is under way"),
        };
    }

    /// Judges what `raw` holds as far as it can; whether anything changed.
    fn advance(&mut self) -> bool {
        match self.state {
            State::Closed => {
                self.raw.clear();
                false
            }
            State::Passthrough => {
                let any = !self.raw.is_empty();
                self.pass(self.raw.len());
                any
            }
            State::Body(rest) | State::ChunkData(rest) => {
                let n = rest.min(self.raw.len() as u64);
                self.pass(n as usize);
                self.body_read(n);
                n > 0 || n == rest
            }
            State::ChunkEnd => {
                if self.raw.len() < 2 {
                    return false;
                }
                self.state = if self.raw.starts_with(b"\r\n") { State::ChunkSize } else { State::Passthrough };
                self.pass(if self.state == State::ChunkSize { 2 } else { 0 });
                true
            }
            State::ChunkSize | State::Trailer => self.line(),
            State::Head => self.head(),
        }
    }

    /// A chunk-size or trailer line.
    fn line(&mut self) -> bool {
        let Some(end) = self.raw.iter().position(|b| *b == b'\n') else {
            if self.raw.len() > MAX_LINE {
                self.state = State::Passthrough;
                return true;
            }
            return false;
        };
        let line = self.raw[..end].strip_suffix(b"\r").unwrap_or(&self.raw[..end]);
        self.state = if self.state == State::Trailer {
            if line.is_empty() { State::Head } else { State::Trailer }
        } else {
            let hex = line.split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
            match std::str::from_utf8(hex).ok().and_then(|h| u64::from_str_radix(h, 16).ok()) {
                Some(0) => State::Trailer,
                Some(n) if !hex.is_empty() => State::ChunkData(n),
                _ => State::Passthrough,
            }
        };
        self.pass(end + 1);
        true
    }

    /// A request head: judged whole, then passed on, or replaced by the token's request.
    fn head(&mut self) -> bool {
        let Some(len) = head_len(&self.raw) else {
            if self.raw.len() >= PARSE_LIMIT.0 {
                self.state = State::Passthrough;
                return true;
            }
            return false;
        };
        let head = &self.raw[..len];
        if let Some(r) = check_head(head) {
            *self.refused.slot.lock() = Some(r);
            let stand_in = format!("GET {} HTTP/1.1\r\nhost: refused\r\nconnection: close\r\n\r\n", self.refused.token);
            self.out.extend_from_slice(stand_in.as_bytes());
            self.raw.clear();
            self.state = State::Closed;
            return true;
        }
        self.state = body_of(head);
        self.pass(len);
        true
    }
}

/// The length of the request head `b` starts with, once its blank line has come: lines
/// end with CRLF, or with a bare LF, which hyper takes too.
pub(crate) fn head_len(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// How the body after a judged head is framed.
fn body_of(head: &[u8]) -> State {
    let mut length = 0u64;
    for l in head.split(|b| *b == b'\n').skip(1) {
        let Some(colon) = l.iter().position(|b| *b == b':') else { continue };
        let (name, value) = (&l[..colon], l[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value.rsplit(|b| *b == b',').next().unwrap_or_default().trim_ascii();
            return if last.eq_ignore_ascii_case(b"chunked") { State::ChunkSize } else { State::Passthrough };
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            // `check_head` took it: one number, perhaps repeated.
            let first = value.split(|b| *b == b',').next().unwrap_or_default().trim_ascii();
            length = std::str::from_utf8(first).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    if length == 0 { State::Head } else { State::Body(length) }
}

impl<S: AsyncRead + Unpin> AsyncRead for Framed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.out_at < me.out.len() {
                let n = buf.remaining().min(me.out.len() - me.out_at);
                buf.put_slice(&me.out[me.out_at..me.out_at + n]);
                me.out_at += n;
                if me.out_at == me.out.len() {
                    me.out.clear();
                    me.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if me.raw.is_empty() {
                match me.state {
                    State::Closed => return Poll::Pending,
                    State::Passthrough => return Pin::new(&mut me.inner).poll_read(cx, buf),
                    // A body's bytes go straight into hyper's buffer, counted.
                    State::Body(rest) | State::ChunkData(rest) if !me.eof => {
                        let cap = (buf.remaining() as u64).min(rest) as usize;
                        let mut part = buf.take(cap);
                        ready!(Pin::new(&mut me.inner).poll_read(cx, &mut part))?;
                        let n = part.filled().len();
                        // SAFETY: `part` is `buf`'s unfilled memory, and the read filled `n` bytes of it.
                        unsafe { buf.assume_init(n) };
                        buf.advance(n);
                        if n > 0 {
                            me.body_read(n as u64);
                        }
                        return Poll::Ready(Ok(()));
                    }
                    _ => {}
                }
            }
            if me.advance() {
                continue;
            }
            if me.eof {
                // The stream ended inside a message: hyper gets what there is.
                me.state = State::Passthrough;
                if me.raw.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; 16 << 10];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                me.eof = true;
            }
            me.raw.extend_from_slice(rb.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Framed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What hyper would read of `input` sent in pieces of `piece` bytes, and the refusal.
    async fn through(input: &[u8], piece: usize) -> (Vec<u8>, Option<Refusal>, String) {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let refused = Refused::new();
        let mut f = Framed::new(Vec::new(), b, refused.clone());
        let token = refused.token.to_string();
        let data = input.to_vec();
        let w = tokio::spawn(async move {
            for p in data.chunks(piece.max(1)) {
                a.write_all(p).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let mut all = Vec::new();
        let mut b = [0u8; 4096];
        // A replaced head leaves the stream waiting for ever: read until the stand-in.
        let stand_in = format!("GET {token} HTTP/1.1\r\nhost: refused\r\nconnection: close\r\n\r\n");
        while !all.ends_with(stand_in.as_bytes()) {
            match tokio::time::timeout(std::time::Duration::from_secs(10), f.read(&mut b)).await.unwrap().unwrap() {
                0 => break,
                n => all.extend_from_slice(&b[..n]),
            }
        }
        w.await.unwrap();
        let r = refused.take(&token);
        (all, r, token)
    }

    #[tokio::test]
    async fn well_framed_requests_pass_unchanged_whatever_the_pieces() {
        let input: &[u8] = b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello\r\n\r\nxy\
            PUT /b/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n\r\n\r\n\r\n3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n\
            GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n";
        for piece in [1, 2, 3, 7, 64, 4096] {
            let (got, r, _) = through(input, piece).await;
            assert_eq!(got, input, "pieces of {piece}");
            assert!(r.is_none());
        }
    }

    #[tokio::test]
    async fn a_later_head_with_a_bad_content_length_is_replaced() {
        for bad in ["Content-Length: -5", "Content-Length: abc", "Content-Length: 10, 20"] {
            // Body bytes that look like a head are a body's, not a head.
            let first = b"PUT /b/k HTTP/1.1\r\nContent-Length: 37\r\n\r\nGET / HTTP/1.1\r\nContent-Length: x\r\n\r\n";
            let mut input = first.to_vec();
            input.extend_from_slice(format!("PUT /b/k HTTP/1.1\r\n{bad}\r\n\r\nrest of it").as_bytes());
            for piece in [1, 5, 4096] {
                let (got, r, token) = through(&input, piece).await;
                let r = r.unwrap_or_else(|| panic!("{bad:?} was not refused"));
                assert_eq!((r.status.as_u16(), r.code), (400, "BadRequest"));
                let stand_in = format!("GET {token} HTTP/1.1\r\nhost: refused\r\nconnection: close\r\n\r\n");
                assert_eq!(got, [&first[..], stand_in.as_bytes()].concat(), "{bad:?} in pieces of {piece}");
            }
        }
    }

    #[tokio::test]
    async fn what_cannot_be_followed_goes_to_hyper_untouched() {
        for input in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nanything\r\nContent-Length: x\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nGET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"PUT / HTTP/1.1\r\nContent-Length: 100\r\n\r\nshort",
        ] {
            let (got, r, _) = through(input, 3).await;
            assert_eq!(got, input);
            assert!(r.is_none());
        }
    }

    /// Random messages, well formed or not, in random pieces: what hyper reads is the
    /// input itself, or, when a head was refused, a prefix of it and the stand-in.
    #[tokio::test]
    async fn any_input_passes_unchanged_or_ends_in_the_stand_in() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(54);
        let parts: [&[u8]; 13] = [
            b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /b/k HTTP/1.1\nHost: x\n\n",
            b"PUT /b/k HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody",
            b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
            b"PUT /b/k HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"\r\n",
            b"\r\n\r\n",
            b"Content-Length: 9\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"ffffffff\r\n",
            b"0\r\n",
            b"xyz",
            b"\n",
        ];
        for case in 0..300 {
            let mut input = Vec::new();
            for _ in 0..rng.random_range(1..12) {
                input.extend_from_slice(parts[rng.random_range(0..parts.len())]);
            }
            let piece = rng.random_range(1..64);
            let (got, r, token) = through(&input, piece).await;
            if r.is_none() {
                assert_eq!(got, input, "case {case}");
            } else {
                let stand_in = format!("GET {token} HTTP/1.1\r\nhost: refused\r\nconnection: close\r\n\r\n");
                let kept = got.strip_suffix(stand_in.as_bytes()).unwrap_or_else(|| panic!("case {case}: {got:?}"));
                assert!(input.starts_with(kept), "case {case}");
            }
        }
    }

    #[test]
    fn the_stand_in_is_answered_once_and_only_at_its_own_path() {
        let refused = Refused::new();
        *refused.slot.lock() = check_head(b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n");
        let token = refused.token.to_string();
        assert_ne!(token, Refused::new().token.to_string());
        assert!(refused.take("/.locus-refused-0").is_none());
        assert!(refused.take(&token).is_some());
        assert!(refused.take(&token).is_none());
    }
}
