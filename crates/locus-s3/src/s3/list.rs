//! Object listings in S3 key order, page by page: ListObjects (V1 and V2) and the
//! walk under them.
//!
//! The namespace is a tree and S3 keys are flat strings, so a listing is a depth-first
//! walk that yields keys in byte order. Two details make that order differ from the
//! directory order the master returns:
//! - a directory `a` sorts as `a/`, so a sibling such as `a.txt` (`.` < `/`) comes
//!   before everything under `a/`: each level holds directories back until the next
//!   name sorts after them;
//! - a listing resumes from a key (continuation token, marker, start-after): the walk
//!   seeks down that key's path instead of re-reading everything before it.
//!
//! Memory stays bounded by one page of the master's listing per directory level.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use locus_client::Client;
use locus_common::path as lpath;
use locus_common::{ErrorKind, Result};
use locus_proto::pb;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Result, s3_error};

use super::search::{search_page, search_param};
use super::{LocusS3, R, etag, etag_of, ok, owner, timestamp};
use crate::{UPLOADS_DIR, s3_error};

/// Entries fetched from the master per call.
const PAGE: u32 = 1000;

/// One listed entry.
#[derive(Debug)]
pub(crate) enum Entry {
    /// An object (a directory here is an empty directory: a `dir/` marker object).
    Object { key: String, fi: Box<pb::FileInfo> },
    /// A common prefix, ending with the delimiter.
    Prefix(String),
}

impl Entry {
    pub(crate) fn key(&self) -> &str {
        match self {
            Entry::Object { key, .. } => key,
            Entry::Prefix(p) => p,
        }
    }
}

/// What to list.
pub(crate) struct ListRequest<'a> {
    pub bucket: &'a str,
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// List keys after this one (the continuation token, marker or start-after).
    pub after: &'a str,
    pub max_keys: usize,
    /// Directory entries count as common prefixes or as `dir/` marker objects;
    /// the `.locus-uploads` directory at the bucket root never appears.
    pub skip_hidden: bool,
}

struct Held(String, pb::FileInfo);
impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.cmp(&o.0)
    }
}

enum Next {
    File(pb::FileInfo),
    Dir(pb::FileInfo),
}

/// One directory level of the walk.
struct Cursor {
    path: String,
    /// Key of this directory's children: "" at the bucket root, else `a/b/`.
    key_prefix: String,
    page: VecDeque<pb::FileInfo>,
    after: String,
    inclusive: bool,
    more: bool,
    /// Directories waiting for their place in key order (sorting as `name/`).
    held: BinaryHeap<Reverse<Held>>,
    /// This directory, which lists as a `dir/` object (first) if it is flagged as one
    /// (it has object metadata).
    dir: Option<pb::FileInfo>,
    root: bool,
}

fn sort_key(fi: &pb::FileInfo) -> String {
    if fi.is_dir { format!("{}/", fi.name) } else { fi.name.clone() }
}

impl Cursor {
    fn new(path: String, key_prefix: String, after: &str, inclusive: bool, dir: Option<pb::FileInfo>) -> Cursor {
        Cursor {
            root: key_prefix.is_empty(),
            path,
            key_prefix,
            page: VecDeque::new(),
            after: after.to_string(),
            inclusive,
            more: true,
            held: BinaryHeap::new(),
            dir,
        }
    }

    async fn next(&mut self, c: &Client) -> Result<Option<Next>> {
        loop {
            if self.page.is_empty() && self.more {
                let (page, more) = match c.list_page(&self.path, &self.after, self.inclusive, PAGE).await {
                    // Deleted since its parent was listed (its last object went): empty.
                    Err(e) if e.kind() == ErrorKind::NotFound && !self.root => (Vec::new(), false),
                    r => r?,
                };
                self.more = more && !page.is_empty();
                if let Some(l) = page.last() {
                    self.after = l.name.clone();
                    self.inclusive = false;
                }
                self.page = page.into();
            }
            let Some(k) = self.page.front().map(sort_key) else {
                return Ok(self.held.pop().map(|Reverse(h)| Next::Dir(h.1)));
            };
            if self.held.peek().is_some_and(|Reverse(h)| h.0 < k) {
                return Ok(self.held.pop().map(|Reverse(h)| Next::Dir(h.1)));
            }
            let Some(e) = self.page.pop_front() else { continue };
            if e.is_dir {
                self.held.push(Reverse(Held(k, e)));
            } else {
                return Ok(Some(Next::File(e)));
            }
        }
    }

