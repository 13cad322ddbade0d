//! Requests refused before `s3s` sees them, with the answer S3 gives: a head over the
//! gateway's limits (431, where hyper's own answer has no body), a presigned URL whose
//! lifetime is negative (403 "Request has expired", where `s3s` cannot parse it), an
//! empty `Content-MD5` (400 InvalidDigest) and a key that is not UTF-8 once decoded (400).
//! Each answer is S3's XML error; [`crate::answer::finish`] adds the request id.
//!
//! What hyper itself refuses without a body (a malformed `Content-Length`, a request
//! line past the http crate's URI limit) is judged by [`check_head`] before hyper parses
//! it: a connection's first head here ([`first_head`], read before hyper takes the
//! connection), every later one in [`crate::framing`].

use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request head (request line and headers) the gateway takes; larger ones get
/// 431 in S3's XML. hyper parses heads up to [`PARSE_LIMIT`] so that this check, not
/// hyper's bare 431, answers them.
pub(crate) const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most headers a request may carry.
pub(crate) const MAX_HEADERS: usize = 100;
/// What hyper parses before it refuses on its own (bytes, headers).
pub(crate) const PARSE_LIMIT: (usize, usize) = (192 << 10, 4096);

/// Why a request is refused before any operation runs: status, S3 code, message.
#[derive(Debug, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

pub(crate) fn refusal(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { status, code, message: message.into() }
}

/// The refusal `parts` gets before `s3s`, if any.
pub(crate) fn check(parts: &http::request::Parts) -> Option<Refusal> {
    let head: usize = parts.method.as_str().len()
        + parts.uri.path_and_query().map_or(0, |p| p.as_str().len())
        + parts.headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>();
    if head > MAX_HEAD_BYTES || parts.headers.len() > MAX_HEADERS {
        return Some(refusal(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "RequestHeaderSectionTooLarge",
            format!(
                "Your request header section exceeds the maximum allowed size ({MAX_HEAD_BYTES} bytes, \
                 {MAX_HEADERS} headers)."
            ),
        ));
    }
    let query = parts.uri.query().unwrap_or_default();
    let expires = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k.eq_ignore_ascii_case("X-Amz-Expires"));
    if let Some((_, v)) = expires
        && v.trim().starts_with('-')
        && v.trim()[1..].parse::<u64>().is_ok()
    {
        return Some(refusal(StatusCode::FORBIDDEN, "AccessDenied", "Request has expired"));
    }
    if parts.headers.get("content-md5").is_some_and(|v| v.as_bytes().iter().all(u8::is_ascii_whitespace)) {
        return Some(refusal(StatusCode::BAD_REQUEST, "InvalidDigest", "The Content-MD5 you specified is not valid."));
    }
    if let Some(r) = sigv4_dates(parts, query) {
        return Some(r);
    }
    if percent_encoding::percent_decode_str(parts.uri.path()).decode_utf8().is_err() {
        return Some(refusal(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "Couldn't parse the specified URI: the key is not valid UTF-8.",
        ));
    }
    None
}

/// SigV4's dates as AWS requires them: `x-amz-date` (header or query) `yyyyMMddTHHmmssZ`,
/// a credential scope's date `yyyyMMdd`. Checked before `s3s` parses them: its digit
/// parser subtracts before it checks, so a byte below `'0'` in a digit's place panics
/// where overflow is checked (debug builds; found by the `gateway` fuzz target).
fn sigv4_dates(parts: &http::request::Parts, query: &str) -> Option<Refusal> {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let amz_date = |v: &[u8]| v.len() == 16 && digits(&v[..8]) && v[8] == b'T' && digits(&v[9..15]) && v[15] == b'Z';
    let scope_date = |cred: &str| cred.split('/').nth(1).is_none_or(|d| d.len() == 8 && digits(d.as_bytes()));
    if parts.headers.get("x-amz-date").is_some_and(|v| !amz_date(v.as_bytes())) {
        let m = "AWS authentication requires a valid Date or x-amz-date header (yyyyMMddTHHmmssZ).";
        return Some(refusal(StatusCode::FORBIDDEN, "AccessDenied", m));
    }
    let auth = parts.headers.get(http::header::AUTHORIZATION).map(|v| v.to_str().unwrap_or_default());
    if let Some(a) = auth.filter(|a| a.starts_with("AWS4-HMAC-SHA256"))
        && let Some((_, rest)) = a.split_once("Credential=")
        && !scope_date(rest.split([',', ' ']).next().unwrap_or_default())
    {
        let m = "The authorization header is malformed; the Credential's date must be yyyyMMdd.";
        return Some(refusal(StatusCode::BAD_REQUEST, "AuthorizationHeaderMalformed", m));
    }
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let bad = (k.eq_ignore_ascii_case("X-Amz-Date") && !amz_date(v.as_bytes()))
            || (k.eq_ignore_ascii_case("X-Amz-Credential") && !scope_date(&v));
        if bad {
            let m = format!(
                "Error parsing the {k} parameter: X-Amz-Date is yyyyMMddTHHmmssZ, a credential's date yyyyMMdd."
            );
            return Some(refusal(StatusCode::BAD_REQUEST, "AuthorizationQueryParametersError", m));
        }
    }
    None
}

