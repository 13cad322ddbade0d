//! GET and HEAD of objects, sharing one evaluation of the preconditions (`If-Match`,
//! `If-None-Match`, `If-Modified-Since`, `If-Unmodified-Since`) and the `Range`.

use locus_client::ReadOptions;
use locus_common::config::ReadType;
use locus_proto::pb;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use super::{LocusS3, R, empty_body, etag, etag_of, meta_of, ok, timestamp, with_standard_headers};
use crate::READ_TYPE_HEADER;

pub(super) async fn head_object(gw: &LocusS3, req: S3Request<HeadObjectInput>) -> R<HeadObjectOutput> {
    let i = req.input;
    let fi = gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), false).await?;
    let tag = etag_of(&fi);
    let meta = meta_of(&fi);
    let sel = select(&fi, &tag, conditions!(i), part(&meta, i.part_number)?)?;
    let out = with_standard_headers!(
        HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(sel.len as i64),
            content_range: sel.content_range,
            content_type: Some(content_type_of(&fi)),
            e_tag: Some(etag(&tag)),
            last_modified: Some(timestamp(fi.mtime_ms)),
            metadata: (!meta.user.is_empty()).then(|| meta.user.clone().into_iter().collect()),
            parts_count: sel.parts_count,
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            version_id: i.version_id.clone(),
        },
        &meta
    );
    let mut res = S3Response::new(out);
    if !meta.tags.is_empty() {
        // (HeadObjectOutput has no field for it.)
        res.headers.insert("x-amz-tagging-count", http::HeaderValue::from(meta.tags.len()));
    }
    Ok(res)
}

pub(super) async fn get_object(gw: &LocusS3, req: S3Request<GetObjectInput>) -> R<GetObjectOutput> {
    let read_type = read_type(&req.headers)?;
    let i = req.input;
    let fi = gw.object_version(&i.bucket, &i.key, i.version_id.as_deref(), true).await?;
    let tag = etag_of(&fi);
    let meta = meta_of(&fi);
    let sel = select(&fi, &tag, conditions!(i), part(&meta, i.part_number)?)?;
    let body = if sel.len == 0 {
        empty_body()
    } else {
        gw.stream(fi.clone(), sel.start, sel.len, ReadOptions { read_type, ..Default::default() })
    };
    ok(with_standard_headers!(
        GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(sel.len as i64),
            content_range: sel.content_range,
            content_type: Some(content_type_of(&fi)),
            e_tag: Some(etag(&tag)),
            last_modified: Some(timestamp(fi.mtime_ms)),
            metadata: (!meta.user.is_empty()).then(|| meta.user.clone().into_iter().collect()),
            parts_count: sel.parts_count,
            tag_count: (!meta.tags.is_empty()).then_some(meta.tags.len() as i32),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            version_id: i.version_id.clone(),
            body: Some(body),
        },
        &meta
    ))
}

/// The part a GET or HEAD by `partNumber` selects: `(start, length, parts count)`. A
/// completed multipart upload has its parts' sizes; any other object is its one part.
fn part(meta: &pb::ObjectMeta, n: Option<i32>) -> S3Result<Option<Part>> {
    let Some(n) = n else { return Ok(None) };
    if !(1..=10_000).contains(&n) {
        return Err(s3_error!(InvalidArgument, "Part number must be an integer between 1 and 10000, inclusive"));
    }
    let n = n as usize;
    let count = meta.part_count as usize;
    if count == 0 || meta.part_sizes.is_empty() {
        return if n == 1 { Ok(Some(Part::Whole)) } else { Err(part_not_satisfiable()) };
    }
    if n > count {
        return Err(part_not_satisfiable());
    }
    let sizes = &meta.part_sizes;
    let (start, len) = if sizes.len() == count {
        (sizes[..n - 1].iter().sum(), sizes[n - 1])
    } else {
        // Every part but the last has the first size.
        let (each, last) = (sizes[0], sizes[sizes.len() - 1]);
        ((n as u64 - 1) * each, if n == count { last } else { each })
    };
    Ok(Some(Part::Of { start, len, count: count as i32 }))
}

fn part_not_satisfiable() -> S3Error {
    let mut e = S3Error::with_message(
        S3ErrorCode::Custom("InvalidPartNumber".into()),
        "The requested partnumber is not satisfiable",
    );
    e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
    e
}

/// What `partNumber` asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// Part 1 of an object not uploaded in parts: all of it.
    Whole,
    /// One part of a completed multipart upload, of `count`.
    Of { start: u64, len: u64, count: i32 },
}

