"""The ``locus://`` filesystem for fsspec (and so for pandas, PyArrow, Dask, Ray...).

Every call is one call of the native client (``locus._native``); this module only
shapes arguments and answers the way fsspec expects them. Paths are Locus paths:
``locus:///a/b`` and ``locus://HOST:PORT/a/b`` both name ``/a/b``; ``HOST:PORT`` names
the master (else the ``master`` keyword, ``LOCUS_MASTER``, or 127.0.0.1:19998).
"""

from __future__ import annotations

import datetime
import os

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import isfilelike, stringify_path

from . import _native

#: Bytes per piece of a copy, a ``get`` or a ``put``.
CHUNK = 8 << 20


class LocusFileSystem(AbstractFileSystem):
    """Files and directories of a Locus cluster.

    Keywords: ``master`` (``host:port`` of the master's RPC), ``config_file``,
    ``token_file``, ``ca_file`` (as for ``locus``), and ``write_type`` (the default of
    files written through this instance: ``MUST_CACHE``, ``CACHE_THROUGH``, ``THROUGH``
    or ``ASYNC_THROUGH``; else the mount's or the cluster's).

    Besides fsspec's calls: ``stat`` (``info`` with ``cached_fraction`` and
    ``persist_state``), ``load`` and ``free``, ``pin``, and near the data ``compute``
    (operators on the workers) and ``search`` (metadata search).
    """

    protocol = "locus"
    root_marker = "/"
    #: Reads and writes of a file go through buffers of this size.
    blocksize = 8 << 20

    def __init__(self, master=None, config_file=None, token_file=None, ca_file=None, write_type=None, **kwargs):
        super().__init__(**kwargs)
        self.client = _native.Client(master=master, config_file=config_file, token_file=token_file, ca_file=ca_file)
        self.write_type = write_type

    # ---------------------------------------------------------------- paths

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("locus://"):
            rest = path[len("locus://") :]
            slash = rest.find("/")
            path = rest[slash:] if slash >= 0 else "/"
        elif path.startswith("locus::"):
            path = path[len("locus::") :]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        path = stringify_path(path)
        if path.startswith("locus://"):
            host = path[len("locus://") :].split("/", 1)[0]
            if host:
                return {"master": host}
        return {}

    def unstrip_protocol(self, name):
        return "locus://" + self._strip_protocol(name)

    # ---------------------------------------------------------------- metadata

    def info(self, path, **kwargs):
        return self.client.stat(self._strip_protocol(path))

    #: ``info`` with Locus's attributes (they are always there).
    stat = info

    def ls(self, path, detail=True, **kwargs):
        entries = self.client.ls(self._strip_protocol(path))
        return entries if detail else [e["name"] for e in entries]

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        path = self._strip_protocol(path)
        try:
            top = self.client.stat(path)
        except FileNotFoundError:
            return {} if detail else []
        if top["type"] == "file":
            out = {path: top}
        else:
            out = {e["name"]: e for e in self.client.ls(path, recursive=True) if withdirs or e["type"] == "file"}
            if withdirs:
                out[path] = top
        out = dict(sorted(out.items()))
        return out if detail else list(out)

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def created(self, path):
        return self.modified(path)

    def ukey(self, path):
        return self.info(path)["fingerprint"]

    def checksum(self, path):
        return int(self.ukey(path).encode().hex()[:16] or "0", 16)

    # ---------------------------------------------------------------- namespace

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if not create_parents and self.exists(path):
            raise FileExistsError(path)
        self.client.mkdir(path, parents=create_parents)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if not exist_ok and self.exists(path):
            raise FileExistsError(path)
        self.client.mkdir(path, parents=True)

    def rmdir(self, path):
        path = self._strip_protocol(path)
        if not self.isdir(path):
            raise NotADirectoryError(path)
        self.client.rm(path, recursive=False)

    def _rm(self, path):
        self.client.rm(self._strip_protocol(path), recursive=False)

    def rm(self, path, recursive=False, maxdepth=None):
        if maxdepth is not None:
            return super().rm(path, recursive=recursive, maxdepth=maxdepth)
        for p in [path] if isinstance(path, str) else path:
            self.client.rm(self._strip_protocol(p), recursive=recursive)

    def rm_file(self, path):
        self._rm(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        self.client.mv(self._strip_protocol(path1), self._strip_protocol(path2))

    def cp_file(self, path1, path2, **kwargs):
        try:
            src = self.client.open(self._strip_protocol(path1))
        except IsADirectoryError:
            # A directory met by a recursive copy is made at the target, as fsspec's local
            # filesystem does (its files come as calls of their own).
            self.makedirs(path2, exist_ok=True)
            return
        with _Writing(self.client, self._strip_protocol(path2), True, self.write_type) as w:
            _copy_out(src, w.write)

    # ---------------------------------------------------------------- bytes

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if not autocommit:
            raise NotImplementedError("locus:// writes are committed on close (no transactions)")
        return LocusFile(self, self._strip_protocol(path), mode, block_size=block_size, cache_options=cache_options, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        r = self.client.open(self._strip_protocol(path))
        size = r.size
        start = 0 if start is None else (max(size + start, 0) if start < 0 else min(start, size))
        end = size if end is None else (max(size + end, 0) if end < 0 else min(end, size))
        return r.read(start, max(end - start, 0))

    def pipe_file(self, path, value, mode="overwrite", write_type=None, **kwargs):
        path = self._strip_protocol(path)
        with _Writing(self.client, path, mode == "overwrite", write_type or self.write_type) as w:
            w.write(value)

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", write_type=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        size = os.path.getsize(lpath)
        if callback is not None:
            callback.set_size(size)
        with _Writing(self.client, rpath, mode == "overwrite", write_type or self.write_type) as w:
            with open(lpath, "rb") as f:
                while data := f.read(CHUNK):
                    w.write(data)
                    if callback is not None:
                        callback.relative_update(len(data))

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        r = self.client.open(rpath)
        if callback is not None:
            callback.set_size(r.size)
        if outfile is None and isfilelike(lpath):  # a file-like target, as fsspec allows
            outfile = lpath
        if outfile is None:
            # As fsspec's own get_file: the local parent directories are made.
            parent = os.path.dirname(os.fspath(lpath))
            if parent:
                os.makedirs(parent, exist_ok=True)
        out = outfile if outfile is not None else open(lpath, "wb")
        try:
            _copy_out(r, out.write, callback)
        finally:
            if outfile is None:
                out.close()

    # ---------------------------------------------------------------- Locus's own

    def load(self, path):
        """Fill the cache with ``path`` (a directory: every file under it). Returns bytes."""
        return self.client.load(self._strip_protocol(path))

    def free(self, path, recursive=False):
        """Drop the cached blocks of ``path`` (persisted, unpinned files)."""
        return self.client.free(self._strip_protocol(path), recursive=recursive)

    def pin(self, path, pinned=True, recursive=False):
        """Keep ``path`` in the cache (or release it, ``pinned=False``)."""
        return self.client.pin(self._strip_protocol(path), pinned=pinned, recursive=recursive)

    # ---------------------------------------------------------------- near the data

    def compute(self, ops, path, **kwargs):
        """Run operators on the workers that hold the blocks (``locus fs compute``):
        ``fs.compute("stats,stddev", "/logs/", columns="c0..c3")``. ``path`` is a file, a
        directory, a glob, or a list of them; keywords: ``columns``, ``text_column``,
        ``k``, ``m``, ``delimiter``, ``quote``, ``quoting``, ``header``,
        ``parallelism``. Returns the results as a dict."""
        paths = [path] if isinstance(path, str) else list(path)
        return self.client.compute(ops, [self._strip_protocol(p) for p in paths], **kwargs)

    def search(self, path, query, limit=None):
        """The files under ``path`` whose metadata matches ``query`` (``locus fs search``:
        ``"size > 1000000 AND tag.project = 'p1'"``), in key order, page after page (up
        to ``limit``). Each is ``stat``'s dict plus ``key``, ``cached`` and ``tier``."""
        after, left = "", limit
        while left is None or left > 0:
            page = self.client.search(self._strip_protocol(path), query, limit=1000 if left is None else min(left, 1000),
                                      after=after)
            yield from page["hits"]
            if left is not None:
                left -= len(page["hits"])
            if not page["truncated"]:
                return
            after = page["next_after"]


class _Writing:
    """A native writer as a context: closed (the file completed) at the end of the block,
    abandoned if the block raised."""

    def __init__(self, client, path, overwrite, write_type):
        self.w = client.create(path, overwrite=overwrite, write_type=write_type)

    def __enter__(self):
        return self.w

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.w.close()
        else:
            self.w.abort()
        return False


def _copy_out(reader, write, callback=None):
    """Every byte of a native reader, in pieces of CHUNK, to ``write``."""
    pos = 0
    while pos < reader.size:
        data = reader.read(pos, CHUNK)
        write(data)
        pos += len(data)
        if callback is not None:
            callback.relative_update(len(data))


class LocusFile(AbstractBufferedFile):
    """A file of a :class:`LocusFileSystem`: ``rb`` (seekable, ranged reads; a read of a
    block or more goes straight into the bytes returned), ``wb`` and ``xb`` (through the
    write pipeline; ``write_type=`` as an ``open`` option)."""

    DEFAULT_BLOCK_SIZE = LocusFileSystem.blocksize

    def __init__(self, fs, path, mode="rb", block_size=None, cache_options=None, write_type=None, **kwargs):
        self._reader = None
        self._writer = None
        #: The file mapped from the cache (``read_buffer``): None before the first
        #: try, False when it cannot be.
        self._map = None
        self.write_type = write_type or fs.write_type
        size = None
        if mode == "rb":
            self._reader = fs.client.open(path)
            size = self._reader.size
        elif mode == "ab":
            raise NotImplementedError("locus:// files cannot be appended to")
        elif mode == "xb" and fs.exists(path):
            raise FileExistsError(path)
        super().__init__(
            fs, path, mode, block_size=block_size or "default", cache_options=cache_options, size=size, **kwargs
        )
        if self._reader is not None:
            self._details = self._reader.info()

    def _fetch_range(self, start, end):
        return self._reader.read(start, max(end - start, 0))

    def read(self, length=-1):
        length = -1 if length is None else int(length)
        if self.mode == "rb" and not self.closed:
            if length < 0:
                length = self.size - self.loc
            if length >= self.blocksize:
                # Large reads skip the read-ahead buffer: one native read into the answer.
                data = self._reader.read(self.loc, length)
                self.loc += len(data)
                return data
        return super().read(length)

    def read_buffer(self, nbytes=-1):
        """Up to ``nbytes`` bytes from the current position (all that is left when
        negative) as a read-only buffer. PyArrow's ``PythonFile`` reads through this when
        it is there. A file cached on this host is mapped from the worker's block files
        on the first call (``Reader.map``), and each answer is a ``memoryview`` into that
        mapping: no copy, so PyArrow's threads decode while the file's lock is free. Else
        the bytes are read as ``read`` does."""
        if self.mode != "rb" or self.closed:
            return self.read(nbytes)
        if self._map is None:
            m = self._reader.map()
            self._map = memoryview(m) if m is not None else False
        if self._map is False:
            return self.read(nbytes)
        start = min(self.loc, self.size)
        end = self.size if nbytes is None or nbytes < 0 else min(start + int(nbytes), self.size)
        self.loc = end
        return self._map[start:end]

    def readinto(self, b):
        """Reads into the writable bytes-like ``b`` straight from the native client (no
        read-ahead buffer). Returns the bytes read."""
        if self.mode != "rb" or self.closed:
            return super().readinto(b)
        # Signed bytes (format "b": NumPy int8, a PyArrow buffer) are taken as unsigned.
        n = self._reader.read_into(self.loc, memoryview(b).cast("B"))
        self.loc += n
        return n

    def write(self, data):
        """Appends ``data``; it goes straight to the native writer, which gathers it into
        chunks (fsspec's own buffer would copy every byte once more)."""
        if self.mode not in ("wb", "xb") or self.closed or self.forced:
            return super().write(data)  # the error fsspec gives
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
        if self.offset is None:
            self.offset = 0
            try:
                self._initiate_upload()
            except BaseException:
                self.closed = True
                raise
        n = self._writer.write(mv)
        self.loc += n
        self.offset += n
        return n

    def _initiate_upload(self):
        self._writer = self.fs.client.create(self.path, overwrite=(self.mode == "wb"), write_type=self.write_type)

    def _upload_chunk(self, final=False):
        # `write` hands every byte to the native writer, so fsspec's buffer stays empty:
        # its last flush only completes the file.
        if final:
            self._writer.close()
        return True

    def __exit__(self, exc_type, exc, tb):
        # A `with` block that raised leaves no file (the write is abandoned, not completed
        # with what it got).
        if exc_type is not None and self.mode != "rb" and not self.closed:
            self.discard()
            self.closed = True
            return False
        return super().__exit__(exc_type, exc, tb)

    def discard(self):
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def close(self):
        if self.closed:
            return
        # The mapping stays while a buffer read from it lives (PyArrow's arrays may).
        self._map = False
        try:
            super().close()
        except BaseException:
            self.discard()
            raise
