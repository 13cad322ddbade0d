//! The S3 operations, each mapped onto the Locus client.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use locus_client::{Client, PutOptions, ReadOptions};
use locus_common::config::{GatewayConfig, ReadType, WriteType};
use locus_common::path as lpath;
use locus_common::{Error, ErrorKind};
use locus_proto::pb;
use md5::{Digest as _, Md5};
use parking_lot::Mutex;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use crate::list::{self, Entry, ListRequest};
use crate::{READ_TYPE_HEADER, UPLOADS_DIR, WRITE_TYPE_HEADER, s3_error};

/// MD5 of nothing: the ETag of empty objects and directory markers.
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";
/// S3's smallest part (all but the last part of an upload).
const MIN_PART_SIZE: u64 = 5 << 20;
const MAX_PART_NUMBER: i32 = 10_000;
const UPLOAD_RECORD: &str = "upload.json";

pub(crate) struct LocusS3 {
    client: Arc<Client>,
    cfg: GatewayConfig,
}

impl LocusS3 {
    pub(crate) fn new(client: Arc<Client>, cfg: GatewayConfig) -> Self {
        LocusS3 { client, cfg }
    }
}

type R<T> = S3Result<S3Response<T>>;

fn ok<T>(t: T) -> R<T> {
    Ok(S3Response::new(t))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn timestamp(ms: i64) -> Timestamp {
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

fn etag(s: &str) -> ETag {
    ETag::Strong(s.to_string())
}

/// Whether an ETag is a plain MD5 (32 hex digits), not a multipart ETag (`md5-N`).
fn is_md5(etag: &str) -> bool {
    etag.len() == 32 && etag.bytes().all(|c| c.is_ascii_hexdigit())
}

/// The S3 ETag of a file: the MD5 recorded when it was written through Locus, else the
/// UFS's ETag (S3), else an MD5 of its fingerprint (size and mtime), which changes
/// whenever the file does.
fn etag_of(fi: &pb::FileInfo) -> String {
    if let Some(m) = fi.meta.as_ref().filter(|m| !m.etag.is_empty()) {
        return m.etag.clone();
    }
    if fi.is_dir || fi.length == 0 {
        return EMPTY_MD5.into();
    }
    match fi.fingerprint.split_once(':') {
        Some((_, e)) if !e.is_empty() && !e.starts_with('m') => e.to_string(),
        _ => hex(&Md5::digest(fi.fingerprint.as_bytes())),
    }
}

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

fn empty_body() -> StreamingBlob {
    StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, io::Error>>())
}

/// What marks a directory as an explicit `dir/` object.
fn marker_meta() -> pb::ObjectMeta {
    pb::ObjectMeta { etag: EMPTY_MD5.into(), ..Default::default() }
}

fn meta_of(fi: &pb::FileInfo) -> pb::ObjectMeta {
    fi.meta.clone().unwrap_or_default()
}

fn content_type_of(fi: &pb::FileInfo) -> String {
    match fi.meta.as_ref().map(|m| m.content_type.as_str()) {
        Some(t) if !t.is_empty() => t.to_string(),
        _ => "binary/octet-stream".into(),
    }
}

fn bucket_path(bucket: &str) -> String {
    format!("/{bucket}")
}

/// The Locus path of an object key (a trailing `/`, marking a directory, dropped).
/// Keys Locus cannot hold as a path (empty, `.` or `..` components, `//`, the internal
/// directories) are refused: no key ever reaches outside its bucket.
fn object_path(bucket: &str, key: &str) -> S3Result<String> {
    if key.len() > 1024 {
        return Err(s3_error!(KeyTooLongError));
    }
    let k = key.strip_suffix('/').unwrap_or(key);
    let bad = k.is_empty()
        || k.split('/').enumerate().any(|(i, c)| {
            c.is_empty()
                || c == "."
                || c == ".."
                || c == lpath::UFS_TEMP_DIR
                || (i == 0 && c == UPLOADS_DIR)
                || c.contains('\0')
        });
    if bad {
        return Err(s3_error!(
            InvalidArgument,
            "object key {key:?} is not supported: it has an empty, '.', '..' or reserved component"
        ));
    }
    Ok(format!("/{bucket}/{k}"))
}

/// The read type a request asked for with `x-locus-read-type`.
fn read_type(headers: &http::HeaderMap) -> S3Result<Option<ReadType>> {
    match headers.get(READ_TYPE_HEADER) {
        None => Ok(None),
        Some(v) => {
            v.to_str().ok().and_then(ReadType::parse).map(Some).ok_or_else(|| {
                s3_error!(InvalidArgument, "{READ_TYPE_HEADER} must be CACHE, CACHE_PROMOTE or NO_CACHE")
            })
        }
    }
}

/// The write type a request asked for with `x-locus-write-type`.
fn write_type(headers: &http::HeaderMap) -> S3Result<Option<WriteType>> {
    match headers.get(WRITE_TYPE_HEADER) {
        None => Ok(None),
        Some(v) => v.to_str().ok().and_then(WriteType::parse).map(Some).ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "{WRITE_TYPE_HEADER} must be MUST_CACHE, CACHE_THROUGH, THROUGH or ASYNC_THROUGH"
            )
        }),
    }
}