fn content_type_of(fi: &pb::FileInfo) -> String {
    match fi.meta.as_ref().map(|m| m.content_type.as_str()) {
        Some(t) if !t.is_empty() => t.to_string(),
        _ => "binary/octet-stream".into(),
    }
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

// ------------------------------------------------------------------ preconditions and range

/// The preconditions and the range of a GET or HEAD.
#[derive(Default)]
struct Conditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
    range: Option<Range>,
}

/// The [`Conditions`] of a GetObject or HeadObject input.
macro_rules! conditions {
    ($i:expr) => {
        Conditions {
            if_match: $i.if_match.as_ref(),
            if_none_match: $i.if_none_match.as_ref(),
            if_modified_since: $i.if_modified_since.as_ref(),
            if_unmodified_since: $i.if_unmodified_since.as_ref(),
            range: $i.range,
        }
    };
}
use conditions;

/// The bytes a GET or HEAD answers with.
#[derive(Debug, PartialEq)]
struct Selected {
    start: u64,
    len: u64,
    /// `Content-Range`, when a range or a part was asked for (the answer is then a 206).
    content_range: Option<String>,
    /// `x-amz-mp-parts-count`: a part of a multipart upload was asked for.
    parts_count: Option<i32>,
}

impl Selected {
    fn all(len: u64) -> Selected {
        Selected { start: 0, len, content_range: None, parts_count: None }
    }
    fn range(start: u64, len: u64, total: u64) -> Selected {
        let content_range = Some(format!("bytes {start}-{}/{total}", start + len - 1));
        Selected { start, len, content_range, parts_count: None }
    }
}

/// Whether an `If-Match`/`If-None-Match` condition holds for an object with ETag `tag`.
pub(super) fn etag_matches(c: &ETagCondition, tag: &str) -> bool {
    match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == tag,
    }
}

fn secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// Evaluate the RFC 7232 preconditions of a GET or HEAD in the order S3 applies them
/// (`If-Match`, else `If-Unmodified-Since`: 412; `If-None-Match`, else
/// `If-Modified-Since`: 304; both answers carry the ETag), then select the range (RFC
/// 9110) or the part of the object's bytes (a directory marker has none). A range that
/// is not satisfiable is InvalidRange (416); a suffix range of an empty object selects
/// nothing, and the whole (empty) object is the answer.
fn select(fi: &pb::FileInfo, tag: &str, c: Conditions<'_>, part: Option<Part>) -> S3Result<Selected> {
    let mtime = fi.mtime_ms / 1000;
    let failed = |code| precondition_failed(code, tag, fi.mtime_ms);
    match c.if_match {
        Some(m) if !etag_matches(m, tag) => return Err(failed(S3ErrorCode::PreconditionFailed)),
        None if c.if_unmodified_since.is_some_and(|t| mtime > secs(t)) => {
            return Err(failed(S3ErrorCode::PreconditionFailed));
        }
        _ => {}
    }
    match c.if_none_match {
        Some(m) if etag_matches(m, tag) => return Err(failed(S3ErrorCode::NotModified)),
        None if c.if_modified_since.is_some_and(|t| mtime <= secs(t)) => {
            return Err(failed(S3ErrorCode::NotModified));
        }
        _ => {}
    }
    let len = if fi.is_dir { 0 } else { fi.length };
    match (c.range, part) {
        (Some(_), Some(_)) => {
            Err(s3_error!(InvalidRequest, "Cannot specify both Range header and partNumber query parameter"))
        }
        (None, Some(Part::Whole)) if len > 0 => Ok(Selected::range(0, len, len)),
        (None, Some(Part::Of { start, len: part_len, count })) => {
            if part_len == 0 || start + part_len > len {
                return Ok(Selected { parts_count: Some(count), ..Selected::all(len) });
            }
            Ok(Selected { parts_count: Some(count), ..Selected::range(start, part_len, len) })
        }
        (Some(r), None) => {
            let rg = r.check(len).map_err(|_| s3_error!(InvalidRange, "The requested range is not satisfiable"))?;
            if rg.is_empty() {
                return Ok(Selected::all(len));
            }
            Ok(Selected::range(rg.start, rg.end - rg.start, len))
        }
        _ => Ok(Selected::all(len)),
    }
}

