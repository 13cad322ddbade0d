//! The indexer: keeps the search index ([`super::index`]) in line with the namespace.
//!
//! - **Live changes** reach it through the journal ([`crate::journal`]), written in the
//!   namespace transaction of each change. The indexer job applies the journal in order,
//!   commits at most about once a second with the last applied seq as the commit's
//!   payload, and then trims the journal. After a crash it resumes from that payload;
//!   every change is an upsert or a delete, so applying one twice changes nothing.
//! - **Searches** call [`Catalog::view`] first: it applies whatever the journal holds
//!   past the writer, so a search sees every change acknowledged before it began
//!   (read-after-write and read-after-delete), and what imports handed in.
//! - **Imports** go straight to the index writer, without the journal: an inventory can
//!   hold billions of objects. A request that asks for it is answered after a commit (the
//!   CLI asks on its last batch). Paths the namespace holds are left alone.
//! - **A fresh index** (a new master, a lost index directory, or the catalog tables of
//!   an older version) is filled from the old tables, else from the namespace.
//!
//! Between commits the writer's changes are not searchable in the index, so the indexer
//! keeps the journal's in an [`Overlay`] (the paths changed, and the subtrees deleted):
//! - a search reads the last commit with the overlay laid over it, so it sees every
//!   acknowledged change without waiting for a commit (a commit costs hundreds of
//!   milliseconds of fsyncs; the overlay costs a look at the journal);
//! - the indexer's own lookups read it too: the entry an upsert merges with, the subtree
//!   a rename moves, the paths an import must skip.
//!
//! Imports are not kept there (an import may hold millions): a change that must see them
//! (a rename, an upsert that merges) commits them first, and so does a search while
//! imports wait, or a count (answered by the index alone).
//!
//! An upsert must delete the path's old document, and a delete costs a dictionary lookup
//! in every segment at commit: too much for an import of millions of new paths. Two
//! Bloom filters of fixed size (so memory stays bounded however large the catalog) say
//! which paths the index certainly does not hold, and which the namespace certainly does
//! not hold; only the others pay the delete or the exact check. They are filled from
//! the index at start and only grow, so they may err only towards the exact path.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use locus_common::job::Job;
use locus_common::{Error, Result};
use locus_proto::pb;
use redb::ReadableTable;
use tantivy::query::{AllQuery, Query};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Searcher};

use crate::Master;
use crate::journal::{self as catalog, CATALOG_JOURNAL, LEGACY_CATALOG, LEGACY_CATALOG_INDEX, entry_of, path_of};
use crate::store::{COUNTERS, INODES, Store, db_err, decode};
use locus_search::index::{self, Fields, KeyRange, KeyScan, ix_err, key_range, successor};
use locus_search::writer::{WRITER_THREADS, import_order, open_index};

/// Deletes after which the writer is replaced at its next commit. tantivy's writer keeps
/// every delete it was given (about 1.3 KiB each: the term query and its scoring cache)
/// for as long as it lives, commits and merges notwithstanding; in a master that deletes
/// all day that grew without end (the memory test in `crates/locus/tests/memory.rs`).
/// Opening a writer costs a few milliseconds.
const RENEW_AFTER_DELETES: u64 = 512;
/// The index's on-disk format (tantivy 0.27 with sstable term dictionaries, no field
/// norms), written to `FORMAT` in its directory; an index without it is rebuilt.
const FORMAT: &str = "tantivy-0.27-sstable-nonorms";
/// How often the job looks at the journal.
const TICK: Duration = Duration::from_millis(200);
/// Uncommitted changes wait at most about this long (searches do not wait for it).
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// Journal entries applied between checks of `PENDING_MAX`.
const JOURNAL_CHUNK: u64 = 20_000;
/// Uncommitted imports wait at most about this long (a search commits them first, and
/// the import's last call commits). Each commit flushes a segment per indexing thread:
/// at 10 s a three-minute import of 10M objects committed 18 times, not 3.
const IMPORT_COMMIT_EVERY: Duration = Duration::from_secs(60);
/// Uncommitted paths that force a commit (bounds the indexer's memory).
const PENDING_MAX: usize = 200_000;
/// Uncommitted paths past which a search commits rather than reading the overlay.
const OVERLAY_MAX: usize = 20_000;
/// The Bloom filters' sizes (bits, as powers of two): 32 MiB for every path, 16 MiB
/// for the namespace's (2e-5 false positives at 10 million paths).
const KEYS_BLOOM_BITS: u32 = 28;
const HELD_BLOOM_BITS: u32 = 27;

