//! The store's unit tests, and the named points tests hook to run one operation inside
//! another at a chosen place (a deterministic interleaving, no sleeps).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use bytesize::ByteSize;
use locus_common::config::{TierAlias, TierConfig};
use locus_common::{ErrorKind, Result};
use parking_lot::Mutex;

use crate::files::{CLUSTER_FILE, block_path};
use crate::{BlockStore, Change, Inner};

type Hook = Box<dyn FnOnce() + Send>;

/// Hooks set by tests, each run once when the store passes its point.
#[derive(Default)]
pub(crate) struct Hooks(Mutex<HashMap<&'static str, Hook>>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

impl Inner {
    /// A named point: run the hook set for it, if any (never with the state lock held).
    pub(crate) fn at(&self, point: &'static str) {
        let hook = self.hooks.0.lock().remove(point);
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl BlockStore {
    /// Run `f` (once) when the store next passes `point`.
    pub(crate) fn on(&self, point: &'static str, f: impl FnOnce() + Send + 'static) {
        self.inner.hooks.0.lock().insert(point, Box::new(f));
    }

    /// Check the accounting against the blocks and the quotas.
    pub(crate) fn check(&self) {
        self.inner.state.lock().check();
    }
}

pub(crate) fn tier(alias: TierAlias, dir: &Path, quota: u64) -> TierConfig {
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
    let tiers = [tier(TierAlias::Mem, m.path(), 1000), tier(TierAlias::Ssd, sd.path(), 1000)];
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
    let tiers = [tier(TierAlias::Mem, m.path(), 1000), tier(TierAlias::Ssd, sd.path(), 1000)];
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
    let tiers = [tier(TierAlias::Mem, m.path(), 1000), tier(TierAlias::Ssd, sd.path(), 1000)];
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
    assert_eq!(s.report().iter().find(|b| b.0 == 3).unwrap().1, TierAlias::Ssd);
    s.remove(3).unwrap();
    assert_eq!(pooled(&s), 0);
}

#[test]
fn lru_eviction_between_watermarks() {
    let d = tempfile::tempdir().unwrap();
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
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

/// A full block report takes the changes it covers, and only those: a block stored
/// after it is a change the next drain returns (the worker's registration sends the
/// report, and its next commit that block).
#[test]
fn a_full_report_takes_the_changes_it_covers_and_no_later_one() {
    let d = tempfile::tempdir().unwrap();
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
    put(&s, 1, 100).unwrap();
    put(&s, 2, 100).unwrap();
    s.remove(2).unwrap();
    let report: Vec<u64> = s.report_and_drain().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(report, [1]);
    assert!(s.drain_changes().is_empty(), "the report covers them");
    put(&s, 3, 100).unwrap();
    assert_eq!(s.drain_changes(), vec![Change::Stored { block_id: 3, tier: TierAlias::Mem, len: 100 }]);
}

/// A retired block (its file version overwritten or deleted) stays readable by id for
/// its grace period, longer while leased; it counts as used until it goes, goes first
/// when room is needed (pinned or not), and is reported removed once, at retirement.
#[test]
fn retired_blocks_stay_readable_for_their_grace_then_give_their_space_back() {
    let d = tempfile::tempdir().unwrap();
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
    let (old, other) = (locus_common::block_id(9, 0), locus_common::block_id(10, 0));
    put(&s, old, 300).unwrap();
    put(&s, other, 300).unwrap();
    s.set_pinned_versions([9, 10].into(), 1); // the worker's pin list may lag the master
    s.drain_changes();
    assert!(s.retire(old, Duration::from_millis(200)).unwrap());
    assert_eq!(s.drain_changes(), vec![Change::Removed { block_id: old }]);
    assert!(!s.contains(old), "not live");
    assert!(!s.report().iter().any(|(id, _, _)| *id == old), "not in a full block report");
    assert_eq!(s.usage()[0].used, 600, "its space is still used");
    let lease = s.lease(old, false).unwrap().expect("still readable by id");
    assert_eq!(s.expire_retired(), 0, "within its grace");
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(s.expire_retired(), 1);
    assert!(lease.path.exists() && s.usage()[0].used == 600, "a leased block stays past its grace");
    assert!(s.lease(old, false).unwrap().is_none(), "no new readers once its grace is over");
    drop(lease);
    assert!(!block_path(d.path(), old).exists());
    assert_eq!(s.usage()[0].used, 300, "the space came back");
    assert!(s.drain_changes().is_empty(), "reported removed once");
    s.check();

    // Room for a write: a retired block goes first, pinned or not, before any live one.
    put(&s, old, 300).unwrap();
    s.retire(old, Duration::from_secs(3600)).unwrap();
    put(&s, 3, 300).unwrap(); // 900: at the high watermark
    drop(s.lease(3, false).unwrap());
    put(&s, 4, 100).unwrap(); // 1000 > 900: room down to 500 - 100
    assert!(s.lease(old, false).unwrap().is_none(), "the retired block went first");
    assert!(s.contains(other), "the pinned live block stays");
    s.check();
    // check_room counts a retired block as space that can be made free.
    put(&s, 5, 200).unwrap();
    s.retire(5, Duration::from_secs(3600)).unwrap();
    s.set_pinned_versions([10, 0].into(), 2); // `other` (300) and 4 (100) are kept
    s.check_room(600).unwrap();
    assert!(s.check_room(601).is_err());
    // A zero grace removes at once.
    assert!(s.retire(other, Duration::ZERO).unwrap());
    assert!(!block_path(d.path(), other).exists());
    s.check();
}

#[test]
fn pinned_and_leased_blocks_stay() {
    let d = tempfile::tempdir().unwrap();
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
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
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
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
    let tiers = [tier(TierAlias::Ssd, ssd.path(), 5000)];
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
    let tiers = [tier(TierAlias::Mem, mem.path(), 500), tier(TierAlias::Ssd, ssd.path(), 5000)];
    let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
    put(&s, 1, 200).unwrap();
    put(&s, 2, 200).unwrap();
    put(&s, 3, 200).unwrap(); // demotes 1 (and maybe 2) to SSD
    let report: HashMap<u64, TierAlias> = s.report().into_iter().map(|(id, t, _)| (id, t)).collect();
    assert_eq!(report[&1], TierAlias::Ssd);
    assert_eq!(report[&3], TierAlias::Mem);
    let changes = s.drain_changes();
    assert!(changes.contains(&Change::Stored { block_id: 1, tier: TierAlias::Ssd, len: 200 }));
    // promote brings it back up
    let l = s.lease(1, true).unwrap().unwrap();
    assert_eq!(l.tier, TierAlias::Mem);
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
    let s = BlockStore::open(&[tier(TierAlias::Mem, d.path(), 1000)], 0.9, 0.5).unwrap();
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

#[test]
fn a_block_dropped_while_its_lease_is_checked_is_gone_not_corrupt() {
    // Once `lease` indexed the block after re-taking the lock and panicked when a
    // cluster adoption had dropped it meanwhile.
    let ssd = tempfile::tempdir().unwrap();
    let s = BlockStore::open(&[tier(TierAlias::Ssd, ssd.path(), 5000)], 0.9, 0.5).unwrap();
    put(&s, 1, 300).unwrap();
    s.adopt_cluster(7).unwrap();
    let other = s.clone();
    s.on("lease.verify", move || assert_eq!(other.adopt_cluster(8).unwrap(), 1));
    assert!(s.lease(1, false).unwrap().is_none(), "the block went while it was checked");
    assert_eq!(s.corrupt_blocks(), 0, "a dropped block is not a corrupt one");
    assert!(!s.contains(1) && !block_path(ssd.path(), 1).exists());
    s.check();
    // The same race, with a new block of the id committed meanwhile: the new one stays.
    put(&s, 1, 300).unwrap();
    let other = s.clone();
    s.on("lease.verify", move || {
        std::fs::write(ssd_cluster(&other), "9").unwrap();
        assert_eq!(other.adopt_cluster(8).unwrap(), 1);
        put(&other, 1, 200).unwrap();
    });
    assert!(s.lease(1, false).unwrap().is_none());
    assert_eq!(s.corrupt_blocks(), 0);
    let l = s.lease(1, false).unwrap().expect("the new block is served");
    assert_eq!(l.len, 200);
    drop(l);
    s.check();
}

fn ssd_cluster(s: &BlockStore) -> std::path::PathBuf {
    s.inner.state.lock().tiers[0].dir.join(CLUSTER_FILE)
}

fn held(slot: &std::sync::Arc<Mutex<Option<crate::Lease>>>) -> crate::Lease {
    slot.lock().take().expect("the hook ran")
}

#[test]
fn a_block_leased_while_it_is_demoted_stays_where_the_lease_found_it() {
    let (mem, ssd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tiers = [tier(TierAlias::Mem, mem.path(), 500), tier(TierAlias::Ssd, ssd.path(), 5000)];
    let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
    put(&s, 1, 200).unwrap();
    put(&s, 2, 200).unwrap();
    // Block 1 (least recently used) is being copied to the SSD tier when a reader leases it.
    let slot = std::sync::Arc::new(Mutex::new(None));
    let (other, into) = (s.clone(), slot.clone());
    s.on("move.copy", move || *into.lock() = other.lease(1, false).unwrap());
    put(&s, 3, 200).unwrap();
    let lease = held(&slot);
    assert_eq!(lease.tier, TierAlias::Mem);
    assert_eq!(std::fs::read(&lease.path).unwrap(), vec![7u8; 200], "the leased file is still there");
    let report: HashMap<u64, TierAlias> = s.report().into_iter().map(|(id, t, _)| (id, t)).collect();
    assert_eq!(report[&1], TierAlias::Mem, "the move was given up");
    assert_eq!(report[&2], TierAlias::Ssd);
    assert!(!block_path(ssd.path(), 1).exists(), "and its copy removed");
    s.check();
    drop(lease);
    // A block removed while it is moved goes when the move ends, from both tiers.
    let other = s.clone();
    s.on("move.copy", move || {
        assert!(other.remove(1).unwrap());
        assert!(!other.contains(1));
    });
    put(&s, 4, 200).unwrap();
    assert!(!s.contains(1) && !block_path(mem.path(), 1).exists() && !block_path(ssd.path(), 1).exists());
    assert!(s.drain_changes().contains(&Change::Removed { block_id: 1 }));
    s.check();
    assert_eq!(s.usage().iter().map(|u| u.used).sum::<u64>(), 600);
}
