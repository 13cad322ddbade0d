//! The search index's directory: tantivy's `MmapDirectory`, except that the document
//! store (the `.store` file of each segment, the stored `CatalogEntry`s) is read with
//! `pread` into owned buffers instead of through a mapping.
//!
//! A page of hits reads one store block (4 KiB compressed) per hit, scattered over the
//! whole store. Through a mapping, each such read maps the page cache's folio around it
//! (up to 2 MiB on this kernel: one byte read per MiB of a mapped file put the whole file
//! in the RSS), and what is mapped stays in the process's RSS while the segment lives:
//! the RSS grew with the catalog and with the spread of the pages read. Read with
//! `pread`, a block costs one system call and a buffer of its size (tantivy keeps the
//! last blocks it read in its own small cache); the page cache still holds the file, but
//! the process does not. Term dictionaries, postings and fast fields stay mapped: a
//! listing streams the key dictionary from a start key with no end (read whole, that
//! would be the rest of the dictionary), and the fast columns are read in place.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tantivy::HasLen;
use tantivy::directory::error::{DeleteError, LockError, OpenDirectoryError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    Directory, DirectoryLock, FileHandle, Lock, MmapDirectory, OwnedBytes, WatchCallback, WatchHandle, WritePtr,
};

/// `MmapDirectory` with the document stores read by `pread` (see the module's doc).
#[derive(Clone, Debug)]
pub struct IndexDir {
    mmap: MmapDirectory,
    root: PathBuf,
}

impl IndexDir {
    pub fn open(dir: &Path) -> Result<IndexDir, OpenDirectoryError> {
        let mmap = MmapDirectory::open(dir)?;
        let root = dir.canonicalize().map_err(|e| OpenDirectoryError::wrap_io_error(e, dir.to_path_buf()))?;
        Ok(IndexDir { mmap, root })
    }
}

/// Whether tantivy's file `path` is a segment's document store.
fn is_store(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "store")
}

/// A file read with `pread`: each read is a buffer of its own.
#[derive(Debug)]
struct PreadFile {
    file: File,
    len: usize,
}

impl HasLen for PreadFile {
    fn len(&self) -> usize {
        self.len
    }
}

impl FileHandle for PreadFile {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        if range.start >= range.end {
            return Ok(OwnedBytes::empty());
        }
        if range.end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("a read of {range:?} past the end of a {}-byte file", self.len),
            ));
        }
        let mut buf = vec![0u8; range.len()];
        self.file.read_exact_at(&mut buf, range.start as u64)?;
        Ok(OwnedBytes::new(buf))
    }
}

impl Directory for IndexDir {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        if !is_store(path) {
            return self.mmap.get_file_handle(path);
        }
        let err = |e: io::Error| match e.kind() {
            io::ErrorKind::NotFound => OpenReadError::FileDoesNotExist(path.to_path_buf()),
            _ => OpenReadError::wrap_io_error(e, path.to_path_buf()),
        };
        let file = File::open(self.root.join(path)).map_err(err)?;
        let len = file.metadata().map_err(err)?.len() as usize;
        Ok(Arc::new(PreadFile { file, len }))
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        let r = self.mmap.delete(path);
        // `MmapDirectory` remembers every file it ever mapped (a weak reference by path)
        // and forgets the dead ones only when asked for its cache's state: without this a
        // master that commits every second kept the names of all the segment files it had
        // ever read.
        let _ = self.mmap.get_cache_info();
        r
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.mmap.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        self.mmap.open_write(path)
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.mmap.atomic_read(path)
    }

    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        self.mmap.atomic_write(path, data)
    }

    fn sync_directory(&self) -> io::Result<()> {
        self.mmap.sync_directory()
    }

    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        self.mmap.acquire_lock(lock)
    }

    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.mmap.watch(watch_callback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tantivy::directory::TerminatingWrite;

    #[test]
    fn stores_are_read_by_pread_and_other_files_mapped() {
        let tmp = tempfile::tempdir().unwrap();
        let d = IndexDir::open(tmp.path()).unwrap();
        for name in ["a.store", "a.idx"] {
            let mut w = d.open_write(Path::new(name)).unwrap();
            w.write_all(b"0123456789").unwrap();
            w.terminate().unwrap();
        }
        for name in ["a.store", "a.idx"] {
            let f = d.open_read(Path::new(name)).unwrap();
            assert_eq!(f.len(), 10);
            assert_eq!(f.slice(2..5).read_bytes().unwrap().as_slice(), b"234", "{name}");
            assert!(f.slice(4..4).read_bytes().unwrap().is_empty());
        }
        assert!(matches!(d.open_read(Path::new("b.store")), Err(OpenReadError::FileDoesNotExist(_))));
        let h = d.get_file_handle(Path::new("a.store")).unwrap();
        assert!(h.read_bytes(8..12).is_err(), "a read past the end fails");
    }
}
