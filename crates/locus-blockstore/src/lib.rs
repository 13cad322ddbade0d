//! The worker's local block store: tiers (MEM on a tmpfs directory, then SSD and HDD
//! directories), one file per block, quotas, LRU eviction between a high and a low
//! watermark with demotion to the next lower tier, pinning, and leases that keep a block
//! in place while a reader (a short-circuit reader or the data path) uses it.
//!
//! Blocks on every tier are found again when the store reopens, so a restarted worker
//! reports them to the master without re-reading the UFS.
//!
//! Each block carries a crc32c (a `<id>.crc` file beside it). A block on a disk tier is
//! checked against it before it is leased, whenever its file changed since the last
//! check (and once after every restart); a bad copy is dropped, counted, and reported
//! as a miss, so it is never served.
//!
//! The MEM tier can keep the files of dropped blocks for a while (the file pool,
//! [`BlockStore::with_file_pool`]) and write new blocks into them: the tmpfs pages are
//! already there, so a fill or a write copies bytes and allocates nothing (no page
//! allocation and zeroing, and on a VM that returns freed memory to its host, no host
//! fault either). Pooled files count against the tier's quota as free space held.
//!
//! Each tier records the cluster (master namespace) its blocks belong to; joining another
//! cluster drops them ([`BlockStore::adopt_cluster`]), since block ids are only unique
//! within one namespace.
//!
//! No networking here, and no dependency on other Locus crates except `locus-common`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locus_common::config::{TierAlias, TierConfig};
use locus_common::{Error, ErrorKind, Result};
use parking_lot::Mutex;

/// A change the worker must tell the master about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The block is now on this tier (new, promoted or demoted).
    Stored { block_id: u64, tier: TierAlias, len: u64 },
    /// The block left this worker.
    Removed { block_id: u64 },
}

/// Usage of one tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierUsage {
    pub alias: TierAlias,
    pub capacity: u64,
    pub used: u64,
    pub blocks: u64,
    /// Free space held in pooled block files (their pages kept for the next blocks).
    pub pooled: u64,
}

#[derive(Debug)]
struct Tier {
    alias: TierAlias,
    dir: PathBuf,
    quota: u64,
    used: u64,
    reserved: u64,
    /// Files of dropped blocks kept for new blocks to be written into (MEM tier with a
    /// file pool only), newest last: path, length, since when.
    pool: Vec<(PathBuf, u64, Instant)>,
    pooled: u64,
    /// Whether dropped blocks' files go to the pool.
    recycle: bool,
}

impl Tier {
    /// Pooled files to release so that blocks, reservations and the pool fit the quota.
    fn fit_pool(&mut self) -> Vec<(PathBuf, u64)> {
        let mut gone = Vec::new();
        while self.used + self.reserved + self.pooled > self.quota && !self.pool.is_empty() {
            gone.push(self.pop_oldest());
        }
        gone
    }

    /// Take the oldest pooled file out of the pool (the caller releases it).
    fn pop_oldest(&mut self) -> (PathBuf, u64) {
        let (p, len, _) = self.pool.remove(0);
        self.pooled -= len;
        (p, len)
    }
}

#[derive(Debug)]
struct Meta {
    tier: usize,
    len: u64,
    last_access: u64,
    leases: u32,
    remove_when_free: bool,
    crc: Option<u32>,
    /// The file's ctime when its checksum last matched.
    verified: Option<(i64, i64)>,
    /// Which incarnation of the id this is: the tick of its commit (0 for a block found
    /// at open). A lease ends on its own block, not on a later one of the same id.
    generation: u64,
}

#[derive(Debug)]
struct State {
    tiers: Vec<Tier>,
    blocks: HashMap<u64, Meta>,
    tick: u64,
    pinned_versions: HashSet<u64>,
    /// Versions written here whose pin the master has not confirmed yet: version → the
    /// pin epoch from which the master's pin list covers it.
    write_pins: HashMap<u64, u64>,
    changes: Vec<Change>,
    evictions: u64,
    corrupt: u64,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    high: f64,
    low: f64,
    /// How long the MEM tier keeps a dropped block's file for reuse; zero: not at all.
    pool_ttl: Duration,
}

/// The block store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BlockStore {
    inner: Arc<Inner>,
}

/// A reader's hold on a block: while it lives the block is neither evicted nor moved.
#[derive(Debug)]
pub struct Lease {
    inner: Arc<Inner>,
    generation: u64,
    pub block_id: u64,
    pub path: PathBuf,
    pub len: u64,
    pub tier: TierAlias,
}

/// A block being written. Space is reserved on the top tier; [`TempBlock::commit`]
/// publishes it, dropping it without commit discards it.
#[derive(Debug)]
pub struct TempBlock {
    inner: Arc<Inner>,
    pub block_id: u64,
    pub path: PathBuf,
    /// Where the file goes when the block is committed.
    pub final_path: PathBuf,
    reserved: u64,
    tier: usize,
    /// The length of the pooled file this block is written into, if it reuses one.
    recycled: Option<u64>,
    done: bool,
}