/// A 412 or 304 answer, with the object's ETag and Last-Modified as S3 sends them.
fn precondition_failed(code: S3ErrorCode, tag: &str, mtime_ms: i64) -> S3Error {
    let not_modified = code == S3ErrorCode::NotModified;
    let mut e = match code {
        S3ErrorCode::NotModified => S3Error::new(code),
        _ => S3Error::with_message(code, "At least one of the pre-conditions you specified did not hold"),
    };
    let mut h = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(&format!("\"{tag}\"")) {
        h.insert(http::header::ETAG, v);
    }
    if let Ok(v) = http::HeaderValue::from_str(&super::http_date(&timestamp(mtime_ms))) {
        h.insert(http::header::LAST_MODIFIED, v);
    }
    if !not_modified {
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    }
    e.set_headers(h);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::S3ErrorCode;

    const TAG: &str = "0123456789abcdef0123456789abcdef";
    /// 2023-11-14T22:13:20Z, in ms.
    const MTIME_MS: i64 = 1_700_000_000_500;

    fn file(len: u64) -> pb::FileInfo {
        pb::FileInfo { length: len, mtime_ms: MTIME_MS, ..Default::default() }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from(time::OffsetDateTime::from_unix_timestamp(secs).unwrap())
    }

    fn select_whole(fi: &pb::FileInfo, tag: &str, c: Conditions<'_>) -> S3Result<Selected> {
        select(fi, tag, c, None)
    }

    fn code(r: S3Result<Selected>) -> S3ErrorCode {
        r.unwrap_err().code().clone()
    }

    fn range(s: &str) -> Conditions<'static> {
        Conditions { range: Some(Range::parse(s).unwrap()), ..Default::default() }
    }

    #[test]
    fn if_match_and_if_unmodified_since() {
        let any = ETagCondition::Any;
        let same = ETagCondition::ETag(ETag::Strong(TAG.into()));
        let other = ETagCondition::ETag(ETag::Strong("x".into()));
        let fi = file(10);
        for c in [&any, &same] {
            assert!(select_whole(&fi, TAG, Conditions { if_match: Some(c), ..Default::default() }).is_ok());
        }
        let c = Conditions { if_match: Some(&other), ..Default::default() };
        assert_eq!(code(select_whole(&fi, TAG, c)), S3ErrorCode::PreconditionFailed);

        let before = at(MTIME_MS / 1000 - 1);
        let same_second = at(MTIME_MS / 1000);
        let c = Conditions { if_unmodified_since: Some(&before), ..Default::default() };
        assert_eq!(code(select_whole(&fi, TAG, c)), S3ErrorCode::PreconditionFailed);
        let c = Conditions { if_unmodified_since: Some(&same_second), ..Default::default() };
        assert!(select_whole(&fi, TAG, c).is_ok(), "whole seconds are compared");
        // If-Match holding overrides If-Unmodified-Since.
        let c = Conditions { if_match: Some(&same), if_unmodified_since: Some(&before), ..Default::default() };
        assert!(select_whole(&fi, TAG, c).is_ok());
    }

    #[test]
    fn if_none_match_and_if_modified_since() {
        let any = ETagCondition::Any;
        let same = ETagCondition::ETag(ETag::Strong(TAG.into()));
        let other = ETagCondition::ETag(ETag::Strong("x".into()));
        let fi = file(10);
        for c in [&any, &same] {
            let c = Conditions { if_none_match: Some(c), ..Default::default() };
            assert_eq!(code(select_whole(&fi, TAG, c)), S3ErrorCode::NotModified);
        }
        assert!(select_whole(&fi, TAG, Conditions { if_none_match: Some(&other), ..Default::default() }).is_ok());

        let before = at(MTIME_MS / 1000 - 1);
        let same_second = at(MTIME_MS / 1000);
        let c = Conditions { if_modified_since: Some(&same_second), ..Default::default() };
        assert_eq!(code(select_whole(&fi, TAG, c)), S3ErrorCode::NotModified);
        assert!(select_whole(&fi, TAG, Conditions { if_modified_since: Some(&before), ..Default::default() }).is_ok());
        // If-None-Match not matching overrides If-Modified-Since.
        let c = Conditions { if_none_match: Some(&other), if_modified_since: Some(&same_second), ..Default::default() };
        assert!(select_whole(&fi, TAG, c).is_ok());
        // A failed If-Match is reported before a matching If-None-Match.
        let c = Conditions { if_match: Some(&other), if_none_match: Some(&any), ..Default::default() };
        assert_eq!(code(select_whole(&fi, TAG, c)), S3ErrorCode::PreconditionFailed);
    }

    #[test]
    fn no_range_selects_everything() {
        let all = Selected::all(10);
        assert_eq!(select_whole(&file(10), TAG, Conditions::default()).unwrap(), all);
        let dir = pb::FileInfo { is_dir: true, length: 4096, ..Default::default() };
        assert_eq!(select_whole(&dir, TAG, Conditions::default()).unwrap().len, 0, "a directory marker is empty");
    }

    #[test]
    fn satisfiable_ranges() {
        let sel = |s: &str| select_whole(&file(10), TAG, range(s)).unwrap();
        let want = |start, len, cr: &str| Selected { start, len, content_range: Some(cr.into()), parts_count: None };
        assert_eq!(sel("bytes=0-0"), want(0, 1, "bytes 0-0/10"));
        assert_eq!(sel("bytes=2-5"), want(2, 4, "bytes 2-5/10"));
        assert_eq!(sel("bytes=3-"), want(3, 7, "bytes 3-9/10"));
        assert_eq!(sel("bytes=8-100"), want(8, 2, "bytes 8-9/10"), "the last byte is clamped");
    }

    #[test]
    fn suffix_ranges() {
        let sel = |len, s: &str| select_whole(&file(len), TAG, range(s));
        let want = |start, len, cr: &str| Selected { start, len, content_range: Some(cr.into()), parts_count: None };
        assert_eq!(sel(10, "bytes=-3").unwrap(), want(7, 3, "bytes 7-9/10"));
        assert_eq!(sel(10, "bytes=-10").unwrap(), want(0, 10, "bytes 0-9/10"));
        assert_eq!(sel(10, "bytes=-50").unwrap(), want(0, 10, "bytes 0-9/10"), "longer than the object");
        assert_eq!(code(sel(10, "bytes=-0")), S3ErrorCode::InvalidRange);
        assert_eq!(sel(0, "bytes=-5").unwrap(), Selected::all(0));
    }

    #[test]
    fn unsatisfiable_ranges() {
        for (len, s) in [(10, "bytes=10-"), (10, "bytes=10-20"), (10, "bytes=50-60"), (0, "bytes=0-0"), (0, "bytes=0-")]
        {
            assert_eq!(code(select_whole(&file(len), TAG, range(s))), S3ErrorCode::InvalidRange, "{s} of {len}");
        }
        let dir = pb::FileInfo { is_dir: true, length: 4096, ..Default::default() };
        assert_eq!(code(select_whole(&dir, TAG, range("bytes=0-0"))), S3ErrorCode::InvalidRange);
    }

    #[test]
    fn preconditions_come_before_the_range() {
        let other = ETagCondition::ETag(ETag::Strong("x".into()));
        let c = Conditions { if_match: Some(&other), ..range("bytes=50-60") };
        assert_eq!(code(select_whole(&file(10), TAG, c)), S3ErrorCode::PreconditionFailed);
    }

    #[test]
    fn parts() {
        let multi = pb::ObjectMeta { part_sizes: vec![6, 4], part_count: 2, ..Default::default() };
        let sel =
            |meta: &pb::ObjectMeta, n| select(&file(10), TAG, Conditions::default(), part(meta, Some(n)).unwrap());
        let want =
            |start, len, cr: &str, count| Selected { start, len, content_range: Some(cr.into()), parts_count: count };
        assert_eq!(sel(&multi, 1).unwrap(), want(0, 6, "bytes 0-5/10", Some(2)));
        assert_eq!(sel(&multi, 2).unwrap(), want(6, 4, "bytes 6-9/10", Some(2)));
        assert!(part(&multi, Some(3)).is_err());
        // three parts of 3 and a last of 1, kept as [3, 1]
        let uniform = pb::ObjectMeta { part_sizes: vec![3, 1], part_count: 4, ..Default::default() };
        let sel10 = |n| select(&file(10), TAG, Conditions::default(), part(&uniform, Some(n)).unwrap()).unwrap();
        assert_eq!(sel10(1), want(0, 3, "bytes 0-2/10", Some(4)));
        assert_eq!(sel10(3), want(6, 3, "bytes 6-8/10", Some(4)));
        assert_eq!(sel10(4), want(9, 1, "bytes 9-9/10", Some(4)));
        assert!(part(&uniform, Some(5)).is_err());
        let single = pb::ObjectMeta::default();
        assert_eq!(sel(&single, 1).unwrap(), want(0, 10, "bytes 0-9/10", None), "part 1 is the whole object");
        let e = part(&single, Some(2)).unwrap_err();
        assert_eq!(e.status_code(), Some(http::StatusCode::RANGE_NOT_SATISFIABLE));
        assert!(part(&single, Some(0)).is_err());
        let both = select(&file(10), TAG, range("bytes=0-1"), Some(Part::Whole));
        assert_eq!(code(both), S3ErrorCode::InvalidRequest);
    }
}
