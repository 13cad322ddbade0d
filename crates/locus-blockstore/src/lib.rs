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
//! The blocks of a file version that is gone are retired rather than dropped
//! ([`BlockStore::retire`]): readable by id for a grace period, so a reader that resolved
//! them before the change finishes, and the first to go when room is needed.
//!
//! Each tier records the cluster (master namespace) its blocks belong to; joining another
//! cluster drops them ([`BlockStore::adopt_cluster`]), since block ids are only unique
//! within one namespace.
//!
//! Decisions (what to evict, demote or drop, reservations, claims on a block being
//! moved) are made under one state mutex; the file work they leave (copies between
//! tiers, removals, renames) is done with the mutex released. The methods that touch
//! files are blocking, and say so: async callers run them on
//! `tokio::task::spawn_blocking`.
//!
//! No networking here, and no dependency on other Locus crates except `locus-common`.

mod evict;
mod files;
mod lease;
mod state;
mod write;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use locus_common::config::{TierAlias, TierConfig};
use locus_common::{Error, Result};
use parking_lot::{Condvar, Mutex};

pub use files::file_crc;
pub use lease::Lease;
pub use write::TempBlock;

use files::{CLUSTER_FILE, Work, crc_path, read_cluster, read_crc};
use state::{Meta, State, Tier};

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
struct Inner {
    state: Mutex<State>,
    /// Signalled whenever file work settles (space freed, a move or a commit done).
    settled: Condvar,
    high: f64,
    low: f64,
    /// How long the MEM tier keeps a dropped block's file for reuse; zero: not at all.
    pool_ttl: Duration,
    #[cfg(test)]
    hooks: tests::Hooks,
}

/// The block store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BlockStore {
    inner: Arc<Inner>,
}

