//! Eviction and moves between tiers. Under the state lock, [`Inner::plan_room`] decides:
//! past the high watermark it picks least recently used blocks (not pinned, leased or
//! moving) down to the low watermark, drops them, or claims them for demotion to the
//! next tier. With the lock released, [`Inner::run_move`] carries a claimed move out:
//! it reserves the space on the target tier, copies the block (its file stays where it
//! was, so a reader may still lease it), and then, under the lock again, either
//! publishes the block on its new tier or, if a reader leased it meanwhile, gives the
//! copy up. A leased block is never moved out from under its lease.

use locus_common::{Error, ErrorKind, Result};

use crate::files::{Work, block_path, copy_file, crc_path};
use crate::state::State;
use crate::{Change, Inner};

/// A block claimed for a move from one tier to another.
#[derive(Debug)]
pub(crate) struct Move {
    pub block_id: u64,
    pub to: usize,
    /// An eviction: if the block cannot go to `to`, it is dropped instead.
    pub evict: bool,
}

fn exhausted(msg: String) -> Error {
    Error::new(ErrorKind::ResourceExhausted, msg)
}

impl Inner {
    /// Plan for `need` more bytes on `tier`: past the high watermark, evict least
    /// recently used blocks down to the low watermark, demoting them to the next tier
    /// when it can take them. Drops are done in the state now, their files left to
    /// `work`; demotions are claimed and queued in `work`, the deepest tier's first.
    /// Ok when the tier will have room once `work` is done.
    pub(crate) fn plan_room(&self, s: &mut State, tier: usize, need: u64, work: &mut Work) -> Result<()> {
        let quota = s.tiers[tier].quota;
        let high = (quota as f64 * self.high) as u64;
        let low = (quota as f64 * self.low) as u64;
        if need > quota {
            return Err(exhausted(format!(
                "block of {need} bytes exceeds the {} tier quota of {quota} bytes",
                s.tiers[tier].alias.as_str()
            )));
        }
        if s.tiers[tier].projected() + need <= high {
            return Ok(());
        }
        let target = low.saturating_sub(need);
        // Retired blocks first (they are only kept for readers already under way), then
        // the least recently used.
        let mut candidates: Vec<(bool, u64, u64)> = s
            .blocks
            .iter()
            .filter(|(id, m)| m.tier == tier && s.movable(**id, m) && !s.kept(**id, m))
            .map(|(id, m)| (m.retired_until.is_none(), m.last_access, *id))
            .collect();
        candidates.sort_unstable();
        for (live, _, id) in candidates {
            if s.tiers[tier].projected() <= target {
                break;
            }
            if !live {
                s.drop_block(id, work);
                continue;
            }
            let len = s.blocks[&id].len;
            // Claim the block first, so planning room below never picks it.
            self.claim(s, id);
            if tier + 1 < s.tiers.len() && self.plan_room(s, tier + 1, len, work).is_ok() {
                s.tiers[tier + 1].incoming += len;
                work.moves.push(Move { block_id: id, to: tier + 1, evict: true });
            } else {
                Self::unclaim(s, id);
                s.drop_block(id, work);
            }
            s.evictions += 1;
        }
        let projected = s.tiers[tier].projected();
        if projected + need <= quota {
            Ok(())
        } else {
            Err(exhausted(format!(
                "{} tier is full: {projected} of {quota} bytes held by pinned or in-use blocks, {need} more needed",
                s.tiers[tier].alias.as_str(),
            )))
        }
    }

    fn claim(&self, s: &mut State, id: u64) {
        let m = s.blocks.get_mut(&id).expect("claimed block");
        m.moving = true;
        let (tier, len) = (m.tier, m.len);
        s.tiers[tier].leaving += len;
    }

    fn unclaim(s: &mut State, id: u64) {
        let m = s.blocks.get_mut(&id).expect("claimed block");
        m.moving = false;
        let (tier, len) = (m.tier, m.len);
        s.tiers[tier].leaving -= len;
    }

    /// Claim a block for promotion to the top tier, planning room there: best effort, no
    /// promotion when the block is held or the top tier cannot make room.
    pub(crate) fn plan_promotion(&self, s: &mut State, block_id: u64, work: &mut Work) {
        let Some(m) = s.blocks.get(&block_id) else {
            return;
        };
        if m.tier == 0 || !s.movable(block_id, m) || m.retired_until.is_some() {
            return;
        }
        let len = m.len;
        self.claim(s, block_id);
        if self.plan_room(s, 0, len, work).is_ok() {
            s.tiers[0].incoming += len;
            work.moves.push(Move { block_id, to: 0, evict: false });
        } else {
            Self::unclaim(s, block_id);
        }
    }

    /// Carry out a claimed move (without the state lock): reserve room on the target
    /// tier, copy the block there, and publish it, unless a reader leased it or someone
    /// removed it meanwhile. An eviction that cannot go to its tier drops the block.
    pub(crate) fn run_move(&self, mv: Move, work: &mut Work) {
        let Move { block_id, to, evict } = mv;
        let mut pool = Work::default();
        let (from, len, crc, src, dst, dst_crc) = {
            let mut s = self.state.lock();
            let m = &s.blocks[&block_id]; // a claimed block stays until its mover ends
            let (from, len, crc, busy) = (m.tier, m.len, m.crc, m.leases > 0 || m.remove_when_free);
            let drop_it = m.leases == 0 && (m.remove_when_free || evict);
            s.tiers[to].incoming -= len;
            if busy || s.tiers[to].held() + len > s.tiers[to].quota {
                Self::unclaim(&mut s, block_id);
                if drop_it {
                    s.drop_block(block_id, work);
                }
                drop(s);
                self.settled.notify_all();
                return;
            }
            s.tiers[to].reserved += len;
            s.fit_pool(to, &mut pool);
            let dir = &s.tiers[to].dir;
            (
                from,
                len,
                crc,
                block_path(&s.tiers[from].dir, block_id),
                block_path(dir, block_id),
                crc_path(dir, block_id),
            )
        };
        self.run(pool); // the pooled files the copy needs room from go first
        #[cfg(test)]
        self.at("move.copy");
        let copied = copy_file(&src, &dst).and_then(|()| match crc {
            Some(crc) => std::fs::write(&dst_crc, crc.to_be_bytes()),
            None => Ok(()),
        });
        if let Err(e) = &copied {
            tracing::warn!(block = block_id, error = %e, "moving a block between tiers failed");
        }
        let mut s = self.state.lock();
        Self::unclaim(&mut s, block_id);
        s.tiers[to].reserved -= len;
        let m = s.blocks.get_mut(&block_id).expect("claimed block");
        if copied.is_ok() && m.leases == 0 && !m.remove_when_free {
            m.tier = to;
            s.tiers[from].used -= len;
            s.tiers[to].used += len;
            s.file_gone(block_id, from, len, None, work);
            let alias = s.tiers[to].alias;
            s.changes.push(Change::Stored { block_id, tier: alias, len });
            s.fit_pool(to, work);
        } else {
            // The copy is given up; the block stays where it was, or goes if removed
            // (or if an eviction could not move it).
            s.file_gone(block_id, to, len, None, work);
            let m = &s.blocks[&block_id];
            if m.leases == 0 && (m.remove_when_free || (evict && copied.is_err())) {
                s.drop_block(block_id, work);
            }
        }
        drop(s);
        self.settled.notify_all();
    }
}
