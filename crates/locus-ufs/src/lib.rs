//! Under file systems: a mount URI plus options becomes an Apache OpenDAL operator
//! (`file://` and `s3://` today) with timeout and retry layers, and the few operations
//! Locus needs: stat with a fingerprint, paged listing, ranged reads and streaming writes.
//!
//! Paths given to a [`Ufs`] are relative to the mount's root and have already been
//! validated by `locus_common::path` (no `.` or `..`), so nothing outside the root can
//! be named. This crate depends only on `locus-common`; it knows nothing of blocks,
//! workers or the namespace.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use locus_common::{Error, ErrorKind, Result};
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{EntryMode, Operator};

mod markers;
mod names;
pub use names::NameRules;

/// Status of one UFS object or directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UfsStatus {
    /// Name relative to the listed directory (listing) or the mount root (stat).
    pub path: String,
    pub is_dir: bool,
    pub length: u64,
    pub etag: String,
    pub mtime_ms: i64,
}

impl UfsStatus {
    /// Size plus etag, or size plus mtime when the store has no etag.
    pub fn fingerprint(&self) -> String {
        if self.is_dir { String::new() } else { fingerprint(self.length, &self.etag, self.mtime_ms) }
    }
}

/// An object's fingerprint: size plus etag, or size plus mtime when the store has no
/// etag. A cached copy is only served while its object's fingerprint holds.
pub fn fingerprint(length: u64, etag: &str, mtime_ms: i64) -> String {
    if etag.is_empty() { format!("{length}:m{mtime_ms}") } else { format!("{length}:{}", etag.trim_matches('"')) }
}

/// One mounted under file system.
#[derive(Clone, Debug)]
pub struct Ufs {
    op: Operator,
    uri: String,
    names: NameRules,
    /// A `file://` mount's root and the mode its files get once written (`file_mode`).
    file_mode: Option<(std::path::PathBuf, u32)>,
    /// Directories known to have no marker object (see `markers.rs`).
    unmarked: markers::Unmarked,
}

/// Options understood for `file://` mounts: `file_mode`, the octal mode of the files
/// Locus writes there (default [`DEFAULT_FILE_MODE`]: other local users read nothing).
pub const FILE_OPTIONS: &[&str] = &["file_mode"];
/// The mode of files written to a `file://` mount unless its `file_mode` says otherwise.
pub const DEFAULT_FILE_MODE: u32 = 0o600;

/// Refuse a mount whose store would expose Locus itself to its clients: a `file://` root
/// that holds any of `protected` (the cluster secret, the metadata, a worker's data), or
/// an `s3://` endpoint on a link-local address (a cloud's instance metadata service,
/// whose answers carry the host's own credentials). Mounts are made by clients, so this
/// is what keeps a client token from reading the cluster's secret through a mount.
pub fn check_mount_target(
    uri: &str,
    options: &BTreeMap<String, String>,
    protected: &[std::path::PathBuf],
) -> Result<()> {
    if let Some(dir) = uri.strip_prefix("file://") {
        let root = std::fs::canonicalize(dir).unwrap_or_else(|_| std::path::PathBuf::from(dir));
        for p in protected {
            let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            if p.starts_with(&root) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{uri} holds Locus's own files ({}): mount a directory that does not contain them",
                        p.display()
                    ),
                ));
            }
        }
    }
    if let Some(ep) = options.get("endpoint") {
        let host = ep.split("://").nth(1).unwrap_or(ep).split('/').next().unwrap_or_default();
        let host = match host.rsplit_once(':') {
            Some((h, port)) if port.parse::<u16>().is_ok() && !h.ends_with(':') => h,
            _ => host,
        };
        let link_local = match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(a)) => a.is_link_local(),
            Ok(std::net::IpAddr::V6(a)) => {
                (a.segments()[0] & 0xffc0) == 0xfe80 || a.segments()[..2] == [0xfd00, 0x0ec2]
            }
            Err(_) => host.eq_ignore_ascii_case("metadata.google.internal"),
        };
        if link_local {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("endpoint {ep} is a link-local address (an instance metadata service): not a UFS"),
            ));
        }
    }
    Ok(())
}