fn block_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("blocks").join(id.to_string())
}

fn crc_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("blocks").join(format!("{id}.crc"))
}

/// The file in a tier directory naming the cluster (master namespace) its blocks belong to.
const CLUSTER_FILE: &str = "cluster_id";

fn read_cluster(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join(CLUSTER_FILE)).ok().and_then(|v| v.trim().parse().ok())
}

fn read_crc(p: &Path) -> Option<u32> {
    std::fs::read(p).ok().and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok()).map(u32::from_be_bytes)
}

fn ctime(p: &Path) -> Option<(i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.ctime(), m.ctime_nsec()))
}

/// crc32c of a whole file.
pub fn file_crc(p: &Path) -> std::io::Result<(u32, u64)> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut crc, mut n) = (0u32, 0u64);
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok((crc, n));
        }
        crc = crc32c::crc32c_append(crc, &buf[..k]);
        n += k as u64;
    }
}

fn pinned(state: &State, id: u64) -> bool {
    let v = locus_common::split_block_id(id).0;
    state.pinned_versions.contains(&v) || state.write_pins.contains_key(&v)
}

/// Move a file between tiers; tiers may sit on different file systems.
fn move_file(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(18) => {
            // EXDEV: copy to a temporary name, then rename into place.
            let tmp = to.with_extension("moving");
            std::fs::copy(from, &tmp)?;
            std::fs::rename(&tmp, to)?;
            std::fs::remove_file(from)
        }
        Err(e) => Err(e),
    }
}

/// Remove released pool files (outside the state lock: freeing a block's pages takes
/// milliseconds). Returns their bytes.
fn release(files: Vec<(PathBuf, u64)>) -> u64 {
    files
        .into_iter()
        .map(|(p, len)| {
            let _ = std::fs::remove_file(p);
            len
        })
        .sum()
}

