//! aws-chunked bodies past a valid SigV4 signature of the request's head: the gateway's
//! decoder (`s3s`'s) reads them as it reads a DeleteObjects body, before any call to the
//! master. The first byte picks the payload kind (signed chunks, or unsigned chunks with
//! a trailer) and the decoded length the head announces; the rest is the body. Any body
//! gets an answer or a closed connection, never a panic or a hang. The head is signed with
//! reqsign (OpenDAL's signer) and the gateway's default key pair.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reqsign_aws_v4::{Credential, RequestSigner};
use reqsign_core::{Context, SignRequest};

#[path = "common/gateway.rs"]
mod common;
use common::{exchange, gateway};

/// The signed head of a DeleteObjects request whose body is `len` bytes of aws-chunked.
fn head(addr: &str, signed_chunks: bool, decoded: usize, len: usize) -> Vec<u8> {
    let sha = if signed_chunks { "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" } else { "STREAMING-UNSIGNED-PAYLOAD-TRAILER" };
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/fuzz-bucket?delete"))
        .header("host", addr)
        .header("x-amz-content-sha256", sha)
        .header("content-encoding", "aws-chunked")
        .header("x-amz-decoded-content-length", decoded.to_string())
        .header("content-length", len.to_string());
    if !signed_chunks {
        b = b.header("x-amz-trailer", "x-amz-checksum-crc32");
    }
    let (mut parts, ()) = b.body(()).unwrap().into_parts();
    let cred = Credential {
        access_key_id: "locusadmin".into(),
        secret_access_key: "locusadmin".into(),
        session_token: None,
        expires_in: None,
    };
    let signer = RequestSigner::new("s3", "us-east-1");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(signer.sign_request(&Context::new(), &mut parts, Some(&cred), None)).unwrap();
    let mut h = format!("POST {} HTTP/1.1\r\n", parts.uri.path_and_query().unwrap()).into_bytes();
    for (k, v) in &parts.headers {
        h.extend_from_slice(k.as_str().as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(v.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(b"\r\n");
    h
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else { return };
    let decoded = (mode >> 1) as usize;
    let mut req = head(gateway(), mode & 1 == 0, decoded, body.len());
    req.extend_from_slice(body);
    let out = exchange(&req);
    if std::env::var_os("LOCUS_FUZZ_SHOW").is_some() {
        eprintln!("{}", String::from_utf8_lossy(&out));
    }
});
