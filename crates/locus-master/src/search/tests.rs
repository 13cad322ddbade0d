//! Searches checked against a brute-force evaluation: random catalogs, random clauses
//! (every attribute and operator, nested AND/OR), paged with random page sizes, prefixes
//! and delimiters; the index kept exact across re-imports, and across journaled puts,
//! deletes and renames applied with and without commits between them.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::indexer::Catalog;
use super::query::Expr;
use super::*;
use crate::journal as catalog;
use crate::store::Store;
use locus_search::writer::WRITER_HEAP;

const TYPES: [&str; 5] = ["image/png", "text/csv", "application/gzip", "application/json", ""];
const OWNERS: usize = 40;

fn gen_entries(rng: &mut StdRng, n: usize) -> Vec<(String, pb::CatalogEntry)> {
    let mut out = Vec::new();
    for i in 0..n {
        let bucket = ["b", "c", "b.x"][rng.random_range(0..3)];
        let top = ["logs", "images", "data", "a", "a.b", "a-b"][rng.random_range(0..6)];
        let depth = rng.random_range(0..3);
        let mut key = top.to_string();
        for _ in 0..depth {
            key.push_str(&format!("/{}", ["2026-01-0", "x", "y.z", "Q"][rng.random_range(0..4)]));
            key.push_str(&rng.random_range(0..4).to_string());
        }
        key.push_str(&format!("/f{i:05}.{}", ["gz", "png", "csv"][rng.random_range(0..3)]));
        let mut user = BTreeMap::new();
        for _ in 0..rng.random_range(0..4) {
            let name = ["owner", "team", "n", "Color"][rng.random_range(0..4)];
            let v = match name {
                "owner" => format!("user-{}", rng.random_range(0..OWNERS)),
                "n" => rng.random_range(0..200).to_string(),
                _ => ["red", "blue", "ice-cream", "b"][rng.random_range(0..4)].to_string(),
            };
            user.insert(name.to_ascii_lowercase(), v);
        }
        let mut tags = BTreeMap::new();
        for _ in 0..rng.random_range(0..3) {
            let name = ["project", "env"][rng.random_range(0..2)];
            tags.insert(name.to_string(), format!("{}{}", &name[..1], rng.random_range(0..5)));
        }
        let e = pb::CatalogEntry {
            size: [0, 1, 999, 1000, 1001, 5_000_000][rng.random_range(0..6)] + rng.random_range(0..3),
            mtime_ms: 1_767_225_600_000 + rng.random_range(0..10) * 86_400_000 + rng.random_range(0..1000),
            content_type: TYPES[rng.random_range(0..TYPES.len())].into(),
            etag: format!("{:08x}", rng.random_range(0..50u32)),
            user,
            tags,
            inode: 0,
        };
        out.push((format!("/{bucket}/{key}"), e));
    }
    out
}

fn gen_cond(rng: &mut StdRng) -> String {
    let op = ["=", "!=", "<>", "<", ">", "<=", ">="][rng.random_range(0..7)];
    match rng.random_range(0..15) {
        0 => format!("key {op} \"{}\"", ["logs/x1/f00010.gz", "images", "data/", "a.b", "m"][rng.random_range(0..5)]),
        1 => format!(
            "key LIKE \"{}\"",
            [
                "^logs/2026-01-0[12]",
                "^a",
                "/^A-/i",
                "\\.png$",
                "^data/x.*csv$",
                "f000",
                "^(logs|images)/x[1-3]",
                "^(a|a\\.b)/",
                "^data/(x|y\\.z)[0-2]/",
            ][rng.random_range(0..9)]
        ),
        2 => format!("content-length {op} {}", [0, 999, 1000, 1001, 5_000_000, -3][rng.random_range(0..6)]),
        13 => format!(
            "content-length > {} AND content-length <= {}",
            [0, 999, 5_000_001][rng.random_range(0..3)],
            [1000, 1001, 10][rng.random_range(0..3)]
        ),
        14 => format!(
            "last-modified >= 2026-01-0{} AND last-modified < 2026-01-0{}",
            rng.random_range(1..9),
            rng.random_range(1..9)
        ),
        3 => format!(
            "last-modified {op} {}",
            ["2026-01-03", "2026-01-05T00:00:00Z", "2026-01-01T00:00:00.500Z"][rng.random_range(0..3)]
        ),
        4 => format!("content-type {op} {}", ["image/png", "text/csv", "\"\""][rng.random_range(0..3)]),
        5 => format!("content-type LIKE \"{}\"", ["^image/", "json$", "^application/"][rng.random_range(0..3)]),
        6 => format!("etag {op} {:08x}", rng.random_range(0..50u32)),
        7 => format!("x-amz-meta-owner {op} user-{}", rng.random_range(0..OWNERS)),
        8 => format!("x-amz-meta-n {op} {}", rng.random_range(0..200)),
        9 => format!("X-Amz-Meta-Color {op} {}", ["red", "blue", "ice-cream"][rng.random_range(0..3)]),
        10 => format!("tags.project {op} p{}", rng.random_range(0..5)),
        _ => format!("tags.env LIKE \"{}\"", ["^e[0-2]", "e4", ".*"][rng.random_range(0..3)]),
    }
}