impl BlockStore {
    /// Open the tiers, creating their directories and finding the blocks already there.
    pub fn open(tiers: &[TierConfig], high_watermark: f64, low_watermark: f64) -> Result<BlockStore> {
        if tiers.is_empty() {
            return Err(Error::invalid("a worker needs at least one tier"));
        }
        let mut sorted: Vec<&TierConfig> = tiers.iter().collect();
        sorted.sort_by_key(|t| t.alias);
        let mut state = State {
            tiers: Vec::new(),
            blocks: HashMap::new(),
            tick: 0,
            pinned_versions: HashSet::new(),
            write_pins: HashMap::new(),
            changes: Vec::new(),
            evictions: 0,
            corrupt: 0,
        };
        for (i, t) in sorted.iter().enumerate() {
            let blocks = t.dir.join("blocks");
            std::fs::create_dir_all(&blocks).map_err(|e| Error::io(format!("create {}", blocks.display()), e))?;
            let tmp = t.dir.join("tmp");
            let _ = std::fs::remove_dir_all(&tmp); // unfinished writes of a previous run
            std::fs::create_dir_all(&tmp).map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
            let mut used = 0;
            for entry in std::fs::read_dir(&blocks).map_err(|e| Error::io("scan tier", e))? {
                let entry = entry.map_err(|e| Error::io("scan tier", e))?;
                let name = entry.file_name();
                if name.to_str().and_then(|s| s.strip_suffix(".crc")).is_some_and(|s| s.parse::<u64>().is_ok()) {
                    continue; // read with its block
                }
                let Some(id) = name.to_str().and_then(|s| s.parse::<u64>().ok()) else {
                    let _ = std::fs::remove_file(entry.path());
                    continue;
                };
                let len = entry.metadata().map_err(|e| Error::io("stat block", e))?.len();
                if state.blocks.contains_key(&id) {
                    // The same block on two tiers (a crash mid-move): keep the upper copy.
                    let _ = std::fs::remove_file(entry.path());
                    continue;
                }
                used += len;
                let crc = read_crc(&crc_path(&t.dir, id));
                state.blocks.insert(
                    id,
                    Meta {
                        tier: i,
                        len,
                        last_access: 0,
                        leases: 0,
                        remove_when_free: false,
                        crc,
                        verified: None,
                        generation: 0,
                    },
                );
            }
            state.tiers.push(Tier {
                alias: t.alias,
                dir: t.dir.clone(),
                quota: t.quota.as_u64(),
                used,
                reserved: 0,
                pool: Vec::new(),
                pooled: 0,
                recycle: false,
            });
        }
        Ok(BlockStore {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                high: high_watermark,
                low: low_watermark,
                pool_ttl: Duration::ZERO,
            }),
        })
    }

    /// Keep the files of blocks dropped from the MEM tier for up to `ttl`, and write new
    /// blocks into them (zero: never). Call right after [`BlockStore::open`].
    pub fn with_file_pool(mut self, ttl: Duration) -> BlockStore {
        let inner = Arc::get_mut(&mut self.inner).expect("with_file_pool on a store not yet shared");
        inner.pool_ttl = ttl;
        for t in &mut inner.state.get_mut().tiers {
            t.recycle = !ttl.is_zero() && t.alias == TierAlias::MEM;
        }
        self
    }

    /// Release pooled files older than the pool's time to live (the worker calls this
    /// with each heartbeat). Returns the bytes released.
    pub fn trim_file_pool(&self) -> u64 {
        let ttl = self.inner.pool_ttl;
        let mut gone = Vec::new();
        {
            let mut s = self.inner.state.lock();
            for t in &mut s.tiers {
                while t.pool.first().is_some_and(|f| f.2.elapsed() >= ttl) {
                    gone.push(t.pop_oldest());
                }
            }
        }
        release(gone)
    }

    /// Every block held, with its tier and length (the full block report).
    pub fn report(&self) -> Vec<(u64, TierAlias, u64)> {
        let s = self.inner.state.lock();
        s.blocks.iter().map(|(id, m)| (*id, s.tiers[m.tier].alias, m.len)).collect()
    }

    /// The cluster the blocks here belong to, as the tiers record it: 0 when none does
    /// (a new store), `u64::MAX` (no cluster's id) when tiers disagree.
    pub fn cluster_id(&self) -> u64 {
        let s = self.inner.state.lock();
        let mut ids = s.tiers.iter().filter_map(|t| read_cluster(&t.dir));
        match ids.next() {
            None => 0,
            Some(first) if ids.all(|i| i == first) => first,
            Some(_) => u64::MAX,
        }
    }

    /// Join cluster `id`: every block on a tier recorded under another cluster is dropped
    /// (leased or not: a reader keeps its open file, but the id now names other data),
    /// then every tier records `id`. Returns the blocks dropped.
    pub fn adopt_cluster(&self, id: u64) -> Result<usize> {
        let mut s = self.inner.state.lock();
        let mut dropped = 0;
        for i in 0..s.tiers.len() {
            let dir = s.tiers[i].dir.clone();
            let recorded = read_cluster(&dir);
            if recorded == Some(id) {
                continue;
            }
            if recorded.is_some() {
                let foreign: Vec<u64> = s.blocks.iter().filter(|(_, m)| m.tier == i).map(|(b, _)| *b).collect();
                dropped += foreign.len();
                for b in foreign {
                    Self::delete_block(&mut s, b);
                }
            }
            let tmp = dir.join("tmp").join(CLUSTER_FILE);
            std::fs::write(&tmp, id.to_string())
                .and_then(|_| std::fs::rename(&tmp, dir.join(CLUSTER_FILE)))
                .map_err(|e| Error::io(format!("record the cluster id in {}", dir.display()), e))?;
        }
        Ok(dropped)
    }

    pub fn usage(&self) -> Vec<TierUsage> {
        let s = self.inner.state.lock();
        s.tiers
            .iter()
            .enumerate()
            .map(|(i, t)| TierUsage {
                alias: t.alias,
                capacity: t.quota,
                used: t.used,
                blocks: s.blocks.values().filter(|m| m.tier == i).count() as u64,
                pooled: t.pooled,
            })
            .collect()
    }

    /// Bad copies found (and dropped) since the store opened.
    pub fn corrupt_blocks(&self) -> u64 {
        self.inner.state.lock().corrupt
    }

    /// The checksum recorded for a block, if any.
    pub fn crc(&self, block_id: u64) -> Option<u32> {
        self.inner.state.lock().blocks.get(&block_id).and_then(|m| m.crc)
    }

    /// Blocks evicted (dropped or demoted) since the store opened.
    pub fn evictions(&self) -> u64 {
        self.inner.state.lock().evictions
    }

    /// Take the changes accumulated since the last call.
    pub fn drain_changes(&self) -> Vec<Change> {
        std::mem::take(&mut self.inner.state.lock().changes)
    }

    /// Replace the set of pinned file versions (blocks of these are never evicted) with
    /// the master's list as of pin epoch `epoch`. Write pins that list covers end.
    pub fn set_pinned_versions(&self, versions: HashSet<u64>, epoch: u64) {
        let mut s = self.inner.state.lock();
        s.pinned_versions = versions;
        s.write_pins.retain(|_, e| *e > epoch);
    }

    /// Pin the blocks of a version being written here until the master's pin list as of
    /// `epoch` arrives (it pins them itself from then on, for as long as they need it).
    pub fn pin_written(&self, version: u64, epoch: u64) {
        let mut s = self.inner.state.lock();
        let e = s.write_pins.entry(version).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    pub fn contains(&self, block_id: u64) -> bool {
        self.inner.state.lock().blocks.get(&block_id).is_some_and(|m| !m.remove_when_free)
    }

    /// Lease a block for reading; `promote` first moves it to the top tier if it can.
    /// `None` when the block is not here, or when its copy on a disk tier fails its
    /// checksum (then it is dropped).
    pub fn lease(&self, block_id: u64, promote: bool) -> Result<Option<Lease>> {
        let Some(lease) = self.lease_unchecked(block_id, promote)? else {
            return Ok(None);
        };
        let check = {
            let s = self.inner.state.lock();
            let m = &s.blocks[&block_id];
            match m.crc {
                Some(crc) if lease.tier != TierAlias::MEM => {
                    let now = ctime(&lease.path);
                    (m.verified.is_none() || m.verified != now).then_some((crc, now))
                }
                _ => None,
            }
        };
        let Some((want, now)) = check else {
            return Ok(Some(lease));
        };
        let ok = matches!(file_crc(&lease.path), Ok((crc, n)) if crc == want && n == lease.len);
        let mut s = self.inner.state.lock();
        if ok {
            if let Some(m) = s.blocks.get_mut(&block_id) {
                m.verified = now;
            }
            return Ok(Some(lease));
        }
        tracing::error!(block = block_id, path = %lease.path.display(), "block failed its checksum; dropping this copy");
        s.corrupt += 1;
        if let Some(m) = s.blocks.get_mut(&block_id) {
            m.remove_when_free = true;
        }
        drop(s);
        drop(lease); // the last lease: the copy goes
        Ok(None)
    }

    fn lease_unchecked(&self, block_id: u64, promote: bool) -> Result<Option<Lease>> {
        let mut s = self.inner.state.lock();
        let Some(m) = s.blocks.get(&block_id) else {
            return Ok(None);
        };
        if m.remove_when_free {
            return Ok(None);
        }
        if promote && m.tier > 0 && m.leases == 0 {
            let len = m.len;
            // Promotion is best effort: a full top tier leaves the block where it is.
            if self.make_room(&mut s, 0, len).is_ok() {
                self.move_block(&mut s, block_id, 0)?;
            }
        }
        s.tick += 1;
        let tick = s.tick;
        let m = s.blocks.get_mut(&block_id).unwrap();
        m.last_access = tick;
        m.leases += 1;
        let (tier, len, generation) = (m.tier, m.len, m.generation);
        Ok(Some(Lease {
            inner: self.inner.clone(),
            generation,
            block_id,
            path: block_path(&s.tiers[tier].dir, block_id),
            len,
            tier: s.tiers[tier].alias,
        }))
    }

    /// Reserve `len` bytes on the top tier for a new block, evicting if needed.
    pub fn create(&self, block_id: u64, len: u64) -> Result<TempBlock> {
        let mut s = self.inner.state.lock();
        if s.blocks.contains_key(&block_id) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("block {block_id} exists")));
        }
        // Try tiers from the top; a block goes to the first one that can make room.
        let mut last_err = None;
        for tier in 0..s.tiers.len() {
            match self.make_room(&mut s, tier, len) {
                Ok(()) => {
                    s.tiers[tier].reserved += len;
                    let nonce = s.tick;
                    s.tick += 1;
                    let t = &mut s.tiers[tier];
                    let path = t.dir.join("tmp").join(format!("{block_id}-{nonce}"));
                    // Write into a pooled file when there is one: the newest, its pages the
                    // most recently used.
                    let mut recycled = None;
                    if let Some((p, flen, _)) = t.pool.pop() {
                        t.pooled -= flen;
                        match std::fs::rename(&p, &path) {
                            Ok(()) => recycled = Some(flen),
                            Err(_) => {
                                let _ = std::fs::remove_file(&p);
                            }
                        }
                    }
                    let final_path = block_path(&t.dir, block_id);
                    let gone = t.fit_pool();
                    drop(s);
                    release(gone);
                    return Ok(TempBlock {
                        inner: self.inner.clone(),
                        block_id,
                        path,
                        final_path,
                        reserved: len,
                        tier,
                        recycled,
                        done: false,
                    });
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap())
    }

    /// Drop a block (free, or stale after a UFS change). A leased block goes when its
    /// last lease ends. Returns whether the block was here.
    pub fn remove(&self, block_id: u64) -> Result<bool> {
        let mut s = self.inner.state.lock();
        let Some(m) = s.blocks.get_mut(&block_id) else {
            return Ok(false);
        };
        if m.leases > 0 {
            m.remove_when_free = true;
            return Ok(true);
        }
        Self::delete_block(&mut s, block_id);
        Ok(true)
    }

    /// Drop a block's copy. Its file goes to the tier's pool when the tier keeps one and
    /// no lease holds the block (a leased file may still be read: it is removed, so the
    /// reader keeps the old bytes and nobody writes over them).
    fn delete_block(s: &mut State, block_id: u64) {
        if let Some(m) = s.blocks.remove(&block_id) {
            let nonce = s.tick;
            s.tick += 1;
            let t = &mut s.tiers[m.tier];
            t.used -= m.len;
            let file = block_path(&t.dir, block_id);
            let pooled = t.dir.join("tmp").join(format!("pool-{nonce}"));
            if t.recycle && m.leases == 0 && std::fs::rename(&file, &pooled).is_ok() {
                t.pool.push((pooled, m.len, Instant::now()));
                t.pooled += m.len;
            } else {
                let _ = std::fs::remove_file(file);
            }
            let _ = std::fs::remove_file(crc_path(&t.dir, block_id));
            s.changes.push(Change::Removed { block_id });
        }
    }

    fn move_block(&self, s: &mut State, block_id: u64, to: usize) -> Result<()> {
        let m = s.blocks.get(&block_id).unwrap();
        let (from, len) = (m.tier, m.len);
        let src = block_path(&s.tiers[from].dir, block_id);
        let dst = block_path(&s.tiers[to].dir, block_id);
        move_file(&src, &dst).map_err(|e| Error::io(format!("move block {block_id}"), e))?;
        if let Some(crc) = m.crc {
            let _ = std::fs::write(crc_path(&s.tiers[to].dir, block_id), crc.to_be_bytes());
            let _ = std::fs::remove_file(crc_path(&s.tiers[from].dir, block_id));
        }
        s.tiers[from].used -= len;
        s.tiers[to].used += len;
        release(s.tiers[to].fit_pool());
        s.blocks.get_mut(&block_id).unwrap().tier = to;
        let alias = s.tiers[to].alias;
        s.changes.push(Change::Stored { block_id, tier: alias, len });
        Ok(())
    }

    /// Make `need` bytes fit on `tier`: past the high watermark, evict least recently
    /// used blocks (not pinned, not leased) down to the low watermark, demoting them to
    /// the next tier when there is one.
    fn make_room(&self, s: &mut State, tier: usize, need: u64) -> Result<()> {
        let quota = s.tiers[tier].quota;
        let high = (quota as f64 * self.inner.high) as u64;
        let low = (quota as f64 * self.inner.low) as u64;
        let occupied = |s: &State| s.tiers[tier].used + s.tiers[tier].reserved;
        if need > quota {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "block of {need} bytes exceeds the {} tier quota of {quota} bytes",
                    s.tiers[tier].alias.as_str()
                ),
            ));
        }
        if occupied(s) + need <= high {
            return Ok(());
        }
        let target = low.saturating_sub(need);
        let mut candidates: Vec<(u64, u64)> = s
            .blocks
            .iter()
            .filter(|(id, m)| m.tier == tier && m.leases == 0 && !pinned(s, **id))
            .map(|(id, m)| (m.last_access, *id))
            .collect();
        candidates.sort_unstable();
        for (_, id) in candidates {
            if occupied(s) <= target {
                break;
            }
            let len = s.blocks[&id].len;
            let demoted = tier + 1 < s.tiers.len()
                && self.make_room(s, tier + 1, len).is_ok()
                && self.move_block(s, id, tier + 1).is_ok();
            if !demoted {
                Self::delete_block(s, id);
            }
            s.evictions += 1;
        }
        if occupied(s) + need <= quota {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{} tier is full: {} of {quota} bytes held by pinned or in-use blocks, {need} more needed",
                    s.tiers[tier].alias.as_str(),
                    occupied(s)
                ),
            ))
        }
    }
}

