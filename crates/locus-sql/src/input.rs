//! The object a select reads, made ready for DataFusion's scans:
//! - the whole object, by its `locus://` URL (streamed through the client);
//! - a `ScanRange`: a window of whole records, those that start inside the range
//!   ([`WindowStore`], streamed); on Parquet, the row groups that start inside it
//!   ([`RowGroupsIn`]);
//! - a GZIP or BZIP2 object, or JSON read as `DOCUMENT` or through a path
//!   (`S3Object[*].a.b[*]`): decompressed and flattened to one record per line, in
//!   memory (at most [`MAX_IN_MEMORY`] bytes).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use locus_client::Client;
use locus_proto::pb;
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;
use object_store::path::Path;

use crate::select::{Input, SelectError, SelectErrorCode, SelectRequest, SelectResult};
use crate::store::WindowStore;

/// The most a select decompresses or flattens in memory.
pub const MAX_IN_MEMORY: u64 = 1 << 30;

/// How the object is compressed (`InputSerialization.CompressionType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Bzip2,
}

/// S3's `ScanRange`: the records that start in `start..=end`. Only `end`: the last `end`
/// bytes. Only `start`: from there to the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanRange {
    pub start: Option<u64>,
    pub end: Option<u64>,
}

pub use locus_select::Step;

/// Where DataFusion reads the input.
pub(crate) struct Prepared {
    pub url: String,
    /// The data begins at the object's first byte (so a CSV header is there).
    pub at_start: bool,
    /// For data made in memory: the bytes read from the object, and the bytes the query
    /// processed (decompressed). Otherwise the session's byte count says.
    pub in_memory: Option<(u64, u64)>,
    /// The data, when it was made in memory (its CSV header is read from here).
    pub memory: Option<Bytes>,
    /// Parquet under a `ScanRange`: the row groups whose first page starts in this byte
    /// range (end exclusive) are read, as S3 does ([`RowGroupsIn`]).
    pub row_groups: Option<(u64, u64)>,
}

impl Prepared {
    fn whole(fi: &pb::FileInfo) -> Prepared {
        Prepared {
            url: format!("locus://{}", fi.path),
            at_start: true,
            in_memory: None,
            memory: None,
            row_groups: None,
        }
    }
}

fn err(code: SelectErrorCode, msg: impl Into<String>) -> SelectError {
    SelectError { code, error: locus_common::Error::invalid(msg.into()) }
}

pub(crate) async fn prepare(
    ctx: &SessionContext,
    client: &Arc<Client>,
    fi: &pb::FileInfo,
    req: &SelectRequest,
    path: &[Step],
    read: &Arc<AtomicU64>,
) -> SelectResult<Prepared> {
    let json = matches!(req.input, Input::JsonLines | Input::JsonDocument);
    if !path.is_empty() && !json {
        return Err(err(SelectErrorCode::Syntax, "a path after S3Object[*] needs JSON input"));
    }
    let flatten = matches!(req.input, Input::JsonDocument) || (json && !path.is_empty());
    if req.compression != Compression::None || flatten {
        if req.scan_range.is_some() {
            return Err(err(
                SelectErrorCode::UnsupportedScanRange,
                "ScanRange needs uncompressed CSV or JSON LINES input (without a path)",
            ));
        }
        if matches!(req.input, Input::Parquet) {
            return Err(err(SelectErrorCode::BadRequest, "Parquet input takes CompressionType NONE"));
        }
        if fi.length > MAX_IN_MEMORY {
            return Err(err(
                SelectErrorCode::Unsupported,
                format!("the object is over {MAX_IN_MEMORY} bytes: too large to decompress or flatten"),
            ));
        }
        let mut raw = Vec::with_capacity(fi.length as usize);
        client.read_to(fi, 0, fi.length, Default::default(), &mut raw).await?;
        let (compression, path) = (req.compression, path.to_vec());
        let data = tokio::task::spawn_blocking(move || -> SelectResult<Vec<u8>> {
            let data = decompress(raw, compression)?;
            if flatten { flatten_json(&data, &path) } else { Ok(data) }
        })
        .await
        .map_err(|e| locus_common::Error::internal(format!("select input task: {e}")))??;
        let data = Bytes::from(data);
        let store = InMemory::new();
        store
            .put(&Path::from("data"), data.clone().into())
            .await
            .map_err(|e| locus_common::Error::internal(format!("select input in memory: {e}")))?;
        let url = url::Url::parse("memory://select/").map_err(|e| locus_common::Error::internal(e.to_string()))?;
        ctx.register_object_store(&url, Arc::new(store));
        return Ok(Prepared {
            url: "memory://select/data".into(),
            at_start: true,
            in_memory: Some((fi.length, data.len() as u64)),
            memory: Some(data),
            row_groups: None,
        });
    }
    let Some(range) = req.scan_range else {
        return Ok(Prepared::whole(fi));
    };
    if matches!(req.input, Input::Parquet) {
        let (start, last) = bounds(fi.length, range)?;
        let end = last.saturating_add(1).min(fi.length);
        return Ok(Prepared { row_groups: Some((start, end.max(start))), ..Prepared::whole(fi) });
    }
    let delimiter = match &req.input {
        Input::Csv(c) if !c.allow_quoted_record_delimiter => c.record_delimiter,
        Input::JsonLines => b'\n',
        _ => {
            return Err(err(
                SelectErrorCode::UnsupportedScanRange,
                "ScanRange needs CSV without AllowQuotedRecordDelimiter, or JSON LINES",
            ));
        }
    };
    let (start, end) = window(client, fi, range, delimiter).await?;
    if (start, end) == (0, fi.length) {
        return Ok(Prepared::whole(fi));
    }
    let store = WindowStore::new(client.clone(), fi.clone(), start, end, read.clone());
    let url = url::Url::parse("locus-window://select/").map_err(|e| locus_common::Error::internal(e.to_string()))?;
    ctx.register_object_store(&url, Arc::new(store));
    Ok(Prepared {
        url: "locus-window://select/data".into(),
        at_start: start == 0,
        in_memory: None,
        memory: None,
        row_groups: None,
    })
}