impl BlockStore {
    /// Open the tiers, creating their directories and finding the blocks already there.
    /// Blocking (it scans the tiers).
    pub fn open(tiers: &[TierConfig], high_watermark: f64, low_watermark: f64) -> Result<BlockStore> {
        if tiers.is_empty() {
            return Err(Error::invalid("a worker needs at least one tier"));
        }
        let mut sorted: Vec<&TierConfig> = tiers.iter().collect();
        sorted.sort_by_key(|t| t.alias);
        let mut state = State::new();
        for (i, t) in sorted.iter().enumerate() {
            let used = scan_tier(&mut state, i, &t.dir)?;
            state.tiers.push(Tier::new(t.alias, t.dir.clone(), t.quota.as_u64(), used));
        }
        Ok(BlockStore {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                settled: Condvar::new(),
                high: high_watermark,
                low: low_watermark,
                pool_ttl: Duration::ZERO,
                #[cfg(test)]
                hooks: Default::default(),
            }),
        })
    }

    /// Keep the files of blocks dropped from the MEM tier for up to `ttl`, and write new
    /// blocks into them (zero: never). Call right after [`BlockStore::open`].
    pub fn with_file_pool(mut self, ttl: Duration) -> BlockStore {
        let inner = Arc::get_mut(&mut self.inner).expect("with_file_pool on a store not yet shared");
        inner.pool_ttl = ttl;
        for t in &mut inner.state.get_mut().tiers {
            t.recycle = !ttl.is_zero() && t.alias == TierAlias::Mem;
        }
        self
    }

    /// Release pooled files older than the pool's time to live (the worker calls this
    /// with each heartbeat). Returns the bytes released. Blocking (it removes files).
    pub fn trim_file_pool(&self) -> u64 {
        let mut work = Work::default();
        {
            let mut s = self.inner.state.lock();
            for t in 0..s.tiers.len() {
                s.expire_pool(t, self.inner.pool_ttl, &mut work);
            }
        }
        self.inner.run(work)
    }

    /// Every block held, with its tier and length (the full block report). Retired
    /// blocks are not: the master has dropped them already.
    pub fn report(&self) -> Vec<(u64, TierAlias, u64)> {
        full_report(&self.inner.state.lock())
    }

    /// [`BlockStore::report`], taking the block changes it covers
    /// ([`BlockStore::drain_changes`]) in the same step, under the state lock: a block
    /// stored or removed after it is a change the next drain returns. (Taken in two steps,
    /// a block stored in between was in neither: not in the report, and its change
    /// drained with the others.)
    pub fn report_and_drain(&self) -> Vec<(u64, TierAlias, u64)> {
        let mut s = self.inner.state.lock();
        s.changes.clear();
        full_report(&s)
    }

    fn tier_dirs(&self) -> Vec<std::path::PathBuf> {
        self.inner.state.lock().tiers.iter().map(|t| t.dir.clone()).collect()
    }

    /// The cluster the blocks here belong to, as the tiers record it: 0 when none does
    /// (a new store), `u64::MAX` (no cluster's id) when tiers disagree. Blocking (it
    /// reads the tiers' records).
    pub fn cluster_id(&self) -> u64 {
        let mut ids = self.tier_dirs().into_iter().filter_map(|d| read_cluster(&d));
        match ids.next() {
            None => 0,
            Some(first) if ids.all(|i| i == first) => first,
            Some(_) => u64::MAX,
        }
    }

    /// Join cluster `id`: every block on a tier recorded under another cluster is dropped
    /// (leased or not: a reader keeps its open file, but the id now names other data;
    /// a block being moved goes when its move ends), then every tier records `id`.
    /// Returns the blocks dropped. Blocking (it removes files and writes the records).
    pub fn adopt_cluster(&self, id: u64) -> Result<usize> {
        let mut dropped = 0;
        for (i, dir) in self.tier_dirs().into_iter().enumerate() {
            let recorded = read_cluster(&dir);
            if recorded == Some(id) {
                continue;
            }
            if recorded.is_some() {
                let mut work = Work::default();
                {
                    let mut s = self.inner.state.lock();
                    let foreign: Vec<u64> =
                        s.blocks.iter().filter(|(_, m)| m.tier == i && !m.remove_when_free).map(|(b, _)| *b).collect();
                    dropped += foreign.len();
                    for b in foreign {
                        let m = s.blocks.get_mut(&b).expect("listed");
                        if m.moving {
                            m.remove_when_free = true;
                        } else {
                            s.drop_block(b, &mut work);
                        }
                    }
                }
                self.inner.run(work);
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

    /// Whether the block is here and live (not removed, not retired).
    pub fn contains(&self, block_id: u64) -> bool {
        self.inner.state.lock().blocks.get(&block_id).is_some_and(|m| !m.remove_when_free && m.retired_until.is_none())
    }

    /// Retire a block whose file version was overwritten or deleted: it stays for
    /// `grace`, readable by its id (a reader that resolved the file's blocks before the
    /// change finishes the version it started), and goes after that (or when its last
    /// lease ends, if later). Its space still counts as used until then, but it is the
    /// first to go when a write or a fill needs room, pinned or not, and it is reported
    /// removed now (never in a full block report). A zero `grace` removes it now.
    /// Returns whether the block was here.
    pub fn retire(&self, block_id: u64, grace: Duration) -> Result<bool> {
        if grace.is_zero() {
            return self.remove(block_id);
        }
        let mut s = self.inner.state.lock();
        let Some(m) = s.blocks.get_mut(&block_id) else {
            return Ok(false);
        };
        if m.retired_until.is_none() && !m.remove_when_free {
            m.retired_until = Some(std::time::Instant::now() + grace);
            s.changes.push(Change::Removed { block_id });
        }
        Ok(true)
    }

    /// Drop the retired blocks whose grace period has ended (a leased one when its last
    /// lease ends). Returns how many went or will go. The worker calls this with each
    /// heartbeat. Blocking (it removes files).
    pub fn expire_retired(&self) -> usize {
        let now = std::time::Instant::now();
        let mut work = Work::default();
        let mut n = 0;
        {
            let mut s = self.inner.state.lock();
            let due: Vec<u64> = s
                .blocks
                .iter()
                .filter(|(_, m)| m.retired_until.is_some_and(|t| t <= now) && !m.remove_when_free)
                .map(|(id, _)| *id)
                .collect();
            for id in due {
                n += 1;
                let m = s.blocks.get_mut(&id).expect("listed");
                if m.free() {
                    s.drop_block(id, &mut work);
                } else {
                    m.remove_when_free = true;
                }
            }
        }
        self.inner.run(work);
        n
    }

    /// Drop a block (free, or stale after a UFS change). A leased block goes when its
    /// last lease ends, a block being moved when its move ends. Returns whether the block
    /// was here. Blocking (it removes the block's file, without the state lock).
    pub fn remove(&self, block_id: u64) -> Result<bool> {
        let mut work = Work::default();
        {
            let mut s = self.inner.state.lock();
            let Some(m) = s.blocks.get_mut(&block_id) else {
                return Ok(false);
            };
            if !m.free() {
                m.remove_when_free = true;
                return Ok(true);
            }
            s.drop_block(block_id, &mut work);
        }
        self.inner.run(work);
        Ok(true)
    }
}

/// The live blocks (not retired) with their tiers and lengths: a full block report.
fn full_report(s: &State) -> Vec<(u64, TierAlias, u64)> {
    s.blocks
        .iter()
        .filter(|(_, m)| m.retired_until.is_none())
        .map(|(id, m)| (*id, s.tiers[m.tier].alias, m.len))
        .collect()
}

/// Find the blocks already on tier `i` (in `dir`), creating its directories and clearing
/// unfinished writes of a previous run. Returns their bytes.
fn scan_tier(state: &mut State, i: usize, dir: &Path) -> Result<u64> {
    // Only this user may look inside a tier (0700): block files are the cluster's data.
    locus_common::security::create_private_dir(dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| Error::io(format!("chmod 700 {}", dir.display()), e))?;
    let blocks = dir.join("blocks");
    std::fs::create_dir_all(&blocks).map_err(|e| Error::io(format!("create {}", blocks.display()), e))?;
    let tmp = dir.join("tmp");
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
            let _ = std::fs::remove_file(entry.path()); // a move's unfinished copy, say
            continue;
        };
        let len = entry.metadata().map_err(|e| Error::io("stat block", e))?.len();
        if state.blocks.contains_key(&id) {
            // The same block on two tiers (a crash mid-move): keep the upper copy.
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        used += len;
        let crc = read_crc(&crc_path(dir, id));
        state.blocks.insert(id, Meta::new(i, len, crc, 0));
    }
    Ok(used)
}
