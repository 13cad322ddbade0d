//! Choosing workers and reaching them: the live-worker list, which workers share this
//! host, the worker for a block or a write's pipeline, and the cache of data connections.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use locus_common::config::{FillPlacement, Locality};
use locus_common::{Error, Result};
use locus_proto::tls::DataStream;
use locus_proto::{authenticate, exchange, pb};
use tokio::io::{BufReader, BufWriter};
use tokio::net::UnixStream;

use crate::{Client, Retry};

/// How long the worker list is trusted before it is fetched again.
const WORKER_LIST_TTL: Duration = Duration::from_secs(2);

pub(crate) type DataConn = BufReader<BufWriter<DataStream>>;

#[derive(Default)]
pub(crate) struct WorkerCache {
    list: Vec<pb::WorkerAddress>,
    fetched: Option<Instant>,
    /// worker id → whether its Unix socket answered as that worker (co-located).
    local: HashMap<u64, bool>,
}

impl Client {
    /// The live workers (cached for 2 s unless `refresh`).
    pub async fn workers(&self, refresh: bool) -> Result<Vec<pb::WorkerAddress>> {
        {
            let c = self.workers.lock();
            if !refresh && c.fetched.is_some_and(|t| t.elapsed() < WORKER_LIST_TTL) && !c.list.is_empty() {
                return Ok(c.list.clone());
            }
        }
        let list =
            self.rpc(Retry::Idempotent, pb::Empty {}, |mut m, r| async move { m.get_workers(r).await }).await?.workers;
        let mut c = self.workers.lock();
        c.list = list.clone();
        c.fetched = Some(Instant::now());
        Ok(list)
    }

    /// Whether worker `w` shares this host: its Unix socket answers as that worker.
    pub(crate) async fn is_local(&self, w: &pb::WorkerAddress) -> bool {
        if self.cfg.locality == Locality::Remote || w.uds_path.is_empty() {
            return false;
        }
        if let Some(v) = self.workers.lock().local.get(&w.worker_id) {
            return *v;
        }
        let v = async {
            let mut s = self.uds_connect(&w.uds_path).await.ok()?;
            let r = exchange(&mut s, pb::data_request::Req::Hello(pb::Empty {})).await.ok()?;
            Some(r.worker_id == w.worker_id)
        }
        .await
        .unwrap_or(false);
        self.workers.lock().local.insert(w.worker_id, v);
        v
    }

    /// Whether worker `w`'s short-circuit socket answers this client as that worker, and
    /// why not, in words, when it does not (for `locus doctor`: a missing path, a
    /// permission, nobody listening, another worker's socket).
    pub async fn probe_socket(&self, w: &pb::WorkerAddress) -> std::result::Result<(), String> {
        if w.uds_path.is_empty() {
            return Err("the worker has no short-circuit socket (worker.uds_path is empty)".into());
        }
        let path = std::path::Path::new(&w.uds_path);
        let mut s = match UnixStream::connect(path).await {
            Ok(s) => s,
            Err(e) => {
                let why = match e.kind() {
                    std::io::ErrorKind::NotFound => "no such file: the path is not visible from this process (another host, container or mount namespace)".to_string(),
                    std::io::ErrorKind::PermissionDenied => "permission denied: this user may not open it".to_string(),
                    std::io::ErrorKind::ConnectionRefused => "connection refused: nobody listens on it (a stale socket of a stopped worker)".to_string(),
                    _ => e.to_string(),
                };
                return Err(format!("{}: {why}", w.uds_path));
            }
        };
        authenticate(&mut s, &self.identity).await.map_err(|e| format!("{}: {e}", w.uds_path))?;
        match exchange(&mut s, pb::data_request::Req::Hello(pb::Empty {})).await {
            Ok(r) if r.worker_id == w.worker_id => Ok(()),
            Ok(r) => Err(format!(
                "{} answers as worker {}, not {} (another worker's socket at the same path, as on another host)",
                w.uds_path, r.worker_id, w.worker_id
            )),
            Err(e) => Err(format!("{}: {e}", w.uds_path)),
        }
    }

