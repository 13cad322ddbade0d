//! S3 Select (`SelectObjectContent`) on the SQL engine: the S3 Select dialect translated
//! onto DataFusion's, the object registered as the table `s3object` with the request's
//! input format, and the result rows written in its output format.
//!
//! The dialect: `FROM S3Object[*]` or `FROM S3Object` with an optional alias; columns by
//! header name (`s.name`, `s."Name"`, case-insensitive unless quoted) or by position
//! (`_1`, `s._3`); CSV fields are text unless `CAST`. Everything else is DataFusion's SQL,
//! so `WHERE`, `LIMIT`, `count`/`sum`/`avg`/`min`/`max`, `CAST`, string and date functions
//! come from it, not from hand-parsed rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use futures::{Stream, StreamExt};
use locus_client::Client;
use locus_common::{Error, ErrorKind};
use locus_proto::pb;

use crate::input::prepare;
pub use crate::input::{Compression, ScanRange};
use crate::query::{df_err, session_counted};
pub use locus_select::{SelectError, SelectErrorCode, SelectResult, Step, normalize_from, translate};

/// Whether the first CSV record names the columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderInfo {
    /// Names the columns (usable in the expression).
    Use,
    /// A header, skipped; columns by position only.
    Ignore,
    /// No header: the first record is data.
    #[default]
    None,
}

#[derive(Clone, Debug)]
pub struct CsvInput {
    pub header: HeaderInfo,
    pub delimiter: u8,
    pub quote: u8,
    pub escape: Option<u8>,
    pub comment: Option<u8>,
    /// `\n` (also ends `\r\n` records) or another single byte.
    pub record_delimiter: u8,
    /// A quoted field may hold the record delimiter.
    pub allow_quoted_record_delimiter: bool,
}

