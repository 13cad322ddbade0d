//! Client reads by host: what each client host read, from where (short-circuit, a local
//! or remote worker, the UFS) and why the reads that were not short-circuit were not
//! (`locus report --by-host`, `locus doctor --reads`). Workers count them, keyed by the
//! host the client named, and send their cumulative rows with each heartbeat; this
//! module turns the differences into totals since the master started and into
//! one-minute buckets for the last day (`GetReads` with a window). Also the
//! `CheckUfs` probe of every mount's UFS.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use locus_common::metrics::{HostKey, OTHER_HOSTS};
use locus_proto::pb;

use crate::*;

/// The longest a `CheckUfs` probe of one mount may take.
const UFS_CHECK_LIMIT: Duration = Duration::from_secs(5);

/// Block reads and bytes.
type Tally = (u64, u64);

/// One bucket's span, and how many the log keeps (a day).
const BUCKET: Duration = Duration::from_secs(60);
const BUCKETS: usize = 24 * 60;
/// Distinct rows the log keeps per bucket and in its totals; rows past it are counted
/// under [`OTHER_HOSTS`], so no caller can grow the master's memory.
const MAX_ROWS: usize = 8192;

/// What a worker reported last: its run, and its cumulative rows.
pub(crate) struct Baseline {
    boot: u64,
    rows: HashMap<HostKey, Tally>,
}

/// The master's account of client reads by host.
pub(crate) struct ReadLog {
    started: Instant,
    totals: BTreeMap<HostKey, Tally>,
    /// (minutes since `started`, rows) oldest first.
    buckets: VecDeque<(u64, BTreeMap<HostKey, Tally>)>,
}

impl Default for ReadLog {
    fn default() -> Self {
        ReadLog { started: Instant::now(), totals: BTreeMap::new(), buckets: VecDeque::new() }
    }
}

fn add(m: &mut BTreeMap<HostKey, Tally>, k: &HostKey, d: Tally) {
    let key = if m.len() >= MAX_ROWS && !m.contains_key(k) { (OTHER_HOSTS.to_string(), k.1, k.2) } else { k.clone() };
    let e = m.entry(key).or_default();
    e.0 += d.0;
    e.1 += d.1;
}

/// A worker's rows as a map.
pub(crate) fn rows_of(v: &[pb::HostReads]) -> HashMap<HostKey, Tally> {
    v.iter().filter_map(|r| Some((r.key()?, (r.reads, r.bytes)))).collect()
}

fn to_pb(m: &BTreeMap<HostKey, Tally>) -> Vec<pb::HostReads> {
    m.iter().map(|(k, t)| pb::HostReads::row(k, *t)).collect()
}

impl ReadLog {
    /// Take a worker's cumulative rows `new`, counted by its run `boot`, against what it
    /// sent last (`last`); returns the new baseline. The first rows of a worker since this
    /// master started only set the baseline (they hold reads from before, which are not
    /// this master's to count: a restarted master would put a worker's whole history
    /// into its first minute); the first rows of a new run of the worker (a restart:
    /// they count from zero) are all new.
    pub(crate) fn record(&mut self, last: Option<Baseline>, boot: u64, new: HashMap<HostKey, Tally>) -> Baseline {
        match last {
            None => {}
            Some(b) if b.boot != boot => self.add_diff(&HashMap::new(), &new),
            Some(b) => self.add_diff(&b.rows, &new),
        }
        Baseline { boot, rows: new }
    }

    /// Add `new - old`, row by row (a row that shrank is counted whole: a restart the
    /// run id missed).
    fn add_diff(&mut self, old: &HashMap<HostKey, Tally>, new: &HashMap<HostKey, Tally>) {
        let minute = self.started.elapsed().as_secs() / BUCKET.as_secs();
        if self.buckets.back().is_none_or(|b| b.0 != minute) {
            self.buckets.push_back((minute, BTreeMap::new()));
            while self.buckets.len() > BUCKETS {
                self.buckets.pop_front();
            }
        }
        for (k, n) in new {
            let o = old.get(k).copied().unwrap_or_default();
            let d = if n.0 >= o.0 && n.1 >= o.1 { (n.0 - o.0, n.1 - o.1) } else { *n };
            if d == (0, 0) {
                continue;
            }
            add(&mut self.totals, k, d);
            add(&mut self.buckets.back_mut().expect("pushed above").1, k, d);
        }
    }

