//! The cluster report as one typed value: what `locus report` prints, `locus report
//! --json` and `/api/report` serialize (their stable JSON shape), and the status page
//! shows. Built once from the master's `pb::Report` and mount table; every reader uses
//! its fields.

use std::collections::BTreeMap;

use locus_common::ErrorKind;
use locus_common::metrics::{ReadReason, ReadSource};
use serde::Serialize;

use crate::pb;

#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    pub workers: Vec<WorkerRow>,
    pub live_workers: usize,
    /// Capacity and use of the live workers' tiers, by tier name.
    pub capacity: BTreeMap<String, Capacity>,
    /// Bytes read by source (`ReadSource::as_str`).
    pub bytes_read: BTreeMap<String, u64>,
    pub cache: CacheRow,
    pub compute: ComputeRow,
    pub bytes_written: WrittenRow,
    pub mounts: Vec<MountRow>,
    pub persist_backlog: Backlog,
    pub jobs: Vec<JobRow>,
    pub by_host: Vec<HostReads>,
    /// The master's wall clock (ms since the epoch).
    pub now_ms: i64,
    pub persist_failed: Failed,
    /// The master group, as its leader sees it (none without a group).
    pub masters: Option<MasterGroup>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MasterGroup {
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// When the leader took over (ms since the epoch).
    pub elected_ms: i64,
    pub members: Vec<MasterRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MasterRow {
    pub raft_address: String,
    pub rpc_address: String,
    /// "leader", "follower" or "learner".
    pub role: &'static str,
    pub matched_index: u64,
    /// Entries behind the leader's log.
    pub lag: u64,
}

impl MasterGroup {
    fn new(g: &pb::MasterGroupStatus) -> MasterGroup {
        let role = |m: &pb::MasterStatus| match (m.leader, m.voter) {
            (true, _) => "leader",
            (false, true) => "follower",
            (false, false) => "learner",
        };
        let members = g
            .masters
            .iter()
            .map(|m| MasterRow {
                raft_address: m.raft_address.clone(),
                rpc_address: m.rpc_address.clone(),
                role: role(m),
                matched_index: m.matched_index,
                lag: m.lag,
            })
            .collect();
        MasterGroup {
            term: g.term,
            last_log_index: g.last_log_index,
            applied_index: g.applied_index,
            elected_ms: g.elected_ms,
            members,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    pub id: u64,
    pub host: String,
    pub data_address: String,
    pub live: bool,
    pub last_heartbeat_ms_ago: u64,
    pub clock_skew_ms: i64,
    pub open_files_limit: u64,
    pub tiers: Vec<TierRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TierRow {
    pub alias: String,
    pub capacity: u64,
    pub used: u64,
    pub blocks: u64,
    pub pooled: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Capacity {
    pub capacity: u64,
    pub used: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CacheRow {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub hit_ratio: f64,
    pub corrupt_blocks: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComputeRow {
    pub bytes_scanned: u64,
    pub bytes_returned: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WrittenRow {
    pub short_circuit: u64,
    pub data_path: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountRow {
    pub path: String,
    pub uri: String,
    pub readonly: bool,
    pub sync_interval_ms: u64,
    pub write_type: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    pub files: u64,
    pub bytes: u64,
    pub oldest_age_ms: u64,
    pub queued_ops: u64,
}

/// A background job: where it runs (`master`, `worker N`), its state, runs, failures,
/// last error, seconds since its last run, and backlog.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    pub on: String,
    pub name: String,
    pub state: &'static str,
    pub runs: u64,
    pub failures: u64,
    pub last_error: String,
    pub last_run_s_ago: Option<f64>,
    pub backlog: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Failed {
    /// Operations given up, all of them (`operations` holds the first 100).
    pub ops: u64,
    pub operations: Vec<FailedOp>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailedOp {
    pub seq: u64,
    pub kind: &'static str,
    pub path: String,
    pub ufs_path: String,
    pub failures: u32,
    pub error: String,
    pub error_kind: &'static str,
    pub failed_ms: i64,
}

/// Client reads of one host: bytes by source, the share read short-circuit, and reads
/// and bytes by reason for those that were not.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostReads {
    pub host: String,
    pub reads: u64,
    pub bytes: u64,
    pub bytes_by_source: BTreeMap<String, u64>,
    pub not_short_circuit: BTreeMap<String, Count>,
    pub short_circuit_share: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Count {
    pub reads: u64,
    pub bytes: u64,
}

impl HostReads {
    /// Bytes this host read from `s`.
    pub fn from_source(&self, s: ReadSource) -> u64 {
        self.bytes_by_source.get(s.as_str()).copied().unwrap_or(0)
    }

    /// Reads and bytes not short-circuit for `r`, if any.
    pub fn for_reason(&self, r: ReadReason) -> Option<Count> {
        self.not_short_circuit.get(r.as_str()).copied()
    }
}

/// Client reads by host (`Report.by_host`, `ReadsResponse.rows`), one row per host in
/// host order.
pub fn by_host(rows: &[pb::HostReads]) -> Vec<HostReads> {
    let mut hosts: BTreeMap<&str, HostReads> = BTreeMap::new();
    for r in rows {
        let Some(source) = r.source().typed() else { continue };
        let h = hosts.entry(r.host.as_str()).or_insert_with(|| HostReads {
            host: r.host.clone(),
            bytes_by_source: ReadSource::ALL.iter().map(|s| (s.as_str().to_string(), 0)).collect(),
            ..Default::default()
        });
        h.reads += r.reads;
        h.bytes += r.bytes;
        *h.bytes_by_source.entry(source.as_str().to_string()).or_default() += r.bytes;
        let reason = ReadReason::from(r.reason());
        if reason != ReadReason::ShortCircuit {
            let e = h.not_short_circuit.entry(reason.as_str().to_string()).or_default();
            e.reads += r.reads;
            e.bytes += r.bytes;
        }
    }
    hosts
        .into_values()
        .map(|mut h| {
            let sc = h.from_source(ReadSource::ShortCircuit);
            h.short_circuit_share = if h.bytes == 0 { 0.0 } else { sc as f64 / h.bytes as f64 };
            h
        })
        .collect()
}

impl ClusterReport {
    pub fn new(r: &pb::Report, mounts: &[pb::MountInfo]) -> ClusterReport {
        let t = r.totals.unwrap_or_default();
        let mut capacity = BTreeMap::<String, Capacity>::new();
        for w in r.workers.iter().filter(|w| w.live) {
            for tier in &w.tiers {
                let e = capacity.entry(tier.alias().name().to_string()).or_default();
                e.capacity += tier.capacity;
                e.used += tier.used;
            }
        }
        ClusterReport {
            workers: r.workers.iter().map(WorkerRow::new).collect(),
            live_workers: r.workers.iter().filter(|w| w.live).count(),
            capacity,
            bytes_read: ReadSource::ALL.iter().map(|s| (s.as_str().to_string(), t.bytes(*s))).collect(),
            cache: CacheRow {
                hits: t.cache_hits,
                misses: t.cache_misses,
                evictions: t.evictions,
                hit_ratio: t.hit_ratio(),
                corrupt_blocks: t.corrupt_blocks,
            },
            compute: ComputeRow { bytes_scanned: t.compute_scanned, bytes_returned: t.compute_returned },
            bytes_written: WrittenRow { short_circuit: t.written_short_circuit, data_path: t.written_data_path },
            mounts: mounts.iter().map(MountRow::new).collect(),
            persist_backlog: Backlog {
                files: r.persist_backlog_files,
                bytes: r.persist_backlog_bytes,
                oldest_age_ms: r.persist_oldest_age_ms,
                queued_ops: r.persist_queue_ops,
            },
            jobs: JobRow::all(r),
            by_host: by_host(&r.by_host),
            now_ms: r.now_ms,
            persist_failed: Failed {
                ops: r.persist_failed_ops,
                operations: r.persist_failed.iter().map(FailedOp::new).collect(),
            },
            masters: r.group.as_ref().map(MasterGroup::new),
        }
    }

    /// Bytes read from `s`.
    pub fn read_from(&self, s: ReadSource) -> u64 {
        self.bytes_read.get(s.as_str()).copied().unwrap_or(0)
    }
}

impl WorkerRow {
    fn new(w: &pb::WorkerReport) -> WorkerRow {
        let a = w.address.clone().unwrap_or_default();
        WorkerRow {
            id: a.worker_id,
            host: a.host,
            data_address: a.data_address,
            live: w.live,
            last_heartbeat_ms_ago: w.last_heartbeat_ms_ago,
            clock_skew_ms: w.clock_skew_ms,
            open_files_limit: w.open_files_limit,
            tiers: w
                .tiers
                .iter()
                .map(|t| TierRow {
                    alias: t.alias().name().to_string(),
                    capacity: t.capacity,
                    used: t.used,
                    blocks: t.blocks,
                    pooled: t.pooled,
                })
                .collect(),
        }
    }
}

impl MountRow {
    fn new(m: &pb::MountInfo) -> MountRow {
        MountRow {
            path: m.path.clone(),
            uri: m.uri.clone(),
            readonly: m.readonly,
            sync_interval_ms: m.sync_interval_ms,
            write_type: m.write_type().typed().map(|w| w.as_str()),
        }
    }
}

impl JobRow {
    /// Every background job of the cluster, the master's first, then each live worker's.
    fn all(r: &pb::Report) -> Vec<JobRow> {
        let now = locus_common::now_ms();
        let job = |on: String, j: &pb::JobInfo| JobRow {
            on,
            name: j.name.clone(),
            state: j.state().name(),
            runs: j.runs,
            failures: j.failures,
            last_error: j.last_error.clone(),
            last_run_s_ago: (j.last_run_ms > 0).then(|| (now - j.last_run_ms).max(0) as f64 / 1000.0),
            backlog: j.backlog,
        };
        let mut out: Vec<_> = r.jobs.iter().map(|j| job("master".into(), j)).collect();
        for w in r.workers.iter().filter(|w| w.live) {
            let id = w.address.as_ref().map(|a| a.worker_id).unwrap_or(0);
            out.extend(w.jobs.iter().map(|j| job(format!("worker {id}"), j)));
        }
        out
    }
}

impl FailedOp {
    fn new(f: &pb::FailedPersist) -> FailedOp {
        FailedOp {
            seq: f.seq,
            kind: f.kind().name(),
            path: f.path.clone(),
            ufs_path: f.ufs_path.clone(),
            failures: f.failures,
            error: f.last_error.clone(),
            error_kind: ErrorKind::from(f.last_error_kind()).as_str(),
            failed_ms: f.failed_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_by_host_add_up_per_host() {
        let row = |host: &str, source: pb::ReadSource, reason: pb::ReadReason, bytes| pb::HostReads {
            host: host.into(),
            source: source.into(),
            reason: reason.into(),
            reads: 1,
            bytes,
        };
        let rows = [
            row("a", pb::ReadSource::ShortCircuit, pb::ReadReason::ShortCircuit, 300),
            row("a", pb::ReadSource::RemoteWorker, pb::ReadReason::CachedElsewhere, 100),
            row("b", pb::ReadSource::Ufs, pb::ReadReason::NoLocalWorker, 50),
            row("b", pb::ReadSource::Ufs, pb::ReadReason::NoLocalWorker, 50),
        ];
        let h = by_host(&rows);
        assert_eq!((h[0].host.as_str(), h[0].bytes), ("a", 400));
        assert_eq!(h[0].short_circuit_share, 0.75);
        assert_eq!(h[0].for_reason(ReadReason::CachedElsewhere).map(|c| c.bytes), Some(100));
        assert_eq!(h[1].from_source(ReadSource::Ufs), 100);
        assert_eq!(h[1].for_reason(ReadReason::NoLocalWorker).map(|c| c.reads), Some(2));
        assert_eq!(h[1].short_circuit_share, 0.0);
        // The JSON shape the CLI and the web API promise.
        let j = serde_json::to_value(&h).unwrap();
        assert_eq!(j[0]["not_short_circuit"]["cached_elsewhere"]["bytes"], 100);
        assert_eq!(j[1]["bytes_by_source"]["ufs"], 100);
        assert_eq!(j[1]["bytes_by_source"]["short_circuit"], 0);
    }

    #[test]
    fn the_report_keeps_its_json_shape() {
        let r = pb::Report {
            workers: vec![pb::WorkerReport {
                address: Some(pb::WorkerAddress { worker_id: 3, host: "h".into(), ..Default::default() }),
                live: true,
                tiers: vec![pb::TierUsage { capacity: 10, used: 4, ..Default::default() }],
                ..Default::default()
            }],
            persist_failed_ops: 1,
            persist_failed: vec![pb::FailedPersist { seq: 9, path: "/x".into(), ..Default::default() }],
            ..Default::default()
        };
        let j = serde_json::to_value(ClusterReport::new(&r, &[])).unwrap();
        assert_eq!(j["live_workers"], 1);
        assert_eq!(j["workers"][0]["id"], 3);
        assert_eq!(j["workers"][0]["tiers"][0]["used"], 4);
        assert_eq!(j["capacity"][j["workers"][0]["tiers"][0]["alias"].as_str().unwrap()]["capacity"], 10);
        assert_eq!(j["persist_failed"]["operations"][0]["seq"], 9);
        for k in ["bytes_read", "cache", "compute", "bytes_written", "mounts", "persist_backlog", "jobs", "by_host"] {
            assert!(!j[k].is_null(), "{k} missing");
        }
        assert_eq!(j["bytes_read"].as_object().unwrap().len(), ReadSource::ALL.len());
    }
}
