//! Cluster administration from the CLI: `locus report` and `locus fs mount`/`unmount`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use locus_client::Client;
use locus_common::Error;
use locus_common::config::WriteType;
use locus_common::metrics::ReadSource;
use locus_proto::pb;
use locus_proto::report::{ClusterReport, HostReads};
use serde_json::json;

use super::{Global, human, runtime};

#[derive(Args)]
pub struct MountArgs {
    /// Locus path to mount at (e.g. /s3). With no PATH and URI, list the mounts.
    pub path: Option<String>,
    /// The UFS: s3://bucket[/prefix] or file:///dir.
    pub uri: Option<String>,
    /// key=value, e.g. endpoint=http://127.0.0.1:9000, region=us-east-1. Repeatable. Put
    /// credentials in --option-file or --option-env instead: arguments show in `ps`.
    #[arg(long = "option", value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// A file of key=value lines (# comments), e.g. access_key_id and secret_access_key;
    /// keep it mode 600.
    #[arg(long, value_name = "FILE")]
    pub option_file: Option<std::path::PathBuf>,
    /// key=VAR: the option's value is environment variable VAR of this command, e.g.
    /// secret_access_key=AWS_SECRET_ACCESS_KEY. Repeatable.
    #[arg(long = "option-env", value_name = "KEY=VAR")]
    pub option_env: Vec<String>,
    /// Refuse writes under this mount.
    #[arg(long)]
    pub readonly: bool,
    /// How old metadata may get before it is checked against the UFS (e.g. 30s; 0s checks
    /// every time): listings, file statuses, and "not found" for a path looked up before.
    /// Default: master.default_sync_interval (60s).
    #[arg(long)]
    pub sync_interval: Option<String>,
    /// Default write type of writes under this mount (else the cluster's).
    #[arg(long)]
    pub write_type: Option<String>,
    /// List the mounts as JSON lines (credentials redacted).
    #[arg(long)]
    pub json: bool,
}

