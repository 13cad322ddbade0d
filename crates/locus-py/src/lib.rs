//! The Python client's native module, `locus._native`: a thin pyo3 binding over
//! [`locus_client::Client`]. The `locus` package's fsspec filesystem
//! (`python/locus/fsspec.py`) is written over it; nothing here decides more than how a
//! Python call becomes a client call.
//!
//! - Every call releases the GIL while it waits (`Python::detach`), so many Python
//!   threads read and write at once.
//! - Reads land in the `bytes` object Python gets back (one buffer, filled by the
//!   client's short-circuit or network read), or in a caller's buffer (`read_into`);
//!   a file cached on this host can be mapped instead (`Reader.map`: its block files
//!   mapped read-only, exported through the buffer protocol, no copy at all).
//! - A client made before `fork` works in the child: the child builds its own runtime
//!   and connections on first use (the parent's threads do not exist there), and leaves
//!   the parent's alone.
//! - A Locus error becomes the `OSError` subclass of its errno in one place ([`py_err`]).
//!
//! Depends on `locus-client` (and its `locus-common`, `locus-proto` and `locus-compute`
//! types) only.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use locus_client::{Client as Core, ConnectOptions, FileMap, FileReader, FileWriter, PutOptions};
use locus_common::config::{Config, WriteType};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;
use parking_lot::Mutex;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{
    PyBufferError, PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError, PyOSError,
    PyPermissionError, PyValueError,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// The one place a Locus error becomes a Python exception: the `OSError` subclass of
/// its errno (`FileNotFoundError`, `FileExistsError`, `IsADirectoryError`,
/// `NotADirectoryError`, `PermissionError`), `ValueError` for a malformed argument, and
/// `OSError(errno, message)` otherwise.
fn py_err(e: Error) -> PyErr {
    let (errno, msg) = (e.kind().errno(), e.to_string());
    match e.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err((errno, msg)),
        ErrorKind::AlreadyExists => PyFileExistsError::new_err((errno, msg)),
        ErrorKind::IsADirectory => PyIsADirectoryError::new_err((errno, msg)),
        ErrorKind::NotADirectory => PyNotADirectoryError::new_err((errno, msg)),
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => PyPermissionError::new_err((errno, msg)),
        ErrorKind::InvalidArgument => PyValueError::new_err(msg),
        _ => PyOSError::new_err((errno, msg)),
    }
}

/// A runtime and a client of it, made in process `pid`.
struct Conn {
    pid: u32,
    rt: ManuallyDrop<tokio::runtime::Runtime>,
    client: ManuallyDrop<Arc<Core>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Only the process that made the runtime may shut it down: in a forked child
        // (where a parent's object can be collected, say in a `preexec_fn`) its threads do
        // not exist, and a shutdown would wait for them for ever. There it is leaked.
        if self.pid == std::process::id() {
            // SAFETY: dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.client);
                ManuallyDrop::drop(&mut self.rt);
            }
        }
    }
}

impl Conn {
    fn new(cfg: &Config) -> Result<Conn> {
        let rt = locus_client::embedded_runtime("locus-py")?;
        let client = {
            let _g = rt.enter();
            Arc::new(Core::from_config(cfg)?)
        };
        Ok(Conn { pid: std::process::id(), rt: ManuallyDrop::new(rt), client: ManuallyDrop::new(client) })
    }

    fn run<T>(&self, f: impl Future<Output = Result<T>>) -> PyResult<T> {
        self.rt.block_on(f).map_err(py_err)
    }
}

/// A connection to a Locus cluster.
///
/// `Client(master=None, config_file=None, token_file=None, ca_file=None)`: each argument
/// that is given overrides the configuration file and the `LOCUS_*` variables (the
/// master defaults to `LOCUS_MASTER`, else 127.0.0.1:19998).
#[pyclass(module = "locus._native", frozen)]
struct Client {
    cfg: Config,
    conn: Mutex<Arc<Conn>>,
}

