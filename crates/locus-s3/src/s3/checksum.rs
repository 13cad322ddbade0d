//! Checked uploads: the body of a PUT, part or copy streamed into Locus while its size,
//! `Content-MD5` and `x-amz-checksum-*` (CRC32, CRC32C, CRC64NVME, SHA1, SHA256; header
//! or trailer) are checked, before the write commits.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures::Stream;
use locus_client::PutOptions;
use locus_common::Error;
use locus_proto::pb;
use md5::{Digest as _, Md5};
use parking_lot::Mutex;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};

use super::{LocusS3, hex};
use crate::s3_error;

/// The `x-amz-checksum-*` values a PutObject or UploadPart input carries.
macro_rules! sent_checksums {
    ($i:expr) => {
        Checksum {
            checksum_crc32: $i.checksum_crc32,
            checksum_crc32c: $i.checksum_crc32c,
            checksum_crc64nvme: $i.checksum_crc64nvme,
            checksum_sha1: $i.checksum_sha1,
            checksum_sha256: $i.checksum_sha256,
            ..Default::default()
        }
    };
}
pub(super) use sent_checksums;

/// A PutObject or UploadPart output with `fields`, returning the checksums `sums` of
/// what was written.
macro_rules! with_checksums {
    ($t:ident { $($f:ident: $v:expr),* $(,)? }, $sums:expr) => {
        $t {
            $($f: $v,)*
            checksum_crc32: $sums.checksum_crc32,
            checksum_crc32c: $sums.checksum_crc32c,
            checksum_crc64nvme: $sums.checksum_crc64nvme,
            checksum_sha1: $sums.checksum_sha1,
            checksum_sha256: $sums.checksum_sha256,
            ..Default::default()
        }
    };
}
pub(super) use with_checksums;

/// Checksums a write was sent with, checked against the bytes before the write commits.
#[derive(Default)]
pub(super) struct Expected {
    md5: Option<Vec<u8>>,
    sums: Checksum,
    /// The checksum header a streaming upload sends as a trailer (`x-amz-trailer`).
    trailer: Option<String>,
}

impl Expected {
    pub(super) fn new(content_md5: Option<&str>, sums: Checksum, headers: &http::HeaderMap) -> S3Result<Expected> {
        let md5 = match content_md5 {
            Some(s) => Some(B64.decode(s).ok().filter(|d| d.len() == 16).ok_or_else(|| s3_error!(InvalidDigest))?),
            None => None,
        };
        let trailer = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()).map(|s| s.trim().to_ascii_lowercase());
        Ok(Expected { md5, sums, trailer })
    }

    fn hasher(&self) -> s3s::checksum::ChecksumHasher {
        let mut h = s3s::checksum::ChecksumHasher::default();
        let t = self.trailer.as_deref().unwrap_or("");
        let s = &self.sums;
        if s.checksum_crc32.is_some() || t == "x-amz-checksum-crc32" {
            h.crc32 = Some(Default::default());
        }
        if s.checksum_crc32c.is_some() || t == "x-amz-checksum-crc32c" {
            h.crc32c = Some(Default::default());
        }
        if s.checksum_crc64nvme.is_some() || t == "x-amz-checksum-crc64nvme" {
            h.crc64nvme = Some(Default::default());
        }
        if s.checksum_sha1.is_some() || t == "x-amz-checksum-sha1" {
            h.sha1 = Some(Default::default());
        }
        if s.checksum_sha256.is_some() || t == "x-amz-checksum-sha256" {
            h.sha256 = Some(Default::default());
        }
        h
    }
}

/// The request body as an `AsyncRead` source that hashes what passes and stops at the
/// size limit. `md5` is `None` when nothing needs the body's MD5.
struct Digesting {
    body: StreamingBlob,
    md5: Option<Md5>,
    sums: s3s::checksum::ChecksumHasher,
    len: u64,
    limit: u64,
    verdict: Arc<Mutex<Option<S3Error>>>,
}