/// A `file_mode` option's value: octal, as chmod takes it, at most 0777.
fn parse_file_mode(v: &str) -> Result<u32> {
    match u32::from_str_radix(v.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 && !v.is_empty() => Ok(m),
        _ => Err(Error::invalid(format!("file_mode {v:?} is not an octal mode such as 0600 or 0640"))),
    }
}

/// Options understood for `s3://` mounts (others are rejected).
pub const S3_OPTIONS: &[&str] = &["endpoint", "region", "access_key_id", "secret_access_key", "session_token"];

fn ufs_err(ctx: impl std::fmt::Display, e: opendal::Error) -> Error {
    let kind = match e.kind() {
        opendal::ErrorKind::NotFound => ErrorKind::NotFound,
        opendal::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        opendal::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
        opendal::ErrorKind::IsADirectory => ErrorKind::IsADirectory,
        opendal::ErrorKind::NotADirectory => ErrorKind::NotADirectory,
        opendal::ErrorKind::ConfigInvalid | opendal::ErrorKind::Unsupported => ErrorKind::InvalidArgument,
        opendal::ErrorKind::RateLimited => ErrorKind::Unavailable,
        // OpenDAL's `fs` reports most OS errors as temporary `Unexpected` ones; those that
        // no retry can mend are told apart here, so the persist queue gives them up.
        _ if os_error(&e) == Some(libc::ENAMETOOLONG) => ErrorKind::NameTooLong,
        _ if os_error(&e) == Some(libc::EISDIR) => ErrorKind::IsADirectory,
        _ if os_error(&e) == Some(libc::ENOTDIR) => ErrorKind::NotADirectory,
        _ if os_error(&e).is_some_and(|c| [libc::ENOTEMPTY, libc::EEXIST].contains(&c)) => {
            ErrorKind::FailedPrecondition
        }
        _ if e.is_temporary() => ErrorKind::Unavailable,
        _ => ErrorKind::Ufs,
    };
    let retryable = e.is_temporary()
        && !matches!(
            kind,
            ErrorKind::NameTooLong | ErrorKind::FailedPrecondition | ErrorKind::IsADirectory | ErrorKind::NotADirectory
        );
    // The OpenDAL error stays the source: its kind, status and context remain reachable
    // (`std::error::Error::source`), and `Display` still reads "ctx: error".
    Error::new(kind, ctx.to_string()).with_source(e).set_retryable(retryable)
}

