//! SQL next to the data. The parts of a physical plan that read `locus://` files and need
//! no rows of other partitions (a scan with its filters and projections, up to a partial
//! aggregate or a per-partition sort) run on the workers that hold the files' blocks; the
//! caller runs the rest (the final aggregate, the merge, the limit) over what they return.
//! This is DataFusion's own plan cut at its exchanges, not a distributed engine: joins
//! across partitions stay where DataFusion put them.
//!
//! - Caller, before physical planning: [`Placement::fold_scalar_joins`] runs each join's one-row side
//!   (a scalar aggregate: normalize's statistics, an uncorrelated scalar subquery) and
//!   puts its values in as constants, so the join is gone and the other side's scan and
//!   aggregates cut into fragments as any other's.
//! - Caller: [`Placement::distribute`] first runs the small build side of each join that collects its
//!   left input and answers each right row on its own (a cross join with a one-row
//!   aggregate, an inner hash join with a small table): its rows go into the plan as
//!   constants, broadcast with the fragment, so the scan on the other side and what sits
//!   above it up to the next exchange still run on the workers. Then it puts a
//!   [`RemoteExec`] in place of each fragment. Under an
//!   exchange, a splittable scan (uncompressed CSV without newlines in values, JSON lines,
//!   Parquet) is cut into one partition per block, so each runs where its block lives;
//!   else the scan keeps DataFusion's partitions, each sent to the worker holding most of
//!   its bytes (an uncached block: the worker a reader fills it on, which fills it as it
//!   scans). A partition whose workers all fail, or run no SQL, runs here.
//! - Worker: [`Fragments`] decodes a fragment (`datafusion-proto`) and runs it on a
//!   runtime of its own, reading Locus files through a client (short-circuit for the
//!   blocks it holds) and nothing else: its sessions know no other object store.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamDecoder;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, JoinType, ScalarValue};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::analyze::AnalyzeExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    replace_children_if_necessary,
};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use locus_client::{Client, FragmentPiece};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use object_store::ObjectStore;

use crate::query::{Traffic, df_err};
use crate::store::LocusStore;

/// A fragment's result as pieces of an Arrow IPC stream.
type IpcPieces = futures::stream::BoxStream<'static, Result<Vec<u8>>>;

/// The scheme of Locus files in plans.
const LOCUS_SCHEME: &str = "locus";

/// One query's placement of fragments on workers: what [`Cx`] looked up (the live
/// workers, the files' blocks) serves both steps, [`Placement::fold_scalar_joins`] on the
/// logical plan and then [`Placement::distribute`] on the physical one, so each is asked
/// of the master once per query.
pub struct Placement(Cx);

impl Placement {
    /// `traffic` adds up the bytes the workers' scans read and the bytes they send back;
    /// `task` runs the sides of joins that are run first (folded or broadcast).
    pub fn new(client: Arc<Client>, traffic: Traffic, task: Arc<TaskContext>) -> Placement {
        Placement(Cx { client, traffic, task, workers: Default::default(), files: Default::default() })
    }

    /// `plan` with each fragment that can run on workers replaced by a [`RemoteExec`].
    pub async fn distribute(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = broadcast(plan, &self.0).await?;
        place(plan, false, &self.0).await
    }

    /// `plan` (optimized) with each join that has a one-row side replaced by the other
    /// side and that row's values as constant columns: the side runs now, through
    /// [`Placement::distribute`]'s steps. Only inner joins, and outer joins whose one-row
    /// side always matches (no condition), where "one row" is certain: an aggregate
    /// without `GROUP BY` (under aliases and projections). An `EXPLAIN` runs nothing.
    pub async fn fold_scalar_joins(&self, plan: LogicalPlan, state: &SessionState) -> Result<LogicalPlan> {
        if matches!(plan, LogicalPlan::Explain(_)) {
            return Ok(plan);
        }
        fold(plan, state, &self.0).await
    }
}