fn parse_tagging(h: Option<&str>) -> S3Result<HashMap<String, String>> {
    let tags: Vec<(String, String)> = match h {
        Some(q) => form_urlencoded::parse(q.as_bytes()).into_owned().collect(),
        None => Vec::new(),
    };
    check_tags(tags)
}

fn check_tags(tags: Vec<(String, String)>) -> S3Result<HashMap<String, String>> {
    if tags.len() > 10 {
        return Err(s3_error!(InvalidTag, "an object can have at most 10 tags"));
    }
    let mut m = HashMap::new();
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
            return Err(s3_error!(InvalidTag, "tag keys are 1-128 characters and values at most 256"));
        }
        if m.insert(k, v).is_some() {
            return Err(s3_error!(InvalidTag, "duplicate tag key"));
        }
    }
    Ok(m)
}

fn tag_set(tags: &HashMap<String, String>) -> TagSet {
    let mut v: Vec<Tag> = tags.iter().map(|(k, v)| Tag { key: Some(k.clone()), value: Some(v.clone()) }).collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

fn ufs_user_metadata(user: &HashMap<String, String>, tags: &HashMap<String, String>) -> HashMap<String, String> {
    locus_proto::ufs_user_metadata(&pb::ObjectMeta { user: user.clone(), tags: tags.clone(), ..Default::default() })
}

// ------------------------------------------------------------------ conditions

fn secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// RFC 7232 preconditions of GET and HEAD, in the order S3 applies them.
fn check_preconditions(
    fi: &pb::FileInfo,
    tag: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == tag,
    };
    let mtime = fi.mtime_ms / 1000;
    match if_match {
        Some(c) if !matches(c) => return Err(s3_error!(PreconditionFailed)),
        None if if_unmodified_since.is_some_and(|t| mtime > secs(t)) => {
            return Err(s3_error!(PreconditionFailed));
        }
        _ => {}
    }
    match if_none_match {
        Some(c) if matches(c) => return Err(s3_error!(NotModified)),
        None if if_modified_since.is_some_and(|t| mtime <= secs(t)) => return Err(s3_error!(NotModified)),
        _ => {}
    }
    Ok(())
}

// ------------------------------------------------------------------ checked uploads

/// Checksums a write was sent with, checked against the bytes before the write commits.
#[derive(Default)]
struct Expected {
    md5: Option<Vec<u8>>,
    sums: Checksum,
    /// The checksum header a streaming upload sends as a trailer (`x-amz-trailer`).
    trailer: Option<String>,
}