    /// Directories named by a proper prefix of `name` followed by a byte below `/`: they
    /// sort after `name` (as `prefix/`) although their names sort before it.
    async fn hold_prefix_dirs(&mut self, c: &Client, name: &str) -> Result<()> {
        for (i, b) in name.bytes().enumerate() {
            if i > 0
                && b < b'/'
                && name.is_char_boundary(i)
                && let Some(fi) = dir_status(c, &lpath::join(&self.path, &name[..i])).await?
            {
                self.held.push(Reverse(Held(format!("{}/", fi.name), fi)));
            }
        }
        Ok(())
    }
}

/// The status of `path` if it is a directory.
async fn dir_status(c: &Client, path: &str) -> Result<Option<pb::FileInfo>> {
    match c.status(path, false).await {
        Ok(fi) if fi.is_dir => Ok(Some(fi)),
        Ok(_) => Ok(None),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidArgument) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Locus path of a key prefix that ends at a directory boundary (`a/b/` → `/bucket/a/b`);
/// `None` when no such directory can exist.
fn dir_path(bucket: &str, dir_key: &str) -> Option<String> {
    // (No key begins with `/` or holds `//`: such a prefix names nothing.)
    lpath::normalize(&format!("/{bucket}/{dir_key}")).ok().filter(|_| {
        !dir_key.split('/').any(|c| c == UPLOADS_DIR) && !dir_key.starts_with('/') && !dir_key.contains("//")
    })
}

/// Where a page resumes: after `req.after`, and when that is a common prefix (it holds
/// the delimiter past the prefix), after the whole group it stands for.
fn resume_point(req: &ListRequest<'_>) -> (String, Option<String>) {
    let mut after = req.after.to_string();
    let mut skip_group = None;
    if let Some(d) = req.delimiter.filter(|d| !d.is_empty())
        && let Some(i) = after.strip_prefix(req.prefix).and_then(|r| r.find(d))
    {
        after.truncate(req.prefix.len() + i + d.len());
        skip_group = Some(after.clone());
    }
    (after, skip_group)
}

/// The cursors of a walk that resumes after key `dkey` + `rest`, from directory `dpath`
/// (key `dkey`) down the path of `rest`: one per directory on it, the deepest last
/// (with a `/` delimiter, only the first: the walk does not descend).
async fn seek(c: &Client, dpath: String, dkey: &str, rest: &str, slash: bool) -> Result<Vec<Cursor>> {
    let comps: Vec<&str> = rest.split('/').collect();
    let (mut path, mut key_prefix) = (dpath, dkey.to_string());
    let mut dir = None;
    let mut stack = Vec::new();
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let mut cur = Cursor::new(path.clone(), key_prefix.clone(), comp, last, dir.take());
        cur.hold_prefix_dirs(c, comp).await?;
        stack.push(cur);
        if last || slash {
            break;
        }
        let child = lpath::join(&path, comp);
        match dir_status(c, &child).await? {
            Some(fi) => {
                dir = Some(fi);
                path = child;
                key_prefix = format!("{key_prefix}{comp}/");
            }
            None => break,
        }
    }
    Ok(stack)
}

