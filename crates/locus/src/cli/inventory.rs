//! Inventory manifests into the catalog (`locus fs index import`): S3 Inventory's
//! manifest.json and its CSV (gzip or not, keys URL-encoded, no header) or Parquet
//! files, or such files given directly (a CSV may then have a header row), or JSON lines
//! that may also carry `metadata` and `tags` maps. Files are parsed on a blocking thread
//! and sent in batches, two requests in flight, with a progress bar over their bytes.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use futures::StreamExt;
use locus_client::Client;
use locus_common::Error;
use locus_proto::pb;

/// One inventory file and how to read it.
#[derive(Debug, Clone)]
enum Source {
    /// CSV with these columns (`None`: take them from a header row, else the default).
    Csv {
        path: PathBuf,
        columns: Option<Vec<String>>,
        gz: bool,
    },
    Parquet(PathBuf),
    Jsonl {
        path: PathBuf,
        gz: bool,
    },
}

impl Source {
    fn path(&self) -> &Path {
        match self {
            Source::Csv { path, .. } | Source::Jsonl { path, .. } | Source::Parquet(path) => path,
        }
    }
}

/// S3 Inventory's columns when neither a manifest nor a header names them.
const DEFAULT_COLUMNS: &str = "Bucket, Key, Size, LastModifiedDate, ETag, StorageClass";

fn norm_col(s: &str) -> String {
    s.trim().chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase()
}

fn columns_of(schema: &str) -> Vec<String> {
    schema.split(',').map(norm_col).collect()
}

fn is_gz(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "gz")
}

/// The extension before an optional `.gz`.
fn kind_of(p: &Path) -> String {
    let name = p.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    name.rsplit_once('.').map(|(_, e)| e.to_string()).unwrap_or_default()
}

/// The files a command-line argument stands for.
fn sources(arg: &Path) -> Result<Vec<Source>> {
    let kind = kind_of(arg);
    let gz = is_gz(arg);
    Ok(match kind.as_str() {
        "json" if arg.file_name().is_some_and(|n| n.to_string_lossy().starts_with("manifest")) => manifest(arg)?,
        "csv" | "tsv" | "txt" => vec![Source::Csv { path: arg.into(), columns: None, gz }],
        "parquet" => vec![Source::Parquet(arg.into())],
        "json" | "jsonl" | "ndjson" => vec![Source::Jsonl { path: arg.into(), gz }],
        _ => {
            return Err(Error::invalid(format!(
                "{}: not a manifest.json or an inventory file (.csv, .csv.gz, .parquet, .json, .jsonl)",
                arg.display()
            ))
            .into());
        }
    })
}

/// The data files of an S3 Inventory manifest.json. Their keys are in the destination
/// bucket; here each is looked for below the manifest's ancestors (the layout S3 writes:
/// `PREFIX/BUCKET/CONFIG/data/...` beside `PREFIX/BUCKET/CONFIG/DATE/manifest.json`),
/// then beside the manifest.
fn manifest(p: &Path) -> Result<Vec<Source>> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let m: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid(format!("{}: not JSON: {e}", p.display())))?;
    let format = m["fileFormat"].as_str().unwrap_or("CSV").to_ascii_uppercase();
    let files = m["files"]
        .as_array()
        .ok_or_else(|| Error::invalid(format!("{}: a manifest needs a `files` list", p.display())))?;
    let dir = p.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for f in files {
        let key = f["key"].as_str().ok_or_else(|| Error::invalid(format!("{}: a file without a key", p.display())))?;
        let found = dir
            .ancestors()
            .map(|a| a.join(key))
            .chain([
                dir.join(Path::new(key).file_name().unwrap_or_default()),
                dir.join("data").join(Path::new(key).file_name().unwrap_or_default()),
            ])
            .find(|c| c.is_file())
            .ok_or_else(|| Error::not_found(format!("{}: data file {key} not found near the manifest", p.display())))?;
        out.push(match format.as_str() {
            "CSV" => Source::Csv {
                gz: is_gz(&found),
                path: found,
                columns: Some(columns_of(m["fileSchema"].as_str().unwrap_or(DEFAULT_COLUMNS))),
            },
            "PARQUET" => Source::Parquet(found),
            other => {
                return Err(Error::invalid(format!(
                    "{}: file format {other} is not supported (CSV, Parquet)",
                    p.display()
                ))
                .into());
            }
        });
    }
    Ok(out)
}