/// A delete that finds its path gone has done its work. OpenDAL's `fs` service looks at
/// the path, then removes it (`remove_file`, `remove_dir`, `remove_dir_all`), and answers
/// NotFound when another delete of the same path removed it in between: two deletes of
/// one key at once (S3 clients racing) are both made in the UFS at once. Passed on, that
/// NotFound became the delete's own answer, without its namespace change, and the S3
/// gateway (a key already gone is a delete done) acknowledged a DELETE whose key was still
/// there until the other delete committed: a GET right after it returned the object.
fn gone_is_deleted(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The OS error under an OpenDAL error, if one is its source (a local file system's).
fn os_error(e: &opendal::Error) -> Option<i32> {
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        src = s.source();
    }
    None
}

impl Ufs {
    /// Build a UFS for `uri` (`file:///dir` or `s3://bucket[/prefix]`) with `options`.
    /// Does no I/O; call [`Ufs::check`] to verify that the store is reachable.
    pub fn new(uri: &str, options: &BTreeMap<String, String>, timeout: Duration) -> Result<Ufs> {
        // Installs the process-wide HTTP transport (reqwest) once; later calls do nothing.
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(opendal::install_default);
        let names;
        let mut file_mode = None;
        let op = if let Some(dir) = uri.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(Error::invalid(format!("file:// mounts need an absolute directory: {uri}")));
            }
            if let Some(k) = options.keys().find(|k| !FILE_OPTIONS.contains(&k.as_str())) {
                return Err(Error::invalid(format!(
                    "unknown option {k:?} for a file:// mount (known: {})",
                    FILE_OPTIONS.join(", ")
                )));
            }
            let mode = options.get("file_mode").map(|v| parse_file_mode(v)).transpose()?.unwrap_or(DEFAULT_FILE_MODE);
            file_mode = Some((std::path::PathBuf::from(dir), mode));
            // OpenDAL's fs service would create a missing root; a mount must not.
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(Error::invalid(format!("{dir} is not a directory"))),
                Err(e) => return Err(Error::io(format!("cannot use {uri}"), e)),
            }
            let mut b = opendal::services::Fs::default().root(dir);
            // Writes go to a temporary file renamed into place on close, so an aborted
            // or failed write never tears the object it replaces. Read-only roots skip it.
            let tmp = std::path::Path::new(dir).join(locus_common::path::UFS_TEMP_DIR);
            // 0700: a write in progress (made under the umask) is this user's only.
            let atomic = {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&tmp).is_ok()
            };
            if atomic {
                b = b.atomic_write_dir(&tmp.to_string_lossy());
            }
            names = NameRules::file(dir, atomic);
            Operator::new(b).map_err(|e| ufs_err("file mount", e))?
        } else if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::invalid(format!("s3 mount needs a bucket: {uri}")));
            }
            if prefix.split('/').any(|c| c == ".." || c == ".") {
                return Err(Error::invalid(format!("mount prefix must not contain '.' or '..': {uri}")));
            }
            for k in options.keys() {
                if !S3_OPTIONS.contains(&k.as_str()) {
                    return Err(Error::invalid(format!(
                        "unknown option {k:?} for an s3:// mount (known: {})",
                        S3_OPTIONS.join(", ")
                    )));
                }
            }
            names = NameRules::s3(prefix);
            let mut b = opendal::services::S3::default()
                .bucket(bucket)
                .root(&format!("/{prefix}"))
                .region(options.get("region").map(String::as_str).unwrap_or("us-east-1"))
                .disable_config_load()
                .disable_ec2_metadata();
            if let Some(v) = options.get("endpoint") {
                b = b.endpoint(v);
            }
            if let Some(v) = options.get("access_key_id") {
                b = b.access_key_id(v);
            }
            if let Some(v) = options.get("secret_access_key") {
                b = b.secret_access_key(v);
            }
            if let Some(v) = options.get("session_token") {
                b = b.session_token(v);
            }
            if !options.contains_key("access_key_id") {
                b = b.skip_signature();
            }
            Operator::new(b).map_err(|e| ufs_err("s3 mount", e))?
        } else {
            return Err(Error::invalid(format!("unsupported UFS URI {uri:?}: use file:///dir or s3://bucket/prefix")));
        };
        let op = op
            .layer(TimeoutLayer::new().with_timeout(timeout).with_io_timeout(timeout))
            .layer(RetryLayer::new().with_max_times(3).with_min_delay(Duration::from_millis(100)));
        Ok(Ufs { op, uri: uri.to_string(), names, file_mode, unmarked: Default::default() })
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Whether this UFS can hold `rel` (a path relative to the mount's root) faithfully,
    /// as a directory or as a file: refused with `NameTooLong` (a component or key past
    /// the store's limit) or `InvalidArgument` (a name the store, or OpenDAL on its way
    /// there, would change). See [`NameRules`].
    pub fn check_name(&self, rel: &str, is_dir: bool) -> Result<()> {
        self.names.check(rel, is_dir)
    }

    /// Verify that the store answers and the root exists (a missing bucket fails here).
    pub async fn check(&self) -> Result<()> {
        let mut l = self.op.lister_with("/").await.map_err(|e| ufs_err(format!("cannot reach {}", self.uri), e))?;
        // One page proves the bucket or directory exists and the credentials work.
        if let Some(r) = l.next().await {
            r.map_err(|e| ufs_err(format!("cannot list {}", self.uri), e))?;
        }
        Ok(())
    }

    fn dir_path(path: &str) -> String {
        if path.is_empty() { "/".into() } else { format!("{}/", path.trim_end_matches('/')) }
    }

    /// Status of `path` (relative to the root; `""` is the root). `None` when absent.
    pub async fn stat(&self, path: &str) -> Result<Option<UfsStatus>> {
        // A name the store cannot hold is not there (OpenDAL would look up another: "x "
        // as "x").
        if self.names.check(path, false).is_err() && self.names.check(path, true).is_err() {
            return Ok(None);
        }
        if !path.is_empty() {
            match self.op.stat(path).await {
                Ok(m) if m.mode() == EntryMode::FILE => {
                    return Ok(Some(UfsStatus {
                        path: path.into(),
                        is_dir: false,
                        length: m.content_length(),
                        etag: m.etag().unwrap_or_default().trim_matches('"').to_string(),
                        mtime_ms: m.last_modified().map(|t| t.into_inner().as_millisecond()).unwrap_or(0),
                    }));
                }
                Ok(_) => {}
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
                Err(e) => return Err(ufs_err(format!("stat {path}"), e)),
            }
        }
        match self.op.stat(&Self::dir_path(path)).await {
            Ok(_) => {
                Ok(Some(UfsStatus { path: path.into(), is_dir: true, length: 0, etag: String::new(), mtime_ms: 0 }))
            }
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ufs_err(format!("stat {path}/"), e)),
        }
    }

    /// Stream the direct children of directory `path`. Entries arrive page by page;
    /// the listing is never held whole in memory.
    pub async fn list(&self, path: &str) -> Result<impl Stream<Item = Result<UfsStatus>> + Send + use<>> {
        let dir = Self::dir_path(path);
        let lister = self.op.lister_with(&dir).await.map_err(|e| ufs_err(format!("list {dir}"), e))?;
        let dir2 = dir.clone();
        Ok(lister.map_err(move |e| ufs_err(format!("list {dir2}"), e)).try_filter_map(move |entry| {
            let dir = dir.clone();
            async move {
                let full = entry.path();
                let rel = full.trim_start_matches('/');
                let dir_rel = dir.trim_start_matches('/');
                let name = rel.strip_prefix(dir_rel).unwrap_or(rel).trim_end_matches('/');
                if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                    return Ok(None); // the directory itself, or a name Locus cannot address
                }
                if name.ends_with(char::is_whitespace) || (dir_rel.is_empty() && name.starts_with(char::is_whitespace))
                {
                    return Ok(None); // OpenDAL would reach another name for it ("x " is read as "x")
                }
                let m = entry.metadata();
                let is_dir = m.mode() == EntryMode::DIR;
                Ok(Some(UfsStatus {
                    path: name.to_string(),
                    is_dir,
                    length: if is_dir { 0 } else { m.content_length() },
                    etag: m.etag().unwrap_or_default().trim_matches('"').to_string(),
                    mtime_ms: m.last_modified().map(|t| t.into_inner().as_millisecond()).unwrap_or(0),
                }))
            }
        }))
    }

    /// Stream bytes `[offset, offset+len)` of `path`, fetching `concurrency` chunks of
    /// `chunk` bytes at once.
    pub async fn read_range(
        &self,
        path: &str,
        offset: u64,
        len: u64,
        chunk: usize,
        concurrency: usize,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + use<>> {
        let r = self
            .op
            .reader_with(path)
            .chunk(chunk)
            .concurrent(concurrency)
            .await
            .map_err(|e| ufs_err(format!("open {path}"), e))?;
        let p = path.to_string();
        let s = r.into_bytes_stream(offset..offset + len).await.map_err(|e| ufs_err(format!("read {path}"), e))?;
        Ok(s.map_err(move |e| Error::io(format!("read {p}"), e).set_retryable(true)))
    }

    /// Whether objects carry user metadata here (S3 yes, a local directory no).
    pub fn stores_metadata(&self) -> bool {
        self.op.info().capability().write_with_user_metadata
    }

    /// Open a streaming writer for `path` (multipart on S3 for large objects). The
    /// content type and user metadata are stored with the object where the store keeps
    /// them (S3), and dropped where it cannot (a local directory).
    pub async fn writer(
        &self,
        path: &str,
        content_type: &str,
        user_metadata: &std::collections::HashMap<String, String>,
    ) -> Result<UfsWriter> {
        let cap = self.op.info().capability();
        let mut wb = self.op.writer_with(path).chunk(16 << 20).concurrent(4);
        if !content_type.is_empty() && cap.write_with_content_type {
            wb = wb.content_type(content_type);
        }
        if !user_metadata.is_empty() && cap.write_with_user_metadata {
            wb = wb.user_metadata(user_metadata.clone());
        }
        let w = wb.await.map_err(|e| ufs_err(format!("create {path}"), e))?;
        Ok(UfsWriter { w, path: path.into(), ufs: self.clone() })
    }

    /// Write a whole object in one request (one PutObject on S3).
    pub async fn put(&self, path: &str, data: Bytes) -> Result<()> {
        self.op.write(path, data).await.map(|_| ()).map_err(|e| ufs_err(format!("put {path}"), e))?;
        self.apply_file_mode(path).await
    }

    /// Give a file just written to a `file://` mount its mode (`file_mode`). It was made
    /// under the process's umask inside the mount's root; the root's own mode keeps
    /// others out meanwhile (`local start` makes it 0700). A file system that refuses
    /// modes (vfat, some network mounts) keeps the file as written: logged, and the
    /// write stands (its bytes are safe; only their mode is not what was asked).
    async fn apply_file_mode(&self, path: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let Some((root, mode)) = &self.file_mode else { return Ok(()) };
        let p = root.join(path.trim_start_matches('/'));
        if let Err(e) = tokio::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).await {
            tracing::warn!(path = %p.display(), mode = format!("{mode:o}"), error = %e, "cannot set a persisted file's mode");
        }
        Ok(())
    }

    /// Delete a file or (recursively) a directory. On an object store, a parent left with
    /// nothing in it gets a marker, so that it stays (see `markers.rs`). A path that is
    /// not there, or goes while it is deleted, is deleted: see [`gone_is_deleted`].
    pub async fn delete(&self, path: &str, is_dir: bool) -> Result<()> {
        gone_is_deleted(self.remove(path, is_dir).await)?;
        self.keep_parent(path).await
    }

    /// Remove directory `path` only if it is empty: its marker object on S3 (objects
    /// under it stay), the directory itself on a file system (an error if it has entries).
    /// On an object store, a parent left with nothing in it gets a marker, as for `delete`.
    /// A directory that is not there, or goes meanwhile, is removed ([`gone_is_deleted`]).
    pub async fn delete_empty_dir(&self, path: &str) -> Result<()> {
        let r = self.op.delete(&Self::dir_path(path)).await.map_err(|e| ufs_err(format!("rmdir {path}"), e));
        gone_is_deleted(r)?;
        self.keep_parent(path).await
    }

    async fn remove(&self, path: &str, is_dir: bool) -> Result<()> {
        // The answer of a delete that loses a race with another delete of the same path
        // (the `fs` service finds the path, then its unlink finds nothing).
        locus_common::fail::fail_point!("ufs.remove.raced", |_| {
            let e = opendal::Error::new(opendal::ErrorKind::NotFound, "entity not found (fault point)");
            Err(ufs_err(format!("rm {path}"), e))
        });
        if is_dir {
            self.op
                .delete_with(&Self::dir_path(path))
                .recursive(true)
                .await
                .map_err(|e| ufs_err(format!("rm -R {path}"), e))
        } else {
            self.op.delete(path).await.map_err(|e| ufs_err(format!("rm {path}"), e))
        }
    }

    /// Rename a file or a directory. Stores without rename (S3) copy then delete: a
    /// directory object by object (its markers too; its own marker only if it held no
    /// object), then the old prefix as a whole; the source's parent keeps a marker if
    /// that left it empty.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        if self.op.info().capability().rename {
            return self.op.rename(from, to).await.map_err(|e| ufs_err(format!("mv {from} {to}"), e));
        }
        match self.op.stat(from).await {
            Ok(m) if m.mode() == EntryMode::FILE => {
                self.op.copy(from, to).await.map_err(|e| ufs_err(format!("copy {from} {to}"), e))?;
                self.op.delete(from).await.map_err(|e| ufs_err(format!("rm {from}"), e))?;
                return self.keep_parent(from).await;
            }
            Ok(_) => {}
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
            Err(e) => return Err(ufs_err(format!("stat {from}"), e)),
        }
        let (src, dst) = (Self::dir_path(from), Self::dir_path(to));
        let mut objects =
            self.op.lister_with(&src).recursive(true).await.map_err(|e| ufs_err(format!("list {src}"), e))?;
        let (mut found, mut held) = (false, false);
        while let Some(entry) = objects.try_next().await.map_err(|e| ufs_err(format!("list {src}"), e))? {
            let path = entry.path().trim_start_matches('/');
            let Some(rel) = path.strip_prefix(src.trim_start_matches('/')) else { continue };
            found = true;
            if rel.is_empty() {
                continue; // the directory's own marker: replaced below if still needed
            }
            held = true;
            let target = format!("{dst}{rel}");
            if path.ends_with('/') {
                self.create_dir(target.trim_end_matches('/')).await?;
            } else {
                self.op.copy(path, &target).await.map_err(|e| ufs_err(format!("copy {path} {target}"), e))?;
            }
        }
        if !found {
            return Err(Error::not_found(format!("mv {from} {to}: {from} does not exist")));
        }
        if !held {
            self.create_dir(to).await?;
        }
        self.delete(from, true).await
    }
}