    /// Worker to fill a block that no worker holds: a co-located one if any (unless
    /// `client.fill` is `named`), else `fill_worker`'s round robin (so repeated reads
    /// meet the same cache, and the block lands where `block_hosts` named it).
    pub(crate) async fn pick_worker(&self, block_id: u64, exclude: &HashSet<u64>) -> Result<pb::WorkerAddress> {
        let ws: Vec<pb::WorkerAddress> =
            self.workers(!exclude.is_empty()).await?.into_iter().filter(|w| !exclude.contains(&w.worker_id)).collect();
        if ws.is_empty() {
            return Err(Error::unavailable("no live workers"));
        }
        if self.cfg.fill != Some(FillPlacement::Named)
            && let Some(w) = self.local_worker(&ws).await
        {
            return Ok(w.clone());
        }
        Ok(fill_worker(block_id, &ws).expect("not empty").clone())
    }

    /// The first of `ws` that shares this client's host (its socket answers).
    pub(crate) async fn local_worker<'w>(&self, ws: &'w [pb::WorkerAddress]) -> Option<&'w pb::WorkerAddress> {
        for w in ws {
            if self.is_local(w).await {
                return Some(w);
            }
        }
        None
    }

    /// Where the blocks of `fi` overlapping `[start, end)` are, for schedulers (the
    /// Hadoop connector's `getFileBlockLocations`): each block's offset, length and the
    /// host names of the live workers caching it. A block no worker caches names the
    /// worker a read fills it on with `client.fill = named` (the Hadoop connector's), and
    /// with `local` when no worker shares the reader's host: so a first run already
    /// places its tasks where the data will land, and a task run elsewhere does not move
    /// it. `fi` must carry its blocks.
    pub async fn block_hosts(&self, fi: &pb::FileInfo, start: u64, end: u64) -> Result<Vec<(u64, u64, Vec<String>)>> {
        let workers = self.workers(false).await?;
        let mut out = Vec::new();
        for b in fi.blocks.iter().filter(|b| b.offset < end && b.offset + b.length > start) {
            let mut hosts: Vec<String> = b
                .locations
                .iter()
                .filter_map(|l| workers.iter().find(|w| w.worker_id == l.worker_id))
                .map(|w| w.host.clone())
                .collect();
            if hosts.is_empty() && fi.persist_state().is_persisted() {
                hosts.extend(fill_worker(b.block_id, &workers).map(|w| w.host.clone()));
            }
            hosts.sort();
            hosts.dedup();
            out.push((b.offset, b.length, hosts));
        }
        Ok(out)
    }

    /// Workers for a write that must end on `copies` of them (0 = min(2, live)), and the
    /// copies it asks for: a co-located worker first, then others in an order that
    /// spreads files. Waits up to `client.replication.wait` for enough workers.
    /// Workers in `exclude` (found dead by this write, before the master noticed) are
    /// left out and never count towards the copies: until the master has marked them
    /// lost, they still count as live in how many copies are asked for, so a write waits
    /// for the master rather than being acknowledged with fewer.
    pub(crate) async fn write_pipeline(
        &self,
        path: &str,
        copies: u32,
        exclude: &HashSet<u64>,
    ) -> Result<(Vec<pb::WorkerAddress>, usize)> {
        let rc = &self.cfg.replication;
        let deadline = Instant::now() + rc.wait;
        let mut refresh = false;
        loop {
            let mut ws = self.workers(refresh).await?;
            let live = ws.len();
            ws.retain(|w| !exclude.contains(&w.worker_id));
            refresh = true;
            let want = if copies == 0 { live.min(2) } else { copies as usize };
            let enough = want > 0 && ws.len() >= want;
            let timed_out = Instant::now() >= deadline;
            if enough || (timed_out && rc.allow_fewer && !ws.is_empty()) {
                let mut order: Vec<(u8, u64, pb::WorkerAddress)> = Vec::new();
                for w in ws {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (path, w.worker_id).hash(&mut h);
                    let local = self.is_local(&w).await;
                    order.push(((!local) as u8, h.finish(), w));
                }
                order.sort_by_key(|o| (o.0, o.1));
                return Ok((order.into_iter().take(want.max(1)).map(|o| o.2).collect(), want.max(1)));
            }
            if timed_out {
                return Err(Error::unavailable(format!(
                    "the write needs {} worker copies but {} of the {live} workers the master lists answer \
                     (waited {:?}; client.replication.allow_fewer lets it go on with fewer)",
                    want.max(1),
                    ws.len(),
                    rc.wait
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn conn(&self, addr: &str) -> Result<DataConn> {
        if let Some(c) = self.conns.lock().get_mut(addr).and_then(|v| v.pop()) {
            return Ok(c);
        }
        let s = self.tls.connect(addr, "worker").await?;
        let mut c = BufReader::with_capacity(256 << 10, BufWriter::new(s));
        // Buffered: the proof leaves with the first request.
        authenticate(&mut c, &self.identity).await?;
        Ok(c)
    }

    /// Whether worker `w` answers a hello on its data port within a second (a worker the
    /// master still lists may have died a moment ago).
    pub(crate) async fn answers(&self, w: &pb::WorkerAddress) -> bool {
        let probe = async {
            let s = self.tls.connect(&w.data_address, "worker").await?;
            let mut s = BufReader::new(BufWriter::new(s));
            authenticate(&mut s, &self.identity).await?;
            exchange(&mut s, pb::data_request::Req::Hello(pb::Empty {})).await
        };
        matches!(tokio::time::timeout(Duration::from_secs(1), probe).await, Ok(Ok(r)) if r.worker_id == w.worker_id)
    }

    /// Connect to a co-located worker's Unix socket and present this client's token.
    pub(crate) async fn uds_connect(&self, path: &str) -> Result<UnixStream> {
        let mut s = UnixStream::connect(path)
            .await
            .map_err(|e| Error::unavailable(format!("connect worker socket {path}: {e}")))?;
        authenticate(&mut s, &self.identity).await?;
        Ok(s)
    }

    pub(crate) fn put_conn(&self, addr: &str, c: DataConn) {
        let mut m = self.conns.lock();
        let v = m.entry(addr.to_string()).or_default();
        if v.len() < 8 {
            v.push(c);
        }
    }
}

/// The worker that fills block `block_id` when no worker shares the reader's host, by
/// round robin over the workers in id order: block `i` of file version `v` goes to worker
/// `(v + i) mod n`. A file's blocks alternate between workers, and so do the files of a
/// directory, whose versions the master gives out one after another as it lists them:
/// a scheduler that runs each block's task where the block is finds the work of a stage
/// spread evenly (a hash of the block id left one host with 5 of 8 blocks as often as
/// not, and the other host's executor idle). Deterministic, so repeated reads meet the
/// same cache. `None` when there are no workers.
///
/// The Hadoop connector's locations, the compute calls and the SQL engine's placement of
/// uncached bytes all use it, so each fills a block where the others expect it.
pub fn fill_worker<'a>(
    block_id: u64,
    workers: impl IntoIterator<Item = &'a pb::WorkerAddress>,
) -> Option<&'a pb::WorkerAddress> {
    let mut ws: Vec<&pb::WorkerAddress> = workers.into_iter().collect();
    if ws.is_empty() {
        return None;
    }
    ws.sort_by_key(|w| w.worker_id);
    let (version, index) = locus_common::split_block_id(block_id);
    ws.get((version.wrapping_add(index) % ws.len() as u64) as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u64) -> Vec<pb::WorkerAddress> {
        // Listed out of id order: the choice must not depend on the master's order.
        (1..=n).rev().map(|id| pb::WorkerAddress { worker_id: id, ..Default::default() }).collect()
    }

    fn load(files: &[(u64, u64)], n: u64) -> Vec<usize> {
        let ws = workers(n);
        let mut per = vec![0; n as usize];
        for &(version, blocks) in files {
            for i in 0..blocks {
                let w = fill_worker(locus_common::block_id(version, i), &ws).unwrap();
                per[(w.worker_id - 1) as usize] += 1;
            }
        }
        per
    }

    #[test]
    fn the_blocks_of_a_directory_are_spread_evenly_over_the_workers() {
        // Four one-block files listed together (consecutive versions), two workers.
        assert_eq!(load(&[(40, 1), (41, 1), (42, 1), (43, 1)], 2), vec![2, 2]);
        // Four two-block files, two and three workers.
        assert_eq!(load(&[(7, 2), (8, 2), (9, 2), (10, 2)], 2), vec![4, 4]);
        assert_eq!(load(&[(7, 2), (8, 2), (9, 2)], 3), vec![2, 2, 2]);
        // One big file: its blocks alternate.
        assert_eq!(load(&[(99, 9)], 3), vec![3, 3, 3]);
        // The same block always names the same worker, whatever the listing order.
        let (a, b) = (workers(3), {
            let mut w = workers(3);
            w.reverse();
            w
        });
        for id in [locus_common::block_id(5, 0), locus_common::block_id(6, 3)] {
            assert_eq!(fill_worker(id, &a).unwrap().worker_id, fill_worker(id, &b).unwrap().worker_id);
        }
        assert!(fill_worker(1, &[]).is_none());
    }
}
