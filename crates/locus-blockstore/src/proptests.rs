//! Property tests of the store under concurrency, in the manner of foyer's storage fuzz
//! tests: several threads run random sequences of create, commit, lease (with or without
//! promotion), release, remove and pool trims over two small tiers. After every step the
//! accounting is checked (used bytes match the blocks, no quota passed); every lease's
//! file is read when it is taken and again when it ends, and must be there, unchanged;
//! at the end the accounting matches the files on disk.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use locus_common::ErrorKind;
use locus_common::config::TierAlias;
use proptest::prelude::*;

use crate::files::CLUSTER_FILE;
use crate::tests::tier;
use crate::{BlockStore, Lease};

#[derive(Clone, Debug)]
enum Op {
    /// Create a block, write it, and commit it (or drop it unfinished).
    Put {
        id: u64,
        len: u64,
        commit: bool,
    },
    /// Lease a block and hold the lease.
    Lease {
        id: u64,
        promote: bool,
    },
    /// End the oldest lease held.
    Release,
    Remove {
        id: u64,
    },
    /// Retire a block (its version gone), for a grace of 0, 1 or 1000 ms.
    Retire {
        id: u64,
        grace_ms: u64,
    },
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..12u64, 50..400u64, prop::bool::weighted(0.9)).prop_map(|(id, len, commit)| Op::Put { id, len, commit }),
        4 => (1..12u64, any::<bool>()).prop_map(|(id, promote)| Op::Lease { id, promote }),
        2 => Just(Op::Release),
        2 => (1..12u64).prop_map(|id| Op::Remove { id }),
        2 => (1..12u64, prop_oneof![Just(0u64), Just(1), Just(1000)]).prop_map(|(id, grace_ms)| Op::Retire { id, grace_ms }),
        1 => Just(Op::Trim),
    ]
}

/// Each write fills its block with a byte of its own, so a lease sees any other write.
static FILL: AtomicU8 = AtomicU8::new(1);

fn step(s: &BlockStore, held: &mut Vec<(Lease, Vec<u8>)>, op: &Op) {
    match *op {
        Op::Put { id, len, commit } => match s.create(id, len) {
            Ok(t) => {
                let data = vec![FILL.fetch_add(1, Ordering::Relaxed); len as usize];
                std::io::Write::write_all(&mut t.open().unwrap(), &data).unwrap();
                if commit {
                    t.commit(len, Some(crc32c::crc32c(&data))).unwrap();
                }
            }
            Err(e) => assert!(matches!(e.kind(), ErrorKind::AlreadyExists | ErrorKind::ResourceExhausted), "{e}"),
        },
        Op::Lease { id, promote } => {
            if let Some(l) = s.lease(id, promote).unwrap() {
                let data = std::fs::read(&l.path).expect("a leased block's file is there");
                assert_eq!(data.len() as u64, l.len);
                held.push((l, data));
            }
        }
        Op::Release => {
            if !held.is_empty() {
                release(held.remove(0));
            }
        }
        Op::Remove { id } => {
            s.remove(id).unwrap();
        }
        Op::Retire { id, grace_ms } => {
            s.retire(id, std::time::Duration::from_millis(grace_ms)).unwrap();
        }
        Op::Trim => {
            s.trim_file_pool();
            s.expire_retired();
        }
    }
    s.check();
}

fn release((l, data): (Lease, Vec<u8>)) {
    let now = std::fs::read(&l.path).expect("a block is never deleted under its lease");
    assert!(now == data, "block {} changed under its lease", l.block_id);
}

/// Bytes and block files on a tier's disk, and the bytes of files in its `tmp/`.
fn on_disk(dir: &std::path::Path) -> (u64, u64, u64) {
    let (mut bytes, mut files) = (0, 0);
    for e in std::fs::read_dir(dir.join("blocks")).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_str().unwrap().parse::<u64>().is_ok() {
            bytes += e.metadata().unwrap().len();
            files += 1;
        }
    }
    let tmp = std::fs::read_dir(dir.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != CLUSTER_FILE)
        .map(|e| e.metadata().unwrap().len())
        .sum();
    (bytes, files, tmp)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_operations_keep_leases_quotas_and_accounting(
        threads in prop::collection::vec(prop::collection::vec(op(), 1..40), 3),
        pool in any::<bool>(),
    ) {
        let (mem, ssd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let tiers = [tier(TierAlias::Mem, mem.path(), 1000), tier(TierAlias::Ssd, ssd.path(), 1000)];
        let ttl = if pool { Duration::from_secs(3600) } else { Duration::ZERO };
        let s = BlockStore::open(&tiers, 0.9, 0.5).unwrap().with_file_pool(ttl);
        std::thread::scope(|scope| {
            for ops in &threads {
                let s = s.clone();
                scope.spawn(move || {
                    let mut held = Vec::new();
                    for op in ops {
                        step(&s, &mut held, op);
                    }
                    held.into_iter().for_each(release);
                });
            }
        });
        s.check();
        for (u, dir) in s.usage().iter().zip([mem.path(), ssd.path()]) {
            let (bytes, files, tmp) = on_disk(dir);
            prop_assert_eq!((u.used, u.blocks), (bytes, files), "{} tier: accounting matches the disk", u.alias.as_str());
            prop_assert_eq!(tmp, u.pooled, "only pooled files are left in tmp/");
            prop_assert!(bytes + tmp <= u.capacity, "{} tier over its quota", u.alias.as_str());
        }
        // Reopened, the store finds the same blocks (retired ones too: the master has them
        // dropped at the registration, since their versions are gone).
        let mut before: Vec<_> = {
            let st = s.inner.state.lock();
            st.blocks.iter().map(|(id, m)| (*id, st.tiers[m.tier].alias, m.len)).collect()
        };
        drop(s);
        let mut after = BlockStore::open(&tiers, 0.9, 0.5).unwrap().report();
        before.sort_unstable();
        after.sort_unstable();
        prop_assert_eq!(before, after);
    }
}