impl Stream for Digesting {
    type Item = io::Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match Pin::new(&mut self.body).poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.len += b.len() as u64;
                if self.len > self.limit {
                    *self.verdict.lock() = Some(s3_error!(EntityTooLarge));
                    return Poll::Ready(Some(Err(io::Error::other("entity too large"))));
                }
                if let Some(m) = &mut self.md5 {
                    m.update(&b);
                }
                self.sums.update(&b);
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                // A bad chunk signature or a broken body: s3s says which.
                let err = match e.downcast::<S3Error>() {
                    Ok(s) => *s,
                    Err(e) => s3_error!(IncompleteBody, "{e}"),
                };
                *self.verdict.lock() = Some(err);
                Poll::Ready(Some(Err(io::Error::other("bad request body"))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What a checked upload produced.
pub(super) struct Written {
    pub(super) fi: pb::FileInfo,
    pub(super) md5: String,
    pub(super) sums: Checksum,
}

impl LocusS3 {
    /// Stream `body` into `path`, checking its size, Content-MD5 and `x-amz-checksum-*`
    /// (header or trailer) before the write commits. `meta` gets the MD5 as its ETag
    /// unless it carries one; the MD5 is computed only when the ETag or a Content-MD5
    /// check needs it (a completed multipart upload's ETag comes from its parts', so its
    /// copy into the object skips a pass over every byte).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn checked_put(
        &self,
        path: &str,
        body: StreamingBlob,
        expected: Expected,
        trailers: Option<s3s::TrailingHeaders>,
        opts: PutOptions,
        meta: pb::ObjectMeta,
    ) -> S3Result<Written> {
        let verdict = Arc::new(Mutex::new(None));
        let src = Digesting {
            body,
            md5: (meta.etag.is_empty() || expected.md5.is_some()).then(Md5::new),
            sums: expected.hasher(),
            len: 0,
            limit: self.cfg.max_object_size.as_u64(),
            verdict: verdict.clone(),
        };
        let mut reader = tokio_util::io::StreamReader::new(src);
        let result: Arc<Mutex<Option<(String, Checksum)>>> = Arc::new(Mutex::new(None));
        let res2 = result.clone();
        let v2 = verdict.clone();
        let seal = move |r: &mut tokio_util::io::StreamReader<Digesting, Bytes>| {
            let d = r.get_mut();
            let md5 = d.md5.take().map(|m| m.finalize());
            let sums = std::mem::take(&mut d.sums).finalize();
            let fail = |e: S3Error| {
                *v2.lock() = Some(e);
                Err(Error::invalid("checksum mismatch"))
            };
            if expected.md5.as_deref().is_some_and(|m| Some(m) != md5.as_deref()) {
                return fail(s3_error!(BadDigest, "the Content-MD5 you specified did not match what we received"));
            }
            let mut want = expected.sums.clone();
            if let (Some(name), Some(t)) = (&expected.trailer, trailers.as_ref()) {
                let v = t.read(|h| h.get(name.as_str()).and_then(|v| v.to_str().ok()).map(str::to_string)).flatten();
                match name.as_str() {
                    "x-amz-checksum-crc32" => want.checksum_crc32 = v,
                    "x-amz-checksum-crc32c" => want.checksum_crc32c = v,
                    "x-amz-checksum-crc64nvme" => want.checksum_crc64nvme = v,
                    "x-amz-checksum-sha1" => want.checksum_sha1 = v,
                    "x-amz-checksum-sha256" => want.checksum_sha256 = v,
                    _ => {}
                }
            }
            let pairs = [
                ("CRC32", &want.checksum_crc32, &sums.checksum_crc32),
                ("CRC32C", &want.checksum_crc32c, &sums.checksum_crc32c),
                ("CRC64NVME", &want.checksum_crc64nvme, &sums.checksum_crc64nvme),
                ("SHA1", &want.checksum_sha1, &sums.checksum_sha1),
                ("SHA256", &want.checksum_sha256, &sums.checksum_sha256),
            ];
            for (alg, w, got) in pairs {
                if let Some(w) = w
                    && Some(w) != got.as_ref()
                {
                    return fail(s3_error!(
                        BadDigest,
                        "the {alg} checksum you specified did not match what we received"
                    ));
                }
            }
            let mut meta = meta;
            let md5 = md5.map(|m| hex(&m)).unwrap_or_else(|| meta.etag.clone());
            if meta.etag.is_empty() {
                meta.etag = md5.clone();
            }
            *res2.lock() = Some((md5, sums));
            Ok(meta)
        };
        match self.client.put_with(path, &mut reader, &opts, seal).await {
            Ok(fi) => {
                let (md5, sums) = result.lock().take().unwrap_or_default();
                Ok(Written { fi, md5, sums })
            }
            Err(e) => match verdict.lock().take() {
                Some(s3) => Err(s3),
                None => Err(s3_error(e, S3ErrorCode::NoSuchKey)),
            },
        }
    }
}