/// One page of a listing: up to `max_keys` entries after `req.after`, and whether more
/// follow.
pub(crate) async fn list(c: &Client, req: &ListRequest<'_>) -> Result<(Vec<Entry>, bool)> {
    if req.max_keys == 0 {
        return Ok((Vec::new(), false));
    }
    let prefix = req.prefix;
    let slash = req.delimiter == Some("/");
    // The deepest directory the prefix names, and the rest of the prefix inside it.
    let (dkey, rem) = match prefix.rfind('/') {
        Some(i) => (&prefix[..=i], &prefix[i + 1..]),
        None => ("", prefix),
    };
    let Some(dpath) = dir_path(req.bucket, dkey) else {
        return Ok((Vec::new(), false));
    };
    let Some(dfi) = dir_status(c, &dpath).await? else {
        return Ok((Vec::new(), false));
    };
    let (after, skip_group) = resume_point(req);
    let mut stack = if after.as_str() < prefix {
        let marker = (rem.is_empty() && !dkey.is_empty()).then_some(dfi);
        vec![Cursor::new(dpath, dkey.to_string(), rem, true, marker)]
    } else if let Some(rest) = after.strip_prefix(dkey) {
        seek(c, dpath, dkey, rest, slash).await?
    } else {
        Vec::new()
    };
    let mut out: Vec<Entry> = Vec::new();
    let mut last_group: Option<String> = None;
    while out.len() <= req.max_keys {
        let Some(top) = stack.last_mut() else { break };
        let explicit = top.dir.as_ref().is_some_and(|d| d.meta.is_some());
        let next = if explicit { None } else { top.next(c).await? };
        let (key, fi, descend) = match (next, explicit.then(|| top.dir.take()).flatten()) {
            (None, Some(dir)) => (top.key_prefix.clone(), dir, false),
            (Some(Next::File(fi)), _) => (format!("{}{}", top.key_prefix, fi.name), fi, false),
            (Some(Next::Dir(fi)), _) => {
                if req.skip_hidden && top.root && fi.name == UPLOADS_DIR {
                    continue;
                }
                (format!("{}{}/", top.key_prefix, fi.name), fi, !slash)
            }
            // An empty directory that is not flagged (made by a mkdir, or left by
            // deletes): a marker Locus keeps for it in the UFS, not an object.
            (None, None) => {
                stack.pop();
                continue;
            }
        };
        if !key.starts_with(prefix) && !prefix.starts_with(key.as_str()) {
            if key.as_str() > prefix {
                break; // every later key sorts after the prefix too
            }
            continue;
        }
        if descend {
            let Some(parent) = stack.last() else { break };
            let path = lpath::join(&parent.path, &fi.name);
            stack.push(Cursor::new(path, key, "", false, Some(fi)));
            continue;
        }
        if key.as_str() <= after.as_str() || skip_group.as_deref().is_some_and(|g| key.starts_with(g)) {
            continue;
        }
        if !key.starts_with(prefix) {
            continue;
        }
        if let Some(d) = req.delimiter.filter(|d| !d.is_empty())
            && let Some(i) = key[prefix.len()..].find(d)
        {
            let group = key[..prefix.len() + i + d.len()].to_string();
            if last_group.as_deref() != Some(group.as_str()) {
                last_group = Some(group.clone());
                out.push(Entry::Prefix(group));
            }
            continue;
        }
        out.push(Entry::Object { key, fi: Box::new(fi) });
    }
    let truncated = out.len() > req.max_keys;
    out.truncate(req.max_keys);
    Ok((out, truncated))
}

// ------------------------------------------------------------------ ListObjects

pub(super) async fn list_objects_v2(gw: &LocusS3, req: S3Request<ListObjectsV2Input>) -> R<ListObjectsV2Output> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let max = max_keys(i.max_keys)?;
    let after = match &i.continuation_token {
        Some(t) => decode_token(t)?,
        None => i.start_after.clone().unwrap_or_default(),
    };
    let prefix = i.prefix.clone().unwrap_or_default();
    let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
    let owner = i.fetch_owner.unwrap_or(false).then(|| owner(&gw.cfg));
    let enc = Encoding::of(i.encoding_type.as_ref())?;
    let search = search_param(&req.uri);
    let page = list_page(gw, &i.bucket, search.as_deref(), &prefix, delimiter.as_deref(), &after, max).await?;
    let next = page.last.as_deref().map(encode_token);
    let (objects, prefixes) = split_entries(page.entries, owner, enc);
    ok(ListObjectsV2Output {
        name: Some(i.bucket),
        prefix: Some(enc.apply(&prefix)),
        delimiter: delimiter.map(|d| enc.apply(&d)),
        encoding_type: i.encoding_type,
        max_keys: Some(max as i32),
        key_count: Some((objects.len() + prefixes.len()) as i32),
        is_truncated: Some(page.truncated),
        continuation_token: i.continuation_token,
        next_continuation_token: next,
        start_after: i.start_after.map(|s| enc.apply(&s)),
        contents: Some(objects),
        common_prefixes: Some(prefixes),
        ..Default::default()
    })
}

