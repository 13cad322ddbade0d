//! The POSIX front end: the Locus namespace as a FUSE file system (`locus fuse
//! MOUNTPOINT`), a front end over [`locus_client::Client`] like the S3 gateway.
//!
//! One file of about 800 lines because it is one `fuser::Filesystem` impl: every
//! callback maps one POSIX call onto the client, and all of them share `LocusFs`'s inode,
//! handle and listing tables; split, each part would reach into the others' state.
//!
//! - Reads go through the client's [`FileReader`]: short-circuit from a worker on this
//!   host, over the data path otherwise, filling the cache from the UFS on a miss. The
//!   kernel's page cache keeps what was read (`FOPEN_KEEP_CACHE`) until the file's
//!   version changes; requests of up to 1 MiB, many in flight.
//! - Files are written once, start to end, through the write pipeline with the mount's
//!   write type: `create` (or an open with `O_TRUNC`) starts the write, `flush` (the
//!   `close` of the file) or `fsync` completes it and answers with its outcome. A write
//!   that is not at the end of what was written, or into a file that exists, is
//!   refused (`EPERM`), never hung.
//! - Directory listings are read a page at a time; user metadata shows as read-only
//!   `user.*` extended attributes.
//! - Errors are the errno of the Locus error's kind ([`ErrorKind::errno`]; `EROFS` for
//!   writes a read-only mount refuses), mapped in one place ([`errno`]).
//!
//! Modules: [`inodes`] (inode numbers and paths), [`writes`] (the write path), which own
//! state of their own and so stand apart.
//!
//! Inode numbers are the master's inode ids (plus 2; the root is 1), so they stay put
//! across renames and listings need no table; the table here maps the inodes the
//! kernel holds to their paths.
//!
//! Depends on `locus-client` (and its `locus-common` and `locus-proto` types) only.

mod inodes;
mod writes;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use locus_client::{Client, FileReader, FileWriter};
use locus_common::config::WriteType;
use locus_common::path as lpath;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use parking_lot::Mutex;

use inodes::{Inodes, ROOT};
use writes::Writing;

/// Options of a mount (`locus fuse --help`).
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel trusts a file's attributes and a name's entry.
    pub attr_timeout: Duration,
    /// Write type of files written through the mount (None: the mount's or the cluster's).
    pub write_type: Option<WriteType>,
    /// Refuse every change (`EROFS`).
    pub read_only: bool,
    /// Threads answering the kernel (requests in flight at once).
    pub threads: usize,
    /// Let other users than the one who mounted use the mount (`allow_other`).
    pub allow_other: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            attr_timeout: Duration::from_secs(1),
            write_type: None,
            read_only: false,
            threads: 4,
            allow_other: false,
        }
    }
}

/// Bytes the kernel reads ahead and sends per write request.
const MAX_IO: u32 = 1 << 20;
/// Entries of a directory read from the master at a time.
const DIR_PAGE: u32 = 1000;
/// Out-of-order write requests (the kernel may send a file's writes on several
/// threads) held at most per file, in bytes.
const MAX_PENDING: usize = 64 << 20;

/// The one place a Locus error becomes an errno: its kind's, and `EROFS` for a change
/// refused because the mount is read-only.
fn errno(e: &Error, change: bool) -> Errno {
    if change && e.kind() == ErrorKind::PermissionDenied {
        return Errno::EROFS;
    }
    tracing::debug!(error = %e, "FUSE request failed");
    Errno::from_i32(e.kind().errno())
}

/// A file handle's state.
enum Handle {
    Read(Arc<FileReader>),
    Write(Arc<Mutex<Writing>>),
    Dir(Arc<Mutex<Listing>>),
}

/// A directory being listed: the entries read so far and where the next page starts.
struct Listing {
    path: String,
    entries: Vec<(FileAttr, String)>,
    after: Option<String>,
}

/// The file system the kernel calls.
pub struct LocusFs {
    client: Arc<Client>,
    rt: tokio::runtime::Handle,
    opts: FuseOptions,
    inodes: Inodes,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// The fingerprint each file had when last opened for reading: opened unchanged, the
    /// kernel keeps its cached pages.
    opened: Mutex<HashMap<u64, (String, u64)>>,
    /// Files being written, by inode: their size so far (for `getattr`).
    writing: Mutex<HashMap<u64, Arc<Mutex<Writing>>>>,
    uid: u32,
    gid: u32,
}