fn fold<'a>(plan: LogicalPlan, state: &'a SessionState, cx: &'a Cx) -> BoxFuture<'a, Result<LogicalPlan>> {
    async move {
        let inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
        if inputs.is_empty() {
            return Ok(plan);
        }
        let mut folded = Vec::with_capacity(inputs.len());
        for i in &inputs {
            folded.push(fold(i.clone(), state, cx).await?);
        }
        let plan =
            if folded == inputs { plan } else { plan.with_new_exprs(plan.expressions(), folded).map_err(df_err)? };
        let LogicalPlan::Join(j) = &plan else {
            return Ok(plan);
        };
        let unconditional = j.on.is_empty() && j.filter.is_none();
        let scalar_left = is_one_row(&j.left)
            && (j.join_type == JoinType::Inner || (j.join_type == JoinType::Right && unconditional));
        let scalar_right = is_one_row(&j.right)
            && (j.join_type == JoinType::Inner || (j.join_type == JoinType::Left && unconditional));
        let (one, other) = match (scalar_left, scalar_right) {
            (true, _) => (j.left.as_ref(), j.right.as_ref()),
            (false, true) => (j.right.as_ref(), j.left.as_ref()),
            _ => return Ok(plan),
        };
        let physical = state.create_physical_plan(one).await.map_err(df_err)?;
        let physical = place(broadcast(physical, cx).await?, false, cx).await?;
        let rows = datafusion::physical_plan::collect(physical, cx.task.clone()).await.map_err(df_err)?;
        let Some(row) = rows.iter().find(|b| b.num_rows() > 0) else {
            return Ok(plan);
        };
        if rows.iter().map(|b| b.num_rows()).sum::<usize>() != 1 {
            return Ok(plan);
        }
        let mut constants = Vec::new();
        for (i, (q, f)) in one.schema().iter().enumerate() {
            let v = ScalarValue::try_from_array(row.column(i), 0).map_err(df_err)?;
            constants.push(Expr::Literal(v, None).alias_qualified(q.cloned(), f.name()));
        }
        let columns: Vec<Expr> = other.schema().iter().map(|(q, f)| Expr::Column(Column::from((q, f)))).collect();
        let exprs = if scalar_left { [constants, columns].concat() } else { [columns, constants].concat() };
        let cond = conjunction(j.on.iter().map(|(l, r)| l.clone().eq(r.clone())).chain(j.filter.clone()));
        let mut out = LogicalPlanBuilder::from(other.clone()).project(exprs).map_err(df_err)?;
        if let Some(c) = cond {
            out = out.filter(c).map_err(df_err)?;
        }
        out.build().map_err(df_err)
    }
    .boxed()
}

/// A plan that yields exactly one row: an aggregate without `GROUP BY`, under aliases and
/// projections.
fn is_one_row(p: &LogicalPlan) -> bool {
    match p {
        LogicalPlan::Aggregate(a) => a.group_expr.is_empty(),
        LogicalPlan::SubqueryAlias(a) => is_one_row(&a.input),
        LogicalPlan::Projection(pr) => is_one_row(&pr.input),
        _ => false,
    }
}

/// The most rows, or bytes, by the planner's estimate, a join's build side may have to
/// be run first and broadcast as constants with the fragments of its probe side (the
/// bytes are DataFusion's own bound for collecting a join's side whole).
const BROADCAST_ROWS: usize = 10_000;
const BROADCAST_BYTES: usize = 1 << 20;

/// `plan` with the build side of each join that can take it run now and put in as
/// constants ([`MemorySourceConfig`]), so the join and the scan under its other side form
/// one fragment ([`Chain`]). Only where that side is small, its other side is a fragment,
/// and the join answers each probe row alone: a join that also emits unmatched build
/// rows (left, full, left semi/anti) needs every partition's probe rows in one place.
fn broadcast<'a>(plan: Arc<dyn ExecutionPlan>, cx: &'a Cx) -> BoxFuture<'a, Result<Arc<dyn ExecutionPlan>>> {
    async move {
        let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        if children.is_empty() {
            return Ok(plan);
        }
        let mut done = Vec::with_capacity(children.len());
        for c in children {
            done.push(broadcast(c, cx).await?);
        }
        let plan = replace_children_if_necessary(plan, done).map_err(df_err)?;
        let mut children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        let [left, right] = children.as_slice() else {
            return Ok(plan);
        };
        let small = estimated_size(left.as_ref()).is_some_and(|(r, b)| r <= BROADCAST_ROWS || b <= BROADCAST_BYTES);
        if !per_probe_row(plan.as_ref()) || !small || is_constant(left) || Chain::of(right).is_none() {
            return Ok(plan);
        }
        let left = place(left.clone(), false, cx).await?;
        let schema = left.schema();
        let rows = datafusion::physical_plan::collect(left, cx.task.clone()).await.map_err(df_err)?;
        children[0] = MemorySourceConfig::try_new_exec(&[rows], schema, None).map_err(df_err)?;
        replace_children_if_necessary(plan, children).map_err(df_err)
    }
    .boxed()
}