/// A Bloom filter: "maybe" or "certainly not".
struct Bloom {
    bits: Vec<u64>,
    mask: u64,
}

impl Bloom {
    const PROBES: u64 = 7;

    fn new(log2_bits: u32) -> Bloom {
        Bloom { bits: vec![0; 1 << (log2_bits - 6)], mask: (1 << log2_bits) - 1 }
    }

    /// The hash both filters probe with (an import hashes each path once).
    fn hash(key: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    }

    fn probes(&self, h: u64) -> impl Iterator<Item = u64> + use<> {
        let (a, b, mask) = (h, h.rotate_left(32) | 1, self.mask);
        (0..Self::PROBES).map(move |i| a.wrapping_add(i.wrapping_mul(b)) & mask)
    }

    fn insert_hash(&mut self, h: u64) {
        for p in self.probes(h) {
            self.bits[(p >> 6) as usize] |= 1 << (p & 63);
        }
    }

    fn maybe_hash(&self, h: u64) -> bool {
        self.probes(h).all(|p| self.bits[(p >> 6) as usize] & (1 << (p & 63)) != 0)
    }

    fn insert(&mut self, key: &[u8]) {
        self.insert_hash(Self::hash(key));
    }
}

/// The search index and its writer.
pub struct Catalog {
    reader: IndexReader,
    pub f: Fields,
    w: Mutex<Writer>,
    /// The last journal seq searchable (committed and loaded).
    searchable: AtomicU64,
    /// Whether the writer holds changes not committed yet.
    dirty: std::sync::atomic::AtomicBool,
    /// The fast columns of the segments searched last.
    pub columns: locus_search::columns::ColumnCache,
}

/// The journal's changes since the last commit (see the module doc).
#[derive(Clone, Default)]
pub struct Overlay {
    /// Paths changed since the last commit: their entry, or `None` when deleted.
    pending: BTreeMap<String, Option<pb::CatalogEntry>>,
    /// Subtrees deleted since the last commit (root paths); a path in `pending` was
    /// changed after them.
    deleted: BTreeSet<String>,
}

impl Overlay {
    /// Whether the committed document of `path` (if any) is out of date.
    pub fn hides(&self, path: &str) -> bool {
        self.pending.contains_key(path) || self.deleted_over(path)
    }

    /// Whether `path` is at or below a subtree deleted since the last commit.
    fn deleted_over(&self, path: &str) -> bool {
        if self.deleted.is_empty() {
            return false;
        }
        // `path` itself, then each directory above it, up to `/`.
        let mut p = path;
        loop {
            if self.deleted.contains(if p.is_empty() { "/" } else { p }) {
                return true;
            }
            match p.rfind('/') {
                Some(i) if !p.is_empty() => p = &p[..i],
                _ => return false,
            }
        }
    }

    /// What the overlay says of `path`: `Some(None)` deleted, `Some(Some(e))` changed,
    /// `None` as committed.
    fn get(&self, path: &str) -> Option<Option<&pb::CatalogEntry>> {
        match self.pending.get(path) {
            Some(v) => Some(v.as_ref()),
            None if self.deleted_over(path) => Some(None),
            None => None,
        }
    }

    /// The entries changed since the last commit with a path in `range`, in path order.
    pub fn entries<'a>(&'a self, range: &KeyRange) -> impl Iterator<Item = (&'a String, &'a pb::CatalogEntry)> {
        let r = (range.0.as_ref().map(String::as_str), range.1.as_ref().map(String::as_str));
        self.pending.range::<str, _>(r).filter_map(|(p, e)| e.as_ref().map(|e| (p, e)))
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.deleted.is_empty()
    }
}

