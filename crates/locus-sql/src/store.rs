//! Locus as an `object_store::ObjectStore` (read-only): how DataFusion's file scans
//! (CSV, newline-delimited JSON, Parquet) reach Locus files, `locus:///path`. Reads go
//! through the client: short-circuit where a worker shares the host, else the data path.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use futures::stream::{BoxStream, StreamExt};
use locus_client::Client;
use locus_common::ErrorKind;
use locus_proto::pb;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// The read-only object store over one cluster.
pub struct LocusStore {
    client: Arc<Client>,
    read: Arc<AtomicU64>,
}

impl LocusStore {
    pub fn new(client: Arc<Client>) -> Self {
        LocusStore { client, read: Arc::default() }
    }

    /// The bytes the scans have read so far (a `LIMIT` stops them early).
    pub fn bytes_read(&self) -> Arc<AtomicU64> {
        self.read.clone()
    }
}

impl fmt::Debug for LocusStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocusStore")
    }
}

impl fmt::Display for LocusStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("locus://")
    }
}

const STORE: &str = "locus";

/// The one mapping from a Locus error to an object-store error.
fn os_err(path: &str, e: locus_common::Error) -> object_store::Error {
    match e.kind() {
        ErrorKind::NotFound => object_store::Error::NotFound { path: path.into(), source: Box::new(e) },
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => {
            object_store::Error::PermissionDenied { path: path.into(), source: Box::new(e) }
        }
        _ => object_store::Error::Generic { store: STORE, source: Box::new(e) },
    }
}

fn read_only() -> object_store::Error {
    object_store::Error::NotSupported { source: "SQL reads Locus files; it does not write them".into() }
}

fn locus_path(p: &Path) -> String {
    format!("/{}", p.as_ref())
}

fn meta(fi: &pb::FileInfo) -> ObjectMeta {
    ObjectMeta {
        location: Path::from(fi.path.trim_start_matches('/')),
        last_modified: chrono_ms(fi.mtime_ms),
        size: fi.length,
        e_tag: (!fi.fingerprint.is_empty()).then(|| fi.fingerprint.clone()),
        version: None,
    }
}

fn chrono_ms(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A read of `meta`'s bytes, which begin at `base` in the Locus file `fi`; `read` counts
/// the bytes as they arrive.
fn get(
    client: &Arc<Client>,
    fi: pb::FileInfo,
    m: ObjectMeta,
    base: u64,
    options: GetOptions,
    read: &Arc<AtomicU64>,
) -> Result<GetResult> {
    options.check_preconditions(&m)?;
    let range: Range<u64> = match &options.range {
        None => 0..m.size,
        Some(r) => {
            r.as_range(m.size).map_err(|e| object_store::Error::Generic { store: STORE, source: Box::new(e) })?
        }
    };
    let stream = if options.head || range.is_empty() {
        futures::stream::empty().boxed()
    } else {
        let (p, read) = (fi.path.clone(), read.clone());
        client
            .read_stream(fi, base + range.start, range.end - range.start, Default::default())
            .map(move |r| match r {
                Ok(b) => {
                    read.fetch_add(b.len() as u64, Relaxed);
                    Ok(b)
                }
                Err(e) => Err(os_err(&p, e)),
            })
            .boxed()
    };
    Ok(GetResult { payload: GetResultPayload::Stream(stream), meta: m, range, attributes: Default::default() })
}

#[async_trait::async_trait]
impl ObjectStore for LocusStore {
    async fn put_opts(&self, _: &Path, _: PutPayload, _: PutOptions) -> Result<PutResult> {
        Err(read_only())
    }

    async fn put_multipart_opts(&self, _: &Path, _: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        Err(read_only())
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let path = locus_path(location);
        let fi = self.client.status(&path, true).await.map_err(|e| os_err(&path, e))?;
        if fi.is_dir {
            return Err(object_store::Error::NotFound { path: path.clone(), source: "a directory".into() });
        }
        let m = meta(&fi);
        get(&self.client, fi, m, 0, options, &self.read)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let client = self.client.clone();
        let dir = prefix.map(locus_path).unwrap_or_else(|| "/".into());
        futures::stream::once(async move {
            let mut v = Vec::new();
            let r = client
                .list_each(&dir, true, |e| {
                    if !e.is_dir {
                        v.push(Ok(meta(e)));
                    }
                })
                .await;
            match r {
                Ok(()) => futures::stream::iter(v),
                // A prefix that names nothing lists nothing.
                Err(e) if e.kind() == ErrorKind::NotFound => futures::stream::iter(Vec::new()),
                Err(e) => futures::stream::iter(vec![Err(os_err(&dir, e))]),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let dir = prefix.map(locus_path).unwrap_or_else(|| "/".into());
        let mut out = ListResult { common_prefixes: Vec::new(), objects: Vec::new() };
        let r = self
            .client
            .list_each(&dir, false, |e| {
                if e.is_dir {
                    out.common_prefixes.push(Path::from(e.path.trim_start_matches('/')));
                } else {
                    out.objects.push(meta(e));
                }
            })
            .await;
        match r {
            Ok(()) => Ok(out),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                Ok(ListResult { common_prefixes: Vec::new(), objects: Vec::new() })
            }
            Err(e) => Err(os_err(&dir, e)),
        }
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> Result<()> {
        Err(read_only())
    }
}

/// One window of one Locus file as a read-only store holding the single object `data`:
/// how a select's `ScanRange` (whole records only) reaches DataFusion's scans.
pub struct WindowStore {
    client: Arc<Client>,
    fi: pb::FileInfo,
    start: u64,
    end: u64,
    read: Arc<AtomicU64>,
}

impl WindowStore {
    /// `read` counts the bytes read (shared with the session's [`LocusStore`]).
    pub fn new(client: Arc<Client>, fi: pb::FileInfo, start: u64, end: u64, read: Arc<AtomicU64>) -> Self {
        WindowStore { client, fi, start, end, read }
    }

    fn meta(&self) -> ObjectMeta {
        ObjectMeta { location: Path::from("data"), size: self.end - self.start, ..meta(&self.fi) }
    }

    fn check(&self, location: &Path) -> Result<()> {
        if location.as_ref() == "data" {
            Ok(())
        } else {
            Err(object_store::Error::NotFound {
                path: location.to_string(),
                source: "a window holds only `data`".into(),
            })
        }
    }
}

impl fmt::Debug for WindowStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WindowStore({} {}..{})", self.fi.path, self.start, self.end)
    }
}

impl fmt::Display for WindowStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[async_trait::async_trait]
impl ObjectStore for WindowStore {
    async fn put_opts(&self, _: &Path, _: PutPayload, _: PutOptions) -> Result<PutResult> {
        Err(read_only())
    }

    async fn put_multipart_opts(&self, _: &Path, _: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        Err(read_only())
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.check(location)?;
        get(&self.client, self.fi.clone(), self.meta(), self.start, options, &self.read)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, _prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        futures::stream::iter(vec![Ok(self.meta())]).boxed()
    }

    async fn list_with_delimiter(&self, _prefix: Option<&Path>) -> Result<ListResult> {
        Ok(ListResult { common_prefixes: Vec::new(), objects: vec![self.meta()] })
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> Result<()> {
        Err(read_only())
    }
}
