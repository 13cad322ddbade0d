//! A DataFusion session over Locus, and query results in the formats `locus sql` prints.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::prelude::{SessionConfig, SessionContext};
use locus_client::Client;
use locus_common::{Error, ErrorKind, Result};

use crate::store::LocusStore;

/// How results are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An aligned text table with a header.
    Table,
    /// RFC 4180 CSV with a header line.
    Csv,
    /// One JSON object per row, one per line.
    Json,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Some(Format::Table),
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// The one mapping from a DataFusion error to a Locus error: what the user wrote wrong
/// (SQL syntax, a missing column or table, a bad cast of their data) is InvalidArgument.
pub fn df_err(e: DataFusionError) -> Error {
    let kind = match e.find_root() {
        DataFusionError::SQL(..) | DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => {
            ErrorKind::InvalidArgument
        }
        DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => ErrorKind::InvalidArgument,
        DataFusionError::NotImplemented(_) => ErrorKind::InvalidArgument,
        DataFusionError::ObjectStore(o) => match o.as_ref() {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            _ => ErrorKind::Unavailable,
        },
        DataFusionError::IoError(_) => ErrorKind::Io,
        _ => ErrorKind::Internal,
    };
    // One line: DataFusion's messages may span several.
    let msg = e.to_string().replace('\n', " ");
    Error::new(kind, msg)
}

/// A session that reads `locus://` URLs: `SELECT ... FROM 'locus:///logs/*.csv'`.
pub fn session(client: Arc<Client>) -> Result<SessionContext> {
    let cfg = SessionConfig::new().with_information_schema(true);
    let ctx = SessionContext::new_with_config(cfg).enable_url_table();
    let url = url::Url::parse("locus://").map_err(|e| Error::internal(format!("locus url: {e}")))?;
    ctx.register_object_store(&url, Arc::new(LocusStore::new(client)));
    Ok(ctx)
}

/// Run one SQL statement to its result batches.
pub async fn run_sql(client: Arc<Client>, sql: &str) -> Result<Vec<RecordBatch>> {
    let ctx = session(client)?;
    let df = ctx.sql(sql).await.map_err(df_err)?;
    df.collect().await.map_err(df_err)
}

/// Write `batches` in `format`.
pub fn write(batches: &[RecordBatch], format: Format, out: &mut impl std::io::Write) -> Result<()> {
    use datafusion::arrow;
    let io = |e: std::io::Error| Error::io("write results", e);
    match format {
        Format::Table => {
            let t = arrow::util::pretty::pretty_format_batches(batches)
                .map_err(|e| Error::internal(format!("format results: {e}")))?;
            writeln!(out, "{t}").map_err(io)
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new().with_header(true).build(out);
            for b in batches {
                w.write(b).map_err(|e| Error::internal(format!("write CSV: {e}")))?;
            }
            Ok(())
        }
        Format::Json => {
            let mut w = arrow::json::LineDelimitedWriter::new(out);
            w.write_batches(&batches.iter().collect::<Vec<_>>())
                .map_err(|e| Error::internal(format!("write JSON: {e}")))?;
            w.finish().map_err(|e| Error::internal(format!("write JSON: {e}")))
        }
    }
}
