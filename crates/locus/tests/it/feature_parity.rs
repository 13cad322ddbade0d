//! The Python client's wheel reuses the workspace build's compiled dependencies: maturin
//! builds `locus-py` alone, and cargo resolves each dependency's features from the
//! packages a command builds, so every shared crate must have, in `cargo tree -p
//! locus-py`, a feature set it also has in the workspace's tree (CI's build). A feature
//! the workspace adds and `locus-py`'s parity list lacks recompiles that crate and all
//! above it for the wheel; the fix is a line in `crates/locus-py/Cargo.toml`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// `cargo tree ARGS` as "name version" → its feature sets, each marked by where it is
/// compiled: for the host (build scripts, proc macros and what they use) or the target.
fn tree(args: &[&str]) -> BTreeMap<String, BTreeSet<(bool, String)>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-f", "{p}|{f}", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .args(args)
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut sets: BTreeMap<String, BTreeSet<(bool, String)>> = BTreeMap::new();
    // The host flag of the line at each depth, and the section header ("[build-dependencies]")
    // that governs the lines at each depth.
    let (mut host_at, mut build_at) = (Vec::<bool>::new(), BTreeMap::<usize, bool>::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // Each level of the tree is indented by four characters ("├── ", "│   ").
        let rest = line.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '[');
        let depth = (line.chars().count() - rest.chars().count()) / 4;
        if let Some(header) = rest.strip_prefix('[') {
            // A header's lines are one level deeper than it is indented.
            build_at.retain(|d, _| *d <= depth);
            build_at.insert(depth + 1, header.starts_with("build-"));
            continue;
        }
        let Some((pkg, features)) = rest.trim_end_matches(" (*)").split_once('|') else { continue };
        build_at.retain(|d, _| *d <= depth);
        let parent = depth.checked_sub(1).and_then(|d| host_at.get(d).copied()).unwrap_or(false);
        let host = parent || build_at.get(&depth).copied().unwrap_or(false) || pkg.ends_with("(proc-macro)");
        host_at.truncate(depth);
        host_at.push(host);
        // "name vX.Y.Z (path)" or "name vX.Y.Z (proc-macro)": the name and version.
        let id: Vec<&str> = pkg.split_whitespace().take(2).collect();
        sets.entry(id.join(" ")).or_default().insert((host, features.to_string()));
    }
    sets
}

#[test]
fn the_wheel_builds_on_the_workspace_s_compiled_dependencies() {
    let ws = tree(&["--workspace", "--exclude", "locus-py"]);
    let py = tree(&["-p", "locus-py"]);
    let drift: Vec<String> = py
        .iter()
        .filter_map(|(pkg, sets)| {
            let theirs = ws.get(pkg)?; // only the wheel uses it (pyo3): built once anyway
            let missing: Vec<_> = sets.difference(theirs).collect();
            (!missing.is_empty()).then(|| format!("{pkg}: the wheel's {missing:?}, the workspace's {theirs:?}"))
        })
        .collect();
    assert!(py.len() > 100 && ws.len() > py.len(), "cargo tree printed too little: {} and {}", py.len(), ws.len());
    assert!(drift.is_empty(), "add to crates/locus-py/Cargo.toml's parity list:\n{}", drift.join("\n"));
}
