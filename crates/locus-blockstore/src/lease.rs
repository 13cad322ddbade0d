//! Leases: a reader's hold on a block, which keeps it in place (never evicted, moved or
//! deleted) while it lives, and the checksum check of a disk tier's copy before it is
//! served.

use std::path::PathBuf;
use std::sync::Arc;

use locus_common::Result;
use locus_common::config::TierAlias;

use crate::files::{Work, block_path, ctime, file_crc};
use crate::{BlockStore, Inner};

/// A reader's hold on a block: while it lives the block is neither evicted nor moved.
#[derive(Debug)]
pub struct Lease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) generation: u64,
    pub block_id: u64,
    pub path: PathBuf,
    pub len: u64,
    pub tier: TierAlias,
}

impl Inner {
    /// Take a lease on a block already looked up under the lock.
    pub(crate) fn take_lease(self: &Arc<Self>, s: &mut crate::state::State, block_id: u64) -> Option<Lease> {
        let tick = s.next_tick();
        let m = s.blocks.get_mut(&block_id)?;
        m.last_access = tick;
        m.leases += 1;
        let t = &s.tiers[m.tier];
        Some(Lease {
            inner: self.clone(),
            generation: m.generation,
            block_id,
            path: block_path(&t.dir, block_id),
            len: m.len,
            tier: t.alias,
        })
    }
}

impl BlockStore {
    /// Lease a block for reading; `promote` first moves it to the top tier if it can.
    /// `None` when the block is not here (or went while it was being checked), or when
    /// its copy on a disk tier fails its checksum (then it is dropped).
    ///
    /// Blocking: a promotion copies the block, and a disk tier's copy is read to check
    /// it; async callers run this on `tokio::task::spawn_blocking`. No lock is held
    /// across the file work.
    pub fn lease(&self, block_id: u64, promote: bool) -> Result<Option<Lease>> {
        let inner = &self.inner;
        if promote {
            let mut work = Work::default();
            inner.plan_promotion(&mut inner.state.lock(), block_id, &mut work);
            inner.run(work);
        }
        let (lease, check) = {
            let mut s = inner.state.lock();
            match s.blocks.get(&block_id) {
                Some(m) if !m.remove_when_free => {}
                _ => return Ok(None),
            }
            let lease = inner.take_lease(&mut s, block_id).expect("looked up");
            let m = &s.blocks[&block_id];
            let check = m.crc.filter(|_| lease.tier != TierAlias::Mem).map(|crc| (crc, m.verified));
            (lease, check)
        };
        let Some((want, verified)) = check else {
            return Ok(Some(lease));
        };
        #[cfg(test)]
        inner.at("lease.verify");
        let now = ctime(&lease.path);
        if verified.is_some() && verified == now {
            return Ok(Some(lease));
        }
        let ok = matches!(file_crc(&lease.path), Ok((crc, n)) if crc == want && n == lease.len);
        let mut s = inner.state.lock();
        let Some(m) = s.blocks.get_mut(&block_id).filter(|m| m.generation == lease.generation) else {
            // Dropped while it was checked (a cluster adoption): gone, not corrupt.
            drop(s);
            drop(lease);
            return Ok(None);
        };
        if ok {
            m.verified = now;
            return Ok(Some(lease));
        }
        m.remove_when_free = true;
        s.corrupt += 1;
        drop(s);
        tracing::error!(block = block_id, path = %lease.path.display(), "block failed its checksum; dropping this copy");
        drop(lease); // the last lease: the copy goes
        Ok(None)
    }
}

impl BlockStore {
    /// [`lease`](BlockStore::lease) when it needs no file work: a block on the MEM tier,
    /// not to be promoted (no copy, no checksum read). `None` when the block is not
    /// here or would need that work: then call [`lease`](BlockStore::lease), on a
    /// blocking thread. Takes only the state mutex, so async callers may run it inline.
    pub fn lease_now(&self, block_id: u64, promote: bool) -> Option<Lease> {
        if promote {
            return None;
        }
        let inner = &self.inner;
        let mut s = inner.state.lock();
        let m = s.blocks.get(&block_id)?;
        if m.remove_when_free || s.tiers[m.tier].alias != TierAlias::Mem {
            return None;
        }
        inner.take_lease(&mut s, block_id)
    }
}

impl Drop for Lease {
    /// Ends the lease; the last lease of a removed block removes its file (blocking, briefly).
    fn drop(&mut self) {
        let mut work = Work::default();
        {
            let mut s = self.inner.state.lock();
            if let Some(m) = s.blocks.get_mut(&self.block_id).filter(|m| m.generation == self.generation) {
                m.leases -= 1;
                if m.free() && m.remove_when_free {
                    s.drop_block(self.block_id, &mut work);
                }
            }
        }
        self.inner.run(work);
    }
}

#[cfg(test)]
mod tests {
    use locus_common::config::TierAlias;

    use crate::BlockStore;
    use crate::tests::tier;

    fn put(store: &BlockStore, id: u64, len: u64) {
        let t = store.create(id, len).unwrap();
        let data = vec![7u8; len as usize];
        std::fs::write(&t.path, &data).unwrap();
        t.commit(len, Some(crc32c::crc32c(&data))).unwrap();
    }

    /// `lease_now` leases a MEM-tier block as `lease` does, and leaves to `lease` what
    /// needs file work (a disk tier's check, a promotion), a missing or removed block.
    #[test]
    fn lease_now_takes_only_mem_blocks_that_need_no_file_work() {
        let (mem, ssd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mem_only = BlockStore::open(&[tier(TierAlias::Mem, mem.path(), 1000)], 0.9, 0.5).unwrap();
        put(&mem_only, 1, 100);
        let l = mem_only.lease_now(1, false).expect("a MEM block leases inline");
        assert_eq!((l.block_id, l.len, l.tier), (1, 100, TierAlias::Mem));
        assert!(mem_only.lease_now(1, true).is_none(), "a promotion goes through lease");
        assert!(mem_only.lease_now(2, false).is_none(), "not here");
        assert!(mem_only.remove(1).unwrap());
        assert!(l.path.exists(), "the lease keeps the removed block's file");
        assert!(mem_only.lease_now(1, false).is_none(), "no new lease of a removed block");
        let path = l.path.clone();
        drop(l);
        assert!(!path.exists(), "the last lease removes it");

        let on_ssd = BlockStore::open(&[tier(TierAlias::Ssd, ssd.path(), 1000)], 0.9, 0.5).unwrap();
        put(&on_ssd, 3, 100);
        assert!(on_ssd.lease_now(3, false).is_none(), "a disk-tier block is checked by lease");
        assert!(on_ssd.lease(3, false).unwrap().is_some());
    }
}
