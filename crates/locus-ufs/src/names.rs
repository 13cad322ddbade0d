//! Which names a UFS can hold faithfully. A name it cannot hold must be refused when it is
//! created in the namespace, not found out by a persist that then fails forever, or
//! worse, writes the bytes under another name.
//!
//! What was found (OpenDAL 0.59, `opendal-core/src/raw/path.rs` `normalize_path`, applied
//! to every path an `Operator` is given, whatever the service): the whole path is
//! `trim()`med, so leading and trailing Unicode whitespace goes (`"x "` is written as
//! `x`, `"dir/ "` becomes the directory `dir/`, `" "` the root); whitespace inside a path
//! is kept (`"a /b"` and `"a/ b"` are stored as they are). A component can be the end of
//! a path (the directory's own stat, rename or delete), so no component may end in
//! whitespace, and the first may not start with it. Nothing else is changed: trailing
//! dots are kept by the `fs` service on Linux (`"x."` is stored as `x.`; Win32's trimming
//! of dots and spaces does not apply), and `fs` only refuses `..` and absolute paths,
//! which Locus refuses already (`locus_common::path`).
//!
//! Lengths: a local file system refuses a component past its `NAME_MAX` (255 bytes on
//! ext4, xfs and tmpfs; read from `statvfs` of the root) and a path past `PATH_MAX`
//! (4096 bytes with its NUL) with `ENAMETOOLONG`. A `file://` mount writes a file first to
//! `.locus-tmp/<name>.<8 random chars>` (OpenDAL's `build_tmp_path_of`), so a file's own
//! name may use 9 bytes fewer. S3 keys are at most 1024 bytes of UTF-8, the mount's
//! prefix included (a directory marker adds its `/`).

use locus_common::{Error, ErrorKind, Result};

/// Bytes the atomic write's temporary name adds to a file's name (`.` and 8 characters).
const TMP_SUFFIX: usize = 9;
/// Linux `PATH_MAX`, with its terminating NUL.
const PATH_MAX: usize = 4096;
/// S3's limit on a key, in bytes of UTF-8.
pub const S3_KEY_MAX: usize = 1024;

/// The naming limits of one mounted UFS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameRules {
    /// A local directory.
    File {
        /// Longest component in bytes (`statvfs` `f_namemax`).
        name_max: usize,
        /// Bytes of the root directory's path (paths below it are joined with a `/`).
        root_len: usize,
        /// Files are written under a temporary name `TMP_SUFFIX` bytes longer first.
        atomic: bool,
    },
    /// An S3 bucket, below a key prefix of `prefix_len` bytes (its `/` included).
    S3 { prefix_len: usize },
}

impl NameRules {
    /// The rules of a `file://` mount of `dir`.
    pub fn file(dir: &str, atomic: bool) -> NameRules {
        NameRules::File { name_max: name_max(dir).unwrap_or(255), root_len: dir.trim_end_matches('/').len(), atomic }
    }

    /// The rules of an `s3://bucket/prefix` mount.
    pub fn s3(prefix: &str) -> NameRules {
        let p = prefix.trim_matches('/');
        NameRules::S3 { prefix_len: if p.is_empty() { 0 } else { p.len() + 1 } }
    }

    /// Check `rel` (relative to the mount's root, `/`-separated, components already
    /// checked by `locus_common::path`) as the name of a directory or of a file.
    pub fn check(&self, rel: &str, is_dir: bool) -> Result<()> {
        if rel.is_empty() {
            return Ok(());
        }
        if rel.starts_with(char::is_whitespace) {
            return Err(Error::invalid(format!(
                "{rel:?} starts with whitespace, which the under file system would drop (use another name)"
            )));
        }
        if let Some(c) = rel.split('/').find(|c| c.ends_with(char::is_whitespace)) {
            return Err(Error::invalid(format!(
                "{c:?} ends with whitespace, which the under file system would drop (use another name)"
            )));
        }
        match *self {
            NameRules::File { name_max, root_len, atomic } => {
                let comps: Vec<&str> = rel.split('/').collect();
                for (i, c) in comps.iter().enumerate() {
                    let limit =
                        if atomic && !is_dir && i + 1 == comps.len() { name_max - TMP_SUFFIX } else { name_max };
                    if c.len() > limit {
                        return Err(too_long(format!(
                            "name of {} bytes is longer than the under file system allows ({limit} bytes{}): {}",
                            c.len(),
                            if limit < name_max { " for a file's name" } else { "" },
                            abbreviate(c)
                        )));
                    }
                }
                let total = root_len + 1 + rel.len();
                if total >= PATH_MAX {
                    return Err(too_long(format!(
                        "path of {total} bytes in the under file system is longer than it allows ({} bytes): {}",
                        PATH_MAX - 1,
                        abbreviate(rel)
                    )));
                }
            }
            NameRules::S3 { prefix_len } => {
                let key = prefix_len + rel.len() + usize::from(is_dir);
                if key > S3_KEY_MAX {
                    return Err(too_long(format!(
                        "S3 key of {key} bytes is longer than S3 allows ({S3_KEY_MAX} bytes, the mount's prefix included): {}",
                        abbreviate(rel)
                    )));
                }
            }
        }
        Ok(())
    }
}

