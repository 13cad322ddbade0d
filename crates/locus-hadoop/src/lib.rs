//! The Hadoop `FileSystem` connector for `locus://` paths: the JNI library under the Java
//! classes in `java/` (`io.locus.hadoop.LocusFileSystem`). Spark, Hive or any Hadoop
//! client loads it with `fs.locus.impl=io.locus.hadoop.LocusFileSystem` and reads blocks
//! the way the native client does: short-circuit from a co-located worker's block files
//! (one copy, into the stream's direct buffer), over the data path otherwise, filling
//! the cache from the UFS on a miss. Writes go through the client's write pipeline
//! (write types, durable replicas), so a file written here is acknowledged and
//! persisted like one written with `locus fs put`.
//!
//! Every Java call runs a future of [`locus_client::Client`] on this library's Tokio
//! runtime; a Locus error becomes a Java exception in one place ([`throw`]). Depends on
//! `locus-client` (and its `locus-common` and `locus-proto` types) only: never on the
//! master, worker, block store or UFS crates.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use bytes::Bytes;
use jni::JNIEnv;
use jni::objects::{JByteArray, JByteBuffer, JClass, JObject, JString};
use jni::sys::{jboolean, jint, jlong, jlongArray, jobjectArray};
use locus_client::{Client, ConnectOptions, FileReader, FileWriter, PutOptions};
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb;

/// A connection: the client and the runtime its futures run on. One per Hadoop
/// `FileSystem` instance; streams hold their own reference, so closing the file system
/// never pulls the runtime from under an open stream.
struct Ctx {
    rt: tokio::runtime::Runtime,
    client: Arc<Client>,
}

impl Ctx {
    fn connect(master: &str, config_file: &str, token_file: &str, ca_file: &str) -> Result<Ctx> {
        let set = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let opts = ConnectOptions {
            master: set(master),
            config_file: set(config_file),
            token_file: set(token_file),
            ca_file: set(ca_file),
        };
        let mut cfg = opts.config()?;
        // Schedulers place tasks by the locations this connector gives: a block is filled
        // where they were told it would be (`client.fill`), unless configured otherwise.
        cfg.client.fill.get_or_insert(locus_common::config::FillPlacement::Named);
        let rt = locus_client::embedded_runtime("locus-hadoop")?;
        let client = {
            let _g = rt.enter();
            Arc::new(Client::from_config(&cfg)?)
        };
        Ok(Ctx { rt, client })
    }
}

/// An open file: the client's reader, on the connection's runtime.
struct Reader {
    ctx: Arc<Ctx>,
    file: FileReader,
}

impl Reader {
    /// Copies up to `buf.len()` bytes at `pos` into `buf`; 0 at the end of the file.
    fn read(&self, pos: u64, buf: &mut [u8]) -> Result<usize> {
        self.ctx.rt.block_on(self.file.read_at(pos, buf))
    }
}

/// A file being written: the client's writer, on the connection's runtime.
struct Writer {
    ctx: Arc<Ctx>,
    file: FileWriter,
}

impl Writer {
    fn create(ctx: Arc<Ctx>, path: String, overwrite: bool) -> Writer {
        let file = {
            let _g = ctx.rt.enter();
            FileWriter::create(ctx.client.clone(), path, PutOptions { overwrite, ..Default::default() })
        };
        Writer { ctx, file }
    }

    fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.ctx.rt.block_on(self.file.write(chunk))
    }

    /// Ends the input and waits for the write to be acknowledged.
    fn finish(&mut self) -> Result<()> {
        self.ctx.rt.block_on(self.file.finish()).map(|_| ())
    }

    /// Abandons the write: the worker drops what it received and nothing is acknowledged.
    fn abort(&mut self) {
        self.ctx.rt.block_on(self.file.abort())
    }
}

// ------------------------------------------------------------------ errors

