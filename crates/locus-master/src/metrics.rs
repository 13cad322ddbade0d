//! The master's Prometheus metrics and the cluster report (`locus report`, the status page).

use std::collections::BTreeMap;

use locus_proto::pb;

use crate::*;
use locus_common::metrics::{BYTES_READ, CACHE_REQUESTS, EVICTIONS, ReadSource};
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub(crate) struct Metrics {
    pub(crate) registry: Registry,
    pub(crate) bytes_read: IntCounterVec,
    pub(crate) cache_requests: IntCounterVec,
    pub(crate) evictions: IntCounter,
    pub(crate) workers_live: IntGauge,
    pub(crate) tier_capacity: IntGaugeVec,
    pub(crate) tier_used: IntGaugeVec,
    pub(crate) tier_pooled: IntGaugeVec,
    pub(crate) hit_ratio: Gauge,
    pub(crate) files_loaded: IntCounter,
    pub(crate) corrupt_blocks: IntCounter,
    pub(crate) compute_bytes: IntCounterVec,
    pub(crate) bytes_written: IntCounterVec,
    /// Persist-queue operations carried out, by kind and result (`done`, or `skipped`: a
    /// persist whose file was deleted or overwritten before its turn, no UFS write).
    pub(crate) persist_ops: IntCounterVec,
    /// Bytes of the files the persist queue has persisted (a retried persist counts once).
    pub(crate) persisted_bytes: IntCounter,
    /// Persist-queue operations given up (see `persist_failures`), waiting for a retry or
    /// a drop.
    pub(crate) persist_failed: IntGauge,
    /// Cached writes acknowledged with fewer worker copies than they asked for.
    pub(crate) writes_short: IntCounter,
}

impl Metrics {
    /// The master's metrics, registered. Fails only on a bad or repeated metric name.
    pub(crate) fn new() -> Result<Metrics> {
        let registry = Registry::new();
        let bytes_read =
            IntCounterVec::new(Opts::new(BYTES_READ, "Bytes delivered to readers, by source"), &["source"])
                .map_err(prom_err)?;
        let cache_requests = IntCounterVec::new(Opts::new(CACHE_REQUESTS, "Block reads by cache result"), &["result"])
            .map_err(prom_err)?;
        let evictions = IntCounter::new(EVICTIONS, "Blocks evicted from a tier").map_err(prom_err)?;
        let workers_live = IntGauge::new("locus_workers_live", "Workers with a recent heartbeat").map_err(prom_err)?;
        let tier_capacity =
            IntGaugeVec::new(Opts::new("locus_tier_capacity_bytes", "Cache capacity per tier"), &["tier"])
                .map_err(prom_err)?;
        let tier_used = IntGaugeVec::new(Opts::new("locus_tier_used_bytes", "Cache usage per tier"), &["tier"])
            .map_err(prom_err)?;
        let hit_ratio =
            Gauge::new("locus_cache_hit_ratio", "Block cache hits over all block reads").map_err(prom_err)?;
        let files_loaded = IntCounter::new("locus_ufs_entries_loaded_total", "UFS entries loaded into the namespace")
            .map_err(prom_err)?;
        registry.register(Box::new(bytes_read.clone())).map_err(prom_err)?;
        registry.register(Box::new(cache_requests.clone())).map_err(prom_err)?;
        registry.register(Box::new(evictions.clone())).map_err(prom_err)?;
        registry.register(Box::new(workers_live.clone())).map_err(prom_err)?;
        registry.register(Box::new(tier_capacity.clone())).map_err(prom_err)?;
        registry.register(Box::new(tier_used.clone())).map_err(prom_err)?;
        let tier_pooled = IntGaugeVec::new(
            Opts::new("locus_tier_pooled_bytes", "Free cache space held in pooled block files per tier"),
            &["tier"],
        )
        .map_err(prom_err)?;
        registry.register(Box::new(tier_pooled.clone())).map_err(prom_err)?;
        registry.register(Box::new(hit_ratio.clone())).map_err(prom_err)?;
        registry.register(Box::new(files_loaded.clone())).map_err(prom_err)?;
        let corrupt_blocks = IntCounter::new(
            "locus_block_corruptions_total",
            "Bad block copies found by their crc32c (on a disk tier or in a transfer) and dropped",
        )
        .map_err(prom_err)?;
        registry.register(Box::new(corrupt_blocks.clone())).map_err(prom_err)?;
        let compute_bytes = IntCounterVec::new(
            Opts::new(
                "locus_compute_bytes_total",
                "Near-data compute: bytes of blocks scanned on workers (scanned), and bytes of partial results sent to callers (returned)",
            ),
            &["kind"],
        )
        .map_err(prom_err)?;
        registry.register(Box::new(compute_bytes.clone())).map_err(prom_err)?;
        let bytes_written = IntCounterVec::new(
            Opts::new(
                "locus_bytes_written_total",
                "Bytes of client writes that workers stored, by path: short_circuit (a co-located client wrote the block files itself) or data_path (sent in chunk frames)",
            ),
            &["path"],
        )
        .map_err(prom_err)?;
        registry.register(Box::new(bytes_written.clone())).map_err(prom_err)?;
        let persist_ops = IntCounterVec::new(
            Opts::new("locus_persist_ops_total", "Persist-queue operations carried out, by kind and result"),
            &["kind", "result"],
        )
        .map_err(prom_err)?;
        let persisted_bytes = IntCounter::new(
            "locus_persisted_bytes_total",
            "Bytes of the files persisted to UFSes by the persist queue",
        )
        .map_err(prom_err)?;
        registry.register(Box::new(persist_ops.clone())).map_err(prom_err)?;
        registry.register(Box::new(persisted_bytes.clone())).map_err(prom_err)?;
        let persist_failed = IntGauge::new(
            "locus_persist_failed_paths",
            "Persist-queue operations given up after failing (locus report lists them; locus fs persist --retry or --drop)",
        )
        .map_err(prom_err)?;
        registry.register(Box::new(persist_failed.clone())).map_err(prom_err)?;
        let writes_short = IntCounter::new(
            "locus_writes_short_total",
            "Cached writes acknowledged with fewer worker copies than they asked for (a worker lost mid-write, or client.replication.allow_fewer)",
        )
        .map_err(prom_err)?;
        registry.register(Box::new(writes_short.clone())).map_err(prom_err)?;
        Ok(Metrics {
            registry,
            bytes_read,
            cache_requests,
            evictions,
            workers_live,
            tier_capacity,
            tier_used,
            tier_pooled,
            hit_ratio,
            files_loaded,
            corrupt_blocks,
            compute_bytes,
            bytes_written,
            persist_ops,
            persisted_bytes,
            persist_failed,
            writes_short,
        })
    }
}

