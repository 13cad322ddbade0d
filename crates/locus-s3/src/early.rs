//! Requests refused before `s3s` sees them, with the answer S3 gives: a head over the
//! gateway's limits (431, where hyper's own answer has no body), a presigned URL whose
//! lifetime is negative (403 "Request has expired", where `s3s` cannot parse it), an
//! empty `Content-MD5` (400 InvalidDigest) and a key that is not UTF-8 once decoded (400).
//! Each answer is S3's XML error; [`crate::answer::finish`] adds the request id.

use http::StatusCode;

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

fn refusal(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
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
    let raw: Vec<u8> = percent_decode(parts.uri.path().as_bytes());
    if std::str::from_utf8(&raw).is_err() {
        return Some(refusal(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "Couldn't parse the specified URI: the key is not valid UTF-8.",
        ));
    }
    None
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%'
            && i + 2 < s.len()
            && let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// The XML body of `r`.
pub(crate) fn body(r: &Refusal) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        r.code,
        r.message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
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
    fn percent_decoding_keeps_what_is_not_an_escape() {
        assert_eq!(percent_decode(b"a%20b%zz%4"), b"a b%zz%4");
    }
}