impl Expected {
    fn new(content_md5: Option<&str>, sums: Checksum, headers: &http::HeaderMap) -> S3Result<Expected> {
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
struct Written {
    fi: pb::FileInfo,
    md5: String,
    sums: Checksum,
}

impl LocusS3 {
    /// Stream `body` into `path`, checking its size, Content-MD5 and `x-amz-checksum-*`
    /// (header or trailer) before the write commits. `meta` gets the MD5 as its ETag
    /// unless it carries one; the MD5 is computed only when the ETag or a Content-MD5
    /// check needs it (a completed multipart upload's ETag comes from its parts', so its
    /// copy into the object skips a pass over every byte).
    #[allow(clippy::too_many_arguments)]
    async fn checked_put(
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
                if let Some(w) = w {
                    if Some(w) != got.as_ref() {
                        return fail(s3_error!(
                            BadDigest,
                            "the {alg} checksum you specified did not match what we received"
                        ));
                    }
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

    /// One page of a bucket listing as ListObjects V1 and V2 both answer it: the objects,
    /// the common prefixes, whether more follow, and the last key listed when they do.
    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: &str,
        max_keys: usize,
    ) -> S3Result<(Vec<Object>, Vec<CommonPrefix>, bool, Option<String>)> {
        let lr = ListRequest { bucket, prefix, delimiter, after, max_keys, skip_hidden: true };
        let (entries, truncated) =
            list::list(&self.client, &lr).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
        let last = truncated.then(|| entries.last().map(|e| e.key().to_string())).flatten();
        let (objects, prefixes) = split_entries(entries);
        Ok((objects, prefixes, truncated, last))
    }

    /// A bucket's status, or NoSuchBucket.
    async fn bucket(&self, bucket: &str) -> S3Result<pb::FileInfo> {
        match self.client.status(&bucket_path(bucket), false).await {
            Ok(fi) if fi.is_dir => Ok(fi),
            Ok(_) => Err(s3_error!(NoSuchBucket)),
            Err(e) => Err(s3_error(e, S3ErrorCode::NoSuchBucket)),
        }
    }

    /// An object's status (a directory only for a `dir/` key), or NoSuchKey/NoSuchBucket.
    async fn object(&self, bucket: &str, key: &str, with_blocks: bool) -> S3Result<pb::FileInfo> {
        let path = object_path(bucket, key)?;
        match self.client.status(&path, with_blocks).await {
            Ok(fi) if fi.is_dir == key.ends_with('/') => Ok(fi),
            Ok(_) => Err(s3_error!(NoSuchKey)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.bucket(bucket).await?;
                Err(s3_error!(NoSuchKey))
            }
            Err(e) => Err(s3_error(e, S3ErrorCode::NoSuchKey)),
        }
    }

    /// Stream a range of an object's bytes.
    fn stream(&self, fi: pb::FileInfo, start: u64, len: u64, opts: ReadOptions) -> StreamingBlob {
        StreamingBlob::wrap(self.client.read_stream(fi, start, len, opts))
    }

    async fn is_empty_dir(&self, path: &str) -> S3Result<bool> {
        let (page, _) =
            self.client.list_page(path, "", false, 1).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
        Ok(page.is_empty())
    }

    /// Delete one key as S3 does: a missing key is not an error. Directories left empty
    /// below the bucket go too, so they do not linger as prefixes.
    async fn delete_key(&self, bucket: &str, key: &str) -> S3Result<()> {
        let path = object_path(bucket, key)?;
        match self.client.status(&path, false).await {
            Ok(fi) if fi.is_dir => {
                if !key.ends_with('/') {
                    return Ok(());
                }
                if !self.is_empty_dir(&path).await? {
                    // The marker goes; the directory stays while it has objects.
                    if fi.meta.is_some() {
                        self.client
                            .set_object_meta(&path, pb::ObjectMeta::default(), false)
                            .await
                            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
                    }
                    return Ok(());
                }
            }
            Ok(_) if key.ends_with('/') => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.bucket(bucket).await?;
                return Ok(());
            }
            Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchKey)),
        }
        match self.client.delete(&path, false).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchKey)),
        }
        let top = bucket_path(bucket);
        let mut cur = path;
        while let Some((parent, _)) = lpath::split_parent(&cur) {
            if parent == top || parent == "/" || !self.is_empty_dir(parent).await.unwrap_or(false) {
                break;
            }
            if self.client.status(parent, false).await.map(|p| p.meta.is_some()).unwrap_or(true) {
                break; // an explicit `dir/` marker stays, as in S3
            }
            if self.client.delete(parent, false).await.is_err() {
                break; // a mount point, or it filled up again
            }
            cur = parent.to_string();
        }
        Ok(())
    }

    fn upload_dir(&self, bucket: &str, upload_id: &str) -> S3Result<String> {
        if upload_id.len() != 32 || !upload_id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(s3_error!(NoSuchUpload));
        }
        Ok(format!("/{bucket}/{UPLOADS_DIR}/{upload_id}"))
    }

    /// How the files of a multipart upload (its record and parts) are written: with the
    /// initial persist wait, so an upload completed or aborted in time never reaches the UFS.
    fn upload_file_options(&self) -> PutOptions {
        PutOptions { overwrite: true, persist_wait: Some(self.cfg.part_persist_wait), ..Default::default() }
    }

    async fn read_small(&self, path: &str) -> locus_common::Result<Vec<u8>> {
        let fi = self.client.status(path, true).await?;
        if fi.length > 1 << 20 {
            return Err(Error::invalid(format!("{path} is too large")));
        }
        let mut out = Vec::new();
        self.client
            .read_to(
                &fi,
                0,
                fi.length,
                ReadOptions { read_type: Some(ReadType::NO_CACHE), ..Default::default() },
                &mut out,
            )
            .await?;
        Ok(out)
    }

    /// The record of an upload in progress, checked against its key.
    async fn upload(&self, bucket: &str, key: &str, upload_id: &str) -> S3Result<(String, UploadRecord)> {
        let dir = self.upload_dir(bucket, upload_id)?;
        let raw = match self.read_small(&format!("{dir}/{UPLOAD_RECORD}")).await {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.bucket(bucket).await?;
                return Err(s3_error!(NoSuchUpload));
            }
            Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchUpload)),
        };
        let rec: UploadRecord = serde_json::from_slice(&raw).map_err(|_| s3_error!(NoSuchUpload))?;
        if rec.key != key {
            return Err(s3_error!(NoSuchUpload));
        }
        Ok((dir, rec))
    }

    /// The parts of an upload, in part-number order.
    async fn parts(&self, dir: &str) -> S3Result<Vec<(i32, pb::FileInfo)>> {
        let mut parts = Vec::new();
        self.client
            .list_each(dir, false, |e| {
                if let Ok(n) = e.name.parse::<i32>() {
                    if !e.is_dir {
                        parts.push((n, e.clone()));
                    }
                }
            })
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?;
        parts.sort_by_key(|p| p.0);
        Ok(parts)
    }

    /// Source object and byte range of a copy (`x-amz-copy-source`, its range and
    /// preconditions).
    async fn copy_source(
        &self,
        src: &CopySource,
        range: Option<&str>,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
    ) -> S3Result<(pb::FileInfo, u64, u64)> {
        let CopySource::Bucket { bucket, key, .. } = src else {
            return Err(s3_error!(NotImplemented, "copy from an access point"));
        };
        let fi = self.object(bucket, key, true).await?;
        let tag = etag_of(&fi);
        if if_match.is_some_and(|c| !matches!(c, ETagCondition::Any) && c.as_etag().map(ETag::value) != Some(&tag))
            || if_none_match
                .is_some_and(|c| matches!(c, ETagCondition::Any) || c.as_etag().map(ETag::value) == Some(&tag))
        {
            return Err(s3_error!(PreconditionFailed));
        }
        let (start, len) = match range {
            None => (0, fi.length),
            Some(r) => {
                let bad = || s3_error!(InvalidArgument, "x-amz-copy-source-range must be bytes=first-last");
                let (a, b) = r.strip_prefix("bytes=").and_then(|r| r.split_once('-')).ok_or_else(bad)?;
                let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b >= fi.length {
                    return Err(s3_error!(InvalidRange));
                }
                (a, b - a + 1)
            }
        };
        Ok((fi, start, len))
    }
}