impl Client {
    /// This process's connection (a child of `fork` makes its own on first use; the
    /// parent's is leaked there, see `Conn`'s drop).
    fn conn(&self) -> PyResult<Arc<Conn>> {
        let mut g = self.conn.lock();
        if g.pid != std::process::id() {
            *g = Arc::new(Conn::new(&self.cfg).map_err(py_err)?);
        }
        Ok(g.clone())
    }

    /// Runs `f` on this process's client, without the GIL.
    fn call<T: Send, F>(&self, py: Python<'_>, f: impl FnOnce(Arc<Core>) -> F + Send) -> PyResult<T>
    where
        F: Future<Output = Result<T>>,
    {
        let c = self.conn()?;
        py.detach(|| c.run(f(Arc::clone(&c.client))))
    }
}

/// A file's or directory's attributes as fsspec's `info` returns them, plus Locus's
/// own: `cached_fraction`, `persist_state`, `pinned`, `block_size`, `mount_point`,
/// `content_type`, `etag`, `metadata` and `tags`.
fn info<'py>(py: Python<'py>, fi: &pb::FileInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &fi.path)?;
    d.set_item("size", fi.length)?;
    d.set_item("type", if fi.is_dir { "directory" } else { "file" })?;
    d.set_item("mtime", fi.mtime_ms as f64 / 1000.0)?;
    d.set_item("block_size", fi.block_size)?;
    d.set_item("cached_fraction", fi.cached_fraction())?;
    d.set_item("persist_state", fi.persist_state().name())?;
    d.set_item("pinned", fi.pinned)?;
    d.set_item("mount_point", &fi.mount_point)?;
    d.set_item("fingerprint", &fi.fingerprint)?;
    let m = fi.meta.clone().unwrap_or_default();
    d.set_item("content_type", m.content_type)?;
    d.set_item("etag", m.etag)?;
    d.set_item("metadata", m.user.into_iter().collect::<std::collections::BTreeMap<_, _>>())?;
    d.set_item("tags", m.tags.into_iter().collect::<std::collections::BTreeMap<_, _>>())?;
    Ok(d)
}