/// The planner's estimate of the rows and bytes `p` yields (unknown: `usize::MAX`).
fn estimated_size(p: &dyn ExecutionPlan) -> Option<(usize, usize)> {
    let stats = StatisticsContext::new().compute(p, &StatisticsArgs::new()).ok()?;
    let known = |v: Option<&usize>| v.copied().unwrap_or(usize::MAX);
    Some((known(stats.num_rows.get_value()), known(stats.total_byte_size.get_value())))
}

/// A join that collects its left input whole and then answers each right row on its own.
fn per_probe_row(p: &dyn ExecutionPlan) -> bool {
    let probe_only =
        |t: &JoinType| matches!(t, JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti);
    if p.is::<CrossJoinExec>() {
        return true;
    }
    if let Some(j) = p.downcast_ref::<HashJoinExec>() {
        return *j.partition_mode() == PartitionMode::CollectLeft && probe_only(j.join_type());
    }
    p.downcast_ref::<NestedLoopJoinExec>().is_some_and(|j| probe_only(j.join_type()))
}

/// Rows put into the plan as constants (a broadcast build side): sent along with a
/// fragment, never placed.
fn is_constant(p: &Arc<dyn ExecutionPlan>) -> bool {
    p.downcast_ref::<DataSourceExec>().is_some_and(|d| d.data_source().downcast_ref::<MemorySourceConfig>().is_some())
}

/// What placing fragments needs: the live workers and the files' blocks, each looked up
/// once, when a fragment first needs them (a plan without Locus scans asks nothing).
struct Cx {
    client: Arc<Client>,
    traffic: Traffic,
    task: Arc<TaskContext>,
    workers: tokio::sync::OnceCell<Vec<pb::WorkerAddress>>,
    files: tokio::sync::Mutex<HashMap<String, Arc<pb::FileInfo>>>,
}

impl Cx {
    async fn workers(&self) -> Result<&[pb::WorkerAddress]> {
        Ok(self.workers.get_or_try_init(|| self.client.workers(false)).await?)
    }

    /// The Locus file `f` reads, with its blocks.
    async fn file(&self, f: &PartitionedFile) -> Result<Arc<pb::FileInfo>> {
        let path = format!("/{}", f.object_meta.location.as_ref());
        let mut m = self.files.lock().await;
        if let Some(f) = m.get(&path) {
            return Ok(f.clone());
        }
        let fi = Arc::new(self.client.status(&path, true).await?);
        m.insert(path, fi.clone());
        Ok(fi)
    }
}

/// The bytes of its file that `f` covers.
fn extent(f: &PartitionedFile) -> (u64, u64) {
    match &f.range {
        Some(r) => (r.start as u64, r.end as u64),
        None => (0, f.object_meta.size),
    }
}

fn place<'a>(
    plan: Arc<dyn ExecutionPlan>,
    under_exchange: bool,
    cx: &'a Cx,
) -> BoxFuture<'a, Result<Arc<dyn ExecutionPlan>>> {
    async move {
        if let Some(chain) = Chain::of(&plan)
            && let Some(r) = remote(chain, under_exchange, cx).await?
        {
            return Ok(r);
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        if children.is_empty() {
            return Ok(plan);
        }
        let exchange = is_exchange(plan.as_ref());
        let mut placed = Vec::with_capacity(children.len());
        for c in children {
            placed.push(place(c, exchange, cx).await?);
        }
        replace_children_if_necessary(plan, placed).map_err(df_err)
    }
    .boxed()
}

