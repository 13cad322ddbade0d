//! What every answer gets on its way out, whoever made it (an operation, or `s3s`
//! refusing a request before any operation ran): a request id in `x-amz-request-id`
//! (and `x-amz-id-2`); for a HEAD of a range or a part, 206 as its GET; for an error, the same id as the body's `<RequestId>` and a
//! `<Message>` (S3's wording when the error came without one), and one log line: debug
//! for a client's mistake (4xx), warn for the gateway's failure (5xx).

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode};

/// A request id as S3 makes them: 16 upper-case hex digits.
pub(crate) fn request_id() -> String {
    format!("{:016X}", rand::random::<u64>())
}

/// Stamp `res` with a new request id; complete and log it if it is an error.
pub(crate) fn finish(mut res: Response<s3s::Body>, method: &Method, path: &str) -> Response<s3s::Body> {
    let id = request_id();
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-amz-request-id", v.clone());
        res.headers_mut().insert("x-amz-id-2", v);
    }
    let status = res.status();
    if status == StatusCode::OK && method == Method::HEAD && res.headers().contains_key(http::header::CONTENT_RANGE) {
        // A HEAD of a range or a part answers as its GET would (`s3s` answers 200).
        *res.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let (code, message) = match res.body().bytes() {
        Some(b) if !b.is_empty() => {
            let (body, code, message) = complete(&b, &id, status);
            let len = body.len();
            *res.body_mut() = s3s::Body::from(body);
            if res.headers().contains_key(http::header::CONTENT_LENGTH) {
                res.headers_mut().insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
            }
            (code, message)
        }
        // A HEAD (no body): only the status tells.
        _ => (String::new(), String::new()),
    };
    if status.is_server_error() {
        tracing::warn!(request_id = %id, %method, path, status = status.as_u16(), code, message, "gateway request failed");
    } else {
        tracing::debug!(request_id = %id, %method, path, status = status.as_u16(), code, message, "gateway request refused");
    }
    res
}

/// An error body with `<Message>` (S3's wording for the code when it had none) and
/// `<RequestId>`; its code and message.
fn complete(body: &[u8], id: &str, status: StatusCode) -> (Bytes, String, String) {
    let Ok(text) = std::str::from_utf8(body) else {
        return (Bytes::copy_from_slice(body), String::new(), String::new());
    };
    let code = between(text, "<Code>", "</Code>").unwrap_or_default().to_string();
    let mut out = text.to_string();
    let message = match between(text, "<Message>", "</Message>") {
        Some(m) => m.to_string(),
        None => {
            let m = default_message(&code)
                .map(str::to_string)
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("Error").to_string());
            if let Some(at) = out.find("</Code>") {
                out.insert_str(at + "</Code>".len(), &format!("<Message>{}</Message>", escape(&m)));
            }
            m
        }
    };
    if !out.contains("<RequestId>")
        && let Some(at) = out.rfind("</Error>")
    {
        out.insert_str(at, &format!("<RequestId>{id}</RequestId><HostId>{id}</HostId>"));
    }
    (Bytes::from(out), code, unescape(&message))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let a = s.find(open)? + open.len();
    let b = s[a..].find(close)? + a;
    Some(&s[a..b])
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// S3's message for an error code, for errors raised without one.
fn default_message(code: &str) -> Option<&'static str> {
    Some(match code {
        "AccessDenied" => "Access Denied",
        "BadDigest" => "The Content-MD5 you specified did not match what we received.",
        "BucketAlreadyExists" => "The requested bucket name is not available.",
        "BucketAlreadyOwnedByYou" => {
            "Your previous request to create the named bucket succeeded and you already own it."
        }
        "BucketNotEmpty" => "The bucket you tried to delete is not empty",
        "EntityTooLarge" => "Your proposed upload exceeds the maximum allowed size",
        "EntityTooSmall" => "Your proposed upload is smaller than the minimum allowed object size.",
        "IncompleteBody" => "You did not provide the number of bytes specified by the Content-Length HTTP header",
        "InternalError" => "We encountered an internal error. Please try again.",
        "InvalidAccessKeyId" => "The AWS Access Key Id you provided does not exist in our records.",
        "InvalidArgument" => "Invalid Argument",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "InvalidDigest" => "The Content-MD5 you specified is not valid.",
        "InvalidPart" => {
            "One or more of the specified parts could not be found. The part may not have been uploaded, \
             or the specified entity tag may not match the part's entity tag."
        }
        "InvalidPartOrder" => {
            "The list of parts was not in ascending order. The parts list must be specified in order by part number."
        }
        "InvalidRange" => "The requested range is not satisfiable",
        "InvalidRequest" => "Invalid Request",
        "InvalidTag" => "The tag provided was not a valid tag.",
        "InvalidURI" => "Couldn't parse the specified URI.",
        "KeyTooLongError" => "Your key is too long",
        "MalformedXML" => "The XML you provided was not well-formed or did not validate against our published schema.",
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "NoSuchBucket" => "The specified bucket does not exist",
        "NoSuchKey" => "The specified key does not exist.",
        "NoSuchTagSet" => "The TagSet does not exist",
        "NoSuchUpload" => {
            "The specified upload does not exist. The upload ID may be invalid, or the upload may have been \
             aborted or completed."
        }
        "NoSuchVersion" => "The specified version does not exist.",
        "NotImplemented" => "A header you provided implies functionality that is not implemented",
        "PreconditionFailed" => "At least one of the pre-conditions you specified did not hold",
        "RequestTimeTooSkewed" => "The difference between the request time and the current time is too large.",
        "ServiceUnavailable" => "Please reduce your request rate.",
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. \
             Check your key and signing method."
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_get_a_message_and_the_request_id() {
        let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchKey</Code></Error>";
        let (out, code, message) = complete(body, "ABC", StatusCode::NOT_FOUND);
        let out = std::str::from_utf8(&out).unwrap();
        assert_eq!(code, "NoSuchKey");
        assert_eq!(message, "The specified key does not exist.");
        assert!(out.contains(
            "<Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><RequestId>ABC</RequestId>"
        ));
        // A message of its own stays; an unknown code gets the status's reason.
        let body = b"<Error><Code>Odd</Code><Message>a &amp; b</Message></Error>";
        let (out, _, message) = complete(body, "X", StatusCode::BAD_REQUEST);
        assert_eq!(message, "a & b");
        assert!(std::str::from_utf8(&out).unwrap().contains("<Message>a &amp; b</Message><RequestId>X"));
        let (out, _, message) = complete(b"<Error><Code>Odd</Code></Error>", "X", StatusCode::BAD_REQUEST);
        assert_eq!(message, "Bad Request");
        assert!(std::str::from_utf8(&out).unwrap().contains("<Message>Bad Request</Message>"));
    }
}
