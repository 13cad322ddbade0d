"""Eviction under a MEM quota, pinning, and a full cache of pinned blocks."""

from __future__ import annotations

import os

from conftest import MiB, assert_one_line_error, sha256


def test_eviction_pinning_and_out_of_space(cluster_factory, s3, bucket, minio):
    quota = 64 * MiB
    c = cluster_factory(args=["--mem-quota", "64MiB", "--block-size", "8MiB"])
    r = c.report()
    assert r["capacity"]["MEM"]["capacity"] == quota, r["capacity"]

    pinned = os.urandom(16 * MiB)
    others = {f"others/f{i}.bin": os.urandom(16 * MiB) for i in range(8)}  # 128 MiB, twice the quota
    extra = os.urandom(32 * MiB)
    s3.put_object(Bucket=bucket, Key="p/pinned.bin", Body=pinned)
    for k, v in others.items():
        s3.put_object(Bucket=bucket, Key=f"p/{k}", Body=v)
    s3.put_object(Bucket=bucket, Key="p/extra/extra.bin", Body=extra)
    c.mount_s3("/data", bucket, "p", minio, "60s")

    out = c.ok("fs", "pin", "/data/pinned.bin").decode()
    assert "pinned 1 file(s)" in out, out
    assert c.stat("/data/pinned.bin")["pinned"] is True
    c.ok("fs", "load", "/data/pinned.bin")
    assert c.stat("/data/pinned.bin")["cached_fraction"] == 1.0

    # Read one file, load the rest: 128 MiB through a 64 MiB tier.
    assert sha256(c.cat("/data/others/f0.bin")) == sha256(others["others/f0.bin"])
    c.ok("fs", "load", "-R", "/data/others")
    c.quiesce()

    r = c.wait_report(lambda r: r["cache"]["evictions"] > 0, what="evictions")
    mem = r["capacity"]["MEM"]
    assert mem["capacity"] == quota
    assert 0 < mem["used"] <= quota, mem
    st = c.stat("/data/pinned.bin")
    assert st["cached_fraction"] == 1.0, st
    fracs = [c.stat(f"/data/{k}")["cached_fraction"] for k in others]
    assert min(fracs) < 1.0, f"128 MiB cannot all be cached in 64 MiB: {fracs}"
    assert max(fracs) > 0.0, fracs  # the most recent loads are cached
    # The pinned file is still served from the cache.
    b0 = c.counters()
    assert sha256(c.cat("/data/pinned.bin")) == sha256(pinned)
    d = c.delta(b0)
    assert d == {"short_circuit": len(pinned), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d

    # Pin everything: the tier fills with pinned blocks, and a load that needs more fails.
    c.ok("fs", "pin", "-R", "/data")
    r = c.run("fs", "load", "/data/extra/extra.bin")
    msg = assert_one_line_error(r, 6)
    assert "full" in msg or "space" in msg or "quota" in msg, msg

    # The cluster stays up and within its quota; reads still work (uncached when no room).
    assert c.alive()
    r = c.report()
    assert r["live_workers"] == 1
    assert r["capacity"]["MEM"]["used"] <= quota, r["capacity"]
    assert c.stat("/data/pinned.bin")["cached_fraction"] == 1.0
    assert sha256(c.cat("/data/extra/extra.bin")) == sha256(extra)
    assert sha256(c.cat("/data/pinned.bin")) == sha256(pinned)
    assert c.report()["capacity"]["MEM"]["used"] <= quota

    # free refuses pinned files; after unpin it works.
    r = c.run("fs", "free", "/data/pinned.bin")
    assert_one_line_error(r)
    c.ok("fs", "unpin", "/data/pinned.bin")
    assert c.stat("/data/pinned.bin")["pinned"] is False
    c.ok("fs", "free", "/data/pinned.bin")
    assert c.stat("/data/pinned.bin")["cached_fraction"] == 0.0