/// A reader that counts the bytes it reads (the progress bar's).
struct Counting<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }
}

fn open(path: &Path, gz: bool, n: &Arc<AtomicU64>) -> Result<Box<dyn BufRead + Send>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let r = Counting { inner: f, n: n.clone() };
    Ok(if gz { Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(r))) } else { Box::new(BufReader::new(r)) })
}

/// Where an object goes: `under/key`, or `/bucket/key`; `None` for a folder marker.
fn path_for(under: Option<&str>, bucket: &str, key: &str) -> std::result::Result<Option<String>, &'static str> {
    if key.is_empty() || key.ends_with('/') {
        return Ok(None); // a folder marker, not an object
    }
    Ok(Some(match under {
        Some(u) => format!("{}/{key}", u.trim_end_matches('/')),
        None if !bucket.is_empty() => format!("/{bucket}/{key}"),
        None => return Err("no bucket for this object: give --under PATH"),
    }))
}

fn bad(src: &Path, line: u64, msg: impl std::fmt::Display) -> anyhow::Error {
    Error::invalid(format!("{}:{line}: {msg}", src.display())).into()
}

fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
}

/// An inventory's size field (empty: 0).
fn size_of(src: &Path, line: u64, size: &str) -> Result<u64> {
    if size.is_empty() {
        return Ok(0);
    }
    size.parse().map_err(|_| bad(src, line, format!("size {size:?} is not a number")))
}

/// An inventory's last-modified field (empty: 0).
fn mtime_of(src: &Path, line: u64, t: &str) -> Result<i64> {
    if t.is_empty() {
        return Ok(0);
    }
    parse_time(t).ok_or_else(|| bad(src, line, format!("last modified {t:?} is not a time")))
}

/// One JSON line of an inventory (the field names of S3 Inventory, AWS's APIs or
/// snake case; other fields are ignored).
#[derive(serde::Deserialize)]
struct JsonObject<'a> {
    #[serde(borrow, alias = "Key")]
    key: Option<Text<'a>>,
    #[serde(borrow, alias = "Bucket")]
    bucket: Option<Text<'a>>,
    #[serde(borrow, alias = "Size", alias = "content_length")]
    size: Option<Text<'a>>,
    #[serde(borrow, alias = "last_modified_date", alias = "LastModifiedDate", alias = "LastModified")]
    last_modified: Option<Text<'a>>,
    #[serde(borrow, alias = "e_tag", alias = "ETag")]
    etag: Option<Text<'a>>,
    #[serde(borrow, alias = "ContentType", alias = "content-type")]
    content_type: Option<Text<'a>>,
    #[serde(borrow, alias = "user_metadata", alias = "Metadata")]
    metadata: Option<std::collections::HashMap<String, Text<'a>>>,
    #[serde(borrow, alias = "Tags")]
    tags: Option<std::collections::HashMap<String, Text<'a>>>,
}

/// A JSON scalar as inventory text: a string as it is (borrowed from the line when it
/// has no escapes), a number or a boolean as written, null as nothing.
struct Text<'a>(Option<std::borrow::Cow<'a, str>>);

impl<'a> Text<'a> {
    fn text<'b>(t: &'b Option<Text<'a>>) -> Option<std::borrow::Cow<'b, str>> {
        t.as_ref().and_then(|t| t.0.as_deref()).map(std::borrow::Cow::Borrowed)
    }

