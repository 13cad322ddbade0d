//! PutObject and CopyObject, and the source of a copy (also UploadPartCopy's).

use futures::StreamExt;
use locus_client::{PutOptions, ReadOptions};
use locus_proto::pb;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result, s3_error};

use super::acl::check_write_acl;
use super::checksum::{Expected, Written, sent_checksums, with_checksums};
use super::get::etag_matches;
use super::tagging::parse_tagging;
use super::{
    EMPTY_MD5, LocusS3, R, empty_body, etag, etag_of, meta_of, object_options, object_path, ok, sent_meta, timestamp,
    write_type,
};
use crate::s3_error;

pub(super) async fn put_object(gw: &LocusS3, req: S3Request<PutObjectInput>) -> R<PutObjectOutput> {
    let headers = req.headers;
    let trailers = req.trailing_headers;
    let mut i = req.input;
    gw.bucket(&i.bucket).await?;
    let path = object_path(&i.bucket, &i.key)?;
    if i.content_length.is_some_and(|n| n as u64 > gw.cfg.max_object_size.as_u64()) {
        return Err(s3_error!(EntityTooLarge));
    }
    if i.key.ends_with('/') {
        // (Streaming-signed markers declare a body length for their empty chunk.)
        if let Some(mut body) = i.body.take() {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "{e}"))?;
                if !chunk.is_empty() {
                    return Err(s3_error!(InvalidArgument, "a key ending in '/' names a directory and takes no data"));
                }
            }
        }
        // A directory marker: the directory, flagged so that it lists as `key/` even
        // when it has children and outlives them.
        gw.client.mkdir(&path, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
        gw.client
            .set_object_meta(&path, marker_meta(), false)
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
        return ok(PutObjectOutput { e_tag: Some(etag(EMPTY_MD5)), ..Default::default() });
    }
    gw.check_write_conditions(&path, i.if_match.as_ref(), i.if_none_match.as_ref()).await?;
    check_write_acl(gw, i.acl.as_ref(), [&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write_acp])?;
    let tags = parse_tagging(i.tagging.as_deref())?;
    let sums = sent_checksums!(i);
    let expected = Expected::new(i.content_md5.as_deref(), sums, &headers)?;
    let body = i.body.take().unwrap_or_else(empty_body);
    let wt = write_type(&headers)?;
    let meta = sent_meta!(i, tags);
    // The object's size, when the request declares it (the decoded length of a streaming
    // upload): a cached write that cannot fit then fails, or goes to the UFS, before it
    // evicts anything.
    let declared = headers
        .get("x-amz-decoded-content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .or(i.content_length.map(|n| n as u64))
        .filter(|n| *n > 0);
    let opts = PutOptions { expected_length: declared, ..object_options(&meta, wt) };
    let w = gw.checked_put(&path, body, expected, trailers, opts, meta).await?;
    ok(with_checksums!(PutObjectOutput { e_tag: Some(etag(&w.md5)), size: Some(w.fi.length as i64) }, w.sums))
}

pub(super) async fn copy_object(gw: &LocusS3, req: S3Request<CopyObjectInput>) -> R<CopyObjectOutput> {
    let wt = write_type(&req.headers)?;
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let path = object_path(&i.bucket, &i.key)?;
    check_write_acl(gw, i.acl.as_ref(), [&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write_acp])?;
    let replace_meta = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
    let replace_tags = i.tagging_directive.as_ref().is_some_and(|d| d.as_str() == TaggingDirective::REPLACE);
    let source = copy_source!(i, None);
    let w = gw
        .copy(source, &path, |src| {
            if src.path == path && !replace_meta && !replace_tags {
                return Err(s3_error!(
                    InvalidRequest,
                    "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata."
                ));
            }
            let old = meta_of(src);
            let tags = if replace_tags { parse_tagging(i.tagging.as_deref())? } else { old.tags.clone() };
            let mut meta = if replace_meta {
                sent_meta!(i, tags)
            } else {
                // The source's metadata and standard headers; not its upload's parts.
                pb::ObjectMeta {
                    etag: String::new(),
                    upload_id: String::new(),
                    part_sizes: Vec::new(),
                    part_count: 0,
                    tags,
                    ..old.clone()
                }
            };
            // Same bytes, same MD5: a source whose ETag is the MD5 Locus recorded when it
            // was written (not a multipart ETag) gives it to the copy, which then skips an
            // MD5 pass.
            if is_md5(&old.etag) {
                meta.etag = old.etag;
            }
            Ok((object_options(&meta, wt), meta))
        })
        .await?;
    ok(CopyObjectOutput { copy_object_result: Some(copy_result!(CopyObjectResult, w)), ..Default::default() })
}