fn gen_clause(rng: &mut StdRng, depth: u32) -> String {
    if depth == 0 || rng.random_range(0..3) == 0 {
        return gen_cond(rng);
    }
    let n = rng.random_range(2..4);
    let kw = if rng.random_bool(0.5) { " AND " } else { " OR " };
    let parts: Vec<String> = (0..n).map(|_| format!("({})", gen_clause(rng, depth - 1))).collect();
    parts.join(kw)
}

struct Obj<'a>(&'a str, &'a pb::CatalogEntry, LocusAttrs);

impl Object for Obj<'_> {
    fn key(&self) -> &str {
        self.0
    }
    fn size(&self) -> u64 {
        self.1.size
    }
    fn mtime_ms(&self) -> i64 {
        self.1.mtime_ms
    }
    fn content_type(&self) -> &str {
        &self.1.content_type
    }
    fn etag(&self) -> &str {
        &self.1.etag
    }
    fn meta(&self, n: &str) -> Option<&str> {
        self.1.user.get(n).map(String::as_str)
    }
    fn tag(&self, n: &str) -> Option<&str> {
        self.1.tags.get(n).map(String::as_str)
    }
    fn locus(&self) -> Option<&LocusAttrs> {
        Some(&self.2)
    }
}

/// The brute-force answer: (objects, common prefixes) in key order.
fn brute(all: &[(String, pb::CatalogEntry)], dir: &str, prefix: &str, delim: &str, expr: &Expr) -> Vec<String> {
    let base = if dir == "/" { "/".to_string() } else { format!("{dir}/") };
    let mut keys: Vec<String> = Vec::new();
    let mut sorted: Vec<&(String, pb::CatalogEntry)> = all.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, e) in sorted {
        let Some(key) = p.strip_prefix(&base) else { continue };
        if !key.starts_with(prefix) {
            continue;
        }
        let locus = LocusAttrs { tier: "NONE".into(), mount: "/".into(), ..Default::default() };
        if !expr.matches(&Obj(key, e, locus)) {
            continue;
        }
        let k = match key[prefix.len()..].find(delim).filter(|_| !delim.is_empty()) {
            Some(i) => key[..prefix.len() + i + delim.len()].to_string(),
            None => key.to_string(),
        };
        if keys.last() != Some(&k) {
            keys.push(k);
        }
    }
    keys
}

/// What a search reads now (the last commit and the changes since).
fn snap(store: &Store, cat: &Catalog) -> Snapshot {
    Snapshot::of(cat, store, false).unwrap()
}

