//! Bucket operations: list, create, head, locate and delete buckets. A bucket is a
//! top-level directory of the namespace.

use locus_common::ErrorKind;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, s3_error};

use super::list::{self, ListRequest};
use super::{LocusS3, R, bucket_path, ok, timestamp};
use crate::s3_error;

pub(super) async fn list_buckets(gw: &LocusS3, _req: S3Request<ListBucketsInput>) -> R<ListBucketsOutput> {
    let mut buckets = Vec::new();
    gw.client
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

pub(super) async fn create_bucket(gw: &LocusS3, req: S3Request<CreateBucketInput>) -> R<CreateBucketOutput> {
    let b = &req.input.bucket;
    if gw.client.status(&bucket_path(b), false).await.is_ok() {
        return Err(s3_error!(BucketAlreadyOwnedByYou));
    }
    gw.client.mkdir(&bucket_path(b), false).await.map_err(|e| match e.kind() {
        ErrorKind::AlreadyExists => s3_error!(BucketAlreadyOwnedByYou),
        _ => s3_error(e, S3ErrorCode::NoSuchBucket),
    })?;
    ok(CreateBucketOutput { location: Some(format!("/{b}")), ..Default::default() })
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