/// An upload in progress, stored as `upload.json` in its directory.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct UploadRecord {
    key: String,
    content_type: String,
    user: HashMap<String, String>,
    tags: HashMap<String, String>,
    initiated_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn encode_token(key: &str) -> String {
    B64URL.encode(key)
}

fn decode_token(t: &str) -> S3Result<String> {
    B64URL
        .decode(t)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not valid"))
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn split_entries(entries: Vec<Entry>) -> (Vec<Object>, Vec<CommonPrefix>) {
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    for e in entries {
        match e {
            Entry::Object { key, fi } => objects.push(Object {
                e_tag: Some(etag(&etag_of(&fi))),
                key: Some(key),
                last_modified: Some(timestamp(fi.mtime_ms)),
                size: Some(if fi.is_dir { 0 } else { fi.length as i64 }),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                ..Default::default()
            }),
            Entry::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(p) }),
        }
    }
    (objects, prefixes)
}

#[async_trait::async_trait]
impl S3 for LocusS3 {
    // -------------------------------------------------------------- buckets

    async fn list_buckets(&self, _req: S3Request<ListBucketsInput>) -> R<ListBucketsOutput> {
        let mut buckets = Vec::new();
        self.client
            .list_each("/", false, |e| {
                if e.is_dir && s3s::path::check_bucket_name(&e.name) {
                    buckets.push(Bucket {
                        name: Some(e.name.clone()),
                        creation_date: Some(timestamp(e.mtime_ms)),
                        ..Default::default()
                    });
                }
            })
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
        ok(ListBucketsOutput { buckets: Some(buckets), ..Default::default() })
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> R<CreateBucketOutput> {
        let b = &req.input.bucket;
        if self.client.status(&bucket_path(b), false).await.is_ok() {
            return Err(s3_error!(BucketAlreadyOwnedByYou));
        }
        self.client.mkdir(&bucket_path(b), false).await.map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists => s3_error!(BucketAlreadyOwnedByYou),
            _ => s3_error(e, S3ErrorCode::NoSuchBucket),
        })?;
        ok(CreateBucketOutput { location: Some(format!("/{b}")), ..Default::default() })
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> R<HeadBucketOutput> {
        self.bucket(&req.input.bucket).await?;
        ok(HeadBucketOutput { bucket_region: Some(self.cfg.region.clone()), ..Default::default() })
    }

