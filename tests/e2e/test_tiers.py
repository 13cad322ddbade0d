"""Tiered storage (MEM over SSD) and clusters of several workers."""

from __future__ import annotations

import os
import uuid
from collections import Counter

from conftest import MiB, sha256


def test_mem_evicts_down_to_ssd(cluster_factory, s3, bucket, minio, tmp):
    shm = f"/dev/shm/locus-e2e-{uuid.uuid4().hex[:12]}"
    ssd = tmp / "ssd"
    c = cluster_factory(args=["--tier", f"MEM:{shm}:16MiB", "--tier", f"SSD:{ssd}:1GiB", "--block-size", "4MiB"],
                        shm_dirs=[shm])
    cap = c.report()["capacity"]
    assert cap["MEM"]["capacity"] == 16 * MiB and cap["SSD"]["capacity"] == 1 << 30, cap
    data = os.urandom(40 * MiB + 1)  # 11 blocks, 2.5 times the MEM quota
    s3.put_object(Bucket=bucket, Key="p/t.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")

    c.ok("fs", "load", "/data/t.bin")
    st = c.stat("/data/t.bin")
    assert st["cached_fraction"] == 1.0, st
    tiers = Counter(x["tier"] for b in st["blocks"] for x in b["locations"])
    assert sum(tiers.values()) == len(st["blocks"]) == 11, tiers
    assert tiers["MEM"] > 0 and tiers["SSD"] > 0, tiers
    # The report's tier usage comes with the workers' heartbeats, so it may lag the block
    # locations `stat` shows: wait for a report that has every block on a tier.
    r = c.wait_report(lambda r: r["cache"]["evictions"] > 0 and r["capacity"]["SSD"]["used"] > 0
                      and r["capacity"]["MEM"]["used"] + r["capacity"]["SSD"]["used"] == len(data),
                      what="demotions to SSD, every block on a tier")
    assert r["capacity"]["MEM"]["used"] <= 16 * MiB, r["capacity"]
    assert r["capacity"]["MEM"]["used"] + r["capacity"]["SSD"]["used"] == len(data), r["capacity"]

    # Every byte is still cached on one tier or the other: a read adds no UFS bytes.
    b0 = c.counters()
    assert sha256(c.cat("/data/t.bin")) == sha256(data)
    d = c.delta(b0)
    assert d == {"short_circuit": len(data), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d


def test_two_workers(cluster_factory, s3, bucket, minio):
    c = cluster_factory(workers=2, args=["--block-size", "4MiB"])
    r = c.report()
    assert r["live_workers"] == 2
    ids = {w["id"] for w in r["workers"]}
    assert len(ids) == 2
    addrs = {w["data_address"] for w in r["workers"]}
    assert len(addrs) == 2, "workers need distinct data ports"
    data = os.urandom(24 * MiB + 5)  # 7 blocks
    s3.put_object(Bucket=bucket, Key="p/w.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")

    # Forced-remote load: blocks go to workers by hash.
    c.ok("fs", "--remote", "load", "/data/w.bin")
    st = c.stat("/data/w.bin")
    assert st["cached_fraction"] == 1.0
    holders = [x["worker_id"] for b in st["blocks"] for x in b["locations"]]
    assert len(holders) == 7 and set(holders) <= ids, st
    r = c.wait_report(lambda r: sum(t["blocks"] for w in r["workers"] for t in w["tiers"]) == 7,
                      what="7 blocks across the workers")
    per_worker = {w["id"]: sum(t["blocks"] for t in w["tiers"]) for w in r["workers"]}
    assert per_worker == dict(Counter(holders)) | {i: 0 for i in ids - set(holders)}, (per_worker, holders)

    b0 = c.counters()
    assert sha256(c.cat("/data/w.bin", "--remote")) == sha256(data)
    d = c.delta(b0)
    assert d == {"short_circuit": 0, "local_worker": 0, "remote_worker": len(data), "ufs": 0}, d
    b1 = c.counters()
    assert sha256(c.cat("/data/w.bin")) == sha256(data)
    d = c.delta(b1)
    assert d == {"short_circuit": len(data), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d
