//! Bucket operations: list, create, head, locate and delete buckets. A bucket is a
//! top-level directory of the namespace.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use locus_common::ErrorKind;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, s3_error};

use super::list::{self, ListRequest};
use super::{LocusS3, R, bucket_path, ok, owner, timestamp};
use crate::s3_error;

/// ListBuckets, with the paging AWS added in 2024: `max-buckets` (1 to 10000), a
/// `continuation-token` (the last bucket of the page before) and a name `prefix`. Asked
/// for any of them without `max-buckets`, a page holds 10000 buckets.
pub(super) async fn list_buckets(gw: &LocusS3, req: S3Request<ListBucketsInput>) -> R<ListBucketsOutput> {
    let i = req.input;
    let max = match i.max_buckets {
        Some(n) if !(1..=10_000).contains(&n) => {
            return Err(s3_error!(InvalidArgument, "max-buckets must be an integer between 1 and 10000"));
        }
        Some(n) => n as usize,
        None if i.continuation_token.is_some() || i.prefix.is_some() || i.bucket_region.is_some() => 10_000,
        None => usize::MAX,
    };
    let after = match i.continuation_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => B64URL
            .decode(t)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| s3_error!(InvalidArgument, "The continuation token provided is incorrect"))?,
        None => String::new(),
    };
    let prefix = i.prefix.clone().unwrap_or_default();
    // Every bucket is in the gateway's region.
    let other_region = i.bucket_region.as_deref().is_some_and(|r| r != gw.cfg.region);
    let mut buckets = Vec::new();
    let mut more = false;
    gw.client
        .list_each("/", false, |e| {
            if !e.is_dir || !s3s::path::check_bucket_name(&e.name) || other_region {
                return;
            }
            if !e.name.starts_with(&prefix) || e.name.as_str() <= after.as_str() {
                return;
            }
            if buckets.len() == max {
                more = true;
                return;
            }
            buckets.push(Bucket {
                name: Some(e.name.clone()),
                creation_date: Some(timestamp(e.mtime_ms)),
                bucket_region: Some(gw.cfg.region.clone()),
            });
        })
        .await
        .map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
    let continuation_token =
        more.then(|| buckets.last().and_then(|b| b.name.as_deref()).map(|n| B64URL.encode(n))).flatten();
    ok(ListBucketsOutput { buckets: Some(buckets), continuation_token, owner: Some(owner(&gw.cfg)), prefix: i.prefix })
}

pub(super) async fn create_bucket(gw: &LocusS3, req: S3Request<CreateBucketInput>) -> R<CreateBucketOutput> {
    let b = &req.input.bucket;
    // Every bucket is the one key pair's. In us-east-1 S3 answers 200 to a CreateBucket of
    // a bucket its caller already owns (and changes nothing); elsewhere 409.
    let owned = || match gw.cfg.region.as_str() {
        "us-east-1" => ok(CreateBucketOutput { location: Some(format!("/{b}")) }),
        _ => Err(s3_error!(BucketAlreadyOwnedByYou)),
    };
    if gw.client.status(&bucket_path(b), false).await.is_ok() {
        return owned();
    }
    match gw.client.mkdir(&bucket_path(b), false).await {
        Ok(_) => ok(CreateBucketOutput { location: Some(format!("/{b}")) }),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => owned(),
        Err(e) => Err(s3_error(e, S3ErrorCode::NoSuchBucket)),
    }
}

pub(super) async fn head_bucket(gw: &LocusS3, req: S3Request<HeadBucketInput>) -> R<HeadBucketOutput> {
    gw.bucket(&req.input.bucket).await?;
    ok(HeadBucketOutput { bucket_region: Some(gw.cfg.region.clone()), ..Default::default() })
}

pub(super) async fn get_bucket_location(
    gw: &LocusS3,
    req: S3Request<GetBucketLocationInput>,
) -> R<GetBucketLocationOutput> {
    gw.bucket(&req.input.bucket).await?;
    // S3 reports us-east-1 as no constraint.
    let location_constraint =
        (gw.cfg.region != "us-east-1").then(|| BucketLocationConstraint::from(gw.cfg.region.clone()));
    ok(GetBucketLocationOutput { location_constraint })
}

pub(super) async fn delete_bucket(gw: &LocusS3, req: S3Request<DeleteBucketInput>) -> R<DeleteBucketOutput> {
    let b = &req.input.bucket;
    gw.bucket(b).await?;
    let lr = ListRequest { bucket: b, prefix: "", delimiter: Some("/"), after: "", max_keys: 1, skip_hidden: true };
    let (entries, _) = list::list(&gw.client, &lr).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
    if !entries.is_empty() {
        return Err(s3_error!(BucketNotEmpty));
    }
    // Only abandoned uploads can be left: they go with the bucket.
    gw.client.delete(&bucket_path(b), true).await.map_err(|e| match e.kind() {
        ErrorKind::DirectoryNotEmpty => s3_error!(BucketNotEmpty),
        ErrorKind::InvalidArgument | ErrorKind::FailedPrecondition => {
            S3Error::with_message(S3ErrorCode::InvalidRequest, format!("cannot delete bucket {b}: {e}"))
        }
        _ => s3_error(e, S3ErrorCode::NoSuchBucket),
    })?;
    ok(DeleteBucketOutput {})
}