pub(super) async fn list_objects(gw: &LocusS3, req: S3Request<ListObjectsInput>) -> R<ListObjectsOutput> {
    let i = req.input;
    gw.bucket(&i.bucket).await?;
    let max = max_keys(i.max_keys)?;
    let marker = i.marker.clone().unwrap_or_default();
    let prefix = i.prefix.clone().unwrap_or_default();
    let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
    let enc = Encoding::of(i.encoding_type.as_ref())?;
    let search = search_param(&req.uri);
    let page = list_page(gw, &i.bucket, search.as_deref(), &prefix, delimiter.as_deref(), &marker, max).await?;
    // S3 sends NextMarker only with a delimiter (without one, the last key is the marker);
    // a search page may stop short of its last match (a scan's budget), so it always does.
    let next_marker = page.last.filter(|_| delimiter.is_some() || search.is_some()).map(|k| enc.apply(&k));
    let (objects, prefixes) = split_entries(page.entries, Some(owner(&gw.cfg)), enc);
    ok(ListObjectsOutput {
        name: Some(i.bucket),
        prefix: Some(enc.apply(&prefix)),
        delimiter: delimiter.map(|d| enc.apply(&d)),
        encoding_type: i.encoding_type,
        marker: Some(enc.apply(&marker)),
        max_keys: Some(max as i32),
        is_truncated: Some(page.truncated),
        next_marker,
        contents: Some(objects),
        common_prefixes: Some(prefixes),
        ..Default::default()
    })
}

/// One page of a bucket listing: the entries, whether more follow, and the last key
/// listed when they do.
pub(super) struct Page {
    pub(super) entries: Vec<Entry>,
    pub(super) truncated: bool,
    pub(super) last: Option<String>,
}

/// How a listing's keys are sent back: as they are, or URL-encoded (`encoding-type=url`).
#[derive(Clone, Copy)]
pub(super) struct Encoding {
    url: bool,
}

impl Encoding {
    /// The encoding a listing asked for (`url`, the only one S3 knows, or none).
    pub(super) fn of(t: Option<&EncodingType>) -> S3Result<Encoding> {
        match t.map(|t| t.as_str()) {
            None | Some("") => Ok(Encoding { url: false }),
            Some(t) if t.eq_ignore_ascii_case(EncodingType::URL) => Ok(Encoding { url: true }),
            Some(_) => Err(s3_error!(InvalidArgument, "Invalid Encoding Method specified in Request")),
        }
    }

    /// `s` as sent: with `encoding-type=url`, every byte but unreserved ones and `/`
    /// percent-encoded, a space as `+` (as S3 does; clients decode with `unquote_plus`).
    pub(super) fn apply(self, s: &str) -> String {
        if !self.url {
            return s.to_string();
        }
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    }
}

/// One page of a bucket listing as ListObjects (V1, V2) and ListObjectVersions answer it:
/// the keys that match `search` (a `?search=` clause) when one is given, else all.
#[allow(clippy::too_many_arguments)]
pub(super) async fn list_page(
    gw: &LocusS3,
    bucket: &str,
    search: Option<&str>,
    prefix: &str,
    delimiter: Option<&str>,
    after: &str,
    max_keys: usize,
) -> S3Result<Page> {
    if let Some(q) = search {
        return search_page(gw, bucket, q, prefix, delimiter, after, max_keys).await;
    }
    let lr = ListRequest { bucket, prefix, delimiter, after, max_keys, skip_hidden: true };
    let (entries, truncated) = list(&gw.client, &lr).await.map_err(|e| s3_error(e, S3ErrorCode::NoSuchBucket))?;
    let last = truncated.then(|| entries.last().map(|e| e.key().to_string())).flatten();
    Ok(Page { entries, truncated, last })
}

fn encode_token(key: &str) -> String {
    B64URL.encode(key)
}

fn decode_token(t: &str) -> S3Result<String> {
    B64URL
        .decode(t)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not valid"))
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn split_entries(entries: Vec<Entry>, owner: Option<Owner>, enc: Encoding) -> (Vec<Object>, Vec<CommonPrefix>) {
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    for e in entries {
        match e {
            Entry::Object { key, fi } => objects.push(Object {
                e_tag: Some(etag(&etag_of(&fi))),
                key: Some(enc.apply(&key)),
                last_modified: Some(timestamp(fi.mtime_ms)),
                owner: owner.clone(),
                size: Some(if fi.is_dir { 0 } else { fi.length as i64 }),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                ..Default::default()
            }),
            Entry::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(enc.apply(&p)) }),
        }
    }
    (objects, prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_follows_s3() {
        let url = Encoding { url: true };
        assert_eq!(url.apply("a b/c+d%e&f=ü~_.-"), "a+b/c%2Bd%25e%26f%3D%C3%BC~_.-");
        assert_eq!(Encoding { url: false }.apply("a b+"), "a b+");
    }

    #[test]
    fn continuation_tokens_round_trip() {
        let k = "dir/ünï code+key=1";
        assert_eq!(decode_token(&encode_token(k)).unwrap(), k);
        assert!(decode_token("!!!").is_err());
    }
}