    async fn get_bucket_location(&self, req: S3Request<GetBucketLocationInput>) -> R<GetBucketLocationOutput> {
        self.bucket(&req.input.bucket).await?;
        // S3 reports us-east-1 as no constraint.
        let location_constraint =
            (self.cfg.region != "us-east-1").then(|| BucketLocationConstraint::from(self.cfg.region.clone()));
        ok(GetBucketLocationOutput { location_constraint })
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> R<DeleteBucketOutput> {
        let b = &req.input.bucket;
        self.bucket(b).await?;
        let lr = ListRequest { bucket: b, prefix: "", delimiter: Some("/"), after: "", max_keys: 1, skip_hidden: true };
        let (entries, _) = list::list(&self.client, &lr).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
        if !entries.is_empty() {
            return Err(s3_error!(BucketNotEmpty));
        }
        // Only abandoned uploads can be left: they go with the bucket.
        self.client.delete(&bucket_path(b), true).await.map_err(|e| match e.kind() {
            ErrorKind::InvalidArgument | ErrorKind::FailedPrecondition => {
                S3Error::with_message(S3ErrorCode::InvalidRequest, format!("cannot delete bucket {b}: {e}"))
            }
            _ => s3_error(e, S3ErrorCode::NoSuchBucket),
        })?;
        ok(DeleteBucketOutput {})
    }

    // -------------------------------------------------------------- listings

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> R<ListObjectsV2Output> {
        let i = req.input;
        self.bucket(&i.bucket).await?;
        let max = max_keys(i.max_keys)?;
        let after = match &i.continuation_token {
            Some(t) => decode_token(t)?,
            None => i.start_after.clone().unwrap_or_default(),
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
        let (objects, prefixes, truncated, last) =
            self.list_page(&i.bucket, &prefix, delimiter.as_deref(), &after, max).await?;
        let next = last.map(|k| encode_token(&k));
        ok(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(prefix),
            delimiter,
            max_keys: Some(max as i32),
            key_count: Some((objects.len() + prefixes.len()) as i32),
            is_truncated: Some(truncated),
            continuation_token: i.continuation_token,
            next_continuation_token: next,
            start_after: i.start_after,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            ..Default::default()
        })
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> R<ListObjectsOutput> {
        let i = req.input;
        self.bucket(&i.bucket).await?;
        let max = max_keys(i.max_keys)?;
        let after = i.marker.clone().unwrap_or_default();
        let prefix = i.prefix.clone().unwrap_or_default();
        let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
        let (objects, prefixes, truncated, next) =
            self.list_page(&i.bucket, &prefix, delimiter.as_deref(), &after, max).await?;
        ok(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(prefix),
            delimiter,
            marker: i.marker,
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            next_marker: next,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            ..Default::default()
        })
    }

    // -------------------------------------------------------------- objects

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> R<HeadObjectOutput> {
        let i = req.input;
        let fi = self.object(&i.bucket, &i.key, false).await?;
        let tag = etag_of(&fi);
        check_preconditions(
            &fi,
            &tag,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
        )?;
        let meta = meta_of(&fi);
        let len = if fi.is_dir { 0 } else { fi.length };
        let (content_length, content_range) = match i.range {
            Some(r) => {
                let rg = r.check(len).map_err(|_| s3_error!(InvalidRange))?;
                (rg.end - rg.start, Some(format!("bytes {}-{}/{len}", rg.start, rg.end - 1)))
            }
            None => (len, None),
        };
        ok(HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(content_length as i64),
            content_range,
            content_type: Some(content_type_of(&fi)),
            e_tag: Some(etag(&tag)),
            last_modified: Some(timestamp(fi.mtime_ms)),
            metadata: (!meta.user.is_empty()).then_some(meta.user),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        })
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> R<GetObjectOutput> {
        let read_type = read_type(&req.headers)?;
        let i = req.input;
        if i.part_number.is_some() {
            return Err(s3_error!(NotImplemented, "GET by part number"));
        }
        let fi = self.object(&i.bucket, &i.key, true).await?;
        let tag = etag_of(&fi);
        check_preconditions(
            &fi,
            &tag,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
        )?;
        let len = if fi.is_dir { 0 } else { fi.length };
        let (start, n, content_range) = match i.range {
            Some(r) => {
                let rg = r.check(len).map_err(|_| s3_error!(InvalidRange))?;
                (rg.start, rg.end - rg.start, Some(format!("bytes {}-{}/{len}", rg.start, rg.end - 1)))
            }
            None => (0, len, None),
        };
        let meta = meta_of(&fi);
        let tag_count = (!meta.tags.is_empty()).then_some(meta.tags.len() as i32);
        let out = GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(n as i64),
            content_range,
            content_type: Some(content_type_of(&fi)),
            e_tag: Some(etag(&tag)),
            last_modified: Some(timestamp(fi.mtime_ms)),
            metadata: (!meta.user.is_empty()).then_some(meta.user),
            tag_count,
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            body: Some(if n == 0 {
                empty_body()
            } else {
                self.stream(fi, start, n, ReadOptions { read_type, ..Default::default() })
            }),
            ..Default::default()
        };
        ok(out)
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> R<PutObjectOutput> {
        let headers = req.headers;
        let trailers = req.trailing_headers;
        let i = req.input;
        self.bucket(&i.bucket).await?;
        let path = object_path(&i.bucket, &i.key)?;
        if i.content_length.is_some_and(|n| n as u64 > self.cfg.max_object_size.as_u64()) {
            return Err(s3_error!(EntityTooLarge));
        }
        if i.key.ends_with('/') {
            // (Streaming-signed markers declare a body length for their empty chunk.)
            if let Some(mut body) = i.body {
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "{e}"))?;
                    if !chunk.is_empty() {
                        return Err(s3_error!(
                            InvalidArgument,
                            "a key ending in '/' names a directory and takes no data"
                        ));
                    }
                }
            }
            // A directory marker: the directory, flagged so that it lists as `key/` even
            // when it has children and outlives them.
            self.client.mkdir(&path, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
            self.client
                .set_object_meta(&path, marker_meta(), false)
                .await
                .map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
            return ok(PutObjectOutput { e_tag: Some(etag(EMPTY_MD5)), ..Default::default() });
        }
        if matches!(i.if_none_match, Some(ETagCondition::Any)) && self.client.status(&path, false).await.is_ok() {
            return Err(s3_error!(PreconditionFailed));
        }
        let tags = parse_tagging(i.tagging.as_deref())?;
        let user = i.metadata.unwrap_or_default();
        let content_type = i.content_type.unwrap_or_default();
        let sums = sent_checksums!(i);
        let expected = Expected::new(i.content_md5.as_deref(), sums, &headers)?;
        let body = i.body.unwrap_or_else(empty_body);
        let opts = PutOptions {
            overwrite: true,
            content_type: content_type.clone(),
            user_metadata: ufs_user_metadata(&user, &tags),
            write_type: write_type(&headers)?,
            ..Default::default()
        };
        let meta = pb::ObjectMeta { content_type, etag: String::new(), user, tags };
        let w = self.checked_put(&path, body, expected, trailers, opts, meta).await?;
        ok(PutObjectOutput {
            e_tag: Some(etag(&w.md5)),
            size: Some(w.fi.length as i64),
            checksum_crc32: w.sums.checksum_crc32,
            checksum_crc32c: w.sums.checksum_crc32c,
            checksum_crc64nvme: w.sums.checksum_crc64nvme,
            checksum_sha1: w.sums.checksum_sha1,
            checksum_sha256: w.sums.checksum_sha256,
            ..Default::default()
        })
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> R<CopyObjectOutput> {
        let wt = write_type(&req.headers)?;
        let i = req.input;
        self.bucket(&i.bucket).await?;
        let path = object_path(&i.bucket, &i.key)?;
        let (src, start, len) = self
            .copy_source(&i.copy_source, None, i.copy_source_if_match.as_ref(), i.copy_source_if_none_match.as_ref())
            .await?;
        if src.is_dir {
            return Err(s3_error!(InvalidRequest, "cannot copy a directory"));
        }
        let replace_meta = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let replace_tags = i.tagging_directive.as_ref().is_some_and(|d| d.as_str() == TaggingDirective::REPLACE);
        if src.path == path && !replace_meta && !replace_tags {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata."
            ));
        }
        let old = meta_of(&src);
        let (content_type, user) = if replace_meta {
            (i.content_type.unwrap_or_default(), i.metadata.unwrap_or_default())
        } else {
            (old.content_type.clone(), old.user.clone())
        };
        let tags = if replace_tags { parse_tagging(i.tagging.as_deref())? } else { old.tags.clone() };
        let body = self.stream(src, start, len, ReadOptions::default());
        let opts = PutOptions {
            overwrite: true,
            content_type: content_type.clone(),
            user_metadata: ufs_user_metadata(&user, &tags),
            write_type: wt,
            ..Default::default()
        };
        // Same bytes, same MD5: a source whose ETag is the MD5 Locus recorded when it was
        // written (not a multipart ETag) gives it to the copy, which then skips an MD5 pass.
        let src_md5 = if is_md5(&old.etag) { old.etag.clone() } else { String::new() };
        let meta = pb::ObjectMeta { content_type, etag: src_md5, user, tags };
        let w = self.checked_put(&path, body, Expected::default(), None, opts, meta).await?;
        ok(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&w.md5)),
                last_modified: Some(timestamp(w.fi.mtime_ms)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> R<DeleteObjectOutput> {
        self.delete_key(&req.input.bucket, &req.input.key).await?;
        ok(DeleteObjectOutput::default())
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> R<DeleteObjectsOutput> {
        let i = req.input;
        self.bucket(&i.bucket).await?;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per request"));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for o in i.delete.objects {
            match self.delete_key(&i.bucket, &o.key).await {
                Ok(()) => {
                    if !quiet {
                        deleted.push(DeletedObject { key: Some(o.key), ..Default::default() });
                    }
                }
                Err(e) => errors.push(s3s::dto::Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    ..Default::default()
                }),
            }
        }
        ok(DeleteObjectsOutput { deleted: Some(deleted), errors: Some(errors), ..Default::default() })
    }

    // -------------------------------------------------------------- tagging

    async fn get_object_tagging(&self, req: S3Request<GetObjectTaggingInput>) -> R<GetObjectTaggingOutput> {
        let fi = self.object(&req.input.bucket, &req.input.key, false).await?;
        ok(GetObjectTaggingOutput { tag_set: tag_set(&meta_of(&fi).tags), ..Default::default() })
    }

    async fn put_object_tagging(&self, req: S3Request<PutObjectTaggingInput>) -> R<PutObjectTaggingOutput> {
        let i = req.input;
        let fi = self.object(&i.bucket, &i.key, false).await?;
        let tags = check_tags(
            i.tagging.tag_set.into_iter().map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default())).collect(),
        )?;
        let meta = pb::ObjectMeta { tags, ..Default::default() };
        self.client.set_object_meta(&fi.path, meta, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
        ok(PutObjectTaggingOutput::default())
    }

    async fn delete_object_tagging(&self, req: S3Request<DeleteObjectTaggingInput>) -> R<DeleteObjectTaggingOutput> {
        let fi = self.object(&req.input.bucket, &req.input.key, false).await?;
        self.client
            .set_object_meta(&fi.path, pb::ObjectMeta::default(), true)
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
        ok(DeleteObjectTaggingOutput::default())
    }

    // -------------------------------------------------------------- multipart

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> R<CreateMultipartUploadOutput> {
        let i = req.input;
        self.bucket(&i.bucket).await?;
        object_path(&i.bucket, &i.key)?;
        if i.key.ends_with('/') {
            return Err(s3_error!(InvalidArgument, "a key ending in '/' names a directory"));
        }
        let upload_id = hex(&rand::random::<[u8; 16]>());
        let dir = self.upload_dir(&i.bucket, &upload_id)?;
        self.client.mkdir(&dir, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
        let rec = UploadRecord {
            key: i.key.clone(),
            content_type: i.content_type.unwrap_or_default(),
            user: i.metadata.unwrap_or_default(),
            tags: parse_tagging(i.tagging.as_deref())?,
            initiated_ms: now_ms(),
        };
        let raw = serde_json::to_vec(&rec).map_err(|e| s3_error!(InternalError, "{e}"))?;
        self.client
            .put_with(&format!("{dir}/{UPLOAD_RECORD}"), &mut raw.as_slice(), &self.upload_file_options(), |_| {
                Ok(pb::ObjectMeta::default())
            })
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
        ok(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(upload_id),
            ..Default::default()
        })
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> R<UploadPartOutput> {
        let headers = req.headers;
        let trailers = req.trailing_headers;
        let i = req.input;
        if !(1..=MAX_PART_NUMBER).contains(&i.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {MAX_PART_NUMBER}"));
        }
        if i.content_length.is_some_and(|n| n as u64 > self.cfg.max_object_size.as_u64()) {
            return Err(s3_error!(EntityTooLarge));
        }
        let (dir, _) = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let sums = sent_checksums!(i);
        let expected = Expected::new(i.content_md5.as_deref(), sums, &headers)?;
        let body = i.body.unwrap_or_else(empty_body);
        let part = format!("{dir}/{:05}", i.part_number);
        let w = self
            .checked_put(&part, body, expected, trailers, self.upload_file_options(), pb::ObjectMeta::default())
            .await?;
        ok(UploadPartOutput {
            e_tag: Some(etag(&w.md5)),
            checksum_crc32: w.sums.checksum_crc32,
            checksum_crc32c: w.sums.checksum_crc32c,
            checksum_crc64nvme: w.sums.checksum_crc64nvme,
            checksum_sha1: w.sums.checksum_sha1,
            checksum_sha256: w.sums.checksum_sha256,
            ..Default::default()
        })
    }

    async fn upload_part_copy(&self, req: S3Request<UploadPartCopyInput>) -> R<UploadPartCopyOutput> {
        let i = req.input;
        if !(1..=MAX_PART_NUMBER).contains(&i.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {MAX_PART_NUMBER}"));
        }
        let (dir, _) = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let (src, start, len) = self
            .copy_source(
                &i.copy_source,
                i.copy_source_range.as_deref(),
                i.copy_source_if_match.as_ref(),
                i.copy_source_if_none_match.as_ref(),
            )
            .await?;
        if src.is_dir {
            return Err(s3_error!(InvalidRequest, "cannot copy a directory"));
        }
        let body = self.stream(src, start, len, ReadOptions::default());
        let part = format!("{dir}/{:05}", i.part_number);
        let opts = self.upload_file_options();
        let w = self.checked_put(&part, body, Expected::default(), None, opts, pb::ObjectMeta::default()).await?;
        ok(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&w.md5)),
                last_modified: Some(timestamp(w.fi.mtime_ms)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> R<CompleteMultipartUploadOutput> {
        let wt = write_type(&req.headers)?;
        let i = req.input;
        let path = object_path(&i.bucket, &i.key)?;
        let (dir, rec) = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let wanted = i.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if wanted.is_empty() {
            return Err(s3_error!(MalformedXML, "the upload names no parts"));
        }
        let have: HashMap<i32, pb::FileInfo> = self.parts(&dir).await?.into_iter().collect();
        let mut prev = 0;
        for p in &wanted {
            let n = p.part_number.ok_or_else(|| s3_error!(InvalidPart, "a part has no number"))?;
            if n <= prev {
                return Err(s3_error!(InvalidPartOrder));
            }
            prev = n;
        }
        let mut chosen = Vec::with_capacity(wanted.len());
        let mut md5s = Md5::new();
        for (k, p) in wanted.iter().enumerate() {
            let n = p.part_number.unwrap_or_default();
            let fi = have.get(&n).ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?;
            let tag = etag_of(fi);
            if p.e_tag.as_ref().is_some_and(|e| e.value() != tag) {
                return Err(s3_error!(InvalidPart, "part {n} has a different ETag"));
            }
            if k + 1 < wanted.len() && fi.length < MIN_PART_SIZE {
                return Err(s3_error!(EntityTooSmall, "part {n} is smaller than 5 MiB"));
            }
            let raw: Vec<u8> =
                (0..tag.len() / 2).filter_map(|j| u8::from_str_radix(&tag[2 * j..2 * j + 2], 16).ok()).collect();
            md5s.update(&raw);
            chosen.push(fi.clone());
        }
        let final_etag = format!("{}-{}", hex(&md5s.finalize()), chosen.len());
        // The parts are read once, uncached, in order, straight into the object.
        let client = self.client.clone();
        let mut parts_with_blocks = Vec::with_capacity(chosen.len());
        for fi in &chosen {
            parts_with_blocks
                .push(client.status(&fi.path, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?);
        }
        let body = futures::stream::iter(parts_with_blocks)
            .map(move |fi| {
                let len = fi.length;
                client.read_stream(
                    fi,
                    0,
                    len,
                    ReadOptions { read_type: Some(ReadType::NO_CACHE), ..Default::default() },
                )
            })
            .flatten();
        let opts = PutOptions {
            overwrite: true,
            content_type: rec.content_type.clone(),
            user_metadata: ufs_user_metadata(&rec.user, &rec.tags),
            write_type: wt,
            ..Default::default()
        };
        let meta =
            pb::ObjectMeta { content_type: rec.content_type, etag: final_etag.clone(), user: rec.user, tags: rec.tags };
        self.checked_put(&path, StreamingBlob::wrap(body), Expected::default(), None, opts, meta).await?;
        if let Err(e) = self.client.delete(&dir, true).await {
            tracing::warn!(dir, error = %e, "cannot remove the parts of a completed upload");
        }
        ok(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            e_tag: Some(etag(&final_etag)),
            ..Default::default()
        })
    }

    async fn abort_multipart_upload(&self, req: S3Request<AbortMultipartUploadInput>) -> R<AbortMultipartUploadOutput> {
        let i = req.input;
        let (dir, _) = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        self.client.delete(&dir, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?;
        ok(AbortMultipartUploadOutput::default())
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> R<ListPartsOutput> {
        let i = req.input;
        let (dir, _) = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let marker = i.part_number_marker.unwrap_or(0);
        let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let mut parts: Vec<Part> = self
            .parts(&dir)
            .await?
            .into_iter()
            .filter(|(n, _)| *n > marker)
            .map(|(n, fi)| Part {
                part_number: Some(n),
                size: Some(fi.length as i64),
                e_tag: Some(etag(&etag_of(&fi))),
                last_modified: Some(timestamp(fi.mtime_ms)),
                ..Default::default()
            })
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        ok(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            part_number_marker: Some(marker),
            next_part_number_marker: parts.last().and_then(|p| p.part_number),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..Default::default()
        })
    }

    async fn list_multipart_uploads(&self, req: S3Request<ListMultipartUploadsInput>) -> R<ListMultipartUploadsOutput> {
        let i = req.input;
        self.bucket(&i.bucket).await?;
        let root = format!("/{}/{UPLOADS_DIR}", i.bucket);
        let mut ids = Vec::new();
        match self.client.list_each(&root, false, |e| ids.push(e.name.clone())).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchBucket)),
        }
        let prefix = i.prefix.clone().unwrap_or_default();
        let mut uploads = Vec::new();
        for id in ids {
            let Ok(raw) = self.read_small(&format!("{root}/{id}/{UPLOAD_RECORD}")).await else { continue };
            let Ok(rec) = serde_json::from_slice::<UploadRecord>(&raw) else { continue };
            if rec.key.starts_with(&prefix) {
                uploads.push((rec.key, id, rec.initiated_ms));
            }
        }
        uploads.sort();
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        uploads.retain(|(k, id, _)| {
            key_marker.is_empty()
                || k.as_str() > key_marker.as_str()
                || (*k == key_marker && id.as_str() > id_marker.as_str())
        });
        let max = i.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
        let truncated = uploads.len() > max;
        uploads.truncate(max);
        let last = uploads.last().cloned();
        ok(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            key_marker: i.key_marker,
            upload_id_marker: i.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: last.as_ref().map(|l| l.0.clone()),
            next_upload_id_marker: last.as_ref().map(|l| l.1.clone()),
            uploads: Some(
                uploads
                    .into_iter()
                    .map(|(key, id, at)| MultipartUpload {
                        key: Some(key),
                        upload_id: Some(id),
                        initiated: Some(timestamp(at)),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_outside_a_bucket_are_refused() {
        assert_eq!(object_path("b", "a/c.txt").unwrap(), "/b/a/c.txt");
        assert_eq!(object_path("b", "dir/").unwrap(), "/b/dir");
        for bad in ["", "/", "../x", "a/../../x", "a//b", "./a", ".locus-uploads/x", "a/.locus-tmp/b", "/abs"] {
            assert!(object_path("b", bad).is_err(), "{bad:?} accepted");
        }
        assert!(object_path("b", &"k".repeat(1025)).is_err());
        // a reserved name deeper down is an ordinary name
        assert!(object_path("b", "x/.locus-uploads").is_ok());
    }

    #[test]
    fn etags_follow_s3() {
        let mut fi = pb::FileInfo { length: 3, fingerprint: "3:m1700".into(), ..Default::default() };
        let derived = etag_of(&fi);
        assert_eq!(derived.len(), 32);
        fi.fingerprint = "3:\"abc\"".into();
        fi.fingerprint = "3:abc".into();
        assert_eq!(etag_of(&fi), "abc", "the UFS's etag when it has one");
        fi.meta = Some(pb::ObjectMeta { etag: "f00-2".into(), ..Default::default() });
        assert_eq!(etag_of(&fi), "f00-2", "the recorded MD5 first");
        assert_eq!(etag_of(&pb::FileInfo { is_dir: true, ..Default::default() }), EMPTY_MD5);
    }

    #[test]
    fn md5_etags_are_told_from_multipart_ones() {
        assert!(is_md5(EMPTY_MD5));
        assert!(!is_md5("d41d8cd98f00b204e9800998ecf8427e-2"));
        assert!(!is_md5(""));
        assert!(!is_md5("z41d8cd98f00b204e9800998ecf8427e"));
    }

    #[test]
    fn tags_are_checked() {
        assert_eq!(parse_tagging(Some("a=1&b=x%20y")).unwrap().get("b").unwrap(), "x y");
        assert!(parse_tagging(Some("a=1&a=2")).is_err());
        let many: Vec<String> = (0..11).map(|i| format!("k{i}=v")).collect();
        assert!(parse_tagging(Some(&many.join("&"))).is_err());
        assert!(parse_tagging(None).unwrap().is_empty());
    }

    #[test]
    fn continuation_tokens_round_trip() {
        let k = "dir/ünï code+key=1";
        assert_eq!(decode_token(&encode_token(k)).unwrap(), k);
        assert!(decode_token("!!!").is_err());
    }
}