/// The one place a Locus error becomes a Java exception: `NotFound` is a
/// `FileNotFoundException`, `AlreadyExists` a `FileAlreadyExistsException`,
/// `PermissionDenied` an `AccessControlException`, a non-empty directory a
/// `PathIsNotEmptyDirectoryException`, everything else an `IOException` whose message
/// starts with the error kind.
fn throw(env: &mut JNIEnv, e: &Error) {
    let class = match e.kind() {
        ErrorKind::NotFound => "java/io/FileNotFoundException",
        ErrorKind::AlreadyExists => "org/apache/hadoop/fs/FileAlreadyExistsException",
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => "org/apache/hadoop/security/AccessControlException",
        ErrorKind::DirectoryNotEmpty => "org/apache/hadoop/fs/PathIsNotEmptyDirectoryException",
        _ => "java/io/IOException",
    };
    if env.exception_check().unwrap_or(false) {
        return; // a Java exception is pending already: keep it
    }
    if env.throw_new(class, e.to_string()).is_err() {
        let _ = env.throw_new("java/io/IOException", e.to_string());
    }
}

fn jni_err(e: jni::errors::Error) -> Error {
    Error::internal(format!("JNI: {e}"))
}

/// Runs `f`, turning its error, or a panic, into a Java exception (and `T::default()`
/// for the return value Java then ignores).
fn call<'l, T: Default>(env: &mut JNIEnv<'l>, f: impl FnOnce(&mut JNIEnv<'l>) -> Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(|| f(env))) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            throw(env, &e);
            T::default()
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            throw(env, &Error::internal(format!("panic in the Locus connector: {msg}")));
            T::default()
        }
    }
}

fn string(env: &mut JNIEnv, s: &JString) -> Result<String> {
    if s.is_null() {
        return Ok(String::new());
    }
    Ok(env.get_string(s).map_err(jni_err)?.into())
}

// ------------------------------------------------------------------ handles

// Java holds every Rust object as a `long` handle, a raw pointer: a connection is an
// `Arc<Ctx>` from `connect` (released by `close`), a reader a `Box<Reader>` from `open`
// (freed by `closeReader`), a writer a `Box<Writer>` from `create` (freed by `closeWriter`
// or `abortWriter`). The functions below are the only places that turn a handle back
// into a reference; 0 is the handle of a closed object (the Java classes zero theirs on
// close), refused with an error instead of dereferenced.

/// The connection `h`, as a new reference (so a stream opened on it outlives `close`).
fn ctx(h: jlong) -> Result<Arc<Ctx>> {
    if h == 0 {
        return Err(closed("file system"));
    }
    let p = h as *const Ctx;
    // SAFETY: a non-zero `h` is a pointer `connect` made with `Arc::into_raw`, whose
    // reference only `close` releases. `LocusFileSystem` calls `close` once, zeroes its
    // handle there and never passes it again, so the reference `h` stands for is alive for
    // this call and taking another one is sound.
    unsafe {
        Arc::increment_strong_count(p);
        Ok(Arc::from_raw(p))
    }
}

/// Releases the connection `h` (0: already closed). Its streams keep their own reference.
fn release_ctx(h: jlong) {
    if h != 0 {
        // SAFETY: as in `ctx`; this releases the reference `h` stands for, in `close`,
        // the handle's last call.
        drop(unsafe { Arc::from_raw(h as *const Ctx) });
    }
}

/// A new stream handle owning `v`.
fn new_stream<T>(v: T) -> jlong {
    Box::into_raw(Box::new(v)) as jlong
}

/// The stream behind `h` (a `Reader` from `open` or a `Writer` from `create`), for the
/// length of one call.
fn stream<'a, T>(h: jlong) -> Result<&'a mut T> {
    if h == 0 {
        return Err(closed("stream"));
    }
    // SAFETY: a non-zero `h` is a `Box<T>` pointer made by `new_stream` for this `T` (a
    // reader handle only ever reaches reader calls, a writer handle writer calls), freed
    // only by `free_stream`. `LocusInputStream` and `LocusOutputStream` make every native
    // call of a stream, its close included, under the stream's monitor and zero the
    // handle on close: calls on one stream never overlap (so the reference is unique) and
    // none comes after the free.
    Ok(unsafe { &mut *(h as *mut T) })
}

/// Takes back the stream `h` (None for 0, a stream already closed).
fn free_stream<T>(h: jlong) -> Option<Box<T>> {
    // SAFETY: as in `stream`; Java closes a stream once, and this is its last call.
    (h != 0).then(|| unsafe { Box::from_raw(h as *mut T) })
}

fn closed(what: &str) -> Error {
    Error::new(ErrorKind::FailedPrecondition, format!("the {what} is closed"))
}

