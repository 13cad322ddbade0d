//! Inventory manifests into the catalog (`locus fs index import`): S3 Inventory's
//! manifest.json and its CSV (gzip or not, keys URL-encoded, no header) or Parquet
//! files, or such files given directly (a CSV may then have a header row), or JSON lines
//! that may also carry `metadata` and `tags` maps. A CSV or JSON-lines file is cut into
//! chunks of whole records on a blocking thread and sent as it is (the master parses the
//! records: [`locus_search::inventory`]); a Parquet file is read here and sent as encoded
//! entries. Two requests are in flight, with a progress bar over the files' bytes.

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
use locus_search::inventory::norm_col;
#[cfg(feature = "sql")]
use locus_search::inventory::path_for;
use pb::import_catalog_request::Objects;

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

/// A chunk's size bound besides its count of records (the master takes requests of up
/// to 16 MiB).
const CHUNK_BYTES: usize = 8 << 20;

/// Append one record of `r` to `buf`: a line, or for CSV as many lines as a quoted field
/// spans (a newline ends a record only after an even count of quotes: RFC 4180 doubles
/// a quote within a quoted field). Returns the lines read (0: the end).
fn read_record(r: &mut dyn BufRead, buf: &mut Vec<u8>, csv: bool) -> std::io::Result<u64> {
    let (mut lines, mut quotes, first) = (0, 0usize, buf.len());
    loop {
        let start = buf.len();
        if r.read_until(b'\n', buf)? == 0 {
            return Ok(lines);
        }
        lines += 1;
        if csv {
            quotes += buf[start..].iter().filter(|&&b| b == b'"').count();
        }
        if quotes % 2 == 0 {
            return Ok(lines);
        }
        if buf.len() - first > CHUNK_BYTES {
            let msg = format!("a record of more than {} MiB (a quote left open?)", CHUNK_BYTES >> 20);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, msg));
        }
    }
}