fn write_type(s: Option<&str>) -> PyResult<Option<WriteType>> {
    s.map(|s| WriteType::parse_or_err(s).map_err(py_err)).transpose()
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (master=None, config_file=None, token_file=None, ca_file=None))]
    fn new(
        master: Option<String>,
        config_file: Option<String>,
        token_file: Option<String>,
        ca_file: Option<String>,
    ) -> PyResult<Client> {
        let cfg = ConnectOptions { master, config_file, token_file, ca_file }.config().map_err(py_err)?;
        let conn = Conn::new(&cfg).map_err(py_err)?;
        Ok(Client { cfg, conn: Mutex::new(Arc::new(conn)) })
    }

    /// The master's RPC address this client talks to.
    #[getter]
    fn master(&self) -> String {
        self.cfg.master_address.clone()
    }

    /// The attributes of `path` (see `info`).
    fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyDict>> {
        let fi = self.call(py, |c| async move { c.status(&path, true).await })?;
        info(py, &fi)
    }

    /// The entries of directory `path` (of a file: the file), or with `recursive` every
    /// file and directory under it.
    #[pyo3(signature = (path, recursive=false))]
    fn ls<'py>(&self, py: Python<'py>, path: String, recursive: bool) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let all = self.call(py, |c| async move {
            let mut v = Vec::new();
            c.list_each(&path, recursive, |fi| v.push(fi.clone())).await?;
            Ok(v)
        })?;
        all.iter().map(|fi| info(py, fi)).collect()
    }

    /// Creates directory `path` (with `parents`, and its missing parents; an existing
    /// directory is then no error).
    #[pyo3(signature = (path, parents=true))]
    fn mkdir(&self, py: Python<'_>, path: String, parents: bool) -> PyResult<()> {
        self.call(py, |c| async move { c.mkdir(&path, parents).await })
    }

    /// Removes `path` (a directory with entries only with `recursive`).
    #[pyo3(signature = (path, recursive=false))]
    fn rm(&self, py: Python<'_>, path: String, recursive: bool) -> PyResult<()> {
        self.call(py, |c| async move { c.delete(&path, recursive).await })
    }

    /// Renames `src` to `dst`.
    fn mv(&self, py: Python<'_>, src: String, dst: String) -> PyResult<()> {
        self.call(py, |c| async move { c.rename(&src, &dst).await })
    }

    /// Opens file `path` for reading.
    fn open(slf: &Bound<'_, Client>, path: String) -> PyResult<Reader> {
        let c = slf.get().conn()?;
        let file = slf.py().detach(|| c.run(FileReader::open(Arc::clone(&c.client), &path)))?;
        Ok(Reader { owner: slf.clone().unbind(), state: Mutex::new((c, Arc::new(file))) })
    }

    /// Creates file `path` for writing (`write_type`: MUST_CACHE, CACHE_THROUGH, THROUGH
    /// or ASYNC_THROUGH; the mount's or the cluster's when None). Nothing is visible
    /// until `close()`.
    #[pyo3(signature = (path, overwrite=true, write_type=None))]
    fn create(&self, py: Python<'_>, path: String, overwrite: bool, write_type: Option<&str>) -> PyResult<Writer> {
        let opts = PutOptions { overwrite, write_type: self::write_type(write_type)?, ..Default::default() };
        let c = self.conn()?;
        let mut file = {
            let _g = c.rt.enter();
            FileWriter::create(Arc::clone(&c.client), path, opts)
        };
        // A refused create (an existing file without `overwrite`, a read-only mount)
        // raises here, not at the first write.
        py.detach(|| c.run(file.ready()))?;
        Ok(Writer { conn: c, file: Mutex::new(Some(file)), pending: Mutex::new(BytesMut::new()) })
    }

    /// Fills the cache with every block of `path` (a directory: every file under it).
    /// Returns the bytes of the files loaded.
    fn load(&self, py: Python<'_>, path: String) -> PyResult<u64> {
        self.call(py, |c| async move {
            let mut files = Vec::new();
            c.list_each(&path, true, |fi| {
                if !fi.is_dir {
                    files.push(fi.path.clone())
                }
            })
            .await?;
            let mut bytes = 0;
            for p in files {
                let fi = c.status(&p, true).await?;
                c.load(&fi, |_| {}).await?;
                bytes += fi.length;
            }
            Ok(bytes)
        })
    }

    /// Drops the cached blocks of `path` (persisted, unpinned files). Returns how many
    /// files were freed.
    #[pyo3(signature = (path, recursive=false))]
    fn free(&self, py: Python<'_>, path: String, recursive: bool) -> PyResult<u64> {
        self.call(py, |c| async move { c.free(&path, recursive).await })
    }

    /// Pins (or unpins) `path` in the cache. Returns how many files changed.
    #[pyo3(signature = (path, pinned=true, recursive=false))]
    fn pin(&self, py: Python<'_>, path: String, pinned: bool, recursive: bool) -> PyResult<u64> {
        self.call(py, |c| async move { c.set_pinned(&path, pinned, recursive).await })
    }

    /// Near-data compute (as `locus fs compute`): the operators `ops` (comma-separated:
    /// count, stats, modsum, stddev, normalize, gram, digits, entropy, or all) over the CSV
    /// files `paths` name (files, directories, globs), each block's partial computed by
    /// the worker that holds it and merged here. Returns what `locus fs compute --json`
    /// prints, as a dict.
    #[pyo3(signature = (ops, paths, columns="", text_column=None, k=1.0, m=10.0, delimiter=",", quote="\"",
                        quoting=true, header=true, parallelism=0))]
    #[allow(clippy::too_many_arguments)]
    fn compute<'py>(
        &self,
        py: Python<'py>,
        ops: &str,
        paths: Vec<String>,
        columns: &str,
        text_column: Option<String>,
        k: f64,
        m: f64,
        delimiter: &str,
        quote: &str,
        quoting: bool,
        header: bool,
        parallelism: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let one = |s: &str, what: &str| match s.as_bytes() {
            [b] if b.is_ascii() => Ok(u32::from(*b)),
            _ => Err(PyValueError::new_err(format!("{what} must be one ASCII character, not {s:?}"))),
        };
        let request = locus_compute::Request {
            ops: locus_compute::parse_ops(ops).map_err(py_err)?,
            columns: columns.to_string(),
            text_column,
            k,
            m,
            csv: pb::CsvFormat {
                delimiter: one(delimiter, "delimiter")?,
                quote: one(quote, "quote")?,
                no_quoting: !quoting,
                header,
                ..Default::default()
            },
        };
        let job = locus_client::ComputeJob { request, parallelism };
        let out = self.call(py, |c| async move { c.compute(&paths, &job).await })?;
        let json = serde_json::to_string(&out).map_err(|e| PyOSError::new_err(format!("the results: {e}")))?;
        py.import("json")?.call_method1("loads", (json,))
    }

    /// Metadata search (as `locus fs search`): one page of up to `limit` (at most 1,000)
    /// files under `path` matching `query` (`size > 1000000 AND tag.project = 'p1'`), in
    /// key order from after key `after`. Returns `{"hits": [...], "truncated": bool,
    /// "next_after": str}`; a hit is `stat`'s dict plus `key`, `cached` (the fraction in
    /// the cache) and `tier`.
    #[pyo3(signature = (path, query, limit=1000, after=String::new()))]
    fn search<'py>(
        &self,
        py: Python<'py>,
        path: String,
        query: String,
        limit: u32,
        after: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        if query.trim().is_empty() {
            return Err(PyValueError::new_err("the search is empty"));
        }
        let req = pb::SearchRequest { path, r#where: query, after, limit: limit.min(1000), ..Default::default() };
        let r = self.call(py, |c| async move { c.search(req).await })?;
        let hits = r
            .hits
            .iter()
            .map(|h| {
                let d = info(py, h.info.as_ref().unwrap_or(&pb::FileInfo::default()))?;
                d.set_item("key", &h.key)?;
                d.set_item("cached", h.cached)?;
                d.set_item("tier", &h.tier)?;
                Ok(d)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let d = PyDict::new(py);
        d.set_item("hits", hits)?;
        d.set_item("truncated", r.truncated)?;
        d.set_item("next_after", r.next_after)?;
        Ok(d)
    }
}

/// A file open for reading, as it was when opened. Safe to share between threads.
#[pyclass(module = "locus._native", frozen)]
struct Reader {
    owner: Py<Client>,
    state: Mutex<(Arc<Conn>, Arc<FileReader>)>,
}

impl Reader {
    /// The reader of this process (after `fork`, one over the child's connection).
    fn file(&self) -> PyResult<(Arc<Conn>, Arc<FileReader>)> {
        let mut g = self.state.lock();
        if g.0.pid != std::process::id() {
            let c = self.owner.get().conn()?;
            let f = Arc::new(FileReader::from_info(Arc::clone(&c.client), g.1.info().clone()));
            *g = (c, f);
        }
        Ok(g.clone())
    }
}

#[pymethods]
impl Reader {
    /// The file's length in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.state.lock().1.info().length
    }

    /// The file's attributes as of the open (see `Client.stat`).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        info(py, self.state.lock().1.info())
    }

    /// Up to `length` bytes from `offset` (fewer only at the end of the file).
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        let (c, f) = self.file()?;
        let n = length.min(f.info().length.saturating_sub(offset)) as usize;
        // A `bytes` object left unfilled (`PyBytes::new_with` would zero it first: 8 MiB
        // of memset per read, as much as a read from a tmpfs block costs), filled below
        // with every byte before anything else can see it, or dropped on an error.
        // SAFETY: CPython's documented way to build a bytes object in place; the pointer
        // is to its `n` bytes, and the object is not shared until it is returned.
        let (bytes, buf) = unsafe {
            let p = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), n as pyo3::ffi::Py_ssize_t);
            let bytes = Bound::from_owned_ptr_or_err(py, p)?.cast_into_unchecked::<PyBytes>();
            let buf = std::slice::from_raw_parts_mut(pyo3::ffi::PyBytes_AsString(p).cast::<u8>(), n);
            (bytes, buf)
        };
        py.detach(|| fill(&c, &f, offset, buf))?;
        Ok(bytes)
    }

    /// Reads from `offset` into `buffer` (any writable, contiguous bytes-like object: a
    /// bytearray, a memoryview, a PyArrow buffer from `pyarrow.allocate_buffer`), as many
    /// bytes as it holds (fewer only at the end of the file). Returns the bytes read. The
    /// GIL is released meanwhile; the caller must not resize `buffer` during the call.
    fn read_into(&self, py: Python<'_>, offset: u64, buffer: PyBuffer<u8>) -> PyResult<usize> {
        if buffer.readonly() || !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err("read_into needs a writable, contiguous buffer"));
        }
        let (c, f) = self.file()?;
        let n = (buffer.len_bytes() as u64).min(f.info().length.saturating_sub(offset)) as usize;
        let at = buffer.buf_ptr() as usize;
        py.detach(|| {
            // SAFETY: `buffer` holds the exporter's view (it cannot be freed or resized
            // under the buffer protocol) until it drops after this call; the `n` bytes are
            // within it, and nothing reads them while the GIL is released here.
            let buf = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, n) };
            fill(&c, &f, offset, buf)
        })?;
        Ok(n)
    }

    /// The whole file mapped read-only from the co-located worker's cache (a `Mapped`),
    /// or `None` where it cannot be (a block not cached on this host, short-circuit off,
    /// an empty file, more blocks than `locus_client::MAP_BLOCKS_MAX`). Its blocks stay
    /// cached, and are not evicted, for as long as the map or a view of it lives.
    fn map(&self, py: Python<'_>) -> PyResult<Option<Mapped>> {
        let (c, f) = self.file()?;
        Ok(py.detach(|| c.run(f.map()))?.map(|map| Mapped { map }))
    }
}

