//! Writing a block: [`BlockStore::create`] reserves its space (making room first), the
//! [`TempBlock`] is written, and [`TempBlock::commit`] publishes it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use locus_common::{Error, ErrorKind, Result};

use crate::files::{Work, block_path, crc_path};
use crate::lease::Lease;
use crate::state::Meta;
use crate::{BlockStore, Inner};

/// How many times `create` plans room before it gives up on a tier that others keep
/// filling (each round waits for the moves and removals in flight).
const ROUNDS: usize = 8;

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

impl BlockStore {
    /// Whether `need` more bytes could be stored here at all, making room by evicting and
    /// demoting whatever may go: the tiers' quotas, less what pinned blocks (a write's
    /// own blocks so far included) and writes in progress hold. Fails with
    /// `ResourceExhausted`, naming the quotas, when they cannot; nothing is evicted. A
    /// write checks its declared size before its first block and each block before
    /// making room for it, so a write that cannot fit never evicts other files for
    /// nothing.
    pub fn check_room(&self, need: u64) -> Result<()> {
        let s = self.inner.state.lock();
        let mut held = vec![0u64; s.tiers.len()];
        for (id, m) in &s.blocks {
            if s.kept(*id, m) {
                held[m.tier] += m.len;
            }
        }
        let mut free = 0u64;
        for (t, h) in s.tiers.iter().zip(&held) {
            free += t.quota.saturating_sub(h + t.reserved);
        }
        if need <= free {
            return Ok(());
        }
        let tiers: Vec<String> = s
            .tiers
            .iter()
            .zip(&held)
            .map(|(t, h)| {
                format!("{} quota {} bytes ({} pinned, {} being written)", t.alias.as_str(), t.quota, h, t.reserved)
            })
            .collect();
        Err(Error::new(
            ErrorKind::ResourceExhausted,
            format!(
                "the cache is full: {need} more bytes cannot fit in {}; at most {free} can be made free",
                tiers.join(", ")
            ),
        ))
    }

    /// Drop at once what a failed write of file version `version` stored here (its blocks
    /// 0, 1, ... as far as they go) and end its write pin, so its space comes back now
    /// rather than when the master gives the write up. Blocking (it removes files).
    pub fn abandon_write(&self, version: u64) -> u64 {
        let mut n = 0;
        while self.remove(locus_common::block_id(version, n)).unwrap_or(false) {
            n += 1;
        }
        self.inner.state.lock().write_pins.remove(&version);
        n
    }

    /// Reserve `len` bytes for a new block on the top tier that can make room for it,
    /// evicting if needed.
    ///
    /// Blocking: eviction removes files and demotion copies them between tiers; async
    /// callers run this on `tokio::task::spawn_blocking`. Room is planned under the state
    /// lock, the file work is done without it, and the space is reserved once it is free.
    pub fn create(&self, block_id: u64, len: u64) -> Result<TempBlock> {
        let inner = &self.inner;
        let mut last_err = None;
        for _ in 0..ROUNDS {
            let mut work = Work::default();
            let mut s = inner.state.lock();
            if s.blocks.contains_key(&block_id) || s.committing.contains(&block_id) {
                return Err(Error::new(ErrorKind::AlreadyExists, format!("block {block_id} exists")));
            }
            // Try tiers from the top; a block goes to the first one that can make room.
            let mut tier = None;
            for t in 0..s.tiers.len() {
                match inner.plan_room(&mut s, t, len, &mut work) {
                    Ok(()) => {
                        tier = Some(t);
                        break;
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            let Some(tier) = tier else {
                drop(s);
                inner.run(work);
                break;
            };
            if s.tiers[tier].held() + len > s.tiers[tier].quota {
                // Room comes once the planned work (ours, or others' in flight) is done.
                drop(s);
                let ours = !work.is_empty();
                inner.run(std::mem::take(&mut work));
                s = inner.state.lock();
                if s.tiers[tier].held() + len > s.tiers[tier].quota {
                    if !ours {
                        inner.settled.wait_for(&mut s, Duration::from_millis(20));
                    }
                    last_err = Some(Error::new(
                        ErrorKind::ResourceExhausted,
                        format!("{} tier is full: no room for {len} more bytes", s.tiers[tier].alias.as_str()),
                    ));
                    continue;
                }
            }
            let nonce = s.next_tick();
            let t = &mut s.tiers[tier];
            t.reserved += len;
            let path = t.dir.join("tmp").join(format!("{block_id}-{nonce}"));
            let final_path = block_path(&t.dir, block_id);
            // Write into a pooled file when there is one: the newest, its pages the most
            // recently used.
            let pooled = t.pool.pop().map(|(p, flen, _)| {
                t.pooled -= flen;
                (p, flen)
            });
            s.fit_pool(tier, &mut work);
            drop(s);
            let recycled = pooled.and_then(|(p, flen)| match std::fs::rename(&p, &path) {
                Ok(()) => Some(flen),
                Err(_) => {
                    let _ = std::fs::remove_file(&p);
                    None
                }
            });
            inner.run(work);
            return Ok(TempBlock {
                inner: inner.clone(),
                block_id,
                path,
                final_path,
                reserved: len,
                tier,
                recycled,
                done: false,
            });
        }
        Err(last_err.expect("a tier was tried"))
    }
}

impl TempBlock {
    /// Open the block's file for writing from its start. A pooled file is written over:
    /// [`TempBlock::commit`] cuts whatever lies past the block's end.
    pub fn open(&self) -> Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)
            .map_err(|e| Error::io(format!("open the file of block {}", self.block_id), e))
    }

    /// Publish the block. `len` is its final length (at most the reservation); `crc` its
    /// crc32c, kept beside it and checked when it is read from a disk tier.
    ///
    /// Blocking (it writes the checksum and renames the file, without the state lock).
    pub fn commit(self, len: u64, crc: Option<u32>) -> Result<()> {
        self.publish(len, crc, false).map(drop)
    }

    /// [`TempBlock::commit`], and lease the block in the same step (so it cannot be
    /// evicted before the lease): for readers that followed the block's file as it grew.
    pub fn commit_leased(self, len: u64, crc: Option<u32>) -> Result<Lease> {
        self.publish(len, crc, true).map(|l| l.expect("a lease was asked for"))
    }

    fn publish(mut self, len: u64, crc: Option<u32>, leased: bool) -> Result<Option<Lease>> {
        let id = self.block_id;
        if len > self.reserved {
            return Err(Error::internal(format!("block {id} grew past its reservation")));
        }
        if self.recycled.is_some_and(|flen| flen > len) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&self.path)
                .and_then(|f| f.set_len(len))
                .map_err(|e| Error::io(format!("cut the file of block {id}"), e))?;
        }
        let inner = self.inner.clone();
        let mut s = inner.state.lock();
        // The id's file is ours to put in place once no one else publishes it and the
        // files of a dropped copy are gone.
        while s.committing.contains(&id) || (s.dropping.contains_key(&id) && !s.blocks.contains_key(&id)) {
            inner.settled.wait(&mut s);
        }
        self.done = true;
        if s.blocks.contains_key(&id) {
            // A concurrent writer won; same bytes.
            s.tiers[self.tier].reserved -= self.reserved;
            let lease = if leased { inner.take_lease(&mut s, id) } else { None };
            drop(s);
            let _ = std::fs::remove_file(&self.path);
            inner.settled.notify_all();
            return Ok(lease);
        }
        s.committing.insert(id);
        let dir = s.tiers[self.tier].dir.clone();
        drop(s);
        let placed = match crc {
            Some(crc) => std::fs::write(crc_path(&dir, id), crc.to_be_bytes())
                .map_err(|e| Error::io(format!("write checksum of block {id}"), e)),
            None => Ok(()),
        }
        .and_then(|()| {
            std::fs::rename(&self.path, &self.final_path).map_err(|e| Error::io(format!("commit block {id}"), e))
        });
        if placed.is_err() {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(crc_path(&dir, id));
        }
        let mut s = inner.state.lock();
        s.committing.remove(&id);
        s.tiers[self.tier].reserved -= self.reserved;
        let lease = match placed {
            Ok(()) => {
                s.tiers[self.tier].used += len;
                let tick = s.next_tick();
                s.blocks.insert(id, Meta::new(self.tier, len, crc, tick));
                let alias = s.tiers[self.tier].alias;
                s.changes.push(crate::Change::Stored { block_id: id, tier: alias, len });
                Ok(if leased { inner.take_lease(&mut s, id) } else { None })
            }
            Err(e) => Err(e),
        };
        drop(s);
        inner.settled.notify_all();
        lease
    }
}