/// The bytes of the records that start inside `range`: from the first record start at
/// or after `start` to the end of the record holding byte `end`.
async fn window(client: &Client, fi: &pb::FileInfo, range: ScanRange, delimiter: u8) -> SelectResult<(u64, u64)> {
    let len = fi.length;
    let (start, last) = bounds(len, range)?;
    let from = record_start(client, fi, start, delimiter).await?;
    let to = if last >= len.saturating_sub(1) { len } else { record_start(client, fi, last + 1, delimiter).await? };
    Ok((from, to.max(from)))
}

/// The first and last byte (inclusive; `u64::MAX`: to the end) a `ScanRange` names in
/// an object of `len` bytes.
fn bounds(len: u64, range: ScanRange) -> SelectResult<(u64, u64)> {
    Ok(match (range.start, range.end) {
        (Some(s), Some(e)) if s > e => {
            return Err(err(SelectErrorCode::BadRequest, format!("ScanRange Start {s} is after its End {e}")));
        }
        (Some(s), Some(e)) => (s, e),
        (Some(s), None) => (s, u64::MAX),
        (None, Some(n)) => (len.saturating_sub(n), u64::MAX),
        (None, None) => (0, u64::MAX),
    })
}

/// A Parquet table read only in the row groups whose first page starts in `start..end`:
/// its scan's files get that byte range, and DataFusion's Parquet reader keeps exactly
/// those row groups (the range survives its splitting and the trip to a worker).
#[derive(Debug)]
pub(crate) struct RowGroupsIn {
    pub table: Arc<dyn TableProvider>,
    pub start: u64,
    pub end: u64,
}