/// A file mapped read-only from the co-located worker's cache (`Reader.map`). Its bytes
/// are exported through the buffer protocol (`memoryview(m)[a:b]` copies nothing); the
/// mapping, and the leases that keep its blocks cached, end when the last view goes.
#[pyclass(module = "locus._native", frozen)]
struct Mapped {
    map: FileMap,
}

#[pymethods]
impl Mapped {
    fn __len__(&self) -> usize {
        self.map.bytes().len()
    }

    /// Read-only, contiguous, one-dimensional bytes (format `B`).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a mapped locus:// file is read-only"));
        }
        let (ptr, len) = {
            let b = slf.get().map.bytes();
            (b.as_ptr(), b.len())
        };
        // SAFETY: `view` is the caller's to fill (checked non-null); it takes a reference
        // to `slf`, which keeps the mapping alive until the view is released. `shape` and
        // `strides` point into the view itself, as CPython's own exporters do.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut std::ffi::c_void;
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut std::ffi::c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape =
                if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// Nothing to free: the format is a static string.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Reads of at least this many bytes are split in two halves, read side by side (the
/// second on a thread of its own). A large read lands in memory the process has not
/// touched yet (a fresh `bytes` object, a buffer PyArrow has just allocated), where each
/// 4 KiB page costs a fault as well as its copy, and one core fills about 2 GB/s.
const SPLIT_READ: usize = 16 << 20;

