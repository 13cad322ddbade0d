//! The store's state under its one mutex: tiers and their accounting, the blocks, pins,
//! and the changes for the master. Everything here is memory only; a change that needs
//! file work records it in a [`Work`] list, carried out after the lock is released.
//!
//! Accounting of a tier (all in bytes):
//! - `used`: committed blocks on the tier (their files are there);
//! - `reserved`: blocks being written, and blocks being moved in (their copies);
//! - `freeing`: files of dropped blocks not yet removed (or pooled);
//! - `pooled`: files kept for reuse (free space held, released to fit the quota);
//! - `leaving` and `incoming`: blocks claimed for a move out of or into the tier, not yet
//!   done: only the eviction plan counts them (a move reserves before it copies).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use locus_common::config::TierAlias;

use crate::Change;
use crate::files::{FileOp, Work, block_path, crc_path};

#[derive(Debug)]
pub(crate) struct Tier {
    pub alias: TierAlias,
    pub dir: PathBuf,
    pub quota: u64,
    pub used: u64,
    pub reserved: u64,
    pub freeing: u64,
    pub leaving: u64,
    pub incoming: u64,
    /// Files of dropped blocks kept for new blocks to be written into (MEM tier with a
    /// file pool only), newest last: path, length, since when.
    pub pool: Vec<(PathBuf, u64, Instant)>,
    pub pooled: u64,
    /// Whether dropped blocks' files go to the pool.
    pub recycle: bool,
}

impl Tier {
    pub fn new(alias: TierAlias, dir: PathBuf, quota: u64, used: u64) -> Tier {
        Tier {
            alias,
            dir,
            quota,
            used,
            reserved: 0,
            freeing: 0,
            leaving: 0,
            incoming: 0,
            pool: Vec::new(),
            pooled: 0,
            recycle: false,
        }
    }

    /// Bytes held on the tier's disk or promised to a writer: what a new reservation must
    /// fit beside (pooled files are free space, released to fit).
    pub fn held(&self) -> u64 {
        self.used + self.reserved + self.freeing
    }

    /// What the tier will hold once the moves claimed so far are done: what eviction plans by.
    pub fn projected(&self) -> u64 {
        (self.used + self.reserved + self.incoming).saturating_sub(self.leaving)
    }
}

#[derive(Debug)]
pub(crate) struct Meta {
    pub tier: usize,
    pub len: u64,
    pub last_access: u64,
    pub leases: u32,
    pub remove_when_free: bool,
    /// Claimed by a move (demotion or promotion) in progress: the mover owns its files
    /// until the move ends; a removal waits for it.
    pub moving: bool,
    pub crc: Option<u32>,
    /// The file's ctime when its checksum last matched.
    pub verified: Option<(i64, i64)>,
    /// Which incarnation of the id this is: the tick of its commit (0 for a block found
    /// at open). A lease ends on its own block, not on a later one of the same id.
    pub generation: u64,
    /// Retired (its file version was overwritten or deleted): kept, still readable by
    /// id, until then, for readers that resolved the file's blocks before the change
    /// ([`crate::BlockStore::retire`]). Not pinned, not reported, the first to go
    /// when room is needed.
    pub retired_until: Option<Instant>,
}

impl Meta {
    pub fn new(tier: usize, len: u64, crc: Option<u32>, tick: u64) -> Meta {
        Meta {
            tier,
            len,
            last_access: tick,
            leases: 0,
            remove_when_free: false,
            moving: false,
            crc,
            verified: None,
            generation: tick,
            retired_until: None,
        }
    }

    /// Nobody reads or moves the block: it may be dropped now.
    pub fn free(&self) -> bool {
        self.leases == 0 && !self.moving
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub tiers: Vec<Tier>,
    pub blocks: HashMap<u64, Meta>,
    pub tick: u64,
    pub pinned_versions: HashSet<u64>,
    /// Versions written here whose pin the master has not confirmed yet: version → the
    /// pin epoch from which the master's pin list covers it.
    pub write_pins: HashMap<u64, u64>,
    /// Ids being published (their file renamed into place outside the lock).
    pub committing: HashSet<u64>,
    /// Ids whose dropped files are still being removed, with how many such removals: a
    /// new block of the id waits for them, so they never take its file.
    pub dropping: HashMap<u64, u32>,
    pub changes: Vec<Change>,
    pub evictions: u64,
    pub corrupt: u64,
}

impl State {
    pub fn new() -> State {
        State {
            tiers: Vec::new(),
            blocks: HashMap::new(),
            tick: 0,
            pinned_versions: HashSet::new(),
            write_pins: HashMap::new(),
            committing: HashSet::new(),
            dropping: HashMap::new(),
            changes: Vec::new(),
            evictions: 0,
            corrupt: 0,
        }
    }

