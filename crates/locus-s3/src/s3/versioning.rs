//! The versioning calls, on buckets that never had versioning (Locus keeps one version
//! of each object): GetBucketVersioning answers an empty configuration (never enabled)
//! and ListObjectVersions lists every object as its one version, `null`, the latest,
//! with no delete markers. The object calls accept `versionId=null` (see
//! [`super::version_id`]).

use s3s::dto::*;
use s3s::{S3Request, s3_error};

use super::list::{Encoding, Entry, list_page};
use super::{LocusS3, R, etag, etag_of, ok, owner, timestamp};

/// The version id of every object.
const NULL: &str = "null";

pub(super) async fn get_bucket_versioning(
    gw: &LocusS3,
    req: S3Request<GetBucketVersioningInput>,
) -> R<GetBucketVersioningOutput> {
    gw.bucket(&req.input.bucket).await?;
    ok(GetBucketVersioningOutput::default())
}

/// Versioning is never turned on (nor suspended): Locus keeps one version of an object.
pub(super) async fn put_bucket_versioning(
    gw: &LocusS3,
    req: S3Request<PutBucketVersioningInput>,
) -> R<PutBucketVersioningOutput> {
    gw.bucket(&req.input.bucket).await?;
    Err(s3_error!(
        NotImplemented,
        "Locus keeps one version of each object: bucket versioning cannot be enabled or suspended"
    ))
}

pub(super) async fn list_object_versions(
    gw: &LocusS3,
    req: S3Request<ListObjectVersionsInput>,
) -> R<ListObjectVersionsOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let max = match i.max_keys {
        None => 1000,
        Some(n) if n < 0 => return Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => (n as usize).min(1000),
    };
    if i.version_id_marker.as_deref().is_some_and(|v| !v.is_empty()) && i.key_marker.as_deref().unwrap_or("").is_empty()
    {
        return Err(s3_error!(InvalidArgument, "A version-id marker cannot be specified without a key marker."));
    }
    // Each key has one version, so listing resumes after the key marker whatever the
    // version-id marker (nothing comes after `null` within a key).
    let key_marker = i.key_marker.clone().unwrap_or_default();
    let prefix = i.prefix.clone().unwrap_or_default();
    let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
    let enc = Encoding::of(i.encoding_type.as_ref())?;
    let page = list_page(gw, &i.bucket, None, &prefix, delimiter.as_deref(), &key_marker, max).await?;
    let o = owner(&gw.cfg);
    let mut versions = Vec::new();
    let mut prefixes = Vec::new();
    let mut last_is_object = false;
    for e in page.entries {
        match e {
            Entry::Object { key, fi } => {
                last_is_object = true;
                versions.push(ObjectVersion {
                    e_tag: Some(etag(&etag_of(&fi))),
                    is_latest: Some(true),
                    key: Some(enc.apply(&key)),
                    last_modified: Some(timestamp(fi.mtime_ms)),
                    owner: Some(o.clone()),
                    size: Some(if fi.is_dir { 0 } else { fi.length as i64 }),
                    storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
                    version_id: Some(NULL.into()),
                    ..Default::default()
                });
            }
            Entry::Prefix(p) => {
                last_is_object = false;
                prefixes.push(CommonPrefix { prefix: Some(enc.apply(&p)) });
            }
        }
    }
    let next_key_marker = page.last.map(|k| enc.apply(&k));
    let next_version_id_marker = (next_key_marker.is_some() && last_is_object).then(|| NULL.to_string());
    ok(ListObjectVersionsOutput {
        name: Some(i.bucket),
        prefix: Some(enc.apply(&prefix)),
        delimiter: delimiter.map(|d| enc.apply(&d)),
        encoding_type: i.encoding_type,
        key_marker: Some(enc.apply(&key_marker)),
        version_id_marker: Some(i.version_id_marker.unwrap_or_default()),
        max_keys: Some(max as i32),
        is_truncated: Some(page.truncated),
        next_key_marker,
        next_version_id_marker,
        versions: Some(versions),
        common_prefixes: Some(prefixes),
        ..Default::default()
    })
}