/// Every page of a search; with `listing`, each hit's listing fields checked against
/// `all` (and its maps empty).
fn search_all(
    r: &Snapshot,
    dir: &str,
    prefix: &str,
    delim: &str,
    clause: &str,
    page: u32,
    listing: Option<&[(String, pb::CatalogEntry)]>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let req = pb::SearchRequest {
            path: dir.into(),
            r#where: clause.into(),
            prefix: prefix.into(),
            after: after.clone(),
            limit: page,
            delimiter: delim.into(),
            count_only: false,
            listing: listing.is_some(),
        };
        let p = Search::new(&req, vec!["/".into()]).unwrap().run(r).unwrap();
        if let Some(all) = listing {
            let base = if dir == "/" { "/".to_string() } else { format!("{dir}/") };
            for (k, e, _) in &p.hits {
                let want = &all.iter().find(|(p, _)| *p == format!("{base}{k}")).expect("a known key").1;
                assert_eq!(
                    (e.size, e.mtime_ms, &e.etag, &e.content_type),
                    (want.size, want.mtime_ms, &want.etag, &want.content_type),
                    "{k}"
                );
                assert!(e.user.is_empty() && e.tags.is_empty(), "a listing's hit without maps");
            }
        }
        let mut keys: Vec<String> = p.hits.iter().map(|h| h.0.clone()).chain(p.prefixes.iter().cloned()).collect();
        keys.sort();
        assert!(keys.len() <= page as usize);
        out.extend(keys);
        if !p.truncated {
            return out;
        }
        assert!(p.next_after > after, "{clause}: a page must move on");
        after = p.next_after;
    }
}

fn store_with(entries: &[(String, pb::CatalogEntry)]) -> (tempfile::TempDir, Store, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 8 << 20).unwrap();
    let cat = Catalog::open(&dir.path().join("search"), &store, WRITER_HEAP).unwrap();
    for chunk in entries.chunks(700) {
        cat.import(chunk.to_vec(), false).unwrap();
    }
    cat.import(Vec::new(), true).unwrap();
    (dir, store, cat)
}

/// Random clauses against brute force over `all`; returns how many matched something.
fn check_clauses(rng: &mut StdRng, r: &Snapshot, all: &[(String, pb::CatalogEntry)], n: usize) -> usize {
    let mut nonempty = 0;
    for i in 0..n {
        let clause = gen_clause(rng, 2);
        let expr = Expr::parse(&clause).unwrap_or_else(|e| panic!("{clause}: {e}"));
        let dir = ["/b", "/", "/c", "/b.x"][rng.random_range(0..4)];
        let prefix = if rng.random_bool(0.3) { ["logs/", "a", "images/x"][rng.random_range(0..3)] } else { "" };
        let delim = if rng.random_bool(0.25) { "/" } else { "" };
        let page = [1, 7, 100, 1000][rng.random_range(0..4)];
        let want = brute(all, dir, prefix, delim, &expr);
        let listing = rng.random_bool(0.5).then_some(all);
        let got = search_all(r, dir, prefix, delim, &clause, page, listing);
        assert_eq!(got, want, "#{i}: {clause} in {dir} prefix {prefix:?} delimiter {delim:?} page {page}");
        nonempty += usize::from(!want.is_empty());
        if delim.is_empty() {
            let req = pb::SearchRequest {
                path: dir.into(),
                r#where: clause.clone(),
                prefix: prefix.into(),
                count_only: true,
                ..Default::default()
            };
            let n = Search::new(&req, vec!["/".into()]).unwrap().run(r).unwrap().count;
            assert_eq!(n as usize, want.len(), "count of {clause}");
        }
    }
    nonempty
}

#[test]
fn searches_match_a_brute_force_evaluation() {
    let mut rng = StdRng::seed_from_u64(7);
    let all = gen_entries(&mut rng, 2500);
    let (_d, store, cat) = store_with(&all);
    let nonempty = check_clauses(&mut rng, &snap(&store, &cat), &all, 400);
    // The clauses are not all trivially empty.
    assert!(nonempty > 150, "{nonempty} of 400 searches matched something");
}

/// Every entry the index holds, by path.
fn listing(store: &Store, cat: &Catalog) -> BTreeMap<String, pb::CatalogEntry> {
    listing_in(&snap(store, cat))
}