/// Read a new connection's first request head (and whatever follows it in the same
/// reads): until the blank line that ends it, [`PARSE_LIMIT`] bytes, or the end of the
/// stream.
pub(crate) async fn first_head<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if crate::framing::head_len(&buf).is_some() || buf.len() >= PARSE_LIMIT.0 {
            return Ok(buf);
        }
    }
}

/// The refusal a request head gets before hyper parses it, if any: a request line too
/// long for a URI, a head hyper's parser refuses, or a `Content-Length` that is not one
/// non-negative number.
pub(crate) fn check_head(head: &[u8]) -> Option<Refusal> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let mut lines = head[..end].split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = lines.next()?;
    if line.len() > MAX_HEAD_BYTES {
        return Some(refusal(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "RequestHeaderSectionTooLarge",
            format!("Your request header section exceeds the maximum allowed size ({MAX_HEAD_BYTES} bytes)."),
        ));
    }
    // The parser hyper uses: a head it cannot parse gets S3's XML here, not hyper's bare
    // 400. More headers than fit are left to the service's limit (431 in XML).
    let mut headers = [httparse::EMPTY_HEADER; 128];
    match httparse::Request::new(&mut headers).parse(&head[..end + 4]) {
        Ok(_) | Err(httparse::Error::TooManyHeaders) => {}
        Err(e) => {
            return Some(refusal(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("An error occurred when parsing the HTTP request: {e}."),
            ));
        }
    }
    let mut length: Option<&[u8]> = None;
    for l in lines {
        let Some(colon) = l.iter().position(|b| *b == b':') else { continue };
        if !l[..colon].eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        for v in l[colon + 1..].split(|b| *b == b',').map(|v| v.trim_ascii()) {
            let number = !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit);
            if !number || length.is_some_and(|seen| seen != v) {
                return Some(refusal(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "An error occurred when parsing the HTTP request: Content-Length must be one non-negative number.",
                ));
            }
            length = Some(v);
        }
    }
    None
}