/// The body of an entry point on connection `h` and one path: `f` gets the connection
/// and the path, its error or panic becomes a Java exception.
fn on_path<'l, T: Default>(
    env: &mut JNIEnv<'l>,
    h: jlong,
    path: &JString,
    f: impl FnOnce(&mut JNIEnv<'l>, Arc<Ctx>, String) -> Result<T>,
) -> T {
    call(env, |env| {
        let (c, p) = (ctx(h)?, string(env, path)?);
        f(env, c, p)
    })
}

/// A file's attributes for Java: is-directory, length, modification time (ms), block size.
fn attrs(fi: &pb::FileInfo) -> [i64; 4] {
    [fi.is_dir as i64, fi.length as i64, fi.mtime_ms, fi.block_size as i64]
}

fn long_array(env: &mut JNIEnv, v: &[i64]) -> Result<jlongArray> {
    let a = env.new_long_array(v.len() as i32).map_err(jni_err)?;
    env.set_long_array_region(&a, 0, v).map_err(jni_err)?;
    Ok(a.into_raw())
}

/// `{String[] strings, long[] longs}`, the shape of the listing calls' answers.
fn strings_and_longs(env: &mut JNIEnv, strings: &[String], longs: &[i64]) -> Result<jobjectArray> {
    let names = env.new_object_array(strings.len() as i32, "java/lang/String", JObject::null()).map_err(jni_err)?;
    for (i, s) in strings.iter().enumerate() {
        let js = env.new_string(s).map_err(jni_err)?;
        env.set_object_array_element(&names, i as i32, js).map_err(jni_err)?;
    }
    // SAFETY: a local reference this call created.
    let longs = unsafe { JObject::from_raw(long_array(env, longs)?) };
    let out = env.new_object_array(2, "java/lang/Object", JObject::null()).map_err(jni_err)?;
    env.set_object_array_element(&out, 0, names).map_err(jni_err)?;
    env.set_object_array_element(&out, 1, longs).map_err(jni_err)?;
    Ok(out.into_raw())
}

// ------------------------------------------------------------------ entry points

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_connect<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    master: JString<'l>,
    config_file: JString<'l>,
    token_file: JString<'l>,
    ca_file: JString<'l>,
) -> jlong {
    call(&mut env, |env| {
        let (m, f, t) = (string(env, &master)?, string(env, &config_file)?, string(env, &token_file)?);
        let ca = string(env, &ca_file)?;
        Ok(Arc::into_raw(Arc::new(Ctx::connect(&m, &f, &t, &ca)?)) as jlong)
    })
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_close<'l>(_: JNIEnv<'l>, _: JClass<'l>, h: jlong) {
    release_ctx(h);
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_stat<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) -> jlongArray {
    on_path(&mut env, h, &path, |env, c, p| {
        let fi = c.rt.block_on(c.client.status(&p, false))?;
        long_array(env, &attrs(&fi))
    })
}

/// A directory's entries: `{String[] names, long[] attributes (4 per entry, as stat)}`.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_list<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) -> jobjectArray {
    on_path(&mut env, h, &path, |env, c, p| {
        let (mut names, mut flat) = (Vec::new(), Vec::new());
        c.rt.block_on(c.client.list_each(&p, false, |fi| {
            names.push(fi.name.clone());
            flat.extend_from_slice(&attrs(fi));
        }))?;
        strings_and_longs(env, &names, &flat)
    })
}

/// Where the blocks of a file overlapping `[start, start+len)` are, for schedulers:
/// `{String[] hosts per block (comma-separated worker hosts: those caching it, or the
/// worker a read would fill it on), long[] (offset, length) per block}`
/// (`Client::block_hosts`).
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_blockLocations<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
    start: jlong,
    len: jlong,
) -> jobjectArray {
    on_path(&mut env, h, &path, |env, c, p| {
        let start = start.max(0) as u64;
        let end = start.saturating_add(len.max(0) as u64);
        let blocks = c.rt.block_on(async {
            let fi = c.client.status(&p, true).await?;
            c.client.block_hosts(&fi, start, end).await
        })?;
        let mut spans = Vec::with_capacity(blocks.len() * 2);
        let mut hosts = Vec::with_capacity(blocks.len());
        for (offset, length, hs) in blocks {
            spans.extend_from_slice(&[offset as i64, length as i64]);
            hosts.push(hs.join(","));
        }
        strings_and_longs(env, &hosts, &spans)
    })
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_mkdirs<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    on_path(&mut env, h, &path, |_, c, p| match c.rt.block_on(c.client.mkdir(&p, true)) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match c.rt.block_on(c.client.status(&p, false)) {
            Ok(fi) if fi.is_dir => Ok(()),
            _ => Err(e),
        },
        r => r,
    })
}

