//! Metadata search on the bucket listing: `GET /BUCKET?search=WHERE` (Zenko's
//! extension). The answer is an ordinary ListBucketResult (V1 or V2) of the matching
//! keys in key order; `prefix`, `delimiter`, `max-keys`, the marker and the
//! continuation token work as in a plain listing. The master evaluates the clause over
//! its catalog; a clause it cannot parse is `InvalidArgument` with its message.

use locus_proto::pb;
use s3s::{S3ErrorCode, S3Result};

use super::LocusS3;
use super::list::{Entry, Page};
use crate::s3_error;

/// The `search` query parameter of a request, if any.
pub(super) fn search_param(uri: &http::Uri) -> Option<String> {
    let q = uri.query()?;
    form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "search").map(|(_, v)| v.into_owned())
}

/// One page of the keys of `bucket` that match `clause`.
pub(super) async fn search_page(
    gw: &LocusS3,
    bucket: &str,
    clause: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: &str,
    max_keys: usize,
) -> S3Result<Page> {
    if clause.trim().is_empty() {
        return Err(s3s::s3_error!(InvalidArgument, "the search is empty: give a clause such as search=key%3Dname"));
    }
    if max_keys == 0 {
        return Ok(Page { entries: Vec::new(), truncated: false, last: None });
    }
    let req = pb::SearchRequest {
        path: super::bucket_path(bucket),
        r#where: clause.to_string(),
        prefix: prefix.to_string(),
        after: after.to_string(),
        limit: max_keys as u32,
        delimiter: delimiter.unwrap_or_default().to_string(),
        count_only: false,
        listing: true,
    };
    let r = gw.client.search(req).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
    // Objects and common prefixes, merged back into key order.
    let mut entries: Vec<Entry> = r
        .hits
        .into_iter()
        .filter_map(|h| h.info.map(|fi| Entry::Object { key: h.key, fi: Box::new(fi) }))
        .chain(r.prefixes.into_iter().map(Entry::Prefix))
        .collect();
    entries.sort_by(|a, b| a.key().cmp(b.key()));
    let last = r.truncated.then_some(r.next_after);
    Ok(Page { entries, truncated: r.truncated, last })
}
