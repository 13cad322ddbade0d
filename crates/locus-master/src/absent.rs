//! The UFS paths a lookup found missing, and when: a lookup of the same name again within
//! its mount's sync interval is answered from here, with no UFS call (Alluxio's
//! absent-path cache). A job's commit protocol looks the same missing paths up several
//! times each (its output directory, `_temporary`, each final file before its rename,
//! `_SUCCESS`), while its persists run in the UFS.
//!
//! An entry is only ever asked about a name the namespace lacks: whatever Locus makes at
//! the path is in the namespace, which answers first. What is put in the UFS behind
//! Locus's back at a path looked up in vain shows once the interval has passed, as in a
//! directory's listing; a path never looked up is asked of the UFS at once.

use std::collections::HashMap;

use parking_lot::Mutex;

/// At most this many paths are remembered; past it, expired entries go, then all.
const CAPACITY: usize = 100_000;

#[derive(Default)]
pub(crate) struct AbsentPaths {
    /// (mount id, UFS path) → when the UFS last said it is not there (ms).
    seen: Mutex<HashMap<(u64, String), i64>>,
}

impl AbsentPaths {
    /// Whether the UFS said `rel` (of mount `mount`) is missing less than `interval_ms`
    /// before `now`.
    /// Forgets every path (a new leader asks the UFS afresh).
    pub(crate) fn forget(&self) {
        self.seen.lock().clear();
    }

    pub(crate) fn is_absent(&self, mount: u64, rel: &str, interval_ms: u64, now: i64) -> bool {
        let seen = self.seen.lock();
        seen.get(&(mount, rel.to_string())).is_some_and(|&t| now - t < interval_ms as i64)
    }

    /// The UFS says `rel` is missing, as of `at`.
    pub(crate) fn note(&self, mount: u64, rel: &str, at: i64, interval_ms: u64) {
        if interval_ms == 0 {
            return;
        }
        let mut seen = self.seen.lock();
        if seen.len() >= CAPACITY {
            seen.retain(|_, t| at - *t < interval_ms as i64);
            if seen.len() >= CAPACITY {
                seen.clear();
            }
        }
        seen.insert((mount, rel.to_string()), at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_within_the_interval_only() {
        let a = AbsentPaths::default();
        assert!(!a.is_absent(1, "out/_SUCCESS", 1000, 0));
        a.note(1, "out/_SUCCESS", 0, 1000);
        assert!(a.is_absent(1, "out/_SUCCESS", 1000, 999));
        assert!(!a.is_absent(1, "out/_SUCCESS", 1000, 1000), "expired");
        assert!(!a.is_absent(2, "out/_SUCCESS", 1000, 1), "another mount");
        assert!(!a.is_absent(1, "out", 1000, 1), "another path");
        a.note(1, "x", 0, 0);
        assert!(!a.is_absent(1, "x", 0, 0), "an interval of 0 always asks the UFS");
    }

    #[test]
    fn stays_bounded() {
        let a = AbsentPaths::default();
        for i in 0..CAPACITY + 10 {
            a.note(1, &format!("p{i}"), i as i64, u64::MAX / 4);
        }
        assert!(a.seen.lock().len() <= CAPACITY);
        assert!(a.is_absent(1, &format!("p{}", CAPACITY + 9), u64::MAX / 4, (CAPACITY + 9) as i64));
    }
}