impl Drop for TempBlock {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
            self.inner.state.lock().tiers[self.tier].reserved -= self.reserved;
            self.inner.settled.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use locus_common::config::TierAlias;
    use locus_common::{ErrorKind, block_id};

    use crate::BlockStore;
    use crate::tests::tier;

    fn put(store: &BlockStore, id: u64, len: u64) {
        let t = store.create(id, len).unwrap();
        std::fs::write(&t.path, vec![1u8; len as usize]).unwrap();
        t.commit(len, None).unwrap();
    }

    /// Room is counted over every tier, less pinned blocks and reservations; what may be
    /// evicted counts as room. Checking evicts nothing.
    #[test]
    fn check_room_counts_what_could_be_freed_and_evicts_nothing() {
        let d = tempfile::tempdir().unwrap();
        let tiers = [tier(TierAlias::Mem, &d.path().join("m"), 4096), tier(TierAlias::Ssd, &d.path().join("s"), 4096)];
        let store = BlockStore::open(&tiers, 0.9, 0.5).unwrap();
        put(&store, block_id(1, 0), 2048); // evictable
        put(&store, block_id(2, 0), 2048); // pinned below
        store.set_pinned_versions(HashSet::from([2]), 1);
        store.check_room(6144).unwrap();
        let e = store.check_room(6145).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ResourceExhausted);
        assert!(e.to_string().contains("MEM quota 4096") && e.to_string().contains("SSD quota 4096"), "{e}");
        let t = store.create(block_id(3, 0), 1024).unwrap(); // a write in progress holds its reservation
        assert!(store.check_room(5121).is_err());
        drop(t);
        store.check_room(6144).unwrap();
        assert!(store.contains(block_id(1, 0)), "nothing evicted");
    }

    /// A failed write's blocks go at once, pinned or not, and its write pin ends.
    #[test]
    fn abandon_write_drops_the_blocks_and_the_pin() {
        let d = tempfile::tempdir().unwrap();
        let store = BlockStore::open(&[tier(TierAlias::Mem, &d.path().join("m"), 8192)], 0.9, 0.5).unwrap();
        store.pin_written(7, 5);
        for i in 0..3 {
            put(&store, block_id(7, i), 1024);
        }
        put(&store, block_id(8, 0), 1024);
        assert!(store.check_room(5121).is_err());
        assert_eq!(store.abandon_write(7), 3);
        assert!((0..3).all(|i| !store.contains(block_id(7, i))));
        assert!(store.contains(block_id(8, 0)));
        store.check_room(8192).unwrap(); // the pin is gone: block 8 is evictable room too
        assert_eq!(store.usage()[0].used, 1024);
    }
}