/// Cut a CSV or JSON-lines source into chunks of `batch` records (or about
/// [`CHUNK_BYTES`]) for the master to parse, calling `send` with each.
fn read_chunks(
    src: &Source,
    under: Option<&str>,
    batch: usize,
    n: &Arc<AtomicU64>,
    send: &mut dyn FnMut(Objects) -> Result<()>,
) -> Result<()> {
    let (path, gz, csv) = match src {
        Source::Csv { path, gz, .. } => (path, *gz, true),
        Source::Jsonl { path, gz } => (path, *gz, false),
        Source::Parquet(_) => unreachable!("a Parquet source is read, not cut"),
    };
    let bad = |line: u64, e: std::io::Error| Error::invalid(format!("{}:{line}: {e}", path.display()));
    let mut r = open(path, gz, n)?;
    let mut head = pb::InventoryChunk {
        format: if csv { pb::InventoryFormat::InventoryCsv } else { pb::InventoryFormat::InventoryJsonLines }.into(),
        under: under.unwrap_or_default().into(),
        source: path.display().to_string(),
        ..Default::default()
    };
    // The line the next chunk starts at, and the records and lines of this one.
    let (mut line, mut records, mut lines) = (1u64, 0usize, 0u64);
    let mut data = Vec::new();
    if let Source::Csv { columns, .. } = src {
        head.url_keys = true;
        head.columns = match columns {
            Some(c) => c.clone(),
            None => {
                // A first row naming a Key column is a header (its keys as they are);
                // otherwise S3 Inventory's columns.
                let k = read_record(&mut *r, &mut data, true).map_err(|e| bad(1, e))?;
                let first: Vec<String> = csv::ReaderBuilder::new()
                    .has_headers(false)
                    .from_reader(&data[..])
                    .records()
                    .next()
                    .and_then(|r| r.ok())
                    .map(|r| r.iter().map(norm_col).collect())
                    .unwrap_or_default();
                if first.iter().any(|c| c == "key") {
                    head.url_keys = false;
                    (line, data) = (1 + k, Vec::new());
                    first
                } else {
                    (records, lines) = (usize::from(k > 0), k);
                    columns_of(DEFAULT_COLUMNS)
                }
            }
        };
    }
    loop {
        let k = read_record(&mut *r, &mut data, csv).map_err(|e| bad(line + lines, e))?;
        if k > 0 {
            records += 1;
            lines += k;
        }
        if (k == 0 && !data.is_empty()) || records >= batch || data.len() >= CHUNK_BYTES {
            let data = std::mem::replace(&mut data, Vec::with_capacity(CHUNK_BYTES.min(batch * 512)));
            send(Objects::Chunk(pb::InventoryChunk { first_line: line, data: data.into(), ..head.clone() }))?;
            (line, records, lines) = (line + lines, 0, 0);
        }
        if k == 0 {
            return Ok(());
        }
    }
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

    /// Read `srcs` on this (blocking) thread, handing `send` each request's objects: a
    /// CSV or JSON-lines file's records in chunks, as they are; a Parquet file's entries
    /// in encoded batches. `read` counts the bytes read.
    fn read_batches(
        &self,
        srcs: &[Source],
        read: &Arc<AtomicU64>,
        mut send: impl FnMut(Objects) -> Result<()>,
    ) -> Result<()> {
        use prost::Message;
        let batch = self.batch.max(1);
        let under = self.under.as_deref();
        let encoded =
            |entries: Vec<pb::CatalogImport>| Objects::Batch(pb::CatalogImportBatch { entries }.encode_to_vec().into());
        for s in srcs {
            let Source::Parquet(path) = s else {
                read_chunks(s, under, batch, read, &mut send)?;
                continue;
            };
            let mut buf = Vec::with_capacity(batch);
            read_parquet(path, under, read, &mut |e| {
                buf.push(e);
                if buf.len() >= batch {
                    send(encoded(std::mem::replace(&mut buf, Vec::with_capacity(batch))))?;
                }
                Ok(())
            })?;
            if !buf.is_empty() {
                send(encoded(buf))?;
            }
        }
        Ok(())
    }
}

