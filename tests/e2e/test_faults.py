"""Faults: the UFS goes away, a worker restarts, the whole process is killed."""

from __future__ import annotations

import os
import time

from conftest import MiB, assert_one_line_error, sha256


def test_ufs_outage_and_return(cluster, own_minio):
    m, endpoint, s3 = own_minio, own_minio.endpoint, own_minio.s3
    s3.create_bucket(Bucket="outage")
    cached, uncached = os.urandom(3 * MiB + 1), os.urandom(2 * MiB + 7)
    s3.put_object(Bucket="outage", Key="p/cached.bin", Body=cached)
    s3.put_object(Bucket="outage", Key="p/uncached.bin", Body=uncached)
    c = cluster
    c.mount_s3("/o", "outage", "p", endpoint, "60s")
    assert sha256(c.cat("/o/cached.bin")) == sha256(cached)
    assert c.stat("/o/uncached.bin")["cached_fraction"] == 0.0

    m.stop()
    # Cached data is still served; uncached data fails cleanly and quickly.
    assert sha256(c.cat("/o/cached.bin")) == sha256(cached)
    t0 = time.monotonic()
    r = c.run("fs", "cat", "/o/uncached.bin", timeout=120)
    assert_one_line_error(r)
    assert time.monotonic() - t0 < 60, "a UFS outage should fail a read within the UFS timeout"
    assert r.stdout == b"" or uncached.startswith(r.stdout)
    r = c.run("fs", "load", "/o/uncached.bin", timeout=120)
    assert_one_line_error(r)
    assert c.alive() and c.report()["live_workers"] == 1

    m.start()
    assert sha256(c.cat("/o/uncached.bin")) == sha256(uncached)
    assert c.stat("/o/uncached.bin")["cached_fraction"] == 1.0


def test_standalone_worker_restart(standalone_factory, s3, bucket, minio):
    s = standalone_factory(root_ufs="none")
    data = os.urandom(5 * MiB + 3)
    s3.put_object(Bucket=bucket, Key="w/f.bin", Body=data)
    s.mount_s3("/s3", bucket, "w", minio, "60s")
    assert sha256(s.cat("/s3/f.bin")) == sha256(data)
    worker_id = s.report()["workers"][0]["id"]

    assert s.stop_worker() == 0, "the worker should exit 0 on SIGTERM"
    r = s.run("fs", "cat", "/s3/f.bin", timeout=120)
    assert_one_line_error(r, 7)
    assert s.master_proc.poll() is None

    s.start_worker()
    r = s.report()
    assert [w["id"] for w in r["workers"] if w["live"]] == [worker_id], r["workers"]
    st = s.stat("/s3/f.bin")
    assert st["cached_fraction"] == 1.0, "MEM blocks in /dev/shm should be reported again"
    b0 = s.counters()
    assert sha256(s.cat("/s3/f.bin")) == sha256(data)
    d = s.delta(b0)
    assert d == {"short_circuit": len(data), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d


def test_sigkill_and_restart(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(4 * MiB + 9)
    s3.put_object(Bucket=bucket, Key="k/f.bin", Body=data)
    c.mount_s3("/data", bucket, "k", minio, "60s")
    c.ok("fs", "put", "-", "/local/x.txt", input=b"x")
    assert sha256(c.cat("/data/f.bin")) == sha256(data)
    c.kill()
    c.start()
    assert sorted(m["path"] for m in c.report()["mounts"]) == ["/", "/data"]
    assert [e["path"] for e in c.ls_json("/data")] == ["/data/f.bin"]
    assert c.cat("/local/x.txt") == b"x"
    assert sha256(c.cat("/data/f.bin")) == sha256(data)
    c.ok("fs", "put", "-", "/local/y.txt", input=b"y")
    assert c.cat("/local/y.txt") == b"y"
