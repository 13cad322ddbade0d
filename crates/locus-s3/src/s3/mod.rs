//! The S3 operations, each mapped onto the Locus client: the gateway's state, the
//! lookups every area shares, and the dispatch of each operation to its area module.
//!
//! `s3s` parses each request (method, path, query, headers) into a typed operation and
//! calls the matching method of its [`S3`] trait, so the endpoint is decided before it
//! is handled; the trait impl below only routes each operation to its area:
//! [`bucket`], [`list`], [`get`], [`put`] (and copy), [`delete`], [`tagging`] (object and
//! bucket tags), [`multipart`], [`versioning`] (the versioning calls on buckets that
//! never had it) and [`acl`]; [`checksum`] checks what uploads send. Locus errors become
//! S3 codes in one place, [`crate::s3_error`].

mod acl;
mod bucket;
mod checksum;
mod delete;
mod get;
mod list;
mod multipart;
mod put;
mod search;
#[cfg(feature = "select")]
mod select;
mod tagging;
mod versioning;

use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use locus_client::{Client, PutOptions, ReadOptions};
use locus_common::ErrorKind;
use locus_common::config::{GatewayConfig, WriteType};
use locus_common::path as lpath;
use locus_proto::pb;
use md5::{Digest as _, Md5};
use s3s::dto::*;
use s3s::{S3, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use crate::{UPLOADS_DIR, WRITE_TYPE_HEADER, s3_error};

/// MD5 of nothing: the ETag of empty objects and directory markers.
use locus_proto::EMPTY_MD5;

pub(crate) struct LocusS3 {
    client: Arc<Client>,
    cfg: GatewayConfig,
    /// Held shared while an upload's directory is made, exclusively while a bucket's
    /// idle staging directory is removed (`multipart.rs`).
    staging: tokio::sync::RwLock<()>,
}

impl LocusS3 {
    pub(crate) fn new(client: Arc<Client>, cfg: GatewayConfig) -> Self {
        LocusS3 { client, cfg, staging: Default::default() }
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

/// The S3 ETag of a file: the MD5 recorded when it was written through Locus, else the
/// UFS's ETag (S3), else an MD5 of its fingerprint (size and mtime), which changes
/// whenever the file does.
fn etag_of(fi: &pb::FileInfo) -> String {
    locus_proto::etag_of(fi.meta.as_ref(), fi.is_dir, fi.length, &fi.fingerprint)
}

fn empty_body() -> StreamingBlob {
    StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, io::Error>>())
}

fn meta_of(fi: &pb::FileInfo) -> pb::ObjectMeta {
    fi.meta.clone().unwrap_or_default()
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

/// The `versionId` of a request. Buckets are never versioned: each object is its own
/// only version, `null`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum VersionId {
    /// `null`: the object as it is.
    Null,
    /// A well-formed id (an AWS or a MinIO one) that no object here has.
    Other,
}

/// Check a request's `versionId`: `null`, some other well-formed id (which names no
/// version here), or InvalidArgument as S3 answers a malformed one.
fn version_id(v: Option<&str>) -> S3Result<Option<VersionId>> {
    let Some(v) = v else { return Ok(None) };
    if v == "null" {
        return Ok(Some(VersionId::Null));
    }
    let aws = v.len() == 32 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_');
    let uuid = v.len() == 36
        && v.bytes()
            .enumerate()
            .all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() });
    if aws || uuid {
        Ok(Some(VersionId::Other))
    } else {
        Err(s3_error!(InvalidArgument, "Invalid version id specified"))
    }
}

/// The owner of every bucket and object: the gateway's one account, named by its access
/// key (an ID of 64 hex digits derived from it, as S3's canonical user ids look).
fn owner(cfg: &GatewayConfig) -> Owner {
    let name = if cfg.access_key_id.is_empty() { "locus" } else { cfg.access_key_id.as_str() };
    let id = format!("{}{}", hex(&Md5::digest(format!("locus-owner/{name}"))), hex(&Md5::digest(name)));
    Owner { display_name: Some(name.to_string()), id: Some(id) }
}