/// Import every manifest; returns (indexed, skipped).
pub async fn import(c: &Arc<Client>, m: &Manifests) -> Result<(u64, u64)> {
    let srcs = m.sources()?;
    let total: u64 = srcs.iter().map(|s| std::fs::metadata(s.path()).map(|m| m.len()).unwrap_or(0)).sum();
    let bar = super::byte_bar(total);
    let read = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::mpsc::channel::<Objects>(4);
    let (m2, counter) = (m.clone(), read.clone());
    let reader = tokio::task::spawn_blocking(move || {
        m2.read_batches(&srcs, &counter, |b| tx.blocking_send(b).map_err(|_| Error::internal("import stopped").into()))
    });
    let (mut done, mut skipped) = (0u64, 0u64);
    let mut sends = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|b| {
            let c = c.clone();
            async move { c.import_catalog(Some(b), false).await }
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
    c.import_catalog(None, true).await?;
    bar.finish_and_clear();
    Ok((done, skipped))
}

/// The import's floor (`locus bench index-floor`): read and parse the manifests as an
/// import does (on a thread of their own, in the same chunks, with the master's parser)
/// and index them with [`locus_search::writer::index_floor`] into `dir`, in this process, with
/// no master around the index. Returns the objects indexed.
pub fn index_floor(m: &Manifests, dir: &Path) -> Result<u64> {
    let srcs = m.sources()?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(String, pb::CatalogEntry)>>(4);
    let m2 = m.clone();
    let reader = std::thread::spawn(move || {
        let read = Arc::new(AtomicU64::new(0));
        m2.read_batches(&srcs, &read, |o| {
            let entries = locus_search::inventory::entries(Some(o))?;
            tx.send(entries).map_err(|_| Error::internal("index floor stopped").into())
        })
    });
    // The index's error first: the reader's own is then only that nobody listened.
    let n = locus_search::writer::index_floor(dir, rx.into_iter())?;
    reader.join().map_err(|_| Error::internal("inventory reader panicked"))??;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks `text` (a file of `kind`) is cut into, `batch` records each.
    fn chunks(kind: &str, text: &str, batch: usize) -> Vec<pb::InventoryChunk> {
        try_chunks(kind, text, batch).unwrap()
    }

    fn try_chunks(kind: &str, text: &str, batch: usize) -> Result<Vec<pb::InventoryChunk>> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(format!("inv.{kind}"));
        std::fs::write(&p, text).unwrap();
        let m = Manifests { manifests: vec![p], under: Some("/u".into()), batch };
        let mut out = Vec::new();
        m.read_batches(&m.sources().unwrap(), &Arc::new(AtomicU64::new(0)), |o| {
            let Objects::Chunk(c) = o else { panic!("a chunk") };
            out.push(c);
            Ok(())
        })?;
        Ok(out)
    }

    fn texts(cs: &[pb::InventoryChunk]) -> Vec<(u64, String)> {
        cs.iter().map(|c| (c.first_line, String::from_utf8(c.data.to_vec()).unwrap())).collect()
    }

    #[test]
    fn csv_is_cut_between_records_never_inside_a_quoted_newline() {
        // A header row, then records, one spanning three lines with doubled quotes.
        let text = "Key,Size\nk1,1\n\"k\n\"\"2\n\",2\nk3,3\nk4,4";
        let cs = chunks("csv", text, 2);
        assert_eq!(cs[0].columns, ["key", "size"]);
        assert!(!cs[0].url_keys);
        assert_eq!(texts(&cs), [(2, "k1,1\n\"k\n\"\"2\n\",2\n".to_string()), (6, "k3,3\nk4,4".into())]);
        // Every record once, through the master's parser, named by its line.
        let all: Vec<String> = cs
            .into_iter()
            .flat_map(|c| locus_search::inventory::entries(Some(Objects::Chunk(c))).unwrap())
            .map(|(p, _)| p)
            .collect();
        assert_eq!(all, ["/u/k1", "/u/k\n\"2\n", "/u/k3", "/u/k4"]);

        // No header: S3 Inventory's columns, keys URL-encoded, the first row kept.
        let cs = chunks("csv", "\"b\",\"a%20b\",\"3\"\n\"b\",\"c\",\"4\"\n", 10);
        assert!(cs[0].url_keys);
        assert_eq!(cs[0].columns[..3], ["bucket", "key", "size"]);
        assert_eq!(texts(&cs), [(1, "\"b\",\"a%20b\",\"3\"\n\"b\",\"c\",\"4\"\n".to_string())]);

        // A quote left open does not swallow the file.
        let open = format!("Key\nk1\n\"k2\n{}", "x\n".repeat(CHUNK_BYTES / 2 + 1));
        let e = try_chunks("csv", &open, 10).unwrap_err().to_string();
        assert!(e.contains("inv.csv:3: a record of more than 8 MiB (a quote left open?)"), "{e}");
    }

    #[test]
    fn json_lines_are_cut_by_line_and_a_bad_one_is_named_by_its_line() {
        let cs = chunks("jsonl", "{\"key\":\"a\"}\n{\"key\":\"b\"}\n\n{\"key\":\"c\",\"size\":\"x\"}\n", 2);
        assert_eq!(
            texts(&cs),
            [(1, "{\"key\":\"a\"}\n{\"key\":\"b\"}\n".to_string()), (3, "\n{\"key\":\"c\",\"size\":\"x\"}\n".into())]
        );
        let e = locus_search::inventory::entries(Some(Objects::Chunk(cs[1].clone()))).unwrap_err().to_string();
        assert!(e.ends_with("inv.jsonl:4: size \"x\" is not a number"), "{e}");
        assert!(chunks("jsonl", "", 2).is_empty());
    }
}
