//! Rules for Locus paths: absolute, `/`-separated, no empty, `.` or `..` components.
//!
//! Rejecting `.` and `..` outright (rather than resolving them) is what guarantees that
//! no request can reach outside a mount's root in the under file system.

use crate::{Error, Result};

/// A directory at the root of a writable `file://` mount where writes land before they
/// are renamed into place (so a failed write never leaves a torn file). It is not part
/// of the namespace: paths through it are refused and listings skip it.
pub const UFS_TEMP_DIR: &str = ".locus-tmp";

/// Normalise and validate a Locus path. Returns it without a trailing slash (`/` for root).
pub fn normalize(path: &str) -> Result<String> {
    if !path.starts_with('/') {
        return Err(Error::invalid(format!("path must be absolute: {path:?}")));
    }
    if path.len() > 4096 {
        return Err(Error::invalid("path longer than 4096 bytes"));
    }
    let mut out = String::with_capacity(path.len());
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err(Error::invalid(format!("path must not contain '.' or '..': {path:?}")));
        }
        if comp == UFS_TEMP_DIR {
            return Err(Error::invalid(format!("path must not contain {UFS_TEMP_DIR:?}: {path:?}")));
        }
        if comp.contains('\0') {
            return Err(Error::invalid("path contains a NUL byte"));
        }
        out.push('/');
        out.push_str(comp);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Check a path relative to a mount's root, as the master sends it to workers: not
/// empty, no leading or doubled `/`, and none of what [`normalize`] refuses (`.`, `..`,
/// the UFS's temporary directory, NUL). A worker checks every one it is sent, so no
/// request reaches outside a mount's root whatever the UFS would make of it.
pub fn check_ufs_rel(rel: &str) -> Result<()> {
    let abs = format!("/{rel}");
    match normalize(&abs) {
        Ok(n) if !rel.is_empty() && n == abs => Ok(()),
        Ok(_) => Err(Error::invalid(format!("not a path below a mount's root: {rel:?}"))),
        Err(e) => Err(e),
    }
}

/// Components of a normalised path (none for root).
pub fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

/// Parent of a normalised path and the last component; `None` for root.
pub fn split_parent(path: &str) -> Option<(&str, &str)> {
    if path == "/" {
        return None;
    }
    let i = path.rfind('/')?;
    Some((if i == 0 { "/" } else { &path[..i] }, &path[i + 1..]))
}

/// [`split_parent`] for an operation on `path` itself (the root is not one's target):
/// InvalidArgument for the root or a path that is not normalised.
pub fn parent_and_name(path: &str) -> crate::Result<(&str, &str)> {
    split_parent(path).ok_or_else(|| crate::Error::invalid(format!("{path:?} names no file or directory below /")))
}

/// Join a normalised directory path and a child name.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

/// If `path` is `prefix` or below it, the remainder relative to it (no leading `/`).
pub fn strip_prefix<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix == "/" {
        return Some(path.trim_start_matches('/'));
    }
    let rest = path.strip_prefix(prefix)?;
    if rest.is_empty() { Some("") } else { rest.strip_prefix('/') }
}

/// Whether a file at `path` is in a staging area of Hadoop's and Spark's file output
/// committers: a directory named `_temporary` on its way (the file itself may be named
/// anything). Such files are committed by renames, or deleted.
pub fn is_staged(path: &str) -> bool {
    path.split('/').rev().skip(1).any(|c| c == "_temporary")
}

/// Whether `path` is a committers' staging directory (`_temporary`) or lies in one: the
/// scratch space of a job's output, which the job alone fills and which no reader of the
/// dataset looks into.
pub fn in_staging(path: &str) -> bool {
    path.split('/').any(|c| c == "_temporary")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ufs_paths_stay_below_the_mount_root() {
        for ok in ["a", "a/b.txt", "dir/sub/x y"] {
            check_ufs_rel(ok).unwrap();
        }
        for bad in ["", "/a", "a//b", "a/", "../x", "a/../../etc/passwd", "./a", "a/.", ".locus-tmp/x", "a\0b"] {
            assert!(check_ufs_rel(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn normalizes() {
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("//a///b/").unwrap(), "/a/b");
        assert!(normalize("a/b").is_err());
        assert!(normalize("/a/../b").is_err());
        assert!(normalize("/a/./b").is_err());
        assert!(normalize("/a/..").is_err());
    }

    #[test]
    fn splits_and_strips() {
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
        assert_eq!(split_parent("/"), None);
        assert_eq!(strip_prefix("/data/x/y", "/data"), Some("x/y"));
        assert_eq!(strip_prefix("/data", "/data"), Some(""));
        assert_eq!(strip_prefix("/database", "/data"), None);
        assert_eq!(strip_prefix("/x", "/"), Some("x"));
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }

    #[test]
    fn committer_staging_paths_are_recognised() {
        assert!(is_staged("/out/_temporary/0/_temporary/attempt_202611240000_0001_m_000000_0/part-0.parquet"));
        assert!(is_staged("out/_temporary/0/task_202611240000_0001_m_000000/part-0.parquet"));
        assert!(is_staged("_temporary/x"));
        assert!(!is_staged("/out/part-0.parquet"));
        assert!(!is_staged("/out/_temporary"), "a file named _temporary is not in one");
        assert!(!is_staged("out/my_temporary/part-0"));
        assert!(in_staging("/out/_temporary"));
        assert!(in_staging("/out/_temporary/0/task_1"));
        assert!(!in_staging("/out/part-0"));
        assert!(!in_staging("/out/my_temporary"));
    }
}
