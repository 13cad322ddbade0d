//! A DataFusion session over Locus, and query results in the formats `locus sql` prints.

use std::sync::Arc;

use std::sync::Weak;
use std::sync::atomic::AtomicU64;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{DynamicFileCatalog, TableProvider, UrlTableFactory};
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableConfigExt, ListingTableUrl};
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use locus_client::Client;
use locus_common::{Error, ErrorKind, Result};
use parking_lot::RwLock;

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
    // A Locus error (a worker's, or the client's) stays itself.
    if let DataFusionError::External(x) = e.find_root()
        && let Some(le) = x.downcast_ref::<Error>()
    {
        return Error::new(le.kind(), le.message()).set_retryable(le.is_retryable());
    }
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

/// A session that reads `locus://` URLs as tables: `SELECT ... FROM 'locus:///logs/*.csv'`
/// (a file, a directory, or a glob in the last part of the path).
pub fn session(client: Arc<Client>) -> Result<SessionContext> {
    Ok(session_counted(client, false)?.0)
}

/// [`session`], and the count of bytes its scans read from Locus. `in_order`: one
/// partition, so rows come out in the file's order (S3 Select's `LIMIT` takes the first
/// records), at the cost of scanning on one core.
pub fn session_counted(client: Arc<Client>, in_order: bool) -> Result<(SessionContext, Arc<AtomicU64>)> {
    let mut cfg = SessionConfig::new().with_information_schema(true);
    if in_order {
        cfg = cfg.with_target_partitions(1);
    }
    // A scan's rows stay in its partition up to the partial aggregate, so that runs on
    // the worker that scans ([`crate::remote`]); partitions come from the blocks instead.
    cfg.options_mut().optimizer.enable_round_robin_repartition = false;
    let ctx = SessionContext::new_with_config(cfg);
    let url = url::Url::parse("locus://").map_err(|e| Error::internal(format!("locus url: {e}")))?;
    let store = LocusStore::new(client);
    let read = store.bytes_read();
    ctx.register_object_store(&url, Arc::new(store));
    // As `SessionContext::enable_url_table`, with globs in URLs (DataFusion's own factory
    // takes globs in local paths only).
    let factory = Arc::new(UrlTables::default());
    let catalogs = Arc::new(DynamicFileCatalog::new(ctx.state().catalog_list().clone(), factory.clone()));
    let ctx: SessionContext = ctx.into_state_builder().with_catalog_list(catalogs).build().into();
    let _ = factory.state.set(ctx.state_weak_ref());
    Ok((ctx, read))
}

/// Tables named by URL (`'locus:///logs/*.csv'`): a listing table of the files the URL
/// names, its format and schema inferred from them.
#[derive(Debug, Default)]
struct UrlTables {
    state: std::sync::OnceLock<Weak<RwLock<SessionState>>>,
}

#[async_trait::async_trait]
impl UrlTableFactory for UrlTables {
    async fn try_new(&self, url: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        let Some(table_url) = listing_url(url) else {
            return Ok(None);
        };
        let state = self
            .state
            .get()
            .and_then(|w| w.upgrade())
            .map(|s| s.read().clone())
            .ok_or_else(|| DataFusionError::Internal("the SQL session is gone".into()))?;
        let cfg = match ListingTableConfig::new(table_url).infer_options(&state).await {
            Ok(cfg) => cfg,
            Err(_) => return Ok(None), // names no files: "table not found"
        };
        let cfg = cfg.infer_partitions_from_path(&state).await?.infer_schema(&state).await?;
        Ok(Some(Arc::new(ListingTable::try_new(cfg)?)))
    }
}

/// A table URL: a glob (`*`, `?`, `[`) in its last part filters the directory before it.
fn listing_url(s: &str) -> Option<ListingTableUrl> {
    let Some(g) = s.find(['*', '?', '[']) else {
        return ListingTableUrl::parse(s).ok();
    };
    if !s.contains("://") {
        return ListingTableUrl::parse(s).ok(); // a local path: DataFusion takes its globs
    }
    let slash = s[..g].rfind('/')?;
    let base = url::Url::parse(&s[..=slash]).ok()?;
    let glob = glob::Pattern::new(&s[slash + 1..]).ok()?;
    ListingTableUrl::try_new(base, Some(glob)).ok()
}

/// Run one SQL statement to its result batches, its scans on the workers.
pub async fn run_sql(client: Arc<Client>, sql: &str) -> Result<Vec<RecordBatch>> {
    Ok(run_sql_counted(client, sql).await?.0)
}

/// What a query moved: the bytes of Locus files its scans read (on workers or here), and
/// the bytes of results workers sent back.
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    pub scanned: Arc<AtomicU64>,
    pub returned: Arc<AtomicU64>,
}

impl Traffic {
    /// Counting into `scanned` (a session's own count, [`session_counted`]).
    pub fn scanning(scanned: Arc<AtomicU64>) -> Traffic {
        Traffic { scanned, returned: Arc::default() }
    }

    /// (scanned, returned) so far.
    pub fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.scanned.load(Relaxed), self.returned.load(Relaxed))
    }
}

/// [`run_sql`], and what it moved.
pub async fn run_sql_counted(client: Arc<Client>, sql: &str) -> Result<(Vec<RecordBatch>, Traffic)> {
    let (ctx, read) = session_counted(client.clone(), false)?;
    let traffic = Traffic::scanning(read);
    let stream = execute(&ctx, client, sql, &traffic).await?;
    let batches = futures::TryStreamExt::try_collect(stream).await.map_err(df_err)?;
    Ok((batches, traffic))
}

/// Plan `sql` in `ctx`, send its fragments to the workers ([`crate::remote`]) and start
/// it. `traffic` counts what the workers' fragments read and send back (the session's
/// own scans count themselves in its store's count).
pub async fn execute(
    ctx: &SessionContext,
    client: Arc<Client>,
    sql: &str,
    traffic: &Traffic,
) -> Result<datafusion::execution::SendableRecordBatchStream> {
    let plan = plan(ctx, client, sql, traffic).await?;
    datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()).map_err(df_err)
}

/// The physical plan of `sql`, its fragments sent to workers ([`execute`]).
pub async fn plan(
    ctx: &SessionContext,
    client: Arc<Client>,
    sql: &str,
    traffic: &Traffic,
) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    let (state, logical) = ctx.sql(sql).await.map_err(df_err)?.into_parts();
    let logical = state.optimize(&logical).map_err(df_err)?;
    let placement = crate::remote::Placement::new(client, traffic.clone(), state.task_ctx());
    let logical = placement.fold_scalar_joins(logical, &state).await?;
    let plan = state.create_physical_plan(&logical).await.map_err(df_err)?;
    placement.distribute(plan).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_in_urls_filter_their_directory() {
        let u = listing_url("locus:///logs/2024/*.csv").unwrap();
        assert_eq!(u.prefix().as_ref(), "logs/2024");
        assert!(u.contains(&"logs/2024/a.csv".into(), true));
        assert!(!u.contains(&"logs/2024/a.json".into(), true));
        assert!(!u.contains(&"logs/2025/a.csv".into(), true));
        let u = listing_url("locus:///logs/a.csv").unwrap();
        assert!(!u.is_collection());
        assert!(listing_url("/tmp/logs/*.csv").is_some_and(|u| u.scheme() == "file"));
    }
}