impl LocusFs {
    /// A file system over `client`, whose futures run on `rt`.
    pub fn new(client: Arc<Client>, rt: tokio::runtime::Handle, opts: FuseOptions) -> LocusFs {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        LocusFs {
            client,
            rt,
            opts,
            inodes: Inodes::default(),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            opened: Mutex::new(HashMap::new()),
            writing: Mutex::new(HashMap::new()),
            uid,
            gid,
        }
    }

    fn run<T>(&self, f: impl Future<Output = Result<T>>) -> Result<T> {
        self.rt.block_on(f)
    }

    fn path(&self, ino: INodeNo) -> std::result::Result<String, Errno> {
        self.inodes.path(ino.0).ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> std::result::Result<String, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(lpath::join(&self.path(parent)?, name))
    }

    fn attr(&self, fi: &pb::FileInfo) -> FileAttr {
        let ino = inodes::ino_of(fi);
        let mtime = UNIX_EPOCH + Duration::from_millis(fi.mtime_ms.max(0) as u64);
        let (kind, perm, nlink) =
            if fi.is_dir { (FileType::Directory, 0o755, 2) } else { (FileType::RegularFile, 0o644, 1) };
        let perm = if self.opts.read_only { perm & 0o555 } else { perm };
        FileAttr {
            ino: INodeNo(ino),
            size: fi.length,
            blocks: fi.length.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: MAX_IO,
            flags: 0,
        }
    }

    /// The attributes of a file being written: its size so far, now as its time.
    fn writing_attr(&self, w: &Writing) -> FileAttr {
        let fi = pb::FileInfo {
            path: w.path.clone(),
            length: w.file.as_ref().map_or(0, FileWriter::written),
            mtime_ms: locus_common::now_ms(),
            ..Default::default()
        };
        FileAttr { ino: INodeNo(w.ino), ..self.attr(&fi) }
    }

    /// `path`'s status (without its blocks).
    fn stat(&self, path: &str) -> Result<pb::FileInfo> {
        self.run(self.client.status(path, false))
    }

    fn entry(&self, fi: &pb::FileInfo) -> FileAttr {
        self.inodes.remember(inodes::ino_of(fi), &fi.path);
        self.attr(fi)
    }

    fn new_fh(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, h);
        FileHandle(fh)
    }

    fn refuse_change(&self) -> std::result::Result<(), Errno> {
        if self.opts.read_only { Err(Errno::EROFS) } else { Ok(()) }
    }

    /// The entries of directory handle `fh` after `offset`, handed to `add` (their offset,
    /// attributes and name) until it says its reply is full. Offsets: 1 is ".", 2 is
    /// "..", 3 + i is entry i.
    fn list_from(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(u64, &FileAttr, &str) -> bool,
    ) -> std::result::Result<(), Errno> {
        let l = match self.handles.lock().get(&fh.0) {
            Some(Handle::Dir(l)) => l.clone(),
            _ => return Err(Errno::EBADF),
        };
        let mut l = l.lock();
        let dir = |ino: u64| FileAttr {
            ino: INodeNo(ino),
            ..self.attr(&pb::FileInfo { is_dir: true, ..Default::default() })
        };
        let mut at = offset;
        if at == 0 {
            if add(1, &dir(ino.0), ".") {
                return Ok(());
            }
            at = 1;
        }
        if at == 1 {
            let parent = lpath::split_parent(&l.path).map_or(ROOT, |(p, _)| self.inodes.known(p).unwrap_or(ROOT));
            if add(2, &dir(parent), "..") {
                return Ok(());
            }
            at = 2;
        }
        let mut i = (at - 2) as usize;
        loop {
            self.list_to(&mut l, i + 1).map_err(|e| errno(&e, false))?;
            let Some((attr, name)) = l.entries.get(i) else { break };
            if add(3 + i as u64, attr, name) {
                break;
            }
            i += 1;
        }
        Ok(())
    }

    /// Fills `l` up to entry `want` (or its end).
    fn list_to(&self, l: &mut Listing, want: usize) -> Result<()> {
        while l.entries.len() < want {
            let Some(after) = l.after.clone() else { return Ok(()) };
            let (page, more) = self.run(self.client.list_page(&l.path, &after, false, DIR_PAGE))?;
            l.after = if more { page.last().map(|f| f.name.clone()) } else { None };
            for fi in &page {
                l.entries.push((self.attr(fi), fi.name.clone()));
            }
            if page.is_empty() {
                l.after = None;
            }
        }
        Ok(())
    }

    fn rename_paths(&self, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Error::invalid("RENAME_EXCHANGE is not supported"));
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self.run(self.client.rename(from, to)) {
            Err(e) if e.kind() == ErrorKind::AlreadyExists && !noreplace => {
                // POSIX replaces the target: a file by a file, an empty directory by a
                // directory.
                let (src, dst) = (self.stat(from)?, self.stat(to)?);
                match (src.is_dir, dst.is_dir) {
                    (false, true) => return Err(Error::new(ErrorKind::IsADirectory, format!("{to} is a directory"))),
                    (true, false) => {
                        return Err(Error::new(ErrorKind::NotADirectory, format!("{to} is not a directory")));
                    }
                    _ => {}
                }
                self.run(self.client.delete(to, false))?;
                self.run(self.client.rename(from, to))
            }
            r => r,
        }
    }
}

