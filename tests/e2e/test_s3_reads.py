"""Reads of a MinIO bucket through Locus: content, listings, stat, and bytes by source."""

from __future__ import annotations

import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from conftest import MiB, assert_one_line_error, put_object, sha256


def _upload(s3, bucket, objects: dict[str, bytes]):
    for key, data in objects.items():
        put_object(s3, bucket, key, data)


def test_mount_read_list_stat_big_object(cluster_factory, s3, bucket, minio, tmp):
    """A ~150 MiB object spanning three default 64 MiB blocks, plus small and nested ones."""
    c = cluster_factory()  # default block size: 64 MiB
    big = os.urandom(150 * MiB + 12345)
    small = b"hello locus\n"
    nested = os.urandom(100_000)
    _upload(s3, bucket, {"prefix/big.bin": big, "prefix/small.txt": small, "prefix/dir/nested.bin": nested,
                         "outside.txt": b"not under the prefix"})
    out = c.mount_s3("/data", bucket, "prefix", minio)
    assert b"/data" in out

    # Listings show exactly the objects under the prefix.
    ls = c.ok("fs", "ls", "/data").decode()
    assert re.search(rf"^\s*{len(big)}\s+-\s+/data/big\.bin$", ls, re.M), ls
    assert re.search(rf"^\s*{len(small)}\s+-\s+/data/small\.txt$", ls, re.M), ls
    assert re.search(r"^\s*-\s+d\s+/data/dir$", ls, re.M), ls
    assert "outside" not in ls and "nested" not in ls, ls
    lsr = c.ok("fs", "ls", "-R", "/data").decode()
    assert re.search(rf"^\s*{len(nested)}\s+-\s+/data/dir/nested\.bin$", lsr, re.M), lsr
    entries = {e["path"]: e for e in c.ls_json("/data", recursive=True)}
    assert set(entries) == {"/data/big.bin", "/data/small.txt", "/data/dir", "/data/dir/nested.bin"}, entries
    assert entries["/data/big.bin"]["length"] == len(big)
    assert entries["/data/big.bin"]["is_dir"] is False
    assert entries["/data/dir"]["is_dir"] is True
    assert entries["/data/dir/nested.bin"]["length"] == len(nested)
    assert entries["/data/big.bin"]["name"] == "big.bin"

    # Before any read: the file is known but not cached.
    st = c.stat("/data/big.bin")
    assert st["length"] == len(big)
    assert st["cached_fraction"] == 0.0
    assert st["block_size"] == 64 * MiB
    assert all(not b["locations"] for b in st["blocks"])

    # cat: every byte, in order.
    assert sha256(c.cat("/data/big.bin")) == sha256(big)
    assert c.cat("/data/small.txt") == small
    assert c.cat("/data/dir/nested.bin") == nested

    # get to a local file.
    local = tmp / "big.copy"
    c.ok("fs", "get", "/data/big.bin", local)
    assert local.stat().st_size == len(big)
    assert sha256(local.read_bytes()) == sha256(big)
    local.unlink()

    # head: prefixes, including one across a block boundary and one past the end.
    assert c.ok("fs", "head", "-c", "1000", "/data/big.bin") == big[:1000]
    n = 64 * MiB + 17
    assert sha256(c.ok("fs", "head", "-c", n, "/data/big.bin")) == sha256(big[:n])
    assert c.ok("fs", "head", "-c", 10**6, "/data/small.txt") == small
    assert c.ok("fs", "head", "/data/small.txt") == small  # default -c 1024

    # stat after the read: size, fingerprint, every block cached with a location.
    st = c.stat("/data/big.bin")
    etag = s3.head_object(Bucket=bucket, Key="prefix/big.bin")["ETag"].strip('"')
    assert st["length"] == len(big)
    assert st["fingerprint"], st
    assert etag in st["fingerprint"], (etag, st["fingerprint"])
    assert st["path"] == "/data/big.bin"
    assert st["mount_point"] == "/data"
    assert st["ufs_path"] == "big.bin"
    assert st["is_dir"] is False
    nblocks = math.ceil(len(big) / (64 * MiB))
    assert len(st["blocks"]) == nblocks == 3
    offset = 0
    workers = {w["id"] for w in c.report()["workers"]}
    for b in st["blocks"]:
        assert b["offset"] == offset
        assert b["length"] == min(64 * MiB, len(big) - offset)
        assert len(b["locations"]) == 1, b
        assert b["locations"][0]["tier"] == "MEM"
        assert b["locations"][0]["worker_id"] in workers
        assert b["locations"][0]["host"], b
        offset += b["length"]
    assert offset == len(big)
    assert st["cached_fraction"] == 1.0

    # Plain-text stat and the cache counters.
    text = c.ok("fs", "stat", "/data/big.bin").decode()
    assert f"size         {len(big)}" in text and "cached       100.0%" in text, text
    r = c.quiesce()
    assert r["cache"]["misses"] >= nblocks, r["cache"]
    assert r["capacity"]["MEM"]["used"] >= len(big) + len(small) + len(nested)