/// Where rows move between partitions: below one, partitions are independent.
fn is_exchange(p: &dyn ExecutionPlan) -> bool {
    p.is::<RepartitionExec>() || p.is::<CoalescePartitionsExec>() || p.is::<SortPreservingMergeExec>()
}

/// A fragment: nodes down to a scan of Locus files, none of them an exchange, each with
/// one child on the way down and any others constants ([`is_constant`]); top first.
struct Chain {
    nodes: Vec<Arc<dyn ExecutionPlan>>,
    /// For each node but the scan, which of its children the chain goes on through.
    via: Vec<usize>,
    scan: FileScanConfig,
}

impl Chain {
    fn of(plan: &Arc<dyn ExecutionPlan>) -> Option<Chain> {
        let (mut nodes, mut via) = (vec![plan.clone()], Vec::new());
        loop {
            let p = nodes.last()?.clone();
            if is_exchange(p.as_ref()) || p.is::<DataSinkExec>() || p.is::<AnalyzeExec>() {
                return None;
            }
            let children = p.children();
            if children.is_empty() {
                let ds = p.downcast_ref::<DataSourceExec>()?;
                let scan = ds.data_source().downcast_ref::<FileScanConfig>()?;
                let url: &url::Url = scan.object_store_url.as_ref();
                let locus = url.scheme() == LOCUS_SCHEME;
                return locus.then(|| Chain { nodes, via, scan: scan.clone() });
            }
            let mut on = children.iter().enumerate().filter(|(_, c)| !is_constant(c));
            match (on.next(), on.next()) {
                (Some((i, c)), None) => {
                    via.push(i);
                    nodes.push((*c).clone());
                }
                _ => return None,
            }
        }
    }

    /// The fragment over the scan `groups` (one partition each).
    fn with_groups(&self, groups: Vec<FileGroup>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let scan = FileScanConfigBuilder::from(self.scan.clone()).with_file_groups(groups).build();
        let mut p: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(scan);
        for (n, &i) in self.nodes.iter().rev().skip(1).zip(self.via.iter().rev()) {
            let mut children: Vec<Arc<dyn ExecutionPlan>> = n.children().into_iter().cloned().collect();
            children[i] = p;
            p = replace_children_if_necessary(n.clone(), children)?;
        }
        Ok(p)
    }

    /// Whether a fragment of this scan survives its trip to a worker: `datafusion-proto`
    /// carries no CSV record terminator, so a CSV scan with one (S3 Select's
    /// `RecordDelimiter` other than a newline) runs here.
    fn encodable(&self) -> bool {
        let csv = self.scan.file_source().downcast_ref::<datafusion::datasource::physical_plan::CsvSource>();
        csv.is_none_or(|c| c.terminator().is_none())
    }

    /// Whether the scan may be cut into other partitions: its bytes split at any offset
    /// (as DataFusion itself splits them), and no node above it needs its partitioning.
    fn splittable(&self) -> bool {
        !self.scan.file_compression_type.is_compressed()
            && self.scan.file_source().supports_repartitioning()
            && self.scan.output_ordering.is_empty()
            && self.nodes.iter().zip(&self.via).all(|(n, &i)| {
                let d = n.input_distribution_requirements().into_per_child();
                d.get(i).is_none_or(|d| matches!(d, Distribution::UnspecifiedDistribution))
            })
    }
}