/// Fills `buf` with the file's bytes from `offset` (the caller has bounded it by the
/// file's length). Runs without the GIL.
fn fill(c: &Conn, f: &FileReader, offset: u64, buf: &mut [u8]) -> PyResult<()> {
    if buf.len() < SPLIT_READ {
        return c.run(read_fully(f, offset, buf));
    }
    let half = buf.len() / 2;
    let (a, b) = buf.split_at_mut(half);
    std::thread::scope(|s| {
        let second = s.spawn(|| c.run(read_fully(f, offset + half as u64, b)));
        let first = c.run(read_fully(f, offset, a));
        let second = second.join().unwrap_or_else(|_| Err(PyOSError::new_err("a read thread panicked")));
        first.and(second)
    })
}

/// Fills `buf` with the file's bytes from `offset`.
async fn read_fully(f: &FileReader, offset: u64, buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let got = f.read_at(offset + done as u64, &mut buf[done..]).await?;
        if got == 0 {
            return Err(Error::new(ErrorKind::Io, "the file ended early"));
        }
        done += got;
    }
    Ok(())
}

/// A new file being written. `close()` completes it; `abort()` (or losing it
/// unclosed) leaves no file.
#[pyclass(module = "locus._native", frozen)]
struct Writer {
    conn: Arc<Conn>,
    file: Mutex<Option<FileWriter>>,
    /// Bytes written and not sent yet: gathered into chunks of [`WRITE_CHUNK`], so a
    /// caller's many small writes (PyArrow's pages, pandas' text) cost one copy each and
    /// the write pipeline sees whole chunks.
    pending: Mutex<BytesMut>,
}

