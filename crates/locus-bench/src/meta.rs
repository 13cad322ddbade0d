//! `locus bench meta`: master metadata throughput through the real RPC path (gRPC on
//! loopback, many concurrent callers): creates of empty files, each durable in redb
//! before it is acknowledged (one CreateFile call; and CreateFile + CompleteFile, the two
//! calls a data write makes), opens (GetStatus) and listings (ListStatus pages of 100
//! entries). Prints medians over the runs, and the ratio of the create rate to the 10k
//! creates/s goal.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use locus_common::Result;
use locus_common::config::WriteType;
use serde::Serialize;

use crate::{loopback_config, median, with_cluster};

/// Creates per second the master must sustain (issue goal).
pub const CREATE_GOAL: f64 = 10_000.0;
/// Entries per listing page.
const LIST_PAGE: u32 = 100;

#[derive(Clone, Debug)]
pub struct MetaBench {
    pub files: usize,
    pub concurrency: usize,
    pub runs: usize,
    pub work_dir: PathBuf,
    /// Run the master as a one-member replicated group (its changes through the log).
    pub group: bool,
    /// With 2 or more: the same work against one master without a group first, then
    /// against a group of this many masters in this process, side by side.
    pub masters: usize,
}

#[derive(Serialize)]
pub struct MetaRow {
    /// The master(s) measured: "1 master", or "3 masters (replicated group)".
    pub setup: String,
    pub name: String,
    pub ops_per_s: Vec<f64>,
    pub median_ops_per_s: f64,
}

/// Run `n` operations `op(i)` with `conc` in flight; returns operations per second.
async fn rate<F, Fut>(n: usize, conc: usize, op: F) -> Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let t = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(0..n).map(op).buffer_unordered(conc).collect().await;
    let secs = t.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(n as f64 / secs)
}

impl MetaBench {
    pub async fn run(&self) -> Result<Vec<MetaRow>> {
        let mut cfg = loopback_config();
        if self.masters > 1 {
            // Each in a data dir of its own, its MEM tiers (under /dev/shm) removed after.
            let (one, work) = (self.work_dir.join("one"), self.work_dir.join("group"));
            let rows = with_cluster(cfg.clone(), &one, false, async |c| self.measure(c, "1 master").await).await;
            let _ = locus_cluster::clean(&one, true);
            let mut rows = rows?;
            let group = locus_cluster::LocalCluster::start_group(cfg, &work, self.masters, 1, None).await?;
            let setup = format!("{} masters (replicated group)", self.masters);
            let measured = self.measure(&group, &setup).await;
            group.shutdown().await;
            let _ = locus_cluster::clean(&work, true);
            rows.extend(measured?);
            return Ok(rows);
        }
        if self.group {
            cfg.master.raft_address = "127.0.0.1:0".into();
        }
        let setup = if self.group { "1 master, a one-member group" } else { "1 master" };
        with_cluster(cfg, &self.work_dir, false, async |c| self.measure(c, setup).await).await
    }

    async fn measure(&self, cluster: &locus_cluster::LocalCluster, setup: &str) -> Result<Vec<MetaRow>> {
        let client = Arc::new(cluster.client(Default::default())?);
        let (mut creates, mut creates2, mut opens, mut lists) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..self.runs {
            let dir = format!("/meta{run}");
            client.mkdir(&dir, true).await?;
            client.mkdir(&format!("{dir}-2"), true).await?;
            let path = |i: usize| format!("{dir}/f{i:08}");
            let c = client.clone();
            // MUST_CACHE: an empty file is a namespace entry only, with no persist behind it.
            creates.push(
                rate(self.files, self.concurrency, |i| {
                    let (c, p) = (c.clone(), path(i));
                    async move { c.touch(&p, Some(WriteType::MustCache)).await.map(|_| ()) }
                })
                .await?,
            );
            creates2.push(
                rate(self.files, self.concurrency, |i| {
                    let (c, p) = (c.clone(), format!("{dir}-2/f{i:08}"));
                    async move { c.create_and_complete_empty(&p, Some(WriteType::MustCache)).await.map(|_| ()) }
                })
                .await?,
            );
            opens.push(
                rate(self.files, self.concurrency, |i| {
                    let (c, p) = (c.clone(), path(i));
                    async move { c.status(&p, false).await.map(|_| ()) }
                })
                .await?,
            );
            // Listings: each caller pages through its own slice of the directory.
            let pages = self.files.div_ceil(LIST_PAGE as usize);
            lists.push(
                rate(pages, self.concurrency, |k| {
                    let (c, d) = (c.clone(), dir.clone());
                    let after = if k == 0 {
                        String::new()
                    } else {
                        path(k * LIST_PAGE as usize - 1)[dir.len() + 1..].to_string()
                    };
                    async move {
                        let (page, _) = c.list_page(&d, &after, false, LIST_PAGE).await?;
                        if page.is_empty() {
                            return Err(locus_common::Error::internal("empty listing page"));
                        }
                        Ok(())
                    }
                })
                .await?,
            );
            eprintln!(
                "{setup}, run {}/{}: {:.0} creates/s ({:.0} as create + complete), {:.0} opens/s, {:.0} lists/s",
                run + 1,
                self.runs,
                creates[run],
                creates2[run],
                opens[run],
                lists[run]
            );
        }
        let row = |name: &str, v: Vec<f64>| MetaRow {
            setup: setup.into(),
            name: name.into(),
            median_ops_per_s: median(&v),
            ops_per_s: v,
        };
        Ok(vec![
            row("create (one CreateFile call, durable)", creates),
            row("create + complete (CreateFile, CompleteFile: as a data write, durable)", creates2),
            row("open (GetStatus)", opens),
            row(&format!("list (ListStatus, {LIST_PAGE} entries per page)"), lists),
        ])
    }
}

pub fn markdown(b: &MetaBench, rows: &[MetaRow]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "### locus bench meta: {} files per run, {} callers in flight, {} runs (medians)\n\n",
        b.files, b.concurrency, b.runs
    ));
    s.push_str("| master(s) | operation | median ops/s | runs (ops/s) |\n|---|---|---:|---|\n");
    for r in rows {
        let runs: Vec<String> = r.ops_per_s.iter().map(|v| format!("{v:.0}")).collect();
        s.push_str(&format!("| {} | {} | {:.0} | {} |\n", r.setup, r.name, r.median_ops_per_s, runs.join(", ")));
    }
    if let Some(c) = rows.first() {
        s.push_str(&format!(
            "\ncreate rate / goal ({:.0}/s): **{:.2}×**\n",
            CREATE_GOAL,
            c.median_ops_per_s / CREATE_GOAL
        ));
    }
    // Side by side: each operation of the group against the one master (goal ≥ 0.6×).
    let (one, group): (Vec<&MetaRow>, Vec<&MetaRow>) = rows.iter().partition(|r| r.setup == "1 master");
    if b.masters > 1 && one.len() == group.len() {
        s.push_str(&format!("\n{} masters ÷ 1 master (goal ≥ 0.6×):\n\n", b.masters));
        for (o, g) in one.iter().zip(&group) {
            s.push_str(&format!("- {}: **{:.2}×**\n", o.name, g.median_ops_per_s / o.median_ops_per_s));
        }
    }
    s
}
