//! The worker registry's state: each registered worker's address, last heartbeat, tiers,
//! counters and the block removals queued for it, with a signal at every registration
//! and heartbeat. Only this type reads or changes it; `workers.rs` serves the RPCs that
//! feed it (registration, heartbeats, block commits).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use locus_proto::pb;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// What the master knows of one registered worker.
pub(crate) struct WorkerState {
    pub(crate) address: pb::WorkerAddress,
    pub(crate) last_heartbeat: Instant,
    pub(crate) tiers: Vec<pb::TierUsage>,
    pub(crate) counters: pb::ReadCounters,
    /// The worker's background jobs, as of its last heartbeat.
    pub(crate) jobs: Vec<pb::JobInfo>,
    pub(crate) pending_remove: Vec<u64>,
    /// Blocks of versions gone, for the worker to retire (see `Effects::retired`).
    pub(crate) pending_retire: Vec<u64>,
    /// Heartbeats received; a worker has acted on a response once the next one arrives.
    pub(crate) beats: u64,
    /// The pin epoch the worker last reported.
    pub(crate) pin_epoch: u64,
    /// The client reads by host it last reported (cumulative; see `reads`), with the run
    /// of the worker that counted them; `None` until its first heartbeat since this
    /// master started.
    pub(crate) host_reads: Option<crate::reads::Baseline>,
    /// Its clock minus the master's at its last heartbeat (ms).
    pub(crate) clock_skew_ms: i64,
    /// Its soft limit on open files (0: not told).
    pub(crate) open_files_limit: u64,
}

/// The registered workers; a worker not heard from within `timeout` is not live.
pub(crate) struct Registry {
    timeout: Duration,
    workers: Mutex<HashMap<u64, WorkerState>>,
    /// Signalled at every heartbeat and registration ([`Registry::wait_until`]).
    changed: Notify,
}

impl Registry {
    pub(crate) fn new(timeout: Duration) -> Registry {
        Registry { timeout, workers: Mutex::new(HashMap::new()), changed: Notify::new() }
    }

    fn is_live(&self, s: &WorkerState) -> bool {
        s.last_heartbeat.elapsed() < self.timeout
    }

    /// The ids of the live workers.
    pub(crate) fn live(&self) -> HashMap<u64, ()> {
        self.workers.lock().iter().filter(|(_, s)| self.is_live(s)).map(|(id, _)| (*id, ())).collect()
    }

    /// The addresses of the live workers, by id.
    pub(crate) fn live_addresses(&self) -> Vec<pb::WorkerAddress> {
        let mut v: Vec<pb::WorkerAddress> =
            self.workers.lock().values().filter(|s| self.is_live(s)).map(|s| s.address.clone()).collect();
        v.sort_by_key(|w| w.worker_id);
        v
    }

    pub(crate) fn is_registered(&self, id: u64) -> bool {
        self.workers.lock().contains_key(&id)
    }

    /// Waits (up to the timeout) until `done` holds for every live worker: checked at
    /// each heartbeat or registration, and when a worker that has not done it would time
    /// out (it no longer counts then).
    pub(crate) async fn wait_until(&self, done: impl Fn(u64, &WorkerState) -> bool) {
        locus_common::wait::until(&self.changed, Instant::now() + self.timeout, || {
            let ws = self.workers.lock();
            let waiting = ws.iter().filter(|(id, s)| self.is_live(s) && !done(**id, s));
            match waiting.map(|(_, s)| s.last_heartbeat + self.timeout).min() {
                None => (Some(()), None),
                Some(expires) => (None, Some(expires)),
            }
        })
        .await;
    }

    /// Records a registration: the worker's address, tiers, and the blocks it must drop
    /// (`stale`). Its counters and reads baseline carry over from an earlier registration.
    pub(crate) fn register(&self, address: pb::WorkerAddress, tiers: Vec<pb::TierUsage>, stale: Vec<u64>) {
        let id = address.worker_id;
        {
            let mut ws = self.workers.lock();
            let counters = ws.get(&id).map(|s| s.counters).unwrap_or_default();
            let host_reads = ws.get_mut(&id).and_then(|s| s.host_reads.take());
            let state = WorkerState {
                address,
                last_heartbeat: Instant::now(),
                tiers,
                counters,
                jobs: Vec::new(),
                pending_remove: stale,
                pending_retire: Vec::new(),
                beats: 0,
                pin_epoch: 0,
                host_reads,
                clock_skew_ms: 0,
                open_files_limit: 0,
            };
            ws.insert(id, state);
        }
        self.changed.notify_waiters();
    }

    /// Records a heartbeat of worker `id` and lets `f` update its state (under the
    /// registry's lock: `f` must not block). `None` when the worker is not registered.
    pub(crate) fn beat<T>(&self, id: u64, f: impl FnOnce(&mut WorkerState) -> T) -> Option<T> {
        let out = {
            let mut ws = self.workers.lock();
            let s = ws.get_mut(&id)?;
            s.last_heartbeat = Instant::now();
            s.beats += 1;
            f(s)
        };
        self.changed.notify_waiters();
        Some(out)
    }

    /// Queues, for each worker's next heartbeat, blocks to delete (`dropped`) and blocks
    /// to retire (`retired`), as (worker, block) pairs.
    pub(crate) fn queue_removals(&self, dropped: Vec<(u64, u64)>, retired: Vec<(u64, u64)>) {
        let mut ws = self.workers.lock();
        for (wk, b) in dropped {
            if let Some(s) = ws.get_mut(&wk) {
                s.pending_remove.push(b);
            }
        }
        for (wk, b) in retired {
            if let Some(s) = ws.get_mut(&wk) {
                s.pending_retire.push(b);
            }
        }
    }

    /// Drops the removals queued in an earlier term: a leader taking over orders only
    /// what it decides itself.
    pub(crate) fn clear_orders(&self) {
        for s in self.workers.lock().values_mut() {
            s.pending_remove.clear();
            s.pending_retire.clear();
        }
    }

    /// For each of `ids` still registered, the heartbeat count `n` beats from now.
    pub(crate) fn beats_ahead(&self, ids: impl IntoIterator<Item = u64>, n: u64) -> HashMap<u64, u64> {
        let ws = self.workers.lock();
        ids.into_iter().filter_map(|id| ws.get(&id).map(|s| (id, s.beats + n))).collect()
    }

    /// Every registered worker as the report shows it, by id.
    pub(crate) fn reports(&self) -> Vec<pb::WorkerReport> {
        let ws = self.workers.lock();
        let mut v: Vec<pb::WorkerReport> = ws
            .values()
            .map(|s| pb::WorkerReport {
                address: Some(s.address.clone()),
                live: self.is_live(s),
                last_heartbeat_ms_ago: s.last_heartbeat.elapsed().as_millis() as u64,
                tiers: s.tiers.clone(),
                counters: Some(s.counters),
                jobs: s.jobs.clone(),
                clock_skew_ms: s.clock_skew_ms,
                open_files_limit: s.open_files_limit,
            })
            .collect();
        v.sort_by_key(|w| w.address.as_ref().map(|a| a.worker_id));
        v
    }
}