/// A streaming UFS write in progress.
pub struct UfsWriter {
    w: opendal::Writer,
    path: String,
    ufs: Ufs,
}

impl UfsWriter {
    pub async fn write(&mut self, b: Bytes) -> Result<()> {
        self.w.write(b).await.map_err(|e| ufs_err(format!("write {}", self.path), e))
    }
    /// Finish the write and return the object's new status.
    pub async fn close(mut self) -> Result<UfsStatus> {
        self.w.close().await.map_err(|e| ufs_err(format!("close {}", self.path), e))?;
        self.ufs.apply_file_mode(&self.path).await?;
        self.ufs
            .stat(&self.path)
            .await?
            .ok_or_else(|| Error::new(ErrorKind::Ufs, format!("{} vanished after write", self.path)))
    }
    pub async fn abort(mut self) {
        let _ = self.w.abort().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_never_expose_locus_itself() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("ufs")).unwrap();
        let secret = data.join("cluster.secret");
        std::fs::write(&secret, "s").unwrap();
        let prot = vec![secret, dir.path().join("data/master")];
        let none = BTreeMap::new();
        for bad in [format!("file://{}", data.display()), format!("file://{}", dir.path().display()), "file:///".into()]
        {
            let e = check_mount_target(&bad, &none, &prot).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{bad}: {e}");
        }
        check_mount_target(&format!("file://{}", data.join("ufs").display()), &none, &prot).unwrap();
        for ep in [
            "http://169.254.169.254",
            "http://169.254.169.254:80/latest",
            "http://[fe80::1]:9000",
            "http://[fd00:ec2::254]",
        ] {
            let o = BTreeMap::from([("endpoint".to_string(), ep.to_string())]);
            assert!(check_mount_target("s3://b", &o, &prot).is_err(), "{ep}");
        }
        let o = BTreeMap::from([("endpoint".to_string(), "http://127.0.0.1:9000".to_string())]);
        check_mount_target("s3://b", &o, &prot).unwrap();
    }

    #[tokio::test]
    async fn files_written_to_a_file_mount_get_its_file_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file://{}", dir.path().display());
        let mode = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().permissions().mode() & 0o777;
        let ufs = Ufs::new(&uri, &BTreeMap::new(), Duration::from_secs(5)).unwrap();
        let w = ufs.writer("a/w.txt", "", &Default::default()).await.unwrap();
        w.close().await.unwrap();
        ufs.put("p.txt", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!((mode("a/w.txt"), mode("p.txt")), (0o600, 0o600), "private by default");
        let opts = BTreeMap::from([("file_mode".to_string(), "0640".to_string())]);
        let ufs = Ufs::new(&uri, &opts, Duration::from_secs(5)).unwrap();
        ufs.put("q.txt", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(mode("q.txt"), 0o640);
        for bad in ["rw", "0800", "1777", ""] {
            let opts = BTreeMap::from([("file_mode".to_string(), bad.to_string())]);
            let e = Ufs::new(&uri, &opts, Duration::from_secs(5)).err().unwrap();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn file_ufs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ufs =
            Ufs::new(&format!("file://{}", dir.path().display()), &BTreeMap::new(), Duration::from_secs(5)).unwrap();
        ufs.check().await.unwrap();
        let mut w = ufs.writer("a/b.txt", "text/plain", &Default::default()).await.unwrap();
        w.write(Bytes::from_static(b"hello world")).await.unwrap();
        let st = w.close().await.unwrap();
        assert_eq!(st.length, 11);
        assert!(st.fingerprint().starts_with("11:"));
        assert!(ufs.stat("a").await.unwrap().unwrap().is_dir);
        assert!(ufs.stat("nope").await.unwrap().is_none());
        let got: Vec<Bytes> = ufs.read_range("a/b.txt", 6, 5, 4, 2).await.unwrap().try_collect().await.unwrap();
        assert_eq!(got.concat(), b"world");
        let names: Vec<UfsStatus> = ufs.list("a").await.unwrap().try_collect().await.unwrap();
        assert_eq!(names.len(), 1);
        assert_eq!(names[0].path, "b.txt");
        ufs.rename("a/b.txt", "a/c.txt").await.unwrap();
        assert!(ufs.stat("a/c.txt").await.unwrap().is_some());
        // nothing outside the root is reachable: the file lives under the tempdir
        assert!(dir.path().join("a/c.txt").exists());
    }

    /// Deletes of one path at once all succeed: the `fs` service looks at the path, then
    /// removes it, and a delete whose removal finds the path gone (another delete removed
    /// it in between) must not say "not found" (a caller takes that for a path that was
    /// never there, and skips its own namespace change).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_deletes_of_one_path_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let ufs =
            Ufs::new(&format!("file://{}", dir.path().display()), &BTreeMap::new(), Duration::from_secs(5)).unwrap();
        for round in 0..50 {
            ufs.put("d/f", Bytes::from_static(b"x")).await.unwrap();
            ufs.create_dir("d/e").await.unwrap();
            let deletes = (0..16).map(|i| {
                let ufs = ufs.clone();
                tokio::spawn(async move {
                    match i % 4 {
                        0 => ufs.delete("d/e", true).await,
                        1 => ufs.delete_empty_dir("d/e").await,
                        _ => ufs.delete("d/f", false).await,
                    }
                })
            });
            for r in futures::future::join_all(deletes).await {
                let r = r.unwrap();
                assert!(r.is_ok(), "round {round}: {r:?}");
            }
            assert!(ufs.stat("d/f").await.unwrap().is_none() && ufs.stat("d/e").await.unwrap().is_none());
        }
    }

    #[test]
    fn ufs_errors_keep_the_opendal_error_as_their_source() {
        let e = ufs_err("stat a/b", opendal::Error::new(opendal::ErrorKind::NotFound, "no such key"));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.message(), "stat a/b");
        let src = std::error::Error::source(&e).expect("source kept");
        let o = src.downcast_ref::<opendal::Error>().expect("an opendal::Error");
        assert_eq!(o.kind(), opendal::ErrorKind::NotFound);
        assert!(e.to_string().starts_with("stat a/b: ") && e.to_string().contains("no such key"), "{e}");
        let t = ufs_err("put x", opendal::Error::new(opendal::ErrorKind::Unexpected, "503").set_temporary());
        assert!(t.is_retryable());
        assert_eq!(t.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn bad_uris_and_options_are_rejected() {
        let o = BTreeMap::new();
        let t = Duration::from_secs(1);
        assert_eq!(Ufs::new("hdfs://x", &o, t).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(Ufs::new("file://rel", &o, t).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(Ufs::new("s3:///x", &o, t).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(Ufs::new("s3://b/../x", &o, t).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut bad = BTreeMap::new();
        bad.insert("colour".to_string(), "red".to_string());
        assert_eq!(Ufs::new("s3://b", &bad, t).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