impl Default for CsvInput {
    fn default() -> Self {
        CsvInput {
            header: HeaderInfo::None,
            delimiter: b',',
            quote: b'"',
            escape: None,
            comment: None,
            record_delimiter: b'\n',
            allow_quoted_record_delimiter: false,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Input {
    Csv(CsvInput),
    /// Newline-delimited JSON (`Type=LINES`).
    JsonLines,
    /// One JSON document, or several one after another (`Type=DOCUMENT`).
    JsonDocument,
    Parquet,
}

#[derive(Clone, Debug)]
pub enum Output {
    Csv { delimiter: u8, quote: u8, quote_all: bool, record_delimiter: String },
    Json { record_delimiter: String },
}

#[derive(Clone, Debug)]
pub struct SelectRequest {
    /// The object's Locus path.
    pub path: String,
    pub expression: String,
    pub input: Input,
    pub compression: Compression,
    pub scan_range: Option<ScanRange>,
    pub output: Output,
}

/// Byte counts for the Stats event, filled in as the result streams.
#[derive(Debug)]
pub struct SelectStats {
    /// The bytes the scans read from Locus so far (a `LIMIT` stops them early).
    read: Arc<AtomicU64>,
    /// Input made in memory: the bytes read and the bytes processed (decompressed).
    in_memory: Option<(u64, u64)>,
    pub returned: AtomicU64,
}

impl SelectStats {
    /// `BytesScanned`: the object's bytes read.
    pub fn scanned(&self) -> u64 {
        self.in_memory.map_or_else(|| self.read.load(Relaxed), |m| m.0)
    }

    /// `BytesProcessed`: the bytes the query went through (after decompression).
    pub fn processed(&self) -> u64 {
        self.in_memory.map_or_else(|| self.read.load(Relaxed), |m| m.1)
    }
}

/// Run a select: the result's bytes in the output format as they are produced (one
/// chunk per batch), and the counters for the Stats event at its end.
pub async fn select(
    client: Arc<Client>,
    req: SelectRequest,
) -> SelectResult<(impl Stream<Item = SelectResult<Bytes>> + Send + 'static, Arc<SelectStats>)> {
    let fi = client.status(&req.path, true).await?;
    if fi.is_dir {
        return Err(Error::not_found(format!("{} is not an object", req.path)).into());
    }
    let (ctx, read) = session_counted(client.clone(), true)?;
    let (_, path) = normalize_from(&req.expression)?;
    let input = prepare(&ctx, &client, &fi, &req, &path, &read).await?;
    let url = input.url.as_str();
    let columns = match &req.input {
        Input::Csv(c) => {
            let names = csv_columns(&client, &fi, input.memory.as_deref(), c).await?;
            let schema = Schema::new(names.iter().map(|n| Field::new(n, DataType::Utf8, true)).collect::<Vec<_>>());
            let mut o = CsvReadOptions::new()
                .has_header(c.header != HeaderInfo::None && input.at_start)
                .delimiter(c.delimiter)
                .quote(c.quote)
                .newlines_in_values(c.allow_quoted_record_delimiter)
                .file_extension("")
                .truncated_rows(true)
                .schema(&schema);
            if let Some(e) = c.escape {
                o = o.escape(e);
            }
            if let Some(cm) = c.comment {
                o = o.comment(cm);
            }
            if c.record_delimiter != b'\n' {
                o = o.terminator(Some(c.record_delimiter));
            }
            ctx.register_csv("s3object", url, o).await.map_err(|e| classify(df_err(e)))?;
            Some((names, c.header == HeaderInfo::Use))
        }
        Input::JsonLines | Input::JsonDocument => {
            ctx.register_json("s3object", url, JsonReadOptions::default().file_extension(""))
                .await
                .map_err(|e| classify(df_err(e)))?;
            None
        }
        Input::Parquet => {
            ctx.register_parquet("s3object", url, ParquetReadOptions::default().file_extension(""))
                .await
                .map_err(|e| classify(df_err(e)))?;
            if let Some((start, end)) = input.row_groups {
                let table = ctx.deregister_table("s3object").map_err(|e| classify(df_err(e)))?;
                let table = table.ok_or_else(|| Error::internal("the select's table is gone"))?;
                let ranged = Arc::new(crate::input::RowGroupsIn { table, start, end });
                ctx.register_table("s3object", ranged).map_err(|e| classify(df_err(e)))?;
            }
            None
        }
    };
    let sql = translate(&req.expression, columns.as_ref().map(|(n, named)| (n.as_slice(), *named)))?;
    tracing::debug!(%sql, "S3 Select translated");
    let traffic = crate::query::Traffic::scanning(read.clone());
    let stream = crate::query::execute(&ctx, client.clone(), &sql, &traffic).await.map_err(classify)?;
    let stats = Arc::new(SelectStats { read, in_memory: input.in_memory, returned: AtomicU64::new(0) });
    let (st, out) = (stats.clone(), req.output.clone());
    let bytes = stream.map(move |b| {
        let b = b.map_err(|e| classify(df_err(e)))?;
        let chunk = encode(&b, &out)?;
        st.returned.fetch_add(chunk.len() as u64, Relaxed);
        Ok(chunk)
    });
    Ok((bytes, stats))
}

/// The columns of a CSV object: the header's names (USE), else `_1`..`_N` by the first
/// record's field count. `memory`: the data when it was made in memory (decompressed).
async fn csv_columns(
    client: &Client,
    fi: &pb::FileInfo,
    memory: Option<&[u8]>,
    c: &CsvInput,
) -> SelectResult<Vec<String>> {
    let terminator = if c.record_delimiter == b'\n' { 0 } else { c.record_delimiter.into() };
    let fmt = pb::CsvFormat {
        delimiter: c.delimiter.into(),
        quote: c.quote.into(),
        no_quoting: false,
        header: true,
        terminator,
    };
    let first = match memory {
        Some([]) => return Ok(vec!["_1".into()]),
        Some(m) => {
            let head = &m[..m.len().min(locus_compute::spec::HEADER_BYTES as usize)];
            locus_compute::header_fields(head, head.len() == m.len(), &fmt, &fi.path)
        }
        None if fi.length == 0 => return Ok(vec!["_1".into()]),
        None => client.csv_header(fi, &fmt).await,
    }
    .map_err(|e| SelectError { code: SelectErrorCode::CsvParsing, error: e })?;
    Ok(match c.header {
        HeaderInfo::Use => first,
        _ => (1..=first.len()).map(|i| format!("_{i}")).collect(),
    })
}

/// Put a DataFusion failure in its S3 Select class by what went wrong.
fn classify(e: Error) -> SelectError {
    let m = e.to_string();
    let code = if m.contains("Cast error")
        || m.contains("Cannot cast")
        || m.contains("parsing timestamp")
        || m.contains("cast") && m.contains("to value of")
    {
        SelectErrorCode::Cast
    } else if m.contains("CSV") || m.contains("csv") {
        SelectErrorCode::CsvParsing
    } else if m.contains("JSON") || m.contains("json") {
        SelectErrorCode::JsonParsing
    } else if m.contains("not implemented") || m.contains("Unsupported") || m.contains("unsupported") {
        SelectErrorCode::Unsupported
    } else if m.contains("SQL error") || m.contains("ParserError") {
        SelectErrorCode::Syntax
    } else if e.kind() == ErrorKind::InvalidArgument {
        SelectErrorCode::Unsupported
    } else {
        SelectErrorCode::Other
    };
    SelectError { code, error: e }
}

/// CSV written with `\n` after each record, with `rd` there instead: a newline inside a
/// quoted field is the field's own and stays.
fn end_records_with(csv: &[u8], quote: u8, rd: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(csv.len());
    let mut quoted = false;
    for &b in csv {
        quoted ^= b == quote;
        match b {
            b'\n' if !quoted => out.extend_from_slice(rd),
            _ => out.push(b),
        }
    }
    out
}

/// One batch in the output format.
fn encode(b: &RecordBatch, out: &Output) -> SelectResult<Bytes> {
    use datafusion::arrow;
    let mut buf = Vec::new();
    match out {
        Output::Csv { delimiter, quote, quote_all, record_delimiter } => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(false)
                .with_delimiter(*delimiter)
                .with_quote(*quote)
                .with_quote_style(if *quote_all {
                    arrow::csv::QuoteStyle::Always
                } else {
                    arrow::csv::QuoteStyle::Necessary
                })
                .build(&mut buf);
            w.write(b).map_err(|e| SelectError::from(Error::internal(format!("write CSV: {e}"))))?;
            drop(w);
            if record_delimiter != "\n" {
                buf = end_records_with(&buf, *quote, record_delimiter.as_bytes());
            }
        }
        Output::Json { record_delimiter } => {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(b).map_err(|e| SelectError::from(Error::internal(format!("write JSON: {e}"))))?;
            w.finish().map_err(|e| SelectError::from(Error::internal(format!("write JSON: {e}"))))?;
            drop(w);
            if record_delimiter != "\n" {
                buf = String::from_utf8_lossy(&buf).replace('\n', record_delimiter).into_bytes();
            }
        }
    }
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn csv_records_end_with_the_delimiter_asked_for() {
        assert_eq!(end_records_with(b"a,\"x\ny\"\nb,c\n", b'"', b"\r\n"), b"a,\"x\ny\"\r\nb,c\r\n");
    }

    #[tokio::test]
    async fn timestamps_and_trim_run_on_datafusion() {
        use datafusion::arrow::array::StringArray;
        use datafusion::datasource::MemTable;
        let schema = Arc::new(Schema::new(vec![Field::new("_1", DataType::Utf8, true)]));
        let rows = vec!["2007T", "2007-02-23T12:14Z", "2007-02-23T12:14:33.079-08:00"];
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(rows))]).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("s3object", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
        let cols = vec!["_1".to_string()];
        let all = |e: &str| {
            let sql = translate(e, Some((&cols, false))).unwrap_or_else(|x| panic!("{e}: {x:?}"));
            let ctx = ctx.clone();
            async move {
                let b = ctx
                    .sql(&sql)
                    .await
                    .unwrap_or_else(|x| panic!("{sql}: {x}"))
                    .collect()
                    .await
                    .unwrap_or_else(|x| panic!("{sql}: {x}"));
                let c = b[0].column(0);
                (0..c.len())
                    .map(|i| datafusion::arrow::util::display::array_value_to_string(c, i).unwrap())
                    .collect::<Vec<_>>()
            }
        };
        let utc = "SELECT TO_STRING(TO_TIMESTAMP(s._1), 'yyyy-MM-dd''T''HH:mm:ss.SSS') FROM S3Object s";
        assert_eq!(all(utc).await, ["2007-01-01T00:00:00.000", "2007-02-23T12:14:00.000", "2007-02-23T20:14:33.079"]);
        let n = "SELECT count(*) FROM S3Object s WHERE TO_TIMESTAMP(s._1) > `2007-02-23T12:14:30Z`";
        assert_eq!(all(n).await, ["1"]);
        let n =
            "SELECT count(*) FROM S3Object s WHERE TO_TIMESTAMP(s._1) > TO_TIMESTAMP('2007-02-23T12:14:33.079-07:00')";
        assert_eq!(all(n).await, ["1"]);
        let lit = "SELECT EXTRACT(HOUR FROM TO_TIMESTAMP('2017-01-02T03:04:05+07:08')), EXTRACT(MINUTE FROM `2017-01-02T03:04:05+07:08`) FROM S3Object LIMIT 1";
        assert_eq!(all(lit).await, ["3"]);
        assert_eq!(all("SELECT EXTRACT(MONTH FROM `2010T`) FROM S3Object LIMIT 1").await, ["1"]);
        assert_eq!(all("SELECT EXTRACT(MONTH FROM `2010-10T`) FROM S3Object LIMIT 1").await, ["10"]);
        let e = translate("SELECT TO_TIMESTAMP('2007-13T') FROM S3Object", Some((&cols, false))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::Cast);
        let trim = "SELECT TRIM(LEADING FROM '  x  '), TRIM(BOTH 'x ' FROM ' x y x') FROM S3Object LIMIT 1";
        assert_eq!(all(trim).await, ["x  "]);
        let trim =
            "SELECT TRIM(BOTH 'x ' FROM ' x y x'), TRIM(TRAILING FROM 'trim(leading from x)  ') FROM S3Object LIMIT 1";
        assert_eq!(all(trim).await, ["y"]);
        let trim = "SELECT TRIM(TRAILING FROM 'trim(leading from x)  ') FROM S3Object LIMIT 1";
        assert_eq!(all(trim).await, ["trim(leading from x)"], "text in quotes is left alone");
    }

