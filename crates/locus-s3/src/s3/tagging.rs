//! Object and bucket tagging: Get/Put/DeleteObjectTagging, Get/Put/DeleteBucketTagging
//! (a bucket's tags are the tags of its directory's object metadata), and the checks on
//! tags however they come (an `x-amz-tagging` header or a Tagging body).

use std::collections::BTreeMap;

use locus_proto::pb;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Result, s3_error};

use super::{LocusS3, R, meta_of, ok};
use crate::s3_error;

pub(super) async fn get_object_tagging(
    gw: &LocusS3,
    req: S3Request<GetObjectTaggingInput>,
) -> R<GetObjectTaggingOutput> {
    let i = req.input;
    let fi = gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    ok(GetObjectTaggingOutput { tag_set: tag_set(&meta_of(&fi).tags), version_id: i.version_id })
}

pub(super) async fn put_object_tagging(
    gw: &LocusS3,
    req: S3Request<PutObjectTaggingInput>,
) -> R<PutObjectTaggingOutput> {
    let i = req.input;
    let fi = gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    let tags = check_tags(pairs(i.tagging), OBJECT_TAGS)?;
    set_tags(gw, &fi, tags).await?;
    ok(PutObjectTaggingOutput { version_id: i.version_id })
}

pub(super) async fn get_bucket_tagging(
    gw: &LocusS3,
    req: S3Request<GetBucketTaggingInput>,
) -> R<GetBucketTaggingOutput> {
    let fi = gw.bucket(&req.input.bucket).await?;
    let tags = meta_of(&fi).tags;
    if tags.is_empty() {
        return Err(s3_error!(NoSuchTagSet, "The TagSet does not exist"));
    }
    ok(GetBucketTaggingOutput { tag_set: tag_set(&tags) })
}

pub(super) async fn put_bucket_tagging(
    gw: &LocusS3,
    req: S3Request<PutBucketTaggingInput>,
) -> R<PutBucketTaggingOutput> {
    let i = req.input;
    let fi = gw.bucket(&i.bucket).await?;
    let tags = check_tags(pairs(i.tagging), BUCKET_TAGS)?;
    set_tags(gw, &fi, tags).await?;
    ok(PutBucketTaggingOutput {})
}

pub(super) async fn delete_bucket_tagging(
    gw: &LocusS3,
    req: S3Request<DeleteBucketTaggingInput>,
) -> R<DeleteBucketTaggingOutput> {
    let fi = gw.bucket(&req.input.bucket).await?;
    if !meta_of(&fi).tags.is_empty() {
        set_tags(gw, &fi, BTreeMap::new()).await?;
    }
    ok(DeleteBucketTaggingOutput {})
}

/// The most tags an object can have, and a bucket.
const OBJECT_TAGS: usize = 10;
const BUCKET_TAGS: usize = 50;

fn pairs(t: Tagging) -> Vec<(String, String)> {
    t.tag_set.into_iter().map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default())).collect()
}

pub(super) async fn delete_object_tagging(
    gw: &LocusS3,
    req: S3Request<DeleteObjectTaggingInput>,
) -> R<DeleteObjectTaggingOutput> {
    let i = req.input;
    let fi = gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    set_tags(gw, &fi, BTreeMap::new()).await?;
    ok(DeleteObjectTaggingOutput { version_id: i.version_id })
}

/// Replace an object's or a bucket's tags (its other metadata stays).
async fn set_tags(gw: &LocusS3, fi: &pb::FileInfo, tags: BTreeMap<String, String>) -> S3Result<()> {
    let meta = pb::ObjectMeta { tags, ..Default::default() };
    gw.client.set_object_meta(&fi.path, meta, true).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchKey))?;
    Ok(())
}

/// The tags of an `x-amz-tagging` header (URL-encoded).
pub(super) fn parse_tagging(h: Option<&str>) -> S3Result<BTreeMap<String, String>> {
    let tags: Vec<(String, String)> = match h {
        Some(q) => form_urlencoded::parse(q.as_bytes()).into_owned().collect(),
        None => Vec::new(),
    };
    check_tags(tags, OBJECT_TAGS)
}

fn check_tags(tags: Vec<(String, String)>, most: usize) -> S3Result<BTreeMap<String, String>> {
    if tags.len() > most {
        let what = if most == OBJECT_TAGS { "an object" } else { "a bucket" };
        return Err(s3_error!(InvalidTag, "{what} can have at most {most} tags"));
    }
    let mut m = BTreeMap::new();
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

fn tag_set(tags: &BTreeMap<String, String>) -> TagSet {
    let mut v: Vec<Tag> = tags.iter().map(|(k, v)| Tag { key: Some(k.clone()), value: Some(v.clone()) }).collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked() {
        assert_eq!(parse_tagging(Some("a=1&b=x%20y")).unwrap().get("b").unwrap(), "x y");
        assert!(parse_tagging(Some("a=1&a=2")).is_err());
        let many: Vec<String> = (0..11).map(|i| format!("k{i}=v")).collect();
        assert!(parse_tagging(Some(&many.join("&"))).is_err());
        assert!(parse_tagging(None).unwrap().is_empty());
    }
}