struct Writer {
    /// `None` only between dropping a writer and opening its successor ([`Writer::iw`]).
    w: Option<IndexWriter>,
    index: Index,
    /// The writer's memory (`master.search_index_memory`).
    heap: usize,
    /// Deletes given to this writer since it was opened, and how many it takes before
    /// it is renewed ([`RENEW_AFTER_DELETES`]).
    deletes: u64,
    renew_after: u64,
    /// Changes since the last commit (shared with searches, copied on write).
    ov: Arc<Overlay>,
    /// The last journal seq given to the writer.
    applied: u64,
    last_commit: Instant,
    /// Whether journal changes (not only imports) wait for a commit.
    journal_dirty: bool,
    /// Whether imports wait for a commit.
    imports_pending: bool,
    /// Paths the index may hold (committed or not).
    keys: Bloom,
    /// Paths the namespace may hold.
    held: Bloom,
}

impl Writer {
    /// The writer, opened anew if the last one was dropped.
    fn iw(&mut self) -> Result<&mut IndexWriter> {
        let w = match self.w.take() {
            Some(w) => w,
            None => {
                self.deletes = 0;
                self.index.writer_with_num_threads(WRITER_THREADS, self.heap).map_err(ix_err)?
            }
        };
        Ok(self.w.insert(w))
    }

    fn delete_term(&mut self, t: tantivy::Term) -> Result<()> {
        self.deletes += 1;
        self.iw()?.delete_term(t);
        Ok(())
    }

    fn delete_query(&mut self, q: Box<dyn Query>) -> Result<()> {
        self.deletes += 1;
        self.iw()?.delete_query(q).map_err(ix_err)?;
        Ok(())
    }
}

/// Whether `path` is `root` or below it.
fn under(path: &str, root: &str) -> bool {
    root == "/" || path == root || path.strip_prefix(root).is_some_and(|r| r.starts_with('/'))
}

/// The key range of the paths strictly below `root`.
fn below(root: &str) -> (String, Option<String>) {
    let lo = if root == "/" { "/".to_string() } else { format!("{root}/") };
    let hi = successor(&lo);
    (lo, hi)
}