/// Whether an ETag is a plain MD5 (32 hex digits), not a multipart ETag (`md5-N`).
fn is_md5(etag: &str) -> bool {
    etag.len() == 32 && etag.bytes().all(|c| c.is_ascii_hexdigit())
}

/// What marks a directory as an explicit `dir/` object.
fn marker_meta() -> pb::ObjectMeta {
    pb::ObjectMeta { etag: EMPTY_MD5.into(), ..Default::default() }
}

/// The source of a copy: `x-amz-copy-source`, its range and its preconditions.
pub(super) struct Source<'a> {
    pub(super) src: &'a CopySource,
    pub(super) range: Option<&'a str>,
    pub(super) if_match: Option<&'a ETagCondition>,
    pub(super) if_none_match: Option<&'a ETagCondition>,
}

/// The [`Source`] of a CopyObject or UploadPartCopy input, with its range.
macro_rules! copy_source {
    ($i:expr, $range:expr) => {
        Source {
            src: &$i.copy_source,
            range: $range,
            if_match: $i.copy_source_if_match.as_ref(),
            if_none_match: $i.copy_source_if_none_match.as_ref(),
        }
    };
}
pub(super) use copy_source;

/// A CopyObjectResult or CopyPartResult: the copy's ETag and time.
macro_rules! copy_result {
    ($t:ident, $w:expr) => {
        $t { e_tag: Some(etag(&$w.md5)), last_modified: Some(timestamp($w.fi.mtime_ms)), ..Default::default() }
    };
}
pub(super) use copy_result;

impl LocusS3 {
    /// Copy `source` (all of it or a range) to `dest`: its preconditions checked, then
    /// its bytes streamed through a checked put. `target` makes the put's options and
    /// metadata from the source's status.
    pub(super) async fn copy(
        &self,
        source: Source<'_>,
        dest: &str,
        target: impl FnOnce(&pb::FileInfo) -> S3Result<(PutOptions, pb::ObjectMeta)>,
    ) -> S3Result<Written> {
        let (src, start, len) = self.copy_source(source).await?;
        if src.is_dir {
            return Err(s3_error!(InvalidRequest, "cannot copy a directory"));
        }
        let (opts, meta) = target(&src)?;
        let body = self.stream(src, start, len, ReadOptions::default());
        self.checked_put(dest, body, Expected::default(), None, opts, meta).await
    }

    /// The preconditions of a write (PutObject, CompleteMultipartUpload), checked against
    /// what the key holds now: `If-None-Match: *` fails (412) when it holds an object,
    /// `If-Match` when its ETag differs (412) or it holds none (404 NoSuchKey).
    pub(super) async fn check_write_conditions(
        &self,
        path: &str,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
    ) -> S3Result<()> {
        if if_match.is_none() && if_none_match.is_none() {
            return Ok(());
        }
        let current = match self.client.status(path, false).await {
            Ok(fi) if !fi.is_dir => Some(etag_of(&fi)),
            Ok(_) => None,
            Err(e) if e.kind() == locus_common::ErrorKind::NotFound => None,
            Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchKey)),
        };
        let failed = || {
            S3Error::with_message(
                S3ErrorCode::PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold",
            )
        };
        match (&current, if_match) {
            (None, Some(_)) => return Err(s3_error!(NoSuchKey, "The specified key does not exist.")),
            (Some(tag), Some(c)) if !etag_matches(c, tag) => return Err(failed()),
            _ => {}
        }
        if let (Some(tag), Some(c)) = (&current, if_none_match)
            && etag_matches(c, tag)
        {
            return Err(failed());
        }
        Ok(())
    }

    /// Source object and byte range of a copy.
    async fn copy_source(&self, source: Source<'_>) -> S3Result<(pb::FileInfo, u64, u64)> {
        let Source { src, range, if_match, if_none_match } = source;
        let CopySource::Bucket { bucket, key, version_id } = src else {
            return Err(s3_error!(NotImplemented, "copy from an access point"));
        };
        let fi = self.object_version(bucket, key, version_id.as_deref(), true).await?;
        let tag = etag_of(&fi);
        // Unlike GET's, a failed copy-source If-None-Match is a 412, not a 304.
        if if_match.is_some_and(|c| !etag_matches(c, &tag)) || if_none_match.is_some_and(|c| etag_matches(c, &tag)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_etags_are_told_from_multipart_ones() {
        assert!(is_md5(EMPTY_MD5));
        assert!(!is_md5("d41d8cd98f00b204e9800998ecf8427e-2"));
        assert!(!is_md5(""));
        assert!(!is_md5("z41d8cd98f00b204e9800998ecf8427e"));
    }
}
