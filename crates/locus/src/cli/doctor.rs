//! `locus doctor`: checks the cluster from the calling host and says, in plain words and
//! with the fix, what is wrong: the master, the workers, each mount's UFS, clocks, free
//! space under the tiers, open-file limits, the client token, and for this host whether
//! a worker is local, its short-circuit socket reachable and a test read short-circuit.
//! `locus doctor --reads` explains the recent reads that were not short-circuit, by host
//! and reason, from the workers' attribution.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use locus_client::{Client, PutOptions};
use locus_common::config::{Config, WriteType};
use locus_common::metrics::ReadReason;
use locus_common::{ErrorKind, security};
use locus_proto::pb;
use serde_json::json;

use super::{Global, human, runtime};

#[derive(Args)]
pub struct DoctorArgs {
    /// Explain the recent reads that were not short-circuit, by client host and reason,
    /// instead of running the checks.
    #[arg(long)]
    pub reads: bool,
    /// With --reads: how far back, e.g. 10m or 2h (default: all the master keeps, 24h).
    #[arg(long, requires = "reads", value_name = "DURATION")]
    pub since: Option<String>,
    /// With --reads: only the reads of this client host (as clients name it,
    /// `client.host`; default every host).
    #[arg(long, requires = "reads", value_name = "HOST")]
    pub host: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Skip the test read (it writes a 1 MiB MUST_CACHE file under --probe-dir, reads it
    /// back and deletes it).
    #[arg(long)]
    pub no_test_read: bool,
    /// Where the test read's file goes.
    #[arg(long, default_value = "/.locus-doctor", value_name = "DIR")]
    pub probe_dir: String,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Status {
    Ok,
    Skip,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One finding: what was checked, how it went, what was seen, and what to do.
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    fix: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name, status, detail: detail.into(), fix: fix.into() }
}

/// Clock skew a warning starts at, and the one S3 signatures no longer survive (15 min).
const SKEW_WARN_MS: i64 = 1_000;
const SKEW_FAIL_MS: i64 = 15 * 60 * 1_000;
/// Open-file limits below these are warned about: a worker holds a file per leased or
/// filling block and a socket per reader; a client a socket per worker and block.
const NOFILE_WORKER: u64 = 16_384;
const NOFILE_CLIENT: u64 = 4_096;
/// The test read's size (one block).
const PROBE_BYTES: usize = 1 << 20;

pub fn run(g: &Global, a: &DoctorArgs) -> Result<()> {
    let mut cfg = g.load_config([])?;
    // A doctor answers at once: no retrying a master that is down.
    cfg.client.master_retry = Duration::ZERO;
    cfg.client.rpc_timeout = cfg.client.rpc_timeout.min(Duration::from_secs(10));
    if a.reads {
        return reads(&cfg, a);
    }
    let checks = runtime()?.block_on(checks(&cfg, a));
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if a.json {
        let v: Vec<_> = checks
            .iter()
            .map(|c| json!({"check": c.name, "status": c.status.as_str(), "detail": c.detail, "fix": c.fix}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({"checks": v, "failed": failed}))?);
    } else {
        for c in &checks {
            println!("[{:<4}] {:<18} {}", c.status.as_str(), c.name, c.detail);
            if !c.fix.is_empty() && c.status != Status::Ok {
                println!("       {:<18} fix: {}", "", c.fix);
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}

async fn checks(cfg: &Config, a: &DoctorArgs) -> Vec<Check> {
    let mut out = Vec::new();
    // The client token (or the cluster secret it derives from) on this host.
    let sec = &cfg.security;
    match security::client_credential(sec) {
        Ok(_) if sec.token_file.exists() => out.push(private_file_check(&sec.token_file)),
        Ok(_) => {
            // No token file: the credential came from the cluster secret, the services'.
            let mut c = private_file_check(&sec.secret_file);
            if c.status == Status::Ok {
                c.status = Status::Warn;
                c.detail = format!(
                    "no client token at {}; this host holds the cluster secret {} (the services' credential)",
                    sec.token_file.display(),
                    sec.secret_file.display()
                );
                c.fix = "clients need only client.token: copy it here and name it with --token-file or \
                         LOCUS_SECURITY__TOKEN_FILE; keep the secret on the master and worker hosts"
                    .into();
            }
            out.push(c);
        }
        Err(e) => {
            out.push(check(
                "client token",
                Status::Fail,
                e.to_string(),
                "copy client.token from the master's data directory to this host (mode 600) and name it with \
                 --token-file or LOCUS_SECURITY__TOKEN_FILE",
            ));
            return out;
        }
    }
    let c = match Client::from_config(cfg) {
        Ok(c) => c,
        Err(e) => {
            out.push(check("master", Status::Fail, e.to_string(), "fix the client configuration"));
            return out;
        }
    };
    // The master: reachable, and accepting this client's token.
    let t0 = Instant::now();
    let (before, rep, after) = (locus_common::now_ms(), c.report().await, locus_common::now_ms());
    let rep = match rep {
        Ok(r) => {
            out.push(check(
                "master",
                Status::Ok,
                format!("{} answered in {:.1} ms", cfg.master_address, t0.elapsed().as_secs_f64() * 1e3),
                "",
            ));
            r
        }
        Err(e) => {
            let fix = match e.kind() {
                ErrorKind::Unauthenticated | ErrorKind::PermissionDenied => {
                    "this host's client token is not the cluster's: copy client.token from the master's data directory"
                        .to_string()
                }
                _ => format!(
                    "start the master (`locus master`, or `locus local start`), or point --master / LOCUS_MASTER at it \
                     (now {})",
                    cfg.master_address
                ),
            };
            out.push(check("master", Status::Fail, format!("{}: {e}", cfg.master_address), fix));
            return out;
        }
    };
    if let Some(g) = &rep.group {
        out.push(masters_check(cfg, g, rep.now_ms).await);
    }
    out.push(workers_check(&rep));
    for m in c.check_ufs().await.unwrap_or_default() {
        out.push(if m.ok {
            check("ufs", Status::Ok, format!("{} ({}) answered in {} ms", m.path, m.uri, m.latency_ms), "")
        } else {
            check(
                "ufs",
                Status::Fail,
                format!("{} ({}): {}", m.path, m.uri, m.error),
                "check the store's endpoint, bucket and credentials (`locus fs mount` lists the mounts; mount again \
                 with corrected --option-file)",
            )
        });
    }
    out.push(clock_check(&rep, before, after));
    out.extend(space_checks(&rep));
    out.push(nofile_check(&rep));
    let workers: Vec<pb::WorkerAddress> = c.workers(true).await.unwrap_or_default();
    let local = local_worker_check(&c, cfg, &workers).await;
    let has_local = local.status == Status::Ok;
    out.push(local);
    if a.no_test_read {
        out.push(check("test read", Status::Skip, "skipped (--no-test-read)", ""));
    } else if workers.is_empty() {
        out.push(check("test read", Status::Skip, "no live worker to read from", ""));
    } else {
        out.push(test_read(&c, cfg, &a.probe_dir, has_local).await);
    }
    out
}

fn private_file_check(file: &std::path::Path) -> Check {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(file) {
        Ok(m) if m.permissions().mode() & 0o077 != 0 => check(
            "client token",
            Status::Fail,
            format!("{} is readable by other users (mode {:o})", file.display(), m.permissions().mode() & 0o777),
            format!("chmod 600 {}", file.display()),
        ),
        Ok(_) => check("client token", Status::Ok, format!("{} (mode 600)", file.display()), ""),
        Err(e) => check("client token", Status::Fail, format!("{}: {e}", file.display()), ""),
    }
}

/// A member this many entries behind the leader is warned about (it catches up by
/// itself, or by snapshot; a lag that stays says its disk or link is slow).
const LAG_WARN: u64 = 10_000;

/// The master group as its leader reports it, and whether each member answers on its
/// own (a member down leaves the group one failure closer to stopping).
async fn masters_check(cfg: &Config, g: &pb::MasterGroupStatus, now_ms: i64) -> Check {
    let (mut rows, mut down) = (Vec::new(), Vec::new());
    for m in &g.masters {
        let role = if m.leader {
            "leader"
        } else if m.voter {
            "follower"
        } else {
            "learner"
        };
        let mut one = cfg.clone();
        one.master_address = m.rpc_address.clone();
        let answer = match Client::from_config(&one) {
            Ok(c) => c.masters().await.map(drop),
            Err(e) => Err(e),
        };
        match answer {
            Ok(()) => rows.push(format!("{} {role} (lag {})", m.rpc_address, m.lag)),
            Err(e) => down.push(format!("{} {role}: {e}", m.rpc_address)),
        }
    }
    let voters = g.masters.iter().filter(|m| m.voter).count();
    let since = (now_ms - g.elected_ms).max(0) as f64 / 1e3;
    let mut detail = format!("term {}, leader since {since:.0} s ago; {}", g.term, rows.join(", "));
    let behind = g.masters.iter().filter(|m| m.lag > LAG_WARN).count();
    if !down.is_empty() {
        detail += &format!("; not answering: {}", down.join("; "));
        let fix = format!(
            "restart the masters not answering (each with its --raft-address and --peers), or replace a dead one: \
             `locus admin masters remove RAFT_ADDRESS`, then start a new one and `locus admin masters add` it; the \
             group serves while a majority of its {voters} voters answers"
        );
        check("masters", Status::Warn, detail, fix)
    } else if behind > 0 {
        let fix = "check the lagging member's disk and network: it catches up by itself, or from a snapshot";
        check("masters", Status::Warn, detail, fix)
    } else {
        check("masters", Status::Ok, detail, "")
    }
}

fn workers_check(rep: &pb::Report) -> Check {
    let live = rep.workers.iter().filter(|w| w.live).count();
    let lost: Vec<String> = rep
        .workers
        .iter()
        .filter(|w| !w.live)
        .map(|w| {
            let a = w.address.clone().unwrap_or_default();
            format!("#{} {} (last heard {:.0} s ago)", a.worker_id, a.host, w.last_heartbeat_ms_ago as f64 / 1e3)
        })
        .collect();
    if live == 0 {
        check(
            "workers",
            Status::Fail,
            "no live worker",
            "start a worker (`locus worker --master ADDRESS`) on each host that should cache data",
        )
    } else if !lost.is_empty() {
        check(
            "workers",
            Status::Warn,
            format!("{live} live; lost: {}", lost.join(", ")),
            "restart the lost workers, or ignore them if they were retired (the master forgets them on restart)",
        )
    } else {
        check("workers", Status::Ok, format!("{live} live"), "")
    }
}

fn clock_check(rep: &pb::Report, before: i64, after: i64) -> Check {
    // This host against the master, taking the middle of the call's round trip.
    let mut skews = vec![(format!("this host ({} ms round trip)", after - before), (before + after) / 2 - rep.now_ms)];
    for w in rep.workers.iter().filter(|w| w.live) {
        let a = w.address.clone().unwrap_or_default();
        skews.push((format!("worker #{} {}", a.worker_id, a.host), w.clock_skew_ms));
    }
    let worst = skews.iter().map(|s| s.1.abs()).max().unwrap_or(0);
    let detail =
        skews.iter().map(|(who, s)| format!("{who} {s:+} ms")).collect::<Vec<_>>().join(", ") + " against the master";
    let fix = "run NTP (chrony or systemd-timesyncd) on every host: file times, persist ages and S3 signatures \
               (15 minutes) depend on the clocks";
    match worst {
        w if w >= SKEW_FAIL_MS => check("clock skew", Status::Fail, detail, fix),
        w if w >= SKEW_WARN_MS => check("clock skew", Status::Warn, detail, fix),
        _ => check("clock skew", Status::Ok, detail, ""),
    }
}

fn space_checks(rep: &pb::Report) -> Vec<Check> {
    let mut v = Vec::new();
    for w in rep.workers.iter().filter(|w| w.live) {
        let a = w.address.clone().unwrap_or_default();
        for t in &w.tiers {
            let free_quota = t.capacity.saturating_sub(t.used);
            let what = format!(
                "worker #{} {} tier {}: {} used of {}",
                a.worker_id,
                a.host,
                t.alias().name(),
                human(t.used),
                human(t.capacity)
            );
            if t.fs_known && t.fs_available < free_quota {
                v.push(check(
                    "free space",
                    Status::Warn,
                    format!("{what}, but its file system has only {} free", human(t.fs_available)),
                    "the tier cannot fill its quota: free space on that file system, or lower the tier's quota \
                     (worker.tiers) so eviction starts before the disk is full",
                ));
            } else {
                let fs = if t.fs_known {
                    format!(", {} free on its file system", human(t.fs_available))
                } else {
                    String::new()
                };
                v.push(check("free space", Status::Ok, format!("{what}{fs}"), ""));
            }
        }
    }
    v
}

fn nofile_check(rep: &pb::Report) -> Check {
    let mine = locus_common::open_files_limit();
    let mut low = Vec::new();
    let mut seen = vec![format!("this process {mine}")];
    if mine != 0 && mine < NOFILE_CLIENT {
        low.push(format!("this process {mine} (below {NOFILE_CLIENT})"));
    }
    for w in rep.workers.iter().filter(|w| w.live && w.open_files_limit != 0) {
        let a = w.address.clone().unwrap_or_default();
        seen.push(format!("worker #{} {}", a.worker_id, w.open_files_limit));
        if w.open_files_limit < NOFILE_WORKER {
            low.push(format!("worker #{} {} (below {NOFILE_WORKER})", a.worker_id, w.open_files_limit));
        }
    }
    if low.is_empty() {
        check("open files", Status::Ok, format!("limits: {}", seen.join(", ")), "")
    } else {
        check(
            "open files",
            Status::Warn,
            format!("low limits: {}", low.join(", ")),
            "raise the soft limit before starting the process (`ulimit -n 65536`, or LimitNOFILE=65536 in its systemd unit)",
        )
    }
}

async fn local_worker_check(c: &Client, cfg: &Config, workers: &[pb::WorkerAddress]) -> Check {
    let host = &cfg.client.host;
    if !cfg.client.short_circuit || cfg.client.locality == locus_common::config::Locality::Remote {
        return check(
            "local worker",
            Status::Warn,
            "short-circuit is disabled in this client's configuration",
            ReadReason::Disabled.fix(),
        );
    }
    let mut problems = Vec::new();
    for w in workers {
        match c.probe_socket(w).await {
            Ok(()) => {
                return check(
                    "local worker",
                    Status::Ok,
                    format!("worker #{} ({}) answers on its socket {}", w.worker_id, w.host, w.uds_path),
                    "",
                );
            }
            Err(why) if &w.host == host => problems.push(format!("worker #{} names this host: {why}", w.worker_id)),
            Err(_) => {}
        }
    }
    if problems.is_empty() {
        check(
            "local worker",
            Status::Warn,
            format!("no worker runs on this host ({host}): reads here go over the network"),
            ReadReason::NoLocalWorker.fix(),
        )
    } else {
        check("local worker", Status::Fail, problems.join("; "), ReadReason::SocketNotVisible.fix())
    }
}

/// Write a small MUST_CACHE file, read it back and say whether the read was
/// short-circuit (by the client's own account of its reads), and why not.
async fn test_read(c: &Client, cfg: &Config, dir: &str, has_local: bool) -> Check {
    let path = format!("{}/{}-{}", dir.trim_end_matches('/'), cfg.client.host, std::process::id());
    let data = vec![0x5au8; PROBE_BYTES];
    let opts = PutOptions { overwrite: true, write_type: Some(WriteType::MustCache), ..Default::default() };
    if let Err(e) = c.put_with(&path, &mut data.as_slice(), &opts, |_| Ok(pb::ObjectMeta::default())).await {
        return check(
            "test read",
            Status::Skip,
            format!("cannot write the test file {path}: {e}"),
            "name a writable directory with --probe-dir",
        );
    }
    let before = c.read_reasons();
    let res = async {
        let fi = c.status(&path, true).await?;
        let mut sink = Vec::with_capacity(PROBE_BYTES);
        c.read_to(&fi, 0, fi.length, Default::default(), &mut sink).await?;
        if sink != data {
            return Err(locus_common::Error::new(ErrorKind::Corrupt, "the test file read back differs"));
        }
        Ok(())
    }
    .await;
    let _ = c.delete(&path, false).await;
    if let Err(e) = res {
        return check("test read", Status::Fail, format!("reading {path}: {e}"), "see the checks above");
    }
    let after = c.read_reasons();
    let grew: Vec<(ReadReason, u64)> = after
        .iter()
        .map(|(r, (_, b))| (*r, b - before.get(r).map(|x| x.1).unwrap_or(0)))
        .filter(|(_, b)| *b > 0)
        .collect();
    match grew.iter().find(|(r, _)| *r != ReadReason::ShortCircuit) {
        None => check("test read", Status::Ok, format!("{} read short-circuit", human(PROBE_BYTES as u64)), ""),
        Some((r, _)) => check(
            "test read",
            if has_local { Status::Fail } else { Status::Warn },
            format!("not short-circuit: {}", r.explain()),
            r.fix(),
        ),
    }
}

/// `locus doctor --reads`: the reads of the last window that were not short-circuit, by
/// host and reason, with what each reason means and its fix.
fn reads(cfg: &Config, a: &DoctorArgs) -> Result<()> {
    let since = match &a.since {
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| locus_common::Error::invalid(format!("bad --since {s:?}: {e} (e.g. 10m, 2h)")))?,
        None => Duration::ZERO,
    };
    runtime()?.block_on(async {
        let c = Client::from_config(cfg)?;
        let r = c.reads(since, a.host.as_deref().unwrap_or("")).await?;
        let hosts = locus_proto::report::by_host(&r.rows);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&json!({"window_ms": r.window_ms, "hosts": hosts}))?);
            return Ok(());
        }
        let span = humantime::format_duration(Duration::from_secs(r.window_ms / 1000));
        if hosts.is_empty() {
            println!("No client reads in the last {span}.");
            return Ok(());
        }
        println!("Client reads in the last {span}, by host (as of the workers' last heartbeats):");
        for h in &hosts {
            let total = h.bytes;
            println!(
                "{}: {} in {} block reads, {:.1}% short-circuit",
                h.host,
                human(total),
                h.reads,
                h.short_circuit_share * 100.0
            );
            for reason in ReadReason::ALL {
                let Some(e) = h.for_reason(reason) else { continue };
                println!(
                    "  {:>6.1}%  {:>10}  {:>6} reads  {}: {}",
                    if total == 0 { 0.0 } else { e.bytes as f64 * 100.0 / total as f64 },
                    human(e.bytes),
                    e.reads,
                    reason.as_str(),
                    reason.explain()
                );
                println!("{:>37}fix: {}", "", reason.fix());
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rpc_address: &str, leader: bool, lag: u64) -> pb::MasterStatus {
        pb::MasterStatus { rpc_address: rpc_address.into(), voter: true, leader, lag, ..Default::default() }
    }

    #[tokio::test]
    async fn a_member_not_answering_is_named_with_the_fix() {
        let mut cfg = Config::default();
        cfg.client.master_retry = Duration::ZERO;
        cfg.client.rpc_timeout = Duration::from_secs(2);
        // Nothing listens on port 1.
        let g = pb::MasterGroupStatus {
            term: 7,
            elected_ms: 1_000,
            masters: vec![member("127.0.0.1:1", true, 0), member("127.0.0.1:1", false, 0)],
            ..Default::default()
        };
        let c = masters_check(&cfg, &g, 61_000).await;
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.starts_with("term 7, leader since 60 s ago"), "{}", c.detail);
        assert!(c.detail.contains("not answering: 127.0.0.1:1 leader"), "{}", c.detail);
        assert!(c.fix.contains("locus admin masters remove") && c.fix.contains("2 voters"), "{}", c.fix);
    }
}
