//! SQL over the metadata catalog: the table `objects` (one row per object of every
//! mount, from the master's search catalog) for `locus fs search --sql`, and the
//! Parquet reader of inventory manifests for `locus fs index import`.
//!
//! `objects` streams the catalog page by page through the `Search` RPC; a filter
//! `key LIKE 'prefix%'` (or `starts_with(key, 'prefix')`) becomes the search's key
//! prefix, so only that range is read. Everything else is DataFusion's.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, MapBuilder, RecordBatch, StringBuilder, TimestampMillisecondBuilder,
    UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::scalar::ScalarValue;
use locus_client::Client;
use locus_common::{Error, Result};
use locus_proto::pb;

use crate::query::df_err;

/// Rows per search page.
const PAGE: u32 = 5000;

fn schema() -> SchemaRef {
    let map = |name: &str| {
        Field::new(
            name,
            DataType::Map(
                Arc::new(Field::new(
                    "entries",
                    DataType::Struct(
                        vec![Field::new("keys", DataType::Utf8, false), Field::new("values", DataType::Utf8, true)]
                            .into(),
                    ),
                    false,
                )),
                false,
            ),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("last_modified", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
        Field::new("content_type", DataType::Utf8, false),
        Field::new("etag", DataType::Utf8, false),
        map("metadata"),
        map("tags"),
        Field::new("cached", DataType::Float64, false),
        Field::new("tier", DataType::Utf8, false),
        Field::new("persist_state", DataType::Utf8, false),
        Field::new("pinned", DataType::Boolean, false),
        Field::new("mount", DataType::Utf8, false),
    ]))
}

/// The `objects` table.
pub struct ObjectsTable {
    client: Arc<Client>,
    schema: SchemaRef,
}

impl std::fmt::Debug for ObjectsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectsTable")
    }
}

impl ObjectsTable {
    pub fn new(client: Arc<Client>) -> ObjectsTable {
        ObjectsTable { client, schema: schema() }
    }
}

/// The key prefix a filter fixes, if it is `key LIKE 'p%'` or `starts_with(key, 'p')`.
fn key_prefix(e: &Expr) -> Option<String> {
    match e {
        Expr::Like(l) if !l.negated && !l.case_insensitive && l.escape_char.is_none() => {
            let (Expr::Column(c), Expr::Literal(ScalarValue::Utf8(Some(p)), _)) = (&*l.expr, &*l.pattern) else {
                return None;
            };
            if c.name != "key" {
                return None;
            }
            let lit: String = p.chars().take_while(|c| *c != '%' && *c != '_' && *c != '\\').collect();
            (!lit.is_empty() && p.ends_with('%')).then_some(lit)
        }
        Expr::ScalarFunction(f) if f.name() == "starts_with" && f.args.len() == 2 => match (&f.args[0], &f.args[1]) {
            (Expr::Column(c), Expr::Literal(ScalarValue::Utf8(Some(p)), _)) if c.name == "key" => Some(p.clone()),
            _ => None,
        },
        Expr::BinaryExpr(b) if b.op == Operator::And => key_prefix(&b.left).or_else(|| key_prefix(&b.right)),
        _ => None,
    }
}

#[async_trait]
impl TableProvider for ObjectsTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if key_prefix(f).is_some() {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let prefix = filters.iter().find_map(key_prefix).unwrap_or_default();
        let part: Arc<dyn PartitionStream> =
            Arc::new(CatalogScan { client: self.client.clone(), schema: self.schema.clone(), prefix });
        Ok(Arc::new(StreamingTableExec::try_new(
            self.schema.clone(),
            vec![part],
            projection,
            Vec::new(),
            false,
            limit,
        )?))
    }
}

/// The catalog in key order, page by page.
struct CatalogScan {
    client: Arc<Client>,
    schema: SchemaRef,
    prefix: String,
}

impl std::fmt::Debug for CatalogScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CatalogScan(prefix={:?})", self.prefix)
    }
}

impl PartitionStream for CatalogScan {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }
    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (client, schema, prefix) = (self.client.clone(), self.schema.clone(), self.prefix.clone());
        let s = futures::stream::try_unfold(Some(String::new()), move |after| {
            let (client, schema, prefix) = (client.clone(), schema.clone(), prefix.clone());
            async move {
                let Some(after) = after else { return Ok(None) };
                let req = pb::SearchRequest { path: "/".into(), prefix, after, limit: PAGE, ..Default::default() };
                let r = client.search(req).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
                let next = r.truncated.then(|| r.next_after.clone());
                Ok(Some((batch(&schema, &r.hits)?, next)))
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), s))
    }
}