impl TempBlock {
    /// Open the block's file for writing from its start. A pooled file is written over:
    /// [`TempBlock::commit`] cuts whatever lies past the block's end.
    pub fn open(&self) -> Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| Error::io(format!("open the file of block {}", self.block_id), e))
    }

    /// Publish the block. `len` is its final length (at most the reservation); `crc` its
    /// crc32c, kept beside it and checked when it is read from a disk tier.
    pub fn commit(self, len: u64, crc: Option<u32>) -> Result<()> {
        self.publish(len, crc, false).map(drop)
    }

    /// [`TempBlock::commit`], and lease the block in the same step (so it cannot be
    /// evicted before the lease): for readers that followed the block's file as it grew.
    pub fn commit_leased(self, len: u64, crc: Option<u32>) -> Result<Lease> {
        self.publish(len, crc, true).map(|l| l.expect("a lease was asked for"))
    }

    fn publish(mut self, len: u64, crc: Option<u32>, leased: bool) -> Result<Option<Lease>> {
        if self.recycled.is_some_and(|flen| flen > len) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&self.path)
                .and_then(|f| f.set_len(len))
                .map_err(|e| Error::io(format!("cut the file of block {}", self.block_id), e))?;
        }
        let inner = self.inner.clone();
        let mut s = inner.state.lock();
        self.done = true;
        let t = &mut s.tiers[self.tier];
        t.reserved -= self.reserved;
        if len > self.reserved {
            let _ = std::fs::remove_file(&self.path);
            return Err(Error::internal(format!("block {} grew past its reservation", self.block_id)));
        }
        let dst = block_path(&t.dir, self.block_id);
        if !s.blocks.contains_key(&self.block_id) {
            if let Some(crc) = crc {
                std::fs::write(crc_path(&s.tiers[self.tier].dir, self.block_id), crc.to_be_bytes())
                    .map_err(|e| Error::io(format!("write checksum of block {}", self.block_id), e))?;
            }
            std::fs::rename(&self.path, &dst).map_err(|e| Error::io(format!("commit block {}", self.block_id), e))?;
            s.tiers[self.tier].used += len;
            s.tick += 1;
            let tick = s.tick;
            s.blocks.insert(
                self.block_id,
                Meta {
                    tier: self.tier,
                    len,
                    last_access: tick,
                    leases: 0,
                    remove_when_free: false,
                    crc,
                    verified: None,
                    generation: tick,
                },
            );
            let alias = s.tiers[self.tier].alias;
            s.changes.push(Change::Stored { block_id: self.block_id, tier: alias, len });
        } else {
            let _ = std::fs::remove_file(&self.path); // a concurrent writer won; same bytes
        }
        if !leased {
            return Ok(None);
        }
        let m = s.blocks.get_mut(&self.block_id).expect("just published");
        m.leases += 1;
        let (tier, len, generation) = (m.tier, m.len, m.generation);
        Ok(Some(Lease {
            inner: inner.clone(),
            generation,
            block_id: self.block_id,
            path: block_path(&s.tiers[tier].dir, self.block_id),
            len,
            tier: s.tiers[tier].alias,
        }))
    }
}