#[async_trait::async_trait]
impl TableProvider for RowGroupsIn {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        self.table.table_type()
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.table.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = self.table.scan(state, projection, filters, limit).await?;
        let (start, end) = (self.start as i64, self.end as i64);
        plan.transform_up(|p| {
            let Some(scan) =
                p.downcast_ref::<DataSourceExec>().and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
            else {
                return Ok(Transformed::no(p));
            };
            let groups = scan
                .file_groups
                .iter()
                .map(|g| FileGroup::new(g.iter().map(|f| f.clone().with_range(start, end)).collect()))
                .collect();
            let scan = FileScanConfigBuilder::from(scan.clone()).with_file_groups(groups).build();
            Ok(Transformed::yes(DataSourceExec::from_data_source(scan) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }
}

/// The first record start at or after `pos`: 0, or just past a delimiter at `pos - 1`
/// or later (the object's length when there is none).
async fn record_start(client: &Client, fi: &pb::FileInfo, pos: u64, delimiter: u8) -> SelectResult<u64> {
    if pos == 0 {
        return Ok(0);
    }
    let mut at = pos - 1;
    while at < fi.length {
        let n = (fi.length - at).min(64 << 10);
        let mut buf = Vec::with_capacity(n as usize);
        client.read_to(fi, at, n, Default::default(), &mut buf).await?;
        if let Some(i) = buf.iter().position(|b| *b == delimiter) {
            return Ok(at + i as u64 + 1);
        }
        at += n;
    }
    Ok(fi.length)
}

fn decompress(raw: Vec<u8>, c: Compression) -> SelectResult<Vec<u8>> {
    let mut out = Vec::new();
    let limit = MAX_IN_MEMORY + 1;
    let r = match c {
        Compression::None => return Ok(raw),
        Compression::Gzip => flate2::read::MultiGzDecoder::new(&raw[..]).take(limit).read_to_end(&mut out),
        Compression::Bzip2 => bzip2::read::MultiBzDecoder::new(&raw[..]).take(limit).read_to_end(&mut out),
    };
    r.map_err(|e| err(SelectErrorCode::Compression, format!("the object is not valid {c:?} data: {e}")))?;
    if out.len() as u64 > MAX_IN_MEMORY {
        return Err(err(
            SelectErrorCode::Unsupported,
            format!("the object decompresses to over {MAX_IN_MEMORY} bytes: too large for a select"),
        ));
    }
    Ok(out)
}

/// JSON values (whitespace-separated: lines or documents) to one record per line, each
/// value taken through `path`. A record that is not an object becomes `{"_1": value}`.
fn flatten_json(data: &[u8], path: &[Step]) -> SelectResult<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len());
    for v in serde_json::Deserializer::from_slice(data).into_iter::<serde_json::Value>() {
        let v = v.map_err(|e| err(SelectErrorCode::JsonParsing, format!("the object is not valid JSON: {e}")))?;
        let mut emit = |r: &serde_json::Value| {
            let line =
                if r.is_object() { serde_json::to_vec(r) } else { serde_json::to_vec(&serde_json::json!({ "_1": r })) };
            out.extend_from_slice(&line.unwrap_or_default());
            out.push(b'\n');
        };
        walk(&v, path, &mut emit);
    }
    Ok(out)
}

fn walk(v: &serde_json::Value, path: &[Step], emit: &mut impl FnMut(&serde_json::Value)) {
    let Some((step, rest)) = path.split_first() else {
        emit(v);
        return;
    };
    match step {
        Step::Key(k) => {
            if let Some(x) = v.as_object().and_then(|o| o.get(k)) {
                walk(x, rest, emit);
            }
        }
        Step::All => match v {
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, rest, emit)),
            serde_json::Value::Object(o) => o.values().for_each(|x| walk(x, rest, emit)),
            _ => {}
        },
        Step::Index(i) => {
            if let Some(x) = v.as_array().and_then(|a| a.get(*i)) {
                walk(x, rest, emit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_flattened_through_the_path() {
        let doc = br#"{"rows": [{"a": 1}, {"a": 2}, 3], "n": {"x": "y"}} {"rows": [{"a": 4}]}"#;
        let got = flatten_json(doc, &[Step::Key("rows".into()), Step::All]).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), "{\"a\":1}\n{\"a\":2}\n{\"_1\":3}\n{\"a\":4}\n");
        let got = flatten_json(doc, &[Step::Key("rows".into()), Step::Index(1)]).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), "{\"a\":2}\n");
        let got = flatten_json(doc, &[]).unwrap();
        assert_eq!(got.iter().filter(|b| **b == b'\n').count(), 2);
        let e = flatten_json(b"{\"a\": 1} {oops", &[]).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::JsonParsing);
    }

    #[test]
    fn decompression_reads_gzip_and_bzip2_and_refuses_junk() {
        use std::io::Write;
        let text = b"a,b\n1,2\n".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        assert_eq!(decompress(gz.finish().unwrap(), Compression::Gzip).unwrap(), text);
        let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        bz.write_all(&text).unwrap();
        assert_eq!(decompress(bz.finish().unwrap(), Compression::Bzip2).unwrap(), text);
        let e = decompress(b"not gzip".to_vec(), Compression::Gzip).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::Compression);
    }
}