    /// A map's entries with a value.
    fn map(m: Option<std::collections::HashMap<String, Text<'a>>>) -> impl Iterator<Item = (String, String)> {
        m.into_iter().flatten().filter_map(|(k, v)| v.0.map(|v| (k, v.into_owned())))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use std::borrow::Cow;
        struct V<'a>(std::marker::PhantomData<Text<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_string<E>(self, v: String) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v))))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_unit<E>(self) -> std::result::Result<Text<'a>, E> {
                Ok(Text(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Read one source, calling `emit` per object.
fn read_source(
    src: &Source,
    under: Option<&str>,
    n: &Arc<AtomicU64>,
    emit: &mut dyn FnMut(pb::CatalogImport) -> Result<()>,
) -> Result<()> {
    match src {
        Source::Csv { path, columns, gz } => {
            let r = open(path, *gz, n)?;
            let mut rd = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(r);
            let mut cols = columns.clone();
            let mut rec = csv::StringRecord::new();
            let mut line = 0u64;
            let mut url_keys = columns.is_some();
            while rd.read_record(&mut rec).map_err(|e| bad(path, line + 1, e))? {
                line += 1;
                if cols.is_none() {
                    let first: Vec<String> = rec.iter().map(norm_col).collect();
                    if first.iter().any(|c| c == "key") {
                        cols = Some(first);
                        continue; // a header row: keys as they are
                    }
                    cols = Some(columns_of(DEFAULT_COLUMNS));
                    url_keys = true;
                }
                let cols = cols.as_ref().unwrap();
                let get = |name: &str| cols.iter().position(|c| c == name).and_then(|i| rec.get(i)).unwrap_or("");
                let key = get("key");
                let key = if url_keys {
                    form_urlencoded::parse(format!("k={}", key.replace('&', "%26").replace('=', "%3D")).as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default()
                } else {
                    key.to_string()
                };
                let Some(p) = path_for(under, get("bucket"), &key).map_err(|e| bad(path, line, e))? else { continue };
                let size = get("size");
                let entry = pb::CatalogEntry {
                    size: size_of(path, line, size)?,
                    mtime_ms: mtime_of(path, line, get("lastmodifieddate"))?,
                    etag: get("etag").trim_matches('"').to_string(),
                    content_type: get("contenttype").to_string(),
                    ..Default::default()
                };
                emit(pb::CatalogImport { path: p, entry: Some(entry) })?;
            }
        }
        Source::Jsonl { path, gz } => {
            let mut r = open(path, *gz, n)?;
            let mut l = String::new();
            let mut line = 0u64;
            loop {
                l.clear();
                if r.read_line(&mut l).map_err(|e| bad(path, line + 1, e))? == 0 {
                    break;
                }
                line += 1;
                if l.trim().is_empty() {
                    continue;
                }
                let o: JsonObject =
                    serde_json::from_str(&l).map_err(|e| bad(path, line, format!("not an inventory line: {e}")))?;
                let key = Text::text(&o.key).ok_or_else(|| bad(path, line, "no key"))?;
                let Some(p) = path_for(under, &Text::text(&o.bucket).unwrap_or_default(), &key)
                    .map_err(|e| bad(path, line, e))?
                else {
                    continue;
                };
                let entry = pb::CatalogEntry {
                    size: size_of(path, line, &Text::text(&o.size).unwrap_or_default())?,
                    mtime_ms: mtime_of(path, line, &Text::text(&o.last_modified).unwrap_or_default())?,
                    etag: Text::text(&o.etag).unwrap_or_default().trim_matches('"').to_string(),
                    content_type: Text::text(&o.content_type).unwrap_or_default().into_owned(),
                    user: Text::map(o.metadata)
                        .map(|(k, v)| (k.strip_prefix("x-amz-meta-").unwrap_or(&k).to_ascii_lowercase(), v))
                        .collect(),
                    tags: Text::map(o.tags).collect(),
                    inode: 0,
                };
                emit(pb::CatalogImport { path: p, entry: Some(entry) })?;
            }
        }
        Source::Parquet(path) => read_parquet(path, under, n, emit)?,
    }
    Ok(())
}

#[cfg(feature = "sql")]
fn read_parquet(
    path: &Path,
    under: Option<&str>,
    n: &Arc<AtomicU64>,
    emit: &mut dyn FnMut(pb::CatalogImport) -> Result<()>,
) -> Result<()> {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    locus_sql::catalog::read_parquet(path, &mut |bucket, key, entry| {
        if let Some(p) = path_for(under, bucket, key).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))? {
            emit(pb::CatalogImport { path: p, entry: Some(entry) }).map_err(|e| Error::internal(format!("{e:#}")))?;
        }
        Ok(())
    })?;
    n.fetch_add(len, Ordering::Relaxed);
    Ok(())
}

#[cfg(not(feature = "sql"))]
fn read_parquet(
    path: &Path,
    _: Option<&str>,
    _: &Arc<AtomicU64>,
    _: &mut dyn FnMut(pb::CatalogImport) -> Result<()>,
) -> Result<()> {
    Err(Error::new(
        locus_common::ErrorKind::FailedPrecondition,
        format!("{}: Parquet inventories need the `sql` build", path.display()),
    )
    .into())
}

/// The manifests an import reads, and how it batches them (`locus fs index import` and
/// `locus bench index-floor` take the same arguments).
#[derive(clap::Args, Clone, Debug)]
pub struct Manifests {
    /// manifest.json files, or inventory files (.csv, .csv.gz, .parquet, .json, .jsonl).
    #[arg(required = true)]
    pub manifests: Vec<PathBuf>,
    /// The Locus directory the inventoried bucket is mounted at (default /BUCKET, from
    /// the inventory's Bucket column, as the S3 gateway maps buckets).
    #[arg(long, value_name = "PATH")]
    pub under: Option<String>,
    /// Objects per batch (one request to the master each).
    #[arg(long, default_value_t = 20_000)]
    pub batch: usize,
}

impl Manifests {
    /// The inventory files the manifests name.
    fn sources(&self) -> Result<Vec<Source>> {
        if let Some(u) = &self.under {
            locus_common::path::normalize(u)?;
        }
        let mut srcs = Vec::new();
        for m in &self.manifests {
            srcs.extend(sources(m)?);
        }
        Ok(srcs)
    }

    /// Parse `srcs` on this (blocking) thread, handing `send` each full batch and then
    /// the rest; `read` counts the bytes read.
    fn read_batches(
        &self,
        srcs: &[Source],
        read: &Arc<AtomicU64>,
        mut send: impl FnMut(Vec<pb::CatalogImport>) -> Result<()>,
    ) -> Result<()> {
        let batch = self.batch.max(1);
        let mut buf = Vec::with_capacity(batch);
        for s in srcs {
            read_source(s, self.under.as_deref(), read, &mut |e| {
                buf.push(e);
                if buf.len() >= batch {
                    send(std::mem::replace(&mut buf, Vec::with_capacity(batch)))?;
                }
                Ok(())
            })?;
        }
        if !buf.is_empty() {
            send(buf)?;
        }
        Ok(())
    }
}

/// Import every manifest; returns (indexed, skipped).
pub async fn import(c: &Arc<Client>, m: &Manifests) -> Result<(u64, u64)> {
    let srcs = m.sources()?;
    let total: u64 = srcs.iter().map(|s| std::fs::metadata(s.path()).map(|m| m.len()).unwrap_or(0)).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap(),
    );
    let read = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<pb::CatalogImport>>(4);
    let (m2, counter) = (m.clone(), read.clone());
    let reader = tokio::task::spawn_blocking(move || {
        m2.read_batches(&srcs, &counter, |b| tx.blocking_send(b).map_err(|_| Error::internal("import stopped").into()))
    });
    let (mut done, mut skipped) = (0u64, 0u64);
    let mut sends = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|b| {
            let c = c.clone();
            async move { c.import_catalog(b, false).await }
        })
        .buffered(2);
    while let Some(r) = sends.next().await {
        let (n, s) = r?;
        done += n;
        skipped += s;
        bar.set_position(read.load(Ordering::Relaxed));
        bar.set_message(format!("{done} objects"));
    }
    reader.await.map_err(|e| Error::internal(format!("inventory reader: {e}")))??;
    // Everything on disk and searchable before the import says it is done.
    c.import_catalog(Vec::new(), true).await?;
    bar.finish_and_clear();
    Ok((done, skipped))
}

/// The import's floor (`locus bench index-floor`): parse the manifests as an import does
/// (on a thread of their own, in batches) and index them with
/// [`locus_master::index_floor`] into `dir`, in this process, with no master around the
/// index. Returns the objects indexed.
pub fn index_floor(m: &Manifests, dir: &Path) -> Result<u64> {
    let srcs = m.sources()?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<pb::CatalogImport>>(4);
    let m2 = m.clone();
    let reader = std::thread::spawn(move || {
        let read = Arc::new(AtomicU64::new(0));
        m2.read_batches(&srcs, &read, |b| tx.send(b).map_err(|_| Error::internal("index floor stopped").into()))
    });
    let batches = rx.into_iter().map(|b| {
        b.into_iter()
            .filter_map(|i| Some((locus_common::path::normalize(&i.path).ok()?, i.entry.unwrap_or_default())))
            .collect()
    });
    // The index's error first: the reader's own is then only that nobody listened.
    let n = locus_master::index_floor(dir, batches)?;
    reader.join().map_err(|_| Error::internal("inventory reader panicked"))??;
    Ok(n)
}