impl Filesystem for LocusFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(
            InitFlags::FUSE_ATOMIC_O_TRUNC
                | InitFlags::FUSE_ASYNC_READ
                | InitFlags::FUSE_BIG_WRITES
                | InitFlags::FUSE_PARALLEL_DIROPS
                | InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_MAX_PAGES,
        );
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.stat(&path) {
            Ok(fi) => reply.entry(&self.opts.attr_timeout, &self.entry(&fi), Generation(0)),
            Err(e) => {
                // A file being written here exists for its writer.
                if let Some(w) = self.writing.lock().values().find(|w| w.lock().path == path).cloned() {
                    let attr = self.writing_attr(&w.lock());
                    self.inodes.remember(attr.ino.0, &path);
                    return reply.entry(&Duration::ZERO, &attr, Generation(0));
                }
                reply.error(errno(&e, false))
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(w) = self.writing.lock().get(&ino.0).cloned() {
            let attr = self.writing_attr(&w.lock());
            return reply.attr(&Duration::ZERO, &attr);
        }
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.stat(&path) {
            Ok(fi) => reply.attr(&self.opts.attr_timeout, &FileAttr { ino, ..self.attr(&fi) }),
            Err(e) => reply.error(errno(&e, false)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Modes, owners and times are Locus's own (tools that copy them, `cp -p`, `rsync
        // -a`, `tar`, carry on); a size is kept only where it is already the size.
        if let Some(w) = self.writing.lock().get(&ino.0).cloned() {
            let g = w.lock();
            let attr = self.writing_attr(&g);
            if size.is_some_and(|s| s != attr.size) {
                return reply.error(Errno::EPERM);
            }
            return reply.attr(&Duration::ZERO, &attr);
        }
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.stat(&path) {
            Ok(fi) if size.is_some_and(|s| s != fi.length) => {
                reply.error(if self.opts.read_only { Errno::EROFS } else { Errno::EPERM })
            }
            Ok(fi) => reply.attr(&self.opts.attr_timeout, &FileAttr { ino, ..self.attr(&fi) }),
            Err(e) => reply.error(errno(&e, false)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let r = (|| {
            self.refuse_change()?;
            let path = self.child(parent, name)?;
            self.run(self.client.mkdir(&path, false)).map_err(|e| errno(&e, true))?;
            self.stat(&path).map_err(|e| errno(&e, false))
        })();
        match r {
            Ok(fi) => reply.entry(&self.opts.attr_timeout, &self.entry(&fi), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            self.refuse_change()?;
            let path = self.child(parent, name)?;
            let fi = self.stat(&path).map_err(|e| errno(&e, false))?;
            if fi.is_dir {
                return Err(Errno::EISDIR);
            }
            self.run(self.client.delete(&path, false)).map_err(|e| errno(&e, true))?;
            self.opened.lock().remove(&inodes::ino_of(&fi));
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            self.refuse_change()?;
            let path = self.child(parent, name)?;
            let fi = self.stat(&path).map_err(|e| errno(&e, false))?;
            if !fi.is_dir {
                return Err(Errno::ENOTDIR);
            }
            self.run(self.client.delete(&path, false)).map_err(|e| errno(&e, true))
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            self.refuse_change()?;
            let (from, to) = (self.child(parent, name)?, self.child(newparent, newname)?);
            self.rename_paths(&from, &to, flags).map_err(|e| errno(&e, true))?;
            self.inodes.renamed(&from, &to);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            let path = self.path(ino)?;
            if flags.acc_mode() != OpenAccMode::O_RDONLY {
                // Files are written whole: only an open that empties the file may write.
                self.refuse_change()?;
                if flags.0 & libc::O_TRUNC == 0 {
                    let fi = self.stat(&path).map_err(|e| errno(&e, false))?;
                    if fi.length > 0 {
                        return Err(Errno::EPERM);
                    }
                }
                let w = self.start_write(ino.0, &path, true, req.pid())?;
                return Ok((self.new_fh(Handle::Write(w)), FopenFlags::FOPEN_DIRECT_IO));
            }
            let fi = self.run(self.client.status(&path, true)).map_err(|e| errno(&e, false))?;
            if fi.is_dir {
                return Err(Errno::EISDIR);
            }
            // Unchanged since it was last opened: the kernel keeps the pages it cached.
            let seen = (fi.fingerprint.clone(), fi.version);
            let keep = self.opened.lock().insert(ino.0, seen.clone()) == Some(seen);
            let reader = FileReader::from_info(self.client.clone(), fi);
            let flags = if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
            Ok((self.new_fh(Handle::Read(Arc::new(reader))), flags))
        })();
        match r {
            Ok((fh, flags)) => reply.opened(fh, flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let reader = match self.handles.lock().get(&fh.0) {
            Some(Handle::Read(r)) => r.clone(),
            Some(_) => return reply.error(Errno::EBADF),
            None => return reply.error(Errno::EBADF),
        };
        let len = (size as u64).min(reader.info().length.saturating_sub(offset)) as usize;
        // One buffer per answering thread, reused (zeroing a fresh MiB per request
        // costs more than the copy the kernel then makes of it).
        thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
        BUF.with_borrow_mut(|buf| {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let mut done = 0;
            while done < len {
                match self.run(reader.read_at(offset + done as u64, &mut buf[done..len])) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) => return reply.error(errno(&e, false)),
                }
            }
            reply.data(&buf[..done]);
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let w = match self.handles.lock().get(&fh.0) {
            Some(Handle::Write(w)) => w.clone(),
            _ => return reply.error(Errno::EBADF),
        };
        match self.write_at(&w, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // `close`: a file written through this handle is complete now, and close's
        // answer is whether it was stored.
        self.complete(fh, Some(req.pid()), reply)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // A reader's handle goes with its lease (the block it held may be evicted again).
        let h = self.handles.lock().remove(&fh.0);
        if let Some(Handle::Write(w)) = h {
            let _ = self.finish(&w);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Waits for the write type's durability: the write is completed here.
        self.complete(fh, None, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.stat(&path) {
            Ok(fi) if !fi.is_dir => reply.error(Errno::ENOTDIR),
            Ok(_) => {
                let l = Listing { path, entries: Vec::new(), after: Some(String::new()) };
                reply.opened(self.new_fh(Handle::Dir(Arc::new(Mutex::new(l)))), FopenFlags::empty())
            }
            Err(e) => reply.error(errno(&e, false)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.list_from(ino, fh, offset, |off, a, name| reply.add(a.ino, off, a.kind, name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// A listing with each entry's attributes (`ls -l`, `find -size` need no lookup per
    /// entry): the kernel keeps each entry as if looked up.
    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let dir = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let ttl = self.opts.attr_timeout;
        let r = self.list_from(ino, fh, offset, |off, a, name| {
            let full = reply.add(a.ino, off, name, &ttl, a, Generation(0));
            if !full && off > 2 {
                // The kernel counts a lookup of every entry but "." and "..".
                self.inodes.remember(a.ino.0, &lpath::join(&dir, name));
            }
            full
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The cache's capacity and free space, over the live workers.
        let (mut cap, mut used) = (0u64, 0u64);
        if let Ok(r) = self.run(self.client.report()) {
            for w in r.workers.iter().filter(|w| w.live) {
                for t in &w.tiers {
                    cap += t.capacity;
                    used += t.used;
                }
            }
        }
        let bsize = 4096u64;
        let (blocks, free) = (cap / bsize, cap.saturating_sub(used) / bsize);
        reply.statfs(blocks, free, free, u64::MAX >> 1, u64::MAX >> 1, bsize as u32, 255, bsize as u32);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = (|| {
            let path = self.path(ino)?;
            let name = name.to_str().and_then(|n| n.strip_prefix("user.")).ok_or(Errno::NO_XATTR)?;
            let fi = self.stat(&path).map_err(|e| errno(&e, false))?;
            let meta = fi.meta.unwrap_or_default();
            meta.user.get(name).cloned().ok_or(Errno::NO_XATTR)
        })();
        match r {
            Ok(v) => xattr_reply(reply, v.as_bytes(), size),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = (|| {
            let path = self.path(ino)?;
            let fi = self.stat(&path).map_err(|e| errno(&e, false))?;
            let mut names: Vec<_> = fi.meta.unwrap_or_default().user.into_keys().collect();
            names.sort();
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(b"user.");
                out.extend_from_slice(n.as_bytes());
                out.push(0);
            }
            Ok(out)
        })();
        match r {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOTSUP); // user metadata is read-only here
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOTSUP);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if self.opts.read_only && mask.contains(fuser::AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        match self.path(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            self.refuse_change()?;
            let path = self.child(parent, name)?;
            let ino = self.inodes.provisional(&path);
            let w = self.start_write(ino, &path, flags & libc::O_EXCL == 0, req.pid())?;
            let attr = self.writing_attr(&w.lock());
            Ok((attr, self.new_fh(Handle::Write(w))))
        })();
        match r {
            Ok((attr, fh)) => reply.created(&Duration::ZERO, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }
}

/// An extended attribute's value (or the list of names): its size when asked for 0
/// bytes, `ERANGE` when it does not fit.
fn xattr_reply(reply: ReplyXattr, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}

/// Mounts `fs` at `mountpoint` and serves it on background threads until the returned
/// session is dropped (which unmounts).
pub fn mount(fs: LocusFs, mountpoint: &Path) -> Result<fuser::BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("locus".into()),
        fuser::MountOption::Subtype("locus".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    if fs.opts.read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    if fs.opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(fs.opts.threads.max(1));
    config.clone_fd = true;
    let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(|e| {
        Error::new(ErrorKind::Io, format!("cannot mount at {}: {e}", mountpoint.display()))
            .with_source(e)
            .set_retryable(false)
    })?;
    raise_read_ahead(mountpoint);
    Ok(session)
}

/// The kernel reads a FUSE file ahead by its mount's `read_ahead_kb` (128 KiB by
/// default), whatever `max_readahead` the file system asked for: raised to [`MAX_IO`]
/// where this process may (as root), so a sequential read is 1 MiB requests, not 128 KiB
/// ones. Best effort: elsewhere the reads are smaller, not wrong.
fn raise_read_ahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mountpoint) else { return };
    let dev = m.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, format!("{}", MAX_IO / 1024)) {
        tracing::debug!(error = %e, knob, "cannot raise the mount's read-ahead");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_maps_kinds_and_read_only_changes() {
        let e = |k| Error::new(k, "x");
        assert_eq!(errno(&e(ErrorKind::NotFound), false), Errno::ENOENT);
        assert_eq!(errno(&e(ErrorKind::DirectoryNotEmpty), true), Errno::ENOTEMPTY);
        assert_eq!(errno(&e(ErrorKind::PermissionDenied), true), Errno::EROFS);
        assert_eq!(errno(&e(ErrorKind::PermissionDenied), false), Errno::EACCES);
        assert_eq!(errno(&e(ErrorKind::ResourceExhausted), true), Errno::ENOSPC);
        assert_eq!(errno(&e(ErrorKind::Unavailable), false), Errno::EIO);
    }
}
