//! ACL calls. Locus has one account, and every bucket and object is private to it: the
//! Get calls answer that ACL (the owner's FULL_CONTROL grant, as S3's canned `private`
//! reads back); the Put calls accept it, as the canned `private` or as that exact grant,
//! and refuse any other with AccessControlListNotSupported, as S3 does for a bucket whose
//! ACLs are disabled.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result, s3_error};

use super::{LocusS3, R, ok, owner};

pub(super) async fn get_bucket_acl(gw: &LocusS3, req: S3Request<GetBucketAclInput>) -> R<GetBucketAclOutput> {
    gw.bucket(&req.input.bucket).await?;
    let o = owner(&gw.cfg);
    ok(GetBucketAclOutput { grants: Some(vec![full_control(&o)]), owner: Some(o) })
}

pub(super) async fn get_object_acl(gw: &LocusS3, req: S3Request<GetObjectAclInput>) -> R<GetObjectAclOutput> {
    let i = req.input;
    gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    let o = owner(&gw.cfg);
    ok(GetObjectAclOutput { grants: Some(vec![full_control(&o)]), owner: Some(o), ..Default::default() })
}

pub(super) async fn put_bucket_acl(gw: &LocusS3, req: S3Request<PutBucketAclInput>) -> R<PutBucketAclOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let grants = [&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write, &i.grant_write_acp];
    check_acl(gw, i.acl.as_ref().map(|a| a.as_str()), grants, i.access_control_policy.as_ref())?;
    ok(PutBucketAclOutput {})
}

pub(super) async fn put_object_acl(gw: &LocusS3, req: S3Request<PutObjectAclInput>) -> R<PutObjectAclOutput> {
    let i = req.input;
    gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    let grants = [&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write, &i.grant_write_acp];
    check_acl(gw, i.acl.as_ref().map(|a| a.as_str()), grants, i.access_control_policy.as_ref())?;
    ok(PutObjectAclOutput::default())
}

/// The ACL a write (PutObject, CopyObject, CreateMultipartUpload) asks the new object to
/// get: none, `private`, `bucket-owner-full-control` (the same here) or the owner's full
/// control grant; anything else is refused, as S3 does with ACLs disabled.
pub(super) fn check_write_acl(
    gw: &LocusS3,
    canned: Option<&ObjectCannedACL>,
    grants: [&Option<String>; 4],
) -> S3Result<()> {
    let [full, read, read_acp, write_acp] = grants;
    let canned = canned.map(|c| c.as_str()).filter(|c| *c != ObjectCannedACL::BUCKET_OWNER_FULL_CONTROL);
    if canned.is_none() && grants.iter().all(|g| g.is_none()) {
        return Ok(());
    }
    check_acl(gw, canned, [full, read, read_acp, &None, write_acp], None)
}

fn full_control(o: &Owner) -> Grant {
    Grant {
        grantee: Some(Grantee {
            display_name: o.display_name.clone(),
            id: o.id.clone(),
            type_: Type::from_static(Type::CANONICAL_USER),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }
}

fn not_supported() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::AccessControlListNotSupported,
        "The bucket does not allow ACLs: Locus keeps every bucket and object private to its owner, \
         and accepts only the canned ACL 'private' (or the owner's one FULL_CONTROL grant)",
    )
}

/// Accept a Put*Acl request that sets what is already there (private), refuse others.
fn check_acl(
    gw: &LocusS3,
    canned: Option<&str>,
    grant_headers: [&Option<String>; 5],
    policy: Option<&AccessControlPolicy>,
) -> S3Result<()> {
    let o = owner(&gw.cfg);
    let id = o.id.clone().unwrap_or_default();
    let [full, rest @ ..] = grant_headers;
    let given = canned.is_some() as u8 + grant_headers.iter().any(|g| g.is_some()) as u8 + policy.is_some() as u8;
    if given == 0 {
        return Err(s3_error!(MissingSecurityHeader, "Your request was missing a required header: an ACL"));
    }
    if given > 1 {
        return Err(s3_error!(InvalidRequest, "Specify an ACL in one way only: canned, grant headers or a body"));
    }
    if let Some(c) = canned {
        return if c == BucketCannedACL::PRIVATE { Ok(()) } else { Err(not_supported()) };
    }
    if grant_headers.iter().any(|g| g.is_some()) {
        // `x-amz-grant-full-control: id="<owner id>"`, the owner's full control, and
        // nothing else.
        let only_owner = full
            .as_deref()
            .is_some_and(|f| f.split(',').map(str::trim).all(|g| g.replace('"', "") == format!("id={id}")));
        return if only_owner && rest.iter().all(|g| g.is_none()) { Ok(()) } else { Err(not_supported()) };
    }
    let Some(p) = policy else { return Err(not_supported()) };
    let grants = p.grants.as_deref().unwrap_or_default();
    let owner_only = grants.len() == 1
        && grants.iter().all(|g| {
            g.permission.as_ref().is_some_and(|p| p.as_str() == Permission::FULL_CONTROL)
                && g.grantee
                    .as_ref()
                    .is_some_and(|e| e.type_.as_str() == Type::CANONICAL_USER && e.id.as_deref() == Some(id.as_str()))
        });
    if owner_only { Ok(()) } else { Err(not_supported()) }
}