    #[tokio::test]
    async fn date_functions_run_on_datafusion() {
        use datafusion::arrow::array::StringArray;
        use datafusion::datasource::MemTable;
        let schema = Arc::new(Schema::new(vec![Field::new("_1", DataType::Utf8, true)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec!["2024-01-30T10:20:30Z"]))])
                .unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("s3object", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
        let cols = cols(&["_1"]);
        let one = |e: &str| {
            let sql = translate(e, Some((&cols, false))).unwrap();
            let ctx = ctx.clone();
            async move {
                let b = ctx.sql(&sql).await.unwrap().collect().await.unwrap();

                datafusion::arrow::util::display::array_value_to_string(b[0].column(0), 0).unwrap()
            }
        };
        let t = "CAST(s._1 AS TIMESTAMP)";
        assert_eq!(one(&format!("SELECT DATE_ADD(day, 3, {t}) FROM S3Object s")).await, "2024-02-02T10:20:30");
        assert_eq!(one(&format!("SELECT DATE_ADD(month, -1, {t}) FROM S3Object s")).await, "2023-12-30T10:20:30");
        assert_eq!(one(&format!("SELECT DATE_DIFF(day, {t}, DATE_ADD(hour, 49, {t})) FROM S3Object s")).await, "2");
        assert_eq!(one(&format!("SELECT DATE_DIFF(year, {t}, DATE_ADD(month, 13, {t})) FROM S3Object s")).await, "1");
        assert_eq!(
            one(&format!("SELECT TO_STRING({t}, 'yyyy/MM/dd HH''h''mm') FROM S3Object s")).await,
            "2024/01/30 10h20"
        );
        assert_eq!(one(&format!("SELECT EXTRACT(YEAR FROM {t}) FROM S3Object s")).await, "2024");
        assert!(one("SELECT UTCNOW() FROM S3Object").await.starts_with("20"));
        let e = translate("SELECT DATE_ADD(fortnight, 1, s._1) FROM S3Object s", Some((&cols, false))).unwrap_err();
        assert_eq!(e.code, SelectErrorCode::Syntax);
    }
}