fn batch(schema: &SchemaRef, hits: &[pb::SearchHit]) -> DfResult<RecordBatch> {
    let n = hits.len();
    let mut key = StringBuilder::with_capacity(n, n * 32);
    let mut size = UInt64Builder::with_capacity(n);
    let mut modified = TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut ct = StringBuilder::new();
    let mut etag = StringBuilder::new();
    let mut meta = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let mut tags = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let mut cached = Float64Builder::with_capacity(n);
    let mut tier = StringBuilder::new();
    let mut state = StringBuilder::new();
    let mut pinned = BooleanBuilder::with_capacity(n);
    let mut mount = StringBuilder::new();
    for h in hits {
        let fi = h.info.clone().unwrap_or_default();
        let m = fi.meta.clone().unwrap_or_default();
        key.append_value(&h.key);
        size.append_value(fi.length);
        modified.append_value(fi.mtime_ms);
        ct.append_value(&m.content_type);
        etag.append_value(&m.etag);
        for (map, b) in [(&m.user, &mut meta), (&m.tags, &mut tags)] {
            let mut kv: Vec<_> = map.iter().collect();
            kv.sort();
            for (k, v) in kv {
                b.keys().append_value(k);
                b.values().append_value(v);
            }
            b.append(true)?;
        }
        cached.append_value(h.cached);
        tier.append_value(&h.tier);
        state.append_value(fi.persist_state().name());
        pinned.append_value(fi.pinned);
        mount.append_value(&fi.mount_point);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(key.finish()),
        Arc::new(size.finish()),
        Arc::new(modified.finish()),
        Arc::new(ct.finish()),
        Arc::new(etag.finish()),
        Arc::new(meta.finish()),
        Arc::new(tags.finish()),
        Arc::new(cached.finish()),
        Arc::new(tier.finish()),
        Arc::new(state.finish()),
        Arc::new(pinned.finish()),
        Arc::new(mount.finish()),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Run `sql` over the catalog (the table `objects`).
pub async fn run(client: Arc<Client>, sql: &str) -> Result<Vec<RecordBatch>> {
    let ctx = crate::query::session(client.clone())?;
    ctx.register_table("objects", Arc::new(ObjectsTable::new(client))).map_err(df_err)?;
    let df = ctx.sql(sql).await.map_err(df_err)?;
    df.collect().await.map_err(df_err)
}

/// A string-to-string map column of one batch, its keys and values cast to text once.
struct MapCol {
    map: datafusion::arrow::array::MapArray,
    keys: ArrayRef,
    values: ArrayRef,
}

impl MapCol {
    fn of(a: Option<&ArrayRef>) -> std::result::Result<Option<MapCol>, String> {
        use datafusion::arrow::array::AsArray;
        let Some(m) = a.and_then(|a| a.as_map_opt()) else { return Ok(None) };
        let c = |x: &ArrayRef| datafusion::arrow::compute::cast(x, &DataType::Utf8).map_err(|e| e.to_string());
        Ok(Some(MapCol { map: m.clone(), keys: c(m.keys())?, values: c(m.values())? }))
    }

    /// Row `i` (user metadata names in lower case, without `x-amz-meta-`).
    fn row(&self, i: usize, meta: bool) -> std::collections::BTreeMap<String, String> {
        use datafusion::arrow::array::{Array, AsArray};
        let mut out = std::collections::BTreeMap::new();
        if self.map.is_null(i) {
            return out;
        }
        let (k, v) = (self.keys.as_string::<i32>(), self.values.as_string::<i32>());
        let (a, b) = (self.map.value_offsets()[i] as usize, self.map.value_offsets()[i + 1] as usize);
        for j in a..b {
            if k.is_null(j) || v.is_null(j) {
                continue;
            }
            let name = k.value(j);
            let name = if meta {
                name.strip_prefix("x-amz-meta-").unwrap_or(name).to_ascii_lowercase()
            } else {
                name.to_string()
            };
            out.insert(name, v.value(j).to_string());
        }
        out
    }
}

fn text_at(a: Option<&datafusion::arrow::array::StringArray>, i: usize) -> &str {
    use datafusion::arrow::array::Array;
    a.filter(|a| !a.is_null(i)).map(|a| a.value(i)).unwrap_or("")
}

/// The columns [`read_parquet`] reads (names lower-cased, without underscores).
const CATALOG_COLUMNS: &[&str] = &[
    "key",
    "bucket",
    "etag",
    "contenttype",
    "size",
    "lastmodifieddate",
    "lastmodified",
    "metadata",
    "usermetadata",
    "tags",
];

/// Read an S3 Inventory Parquet file (columns `bucket`, `key`, `size`,
/// `last_modified_date`, `e_tag`, and optionally `content_type` and the maps `metadata`
/// and `tags`; names compared without case or underscores), calling `f(bucket, key, entry)`
/// per row.
pub fn read_parquet(path: &Path, f: &mut dyn FnMut(&str, &str, pb::CatalogEntry) -> Result<()>) -> Result<()> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::compute::cast;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::new(locus_common::ErrorKind::NotFound, format!("{}: {e}", path.display())))?;
    let bad = |e: &dyn std::fmt::Display| Error::invalid(format!("{}: {e}", path.display()));
    let norm = |s: &str| s.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| bad(&e))?;
    // Only the columns read below are decoded (an inventory, or an export meant for other
    // engines too, may carry many more).
    let used = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, fl)| CATALOG_COLUMNS.contains(&norm(fl.name()).as_str()))
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    let mask = datafusion::parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), used);
    let reader = builder.with_projection(mask).with_batch_size(8192).build().map_err(|e| bad(&e))?;
    for b in reader {
        let b = b.map_err(|e| bad(&e))?;
        let col = |names: &[&str]| -> Option<ArrayRef> {
            let s = b.schema();
            let i = s.fields().iter().position(|fl| names.contains(&norm(fl.name()).as_str()))?;
            Some(b.column(i).clone())
        };
        let text = |names: &[&str]| -> Result<Option<ArrayRef>> {
            col(names).map(|a| cast(&a, &DataType::Utf8).map_err(|e| bad(&e))).transpose()
        };
        let key = text(&["key"])?.ok_or_else(|| bad(&"no `key` column"))?;
        let bucket = text(&["bucket"])?;
        let etag = text(&["etag"])?;
        let ct = text(&["contenttype"])?;
        let size = col(&["size"]).map(|a| cast(&a, &DataType::UInt64).map_err(|e| bad(&e))).transpose()?;
        let modified = col(&["lastmodifieddate", "lastmodified"])
            .map(|a| {
                let a = if matches!(a.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
                    cast(&a, &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())))
                } else {
                    cast(&a, &DataType::Timestamp(TimeUnit::Millisecond, None))
                };
                a.and_then(|a| cast(&a, &DataType::Int64)).map_err(|e| bad(&e))
            })
            .transpose()?;
        let (key, bucket, etag, ct) = (
            key.as_string::<i32>(),
            bucket.as_ref().map(|a| a.as_string::<i32>()),
            etag.as_ref().map(|a| a.as_string::<i32>()),
            ct.as_ref().map(|a| a.as_string::<i32>()),
        );
        let size = size.as_ref().map(|a| a.as_primitive::<datafusion::arrow::datatypes::UInt64Type>());
        let meta = MapCol::of(col(&["metadata", "usermetadata"]).as_ref()).map_err(|e| bad(&e))?;
        let tags = MapCol::of(col(&["tags"]).as_ref()).map_err(|e| bad(&e))?;
        let modified = modified.as_ref().map(|a| a.as_primitive::<datafusion::arrow::datatypes::Int64Type>());
        for i in 0..b.num_rows() {
            if key.is_null(i) {
                continue;
            }
            let s = |a| text_at(a, i);
            let entry = pb::CatalogEntry {
                size: size.filter(|a| !a.is_null(i)).map(|a| a.value(i)).unwrap_or(0),
                mtime_ms: modified.filter(|a| !a.is_null(i)).map(|a| a.value(i)).unwrap_or(0),
                etag: s(etag).trim_matches('"').to_string(),
                content_type: s(ct).to_string(),
                user: meta.as_ref().map(|m| m.row(i, true)).unwrap_or_default(),
                tags: tags.as_ref().map(|m| m.row(i, false)).unwrap_or_default(),
                inode: 0,
            };
            f(s(bucket), key.value(i), entry)?;
        }
    }
    Ok(())
}