async fn remote(chain: Chain, under_exchange: bool, cx: &Cx) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if !chain.encodable() || cx.workers().await?.is_empty() {
        return Ok(None);
    }
    let mut groups: Vec<FileGroup> = chain.scan.file_groups.clone();
    if under_exchange && chain.splittable() {
        // Each file's ranges (DataFusion's own split) joined, then cut at its blocks.
        let mut files: Vec<(PartitionedFile, Vec<(u64, u64)>)> = Vec::new();
        for f in groups.iter().flat_map(|g| g.iter()) {
            let r = extent(f);
            match files.iter_mut().find(|(g, _)| g.object_meta.location == f.object_meta.location) {
                Some((_, rs)) => rs.push(r),
                None => files.push((f.clone(), vec![r])),
            }
        }
        let mut cut = Vec::new();
        for (f, mut ranges) in files {
            ranges.sort();
            let mut joined: Vec<(u64, u64)> = Vec::new();
            for (s, e) in ranges {
                match joined.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => joined.push((s, e)),
                }
            }
            let fi = cx.file(&f).await?;
            for (start, end) in joined {
                for b in &fi.blocks {
                    let (s, e) = (b.offset.max(start), (b.offset + b.length).min(end));
                    if s < e {
                        let mut piece = f.clone().with_range(s as i64, e as i64);
                        piece.statistics = None; // a file's statistics are not a block's
                        cut.push(FileGroup::new(vec![piece]));
                    }
                }
            }
        }
        if !cut.is_empty() {
            groups = cut;
        }
    }
    let local = match chain.with_groups(groups.clone()) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "a fragment could not be re-planned; it runs here");
            return Ok(None);
        }
    };
    let mut parts = Vec::with_capacity(groups.len());
    for g in groups {
        let workers = rank_workers(&g, cx).await?;
        let plan = match chain.with_groups(vec![g]).and_then(datafusion_proto::bytes::physical_plan_to_bytes) {
            Ok(b) => b.to_vec(),
            Err(e) => {
                tracing::debug!(error = %e, "a fragment cannot be sent to workers; it runs here");
                return Ok(None);
            }
        };
        parts.push(Part { plan: Arc::new(plan), workers });
    }
    let props = local.properties().clone();
    Ok(Some(Arc::new(RemoteExec { local, parts, client: cx.client.clone(), traffic: cx.traffic.clone(), props })))
}

/// The data addresses of the live workers, best first for the bytes of `g`: by bytes
/// held; for bytes no worker holds, the worker a reader fills the first such block on.
async fn rank_workers(g: &FileGroup, cx: &Cx) -> Result<Vec<String>> {
    let workers = cx.workers().await?;
    let mut held: HashMap<u64, u64> = HashMap::new();
    let mut uncached: Option<u64> = None;
    for f in g.iter() {
        let fi = cx.file(f).await?;
        let (start, end) = extent(f);
        for b in &fi.blocks {
            let n = (b.offset + b.length).min(end).saturating_sub(b.offset.max(start));
            if n == 0 {
                continue;
            }
            let live: Vec<u64> = b
                .locations
                .iter()
                .map(|l| l.worker_id)
                .filter(|id| workers.iter().any(|w| w.worker_id == *id))
                .collect();
            if live.is_empty() {
                uncached.get_or_insert(b.block_id);
            }
            for id in live {
                *held.entry(id).or_default() += n;
            }
        }
    }
    // The worker a reader would fill the first uncached block on (`fill_worker`).
    let filler = |id: u64| {
        let w = locus_client::fill_worker(id, workers.iter());
        w.and_then(|w| workers.iter().position(|x| x.worker_id == w.worker_id)).unwrap_or(0)
    };
    let (n, first) = (workers.len(), uncached.map(filler).unwrap_or(0));
    let mut order: Vec<usize> = (0..n).collect();
    // Most bytes held first; among equals, from the filling worker on.
    order.sort_by_key(|&i| {
        (std::cmp::Reverse(held.get(&workers[i].worker_id).copied().unwrap_or(0)), (i + n - first) % n)
    });
    Ok(order.into_iter().map(|i| workers[i].data_address.clone()).collect())
}

/// One partition of a [`RemoteExec`]: its fragment, encoded, and where to run it.
#[derive(Clone)]
struct Part {
    plan: Arc<Vec<u8>>,
    workers: Vec<String>,
}

/// A fragment run on workers, one partition per request ([`Placement::distribute`]).
pub struct RemoteExec {
    /// The fragment itself: what runs here when no worker can.
    local: Arc<dyn ExecutionPlan>,
    parts: Vec<Part>,
    client: Arc<Client>,
    traffic: Traffic,
    props: Arc<PlanProperties>,
}