/// Bytes a writer sends at a time.
const WRITE_CHUNK: usize = 8 << 20;

impl Writer {
    fn with<T: Send>(&self, py: Python<'_>, f: impl AsyncFnOnce(&mut FileWriter) -> Result<T> + Send) -> PyResult<T> {
        if self.conn.pid != std::process::id() {
            return Err(py_err(Error::new(ErrorKind::FailedPrecondition, "a file opened for writing before fork")));
        }
        py.detach(|| {
            let mut g = self.file.lock();
            let Some(w) = g.as_mut() else {
                return Err(py_err(Error::new(ErrorKind::FailedPrecondition, "the file is closed")));
            };
            self.conn.run(f(w))
        })
    }

    /// Hands a chunk to the write pipeline.
    fn send(&self, py: Python<'_>, chunk: Bytes) -> PyResult<()> {
        self.with(py, async move |w: &mut FileWriter| w.write(chunk).await)
    }
}

#[pymethods]
impl Writer {
    /// Appends `data` (any bytes-like object of bytes: bytes, bytearray, memoryview,
    /// NumPy `uint8`...). It is copied before the call returns (the caller may reuse
    /// it); whole chunks go to the write pipeline as they fill.
    fn write(&self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<usize> {
        let n = data.item_count();
        if self.file.lock().is_none() {
            return Err(py_err(Error::new(ErrorKind::FailedPrecondition, "the file is closed")));
        }
        // What is pending goes first when `data` would not fit beside it.
        let before = {
            let mut p = self.pending.lock();
            (!p.is_empty() && p.len() + n > WRITE_CHUNK).then(|| p.split().freeze())
        };
        if let Some(c) = before {
            self.send(py, c)?;
        }
        let full = {
            let mut p = self.pending.lock();
            let room = n.max(WRITE_CHUNK.saturating_sub(p.len()));
            p.reserve(room);
            if data.is_c_contiguous() {
                // SAFETY: `data` holds the exporter's view of `n` contiguous bytes for as
                // long as it lives (the buffer protocol forbids resizing meanwhile), and
                // the GIL is held: no Python code runs during the copy.
                p.extend_from_slice(unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, n) });
            } else {
                let at = p.len();
                p.resize(at + n, 0);
                data.copy_to_slice(py, &mut p[at..])?;
            }
            (p.len() >= WRITE_CHUNK).then(|| p.split().freeze())
        };
        if let Some(c) = full {
            self.send(py, c)?;
        }
        Ok(n)
    }

    /// Bytes written so far.
    #[getter]
    fn written(&self) -> u64 {
        self.file.lock().as_ref().map_or(0, FileWriter::written) + self.pending.lock().len() as u64
    }

    /// Completes the file (acknowledged per its write type) and returns its attributes
    /// (None when it was closed already).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.file.lock().is_none() {
            return Ok(None);
        }
        let rest = self.pending.lock().split().freeze();
        if !rest.is_empty()
            && let Err(e) = self.send(py, rest)
        {
            self.abort(py)?;
            return Err(e);
        }
        let r = self.with(py, async |w: &mut FileWriter| w.finish().await);
        *self.file.lock() = None;
        r?.map(|fi| info(py, &fi)).transpose()
    }

    /// Abandons the file: nothing of it becomes visible.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        self.pending.lock().clear();
        if self.file.lock().is_none() {
            return Ok(());
        }
        let r = self.with(py, async |w: &mut FileWriter| {
            w.abort().await;
            Ok(())
        });
        *self.file.lock() = None;
        r
    }
}

/// The module: `Client`, `Reader`, `Mapped`, `Writer`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Reader>()?;
    m.add_class::<Mapped>()?;
    m.add_class::<Writer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