def test_bytes_read_by_source(cluster, s3, bucket, minio):
    c = cluster
    a = os.urandom(10 * MiB + 7)  # two 8 MiB blocks
    b = os.urandom(3 * MiB + 1)
    _upload(s3, bucket, {"p/a.bin": a, "p/b.bin": b})
    c.mount_s3("/data", bucket, "p", minio)
    keys = ("short_circuit", "local_worker", "remote_worker", "ufs")

    def base():
        r = c.counters()
        return {k: r[k] for k in keys}

    # First read: from MinIO, filled by the co-located worker, which serves it locally
    # (short-circuit once the block is filled, or over its data path).
    b0 = base()
    assert c.cat("/data/a.bin") == a
    d = c.delta(b0)
    assert d["ufs"] == len(a) and d["remote_worker"] == 0, d
    assert d["short_circuit"] + d["local_worker"] == len(a), d

    # Second read: short-circuit (the block file, read under a lease), no UFS bytes.
    b1 = base()
    hits0 = c.report()["cache"]["hits"]
    assert c.cat("/data/a.bin") == a
    d = c.delta(b1)
    assert d == {"short_circuit": len(a), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d
    assert c.report()["cache"]["hits"] >= hits0 + 2

    # --remote: the cached blocks come over the data path as from a remote worker.
    b2 = base()
    assert c.cat("/data/a.bin", "--remote") == a
    d = c.delta(b2)
    assert d == {"short_circuit": 0, "local_worker": 0, "remote_worker": len(a), "ufs": 0}, d

    # --no-short-circuit: the co-located worker serves them over TCP.
    b3 = base()
    assert c.cat("/data/a.bin", "--no-short-circuit") == a
    d = c.delta(b3)
    assert d == {"short_circuit": 0, "local_worker": len(a), "remote_worker": 0, "ufs": 0}, d

    # A fresh file read with --remote: UFS bytes, served as remote.
    b4 = base()
    assert c.cat("/data/b.bin", "--remote") == b
    d = c.delta(b4)
    assert d == {"short_circuit": 0, "local_worker": 0, "remote_worker": len(b), "ufs": len(b)}, d

    # free drops the cached blocks; the next read goes to the UFS again.
    out = c.ok("fs", "free", "/data/a.bin").decode()
    assert re.match(r"freed 2 block\(s\)", out), out
    assert c.stat("/data/a.bin")["cached_fraction"] == 0.0
    # The worker drops the blocks on its next heartbeat; only b.bin's block stays.
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 1, what="the worker to drop a.bin")
    b5 = base()
    assert c.cat("/data/a.bin") == a
    d = c.delta(b5)
    assert d["ufs"] == len(a) and d["remote_worker"] == 0, d
    assert d["short_circuit"] + d["local_worker"] == len(a), d
    assert c.stat("/data/a.bin")["cached_fraction"] == 1.0

    # Prometheus text on the status port.
    r = c.report()
    m = c.metrics()
    found = re.search(r'^locus_bytes_read_total\{source="short_circuit"\} (\d+(?:\.\d+)?(?:e\+?\d+)?)$', m, re.M)
    assert found, m[:3000]
    assert float(found.group(1)) > 0
    assert int(float(found.group(1))) == r["bytes_read"]["short_circuit"]
    for src in ("local_worker", "remote_worker", "ufs"):
        assert re.search(rf'^locus_bytes_read_total\{{source="{src}"\}} ', m, re.M), src
    hr = r["cache"]["hit_ratio"]
    assert 0 < hr < 1, r["cache"]
    assert abs(hr - r["cache"]["hits"] / (r["cache"]["hits"] + r["cache"]["misses"])) < 1e-9


