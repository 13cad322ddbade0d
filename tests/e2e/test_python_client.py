"""The Python client (the `locus` wheel: the pyo3 binding and its `locus://` fsspec
filesystem) against a real cluster and MinIO: fsspec's calls, pandas and PyArrow on
`locus://` paths, the errors Python code expects, threads, fork, and reads that go
short-circuit."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import MiB, sha256

locus = pytest.importorskip("locus", reason="the locus wheel is not installed (scripts/build-python-client)")
fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def fs(cluster, monkeypatch):
    """A LocusFileSystem of `cluster`, found the way users find it: LOCUS_MASTER and the
    token file from the environment."""
    monkeypatch.setenv("LOCUS_MASTER", cluster.master)
    monkeypatch.setenv("LOCUS_SECURITY__TOKEN_FILE", str(cluster.token_file))
    fsspec.config.conf.clear()
    return fsspec.filesystem("locus", skip_instance_cache=True)


def test_registered_for_the_locus_protocol(fs, cluster):
    assert type(fs).__name__ == "LocusFileSystem" and fs.client.master == cluster.master
    # The URL's host:port names the master.
    from locus.fsspec import LocusFileSystem
    assert LocusFileSystem._get_kwargs_from_urls(f"locus://{cluster.master}/a/b") == {"master": cluster.master}
    assert LocusFileSystem._strip_protocol(f"locus://{cluster.master}/a/b/") == "/a/b"
    assert LocusFileSystem._strip_protocol("locus:///a/b") == "/a/b"
    fs.pipe_file("/reg/x.txt", b"via url")
    with fsspec.open(f"locus://{cluster.master}/reg/x.txt", "rb") as f:
        assert f.read() == b"via url"


def test_files_and_directories(fs, cluster, tmp):
    data = os.urandom(3 * 8 * MiB + 12345)  # over three 8 MiB blocks
    fs.pipe_file("locus:///d/a.bin", data)
    fs.pipe_file("/d/sub/b.txt", b"hello")
    fs.makedirs("/d/empty", exist_ok=True)

    info = fs.info("/d/a.bin")
    assert (info["name"], info["size"], info["type"]) == ("/d/a.bin", len(data), "file")
    assert info["persist_state"] in ("PERSISTED", "TO_BE_PERSISTED", "NOT_PERSISTED")
    assert 0.0 <= info["cached_fraction"] <= 1.0
    assert fs.info("/d")["type"] == "directory"
    assert sorted(fs.ls("/d", detail=False)) == ["/d/a.bin", "/d/empty", "/d/sub"]
    assert fs.find("/d") == ["/d/a.bin", "/d/sub/b.txt"]
    assert fs.find("/d", withdirs=True) == ["/d", "/d/a.bin", "/d/empty", "/d/sub", "/d/sub/b.txt"]
    assert fs.glob("/d/*.bin") == ["/d/a.bin"]
    assert fs.glob("/d/**/*.txt") == ["/d/sub/b.txt"]
    assert fs.exists("/d/a.bin") and not fs.exists("/d/nope")
    assert fs.isdir("/d/sub") and not fs.isdir("/d/a.bin")
    assert fs.isfile("/d/a.bin") and not fs.isfile("/d/sub")
    assert fs.cat_file("/d/a.bin") == data
    assert fs.cat_file("/d/a.bin", start=8 * MiB - 5, end=8 * MiB + 5) == data[8 * MiB - 5:8 * MiB + 5]
    assert fs.cat_file("/d/a.bin", start=-10) == data[-10:]
    assert fs.cat_ranges(["/d/a.bin", "/d/sub/b.txt"], [1, 0], [4, 5]) == [data[1:4], b"hello"]

    # Seekable reads, small and large (a large one bypasses the read-ahead buffer).
    with fs.open("/d/a.bin", "rb") as f:
        assert f.seekable() and f.size == len(data)
        f.seek(100)
        assert f.read(10) == data[100:110]
        assert f.read(20 * MiB) == data[110:110 + 20 * MiB]
        f.seek(-7, io.SEEK_END)
        assert f.read() == data[-7:]
        assert f.read(5) == b""
        buf = bytearray(1000)
        f.seek(5)
        assert f.readinto(buf) == 1000 and bytes(buf) == data[5:1005]
        # readinto fills any writable buffer straight from the client, across blocks (one
        # of 16 MiB or more is read in two halves side by side), and stops at the end of
        # the file; a read-only one is refused.
        big = bytearray(17 * MiB)
        f.seek(5 * MiB - 3)
        assert f.readinto(big) == 17 * MiB and big == data[5 * MiB - 3:22 * MiB - 3]
        assert f.tell() == 22 * MiB - 3
        import numpy as np
        arr = np.zeros(100, dtype=np.int8)  # signed bytes, format "b"
        f.seek(len(data) - 40)
        assert f.readinto(arr) == 40 and arr[:40].tobytes() == data[-40:]
        assert f.readinto(arr) == 0
        with pytest.raises(ValueError, match="writable"):
            f.readinto(b"read-only bytes")

    # Writes in pieces, with a write type.
    with fs.open("/d/w.bin", "wb", write_type="MUST_CACHE", block_size=5 * MiB) as f:
        for i in range(0, len(data), 3 * MiB + 1):
            f.write(data[i:i + 3 * MiB + 1])
    assert sha256(fs.cat_file("/d/w.bin")) == sha256(data)
    assert fs.info("/d/w.bin")["persist_state"] == "NOT_PERSISTED"
    # A write that fails half-way leaves nothing.
    with pytest.raises(RuntimeError):
        with fs.open("/d/half.bin", "wb") as f:
            f.write(b"x" * (9 * MiB))
            raise RuntimeError("stop")
    assert not fs.exists("/d/half.bin")

    # put, get, copy, move, remove.
    local = tmp / "local.bin"
    local.write_bytes(data[:MiB])
    fs.put(str(local), "/d/put.bin")
    assert fs.cat_file("/d/put.bin") == data[:MiB]
    fs.get("/d/put.bin", str(tmp / "got.bin"))
    assert (tmp / "got.bin").read_bytes() == data[:MiB]
    fs.copy("/d/put.bin", "/d/copy.bin")
    assert fs.cat_file("/d/copy.bin") == data[:MiB]
    fs.mv("/d/copy.bin", "/d/moved.bin")
    assert not fs.exists("/d/copy.bin") and fs.cat_file("/d/moved.bin") == data[:MiB]
    fs.rm("/d/moved.bin")
    assert not fs.exists("/d/moved.bin")
    fs.rm("/d", recursive=True)
    assert not fs.exists("/d")
    # And the cluster agrees.
    assert cluster.run("fs", "stat", "/d").returncode == 3


def test_errors_are_the_python_exceptions(fs, cluster, s3, bucket, minio):
    fs.pipe_file("/e/f.txt", b"f")
    with pytest.raises(FileNotFoundError):
        fs.info("/e/nope")
    with pytest.raises(FileNotFoundError):
        fs.open("/e/nope", "rb")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("/nope/at/all")
    with pytest.raises(FileExistsError):
        fs.makedirs("/e", exist_ok=False)
    with pytest.raises(FileExistsError):
        fs.open("/e/f.txt", "xb")
    with pytest.raises(IsADirectoryError):
        fs.open("/e", "rb")
    with pytest.raises(NotADirectoryError):
        fs.pipe_file("/e/f.txt/under", b"x")
    with pytest.raises(OSError) as ei:
        fs.rm("/e")  # not empty, not recursive
    assert ei.value.errno == 39 and "/e" in str(ei.value)  # ENOTEMPTY
    with pytest.raises(ValueError):
        fs.open("/e/w.bin", "wb", write_type="SOMETIMES").close()
    # A read-only mount refuses writes with PermissionError.
    s3.put_object(Bucket=bucket, Key="ro/x.txt", Body=b"ro")
    cluster.mount_s3("/ro", bucket, "ro", minio, "1s", "--readonly")
    assert fs.cat_file("/ro/x.txt") == b"ro"
    with pytest.raises(PermissionError):
        fs.pipe_file("/ro/y.txt", b"no")
    with pytest.raises(PermissionError):
        fs.rm("/ro/x.txt")
    # A master that is not there: a clear OSError, not a hang.
    from locus import Client
    with pytest.raises(OSError) as ei:
        Client(master="127.0.0.1:1", token_file=str(cluster.token_file)).stat("/")
    assert "127.0.0.1:1" in str(ei.value)


def test_pandas_and_pyarrow(fs, cluster, tmp):
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ds = pytest.importorskip("pyarrow.dataset")
    df = pd.DataFrame({"sensor": [f"s{i % 7}" for i in range(50_000)], "v": [i * 0.5 for i in range(50_000)]})

    df.to_csv("locus:///pd/x.csv", index=False)
    back = pd.read_csv("locus:///pd/x.csv")
    pd.testing.assert_frame_equal(back, df)

    df.to_parquet("locus:///pd/x.parquet", row_group_size=10_000)
    pd.testing.assert_frame_equal(pd.read_parquet("locus:///pd/x.parquet"), df)
    t = pq.read_table("/pd/x.parquet", filesystem=fs)
    assert t.num_rows == len(df) and t.column("v").to_pylist() == df["v"].tolist()
    # A dataset over several files, with a filter pushed into the scan.
    for i in range(3):
        pq.write_table(pa.table({"k": list(range(i * 100, i * 100 + 100))}), f"/pd/ds/part-{i}.parquet", filesystem=fs)
    d = ds.dataset("/pd/ds", filesystem=fs, format="parquet")
    assert d.count_rows() == 300
    assert sorted(d.to_table(filter=ds.field("k") >= 250).column("k").to_pylist()) == list(range(250, 300))


def test_threads_read_at_once_and_short_circuit(fs, cluster):
    data = os.urandom(4 * 8 * MiB)
    fs.pipe_file("/t/big.bin", data)
    fs.load("/t/big.bin")
    assert fs.stat("/t/big.bin")["cached_fraction"] == 1.0
    r = fs.client.open("/t/big.bin")
    ranges = [(off, 3 * MiB + 17) for off in range(0, len(data) - 4 * MiB, 997 * 1024)]
    base = cluster.counters()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda a: r.read(*a), ranges))
    for (off, n), g in zip(ranges, got):
        assert g == data[off:off + n], off
    # A reader's leases end with it: the worker counts what was read under them then.
    del r
    import gc
    gc.collect()
    d = cluster.delta(base)
    total = sum(n for _, n in ranges)
    # Every byte came from the co-located worker's block files.
    assert d == {"short_circuit": total, "local_worker": 0, "remote_worker": 0, "ufs": 0}, d


def test_cached_files_are_mapped_without_a_copy(fs, cluster):
    import gc

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    # Four 8 MiB blocks, the last one short (and not a whole number of pages).
    data = os.urandom(3 * 8 * MiB + 12345)
    # Persisted at once (so it can be freed below), in writes of many sizes.
    with fs.open("/m/a.bin", "wb", write_type="CACHE_THROUGH") as f:
        at = 0
        for n in (1, 4095, 10 * MiB, 3, 9 * MiB):
            assert f.write(data[at:at + n]) == n
            at += n
        f.write(memoryview(data)[at:])
    assert fs.cat_file("/m/a.bin") == data
    # Buffers of wider items are written as their bytes.
    import array

    ints = array.array("i", range(1000))
    with fs.open("/m/ints.bin", "wb") as f:
        assert f.write(ints) == len(ints.tobytes())
    assert fs.cat_file("/m/ints.bin") == ints.tobytes()
    fs.load("/m/a.bin")
    with fs.open("/m/a.bin", "rb") as f:
        f.seek(5)
        v = f.read_buffer(10 * MiB)
        # A view into the mapped block files, across a block boundary: no copy.
        assert isinstance(v, memoryview) and v.readonly
        assert bytes(v) == data[5:5 + 10 * MiB] and f.tell() == 5 + 10 * MiB
        assert bytes(f.read_buffer(-1)) == data[5 + 10 * MiB:]
        assert bytes(f.read_buffer(10)) == b""
    with pytest.raises(TypeError):
        v[0] = 1
    # The file freed (its blocks dropped from the cache) while a view lives: the view
    # still reads the bytes it was given.
    fs.free("/m/a.bin")
    assert bytes(v[-100:]) == data[5 + 10 * MiB - 100:5 + 10 * MiB]
    del v
    gc.collect()
    # Not cached on this host: read_buffer reads as read does.
    with fs.open("/m/a.bin", "rb") as f:
        got = f.read_buffer(3 * MiB)
        assert isinstance(got, bytes) and got == data[:3 * MiB]

    # PyArrow reads a cached Parquet file through the mapping: the same table, and every
    # byte short-circuit (a mapping counts its file when its leases end).
    t = pa.table({"x": list(range(600_000)), "s": [f"v{i}" for i in range(600_000)]})
    pq.write_table(t, "/m/t.parquet", filesystem=fs, compression="none")
    fs.load("/m/t.parquet")
    size = fs.size("/m/t.parquet")
    assert size > 8 * MiB
    base = cluster.counters()
    back = pq.read_table("/m/t.parquet", filesystem=fs)
    assert back.equals(t)
    del back
    gc.collect()
    d = cluster.delta(base)
    # Whole mappings (PyArrow opens the file twice: its footer, then the row groups), and
    # nothing read another way.
    sc = d.pop("short_circuit")
    assert sc in (size, 2 * size) and d == {"local_worker": 0, "remote_worker": 0, "ufs": 0}, (sc, size, d)


def test_writes_go_short_circuit(fs, cluster):
    """A cached write with one copy to the co-located worker (MUST_CACHE; ASYNC_THROUGH,
    the cluster having one worker) is written into the block files by this process: every
    byte counts as short-circuit, none crosses a socket, and the file reads back whole,
    ending on a block boundary or not. A write that goes to the UFS at once
    (CACHE_THROUGH) goes over the data path."""
    base = cluster.quiesce()["bytes_written"]
    sizes = {"MUST_CACHE": 2 * 8 * MiB, "ASYNC_THROUGH": 2 * 8 * MiB + 12345}
    for wt, n in sizes.items():
        data = os.urandom(n)
        with fs.open(f"/w/{wt}.bin", "wb", write_type=wt) as f:
            for at in range(0, n, 3 * MiB + 1):
                f.write(data[at:at + 3 * MiB + 1])
        assert fs.cat_file(f"/w/{wt}.bin") == data, wt
        assert fs.size(f"/w/{wt}.bin") == n
    now = cluster.quiesce()["bytes_written"]
    assert now["short_circuit"] - base["short_circuit"] == sum(sizes.values()), (base, now)
    assert now["data_path"] == base["data_path"], (base, now)
    fs.pipe_file("/w/through.bin", b"x" * 1000, write_type="CACHE_THROUGH")
    assert fs.cat_file("/w/through.bin") == b"x" * 1000
    after = cluster.quiesce()["bytes_written"]
    assert after["data_path"] - now["data_path"] == 1000 and after["short_circuit"] == now["short_circuit"]


def test_fork(fs, cluster):
    fs.pipe_file("/f/x.bin", b"before fork")
    r = fs.client.open("/f/x.bin")
    assert r.read(0, 6) == b"before"
    code = (
        "import os, sys, locus\n"
        "c = locus.Client()\n"
        "r = c.open('/f/x.bin')\n"
        "assert r.read(0, 6) == b'before'\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = r.read(0, 11) == b'before fork' and c.stat('/f/x.bin')['size'] == 11\n"
        "    w = c.create('/f/child.bin'); w.write(b'from the child'); w.close()\n"
        "    os._exit(0 if ok else 3)\n"
        "_, st = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(st) == 0, st\n"
        # A child that collects a parent's client (PySpark starts Java with a preexec_fn,
        # which runs Python in the forked child) must not wait for the parent's threads.
        "import gc, subprocess\n"
        "spare = [locus.Client() for _ in range(3)]\n"
        "spare[0].stat('/f/x.bin')\n"
        "def drop_them():\n"
        "    spare.clear(); gc.collect()\n"
        "p = subprocess.run(['true'], preexec_fn=drop_them, timeout=20)\n"
        "assert p.returncode == 0\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    del c, r; spare.clear(); gc.collect(); os._exit(0)\n"
        "_, st = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(st) == 0, st\n"
        "assert c.open('/f/child.bin').read(0, 100) == b'from the child'\n"
        "print('ok')\n"
    )
    env = dict(os.environ, LOCUS_MASTER=cluster.master, LOCUS_SECURITY__TOKEN_FILE=str(cluster.token_file))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=90)
    assert p.returncode == 0 and p.stdout.strip() == b"ok", p.stderr.decode()[-2000:]
    assert fs.cat_file("/f/child.bin") == b"from the child"


def test_compute_and_search_from_python(fs, cluster):
    """`compute` runs the operators on the workers (the same answers as plain Python over
    the same text, every row counted once across 8 MiB blocks) and `search` finds files
    by their metadata, page after page; bad input is a ValueError."""
    import random

    rnd = random.Random(5)
    rows = [(i, rnd.uniform(-100, 100), rnd.randint(0, 9)) for i in range(400_000)]
    text = "id,x,y\n" + "".join(f"{i},{x!r},{y}\n" for i, x, y in rows)
    assert len(text) > 8 * MiB  # more than one block
    fs.pipe_file("/calc/a.csv", text.encode())
    r = fs.compute("count,stats", "locus:///calc/a.csv", columns="x,y")
    assert r["rows"] == len(rows) and r["count"] == {"lines": len(rows) + 1, "rows": len(rows)}, r
    xs = [x for _, x, _ in rows]
    sx = r["stats"]["x"]
    assert sx["count"] == len(xs)
    assert abs(sx["sum"] - sum(xs)) <= 1e-9 * sum(abs(x) for x in xs), sx
    assert (sx["min"], sx["max"]) == (min(xs), max(xs))
    assert r["stats"]["y"]["sum"] == sum(y for _, _, y in rows)
    with pytest.raises(ValueError):
        fs.compute("nonsense", "/calc/a.csv")
    with pytest.raises(FileNotFoundError):
        fs.compute("count", "/calc/none.csv")

    for i in range(1500):
        fs.pipe_file(f"/found/f{i:04d}.bin", b"x" * (i % 7))
    hits = list(fs.search("/found", "size > 5"))
    want = [f"f{i:04d}.bin" for i in range(1500) if i % 7 > 5]
    assert [h["key"].rsplit("/", 1)[-1] for h in hits] == want
    assert all(h["size"] == 6 and h["type"] == "file" for h in hits)
    assert len(list(fs.search("/found", "size >= 0", limit=1200))) == 1200  # two pages
    with pytest.raises(ValueError):
        list(fs.search("/found", "size >>> 3"))
