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