fn listing_in(r: &Snapshot) -> BTreeMap<String, pb::CatalogEntry> {
    let req = pb::SearchRequest { path: "/".into(), limit: 10_000, ..Default::default() };
    let p = Search::new(&req, vec!["/".into()]).unwrap().run(r).unwrap();
    assert!(!p.truncated);
    p.hits.into_iter().map(|(k, e, _)| (format!("/{k}"), e)).collect()
}

#[test]
fn reimports_keep_the_index_exact() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut all = gen_entries(&mut rng, 600);
    let (_d, store, cat) = store_with(&all);
    // Import the same again (idempotent), then changed entries for a third of the paths.
    cat.import(all.clone(), true).unwrap();
    let changed = gen_entries(&mut rng, 600);
    let mut update = Vec::new();
    for (i, e) in changed.into_iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        all[i].1 = e.1.clone();
        update.push((all[i].0.clone(), e.1));
    }
    cat.import(update, true).unwrap();
    let want: BTreeMap<String, pb::CatalogEntry> = all.iter().cloned().collect();
    assert_eq!(listing(&store, &cat), want);
    // No stale value of a changed entry still matches.
    assert!(check_clauses(&mut rng, &snap(&store, &cat), &all, 150) > 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_changes_keep_the_index_exact() {
    let mut rng = StdRng::seed_from_u64(23);
    let base = gen_entries(&mut rng, 400);
    let (d, store, cat) = store_with(&base);
    cat.renew_after_deletes(5); // the writer is replaced now and then, between changes
    let mut model: BTreeMap<String, pb::CatalogEntry> = base.iter().cloned().collect();
    let fresh = gen_entries(&mut rng, 400);
    let mut overlaid = 0;
    for round in 0..30 {
        // A few changes in one transaction, then the indexer, committing or not.
        let mut changes = Vec::new();
        for _ in 0..rng.random_range(1..8) {
            let keys: Vec<&String> = model.keys().collect();
            let pick = |rng: &mut StdRng| keys[rng.random_range(0..keys.len())].clone();
            let c = match rng.random_range(0..10) {
                0..=4 => {
                    let (p, mut e) = if rng.random_bool(0.5) && !keys.is_empty() {
                        (pick(&mut rng), fresh[rng.random_range(0..fresh.len())].1.clone())
                    } else {
                        fresh[rng.random_range(0..fresh.len())].clone()
                    };
                    e.inode = rng.random_range(1..1000);
                    pb::CatalogChange {
                        kind: pb::CatalogChangeKind::CatalogPut.into(),
                        path: p,
                        entry: Some(e),
                        ..Default::default()
                    }
                }
                5..=6 if !keys.is_empty() => {
                    // A file, or a directory above one.
                    let p = pick(&mut rng);
                    let p = match p.rfind('/') {
                        Some(i) if rng.random_bool(0.5) && i > 0 => p[..i].to_string(),
                        _ => p,
                    };
                    pb::CatalogChange {
                        kind: pb::CatalogChangeKind::CatalogDeleteTree.into(),
                        path: p,
                        ..Default::default()
                    }
                }
                _ if !keys.is_empty() => {
                    let p = pick(&mut rng);
                    let src = match p.rfind('/') {
                        Some(i) if rng.random_bool(0.5) && i > 0 => p[..i].to_string(),
                        _ => p,
                    };
                    let dst = format!("/moved{round}{}", &src[src.find('/').unwrap()..]);
                    pb::CatalogChange {
                        kind: pb::CatalogChangeKind::CatalogRename.into(),
                        path: src,
                        dst,
                        ..Default::default()
                    }
                }
                _ => continue,
            };
            apply_to_model(&mut model, &c);
            changes.push(c);
        }
        store
            .mutate(move |w| {
                for c in &changes {
                    catalog::append(w, c.clone())?;
                }
                Ok(())
            })
            .await
            .unwrap();
        cat.step(&store, rng.random_bool(0.3)).unwrap();
        // Searches see every change at once, committed or not (read over the overlay).
        let r = snap(&store, &cat);
        overlaid += usize::from(!r.ov.is_empty());
        assert_eq!(listing_in(&r), model, "round {round}, uncommitted");
        if round % 3 == 1 {
            let all: Vec<(String, pb::CatalogEntry)> = model.clone().into_iter().collect();
            check_clauses(&mut rng, &r, &all, 20);
        }
        drop(r);
        if round % 10 == 9 {
            cat.step(&store, true).unwrap();
            assert_eq!(listing(&store, &cat), model, "round {round}");
        }
    }
    assert!(overlaid >= 10, "only {overlaid} of 30 rounds searched over uncommitted changes");
    cat.step(&store, true).unwrap();
    assert_eq!(listing(&store, &cat), model);
    // An import leaves alone the paths the namespace holds, and indexes the others.
    let held: Vec<String> = model.iter().filter(|(_, e)| e.inode != 0).map(|(p, _)| p.clone()).collect();
    assert!(held.len() > 20, "{}", held.len());
    let mut imported: Vec<(String, pb::CatalogEntry)> =
        held.iter().map(|p| (p.clone(), pb::CatalogEntry { size: 7, ..Default::default() })).collect();
    imported.push(("/imported/only".into(), pb::CatalogEntry { size: 8, ..Default::default() }));
    model.insert("/imported/only".into(), imported.last().unwrap().1.clone());
    assert_eq!(cat.import(imported.clone(), true).unwrap(), (1, held.len() as u64));
    assert_eq!(listing(&store, &cat), model);
    // Reopened, the index still knows which paths the namespace holds (only those
    // documents carry the `ns` term): the same import skips them again.
    let dir = d.path().join("search");
    drop(cat);
    let cat = Catalog::open(&dir, &store, WRITER_HEAP).unwrap();
    assert_eq!(cat.import(imported, true).unwrap(), (1, held.len() as u64));
    assert_eq!(listing(&store, &cat), model);
    let all: Vec<(String, pb::CatalogEntry)> = model.into_iter().collect();
    check_clauses(&mut rng, &snap(&store, &cat), &all, 100);
    // The journal is trimmed once committed.
    let r = store.read().unwrap();
    assert_eq!(redb::ReadableTableMetadata::len(&r.open_table(catalog::CATALOG_JOURNAL).unwrap()).unwrap(), 0);
}

fn apply_to_model(m: &mut BTreeMap<String, pb::CatalogEntry>, c: &pb::CatalogChange) {
    let under = |p: &str, root: &str| p == root || p.starts_with(&format!("{root}/"));
    match c.kind() {
        pb::CatalogChangeKind::CatalogPut => {
            m.insert(c.path.clone(), c.entry.clone().unwrap());
        }
        pb::CatalogChangeKind::CatalogDeleteTree => m.retain(|p, _| !under(p, &c.path)),
        pb::CatalogChangeKind::CatalogRename => {
            let moved: Vec<(String, pb::CatalogEntry)> =
                m.iter().filter(|(p, _)| under(p, &c.path)).map(|(p, e)| (p.clone(), e.clone())).collect();
            m.retain(|p, _| !under(p, &c.path));
            for (p, e) in moved {
                m.insert(format!("{}{}", c.dst, &p[c.path.len()..]), e);
            }
        }
        pb::CatalogChangeKind::Unspecified => {}
    }
}

#[test]
fn an_index_of_an_older_format_is_rebuilt_from_the_namespace() {
    let mut rng = StdRng::seed_from_u64(5);
    let all = gen_entries(&mut rng, 50);
    let (d, store, cat) = store_with(&all);
    assert_eq!(listing(&store, &cat).len(), all.len());
    drop(cat);
    // Same format: reopened as it is.
    let cat = Catalog::open(&d.path().join("search"), &store, WRITER_HEAP).unwrap();
    assert_eq!(listing(&store, &cat).len(), all.len());
    drop(cat);
    // No format marker (an older build's index): rebuilt from the namespace, which holds
    // none of the imported entries.
    std::fs::remove_file(d.path().join("search/FORMAT")).unwrap();
    let cat = Catalog::open(&d.path().join("search"), &store, WRITER_HEAP).unwrap();
    assert!(listing(&store, &cat).is_empty());
    assert!(d.path().join("search/FORMAT").exists());
}