    /// Every row since the master started.
    pub(crate) fn totals(&self) -> Vec<pb::HostReads> {
        to_pb(&self.totals)
    }

    /// The rows of the last `since` (all the log keeps when zero), of host `host` only
    /// when it is not empty; and the span they cover.
    pub(crate) fn window(&self, since: Duration, host: &str) -> (Vec<pb::HostReads>, Duration) {
        let kept = (BUCKETS as u64) * BUCKET.as_secs();
        let want = if since.is_zero() { kept } else { since.as_secs().max(1).min(kept) };
        let now = self.started.elapsed().as_secs();
        // Whole buckets that overlap the window.
        let first_minute = now.saturating_sub(want) / BUCKET.as_secs();
        let mut m = BTreeMap::new();
        for (_, rows) in self.buckets.iter().filter(|b| b.0 >= first_minute) {
            for (k, d) in rows.iter().filter(|(k, _)| host.is_empty() || k.0 == host) {
                add(&mut m, k, *d);
            }
        }
        (to_pb(&m), Duration::from_secs(want.min(now.max(1))))
    }
}

impl Master {
    /// Client reads over the last `since` (`GetReads`).
    pub fn reads(&self, req: &pb::ReadsRequest) -> pb::ReadsResponse {
        let (rows, span) = self.inner.reads.lock().window(Duration::from_millis(req.since_ms), &req.host);
        pb::ReadsResponse { rows, window_ms: span.as_millis() as u64 }
    }

    /// Whether each mount's UFS answers a listing of its root, with the time it took
    /// (`CheckUfs`). Mounts are probed at once, each within the UFS timeout but at most
    /// [`UFS_CHECK_LIMIT`] (a doctor answers at once); the URIs carry no credentials
    /// (those are options, never returned).
    pub async fn check_ufs(&self) -> pb::UfsCheckResponse {
        let mounts = self.inner.mounts.all();
        let limit = self.inner.cfg.ufs_timeout.clamp(Duration::from_secs(1), UFS_CHECK_LIMIT);
        let probes = mounts.into_iter().map(|m| async move {
            let t = Instant::now();
            let r = tokio::time::timeout(limit, m.ufs.check()).await;
            let (ok, error) = match r {
                Ok(Ok(())) => (true, String::new()),
                Ok(Err(e)) => (false, e.to_string()),
                Err(_) => (false, format!("no answer within {limit:?}")),
            };
            pb::UfsCheck {
                path: m.info.path.clone(),
                uri: m.info.uri.clone(),
                ok,
                error,
                latency_ms: t.elapsed().as_millis() as u64,
            }
        });
        let mut v = futures::future::join_all(probes).await;
        v.sort_by(|a, b| a.path.cmp(&b.path));
        pb::UfsCheckResponse { mounts: v }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locus_common::metrics::{ReadReason, ReadSource};

    fn key(h: &str, s: ReadSource, r: ReadReason) -> HostKey {
        (h.into(), s, r)
    }

    #[test]
    fn heartbeats_add_their_differences_and_a_restart_counts_from_zero() {
        let mut log = ReadLog::default();
        let k = key("h1", ReadSource::Ufs, ReadReason::NoLocalWorker);
        let sc = key("h2", ReadSource::ShortCircuit, ReadReason::ShortCircuit);
        // First rows since the master started: reads from before, not counted.
        let base = log.record(None, 7, [(k.clone(), (40, 4000))].into());
        assert!(log.totals().is_empty());
        let base = log.record(Some(base), 7, [(k.clone(), (42, 4200))].into());
        let base = log.record(Some(base), 7, [(k.clone(), (45, 4500)), (sc.clone(), (1, 64))].into());
        // The worker restarted (a new run): its rows start from zero again, even one
        // that is back above its old count by the first heartbeat.
        let base = log.record(Some(base), 8, [(k.clone(), (50, 5000))].into());
        log.record(Some(base), 8, [(k.clone(), (51, 5100))].into());
        let t: HashMap<_, _> = rows_of(&log.totals());
        assert_eq!(t[&k], (2 + 3 + 50 + 1, 5600));
        assert_eq!(t[&sc], (1, 64));
        let (rows, _) = log.window(Duration::from_secs(600), "h2");
        assert_eq!(rows_of(&rows), [(sc, (1, 64))].into());
    }
}
