//! One gateway connection: its first request head judged before hyper parses it (what
//! hyper would refuse without a body gets S3's XML, `early.rs`), then hyper's HTTP/1 with
//! the framing check of every later head (`framing.rs`), each request through `s3s`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use s3s::service::S3Service;
use tokio::net::TcpStream;

use crate::{answer, early, framing, limits};

/// What serving one connection needs.
pub(crate) struct Conn {
    pub(crate) service: S3Service,
    pub(crate) peer: SocketAddr,
    /// How long the first head may take (`gateway.header_read_timeout`), and each later one.
    pub(crate) head_timeout: Duration,
    /// How long a request body may send nothing (`gateway.body_idle_timeout`).
    pub(crate) idle: Duration,
}

impl Conn {
    /// Serves the connection until it closes (or the gateway's shutdown ends it).
    pub(crate) async fn serve(self, mut stream: TcpStream, watcher: Watcher) {
        let head = match tokio::time::timeout(self.head_timeout, early::first_head(&mut stream)).await {
            Ok(Ok(h)) if !h.is_empty() => h,
            _ => return,
        };
        if let Some(r) = early::check_head(&head) {
            tracing::debug!(peer = %self.peer, code = r.code, message = %r.message, "gateway request refused before parsing");
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                use tokio::io::AsyncWriteExt;
                stream.write_all(&early::raw_answer(&r)).await?;
                stream.shutdown().await
            })
            .await;
            return;
        }
        let refused = framing::Refused::new();
        let (service, stand_in, idle) = (self.service, refused.clone(), self.idle);
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            call(service.clone(), stand_in.clone(), idle, req)
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(early::PARSE_LIMIT.0)
            .max_header_size(early::PARSE_LIMIT.0)
            .max_headers(early::PARSE_LIMIT.1)
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.head_timeout)
            .serve_connection(TokioIo::new(framing::Framed::new(head, stream, refused)), svc);
        if let Err(e) = watcher.watch(conn).await {
            tracing::debug!(peer = %self.peer, error = %e, "gateway connection ended with an error");
        }
    }
}

/// One request: a head the framing check refused (its stand-in) or that `early::check`
/// refuses gets S3's XML at once; any other goes to `s3s`.
async fn call(
    service: S3Service,
    stand_in: framing::Refused,
    idle: Duration,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<s3s::Body>, s3s::HttpError> {
    // A request answered before its body was read (an error), or with an empty body,
    // never got its `100 Continue`: the client may not send the body, and botocore then
    // mistakes the connection's state (its next request waits out the read timeout).
    // Such a connection is not reused.
    let empty = http_body::Body::is_end_stream(req.body());
    let expects = req.headers().contains_key(http::header::EXPECT);
    let done = Arc::new(AtomicBool::new(false));
    let (mut parts, body) = req.into_parts();
    let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
    if let Some(r) = stand_in.take(&path).or_else(|| early::check(&parts)) {
        let mut res = http::Response::new(s3s::Body::from(bytes::Bytes::from(early::body(&r))));
        *res.status_mut() = r.status;
        res.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
        // The body (if any) is not read: the connection is not reused.
        res.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        return Ok(answer::finish(res, &method, &path));
    }
    allow_unknown_length(&mut parts);
    let body = s3s::Body::http_body_unsync(limits::IdleBody::new(body, done.clone(), idle));
    let res = service.call(http::Request::from_parts(parts, body)).await?;
    let mut res = answer::finish(res, &method, &path);
    if (expects && empty) || (!empty && !done.load(Ordering::Acquire)) {
        res.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    Ok(res)
}

/// Let an upload (PutObject, UploadPart) come with `Transfer-Encoding: chunked`, no
/// `Content-Length` and an unsigned payload (`x-amz-content-sha256: UNSIGNED-PAYLOAD`),
/// as streaming clients send a body of unknown size: `s3s` refuses such a body
/// (MissingContentLength) unless told a length, so it is told `0`. The length only
/// feeds the early size check (`EntityTooLarge` before any byte is read); the bytes are
/// counted, checked against the limit and hashed as they stream. (A signed payload hash
/// needs the length to check it: such a request is still refused.)
fn allow_unknown_length(parts: &mut http::request::Parts) {
    let h = &parts.headers;
    let chunked = h
        .get(http::header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let unsigned = h.get("x-amz-content-sha256").is_some_and(|v| v.as_bytes() == b"UNSIGNED-PAYLOAD");
    let upload = parts.method == http::Method::PUT
        && parts.uri.query().is_none_or(|q| q.is_empty() || q.contains("partNumber=") || q.starts_with("x-id="))
        && !h.contains_key("x-amz-copy-source");
    if chunked && unsigned && upload && !h.contains_key(http::header::CONTENT_LENGTH) {
        parts.headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("0"));
    }
}