    pub fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    pub fn pinned(&self, id: u64) -> bool {
        let v = locus_common::split_block_id(id).0;
        self.pinned_versions.contains(&v) || self.write_pins.contains_key(&v)
    }

    /// Whether block `id` must stay: pinned and not retired (a retired block's version
    /// is gone, whatever pin list this worker still has).
    pub fn kept(&self, id: u64, m: &Meta) -> bool {
        m.retired_until.is_none() && self.pinned(id)
    }

    /// Whether a block may be claimed for a move: nobody reads, moves or removes it, and
    /// no earlier file work on its paths is still pending (it could take the new copy).
    pub fn movable(&self, id: u64, m: &Meta) -> bool {
        m.free() && !m.remove_when_free && !self.dropping.contains_key(&id)
    }

    /// Release pooled files of `tier` so that blocks, reservations and the pool fit the quota.
    pub fn fit_pool(&mut self, tier: usize, work: &mut Work) {
        let t = &mut self.tiers[tier];
        while t.used + t.reserved + t.pooled > t.quota && !t.pool.is_empty() {
            let (p, len, _) = t.pool.remove(0);
            t.pooled -= len;
            t.freeing += len;
            work.release.push((p, tier, len));
        }
    }

    /// Release pooled files of `tier` older than `ttl`.
    pub fn expire_pool(&mut self, tier: usize, ttl: std::time::Duration, work: &mut Work) {
        let t = &mut self.tiers[tier];
        while t.pool.first().is_some_and(|f| f.2.elapsed() >= ttl) {
            let (p, len, _) = t.pool.remove(0);
            t.pooled -= len;
            t.freeing += len;
            work.release.push((p, tier, len));
        }
    }

    /// Drop a block's copy (not one being moved: its mover drops it). Its file goes to
    /// the tier's pool when the tier keeps one and no lease holds the block (a leased
    /// file may still be read: it is removed, so the reader keeps the old bytes and
    /// nobody writes over them). The files are dealt with by `work`.
    pub fn drop_block(&mut self, block_id: u64, work: &mut Work) {
        let Some(m) = self.blocks.remove(&block_id) else {
            return;
        };
        debug_assert!(!m.moving, "block {block_id} dropped under its mover");
        let nonce = self.next_tick();
        let t = &mut self.tiers[m.tier];
        t.used -= m.len;
        let pool = (t.recycle && m.leases == 0).then(|| t.dir.join("tmp").join(format!("pool-{nonce}")));
        if m.retired_until.is_none() {
            // (a retired block was reported removed when it was retired)
            self.changes.push(Change::Removed { block_id });
        }
        self.file_gone(block_id, m.tier, m.len, pool, work);
    }

    /// Hand a block's files on `tier` (`len` bytes, no longer in `used`) to `work` for
    /// removal, or for the pool when `pool` names a place in it.
    pub fn file_gone(&mut self, block_id: u64, tier: usize, len: u64, pool: Option<PathBuf>, work: &mut Work) {
        let dir = &self.tiers[tier].dir;
        work.files.push(FileOp {
            block_id,
            tier,
            len,
            file: block_path(dir, block_id),
            crc: crc_path(dir, block_id),
            pool,
        });
        self.tiers[tier].freeing += len;
        *self.dropping.entry(block_id).or_default() += 1;
    }

    /// The accounting matches the blocks and never passes a quota (tests check it after
    /// every step).
    #[cfg(test)]
    pub fn check(&self) {
        for (i, t) in self.tiers.iter().enumerate() {
            let on_tier: u64 = self.blocks.values().filter(|m| m.tier == i).map(|m| m.len).sum();
            assert_eq!(t.used, on_tier, "{} tier: used bytes match its blocks", t.alias.as_str());
            assert!(t.used + t.reserved <= t.quota, "{} tier over quota: {t:?}", t.alias.as_str());
            assert_eq!(t.pooled, t.pool.iter().map(|p| p.1).sum::<u64>());
        }
    }
}
