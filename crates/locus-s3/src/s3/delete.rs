//! DeleteObject and DeleteObjects: a missing key is no error, and directories a delete
//! leaves empty go too.

use locus_common::ErrorKind;
use locus_common::path as lpath;
use locus_proto::pb;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Result, s3_error};

use super::{LocusS3, R, VersionId, bucket_path, object_path, ok, version_id};
use crate::s3_error;

pub(super) async fn delete_object(gw: &LocusS3, req: S3Request<DeleteObjectInput>) -> R<DeleteObjectOutput> {
    let i = req.input;
    gw.delete_version(&i.bucket, &i.key, i.version_id.as_deref()).await?;
    ok(DeleteObjectOutput { version_id: i.version_id, ..Default::default() })
}

pub(super) async fn delete_objects(gw: &LocusS3, req: S3Request<DeleteObjectsInput>) -> R<DeleteObjectsOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    if i.delete.objects.len() > 1000 {
        return Err(s3_error!(MalformedXML, "at most 1000 keys per request"));
    }
    let quiet = i.delete.quiet.unwrap_or(false);
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for o in i.delete.objects {
        match gw.delete_version(&i.bucket, &o.key, o.version_id.as_deref()).await {
            Ok(()) => {
                if !quiet {
                    deleted.push(DeletedObject { key: Some(o.key), version_id: o.version_id, ..Default::default() });
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

impl LocusS3 {
    /// Delete one key, or its version `versionId`: `null` is the object itself; another
    /// well-formed id names no version here, so there is nothing to delete.
    async fn delete_version(&self, bucket: &str, key: &str, version: Option<&str>) -> S3Result<()> {
        match version_id(version)? {
            Some(VersionId::Other) => {
                object_path(bucket, key)?;
                self.bucket(bucket).await.map(|_| ())
            }
            _ => self.delete_key(bucket, key).await,
        }
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
}