fn too_long(msg: String) -> Error {
    Error::new(ErrorKind::NameTooLong, msg)
}

/// A long name cut for an error message.
fn abbreviate(s: &str) -> String {
    if s.len() <= 64 {
        return format!("{s:?}");
    }
    let mut end = 40;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}...", &s[..end])
}

/// The longest file name the file system of `dir` takes.
fn name_max(dir: &str) -> Option<usize> {
    let c = std::ffi::CString::new(dir).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory of the
    // size `statvfs` fills; it is read only when the call succeeded.
    let r = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let n = unsafe { st.assume_init() }.f_namemax as usize;
    (n > TMP_SUFFIX).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ufs;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn kind(r: Result<()>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind())
    }

    #[test]
    fn file_rules() {
        let r = NameRules::File { name_max: 255, root_len: 10, atomic: true };
        assert_eq!(kind(r.check("a/b.txt", false)), None);
        assert_eq!(kind(r.check(&"x".repeat(246), false)), None);
        assert_eq!(kind(r.check(&"x".repeat(247), false)), Some(ErrorKind::NameTooLong));
        assert_eq!(kind(r.check(&"x".repeat(255), true)), None);
        assert_eq!(kind(r.check(&format!("{}/f", "x".repeat(256)), false)), Some(ErrorKind::NameTooLong));
        assert_eq!(kind(r.check(&format!("d/{}", "x".repeat(300)), false)), Some(ErrorKind::NameTooLong));
        let deep = vec!["y".repeat(200); 21].join("/");
        assert_eq!(kind(r.check(&deep, false)), Some(ErrorKind::NameTooLong));
        for bad in ["x ", " ", "dir/ ", "a /b", " x", "a\t", "a\u{3000}"] {
            assert_eq!(kind(r.check(bad, false)), Some(ErrorKind::InvalidArgument), "{bad:?}");
        }
        for good in ["a/ b", "x.", "a b", "x..y", "dir./f."] {
            assert_eq!(kind(r.check(good, false)), None, "{good:?}");
        }
    }

    #[test]
    fn s3_rules() {
        let r = NameRules::s3("/pre/fix/");
        assert_eq!(r, NameRules::S3 { prefix_len: 8 });
        assert_eq!(kind(r.check(&"k".repeat(1016), false)), None);
        assert_eq!(kind(r.check(&"k".repeat(1017), false)), Some(ErrorKind::NameTooLong));
        assert_eq!(kind(r.check(&"k".repeat(1016), true)), Some(ErrorKind::NameTooLong));
        assert_eq!(kind(NameRules::s3("").check(&"k".repeat(1024), false)), None);
        assert_eq!(kind(r.check("key ", false)), Some(ErrorKind::InvalidArgument));
    }

    /// What the rules rest on, observed through the `fs` service itself.
    #[tokio::test]
    async fn what_opendal_fs_does_to_names() {
        let dir = tempfile::tempdir().unwrap();
        let ufs =
            Ufs::new(&format!("file://{}", dir.path().display()), &BTreeMap::new(), Duration::from_secs(5)).unwrap();
        // A trailing space is trimmed: "x " is written as "x".
        ufs.put("x ", bytes::Bytes::from_static(b"1")).await.unwrap();
        assert!(dir.path().join("x").exists() && !dir.path().join("x ").exists());
        // Whitespace inside the path and trailing dots are kept.
        ufs.put("a /b.", bytes::Bytes::from_static(b"2")).await.unwrap();
        assert!(dir.path().join("a /b.").exists());
        // A 300-byte component fails with ENAMETOOLONG, mapped to NameTooLong.
        let e = ufs.put(&"n".repeat(300), bytes::Bytes::from_static(b"3")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NameTooLong, "{e}");
        // 250 bytes would fit the directory, but not the temporary name of the write.
        let e = ufs.put(&"m".repeat(250), bytes::Bytes::from_static(b"4")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NameTooLong, "{e}");
        assert_eq!(kind(ufs.check_name(&"m".repeat(250), false)), Some(ErrorKind::NameTooLong));
        ufs.put(&"m".repeat(246), bytes::Bytes::from_static(b"5")).await.unwrap();
        // So such a name is not there for Locus, even where a file has it ("x " is not
        // looked up as "x", nor listed to be read as another file).
        std::fs::write(dir.path().join("y "), b"6").unwrap();
        assert!(ufs.stat("x ").await.unwrap().is_none());
        assert!(ufs.stat("y ").await.unwrap().is_none());
        assert!(ufs.stat("x").await.unwrap().is_some());
        let names: Vec<String> = futures::TryStreamExt::try_collect::<Vec<_>>(ufs.list("").await.unwrap())
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.path)
            .collect();
        assert!(names.contains(&"x".to_string()) && !names.contains(&"y ".to_string()), "{names:?}");
    }
}