/// False when there is nothing at `path`.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_delete<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
    recursive: jboolean,
) -> jboolean {
    on_path(&mut env, h, &path, |_, c, p| match c.rt.block_on(c.client.delete(&p, recursive != 0)) {
        Ok(()) => Ok(1),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    })
}

/// False when the source is missing or the destination exists.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_rename<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    src: JString<'l>,
    dst: JString<'l>,
) -> jboolean {
    call(&mut env, |env| {
        let (c, s, d) = (ctx(h)?, string(env, &src)?, string(env, &dst)?);
        match c.rt.block_on(c.client.rename(&s, &d)) {
            Ok(()) => Ok(1),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::AlreadyExists) => Ok(0),
            Err(e) => Err(e),
        }
    })
}

/// Opens a file for reading: `{reader handle, file length}`, from one master call (the
/// file's status with its blocks). A directory is a `FileNotFoundException`, as in HDFS.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_open<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) -> jlongArray {
    on_path(&mut env, h, &path, |env, c, p| {
        let fi = c.rt.block_on(c.client.status(&p, true))?;
        if fi.is_dir {
            return Err(Error::not_found(format!("{p} is a directory")));
        }
        let length = fi.length as i64;
        let file = FileReader::from_info(c.client.clone(), fi);
        let reader = new_stream(Reader { ctx: c, file });
        // Java never sees the handle if the answer cannot be made.
        long_array(env, &[reader, length]).inspect_err(|_| drop(free_stream::<Reader>(reader)))
    })
}

/// Reads up to `len` bytes at `pos` into the direct buffer `buf`; -1 at the end of the file.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_read<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    reader: jlong,
    pos: jlong,
    buf: JByteBuffer<'l>,
    len: jint,
) -> jint {
    call(&mut env, |env| {
        let r: &Reader = stream(reader)?;
        if pos < 0 || len < 0 {
            return Err(Error::invalid(format!("bad read: position {pos}, length {len}")));
        }
        if pos as u64 >= r.file.info().length {
            return Ok(-1);
        }
        let addr = env.get_direct_buffer_address(&buf).map_err(jni_err)?;
        let cap = env.get_direct_buffer_capacity(&buf).map_err(jni_err)?;
        let n = (len as usize).min(cap);
        // SAFETY: a direct buffer's memory, `cap` bytes, alive while Java holds `buf`
        // (it does for the whole call).
        let out = unsafe { std::slice::from_raw_parts_mut(addr, n) };
        Ok(r.read(pos as u64, out)? as jint)
    })
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_closeReader<'l>(_: JNIEnv<'l>, _: JClass<'l>, reader: jlong) {
    drop(free_stream::<Reader>(reader));
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_create<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    h: jlong,
    path: JString<'l>,
    overwrite: jboolean,
) -> jlong {
    on_path(&mut env, h, &path, |_, c, p| Ok(new_stream(Writer::create(c, p, overwrite != 0))))
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_write<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    writer: jlong,
    data: JByteArray<'l>,
    off: jint,
    len: jint,
) {
    call(&mut env, |env| {
        let w: &mut Writer = stream(writer)?;
        let mut v = vec![0u8; len.max(0) as usize];
        // SAFETY: i8 and u8 have one layout; the slice is `v`'s.
        let s = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut i8, v.len()) };
        env.get_byte_array_region(&data, off, s).map_err(jni_err)?;
        w.write(Bytes::from(v))
    })
}

/// Completes the file (acknowledged per its write type) and frees the writer.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_closeWriter<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    writer: jlong,
) {
    call(&mut env, |_| match free_stream::<Writer>(writer) {
        Some(mut w) => w.finish(),
        None => Ok(()),
    })
}

/// Abandons the file and frees the writer.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_locus_hadoop_LocusNative_abortWriter<'l>(_: JNIEnv<'l>, _: JClass<'l>, writer: jlong) {
    if let Some(mut w) = free_stream::<Writer>(writer) {
        w.abort();
    }
}
