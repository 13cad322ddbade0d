//! Multipart uploads. An upload in progress is a directory under the bucket's
//! `.locus-uploads`, holding its record (`upload.json`) and one file per part; completing
//! it streams the parts, in order, into the object. The staging directory goes with the
//! bucket's last upload (completed or aborted), so it does not stay in the user's bucket.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use locus_client::{PutOptions, ReadOptions};
use locus_common::config::ReadType;
use locus_common::{Error, ErrorKind};
use locus_proto::pb;
use md5::{Digest as _, Md5};
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Result, s3_error};

use super::acl::check_write_acl;
use super::checksum::{Expected, sent_checksums, with_checksums};
use super::put::{Source, copy_result, copy_source};
use super::tagging::parse_tagging;
use super::{
    LocusS3, R, empty_body, etag, etag_of, hex, object_options, object_path, ok, sent_meta, timestamp, write_type,
};
use crate::{UPLOADS_DIR, s3_error};
use locus_common::now_ms;

/// S3's smallest part (all but the last part of an upload).
const MIN_PART_SIZE: u64 = 5 << 20;
const MAX_PART_NUMBER: i32 = 10_000;
const UPLOAD_RECORD: &str = "upload.json";

pub(super) async fn create_multipart_upload(
    gw: &LocusS3,
    req: S3Request<CreateMultipartUploadInput>,
) -> R<CreateMultipartUploadOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    object_path(&i.bucket, &i.key)?;
    if i.key.ends_with('/') {
        return Err(s3_error!(InvalidArgument, "a key ending in '/' names a directory"));
    }
    check_write_acl(gw, i.acl.as_ref(), [&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write_acp])?;
    let tags = parse_tagging(i.tagging.as_deref())?;
    let upload_id = hex(&rand::random::<[u8; 16]>());
    let dir = gw.upload_dir(&i.bucket, &upload_id)?;
    // (Not while an idle staging directory is being removed.)
    let _staging = gw.staging.read().await;
    gw.client.mkdir(&dir, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
    let key = i.key.clone();
    let m = sent_meta!(i, tags);
    let rec = UploadRecord {
        key,
        content_type: m.content_type,
        user: m.user,
        tags: m.tags,
        initiated_ms: now_ms(),
        cache_control: m.cache_control,
        content_disposition: m.content_disposition,
        content_encoding: m.content_encoding,
        content_language: m.content_language,
        expires: m.expires,
    };
    let raw = serde_json::to_vec(&rec).map_err(|e| s3_error!(InternalError, "{e}"))?;
    gw.client
        .put_with(&format!("{dir}/{UPLOAD_RECORD}"), &mut raw.as_slice(), &gw.upload_file_options(), |_| {
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

pub(super) async fn upload_part(gw: &LocusS3, req: S3Request<UploadPartInput>) -> R<UploadPartOutput> {
    let headers = req.headers;
    let trailers = req.trailing_headers;
    let i = req.input;
    if !(1..=MAX_PART_NUMBER).contains(&i.part_number) {
        return Err(s3_error!(InvalidArgument, "part numbers are 1 to {MAX_PART_NUMBER}"));
    }
    if i.content_length.is_some_and(|n| n as u64 > gw.cfg.max_object_size.as_u64()) {
        return Err(s3_error!(EntityTooLarge));
    }
    let (dir, _) = gw.upload(&i.bucket, &i.key, &i.upload_id).await?;
    let sums = sent_checksums!(i);
    let expected = Expected::new(i.content_md5.as_deref(), sums, &headers)?;
    let body = i.body.unwrap_or_else(empty_body);
    let part = format!("{dir}/{:05}", i.part_number);
    let w =
        gw.checked_put(&part, body, expected, trailers, gw.upload_file_options(), pb::ObjectMeta::default()).await?;
    ok(with_checksums!(UploadPartOutput { e_tag: Some(etag(&w.md5)) }, w.sums))
}

pub(super) async fn upload_part_copy(gw: &LocusS3, req: S3Request<UploadPartCopyInput>) -> R<UploadPartCopyOutput> {
    let i = req.input;
    if !(1..=MAX_PART_NUMBER).contains(&i.part_number) {
        return Err(s3_error!(InvalidArgument, "part numbers are 1 to {MAX_PART_NUMBER}"));
    }
    let (dir, _) = gw.upload(&i.bucket, &i.key, &i.upload_id).await?;
    let source = copy_source!(i, i.copy_source_range.as_deref());
    let part = format!("{dir}/{:05}", i.part_number);
    let w = gw.copy(source, &part, |_| Ok((gw.upload_file_options(), pb::ObjectMeta::default()))).await?;
    ok(UploadPartCopyOutput { copy_part_result: Some(copy_result!(CopyPartResult, w)), ..Default::default() })
}

pub(super) async fn complete_multipart_upload(
    gw: &LocusS3,
    req: S3Request<CompleteMultipartUploadInput>,
) -> R<CompleteMultipartUploadOutput> {
    let wt = write_type(&req.headers)?;
    let i = req.input;
    let path = object_path(&i.bucket, &i.key)?;
    let (dir, rec) = match gw.upload(&i.bucket, &i.key, &i.upload_id).await {
        Ok(u) => u,
        Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => {
            // A retry of a Complete that went through (its answer lost, say): the object
            // it made answers again, as long as it is still there.
            return match gw.client.status(&path, false).await {
                Ok(fi) if fi.meta.as_ref().is_some_and(|m| m.upload_id == i.upload_id) => {
                    ok(CompleteMultipartUploadOutput {
                        bucket: Some(i.bucket),
                        key: Some(i.key),
                        e_tag: Some(etag(&etag_of(&fi))),
                        ..Default::default()
                    })
                }
                _ => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    gw.check_write_conditions(&path, i.if_match.as_ref(), i.if_none_match.as_ref()).await?;
    let wanted = i.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
    if wanted.is_empty() {
        return Err(s3_error!(MalformedXML, "the upload names no parts"));
    }
    let have: HashMap<i32, pb::FileInfo> = gw.parts(&dir).await?.into_iter().collect();
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
    let client = gw.client.clone();
    let mut parts_with_blocks = Vec::with_capacity(chosen.len());
    for fi in &chosen {
        parts_with_blocks
            .push(client.status(&fi.path, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?);
    }
    let body = futures::stream::iter(parts_with_blocks)
        .map(move |fi| {
            let len = fi.length;
            client.read_stream(fi, 0, len, ReadOptions { read_type: Some(ReadType::NoCache), ..Default::default() })
        })
        .flatten();
    let meta = pb::ObjectMeta {
        content_type: rec.content_type,
        etag: final_etag.clone(),
        user: rec.user,
        tags: rec.tags,
        cache_control: rec.cache_control,
        content_disposition: rec.content_disposition,
        content_encoding: rec.content_encoding,
        content_language: rec.content_language,
        expires: rec.expires,
        upload_id: i.upload_id.clone(),
        part_sizes: part_sizes(&chosen.iter().map(|fi| fi.length).collect::<Vec<_>>()),
        part_count: chosen.len() as u32,
    };
    let opts = object_options(&meta, wt);
    gw.checked_put(&path, StreamingBlob::wrap(body), Expected::default(), None, opts, meta).await?;
    if let Err(e) = gw.client.delete(&dir, true).await {
        tracing::warn!(dir, error = %e, "cannot remove the parts of a completed upload");
    }
    gw.remove_idle_staging(&i.bucket).await;
    ok(CompleteMultipartUploadOutput {
        location: Some(format!("/{}/{}", i.bucket, i.key)),
        bucket: Some(i.bucket),
        key: Some(i.key),
        e_tag: Some(etag(&final_etag)),
        ..Default::default()
    })
}

pub(super) async fn abort_multipart_upload(
    gw: &LocusS3,
    req: S3Request<AbortMultipartUploadInput>,
) -> R<AbortMultipartUploadOutput> {
    let i = req.input;
    let (dir, _) = gw.upload(&i.bucket, &i.key, &i.upload_id).await?;
    gw.client.delete(&dir, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?;
    gw.remove_idle_staging(&i.bucket).await;
    ok(AbortMultipartUploadOutput::default())
}

pub(super) async fn list_parts(gw: &LocusS3, req: S3Request<ListPartsInput>) -> R<ListPartsOutput> {
    let i = req.input;
    let (dir, _) = gw.upload(&i.bucket, &i.key, &i.upload_id).await?;
    let marker = i.part_number_marker.unwrap_or(0);
    let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
    let mut parts: Vec<Part> = gw
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

pub(super) async fn list_multipart_uploads(
    gw: &LocusS3,
    req: S3Request<ListMultipartUploadsInput>,
) -> R<ListMultipartUploadsOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let root = format!("/{}/{UPLOADS_DIR}", i.bucket);
    let mut ids = Vec::new();
    match gw.client.list_each(&root, false, |e| ids.push(e.name.clone())).await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(s3_error(e, S3ErrorCode::NoSuchBucket)),
    }
    let prefix = i.prefix.clone().unwrap_or_default();
    let mut uploads = Vec::new();
    for id in ids {
        let Ok(raw) = gw.read_small(&format!("{root}/{id}/{UPLOAD_RECORD}")).await else { continue };
        let Ok(rec) = serde_json::from_slice::<UploadRecord>(&raw) else { continue };
        if rec.key.starts_with(&prefix) {
            uploads.push((rec.key, id, rec.initiated_ms));
        }
    }
    uploads.sort();
    let key_marker = i.key_marker.clone().unwrap_or_default();
    let id_marker = i.upload_id_marker.clone().unwrap_or_default();
    let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
    // A key marker that is a common prefix (the last of a page) skips the keys under it.
    let marker_is_prefix = delimiter.as_deref().is_some_and(|d| key_marker.ends_with(d));
    uploads.retain(|(k, id, _)| {
        key_marker.is_empty()
            || (k.as_str() > key_marker.as_str() && !(marker_is_prefix && k.starts_with(&key_marker)))
            || (*k == key_marker && id.as_str() > id_marker.as_str())
    });
    let max = i.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
    let enc = super::list::Encoding::of(i.encoding_type.as_ref())?;
    // With a delimiter, keys that hold it after the prefix roll up into one common prefix
    // each, counted against max-uploads as S3 counts them.
    let mut listed: Vec<(String, String, i64)> = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut truncated = false;
    let mut last: Option<(String, String)> = None;
    for (key, id, at) in uploads {
        let rolled = delimiter
            .as_deref()
            .and_then(|d| key[prefix.len()..].find(d).map(|at| key[..prefix.len() + at + d.len()].to_string()));
        if let Some(cp) = &rolled
            && prefixes.last() == Some(cp)
        {
            continue;
        }
        if listed.len() + prefixes.len() == max {
            truncated = true;
            break;
        }
        match rolled {
            Some(cp) => {
                last = Some((cp.clone(), String::new()));
                prefixes.push(cp);
            }
            None => {
                last = Some((key.clone(), id.clone()));
                listed.push((key, id, at));
            }
        }
    }
    let last = last.filter(|_| truncated);
    ok(ListMultipartUploadsOutput {
        bucket: Some(i.bucket),
        prefix: i.prefix.map(|p| enc.apply(&p)),
        delimiter: delimiter.map(|d| enc.apply(&d)),
        encoding_type: i.encoding_type,
        key_marker: i.key_marker.map(|k| enc.apply(&k)),
        upload_id_marker: i.upload_id_marker,
        max_uploads: Some(max as i32),
        is_truncated: Some(truncated),
        next_key_marker: last.as_ref().map(|l| enc.apply(&l.0)),
        next_upload_id_marker: last.as_ref().map(|l| l.1.clone()),
        common_prefixes: Some(prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc.apply(&p)) }).collect()),
        uploads: Some(
            listed
                .into_iter()
                .map(|(key, id, at)| MultipartUpload {
                    key: Some(enc.apply(&key)),
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

/// An upload in progress, stored as `upload.json` in its directory.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct UploadRecord {
    key: String,
    content_type: String,
    user: BTreeMap<String, String>,
    tags: BTreeMap<String, String>,
    initiated_ms: i64,
    /// The standard headers the object gets (absent from records of older gateways).
    #[serde(default)]
    cache_control: String,
    #[serde(default)]
    content_disposition: String,
    #[serde(default)]
    content_encoding: String,
    #[serde(default)]
    content_language: String,
    #[serde(default)]
    expires: String,
}

/// The part sizes an object keeps: all of them, or, when every part but the last has
/// the same size (as SDKs upload), that size and the last one's.
fn part_sizes(sizes: &[u64]) -> Vec<u64> {
    match sizes {
        [first, middle @ .., last] if middle.iter().all(|s| s == first) => vec![*first, *last],
        _ => sizes.to_vec(),
    }
}

impl LocusS3 {
    /// Remove the bucket's staging directory if no upload is left in it, so that it
    /// stays neither in the namespace (`fs ls`) nor in the UFS. Failures are logged: the
    /// next Complete or Abort tries again.
    async fn remove_idle_staging(&self, bucket: &str) {
        let root = format!("/{bucket}/{UPLOADS_DIR}");
        let _staging = self.staging.write().await;
        match self.client.list_page(&root, "", false, 1).await {
            Ok((page, _)) if page.is_empty() => match self.client.delete(&root, false).await {
                Ok(()) => {}
                // Another gateway's upload began, or its cleanup came first.
                Err(e) if matches!(e.kind(), ErrorKind::DirectoryNotEmpty | ErrorKind::NotFound) => {}
                Err(e) => tracing::warn!(dir = root, error = %e, "cannot remove the idle staging directory"),
            },
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = root, error = %e, "cannot list the staging directory"),
        }
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
                ReadOptions { read_type: Some(ReadType::NoCache), ..Default::default() },
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
                if let Ok(n) = e.name.parse::<i32>()
                    && !e.is_dir
                {
                    parts.push((n, e.clone()));
                }
            })
            .await
            .map_err(|e| s3_error(e, S3ErrorCode::NoSuchUpload))?;
        parts.sort_by_key(|p| p.0);
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_parts_are_kept_short() {
        assert_eq!(part_sizes(&[8, 8, 8, 3]), vec![8, 3]);
        assert_eq!(part_sizes(&[8, 3]), vec![8, 3]);
        assert_eq!(part_sizes(&[5]), vec![5]);
        assert_eq!(part_sizes(&[8, 9, 8, 3]), vec![8, 9, 8, 3]);
    }
}