impl Master {
    pub fn report(&self) -> pb::Report {
        let mut rep = pb::Report {
            mounts: self.inner.mounts.len() as u64,
            workers: self.inner.workers.reports(),
            ..Default::default()
        };
        // Cluster totals come from the master's monotonic counters, which survive
        // worker restarts.
        let m = &self.inner.metrics;
        let b = |s: ReadSource| m.bytes_read.with_label_values(&[s.as_str()]).get();
        rep.totals = Some(pb::ReadCounters {
            short_circuit: b(ReadSource::ShortCircuit),
            local_worker: b(ReadSource::LocalWorker),
            remote_worker: b(ReadSource::RemoteWorker),
            ufs: b(ReadSource::Ufs),
            cache_hits: m.cache_requests.with_label_values(&["hit"]).get(),
            cache_misses: m.cache_requests.with_label_values(&["miss"]).get(),
            evictions: m.evictions.get(),
            corrupt_blocks: m.corrupt_blocks.get(),
            compute_scanned: m.compute_bytes.with_label_values(&["scanned"]).get(),
            compute_returned: m.compute_bytes.with_label_values(&["returned"]).get(),
            written_short_circuit: m.bytes_written.with_label_values(&["short_circuit"]).get(),
            written_data_path: m.bytes_written.with_label_values(&["data_path"]).get(),
        });
        let b = self.persist_backlog();
        rep.persist_backlog_files = b.files;
        rep.persist_backlog_bytes = b.bytes;
        rep.persist_oldest_age_ms = b.oldest_age_ms;
        rep.persist_queue_ops = b.ops;
        rep.jobs = self.inner.jobs.lock().iter().map(|j| j.status().into()).collect();
        (rep.persist_failed_ops, rep.persist_failed) = self.failed_persists();
        rep.group = self.inner.group.as_ref().map(|g| g.status());
        rep.by_host = self.inner.reads.lock().totals();
        rep.now_ms = locus_common::now_ms();
        rep
    }

    pub(crate) fn update_gauges(&self) {
        let rep = self.report();
        let m = &self.inner.metrics;
        m.workers_live.set(rep.workers.iter().filter(|w| w.live).count() as i64);
        m.persist_failed.set(rep.persist_failed_ops as i64);
        let mut cap: BTreeMap<&str, u64> = BTreeMap::new();
        let mut used: BTreeMap<&str, u64> = BTreeMap::new();
        let mut pooled: BTreeMap<&str, u64> = BTreeMap::new();
        for w in rep.workers.iter().filter(|w| w.live) {
            for t in &w.tiers {
                *cap.entry(t.alias().name()).or_default() += t.capacity;
                *used.entry(t.alias().name()).or_default() += t.used;
                *pooled.entry(t.alias().name()).or_default() += t.pooled;
            }
        }
        for (t, v) in pooled {
            m.tier_pooled.with_label_values(&[t]).set(v as i64);
        }
        for (t, v) in cap {
            m.tier_capacity.with_label_values(&[t]).set(v as i64);
        }
        for (t, v) in used {
            m.tier_used.with_label_values(&[t]).set(v as i64);
        }
        let hits = m.cache_requests.with_label_values(&["hit"]).get();
        let misses = m.cache_requests.with_label_values(&["miss"]).get();
        m.hit_ratio.set(if hits + misses == 0 { 0.0 } else { hits as f64 / (hits + misses) as f64 });
    }
}

fn prom_err(e: prometheus::Error) -> Error {
    Error::internal(format!("metrics: {e}"))
}
