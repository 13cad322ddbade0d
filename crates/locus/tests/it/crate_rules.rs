//! The crate rules hold: no crate depends, directly or through others, on a crate its row
//! of ARCHITECTURE.md's crate table says it must not depend on. The table is the one
//! place the rules live; this test reads it and `cargo metadata`, so a new forbidden edge
//! fails CI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

/// Edges that break a rule today, each with the issue that removes it. Nothing else may.
const KNOWN: &[(&str, &str, &str)] = &[];

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    resolve: Resolve,
    workspace_members: Vec<String>,
}

#[derive(Deserialize)]
struct Package {
    id: String,
    name: String,
}

#[derive(Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
}

#[derive(Deserialize)]
struct NodeDep {
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Deserialize)]
struct DepKind {
    kind: Option<String>,
}

/// Each package's name → the names of every package it depends on, transitively
/// (normal dependencies only: not tests, not build scripts).
fn closure(md: &Metadata) -> BTreeMap<String, BTreeSet<String>> {
    let name: BTreeMap<&str, &str> = md.packages.iter().map(|p| (p.id.as_str(), p.name.as_str())).collect();
    let direct: BTreeMap<&str, Vec<&str>> = md
        .resolve
        .nodes
        .iter()
        .map(|n| {
            let deps = n.deps.iter().filter(|d| d.dep_kinds.iter().any(|k| k.kind.is_none()));
            (n.id.as_str(), deps.map(|d| d.pkg.as_str()).collect())
        })
        .collect();
    let mut out = BTreeMap::new();
    for member in &md.workspace_members {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![member.as_str()]);
        while let Some(id) = todo.pop() {
            for &d in direct.get(id).into_iter().flatten() {
                if seen.insert(name[d].to_string()) {
                    todo.push(d);
                }
            }
        }
        out.insert(name[member.as_str()].to_string(), seen);
    }
    out
}

/// A crate's "must not depend on" cell as package names: `locus-X` for each word X naming
/// a workspace crate, every Locus crate for "any Locus crate", and the engines the table
/// names (DataFusion, tantivy, redb). What its "depends on" cell allows is taken out.
fn forbidden(cell: &str, allowed: &str, own: &str, crates: &BTreeSet<String>) -> BTreeSet<String> {
    let words = |s: &str| -> BTreeSet<String> {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).map(|w| w.to_ascii_lowercase()).collect()
    };
    let (said, ok) = (words(cell), words(allowed));
    let named = |c: &str| c.strip_prefix("locus-").unwrap_or(c).to_string();
    let mut out: BTreeSet<String> =
        crates.iter().filter(|c| said.contains(&named(c)) || said.contains(c.as_str())).cloned().collect();
    if cell.contains("any Locus crate") || cell.contains("any other Locus crate") {
        out.extend(crates.iter().cloned());
    }
    if cell.contains("SQL engine") || said.contains("datafusion") {
        out.insert("datafusion".into());
    }
    for engine in ["tantivy", "redb"] {
        if said.contains(engine) {
            out.insert(engine.into());
        }
    }
    out.retain(|c| c != own && !ok.contains(&named(c)) && !(ok.contains("all")));
    out
}

#[test]
fn no_crate_depends_on_what_its_row_forbids() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    // Offline: the metadata names every platform's dependencies, which a build does not
    // download; `cargo fetch` (scripts/test runs it first) does.
    assert!(
        out.status.success(),
        "cargo metadata --offline failed (run `cargo fetch` first): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md: Metadata = serde_json::from_slice(&out.stdout).unwrap();
    let deps = closure(&md);
    let crates: BTreeSet<String> = deps.keys().cloned().collect();
    let table = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut rows = 0;
    let mut broken = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `locus")) {
        // A `\|` inside a cell is text, not a column.
        let line = line.replace("\\|", "/");
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let krate = cells[1].trim_matches('`');
        if krate.contains(' ') || cells.len() < 6 {
            continue; // the processes table: `locus master`, ...
        }
        let (allowed, cell) = (cells[3], cells[4]);
        let Some(has) = deps.get(krate) else { panic!("ARCHITECTURE.md names {krate}, not a workspace crate") };
        rows += 1;
        for f in forbidden(cell, allowed, krate, &crates) {
            if has.contains(&f) && !KNOWN.iter().any(|(a, b, _)| *a == krate && *b == f) {
                broken.push(format!("{krate} depends on {f}, which its row forbids ({cell})"));
            }
        }
    }
    assert_eq!(rows, crates.len(), "every workspace crate has a row in ARCHITECTURE.md's crate table");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    // The known exceptions are still true (else this list must shrink).
    for (a, b, why) in KNOWN {
        assert!(deps[*a].contains(*b), "{a} no longer depends on {b} ({why}): take it out of KNOWN");
    }
}

#[test]
fn the_rules_are_read_as_written() {
    let crates: BTreeSet<String> =
        ["locus-common", "locus-proto", "locus-client", "locus-worker", "locus-master", "locus-sql", "locus"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let f = forbidden("master, worker, the SQL engine", "common, proto", "locus-client", &crates);
    assert_eq!(f, ["datafusion", "locus-master", "locus-sql", "locus-worker"].map(String::from).into());
    let f = forbidden("any other Locus crate", "common", "locus-proto", &crates);
    assert!(!f.contains("locus-common") && f.contains("locus-worker") && !f.contains("locus-proto"));
}