/// The mount options of the command line: the file's, then --option-env's, then
/// --option's (a later source overrides an earlier one for the same key).
fn mount_options(a: &MountArgs) -> Result<HashMap<String, String>, Error> {
    let mut opts = HashMap::new();
    if let Some(p) = &a.option_file {
        let text = std::fs::read_to_string(p)
            .map_err(|e| Error::invalid(format!("cannot read --option-file {}: {e}", p.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| Error::invalid(format!("{} line {}: not key=value", p.display(), n + 1)))?;
            opts.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    for o in &a.option_env {
        let (k, var) = o.split_once('=').ok_or_else(|| Error::invalid(format!("--option-env {o:?} is not KEY=VAR")))?;
        let v = std::env::var(var)
            .map_err(|_| Error::invalid(format!("--option-env {k}: environment variable {var} is not set")))?;
        opts.insert(k.to_string(), v);
    }
    for o in &a.options {
        let (k, v) = o.split_once('=').ok_or_else(|| Error::invalid(format!("option {o:?} is not key=value")))?;
        opts.insert(k.to_string(), v.to_string());
    }
    Ok(opts)
}

/// Mount a UFS at a path; with no path and URI, list the mounts.
pub async fn mount(c: &Client, a: &MountArgs) -> Result<()> {
    let MountArgs { path, uri, readonly, sync_interval, write_type, json: as_json, .. } = a;
    let (Some(path), Some(uri)) = (path, uri) else {
        let t = c.mount_table().await?;
        for m in t {
            if *as_json {
                println!(
                    "{}",
                    json!({"path": m.path, "uri": m.uri, "readonly": m.readonly, "sync_interval_ms": m.sync_interval_ms, "options": m.options})
                );
            } else {
                println!(
                    "{}  on  {}  ({}sync {}ms)",
                    m.uri,
                    m.path,
                    if m.readonly { "ro, " } else { "" },
                    m.sync_interval_ms
                );
            }
        }
        return Ok(());
    };
    let opts = mount_options(a)?;
    let sync_interval_ms = match sync_interval {
        Some(s) => {
            let d: Duration =
                humantime::parse_duration(s).map_err(|e| Error::invalid(format!("bad --sync-interval {s:?}: {e}")))?;
            d.as_millis().max(1) as u64
        }
        None => 0,
    };
    let m = c
        .mount(pb::MountRequest {
            path: path.clone(),
            uri: uri.clone(),
            options: opts,
            readonly: *readonly,
            sync_interval_ms,
            write_type: pb::WriteType::from_opt(write_type.as_deref().map(WriteType::parse_or_err).transpose()?).into(),
        })
        .await?;
    println!("mounted {} at {}", m.uri, m.path);
    Ok(())
}

pub async fn unmount(c: &Client, path: &str) -> Result<()> {
    c.unmount(path).await?;
    println!("unmounted {path}");
    Ok(())
}

/// `locus report`: workers, capacity, persist backlog, bytes read by source, the cache;
/// with `by_host`, the client reads by client host.
pub fn report(g: &Global, as_json: bool, by_host: bool) -> Result<()> {
    let cfg = g.load_config([])?;
    runtime()?.block_on(async move {
        let c = super::client(&cfg)?;
        let r = c.report().await?;
        let mounts = c.mount_table().await?;
        let rep = ClusterReport::new(&r, &mounts);
        match (as_json, by_host) {
            (true, false) => println!("{}", serde_json::to_string_pretty(&rep)?),
            (true, true) => println!("{}", serde_json::to_string_pretty(&rep.by_host)?),
            (false, true) => print_by_host(&rep.by_host),
            (false, false) => print_report(&rep),
        }
        Ok(())
    })
}

/// The client reads by host: bytes by source and the share read short-circuit.
fn print_by_host(hosts: &[HostReads]) {
    println!("Client reads by host, since the master started (as of the workers' last heartbeats):");
    print!("  {:<24} {:>8}", "host", "reads");
    for s in ReadSource::ALL {
        print!(" {:>14}", s.label());
    }
    println!(" {:>14}", "short-circuit %");
    for h in hosts {
        print!("  {:<24} {:>8}", h.host, h.reads);
        for s in ReadSource::ALL {
            print!(" {:>14}", human(h.from_source(s)));
        }
        println!(" {:>14.1}", h.short_circuit_share * 100.0);
    }
    println!("Why reads were not short-circuit: locus doctor --reads");
}

fn print_report(r: &ClusterReport) {
    if let Some(g) = &r.masters {
        let ago = (r.now_ms - g.elected_ms).max(0) as f64 / 1000.0;
        println!(
            "Masters: term {}, log {}, applied {}, leader since {ago:.1}s",
            g.term, g.last_log_index, g.applied_index
        );
        for m in &g.members {
            println!(
                "  {:<9} {} (rpc {})  matched {}, {} behind",
                m.role, m.raft_address, m.rpc_address, m.matched_index, m.lag
            );
        }
    }
    println!("Workers: {} live", r.live_workers);
    for w in &r.workers {
        let tiers: Vec<String> = w
            .tiers
            .iter()
            .map(|t| {
                let pooled = if t.pooled > 0 { format!(" (+{} pooled)", human(t.pooled)) } else { String::new() };
                format!("{} {}/{}{pooled}", t.alias, human(t.used), human(t.capacity))
            })
            .collect();
        let state = if w.live { "live" } else { "LOST" };
        println!("  #{} {} {} {state}  {}", w.id, w.host, w.data_address, tiers.join("  "));
    }
    println!("Capacity:");
    for (k, v) in &r.capacity {
        println!("  {k}: {} used of {}", human(v.used), human(v.capacity));
    }
    let b = &r.persist_backlog;
    println!(
        "Persist backlog: {} file(s), {}, oldest {:.1}s ({} queued UFS operation(s))",
        b.files,
        human(b.bytes),
        b.oldest_age_ms as f64 / 1000.0,
        b.queued_ops
    );
    let f = &r.persist_failed;
    if f.ops > 0 {
        println!("Persist failures: {} operation(s) given up (locus fs persist --retry PATH, or --drop PATH)", f.ops);
        for o in &f.operations {
            println!("  {:<8} {}  ({} attempt(s)) {}", o.kind, o.path, o.failures, o.error);
        }
    }
    // Workers send their counters with each heartbeat: a read finished just now shows
    // once its worker has beaten since.
    let oldest = r.workers.iter().filter(|w| w.live).map(|w| w.last_heartbeat_ms_ago).max().unwrap_or(0);
    println!("Bytes read by source (as of the workers' last heartbeats, at most {:.1} s ago):", oldest as f64 / 1000.0);
    for s in ReadSource::ALL {
        println!("  {:<14} {}", s.as_str(), human(r.read_from(s)));
    }
    let c = &r.cache;
    println!(
        "Cache (counted in block reads, not bytes): {} hits, {} misses, {} evictions, hit ratio {:.3}",
        c.hits, c.misses, c.evictions, c.hit_ratio
    );
    println!(
        "Near-data compute: {} scanned on workers, {} returned to callers",
        human(r.compute.bytes_scanned),
        human(r.compute.bytes_returned)
    );
    println!(
        "Bytes written: {} short-circuit (into block files by co-located clients), {} over the data path",
        human(r.bytes_written.short_circuit),
        human(r.bytes_written.data_path)
    );
    println!("Background jobs:");
    println!(
        "  {:<10} {:<20} {:<8} {:>8} {:>8} {:>10} {:>8}  last error",
        "on", "job", "state", "runs", "failures", "last run", "backlog"
    );
    for job in &r.jobs {
        let last = job.last_run_s_ago.map_or_else(|| "never".into(), |s| format!("{s:.1}s ago"));
        println!(
            "  {:<10} {:<20} {:<8} {:>8} {:>8} {:>10} {:>8}  {}",
            job.on, job.name, job.state, job.runs, job.failures, last, job.backlog, job.last_error
        );
    }
}