/// An HTTP date (the stored form of `Expires`).
fn http_date(t: &Timestamp) -> String {
    let mut buf = Vec::new();
    match t.format(TimestampFormat::HttpDate, &mut buf) {
        Ok(()) => String::from_utf8(buf).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// `Content-Encoding` as stored: without `aws-chunked`, which only describes how the
/// request body was sent (S3 drops it too).
fn stored_encoding(e: Option<String>) -> String {
    let Some(e) = e else { return String::new() };
    e.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("aws-chunked"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The object metadata a PutObject, CreateMultipartUpload or CopyObject (`REPLACE`)
/// input sends: content type, user metadata, tags and the standard headers
/// (`Cache-Control`, `Content-Disposition`, `Content-Encoding`, `Content-Language`,
/// `Expires`).
macro_rules! sent_meta {
    ($i:expr, $tags:expr) => {
        locus_proto::pb::ObjectMeta {
            content_type: $i.content_type.unwrap_or_default(),
            user: $i.metadata.unwrap_or_default().into_iter().collect(),
            tags: $tags,
            cache_control: $i.cache_control.unwrap_or_default(),
            content_disposition: $i.content_disposition.unwrap_or_default(),
            content_encoding: $crate::s3::stored_encoding($i.content_encoding),
            content_language: $i.content_language.unwrap_or_default(),
            expires: $i.expires.as_ref().map($crate::s3::http_date).unwrap_or_default(),
            ..Default::default()
        }
    };
}
use sent_meta;

/// A GetObject or HeadObject output with `fields`, and the standard headers stored
/// with the object (`meta`).
macro_rules! with_standard_headers {
    ($t:ident { $($f:ident: $v:expr),* $(,)? }, $meta:expr) => {{
        let m: &locus_proto::pb::ObjectMeta = $meta;
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        $t {
            $($f: $v,)*
            cache_control: some(&m.cache_control),
            content_disposition: some(&m.content_disposition),
            content_encoding: some(&m.content_encoding),
            content_language: some(&m.content_language),
            expires: (!m.expires.is_empty())
                .then(|| s3s::dto::Timestamp::parse(s3s::dto::TimestampFormat::HttpDate, &m.expires).ok())
                .flatten(),
            ..Default::default()
        }
    }};
}
use with_standard_headers;

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

/// How an object (a PUT, a copy, a completed upload) is written: overwriting, with its
/// content type and its user metadata and tags as the UFS's user metadata.
fn object_options(meta: &pb::ObjectMeta, write_type: Option<WriteType>) -> PutOptions {
    PutOptions {
        overwrite: true,
        content_type: meta.content_type.clone(),
        user_metadata: locus_proto::ufs_user_metadata(meta),
        write_type,
        ..Default::default()
    }
}

impl LocusS3 {
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

    /// An object named with an optional `versionId` (only `null` names one here).
    pub(super) async fn object_version(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        with_blocks: bool,
    ) -> S3Result<pb::FileInfo> {
        match version_id(version)? {
            Some(VersionId::Other) => {
                self.bucket(bucket).await?;
                Err(s3_error!(NoSuchVersion, "The specified version does not exist."))
            }
            Some(VersionId::Null) => match self.object(bucket, key, with_blocks).await {
                Err(e) if *e.code() == S3ErrorCode::NoSuchKey => {
                    Err(s3_error!(NoSuchVersion, "The specified version does not exist."))
                }
                r => r,
            },
            None => self.object(bucket, key, with_blocks).await,
        }
    }

    /// Stream a range of an object's bytes.
    fn stream(&self, fi: pb::FileInfo, start: u64, len: u64, opts: ReadOptions) -> StreamingBlob {
        StreamingBlob::wrap(self.client.read_stream(fi, start, len, opts))
    }
}

/// Each operation, as `s3s` parsed it, handed to its area.
#[async_trait::async_trait]
impl S3 for LocusS3 {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> R<ListBucketsOutput> {
        bucket::list_buckets(self, req).await
    }
    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> R<CreateBucketOutput> {
        bucket::create_bucket(self, req).await
    }
    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> R<HeadBucketOutput> {
        bucket::head_bucket(self, req).await
    }
    async fn get_bucket_location(&self, req: S3Request<GetBucketLocationInput>) -> R<GetBucketLocationOutput> {
        bucket::get_bucket_location(self, req).await
    }
    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> R<DeleteBucketOutput> {
        bucket::delete_bucket(self, req).await
    }

    async fn get_bucket_versioning(&self, req: S3Request<GetBucketVersioningInput>) -> R<GetBucketVersioningOutput> {
        versioning::get_bucket_versioning(self, req).await
    }
    async fn put_bucket_versioning(&self, req: S3Request<PutBucketVersioningInput>) -> R<PutBucketVersioningOutput> {
        versioning::put_bucket_versioning(self, req).await
    }
    async fn list_object_versions(&self, req: S3Request<ListObjectVersionsInput>) -> R<ListObjectVersionsOutput> {
        versioning::list_object_versions(self, req).await
    }
    async fn get_bucket_tagging(&self, req: S3Request<GetBucketTaggingInput>) -> R<GetBucketTaggingOutput> {
        tagging::get_bucket_tagging(self, req).await
    }
    async fn put_bucket_tagging(&self, req: S3Request<PutBucketTaggingInput>) -> R<PutBucketTaggingOutput> {
        tagging::put_bucket_tagging(self, req).await
    }
    async fn delete_bucket_tagging(&self, req: S3Request<DeleteBucketTaggingInput>) -> R<DeleteBucketTaggingOutput> {
        tagging::delete_bucket_tagging(self, req).await
    }
    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> R<GetBucketAclOutput> {
        acl::get_bucket_acl(self, req).await
    }
    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> R<PutBucketAclOutput> {
        acl::put_bucket_acl(self, req).await
    }
    async fn get_object_acl(&self, req: S3Request<GetObjectAclInput>) -> R<GetObjectAclOutput> {
        acl::get_object_acl(self, req).await
    }
    async fn put_object_acl(&self, req: S3Request<PutObjectAclInput>) -> R<PutObjectAclOutput> {
        acl::put_object_acl(self, req).await
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> R<ListObjectsV2Output> {
        list::list_objects_v2(self, req).await
    }
    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> R<ListObjectsOutput> {
        list::list_objects(self, req).await
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> R<HeadObjectOutput> {
        get::head_object(self, req).await
    }
    async fn get_object(&self, req: S3Request<GetObjectInput>) -> R<GetObjectOutput> {
        get::get_object(self, req).await
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> R<PutObjectOutput> {
        put::put_object(self, req).await
    }
    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> R<CopyObjectOutput> {
        put::copy_object(self, req).await
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> R<DeleteObjectOutput> {
        delete::delete_object(self, req).await
    }
    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> R<DeleteObjectsOutput> {
        delete::delete_objects(self, req).await
    }

    async fn get_object_tagging(&self, req: S3Request<GetObjectTaggingInput>) -> R<GetObjectTaggingOutput> {
        tagging::get_object_tagging(self, req).await
    }
    async fn put_object_tagging(&self, req: S3Request<PutObjectTaggingInput>) -> R<PutObjectTaggingOutput> {
        tagging::put_object_tagging(self, req).await
    }
    async fn delete_object_tagging(&self, req: S3Request<DeleteObjectTaggingInput>) -> R<DeleteObjectTaggingOutput> {
        tagging::delete_object_tagging(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> R<CreateMultipartUploadOutput> {
        multipart::create_multipart_upload(self, req).await
    }
    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> R<UploadPartOutput> {
        multipart::upload_part(self, req).await
    }
    async fn upload_part_copy(&self, req: S3Request<UploadPartCopyInput>) -> R<UploadPartCopyOutput> {
        multipart::upload_part_copy(self, req).await
    }
    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> R<CompleteMultipartUploadOutput> {
        multipart::complete_multipart_upload(self, req).await
    }
    async fn abort_multipart_upload(&self, req: S3Request<AbortMultipartUploadInput>) -> R<AbortMultipartUploadOutput> {
        multipart::abort_multipart_upload(self, req).await
    }
    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> R<ListPartsOutput> {
        multipart::list_parts(self, req).await
    }
    async fn list_multipart_uploads(&self, req: S3Request<ListMultipartUploadsInput>) -> R<ListMultipartUploadsOutput> {
        multipart::list_multipart_uploads(self, req).await
    }

    // ------------------------------------------------------------------- S3 Select
    #[cfg(feature = "select")]
    async fn select_object_content(&self, req: S3Request<SelectObjectContentInput>) -> R<SelectObjectContentOutput> {
        select::select_object_content(self, req).await
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
    fn version_ids() {
        assert_eq!(version_id(None).unwrap(), None);
        assert_eq!(version_id(Some("null")).unwrap(), Some(VersionId::Null));
        for other in ["3HL4kqtJlcpXroDTDmJ_rmSpXd3dIbrH", "0b5e8f0e-7c1a-4c4e-9d1f-2a3b4c5d6e7f"] {
            assert_eq!(version_id(Some(other)).unwrap(), Some(VersionId::Other), "{other}");
        }
        for bad in ["", "NULL", "abc", "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrH", "0b5e8f0e+7c1a-4c4e-9d1f-2a3b4c5d6e7f"] {
            assert!(version_id(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn aws_chunked_is_not_stored_as_an_encoding() {
        assert_eq!(stored_encoding(None), "");
        assert_eq!(stored_encoding(Some("aws-chunked".into())), "");
        assert_eq!(stored_encoding(Some("aws-chunked, gzip".into())), "gzip");
        assert_eq!(stored_encoding(Some("gzip,br".into())), "gzip, br");
    }

    #[test]
    fn owner_ids_look_canonical() {
        let cfg = GatewayConfig { access_key_id: "k".into(), ..Default::default() };
        let o = owner(&cfg);
        assert_eq!(o.id.as_deref().map(str::len), Some(64));
        assert_eq!(o.display_name.as_deref(), Some("k"));
        assert_eq!(owner(&cfg).id, o.id, "stable");
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
}