def test_no_cache_read_type(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(2 * MiB + 5)
    _upload(s3, bucket, {"p/n.bin": data})
    c.mount_s3("/data", bucket, "p", minio)
    b0 = c.counters()
    assert c.cat("/data/n.bin", "--read-type", "NO_CACHE") == data
    d = c.delta(b0)
    assert d["ufs"] == len(data) and d["remote_worker"] == 0, d
    assert d["short_circuit"] + d["local_worker"] == len(data), d
    assert c.stat("/data/n.bin")["cached_fraction"] == 0.0
    assert c.report()["capacity"]["MEM"]["used"] == 0
    assert_one_line_error(c.run("fs", "--read-type", "SOMETIMES", "cat", "/data/n.bin"), 2)


def test_special_names_empty_objects_and_long_listings(cluster, s3, bucket, minio):
    c = cluster
    names = {"with space ü.txt": b"unicode", "a+b%20c.txt": b"plus", "empty": b"", "dir/x y.txt": b"nested"}
    _upload(s3, bucket, {f"p/{k}": v for k, v in names.items()})
    many = 1205  # more than one 1000-entry listing page
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"p/many/f{i:05d}", Body=str(i).encode()),
                      range(many)))
    c.mount_s3("/data", bucket, "p", minio, "60s")

    for k, v in names.items():
        assert c.cat(f"/data/{k}") == v, k
    st = c.stat("/data/empty")
    assert st["length"] == 0 and st["blocks"] == [], st
    listed = [e["name"] for e in c.ls_json("/data/many")]
    assert len(listed) == many, len(listed)
    assert listed == sorted(f"f{i:05d}" for i in range(many))
    rec = [e["path"] for e in c.ls_json("/data", recursive=True)]
    assert len(rec) == len(set(rec)), "duplicate entries in a recursive listing"
    assert len([p for p in rec if p.startswith("/data/many/")]) == many
    assert "/data/with space ü.txt" in rec and "/data/dir/x y.txt" in rec
    assert c.cat("/data/many/f01204") == b"1204"


def test_concurrent_first_reads_cost_one_ufs_read(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(24 * MiB + 1)  # 4 blocks of 8 MiB
    _upload(s3, bucket, {"p/par.bin": data})
    c.mount_s3("/data", bucket, "p", minio, "60s")
    b0 = c.counters()
    procs = [c.popen("fs", "cat", "/data/par.bin") for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert sha256(out) == sha256(data)
    d = c.delta(b0)
    assert d["ufs"] == len(data), f"4 concurrent readers should cost one UFS read of each block: {d}"
    assert d["short_circuit"] + d["local_worker"] == 4 * len(data), d


def test_output_pipe_closed_early(cluster, s3, bucket, minio):
    """`locus fs cat F | head -c 10`: the reader going away is not a cluster failure."""
    c = cluster
    data = os.urandom(20 * MiB)
    _upload(s3, bucket, {"p/f.bin": data})
    c.mount_s3("/data", bucket, "p", minio, "60s")
    for label in ("first read", "cached read"):
        p = c.popen("fs", "cat", "/data/f.bin")
        head = p.stdout.read(10)
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=60)
        assert head == data[:10]
        assert "worker" not in err and "unavailable" not in err.lower(), f"{label}: misleading error {err!r}"
        assert err == "" or err.startswith("locus: "), err
    assert sha256(c.cat("/data/f.bin")) == sha256(data)
    assert c.report()["live_workers"] == 1