impl Catalog {
    /// Open (or create) the index in `dir`, filling a fresh one from `store`; its
    /// writer holds at most `heap` bytes of uncommitted changes.
    pub fn open(dir: &Path, store: &Store, heap: usize) -> Result<Catalog> {
        catalog::create(store)?;
        let marker = dir.join("FORMAT");
        let format = std::fs::read_to_string(&marker).unwrap_or_default();
        if format.trim() != FORMAT && dir.join("meta.json").exists() {
            // An index of an older build (another term dictionary): rebuilt from the
            // namespace. Entries only an import brought in are not in the namespace.
            tracing::warn!(
                dir = %dir.display(),
                "the search index has an older format: rebuilding it from the namespace (import inventories again)"
            );
            std::fs::remove_dir_all(dir).map_err(|e| Error::io(format!("removing {}", dir.display()), e))?;
        }
        locus_common::security::create_private_dir(dir)?;
        if format.trim() != FORMAT {
            std::fs::write(&marker, FORMAT).map_err(|e| Error::io(format!("writing {}", marker.display()), e))?;
        }
        let (index, w) = open_index(dir, heap)?;
        let f = Fields::of(&index.schema())?;
        let metas = index.load_metas().map_err(ix_err)?;
        let fresh = metas.payload.is_none() && metas.segments.is_empty();
        let applied = metas.payload.as_deref().and_then(|p| p.parse().ok()).unwrap_or(0);
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(ix_err)?;
        let cat = Catalog {
            reader,
            f,
            w: Mutex::new(Writer {
                w: Some(w),
                index: index.clone(),
                heap,
                deletes: 0,
                renew_after: RENEW_AFTER_DELETES,
                ov: Arc::default(),
                applied,
                last_commit: Instant::now(),
                journal_dirty: false,
                imports_pending: false,
                keys: Bloom::new(KEYS_BLOOM_BITS),
                held: Bloom::new(HELD_BLOOM_BITS),
            }),
            searchable: AtomicU64::new(applied),
            dirty: false.into(),
            columns: Default::default(),
        };
        if fresh {
            cat.fill(store)?;
        }
        {
            let mut st = cat.lock();
            let st = &mut *st;
            let s = cat.searcher();
            index::all_keys(&s, &cat.f, |k| st.keys.insert(k))?;
            index::namespace_keys(&s, &cat.f, |k| st.held.insert(k))?;
        }
        Ok(cat)
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        self.w.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The index as of the last commit.
    pub fn searcher(&self) -> Searcher {
        self.reader.searcher()
    }

    /// Fill a fresh index: from the catalog tables of an older version when they exist
    /// (then delete them), else from the namespace's files.
    fn fill(&self, store: &Store) -> Result<()> {
        let mut st = self.lock();
        let r = store.read()?;
        let head = catalog::head(&r.open_table(COUNTERS).map_err(db_err)?)?;
        let mut n = 0u64;
        let legacy = match r.open_table(LEGACY_CATALOG) {
            Ok(t) => {
                for e in t.iter().map_err(db_err)? {
                    let (k, v) = e.map_err(db_err)?;
                    let entry: pb::CatalogEntry = decode(v.value())?;
                    st.iw()?.add_document(self.f.doc(k.value(), &entry)).map_err(ix_err)?;
                    n += 1;
                }
                true
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {
                let inodes = r.open_table(INODES).map_err(db_err)?;
                for e in inodes.iter().map_err(db_err)? {
                    let (_, v) = e.map_err(db_err)?;
                    let rec: pb::InodeRecord = decode(v.value())?;
                    if rec.is_dir || rec.parent == 0 {
                        continue;
                    }
                    if let Some(p) = path_of(&inodes, &rec)? {
                        st.iw()?.add_document(self.f.doc(&p, &entry_of(&rec))).map_err(ix_err)?;
                        n += 1;
                    }
                }
                false
            }
            Err(e) => return Err(db_err(e)),
        };
        drop(r);
        st.applied = head;
        self.commit(&mut st)?;
        if n > 0 {
            tracing::info!(
                entries = n,
                from = if legacy { "the old catalog tables" } else { "the namespace" },
                "search index built"
            );
        }
        store.write_soft_blocking(move |w| {
            w.delete_table(LEGACY_CATALOG).map_err(db_err)?;
            w.delete_table(LEGACY_CATALOG_INDEX).map_err(db_err)?;
            w.open_table(CATALOG_JOURNAL).map_err(db_err)?.retain_in(..=head, |_, _| false).map_err(db_err)?;
            Ok(())
        })
    }

    /// Renews the writer after `n` deletes instead (tests: renewals among other changes).
    #[cfg(test)]
    pub(crate) fn renew_after_deletes(&self, n: u64) {
        self.w.lock().unwrap_or_else(|e| e.into_inner()).renew_after = n;
    }

    /// Commit the writer (with the last applied seq as payload) and load the commit.
    fn commit(&self, st: &mut Writer) -> Result<()> {
        let payload = st.applied.to_string();
        let mut pc = st.iw()?.prepare_commit().map_err(ix_err)?;
        pc.set_payload(&payload);
        pc.commit().map_err(ix_err)?;
        if st.deletes >= st.renew_after {
            st.w = None; // the old writer goes first: it holds the directory's lock
            st.iw()?;
        }
        self.reader.reload().map_err(ix_err)?;
        st.ov = Arc::default();
        st.last_commit = Instant::now();
        st.journal_dirty = false;
        st.imports_pending = false;
        self.searchable.store(st.applied, Ordering::SeqCst);
        self.dirty.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Apply the journal past the writer; commit when due, when `force`d, or when many
    /// paths wait; then trim what is committed. Blocking.
    pub fn step(&self, store: &Store, force: bool) -> Result<()> {
        let mut st = self.lock();
        self.catch_up(&mut st, store)?;
        let committed = self.searchable.load(Ordering::SeqCst);
        let every = if st.journal_dirty { COMMIT_EVERY } else { IMPORT_COMMIT_EVERY };
        if self.dirty.load(Ordering::SeqCst) && (force || st.last_commit.elapsed() >= every) {
            self.commit(&mut st)?;
        }
        let now = self.searchable.load(Ordering::SeqCst);
        if now > committed {
            store.write_soft_blocking(move |w| {
                w.open_table(CATALOG_JOURNAL).map_err(db_err)?.retain_in(..=now, |_, _| false).map_err(db_err)
            })?;
        }
        Ok(())
    }

    /// What a search reads: the last commit and the changes since, every change
    /// acknowledged so far included. Commits first when imports wait, when the overlay
    /// is large, or when `commit` (a count, answered by the index alone). Blocking.
    pub fn view(&self, store: &Store, commit: bool) -> Result<(Searcher, Arc<Overlay>)> {
        let mut st = self.lock();
        self.catch_up(&mut st, store)?;
        if self.dirty.load(Ordering::SeqCst)
            && (commit || st.imports_pending || st.ov.pending.len() + st.ov.deleted.len() > OVERLAY_MAX)
        {
            self.commit(&mut st)?;
        }
        Ok((self.searcher(), st.ov.clone()))
    }

    /// Apply the journal past the writer (committing when many paths wait).
    fn catch_up(&self, st: &mut Writer, store: &Store) -> Result<()> {
        loop {
            let r = store.read()?;
            let head = catalog::head(&r.open_table(COUNTERS).map_err(db_err)?)?;
            if head <= st.applied {
                break;
            }
            let to = head.min(st.applied + JOURNAL_CHUNK);
            let t = r.open_table(CATALOG_JOURNAL).map_err(db_err)?;
            let mut changes = Vec::new();
            for e in t.range(st.applied + 1..=to).map_err(db_err)? {
                let (_, v) = e.map_err(db_err)?;
                changes.push(decode::<pb::CatalogChange>(v.value())?);
            }
            drop((t, r));
            for c in changes {
                self.apply(st, c)?;
            }
            st.applied = to;
            st.journal_dirty = true;
            self.dirty.store(true, Ordering::SeqCst);
            if st.ov.pending.len() >= PENDING_MAX {
                self.commit(st)?;
            }
        }
        Ok(())
    }

    fn apply(&self, st: &mut Writer, c: pb::CatalogChange) -> Result<()> {
        let reads = c.kind() == pb::CatalogChangeKind::CatalogRename || c.keep_imported;
        if reads && st.imports_pending {
            // What it reads must include the imports (not kept in `pending`).
            self.commit(st)?;
        }
        match c.kind() {
            pb::CatalogChangeKind::CatalogPut => {
                let mut e = c.entry.unwrap_or_default();
                if c.keep_imported
                    && let Some(o) = self.current(st, &c.path)?
                    && o.size == e.size
                    && o.etag == e.etag
                {
                    e.content_type = o.content_type;
                    e.user = o.user;
                    e.tags = o.tags;
                }
                self.put(st, c.path, e, true)
            }
            pb::CatalogChangeKind::CatalogDeleteTree => self.delete_tree(st, &c.path),
            pb::CatalogChangeKind::CatalogRename => {
                let moved = self.subtree(st, &c.path)?;
                self.delete_tree(st, &c.path)?;
                for (p, e) in moved {
                    let to = format!("{}{}", c.dst, &p[c.path.len()..]);
                    self.put(st, to, e, true)?;
                }
                Ok(())
            }
            pb::CatalogChangeKind::Unspecified => {
                tracing::warn!(path = %c.path, "a catalog change of no kind (skipped)");
                Ok(())
            }
        }
    }

    /// The entry `path` has now, counting the writer's uncommitted changes.
    fn current(&self, st: &Writer, path: &str) -> Result<Option<pb::CatalogEntry>> {
        match st.ov.get(path) {
            Some(v) => Ok(v.cloned()),
            None => index::lookup(&self.searcher(), &self.f, path),
        }
    }

    fn put(&self, st: &mut Writer, path: String, e: pb::CatalogEntry, may_exist: bool) -> Result<()> {
        if may_exist {
            st.delete_term(self.f.key_term(&path))?;
        }
        st.iw()?.add_document(self.f.doc(&path, &e)).map_err(ix_err)?;
        st.keys.insert(path.as_bytes());
        if e.inode != 0 {
            st.held.insert(path.as_bytes());
        }
        Arc::make_mut(&mut st.ov).pending.insert(path, Some(e));
        Ok(())
    }

    fn delete_tree(&self, st: &mut Writer, root: &str) -> Result<()> {
        st.delete_term(self.f.key_term(root))?;
        let (lo, hi) = below(root);
        let q: Box<dyn Query> = if root == "/" { Box::new(AllQuery) } else { key_range(&self.f, &lo, hi.as_deref()) };
        st.delete_query(q)?;
        let ov = Arc::make_mut(&mut st.ov);
        let doomed: Vec<String> = ov
            .pending
            .range::<str, _>((Bound::Included(root), Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(root))
            .map(|(p, _)| p.clone())
            .filter(|p| under(p, root))
            .collect();
        for p in doomed {
            ov.pending.remove(&p);
        }
        ov.deleted.insert(root.to_string());
        Ok(())
    }

    /// Every entry at `root` and below it now.
    fn subtree(&self, st: &Writer, root: &str) -> Result<Vec<(String, pb::CatalogEntry)>> {
        let s = self.searcher();
        let mut out = Vec::new();
        let (lo, hi) = below(root);
        let ranges = [
            (Bound::Included(root), Bound::Included(root)),
            (Bound::Included(lo.as_str()), hi.as_deref().map_or(Bound::Unbounded, Bound::Excluded)),
        ];
        for (a, b) in ranges {
            let mut scan = KeyScan::new(&s, &self.f, a, b)?;
            while let Some((p, addr)) = scan.next_doc()? {
                if st.ov.hides(&p) {
                    continue;
                }
                out.push((p, index::entry_at(&s, &self.f, addr)?));
            }
        }
        for (p, e) in st.ov.pending.range::<str, _>((Bound::Included(root), Bound::Unbounded)) {
            if !p.starts_with(root) {
                break;
            }
            if let Some(e) = e
                && under(p, root)
            {
                out.push((p.clone(), e.clone()));
            }
        }
        Ok(out)
    }

    /// Index imported entries (the last of a path wins), leaving alone the paths the
    /// namespace holds; commit when `commit`. Returns (written, skipped). Blocking.
    pub fn import(&self, mut entries: Vec<(String, pb::CatalogEntry)>, commit: bool) -> Result<(u64, u64)> {
        let order = import_order(&entries);
        let mut st = self.lock();
        let st = &mut *st;
        let s = self.searcher();
        let (mut written, mut skipped) = (0, 0);
        for i in order {
            let path = std::mem::take(&mut entries[i].0);
            let e = pb::CatalogEntry { inode: 0, ..std::mem::take(&mut entries[i].1) };
            let h = Bloom::hash(path.as_bytes());
            let held = match st.ov.get(&path) {
                Some(v) => v.is_some_and(|o| o.inode != 0),
                None => st.held.maybe_hash(h) && index::lookup(&s, &self.f, &path)?.is_some_and(|o| o.inode != 0),
            };
            if held {
                skipped += 1;
                continue;
            }
            // (A committed document under a subtree deleted since goes with that delete,
            // which comes before this put.)
            if st.ov.pending.contains_key(&path) || st.keys.maybe_hash(h) {
                st.delete_term(self.f.key_term(&path))?;
            }
            st.iw()?.add_document(self.f.doc(&path, &e)).map_err(ix_err)?;
            st.keys.insert_hash(h);
            written += 1;
        }
        if written > 0 {
            st.imports_pending = true;
            self.dirty.store(true, Ordering::SeqCst);
        }
        if commit && self.dirty.load(Ordering::SeqCst) {
            self.commit(st)?;
        }
        Ok((written, skipped))
    }
}

/// The indexer job: applies the journal every [`TICK`]; commits at most every
/// [`COMMIT_EVERY`] (searches force one when they need it), and once more on shutdown.
pub fn start(m: Master) -> Job {
    Job::spawn_loop("master.indexer", move |mut stop, handle| async move {
        loop {
            let stopping = tokio::select! {
                _ = tokio::time::sleep(TICK) => false,
                _ = stop.changed() => true,
            };
            let m2 = m.clone();
            let r = tokio::task::spawn_blocking(move || m2.inner.catalog.step(m2.ns().store(), stopping))
                .await
                .unwrap_or_else(|e| Err(Error::internal(format!("indexer: {e}"))));
            handle.record(&r);
            if let Ok(r) = m.ns().read()
                && let Ok(t) = r.open_table(COUNTERS)
                && let Ok(h) = catalog::head(&t)
            {
                handle.set_backlog(h.saturating_sub(m.inner.catalog.searchable.load(Ordering::SeqCst)));
            }
            if stopping {
                break;
            }
        }
    })
}
