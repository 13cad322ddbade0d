//! `locus fs search` (metadata search in Zenko's syntax, or SQL over the catalog) and
//! `locus fs index import` (S3 Inventory-style manifests into the catalog).

use std::io::Write;
use std::sync::Arc;

use anyhow::Result;
use clap::{Args, Subcommand};
use locus_client::Client;
use locus_common::Error;
use locus_proto::pb;
use serde_json::json;

use super::inventory;

#[derive(Args)]
pub struct SearchArgs {
    /// [PATH] WHERE: the directory to search (default /: every mount; keys are relative
    /// to it) and a clause in Zenko's syntax, e.g. `x-amz-meta-color = blue AND
    /// content-length > 1000` or `key LIKE "^logs/2026-.*\.gz$"`. Attributes: key,
    /// content-length, last-modified, content-type, etag, x-amz-meta-NAME, tags.NAME,
    /// locus.cached, locus.tier, locus.persist-state, locus.pinned, locus.mount.
    #[arg(num_args = 0..=2, value_names = ["PATH", "WHERE"])]
    pub args: Vec<String>,
    /// One JSON object per match (key, path, size, last_modified, etag, content_type,
    /// metadata, tags and Locus's own attributes).
    #[arg(long)]
    pub json: bool,
    /// Print only the number of matches.
    #[arg(long, conflicts_with = "sql")]
    pub count: bool,
    /// Print at most this many matches (default: all).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Only keys that start with this prefix.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// A SQL query over the catalog instead of a clause: the table `objects` has key,
    /// size, last_modified, content_type, etag, metadata and tags (maps), cached, tier,
    /// persist_state, pinned and mount; e.g. "SELECT content_type, count(*), sum(size)
    /// FROM objects WHERE key LIKE 'logs/%' GROUP BY 1". Needs the `sql` build.
    #[arg(long, value_name = "QUERY")]
    pub sql: Option<String>,
    /// --sql output: table, csv or json.
    #[arg(long, default_value = "table")]
    pub format: String,
}

#[derive(Args)]
pub struct IndexArgs {
    #[command(subcommand)]
    pub cmd: IndexCmd,
}

#[derive(Subcommand)]
pub enum IndexCmd {
    /// Index the objects an inventory lists, without a HEAD per object: S3 Inventory
    /// manifests (manifest.json with CSV or Parquet files), or CSV, Parquet or JSON-lines
    /// files themselves (JSON lines may carry `metadata` and `tags` maps). A re-import of
    /// the same manifest changes nothing; an interrupted one is finished by running it again.
    Import(inventory::Manifests),
}

/// PATH and WHERE from the positional arguments.
fn path_and_clause(a: &SearchArgs) -> Result<(String, String)> {
    match a.args.as_slice() {
        [w] => Ok(("/".into(), w.clone())),
        [p, w] => Ok((p.clone(), w.clone())),
        _ => Err(Error::invalid("give a clause to search for (locus fs search [PATH] WHERE), or --sql QUERY").into()),
    }
}

fn hit_json(h: &pb::SearchHit) -> serde_json::Value {
    let fi = h.info.clone().unwrap_or_default();
    let meta = fi.meta.clone().unwrap_or_default();
    json!({
        "key": h.key, "path": fi.path, "size": fi.length,
        "last_modified": iso(fi.mtime_ms), "etag": meta.etag, "content_type": meta.content_type,
        "metadata": meta.user, "tags": meta.tags,
        "cached": h.cached, "tier": h.tier, "persist_state": fi.persist_state().name(),
        "pinned": fi.pinned, "mount": fi.mount_point,
    })
}

fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64);
    humantime::format_rfc3339_millis(t + std::time::Duration::from_millis(ms.rem_euclid(1000) as u64)).to_string()
}

pub async fn search(c: &Arc<Client>, a: &SearchArgs) -> Result<()> {
    if let Some(q) = &a.sql {
        return sql(c, q, &a.format).await;
    }
    let (path, clause) = path_and_clause(a)?;
    if clause.trim().is_empty() {
        return Err(Error::invalid("the search is empty").into());
    }
    let mut req = pb::SearchRequest {
        path,
        r#where: clause,
        prefix: a.prefix.clone(),
        count_only: a.count,
        limit: 1000,
        ..Default::default()
    };
    if a.count {
        let r = c.search(req).await?;
        println!("{}", r.count);
        return Ok(());
    }
    let mut left = a.limit.unwrap_or(u64::MAX);
    let mut out = std::io::stdout().lock();
    while left > 0 {
        req.limit = left.min(1000) as u32;
        let r = c.search(req.clone()).await?;
        for h in &r.hits {
            let line = if a.json {
                hit_json(h).to_string()
            } else {
                let fi = h.info.clone().unwrap_or_default();
                format!("{:>12}  {}  {}", fi.length, iso(fi.mtime_ms), h.key)
            };
            if let Err(e) = writeln!(out, "{line}") {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(());
                }
                return Err(e.into());
            }
        }
        left = left.saturating_sub(r.hits.len() as u64);
        if !r.truncated {
            break;
        }
        req.after = r.next_after;
    }
    Ok(())
}

#[cfg(feature = "sql")]
async fn sql(c: &Arc<Client>, q: &str, format: &str) -> Result<()> {
    let format = locus_sql::Format::parse(format)
        .ok_or_else(|| Error::invalid(format!("unknown --format {format:?} (table, csv or json)")))?;
    let batches = locus_sql::catalog::run(c.clone(), q).await?;
    locus_sql::query::write(&batches, format, &mut std::io::stdout().lock())?;
    Ok(())
}

#[cfg(not(feature = "sql"))]
async fn sql(_: &Arc<Client>, _: &str, _: &str) -> Result<()> {
    Err(Error::new(
        locus_common::ErrorKind::FailedPrecondition,
        "this locus was built without SQL (cargo feature `sql`)",
    )
    .into())
}

pub async fn index(c: &Arc<Client>, a: &IndexArgs) -> Result<()> {
    match &a.cmd {
        IndexCmd::Import(m) => {
            let t = std::time::Instant::now();
            let (n, skipped) = inventory::import(c, m).await?;
            let secs = t.elapsed().as_secs_f64();
            println!(
                "indexed {n} object(s) in {secs:.1} s ({:.0}/s){}",
                n as f64 / secs.max(1e-9),
                if skipped > 0 {
                    format!("; {skipped} already in the namespace kept as they are")
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
