"""Metadata sync: changes made directly in MinIO show through after the sync interval."""

from __future__ import annotations

import os
import time

from conftest import MiB, assert_one_line_error, sha256

SYNC = 1.0  # --sync-interval 1s


def test_overwritten_object_is_read_again(cluster, s3, bucket, minio):
    c = cluster
    old = os.urandom(9 * MiB + 3)  # two 8 MiB blocks
    new = os.urandom(5 * MiB + 11)  # different content and size: one block
    s3.put_object(Bucket=bucket, Key="p/f.bin", Body=old)
    c.mount_s3("/data", bucket, "p", minio, "1s")

    assert sha256(c.cat("/data/f.bin")) == sha256(old)
    st_old = c.stat("/data/f.bin")
    assert st_old["cached_fraction"] == 1.0 and st_old["length"] == len(old)
    b0 = c.counters()

    s3.put_object(Bucket=bucket, Key="p/f.bin", Body=new)
    time.sleep(SYNC + 0.5)

    got = c.cat("/data/f.bin")
    assert len(got) == len(new), f"read {len(got)} bytes, object now has {len(new)} (old size {len(old)})"
    assert sha256(got) == sha256(new), "read stale bytes after the sync interval"
    d = c.delta(b0)
    assert d["ufs"] == len(new) and d["remote_worker"] == 0, d
    assert d["short_circuit"] + d["local_worker"] == len(new), d

    st = c.stat("/data/f.bin")
    assert st["length"] == len(new)
    assert st["fingerprint"] != st_old["fingerprint"]
    assert len(st["blocks"]) == 1
    assert st["cached_fraction"] == 1.0
    # The old version's blocks are gone from the namespace and, soon, from the worker.
    assert {b["id"] for b in st["blocks"]}.isdisjoint({b["id"] for b in st_old["blocks"]})
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 1, what="old blocks to be removed")
    ls = c.ls_json("/data")
    assert [(e["name"], e["length"]) for e in ls] == [("f.bin", len(new))], ls


def test_new_and_deleted_objects(cluster, s3, bucket, minio):
    c = cluster
    s3.put_object(Bucket=bucket, Key="p/keep.txt", Body=b"keep")
    s3.put_object(Bucket=bucket, Key="p/gone.txt", Body=b"gone")
    c.mount_s3("/data", bucket, "p", minio, "1s")
    assert {e["name"] for e in c.ls_json("/data")} == {"keep.txt", "gone.txt"}
    assert c.cat("/data/gone.txt") == b"gone"

    s3.delete_object(Bucket=bucket, Key="p/gone.txt")
    s3.put_object(Bucket=bucket, Key="p/added.txt", Body=b"added")
    time.sleep(SYNC + 0.5)

    assert {e["name"] for e in c.ls_json("/data")} == {"keep.txt", "added.txt"}
    assert c.cat("/data/added.txt") == b"added"
    r = c.run("fs", "cat", "/data/gone.txt")
    assert_one_line_error(r, 3)


def test_object_changed_before_the_sync_interval(cluster, s3, bucket, minio):
    """Within the sync interval Locus may serve the old metadata, but a read must give either
    the old bytes, the new bytes, or an error that says what happened: never mixed bytes,
    and never blame the (healthy) workers."""
    c = cluster
    old = os.urandom(10 * MiB + 5)
    same_size = os.urandom(len(old))
    smaller = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="p/same.bin", Body=old)
    s3.put_object(Bucket=bucket, Key="p/smaller.bin", Body=old)
    c.mount_s3("/data", bucket, "p", minio, "60s")
    assert c.stat("/data/same.bin")["length"] == len(old)  # metadata loaded, nothing cached
    assert c.stat("/data/smaller.bin")["length"] == len(old)
    s3.put_object(Bucket=bucket, Key="p/same.bin", Body=same_size)
    s3.put_object(Bucket=bucket, Key="p/smaller.bin", Body=smaller)

    for path, new in (("/data/same.bin", same_size), ("/data/smaller.bin", smaller)):
        r = c.run("fs", "cat", path)
        if r.returncode == 0:
            assert r.stdout in (old, new), f"{path}: mixed or truncated bytes ({len(r.stdout)} bytes)"
        else:
            msg = assert_one_line_error(r)
            assert r.returncode != 7 and "no live workers" not in msg, \
                f"{path}: a changed UFS object is reported as a cluster outage: {msg!r}"
    assert c.alive() and c.report()["live_workers"] == 1