impl Drop for TempBlock {
    fn drop(&mut self) {
        if !self.done {
            self.inner.state.lock().tiers[self.tier].reserved -= self.reserved;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.inner.state.lock();
        if let Some(m) = s.blocks.get_mut(&self.block_id).filter(|m| m.generation == self.generation) {
            m.leases -= 1;
            if m.leases == 0 && m.remove_when_free {
                BlockStore::delete_block(&mut s, self.block_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytesize::ByteSize;

    fn tier(alias: TierAlias, dir: &Path, quota: u64) -> TierConfig {
        TierConfig { alias, dir: dir.to_path_buf(), quota: ByteSize::b(quota) }
    }

    fn put(store: &BlockStore, id: u64, len: u64) -> Result<()> {
        let t = store.create(id, len)?;
        let data = vec![7u8; len as usize];
        std::fs::write(&t.path, &data).unwrap();
        t.commit(len, Some(crc32c::crc32c(&data)))
    }

    #[test]
    fn adopting_a_cluster_drops_only_blocks_recorded_under_another() {
        let (m, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let tiers = [tier(TierAlias::MEM, m.path(), 1000), tier(TierAlias::SSD, sd.path(), 1000)];
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        assert_eq!(s.cluster_id(), 0, "a new store belongs to no cluster");
        put(&s, 1, 100).unwrap();
        assert_eq!(s.adopt_cluster(7).unwrap(), 0, "unrecorded blocks stay (the master checks them)");
        assert_eq!(s.cluster_id(), 7);
        assert_eq!(s.adopt_cluster(7).unwrap(), 0);
        assert!(s.contains(1));
        // Reopened, the record is still there; another cluster's id drops the blocks,
        // even one a reader holds, and the reader's lease ends on its own block only.
        drop(s);
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        assert_eq!(s.cluster_id(), 7);
        let lease = s.lease(1, false).unwrap().unwrap();
        assert_eq!(s.adopt_cluster(8).unwrap(), 1);
        assert!(!s.contains(1) && !block_path(m.path(), 1).exists());
        assert_eq!(s.usage()[0].used, 0);
        put(&s, 1, 100).unwrap(); // the id, now this cluster's data
        drop(lease);
        let l2 = s.lease(1, false).unwrap().unwrap();
        drop(l2);
        assert!(s.remove(1).unwrap() && !s.contains(1), "the old lease left the new block's count alone");
        // Tiers that disagree name no cluster.
        std::fs::write(sd.path().join(CLUSTER_FILE), "9").unwrap();
        assert_eq!(s.cluster_id(), u64::MAX);
    }

    fn pooled(s: &BlockStore) -> u64 {
        s.usage().iter().map(|u| u.pooled).sum()
    }

    fn ino(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().ino()
    }

    #[test]
    fn the_mem_tier_writes_new_blocks_into_the_files_of_dropped_ones() {
        let (m, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let tiers = [tier(TierAlias::MEM, m.path(), 1000), tier(TierAlias::SSD, sd.path(), 1000)];
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap().with_file_pool(Duration::from_secs(3600));
        put(&s, 1, 300).unwrap();
        let old = ino(&block_path(m.path(), 1));
        assert!(s.remove(1).unwrap());
        assert!(!block_path(m.path(), 1).exists());
        assert_eq!((pooled(&s), s.usage()[0].used), (300, 0), "the file is kept, as free space");
        // The next block is written into it, from its start; the rest is cut at commit.
        let t = s.create(2, 300).unwrap();
        assert_eq!(ino(&t.path), old);
        assert_eq!(pooled(&s), 0);
        let mut f = t.open().unwrap();
        std::io::Write::write_all(&mut f, b"fresh").unwrap();
        t.commit(5, Some(crc32c::crc32c(b"fresh"))).unwrap();
        assert_eq!(std::fs::read(block_path(m.path(), 2)).unwrap(), b"fresh");
        assert_eq!(ino(&block_path(m.path(), 2)), old);
        // A leased block's file is never reused: a reader may still read it.
        let lease = s.lease(2, false).unwrap().unwrap();
        let held = std::fs::File::open(&lease.path).unwrap();
        assert_eq!(s.adopt_cluster(1).unwrap(), 0);
        std::fs::write(m.path().join(CLUSTER_FILE), "9").unwrap();
        assert_eq!(s.adopt_cluster(1).unwrap(), 1, "another cluster's block goes, leased or not");
        assert_eq!(pooled(&s), 0, "removed, not pooled");
        drop(lease);
        put(&s, 3, 300).unwrap();
        assert_ne!(ino(&block_path(m.path(), 3)), old);
        let mut seen = Vec::new();
        std::io::Read::read_to_end(&mut { held }, &mut seen).unwrap();
        assert_eq!(seen, b"fresh", "the reader's open file kept its bytes");
        // A block committed with a lease (readers followed its file as it grew) goes to
        // the pool only when that lease ends.
        let t = s.create(7, 300).unwrap();
        std::fs::write(&t.path, [1u8; 300]).unwrap();
        let lease = t.commit_leased(300, None).unwrap();
        assert!(s.remove(7).unwrap());
        assert_eq!(pooled(&s), 0);
        drop(lease);
        assert_eq!(pooled(&s), 300);
        // Evicted blocks feed the pool and the next block takes one; blocks, reservations
        // and pooled files together never pass the quota.
        for id in 4..=6 {
            put(&s, id, 300).unwrap();
        }
        let u = &s.usage()[0];
        assert!(u.used + pooled(&s) <= 1000, "used {} + pooled {}", u.used, pooled(&s));
        // Only the MEM tier pools; and the pool empties after its time to live.
        let s2 = BlockStore::open(&tiers, 0.9, 0.5).unwrap().with_file_pool(Duration::ZERO);
        assert_eq!(pooled(&s2), 0, "a reopened store starts with no pool (tmp/ is cleared)");
        drop(s2);
        assert!(
            std::fs::read_dir(m.path().join("tmp")).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("pool-"))
        );
    }

    #[test]
    fn pooled_files_go_after_their_time_to_live_and_never_on_disk_tiers() {
        let (m, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let tiers = [tier(TierAlias::MEM, m.path(), 1000), tier(TierAlias::SSD, sd.path(), 1000)];
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap().with_file_pool(Duration::from_millis(50));
        put(&s, 1, 200).unwrap();
        s.remove(1).unwrap();
        assert_eq!(pooled(&s), 200);
        assert_eq!(s.trim_file_pool(), 0, "not yet");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.trim_file_pool(), 200);
        assert_eq!(pooled(&s), 0);
        assert_eq!(std::fs::read_dir(m.path().join("tmp")).unwrap().count(), 0);
        // A block on the SSD tier is removed outright.
        put(&s, 3, 850).unwrap();
        put(&s, 4, 850).unwrap(); // demotes 3 to the SSD tier
        assert_eq!(s.report().iter().find(|b| b.0 == 3).unwrap().1, TierAlias::SSD);
        s.remove(3).unwrap();
        assert_eq!(pooled(&s), 0);
    }

    #[test]
    fn lru_eviction_between_watermarks() {
        let d = tempfile::tempdir().unwrap();
        let s = BlockStore::open(&[tier(TierAlias::MEM, d.path(), 1000)], 0.9, 0.5).unwrap();
        for id in 1..=4 {
            put(&s, id, 200).unwrap();
        }
        drop(s.lease(1, false).unwrap()); // touch 1: now 2 is least recently used
        put(&s, 5, 200).unwrap(); // 800 + 200 > 900: evict down to 500 - 200 = 300
        assert!(s.contains(1) && s.contains(5));
        assert!(!s.contains(2) && !s.contains(3), "least recently used go first");
        assert_eq!(s.evictions(), 3);
        assert!(!block_path(d.path(), 2).exists());
    }

    #[test]
    fn pinned_and_leased_blocks_stay() {
        let d = tempfile::tempdir().unwrap();
        let s = BlockStore::open(&[tier(TierAlias::MEM, d.path(), 1000)], 0.9, 0.5).unwrap();
        let pinned_id = locus_common::block_id(9, 0);
        put(&s, pinned_id, 400).unwrap();
        put(&s, 2, 400).unwrap();
        s.set_pinned_versions([9].into(), 1);
        let lease = s.lease(2, false).unwrap().unwrap();
        let e = s.create(3, 400).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ResourceExhausted);
        assert!(s.contains(pinned_id) && s.contains(2));
        drop(lease);
        put(&s, 3, 400).unwrap();
        assert!(s.contains(pinned_id), "pinned block survives eviction");
        assert!(!s.contains(2));
    }

    #[test]
    fn write_pins_hold_until_the_master_list_covers_them() {
        let d = tempfile::tempdir().unwrap();
        let s = BlockStore::open(&[tier(TierAlias::MEM, d.path(), 1000)], 0.9, 0.5).unwrap();
        let written = locus_common::block_id(5, 0);
        s.pin_written(5, 7);
        put(&s, written, 400).unwrap();
        s.set_pinned_versions(HashSet::new(), 6); // an older list does not know the write yet
        put(&s, 2, 400).unwrap();
        put(&s, 3, 400).unwrap();
        assert!(s.contains(written), "write-pinned block is not evicted");
        assert!(!s.contains(2), "the unpinned one goes instead");
        s.set_pinned_versions(HashSet::new(), 7); // the master's list as of the write: persisted
        put(&s, 4, 400).unwrap();
        assert!(!s.contains(written), "released once the master's list no longer pins it");
    }

    #[test]
    fn a_corrupted_disk_copy_is_dropped_not_served() {
        let ssd = tempfile::tempdir().unwrap();
        let tiers = [tier(TierAlias::SSD, ssd.path(), 5000)];
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        put(&s, 1, 300).unwrap();
        put(&s, 2, 300).unwrap();
        assert!(s.lease(1, false).unwrap().is_some(), "a good copy is served");
        drop(s);
        // corrupt block 1 behind the store's back (same length), then reopen
        let p = block_path(ssd.path(), 1);
        let mut b = std::fs::read(&p).unwrap();
        b[100] ^= 0xff;
        std::fs::write(&p, &b).unwrap();
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        assert!(s.lease(1, false).unwrap().is_none(), "the bad copy is not served");
        assert_eq!(s.corrupt_blocks(), 1);
        assert!(!p.exists() && !s.contains(1), "and it is gone");
        assert!(s.drain_changes().contains(&Change::Removed { block_id: 1 }));
        assert!(s.lease(2, false).unwrap().is_some());
        // a change while running is caught too (the file's ctime moves)
        let p2 = block_path(ssd.path(), 2);
        let mut b = std::fs::read(&p2).unwrap();
        b[0] ^= 1;
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p2, &b).unwrap();
        assert!(s.lease(2, false).unwrap().is_none());
        assert_eq!(s.corrupt_blocks(), 2);
    }

    #[test]
    fn demotion_and_restart_recovery() {
        let mem = tempfile::tempdir().unwrap();
        let ssd = tempfile::tempdir().unwrap();
        let tiers = [tier(TierAlias::MEM, mem.path(), 500), tier(TierAlias::SSD, ssd.path(), 5000)];
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        put(&s, 1, 200).unwrap();
        put(&s, 2, 200).unwrap();
        put(&s, 3, 200).unwrap(); // demotes 1 (and maybe 2) to SSD
        let report: HashMap<u64, TierAlias> = s.report().into_iter().map(|(id, t, _)| (id, t)).collect();
        assert_eq!(report[&1], TierAlias::SSD);
        assert_eq!(report[&3], TierAlias::MEM);
        let changes = s.drain_changes();
        assert!(changes.contains(&Change::Stored { block_id: 1, tier: TierAlias::SSD, len: 200 }));
        // promote brings it back up
        let l = s.lease(1, true).unwrap().unwrap();
        assert_eq!(l.tier, TierAlias::MEM);
        assert_eq!(std::fs::read(&l.path).unwrap().len(), 200);
        drop(l);
        drop(s);
        let s2 = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        assert_eq!(s2.report().len(), 3, "blocks survive a restart");
        assert_eq!(s2.usage().iter().map(|u| u.used).sum::<u64>(), 600);
    }

    #[test]
    fn removal_waits_for_leases_and_temp_blocks_clean_up() {
        let d = tempfile::tempdir().unwrap();
        let s = BlockStore::open(&[tier(TierAlias::MEM, d.path(), 1000)], 0.9, 0.5).unwrap();
        put(&s, 1, 100).unwrap();
        let l = s.lease(1, false).unwrap().unwrap();
        assert!(s.remove(1).unwrap());
        assert!(l.path.exists(), "leased block stays readable");
        assert!(s.lease(1, false).unwrap().is_none(), "but no new leases");
        drop(l);
        assert!(!block_path(d.path(), 1).exists());
        let t = s.create(2, 100).unwrap();
        std::fs::write(&t.path, b"x").unwrap();
        let p = t.path.clone();
        drop(t);
        assert!(!p.exists());
        assert_eq!(s.usage()[0].used, 0);
        assert_eq!(s.create(3, 2000).unwrap_err().kind(), ErrorKind::ResourceExhausted);
    }
}