/// The whole HTTP answer of `r` written straight to a connection hyper never took
/// (the request id as [`crate::answer::finish`] makes them).
pub(crate) fn raw_answer(r: &Refusal) -> Vec<u8> {
    let id = crate::answer::request_id();
    let body = body(r).replace("</Error>", &format!("<RequestId>{id}</RequestId><HostId>{id}</HostId></Error>"));
    let reason = r.status.canonical_reason().unwrap_or("Error");
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nx-amz-request-id: {id}\r\n\
         x-amz-id-2: {id}\r\nConnection: close\r\n\r\n",
        r.status.as_u16(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// The XML body of `r`.
pub(crate) fn body(r: &Refusal) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        r.code,
        crate::answer::escape(&r.message)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn refusals_follow_s3() {
        assert_eq!(check(&parts("/b/k", &[])), None);
        assert_eq!(check(&parts("/b/%C3%BC", &[])), None);
        assert_eq!(check(&parts("/b/k?X-Amz-Expires=60", &[])), None);
        let r = check(&parts("/b/k?X-Amz-Expires=-5&X-Amz-Signature=x", &[])).unwrap();
        assert_eq!((r.status.as_u16(), r.code, r.message.as_str()), (403, "AccessDenied", "Request has expired"));
        assert_eq!(check(&parts("/b/k", &[("content-md5", "")])).unwrap().code, "InvalidDigest");
        assert_eq!(check(&parts("/b/k", &[("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==")])), None);
        assert_eq!(check(&parts("/b/%FF%FE", &[])).unwrap().code, "InvalidURI");
        let big = "a".repeat(70 << 10);
        assert_eq!(check(&parts("/b/k", &[("x-big", &big)])).unwrap().status.as_u16(), 431);
        // A long request line counts too (the http crate takes URIs of up to 64 KiB).
        let line = format!("/b/{}", "k".repeat(60 << 10));
        assert_eq!(check(&parts(&line, &[("x-more", &"m".repeat(8 << 10))])).unwrap().status.as_u16(), 431);
        let many: Vec<(String, String)> = (0..3000).map(|i| (format!("x-h{i}"), "v".to_string())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(check(&parts("/b/k", &many)).unwrap().code, "RequestHeaderSectionTooLarge");
        let b = body(&check(&parts("/b/k", &[("content-md5", "")])).unwrap());
        assert!(b.contains("<Code>InvalidDigest</Code><Message>"), "{b}");
    }

    #[test]
    fn sigv4_dates_are_checked_before_s3s_parses_them() {
        let auth = |date: &str| {
            format!("AWS4-HMAC-SHA256 Credential=k/{date}/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
        };
        let ok = [("x-amz-date", "20261206T000000Z"), ("authorization", &*auth("20261206"))];
        assert_eq!(check(&parts("/b/k", &ok)), None);
        // The fuzz target's input: a byte below '0' where a digit goes.
        let r = check(&parts("/b/k", &[("authorization", &*auth("2-east-1"))])).unwrap();
        assert_eq!((r.status.as_u16(), r.code), (400, "AuthorizationHeaderMalformed"));
        let r = check(&parts("/b/k", &[("x-amz-date", "2026120!T000000Z")])).unwrap();
        assert_eq!((r.status.as_u16(), r.code), (403, "AccessDenied"));
        for q in ["X-Amz-Date=2026-12-06", "X-Amz-Credential=k%2F2026%2F12%2Fus-east-1%2Fs3%2Faws4_request"] {
            assert_eq!(
                check(&parts(&format!("/b/k?{q}"), &[])).unwrap().code,
                "AuthorizationQueryParametersError",
                "{q}"
            );
        }
        let q = "/b/k?X-Amz-Date=20261206T000000Z&X-Amz-Credential=k%2F20261206%2Fus-east-1%2Fs3%2Faws4_request";
        assert_eq!(check(&parts(q, &[])), None);
        // Other schemes are s3s's to judge.
        assert_eq!(check(&parts("/b/k", &[("authorization", "AWS k:sig")])), None);
    }

    #[test]
    fn first_heads_with_a_bad_content_length_are_refused() {
        let head = |cl: &str| format!("PUT /b/k HTTP/1.1\r\nHost: x\r\n{cl}\r\n\r\nbody").into_bytes();
        for bad in [
            "Content-Length: -5",
            "content-length: abc",
            "Content-Length: 10, 20",
            "Content-Length:",
            "Content-Length: 1\r\nContent-Length: 2",
        ] {
            let r = check_head(&head(bad)).unwrap_or_else(|| panic!("{bad:?} passed"));
            assert_eq!((r.status.as_u16(), r.code), (400, "BadRequest"), "{bad:?}");
        }
        for bad in ["Bad Name: 1", "X-Ctl: a\x01b", ": empty-name"] {
            let r = check_head(&head(bad)).unwrap_or_else(|| panic!("{bad:?} passed"));
            assert_eq!((r.status.as_u16(), r.code), (400, "BadRequest"), "{bad:?}");
        }
        for line in ["GET / HTTP/9.9", "G(T / HTTP/1.1", "GET  HTTP/1.1"] {
            assert!(check_head(format!("{line}\r\nHost: x\r\n\r\n").as_bytes()).is_some(), "{line:?}");
        }
        for good in ["Content-Length: 4", "Content-Length: 4, 4", "X-Other: -5"] {
            assert_eq!(check_head(&head(good)), None, "{good:?}");
        }
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "k".repeat(100 << 10));
        assert_eq!(check_head(long.as_bytes()).unwrap().status.as_u16(), 431);
        assert_eq!(check_head(b"GET / HTTP/1.1\r\nHost: x"), None, "an unfinished head is hyper's");
        let a = String::from_utf8(raw_answer(&check_head(&head("Content-Length: x")).unwrap())).unwrap();
        assert!(a.starts_with("HTTP/1.1 400 Bad Request\r\n") && a.contains("<Code>BadRequest</Code><Message>"), "{a}");
        let len: usize = a.split("Content-Length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
        assert_eq!(len, a.split("\r\n\r\n").nth(1).unwrap().len());
    }
}