impl fmt::Debug for RemoteExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteExec({} partitions)", self.parts.len())
    }
}

impl DisplayAs for RemoteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let local = datafusion::physical_plan::displayable(self.local.as_ref()).one_line().to_string();
        write!(f, "RemoteExec: partitions={} on workers, fragment={}", self.parts.len(), local.trim_end())
    }
}

impl ExecutionPlan for RemoteExec {
    fn name(&self) -> &str {
        "RemoteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { Err(DataFusionError::Internal("RemoteExec has no children".into())) }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        let part = self
            .parts
            .get(partition)
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("RemoteExec has no partition {partition}")))?;
        let schema = self.schema();
        let (client, traffic, local) = (self.client.clone(), self.traffic.clone(), self.local.clone());
        let s = schema.clone();
        let stream = futures::stream::once(async move {
            match open(&client, &part).await {
                Ok(Some(pieces)) => Ok(decode(pieces, traffic)),
                Ok(None) => local.execute(partition, context).map(|s| s.boxed()),
                Err(e) => Err(DataFusionError::External(Box::new(e))),
            }
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(s, stream)))
    }
}

type Pieces = futures::stream::BoxStream<'static, Result<FragmentPiece>>;

/// The fragment's answer from the first of its workers that takes it; `None` when none
/// can (gone, or without SQL): the caller runs it.
async fn open(client: &Client, part: &Part) -> Result<Option<Pieces>> {
    for addr in &part.workers {
        let attempt = async {
            let mut s = client.run_fragment(addr, part.plan.to_vec(), 0).await?.boxed();
            // A worker that takes the fragment answers at once with the stream's schema.
            let first = s.next().await.ok_or_else(|| Error::unavailable("no answer"))??;
            Ok::<_, Error>(futures::stream::once(async { Ok(first) }).chain(s).boxed())
        };
        match attempt.await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Io | ErrorKind::FailedPrecondition) => {
                tracing::debug!(worker = %addr, error = %e, "a worker did not take a SQL fragment");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The batches of a fragment's Arrow IPC stream.
fn decode(
    pieces: Pieces,
    traffic: Traffic,
) -> futures::stream::BoxStream<'static, DfResult<datafusion::arrow::record_batch::RecordBatch>> {
    futures::stream::try_unfold(
        (pieces, StreamDecoder::new(), Buffer::from(Vec::<u8>::new())),
        move |(mut pieces, mut dec, mut buf)| {
            let traffic = traffic.clone();
            async move {
                loop {
                    while !buf.is_empty() {
                        if let Some(b) = dec.decode(&mut buf)? {
                            return Ok(Some((b, (pieces, dec, buf))));
                        }
                    }
                    match pieces.next().await {
                        Some(Ok(FragmentPiece::Ipc(b))) => {
                            traffic.returned.fetch_add(b.len() as u64, Relaxed);
                            buf = Buffer::from(b)
                        }
                        Some(Ok(FragmentPiece::Done { scanned: n })) => {
                            traffic.scanned.fetch_add(n, Relaxed);
                            dec.finish()?;
                            return Ok(None);
                        }
                        Some(Err(e)) => return Err(DataFusionError::External(Box::new(e))),
                        None => {
                            return Err(DataFusionError::External(Box::new(Error::unavailable(
                                "a worker's SQL fragment ended early",
                            ))));
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

/// A worker's runner of SQL fragments: a runtime of its own (the scans' CPU work stays
/// off the data path's runtime) and a client to read Locus files with.
pub struct Fragments {
    client: Arc<Client>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Fragments {
    pub fn new(client: Arc<Client>) -> Result<Fragments> {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("locus-sql")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the SQL runtime", e))?;
        Ok(Fragments { client, rt: Some(rt) })
    }

    /// Start partition `partition` of the encoded fragment `plan`: its result as pieces of
    /// an Arrow IPC stream (the schema first, at once), and the bytes its scans read.
    /// Dropping the stream stops the work.
    pub fn run(&self, plan: &[u8], partition: u32) -> Result<(IpcPieces, Arc<AtomicU64>)> {
        let store = LocusStore::new(self.client.clone());
        let read = store.bytes_read();
        let ctx = worker_session(Arc::new(store))?;
        let plan = datafusion_proto::bytes::physical_plan_from_bytes(plan, &ctx.task_ctx()).map_err(df_err)?;
        let partition = partition as usize;
        if partition >= plan.output_partitioning().partition_count() {
            return Err(Error::invalid(format!("the fragment has no partition {partition}")));
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>>>(2);
        let rt = self.rt.as_ref().ok_or_else(|| Error::unavailable("the SQL runtime is stopping"))?;
        rt.spawn(async move {
            let r = async {
                let schema: SchemaRef = plan.schema();
                let mut w = StreamWriter::try_new(Vec::new(), &schema).map_err(arrow_err)?;
                if tx.send(Ok(std::mem::take(w.get_mut()))).await.is_err() {
                    return Ok(());
                }
                let mut batches = plan.execute(partition, ctx.task_ctx()).map_err(df_err)?;
                loop {
                    let next = tokio::select! {
                        b = batches.next() => b,
                        _ = tx.closed() => return Ok(()), // the caller left: stop scanning
                    };
                    let Some(b) = next else { break };
                    w.write(&b.map_err(df_err)?).map_err(arrow_err)?;
                    if tx.send(Ok(std::mem::take(w.get_mut()))).await.is_err() {
                        return Ok(());
                    }
                }
                w.finish().map_err(arrow_err)?;
                let _ = tx.send(Ok(std::mem::take(w.get_mut()))).await;
                Ok::<_, Error>(())
            };
            if let Err(e) = r.await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok((tokio_stream_of(rx), read))
    }
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> futures::stream::BoxStream<'static, T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

fn arrow_err(e: datafusion::arrow::error::ArrowError) -> Error {
    df_err(DataFusionError::ArrowError(Box::new(e), None))
}

impl locus_proto::fragment::FragmentRunner for Fragments {
    fn run(&self, plan: &[u8], partition: u32) -> Result<(locus_proto::fragment::FragmentStream, Arc<AtomicU64>)> {
        Fragments::run(self, plan, partition)
    }
}

/// How a worker makes its [`Fragments`]: with a client (`cfg`) of its own that presents
/// the client token of the cluster secret (a fragment reads what a client may read, and
/// no more).
pub fn factory(cfg: locus_common::config::ClientConfig) -> locus_proto::fragment::FragmentFactory {
    Arc::new(move |master: &str, secret: &locus_common::security::Secret, tls: &locus_client::Tls| {
        let c = Client::with_tls(master, cfg.clone(), secret.client_token(), tls.clone())?;
        Ok(Arc::new(Fragments::new(Arc::new(c))?) as Arc<dyn locus_proto::fragment::FragmentRunner>)
    })
}

impl Drop for Fragments {
    fn drop(&mut self) {
        // A runtime must not be dropped on a runtime's thread (a worker shuts down there).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A session for running fragments: `store` is its only object store (a fragment may
/// name no other: a worker's local files are not for callers to read).
fn worker_session(store: Arc<LocusStore>) -> Result<SessionContext> {
    let registry = Arc::new(OnlyLocus(store));
    let env = RuntimeEnvBuilder::new().with_object_store_registry(registry).build_arc().map_err(df_err)?;
    Ok(SessionContext::new_with_config_rt(SessionConfig::new(), env))
}

/// An object-store registry that knows `locus://` only.
#[derive(Debug)]
struct OnlyLocus(Arc<LocusStore>);

impl ObjectStoreRegistry for OnlyLocus {
    fn register_store(&self, _url: &url::Url, _store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        None
    }

    fn get_store(&self, url: &url::Url) -> DfResult<Arc<dyn ObjectStore>> {
        if url.scheme() == "locus" {
            Ok(self.0.clone())
        } else {
            Err(DataFusionError::Plan(format!("a SQL fragment on a worker reads locus:// files only, not {url}")))
        }
    }
}
